//! Kernel throughput against this machine's memory bandwidth.
//!
//! Run: `cargo bench -p sluice-kernels --bench kernels` (add a criterion filter such as
//! `-- bf16` to run a subset). It measures, on one thread:
//!
//! - the read bandwidth of a streaming sum over a 1 GiB buffer (far larger than any L3);
//! - matrix × activations for every weight format and every SIMD ISA this CPU has, at
//!   4096 × 4096 and 7168 × 2048, batch 1 (decode) and batch 8 and 32 (prefill), plus the
//!   scalar specification at batch 1 for scale;
//! - the transposed products `matmul_xw` (GPT-OSS's BF16 experts, batch 1 and 8) and `absorb`
//!   (one head of DeepSeek's FP8 `kv_b_proj`), against the model's former decode-then-`axpy`.
//!
//! Weights are cycled through a 1 GiB pool of copies, so every call streams them from memory
//! as decode does. Results print as criterion's usual lines and, at the end, as one table:
//! weight GB/s (stored bytes, scales included, per second), that figure as a share of the
//! measured bandwidth, and activation rows per second against batch 1.
//!
//! Kept short by default (10 samples, 1 s each): the machines this runs on are shared. For
//! the same reason every time is the benchmark thread's CPU time, not wall time: time spent
//! descheduled while another process runs is not counted (time spent waiting for memory is).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use criterion::{Criterion, SamplingMode, Throughput};
use sluice_kernels::Numerics;
use sluice_kernels::decode::f32_to_bf16;
use sluice_kernels::gguf::BlockFormat;
use sluice_kernels::{Codes, Isa, Kernels, Matrix, ScaleType, Scales};

/// Bytes cycled through: weights never stay in a cache between calls.
const POOL_BYTES: usize = 1 << 30;

/// One weight format as benchmarked.
#[derive(Clone, Copy)]
struct Format {
    name: &'static str,
    codes: Codes,
    /// Scale type, columns and rows per group (quantized codes only).
    scales: Option<(ScaleType, usize, usize)>,
}

const FORMATS: [Format; 24] = [
    Format {
        name: "f32",
        codes: Codes::F32,
        scales: None,
    },
    Format {
        name: "bf16",
        codes: Codes::BF16,
        scales: None,
    },
    Format {
        name: "f16",
        codes: Codes::F16,
        scales: None,
    },
    Format {
        name: "fp8-e4m3-b128",
        codes: Codes::E4M3,
        scales: Some((ScaleType::F32, 128, 128)),
    },
    Format {
        name: "int4-g32",
        codes: Codes::Int4,
        scales: Some((ScaleType::BF16, 32, 1)),
    },
    Format {
        name: "int4-g128",
        codes: Codes::Int4,
        scales: Some((ScaleType::BF16, 128, 1)),
    },
    Format {
        name: "mxfp4",
        codes: Codes::E2M1,
        scales: Some((ScaleType::E8M0, 32, 1)),
    },
    Format {
        name: "int8-g128",
        codes: Codes::I8,
        scales: Some((ScaleType::BF16, 128, 1)),
    },
    // GGUF blocks, multiplied in place (each row decoded once per call).
    Format {
        name: "gguf-q8_0",
        codes: Codes::Block(BlockFormat::Q8_0),
        scales: None,
    },
    Format {
        name: "gguf-q4_k",
        codes: Codes::Block(BlockFormat::Q4_K),
        scales: None,
    },
    Format {
        name: "gguf-q5_k",
        codes: Codes::Block(BlockFormat::Q5_K),
        scales: None,
    },
    Format {
        name: "gguf-q5_0",
        codes: Codes::Block(BlockFormat::Q5_0),
        scales: None,
    },
    Format {
        name: "gguf-q6_k",
        codes: Codes::Block(BlockFormat::Q6_K),
        scales: None,
    },
    // The low-bit formats giant models ship in.
    Format {
        name: "gguf-q2_k",
        codes: Codes::Block(BlockFormat::Q2_K),
        scales: None,
    },
    Format {
        name: "gguf-q3_k",
        codes: Codes::Block(BlockFormat::Q3_K),
        scales: None,
    },
    Format {
        name: "gguf-iq4_xs",
        codes: Codes::Block(BlockFormat::IQ4_XS),
        scales: None,
    },
    Format {
        name: "gguf-mxfp4",
        codes: Codes::Block(BlockFormat::MXFP4),
        scales: None,
    },
    Format {
        name: "gguf-iq2_xxs",
        codes: Codes::Block(BlockFormat::IQ2_XXS),
        scales: None,
    },
    Format {
        name: "gguf-iq2_xs",
        codes: Codes::Block(BlockFormat::IQ2_XS),
        scales: None,
    },
    Format {
        name: "gguf-iq2_s",
        codes: Codes::Block(BlockFormat::IQ2_S),
        scales: None,
    },
    Format {
        name: "gguf-iq3_xxs",
        codes: Codes::Block(BlockFormat::IQ3_XXS),
        scales: None,
    },
    Format {
        name: "gguf-iq3_s",
        codes: Codes::Block(BlockFormat::IQ3_S),
        scales: None,
    },
    Format {
        name: "gguf-iq1_s",
        codes: Codes::Block(BlockFormat::IQ1_S),
        scales: None,
    },
    Format {
        name: "gguf-iq1_m",
        codes: Codes::Block(BlockFormat::IQ1_M),
        scales: None,
    },
];

