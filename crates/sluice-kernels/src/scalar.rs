//! The scalar kernels. They are the specification: every other implementation must return
//! exactly these bits.
//!
//! # The numeric contract
//!
//! **Dot products** (the heart of every matrix product) use 16 lanes. Element `j` of a row
//! goes to lane `j mod 16`; a row is processed in blocks of 16 columns, and a block that runs
//! past the end of the row is padded with zero weights and zero activations (which still go
//! through the fused multiply-add). Each lane accumulates with `fma(w, x, acc)` — one rounding —
//! starting from `+0.0`. At the end the 16 lanes are combined by a fixed pairwise tree:
//! `s8[i] = a[i] + a[i+8]`, `s4[i] = s8[i] + s8[i+4]`, `s2[i] = s4[i] + s4[i+2]`,
//! `s = s2[0] + s2[1]`. Nothing depends on the vector width of the machine.
//!
//! **Quantized rows** (scales per group of `G` columns, `G` a multiple of 16) accumulate each
//! group separately: `g[i] = fma(code, x, g[i])` from `+0.0` over the group's blocks (codes are
//! the exact unscaled values: `q − 8` for INT4, the E2M1 or E4M3 value, the int8), then
//! `acc[i] = fma(g[i], scale, acc[i])`, then the same tree. Codes and scales convert to f32
//! exactly, so no rounding hides in decoding.
//!
//! Every (activation row, output row) pair is computed by this one procedure, so a result never
//! depends on how many rows share a call, which rows a thread owns, or the ISA.
//!
//! **Row ops** are written with explicit IEEE operations (no library transcendental functions):
//! [`exp`] is a fixed polynomial so that vector code can reproduce it exactly.

use std::ops::Range;

use crate::decode::{E2M1_TABLE, E4M3_TABLE, INT4_TABLE, bf16_to_f32, f16_to_f32, scale_at};
use crate::matrix::{Codes, Matrix};

/// Lanes of the reduction in the numeric contract.
pub const LANES: usize = 16;

/// The fixed pairwise reduction of 16 lanes.
#[inline(always)]
pub fn tree(a: &[f32; LANES]) -> f32 {
    let mut s8 = [0f32; 8];
    for i in 0..8 {
        s8[i] = a[i] + a[i + 8];
    }
    let mut s4 = [0f32; 4];
    for i in 0..4 {
        s4[i] = s8[i] + s8[i + 4];
    }
    let s2 = [s4[0] + s4[2], s4[1] + s4[3]];
    s2[0] + s2[1]
}

/// The unscaled value of element `j` of a stored row.
#[inline(always)]
pub fn code(codes: Codes, row: &[u8], j: usize) -> f32 {
    match codes {
        Codes::F32 => {
            f32::from_le_bytes([row[4 * j], row[4 * j + 1], row[4 * j + 2], row[4 * j + 3]])
        }
        Codes::BF16 => bf16_to_f32(u16::from_le_bytes([row[2 * j], row[2 * j + 1]])),
        Codes::F16 => f16_to_f32(u16::from_le_bytes([row[2 * j], row[2 * j + 1]])),
        Codes::E4M3 => E4M3_TABLE[row[j] as usize],
        Codes::Int4 => INT4_TABLE[((row[j / 2] >> (4 * (j & 1))) & 15) as usize],
        Codes::E2M1 => E2M1_TABLE[((row[j / 2] >> (4 * (j & 1))) & 15) as usize],
        Codes::I8 => row[j] as i8 as f32,
    }
}

/// Accumulates columns `start..end` of a stored row against `x` into `acc`, lane `j mod 16`,
/// padding the last block with zeros. `start` must be a multiple of 16.
#[inline(always)]
fn accumulate(
    codes: Codes,
    row: &[u8],
    x: &[f32],
    start: usize,
    end: usize,
    acc: &mut [f32; LANES],
) {
    let mut j0 = start;
    while j0 < end {
        for (i, a) in acc.iter_mut().enumerate() {
            let j = j0 + i;
            let (w, xv) = if j < end {
                (code(codes, row, j), x[j])
            } else {
                (0.0, 0.0)
            };
            *a = w.mul_add(xv, *a);
        }
        j0 += LANES;
    }
}

/// Row `r` of `m` dotted with `x` (length `m.cols()`), by the contract.
pub fn dot_row(m: &Matrix<'_>, r: usize, x: &[f32]) -> f32 {
    let row = m.row(r);
    let n = m.cols();
    let mut acc = [0f32; LANES];
    match m.scales() {
        None => accumulate(m.codes(), row, x, 0, n, &mut acc),
        Some(s) => {
            let srow = m.scale_row(r);
            let g = s.group_cols;
            for gi in 0..n.div_ceil(g) {
                let start = gi * g;
                let end = (start + g).min(n);
                let mut gacc = [0f32; LANES];
                accumulate(m.codes(), row, x, start, end, &mut gacc);
                let sc = scale_at(s.ty, srow, gi);
                for (a, ga) in acc.iter_mut().zip(gacc) {
                    *a = ga.mul_add(sc, *a);
                }
            }
        }
    }
    tree(&acc)
}

