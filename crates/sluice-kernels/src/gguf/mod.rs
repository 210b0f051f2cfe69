//! GGUF (ggml) block formats: dequantization to f32 and the dot product with f32 activations.
//!
//! # The specification
//!
//! [`dequantize_block`] gives, for every format here, exactly the f32 values llama.cpp's gguf-py
//! (`gguf.quants.dequantize`, numpy float32 arithmetic) gives: the same operations in the same
//! order, each rounded once (no fused multiply-add), f16 scales converted to f32 exactly. The
//! tests compare `to_bits()` against fixtures written by gguf-py
//! (`tools/reference/make_gguf_fixtures.py`). The IQ grids are generated from gguf-py's own
//! decoded tables (`grids.rs`).
//!
//! [`dot_row`] is the numeric contract of [`crate::scalar`] applied to the dequantized row:
//! element `j` goes to lane `j mod 16`, `acc = fma(w_j, x_j, acc)` from `+0.0`, a partial last
//! block of 16 padded with zero weights and activations, then the fixed pairwise tree. So
//! `dot_row(f, row, x)` is bit for bit `scalar::dot(&dequantize_row(f, row), x)`, whatever the
//! format, computed block by block without materialising the row.
//!
//! Per element (`d`, `dmin` the block's f16 scales as f32; every product and sum rounded to f32
//! in the order written):
//!
//! | format | block | value |
//! |---|---|---|
//! | F32, F16, BF16 | 1 | the stored value (exact) |
//! | Q8_0 | 32 | `q × d`, q int8 |
//! | Q4_0 / Q5_0 | 32 | `d × (q − 8)` / `d × (q − 16)` |
//! | Q4_1 / Q5_1 | 32 | `d × q + m` |
//! | Q2_K | 256 | `(d × sc) × q − (dmin × m)` per 16 |
//! | Q3_K | 256 | `(d × (sc − 32)) × q`, q in −4..3, per 16 |
//! | Q4_K / Q5_K | 256 | `(d × sc) × q − (dmin × m)` per 32 (6-bit packed sc, m) |
//! | Q6_K | 256 | `(d × sc) × (q − 32)`, sc int8 per 16 |
//! | IQ4_NL / IQ4_XS | 32 / 256 | `d × kv[q]` / `(d × (sc − 32)) × kv[q]` per 32 |
//! | MXFP4 | 32 | `e8m0_half(e) × 2·e2m1[q]` |
//! | IQ2_XXS, IQ2_XS, IQ2_S | 256 | `((d × (0.5 + s)) × 0.25 × g) × ±1` |
//! | IQ3_XXS | 256 | `((d × (0.5 + s)) × 0.5 × g) × ±1` |
//! | IQ3_S | 256 | `(d × (1 + 2s) × g) × ±1` |
//! | IQ1_S, IQ1_M | 256 | `(d × (2s + 1)) × (g + ±0.125)` |
//! | TQ1_0 / TQ2_0 | 256 | `d × (t − 1)`, t a base-3 / 2-bit digit |
//! | NVFP4 | 64 | `ue4m3_half(s) × 2·e2m1[q]` per 16 |

mod fast;
pub(crate) mod grids;

use crate::KernelError;
use crate::decode::{bf16_to_f32, f16_to_f32};
use crate::scalar::{LANES, tree};
use grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS};

/// Elements per super-block of the K and IQ formats (ggml's `QK_K`).
pub const QK_K: usize = 256;

/// The largest block, in elements.
pub const MAX_BLOCK: usize = QK_K;

/// A ggml block format this crate can decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(non_camel_case_types, missing_docs)]
pub enum BlockFormat {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    IQ4_NL,
    IQ4_XS,
    MXFP4,
    IQ2_XXS,
    IQ2_XS,
    IQ2_S,
    IQ3_XXS,
    IQ3_S,
    IQ1_S,
    IQ1_M,
    TQ1_0,
    TQ2_0,
    NVFP4,
}

