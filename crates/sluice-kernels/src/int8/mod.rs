//! The integer numeric mode (`int8`): quantized weights times 8-bit activations in exact integer
//! arithmetic, the numerics users of llama.cpp get from a quantized GGUF file, with sluice's
//! promise kept — the same bits on every ISA, thread count, batch and chunk.
//!
//! # The specification
//!
//! This module is the specification; a SIMD path must return exactly its bits.
//!
//! **Activations.** Each activation row is quantized on its own, in blocks of the weight
//! format's activation type (llama.cpp's `vec_dot_type`, [`ActKind::for_format`]), exactly as
//! llama.cpp's reference quantizers do:
//! - `Q8_K` (256 values; the k-quants): `max` is the first value of largest magnitude,
//!   `iscale = −127 / max`, `q = min(127, nearest_int(iscale × x))` (`nearest_int` rounds half
//!   to even), `d = 1 / iscale`, and `bsums` the sums of each 16 codes. A block of zeros has
//!   `d = 0` and zero codes. (`quantize_row_q8_K_ref`.)
//! - `Q8_0` (32 values): `amax = max |x|`, `d = amax / 127`, `id = 1 / d` (0 when `d` is 0),
//!   `q = round(x × id)` (half away from zero), and `d` stored as f16 (round to nearest even)
//!   and used as that f16's value. (`quantize_row_q8_0_ref`.)
//! - `Q8_1` (32 values; formats with a min): `Q8_0`'s codes and `d`, and `s` = the f16 of
//!   `d × Σ q`. (`quantize_row_q8_1_ref`.)
//!
//! **Integer sums.** Per weight block (the super-block of 256 for the k-quants) the products of
//! weight codes and activation codes are summed exactly in i32, the k-quants' 6- or 8-bit
//! sub-block scales applied to each sub-block's sum in integers too: `isum = Σ_g sc_g × Σ_{j ∈ g}
//! q_j a_j`, and for formats with mins `msum = Σ_g m_g × Σ_{j ∈ g} a_j` (from `bsums`). No sum
//! can overflow i32 (the largest, Q6_K's, stays below 2^28).
//!
//! **The float epilogue.** Per output value, `acc` starts at `+0.0` and takes each block in
//! order, every operation rounded to f32 (no fused multiply-add), the sums converted to f32
//! once per block (exact below 2^24, correctly rounded above):
//!
//! | format | activation | `acc ←` |
//! |---|---|---|
//! | Q8_0, Q4_0, Q5_0, IQ4_NL, MXFP4 | Q8_0 | `acc + (d_w × d_a) × isum` |
//! | Q4_1, Q5_1 | Q8_1 | `acc + ((d_w × d_a) × isum + m_w × s_a)` |
//! | Q4_K, Q5_K | Q8_K | `acc + ((d_w × d_a) × isum − (dmin_w × d_a) × msum)` |
//! | Q6_K, IQ4_XS | Q8_K | `acc + (d_w × d_a) × isum` |
//!
//! where the weight block's codes are: Q8_0 the int8 values; Q4_0 `q − 8`, Q5_0 `q − 16`; Q4_1,
//! Q5_1, Q4_K, Q5_K the unsigned `q`; Q6_K `q − 32` with signed 8-bit scales; IQ4_NL and IQ4_XS
//! the non-linear table's `kv[q]` (IQ4_XS with the 6-bit scales `ls − 32` per 32); MXFP4 the
//! doubled E2M1 values `2·e2m1[q]` with `d_w` half its E8M0 scale (llama.cpp's
//! `GGML_E8M0_TO_FP32_HALF`). The other formats run the exact f32 path in this mode.

use crate::decode::f16_to_f32;
use crate::gguf::{BlockFormat, QK_K, scale_min_k4};
use crate::{Codes, Matrix};

#[cfg(test)]
mod tests;

/// The block type activations are quantized to for a weight format's integer product.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum ActKind {
    /// 32 codes, an f16 scale.
    Q8_0,
    /// 32 codes, an f16 scale and the f16 of scale × sum.
    Q8_1,
    /// 256 codes, an f32 scale, sums of each 16.
    Q8_K,
}

