//! Matrix products on every ISA this CPU has, against the scalar specification, bit for bit;
//! against an f64 reference within a named tolerance; and independent of the row range and
//! batch requested.

mod common;

use common::*;
use proptest::prelude::*;
use sluice_kernels::{Codes, Kernels, ScaleType};

/// One generated product: a matrix and a batch of activations.
#[derive(Clone, Debug)]
struct Product {
    case: Case,
    batch: usize,
    x: Vec<f32>,
}

fn codes_strategy() -> impl Strategy<Value = Codes> {
    proptest::sample::select(ALL_CODES.to_vec())
}

fn mode_strategy() -> impl Strategy<Value = Mode> {
    prop_oneof![
        4 => Just(Mode::Tame),
        4 => Just(Mode::Edges),
        1 => Just(Mode::Wild),
        1 => Just(Mode::Zeros),
    ]
}

fn product_strategy() -> impl Strategy<Value = Product> {
    let cols = prop_oneof![
        6 => 0usize..=49,
        3 => 50usize..=300,
        1 => proptest::sample::select(vec![512usize, 1000, 1040]),
    ];
    let batch = prop_oneof![8 => 1usize..=9, 1 => 10usize..=64];
    let group_cols = proptest::sample::select(vec![16usize, 32, 48, 64, 128]);
    let group_rows = proptest::sample::select(vec![1usize, 2, 3, 128]);
    (
        codes_strategy(),
        cols,
        0usize..=9,
        batch,
        group_cols,
        group_rows,
        proptest::sample::select(ALL_SCALES.to_vec()),
        0usize..=3,
        any::<u64>(),
        mode_strategy(),
        mode_strategy(),
    )
        .prop_map(
            |(codes, cols, rows, batch, gc, gr, st, offset, seed, wmode, xmode)| {
                let cols = if codes.row_bytes(cols).is_none() {
                    cols + 1
                } else {
                    cols
                };
                let mut rng = Rng(seed);
                let case = Case::new(&mut rng, codes, rows, cols, offset, st, gc, gr, wmode);
                let x = (0..batch * cols).map(|_| value(&mut rng, xmode)).collect();
                Product { case, batch, x }
            },
        )
}

fn run(
    k: &Kernels,
    p: &Product,
    rows: std::ops::Range<usize>,
    x: &[f32],
    batch: usize,
) -> Vec<f32> {
    let m = p.case.matrix();
    let mut y = vec![f32::from_bits(0x7fbf_dead); batch * rows.len()];
    k.matmul(&m, x, &mut y, rows);
    y
}

proptest! {
    #![proptest_config(config(192, "proptest-regressions/matmul.txt"))]

    /// Every ISA returns the scalar bits for the whole product.
    #[test]
    fn matmul_matches_scalar(p in product_strategy()) {
        let rows = 0..p.case.rows;
        let want = run(&spec(), &p, rows.clone(), &p.x, p.batch);
        for k in simd_kernels() {
            let got = run(&k, &p, rows.clone(), &p.x, p.batch);
            assert_same(&format!("{:?} {:?}", k.isa(), p.case.codes), &got, &want);
        }
    }

    /// Any row range and any single activation row give the same bits as the full call.
    #[test]
    fn matmul_rows_independent(p in product_strategy(), a in any::<usize>(), b in any::<usize>(), pick in any::<usize>()) {
        let n = p.case.rows;
        let cols = p.case.cols;
        let full_rows = 0..n;
        let (lo, hi) = {
            let (u, v) = (a % (n + 1), b % (n + 1));
            (u.min(v), u.max(v))
        };
        let bi = pick % p.batch;
        let xi = &p.x[bi * cols..(bi + 1) * cols];
        let mut ks = simd_kernels();
        ks.push(spec());
        for k in ks {
            let full = run(&k, &p, full_rows.clone(), &p.x, p.batch);
            // A sub-range of rows, whole batch.
            let sub = run(&k, &p, lo..hi, &p.x, p.batch);
            for b in 0..p.batch {
                for r in lo..hi {
                    let (g, w) = (sub[b * (hi - lo) + r - lo], full[b * n + r]);
                    prop_assert!(same(g, w), "{:?} rows {lo}..{hi} act {b} row {r}: {g:e} vs {w:e}", k.isa());
                }
            }
            // One activation row, one output row at a time.
            if cols > 0 {
                for r in lo..hi {
                    let one = run(&k, &p, r..r + 1, xi, 1);
                    let w = full[bi * n + r];
                    prop_assert!(same(one[0], w), "{:?} single row {r} act {bi}: {:e} vs {w:e}", k.isa(), one[0]);
                }
            }
        }
    }
}

