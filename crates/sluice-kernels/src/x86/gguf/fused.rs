//! Batch-1 products over GGUF blocks with AVX-512: each row's blocks decoded in registers and
//! multiplied with the activations at once, by the specification's operations in its order.

use super::*;

/// Rows of one batch-1 product computed together (independent accumulators for the FMA
/// pipeline; they share the activation loads).
const FUSED_ROWS: usize = 4;

/// 16 bytes at `p` zero- or sign-extended to 16 32-bit lanes.
///
/// # Safety
/// AVX-512 F is available; `p` is valid for 16 reads.
#[inline(always)]
unsafe fn u8x16(p: *const u8) -> __m512i {
    // SAFETY: AVX-512F is available and `p` is valid for 16 bytes (this function's contract).
    unsafe { _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast())) }
}

/// A block format the fused one-row product decodes into registers: the per-block factors as
/// the specification computes them, and chunk `c` (columns `16c..16c + 16`) of a block by the
/// specification's operations in its order (as the AVX2 decoders above).
trait Fused {
    const BS: usize;
    const TS: usize;
    /// The block's factors ([`Fused::chunk`] reads them).
    ///
    /// # Safety
    /// F16C is available.
    unsafe fn scales(b: &[u8]) -> [f32; 16];
    /// # Safety
    /// AVX-512 F is available; `b` points at a whole block; `c < BS / 16`.
    unsafe fn chunk(b: *const u8, c: usize, s: &[f32; 16]) -> __m512;
}

struct FQ8_0;
impl Fused for FQ8_0 {
    const BS: usize = 32;
    const TS: usize = 34;
    #[inline(always)]
    unsafe fn scales(b: &[u8]) -> [f32; 16] {
        // SAFETY: F16C is available (this function's contract).
        [unsafe { hc(b, 0) }; 16]
    }
    #[inline(always)]
    unsafe fn chunk(b: *const u8, c: usize, s: &[f32; 16]) -> __m512 {
        // SAFETY: the block's 32 codes are at bytes 2..34 (this function's contract).
        unsafe {
            let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(2 + 16 * c).cast()));
            _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(s[0]))
        }
    }
}

struct FQ4K;
impl Fused for FQ4K {
    const BS: usize = 256;
    const TS: usize = 144;
    /// `d × scale` of the 8 sub-blocks, then `dmin × min`.
    #[inline(always)]
    unsafe fn scales(b: &[u8]) -> [f32; 16] {
        // SAFETY: F16C is available (this function's contract).
        let (d, dmin) = unsafe { (hc(b, 0), hc(b, 2)) };
        let mut s = [0f32; 16];
        for i in 0..8 {
            let (sc, m) = scale_min_k4(&b[4..16], i);
            s[i] = d * (sc as f32);
            s[8 + i] = dmin * (m as f32);
        }
        s
    }
    #[inline(always)]
    unsafe fn chunk(b: *const u8, c: usize, s: &[f32; 16]) -> __m512 {
        // Sub-block `sb` = c / 2: the low nibbles of pair `sb / 2` for even `sb`, the high for
        // odd; `c % 2` the pair's first or second 16 bytes.
        let sb = c / 2;
        // SAFETY: the codes are bytes 16..144 of the block (this function's contract).
        unsafe {
            let q = u8x16(b.add(16 + 32 * (sb / 2) + 16 * (c % 2)));
            let q = if sb.is_multiple_of(2) {
                _mm512_and_si512(q, _mm512_set1_epi32(15))
            } else {
                _mm512_srli_epi32::<4>(q)
            };
            let v = _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(s[sb]));
            _mm512_sub_ps(v, _mm512_set1_ps(s[8 + sb]))
        }
    }
}

