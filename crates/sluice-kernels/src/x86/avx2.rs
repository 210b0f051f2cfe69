//! AVX2 with FMA and F16C: the 16 lanes of the contract are two ymm registers (lanes 0–7 and
//! 8–15 of the decoder's layout).
//!
//! Decoders (all exact):
//! - F32: two loads. BF16: one 32-byte load of 16 codes; `word << 16` gives the even columns
//!   and `word & 0xffff0000` the odd ones ([`EVEN_ODD`] layout). F16: `vcvtph2ps`.
//! - E4M3: the byte rearranged into the f16 with the same bits shifted (`(b + s·128) << 7`),
//!   which is the value divided by 2⁸ (E4M3 subnormals land on f16 subnormals), converted by
//!   `vcvtph2ps` and multiplied by 2⁸, both exact; `0x7f` made an f16 NaN first.
//! - INT4: the 8 bytes of a block, xor `0x88…` (so that a nibble read as a signed 4-bit number
//!   is `code − 8`), broadcast; per 32-bit lane a variable left shift brings the lane's nibble
//!   to bits 28–31 and an arithmetic right shift by 28 sign-extends it ([`NIBBLE`] layout).
//! - E2M1: the magnitude from an 8-entry `vpermps` on the nibble's low 3 bits, the sign bit
//!   from its bit 3.
//! - I8: sign-extend and convert.

use std::arch::x86_64::*;
use std::ops::Range;

use super::generic::{self, Codec, EVEN_ODD, NATURAL, NIBBLE, Vector};
use crate::decode::scale_at;
use crate::matrix::{Codes, Matrix, ScaleType};

/// 16 lanes in two ymm registers.
#[derive(Clone, Copy)]
pub(crate) struct V256(__m256, __m256);

const EXP_HI: f32 = 88.722_84;
const EXP_LO: f32 = -87.336_54;
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

/// Applies a two-operand ymm intrinsic to both halves.
macro_rules! both {
    ($f:ident, $a:expr, $b:expr) => {{
        let (a, b) = ($a, $b);
        V256($f(a.0, b.0), $f(a.1, b.1))
    }};
}

impl Vector for V256 {
    #[inline(always)]
    unsafe fn tree(self) -> f32 {
        // SAFETY: AVX is available (trait contract).
        unsafe {
            // s8[i] = a[i] + a[i + 8]: the two halves.
            let s8 = _mm256_add_ps(self.0, self.1);
            // s4[i] = s8[i] + s8[i + 4]
            let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
            // s2 = [s4[0] + s4[2], s4[1] + s4[3]]
            let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            // s2[0] + s2[1]
            _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2)))
        }
    }
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: AVX is available (trait contract).
        unsafe { V256(_mm256_setzero_ps(), _mm256_setzero_ps()) }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        // SAFETY: AVX is available.
        unsafe { V256(_mm256_set1_ps(v), _mm256_set1_ps(v)) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: AVX is available; `p` is valid for 16 f32s (trait contract).
        unsafe { V256(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: AVX is available; `p` is valid for 16 f32s.
        unsafe {
            _mm256_storeu_ps(p, self.0);
            _mm256_storeu_ps(p.add(8), self.1);
        }
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        // SAFETY: AVX is available.
        unsafe { both!(_mm256_add_ps, self, b) }
    }
    #[inline(always)]
    unsafe fn sub(self, b: Self) -> Self {
        // SAFETY: AVX is available.
        unsafe { both!(_mm256_sub_ps, self, b) }
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        // SAFETY: AVX is available.
        unsafe { both!(_mm256_mul_ps, self, b) }
    }
    #[inline(always)]
    unsafe fn div(self, b: Self) -> Self {
        // SAFETY: AVX is available.
        unsafe { both!(_mm256_div_ps, self, b) }
    }
    #[inline(always)]
    unsafe fn neg(self) -> Self {
        // SAFETY: AVX is available.
        unsafe { both!(_mm256_xor_ps, self, Self::splat(-0.0)) }
    }
    #[inline(always)]
    unsafe fn mul_add(self, b: Self, c: Self) -> Self {
        // SAFETY: FMA is available.
        unsafe {
            V256(
                _mm256_fmadd_ps(self.0, b.0, c.0),
                _mm256_fmadd_ps(self.1, b.1, c.1),
            )
        }
    }
    #[inline(always)]
    unsafe fn max(self, b: Self) -> Self {
        // SAFETY: AVX is available.
        unsafe { both!(_mm256_max_ps, self, b) }
    }
    #[inline(always)]
    unsafe fn any_nan(self) -> bool {
        // SAFETY: AVX is available.
        unsafe {
            let u = _mm256_or_ps(
                _mm256_cmp_ps::<_CMP_UNORD_Q>(self.0, self.0),
                _mm256_cmp_ps::<_CMP_UNORD_Q>(self.1, self.1),
            );
            _mm256_movemask_ps(u) != 0
        }
    }
    #[inline(always)]
    unsafe fn exp(self) -> Self {
        // SAFETY: AVX2 and FMA are available.
        unsafe { V256(exp8(self.0), exp8(self.1)) }
    }
    #[inline(always)]
    unsafe fn decode_scales(ty: ScaleType, src: &[u8], dst: &mut [f32]) {
        let n = dst.len();
        let mut g = 0;
        // SAFETY: AVX2 and F16C are available; each load reads 8 scales inside `src`, which
        // holds `n` scales of `ty.size()` bytes.
        unsafe {
            match ty {
                ScaleType::BF16 => {
                    while g + 8 <= n {
                        let h = _mm_loadu_si128(src.as_ptr().add(2 * g).cast());
                        let v = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h));
                        _mm256_storeu_ps(dst.as_mut_ptr().add(g), _mm256_castsi256_ps(v));
                        g += 8;
                    }
                }
                ScaleType::F16 => {
                    while g + 8 <= n {
                        let h = _mm_loadu_si128(src.as_ptr().add(2 * g).cast());
                        _mm256_storeu_ps(dst.as_mut_ptr().add(g), _mm256_cvtph_ps(h));
                        g += 8;
                    }
                }
                ScaleType::E8M0 => {
                    while g + 8 <= n {
                        let b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(src.as_ptr().add(g).cast()));
                        let mut v = _mm256_slli_epi32::<23>(b);
                        let k0 = _mm256_cmpeq_epi32(b, _mm256_setzero_si256());
                        v = _mm256_blendv_epi8(v, _mm256_set1_epi32(0x0040_0000), k0);
                        let kn = _mm256_cmpeq_epi32(b, _mm256_set1_epi32(255));
                        v = _mm256_blendv_epi8(v, _mm256_set1_epi32(f32::NAN.to_bits() as i32), kn);
                        _mm256_storeu_ps(dst.as_mut_ptr().add(g), _mm256_castsi256_ps(v));
                        g += 8;
                    }
                }
                ScaleType::F32 => {}
            }
        }
        for (i, d) in dst.iter_mut().enumerate().skip(g) {
            *d = scale_at(ty, src, i);
        }
    }
}