impl ActKind {
    /// The activation blocks of `f`'s integer product, `None` when `f` runs the exact f32 path
    /// in the integer mode too.
    pub fn for_format(f: BlockFormat) -> Option<ActKind> {
        use BlockFormat::*;
        match f {
            Q8_0 | Q4_0 | Q5_0 | IQ4_NL | MXFP4 => Some(ActKind::Q8_0),
            Q4_1 | Q5_1 => Some(ActKind::Q8_1),
            Q4_K | Q5_K | Q6_K | IQ4_XS => Some(ActKind::Q8_K),
            _ => None,
        }
    }

    /// Values per block.
    pub fn block(self) -> usize {
        match self {
            ActKind::Q8_0 | ActKind::Q8_1 => 32,
            ActKind::Q8_K => QK_K,
        }
    }
}

/// Activation rows quantized to one [`ActKind`]: `rows` rows of `cols` codes.
#[derive(Clone, Debug, PartialEq)]
pub struct QActs {
    kind: ActKind,
    cols: usize,
    /// The codes, row after row.
    pub(crate) qs: Vec<i8>,
    /// Each block's scale (Q8_0 and Q8_1: the value of its f16).
    pub(crate) d: Vec<f32>,
    /// Q8_1: each block's `s` (the value of its f16); empty otherwise.
    pub(crate) s: Vec<f32>,
    /// Q8_K: each block's sums of 16 codes; empty otherwise.
    pub(crate) bsums: Vec<i16>,
}

impl QActs {
    /// The block type.
    pub fn kind(&self) -> ActKind {
        self.kind
    }

    /// Values per row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.qs.len().checked_div(self.cols).unwrap_or(0)
    }

    /// Row `i`'s codes.
    pub fn codes(&self, i: usize) -> &[i8] {
        &self.qs[i * self.cols..(i + 1) * self.cols]
    }

    /// Row `i`'s block scales.
    pub fn scales(&self, i: usize) -> &[f32] {
        let nb = self.cols / self.kind.block();
        &self.d[i * nb..(i + 1) * nb]
    }

    /// Row `i`'s block sums `s` (Q8_1).
    pub fn sums(&self, i: usize) -> &[f32] {
        let nb = self.cols / self.kind.block();
        &self.s[i * nb..(i + 1) * nb]
    }

    /// Row `i`'s sums of 16 codes (Q8_K).
    pub fn bsums(&self, i: usize) -> &[i16] {
        let n = self.cols / 16;
        &self.bsums[i * n..(i + 1) * n]
    }
}

/// The f16 nearest `x` (ties to even), as f32: what llama.cpp stores as a block's `d`.
fn f16_round(x: f32) -> f32 {
    f16_to_f32(half::f16::from_f32(x).to_bits())
}

/// Quantizes activation rows (`x`: rows of `cols` values, `cols` a multiple of the block) as
/// the module's specification says.
///
/// # Panics
/// When `cols` is not a multiple of `kind.block()` or `x.len()` of `cols`.
pub fn quantize(kind: ActKind, x: &[f32], cols: usize) -> QActs {
    let mut q = QActs {
        kind,
        cols,
        qs: Vec::new(),
        d: Vec::new(),
        s: Vec::new(),
        bsums: Vec::new(),
    };
    quantize_into(&mut q, kind, x, cols);
    q
}

/// [`quantize`] into `q`, whose buffers are reused.
pub(crate) fn quantize_into(q: &mut QActs, kind: ActKind, x: &[f32], cols: usize) {
    let bl = kind.block();
    assert!(
        cols > 0 && cols.is_multiple_of(bl),
        "{cols} columns in blocks of {bl}"
    );
    assert!(
        x.len().is_multiple_of(cols),
        "{} values in rows of {cols}",
        x.len()
    );
    let nb = x.len() / bl;
    q.kind = kind;
    q.cols = cols;
    q.qs.resize(x.len(), 0);
    q.d.resize(nb, 0.0);
    q.s.clear();
    q.bsums.clear();
    match kind {
        ActKind::Q8_K => {
            q.bsums.resize(x.len() / 16, 0);
            for (b, xb) in x.chunks_exact(bl).enumerate() {
                let qs = &mut q.qs[b * bl..(b + 1) * bl];
                q.d[b] = quantize_q8_k(xb, qs);
                for (s, c) in q.bsums[b * 16..(b + 1) * 16]
                    .iter_mut()
                    .zip(qs.chunks_exact(16))
                {
                    *s = c.iter().map(|&v| v as i16).sum();
                }
            }
        }
        ActKind::Q8_0 | ActKind::Q8_1 => {
            if kind == ActKind::Q8_1 {
                q.s.resize(nb, 0.0);
            }
            for (b, xb) in x.chunks_exact(bl).enumerate() {
                let qs = &mut q.qs[b * bl..(b + 1) * bl];
                let d = quantize_q8_0(xb, qs);
                q.d[b] = f16_round(d);
                if kind == ActKind::Q8_1 {
                    let sum: i32 = qs.iter().map(|&v| v as i32).sum();
                    q.s[b] = f16_round(sum as f32 * d);
                }
            }
        }
    }
}