struct FQ6K;
impl Fused for FQ6K {
    const BS: usize = 256;
    const TS: usize = 210;
    /// `d × scale` of the 16 groups.
    #[inline(always)]
    unsafe fn scales(b: &[u8]) -> [f32; 16] {
        // SAFETY: F16C is available (this function's contract).
        let d = unsafe { hc(b, 208) };
        std::array::from_fn(|i| d * (b[192 + i] as i8 as f32))
    }
    #[inline(always)]
    unsafe fn chunk(b: *const u8, c: usize, s: &[f32; 16]) -> __m512 {
        // c = 8·half + 2·k + g (see `fast::q6_k`).
        let (half, k, g) = (c / 8, (c % 8) / 2, c % 2);
        // SAFETY: `ql` is bytes 0..128 of the block, `qh` 128..192 (this function's contract).
        unsafe {
            let lo = u8x16(b.add(64 * half + 32 * (k % 2) + 16 * g));
            let lo = match k / 2 {
                0 => _mm512_and_si512(lo, _mm512_set1_epi32(15)),
                _ => _mm512_srli_epi32::<4>(lo),
            };
            // The two high bits of group k, moved to bits 4 and 5.
            let hi = u8x16(b.add(128 + 32 * half + 16 * g));
            let hi = match k {
                0 => _mm512_slli_epi32::<4>(hi),
                1 => _mm512_slli_epi32::<2>(hi),
                2 => hi,
                _ => _mm512_srli_epi32::<2>(hi),
            };
            let q = _mm512_or_si512(lo, _mm512_and_si512(hi, _mm512_set1_epi32(0x30)));
            let x = _mm512_sub_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(32.0));
            _mm512_mul_ps(x, _mm512_set1_ps(s[c]))
        }
    }
}

/// The low (`c` = 0) or high (`c` = 1) nibbles of the 16 bytes at `p`, one per lane.
///
/// # Safety
/// AVX-512 F is available; `p` is valid for 16 reads.
#[inline(always)]
unsafe fn nibble16(p: *const u8, c: usize) -> __m512i {
    // SAFETY: passed on (this function's contract).
    unsafe {
        let q = u8x16(p);
        if c == 0 {
            _mm512_and_si512(q, _mm512_set1_epi32(15))
        } else {
            _mm512_srli_epi32::<4>(q)
        }
    }
}

/// Bits `from..from + 16` of `bits`, one per lane, moved to bit 4.
///
/// # Safety
/// AVX-512 F is available.
#[inline(always)]
unsafe fn bit4x16(bits: u32, from: u32) -> __m512i {
    // SAFETY: AVX-512F is available (this function's contract).
    unsafe {
        let at = _mm512_add_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(from as i32),
        );
        let b = _mm512_srlv_epi32(_mm512_set1_epi32(bits as i32), at);
        _mm512_slli_epi32::<4>(_mm512_and_si512(b, _mm512_set1_epi32(1)))
    }
}

struct FQ4_0;
impl Fused for FQ4_0 {
    const BS: usize = 32;
    const TS: usize = 18;
    #[inline(always)]
    unsafe fn scales(b: &[u8]) -> [f32; 16] {
        // SAFETY: F16C is available (this function's contract).
        [unsafe { hc(b, 0) }; 16]
    }
    #[inline(always)]
    unsafe fn chunk(b: *const u8, c: usize, s: &[f32; 16]) -> __m512 {
        // SAFETY: the codes are bytes 2..18 of the block (this function's contract).
        unsafe {
            let q = _mm512_cvtepi32_ps(nibble16(b.add(2), c));
            _mm512_mul_ps(_mm512_sub_ps(q, _mm512_set1_ps(8.0)), _mm512_set1_ps(s[0]))
        }
    }
}

struct FQ4_1;
impl Fused for FQ4_1 {
    const BS: usize = 32;
    const TS: usize = 20;
    /// `d`, then `m`.
    #[inline(always)]
    unsafe fn scales(b: &[u8]) -> [f32; 16] {
        let mut s = [0f32; 16];
        // SAFETY: F16C is available (this function's contract).
        (s[0], s[1]) = unsafe { (hc(b, 0), hc(b, 2)) };
        s
    }
    #[inline(always)]
    unsafe fn chunk(b: *const u8, c: usize, s: &[f32; 16]) -> __m512 {
        // SAFETY: the codes are bytes 4..20 of the block (this function's contract).
        unsafe {
            let q = _mm512_cvtepi32_ps(nibble16(b.add(4), c));
            _mm512_add_ps(_mm512_mul_ps(q, _mm512_set1_ps(s[0])), _mm512_set1_ps(s[1]))
        }
    }
}

