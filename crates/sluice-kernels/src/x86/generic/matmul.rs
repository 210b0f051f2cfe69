//! Matrix products ([`crate::Kernels::matmul`]) over a [`Vector`] and a [`Codec`].
//!
//! Each (output row, activation row) pair owns its own 16-lane accumulator (and, for quantized
//! codes, its own group accumulator), fed in column order exactly as [`crate::scalar::dot_row`] does.
//! Three paths share that arithmetic:
//!
//! - one activation row (decode): `R1` rows at a time, each block decoded as it streams in and
//!   multiplied with activations loaded once for all `R1` rows, the next tile prefetched; for
//!   dense codes over enough rows, tiles of `RS` rows spread evenly over the range instead, so
//!   that the `RS` rows of a tile are `RS` long sequential streams through memory (each
//!   prefetched a fixed distance ahead), not `RS` short neighbouring ones;
//! - a few ([`FEW`] at most) over rows of at most [`KC`] blocks (a decode step's attention
//!   tile: its queries against the cached positions): `R1` rows at a time decoded as they
//!   stream in, against the activations four at a time, the accumulators in registers;
//! - several (prefill): [`RD`] rows decoded once into f32, then tiles of `RB` (or `RQ`) rows ×
//!   `BB` activation rows over [`KC`]-block column ranges, each pair's accumulator parked in
//!   memory between ranges.
//!
//! Sharing loads and decoding never shares arithmetic, so the result of a pair does not depend
//! on the path, the tile, the row range or the batch (the tests check exactly that).
//!
//! Tails follow the contract: the activations are copied once per call into a buffer padded
//! with `+0.0` to a multiple of 16 columns (and permuted into the decoder's lane layout), and
//! the last partial block of each weight row is copied into a buffer filled with a byte that
//! decodes to `+0.0` ([`Codec::PAD`]), so the padded lanes compute `fma(+0, +0, acc)` like the
//! scalar code.

use std::ops::Range;

use super::{Codec, NATURAL, Vector, reduce};
use crate::matrix::Matrix;
use crate::scalar::LANES;

/// Shape of the column loop of one matrix product.
#[derive(Clone, Copy)]
struct Geom {
    /// Full 16-column blocks per row.
    nfull: usize,
    /// Whether a partial block follows them.
    tail: bool,
    /// Blocks per scale group (quantized codes).
    gblocks: usize,
    /// Scale groups per row (quantized codes).
    ngroups: usize,
    /// f32s between one block of the activations and the next (16 × batch: the prepared
    /// activations hold block `k` of every activation row together).
    xstride: usize,
}

/// One block for every pair of the tile: `acc[r][b] = fma(w_r, x_b, acc[r][b])`, with the
/// weights at `w[r] + wo` and the activations at `x[b] + xo`. Accumulators go in and out by
/// value so that they live in registers.
#[inline(always)]
unsafe fn step<V: Vector, C: Codec<V>, const R: usize, const B: usize>(
    w: &[*const u8; R],
    wo: usize,
    x: &[*const f32; B],
    xo: usize,
    mut acc: [[V; B]; R],
) -> [[V; B]; R] {
    // SAFETY: the caller guarantees the ISA and that each `w[r] + wo` is valid for a block and
    // each `x[b] + xo` for 16 f32s.
    unsafe {
        #[allow(clippy::needless_range_loop)]
        for r in 0..R {
            let wv = C::decode(w[r].add(wo));
            for b in 0..B {
                acc[r][b] = wv.mul_add(V::load(x[b].add(xo)), acc[r][b]);
            }
        }
    }
    acc
}

/// Prefetches the bytes of the next tile that match block `blk` of this one: a tile reads
/// `R × BLOCK_BYTES` bytes per block, so walking the next tile's (contiguous) rows at that pace
/// keeps a tile's worth of weights in flight ahead of the arithmetic. Null: nothing to fetch.
#[inline(always)]
fn prefetch<const R: usize>(next: *const u8, blk: usize, block_bytes: usize) {
    if next.is_null() {
        return;
    }
    let per = R * block_bytes;
    let mut o = 0;
    while o < per {
        // SAFETY: prefetching is a hint that never faults, whatever the address; the pointer
        // is only formed with wrapping arithmetic.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                next.wrapping_add(blk * per + o).cast(),
            )
        };
        o += 64;
    }
}

