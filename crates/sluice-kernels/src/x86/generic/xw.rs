//! Decoding rows, and the transposed products that accumulate decoded rows with `axpy`'s
//! arithmetic ([`crate::scalar::decode_row`], [`crate::scalar::matmul_xw`],
//! [`crate::scalar::absorb`], [`crate::scalar::weighted_sum`]).
//!
//! The specification computes each output column `o` of activation row `b` as
//! `acc = fma(x[b, i], w(i, o), acc)` from `+0.0`, over the input rows `i` in order, with
//! `w(i, o)` the stored value times its group's scale (one rounding). Here a lane holds one
//! output column: blocks of 16 columns aligned to multiples of 16 (so that a block lies in one
//! scale group and starts on a byte for the nibble codes) are decoded into a vector, scaled
//! with one multiply, and accumulated with one fused multiply-add per row; lanes outside the
//! requested columns are computed and dropped. Every output value sees exactly the operations
//! of the specification in the same order, so the bits are the same; rows streamed together
//! only share loads and decoding.

use std::ops::Range;

use super::{Codec, NATURAL, Vector};
use crate::decode::scale_at;
use crate::matrix::Matrix;
use crate::scalar::LANES;

/// Block `jb / 16` (`jb` a multiple of 16) of row `r` of `m`,
/// decoded and scaled (`code × scale`, one rounding, for quantized codes). The last partial
/// block of a row is read from a copy padded with [`Codec::PAD`].
///
/// # Safety
/// The ISA of `V` is available; `row` is a row of `m` and `jb < m.cols()`.
#[inline(always)]
unsafe fn block<V: Vector, C: Codec<V>>(m: &Matrix<'_>, r: usize, jb: usize) -> V {
    let row = m.row(r);
    let off = jb / LANES * C::BLOCK_BYTES;
    // SAFETY: a full block lies inside the row (`jb + 16 ≤ cols`); a partial one is copied
    // into a 64-byte buffer (every block is at most 64 bytes); the ISA is available.
    unsafe {
        let v = if jb + LANES <= m.cols() {
            C::decode(row.as_ptr().add(off))
        } else {
            let mut t = [C::PAD; 64];
            let rest = &row[off..];
            t[..rest.len()].copy_from_slice(rest);
            C::decode(t.as_ptr())
        };
        match m.scales() {
            Some(s) if C::QUANT => {
                v.mul(V::splat(scale_at(s.ty, m.scale_row(r), jb / s.group_cols)))
            }
            _ => v,
        }
    }
}

/// Writes the lanes of `v` (block at column `jb`, in the layout of `C`) whose columns lie in
/// `cols` to `out[column − cols.start]`.
///
/// # Safety
/// The ISA of `V` is available; `out` holds `cols.len()` values.
#[inline(always)]
unsafe fn put<V: Vector, C: Codec<V>>(v: V, jb: usize, cols: &Range<usize>, out: &mut [f32]) {
    // SAFETY: a direct store writes 16 values inside `out` (`cols.start ≤ jb`,
    // `jb + 16 ≤ cols.end`); the ISA is available.
    unsafe {
        if C::LAYOUT == NATURAL && jb >= cols.start && jb + LANES <= cols.end {
            v.store(out.as_mut_ptr().add(jb - cols.start));
            return;
        }
        let a = v.to_array();
        for (p, &c) in C::LAYOUT.iter().enumerate() {
            let j = jb + c as usize;
            if cols.contains(&j) {
                out[j - cols.start] = a[p];
            }
        }
    }
}

/// [`crate::scalar::decode_row`].
///
/// # Safety
/// The ISA of `V` is available, `m.codes()` is the coding `C` decodes, `r < m.rows()`,
/// `cols.end ≤ m.cols()` and `out.len() == cols.len()`.
#[inline(always)]
pub(crate) unsafe fn decode_row<V: Vector, C: Codec<V>>(
    m: &Matrix<'_>,
    r: usize,
    cols: Range<usize>,
    out: &mut [f32],
) {
    let mut jb = cols.start / LANES * LANES;
    while jb < cols.end {
        // SAFETY: forwarded from this function's contract; `jb < cols.end ≤ m.cols()`.
        unsafe { put::<V, C>(block::<V, C>(m, r, jb), jb, &cols, out) };
        jb += LANES;
    }
}

