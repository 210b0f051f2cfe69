//! The row ops over a [`Vector`]: each the scalar function it names, bit for bit.

use super::{NATURAL, Vector, reduce};
use crate::scalar::LANES;

/// [`crate::scalar::dot`].
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

/// [`crate::scalar::sum`].
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

/// [`crate::scalar::axpy`].
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

/// [`crate::scalar::rmsnorm`].
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

/// [`crate::scalar::sigmoid`].
struct Sigmoid;
impl Lanewise for Sigmoid {
    #[inline(always)]
    unsafe fn apply<V: Vector>(v: V, _: f32) -> V {
        // SAFETY: the caller guarantees the ISA.
        unsafe { V::splat(1.0).div(one_plus_exp_neg(v)) }
    }
}

/// [`crate::scalar::silu`].
struct Silu;
impl Lanewise for Silu {
    #[inline(always)]
    unsafe fn apply<V: Vector>(v: V, _: f32) -> V {
        // SAFETY: the caller guarantees the ISA.
        unsafe { v.div(one_plus_exp_neg(v)) }
    }
}

/// [`crate::scalar::exp`].
struct Exp;
impl Lanewise for Exp {
    #[inline(always)]
    unsafe fn apply<V: Vector>(v: V, _: f32) -> V {
        // SAFETY: the caller guarantees the ISA.
        unsafe { v.exp() }
    }
}

/// [`crate::scalar::softmax`].
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

/// `1 + e^−x` lane-wise, the denominator of [`crate::scalar::sigmoid`] and [`crate::scalar::silu`].
#[inline(always)]
unsafe fn one_plus_exp_neg<V: Vector>(v: V) -> V {
    // SAFETY: the caller guarantees the ISA.
    unsafe { V::splat(1.0).add(v.neg().exp()) }
}

/// [`crate::scalar::silu_mul`].
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

/// [`crate::scalar::sigmoid`] over a slice, in place.
///
/// # Safety
/// The ISA of `V` is available.
#[inline(always)]
pub(crate) unsafe fn sigmoid<V: Vector>(x: &mut [f32]) {
    // SAFETY: the ISA is available.
    unsafe { map_in_place::<V, Sigmoid>(x, 0.0) }
}

/// [`crate::scalar::silu`] over a slice, in place.
///
/// # Safety
/// The ISA of `V` is available.
#[inline(always)]
pub(crate) unsafe fn silu<V: Vector>(x: &mut [f32]) {
    // SAFETY: the ISA is available.
    unsafe { map_in_place::<V, Silu>(x, 0.0) }
}

/// [`crate::scalar::exp`] over a slice, in place.
///
/// # Safety
/// The ISA of `V` is available.
#[inline(always)]
pub(crate) unsafe fn exp<V: Vector>(x: &mut [f32]) {
    // SAFETY: the ISA is available.
    unsafe { map_in_place::<V, Exp>(x, 0.0) }
}
