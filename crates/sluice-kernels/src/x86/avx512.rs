//! AVX-512 (F, BW, VL, DQ; with AVX2, FMA and F16C): the 16 lanes of the contract are one zmm.
//!
//! Decoders (all exact):
//! - F32: a plain load. BF16: zero-extend to 32 bits and shift left by 16. F16: `vcvtph2ps`.
//! - E4M3: the byte rearranged into the f16 with the same bits shifted (`(b + s·128) << 7`),
//!   which is the value divided by 2⁸ (E4M3 subnormals land on f16 subnormals), converted by
//!   `vcvtph2ps` and multiplied by 2⁸, both exact; `0x7f` → NaN.
//! - INT4 / E2M1: the 8 bytes of a block broadcast to every 64-bit lane `q` and rotated right
//!   by `4q`, so the low nibble of 32-bit lane `p` is column `8 (p & 1) + (p >> 1)`
//!   ([`NIBBLE`] layout); `vpermps` looks the 16 values up.
//! - I8: sign-extend and convert.

use std::arch::x86_64::*;
use std::ops::Range;

use super::generic::{self, Codec, NATURAL, NIBBLE, Vector};
use crate::decode::{E2M1_TABLE, INT4_TABLE, scale_at};
use crate::matrix::{Codes, Matrix, ScaleType};

/// 16 lanes in one zmm.
#[derive(Clone, Copy)]
pub(crate) struct V512(__m512);

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

