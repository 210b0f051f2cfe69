//! Row decoders for every block format but the plain F32, F16, BF16 and TQ1_0: the same float
//! operations in the same order as the specification ([`super::dequantize_block`]), so the
//! same bits, but organised per sub-block — scales decoded once, the elements in straight
//! loops over fixed-size arrays that the compiler turns into vector code, and for the grid
//! formats (IQ2, IQ3, IQ1) one grid row and one sign byte per group of 8. The other formats
//! decode block by block through the specification.

use super::grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS};
use super::{
    BlockFormat, IQ4_KVALUES, MXFP4_KVALUES, delta, dequantize_block, h, iq1m_d_bits, iq2_scale,
    iq2s_index, iq3s_index, scale_min_k4, sign, u16_at, u32_at, ue4m3_to_f32_half,
};

/// Dequantizes whole blocks: `row` holds `n` blocks of `f` and `out` their `n × block_size`
/// values, bit for bit what [`dequantize_block`] gives each.
///
/// # Panics
/// When the lengths disagree.
pub(crate) fn decode_blocks(f: BlockFormat, row: &[u8], out: &mut [f32]) {
    check_blocks(f, row, out);
    let (bs, ts) = (f.block_size(), f.type_size());
    let blocks = row.chunks_exact(ts).zip(out.chunks_exact_mut(bs));
    use BlockFormat::*;
    match f {
        Q8_0 => blocks.for_each(|(b, o)| q8_0(b.try_into().unwrap(), o.try_into().unwrap())),
        Q4_0 => blocks.for_each(|(b, o)| q4_0(b.try_into().unwrap(), o.try_into().unwrap())),
        IQ4_NL => blocks.for_each(|(b, o)| iq4_nl(b.try_into().unwrap(), o.try_into().unwrap())),
        Q4_1 => blocks.for_each(|(b, o)| q4_1(b.try_into().unwrap(), o.try_into().unwrap())),
        Q5_0 => blocks.for_each(|(b, o)| q5_0(b.try_into().unwrap(), o.try_into().unwrap())),
        Q4_K => blocks.for_each(|(b, o)| q4_k(b.try_into().unwrap(), o.try_into().unwrap())),
        Q5_K => blocks.for_each(|(b, o)| q5_k(b.try_into().unwrap(), o.try_into().unwrap())),
        Q6_K => blocks.for_each(|(b, o)| q6_k(b.try_into().unwrap(), o.try_into().unwrap())),
        IQ4_XS => blocks.for_each(|(b, o)| iq4_xs(b.try_into().unwrap(), o.try_into().unwrap())),
        Q2_K => blocks.for_each(|(b, o)| q2_k(b.try_into().unwrap(), o.try_into().unwrap())),
        Q3_K => blocks.for_each(|(b, o)| q3_k(b.try_into().unwrap(), o.try_into().unwrap())),
        Q5_1 => blocks.for_each(|(b, o)| q5_1(b.try_into().unwrap(), o.try_into().unwrap())),
        IQ2_XXS => blocks.for_each(|(b, o)| iq2_xxs(b.try_into().unwrap(), o.try_into().unwrap())),
        IQ2_XS => blocks.for_each(|(b, o)| iq2_xs(b.try_into().unwrap(), o.try_into().unwrap())),
        IQ2_S => blocks.for_each(|(b, o)| iq2_s(b.try_into().unwrap(), o.try_into().unwrap())),
        IQ3_XXS => blocks.for_each(|(b, o)| iq3_xxs(b.try_into().unwrap(), o.try_into().unwrap())),
        IQ3_S => blocks.for_each(|(b, o)| iq3_s(b.try_into().unwrap(), o.try_into().unwrap())),
        IQ1_S => blocks.for_each(|(b, o)| iq1_s(b.try_into().unwrap(), o.try_into().unwrap())),
        IQ1_M => blocks.for_each(|(b, o)| iq1_m(b.try_into().unwrap(), o.try_into().unwrap())),
        TQ2_0 => blocks.for_each(|(b, o)| tq2_0(b.try_into().unwrap(), o.try_into().unwrap())),
        NVFP4 => blocks.for_each(|(b, o)| nvfp4(b.try_into().unwrap(), o.try_into().unwrap())),
        _ => blocks.for_each(|(b, o)| dequantize_block(f, b, o)),
    }
}

