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
    // SAFETY: forwarded from this function's contract.
    unsafe { block_of::<V, C>(m, m.row(r), r, jb) }
}

/// [`block`] with row `r`'s bytes already looked up (`row == m.row(r)`): loops over the blocks
/// of a row look the row up once.
///
/// # Safety
/// As [`block`], with `row` the bytes of row `r`.
#[inline(always)]
unsafe fn block_of<V: Vector, C: Codec<V>>(m: &Matrix<'_>, row: &[u8], r: usize, jb: usize) -> V {
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
pub(crate) unsafe fn xw<
    V: Vector,
    C: Codec<V>,
    const R: usize,
    const B: usize,
    const NB: usize,
    const ONE: usize,
>(
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
    if batch >= MANY_ROWS {
        // SAFETY: forwarded from this function's contract.
        unsafe { xw_many::<V, C, B, NB>(m, rows, x, y, cols) };
        return;
    }
    if nblocks <= ONE_ROW_BLOCKS {
        for (xb, yb) in x.chunks_exact(n_in.max(1)).zip(y.chunks_exact_mut(w)) {
            // SAFETY: forwarded from this function's contract, one activation row at a time.
            unsafe { xw_one::<V, C, ONE>(m, rows.clone(), xb, yb, &cols) };
        }
        if n_in == 0 {
            y.fill(0.0);
        }
        return;
    }
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

/// Up to this many blocks of columns (MLA's latent, a head's values), one activation row goes
/// through [`xw_one`].
const ONE_ROW_BLOCKS: usize = 32;

/// One activation row over a narrow range of columns, `NB1` blocks at a time with their
/// accumulators in registers through every input row: each row adds one independent fma per
/// block, where the general path loads and stores each block's accumulator once per `R` rows
/// and chains those `R` fmas on it. Terms still come in row order, one fma each, from `+0.0`.
///
/// # Safety
/// As [`xw`], with one activation row (`x.len() == rows.len()`, `y.len() == cols.len()`).
#[inline(always)]
unsafe fn xw_one<V: Vector, C: Codec<V>, const NB1: usize>(
    m: &Matrix<'_>,
    rows: Range<usize>,
    x: &[f32],
    y: &mut [f32],
    cols: &Range<usize>,
) {
    let first = cols.start / LANES * LANES;
    let nblocks = (cols.end - first).div_ceil(LANES);
    let mut k0 = 0;
    while k0 < nblocks {
        let n = NB1.min(nblocks - k0);
        // SAFETY: forwarded from this function's contract; every block starts below
        // `cols.end`.
        unsafe {
            let mut a = [V::zero(); NB1];
            for (i, r) in rows.clone().enumerate() {
                let xv = V::splat(x[i]);
                let row = m.row(r);
                for (k, ak) in a.iter_mut().enumerate().take(n) {
                    let jb = first + (k0 + k) * LANES;
                    *ak = xv.mul_add(block_of::<V, C>(m, row, r, jb), *ak);
                }
            }
            for (k, ak) in a.iter().enumerate().take(n) {
                put::<V, C>(*ak, first + (k0 + k) * LANES, cols, y);
            }
        }
        k0 += n;
    }
}

/// From this many activation rows [`xw`] takes [`xw_many`]'s path.
const MANY_ROWS: usize = 4;
/// Blocks of columns [`xw_many`] takes at a time.
const PANEL_BLOCKS: usize = 16;
/// Input rows [`xw_many`] decodes at a time (with [`PANEL_BLOCKS`]: a 128 KiB panel).
const PANEL_ROWS: usize = 128;

/// [`xw`] over several activation rows, the way a matrix product is tiled: the weights a
/// column range and row range at a time decoded once into an f32 panel (kept in L2), and over
/// it tiles of `B` activation rows × `NB` blocks of columns whose accumulators stay in
/// registers through the panel's rows (parked in memory between panels, which keeps their
/// values). Each weight vector loaded serves `B` activation rows and each broadcast
/// activation `NB` blocks, where the single-row path loads and stores an accumulator for
/// every `R` terms. Every output still takes its terms one fma each, in row order, from
/// `+0.0`: the same bits.
///
/// # Safety
/// As [`xw`], with `batch ≥ 1`.
#[inline(always)]
unsafe fn xw_many<V: Vector, C: Codec<V>, const B: usize, const NB: usize>(
    m: &Matrix<'_>,
    rows: Range<usize>,
    x: &[f32],
    y: &mut [f32],
    cols: Range<usize>,
) {
    let (n_in, w) = (rows.len(), cols.len());
    let batch = y.len() / w;
    let first = cols.start / LANES * LANES;
    let nblocks = (cols.end - first).div_ceil(LANES);
    let pb = PANEL_BLOCKS.min(nblocks);
    // The panel and the accumulators live in this thread's scratch, kept from call to call
    // (a decode step makes one call per layer and tile; a fresh 128 KiB would be mapped and
    // zeroed each time). Every panel value read was written first; the accumulators are
    // zeroed below.
    let (mut panel, mut acc) = SCRATCH.take();
    panel.resize(PANEL_ROWS.min(n_in) * pb * LANES, 0.0);
    // Accumulators of the column range: activation row `b`, block `k` at `(b × pb + k) × 16`.
    acc.resize(batch * pb * LANES, 0.0);
    for c0 in (0..nblocks).step_by(pb) {
        let nc = pb.min(nblocks - c0);
        acc.fill(0.0);
        for i0 in (0..n_in).step_by(PANEL_ROWS) {
            let ni = PANEL_ROWS.min(n_in - i0);
            // The panel: row `i` of the range, block `k` at `(i × nc + k) × 16`.
            for i in 0..ni {
                let r = rows.start + i0 + i;
                let row = m.row(r);
                for k in 0..nc {
                    // SAFETY: `r` is a row of `m`, the block starts below `cols.end`; the
                    // store writes 16 f32s inside `panel`.
                    unsafe {
                        block_of::<V, C>(m, row, r, first + (c0 + k) * LANES)
                            .store(panel.as_mut_ptr().add((i * nc + k) * LANES));
                    }
                }
            }
            let p = Panel {
                w: &panel,
                x,
                n_in,
                i0,
                ni,
                nc,
                pb,
            };
            let mut b = 0;
            // SAFETY: every index below is inside `panel`, `acc` and `x` by the loops' bounds.
            unsafe {
                while b + B <= batch {
                    p.rows::<V, B, NB>(&mut acc, b);
                    b += B;
                }
                while b < batch {
                    p.rows::<V, 1, NB>(&mut acc, b);
                    b += 1;
                }
            }
        }
        for (b, out) in y.chunks_exact_mut(w).enumerate() {
            for k in 0..nc {
                // SAFETY: `acc` holds `pb` blocks per activation row; the ISA is available.
                unsafe {
                    let a = V::load(acc.as_ptr().add((b * pb + k) * LANES));
                    put::<V, C>(a, first + (c0 + k) * LANES, &cols, out);
                }
            }
        }
    }
    SCRATCH.set((panel, acc));
}

thread_local! {
    /// [`xw_many`]'s panel and accumulators, per thread.
    static SCRATCH: std::cell::Cell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::Cell::new((Vec::new(), Vec::new())) };
}

/// One decoded panel of [`xw_many`] and the activations it meets.
struct Panel<'a> {
    /// Input row `i` of the panel, block `k` at `(i × nc + k) × 16`.
    w: &'a [f32],
    /// The activation rows, `n_in` values each.
    x: &'a [f32],
    n_in: usize,
    /// The panel's first input row (within the range) and its rows.
    i0: usize,
    ni: usize,
    /// Blocks in the panel, and per activation row in the accumulators.
    nc: usize,
    pb: usize,
}