/// `acc[r][b] = fma(gacc[r][b], scale_r, acc[r][b])`: one group folded into the row sums.
#[inline(always)]
unsafe fn fold<V: Vector, const R: usize, const B: usize>(
    gacc: [[V; B]; R],
    scales: &[*const f32; R],
    gi: usize,
    mut acc: [[V; B]; R],
) -> [[V; B]; R] {
    // SAFETY: the caller guarantees the ISA and that each `scales[r]` holds group `gi`.
    unsafe {
        #[allow(clippy::needless_range_loop)]
        for r in 0..R {
            let s = V::splat(*scales[r].add(gi));
            for b in 0..B {
                acc[r][b] = gacc[r][b].mul_add(s, acc[r][b]);
            }
        }
    }
    acc
}

/// Where a tile's weights come from.
#[derive(Clone, Copy)]
struct Rows<'t, const R: usize> {
    /// Row starts.
    w: [*const u8; R],
    /// The padded last partial block of each row (when `g.tail`).
    tails: &'t [[u8; 64]; R],
    /// Decoded scales of each row (quantized codes).
    scales: [*const f32; R],
    /// Start of the next tile's weights, to prefetch (null: none).
    next: *const u8,
    /// Prefetch each row [`STREAM_AHEAD`] bytes ahead of where it is read instead (the rows
    /// of a strided tile, each continuing into the next row of its stream).
    streams: bool,
}

/// How far ahead of the reads of a strided tile each of its streams is prefetched.
const STREAM_AHEAD: usize = 1024;

/// Prefetches each row of a strided tile [`STREAM_AHEAD`] bytes past block `blk`, once per
/// 64-byte line.
#[inline(always)]
fn prefetch_streams<const R: usize>(w: &[*const u8; R], blk: usize, block_bytes: usize) {
    let at = blk * block_bytes;
    if at % 64 >= block_bytes {
        return;
    }
    for p in w {
        // SAFETY: prefetching is a hint that never faults, whatever the address; the pointer
        // is only formed with wrapping arithmetic.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                p.wrapping_add(at + STREAM_AHEAD).cast(),
            )
        };
    }
}

/// `R` rows × `B` activations over a whole row; returns the `R × B` results.
///
/// # Safety
/// The ISA of `V` is available; each `w[r]` is valid for `g.nfull` blocks; each `x[b]` for
/// blocks `0 .. g.nfull + g.tail` at stride `g.xstride`; for quantized codes each `scales[r]`
/// for `g.ngroups` f32s.
#[inline(always)]
unsafe fn tile<V: Vector, C: Codec<V>, const R: usize, const B: usize>(
    t: Rows<'_, R>,
    x: [*const f32; B],
    g: Geom,
) -> [[f32; B]; R] {
    // SAFETY: forwarded from this function's contract; the common group sizes get their
    // block loop unrolled.
    let acc = unsafe {
        match (C::QUANT, g.gblocks) {
            (false, _) => tile_dense::<V, C, R, B>(t, x, g),
            (true, 2) => tile_quant::<V, C, R, B, 2>(t, x, g),
            (true, 8) => tile_quant::<V, C, R, B, 8>(t, x, g),
            (true, _) => tile_quant::<V, C, R, B, 0>(t, x, g),
        }
    };
    let mut out = [[0f32; B]; R];
    for r in 0..R {
        for b in 0..B {
            // SAFETY: the ISA is available.
            out[r][b] = unsafe { reduce(acc[r][b], &C::LAYOUT) };
        }
    }
    out
}