/// `y[b, r − rows.start] = m[r] · x[b]` for every activation row `b` and `r` in `rows`.
pub fn matmul(m: &Matrix<'_>, x: &[f32], y: &mut [f32], rows: Range<usize>) {
    let cols = m.cols();
    let nr = rows.len();
    if nr == 0 {
        return;
    }
    for (xb, yb) in x.chunks_exact(cols.max(1)).zip(y.chunks_exact_mut(nr)) {
        for (k, r) in rows.clone().enumerate() {
            yb[k] = dot_row(m, r, xb);
        }
    }
}

/// `a · b` for f32 vectors of equal length, by the contract.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let mut acc = [0f32; LANES];
    let mut j0 = 0;
    while j0 < n {
        for (i, s) in acc.iter_mut().enumerate() {
            let j = j0 + i;
            let (u, v) = if j < n { (a[j], b[j]) } else { (0.0, 0.0) };
            *s = u.mul_add(v, *s);
        }
        j0 += LANES;
    }
    tree(&acc)
}

/// Sum of `x` in the contract's lane order (the dot product with ones, without the multiply).
pub fn sum(x: &[f32]) -> f32 {
    let n = x.len();
    let mut acc = [0f32; LANES];
    let mut j0 = 0;
    while j0 < n {
        for (i, s) in acc.iter_mut().enumerate() {
            let j = j0 + i;
            *s += if j < n { x[j] } else { 0.0 };
        }
        j0 += LANES;
    }
    tree(&acc)
}

/// `y[i] = fma(a, x[i], y[i])`.
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi = a.mul_add(xi, *yi);
    }
}

// ---- transcendental functions, written out so vector code can match them bit for bit ----

const EXP_HI: f32 = 88.722_84;
const EXP_LO: f32 = -87.336_54;
const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
const EXP_P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// `e^x` to within about 1 ulp, by a fixed sequence of IEEE operations:
/// NaN → NaN; `x > 88.72284` → +∞; `x < −87.33654` → +0; otherwise with
/// `n = round_ties_even(x × log2 e)`, `r = fma(−n, ln2_lo, fma(−n, ln2_hi, x))`,
/// `p = ((((c0 r + c1) r + c2) r + c3) r + c4) r + c5` (each step one fma),
/// `e^x = (fma(p, r × r, r) + 1) × 2^n`.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x > EXP_HI {
        return f32::INFINITY;
    }
    if x < EXP_LO {
        return 0.0;
    }
    let n = (x * LOG2E).round_ties_even();
    let r = (-n).mul_add(LN2_HI, x);
    let r = (-n).mul_add(LN2_LO, r);
    let mut p = EXP_P[0];
    for &c in &EXP_P[1..] {
        p = p.mul_add(r, c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    // n is in [-126, 128]; split the power so that 2^128 never has to be formed.
    let ni = n as i32;
    let half = ni / 2;
    y * pow2i(half) * pow2i(ni - half)
}

#[inline(always)]
fn pow2i(n: i32) -> f32 {
    f32::from_bits(((n + 127) as u32) << 23)
}

/// The logistic function `1 / (1 + e^−x)`.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// SiLU, `x / (1 + e^−x)`.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// `out[i] = silu(gate[i]) × up[i]` (SwiGLU).
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu(g) * u;
    }
}

/// RMSNorm: `out[i] = w[i] × (x[i] × r)` with `r = 1 / sqrt(sum(x²) / n + eps)`, the sum of
/// squares taken by the dot-product contract.
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss = dot(x, x);
    let r = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for ((o, &xi), &wi) in out.iter_mut().zip(x).zip(w) {
        *o = wi * (xi * r);
    }
}

/// Softmax in place: `m = max(x)`, `e[i] = exp(x[i] − m)`, `x[i] = e[i] / sum(e)` with the
/// sum in the contract's lane order. An empty slice is left alone; NaN propagates.
pub fn softmax(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let mut m = f32::NEG_INFINITY;
    for &v in x.iter() {
        if v > m || v.is_nan() {
            m = v;
            if v.is_nan() {
                break;
            }
        }
    }
    for v in x.iter_mut() {
        *v = exp(*v - m);
    }
    let s = sum(x);
    for v in x.iter_mut() {
        *v /= s;
    }
}

/// Rotates pairs `(x[i], x[i + d/2])` (the half-split, "rotate_half" layout) by angles whose
/// cosines and sines are `cos[i]`, `sin[i]` for `i < d/2`:
/// `x[i] ← x[i]·c − x[i+d/2]·s`, `x[i+d/2] ← x[i+d/2]·c + x[i]·s` (products rounded, no fma).
pub fn rope_half(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let h = x.len() / 2;
    for i in 0..h.min(cos.len()) {
        let (a, b) = (x[i], x[i + h]);
        x[i] = a * cos[i] - b * sin[i];
        x[i + h] = b * cos[i] + a * sin[i];
    }
}