/// `quantize_row_q8_K_ref` for one block: fills `qs`, returns `d`.
fn quantize_q8_k(x: &[f32], qs: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        qs.fill(0);
        return 0.0;
    }
    let iscale = -127.0 / max;
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = nearest_int(iscale * v).min(127) as i8;
    }
    1.0 / iscale
}

/// `quantize_row_q8_0_ref` for one block: fills `qs`, returns `d` before its f16 rounding.
fn quantize_q8_0(x: &[f32], qs: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round() as i8;
    }
    d
}

/// ggml's `nearest_int`: the nearest integer, ties to even, by its magic-number addition
/// (exact for |x| ≤ 2^22, far beyond the ±127.5 it sees here; the same as `round_ties_even`,
/// without a call into the maths library).
fn nearest_int(x: f32) -> i32 {
    debug_assert!(x.abs() <= 4_194_303.0);
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// The dot product of one stored row of `f` (`row`) with activation row `i` of `a`, as the
/// module's specification says.
///
/// # Panics
/// When `a`'s kind is not `f`'s or the lengths disagree.
pub fn dot(f: BlockFormat, row: &[u8], a: &QActs, i: usize) -> f32 {
    assert_eq!(
        ActKind::for_format(f),
        Some(a.kind),
        "{f:?} with {:?}",
        a.kind
    );
    let (ts, bl) = (f.type_size(), f.block_size());
    assert_eq!(
        row.len() / ts * bl,
        a.cols,
        "{f:?} row against {} columns",
        a.cols
    );
    let qs = a.codes(i);
    let d = a.scales(i);
    let bsums = if a.kind == ActKind::Q8_K {
        a.bsums(i)
    } else {
        &[]
    };
    let mut acc = 0f32;
    for (b, blk) in row.chunks_exact(ts).enumerate() {
        let q = &qs[b * bl..(b + 1) * bl];
        let bs = bsums.get(b * 16..(b + 1) * 16).unwrap_or(&[]);
        let sum = block_isum(f, blk, q) as f32;
        acc = match f {
            BlockFormat::Q4_1 | BlockFormat::Q5_1 => {
                let (dw, mw) = (h(blk, 0), h(blk, 2));
                acc + ((dw * d[b]) * sum + mw * a.sums(i)[b])
            }
            BlockFormat::Q4_K | BlockFormat::Q5_K => {
                let (dw, dmin) = (h(blk, 0), h(blk, 2));
                let msum = k4_msum(&blk[4..16], bs) as f32;
                acc + ((dw * d[b]) * sum - (dmin * d[b]) * msum)
            }
            BlockFormat::Q6_K => acc + (h(blk, 208) * d[b]) * sum,
            BlockFormat::MXFP4 => acc + (crate::gguf::e8m0_to_f32_half(blk[0]) * d[b]) * sum,
            _ => acc + (h(blk, 0) * d[b]) * sum,
        };
    }
    acc
}

/// The f16 at byte `at` of a block, as f32.
fn h(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Q4_K / Q5_K: `Σ_g m_g × Σ a` over the 8 sub-blocks of 32, from the sums of 16.
fn k4_msum(scales: &[u8], bsums: &[i16]) -> i32 {
    (0..8)
        .map(|g| {
            let m = scale_min_k4(scales, g).1 as i32;
            m * (bsums[2 * g] as i32 + bsums[2 * g + 1] as i32)
        })
        .sum()
}

/// The weight block's integer codes, in element order, into `out` (`f.block_size()` values),
/// and its integer sub-block scales into `sc` (one per sub-block: 8 of 32 for Q4_K/Q5_K, 16 of
/// 16 for Q6_K; a single 1 otherwise).
fn block_codes(f: BlockFormat, b: &[u8], out: &mut [i32], sc: &mut Vec<i32>) {
    use BlockFormat::*;
    sc.clear();
    match f {
        Q8_0 => {
            for (j, o) in out.iter_mut().enumerate() {
                *o = b[2 + j] as i8 as i32;
            }
            sc.push(1);
        }
        Q4_0 | Q4_1 => {
            let off = if f == Q4_0 { 2 } else { 4 };
            for (j, o) in out.iter_mut().enumerate() {
                let q = ((b[off + j % 16] >> (4 * (j / 16))) & 15) as i32;
                *o = if f == Q4_0 { q - 8 } else { q };
            }
            sc.push(1);
        }
        Q5_0 | Q5_1 => {
            let (hoff, off) = if f == Q5_0 { (2, 6) } else { (4, 8) };
            let qh = u32::from_le_bytes([b[hoff], b[hoff + 1], b[hoff + 2], b[hoff + 3]]);
            for (j, o) in out.iter_mut().enumerate() {
                let q = ((b[off + j % 16] >> (4 * (j / 16))) & 15) as i32
                    | ((((qh >> j) & 1) as i32) << 4);
                *o = if f == Q5_0 { q - 16 } else { q };
            }
            sc.push(1);
        }
        Q4_K | Q5_K => {
            let s = &b[4..16];
            let (qh, qs) = if f == Q5_K {
                (&b[16..48], &b[48..176])
            } else {
                (&b[0..0], &b[16..144])
            };
            for (j, o) in out.iter_mut().enumerate() {
                let mut q = (qs[(j / 64) * 32 + j % 32] >> (4 * ((j % 64) / 32))) & 15;
                if f == Q5_K {
                    q |= ((qh[j % 32] >> (j / 32)) & 1) << 4;
                }
                *o = q as i32;
            }
            sc.extend((0..8).map(|g| scale_min_k4(s, g).0 as i32));
        }
        Q6_K => {
            let (ql, qh, s) = (&b[0..128], &b[128..192], &b[192..208]);
            for (j, o) in out.iter_mut().enumerate() {
                let (half, k) = (j / 128, j % 128);
                let lo = (ql[half * 64 + k % 64] >> (4 * (k / 64))) & 15;
                let hi = (qh[half * 32 + k % 32] >> (2 * (k / 32))) & 3;
                *o = (lo | (hi << 4)) as i32 - 32;
            }
            sc.extend(s.iter().map(|&v| v as i8 as i32));
        }
        IQ4_NL | MXFP4 => {
            let (kv, off) = if f == IQ4_NL {
                (&crate::gguf::IQ4_KVALUES, 2)
            } else {
                (&crate::gguf::MXFP4_KVALUES, 1)
            };
            for (j, o) in out.iter_mut().enumerate() {
                let q = (b[off + j % 16] >> (4 * (j / 16))) & 15;
                *o = kv[q as usize] as i32;
            }
            sc.push(1);
        }
        IQ4_XS => {
            let sh = u16::from_le_bytes([b[2], b[3]]);
            let (sl, qs) = (&b[4..8], &b[8..136]);
            for (j, o) in out.iter_mut().enumerate() {
                let (i, k) = (j / 32, j % 32);
                let q = (qs[i * 16 + k % 16] >> (4 * (k / 16))) & 15;
                *o = crate::gguf::IQ4_KVALUES[q as usize] as i32;
            }
            sc.extend((0..8).map(|i| {
                let lo = (sl[i / 2] >> (4 * (i % 2))) & 15;
                let hi = ((sh >> (2 * i)) & 3) as u8;
                (lo | (hi << 4)) as i32 - 32
            }));
        }
        _ => unreachable!("{f:?} has no integer product"),
    }
}

/// `isum` of one weight block against its activation codes `a`.
fn block_isum(f: BlockFormat, b: &[u8], a: &[i8]) -> i32 {
    let mut w = [0i32; QK_K];
    let mut sc = Vec::with_capacity(16);
    let w = &mut w[..f.block_size()];
    block_codes(f, b, w, &mut sc);
    let g = w.len() / sc.len();
    sc.iter()
        .enumerate()
        .map(|(k, &s)| {
            let part: i32 = (k * g..(k + 1) * g).map(|j| w[j] * a[j] as i32).sum();
            s * part
        })
        .sum()
}

/// The scalar product of `m` (a matrix of a format with an integer product; rows `rows`) with
/// every activation row of `a`: `y[i, r − rows.start]` as [`dot`] gives it.
///
/// # Panics
/// When `m` has no integer product, or the shapes disagree.
pub fn matmul(m: &Matrix<'_>, a: &QActs, y: &mut [f32], rows: std::ops::Range<usize>) {
    let Codes::Block(f) = m.codes() else {
        panic!("{:?} has no integer product", m.codes());
    };
    let nr = rows.len();
    assert_eq!(y.len(), a.rows() * nr, "output of {} values", y.len());
    for (i, yr) in y.chunks_exact_mut(nr.max(1)).enumerate().take(a.rows()) {
        for (o, r) in yr.iter_mut().zip(rows.clone()) {
            *o = dot(f, m.row(r), a, i);
        }
    }
}

thread_local! {
    /// The activations last quantized on this thread, with their kind and codes: the row
    /// ranges of one product, and products that share their input (a layer's gate and up
    /// projections), quantize it once. Reuse is decided on the values' bits, so it cannot
    /// change a result.
    static LAST: std::cell::RefCell<Option<(Vec<u32>, QActs)>> = const { std::cell::RefCell::new(None) };

}

/// [`crate::Kernels::matmul`] in the integer mode for a format with an integer product: the
/// activations quantized (or taken from [`LAST`]), each value [`dot`]'s, its blocks' integer
/// sums from the ISA's SIMD path where it has one.
pub(crate) fn matmul_with(
    k: &crate::Kernels,
    f: BlockFormat,
    kind: ActKind,
    m: &Matrix<'_>,
    x: &[f32],
    y: &mut [f32],
    rows: std::ops::Range<usize>,
) {
    let cols = m.cols();
    let bits: &[u32] = bytemuck::cast_slice(x);
    LAST.with_borrow_mut(|last| {
        let hit = matches!(last, Some((b, a)) if a.kind == kind && a.cols == cols && b.as_slice() == bits);
        if !hit {
            if x.len() > KEEP {
                // Quantized for this call alone: what a thread keeps stays a few MiB, beside
                // the scratch the memory plan counts.
                let q = quantize(kind, x, cols);
                return product(k, f, m, &q, y, rows);
            }
            // The kept buffers are reused (no fresh pages for every input).
            let (b, q) = last.get_or_insert_with(|| (Vec::new(), quantize(kind, &[], cols)));
            b.clear();
            b.extend_from_slice(bits);
            quantize_into(q, kind, x, cols);
        }
        if let Some((_, a)) = last.as_ref() {
            product(k, f, m, a, y, rows);
        }
    });
}

/// Values of input a thread keeps quantized for the calls after ([`LAST`]).
const KEEP: usize = 1 << 20;

/// The products of [`matmul_with`] from quantized activations `a`.
fn product(
    k: &crate::Kernels,
    f: BlockFormat,
    m: &Matrix<'_>,
    a: &QActs,
    y: &mut [f32],
    rows: std::ops::Range<usize>,
) {
    #[cfg(target_arch = "x86_64")]
    if k.isa() != crate::Isa::Scalar
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("f16c")
    {
        // A `Kernels` of AVX-512 proves F and BW.
        let wide = k.isa() == crate::Isa::Avx512;
        // SAFETY: the CPU has AVX2 and F16C (checked just now), and AVX-512 F/BW when `wide`; `m` is
        // a matrix of `f`, `a` its activations and `y` holds `a.rows() × rows.len()`
        // values (the checked call's).
        unsafe { crate::x86::int8::matmul(f, m, a, y, rows, wide) };
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = k;
    matmul(m, a, y, rows);
}
