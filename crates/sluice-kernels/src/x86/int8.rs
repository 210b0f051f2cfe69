//! AVX2 integer sums of the integer mode ([`crate::int8`]): a weight block's `isum` against its
//! activation codes, exact in i32, so any order of the additions gives the specification's
//! integer. `maddubs` multiplies unsigned weight bytes (at most 63, or the 128 of a −128 code's
//! magnitude) by signed activation codes in [−127, 127]: a pair's sum is at most 2 × 128 × 127
//! = 32,512, so it never saturates.

use std::arch::x86_64::*;

use crate::gguf::{BlockFormat, scale_min_k4};

/// The block's `isum`, as [`crate::int8`]'s `block_isum` gives it: `a` the block's activation
/// codes, `bsums` its sums of 16 (Q8_K) or empty. Formats without a SIMD sum here take the
/// scalar one.
///
/// # Safety
/// The CPU must have AVX2; `b` must be one block of `f` and `a` its `f.block_size()` codes.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn isum(f: BlockFormat, b: &[u8], a: &[i8], bsums: &[i16]) -> i32 {
    debug_assert_eq!(b.len(), f.type_size());
    debug_assert_eq!(a.len(), f.block_size());
    match f {
        // SAFETY: AVX2 is enabled; the lengths are the caller's.
        BlockFormat::Q8_0 => unsafe { q8_0(b, a) },
        // SAFETY: as above.
        BlockFormat::Q4_0 => unsafe { q4_0(b, a) },
        // SAFETY: as above.
        BlockFormat::Q4_K => unsafe { q4_k(b, a) },
        // SAFETY: as above.
        BlockFormat::Q6_K => unsafe { q6_k(b, a, bsums) },
        _ => crate::int8::block_isum(f, b, a, bsums),
    }
}

/// The sum of the eight i32 lanes.
#[target_feature(enable = "avx2")]
fn hsum(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// Loads 32 bytes.
///
/// # Safety
/// `p` must hold at least 32 bytes.
#[target_feature(enable = "avx2")]
unsafe fn load(p: &[u8]) -> __m256i {
    debug_assert!(p.len() >= 32);
    // SAFETY: 32 bytes are readable (the caller's); unaligned loads are allowed.
    unsafe { _mm256_loadu_si256(p.as_ptr().cast()) }
}

/// Loads 32 activation codes.
///
/// # Safety
/// `p` must hold at least 32 codes.
#[target_feature(enable = "avx2")]
unsafe fn load_i8(p: &[i8]) -> __m256i {
    debug_assert!(p.len() >= 32);
    // SAFETY: as `load`.
    unsafe { _mm256_loadu_si256(p.as_ptr().cast()) }
}

/// Σ w_j a_j over 32 signed weight bytes `w` and activations `x`, as eight i32 partial sums:
/// `maddubs` of |w| and x with w's sign.
#[target_feature(enable = "avx2")]
fn signed_dot(w: __m256i, x: __m256i) -> __m256i {
    let p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// # Safety
/// AVX2; one Q8_0 block and its 32 codes.
#[target_feature(enable = "avx2")]
unsafe fn q8_0(b: &[u8], a: &[i8]) -> i32 {
    // SAFETY: the block holds 34 bytes (2 of scale, 32 codes), `a` 32 codes.
    let (w, x) = unsafe { (load(&b[2..]), load_i8(a)) };
    hsum(signed_dot(w, x))
}

/// # Safety
/// AVX2; one Q4_0 block and its 32 codes.
#[target_feature(enable = "avx2")]
unsafe fn q4_0(b: &[u8], a: &[i8]) -> i32 {
    // SAFETY: the block holds 18 bytes, the last 16 the nibbles.
    let q = unsafe { _mm_loadu_si128(b[2..18].as_ptr().cast()) };
    let m4 = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(q, m4);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), m4);
    // Elements 0..16 are the low nibbles, 16..32 the high ones; codes − 8.
    let w = _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8));
    // SAFETY: `a` holds 32 codes.
    let x = unsafe { load_i8(a) };
    hsum(signed_dot(w, x))
}

