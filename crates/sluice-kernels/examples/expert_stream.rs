//! How fast one-row (decode) products stream BF16 expert weights from memory, against a plain
//! read of the same buffer by the same threads.
//!
//! Run: `cargo run --release -p sluice-kernels --example expert_stream -- [THREADS] [4k|2m]`
//! (defaults: 1 thread, 2 MiB pages). A 1 GiB pool holds DeepSeek-V3-shaped experts of the
//! bench model (`sluice synth --moe-inter 768`: gate and up 768 × 1024, down 1024 × 768), taken
//! in a scattered order; each thread computes its share of the rows of every product, as a
//! decode step splits them, with no synchronisation between products (so the figure is the
//! kernel's streaming rate, not the pool's). `2m` asks for transparent huge pages, as the
//! store does for the buffers weights are read into; `4k` leaves the pool on small pages.
//! Prints GB/s for each of seven rounds, then the medians.

use std::time::Instant;

use sluice_kernels::{Codes, Kernels, Matrix, probe};

const POOL: usize = 1 << 30;
const HIDDEN: usize = 1024;
const INTER: usize = 768;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads: usize = match args.first().map(|a| a.parse()) {
        None => 1,
        Some(Ok(n)) if (1..=64).contains(&n) => n,
        _ => {
            eprintln!("expert_stream: THREADS must be a number from 1 to 64");
            std::process::exit(2);
        }
    };
    let huge = match args.get(1).map(String::as_str) {
        None | Some("2m") => true,
        Some("4k") => false,
        Some(other) => {
            eprintln!("expert_stream: pages must be 4k or 2m, not {other}");
            std::process::exit(2);
        }
    };
    let k = Kernels::best();
    let mut map = memmap2::MmapMut::map_anon(POOL).expect("a 1 GiB anonymous map");
    let advice = if huge {
        memmap2::Advice::HugePage
    } else {
        memmap2::Advice::NoHugePage
    };
    if map.advise(advice).is_err() {
        eprintln!(
            "expert_stream: the kernel refused the page-size advice; figures are for its default"
        );
    }
    // Normal BF16 values, either sign, of magnitude 2^-7 to just under 2 (no subnormals: an FMA
    // on one takes a microcode assist, which would make the products look compute-bound).
    for (i, b) in map.iter_mut().enumerate() {
        let r = (i.wrapping_mul(2_654_435_761) >> 13) as u8;
        *b = if i % 2 == 1 { 0x3c | (r & 0x83) } else { r };
    }
    let pool: &[u8] = &map;
    let (gate, down) = (INTER * HIDDEN * 2, HIDDEN * INTER * 2);
    let per = 2 * gate + down;
    let n = POOL / per;
    // A stride prime to `n` visits every expert once per round in a scattered order, as routed
    // experts come.
    let gcd = |mut a: usize, mut b: usize| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    let stride = (37..)
        .find(|&s| gcd(s, n) == 1)
        .expect("some stride is prime to the expert count");
    let x: Vec<f32> = (0..HIDDEN).map(|i| (i as f32 * 1e-3).sin()).collect();
    let h: Vec<f32> = (0..INTER).map(|i| (i as f32 * 2e-3).cos()).collect();
    let words: &[u64] = bytemuck::cast_slice(pool);
    let share = |rows: usize, t: usize| rows * t / threads..rows * (t + 1) / threads;
    let (mut reads, mut prods) = (Vec::new(), Vec::new());
    println!(
        "{threads} thread(s), {} pages, {}",
        if huge { "2 MiB" } else { "4 KiB" },
        k.isa()
    );
    for round in 0..7 {
        let t0 = Instant::now();
        std::thread::scope(|s| {
            let part = words.len() / threads;
            for t in 0..threads {
                let w = &words[t * part..(t + 1) * part];
                s.spawn(move || std::hint::black_box(probe::read_sum(k.isa(), w)));
            }
        });
        let read = POOL as f64 / t0.elapsed().as_secs_f64() / 1e9;
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for t in 0..threads {
                let (x, h) = (&x, &h);
                s.spawn(move || {
                    let (gr, dr) = (share(INTER, t), share(HIDDEN, t));
                    let mut y = vec![0f32; gr.len()];
                    let mut z = vec![0f32; dr.len()];
                    for i in 0..n {
                        let base = (i * stride % n) * per;
                        let m = |o: usize, len: usize, rows: usize, cols: usize| {
                            Matrix::dense(Codes::BF16, &pool[base + o..base + o + len], rows, cols)
                                .expect("a valid matrix")
                        };
                        k.matmul(&m(0, gate, INTER, HIDDEN), x, &mut y, gr.clone());
                        k.matmul(&m(gate, gate, INTER, HIDDEN), x, &mut y, gr.clone());
                        k.matmul(&m(2 * gate, down, HIDDEN, INTER), h, &mut z, dr.clone());
                    }
                });
            }
        });
        let prod = (n * per) as f64 / t0.elapsed().as_secs_f64() / 1e9;
        println!(
            "round {round}: read {read:.2} GB/s, products {prod:.2} GB/s ({:.3})",
            prod / read
        );
        reads.push(read);
        prods.push(prod);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (r, p) = (median(&mut reads), median(&mut prods));
    println!(
        "median: read {r:.2} GB/s, products {p:.2} GB/s ({:.3})",
        p / r
    );
}