struct FQ5_0;
impl Fused for FQ5_0 {
    const BS: usize = 32;
    const TS: usize = 22;
    /// `d`, then the fifth bits (a u32's bit pattern).
    #[inline(always)]
    unsafe fn scales(b: &[u8]) -> [f32; 16] {
        let mut s = [0f32; 16];
        // SAFETY: F16C is available (this function's contract).
        s[0] = unsafe { hc(b, 0) };
        s[1] = f32::from_bits(u32_at(b, 2));
        s
    }
    #[inline(always)]
    unsafe fn chunk(b: *const u8, c: usize, s: &[f32; 16]) -> __m512 {
        // SAFETY: the codes are bytes 6..22 of the block (this function's contract).
        unsafe {
            let q = _mm512_or_si512(
                nibble16(b.add(6), c),
                bit4x16(s[1].to_bits(), 16 * c as u32),
            );
            let q = _mm512_sub_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(16.0));
            _mm512_mul_ps(q, _mm512_set1_ps(s[0]))
        }
    }
}

struct FQ5K;
impl Fused for FQ5K {
    const BS: usize = 256;
    const TS: usize = 176;
    /// As Q4_K's.
    #[inline(always)]
    unsafe fn scales(b: &[u8]) -> [f32; 16] {
        // SAFETY: the same header layout as Q4_K's; F16C is available.
        unsafe { FQ4K::scales(b) }
    }
    #[inline(always)]
    unsafe fn chunk(b: *const u8, c: usize, s: &[f32; 16]) -> __m512 {
        // Sub-block `sb` = c / 2 as in Q4_K, its fifth bit bit `sb` of `qh[16·(c % 2) + l]`.
        let sb = c / 2;
        // SAFETY: `qh` is bytes 16..48 of the block, the codes 48..176 (this function's
        // contract).
        unsafe {
            let lo = u8x16(b.add(48 + 32 * (sb / 2) + 16 * (c % 2)));
            let lo = if sb.is_multiple_of(2) {
                _mm512_and_si512(lo, _mm512_set1_epi32(15))
            } else {
                _mm512_srli_epi32::<4>(lo)
            };
            let hb = u8x16(b.add(16 + 16 * (c % 2)));
            let hb = _mm512_and_si512(
                _mm512_srl_epi32(hb, _mm_cvtsi32_si128(sb as i32)),
                _mm512_set1_epi32(1),
            );
            let q = _mm512_or_si512(lo, _mm512_slli_epi32::<4>(hb));
            let v = _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(s[sb]));
            _mm512_sub_ps(v, _mm512_set1_ps(s[8 + sb]))
        }
    }
}

/// 16 values `(d × g_k) × ±1.0` of two groups of 8 (IQ2): grid rows `g0` then `g1`,
/// lane `k` negative where bit `k` of `signs` is set.
///
/// # Safety
/// AVX-512 F is available.
#[inline(always)]
unsafe fn grid16(d: f32, g0: &[i8; 8], g1: &[i8; 8], signs: u16) -> __m512 {
    // SAFETY: AVX-512F is available (this function's contract).
    unsafe {
        let g = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(rows16(g0, g1)));
        let v = _mm512_mul_ps(_mm512_set1_ps(d), g);
        let pm = _mm512_mask_blend_ps(signs, _mm512_set1_ps(1.0), _mm512_set1_ps(-1.0));
        _mm512_mul_ps(v, pm)
    }
}

/// 16 values `dl × (g_k + δ)` of two groups of 8 (IQ1): grid rows `g0` then `g1`, `δ0` and
/// `δ1` their ±0.125.
///
/// # Safety
/// AVX-512 F is available.
#[inline(always)]
unsafe fn grid16_delta(dl: f32, g0: &[i8; 8], g1: &[i8; 8], d0: f32, d1: f32) -> __m512 {
    // SAFETY: AVX-512F is available (this function's contract).
    unsafe {
        let g = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(rows16(g0, g1)));
        let dt = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(d0), _mm512_set1_ps(d1));
        _mm512_mul_ps(_mm512_set1_ps(dl), _mm512_add_ps(g, dt))
    }
}

/// The block at `b` as a slice of `n` bytes.
///
/// # Safety
/// `b` is valid for `n` reads.
#[inline(always)]
unsafe fn block<'a>(b: *const u8, n: usize) -> &'a [u8] {
    // SAFETY: passed on (this function's contract).
    unsafe { std::slice::from_raw_parts(b, n) }
}