/// [`crate::scalar::exp`] on 8 lanes: the same operations in the same order, then the three
/// special cases selected in the scalar code's order of precedence.
#[inline(always)]
unsafe fn exp8(x: __m256) -> __m256 {
    // SAFETY: AVX2 and FMA are available (caller's contract).
    unsafe {
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        // fma(−n, c, x) is −(n·c) + x with one rounding: vfnmadd.
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
        let mut p = _mm256_set1_ps(EXP_P[0]);
        for &c in &EXP_P[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let y = _mm256_add_ps(
            _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
            _mm256_set1_ps(1.0),
        );
        // n / 2 rounded toward zero, as Rust's `i32 / 2`.
        let ni = _mm256_cvttps_epi32(n);
        let half = _mm256_srai_epi32::<1>(_mm256_add_epi32(ni, _mm256_srli_epi32::<31>(ni)));
        let bias = _mm256_set1_epi32(127);
        let p1 = _mm256_slli_epi32::<23>(_mm256_add_epi32(half, bias));
        let p2 = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_sub_epi32(ni, half), bias));
        let mut res = _mm256_mul_ps(
            _mm256_mul_ps(y, _mm256_castsi256_ps(p1)),
            _mm256_castsi256_ps(p2),
        );
        let lo = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(EXP_LO));
        res = _mm256_blendv_ps(res, _mm256_setzero_ps(), lo);
        let hi = _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(EXP_HI));
        res = _mm256_blendv_ps(res, _mm256_set1_ps(f32::INFINITY), hi);
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
        _mm256_blendv_ps(res, x, nan)
    }
}

/// IEEE binary32.
pub(crate) struct F32;
/// bfloat16.
pub(crate) struct Bf16;
/// IEEE binary16.
pub(crate) struct F16;
/// FP8 E4M3.
pub(crate) struct E4m3;
/// INT4 (code − 8).
pub(crate) struct Int4;
/// FP4 E2M1.
pub(crate) struct E2m1;
/// int8.
pub(crate) struct I8;

impl Codec<V256> for F32 {
    const BLOCK_BYTES: usize = 64;
    const LAYOUT: [u8; 16] = NATURAL;
    const PAD: u8 = 0;
    const QUANT: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> V256 {
        // SAFETY: AVX is available; `p` is valid for 64 bytes (trait contract).
        unsafe { V256::load(p.cast()) }
    }
}