const SHAPES: [(usize, usize); 2] = [(4096, 4096), (7168, 2048)];
const BATCHES: [usize; 3] = [1, 8, 32];

/// Seconds per call, per benchmark id, as measured by the last sample set.
static RESULTS: Mutex<BTreeMap<String, Vec<f64>>> = Mutex::new(BTreeMap::new());

fn record(id: &str, secs_per_iter: f64) {
    RESULTS
        .lock()
        .unwrap()
        .entry(id.to_owned())
        .or_default()
        .push(secs_per_iter);
}

/// CPU time of this thread.
fn cpu_now() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Times `iters` runs of `f` in thread CPU time and records the time per run under `id`.
fn timed(id: &str, iters: u64, mut f: impl FnMut()) -> Duration {
    let t0 = cpu_now();
    for _ in 0..iters {
        f();
    }
    let d = cpu_now().saturating_sub(t0);
    record(id, d.as_secs_f64() / iters as f64);
    d
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// SplitMix64, for bench data.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// Fills `buf` with plausible codes of `codes` (no NaN, no subnormals): a 1 MiB random
/// pattern repeated.
fn fill(buf: &mut [u8], codes: Codes) {
    let mut rng = Rng(7);
    let mut pat = vec![0u8; 1 << 20];
    for ch in pat.chunks_exact_mut(4) {
        let v = rng.unit();
        let b: [u8; 4] = match codes {
            Codes::F32 => v.to_le_bytes(),
            Codes::BF16 => {
                let h = f32_to_bf16(v).to_le_bytes();
                let g = f32_to_bf16(rng.unit()).to_le_bytes();
                [h[0], h[1], g[0], g[1]]
            }
            // A normal half: sign, exponent 10..=17, random mantissa.
            Codes::F16 => {
                let r = rng.next();
                let h = |r: u64| ((r & 0x83ff) | ((10 + (r >> 16) % 8) << 10)) as u16;
                let (a, c) = (h(r).to_le_bytes(), h(r >> 24).to_le_bytes());
                [a[0], a[1], c[0], c[1]]
            }
            Codes::E4M3 => (rng.next() as u32 & 0xf6f6_f6f6).to_le_bytes(),
            // Block scales may come out NaN: a timing does not care.
            Codes::Int4 | Codes::E2M1 | Codes::I8 | Codes::Block(_) => {
                (rng.next() as u32).to_le_bytes()
            }
        };
        ch.copy_from_slice(&b);
    }
    for ch in buf.chunks_mut(pat.len()) {
        ch.copy_from_slice(&pat[..ch.len()]);
    }
}

fn scale_fill(n: usize, ty: ScaleType) -> Vec<u8> {
    let mut rng = Rng(11);
    let mut out = Vec::with_capacity(n * ty.size());
    for _ in 0..n {
        let v = 0.01 + rng.unit().abs() * 0.1;
        match ty {
            ScaleType::F32 => out.extend(v.to_le_bytes()),
            ScaleType::BF16 => out.extend(f32_to_bf16(v).to_le_bytes()),
            ScaleType::F16 => out.extend(0x2c00u16.to_le_bytes()),
            ScaleType::E8M0 => out.push(118 + (rng.next() % 8) as u8),
        }
    }
    out
}

/// Weight bytes of one matrix of `f` at `(rows, cols)`, and its scale bytes.
fn sizes(f: Format, rows: usize, cols: usize) -> (usize, usize) {
    let data = f.codes.row_bytes(cols).unwrap() * rows;
    let scales = f.scales.map_or(0, |(ty, gc, gr)| {
        rows.div_ceil(gr) * cols.div_ceil(gc) * ty.size()
    });
    (data, scales)
}

/// Reads `buf` as `S` streams at once (the buffer cut in `S` parts walked side by side), one
/// 64-byte line per stream per step; returns a checksum.
fn read_streams<const S: usize>(buf: &[u64]) -> u64 {
    let part = buf.len() / S / 8 * 8;
    let parts: [&[u64]; S] = std::array::from_fn(|i| &buf[i * part..(i + 1) * part]);
    let mut acc = [[0u64; 8]; S];
    for j in (0..part).step_by(8) {
        for (a, p) in acc.iter_mut().zip(&parts) {
            for (ai, &v) in a.iter_mut().zip(&p[j..j + 8]) {
                *ai = ai.wrapping_add(v);
            }
        }
    }
    acc.iter().flatten().fold(0, |s, &v| s.wrapping_add(v))
}

/// Single-thread read bandwidth: the contract's `sum` over 1 GiB (one stream, 16 lanes), and a
/// plain integer sum over 1, 4 and 8 streams; the table uses the best.
fn bench_bandwidth(c: &mut Criterion, pool: &[f32], k: Kernels) {
    let mut g = c.benchmark_group("bandwidth");
    g.sampling_mode(SamplingMode::Flat);
    g.throughput(Throughput::Bytes(std::mem::size_of_val(pool) as u64));
    let words: &[u64] = bytemuck::cast_slice(pool);
    let id = format!("sum-f32/{}", k.isa());
    g.bench_function(&id, |b| {
        b.iter_custom(|iters| {
            timed(&format!("bandwidth/{id}"), iters, || {
                std::hint::black_box(k.sum(std::hint::black_box(pool)));
            })
        })
    });
    macro_rules! streams {
        ($($s:literal),*) => {$(
            let id = format!("read-{}-streams", $s);
            g.bench_function(&id, |b| {
                b.iter_custom(|iters| {
                    timed(&format!("bandwidth/{id}"), iters, || {
                        std::hint::black_box(read_streams::<$s>(std::hint::black_box(words)));
                    })
                })
            });
        )*};
    }
    streams!(1, 4, 8);
    g.finish();
}

fn bench_matmul(c: &mut Criterion, pool: &mut [u8], kernels: &[Kernels]) {
    for f in FORMATS {
        let mut filled = false;
        for (rows, cols) in SHAPES {
            let (dbytes, sbytes) = sizes(f, rows, cols);
            let copies = (pool.len() / dbytes).max(1);
            let mut g = c.benchmark_group(format!("matmul/{}/{rows}x{cols}", f.name));
            g.sampling_mode(SamplingMode::Flat);
            g.throughput(Throughput::Bytes((dbytes + sbytes) as u64));
            // The scale pool: one copy per weight copy (they are small next to the weights).
            let spool = f
                .scales
                .map(|(ty, _, _)| scale_fill(copies * sbytes / ty.size(), ty));
            for &k in kernels {
                for batch in BATCHES {
                    if k.isa() == Isa::Scalar && (batch > 1 || rows != 4096) {
                        continue;
                    }
                    let int8 = k.numerics() == Numerics::Int8;
                    if int8
                        && !matches!(f.codes, Codes::Block(b) if sluice_kernels::int8::ActKind::for_format(b).is_some())
                    {
                        continue;
                    }
                    let id = format!("{}{}/b{batch}", k.isa(), if int8 { "-int8" } else { "" });
                    let full = format!("matmul/{}/{rows}x{cols}/{id}", f.name);
                    let x: Vec<f32> = {
                        let mut rng = Rng(3);
                        (0..batch * cols).map(|_| rng.unit()).collect()
                    };
                    let mut y = vec![0f32; batch * rows];
                    let pool_ref = &mut *pool;
                    let filled_ref = &mut filled;
                    g.bench_function(&id, |b| {
                        if !*filled_ref {
                            fill(pool_ref, f.codes);
                            *filled_ref = true;
                        }
                        let mut next = 0usize;
                        b.iter_custom(|iters| {
                            timed(&full, iters, || {
                                let data = &pool_ref[next * dbytes..(next + 1) * dbytes];
                                let m = match (f.scales, &spool) {
                                    (Some((ty, gc, gr)), Some(sp)) => Matrix::quantized(
                                        f.codes,
                                        data,
                                        rows,
                                        cols,
                                        Scales {
                                            data: &sp[next * sbytes..(next + 1) * sbytes],
                                            ty,
                                            group_cols: gc,
                                            group_rows: gr,
                                        },
                                    ),
                                    _ => Matrix::dense(f.codes, data, rows, cols),
                                }
                                .unwrap();
                                k.matmul(&m, &x, &mut y, 0..rows);
                                next = (next + 1) % copies;
                            })
                        })
                    });
                }
            }
            g.finish();
        }
    }
}

/// The transposed products: `matmul_xw` over GPT-OSS's fused BF16 `gate_up_proj` of one
/// expert (`[2880, 5760]` stored `[in, out]`), batch 1 and 8, and `absorb` over one head's
/// 128 rows of DeepSeek's FP8 `kv_b_proj` (`[128, 512]` of a `[32768, 512]` matrix, 128 × 128
/// f32 block scales). Each also runs as the model crate computed it before the kernels owned
/// it (`model-axpy`: the scalar row decoder, then the ISA's `axpy` per row), for comparison.
fn bench_transposed(c: &mut Criterion, kernels: &[Kernels]) {
    let (n_in, n_out) = (2880, 5760);
    let mut w = vec![0u8; n_in * n_out * 2];
    fill(&mut w, Codes::BF16);
    let m = Matrix::dense(Codes::BF16, &w, n_in, n_out).unwrap();
    let mut g = c.benchmark_group(format!("matmul_xw/bf16/{n_in}x{n_out}"));
    g.sampling_mode(SamplingMode::Flat);
    g.throughput(Throughput::Bytes(w.len() as u64));
    for &k in kernels {
        for batch in [1usize, 8] {
            let mut rng = Rng(5);
            let x: Vec<f32> = (0..batch * n_in).map(|_| rng.unit()).collect();
            let mut y = vec![0f32; batch * n_out];
            let id = format!("{}/b{batch}", k.isa());
            g.bench_function(&id, |b| {
                b.iter_custom(|iters| {
                    timed(&format!("matmul_xw/{id}"), iters, || {
                        k.matmul_xw(&m, &x, &mut y, 0..n_out)
                    })
                })
            });
            if k.isa() == Isa::Scalar {
                continue;
            }
            let id = format!("{}-model-axpy/b{batch}", k.isa());
            let mut row = vec![0f32; n_out];
            g.bench_function(&id, |b| {
                b.iter_custom(|iters| {
                    timed(&format!("matmul_xw/{id}"), iters, || {
                        y.fill(0.0);
                        for i in 0..n_in {
                            sluice_kernels::scalar::decode_row(&m, i, 0..n_out, &mut row);
                            for bi in 0..batch {
                                let yb = &mut y[bi * n_out..(bi + 1) * n_out];
                                k.axpy(x[bi * n_in + i], &row, yb);
                            }
                        }
                    })
                })
            });
        }
    }
    g.finish();

    let (rows, cols) = (32768, 512);
    let mut w = vec![0u8; rows * cols];
    fill(&mut w, Codes::E4M3);
    let sc = scale_fill(rows.div_ceil(128) * cols.div_ceil(128), ScaleType::F32);
    let scales = Scales {
        data: &sc,
        ty: ScaleType::F32,
        group_cols: 128,
        group_rows: 128,
    };
    let m = Matrix::quantized(Codes::E4M3, &w, rows, cols, scales).unwrap();
    let mut g = c.benchmark_group(format!("absorb/fp8-e4m3-b128/128x{cols}"));
    g.sampling_mode(SamplingMode::Flat);
    g.throughput(Throughput::Bytes(128 * cols as u64));
    let mut rng = Rng(9);
    let x: Vec<f32> = (0..128).map(|_| rng.unit()).collect();
    let mut out = vec![0f32; cols];
    for &k in kernels {
        let id = k.isa().to_string();
        g.bench_function(&id, |b| {
            b.iter_custom(|iters| {
                timed(&format!("absorb/{id}"), iters, || {
                    k.absorb(&m, 256..384, &x, &mut out)
                })
            })
        });
        if k.isa() == Isa::Scalar {
            continue;
        }
        let id = format!("{}-model-axpy", k.isa());
        let mut row = vec![0f32; cols];
        g.bench_function(&id, |b| {
            b.iter_custom(|iters| {
                timed(&format!("absorb/{id}"), iters, || {
                    out.fill(0.0);
                    for (i, r) in (256..384).enumerate() {
                        sluice_kernels::scalar::decode_row(&m, r, 0..cols, &mut row);
                        k.axpy(x[i], &row, &mut out);
                    }
                })
            })
        });
    }
    g.finish();
}

fn print_table() {
    let res = RESULTS.lock().unwrap();
    println!();
    println!("== sluice kernels: one thread, CPU time ==");
    let mut bw = 0f64;
    for (id, v) in res.iter().filter(|(k, _)| k.starts_with("bandwidth/")) {
        let gbs = POOL_BYTES as f64 / median(v) / 1e9;
        println!("memory read over 1 GiB, {:<22} {gbs:6.2} GB/s", &id[10..]);
        bw = bw.max(gbs);
    }
    if bw > 0.0 {
        println!("bandwidth used below (best of the above): {bw:.2} GB/s");
    }
    println!(
        "{:<14} {:<10} {:<7} {:>5} {:>10} {:>9} {:>7} {:>12} {:>9}",
        "format", "shape", "isa", "batch", "ms/call", "GB/s", "% bw", "act rows/s", "vs b1"
    );
    let mut b1: BTreeMap<String, f64> = BTreeMap::new();
    for (id, v) in res.iter() {
        let parts: Vec<&str> = id.split('/').collect();
        if parts.len() != 5 || parts[0] != "matmul" {
            continue;
        }
        let (fname, shape, isa, batch) = (parts[1], parts[2], parts[3], &parts[4][1..]);
        let batch: usize = batch.parse().unwrap_or(1);
        let f = FORMATS.iter().find(|f| f.name == fname).unwrap();
        let (rows, cols) = shape.split_once('x').unwrap();
        let (rows, cols): (usize, usize) = (rows.parse().unwrap(), cols.parse().unwrap());
        let (d, s) = sizes(*f, rows, cols);
        let t = median(v);
        let gbs = (d + s) as f64 / t / 1e9;
        let acts = batch as f64 / t;
        let key = format!("{fname}/{shape}/{isa}");
        if batch == 1 {
            b1.insert(key.clone(), acts);
        }
        let vs = b1
            .get(&key)
            .map_or(String::from("-"), |a| format!("{:.1}x", acts / a));
        let pct = if bw > 0.0 {
            format!("{:.0}%", 100.0 * gbs / bw)
        } else {
            "-".into()
        };
        println!(
            "{fname:<14} {shape:<10} {isa:<7} {batch:>5} {:>10.3} {gbs:>9.2} {pct:>7} {acts:>12.0} {vs:>9}",
            t * 1e3
        );
    }
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .without_plots()
        .configure_from_args();
    let best = Kernels::best();
    let mut kernels: Vec<Kernels> = Isa::available()
        .into_iter()
        .map(|i| Kernels::new(i).unwrap())
        .collect();
    kernels.sort_by_key(|k| k.isa());
    // The integer mode beside the exact one, on the formats it multiplies in integers (its
    // activations are quantized once per distinct input: a product repeated on the same input,
    // as here, measures the integer products alone).
    let with_int8: Vec<Kernels> = kernels
        .iter()
        .copied()
        .chain(kernels.iter().map(|k| k.with_numerics(Numerics::Int8)))
        .collect();
    {
        let pool = vec![1.0f32; POOL_BYTES / 4];
        bench_bandwidth(&mut c, &pool, best);
    }
    bench_transposed(&mut c, &kernels);
    let mut pool = vec![0u8; POOL_BYTES];
    bench_matmul(&mut c, &mut pool, &with_int8);
    c.final_summary();
    print_table();
}