/// `y[b, o − cols.start] = Σ_i x[b, i] · m[rows.start + i, o]` for `o` in `cols`, each sum
/// accumulated over `i` in order with one fma per term from `+0.0`, as
/// [`crate::scalar::matmul_xw`] does (which is this over all rows; [`crate::scalar::absorb`]
/// and [`crate::scalar::weighted_sum`] are it for one activation row over all columns).
///
/// The weights stream through row by row, `R` rows at a time (`R` sequential streams), once
/// per group of activation rows whose accumulators fit in L1: each block of the `R` rows is
/// decoded once per group, then for every activation row of the group its 16 accumulators are
/// loaded from a buffer (kept in the decoder's lane layout, so nothing is permuted until the
/// end), take the `R` rows' terms in row order, and are stored back.
///
/// # Safety
/// The ISA of `V` is available, `m.codes()` is the coding `C` decodes, `rows` and `cols` lie
/// inside the matrix, `x.len() == batch × rows.len()` and `y.len() == batch × cols.len()` for
/// some `batch`.
#[inline(always)]
pub(crate) unsafe fn xw<V: Vector, C: Codec<V>, const R: usize>(
    m: &Matrix<'_>,
    rows: Range<usize>,
    x: &[f32],
    y: &mut [f32],
    cols: Range<usize>,
) {
    let (n_in, w) = (rows.len(), cols.len());
    if w == 0 {
        return;
    }
    let batch = y.len() / w;
    assert!(x.len() == batch * n_in && y.len() == batch * w);
    assert!(rows.end <= m.rows() && cols.end <= m.cols());
    let first = cols.start / LANES * LANES;
    let nblocks = (cols.end - first).div_ceil(LANES);
    // Activation rows a pass over the weights takes: as many as keep their accumulators within
    // about 16 KiB (L1), at least one; more rows make more passes over the weights.
    let group = (XW_ACC_FLOATS / (nblocks * LANES)).clamp(1, batch.max(1));
    // Accumulators of activation row `b` of the group, block `k`:
    // `acc[(b × nblocks + k) × 16 ..][..16]`.
    let mut acc = vec![0f32; group * nblocks * LANES];
    for b0 in (0..batch).step_by(group) {
        let gb = group.min(batch - b0);
        let xg = &x[b0 * n_in..(b0 + gb) * n_in];
        acc.fill(0.0);
        let mut i = rows.start;
        // SAFETY: forwarded from this function's contract; every block starts below
        // `cols.end`, and every accumulator index is inside `acc`.
        unsafe {
            while i + R <= rows.end {
                rows_step::<V, C, R>(m, i, rows.start, xg, n_in, &mut acc, first, nblocks, gb);
                i += R;
            }
            while i < rows.end {
                rows_step::<V, C, 1>(m, i, rows.start, xg, n_in, &mut acc, first, nblocks, gb);
                i += 1;
            }
            for (b, out) in y[b0 * w..(b0 + gb) * w].chunks_exact_mut(w).enumerate() {
                for k in 0..nblocks {
                    let a = V::load(acc.as_ptr().add((b * nblocks + k) * LANES));
                    put::<V, C>(a, first + k * LANES, &cols, out);
                }
            }
        }
    }
}

/// Accumulator floats one pass of [`xw`] keeps (16 KiB).
const XW_ACC_FLOATS: usize = 4096;

/// Rows `i0 .. i0 + R` of [`xw`]: their terms added to every accumulator, in row order.
///
/// # Safety
/// As [`xw`], with `i0 + R ≤ rows.end` and `acc` holding `batch × nblocks` blocks.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_step<V: Vector, C: Codec<V>, const R: usize>(
    m: &Matrix<'_>,
    i0: usize,
    row0: usize,
    x: &[f32],
    n_in: usize,
    acc: &mut [f32],
    first: usize,
    nblocks: usize,
    batch: usize,
) {
    let ap = acc.as_mut_ptr();
    // SAFETY: forwarded from this function's contract.
    unsafe {
        for k in 0..nblocks {
            let jb = first + k * LANES;
            // A loop, not `array::from_fn`: a closure might not be inlined into the
            // `#[target_feature]` entry point, and the decoder must be.
            let mut wv = [V::zero(); R];
            for (r, wr) in wv.iter_mut().enumerate() {
                *wr = block::<V, C>(m, i0 + r, jb);
            }
            for b in 0..batch {
                let xb = &x[b * n_in + i0 - row0..][..R];
                let p = ap.add((b * nblocks + k) * LANES);
                let mut a = V::load(p);
                for (wr, &xv) in wv.iter().zip(xb) {
                    a = V::splat(xv).mul_add(*wr, a);
                }
                a.store(p);
            }
        }
    }
}