/// Checks that `row` holds whole blocks of `f` and `out` their values.
///
/// # Panics
/// When it does not.
pub(crate) fn check_blocks(f: BlockFormat, row: &[u8], out: &[f32]) {
    let (bs, ts) = (f.block_size(), f.type_size());
    assert!(
        row.len().is_multiple_of(ts) && out.len() == row.len() / ts * bs,
        "{f:?}: {} bytes into {} values",
        row.len(),
        out.len()
    );
}

#[inline(always)]
fn q8_0(b: &[u8; 34], o: &mut [f32; 32]) {
    let d = h(b, 0);
    for j in 0..32 {
        o[j] = (b[2 + j] as i8 as f32) * d;
    }
}

#[inline(always)]
fn q4_0(b: &[u8; 18], o: &mut [f32; 32]) {
    let d = h(b, 0);
    for j in 0..16 {
        o[j] = d * (((b[2 + j] & 15) as i32 - 8) as f32);
        o[16 + j] = d * (((b[2 + j] >> 4) as i32 - 8) as f32);
    }
}

#[inline(always)]
fn iq4_nl(b: &[u8; 18], o: &mut [f32; 32]) {
    let d = h(b, 0);
    for j in 0..16 {
        o[j] = d * (IQ4_KVALUES[(b[2 + j] & 15) as usize] as f32);
        o[16 + j] = d * (IQ4_KVALUES[(b[2 + j] >> 4) as usize] as f32);
    }
}

#[inline(always)]
fn q4_1(b: &[u8; 20], o: &mut [f32; 32]) {
    let (d, m) = (h(b, 0), h(b, 2));
    for j in 0..16 {
        o[j] = d * ((b[4 + j] & 15) as f32) + m;
        o[16 + j] = d * ((b[4 + j] >> 4) as f32) + m;
    }
}

#[inline(always)]
fn q5_0(b: &[u8; 22], o: &mut [f32; 32]) {
    let d = h(b, 0);
    let qh = u32_at(b, 2);
    for j in 0..16 {
        let lo = (b[6 + j] & 15) as u32 | (((qh >> j) & 1) << 4);
        let hi = (b[6 + j] >> 4) as u32 | (((qh >> (16 + j)) & 1) << 4);
        o[j] = d * ((lo as i32 - 16) as f32);
        o[16 + j] = d * ((hi as i32 - 16) as f32);
    }
}

/// One 32-element sub-block of Q4_K / Q5_K: `dl × q − dm`.
#[inline(always)]
fn k_sub(o: &mut [f32], q: impl Fn(usize) -> u8, dl: f32, dm: f32) {
    for (l, v) in o[..32].iter_mut().enumerate() {
        *v = dl * (q(l) as f32) - dm;
    }
}

#[inline(always)]
fn q4_k(b: &[u8; 144], o: &mut [f32; 256]) {
    let (d, dmin) = (h(b, 0), h(b, 2));
    let s = &b[4..16];
    let qs = &b[16..144];
    for c in 0..4 {
        let (s1, m1) = scale_min_k4(s, 2 * c);
        let (s2, m2) = scale_min_k4(s, 2 * c + 1);
        let q = &qs[32 * c..32 * c + 32];
        let (lo, hi) = o[64 * c..64 * c + 64].split_at_mut(32);
        k_sub(lo, |l| q[l] & 15, d * (s1 as f32), dmin * (m1 as f32));
        k_sub(hi, |l| q[l] >> 4, d * (s2 as f32), dmin * (m2 as f32));
    }
}

