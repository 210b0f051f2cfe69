//! The SIMD kernels written once, over a 16-lane vector ([`Vector`]) and a block decoder
//! ([`Codec`]). Every function here is `#[inline(always)]` and is only ever called from an ISA
//! module's `#[target_feature]` entry point, into which it is inlined.
//!
//! - [`matmul`]: the products of [`crate::Kernels::matmul`];
//! - [`xw`]: decoding rows and the transposed products ([`crate::Kernels::decode_row`],
//!   [`crate::Kernels::matmul_xw`], [`crate::Kernels::absorb`],
//!   [`crate::Kernels::weighted_sum`]);
//! - [`rows`]: the row ops (dot, sum, axpy, RMSNorm, softmax, SwiGLU, sigmoid, SiLU, exp).

use crate::matrix::ScaleType;
use crate::scalar::{self, LANES};

mod matmul;
mod rows;
mod xw;

pub(crate) use matmul::matmul;
pub(crate) use rows::{axpy, dot, exp, rmsnorm, sigmoid, silu, silu_mul, softmax, sum};
pub(crate) use xw::{decode_row, xw};

/// Lane layout where lane `p` holds column `p` of the block.
pub(crate) const NATURAL: [u8; LANES] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];
/// Lane layout of the nibble decoders: lane `p` holds column `8 (p & 1) + (p >> 1)`, which is
/// what shifting a broadcast 64-bit word right by `4 (p >> 1)` per 32-bit lane yields.
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

    /// The contract's pairwise tree over the lanes in lane order ([`scalar::tree`]): lanes
    /// `i` and `i + 8` first, then `i` and `i + 4`, `i` and `i + 2`, then the last two. The
    /// ISA types do it with shuffles; the adds are the tree's (each pair added once, and an
    /// IEEE sum does not depend on its operands' order), so the bits are too.
    #[inline(always)]
    unsafe fn tree(self) -> f32 {
        // SAFETY: the caller guarantees the ISA.
        scalar::tree(&unsafe { self.to_array() })
    }

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
pub(super) unsafe fn reduce<V: Vector>(v: V, layout: &[u8; LANES]) -> f32 {
    if *layout == NATURAL {
        // SAFETY: the caller guarantees the ISA.
        return unsafe { v.tree() };
    }
    // SAFETY: the caller guarantees the ISA.
    let a = unsafe { v.to_array() };
    let mut c = [0f32; LANES];
    for (p, &col) in layout.iter().enumerate() {
        c[col as usize] = a[p];
    }
    scalar::tree(&c)
}
