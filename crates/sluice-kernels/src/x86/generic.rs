//! The SIMD kernels written once, over a 16-lane vector ([`Vector`]) and a block decoder
//! ([`Codec`]). Every function here is `#[inline(always)]` and is only ever called from an ISA
//! module's `#[target_feature]` entry point, into which it is inlined.
//!
//! # Matrix products
//!
//! Output rows are taken `R` at a time and activation rows `B` at a time; each (row,
//! activation) pair owns its own 16-lane accumulator (and, for quantized codes, its own group
//! accumulator), fed in column order exactly as [`scalar::dot_row`] does. A weight block is
//! decoded once per tile and used for all `B` activations; the activations are loaded once per
//! block and used for all `R` rows. Sharing loads never shares arithmetic, so the result of a
//! pair does not depend on `R`, `B`, the row range or the batch.
//!
//! Tails follow the contract: the activations are copied once per call into a buffer padded
//! with `+0.0` to a multiple of 16 columns (and permuted into the decoder's lane layout), and
//! the last partial block of each weight row is copied into a buffer filled with a byte that
//! decodes to `+0.0` ([`Codec::PAD`]), so the padded lanes compute `fma(+0, +0, acc)` like the
//! scalar code.

use std::ops::Range;

use crate::matrix::{Matrix, ScaleType};
use crate::scalar::{self, LANES};

/// Lane layout where lane `p` holds column `p` of the block.
pub(crate) const NATURAL: [u8; LANES] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];
/// Lane layout of the nibble decoders: lane `p` holds column `8 (p & 1) + (p >> 1)`, which is
/// what a variable shift of a broadcast 64-bit word yields.
pub(crate) const NIBBLE: [u8; LANES] = [0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15];
/// Lane layout of 16-bit codes split into even and odd columns of 32-bit words: lanes 0–7
/// hold columns 0, 2, …, 14 and lanes 8–15 columns 1, 3, …, 15.
pub(crate) const EVEN_ODD: [u8; LANES] = [0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15];

/// 16 f32 lanes and the operations the kernels need. All methods require the ISA of the
/// implementing type to be available; pointer arguments must be valid for 16 f32s.
pub(crate) trait Vector: Copy {
    /// All lanes `+0.0`.
    unsafe fn zero() -> Self;
    /// All lanes `v`.
    unsafe fn splat(v: f32) -> Self;
    /// Unaligned load of 16 f32s.
    unsafe fn load(p: *const f32) -> Self;
    /// Unaligned store of 16 f32s.
    unsafe fn store(self, p: *mut f32);
    /// Lane-wise `self + b`.
    unsafe fn add(self, b: Self) -> Self;
    /// Lane-wise `self − b`.
    unsafe fn sub(self, b: Self) -> Self;
    /// Lane-wise `self × b`.
    unsafe fn mul(self, b: Self) -> Self;
    /// Lane-wise `self / b`.
    unsafe fn div(self, b: Self) -> Self;
    /// Lane-wise sign flip (as `-x` in Rust).
    unsafe fn neg(self) -> Self;
    /// Lane-wise `fma(self, b, c)`, one rounding.
    unsafe fn mul_add(self, b: Self, c: Self) -> Self;
    /// Lane-wise maximum (only used on lanes without NaN).
    unsafe fn max(self, b: Self) -> Self;
    /// Whether any lane is NaN.
    unsafe fn any_nan(self) -> bool;
    /// Lane-wise [`scalar::exp`], bit for bit.
    unsafe fn exp(self) -> Self;
    /// Decodes `dst.len()` scales of type `ty` from `src` into f32 (exact, as
    /// [`crate::decode::scale_at`]).
    unsafe fn decode_scales(ty: ScaleType, src: &[u8], dst: &mut [f32]);

    /// The lanes as an array.
    #[inline(always)]
    unsafe fn to_array(self) -> [f32; LANES] {
        let mut a = [0f32; LANES];
        // SAFETY: `a` holds 16 f32s.
        unsafe { self.store(a.as_mut_ptr()) };
        a
    }

