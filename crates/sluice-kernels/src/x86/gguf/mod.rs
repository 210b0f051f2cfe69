//! GGUF row decoders with AVX2 (used on AVX-512 machines too): Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
//! Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, TQ2_0, the table formats IQ4_NL, IQ4_XS, MXFP4 and NVFP4 (one
//! byte shuffle looks a block's values up), and the grid formats IQ2_XXS, IQ2_XS, IQ2_S,
//! IQ3_XXS, IQ3_S, IQ1_S and IQ1_M (one grid row of 8 values, or two of 4, and one sign byte per
//! group of 8), 8 lanes at a time. Each value is computed by the operations of the
//! specification ([`crate::gguf::dequantize_block`]) in its order: the small integer code
//! converted exactly (an offset such as `q − 8` taken in f32 is exact too), one multiply by the
//! sub-block's scale, then for the formats with a minimum one subtraction (`a + m` is written
//! `a − (−m)`, the same IEEE operation), for the grid formats one multiply by `±1.0` (IQ1: the
//! exact `g ± 0.125` before the scale) — so the bits are the specification's.

use std::arch::x86_64::*;

use crate::gguf::grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS,
};
use crate::gguf::{
    BlockFormat, IQ4_KVALUES, MXFP4_KVALUES, delta, e8m0_to_f32_half, iq1m_d_bits, iq2_scale,
    iq2s_index, iq3s_index, scale_min_k4, u16_at, u32_at, ue4m3_to_f32_half,
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

/// `±1.0` per lane: `−1.0` where bit `k` of `signs` is set (lane `k`, 0..8).
///
/// # Safety
/// AVX2 is available.
#[inline(always)]
unsafe fn signs8(signs: u8) -> __m256 {
    // SAFETY: AVX2 is available (this function's contract).
    unsafe {
        let at = _mm256_setr_epi32(31, 30, 29, 28, 27, 26, 25, 24);
        let bit = _mm256_sllv_epi32(_mm256_set1_epi32(i32::from(signs)), at);
        let neg = _mm256_and_si256(bit, _mm256_set1_epi32(i32::MIN));
        _mm256_or_ps(_mm256_castsi256_ps(neg), _mm256_set1_ps(1.0))
    }
}

/// 8 grid values (`i8`) in the low 8 bytes of `g` as f32.
///
/// # Safety
/// AVX2 is available.
#[inline(always)]
unsafe fn grid_f32(g: __m128i) -> __m256 {
    // SAFETY: AVX2 is available (this function's contract).
    unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(g)) }
}

/// `o[0..8] = (db × g_k) × ±1.0` for one IQ2 / IQ3 group: the grid values in the low 8 bytes
/// of `g`, the sign of lane `k` from bit `k` of `signs`.
///
/// # Safety
/// AVX2 is available; `o` is valid for 8 writes.
#[inline(always)]
unsafe fn grid8(db: f32, g: __m128i, signs: u8, o: *mut f32) {
    // SAFETY: AVX2 is available and `o` is valid for 8 floats (this function's contract).
    unsafe {
        let v = _mm256_mul_ps(_mm256_set1_ps(db), grid_f32(g));
        _mm256_storeu_ps(o, _mm256_mul_ps(v, signs8(signs)));
    }
}

/// `o[0..8] = dl × (g_k + delta)` for one IQ1 group.
///
/// # Safety
/// AVX2 is available; `o` is valid for 8 writes.
#[inline(always)]
unsafe fn grid8_delta(dl: f32, g: &[i8; 8], delta: f32, o: *mut f32) {
    // SAFETY: AVX2 is available, `g` holds 8 bytes and `o` is valid for 8 floats.
    unsafe {
        let g = grid_f32(_mm_loadl_epi64(g.as_ptr().cast()));
        let v = _mm256_add_ps(g, _mm256_set1_ps(delta));
        _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_set1_ps(dl), v));
    }
}

/// A grid row of 8 in the low half of a vector.
///
/// # Safety
/// AVX2 is available.
#[inline(always)]
unsafe fn row8(g: &[i8; 8]) -> __m128i {
    // SAFETY: `g` holds 8 bytes; AVX2 (so SSE2) is available.
    unsafe { _mm_loadl_epi64(g.as_ptr().cast()) }
}

/// Two grid rows of 4 (IQ3) as one of 8.
///
/// # Safety
/// AVX2 is available.
#[inline(always)]
unsafe fn rows4(a: &[i8; 4], b: &[i8; 4]) -> __m128i {
    // SAFETY: AVX2 (so SSE2) is available.
    unsafe {
        _mm_setr_epi32(
            i32::from_le_bytes(a.map(|v| v as u8)),
            i32::from_le_bytes(b.map(|v| v as u8)),
            0,
            0,
        )
    }
}

