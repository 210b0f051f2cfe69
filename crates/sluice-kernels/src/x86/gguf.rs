//! GGUF row decoders with AVX2 (used on AVX-512 machines too): Q8_0, Q4_0, Q4_1, Q5_0, Q2_K,
//! Q3_K, Q4_K, Q5_K, Q6_K, and the table formats IQ4_NL, IQ4_XS and MXFP4 (one byte shuffle
//! looks a block's values up), 8 lanes at a time. Each value is computed by the operations of the
//! specification ([`crate::gguf::dequantize_block`]) in its order: the small integer code
//! converted exactly (an offset such as `q − 8` taken in f32 is exact too), one multiply by the
//! sub-block's scale, then for the formats with a minimum one subtraction (`a + m` is written
//! `a − (−m)`, the same IEEE operation) — so the bits are the specification's.

use std::arch::x86_64::*;

use crate::gguf::{
    BlockFormat, IQ4_KVALUES, MXFP4_KVALUES, e8m0_to_f32_half, h, scale_min_k4, u16_at, u32_at,
};

/// `out[0..16] = (q_j − off) × mul − sub` for the 16 unsigned bytes of `q`.
///
/// # Safety
/// AVX2 is available; `o` is valid for 16 writes.
#[inline(always)]
unsafe fn emit16(q: __m128i, off: f32, mul: f32, sub: Option<f32>, o: *mut f32) {
    // SAFETY: AVX2 is available (this function's contract); `o` is valid for 16 floats.
    unsafe {
        let (off, mul) = (_mm256_set1_ps(off), _mm256_set1_ps(mul));
        for (k, half) in [q, _mm_srli_si128::<8>(q)].into_iter().enumerate() {
            let x = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(half)), off);
            let mut v = _mm256_mul_ps(x, mul);
            if let Some(s) = sub {
                v = _mm256_sub_ps(v, _mm256_set1_ps(s));
            }
            _mm256_storeu_ps(o.add(8 * k), v);
        }
    }
}

/// `out[0..16] = mul × table[q_j]` for the 16 codes (`< 16`) of `q`: a non-linear format's
/// values (IQ4_NL, IQ4_XS, MXFP4) looked up in one byte shuffle.
///
/// # Safety
/// AVX2 is available; `o` is valid for 16 writes; every byte of `q` is below 16.
#[inline(always)]
unsafe fn lut16(q: __m128i, table: &[i8; 16], mul: f32, o: *mut f32) {
    // SAFETY: AVX2 is available (this function's contract); `table` holds 16 bytes and `o` is
    // valid for 16 floats.
    unsafe {
        let t = _mm_loadu_si128(table.as_ptr().cast());
        let v = _mm_shuffle_epi8(t, q);
        let mul = _mm256_set1_ps(mul);
        for (k, half) in [v, _mm_srli_si128::<8>(v)].into_iter().enumerate() {
            let x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(half));
            _mm256_storeu_ps(o.add(8 * k), _mm256_mul_ps(x, mul));
        }
    }
}

/// The low and high nibbles of 16 bytes.
///
/// # Safety
/// AVX2 is available.
#[inline(always)]
unsafe fn nibbles(q: __m128i) -> (__m128i, __m128i) {
    // SAFETY: AVX2 (and so SSE2) is available.
    unsafe {
        let m = _mm_set1_epi8(15);
        (
            _mm_and_si128(q, m),
            _mm_and_si128(_mm_srli_epi16::<4>(q), m),
        )
    }
}

/// Bit `b` of each of 16 bytes, moved to bit `to`.
///
/// # Safety
/// AVX2 is available; `b < 8`, `to < 8`.
#[inline(always)]
unsafe fn bit(q: __m128i, b: u32, to: u32) -> __m128i {
    // SAFETY: AVX2 (and so SSE2) is available.
    unsafe {
        let one = _mm_set1_epi8(1);
        let x = _mm_and_si128(_mm_srl_epi16(q, _mm_cvtsi32_si128(b as i32)), one);
        _mm_sll_epi16(x, _mm_cvtsi32_si128(to as i32))
    }
}