    /// Loads `s` (at most 16 values) padded with `+0.0`.
    #[inline(always)]
    unsafe fn load_partial(s: &[f32]) -> Self {
        let mut a = [0f32; LANES];
        a[..s.len()].copy_from_slice(s);
        // SAFETY: `a` holds 16 f32s.
        unsafe { Self::load(a.as_ptr()) }
    }

    /// Stores the first `d.len()` lanes (at most 16) into `d`.
    #[inline(always)]
    unsafe fn store_partial(self, d: &mut [f32]) {
        // SAFETY: the caller guarantees the ISA.
        let a = unsafe { self.to_array() };
        let n = d.len();
        d.copy_from_slice(&a[..n]);
    }
}

/// How a block of 16 stored columns decodes into the lanes of `V`.
pub(crate) trait Codec<V: Vector> {
    /// Stored bytes per 16 columns.
    const BLOCK_BYTES: usize;
    /// Column of the block held by each lane.
    const LAYOUT: [u8; LANES];
    /// A byte whose every element decodes to `+0.0` (pads the last block of a row).
    const PAD: u8;
    /// Whether the coding carries group scales.
    const QUANT: bool;
    /// Decodes the 16 columns at `p` (valid for [`Self::BLOCK_BYTES`] bytes), exactly.
    unsafe fn decode(p: *const u8) -> V;
}

/// The contract's tree over a vector's lanes, after putting them back in column order.
#[inline(always)]
unsafe fn reduce<V: Vector>(v: V, layout: &[u8; LANES]) -> f32 {
    // SAFETY: the caller guarantees the ISA.
    let a = unsafe { v.to_array() };
    let mut c = [0f32; LANES];
    for (p, &col) in layout.iter().enumerate() {
        c[col as usize] = a[p];
    }
    scalar::tree(&c)
}

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
}

/// One block for every pair of the tile: `acc[r][b] = fma(w_r, x_b, acc[r][b])`.
#[inline(always)]
unsafe fn step<V: Vector, C: Codec<V>, const R: usize, const B: usize>(
    w: &[*const u8; R],
    x: &[*const f32; B],
    acc: &mut [[V; B]; R],
) {
    for (wr, accr) in w.iter().zip(acc.iter_mut()) {
        // SAFETY: the caller guarantees the ISA and that `wr` is valid for a block and every
        // `x` pointer for 16 f32s.
        unsafe {
            let wv = C::decode(*wr);
            for (xb, a) in x.iter().zip(accr.iter_mut()) {
                *a = wv.mul_add(V::load(*xb), *a);
            }
        }
    }
}

/// `R` rows × `B` activations over a whole row.
///
/// # Safety
/// The ISA of `V` is available; each `w[r]` is valid for `g.nfull` blocks; each `x[b]` for
/// `16 × (g.nfull + g.tail)` f32s; for quantized codes each `scales[r]` for `g.ngroups` f32s.
#[inline(always)]
unsafe fn tile<V: Vector, C: Codec<V>, const R: usize, const B: usize>(
    w: [*const u8; R],
    tails: &[[u8; 64]; R],
    scales: [*const f32; R],
    x: [*const f32; B],
    g: Geom,
) -> [[f32; B]; R] {
    // SAFETY: the caller's guarantees cover every pointer advanced below (see # Safety).
    unsafe {
        let tail_w: [*const u8; R] = std::array::from_fn(|r| tails[r].as_ptr());
        let mut acc = [[V::zero(); B]; R];
        let mut wp = w;
        let mut xp = x;
        if C::QUANT {
            let mut blk = 0;
            for gi in 0..g.ngroups {
                let end = (blk + g.gblocks).min(g.nfull);
                let mut gacc = [[V::zero(); B]; R];
                while blk < end {
                    step::<V, C, R, B>(&wp, &xp, &mut gacc);
                    for p in wp.iter_mut() {
                        *p = p.add(C::BLOCK_BYTES);
                    }
                    for p in xp.iter_mut() {
                        *p = p.add(LANES);
                    }
                    blk += 1;
                }
                if gi + 1 == g.ngroups && g.tail {
                    step::<V, C, R, B>(&tail_w, &xp, &mut gacc);
                }
                for r in 0..R {
                    let s = V::splat(*scales[r].add(gi));
                    for b in 0..B {
                        acc[r][b] = gacc[r][b].mul_add(s, acc[r][b]);
                    }
                }
            }
        } else {
            for _ in 0..g.nfull {
                step::<V, C, R, B>(&wp, &xp, &mut acc);
                for p in wp.iter_mut() {
                    *p = p.add(C::BLOCK_BYTES);
                }
                for p in xp.iter_mut() {
                    *p = p.add(LANES);
                }
            }
            if g.tail {
                step::<V, C, R, B>(&tail_w, &xp, &mut acc);
            }
        }
        let mut out = [[0f32; B]; R];
        for r in 0..R {
            for b in 0..B {
                out[r][b] = reduce(acc[r][b], &C::LAYOUT);
            }
        }
        out
    }
}

