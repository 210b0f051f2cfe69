//! The integer mode's products on x86 ([`crate::int8`]), AVX2 with 512-bit Q4_K and Q6_K on
//! AVX-512: each weight block's `isum` against its activation codes is exact in i32, so any
//! order of the additions gives the specification's integer, and the epilogue is its float
//! operations in its order. `maddubs` multiplies unsigned weight bytes (at most 63, or the 128 of a −128 code's
//! magnitude) by signed activation codes in [−127, 127]: a pair's sum is at most 2 × 128 × 127
//! = 32,512, so it never saturates.

use std::arch::x86_64::*;

use crate::gguf::{BlockFormat, scale_min_k4};

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

/// Activation rows a weight block is unpacked for at once.
const GROUP: usize = 4;

/// [`crate::int8::matmul`] for one ISA with AVX2: `y[i, r − rows.start]` for every activation
/// row `i` of `a`. The 32-blocks run a row at a time ([`q8_0_row`]); the super-block formats
/// unpack a weight block once for up to [`GROUP`] activation rows, with the integer sums and
/// the specification's epilogue inline. Same bits as the specification: the integer sums are
/// equal, and the epilogue is its operations in its order. A format with no kernel here takes
/// the scalar specification.
///
/// With `wide`, the Q4_K and Q6_K blocks run in 512-bit registers (AVX-512 BW): the same
/// integers.
///
/// # Safety
/// The CPU must have AVX2 and F16C, and AVX-512 F and BW when `wide`; `m` must be a matrix of `f` (a
/// format with an integer product) and `a` its activations, `y` of `a.rows() × rows.len()`
/// values.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn matmul(
    f: BlockFormat,
    m: &crate::Matrix<'_>,
    a: &crate::int8::QActs,
    y: &mut [f32],
    rows: std::ops::Range<usize>,
    wide: bool,
) {
    let (nr, t) = (rows.len(), a.rows());
    if matches!(
        f,
        BlockFormat::Q8_0
            | BlockFormat::Q4_0
            | BlockFormat::Q4_1
            | BlockFormat::Q5_0
            | BlockFormat::Q5_1
            | BlockFormat::IQ4_NL
            | BlockFormat::MXFP4
    ) {
        for (ri, r) in rows.enumerate() {
            let row = m.row(r);
            for i in 0..t {
                // SAFETY: AVX2 is enabled and the caller checked F16C; one row of `f` against
                // activation row `i`.
                y[i * nr + ri] = unsafe { q8_0_row(f, row, a, i) };
            }
        }
        return;
    }
    if !matches!(
        f,
        BlockFormat::Q4_K | BlockFormat::Q5_K | BlockFormat::Q6_K | BlockFormat::IQ4_XS
    ) {
        return crate::int8::matmul(m, a, y, rows);
    }
    for (ri, r) in rows.enumerate() {
        let row = m.row(r);
        let mut i0 = 0;
        while i0 < t {
            let n = GROUP.min(t - i0);
            let mut acc = [0f32; GROUP];
            for (b, blk) in row.chunks_exact(f.type_size()).enumerate() {
                // SAFETY: AVX2 is enabled, and AVX-512 F/BW when `wide` (the caller's); one
                // block of `f`, 256 codes per activation row.
                unsafe {
                    match (f, wide) {
                        (BlockFormat::Q4_K, true) => q4_k_group512(blk, a, i0, n, b, &mut acc),
                        (BlockFormat::Q4_K | BlockFormat::Q5_K, _) => {
                            k4_group(f, blk, a, i0, n, b, &mut acc)
                        }
                        (BlockFormat::IQ4_XS, _) => iq4_xs_group(blk, a, i0, n, b, &mut acc),
                        (_, false) => q6_k_group(blk, a, i0, n, b, &mut acc),
                        (_, true) => q6_k_group512(blk, a, i0, n, b, &mut acc),
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

/// Q4_K's and Q5_K's 6-bit mins, each twice (a sub-block of 32 holds two sums of 16), as
/// 16 i16 lanes against the activations' `bsums`.
#[target_feature(enable = "avx2")]
fn k4_mins(s: &[u8]) -> __m256i {
    let mut mins = [0i16; 16];
    for (g, pair) in mins.chunks_exact_mut(2).enumerate() {
        pair.fill(scale_min_k4(s, g).1 as i16);
    }
    // SAFETY: 16 i16 values.
    unsafe { _mm256_loadu_si256(mins.as_ptr().cast()) }
}

/// `Σ_g madd(maddubs(w[g], x_g), sc[g])` over the eight runs of 32 codes of `q`: eight i32
/// partial sums of `Σ sc · w · a`.
#[target_feature(enable = "avx2")]
fn runs_dot(w: &[__m256i; 8], sc: &[__m256i; 8], q: &[i8]) -> __m256i {
    let mut acc = _mm256_setzero_si256();
    for g in 0..8 {
        // SAFETY: 32 codes from 32g < 256 (`q` holds a super-block's).
        let x = unsafe { load_i8(&q[32 * g..]) };
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w[g], x), sc[g]));
    }
    acc
}

/// Q4_K or Q5_K (`f`): super-block `b` of a row (`blk`) against activation rows `i0..i0 + n`,
/// each value's epilogue step applied to `out` as [`crate::int8`] specifies it. Q5_K's fifth
/// bits come from the block's 32 bytes of high bits.
///
/// # Safety
/// AVX2; `blk` one block of `f`, `a` Q8_K activations with rows `i0..i0 + n`.
#[target_feature(enable = "avx2")]
unsafe fn k4_group(
    f: BlockFormat,
    blk: &[u8],
    a: &crate::int8::QActs,
    i0: usize,
    n: usize,
    b: usize,
    out: &mut [f32; GROUP],
) {
    let five = f == BlockFormat::Q5_K;
    let s = &blk[4..16];
    let qs = if five { &blk[48..176] } else { &blk[16..144] };
    let (dw, dmin) = (h(blk, 0), h(blk, 2));
    let m4 = _mm256_set1_epi8(0x0f);
    let one = _mm256_set1_epi8(1);
    // Bit p of byte l is the fifth bit of element 32p + l (Q5_K).
    let mut hv = if five {
        // SAFETY: a Q5_K block holds 32 bytes of high bits there.
        unsafe { load(&blk[16..48]) }
    } else {
        _mm256_setzero_si256()
    };
    let mut fifth = || {
        let v = _mm256_slli_epi16::<4>(_mm256_and_si256(hv, one));
        hv = _mm256_srli_epi16::<1>(hv);
        v
    };
    let mut w = [_mm256_setzero_si256(); 8];
    for k in 0..4 {
        // SAFETY: 128 bytes of nibbles.
        let v = unsafe { load(&qs[32 * k..]) };
        w[2 * k] = _mm256_or_si256(_mm256_and_si256(v, m4), fifth());
        w[2 * k + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(v), m4), fifth());
    }
    let sc: [__m256i; 8] = std::array::from_fn(|g| _mm256_set1_epi16(scale_min_k4(s, g).0 as i16));
    let mins = k4_mins(s);
    for (k, out) in out.iter_mut().enumerate().take(n) {
        let i = i0 + k;
        let q = &a.codes(i)[b * 256..(b + 1) * 256];
        let bs = &a.bsums(i)[b * 16..(b + 1) * 16];
        // SAFETY: 16 sums of 16.
        let bsv = unsafe { _mm256_loadu_si256(bs.as_ptr().cast()) };
        let (isum, msum) = hsum2(runs_dot(&w, &sc, q), _mm256_madd_epi16(bsv, mins));
        let da = a.scales(i)[b];
        *out += (dw * da) * (isum as f32) - (dmin * da) * (msum as f32);
    }
}

/// Q6_K: as [`k4_group`].
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
        // SAFETY: 16 sums of 16.
        let bsv = unsafe { _mm256_loadu_si256(bs.as_ptr().cast()) };
        // The codes are stored + 32: Σ sc (q − 32) a = Σ sc q a − 32 Σ sc bsum.
        let (qa, offset) = hsum2(runs_dot(&w, &sc, q), _mm256_madd_epi16(bsv, scales16));
        let da = a.scales(i)[b];
        *out += (dw * da) * ((qa - 32 * offset) as f32);
    }
}

