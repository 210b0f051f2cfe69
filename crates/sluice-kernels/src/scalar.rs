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
        Codes::Block(f) => {
            // One element of a block format: its block decoded (products go row by row).
            let (bs, ts) = (f.block_size(), f.type_size());
            let mut out = [0f32; crate::gguf::MAX_BLOCK];
            let b = j / bs;
            crate::gguf::dequantize_block(f, &row[b * ts..(b + 1) * ts], &mut out[..bs]);
            out[j % bs]
        }
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
    if let Codes::Block(f) = m.codes() {
        // Lengths were checked when the matrix was made.
        return crate::gguf::dot_row(f, row, x).unwrap_or(f32::NAN);
    }
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

/// Columns `cols` of row `r` of `m` as f32: the stored value, times its group's scale for
/// quantized codings (`code × scale`, one rounding). Every value is exact but for that one
/// rounding, so any correct decoder gives these bits.
pub fn decode_row(m: &Matrix<'_>, r: usize, cols: Range<usize>, out: &mut [f32]) {
    let bytes = m.row(r);
    if let Codes::Block(f) = m.codes() {
        return crate::gguf::decode_cols(f, bytes, cols, out);
    }
    match m.scales() {
        // The dense codings, one match per row rather than per element: the same exact
        // conversions as `code`, in loops the compiler vectorises.
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
                    *o = code(codes, bytes, j);
                }
            }
        },
        Some(s) => {
            let srow = m.scale_row(r);
            for (o, j) in out.iter_mut().zip(cols) {
                let sc = scale_at(s.ty, srow, j / s.group_cols);
                *o = code(m.codes(), bytes, j) * sc;
            }
        }
    }
}

/// The transposed product `y = x · W` over output columns `cols`, for a matrix stored
/// `[in, out]` (the `x @ W` layout, `in = m.rows()`, `out = m.cols()`): `x` is `[b, in]` and
/// `y` is `[b, cols.len()]`, `y[b, o − cols.start] = Σ_i x[b, i] · W[i, o]`.
///
/// Each output is accumulated over the input rows in order, `acc = fma(x[b, i], W[i, o],
/// acc)` from `+0.0` ([`axpy`] of each row decoded by [`decode_row`]). A value depends only on
/// its column, so splitting the columns (across threads) or the batch cannot change a bit.
pub fn matmul_xw(m: &Matrix<'_>, x: &[f32], y: &mut [f32], cols: Range<usize>) {
    xw_rows(m, 0..m.rows(), x, y, cols)
}

/// [`matmul_xw`] over the input rows `rows` of `m` only: `x` is `[b, rows.len()]`.
pub(crate) fn xw_rows(
    m: &Matrix<'_>,
    rows: Range<usize>,
    x: &[f32],
    y: &mut [f32],
    cols: Range<usize>,
) {
    let n_in = rows.len();
    let w = cols.len();
    y.fill(0.0);
    if w == 0 {
        return;
    }
    let batch = y.len() / w;
    let mut row = vec![0f32; w];
    for (i, r) in rows.enumerate() {
        decode_row(m, r, cols.clone(), &mut row);
        for b in 0..batch {
            axpy(x[b * n_in + i], &row, &mut y[b * w..(b + 1) * w]);
        }
    }
}

/// `out = Σ_i x[i] · m[rows.start + i, :]`: the transposed product over a range of rows (the
/// weight absorption of multi-head latent attention), accumulated row by row from `+0.0` with
/// [`axpy`] over each row decoded by [`decode_row`] (packed rows with their scales); for each
/// activation row of `x` (`rows.len()` values each) into the matching row of `out`
/// (`m.cols()` values each).
pub fn absorb(m: &Matrix<'_>, rows: Range<usize>, x: &[f32], out: &mut [f32]) {
    let n = rows.len();
    let mut row = vec![0f32; m.cols()];
    for (b, o) in out.chunks_exact_mut(m.cols().max(1)).enumerate() {
        o.fill(0.0);
        for (i, r) in rows.clone().enumerate() {
            decode_row(m, r, 0..m.cols(), &mut row);
            axpy(x[b * n + i], &row, o);
        }
    }
}

