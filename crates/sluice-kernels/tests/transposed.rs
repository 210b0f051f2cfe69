//! Row decoding and the transposed products (`decode_row`, `matmul_xw`, `absorb`,
//! `weighted_sum`) on every ISA this CPU has: bit for bit the scalar specification, and bit for
//! bit a reference written from the model crate's code these replaced (`Exec::matmul_xw`,
//! `exec::decode_row`, `attention::absorb`, `attention::weighted_sum` as of issue 19), over
//! every coding and scale type, odd shapes, column ranges starting and ending anywhere, and
//! batches crossing the tile sizes.

mod common;

use std::ops::Range;

use common::*;
use sluice_format::Dtype;
use sluice_kernels::decode::{bf16_to_f32, f16_to_f32, scale_at};
use sluice_kernels::{Codes, Kernels, Matrix, scalar};

/// The model crate's `decode_row`, as it was.
fn model_decode_row(m: &Matrix<'_>, r: usize, cols: Range<usize>, out: &mut [f32]) {
    let bytes = m.row(r);
    match m.scales() {
        None => match m.codes() {
            Codes::BF16 => {
                let src = &bytes[2 * cols.start..2 * cols.end];
                for (o, b) in out.iter_mut().zip(src.chunks_exact(2)) {
                    *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
                }
            }
            Codes::F32 => {
                let src = &bytes[4 * cols.start..4 * cols.end];
                for (o, b) in out.iter_mut().zip(src.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            Codes::F16 => {
                let src = &bytes[2 * cols.start..2 * cols.end];
                for (o, b) in out.iter_mut().zip(src.chunks_exact(2)) {
                    *o = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
                }
            }
            codes => {
                for (o, j) in out.iter_mut().zip(cols) {
                    *o = scalar::code(codes, bytes, j);
                }
            }
        },
        Some(s) => {
            let srow = m.scale_row(r);
            for (o, j) in out.iter_mut().zip(cols) {
                let sc = scale_at(s.ty, srow, j / s.group_cols);
                *o = scalar::code(m.codes(), bytes, j) * sc;
            }
        }
    }
}

/// The model crate's `Exec::matmul_xw` over one column range (its per-thread `columns`), with
/// the kernels' `axpy` of `k`.
fn model_matmul_xw(
    k: &Kernels,
    m: &Matrix<'_>,
    x: &[f32],
    batch: usize,
    cols: Range<usize>,
) -> Vec<f32> {
    let n_in = m.rows();
    let w = cols.len();
    let mut part = vec![0f32; batch * w];
    let mut row = vec![0f32; w];
    for i in 0..n_in {
        model_decode_row(m, i, cols.clone(), &mut row);
        for b in 0..batch {
            k.axpy(x[b * n_in + i], &row, &mut part[b * w..(b + 1) * w]);
        }
    }
    part
}

/// The model crate's `attention::absorb`.
fn model_absorb(k: &Kernels, m: &Matrix<'_>, rows: Range<usize>, x: &[f32], out: &mut [f32]) {
    out.fill(0.0);
    let mut row = vec![0f32; m.cols()];
    for (i, r) in rows.enumerate() {
        model_decode_row(m, r, 0..m.cols(), &mut row);
        k.axpy(x[i], &row, out);
    }
}

/// The model crate's `attention::weighted_sum`.
fn model_weighted_sum(k: &Kernels, p: &[f32], v: &[f32], dim: usize, out: &mut [f32]) {
    out.fill(0.0);
    for (j, &pj) in p.iter().enumerate() {
        k.axpy(pj, &v[j * dim..(j + 1) * dim], out);
    }
}

/// Every kernel: the specification first.
fn all_kernels() -> Vec<Kernels> {
    let mut v = vec![spec()];
    v.extend(simd_kernels());
    v
}

/// Column ranges of a row of `n`: all, empty, and ones starting and ending off the 16-column
/// blocks, odd and even.
fn col_ranges(rng: &mut Rng, n: usize) -> Vec<Range<usize>> {
    let mut v = vec![0..n, 0..0, n..n];
    for _ in 0..6 {
        let a = rng.below(n as u64 + 1) as usize;
        let b = a + rng.below((n - a) as u64 + 1) as usize;
        v.push(a..b);
    }
    if n > 17 {
        v.extend([1..n, 17..n, 3..n - 1, 16..32.min(n)]);
    }
    v
}

fn cases(seed: u64) -> Vec<Case> {
    let mut rng = Rng(seed);
    let mut out = Vec::new();
    let shapes = [
        (1, 2),
        (3, 16),
        (5, 17),
        (7, 33),
        (2, 64),
        (9, 130),
        (4, 200),
        (33, 48),
    ];
    for &codes in &ALL_CODES {
        for &(rows, cols) in &shapes {
            let cols = if codes.row_bytes(cols).is_none() {
                cols + 1
            } else {
                cols
            };
            for &st in &ALL_SCALES {
                if !codes.is_quantized() && st != ALL_SCALES[0] {
                    continue;
                }
                let gc = [16, 32, 48, 128][rng.below(4) as usize];
                let gr = [1, 2, 3, 128][rng.below(4) as usize];
                let mode =
                    [Mode::Tame, Mode::Edges, Mode::Wild, Mode::Zeros][rng.below(4) as usize];
                let offset = rng.below(4) as usize;
                out.push(Case::new(
                    &mut rng, codes, rows, cols, offset, st, gc, gr, mode,
                ));
            }
        }
    }
    out
}

#[test]
fn decode_row_is_the_specification_and_the_model_code() {
    let mut rng = Rng(7);
    for case in cases(1) {
        let m = case.matrix();
        for r in 0..m.rows() {
            for cols in col_ranges(&mut rng, m.cols()) {
                let mut want = vec![0f32; cols.len()];
                model_decode_row(&m, r, cols.clone(), &mut want);
                for k in all_kernels() {
                    let mut got = vec![f32::from_bits(0x7fbf_dead); cols.len()];
                    k.decode_row(&m, r, cols.clone(), &mut got);
                    let what = format!(
                        "{:?} decode_row {:?} [{}, {}] r{r} {cols:?}",
                        k.isa(),
                        m.codes(),
                        m.rows(),
                        m.cols()
                    );
                    assert_same(&what, &got, &want);
                }
            }
        }
    }
}

#[test]
fn matmul_xw_is_the_specification_and_the_model_code() {
    let mut rng = Rng(11);
    for case in cases(2) {
        let m = case.matrix();
        for batch in [1, 2, 3, 5, 9] {
            let x: Vec<f32> = (0..batch * m.rows())
                .map(|_| value(&mut rng, Mode::Edges))
                .collect();
            let spec_all = model_matmul_xw(&spec(), &m, &x, batch, 0..m.cols());
            for cols in col_ranges(&mut rng, m.cols()) {
                let want = model_matmul_xw(&spec(), &m, &x, batch, cols.clone());
                // A column's value does not depend on the range it was computed in.
                for b in 0..batch {
                    let all = &spec_all[b * m.cols() + cols.start..b * m.cols() + cols.end];
                    assert_same(
                        "range independence",
                        &want[b * cols.len()..(b + 1) * cols.len()],
                        all,
                    );
                }
                for k in all_kernels() {
                    let mut got = vec![f32::from_bits(0x7fbf_dead); batch * cols.len()];
                    k.matmul_xw(&m, &x, &mut got, cols.clone());
                    let what = format!(
                        "{:?} matmul_xw {:?} [{}, {}] b{batch} {cols:?}",
                        k.isa(),
                        m.codes(),
                        m.rows(),
                        m.cols()
                    );
                    assert_same(&what, &got, &want);
                    // And the model code running on this ISA's axpy.
                    assert_same(
                        &what,
                        &model_matmul_xw(&k, &m, &x, batch, cols.clone()),
                        &want,
                    );
                }
            }
        }
    }
}

#[test]
fn absorb_is_the_specification_and_the_model_code() {
    let mut rng = Rng(13);
    for case in cases(3) {
        let m = case.matrix();
        for rows in col_ranges(&mut rng, m.rows()) {
            let x: Vec<f32> = (0..rows.len())
                .map(|_| value(&mut rng, Mode::Edges))
                .collect();
            let mut want = vec![0f32; m.cols()];
            model_absorb(&spec(), &m, rows.clone(), &x, &mut want);
            let mut s = vec![1f32; m.cols()];
            scalar::absorb(&m, rows.clone(), &x, &mut s);
            assert_same("scalar::absorb", &s, &want);
            for k in all_kernels() {
                let mut got = vec![f32::from_bits(0x7fbf_dead); m.cols()];
                k.absorb(&m, rows.clone(), &x, &mut got);
                let what = format!(
                    "{:?} absorb {:?} [{}, {}] {rows:?}",
                    k.isa(),
                    m.codes(),
                    m.rows(),
                    m.cols()
                );
                assert_same(&what, &got, &want);
            }
        }
    }
}

/// Matrices larger than one decoded panel (128 input rows × 256 columns), so that several
/// activation rows park their accumulators between row panels and column panels, and one or
/// two rows take more than one register tile of columns: the specification's bits on every
/// ISA, for every coding.
#[test]
fn matmul_xw_over_several_panels_is_the_specification() {
    let mut rng = Rng(31);
    for &codes in &ALL_CODES {
        for (rows, cols) in [(300, 530), (129, 257), (130, 40)] {
            let cols = if codes.row_bytes(cols).is_none() {
                cols + 1
            } else {
                cols
            };
            let st = ALL_SCALES[rng.below(ALL_SCALES.len() as u64) as usize];
            let case = Case::new(&mut rng, codes, rows, cols, 1, st, 32, 2, Mode::Edges);
            let m = case.matrix();
            for batch in [1usize, 2, 4, 6, 13] {
                let x: Vec<f32> = (0..batch * m.rows())
                    .map(|_| value(&mut rng, Mode::Edges))
                    .collect();
                for c in [0..m.cols(), 17..m.cols() - 3] {
                    let want = model_matmul_xw(&spec(), &m, &x, batch, c.clone());
                    for k in simd_kernels() {
                        let mut got = vec![f32::from_bits(0x7fbf_dead); batch * c.len()];
                        k.matmul_xw(&m, &x, &mut got, c.clone());
                        let what = format!(
                            "{:?} matmul_xw {codes:?} [{rows}, {cols}] b{batch} {c:?}",
                            k.isa()
                        );
                        assert_same(&what, &got, &want);
                    }
                }
            }
        }
    }
}

/// Several activation rows in one call give each row exactly what a call of its own gives,
/// whatever the ISA (a prefill absorbs every query of a head at once).
#[test]
fn absorb_over_several_rows_is_each_row_alone() {
    let mut rng = Rng(29);
    for case in cases(3) {
        let m = case.matrix();
        for rows in col_ranges(&mut rng, m.rows()) {
            for batch in [2usize, 5, 17] {
                let x: Vec<f32> = (0..batch * rows.len())
                    .map(|_| value(&mut rng, Mode::Edges))
                    .collect();
                for k in std::iter::once(spec()).chain(all_kernels()) {
                    let mut want = vec![0f32; batch * m.cols()];
                    for (b, w) in want.chunks_exact_mut(m.cols().max(1)).enumerate() {
                        let xb = &x[b * rows.len()..(b + 1) * rows.len()];
                        k.absorb(&m, rows.clone(), xb, w);
                    }
                    let mut got = vec![f32::from_bits(0x7fbf_dead); batch * m.cols()];
                    k.absorb(&m, rows.clone(), &x, &mut got);
                    let what = format!(
                        "{:?} absorb of {batch} rows {:?} [{}, {}] {rows:?}",
                        k.isa(),
                        m.codes(),
                        m.rows(),
                        m.cols()
                    );
                    assert_same(&what, &got, &want);
                    let mut s = vec![1f32; batch * m.cols()];
                    scalar::absorb(&m, rows.clone(), &x, &mut s);
                    assert_same(&format!("scalar {what}"), &s, &want);
                }
            }
        }
    }
}

#[test]
fn weighted_sum_is_the_specification_and_the_model_code() {
    let mut rng = Rng(17);
    for n in [0usize, 1, 2, 5, 16, 31, 100] {
        for dim in [0usize, 1, 7, 16, 33, 64, 128, 130] {
            for mode in [Mode::Tame, Mode::Edges, Mode::Wild, Mode::Zeros] {
                let p: Vec<f32> = (0..n).map(|_| value(&mut rng, mode)).collect();
                // One spare row past the `n` used: never read.
                let v: Vec<f32> = (0..(n + 1) * dim).map(|_| value(&mut rng, mode)).collect();
                let mut want = vec![0f32; dim];
                model_weighted_sum(&spec(), &p, &v, dim, &mut want);
                for k in all_kernels() {
                    let mut got = vec![f32::from_bits(0x7fbf_dead); dim];
                    k.weighted_sum(&p, &v, dim, &mut got);
                    assert_same(
                        &format!("{:?} weighted_sum {n}x{dim}", k.isa()),
                        &got,
                        &want,
                    );
                }
            }
        }
    }
}

/// Long rows and many input rows, where the tiles and the remainder paths all run.
#[test]
fn large_transposed_products() {
    let mut rng = Rng(19);
    for &codes in &ALL_CODES {
        let st = ALL_SCALES[rng.below(4) as usize];
        let case = Case::new(&mut rng, codes, 70, 1000, 1, st, 32, 1, Mode::Edges);
        let m = case.matrix();
        for batch in [1, 4, 7] {
            let x: Vec<f32> = (0..batch * m.rows())
                .map(|_| value(&mut rng, Mode::Tame))
                .collect();
            for cols in [0..1000, 5..999, 128..640] {
                let want = model_matmul_xw(&spec(), &m, &x, batch, cols.clone());
                for k in simd_kernels() {
                    let mut got = vec![0f32; batch * cols.len()];
                    k.matmul_xw(&m, &x, &mut got, cols.clone());
                    assert_same(
                        &format!("{:?} {codes:?} b{batch} {cols:?}", k.isa()),
                        &got,
                        &want,
                    );
                }
            }
        }
    }
}

#[test]
fn codes_of_dtypes() {
    for (d, c) in [
        (Dtype::F32, Codes::F32),
        (Dtype::BF16, Codes::BF16),
        (Dtype::F16, Codes::F16),
        (Dtype::F8E4M3, Codes::E4M3),
        (Dtype::I8, Codes::I8),
    ] {
        assert_eq!(Codes::for_dtype(d), Some(c));
        assert_eq!(c.container(), d);
    }
    for d in [
        Dtype::U8,
        Dtype::I32,
        Dtype::F64,
        Dtype::F8E5M2,
        Dtype::F8E8M0,
        Dtype::Bool,
    ] {
        assert_eq!(Codes::for_dtype(d), None, "{d}");
    }
    assert_eq!(Codes::Int4.container(), Dtype::I32);
    assert_eq!(Codes::E2M1.container(), Dtype::U8);
    use sluice_kernels::ScaleType;
    assert_eq!(ScaleType::for_dtype(Dtype::U8), Some(ScaleType::E8M0));
    assert_eq!(ScaleType::for_dtype(Dtype::F8E8M0), Some(ScaleType::E8M0));
    assert_eq!(ScaleType::for_dtype(Dtype::BF16), Some(ScaleType::BF16));
    assert_eq!(ScaleType::for_dtype(Dtype::I32), None);
    // decode_vec is the exact conversion, element by element.
    let b: Vec<u8> = [1.5f32, -2.0, 0.25]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(
        sluice_kernels::decode::decode_vec(Codes::F32, &b, 2),
        vec![1.5, -2.0]
    );
    let h = [0x00u8, 0x3c, 0x00, 0xc0];
    assert_eq!(
        sluice_kernels::decode::decode_vec(Codes::F16, &h, 2),
        vec![1.0, -2.0]
    );
    assert_eq!(
        sluice_kernels::decode::decode_vec(Codes::BF16, &h, 2),
        vec![bf16_to_f32(0x3c00), -2.0]
    );
}