/// Rotates adjacent pairs `(x[2i], x[2i+1])` (the interleaved layout) by the angles of
/// `cos[i]`, `sin[i]`, with the same arithmetic as [`rope_half`].
pub fn rope_interleaved(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    for i in 0..(x.len() / 2).min(cos.len()) {
        let (a, b) = (x[2 * i], x[2 * i + 1]);
        x[2 * i] = a * cos[i] - b * sin[i];
        x[2 * i + 1] = b * cos[i] + a * sin[i];
    }
}

/// The `k` largest entries as `(index, value)`, largest first. Ties go to the lower index;
/// NaN ranks below every number. `k` larger than the input returns everything.
pub fn top_k(x: &[f32], k: usize) -> Vec<(usize, f32)> {
    let key = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
    let mut out: Vec<(usize, f32)> = Vec::with_capacity(k.min(x.len()) + 1);
    for (i, &v) in x.iter().enumerate() {
        let kv = key(v);
        // Position among the kept entries: after every entry that ranks at least as high.
        let pos = out.partition_point(|&(_, o)| key(o) >= kv);
        if pos < k {
            out.insert(pos, (i, v));
            out.truncate(k);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::{ScaleType, Scales};

    #[test]
    fn exp_accuracy() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let got = exp(x) as f64;
            let want = (x as f64).exp();
            worst = worst.max(((got - want) / want).abs());
            x += 0.013;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert_eq!(exp(-100.0), 0.0);
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(88.7).is_finite());
        assert!(exp(-87.3) > 0.0);
    }

    #[test]
    fn sigmoid_and_silu_limits() {
        assert_eq!(sigmoid(0.0), 0.5);
        assert_eq!(sigmoid(200.0), 1.0);
        assert_eq!(sigmoid(-200.0), 0.0);
        assert_eq!(silu(-200.0), 0.0);
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
    }

    #[test]
    fn tree_order_is_fixed() {
        let mut a = [0f32; 16];
        a[0] = 1e8;
        a[8] = -1e8;
        a[1] = 1.0;
        assert_eq!(tree(&a), 1.0);
    }

    #[test]
    fn top_k_ties_and_nan() {
        let v = [1.0, 3.0, f32::NAN, 3.0, 2.0];
        let t = top_k(&v, 3);
        assert_eq!(t.iter().map(|p| p.0).collect::<Vec<_>>(), vec![1, 3, 4]);
        assert_eq!(top_k(&v, 9).len(), 5);
        assert_eq!(top_k(&v, 9)[4].0, 2);
        assert!(top_k(&v, 0).is_empty());
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut v = [1.0f32, 2.0, 3.0, -1.0];
        softmax(&mut v);
        let s: f64 = v.iter().map(|&x| x as f64).sum();
        assert!((s - 1.0).abs() < 1e-6);
        assert!(v[2] > v[1] && v[1] > v[0] && v[0] > v[3]);
    }

    #[test]
    fn int4_group_dot_matches_f64() {
        // 2 rows x 40 columns, group 32 (second group partial), bf16 scales.
        let rows = 2;
        let cols = 40;
        let mut packed = vec![0u8; rows * cols / 2];
        for (i, b) in packed.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(37);
        }
        let scales_f = [0.5f32, -0.25, 2.0, 1.0];
        let scales: Vec<u8> = scales_f
            .iter()
            .flat_map(|&s| crate::decode::f32_to_bf16(s).to_le_bytes())
            .collect();
        let m = Matrix::quantized(
            Codes::Int4,
            &packed,
            rows,
            cols,
            Scales {
                data: &scales,
                ty: ScaleType::BF16,
                group_cols: 32,
                group_rows: 1,
            },
        )
        .unwrap();
        let x: Vec<f32> = (0..cols).map(|j| (j as f32 * 0.37).sin()).collect();
        for r in 0..rows {
            let mut want = 0f64;
            for j in 0..cols {
                let byte = packed[r * cols / 2 + j / 2];
                let q = ((byte >> (4 * (j % 2))) & 15) as f64 - 8.0;
                want += q * scales_f[r * 2 + j / 32] as f64 * x[j] as f64;
            }
            let got = dot_row(&m, r, &x) as f64;
            assert!((got - want).abs() < 1e-5, "row {r}: {got} vs {want}");
        }
    }

    #[test]
    fn rope_layouts_agree_up_to_permutation() {
        let x: Vec<f32> = (0..8).map(|i| i as f32 + 0.5).collect();
        let cos = [0.3f32, 0.6, 0.9, -0.2];
        let sin = [0.7f32, -0.1, 0.4, 0.8];
        let mut inter = x.clone();
        rope_interleaved(&mut inter, &cos, &sin);
        // Interleaved pairs (0,1),(2,3).. are half-split pairs after [evens | odds].
        let mut half: Vec<f32> = x
            .iter()
            .step_by(2)
            .chain(x.iter().skip(1).step_by(2))
            .copied()
            .collect();
        rope_half(&mut half, &cos, &sin);
        for i in 0..4 {
            assert_eq!(inter[2 * i], half[i]);
            assert_eq!(inter[2 * i + 1], half[i + 4]);
        }
    }
}