/// [`tile`] for dense codes.
#[inline(always)]
unsafe fn tile_dense<V: Vector, C: Codec<V>, const R: usize, const B: usize>(
    t: Rows<'_, R>,
    x: [*const f32; B],
    g: Geom,
) -> [[V; B]; R] {
    // SAFETY: forwarded from `tile`: block `blk` of row `r` is at `w[r] + blk × BLOCK_BYTES`,
    // its activations at `x[b] + blk × xstride`; the tail block comes from `tails`.
    unsafe {
        let mut acc = [[V::zero(); B]; R];
        for blk in 0..g.nfull {
            if t.streams {
                prefetch_streams::<R>(&t.w, blk, C::BLOCK_BYTES);
            } else {
                prefetch::<R>(t.next, blk, C::BLOCK_BYTES);
            }
            acc = step::<V, C, R, B>(&t.w, blk * C::BLOCK_BYTES, &x, blk * g.xstride, acc);
        }
        if g.tail {
            let tw: [*const u8; R] = std::array::from_fn(|r| t.tails[r].as_ptr());
            acc = step::<V, C, R, B>(&tw, 0, &x, g.nfull * g.xstride, acc);
        }
        acc
    }
}

/// [`tile`] for quantized codes, `GB` blocks per group (0: `g.gblocks`, known at run time).
#[inline(always)]
unsafe fn tile_quant<V: Vector, C: Codec<V>, const R: usize, const B: usize, const GB: usize>(
    t: Rows<'_, R>,
    x: [*const f32; B],
    g: Geom,
) -> [[V; B]; R] {
    let gb = if GB > 0 { GB } else { g.gblocks };
    // Groups made only of full blocks; at most one more group follows, holding the remaining
    // full blocks and the tail.
    let full_groups = g.nfull / gb;
    // SAFETY: forwarded from `tile`, as in `tile_dense`; group `gi` has scale `gi`.
    unsafe {
        let mut acc = [[V::zero(); B]; R];
        let mut blk = 0;
        for gi in 0..full_groups {
            let mut gacc = [[V::zero(); B]; R];
            for _ in 0..gb {
                prefetch::<R>(t.next, blk, C::BLOCK_BYTES);
                let (wo, xo) = (blk * C::BLOCK_BYTES, blk * g.xstride);
                gacc = step::<V, C, R, B>(&t.w, wo, &x, xo, gacc);
                blk += 1;
            }
            acc = fold(gacc, &t.scales, gi, acc);
        }
        if full_groups < g.ngroups {
            let mut gacc = [[V::zero(); B]; R];
            while blk < g.nfull {
                let (wo, xo) = (blk * C::BLOCK_BYTES, blk * g.xstride);
                gacc = step::<V, C, R, B>(&t.w, wo, &x, xo, gacc);
                blk += 1;
            }
            if g.tail {
                let tw: [*const u8; R] = std::array::from_fn(|r| t.tails[r].as_ptr());
                gacc = step::<V, C, R, B>(&tw, 0, &x, g.nfull * g.xstride, gacc);
            }
            acc = fold(gacc, &t.scales, full_groups, acc);
        }
        acc
    }
}

/// Blocks `k0 .. k1` of a dense tile, continuing `acc`.
#[inline(always)]
unsafe fn range_dense<V: Vector, C: Codec<V>, const R: usize, const B: usize>(
    t: Rows<'_, R>,
    x: [*const f32; B],
    g: Geom,
    k0: usize,
    k1: usize,
    mut acc: [[V; B]; R],
) -> [[V; B]; R] {
    // SAFETY: forwarded from the caller: blocks `k0 .. k1` are inside the rows.
    unsafe {
        for blk in k0..k1 {
            acc = step::<V, C, R, B>(&t.w, blk * C::BLOCK_BYTES, &x, blk * g.xstride, acc);
        }
    }
    acc
}