/// `(format, ggml type id, elements per block, bytes per block)`.
const FORMATS: [(BlockFormat, u32, usize, usize); 26] = {
    use BlockFormat::*;
    [
        (F32, 0, 1, 4),
        (F16, 1, 1, 2),
        (BF16, 30, 1, 2),
        (Q8_0, 8, 32, 34),
        (Q4_0, 2, 32, 18),
        (Q4_1, 3, 32, 20),
        (Q5_0, 6, 32, 22),
        (Q5_1, 7, 32, 24),
        (Q2_K, 10, QK_K, 84),
        (Q3_K, 11, QK_K, 110),
        (Q4_K, 12, QK_K, 144),
        (Q5_K, 13, QK_K, 176),
        (Q6_K, 14, QK_K, 210),
        (IQ4_NL, 20, 32, 18),
        (IQ4_XS, 23, QK_K, 136),
        (MXFP4, 39, 32, 17),
        (IQ2_XXS, 16, QK_K, 66),
        (IQ2_XS, 17, QK_K, 74),
        (IQ2_S, 22, QK_K, 82),
        (IQ3_XXS, 18, QK_K, 98),
        (IQ3_S, 21, QK_K, 110),
        (IQ1_S, 19, QK_K, 50),
        (IQ1_M, 29, QK_K, 56),
        (TQ1_0, 34, QK_K, 54),
        (TQ2_0, 35, QK_K, 66),
        (NVFP4, 40, 64, 36),
    ]
};

impl BlockFormat {
    /// Every format, in the order of the table above.
    pub const ALL: [BlockFormat; 26] = {
        let mut a = [BlockFormat::F32; 26];
        let mut i = 0;
        while i < 26 {
            a[i] = FORMATS[i].0;
            i += 1;
        }
        a
    };

    fn row(self) -> &'static (BlockFormat, u32, usize, usize) {
        &FORMATS[self as usize]
    }

    /// The format of ggml type `id`, if this crate decodes it.
    pub fn from_ggml_id(id: u32) -> Option<BlockFormat> {
        FORMATS.iter().find(|f| f.1 == id).map(|f| f.0)
    }

    /// The ggml type id.
    pub fn ggml_id(self) -> u32 {
        self.row().1
    }

    /// The ggml type, as the GGUF reader names it.
    pub fn ggml_type(self) -> sluice_format::gguf::GgmlType {
        use sluice_format::gguf::GgmlType as G;
        match self {
            BlockFormat::F32 => G::F32,
            BlockFormat::F16 => G::F16,
            BlockFormat::BF16 => G::BF16,
            BlockFormat::Q8_0 => G::Q8_0,
            BlockFormat::Q4_0 => G::Q4_0,
            BlockFormat::Q4_1 => G::Q4_1,
            BlockFormat::Q5_0 => G::Q5_0,
            BlockFormat::Q5_1 => G::Q5_1,
            BlockFormat::Q2_K => G::Q2_K,
            BlockFormat::Q3_K => G::Q3_K,
            BlockFormat::Q4_K => G::Q4_K,
            BlockFormat::Q5_K => G::Q5_K,
            BlockFormat::Q6_K => G::Q6_K,
            BlockFormat::IQ4_NL => G::IQ4_NL,
            BlockFormat::IQ4_XS => G::IQ4_XS,
            BlockFormat::MXFP4 => G::MXFP4,
            BlockFormat::IQ2_XXS => G::IQ2_XXS,
            BlockFormat::IQ2_XS => G::IQ2_XS,
            BlockFormat::IQ2_S => G::IQ2_S,
            BlockFormat::IQ3_XXS => G::IQ3_XXS,
            BlockFormat::IQ3_S => G::IQ3_S,
            BlockFormat::IQ1_S => G::IQ1_S,
            BlockFormat::IQ1_M => G::IQ1_M,
            BlockFormat::TQ1_0 => G::TQ1_0,
            BlockFormat::TQ2_0 => G::TQ2_0,
            BlockFormat::NVFP4 => G::NVFP4,
        }
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        self.row().2
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.row().3
    }

    /// Bytes for a row of `cols` elements: `None` unless `cols` is a whole number of blocks.
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        cols.is_multiple_of(self.block_size())
            .then(|| (cols / self.block_size()).checked_mul(self.type_size()))
            .flatten()
    }
}

/// IQ4_NL's non-linear 4-bit values.
pub const IQ4_KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// MXFP4's E2M1 values, doubled (gguf-py's `MXFP4.kvalues`).
pub const MXFP4_KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half of an E8M0 scale, `2^(e − 128)`, as ggml's `ggml_e8m0_to_fp32_half` (exact; `e = 0`
/// and `1` give subnormals, 255 gives `2^127`).
#[inline(always)]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits(((e as u32) - 1) << 23)
    }
}