/// # Safety
/// AVX2; one Q4_K block and its 256 codes.
#[target_feature(enable = "avx2")]
unsafe fn q4_k(b: &[u8], a: &[i8]) -> i32 {
    let (s, qs) = (&b[4..16], &b[16..144]);
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = _mm256_setzero_si256();
    for k in 0..4 {
        // SAFETY: 128 bytes of nibbles, 256 codes: 32 and 64 from each offset here.
        let (v, a0, a1) = unsafe {
            (
                load(&qs[32 * k..]),
                load_i8(&a[64 * k..]),
                load_i8(&a[64 * k + 32..]),
            )
        };
        let lo = _mm256_and_si256(v, m4);
        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
        let (s0, s1) = (scale_min_k4(s, 2 * k).0, scale_min_k4(s, 2 * k + 1).0);
        let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a0), _mm256_set1_epi16(s0 as i16));
        let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, a1), _mm256_set1_epi16(s1 as i16));
        acc = _mm256_add_epi32(acc, _mm256_add_epi32(p0, p1));
    }
    hsum(acc)
}

/// # Safety
/// AVX2; one Q6_K block, its 256 codes and their 16 sums of 16.
#[target_feature(enable = "avx2")]
unsafe fn q6_k(b: &[u8], a: &[i8], bsums: &[i16]) -> i32 {
    let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
    let m4 = _mm256_set1_epi8(0x0f);
    let m3 = _mm256_set1_epi8(3);
    let mut acc = _mm256_setzero_si256();
    for half in 0..2 {
        // SAFETY: 64 bytes of low bits and 32 of high bits per half.
        let (l0, l1, h) = unsafe {
            (
                load(&ql[64 * half..]),
                load(&ql[64 * half + 32..]),
                load(&qh[32 * half..]),
            )
        };
        let high = |shift: i32| -> __m256i {
            let v = match shift {
                0 => h,
                2 => _mm256_srli_epi16::<2>(h),
                4 => _mm256_srli_epi16::<4>(h),
                _ => _mm256_srli_epi16::<6>(h),
            };
            _mm256_slli_epi16::<4>(_mm256_and_si256(v, m3))
        };
        // The unsigned 6-bit codes of elements 32g..32g+32 of the half.
        let groups = [
            _mm256_or_si256(_mm256_and_si256(l0, m4), high(0)),
            _mm256_or_si256(_mm256_and_si256(l1, m4), high(2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(l0), m4), high(4)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(l1), m4), high(6)),
        ];
        for (g, w) in groups.into_iter().enumerate() {
            let at = 128 * half + 32 * g;
            // SAFETY: 32 codes from `at` < 256.
            let x = unsafe { load_i8(&a[at..]) };
            let s = at / 16;
            // Bytes 0..16 (i16 lanes 0..8 of the pair sums) take the first scale.
            let scales = _mm256_set_m128i(
                _mm_set1_epi16(sc[s + 1] as i8 as i16),
                _mm_set1_epi16(sc[s] as i8 as i16),
            );
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), scales));
        }
    }
    // The codes are stored + 32: Σ sc (q − 32) a = Σ sc q a − 32 Σ sc bsum.
    let offset: i32 = sc
        .iter()
        .zip(bsums)
        .map(|(&s, &bs)| s as i8 as i32 * bs as i32)
        .sum();
    hsum(acc) - 32 * offset
}

/// Activation rows a weight block is unpacked for at once.
const GROUP: usize = 4;