/// Blocks `k0 .. k1` of a quantized tile (`k0` starts a group; `k1` ends one or the row),
/// continuing `acc`; `GB` as in [`tile_quant`].
#[inline(always)]
unsafe fn range_quant<V: Vector, C: Codec<V>, const R: usize, const B: usize, const GB: usize>(
    t: Rows<'_, R>,
    x: [*const f32; B],
    g: Geom,
    k0: usize,
    k1: usize,
    mut acc: [[V; B]; R],
) -> [[V; B]; R] {
    let gb = if GB > 0 { GB } else { g.gblocks };
    let mut blk = k0;
    // SAFETY: forwarded from the caller; group `blk / gb` has scale `blk / gb`.
    unsafe {
        while blk < k1 {
            let gi = blk / gb;
            let mut gacc = [[V::zero(); B]; R];
            if GB > 0 && blk + GB <= k1 {
                for _ in 0..GB {
                    let (wo, xo) = (blk * C::BLOCK_BYTES, blk * g.xstride);
                    gacc = step::<V, C, R, B>(&t.w, wo, &x, xo, gacc);
                    blk += 1;
                }
            } else {
                let end = (blk + gb).min(k1);
                while blk < end {
                    let (wo, xo) = (blk * C::BLOCK_BYTES, blk * g.xstride);
                    gacc = step::<V, C, R, B>(&t.w, wo, &x, xo, gacc);
                    blk += 1;
                }
            }
            acc = fold(gacc, &t.scales, gi, acc);
        }
    }
    acc
}

/// Weights already decoded to f32 (in the lane layout of `C`), 16 per block: what a tile of
/// several activation rows reads, so that each weight is decoded once per call whatever the
/// batch. The values are the exact decoded codes, so the arithmetic is unchanged.
struct Decoded<C>(std::marker::PhantomData<C>);

impl<V: Vector, C: Codec<V>> Codec<V> for Decoded<C> {
    const BLOCK_BYTES: usize = 4 * LANES;
    const LAYOUT: [u8; LANES] = C::LAYOUT;
    const PAD: u8 = 0;
    const QUANT: bool = C::QUANT;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> V {
        // SAFETY: the caller guarantees the ISA and 64 readable bytes, written as f32s.
        unsafe { V::load(p.cast()) }
    }
}

/// The activations of a call, padded to whole blocks and permuted into the decoder's layout,
/// block-major: block `k` of activation row `b` starts at `16 (k × batch + b)`.
fn prepare_x(layout: &[u8; LANES], x: &[f32], cols: usize, batch: usize) -> Vec<f32> {
    let nblocks = cols.div_ceil(LANES);
    let mut xp = vec![0f32; batch * nblocks * LANES];
    for (b, src) in x.chunks_exact(cols).enumerate() {
        for k in 0..nblocks {
            let base = k * LANES;
            let d = (k * batch + b) * LANES;
            let db = &mut xp[d..d + LANES];
            if *layout == NATURAL && base + LANES <= cols {
                db.copy_from_slice(&src[base..base + LANES]);
                continue;
            }
            for (d, &c) in db.iter_mut().zip(layout) {
                *d = src.get(base + c as usize).copied().unwrap_or(0.0);
            }
        }
    }
    xp
}

/// Everything a product needs besides the tile shape.
struct Job<'a, 'm> {
    m: &'a Matrix<'m>,
    xp: &'a [f32],
    batch: usize,
    geom: Geom,
    y: &'a mut [f32],
    first_row: usize,
    nr: usize,
    /// Decoded scales, one row of `ngroups` per tile row.
    sbuf: Vec<f32>,
    /// Decoded weights, `nblocks × 16` per row (several activation rows only).
    wbuf: Vec<f32>,
    /// Accumulators, 16 per (row, activation) pair (several activation rows only).
    abuf: Vec<f32>,
}

/// Rows decoded together for several activation rows.
const RD: usize = 12;
/// Blocks of columns per range for several activation rows (rounded to whole groups).
const KC: usize = 32;
/// Activation rows up to which rows of at most [`KC`] blocks go through [`Job::rows_few`].
const FEW: usize = 16;