/// Two i16 scales broadcast over the two 256-bit halves (`lo` in the low half).
#[target_feature(enable = "avx512f,avx512bw")]
fn pair_i16(lo: i16, hi: i16) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_set1_epi16(lo), _mm256_set1_epi16(hi))
}

/// The epilogue of four activation rows at once, in f32 lanes (each lane the operations of
/// [`crate::int8`]'s epilogue for its row, in its order): `sums` holds the rows' `isum` in
/// lanes 0..4 and their `msum` (Q4_K, Q5_K) or `Σ sc·bsum` offset (Q6_K) in lanes 4..8.
///
/// # Safety
/// AVX2; `da` the rows' activation scales of the block.
#[target_feature(enable = "avx2")]
unsafe fn finish4(out: &mut [f32; GROUP], sums: __m256i, dw: f32, dmin: Option<f32>, da: [f32; 4]) {
    // SAFETY: four floats each.
    let (o, dav) = unsafe { (_mm_loadu_ps(out.as_ptr()), _mm_loadu_ps(da.as_ptr())) };
    let lo = _mm256_castsi256_si128(sums);
    let hi = _mm256_extracti128_si256::<1>(sums);
    let step = match dmin {
        Some(dmin) => {
            let left = _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(dw), dav), _mm_cvtepi32_ps(lo));
            let right = _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(dmin), dav), _mm_cvtepi32_ps(hi));
            _mm_sub_ps(left, right)
        }
        None => {
            // Q6_K: isum = Σ sc q a − 32 Σ sc bsum, exact in i32.
            let isum = _mm_sub_epi32(lo, _mm_slli_epi32::<5>(hi));
            _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(dw), dav), _mm_cvtepi32_ps(isum))
        }
    };
    // SAFETY: four floats.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), _mm_add_ps(o, step)) };
}