/// `probs · V` over cached rows: `out[d] = Σ_j p[j] · v[j, d]` for `v` holding `p.len()` rows of
/// `dim` values, accumulated from `+0.0` in position order with [`axpy`].
pub fn weighted_sum(p: &[f32], v: &[f32], dim: usize, out: &mut [f32]) {
    out.fill(0.0);
    for (j, &pj) in p.iter().enumerate() {
        axpy(pj, &v[j * dim..(j + 1) * dim], out);
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

const TANH_P: [f32; 5] = [
    -5.704_988_7e-3,
    2.063_909e-2,
    -5.373_971_6e-2,
    1.333_144_2e-1,
    -3.333_328e-1,
];

/// The hyperbolic tangent, by a fixed sequence of IEEE operations: NaN → NaN; for
/// `|x| < 0.625`, with `z = x²`, `p = (((c0 z + c1) z + c2) z + c3) z + c4` (each step one fma),
/// `tanh x = fma(p × z, x, x)`; otherwise `e = exp(2|x|)` ([`exp`]), `tanh |x| = 1 − 2 / (e + 1)`
/// with the sign of `x` (±1 once `e` overflows). About 2 ulp from the true value.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    if a < 0.625 {
        let z = x * x;
        let mut p = TANH_P[0];
        for &c in &TANH_P[1..] {
            p = p.mul_add(z, c);
        }
        return (p * z).mul_add(x, x);
    }
    let e = exp(a + a);
    let t = 1.0 - 2.0 / (e + 1.0);
    if x < 0.0 { -t } else { t }
}

const LN_P: [f32; 9] = [
    7.037_683_6e-2,
    -1.151_461_1e-1,
    1.167_699_9e-1,
    -1.242_014_1e-1,
    1.424_932_3e-1,
    -1.666_805_8e-1,
    2.000_071_5e-1,
    -2.499_999_4e-1,
    3.333_333e-1,
];

/// The natural logarithm, by a fixed sequence of IEEE operations: NaN or `x < 0` → NaN,
/// `±0` → −∞, +∞ → +∞; otherwise `x = m × 2^e` with `m` in `[√½, √2)` (exact, from the bits),
/// `f = m − 1`, `p = c0 f + c1 … + c8` (each step one fma), `y = p × f × f² − 2.12194440e-4 × e −
/// f²/2` and `ln x = (f + y) + 0.693359375 × e` (the split ln 2 of Cephes' `logf`). About 1 ulp.
#[inline(always)]
pub fn ln(x: f32) -> f32 {
    if x.is_nan() || x < 0.0 {
        return f32::NAN;
    }
    if x == 0.0 {
        return f32::NEG_INFINITY;
    }
    if x == f32::INFINITY {
        return x;
    }
    // Normalise subnormals exactly.
    let (x, bias) = if x < f32::MIN_POSITIVE {
        (x * 8_388_608.0, -23)
    } else {
        (x, 0)
    };
    let bits = x.to_bits();
    let mut e = ((bits >> 23) & 0xff) as i32 - 126 + bias;
    // m in [0.5, 1).
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f00_0000);
    if m < std::f32::consts::FRAC_1_SQRT_2 {
        e -= 1;
        m = m + m - 1.0;
    } else {
        m -= 1.0;
    }
    let z = m * m;
    let mut p = LN_P[0];
    for &c in &LN_P[1..] {
        p = p.mul_add(m, c);
    }
    let fe = e as f32;
    let mut y = p * m * z;
    y = (-2.121_944_4e-4f32).mul_add(fe, y);
    y = (-0.5f32).mul_add(z, y);
    let r = m + y;
    0.693_359_4f32.mul_add(fe, r)
}

/// Softplus as transformers' Kimi Linear forget gate writes it: `x` when `x > 20`, else
/// `ln(1 + exp(x))` ([`ln`], [`exp`]).
#[inline(always)]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { ln(1.0 + exp(x)) }
}

/// SiTU-GLU (Kimi K3): `out[i] = (β·tanh(g/β) · σ(g)) · (β_lin·tanh(u/β_lin))`, the sigmoid of
/// the uncapped gate; without `linear_beta` the up value is taken as it is.
pub fn situ_mul(gate: &[f32], up: &[f32], beta: f32, linear_beta: Option<f32>, out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        let a = beta * tanh(g / beta) * sigmoid(g);
        let u = match linear_beta {
            Some(lb) => lb * tanh(u / lb),
            None => u,
        };
        *o = a * u;
    }
}