/// [`crate::int8::matmul`] for one ISA with AVX2: `y[i, r − rows.start]` for every activation
/// row `i` of `a`. Q4_K and Q6_K rows run here whole — a weight block unpacked once for up to
/// [`GROUP`] activation rows, its integer sums and the specification's epilogue inline; the
/// other formats through [`crate::int8::dot_with`] with [`isum`]. Same bits as the
/// specification: the integer sums are equal, and the epilogue is its operations in its order.
///
/// # Safety
/// The CPU must have AVX2; `m` must be a matrix of `f` (a format with an integer product) and
/// `a` its activations, `y` of `a.rows() × rows.len()` values.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn matmul(
    f: BlockFormat,
    m: &crate::Matrix<'_>,
    a: &crate::int8::QActs,
    y: &mut [f32],
    rows: std::ops::Range<usize>,
) {
    let (nr, t) = (rows.len(), a.rows());
    let fast = matches!(f, BlockFormat::Q4_K | BlockFormat::Q6_K);
    for (ri, r) in rows.enumerate() {
        let row = m.row(r);
        if !fast {
            for i in 0..t {
                y[i * nr + ri] = crate::int8::dot_with(f, row, a, i, |f, b, q, bs| {
                    // SAFETY: AVX2 is enabled; `dot_with` hands one block and its codes.
                    unsafe { isum(f, b, q, bs) }
                });
            }
            continue;
        }
        let mut i0 = 0;
        while i0 < t {
            let n = GROUP.min(t - i0);
            let mut acc = [0f32; GROUP];
            for (b, blk) in row.chunks_exact(f.type_size()).enumerate() {
                // SAFETY: AVX2 is enabled; one block of `f`, 256 codes per activation row.
                unsafe {
                    match f {
                        BlockFormat::Q4_K => q4_k_group(blk, a, i0, n, b, &mut acc),
                        _ => q6_k_group(blk, a, i0, n, b, &mut acc),
                    }
                }
            }
            for k in 0..n {
                y[(i0 + k) * nr + ri] = acc[k];
            }
            i0 += n;
        }
    }
}

/// The f16 at byte `at`, as f32.
fn h(b: &[u8], at: usize) -> f32 {
    crate::decode::f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// The two sums of `v` (lanes) and `u`: `(Σ v, Σ u)`.
#[target_feature(enable = "avx2")]
fn hsum2(v: __m256i, u: __m256i) -> (i32, i32) {
    // [v0+v1, v2+v3, u0+u1, u2+u3 | v4+v5, v6+v7, u4+u5, u6+u7]
    let p = _mm256_hadd_epi32(v, u);
    let s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256::<1>(p));
    let s = _mm_hadd_epi32(s, s);
    (_mm_cvtsi128_si32(s), _mm_extract_epi32::<1>(s))
}

/// Q4_K: super-block `b` of a row (`blk`) against activation rows `i0..i0 + n`, each value's
/// epilogue step applied to `out` as [`crate::int8`] specifies it.
///
/// # Safety
/// AVX2; `blk` one Q4_K block, `a` Q8_K activations with rows `i0..i0 + n`.
#[target_feature(enable = "avx2")]
unsafe fn q4_k_group(
    blk: &[u8],
    a: &crate::int8::QActs,
    i0: usize,
    n: usize,
    b: usize,
    out: &mut [f32; GROUP],
) {
    let (s, qs) = (&blk[4..16], &blk[16..144]);
    let (dw, dmin) = (h(blk, 0), h(blk, 2));
    let m4 = _mm256_set1_epi8(0x0f);
    let mut w = [_mm256_setzero_si256(); 8];
    let mut sc = [_mm256_setzero_si256(); 8];
    let mut mins = [0i16; 16];
    for k in 0..4 {
        // SAFETY: 128 bytes of nibbles.
        let v = unsafe { load(&qs[32 * k..]) };
        w[2 * k] = _mm256_and_si256(v, m4);
        w[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
    }
    for g in 0..8 {
        let (scale, min) = scale_min_k4(s, g);
        sc[g] = _mm256_set1_epi16(scale as i16);
        // A sub-block of 32 holds two sums of 16.
        mins[2 * g] = min as i16;
        mins[2 * g + 1] = min as i16;
    }
    // SAFETY: 16 i16 values.
    let mins = unsafe { _mm256_loadu_si256(mins.as_ptr().cast()) };
    for (k, out) in out.iter_mut().enumerate().take(n) {
        let i = i0 + k;
        let q = &a.codes(i)[b * 256..(b + 1) * 256];
        let bs = &a.bsums(i)[b * 16..(b + 1) * 16];
        let mut acc = _mm256_setzero_si256();
        for g in 0..8 {
            // SAFETY: 32 codes from 32g < 256.
            let x = unsafe { load_i8(&q[32 * g..]) };
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w[g], x), sc[g]));
        }
        // SAFETY: 16 sums of 16.
        let bsv = unsafe { _mm256_loadu_si256(bs.as_ptr().cast()) };
        let (isum, msum) = hsum2(acc, _mm256_madd_epi16(bsv, mins));
        let da = a.scales(i)[b];
        *out += (dw * da) * (isum as f32) - (dmin * da) * (msum as f32);
    }
}