impl Codec<V256> for Bf16 {
    const BLOCK_BYTES: usize = 32;
    const LAYOUT: [u8; 16] = EVEN_ODD;
    const PAD: u8 = 0;
    const QUANT: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> V256 {
        // SAFETY: AVX2 is available; `p` is valid for 32 bytes.
        unsafe {
            let d = _mm256_loadu_si256(p.cast());
            let even = _mm256_slli_epi32::<16>(d);
            let odd = _mm256_and_si256(d, _mm256_set1_epi32(0xffff_0000u32 as i32));
            V256(_mm256_castsi256_ps(even), _mm256_castsi256_ps(odd))
        }
    }
}

impl Codec<V256> for F16 {
    const BLOCK_BYTES: usize = 32;
    const LAYOUT: [u8; 16] = NATURAL;
    const PAD: u8 = 0;
    const QUANT: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> V256 {
        // SAFETY: F16C is available; `p` is valid for 32 bytes.
        unsafe {
            V256(
                _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(16).cast())),
            )
        }
    }
}

impl Codec<V256> for E4m3 {
    const BLOCK_BYTES: usize = 16;
    const LAYOUT: [u8; 16] = NATURAL;
    const PAD: u8 = 0;
    const QUANT: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> V256 {
        // SAFETY: AVX2, FMA and F16C are available; `p` is valid for 16 bytes.
        unsafe {
            let w = _mm256_cvtepu8_epi16(_mm_loadu_si128(p.cast()));
            // b = s·128 + |b| → f16 bits s·2¹⁵ + |b|·2⁷ = ((b + s·128) << 7): the E4M3 value
            // divided by 2⁸, exact in f16 (E4M3 subnormals land on f16 subnormals).
            let t = _mm256_add_epi16(w, _mm256_and_si256(w, _mm256_set1_epi16(0x80)));
            let mut h = _mm256_slli_epi16::<7>(t);
            // |b| = 0x7f is NaN: turn s | 0x3f80 into the f16 quiet NaN s | 0x7e00, which
            // converts to the f32 NaN the table holds (s | 0x7fc00000).
            let seven_f = _mm256_set1_epi16(0x7f);
            let nan = _mm256_cmpeq_epi16(_mm256_and_si256(w, seven_f), seven_f);
            h = _mm256_xor_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x4180)));
            let k = _mm256_set1_ps(256.0);
            let lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
            let hi = _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h));
            V256(_mm256_mul_ps(lo, k), _mm256_mul_ps(hi, k))
        }
    }
}

/// The 8 bytes at `p` broadcast to every 64-bit lane.
#[inline(always)]
unsafe fn broadcast8(p: *const u8) -> __m256i {
    // SAFETY: AVX is available; `p` is valid for 8 bytes (caller's contract).
    unsafe { _mm256_set1_epi64x(p.cast::<i64>().read_unaligned()) }
}

/// Left shifts that bring the nibble of lane `p` (column `8 (p & 1) + (p >> 1)`) to bits
/// 28–31, for lanes 0–7 and 8–15.
const SHL_LO: [i32; 8] = [28, 28, 24, 24, 20, 20, 16, 16];
const SHL_HI: [i32; 8] = [12, 12, 8, 8, 4, 4, 0, 0];
/// Right shifts that bring it to bits 0–3.
const SHR_LO: [i32; 8] = [0, 0, 4, 4, 8, 8, 12, 12];
const SHR_HI: [i32; 8] = [16, 16, 20, 20, 24, 24, 28, 28];

#[inline(always)]
unsafe fn consts8(c: &[i32; 8]) -> __m256i {
    // SAFETY: AVX is available; `c` holds 8 i32s.
    unsafe { _mm256_loadu_si256(c.as_ptr().cast()) }
}

impl Codec<V256> for Int4 {
    const BLOCK_BYTES: usize = 8;
    const LAYOUT: [u8; 16] = NIBBLE;
    const PAD: u8 = 0x88;
    const QUANT: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> V256 {
        // SAFETY: AVX2 is available; `p` is valid for 8 bytes.
        unsafe {
            let v = _mm256_xor_si256(broadcast8(p), _mm256_set1_epi8(0x88u8 as i8));
            let lo = _mm256_srai_epi32::<28>(_mm256_sllv_epi32(v, consts8(&SHL_LO)));
            let hi = _mm256_srai_epi32::<28>(_mm256_sllv_epi32(v, consts8(&SHL_HI)));
            V256(_mm256_cvtepi32_ps(lo), _mm256_cvtepi32_ps(hi))
        }
    }
}