/// L2 normalisation as FLA writes it: `out[i] = x[i] / sqrt(sum(x²) + eps)`, the sum of squares
/// by the dot-product contract.
pub fn l2norm(x: &[f32], eps: f32, out: &mut [f32]) {
    let r = (dot(x, x) + eps).sqrt();
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v / r;
    }
}

/// A sigmoid gate: `x[i] = x[i] × σ(gate[i])`.
pub fn mul_sigmoid(x: &mut [f32], gate: &[f32]) {
    for (v, &g) in x.iter_mut().zip(gate) {
        *v *= sigmoid(g);
    }
}

/// A depthwise causal convolution with SiLU for one position: `window` holds the last `k`
/// inputs, oldest first, `[k, channels]` row-major; `w` the taps transposed, `[k, channels]`
/// (tap `j` of every channel in row `j`; the last tap weighs the newest input).
/// `out[c] = silu(acc)` where `acc` starts at `+0.0` and takes `fma(w[j, c], window[j, c], acc)`
/// for `j = 0 … k − 1`.
pub fn conv_silu(window: &[f32], w: &[f32], out: &mut [f32]) {
    let c = out.len();
    for (ch, o) in out.iter_mut().enumerate() {
        let mut acc = 0f32;
        for (wr, xr) in w.chunks_exact(c).zip(window.chunks_exact(c)) {
            acc = wr[ch].mul_add(xr[ch], acc);
        }
        *o = silu(acc);
    }
}