impl Job<'_, '_> {
    /// The padded tails and decoded scales of rows `r0 .. r0 + R`, the scales in `sbuf` slots
    /// `slot .. slot + R`.
    #[inline(always)]
    unsafe fn prepare<V: Vector, C: Codec<V>, const R: usize>(
        &mut self,
        r0: usize,
        slot: usize,
    ) -> ([[u8; 64]; R], [*const f32; R]) {
        let m = self.m;
        let g = self.geom;
        let mut tails = [[C::PAD; 64]; R];
        if g.tail {
            for (i, t) in tails.iter_mut().enumerate() {
                let rest = &m.row(r0 + i)[g.nfull * C::BLOCK_BYTES..];
                t[..rest.len()].copy_from_slice(rest);
            }
        }
        let mut scales = [std::ptr::null::<f32>(); R];
        if let (true, Some(s)) = (C::QUANT, m.scales()) {
            let ng = g.ngroups;
            for (i, sp) in scales.iter_mut().enumerate() {
                let dst = &mut self.sbuf[(slot + i) * ng..(slot + i + 1) * ng];
                // SAFETY: the ISA of `V` is available (the caller's guarantee).
                unsafe { V::decode_scales(s.ty, m.scale_row(r0 + i), dst) };
                *sp = dst.as_ptr();
            }
        }
        (tails, scales)
    }

