//! What this CPU's arithmetic can do at best: the fused multiply-add ceiling of an ISA on one
//! thread, measured with independent chains long enough to hide the latency of each FMA (the
//! figure a compute-bound kernel is held against; `sluice doctor` reports it).

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
}
