//! What this CPU can do at best: the fused multiply-add ceiling of an ISA on one thread,
//! measured with independent chains long enough to hide the latency of each FMA (the figure a
//! compute-bound kernel is held against), and a memory read loop as wide as the kernels' loads
//! (the one the bandwidth a decode step is held against is measured with). `sluice doctor`
//! reports both.

use std::time::{Duration, Instant};

use crate::Isa;

/// Independent accumulators per chain: enough to cover an FMA's latency on two ports.
const CHAINS: usize = 24;

/// Multiply-adds per second (f32, one thread) that `isa`'s widest FMA sustains, measured for
/// about `budget`. An ISA this CPU lacks gives `None`.
pub fn fma_ceiling(isa: Isa, budget: Duration) -> Option<f64> {
    if !isa.is_available() {
        return None;
    }
    let t0 = Instant::now();
    let mut macs = 0u64;
    let mut sink = 0f32;
    while t0.elapsed() < budget {
        let (n, s) = burst(isa, 1 << 16);
        macs += n;
        sink += s;
    }
    std::hint::black_box(sink);
    Some(macs as f64 / t0.elapsed().as_secs_f64())
}

/// `iters` rounds of [`CHAINS`] FMAs of the ISA's width; returns the multiply-adds done and a
/// value depending on all of them.
fn burst(isa: Isa, iters: usize) -> (u64, f32) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller checked that the ISA is available.
        Isa::Avx512 => unsafe { (iters as u64 * CHAINS as u64 * 16, avx512(iters)) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { (iters as u64 * CHAINS as u64 * 8, avx2(iters)) },
        _ => (iters as u64 * CHAINS as u64, scalar(iters)),
    }
}

fn scalar(iters: usize) -> f32 {
    let mut acc = [1f32; CHAINS];
    let (a, b) = std::hint::black_box((0.999_999f32, 1e-7f32));
    for _ in 0..iters {
        for x in &mut acc {
            *x = x.mul_add(a, b);
        }
    }
    acc.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let (a, b) = std::hint::black_box((0.999_999f32, 1e-7f32));
    let (va, vb) = (_mm512_set1_ps(a), _mm512_set1_ps(b));
    let mut acc = [_mm512_set1_ps(1.0); CHAINS];
    for _ in 0..iters {
        for x in &mut acc {
            *x = _mm512_fmadd_ps(*x, va, vb);
        }
    }
    acc.iter().map(|v| _mm512_reduce_add_ps(*v)).sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2(iters: usize) -> f32 {
    use std::arch::x86_64::*;
    let (a, b) = std::hint::black_box((0.999_999f32, 1e-7f32));
    let (va, vb) = (_mm256_set1_ps(a), _mm256_set1_ps(b));
    let mut acc = [_mm256_set1_ps(1.0); CHAINS];
    for _ in 0..iters {
        for x in &mut acc {
            *x = _mm256_fmadd_ps(*x, va, vb);
        }
    }
    let mut out = [0f32; 8];
    let mut s = 0f32;
    for v in acc {
        // SAFETY: `out` holds 8 f32s.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
        s += out.iter().sum::<f32>();
    }
    s
}

/// Streams [`read_sum`] walks side by side in one slice: enough for the hardware prefetchers to
/// keep as many lines in flight as the product kernels' many weight rows do.
const STREAMS: usize = 16;

/// The wrapping sum of `words`, read with `isa`'s widest loads in [`STREAMS`] streams side by
/// side: a memory read loop for bandwidth probes (what a thread can stream from memory, the
/// figure decode's weight reads are held against). On an ISA this CPU lacks, the scalar loop.
pub fn read_sum(isa: Isa, words: &[u64]) -> u64 {
    let lanes = words.len() / STREAMS / 8;
    let (body, tail) = words.split_at(lanes * 8 * STREAMS);
    let head = match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the ISA is available.
        Isa::Avx512 if isa.is_available() => unsafe { read_avx512(body, lanes) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 if isa.is_available() => unsafe { read_avx2(body, lanes) },
        _ => read_scalar(body, lanes),
    };
    tail.iter().fold(head, |a, &w| a.wrapping_add(w))
}

/// [`STREAMS`] streams of `lanes` groups of 8 words each, summed.
fn read_scalar(body: &[u64], lanes: usize) -> u64 {
    let mut acc = [[0u64; 8]; STREAMS];
    for j in 0..lanes {
        for (k, a) in acc.iter_mut().enumerate() {
            let p = &body[(k * lanes + j) * 8..(k * lanes + j + 1) * 8];
            for (ai, &v) in a.iter_mut().zip(p) {
                *ai = ai.wrapping_add(v);
            }
        }
    }
    acc.iter().flatten().fold(0u64, |x, &y| x.wrapping_add(y))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn read_avx512(body: &[u64], lanes: usize) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_si512(); STREAMS];
    for j in 0..lanes {
        for (k, a) in acc.iter_mut().enumerate() {
            let p = &body[(k * lanes + j) * 8..(k * lanes + j + 1) * 8];
            // SAFETY: `p` holds 8 u64s (64 bytes).
            let v = unsafe { _mm512_loadu_si512(p.as_ptr().cast()) };
            *a = _mm512_add_epi64(*a, v);
        }
    }
    acc.iter().fold(0u64, |x, &v| {
        x.wrapping_add(_mm512_reduce_add_epi64(v) as u64)
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn read_avx2(body: &[u64], lanes: usize) -> u64 {
    use std::arch::x86_64::*;
    // Eight accumulators, two per four streams: the sum is a wrapping one, so which stream
    // feeds which does not matter, and eight stay in AVX2's sixteen registers.
    let mut acc = [_mm256_setzero_si256(); 8];
    for j in 0..lanes {
        for k in 0..STREAMS {
            let a = &mut acc[(k % 4) * 2..(k % 4) * 2 + 2];
            let p = &body[(k * lanes + j) * 8..(k * lanes + j + 1) * 8];
            // SAFETY: `p` holds 8 u64s: two 32-byte loads.
            let (lo, hi) = unsafe {
                (
                    _mm256_loadu_si256(p.as_ptr().cast()),
                    _mm256_loadu_si256(p.as_ptr().add(4).cast()),
                )
            };
            a[0] = _mm256_add_epi64(a[0], lo);
            a[1] = _mm256_add_epi64(a[1], hi);
        }
    }
    let mut out = [0u64; 4];
    let mut s = 0u64;
    for v in acc {
        // SAFETY: `out` holds 4 u64s.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), v) };
        s = out.iter().fold(s, |x, &y| x.wrapping_add(y));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_available_isa_measures_and_a_missing_one_does_not() {
        for isa in Isa::ALL {
            let g = fma_ceiling(isa, Duration::from_millis(5));
            assert_eq!(g.is_some(), isa.is_available(), "{isa}");
            if let Some(g) = g {
                assert!(g.is_finite() && g > 0.0, "{isa}: {g}");
            }
        }
    }

    #[test]
    fn the_read_loop_sums_every_word_on_every_isa() {
        // Lengths around the streams' groups, so the tail and empty bodies are covered.
        for n in [0, 1, 7, 127, 128, 129, 1000, 4096 + 37] {
            let words: Vec<u64> = (0..n as u64)
                .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                .collect();
            let want = words.iter().fold(0u64, |a, &w| a.wrapping_add(w));
            for isa in Isa::ALL {
                assert_eq!(read_sum(isa, &words), want, "{isa}, {n} words");
            }
        }
    }
}