/// The four rows' activation scales of block `b`.
fn scales4(a: &crate::int8::QActs, i0: usize, b: usize) -> [f32; 4] {
    std::array::from_fn(|k| a.scales(i0 + k)[b])
}

/// A 512-bit register's two halves added.
#[target_feature(enable = "avx512f,avx512bw")]
fn fold(z: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(z), _mm512_extracti64x4_epi64::<1>(z))
}

/// [`k4_group`] in 512-bit registers: two 32-code runs per product.
///
/// # Safety
/// AVX-512 F/BW; as [`k4_group`].
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn q4_k_group512(
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
    // Register k holds elements 64k..64k+64 in order: the low nibbles of bytes 32k..32k+32
    // (sub-block 2k), then their high nibbles (2k + 1). Each activation row is then read with
    // plain 64-byte loads.
    let mut w = [_mm512_setzero_si512(); 4];
    let mut sc = [_mm512_setzero_si512(); 4];
    let scale = |g: usize| scale_min_k4(s, g).0 as i16;
    for k in 0..4 {
        // SAFETY: 128 bytes of nibbles.
        let v = unsafe { load(&qs[32 * k..]) };
        let lo = _mm256_and_si256(v, m4);
        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
        w[k] = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
        sc[k] = pair_i16(scale(2 * k), scale(2 * k + 1));
    }
    let mins = k4_mins(s);
    let mut folded = [_mm256_setzero_si256(); 8];
    for k in 0..n {
        let i = i0 + k;
        let q = &a.codes(i)[b * 256..(b + 1) * 256];
        let bs = &a.bsums(i)[b * 16..(b + 1) * 16];
        let mut acc = _mm512_setzero_si512();
        for (j, (wj, sj)) in w.iter().zip(&sc).enumerate() {
            // SAFETY: 64 codes from 64j < 256.
            let x = unsafe { _mm512_loadu_si512(q[64 * j..].as_ptr().cast()) };
            acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(*wj, x), *sj));
        }
        // SAFETY: 16 sums of 16.
        let bsv = unsafe { _mm256_loadu_si256(bs.as_ptr().cast()) };
        folded[k] = fold(acc);
        folded[4 + k] = _mm256_madd_epi16(bsv, mins);
    }
    if n == GROUP {
        // SAFETY: AVX2 (implied by AVX-512 F here, and the caller's); four rows from `i0`.
        unsafe { finish4(out, hsum8(&folded), dw, Some(dmin), scales4(a, i0, b)) };
        return;
    }
    for (k, out) in out.iter_mut().enumerate().take(n) {
        let (isum, msum) = hsum2(folded[k], folded[4 + k]);
        let da = a.scales(i0 + k)[b];
        *out += (dw * da) * (isum as f32) - (dmin * da) * (msum as f32);
    }
}