/// The activations of a call, padded to whole blocks and permuted into the decoder's layout.
fn prepare_x(layout: &[u8; LANES], x: &[f32], cols: usize, batch: usize) -> (Vec<f32>, usize) {
    let nblocks = cols.div_ceil(LANES);
    let stride = nblocks * LANES;
    let mut xp = vec![0f32; batch * stride];
    for (src, dst) in x.chunks_exact(cols).zip(xp.chunks_exact_mut(stride)) {
        if *layout == NATURAL {
            dst[..cols].copy_from_slice(src);
            continue;
        }
        for (k, db) in dst.chunks_exact_mut(LANES).enumerate() {
            let base = k * LANES;
            for (d, &c) in db.iter_mut().zip(layout) {
                *d = src.get(base + c as usize).copied().unwrap_or(0.0);
            }
        }
    }
    (xp, stride)
}

/// Everything a product needs besides the tile shape.
struct Job<'a, 'm> {
    m: &'a Matrix<'m>,
    xp: &'a [f32],
    stride: usize,
    batch: usize,
    geom: Geom,
    y: &'a mut [f32],
    first_row: usize,
    nr: usize,
    sbuf: Vec<f32>,
}

impl Job<'_, '_> {
    /// Rows `r0 .. r0 + R` against every activation, `BB` activations at a time.
    #[inline(always)]
    unsafe fn rows<V: Vector, C: Codec<V>, const R: usize, const BB: usize>(&mut self, r0: usize) {
        let m = self.m;
        let g = self.geom;
        let w: [*const u8; R] = std::array::from_fn(|i| m.row(r0 + i).as_ptr());
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
                let dst = &mut self.sbuf[i * ng..(i + 1) * ng];
                // SAFETY: the ISA of `V` is available (the caller's guarantee).
                unsafe { V::decode_scales(s.ty, m.scale_row(r0 + i), dst) };
                *sp = dst.as_ptr();
            }
        }
        let mut b = 0;
        // SAFETY: the pointers satisfy `tile`'s contract: rows and tails come from the
        // validated matrix, activations from the padded buffer, scales from `sbuf`.
        unsafe {
            while b + BB <= self.batch {
                self.chunk::<V, C, R, BB>(r0, w, &tails, scales, b);
                b += BB;
            }
            match self.batch - b {
                0 => {}
                1 => self.chunk::<V, C, R, 1>(r0, w, &tails, scales, b),
                2 => self.chunk::<V, C, R, 2>(r0, w, &tails, scales, b),
                3 => self.chunk::<V, C, R, 3>(r0, w, &tails, scales, b),
                n => unreachable!("remainder of {n} activations with chunks of {BB}"),
            }
        }
    }

    /// One tile: rows `r0 .. r0 + R`, activations `b0 .. b0 + B`.
    #[inline(always)]
    unsafe fn chunk<V: Vector, C: Codec<V>, const R: usize, const B: usize>(
        &mut self,
        r0: usize,
        w: [*const u8; R],
        tails: &[[u8; 64]; R],
        scales: [*const f32; R],
        b0: usize,
    ) {
        let x: [*const f32; B] =
            std::array::from_fn(|i| self.xp[(b0 + i) * self.stride..].as_ptr());
        // SAFETY: forwarded from `rows`.
        let out = unsafe { tile::<V, C, R, B>(w, tails, scales, x, self.geom) };
        let k0 = r0 - self.first_row;
        for (i, o) in out.iter().enumerate() {
            for (j, &v) in o.iter().enumerate() {
                self.y[(b0 + j) * self.nr + k0 + i] = v;
            }
        }
    }
}

