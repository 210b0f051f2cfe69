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
//! of the specification in the same order, so the bits are the same; tiles of `K` blocks ×
//! `B` activation rows only share loads and decoding.

use std::ops::Range;

use super::{Codec, NATURAL, Vector};
use crate::decode::scale_at;
use crate::matrix::Matrix;
use crate::scalar::LANES;

/// Block `jb / 16` (`jb` a multiple of 16) of the stored row `row` of a matrix of `n` columns,
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
/// and [`crate::scalar::weighted_sum`] are it for one activation row over all columns). `K1`
/// blocks per tile for one activation row; `K` blocks × `B` activation rows for several.
///
/// # Safety
/// The ISA of `V` is available, `m.codes()` is the coding `C` decodes, `rows` and `cols` lie
/// inside the matrix, `x.len() == batch × rows.len()` and `y.len() == batch × cols.len()` for
/// some `batch`.
#[inline(always)]
pub(crate) unsafe fn xw<V: Vector, C: Codec<V>, const K1: usize, const K: usize, const B: usize>(
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
    let mut t = Tiles {
        m,
        rows,
        x,
        y,
        cols,
    };
    let mut k = 0;
    // SAFETY: forwarded from this function's contract; every block index is below `nblocks`.
    unsafe {
        if batch == 1 {
            while k + K1 <= nblocks {
                t.tile::<V, C, K1, 1>(first + k * LANES, 0);
                k += K1;
            }
        } else {
            while k + K <= nblocks {
                let mut b = 0;
                while b + B <= batch {
                    t.tile::<V, C, K, B>(first + k * LANES, b);
                    b += B;
                }
                while b < batch {
                    t.tile::<V, C, K, 1>(first + k * LANES, b);
                    b += 1;
                }
                k += K;
            }
        }
        while k < nblocks {
            for b in 0..batch {
                t.tile::<V, C, 1, 1>(first + k * LANES, b);
            }
            k += 1;
        }
    }
}

/// The operands of one [`xw`] call.
struct Tiles<'a, 'm> {
    m: &'a Matrix<'m>,
    rows: Range<usize>,
    x: &'a [f32],
    y: &'a mut [f32],
    cols: Range<usize>,
}

impl Tiles<'_, '_> {
    /// Blocks at columns `j0, j0 + 16, …` (`K` of them, `j0` a multiple of 16) × activation
    /// rows `b0 .. b0 + B`, over every input row.
    ///
    /// # Safety
    /// The ISA of `V` is available, `C` decodes `m.codes()`, the `K` blocks start inside the
    /// matrix and the activation rows exist.
    #[inline(always)]
    unsafe fn tile<V: Vector, C: Codec<V>, const K: usize, const B: usize>(
        &mut self,
        j0: usize,
        b0: usize,
    ) {
        let n_in = self.rows.len();
        let xb: [&[f32]; B] = std::array::from_fn(|b| &self.x[(b0 + b) * n_in..][..n_in]);
        // SAFETY: forwarded from this function's contract.
        unsafe {
            let mut acc = [[V::zero(); B]; K];
            for (i, r) in self.rows.clone().enumerate() {
                let xs: [V; B] = std::array::from_fn(|b| V::splat(xb[b][i]));
                for (k, ak) in acc.iter_mut().enumerate() {
                    let wv = block::<V, C>(self.m, r, j0 + k * LANES);
                    for (a, &xv) in ak.iter_mut().zip(&xs) {
                        *a = xv.mul_add(wv, *a);
                    }
                }
            }
            let w = self.cols.len();
            for (k, ak) in acc.iter().enumerate() {
                for (b, &a) in ak.iter().enumerate() {
                    let out = &mut self.y[(b0 + b) * w..][..w];
                    put::<V, C>(a, j0 + k * LANES, &self.cols, out);
                }
            }
        }
    }
}