#[inline(always)]
unsafe fn load16(p: &[u8]) -> __m128i {
    debug_assert!(p.len() >= 16);
    // SAFETY: the slice holds 16 bytes (every caller passes a sub-slice of a whole block).
    unsafe { _mm_loadu_si128(p.as_ptr().cast()) }
}

/// Decodes whole blocks of `f` as [`crate::gguf::fast`] does, if it is one of the formats
/// above; `false` (nothing written) otherwise.
///
/// # Safety
/// AVX2 is available; `row` holds whole blocks and `out` their values (checked by the caller).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn decode_blocks(f: BlockFormat, row: &[u8], out: &mut [f32]) -> bool {
    use BlockFormat::*;
    let (bs, ts) = (f.block_size(), f.type_size());
    let blocks = row.chunks_exact(ts).zip(out.chunks_exact_mut(bs));
    // SAFETY: AVX2 is available (this function's contract); every block slice has its
    // format's bytes and every output slice its values, so each load and store is in bounds.
    unsafe {
        match f {
            Q8_0 => {
                for (b, o) in blocks {
                    let d = _mm256_set1_ps(h(b, 0));
                    for k in 0..4 {
                        let q = _mm_loadl_epi64(b[2 + 8 * k..].as_ptr().cast());
                        let x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                        _mm256_storeu_ps(o.as_mut_ptr().add(8 * k), _mm256_mul_ps(x, d));
                    }
                }
            }
            Q4_0 | Q4_1 => {
                let at = if f == Q4_0 { 2 } else { 4 };
                for (b, o) in blocks {
                    let (lo, hi) = nibbles(load16(&b[at..]));
                    let (off, sub) = if f == Q4_0 {
                        (8.0, None)
                    } else {
                        (0.0, Some(-h(b, 2)))
                    };
                    let d = h(b, 0);
                    emit16(lo, off, d, sub, o.as_mut_ptr());
                    emit16(hi, off, d, sub, o.as_mut_ptr().add(16));
                }
            }
            Q5_0 => {
                for (b, o) in blocks {
                    let d = h(b, 0);
                    let qh = u32_at(b, 2);
                    // The fifth bits as bytes: 16 for the low nibbles, 16 for the high.
                    let bits: [u8; 32] = std::array::from_fn(|j| (((qh >> j) & 1) << 4) as u8);
                    let (lo, hi) = nibbles(load16(&b[6..]));
                    let lo = _mm_or_si128(lo, load16(&bits[..16]));
                    let hi = _mm_or_si128(hi, load16(&bits[16..]));
                    emit16(lo, 16.0, d, None, o.as_mut_ptr());
                    emit16(hi, 16.0, d, None, o.as_mut_ptr().add(16));
                }
            }
            Q4_K | Q5_K => {
                let (qs_at, qh_at) = if f == Q4_K { (16, 0) } else { (48, 16) };
                for (b, o) in blocks {
                    let (d, dmin) = (h(b, 0), h(b, 2));
                    let s = &b[4..16];
                    for c in 0..4 {
                        let (s1, m1) = scale_min_k4(s, 2 * c);
                        let (s2, m2) = scale_min_k4(s, 2 * c + 1);
                        let (dl1, dm1) = (d * (s1 as f32), dmin * (m1 as f32));
                        let (dl2, dm2) = (d * (s2 as f32), dmin * (m2 as f32));
                        for g in 0..2 {
                            let (mut lo, mut hi) = nibbles(load16(&b[qs_at + 32 * c + 16 * g..]));
                            if f == Q5_K {
                                let qh = load16(&b[qh_at + 16 * g..]);
                                lo = _mm_or_si128(lo, bit(qh, 2 * c as u32, 4));
                                hi = _mm_or_si128(hi, bit(qh, 2 * c as u32 + 1, 4));
                            }
                            let p = o.as_mut_ptr().add(64 * c + 16 * g);
                            emit16(lo, 0.0, dl1, Some(dm1), p);
                            emit16(hi, 0.0, dl2, Some(dm2), p.add(32));
                        }
                    }
                }
            }
            Q6_K => {
                for (b, o) in blocks {
                    let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
                    let d = h(b, 208);
                    let m15 = _mm_set1_epi8(15);
                    let m3 = _mm_set1_epi8(3);
                    for half in 0..2 {
                        for k in 0..4 {
                            let (lo_at, lo_shift) = ((k % 2) * 32, 4 * (k / 2) as i32);
                            for g in 0..2 {
                                let dl = d * (sc[8 * half + 2 * k + g] as i8 as f32);
                                let l = load16(&ql[64 * half + lo_at + 16 * g..]);
                                let lo = _mm_and_si128(
                                    _mm_srl_epi16(l, _mm_cvtsi32_si128(lo_shift)),
                                    m15,
                                );
                                let hb = load16(&qh[32 * half + 16 * g..]);
                                let hi = _mm_and_si128(
                                    _mm_srl_epi16(hb, _mm_cvtsi32_si128(2 * k as i32)),
                                    m3,
                                );
                                let q = _mm_or_si128(lo, _mm_slli_epi16::<4>(hi));
                                let p = o.as_mut_ptr().add(128 * half + 32 * k + 16 * g);
                                emit16(q, 32.0, dl, None, p);
                            }
                        }
                    }
                }
            }
            IQ4_NL | MXFP4 => {
                let (at, table) = if f == IQ4_NL {
                    (2, &IQ4_KVALUES)
                } else {
                    (1, &MXFP4_KVALUES)
                };
                for (b, o) in blocks {
                    let d = if f == IQ4_NL {
                        h(b, 0)
                    } else {
                        e8m0_to_f32_half(b[0])
                    };
                    let (lo, hi) = nibbles(load16(&b[at..]));
                    lut16(lo, table, d, o.as_mut_ptr());
                    lut16(hi, table, d, o.as_mut_ptr().add(16));
                }
            }
            IQ4_XS => {
                for (b, o) in blocks {
                    let d = h(b, 0);
                    let sh = u16_at(b, 2);
                    let (sl, qs) = (&b[4..8], &b[8..136]);
                    for i in 0..8 {
                        let lo = (sl[i / 2] >> (4 * (i % 2))) & 15;
                        let hi = ((sh >> (2 * i)) & 3) as u8;
                        let dl = d * (((lo | (hi << 4)) as i32 - 32) as f32);
                        let (l, u) = nibbles(load16(&qs[16 * i..]));
                        lut16(l, &IQ4_KVALUES, dl, o.as_mut_ptr().add(32 * i));
                        lut16(u, &IQ4_KVALUES, dl, o.as_mut_ptr().add(32 * i + 16));
                    }
                }
            }
            Q2_K => {
                for (b, o) in blocks {
                    let (sc, qs) = (&b[0..16], &b[16..80]);
                    let (d, dmin) = (h(b, 80), h(b, 82));
                    let m3 = _mm_set1_epi8(3);
                    for (g, &s) in sc.iter().enumerate() {
                        let (dl, ml) = (d * ((s & 15) as f32), dmin * ((s >> 4) as f32));
                        let q = load16(&qs[32 * (g / 8) + 16 * (g % 2)..]);
                        let shift = _mm_cvtsi32_si128(2 * ((g % 8) / 2) as i32);
                        let q = _mm_and_si128(_mm_srl_epi16(q, shift), m3);
                        emit16(q, 0.0, dl, Some(ml), o.as_mut_ptr().add(16 * g));
                    }
                }
            }
            Q3_K => {
                for (b, o) in blocks {
                    let (hm, qs, s) = (&b[0..32], &b[32..96], &b[96..108]);
                    let d = h(b, 108);
                    let m3 = _mm_set1_epi8(3);
                    for g in 0..16 {
                        let lo = (s[g % 8] >> (4 * (g / 8))) & 15;
                        let hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
                        let dl = d * (((lo | (hi << 4)) as i32 - 32) as f32);
                        let at = 16 * (g % 2);
                        let q = load16(&qs[32 * (g / 8) + at..]);
                        let shift = _mm_cvtsi32_si128(2 * ((g % 8) / 2) as i32);
                        let ql = _mm_and_si128(_mm_srl_epi16(q, shift), m3);
                        // `ql − 4·(1 − high)` = `(ql | high << 2) − 4`, exact in f32.
                        let q = _mm_or_si128(ql, bit(load16(&hm[at..]), (g / 2) as u32, 2));
                        emit16(q, 4.0, dl, None, o.as_mut_ptr().add(16 * g));
                    }
                }
            }
            _ => return false,
        }
    }
    true
}
