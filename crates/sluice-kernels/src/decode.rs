//! Exact conversions of stored element and scale codings to `f32`.
//!
//! Every conversion here is exact (the f32 holds the stored value without rounding), so any
//! implementation that converts correctly gives the same bits.

use crate::matrix::ScaleType;

/// bfloat16 bits to f32 (exact).
#[inline(always)]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// f32 to bfloat16 bits, rounding to nearest even (NaN stays NaN).
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

/// IEEE binary16 bits to f32 (exact).
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match exp {
        0 => {
            if man == 0 {
                sign
            } else {
                // Subnormal: man × 2^-24, exact in f32.
                let v = (man as f32) * f32::from_bits(0x3380_0000);
                return if sign != 0 { -v } else { v };
            }
        }
        0x1f => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 112) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// FP8 E4M3 (`float8_e4m3fn`: bias 7, no infinities, `S.1111.111` is NaN) to f32, exact.
pub const E4M3_TABLE: [f32; 256] = e4m3_table();

const fn e4m3_table() -> [f32; 256] {
    let mut t = [0f32; 256];
    let mut i = 0;
    while i < 256 {
        let sign = ((i as u32) & 0x80) << 24;
        let exp = ((i >> 3) & 0xf) as u32;
        let man = (i & 7) as u32;
        let bits = if exp == 0xf && man == 7 {
            0x7fc0_0000 | sign
        } else if exp == 0 {
            if man == 0 {
                sign
            } else {
                // man × 2^-9: normalise into an f32 exponent.
                let mut m = man;
                let mut e: u32 = 127 - 9;
                while m & 0x8 == 0 {
                    m <<= 1;
                    e -= 1;
                }
                // Now m is 1xxx (bit 3 set): value = m × 2^(e-127) with m in [8, 16).
                sign | ((e + 3) << 23) | ((m & 7) << 20)
            }
        } else {
            sign | ((exp + 120) << 23) | (man << 20)
        };
        t[i] = f32::from_bits(bits);
        i += 1;
    }
    t
}

/// FP4 E2M1 codes (sign bit 3, exponent bits 2–1, mantissa bit 0) to f32, exact.
pub const E2M1_TABLE: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// INT4 pack-quantized codes to f32: code − 8, exact.
pub const INT4_TABLE: [f32; 16] = [
    -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0,
];

/// E8M0 scale byte to f32: `2^(s − 127)`, exact (s = 0 is the subnormal 2^-127); 255 is NaN.
#[inline(always)]
pub fn e8m0_to_f32(s: u8) -> f32 {
    match s {
        0 => f32::from_bits(0x0040_0000),
        255 => f32::NAN,
        s => f32::from_bits((s as u32) << 23),
    }
}

/// The index of the first NaN or infinity among stored values of `dtype` in `bytes` (F32, BF16,
/// F16 and FP8 E4M3's NaN; the integer and packed codings hold no such values and give
/// `None`).
pub fn first_non_finite(dtype: crate::Codes, bytes: &[u8]) -> Option<usize> {
    match dtype {
        crate::Codes::F32 => bytes.chunks_exact(4).position(|c| {
            u32::from_le_bytes([c[0], c[1], c[2], c[3]]) & 0x7f80_0000 == 0x7f80_0000
        }),
        crate::Codes::BF16 => bytes
            .chunks_exact(2)
            .position(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7f80 == 0x7f80),
        crate::Codes::F16 => bytes
            .chunks_exact(2)
            .position(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7c00 == 0x7c00),
        // E4M3 has no infinity; S.1111.111 is its NaN.
        crate::Codes::E4M3 => bytes.iter().position(|&b| b & 0x7f == 0x7f),
        // A block's scales can be NaN or infinite (an f16 scale of 0x7c00): decoded, per block.
        crate::Codes::Block(f) => {
            let (bs, ts) = (f.block_size(), f.type_size());
            let mut out = [0f32; crate::gguf::MAX_BLOCK];
            bytes.chunks_exact(ts).enumerate().find_map(|(b, blk)| {
                crate::gguf::dequantize_block(f, blk, &mut out[..bs]);
                out[..bs]
                    .iter()
                    .position(|v| !v.is_finite())
                    .map(|j| b * bs + j)
            })
        }
        _ => None,
    }
}