/// Eight E2M1 values from the broadcast block `v`: magnitude by the nibble's low 3 bits, sign
/// from its bit 3.
#[inline(always)]
unsafe fn e2m1x8(v: __m256i, shr: &[i32; 8], shl: &[i32; 8]) -> __m256 {
    // SAFETY: AVX2 is available (caller's contract).
    unsafe {
        let mag = _mm256_setr_ps(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
        let m = _mm256_permutevar8x32_ps(mag, _mm256_srlv_epi32(v, consts8(shr)));
        let s = _mm256_and_si256(
            _mm256_sllv_epi32(v, consts8(shl)),
            _mm256_set1_epi32(i32::MIN),
        );
        _mm256_or_ps(m, _mm256_castsi256_ps(s))
    }
}

impl Codec<V256> for E2m1 {
    const BLOCK_BYTES: usize = 8;
    const LAYOUT: [u8; 16] = NIBBLE;
    const PAD: u8 = 0;
    const QUANT: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> V256 {
        // SAFETY: AVX2 is available; `p` is valid for 8 bytes.
        unsafe {
            let v = broadcast8(p);
            V256(e2m1x8(v, &SHR_LO, &SHL_LO), e2m1x8(v, &SHR_HI, &SHL_HI))
        }
    }
}

impl Codec<V256> for I8 {
    const BLOCK_BYTES: usize = 16;
    const LAYOUT: [u8; 16] = NATURAL;
    const PAD: u8 = 0;
    const QUANT: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> V256 {
        // SAFETY: AVX2 is available; `p` is valid for 16 bytes.
        unsafe {
            let lo = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast()));
            let hi = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(8).cast()));
            V256(_mm256_cvtepi32_ps(lo), _mm256_cvtepi32_ps(hi))
        }
    }
}

/// Output rows per tile for one activation row.
const R1: usize = 4;
/// Rows per strided tile (dense codes, one activation row): `RS` sequential streams.
const RS: usize = 4;
/// Output rows (dense, quantized) × activation rows per tile for several activation rows.
const RQ: usize = 1;
const RB: usize = 2;
const BB: usize = 2;

/// [`crate::Kernels::matmul`] with AVX2.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C ([`crate::Isa::Avx2`] is available), `m.cols() > 0`,
/// and the lengths must pass the checks of [`crate::Kernels::matmul`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn matmul(m: &Matrix<'_>, x: &[f32], y: &mut [f32], rows: Range<usize>) {
    // SAFETY: the ISA is available and the shapes are checked (this function's contract);
    // each arm decodes the coding it matches.
    unsafe {
        match m.codes() {
            Codes::F32 => generic::matmul::<V256, F32, R1, RS, RB, RQ, BB>(m, x, y, rows),
            Codes::BF16 => generic::matmul::<V256, Bf16, R1, RS, RB, RQ, BB>(m, x, y, rows),
            Codes::F16 => generic::matmul::<V256, F16, R1, RS, RB, RQ, BB>(m, x, y, rows),
            Codes::E4M3 => generic::matmul::<V256, E4m3, R1, RS, RB, RQ, BB>(m, x, y, rows),
            Codes::Int4 => generic::matmul::<V256, Int4, R1, RS, RB, RQ, BB>(m, x, y, rows),
            Codes::E2M1 => generic::matmul::<V256, E2m1, R1, RS, RB, RQ, BB>(m, x, y, rows),
            Codes::I8 => generic::matmul::<V256, I8, R1, RS, RB, RQ, BB>(m, x, y, rows),
            // Block matrices go row by row (`gguf::matmul`); the specification otherwise.
            Codes::Block(_) => crate::scalar::matmul(m, x, y, rows),
        }
    }
}

xw_ops!(V256, "avx2,fma,f16c", 4, 2, 2, 4);

/// Declares `#[target_feature]` entry points for the row ops of [`generic`].
macro_rules! row_ops {
    ($($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)?;)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// The CPU must have AVX2, FMA and F16C; slice lengths must pass the checks of the
        /// matching [`crate::Kernels`] method.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(crate) unsafe fn $name($($arg: $ty),*) $(-> $ret)? {
            // SAFETY: the ISA is available (this function's contract).
            unsafe { generic::$name::<V256>($($arg),*) }
        }
    )*};
}

row_ops! {
    /// [`crate::scalar::dot`].
    fn dot(a: &[f32], b: &[f32]) -> f32;
    /// [`crate::scalar::sum`].
    fn sum(x: &[f32]) -> f32;
    /// [`crate::scalar::axpy`].
    fn axpy(a: f32, x: &[f32], y: &mut [f32]);
    /// [`crate::scalar::rmsnorm`].
    fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]);
    /// [`crate::scalar::softmax`].
    fn softmax(x: &mut [f32]);
    /// [`crate::scalar::silu_mul`].
    fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]);
    /// [`crate::scalar::sigmoid`] in place.
    fn sigmoid(x: &mut [f32]);
    /// [`crate::scalar::silu`] in place.
    fn silu(x: &mut [f32]);
    /// [`crate::scalar::exp`] in place.
    fn exp(x: &mut [f32]);
}