/// [`q6_k_group`] in 512-bit registers.
///
/// # Safety
/// AVX-512 F/BW; as [`q6_k_group`].
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn q6_k_group512(
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
    let hi = |v: __m256i| _mm256_slli_epi16::<4>(_mm256_and_si256(v, m3));
    // Register 2h + p holds elements 128h + 64p .. + 64 in order (runs 2p and 2p + 1 of half
    // h), so that activations are read with plain 64-byte loads.
    let mut w = [_mm512_setzero_si512(); 4];
    let mut sc = [_mm512_setzero_si512(); 4];
    for half in 0..2 {
        // SAFETY: 64 bytes of low bits and 32 of high bits per half.
        let (l0, l1, hb) = unsafe {
            (
                load(&ql[64 * half..]),
                load(&ql[64 * half + 32..]),
                load(&qh[32 * half..]),
            )
        };
        let runs = [
            _mm256_or_si256(_mm256_and_si256(l0, m4), hi(hb)),
            _mm256_or_si256(_mm256_and_si256(l1, m4), hi(_mm256_srli_epi16::<2>(hb))),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(l0), m4),
                hi(_mm256_srli_epi16::<4>(hb)),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(l1), m4),
                hi(_mm256_srli_epi16::<6>(hb)),
            ),
        ];
        for p in 0..2 {
            w[2 * half + p] =
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(runs[2 * p]), runs[2 * p + 1]);
            // Each 16 codes (a 128-bit quarter) take their own scale.
            let s0 = 8 * half + 4 * p;
            let v = |k: usize| scb[k] as i8 as i16;
            let q = |lo: i16, hi: i16| _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo));
            sc[2 * half + p] = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(q(v(s0), v(s0 + 1))),
                q(v(s0 + 2), v(s0 + 3)),
            );
        }
    }
    let mut folded = [_mm256_setzero_si256(); 8];
    for k in 0..n {
        let i = i0 + k;
        let q = &a.codes(i)[b * 256..(b + 1) * 256];
        let bs = &a.bsums(i)[b * 16..(b + 1) * 16];
        let mut acc = _mm512_setzero_si512();
        for (j, (wj, sj)) in w.iter().zip(&sc).enumerate() {
            // SAFETY: 64 codes from 64j < 256.
            let x = unsafe { _mm512_loadu_si512(q[64 * j..].as_ptr().cast()) };
            acc = _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(*wj, x), *sj));
        }
        // SAFETY: 16 sums of 16.
        let bsv = unsafe { _mm256_loadu_si256(bs.as_ptr().cast()) };
        folded[k] = fold(acc);
        folded[4 + k] = _mm256_madd_epi16(bsv, scales16);
    }
    if n == GROUP {
        // SAFETY: AVX2 (implied by AVX-512 F here, and the caller's); four rows from `i0`.
        unsafe { finish4(out, hsum8(&folded), dw, None, scales4(a, i0, b)) };
        return;
    }
    for (k, out) in out.iter_mut().enumerate().take(n) {
        // The codes are stored + 32: Σ sc (q − 32) a = Σ sc q a − 32 Σ sc bsum.
        let (qa, offset) = hsum2(folded[k], folded[4 + k]);
        let da = a.scales(i0 + k)[b];
        *out += (dw * da) * ((qa - 32 * offset) as f32);
    }
}

/// The eight lane sums of eight vectors, in order, as one vector.
#[target_feature(enable = "avx2")]
fn hsum8(v: &[__m256i; 8]) -> __m256i {
    let a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    let b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    // a = [s0 s1 s2 s3 (low lanes) | s0 s1 s2 s3 (high lanes)], likewise b for 4..8.
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(a, b),
        _mm256_permute2x128_si256::<0x31>(a, b),
    )
}