#[inline(always)]
fn q5_k(b: &[u8; 176], o: &mut [f32; 256]) {
    let (d, dmin) = (h(b, 0), h(b, 2));
    let s = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for c in 0..4 {
        let (s1, m1) = scale_min_k4(s, 2 * c);
        let (s2, m2) = scale_min_k4(s, 2 * c + 1);
        let q = &qs[32 * c..32 * c + 32];
        let (b1, b2) = (2 * c, 2 * c + 1);
        let (lo, hi) = o[64 * c..64 * c + 64].split_at_mut(32);
        k_sub(
            lo,
            |l| (q[l] & 15) | (((qh[l] >> b1) & 1) << 4),
            d * (s1 as f32),
            dmin * (m1 as f32),
        );
        k_sub(
            hi,
            |l| (q[l] >> 4) | (((qh[l] >> b2) & 1) << 4),
            d * (s2 as f32),
            dmin * (m2 as f32),
        );
    }
}

#[inline(always)]
fn q6_k(b: &[u8; 210], o: &mut [f32; 256]) {
    let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = h(b, 208);
    for half in 0..2 {
        let ql = &ql[64 * half..64 * half + 64];
        let qh = &qh[32 * half..32 * half + 32];
        let o = &mut o[128 * half..128 * half + 128];
        // Quarter `k` of the half: elements 32k..32k+32.
        for k in 0..4 {
            let (lo_at, lo_shift) = ((k % 2) * 32, 4 * (k / 2));
            for g in 0..2 {
                let dl = d * (sc[8 * half + 2 * k + g] as i8 as f32);
                for l in 16 * g..16 * g + 16 {
                    let lo = (ql[lo_at + l] >> lo_shift) & 15;
                    let hi = (qh[l] >> (2 * k)) & 3;
                    let q = (lo | (hi << 4)) as i32 - 32;
                    o[32 * k + l] = dl * (q as f32);
                }
            }
        }
    }
}