/// `y[b, r − rows.start] = m[r] · x[b]` by the contract, `R1` rows at a time for one activation
/// row and `RB` × `BB` tiles for several (`BB` ≤ 4).
///
/// # Safety
/// The ISA of `V` is available, `m.codes()` is the coding `C` decodes, `m.cols() > 0`, and the
/// lengths satisfy the checks of [`crate::Kernels::matmul`].
#[inline(always)]
pub(crate) unsafe fn matmul<
    V: Vector,
    C: Codec<V>,
    const R1: usize,
    const RB: usize,
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
    let (xp, stride) = prepare_x(&C::LAYOUT, x, cols, batch);
    let (gcols, ngroups) = match m.scales() {
        Some(s) => (s.group_cols, cols.div_ceil(s.group_cols)),
        None => (stride, 1),
    };
    let geom = Geom {
        nfull: cols / LANES,
        tail: !cols.is_multiple_of(LANES),
        gblocks: gcols / LANES,
        ngroups,
    };
    let sbuf = if C::QUANT {
        vec![0f32; R1.max(RB) * ngroups]
    } else {
        Vec::new()
    };
    let mut job = Job {
        m,
        xp: &xp,
        stride,
        batch,
        geom,
        y,
        first_row: rows.start,
        nr,
        sbuf,
    };
    let mut r = rows.start;
    // SAFETY: forwarded from this function's contract; every row index is inside `rows`,
    // which lies inside the matrix.
    unsafe {
        if batch == 1 {
            while r + R1 <= rows.end {
                job.rows::<V, C, R1, 1>(r);
                r += R1;
            }
            while r < rows.end {
                job.rows::<V, C, 1, 1>(r);
                r += 1;
            }
        } else {
            while r + RB <= rows.end {
                job.rows::<V, C, RB, BB>(r);
                r += RB;
            }
            while r < rows.end {
                job.rows::<V, C, 1, BB>(r);
                r += 1;
            }
        }
    }
}

// ---- row ops ----

/// [`scalar::dot`].
///
/// # Safety
/// The ISA of `V` is available; `a.len() == b.len()`.
#[inline(always)]
pub(crate) unsafe fn dot<V: Vector>(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    // SAFETY: every full load reads 16 values inside both slices.
    unsafe {
        let mut acc = V::zero();
        let mut j = 0;
        while j + LANES <= n {
            acc = V::load(a.as_ptr().add(j)).mul_add(V::load(b.as_ptr().add(j)), acc);
            j += LANES;
        }
        if j < n {
            acc = V::load_partial(&a[j..n]).mul_add(V::load_partial(&b[j..n]), acc);
        }
        reduce(acc, &NATURAL)
    }
}

/// [`scalar::sum`].
///
/// # Safety
/// The ISA of `V` is available.
#[inline(always)]
pub(crate) unsafe fn sum<V: Vector>(x: &[f32]) -> f32 {
    let n = x.len();
    // SAFETY: every full load reads 16 values inside the slice.
    unsafe {
        let mut acc = V::zero();
        let mut j = 0;
        while j + LANES <= n {
            acc = acc.add(V::load(x.as_ptr().add(j)));
            j += LANES;
        }
        if j < n {
            acc = acc.add(V::load_partial(&x[j..]));
        }
        reduce(acc, &NATURAL)
    }
}