impl Vector for V512 {
    #[inline(always)]
    unsafe fn tree(self) -> f32 {
        // SAFETY: AVX-512F (and the SSE/AVX it implies) is available (trait contract).
        unsafe {
            // s8[i] = a[i] + a[i + 8]
            let s8 = _mm256_add_ps(
                _mm512_castps512_ps256(self.0),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(self.0))),
            );
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
        // SAFETY: AVX-512F is available (trait contract).
        unsafe { V512(_mm512_setzero_ps()) }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> Self {
        // SAFETY: AVX-512F is available.
        unsafe { V512(_mm512_set1_ps(v)) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: AVX-512F is available; `p` is valid for 16 f32s (trait contract).
        unsafe { V512(_mm512_loadu_ps(p)) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: AVX-512F is available; `p` is valid for 16 f32s.
        unsafe { _mm512_storeu_ps(p, self.0) }
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        // SAFETY: AVX-512F is available.
        unsafe { V512(_mm512_add_ps(self.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn sub(self, b: Self) -> Self {
        // SAFETY: AVX-512F is available.
        unsafe { V512(_mm512_sub_ps(self.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        // SAFETY: AVX-512F is available.
        unsafe { V512(_mm512_mul_ps(self.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn div(self, b: Self) -> Self {
        // SAFETY: AVX-512F is available.
        unsafe { V512(_mm512_div_ps(self.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn neg(self) -> Self {
        // SAFETY: AVX-512F is available.
        unsafe {
            V512(_mm512_castsi512_ps(_mm512_xor_si512(
                _mm512_castps_si512(self.0),
                _mm512_set1_epi32(i32::MIN),
            )))
        }
    }
    #[inline(always)]
    unsafe fn mul_add(self, b: Self, c: Self) -> Self {
        // SAFETY: AVX-512F is available.
        unsafe { V512(_mm512_fmadd_ps(self.0, b.0, c.0)) }
    }
    #[inline(always)]
    unsafe fn max(self, b: Self) -> Self {
        // SAFETY: AVX-512F is available.
        unsafe { V512(_mm512_max_ps(self.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn any_nan(self) -> bool {
        // SAFETY: AVX-512F is available.
        unsafe { _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(self.0, self.0) != 0 }
    }
    #[inline(always)]
    unsafe fn exp(self) -> Self {
        // SAFETY: AVX-512F is available.
        unsafe { V512(exp16(self.0)) }
    }
    #[inline(always)]
    unsafe fn decode_scales(ty: ScaleType, src: &[u8], dst: &mut [f32]) {
        let n = dst.len();
        let mut g = 0;
        // SAFETY: AVX-512 is available; each load reads 16 scales inside `src`, which holds
        // `n` scales of `ty.size()` bytes.
        unsafe {
            match ty {
                ScaleType::BF16 => {
                    while g + 16 <= n {
                        let h = _mm256_loadu_si256(src.as_ptr().add(2 * g).cast());
                        let v = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h));
                        _mm512_storeu_ps(dst.as_mut_ptr().add(g), _mm512_castsi512_ps(v));
                        g += 16;
                    }
                }
                ScaleType::F16 => {
                    while g + 16 <= n {
                        let h = _mm256_loadu_si256(src.as_ptr().add(2 * g).cast());
                        _mm512_storeu_ps(dst.as_mut_ptr().add(g), _mm512_cvtph_ps(h));
                        g += 16;
                    }
                }
                ScaleType::E8M0 => {
                    while g + 16 <= n {
                        let b = _mm512_cvtepu8_epi32(_mm_loadu_si128(src.as_ptr().add(g).cast()));
                        let mut v = _mm512_slli_epi32::<23>(b);
                        let k0 = _mm512_cmpeq_epi32_mask(b, _mm512_setzero_si512());
                        v = _mm512_mask_mov_epi32(v, k0, _mm512_set1_epi32(0x0040_0000));
                        let kn = _mm512_cmpeq_epi32_mask(b, _mm512_set1_epi32(255));
                        v = _mm512_mask_mov_epi32(
                            v,
                            kn,
                            _mm512_set1_epi32(f32::NAN.to_bits() as i32),
                        );
                        _mm512_storeu_ps(dst.as_mut_ptr().add(g), _mm512_castsi512_ps(v));
                        g += 16;
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

/// [`crate::scalar::exp`] on 16 lanes: the same operations in the same order, then the three
/// special cases selected in the scalar code's order of precedence.
#[inline(always)]
unsafe fn exp16(x: __m512) -> __m512 {
    // SAFETY: AVX-512F is available (caller's contract).
    unsafe {
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        );
        // fma(−n, c, x) is −(n·c) + x with one rounding: vfnmadd.
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
        let mut p = _mm512_set1_ps(EXP_P[0]);
        for &c in &EXP_P[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let y = _mm512_add_ps(
            _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r),
            _mm512_set1_ps(1.0),
        );
        // n / 2 rounded toward zero, as Rust's `i32 / 2`.
        let ni = _mm512_cvttps_epi32(n);
        let half = _mm512_srai_epi32::<1>(_mm512_add_epi32(ni, _mm512_srli_epi32::<31>(ni)));
        let bias = _mm512_set1_epi32(127);
        let p1 = _mm512_slli_epi32::<23>(_mm512_add_epi32(half, bias));
        let p2 = _mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_sub_epi32(ni, half), bias));
        let mut res = _mm512_mul_ps(
            _mm512_mul_ps(y, _mm512_castsi512_ps(p1)),
            _mm512_castsi512_ps(p2),
        );
        let lo = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(EXP_LO));
        res = _mm512_mask_mov_ps(res, lo, _mm512_setzero_ps());
        let hi = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_set1_ps(EXP_HI));
        res = _mm512_mask_mov_ps(res, hi, _mm512_set1_ps(f32::INFINITY));
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        _mm512_mask_mov_ps(res, nan, x)
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

impl Codec<V512> for F32 {
    const BLOCK_BYTES: usize = 64;
    const LAYOUT: [u8; 16] = NATURAL;
    const PAD: u8 = 0;
    const QUANT: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> V512 {
        // SAFETY: AVX-512F is available; `p` is valid for 64 bytes (trait contract).
        unsafe { V512(_mm512_loadu_ps(p.cast())) }
    }
}

impl Codec<V512> for Bf16 {
    const BLOCK_BYTES: usize = 32;
    const LAYOUT: [u8; 16] = NATURAL;
    const PAD: u8 = 0;
    const QUANT: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> V512 {
        // SAFETY: AVX-512F is available; `p` is valid for 32 bytes.
        unsafe {
            let h = _mm256_loadu_si256(p.cast());
            V512(_mm512_castsi512_ps(_mm512_slli_epi32::<16>(
                _mm512_cvtepu16_epi32(h),
            )))
        }
    }
}

impl Codec<V512> for F16 {
    const BLOCK_BYTES: usize = 32;
    const LAYOUT: [u8; 16] = NATURAL;
    const PAD: u8 = 0;
    const QUANT: bool = false;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> V512 {
        // SAFETY: AVX-512F is available; `p` is valid for 32 bytes.
        unsafe { V512(_mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))) }
    }
}

impl Codec<V512> for E4m3 {
    const BLOCK_BYTES: usize = 16;
    const LAYOUT: [u8; 16] = NATURAL;
    const PAD: u8 = 0;
    const QUANT: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> V512 {
        // SAFETY: AVX-512 F/BW/VL and F16C are available; `p` is valid for 16 bytes.
        unsafe {
            let w = _mm256_cvtepu8_epi16(_mm_loadu_si128(p.cast()));
            // b = s·128 + |b| → f16 bits s·2¹⁵ + |b|·2⁷ = ((b + s·128) << 7): the E4M3 value
            // divided by 2⁸, exact in f16 (E4M3 subnormals land on f16 subnormals).
            let t = _mm256_add_epi16(w, _mm256_and_si256(w, _mm256_set1_epi16(0x80)));
            let h = _mm256_slli_epi16::<7>(t);
            let f = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0));
            // |b| = 0x7f is NaN: the table's s | 0x7fc00000.
            let seven_f = _mm256_set1_epi16(0x7f);
            let nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(w, seven_f), seven_f);
            V512(_mm512_castsi512_ps(_mm512_mask_ternarylogic_epi32::<0xec>(
                _mm512_castps_si512(f),
                nan,
                _mm512_set1_epi32(f32::NAN.to_bits() as i32),
                _mm512_set1_epi32(i32::MIN),
            )))
        }
    }
}

/// Right rotation of 64-bit lane `q` that brings column `q` to the low nibble of 32-bit lane
/// `2q` and column `q + 8` to the low nibble of lane `2q + 1` (the [`NIBBLE`] layout). A
/// rotation, not a shift: the compiler turns a shift by a constant zero into a merge-masked
/// shift that costs a register copy per decode, and leaves rotations alone.
const NIBBLE_ROTATIONS: [u64; 8] = [0, 4, 8, 12, 16, 20, 24, 28];

/// The 16 nibbles of the 8 bytes at `p` as lane indices in the [`NIBBLE`] layout (only the low
/// 4 bits of each lane are meaningful).
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> __m512i {
    // SAFETY: AVX-512F is available; `p` is valid for 8 bytes (caller's contract).
    unsafe {
        let v = _mm512_set1_epi64(p.cast::<i64>().read_unaligned());
        _mm512_rorv_epi64(v, _mm512_loadu_si512(NIBBLE_ROTATIONS.as_ptr().cast()))
    }
}

impl Codec<V512> for Int4 {
    const BLOCK_BYTES: usize = 8;
    const LAYOUT: [u8; 16] = NIBBLE;
    const PAD: u8 = 0x88;
    const QUANT: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> V512 {
        // SAFETY: AVX-512F is available; `p` is valid for 8 bytes.
        unsafe {
            let t = _mm512_loadu_ps(INT4_TABLE.as_ptr());
            V512(_mm512_permutexvar_ps(nibbles(p), t))
        }
    }
}

impl Codec<V512> for E2m1 {
    const BLOCK_BYTES: usize = 8;
    const LAYOUT: [u8; 16] = NIBBLE;
    const PAD: u8 = 0;
    const QUANT: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> V512 {
        // SAFETY: AVX-512F is available; `p` is valid for 8 bytes.
        unsafe {
            let t = _mm512_loadu_ps(E2M1_TABLE.as_ptr());
            V512(_mm512_permutexvar_ps(nibbles(p), t))
        }
    }
}

impl Codec<V512> for I8 {
    const BLOCK_BYTES: usize = 16;
    const LAYOUT: [u8; 16] = NATURAL;
    const PAD: u8 = 0;
    const QUANT: bool = true;
    #[inline(always)]
    unsafe fn decode(p: *const u8) -> V512 {
        // SAFETY: AVX-512F is available; `p` is valid for 16 bytes.
        unsafe {
            V512(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                p.cast(),
            ))))
        }
    }
}

/// Output rows per tile for one activation row.
const R1: usize = 4;
/// Rows per strided tile (dense codes, one activation row): `RS` sequential streams. Four, as
/// on AVX2: on the 2 MiB pages the store asks for, one thread streamed BF16 expert matrices at
/// 14.1–14.3 GB/s with eight and 15.1–15.7 with four (six: 13.4–13.6); on 4 KiB pages, and on
/// two threads, where the bus is the limit, they are level (`examples/expert_stream.rs`;
/// docs/PERFORMANCE.md). Presumably the streams of a tile, in physically contiguous memory,
/// fall on DRAM banks that conflict.
const RS: usize = 4;
/// Output rows (dense, quantized) × activation rows per tile for several activation rows.
const RQ: usize = 4;
const RB: usize = 6;
const BB: usize = 4;

/// [`crate::Kernels::matmul`] with AVX-512.
///
/// # Safety
/// The CPU must have AVX-512 F, BW, VL and DQ, AVX2, FMA and F16C ([`crate::Isa::Avx512`] is
/// available), `m.cols() > 0`, and the lengths must pass the checks of
/// [`crate::Kernels::matmul`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(crate) unsafe fn matmul(m: &Matrix<'_>, x: &[f32], y: &mut [f32], rows: Range<usize>) {
    // SAFETY: the ISA is available and the shapes are checked (this function's contract);
    // each arm decodes the coding it matches.
    unsafe {
        match m.codes() {
            Codes::F32 => generic::matmul::<V512, F32, R1, RS, RB, RQ, BB>(m, x, y, rows),
            Codes::BF16 => generic::matmul::<V512, Bf16, R1, RS, RB, RQ, BB>(m, x, y, rows),
            Codes::F16 => generic::matmul::<V512, F16, R1, RS, RB, RQ, BB>(m, x, y, rows),
            Codes::E4M3 => generic::matmul::<V512, E4m3, R1, RS, RB, RQ, BB>(m, x, y, rows),
            Codes::Int4 => generic::matmul::<V512, Int4, R1, RS, RB, RQ, BB>(m, x, y, rows),
            Codes::E2M1 => generic::matmul::<V512, E2m1, R1, RS, RB, RQ, BB>(m, x, y, rows),
            Codes::I8 => generic::matmul::<V512, I8, R1, RS, RB, RQ, BB>(m, x, y, rows),
            // Block matrices go row by row (`gguf::matmul`); the specification otherwise.
            Codes::Block(_) => crate::scalar::matmul(m, x, y, rows),
        }
    }
}

xw_ops!(
    V512,
    "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c",
    4,
    4,
    4,
    16
);

/// Declares `#[target_feature]` entry points for the row ops of [`generic`].
macro_rules! row_ops {
    ($($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)?;)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// The CPU must have AVX-512 F, BW, VL and DQ, AVX2, FMA and F16C; slice lengths must
        /// pass the checks of the matching [`crate::Kernels`] method.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
        pub(crate) unsafe fn $name($($arg: $ty),*) $(-> $ret)? {
            // SAFETY: the ISA is available (this function's contract).
            unsafe { generic::$name::<V512>($($arg),*) }
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