/// FP8 with DeepSeek-style 128 × 128 block scales, across the row and column block edges, for
/// every scale type.
#[test]
fn fp8_block_edges() {
    for (i, st) in ALL_SCALES.into_iter().enumerate() {
        let mut rng = Rng(77 + i as u64);
        for (rows, cols) in [(130, 272), (129, 257 - 1), (128, 128)] {
            let case = Case::new(
                &mut rng,
                Codes::E4M3,
                rows,
                cols,
                1 + i % 3,
                st,
                128,
                128,
                Mode::Edges,
            );
            let p = Product {
                batch: 3,
                x: (0..3 * cols).map(|_| value(&mut rng, Mode::Tame)).collect(),
                case,
            };
            let want = run(&spec(), &p, 0..rows, &p.x, 3);
            for k in simd_kernels() {
                assert_same(
                    &format!("{:?} {st:?} {rows}x{cols}", k.isa()),
                    &run(&k, &p, 0..rows, &p.x, 3),
                    &want,
                );
                // Rows that straddle the block edge on their own.
                let part = run(&k, &p, 126..rows, &p.x, 3);
                for b in 0..3 {
                    for r in 126..rows {
                        assert!(same(part[b * (rows - 126) + r - 126], want[b * rows + r]));
                    }
                }
            }
        }
    }
}

/// Long rows: many groups and blocks, every coding and scale type, a batch that exercises
/// full tiles and remainders in both dimensions.
#[test]
fn long_rows_every_format() {
    for codes in ALL_CODES {
        for (i, st) in ALL_SCALES.into_iter().enumerate() {
            if !codes.is_quantized() && i > 0 {
                continue;
            }
            let mut rng = Rng(1000 + i as u64);
            let (rows, cols, batch) = (11, 2080, 7);
            let case = Case::new(&mut rng, codes, rows, cols, 3, st, 32, 1, Mode::Edges);
            let p = Product {
                batch,
                x: (0..batch * cols)
                    .map(|_| value(&mut rng, Mode::Edges))
                    .collect(),
                case,
            };
            let want = run(&spec(), &p, 0..rows, &p.x, batch);
            for k in simd_kernels() {
                let got = run(&k, &p, 0..rows, &p.x, batch);
                assert_same(&format!("{:?} {codes:?} {st:?}", k.isa()), &got, &want);
            }
        }
    }
}

// ---- accuracy against f64 ----
//
// Decoding is exact for every format (checked against torch in `torch_fixtures.rs`), so the
// only error is f32 accumulation: a lane chain of n/16 fmas, a group chain for quantized
// codes, and the 4-level tree, each step within half an ulp of the running sum. The bound
// below is `TOL × Σ|w·s·x|` with `TOL` per format; formats share values because their
// arithmetic after decoding is the same, and differ only where the contract does (group
// scales add one fma per group).

/// Relative tolerance (against `Σ|w·x|`) for dense f32 weights, rows up to 2080 columns.
const TOL_F32: f64 = 2e-5;
/// Relative tolerance for bf16 weights (decoding exact, so as f32).
const TOL_BF16: f64 = 2e-5;
/// Relative tolerance for f16 weights (decoding exact, so as f32).
const TOL_F16: f64 = 2e-5;
/// Relative tolerance for FP8 E4M3 with group scales (one extra fma per group).
const TOL_E4M3: f64 = 3e-5;
/// Relative tolerance for INT4 with group scales.
const TOL_INT4: f64 = 3e-5;
/// Relative tolerance for MXFP4 (E2M1 with E8M0 or other scales).
const TOL_E2M1: f64 = 3e-5;
/// Relative tolerance for int8 with group scales.
const TOL_I8: f64 = 3e-5;

fn tolerance(codes: Codes) -> f64 {
    match codes {
        Codes::F32 => TOL_F32,
        Codes::BF16 => TOL_BF16,
        Codes::F16 => TOL_F16,
        Codes::E4M3 => TOL_E4M3,
        Codes::Int4 => TOL_INT4,
        Codes::E2M1 => TOL_E2M1,
        Codes::I8 => TOL_I8,
        Codes::Block(f) => panic!("{f:?}: GGUF blocks are tested on gguf-py's fixtures"),
    }
}