    /// Rows `r0 .. r0 + R` of the matrix as a tile's weights, the next `R` rows (when the
    /// matrix has them) prefetched while it computes.
    #[inline(always)]
    fn rows_at<'t, const R: usize>(
        &self,
        r0: usize,
        tails: &'t [[u8; 64]; R],
        scales: [*const f32; R],
    ) -> Rows<'t, R> {
        let m = self.m;
        Rows {
            w: std::array::from_fn(|i| m.row(r0 + i).as_ptr()),
            tails,
            scales,
            next: if r0 + 2 * R <= m.rows() {
                m.row(r0 + R).as_ptr()
            } else {
                std::ptr::null()
            },
            streams: false,
        }
    }

    /// Rows `r0 .. r0 + R` against the one activation row, decoding as they stream in.
    #[inline(always)]
    unsafe fn rows_one<V: Vector, C: Codec<V>, const R: usize>(&mut self, r0: usize) {
        // SAFETY: the caller guarantees the ISA.
        let (tails, scales) = unsafe { self.prepare::<V, C, R>(r0, 0) };
        let t = self.rows_at(r0, &tails, scales);
        // One activation row: its blocks are 16 apart (a constant the loop can use).
        let g = Geom {
            xstride: LANES,
            ..self.geom
        };
        // SAFETY: rows and tails come from the validated matrix, the activations from the
        // padded buffer, scales from `sbuf`: `tile`'s contract.
        let out = unsafe { tile::<V, C, R, 1>(t, [self.xp.as_ptr()], g) };
        self.write(r0, 0, &out);
    }

    /// Rows `r0 .. r0 + R` against a few activation rows whose blocks all stay in L1 (an
    /// attention tile's queries against the cached keys), decoding as they stream in: no
    /// decoded copy of the rows and no accumulators parked in memory, each tile of `R` rows
    /// taken against the activations four at a time. Each pair's arithmetic is
    /// [`Self::rows_one`]'s.
    #[inline(always)]
    unsafe fn rows_few<V: Vector, C: Codec<V>, const R: usize>(&mut self, r0: usize) {
        // SAFETY: the caller guarantees the ISA.
        let (tails, scales) = unsafe { self.prepare::<V, C, R>(r0, 0) };
        let t = self.rows_at(r0, &tails, scales);
        let g = self.geom;
        let x0 = self.xp.as_ptr();
        let x = |b: usize| x0.wrapping_add(b * LANES);
        let mut b = 0;
        // SAFETY: rows and tails come from the validated matrix, the activations from the
        // padded buffer (row `b`'s block `k` at `16 (k × batch + b)`), scales from `sbuf`:
        // `tile`'s contract.
        unsafe {
            while b + 4 <= self.batch {
                let out = tile::<V, C, R, 4>(t, std::array::from_fn(|i| x(b + i)), g);
                self.write(r0, b, &out);
                b += 4;
            }
            match self.batch - b {
                0 => {}
                1 => {
                    let out = tile::<V, C, R, 1>(t, [x(b)], g);
                    self.write(r0, b, &out);
                }
                2 => {
                    let out = tile::<V, C, R, 2>(t, [x(b), x(b + 1)], g);
                    self.write(r0, b, &out);
                }
                n => {
                    debug_assert_eq!(n, 3);
                    let out = tile::<V, C, R, 3>(t, [x(b), x(b + 1), x(b + 2)], g);
                    self.write(r0, b, &out);
                }
            }
        }
    }

    /// Rows `r0 + i × q` (`i < R`) of a dense matrix against the one activation row. Over
    /// `q` calls with `r0` going up by one, each of the `R` rows walks its own contiguous
    /// `q`-row part of the range front to back: `R` long sequential streams, each prefetched
    /// ahead by [`prefetch_streams`]. Each row's arithmetic is [`Self::rows_one`]'s.
    #[inline(always)]
    unsafe fn rows_strided<V: Vector, C: Codec<V>, const R: usize>(&mut self, r0: usize, q: usize) {
        let m = self.m;
        let mut tails = [[C::PAD; 64]; R];
        if self.geom.tail {
            for (i, t) in tails.iter_mut().enumerate() {
                let rest = &m.row(r0 + i * q)[self.geom.nfull * C::BLOCK_BYTES..];
                t[..rest.len()].copy_from_slice(rest);
            }
        }
        let t = Rows {
            w: std::array::from_fn(|i| m.row(r0 + i * q).as_ptr()),
            tails: &tails,
            scales: [std::ptr::null(); R],
            next: std::ptr::null(),
            streams: true,
        };
        let g = Geom {
            xstride: LANES,
            ..self.geom
        };
        // SAFETY: rows and tails come from the validated matrix, the activations from the
        // padded buffer; dense codes need no scales: `tile`'s contract.
        let out = unsafe { tile::<V, C, R, 1>(t, [self.xp.as_ptr()], g) };
        let k0 = r0 - self.first_row;
        for (i, o) in out.iter().enumerate() {
            self.y[k0 + i * q] = o[0];
        }
    }

    /// Rows `r0 .. r0 + n` (`n` ≤ [`RD`]) against every activation row: decoded once into
    /// `wbuf`, then multiplied [`KC`] blocks of columns at a time (so that the weights and
    /// activations in use stay in L1), `R` rows × `BB` activation rows per tile, each pair's
    /// accumulator parked in `abuf` between column ranges. A pair still sees its blocks, and
    /// groups, in column order.
    #[inline(always)]
    unsafe fn rows_many<V: Vector, C: Codec<V>, const R: usize, const BB: usize>(
        &mut self,
        r0: usize,
        n: usize,
    ) {
        let m = self.m;
        let g = self.geom;
        let nblocks = g.nfull + g.tail as usize;
        let per_row = nblocks * LANES;
        for i in 0..n {
            // SAFETY: the caller guarantees the ISA.
            let (tails, _) = unsafe { self.prepare::<V, C, 1>(r0 + i, i) };
            let row = m.row(r0 + i).as_ptr();
            let dst = &mut self.wbuf[i * per_row..(i + 1) * per_row];
            // SAFETY: block `blk` of the row lies inside it (`blk < nfull`); the tail comes
            // from the padded copy; each store writes 16 f32s inside `dst`.
            unsafe {
                for blk in 0..g.nfull {
                    C::decode(row.add(blk * C::BLOCK_BYTES))
                        .store(dst.as_mut_ptr().add(blk * LANES));
                }
                if g.tail {
                    C::decode(tails[0].as_ptr()).store(dst.as_mut_ptr().add(g.nfull * LANES));
                }
            }
        }
        self.abuf[..n * self.batch * LANES].fill(0.0);
        let dg = Geom {
            nfull: nblocks,
            tail: false,
            ..g
        };
        // Column ranges hold whole groups.
        let kc = if C::QUANT {
            g.gblocks * (KC / g.gblocks).max(1)
        } else {
            KC
        };
        let mut k0 = 0;
        while k0 < nblocks {
            let k1 = (k0 + kc).min(nblocks);
            let mut i = 0;
            // SAFETY: forwarded from this function's contract.
            unsafe {
                while i + R <= n {
                    self.subtile::<V, C, R, BB>(i, dg, k0, k1);
                    i += R;
                }
                while i < n {
                    self.subtile::<V, C, 1, BB>(i, dg, k0, k1);
                    i += 1;
                }
            }
            k0 = k1;
        }
        let ap = self.abuf.as_ptr();
        for i in 0..n {
            for b in 0..self.batch {
                // SAFETY: `abuf` holds 16 f32s per (row, activation) pair; the ISA is available.
                let v =
                    unsafe { reduce(V::load(ap.add((i * self.batch + b) * LANES)), &C::LAYOUT) };
                self.y[b * self.nr + r0 - self.first_row + i] = v;
            }
        }
    }

    /// Decoded rows `i0 .. i0 + R` of `wbuf` over blocks `k0 .. k1`, every activation row.
    #[inline(always)]
    unsafe fn subtile<V: Vector, C: Codec<V>, const R: usize, const BB: usize>(
        &mut self,
        i0: usize,
        g: Geom,
        k0: usize,
        k1: usize,
    ) {
        let per_row = g.nfull * LANES;
        let wb = self.wbuf.as_ptr();
        let sb = self.sbuf.as_ptr();
        let t = Rows {
            w: std::array::from_fn(|r| wb.wrapping_add((i0 + r) * per_row).cast::<u8>()),
            tails: &[[0; 64]; R],
            scales: std::array::from_fn(|r| sb.wrapping_add((i0 + r) * g.ngroups)),
            next: std::ptr::null(),
            streams: false,
        };
        let mut b = 0;
        // SAFETY: `wbuf` holds `g.nfull` decoded blocks per row and `sbuf` the rows' scales:
        // `range`'s contract for `Decoded<C>`.
        unsafe {
            while b + BB <= self.batch {
                self.range::<V, C, R, BB>(t, g, i0, b, k0, k1);
                b += BB;
            }
            match self.batch - b {
                0 => {}
                1 => self.range::<V, C, R, 1>(t, g, i0, b, k0, k1),
                2 => self.range::<V, C, R, 2>(t, g, i0, b, k0, k1),
                3 => self.range::<V, C, R, 3>(t, g, i0, b, k0, k1),
                n => unreachable!("remainder of {n} activations with chunks of {BB}"),
            }
        }
    }

    /// Rows `i0 .. i0 + R` × activations `b0 .. b0 + B` over blocks `k0 .. k1`, continuing the
    /// accumulators parked in `abuf`.
    #[inline(always)]
    unsafe fn range<V: Vector, C: Codec<V>, const R: usize, const B: usize>(
        &mut self,
        t: Rows<'_, R>,
        g: Geom,
        i0: usize,
        b0: usize,
        k0: usize,
        k1: usize,
    ) {
        let x0 = self.xp[b0 * LANES..].as_ptr();
        let x: [*const f32; B] = std::array::from_fn(|i| x0.wrapping_add(i * LANES));
        let batch = self.batch;
        let ap = self.abuf.as_mut_ptr();
        let at = |r: usize, b: usize| ((i0 + r) * batch + b0 + b) * LANES;
        // SAFETY: every `abuf` index is a (row, activation) pair of this call; the tile
        // pointers are as `subtile` describes.
        unsafe {
            let mut acc: [[V; B]; R] =
                std::array::from_fn(|r| std::array::from_fn(|b| V::load(ap.add(at(r, b)))));
            acc = match (C::QUANT, g.gblocks) {
                (false, _) => range_dense::<V, Decoded<C>, R, B>(t, x, g, k0, k1, acc),
                (true, 2) => range_quant::<V, Decoded<C>, R, B, 2>(t, x, g, k0, k1, acc),
                (true, 8) => range_quant::<V, Decoded<C>, R, B, 8>(t, x, g, k0, k1, acc),
                (true, _) => range_quant::<V, Decoded<C>, R, B, 0>(t, x, g, k0, k1, acc),
            };
            for (r, ar) in acc.iter().enumerate() {
                for (b, a) in ar.iter().enumerate() {
                    a.store(ap.add(at(r, b)));
                }
            }
        }
    }

    fn write<const R: usize, const B: usize>(&mut self, r0: usize, b0: usize, out: &[[f32; B]; R]) {
        let k0 = r0 - self.first_row;
        for (i, o) in out.iter().enumerate() {
            for (j, &v) in o.iter().enumerate() {
                self.y[(b0 + j) * self.nr + k0 + i] = v;
            }
        }
    }
}