/// The 16 group scales of an IQ2_XS or IQ2_S block, from its scale nibbles `sc` (8 bytes).
#[inline(always)]
fn iq2_scales(d: f32, sc: &[u8]) -> [f32; 16] {
    std::array::from_fn(|i| iq2_scale(d, ((sc[i / 2] >> (4 * (i % 2))) & 15).into()))
}

struct FIQ2XS;
impl Fused for FIQ2XS {
    const BS: usize = 256;
    const TS: usize = 74;
    /// `db` of the 16 groups of 16.
    #[inline(always)]
    unsafe fn scales(b: &[u8]) -> [f32; 16] {
        // SAFETY: F16C is available (this function's contract).
        let d = unsafe { hc(b, 0) };
        iq2_scales(d, &b[66..74])
    }
    #[inline(always)]
    unsafe fn chunk(b: *const u8, c: usize, s: &[f32; 16]) -> __m512 {
        // SAFETY: `b` points at a whole block (this function's contract).
        let b = unsafe { block(b, Self::TS) };
        let (q0, q1) = (u16_at(b, 2 + 4 * c), u16_at(b, 4 + 4 * c));
        let g = |q: u16| &IQ2XS_GRID[(q & 511) as usize];
        let sg = |q: u16| u16::from(KSIGNS[(q >> 9) as usize]);
        // SAFETY: AVX-512F is available (this function's contract).
        unsafe { grid16(s[c], g(q0), g(q1), sg(q0) | (sg(q1) << 8)) }
    }
}

struct FIQ2S;
impl Fused for FIQ2S {
    const BS: usize = 256;
    const TS: usize = 82;
    /// `db` of the 16 groups of 16.
    #[inline(always)]
    unsafe fn scales(b: &[u8]) -> [f32; 16] {
        // SAFETY: F16C is available (this function's contract).
        let d = unsafe { hc(b, 0) };
        iq2_scales(d, &b[74..82])
    }
    #[inline(always)]
    unsafe fn chunk(b: *const u8, c: usize, s: &[f32; 16]) -> __m512 {
        // SAFETY: `b` points at a whole block (this function's contract).
        let b = unsafe { block(b, Self::TS) };
        let (qs, signs, qh) = (&b[2..34], &b[34..66], &b[66..74]);
        let g = |k: usize| &IQ2S_GRID[iq2s_index(qs, qh, k)];
        let k = 2 * c;
        let sg = u16::from(signs[k]) | (u16::from(signs[k + 1]) << 8);
        // SAFETY: AVX-512F is available (this function's contract).
        unsafe { grid16(s[c], g(k), g(k + 1), sg) }
    }
}

struct FIQ1M;
impl Fused for FIQ1M {
    const BS: usize = 256;
    const TS: usize = 56;
    /// `dl` of the 16 groups of 16.
    #[inline(always)]
    unsafe fn scales(b: &[u8]) -> [f32; 16] {
        let sc = [u16_at(b, 48), u16_at(b, 50), u16_at(b, 52), u16_at(b, 54)];
        // SAFETY: F16C is available (this function's contract).
        let d = unsafe { hc(&iq1m_d_bits(&sc).to_le_bytes(), 0) };
        std::array::from_fn(|i| d * ((2 * ((sc[i / 4] >> (3 * (i % 4))) & 7) + 1) as f32))
    }
    #[inline(always)]
    unsafe fn chunk(b: *const u8, c: usize, s: &[f32; 16]) -> __m512 {
        // SAFETY: `b` points at a whole block (this function's contract).
        let b = unsafe { block(b, Self::TS) };
        // Groups 2c and 2c + 1: the low and high nibble of `qh[c]`.
        let nib = [b[32 + c] & 15, b[32 + c] >> 4];
        let g = |h: usize| {
            let idx = b[2 * c + h] as usize | (((nib[h] & 7) as usize) << 8);
            &IQ1S_GRID[idx]
        };
        let (d0, d1) = (delta(nib[0] & 8 != 0), delta(nib[1] & 8 != 0));
        // SAFETY: AVX-512F is available (this function's contract).
        unsafe { grid16_delta(s[c], g(0), g(1), d0, d1) }
    }
}