#[test]
fn accuracy_against_f64() {
    for codes in ALL_CODES {
        for st in [
            ScaleType::BF16,
            ScaleType::E8M0,
            ScaleType::F16,
            ScaleType::F32,
        ] {
            let mut rng = Rng(4242);
            for cols in [16, 100, 512, 2080] {
                let rows = 5;
                let case = Case::new(&mut rng, codes, rows, cols, 0, st, 32, 1, Mode::Tame);
                let m = case.matrix();
                let x: Vec<f32> = (0..cols).map(|_| value(&mut rng, Mode::Tame)).collect();
                let mut ks = simd_kernels();
                ks.push(spec());
                for k in ks {
                    let mut y = vec![0f32; rows];
                    k.matmul(&m, &x, &mut y, 0..rows);
                    for (r, &got) in y.iter().enumerate() {
                        let (mut exact, mut mag) = (0f64, 0f64);
                        for (j, &xj) in x.iter().enumerate() {
                            let t = weight_f64(&m, r, j) * xj as f64;
                            exact += t;
                            mag += t.abs();
                        }
                        let err = (got as f64 - exact).abs();
                        assert!(
                            err <= tolerance(codes) * mag + 1e-30,
                            "{:?} {codes:?} {st:?} cols {cols} row {r}: {got} vs {exact} (|err| {err:e}, Σ|wx| {mag:e})",
                            k.isa()
                        );
                    }
                }
            }
        }
    }
}

/// Degenerate shapes: no activation rows, no output rows, no columns. Nothing to compute, and
/// every ISA leaves `y` as the specification does.
#[test]
fn empty_shapes() {
    let mut rng = Rng(5);
    for codes in ALL_CODES {
        for (rows, cols, batch, range) in [
            (3, 32, 0, 0..3),
            (3, 32, 2, 1..1),
            (3, 0, 2, 0..3),
            (0, 16, 1, 0..0),
        ] {
            let case = Case::new(
                &mut rng,
                codes,
                rows,
                cols,
                1,
                ScaleType::BF16,
                16,
                1,
                Mode::Tame,
            );
            let m = case.matrix();
            let x = vec![1.0f32; batch * cols];
            let mut want = vec![7.0f32; batch * range.len()];
            spec().matmul(&m, &x, &mut want, range.clone());
            for k in simd_kernels() {
                let mut got = vec![7.0f32; batch * range.len()];
                k.matmul(&m, &x, &mut got, range.clone());
                assert_same(
                    &format!("{:?} {codes:?} {rows}x{cols} b{batch}", k.isa()),
                    &got,
                    &want,
                );
            }
        }
    }
}

/// The dispatch picks an ISA the CPU has, and this machine's expected ISAs are really tested.
#[test]
fn isas_under_test() {
    let isas: Vec<_> = simd_kernels().iter().map(|k| k.isa()).collect();
    eprintln!("SIMD ISAs under test: {isas:?}");
    assert!(Kernels::best().isa().is_available());
}

/// One activation row over dense codes and enough rows for the strided tiles (rows spread over
/// the range as sequential streams, with leftover rows after them), whole and in sub-ranges,
/// against the scalar bits.
#[test]
fn dense_decode_strided_rows() {
    for (i, codes) in [Codes::BF16, Codes::F16, Codes::F32]
        .into_iter()
        .enumerate()
    {
        let mut rng = Rng(91 + i as u64);
        for (rows, cols) in [(32, 64), (37, 100), (71, 1024), (300, 33), (129, 16)] {
            let case = Case::new(
                &mut rng,
                codes,
                rows,
                cols,
                i % 3,
                ScaleType::F32,
                16,
                1,
                Mode::Edges,
            );
            let p = Product {
                batch: 1,
                x: (0..cols).map(|_| value(&mut rng, Mode::Tame)).collect(),
                case,
            };
            let want = run(&spec(), &p, 0..rows, &p.x, 1);
            for k in simd_kernels() {
                let what = format!("{:?} {codes:?} {rows}x{cols}", k.isa());
                assert_same(&what, &run(&k, &p, 0..rows, &p.x, 1), &want);
                for (lo, hi) in [(1, rows), (3, rows - 2), (rows / 2, rows)] {
                    assert_same(&what, &run(&k, &p, lo..hi, &p.x, 1), &want[lo..hi]);
                }
            }
        }
    }
}