/// The 32 bits of `qh` as 32 bytes, `0x10` where the bit is set (bit `j` → byte `j`).
#[target_feature(enable = "avx2")]
fn fifth_bits(qh: u32) -> __m256i {
    let v = _mm256_set1_epi32(qh as i32);
    // Byte j takes byte j / 8 of the word, then its bit j % 8 is tested.
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let v = _mm256_shuffle_epi8(v, shuf);
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// One row of 32-blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4) against activation row
/// `i` (the tables' codes looked up with a byte shuffle): eight
/// blocks' integer sums at a time, their epilogue terms (`(d_w × d_a) × isum`, plus `m_w ×
/// s_a` with mins) in vector lanes, then the specification's additions in block order.
///
/// # Safety
/// AVX2 and F16C; `row` whole blocks of `f`, `a` their Q8_0 or Q8_1 activations.
#[target_feature(enable = "avx2,f16c")]
unsafe fn q8_0_row(f: BlockFormat, row: &[u8], a: &crate::int8::QActs, i: usize) -> f32 {
    let ts = f.type_size();
    let nb = row.len() / ts;
    let (q, d) = (a.codes(i), a.scales(i));
    let with_min = matches!(f, BlockFormat::Q4_1 | BlockFormat::Q5_1);
    let sa: &[f32] = if with_min { a.sums(i) } else { &[] };
    let m4 = _mm_set1_epi8(0x0f);
    let nibbles = |p: &[u8]| -> __m256i {
        // SAFETY: 16 bytes of nibbles (the block's).
        let v = unsafe { _mm_loadu_si128(p[..16].as_ptr().cast()) };
        let lo = _mm_and_si128(v, m4);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), m4);
        _mm256_set_m128i(hi, lo)
    };
    let qh = |blk: &[u8], at: usize| {
        u32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]])
    };
    let table = |kv: &[i8; 16]| {
        // SAFETY: 16 bytes.
        _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(kv.as_ptr().cast()) })
    };
    let (iq4, mxfp4) = (
        table(&crate::gguf::IQ4_KVALUES),
        table(&crate::gguf::MXFP4_KVALUES),
    );
    // The block's weight scale: its f16, or MXFP4's half E8M0.
    let scale = |blk: &[u8]| {
        if f == BlockFormat::MXFP4 {
            crate::gguf::e8m0_to_f32_half(blk[0])
        } else {
            h(blk, 0)
        }
    };
    let weights = |blk: &[u8]| -> __m256i {
        match f {
            // SAFETY: 34 bytes, 32 codes after the scale.
            BlockFormat::Q8_0 => unsafe { load(&blk[2..]) },
            BlockFormat::Q4_0 => _mm256_sub_epi8(nibbles(&blk[2..]), _mm256_set1_epi8(8)),
            BlockFormat::Q4_1 => nibbles(&blk[4..]),
            BlockFormat::IQ4_NL => _mm256_shuffle_epi8(iq4, nibbles(&blk[2..])),
            BlockFormat::MXFP4 => _mm256_shuffle_epi8(mxfp4, nibbles(&blk[1..])),
            BlockFormat::Q5_0 => _mm256_sub_epi8(
                _mm256_or_si256(nibbles(&blk[6..]), fifth_bits(qh(blk, 2))),
                _mm256_set1_epi8(16),
            ),
            _ => _mm256_or_si256(nibbles(&blk[8..]), fifth_bits(qh(blk, 4))),
        }
    };
    let mut acc = 0f32;
    let mut b0 = 0;
    while b0 + 8 <= nb {
        let mut v = [_mm256_setzero_si256(); 8];
        let mut dw = [0f32; 8];
        let mut mw = [0u16; 8];
        for k in 0..8 {
            let blk = &row[(b0 + k) * ts..(b0 + k + 1) * ts];
            // SAFETY: 32 codes of block b0 + k.
            let x = unsafe { load_i8(&q[32 * (b0 + k)..]) };
            v[k] = signed_dot(weights(blk), x);
            dw[k] = scale(blk);
            if with_min {
                mw[k] = u16::from_le_bytes([blk[2], blk[3]]);
            }
        }
        let sums = _mm256_cvtepi32_ps(hsum8(&v));
        // SAFETY: 8 f16 scales and 8 activation scales.
        let (dwv, dav) = unsafe {
            (
                _mm256_loadu_ps(dw.as_ptr()),
                _mm256_loadu_ps(d[b0..].as_ptr()),
            )
        };
        let mut terms = _mm256_mul_ps(_mm256_mul_ps(dwv, dav), sums);
        if with_min {
            // SAFETY: 8 f16 mins and 8 activation sums.
            let (mwv, sav) = unsafe {
                (
                    _mm256_cvtph_ps(_mm_loadu_si128(mw.as_ptr().cast())),
                    _mm256_loadu_ps(sa[b0..].as_ptr()),
                )
            };
            terms = _mm256_add_ps(terms, _mm256_mul_ps(mwv, sav));
        }
        let mut t = [0f32; 8];
        // SAFETY: 8 floats.
        unsafe { _mm256_storeu_ps(t.as_mut_ptr(), terms) };
        for v in t {
            acc += v;
        }
        b0 += 8;
    }
    for b in b0..nb {
        let blk = &row[b * ts..(b + 1) * ts];
        // SAFETY: 32 codes of block b.
        let x = unsafe { load_i8(&q[32 * b..]) };
        let sum = hsum(signed_dot(weights(blk), x)) as f32;
        acc += if with_min {
            (h(blk, 0) * d[b]) * sum + h(blk, 2) * sa[b]
        } else {
            (scale(blk) * d[b]) * sum
        };
    }
    acc
}