/// Half of an unsigned E4M3 scale (bias 7, bit 7 ignored) as gguf-py's `NVFP4.ue4m3_to_fp32`
/// computes it: `0` and `0x7f` give 0, exponent 0 gives `m × 2^-9`, otherwise
/// `(1 + m/8) × 2^(e − 7)`; then × 0.5. Every step is exact.
#[inline(always)]
pub fn ue4m3_to_f32_half(x: u8) -> f32 {
    if x == 0 || x == 0x7f {
        return 0.0;
    }
    let e = ((x >> 3) & 15) as i32;
    let m = (x & 7) as f32;
    let v = if e == 0 {
        m * f32::from_bits(118 << 23) // 2^-9
    } else {
        (1.0 + m / 8.0) * f32::from_bits(((e - 7 + 127) as u32) << 23)
    };
    v * 0.5
}

#[inline(always)]
pub(crate) fn h(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

#[inline(always)]
pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

#[inline(always)]
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// IQ1's `±0.125`: `+` when `set` is false. Built from its bits, without a branch: the bit is
/// random, and a branch on it mispredicts about half the time (IQ1_M: 10.6 against 3.7 ms per
/// one-thread 4096² product).
#[inline(always)]
pub(crate) fn delta(set: bool) -> f32 {
    f32::from_bits(0x3e00_0000 | (u32::from(set) << 31))
}

/// IQ2's group scale: `(d × (0.5 + s)) × 0.25`.
#[inline(always)]
pub(crate) fn iq2_scale(d: f32, s: u32) -> f32 {
    d * (0.5 + s as f32) * 0.25
}

/// Grid index of group `k` of an IQ2_S block: `qs[k]` and two high bits from `qh`.
#[inline(always)]
pub(crate) fn iq2s_index(qs: &[u8], qh: &[u8], k: usize) -> usize {
    qs[k] as usize | ((((qh[k / 4] >> (2 * (k % 4))) & 3) as usize) << 8)
}

/// Grid index of row `k` (of 4 values) of an IQ3_S block: `qs[k]` and one high bit from `qh`.
#[inline(always)]
pub(crate) fn iq3s_index(qs: &[u8], qh: &[u8], k: usize) -> usize {
    qs[k] as usize | ((((qh[k / 8] >> (k % 8)) & 1) as usize) << 8)
}

/// The f16 bits of an IQ1_M block's scale, spread over the top nibbles of its four scale words.
#[inline(always)]
pub(crate) fn iq1m_d_bits(sc: &[u16; 4]) -> u16 {
    ((sc[0] & 0xf000) >> 12) | ((sc[1] & 0xf000) >> 8) | ((sc[2] & 0xf000) >> 4) | (sc[3] & 0xf000)
}

/// `+1.0` or `−1.0` as bit `k` of `bits` is clear or set — without a branch: the signs of the
/// IQ formats are random bits, and a branch on each mispredicts about half the time.
#[inline(always)]
pub(crate) fn sign(bits: u8, k: usize) -> f32 {
    f32::from_bits(0x3f80_0000 | ((((bits >> k) & 1) as u32) << 31))
}

/// Q4_K / Q5_K: the 6-bit scale and min of sub-block `i` (0..8) from the 12 packed bytes.
#[inline(always)]
pub(crate) fn scale_min_k4(s: &[u8], i: usize) -> (u8, u8) {
    if i < 4 {
        (s[i] & 63, s[4 + i] & 63)
    } else {
        (
            (s[8 + i - 4] & 0x0f) | ((s[i - 4] >> 2) & 0x30),
            (s[8 + i - 4] >> 4) | ((s[i] >> 2) & 0x30),
        )
    }
}

/// Dequantizes one block: `block` holds `f.type_size()` bytes, `out` receives
/// `f.block_size()` values.
///
/// # Panics
/// When the lengths are not those.
pub fn dequantize_block(f: BlockFormat, b: &[u8], out: &mut [f32]) {
    assert_eq!(b.len(), f.type_size(), "{f:?} block of {} bytes", b.len());
    assert_eq!(out.len(), f.block_size(), "{f:?} output of {}", out.len());
    use BlockFormat::*;
    match f {
        F32 => out[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        F16 => out[0] = h(b, 0),
        BF16 => out[0] = bf16_to_f32(u16_at(b, 0)),
        Q8_0 => {
            let d = h(b, 0);
            for (j, o) in out.iter_mut().enumerate() {
                *o = (b[2 + j] as i8 as f32) * d;
            }
        }
        Q4_0 | IQ4_NL => {
            let d = h(b, 0);
            for (j, o) in out.iter_mut().enumerate() {
                let q = (b[2 + j % 16] >> (4 * (j / 16))) & 15;
                *o = if f == Q4_0 {
                    d * ((q as i32 - 8) as f32)
                } else {
                    d * (IQ4_KVALUES[q as usize] as f32)
                };
            }
        }
        Q4_1 => {
            let (d, m) = (h(b, 0), h(b, 2));
            for (j, o) in out.iter_mut().enumerate() {
                let q = (b[4 + j % 16] >> (4 * (j / 16))) & 15;
                *o = d * (q as f32) + m;
            }
        }
        Q5_0 => {
            let d = h(b, 0);
            let qh = u32_at(b, 2);
            for (j, o) in out.iter_mut().enumerate() {
                let q = ((b[6 + j % 16] >> (4 * (j / 16))) & 15) as u32 | (((qh >> j) & 1) << 4);
                *o = d * ((q as i32 - 16) as f32);
            }
        }
        Q5_1 => {
            let (d, m) = (h(b, 0), h(b, 2));
            let qh = u32_at(b, 4);
            for (j, o) in out.iter_mut().enumerate() {
                let q = ((b[8 + j % 16] >> (4 * (j / 16))) & 15) as u32 | (((qh >> j) & 1) << 4);
                *o = d * (q as f32) + m;
            }
        }
        Q2_K => {
            let (sc, qs) = (&b[0..16], &b[16..80]);
            let (d, dmin) = (h(b, 80), h(b, 82));
            for (j, o) in out.iter_mut().enumerate() {
                let g = j / 16;
                let dl = d * ((sc[g] & 15) as f32);
                let ml = dmin * ((sc[g] >> 4) as f32);
                let q = (qs[(j / 128) * 32 + j % 32] >> (2 * ((j % 128) / 32))) & 3;
                *o = dl * (q as f32) - ml;
            }
        }
        Q3_K => {
            let (hm, qs, s) = (&b[0..32], &b[32..96], &b[96..108]);
            let d = h(b, 108);
            for (j, o) in out.iter_mut().enumerate() {
                let i = j / 16;
                let lo = (s[i % 8] >> (4 * (i / 8))) & 15;
                let hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
                let sc = (lo | (hi << 4)) as i32 - 32;
                let dl = d * (sc as f32);
                let ql = (qs[(j / 128) * 32 + j % 32] >> (2 * ((j % 128) / 32))) & 3;
                let high = (hm[j % 32] >> (j / 32)) & 1;
                let q = ql as i32 - if high == 0 { 4 } else { 0 };
                *o = dl * (q as f32);
            }
        }
        Q4_K | Q5_K => {
            let (d, dmin) = (h(b, 0), h(b, 2));
            let s = &b[4..16];
            let (qh, qs) = if f == Q5_K {
                (&b[16..48], &b[48..176])
            } else {
                (&b[0..0], &b[16..144])
            };
            for (j, o) in out.iter_mut().enumerate() {
                let (sc, m) = scale_min_k4(s, j / 32);
                let dl = d * (sc as f32);
                let dm = dmin * (m as f32);
                let mut q = (qs[(j / 64) * 32 + j % 32] >> (4 * ((j % 64) / 32))) & 15;
                if f == Q5_K {
                    q |= ((qh[j % 32] >> (j / 32)) & 1) << 4;
                }
                *o = dl * (q as f32) - dm;
            }
        }
        Q6_K => {
            let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
            let d = h(b, 208);
            for (j, o) in out.iter_mut().enumerate() {
                let (half, k) = (j / 128, j % 128);
                let lo = (ql[half * 64 + k % 64] >> (4 * (k / 64))) & 15;
                let hi = (qh[half * 32 + k % 32] >> (2 * (k / 32))) & 3;
                let q = (lo | (hi << 4)) as i32 - 32;
                let dl = d * (sc[j / 16] as i8 as f32);
                *o = dl * (q as f32);
            }
        }
        IQ4_XS => {
            let d = h(b, 0);
            let sh = u16_at(b, 2);
            let (sl, qs) = (&b[4..8], &b[8..136]);
            for (j, o) in out.iter_mut().enumerate() {
                let i = j / 32;
                let lo = (sl[i / 2] >> (4 * (i % 2))) & 15;
                let hi = ((sh >> (2 * i)) & 3) as u8;
                let dl = d * (((lo | (hi << 4)) as i32 - 32) as f32);
                let k = j % 32;
                let q = (qs[i * 16 + k % 16] >> (4 * (k / 16))) & 15;
                *o = dl * (IQ4_KVALUES[q as usize] as f32);
            }
        }
        MXFP4 => {
            let d = e8m0_to_f32_half(b[0]);
            for (j, o) in out.iter_mut().enumerate() {
                let q = (b[1 + j % 16] >> (4 * (j / 16))) & 15;
                *o = d * (MXFP4_KVALUES[q as usize] as f32);
            }
        }
        IQ2_XXS => {
            let d = h(b, 0);
            for s in 0..8 {
                let a0 = 2 + 8 * s;
                let aux1 = u32_at(b, a0 + 4);
                let db = iq2_scale(d, aux1 >> 28);
                for l in 0..4 {
                    let grid = &IQ2XXS_GRID[b[a0 + l] as usize];
                    let signs = KSIGNS[((aux1 >> (7 * l)) & 127) as usize];
                    for k in 0..8 {
                        out[32 * s + 8 * l + k] = db * (grid[k] as f32) * sign(signs, k);
                    }
                }
            }
        }
        IQ2_XS => {
            let d = h(b, 0);
            let sc = &b[66..74];
            for (i, o16) in out.chunks_exact_mut(16).enumerate() {
                let s = (sc[i / 2] >> (4 * (i % 2))) & 15;
                let db = iq2_scale(d, s.into());
                for (half, o8) in o16.chunks_exact_mut(8).enumerate() {
                    let q = u16_at(b, 2 + 2 * (2 * i + half));
                    let grid = &IQ2XS_GRID[(q & 511) as usize];
                    let signs = KSIGNS[(q >> 9) as usize];
                    for k in 0..8 {
                        o8[k] = db * (grid[k] as f32) * sign(signs, k);
                    }
                }
            }
        }
        IQ2_S => {
            let d = h(b, 0);
            let (qs, signs, qh, sc) = (&b[2..34], &b[34..66], &b[66..74], &b[74..82]);
            for (j, o) in out.iter_mut().enumerate() {
                let i = j / 16;
                let s = (sc[i / 2] >> (4 * (i % 2))) & 15;
                let db = iq2_scale(d, s.into());
                let k = j / 8;
                let idx = iq2s_index(qs, qh, k);
                *o = db * (IQ2S_GRID[idx][j % 8] as f32) * sign(signs[k], j % 8);
            }
        }
        IQ3_XXS => {
            let d = h(b, 0);
            let qs = &b[2..66];
            for (j, o) in out.iter_mut().enumerate() {
                let aux = u32_at(b, 66 + 4 * (j / 32));
                let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
                let l = (j % 32) / 8;
                let signs = KSIGNS[((aux >> (7 * l)) & 127) as usize];
                let g = IQ3XXS_GRID[qs[j / 4] as usize][j % 4];
                *o = db * (g as f32) * sign(signs, j % 8);
            }
        }
        IQ3_S => {
            let d = h(b, 0);
            let (qs, qh, signs, sc) = (&b[2..66], &b[66..74], &b[74..106], &b[106..110]);
            for (j, o) in out.iter_mut().enumerate() {
                let i = j / 32;
                let s = (sc[i / 2] >> (4 * (i % 2))) & 15;
                let db = d * ((1 + 2 * s) as f32);
                let k = j / 4;
                let idx = iq3s_index(qs, qh, k);
                *o = db * (IQ3S_GRID[idx][j % 4] as f32) * sign(signs[j / 8], j % 8);
            }
        }
        IQ1_S => {
            let d = h(b, 0);
            let qs = &b[2..34];
            for (j, o) in out.iter_mut().enumerate() {
                let qh = u16_at(b, 34 + 2 * (j / 32));
                let dl = d * ((2 * ((qh >> 12) & 7) + 1) as f32);
                let delta = delta(qh & 0x8000 != 0);
                let k = j / 8;
                let hk = u16_at(b, 34 + 2 * (k / 4));
                let idx = qs[k] as usize | ((((hk >> (3 * (k % 4))) & 7) as usize) << 8);
                *o = dl * (IQ1S_GRID[idx][j % 8] as f32 + delta);
            }
        }
        IQ1_M => {
            let (qs, qh) = (&b[0..32], &b[32..48]);
            let sc = [u16_at(b, 48), u16_at(b, 50), u16_at(b, 52), u16_at(b, 54)];
            let d = f16_to_f32(iq1m_d_bits(&sc));
            for (j, o) in out.iter_mut().enumerate() {
                let i = j / 16;
                let s = (sc[i / 4] >> (3 * (i % 4))) & 7;
                let dl = d * ((2 * s + 1) as f32);
                let k = j / 8;
                let nib = (qh[k / 2] >> (4 * (k % 2))) & 15;
                let idx = qs[k] as usize | (((nib & 7) as usize) << 8);
                let delta = delta(nib & 8 != 0);
                *o = dl * (IQ1S_GRID[idx][j % 8] as f32 + delta);
            }
        }
        TQ1_0 => {
            // Base-3 digits: byte × 3^p (mod 256, as uint8 arithmetic wraps), then the top
            // two bits of × 3 give the digit 0..2.
            const POW3: [u8; 5] = [1, 3, 9, 27, 81];
            let d = h(b, 52);
            for (j, o) in out.iter_mut().enumerate() {
                let v = if j < 160 {
                    b[j % 32].wrapping_mul(POW3[j / 32])
                } else if j < 240 {
                    let k = j - 160;
                    b[32 + k % 16].wrapping_mul(POW3[k / 16])
                } else {
                    let k = j - 240;
                    b[48 + k % 4].wrapping_mul(POW3[k / 4])
                };
                let q = (((v as u16) * 3) >> 8) as i32 - 1;
                *o = d * (q as f32);
            }
        }
        NVFP4 => {
            for (s, o16) in out.chunks_exact_mut(16).enumerate() {
                let d = ue4m3_to_f32_half(b[s]);
                for (j, o) in o16.iter_mut().enumerate() {
                    let q = (b[4 + 8 * s + j % 8] >> (4 * (j / 8))) & 15;
                    *o = d * (MXFP4_KVALUES[q as usize] as f32);
                }
            }
        }
        TQ2_0 => {
            let d = h(b, 64);
            for (j, o) in out.iter_mut().enumerate() {
                let q = (b[(j / 128) * 32 + j % 32] >> (2 * ((j % 128) / 32))) & 3;
                *o = d * ((q as i32 - 1) as f32);
            }
        }
    }
}

fn check_row(f: BlockFormat, row: &[u8], cols: usize) -> Result<(), KernelError> {
    match f.row_bytes(cols) {
        Some(n) if n == row.len() => Ok(()),
        Some(n) => Err(KernelError::Layout(format!(
            "{f:?} row of {cols} elements needs {n} bytes, got {}",
            row.len()
        ))),
        None => Err(KernelError::Layout(format!(
            "{f:?} row of {cols} elements is not a whole number of {}-element blocks",
            f.block_size()
        ))),
    }
}

/// Columns `cols` of a stored row, dequantized into `out` (`cols.len()` values): only the
/// blocks the range touches are decoded.
///
/// # Panics
/// When `row` holds fewer blocks than `cols` reaches or `out.len() != cols.len()`.
pub fn decode_cols(f: BlockFormat, row: &[u8], cols: std::ops::Range<usize>, out: &mut [f32]) {
    assert_eq!(
        out.len(),
        cols.len(),
        "decode_cols: output of {}",
        out.len()
    );
    let (bs, ts) = (f.block_size(), f.type_size());
    let mut buf = [0f32; MAX_BLOCK];
    let mut j = cols.start;
    while j < cols.end {
        let b = j / bs;
        dequantize_block(f, &row[b * ts..(b + 1) * ts], &mut buf[..bs]);
        let end = ((b + 1) * bs).min(cols.end);
        out[j - cols.start..end - cols.start].copy_from_slice(&buf[j - b * bs..end - b * bs]);
        j = end;
    }
}

/// [`fast::decode_blocks`] on `k`'s ISA: the AVX2 decoders where `k` has AVX2 and the format
/// has one, the same bits either way.
pub(crate) fn decode_blocks_with(k: &crate::Kernels, f: BlockFormat, row: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if k.isa() != crate::Isa::Scalar {
        fast::check_blocks(f, row, out);
        // SAFETY: a `Kernels` of an x86 ISA other than scalar proves AVX2 (AVX-512 machines
        // have it too); the lengths are checked above.
        if unsafe { crate::x86::gguf::decode_blocks(f, row, out) } {
            return;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = k;
    fast::decode_blocks(f, row, out)
}

thread_local! {
    /// Dequantized rows and their products, per thread, reused by every call ([`matmul`]).
    static ROW: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Rows of a block matrix decoded together before they are multiplied.
const TILE: usize = 64;

/// [`crate::Kernels::matmul`] of a [`crate::Codes::Block`] matrix: [`TILE`] rows at a time (in
/// the matrix's row order, see [`crate::Matrix::with_rope_rows`]) are dequantized once into a
/// per-thread scratch and multiplied with every activation row as the dense F32 matrix they
/// are, by the ISA's tiled product — the bits of [`crate::scalar::matmul`], the decoding shared
/// by the batch. One activation row of Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K or Q6_K on AVX-512
/// is multiplied with the weights decoded in registers instead (`x86::gguf::matvec`), with the
/// same bits.
pub(crate) fn matmul(
    k: &crate::Kernels,
    f: BlockFormat,
    m: &crate::Matrix<'_>,
    x: &[f32],
    y: &mut [f32],
    rows: std::ops::Range<usize>,
) {
    let (nr, cols) = (rows.len(), m.cols());
    if nr == 0 || cols == 0 {
        return crate::scalar::matmul(m, x, y, rows);
    }
    let batch = x.len() / cols;
    #[cfg(target_arch = "x86_64")]
    if batch == 1 && k.isa() == crate::Isa::Avx512 && crate::x86::gguf::fused(f) {
        // SAFETY: a `Kernels` of AVX-512 proves the ISA; the shapes are those of the checked
        // call (one activation row, `y` one value per row).
        unsafe { crate::x86::gguf::matvec(f, m, x, y, rows) };
        return;
    }
    ROW.with_borrow_mut(|(w, t)| {
        w.resize(TILE * cols, 0.0);
        t.resize(TILE * batch, 0.0);
        let mut r0 = rows.start;
        while r0 < rows.end {
            let n = TILE.min(rows.end - r0);
            for (i, wr) in w.chunks_exact_mut(cols).take(n).enumerate() {
                decode_blocks_with(k, f, m.row(r0 + i), wr);
            }
            let bytes: &[u8] = bytemuck::cast_slice(&w[..n * cols]);
            // The shapes are those of the checked call.
            let Ok(dense) = crate::Matrix::dense(crate::Codes::F32, bytes, n, cols) else {
                return;
            };
            k.matmul(&dense, x, &mut t[..batch * n], 0..n);
            let at = r0 - rows.start;
            for (tb, yb) in t.chunks_exact(n).zip(y.chunks_exact_mut(nr)) {
                yb[at..at + n].copy_from_slice(tb);
            }
            r0 += n;
        }
    });
}

/// Dequantizes a row: `out.len()` elements (a multiple of the block size) from `row`.
pub fn dequantize_row(f: BlockFormat, row: &[u8], out: &mut [f32]) -> Result<(), KernelError> {
    check_row(f, row, out.len())?;
    fast::decode_blocks(f, row, out);
    Ok(())
}

/// `x · dequant(row)` by the numeric contract (see the module documentation): bit for bit
/// `scalar::dot(&dequantized, x)`. `x.len()` is the row length.
pub fn dot_row(f: BlockFormat, row: &[u8], x: &[f32]) -> Result<f32, KernelError> {
    check_row(f, row, x.len())?;
    let (bs, ts) = (f.block_size(), f.type_size());
    // Decode a chunk of whole blocks (256 elements, or fewer at the end), a multiple of 16
    // elements except possibly the last chunk of a 1-element-block format.
    let per_chunk = MAX_BLOCK / bs;
    let mut buf = [0f32; MAX_BLOCK];
    let mut acc = [0f32; LANES];
    for (c, bytes) in row.chunks(per_chunk * ts).enumerate() {
        let n = bytes.len() / ts * bs;
        for (blk, o) in bytes.chunks_exact(ts).zip(buf[..n].chunks_exact_mut(bs)) {
            dequantize_block(f, blk, o);
        }
        let xs = &x[c * MAX_BLOCK..c * MAX_BLOCK + n];
        for j0 in (0..n).step_by(LANES) {
            for (i, a) in acc.iter_mut().enumerate() {
                let j = j0 + i;
                let (w, xv) = if j < n { (buf[j], xs[j]) } else { (0.0, 0.0) };
                *a = w.mul_add(xv, *a);
            }
        }
    }
    Ok(tree(&acc))
}

/// A borrowed weight matrix stored as GGUF blocks: `rows` rows of `cols` elements, row-major
/// (ggml's layout: `ne[0]` is `cols`, each row a whole number of blocks). This is how a loader
/// multiplies packed GGUF weights — a cached expert keeps its packed size — without expanding
/// them to f32.
#[derive(Clone, Copy, Debug)]
pub struct BlockMatrix<'a> {
    format: BlockFormat,
    data: &'a [u8],
    rows: usize,
    cols: usize,
    row_bytes: usize,
}

impl<'a> BlockMatrix<'a> {
    /// A matrix over `data`, which must hold exactly `rows` rows of `cols` elements.
    pub fn new(
        format: BlockFormat,
        data: &'a [u8],
        rows: usize,
        cols: usize,
    ) -> Result<Self, KernelError> {
        let row_bytes = format.row_bytes(cols).ok_or_else(|| {
            KernelError::Layout(format!(
                "{format:?}: {cols} columns are not a whole number of {}-element blocks",
                format.block_size()
            ))
        })?;
        let want = row_bytes.checked_mul(rows);
        if want != Some(data.len()) {
            return Err(KernelError::Layout(format!(
                "{format:?} [{rows}, {cols}] needs {want:?} bytes, got {}",
                data.len()
            )));
        }
        Ok(BlockMatrix {
            format,
            data,
            rows,
            cols,
            row_bytes,
        })
    }

    /// The block format.
    pub fn format(&self) -> BlockFormat {
        self.format
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// [`BlockMatrix::matmul`] with the dot products on `k`'s ISA: each row is dequantized
    /// once (into a scratch row of `cols` values, never the whole matrix) and dotted with every
    /// activation row by [`crate::Kernels::dot`], which returns the contract's bits on every
    /// ISA — so the result is [`BlockMatrix::matmul`]'s, bit for bit, and the decoding is shared
    /// across the batch.
    ///
    /// # Panics
    /// As [`BlockMatrix::matmul`].
    pub fn matmul_with(
        &self,
        k: &crate::Kernels,
        x: &[f32],
        y: &mut [f32],
        rows: std::ops::Range<usize>,
    ) {
        let (nr, cols) = self.check_shapes(x, y, &rows);
        if nr == 0 || self.cols == 0 {
            y.iter_mut().for_each(|v| *v = 0.0);
            return;
        }
        let mut w = vec![0f32; self.cols];
        for (i, r) in rows.enumerate() {
            for (j, b) in self
                .row(r)
                .chunks_exact(self.format.type_size())
                .enumerate()
            {
                let bs = self.format.block_size();
                dequantize_block(self.format, b, &mut w[j * bs..(j + 1) * bs]);
            }
            for (xb, yb) in x.chunks_exact(cols).zip(y.chunks_exact_mut(nr)) {
                yb[i] = k.dot(&w, xb);
            }
        }
    }

    /// The same matrix as a dense [`crate::Matrix`] when the format is F32, F16 or BF16, so that
    /// [`crate::Kernels::matmul`] (SIMD) can multiply it: the weights are exact, so it gives the
    /// bits of [`BlockMatrix::matmul`] on every ISA. `None` for block formats.
    pub fn dense_view(&self) -> Option<crate::Matrix<'a>> {
        let codes = match self.format {
            BlockFormat::F32 => crate::Codes::F32,
            BlockFormat::F16 => crate::Codes::F16,
            BlockFormat::BF16 => crate::Codes::BF16,
            _ => return None,
        };
        crate::Matrix::dense(codes, self.data, self.rows, self.cols).ok()
    }

    /// The rows asked for and the activation width, after checking the shapes of a product
    /// (the panics documented on [`BlockMatrix::matmul`]).
    fn check_shapes(&self, x: &[f32], y: &[f32], rows: &std::ops::Range<usize>) -> (usize, usize) {
        assert!(
            rows.start <= rows.end && rows.end <= self.rows,
            "rows {rows:?}"
        );
        let nr = rows.len();
        let cols = self.cols.max(1);
        assert!(x.len().is_multiple_of(cols), "activations of {}", x.len());
        assert_eq!(y.len(), x.len() / cols * nr, "output of {}", y.len());
        (nr, cols)
    }

    /// The stored bytes of row `r`.
    pub fn row(&self, r: usize) -> &'a [u8] {
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// `y[b, r − rows.start] = row r · x[b]` for every activation row `b` (of `cols` values) and
    /// `r` in `rows`, each by [`dot_row`]: the result does not depend on the batch or the range.
    ///
    /// # Panics
    /// When `x.len()` is not a multiple of `cols`, `y.len()` is not `b × rows.len()`, or `rows`
    /// runs past the matrix.
    pub fn matmul(&self, x: &[f32], y: &mut [f32], rows: std::ops::Range<usize>) {
        let (nr, cols) = self.check_shapes(x, y, &rows);
        if nr == 0 {
            return;
        }
        for (xb, yb) in x.chunks_exact(cols).zip(y.chunks_exact_mut(nr)) {
            for (k, r) in rows.clone().enumerate() {
                // Lengths were checked at construction and above.
                yb[k] = dot_row(self.format, self.row(r), xb).unwrap_or(f32::NAN);
            }
        }
    }
}

#[cfg(test)]
mod tests;