impl Panel<'_> {
    /// Activation rows `b0 .. b0 + B` over the panel, `NB` blocks at a time (then one at a
    /// time).
    ///
    /// # Safety
    /// The ISA of `V` is available; `acc` holds `pb` blocks per activation row and `x` holds
    /// rows `b0 .. b0 + B`.
    #[inline(always)]
    unsafe fn rows<V: Vector, const B: usize, const NB: usize>(&self, acc: &mut [f32], b0: usize) {
        let mut k = 0;
        // SAFETY: forwarded from this function's contract.
        unsafe {
            while k + NB <= self.nc {
                self.tile::<V, B, NB>(acc, b0, k);
                k += NB;
            }
            while k < self.nc {
                self.tile::<V, B, 1>(acc, b0, k);
                k += 1;
            }
        }
    }

    /// One tile: activation rows `b0 .. b0 + B` × blocks `k0 .. k0 + NB` of the panel, its
    /// accumulators in registers over the panel's rows in order.
    ///
    /// # Safety
    /// As [`Panel::rows`], with `k0 + NB ≤ nc`.
    #[inline(always)]
    unsafe fn tile<V: Vector, const B: usize, const NB: usize>(
        &self,
        acc: &mut [f32],
        b0: usize,
        k0: usize,
    ) {
        let (n_in, i0, nc, pb) = (self.n_in, self.i0, self.nc, self.pb);
        let ap = acc.as_mut_ptr();
        let pp = self.w.as_ptr();
        let xp = self.x.as_ptr();
        let at = |b: usize, n: usize| ((b0 + b) * pb + k0 + n) * LANES;
        // SAFETY: forwarded from this function's contract.
        unsafe {
            let mut a = [[V::zero(); NB]; B];
            for (b, ab) in a.iter_mut().enumerate() {
                for (n, v) in ab.iter_mut().enumerate() {
                    *v = V::load(ap.add(at(b, n)));
                }
            }
            for i in 0..self.ni {
                let mut wv = [V::zero(); NB];
                for (n, wn) in wv.iter_mut().enumerate() {
                    *wn = V::load(pp.add((i * nc + k0 + n) * LANES));
                }
                for (b, ab) in a.iter_mut().enumerate() {
                    let xv = V::splat(*xp.add((b0 + b) * n_in + i0 + i));
                    for (n, v) in ab.iter_mut().enumerate() {
                        *v = xv.mul_add(wv[n], *v);
                    }
                }
            }
            for (b, ab) in a.iter().enumerate() {
                for (n, v) in ab.iter().enumerate() {
                    v.store(ap.add(at(b, n)));
                }
            }
        }
    }
}

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
    let mut rws: [&[u8]; R] = [&[]; R];
    for (r, rw) in rws.iter_mut().enumerate() {
        *rw = m.row(i0 + r);
    }
    // SAFETY: forwarded from this function's contract.
    unsafe {
        for k in 0..nblocks {
            let jb = first + k * LANES;
            // A loop, not `array::from_fn`: a closure might not be inlined into the
            // `#[target_feature]` entry point, and the decoder must be.
            let mut wv = [V::zero(); R];
            for (r, wr) in wv.iter_mut().enumerate() {
                *wr = block_of::<V, C>(m, rws[r], i0 + r, jb);
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