/// IQ4_XS: as [`k4_group`], the codes looked up in the non-linear table by a byte shuffle
/// (signed, so multiplied as `maddubs(|w|, sign(x, w))`), the 6-bit scales `ls − 32` per 32.
///
/// # Safety
/// AVX2; `blk` one IQ4_XS block, `a` Q8_K activations with rows `i0..i0 + n`.
#[target_feature(enable = "avx2")]
unsafe fn iq4_xs_group(
    blk: &[u8],
    a: &crate::int8::QActs,
    i0: usize,
    n: usize,
    b: usize,
    out: &mut [f32; GROUP],
) {
    let dw = h(blk, 0);
    let sh = u16::from_le_bytes([blk[2], blk[3]]);
    let (sl, qs) = (&blk[4..8], &blk[8..136]);
    // SAFETY: 16 bytes.
    let kv = _mm256_broadcastsi128_si256(unsafe {
        _mm_loadu_si128(crate::gguf::IQ4_KVALUES.as_ptr().cast())
    });
    let m4 = _mm_set1_epi8(0x0f);
    let mut w = [_mm256_setzero_si256(); 8];
    let mut aw = [_mm256_setzero_si256(); 8];
    let mut sc = [_mm256_setzero_si256(); 8];
    for g in 0..8 {
        // SAFETY: 16 bytes of nibbles per sub-block of 32.
        let v = unsafe { _mm_loadu_si128(qs[16 * g..].as_ptr().cast()) };
        let idx = _mm256_set_m128i(
            _mm_and_si128(_mm_srli_epi16::<4>(v), m4),
            _mm_and_si128(v, m4),
        );
        w[g] = _mm256_shuffle_epi8(kv, idx);
        aw[g] = _mm256_sign_epi8(w[g], w[g]);
        let lo = (sl[g / 2] >> (4 * (g % 2))) & 15;
        let hi = ((sh >> (2 * g)) & 3) as u8;
        sc[g] = _mm256_set1_epi16((lo | (hi << 4)) as i16 - 32);
    }
    for (k, out) in out.iter_mut().enumerate().take(n) {
        let i = i0 + k;
        let q = &a.codes(i)[b * 256..(b + 1) * 256];
        let mut acc = _mm256_setzero_si256();
        for g in 0..8 {
            // SAFETY: 32 codes from 32g < 256.
            let x = unsafe { load_i8(&q[32 * g..]) };
            let p = _mm256_maddubs_epi16(aw[g], _mm256_sign_epi8(x, w[g]));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc[g]));
        }
        let da = a.scales(i)[b];
        *out += (dw * da) * (hsum(acc) as f32);
    }
}