/// Two grid rows of 8, `g0` in the low half.
///
/// # Safety
/// AVX2 is available.
#[inline(always)]
unsafe fn rows16(g0: &[i8; 8], g1: &[i8; 8]) -> __m128i {
    // SAFETY: AVX2 (so SSE2) is available (this function's contract).
    unsafe { _mm_unpacklo_epi64(row8(g0), row8(g1)) }
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
                    let d = _mm256_set1_ps(hc(b, 0));
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
                        (0.0, Some(-hc(b, 2)))
                    };
                    let d = hc(b, 0);
                    emit16(lo, off, d, sub, o.as_mut_ptr());
                    emit16(hi, off, d, sub, o.as_mut_ptr().add(16));
                }
            }
            Q5_0 | Q5_1 => {
                // Q5_1 has a minimum after `d`, so its fifth bits and codes start 2 bytes later.
                let qh_at = if f == Q5_0 { 2 } else { 4 };
                for (b, o) in blocks {
                    let d = hc(b, 0);
                    // Q5_0: `d × (q − 16)`; Q5_1: `d × q + m`, written `− (−m)`.
                    let (off, sub) = if f == Q5_0 {
                        (16.0, None)
                    } else {
                        (0.0, Some(-hc(b, 2)))
                    };
                    let qh = u32_at(b, qh_at);
                    // The fifth bits as bytes: 16 for the low nibbles, 16 for the high.
                    let bits: [u8; 32] = std::array::from_fn(|j| (((qh >> j) & 1) << 4) as u8);
                    let (lo, hi) = nibbles(load16(&b[qh_at + 4..]));
                    let lo = _mm_or_si128(lo, load16(&bits[..16]));
                    let hi = _mm_or_si128(hi, load16(&bits[16..]));
                    emit16(lo, off, d, sub, o.as_mut_ptr());
                    emit16(hi, off, d, sub, o.as_mut_ptr().add(16));
                }
            }
            Q4_K | Q5_K => {
                let (qs_at, qh_at) = if f == Q4_K { (16, 0) } else { (48, 16) };
                for (b, o) in blocks {
                    let (d, dmin) = (hc(b, 0), hc(b, 2));
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
                    let d = hc(b, 208);
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
                        hc(b, 0)
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
                    let d = hc(b, 0);
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
                    let (d, dmin) = (hc(b, 80), hc(b, 82));
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
                    let d = hc(b, 108);
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
            TQ2_0 => {
                for (b, o) in blocks {
                    let d = hc(b, 64);
                    let m3 = _mm_set1_epi8(3);
                    for c in 0..2 {
                        for p in 0..4 {
                            let shift = _mm_cvtsi32_si128(2 * p as i32);
                            for g in 0..2 {
                                let q = load16(&b[32 * c + 16 * g..]);
                                let q = _mm_and_si128(_mm_srl_epi16(q, shift), m3);
                                let at = 128 * c + 32 * p + 16 * g;
                                emit16(q, 1.0, d, None, o.as_mut_ptr().add(at));
                            }
                        }
                    }
                }
            }
            NVFP4 => {
                for (b, o) in blocks {
                    for s in 0..4 {
                        let d = ue4m3_to_f32_half(b[s]);
                        // The 8 code bytes of sub-block `s`: low nibbles first, then high.
                        let q = _mm_loadl_epi64(b[4 + 8 * s..].as_ptr().cast());
                        let (lo, hi) = nibbles(q);
                        lut16(
                            _mm_unpacklo_epi64(lo, hi),
                            &MXFP4_KVALUES,
                            d,
                            o.as_mut_ptr().add(16 * s),
                        );
                    }
                }
            }
            IQ2_XXS => {
                for (b, o) in blocks {
                    let d = hc(b, 0);
                    for s in 0..8 {
                        let a0 = 2 + 8 * s;
                        let aux1 = u32_at(b, a0 + 4);
                        let db = iq2_scale(d, aux1 >> 28);
                        for l in 0..4 {
                            let g = row8(&IQ2XXS_GRID[b[a0 + l] as usize]);
                            let signs = KSIGNS[((aux1 >> (7 * l)) & 127) as usize];
                            grid8(db, g, signs, o.as_mut_ptr().add(32 * s + 8 * l));
                        }
                    }
                }
            }
            IQ2_XS => {
                for (b, o) in blocks {
                    let d = hc(b, 0);
                    for i in 0..16 {
                        let s = (b[66 + i / 2] >> (4 * (i % 2))) & 15;
                        let db = iq2_scale(d, s.into());
                        for half in 0..2 {
                            let q = u16_at(b, 2 + 2 * (2 * i + half));
                            let g = row8(&IQ2XS_GRID[(q & 511) as usize]);
                            let signs = KSIGNS[(q >> 9) as usize];
                            grid8(db, g, signs, o.as_mut_ptr().add(16 * i + 8 * half));
                        }
                    }
                }
            }
            IQ2_S => {
                for (b, o) in blocks {
                    let d = hc(b, 0);
                    let (qs, signs, qh, sc) = (&b[2..34], &b[34..66], &b[66..74], &b[74..82]);
                    for i in 0..16 {
                        let s = (sc[i / 2] >> (4 * (i % 2))) & 15;
                        let db = iq2_scale(d, s.into());
                        for k in 2 * i..2 * i + 2 {
                            let g = row8(&IQ2S_GRID[iq2s_index(qs, qh, k)]);
                            grid8(db, g, signs[k], o.as_mut_ptr().add(8 * k));
                        }
                    }
                }
            }
            IQ3_XXS => {
                for (b, o) in blocks {
                    let d = hc(b, 0);
                    let qs = &b[2..66];
                    for s in 0..8 {
                        let aux = u32_at(b, 66 + 4 * s);
                        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
                        for l in 0..4 {
                            let k = 4 * s + l;
                            let g = rows4(
                                &IQ3XXS_GRID[qs[2 * k] as usize],
                                &IQ3XXS_GRID[qs[2 * k + 1] as usize],
                            );
                            let signs = KSIGNS[((aux >> (7 * l)) & 127) as usize];
                            grid8(db, g, signs, o.as_mut_ptr().add(8 * k));
                        }
                    }
                }
            }
            IQ3_S => {
                for (b, o) in blocks {
                    let d = hc(b, 0);
                    let (qs, qh, signs, sc) = (&b[2..66], &b[66..74], &b[74..106], &b[106..110]);
                    let idx = |k: usize| iq3s_index(qs, qh, k);
                    for i in 0..8 {
                        let s = (sc[i / 2] >> (4 * (i % 2))) & 15;
                        let db = d * ((1 + 2 * s) as f32);
                        for m in 4 * i..4 * i + 4 {
                            let g = rows4(&IQ3S_GRID[idx(2 * m)], &IQ3S_GRID[idx(2 * m + 1)]);
                            grid8(db, g, signs[m], o.as_mut_ptr().add(8 * m));
                        }
                    }
                }
            }
            IQ1_S => {
                for (b, o) in blocks {
                    let d = hc(b, 0);
                    let qs = &b[2..34];
                    for i in 0..8 {
                        let qh = u16_at(b, 34 + 2 * i);
                        let dl = d * ((2 * ((qh >> 12) & 7) + 1) as f32);
                        let dt = delta(qh & 0x8000 != 0);
                        for k in 4 * i..4 * i + 4 {
                            let hi = ((qh >> (3 * (k % 4))) & 7) as usize;
                            let g = &IQ1S_GRID[qs[k] as usize | (hi << 8)];
                            grid8_delta(dl, g, dt, o.as_mut_ptr().add(8 * k));
                        }
                    }
                }
            }
            IQ1_M => {
                for (b, o) in blocks {
                    let (qs, qh) = (&b[0..32], &b[32..48]);
                    let sc = [u16_at(b, 48), u16_at(b, 50), u16_at(b, 52), u16_at(b, 54)];
                    let d = hc(&iq1m_d_bits(&sc).to_le_bytes(), 0);
                    for i in 0..16 {
                        let s = (sc[i / 4] >> (3 * (i % 4))) & 7;
                        let dl = d * ((2 * s + 1) as f32);
                        for k in 2 * i..2 * i + 2 {
                            let nib = (qh[k / 2] >> (4 * (k % 2))) & 15;
                            let g = &IQ1S_GRID[qs[k] as usize | (((nib & 7) as usize) << 8)];
                            grid8_delta(dl, g, delta(nib & 8 != 0), o.as_mut_ptr().add(8 * k));
                        }
                    }
                }
            }
            _ => return false,
        }
    }
    true
}

/// The f16 at byte `at` of `b` as f32 by F16C (exact, as `gguf::h`; a NaN stays a NaN).
///
/// # Safety
/// F16C is available.
#[inline(always)]
unsafe fn hc(b: &[u8], at: usize) -> f32 {
    let v = u16::from_le_bytes([b[at], b[at + 1]]);
    // SAFETY: F16C is available (this function's contract).
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(v)))) }
}

mod fused;

pub(crate) use fused::{fused, matvec};