/// Q2_K: 16 groups of 16, each `dl × q − ml` with its 4-bit scale and minimum.
#[inline(always)]
fn q2_k(b: &[u8; 84], o: &mut [f32; 256]) {
    let (sc, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (h(b, 80), h(b, 82));
    for g in 0..16 {
        let dl = d * ((sc[g] & 15) as f32);
        let ml = dmin * ((sc[g] >> 4) as f32);
        let q = &qs[32 * (g / 8) + 16 * (g % 2)..][..16];
        let shift = 2 * ((g % 8) / 2);
        for i in 0..16 {
            o[16 * g + i] = dl * (((q[i] >> shift) & 3) as f32) - ml;
        }
    }
}

/// Q3_K: 16 groups of 16, each `dl × q` with its 6-bit scale; the third bit in `hmask`.
#[inline(always)]
fn q3_k(b: &[u8; 110], o: &mut [f32; 256]) {
    let (hm, qs, s) = (&b[0..32], &b[32..96], &b[96..108]);
    let d = h(b, 108);
    for g in 0..16 {
        let lo = (s[g % 8] >> (4 * (g / 8))) & 15;
        let hi = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
        let dl = d * (((lo | (hi << 4)) as i32 - 32) as f32);
        let at = 16 * (g % 2);
        let q = &qs[32 * (g / 8) + at..][..16];
        let m = &hm[at..at + 16];
        let (shift, hb) = (2 * ((g % 8) / 2), g / 2);
        for i in 0..16 {
            let ql = ((q[i] >> shift) & 3) as i32;
            let high = (m[i] >> hb) & 1;
            o[16 * g + i] = dl * ((ql - 4 * (1 - high as i32)) as f32);
        }
    }
}

#[inline(always)]
fn iq4_xs(b: &[u8; 136], o: &mut [f32; 256]) {
    let d = h(b, 0);
    let sh = u16_at(b, 2);
    let (sl, qs) = (&b[4..8], &b[8..136]);
    for i in 0..8 {
        let lo = (sl[i / 2] >> (4 * (i % 2))) & 15;
        let hi = ((sh >> (2 * i)) & 3) as u8;
        let dl = d * (((lo | (hi << 4)) as i32 - 32) as f32);
        let q = &qs[16 * i..16 * i + 16];
        for k in 0..16 {
            o[32 * i + k] = dl * (IQ4_KVALUES[(q[k] & 15) as usize] as f32);
            o[32 * i + 16 + k] = dl * (IQ4_KVALUES[(q[k] >> 4) as usize] as f32);
        }
    }
}

#[inline(always)]
fn q5_1(b: &[u8; 24], o: &mut [f32; 32]) {
    let (d, m) = (h(b, 0), h(b, 2));
    let qh = u32_at(b, 4);
    for j in 0..16 {
        let lo = (b[8 + j] & 15) as u32 | (((qh >> j) & 1) << 4);
        let hi = (b[8 + j] >> 4) as u32 | (((qh >> (16 + j)) & 1) << 4);
        o[j] = d * (lo as f32) + m;
        o[16 + j] = d * (hi as f32) + m;
    }
}

/// One group of 8 of the IQ2 / IQ3 formats: `(db × g_k) × ±1`, the sign from bit `k`.
#[inline(always)]
fn grid8(o: &mut [f32], db: f32, g: [i8; 8], signs: u8) {
    for k in 0..8 {
        o[k] = db * (g[k] as f32) * sign(signs, k);
    }
}

/// Two grid rows of 4 (IQ3) as one of 8.
#[inline(always)]
fn two(a: &[i8; 4], b: &[i8; 4]) -> [i8; 8] {
    [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
}

/// One group of 8 of the IQ1 formats: `dl × (g_k + delta)`.
#[inline(always)]
fn grid8_delta(o: &mut [f32], dl: f32, g: &[i8; 8], delta: f32) {
    for k in 0..8 {
        o[k] = dl * (g[k] as f32 + delta);
    }
}

#[inline(always)]
fn iq2_xxs(b: &[u8; 66], o: &mut [f32; 256]) {
    let d = h(b, 0);
    for s in 0..8 {
        let a0 = 2 + 8 * s;
        let aux1 = u32_at(b, a0 + 4);
        let db = iq2_scale(d, aux1 >> 28);
        for l in 0..4 {
            let signs = KSIGNS[((aux1 >> (7 * l)) & 127) as usize];
            let at = 32 * s + 8 * l;
            grid8(
                &mut o[at..at + 8],
                db,
                IQ2XXS_GRID[b[a0 + l] as usize],
                signs,
            );
        }
    }
}

#[inline(always)]
fn iq2_xs(b: &[u8; 74], o: &mut [f32; 256]) {
    let d = h(b, 0);
    for i in 0..16 {
        let s = (b[66 + i / 2] >> (4 * (i % 2))) & 15;
        let db = iq2_scale(d, s.into());
        for half in 0..2 {
            let q = u16_at(b, 2 + 2 * (2 * i + half));
            let at = 16 * i + 8 * half;
            let g = IQ2XS_GRID[(q & 511) as usize];
            grid8(&mut o[at..at + 8], db, g, KSIGNS[(q >> 9) as usize]);
        }
    }
}

#[inline(always)]
fn iq2_s(b: &[u8; 82], o: &mut [f32; 256]) {
    let d = h(b, 0);
    let (qs, signs, qh, sc) = (&b[2..34], &b[34..66], &b[66..74], &b[74..82]);
    for i in 0..16 {
        let s = (sc[i / 2] >> (4 * (i % 2))) & 15;
        let db = iq2_scale(d, s.into());
        for k in 2 * i..2 * i + 2 {
            let idx = iq2s_index(qs, qh, k);
            grid8(&mut o[8 * k..8 * k + 8], db, IQ2S_GRID[idx], signs[k]);
        }
    }
}

#[inline(always)]
fn iq3_xxs(b: &[u8; 98], o: &mut [f32; 256]) {
    let d = h(b, 0);
    let qs = &b[2..66];
    for s in 0..8 {
        let aux = u32_at(b, 66 + 4 * s);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for l in 0..4 {
            let k = 4 * s + l;
            let signs = KSIGNS[((aux >> (7 * l)) & 127) as usize];
            let g = two(
                &IQ3XXS_GRID[qs[2 * k] as usize],
                &IQ3XXS_GRID[qs[2 * k + 1] as usize],
            );
            grid8(&mut o[8 * k..8 * k + 8], db, g, signs);
        }
    }
}

#[inline(always)]
fn iq3_s(b: &[u8; 110], o: &mut [f32; 256]) {
    let d = h(b, 0);
    let (qs, qh, signs, sc) = (&b[2..66], &b[66..74], &b[74..106], &b[106..110]);
    let idx = |k: usize| iq3s_index(qs, qh, k);
    for i in 0..8 {
        let s = (sc[i / 2] >> (4 * (i % 2))) & 15;
        let db = d * ((1 + 2 * s) as f32);
        for m in 4 * i..4 * i + 4 {
            let g = two(&IQ3S_GRID[idx(2 * m)], &IQ3S_GRID[idx(2 * m + 1)]);
            grid8(&mut o[8 * m..8 * m + 8], db, g, signs[m]);
        }
    }
}

#[inline(always)]
fn iq1_s(b: &[u8; 50], o: &mut [f32; 256]) {
    let d = h(b, 0);
    let qs = &b[2..34];
    for i in 0..8 {
        let qh = u16_at(b, 34 + 2 * i);
        let dl = d * ((2 * ((qh >> 12) & 7) + 1) as f32);
        let delta = delta(qh & 0x8000 != 0);
        for k in 4 * i..4 * i + 4 {
            let idx = qs[k] as usize | ((((qh >> (3 * (k % 4))) & 7) as usize) << 8);
            grid8_delta(&mut o[8 * k..8 * k + 8], dl, &IQ1S_GRID[idx], delta);
        }
    }
}

#[inline(always)]
fn iq1_m(b: &[u8; 56], o: &mut [f32; 256]) {
    let (qs, qh) = (&b[0..32], &b[32..48]);
    let sc = [u16_at(b, 48), u16_at(b, 50), u16_at(b, 52), u16_at(b, 54)];
    let d = crate::decode::f16_to_f32(iq1m_d_bits(&sc));
    for i in 0..16 {
        let s = (sc[i / 4] >> (3 * (i % 4))) & 7;
        let dl = d * ((2 * s + 1) as f32);
        for k in 2 * i..2 * i + 2 {
            let nib = (qh[k / 2] >> (4 * (k % 2))) & 15;
            let idx = qs[k] as usize | (((nib & 7) as usize) << 8);
            grid8_delta(
                &mut o[8 * k..8 * k + 8],
                dl,
                &IQ1S_GRID[idx],
                delta(nib & 8 != 0),
            );
        }
    }
}

#[inline(always)]
fn tq2_0(b: &[u8; 66], o: &mut [f32; 256]) {
    let d = h(b, 64);
    for c in 0..2 {
        for p in 0..4 {
            for l in 0..32 {
                let q = (b[32 * c + l] >> (2 * p)) & 3;
                o[128 * c + 32 * p + l] = d * ((q as i32 - 1) as f32);
            }
        }
    }
}

#[inline(always)]
fn nvfp4(b: &[u8; 36], o: &mut [f32; 64]) {
    for s in 0..4 {
        let d = ue4m3_to_f32_half(b[s]);
        for j in 0..8 {
            let q = b[4 + 8 * s + j];
            o[16 * s + j] = d * (MXFP4_KVALUES[(q & 15) as usize] as f32);
            o[16 * s + 8 + j] = d * (MXFP4_KVALUES[(q >> 4) as usize] as f32);
        }
    }
}