/// Q6_K: as [`q4_k_group`].
///
/// # Safety
/// AVX2; `blk` one Q6_K block, `a` Q8_K activations with rows `i0..i0 + n`.
#[target_feature(enable = "avx2")]
unsafe fn q6_k_group(
    blk: &[u8],
    a: &crate::int8::QActs,
    i0: usize,
    n: usize,
    b: usize,
    out: &mut [f32; GROUP],
) {
    let (ql, qh, scb) = (&blk[0..128], &blk[128..192], &blk[192..208]);
    let dw = h(blk, 208);
    let mut scales16 = [0i16; 16];
    for (o, &v) in scales16.iter_mut().zip(scb) {
        *o = v as i8 as i16;
    }
    // SAFETY: 16 i16 values.
    let scales16 = unsafe { _mm256_loadu_si256(scales16.as_ptr().cast()) };
    let m4 = _mm256_set1_epi8(0x0f);
    let m3 = _mm256_set1_epi8(3);
    let mut w = [_mm256_setzero_si256(); 8];
    let mut sc = [_mm256_setzero_si256(); 8];
    for half in 0..2 {
        // SAFETY: 64 bytes of low bits and 32 of high bits per half.
        let (l0, l1, hb) = unsafe {
            (
                load(&ql[64 * half..]),
                load(&ql[64 * half + 32..]),
                load(&qh[32 * half..]),
            )
        };
        let hi = |v: __m256i| _mm256_slli_epi16::<4>(_mm256_and_si256(v, m3));
        w[4 * half] = _mm256_or_si256(_mm256_and_si256(l0, m4), hi(hb));
        w[4 * half + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4), hi(_mm256_srli_epi16::<2>(hb)));
        w[4 * half + 2] = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(l0), m4),
            hi(_mm256_srli_epi16::<4>(hb)),
        );
        w[4 * half + 3] = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(l1), m4),
            hi(_mm256_srli_epi16::<6>(hb)),
        );
    }
    for (g, s) in sc.iter_mut().enumerate() {
        *s = _mm256_set_m128i(
            _mm_set1_epi16(scb[2 * g + 1] as i8 as i16),
            _mm_set1_epi16(scb[2 * g] as i8 as i16),
        );
    }
    for (k, out) in out.iter_mut().enumerate().take(n) {
        let i = i0 + k;
        let q = &a.codes(i)[b * 256..(b + 1) * 256];
        let bs = &a.bsums(i)[b * 16..(b + 1) * 16];
        let mut acc = _mm256_setzero_si256();
        for g in 0..8 {
            // SAFETY: 32 codes from 32g < 256.
            let x = unsafe { load_i8(&q[32 * g..]) };
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w[g], x), sc[g]));
        }
        // SAFETY: 16 sums of 16.
        let bsv = unsafe { _mm256_loadu_si256(bs.as_ptr().cast()) };
        // The codes are stored + 32: Σ sc (q − 32) a = Σ sc q a − 32 Σ sc bsum.
        let (qa, offset) = hsum2(acc, _mm256_madd_epi16(bsv, scales16));
        let da = a.scales(i)[b];
        *out += (dw * da) * ((qa - 32 * offset) as f32);
    }
}