/// The first `len` stored values of `codes` in `bytes` as f32, exactly (the unscaled codes for
/// quantized codings): a norm weight or bias vector as the kernels take it.
///
/// # Panics
/// When `bytes` holds fewer than `len` values.
pub fn decode_vec(codes: crate::Codes, bytes: &[u8], len: usize) -> Vec<f32> {
    if let crate::Codes::Block(f) = codes {
        let mut out = vec![0f32; len];
        crate::gguf::decode_cols(f, bytes, 0..len, &mut out);
        return out;
    }
    (0..len)
        .map(|j| crate::scalar::code(codes, bytes, j))
        .collect()
}

/// Scale `g` of a row of scales, as f32 (exact for every scale type).
#[inline(always)]
pub fn scale_at(ty: ScaleType, row: &[u8], g: usize) -> f32 {
    match ty {
        ScaleType::F32 => {
            f32::from_le_bytes([row[4 * g], row[4 * g + 1], row[4 * g + 2], row[4 * g + 3]])
        }
        ScaleType::BF16 => bf16_to_f32(u16::from_le_bytes([row[2 * g], row[2 * g + 1]])),
        ScaleType::F16 => f16_to_f32(u16::from_le_bytes([row[2 * g], row[2 * g + 1]])),
        ScaleType::E8M0 => e8m0_to_f32(row[g]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_nan_is_found_and_its_largest_finite_values_are_not() {
        // 0x7e and 0xfe are ±448, the largest finite values; 0x7f and 0xff are NaN.
        assert_eq!(
            first_non_finite(crate::Codes::E4M3, &[0x00, 0x7e, 0xfe]),
            None
        );
        assert_eq!(
            first_non_finite(crate::Codes::E4M3, &[0x38, 0x7e, 0xff]),
            Some(2)
        );
        assert_eq!(first_non_finite(crate::Codes::E4M3, &[0x7f]), Some(0));
        for b in [0x7fu8, 0xff] {
            assert!(crate::scalar::code(crate::Codes::E4M3, &[b], 0).is_nan());
        }
        assert_eq!(crate::scalar::code(crate::Codes::E4M3, &[0x7e], 0), 448.0);
    }

    #[test]
    fn f16_matches_reference_values() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x8001), -(2f32.powi(-24)));
        assert_eq!(f16_to_f32(0x03ff), 1023.0 * 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn f16_agrees_with_f64_formula_everywhere() {
        for h in 0..=u16::MAX {
            let exp = ((h >> 10) & 0x1f) as i32;
            let man = (h & 0x3ff) as f64;
            let s = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
            let v = match exp {
                0 => s * man * 2f64.powi(-24),
                31 => continue,
                e => s * (1.0 + man / 1024.0) * 2f64.powi(e - 15),
            };
            assert_eq!(f16_to_f32(h) as f64, v, "{h:#x}");
        }
    }

    #[test]
    fn e4m3_table_formula() {
        for (i, &v) in E4M3_TABLE.iter().enumerate() {
            let exp = ((i >> 3) & 0xf) as i32;
            let man = (i & 7) as f64;
            let s = if i & 0x80 != 0 { -1.0 } else { 1.0 };
            if exp == 15 && man == 7.0 {
                assert!(v.is_nan());
                continue;
            }
            let want = if exp == 0 {
                s * man * 2f64.powi(-9)
            } else {
                s * (1.0 + man / 8.0) * 2f64.powi(exp - 7)
            };
            assert_eq!(v as f64, want, "{i:#x}");
        }
        assert_eq!(E4M3_TABLE[0x7e], 448.0);
    }

    #[test]
    fn bf16_round_trip() {
        for x in [
            0.0f32,
            1.0,
            -3.5,
            f32::from_bits(0x0001_0000),
            f32::from_bits(0x7f7f_0000),
        ] {
            let b = f32_to_bf16(x);
            assert_eq!(bf16_to_f32(b), x);
        }
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3f80); // ties to even
        assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
    }

    #[test]
    fn e8m0() {
        assert_eq!(e8m0_to_f32(127), 1.0);
        assert_eq!(e8m0_to_f32(128), 2.0);
        assert_eq!(e8m0_to_f32(1), 2f32.powi(-126));
        assert_eq!(e8m0_to_f32(0) as f64, 2f64.powi(-127));
        assert_eq!(e8m0_to_f32(254), 2f32.powi(127));
        assert!(e8m0_to_f32(255).is_nan());
    }
}