/// [`scalar::axpy`].
///
/// # Safety
/// The ISA of `V` is available; `x.len() == y.len()`.
#[inline(always)]
pub(crate) unsafe fn axpy<V: Vector>(a: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    // SAFETY: every full load and store touches 16 values inside the slices.
    unsafe {
        let av = V::splat(a);
        let mut j = 0;
        while j + LANES <= n {
            let yp = y.as_mut_ptr().add(j);
            av.mul_add(V::load(x.as_ptr().add(j)), V::load(yp))
                .store(yp);
            j += LANES;
        }
        if j < n {
            let v = av.mul_add(V::load_partial(&x[j..n]), V::load_partial(&y[j..n]));
            v.store_partial(&mut y[j..n]);
        }
    }
}

/// [`scalar::rmsnorm`].
///
/// # Safety
/// The ISA of `V` is available; the three lengths are equal.
#[inline(always)]
pub(crate) unsafe fn rmsnorm<V: Vector>(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    // SAFETY: the ISA is available; full loads and stores stay inside the slices.
    unsafe {
        let ss = dot::<V>(x, x);
        let r = 1.0 / (ss / x.len() as f32 + eps).sqrt();
        let rv = V::splat(r);
        let n = x.len().min(w.len()).min(out.len());
        let mut j = 0;
        while j + LANES <= n {
            let v = V::load(w.as_ptr().add(j)).mul(V::load(x.as_ptr().add(j)).mul(rv));
            v.store(out.as_mut_ptr().add(j));
            j += LANES;
        }
        if j < n {
            let v = V::load_partial(&w[j..n]).mul(V::load_partial(&x[j..n]).mul(rv));
            v.store_partial(&mut out[j..n]);
        }
    }
}

/// A lane-wise operation with one scalar parameter (a named type, not a closure, so that it
/// is inlined into the `#[target_feature]` entry point with everything else).
pub(crate) trait Lanewise {
    /// The operation on 16 lanes.
    unsafe fn apply<V: Vector>(v: V, a: f32) -> V;
}

/// Applies `F` to every lane of `x` in place, 16 at a time (the tail padded with `+0.0`).
#[inline(always)]
unsafe fn map_in_place<V: Vector, F: Lanewise>(x: &mut [f32], a: f32) {
    let n = x.len();
    let mut j = 0;
    // SAFETY: the caller guarantees the ISA; full loads and stores stay inside the slice.
    unsafe {
        while j + LANES <= n {
            let p = x.as_mut_ptr().add(j);
            F::apply(V::load(p), a).store(p);
            j += LANES;
        }
        if j < n {
            F::apply(V::load_partial(&x[j..]), a).store_partial(&mut x[j..]);
        }
    }
}

/// `x / a`.
struct DivBy;
impl Lanewise for DivBy {
    #[inline(always)]
    unsafe fn apply<V: Vector>(v: V, a: f32) -> V {
        // SAFETY: the caller guarantees the ISA.
        unsafe { v.div(V::splat(a)) }
    }
}

/// [`scalar::sigmoid`].
struct Sigmoid;
impl Lanewise for Sigmoid {
    #[inline(always)]
    unsafe fn apply<V: Vector>(v: V, _: f32) -> V {
        // SAFETY: the caller guarantees the ISA.
        unsafe { V::splat(1.0).div(one_plus_exp_neg(v)) }
    }
}

/// [`scalar::silu`].
struct Silu;
impl Lanewise for Silu {
    #[inline(always)]
    unsafe fn apply<V: Vector>(v: V, _: f32) -> V {
        // SAFETY: the caller guarantees the ISA.
        unsafe { v.div(one_plus_exp_neg(v)) }
    }
}

/// [`scalar::exp`].
struct Exp;
impl Lanewise for Exp {
    #[inline(always)]
    unsafe fn apply<V: Vector>(v: V, _: f32) -> V {
        // SAFETY: the caller guarantees the ISA.
        unsafe { v.exp() }
    }
}