/// One token of Kimi Delta Attention for one head (the gated delta rule with a decay per key
/// channel), updating `state` (`[dk, dv]` row-major, key channel `i` in row `i`) in place:
///
/// 1. `S[i] ← S[i] × decay[i]` (one rounding per element), and `u = Σ_i k[i] · S[i]`
///    accumulated from `+0.0` over `i` in order, `u ← fma(k[i], S[i], u)` (element-wise);
/// 2. `d[j] = (v[j] − u[j]) × beta`;
/// 3. `S[i] ← fma(k[i], d, S[i])` and `out = Σ_i q[i] · S[i]` (the updated rows), accumulated
///    like `u`.
///
/// `decay` is `exp(g)` of the gate; `q` is already scaled. `u` is scratch of `dv` values.
#[allow(clippy::too_many_arguments)]
pub fn kda_step(
    state: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    decay: &[f32],
    beta: f32,
    u: &mut [f32],
    out: &mut [f32],
) {
    let dv = v.len();
    u.fill(0.0);
    for ((row, &a), &ki) in state.chunks_exact_mut(dv).zip(decay).zip(k) {
        for s in row.iter_mut() {
            *s *= a;
        }
        axpy(ki, row, u);
    }
    for (d, &vj) in u.iter_mut().zip(v) {
        *d = (vj - *d) * beta;
    }
    out.fill(0.0);
    for ((row, &ki), &qi) in state.chunks_exact_mut(dv).zip(k).zip(q) {
        axpy(ki, u, row);
        axpy(qi, row, out);
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
    fn tanh_ln_softplus_accuracy() {
        let mut worst_t = 0f64;
        let mut x = -12.0f32;
        while x < 12.0 {
            let got = tanh(x) as f64;
            let want = (x as f64).tanh();
            worst_t = worst_t.max((got - want).abs() / want.abs().max(1e-30));
            x += 0.0037;
        }
        assert!(worst_t < 4e-7, "tanh worst relative error {worst_t}");
        assert_eq!(tanh(0.0), 0.0);
        assert_eq!(tanh(100.0), 1.0);
        assert_eq!(tanh(-100.0), -1.0);
        assert!(tanh(f32::NAN).is_nan());
        assert!((tanh(1e-20) - 1e-20).abs() < 1e-26);
        let mut worst_l = 0f64;
        let mut x = 1e-30f32;
        while x < 1e30 {
            let got = ln(x) as f64;
            let want = (x as f64).ln();
            worst_l = worst_l.max((got - want).abs() / want.abs().max(1.0));
            x *= 1.0137;
        }
        assert!(worst_l < 2e-7, "ln worst error {worst_l}");
        for x in [0.5f32, 0.7, 0.75, 1.0, 1.5, 2.0, 1e-40] {
            let (got, want) = (ln(x) as f64, (x as f64).ln());
            assert!(
                (got - want).abs() <= 2e-7 * want.abs().max(1.0),
                "ln {x}: {got} vs {want}"
            );
        }
        assert_eq!(ln(1.0), 0.0);
        assert_eq!(ln(0.0), f32::NEG_INFINITY);
        assert!(ln(-1.0).is_nan());
        let mut x = -30.0f32;
        while x < 30.0 {
            let got = softplus(x) as f64;
            let want = if x > 20.0 {
                x as f64
            } else {
                // As the f32 formula rounds: 1 + e^x in f32, then the logarithm.
                ((1.0f32 + (x as f64).exp() as f32) as f64).ln()
            };
            assert!(
                // One ulp of 1 + e^x (the formula's own rounding) plus the relative error.
                (got - want).abs() <= 2.5e-7 + 3e-7 * want.abs(),
                "softplus {x}: {got} vs {want}"
            );
            x += 0.01;
        }
    }

    #[test]
    fn situ_matches_its_definition() {
        let g = [-30.0f32, -2.0, -0.1, 0.0, 0.3, 3.0, 50.0];
        let u = [400.0f32, -1.0, 0.5, 2.0, -60.0, 7.0, 0.25];
        let mut out = [0f32; 7];
        situ_mul(&g, &u, 4.0, Some(25.0), &mut out);
        for i in 0..7 {
            let (gd, ud) = (g[i] as f64, u[i] as f64);
            let want = 4.0 * (gd / 4.0).tanh() / (1.0 + (-gd).exp()) * 25.0 * (ud / 25.0).tanh();
            assert!(
                (out[i] as f64 - want).abs() <= 1e-6 * want.abs().max(1e-3),
                "{i}"
            );
        }
        situ_mul(&g, &u, 4.0, None, &mut out);
        let want = 4.0 * (3.0f64 / 4.0).tanh() / (1.0 + (-3.0f64).exp()) * 7.0;
        assert!((out[5] as f64 - want).abs() < 1e-5);
    }

    #[test]
    fn kda_step_is_the_delta_rule() {
        // One head, dk = 3, dv = 2, against the definition in f64.
        let mut s = vec![0.5f32, -1.0, 0.25, 2.0, -0.75, 0.125];
        let s0: Vec<f64> = s.iter().map(|&v| v as f64).collect();
        let (q, k, v) = ([0.3f32, -0.2, 0.9], [0.6f32, 0.8, 0.0], [1.5f32, -0.5]);
        let decay = [0.9f32, 0.5, 1.0];
        let beta = 0.7f32;
        let (mut u, mut o) = ([0f32; 2], [0f32; 2]);
        kda_step(&mut s, &q, &k, &v, &decay, beta, &mut u, &mut o);
        let mut sd = s0.clone();
        for i in 0..3 {
            for j in 0..2 {
                sd[i * 2 + j] *= decay[i] as f64;
            }
        }
        let um: Vec<f64> = (0..2)
            .map(|j| (0..3).map(|i| k[i] as f64 * sd[i * 2 + j]).sum())
            .collect();
        for i in 0..3 {
            for j in 0..2 {
                sd[i * 2 + j] += k[i] as f64 * (v[j] as f64 - um[j]) * beta as f64;
            }
        }
        for j in 0..2 {
            let want: f64 = (0..3).map(|i| q[i] as f64 * sd[i * 2 + j]).sum();
            assert!((o[j] as f64 - want).abs() < 1e-6, "out {j}");
        }
        for (a, b) in s.iter().zip(&sd) {
            assert!((*a as f64 - b).abs() < 1e-6);
        }
    }

    #[test]
    fn conv_silu_taps_in_order() {
        // 2 channels, 3 taps; the last tap weighs the newest input.
        let window = [1.0f32, 10.0, 2.0, 20.0, 3.0, 30.0];
        let w = [0.5f32, 0.0, 0.25, 0.0, 1.0, 0.1];
        let mut out = [0f32; 2];
        conv_silu(&window, &w, &mut out);
        assert_eq!(out[0], silu(0.5 + 0.5 + 3.0));
        assert_eq!(out[1], silu(3.0));
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