/// `y[b, r − rows.start] = m[r] · x[b]` by the contract: for one activation row, `R1` rows at
/// a time decoded as they stream in (dense codes over at least `4 × RS` rows: `RS` strided
/// streams, [`Job::rows_strided`]); for up to [`FEW`] over rows of at most [`KC`] blocks, the
/// same `R1` rows against four activation rows at a time ([`Job::rows_few`]); for more, or
/// longer rows, [`RD`] rows at a time decoded once and
/// multiplied in tiles of `RB` rows (`RQ` for quantized codes, which need a group accumulator
/// per pair as well) × `BB` activation rows (`BB` ≤ 4).
///
/// # Safety
/// The ISA of `V` is available, `m.codes()` is the coding `C` decodes, and the lengths satisfy
/// the checks of [`crate::Kernels::matmul`].
#[inline(always)]
pub(crate) unsafe fn matmul<
    V: Vector,
    C: Codec<V>,
    const R1: usize,
    const RS: usize,
    const RB: usize,
    const RQ: usize,
    const BB: usize,
>(
    m: &Matrix<'_>,
    x: &[f32],
    y: &mut [f32],
    rows: Range<usize>,
) {
    let cols = m.cols();
    let nr = rows.len();
    if nr == 0 || cols == 0 {
        return;
    }
    let batch = y.len() / nr;
    assert!(x.len() == batch * cols && y.len() == batch * nr && rows.end <= m.rows());
    if batch == 0 {
        return;
    }
    let xp = prepare_x(&C::LAYOUT, x, cols, batch);
    let nblocks = cols.div_ceil(LANES);
    let (gcols, ngroups) = match m.scales() {
        Some(s) => (s.group_cols, cols.div_ceil(s.group_cols)),
        None => (nblocks * LANES, 1),
    };
    let geom = Geom {
        nfull: cols / LANES,
        tail: !cols.is_multiple_of(LANES),
        gblocks: gcols / LANES,
        ngroups,
        xstride: batch * LANES,
    };
    let rmax = R1.max(RD);
    let mut job = Job {
        m,
        xp: &xp,
        batch,
        geom,
        y,
        first_row: rows.start,
        nr,
        sbuf: if C::QUANT {
            vec![0f32; rmax * ngroups]
        } else {
            Vec::new()
        },
        wbuf: if batch > 1 {
            vec![0f32; RD * nblocks * LANES]
        } else {
            Vec::new()
        },
        abuf: if batch > 1 {
            vec![0f32; RD * batch * LANES]
        } else {
            Vec::new()
        },
    };
    let mut r = rows.start;
    // SAFETY: forwarded from this function's contract; every row index is inside `rows`,
    // which lies inside the matrix.
    unsafe {
        if batch == 1 && !C::QUANT && nr >= 4 * RS {
            let q = nr / RS;
            for k in 0..q {
                job.rows_strided::<V, C, RS>(rows.start + k, q);
            }
            r = rows.start + q * RS;
            while r < rows.end {
                job.rows_one::<V, C, 1>(r);
                r += 1;
            }
        } else if batch == 1 {
            while r + R1 <= rows.end {
                job.rows_one::<V, C, R1>(r);
                r += R1;
            }
            while r < rows.end {
                job.rows_one::<V, C, 1>(r);
                r += 1;
            }
        } else if batch <= FEW && nblocks <= KC {
            while r + R1 <= rows.end {
                job.rows_few::<V, C, R1>(r);
                r += R1;
            }
            while r < rows.end {
                job.rows_few::<V, C, 1>(r);
                r += 1;
            }
        } else {
            while r < rows.end {
                let n = RD.min(rows.end - r);
                if C::QUANT {
                    job.rows_many::<V, C, RQ, BB>(r, n);
                } else {
                    job.rows_many::<V, C, RB, BB>(r, n);
                }
                r += n;
            }
        }
    }
}