/// [`scalar::softmax`].
///
/// # Safety
/// The ISA of `V` is available.
#[inline(always)]
pub(crate) unsafe fn softmax<V: Vector>(x: &mut [f32]) {
    let n = x.len();
    if n == 0 {
        return;
    }
    // SAFETY: the ISA is available; loads and stores stay inside the slice.
    unsafe {
        // The maximum. Which of equal maxima (±0) is taken cannot change a bit of the result
        // (x − ±0 and exp(±0) agree), so the order of comparisons is free. A NaN anywhere makes
        // every output NaN; the scalar code takes the first NaN, so take it too.
        let mut vmax = V::splat(f32::NEG_INFINITY);
        let mut nan = false;
        let mut j = 0;
        while j + LANES <= n {
            let v = V::load(x.as_ptr().add(j));
            nan |= v.any_nan();
            vmax = vmax.max(v);
            j += LANES;
        }
        let mut m = vmax
            .to_array()
            .into_iter()
            .fold(f32::NEG_INFINITY, |a, b| if b > a { b } else { a });
        for &v in &x[j..] {
            nan |= v.is_nan();
            if v > m {
                m = v;
            }
        }
        if nan && let Some(&first) = x.iter().find(|v| v.is_nan()) {
            m = first;
        }
        // e = exp(x − m), summed in the contract's lane order as it is produced.
        let mv = V::splat(m);
        let mut acc = V::zero();
        let mut j = 0;
        while j + LANES <= n {
            let p = x.as_mut_ptr().add(j);
            let e = V::load(p).sub(mv).exp();
            e.store(p);
            acc = acc.add(e);
            j += LANES;
        }
        if j < n {
            let e = V::load_partial(&x[j..]).sub(mv).exp();
            e.store_partial(&mut x[j..]);
            acc = acc.add(V::load_partial(&x[j..]));
        }
        let s = reduce(acc, &NATURAL);
        map_in_place::<V, DivBy>(x, s);
    }
}

/// `1 + e^−x` lane-wise, the denominator of [`scalar::sigmoid`] and [`scalar::silu`].
#[inline(always)]
unsafe fn one_plus_exp_neg<V: Vector>(v: V) -> V {
    // SAFETY: the caller guarantees the ISA.
    unsafe { V::splat(1.0).add(v.neg().exp()) }
}

/// [`scalar::silu_mul`].
///
/// # Safety
/// The ISA of `V` is available; the three lengths are equal.
#[inline(always)]
pub(crate) unsafe fn silu_mul<V: Vector>(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = gate.len().min(up.len()).min(out.len());
    // SAFETY: the ISA is available; full loads and stores stay inside the slices.
    unsafe {
        let mut j = 0;
        while j + LANES <= n {
            let g = V::load(gate.as_ptr().add(j));
            let u = V::load(up.as_ptr().add(j));
            g.div(one_plus_exp_neg(g))
                .mul(u)
                .store(out.as_mut_ptr().add(j));
            j += LANES;
        }
        if j < n {
            let g = V::load_partial(&gate[j..n]);
            let u = V::load_partial(&up[j..n]);
            g.div(one_plus_exp_neg(g))
                .mul(u)
                .store_partial(&mut out[j..n]);
        }
    }
}

/// [`scalar::sigmoid`] over a slice, in place.
///
/// # Safety
/// The ISA of `V` is available.
#[inline(always)]
pub(crate) unsafe fn sigmoid<V: Vector>(x: &mut [f32]) {
    // SAFETY: the ISA is available.
    unsafe { map_in_place::<V, Sigmoid>(x, 0.0) }
}

/// [`scalar::silu`] over a slice, in place.
///
/// # Safety
/// The ISA of `V` is available.
#[inline(always)]
pub(crate) unsafe fn silu<V: Vector>(x: &mut [f32]) {
    // SAFETY: the ISA is available.
    unsafe { map_in_place::<V, Silu>(x, 0.0) }
}

/// [`scalar::exp`] over a slice, in place.
///
/// # Safety
/// The ISA of `V` is available.
#[inline(always)]
pub(crate) unsafe fn exp<V: Vector>(x: &mut [f32]) {
    // SAFETY: the ISA is available.
    unsafe { map_in_place::<V, Exp>(x, 0.0) }
}