/// Whether [`matvec`] takes `f`. Of the grid formats, only those this path made faster at one
/// thread, 4096², batch 1 (IQ2_XS 4.4 → 3.7 ms, IQ2_S 4.7 → 3.4, IQ1_M 3.7 → 2.6): written the
/// same way, IQ2_XXS, IQ3_XXS, IQ3_S and IQ1_S were 8–21% slower than the decoded tiles.
pub(crate) fn fused(f: BlockFormat) -> bool {
    use BlockFormat::*;
    matches!(
        f,
        Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q4_K | Q5_K | Q6_K | IQ2_XS | IQ2_S | IQ1_M
    )
}

/// One activation row times rows `rows` of a block matrix of a [`fused`] format, each weight
/// decoded into a register and multiplied there: every lane accumulates its columns in order
/// with one FMA each from `+0.0` and the 16 lanes go through the contract's tree — the bits of
/// the dense kernel over the decoded rows, without writing them out.
///
/// # Safety
/// AVX-512 F, BW, VL and DQ, AVX2, FMA and F16C are available; `m` is a block matrix of `f`
/// (one of the [`fused`] formats) with `x.len() == m.cols()` and `y.len() == rows.len()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(crate) unsafe fn matvec(
    f: BlockFormat,
    m: &crate::Matrix<'_>,
    x: &[f32],
    y: &mut [f32],
    rows: std::ops::Range<usize>,
) {
    // SAFETY: passed on (this function's contract).
    unsafe {
        match f {
            BlockFormat::Q8_0 => matvec_of::<FQ8_0>(m, x, y, rows),
            BlockFormat::Q4_0 => matvec_of::<FQ4_0>(m, x, y, rows),
            BlockFormat::Q4_1 => matvec_of::<FQ4_1>(m, x, y, rows),
            BlockFormat::Q5_0 => matvec_of::<FQ5_0>(m, x, y, rows),
            BlockFormat::Q4_K => matvec_of::<FQ4K>(m, x, y, rows),
            BlockFormat::Q5_K => matvec_of::<FQ5K>(m, x, y, rows),
            BlockFormat::Q6_K => matvec_of::<FQ6K>(m, x, y, rows),
            BlockFormat::IQ2_XS => matvec_of::<FIQ2XS>(m, x, y, rows),
            BlockFormat::IQ2_S => matvec_of::<FIQ2S>(m, x, y, rows),
            BlockFormat::IQ1_M => matvec_of::<FIQ1M>(m, x, y, rows),
            _ => unreachable!("{f:?} is not a fused format"),
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn matvec_of<F: Fused>(
    m: &crate::Matrix<'_>,
    x: &[f32],
    y: &mut [f32],
    rows: std::ops::Range<usize>,
) {
    let nb = m.cols() / F::BS;
    assert!(x.len() == nb * F::BS && y.len() == rows.len());
    let mut r0 = rows.start;
    while r0 < rows.end {
        let n = FUSED_ROWS.min(rows.end - r0);
        let rs: [&[u8]; FUSED_ROWS] = std::array::from_fn(|i| m.row(r0 + i.min(n - 1)));
        assert!(rs.iter().all(|r| r.len() == nb * F::TS));
        // SAFETY: AVX-512 is available (this function's contract); each row holds `nb` whole
        // blocks (checked above) and `x` holds `nb · BS` values, so every block pointer and
        // every 16-value activation load is in bounds.
        unsafe {
            let mut acc = [_mm512_setzero_ps(); FUSED_ROWS];
            for blk in 0..nb {
                let ptr: [*const u8; FUSED_ROWS] =
                    std::array::from_fn(|i| rs[i].as_ptr().add(blk * F::TS));
                let sc: [[f32; 16]; FUSED_ROWS] =
                    std::array::from_fn(|i| F::scales(&rs[i][blk * F::TS..(blk + 1) * F::TS]));
                let xb = x.as_ptr().add(blk * F::BS);
                for c in 0..F::BS / 16 {
                    let xv = _mm512_loadu_ps(xb.add(16 * c));
                    for i in 0..FUSED_ROWS {
                        let w = F::chunk(ptr[i], c, &sc[i]);
                        acc[i] = _mm512_fmadd_ps(w, xv, acc[i]);
                    }
                }
            }
            for (i, a) in acc.iter().take(n).enumerate() {
                let mut lanes = [0f32; 16];
                _mm512_storeu_ps(lanes.as_mut_ptr(), *a);
                y[r0 - rows.start + i] = crate::scalar::tree(&lanes);
            }
        }
        r0 += n;
    }
}
