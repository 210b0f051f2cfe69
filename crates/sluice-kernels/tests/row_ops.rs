//! Row ops (dot, sum, axpy, RMSNorm, softmax, SwiGLU, sigmoid, SiLU, exp) on every ISA this CPU
//! has, against the scalar specification, bit for bit.

mod common;

use common::*;
use proptest::prelude::*;
use sluice_kernels::scalar;

fn mode_strategy() -> impl Strategy<Value = Mode> {
    prop_oneof![
        3 => Just(Mode::Tame),
        3 => Just(Mode::Edges),
        1 => Just(Mode::Wild),
        1 => Just(Mode::Zeros),
    ]
}

/// A vector of a length that crosses 0, 1 and several 16-lane blocks, with values from `mode`
/// (scaled so that exp-based ops see their whole domain: underflow, overflow, both limits).
fn vec_strategy() -> impl Strategy<Value = Vec<f32>> {
    (
        prop_oneof![4 => 0usize..=49, 1 => 50usize..=300],
        any::<u64>(),
        mode_strategy(),
        proptest::sample::select(vec![1.0f32, 30.0, 100.0]),
    )
        .prop_map(|(n, seed, mode, scale)| {
            let mut rng = Rng(seed);
            (0..n).map(|_| value(&mut rng, mode) * scale).collect()
        })
}

fn pair_strategy() -> impl Strategy<Value = (Vec<f32>, Vec<f32>)> {
    vec_strategy().prop_flat_map(|a| {
        let n = a.len();
        (
            Just(a),
            (any::<u64>(), mode_strategy()).prop_map(move |(seed, mode)| {
                let mut rng = Rng(seed);
                (0..n).map(|_| value(&mut rng, mode)).collect::<Vec<f32>>()
            }),
        )
    })
}

proptest! {
    #![proptest_config(config(256, "proptest-regressions/row_ops.txt"))]

    #[test]
    fn dot_and_sum((a, b) in pair_strategy()) {
        let want_dot = spec().dot(&a, &b);
        let want_sum = spec().sum(&a);
        prop_assert!(same(want_dot, scalar::dot(&a, &b)));
        for k in simd_kernels() {
            let d = k.dot(&a, &b);
            prop_assert!(same(d, want_dot), "{:?} dot {d:e} vs {want_dot:e}", k.isa());
            let s = k.sum(&a);
            prop_assert!(same(s, want_sum), "{:?} sum {s:e} vs {want_sum:e}", k.isa());
        }
    }

    #[test]
    fn axpy((x, y) in pair_strategy(), a in any::<f32>()) {
        let mut want = y.clone();
        spec().axpy(a, &x, &mut want);
        for k in simd_kernels() {
            let mut got = y.clone();
            k.axpy(a, &x, &mut got);
            assert_same(&format!("{:?} axpy", k.isa()), &got, &want);
        }
    }

    #[test]
    fn rmsnorm((x, w) in pair_strategy(), eps in prop_oneof![Just(1e-6f32), Just(1e-5), Just(0.0)]) {
        let mut want = vec![0f32; x.len()];
        spec().rmsnorm(&x, &w, eps, &mut want);
        for k in simd_kernels() {
            let mut got = vec![1f32; x.len()];
            k.rmsnorm(&x, &w, eps, &mut got);
            assert_same(&format!("{:?} rmsnorm", k.isa()), &got, &want);
        }
    }

    #[test]
    fn softmax(x in vec_strategy()) {
        let mut want = x.clone();
        spec().softmax(&mut want);
        for k in simd_kernels() {
            let mut got = x.clone();
            k.softmax(&mut got);
            assert_same(&format!("{:?} softmax", k.isa()), &got, &want);
        }
    }

    #[test]
    fn silu_mul((g, u) in pair_strategy()) {
        let mut want = vec![0f32; g.len()];
        spec().silu_mul(&g, &u, &mut want);
        for k in simd_kernels() {
            let mut got = vec![0f32; g.len()];
            k.silu_mul(&g, &u, &mut got);
            assert_same(&format!("{:?} silu_mul", k.isa()), &got, &want);
        }
    }

    #[test]
    fn element_ops(x in vec_strategy()) {
        let want_sig: Vec<f32> = x.iter().map(|&v| scalar::sigmoid(v)).collect();
        let want_silu: Vec<f32> = x.iter().map(|&v| scalar::silu(v)).collect();
        let want_exp: Vec<f32> = x.iter().map(|&v| scalar::exp(v)).collect();
        let mut ks = simd_kernels();
        ks.push(spec());
        for k in ks {
            let mut s = x.clone();
            k.sigmoid(&mut s);
            assert_same(&format!("{:?} sigmoid", k.isa()), &s, &want_sig);
            let mut s = x.clone();
            k.silu(&mut s);
            assert_same(&format!("{:?} silu", k.isa()), &s, &want_silu);
            let mut s = x.clone();
            k.exp(&mut s);
            assert_same(&format!("{:?} exp", k.isa()), &s, &want_exp);
        }
    }
}

/// Kimi Delta Attention steps and L2 norms on every ISA give the scalar specification's bits
/// (their products go through `axpy` and `dot`).
#[test]
fn kda_step_and_l2norm_match_the_specification() {
    let mut rng = Rng(41);
    for (dk, dv) in [(1, 1), (3, 5), (16, 16), (17, 33), (32, 64)] {
        let st: Vec<f32> = (0..dk * dv).map(|_| value(&mut rng, Mode::Tame)).collect();
        let q: Vec<f32> = (0..dk).map(|_| value(&mut rng, Mode::Tame)).collect();
        let kk: Vec<f32> = (0..dk).map(|_| value(&mut rng, Mode::Tame)).collect();
        let v: Vec<f32> = (0..dv).map(|_| value(&mut rng, Mode::Tame)).collect();
        let decay: Vec<f32> = (0..dk).map(|_| rng.unit()).collect();
        let beta = rng.unit();
        let (mut ws, mut wu, mut wo) = (st.clone(), vec![0f32; dv], vec![0f32; dv]);
        scalar::kda_step(&mut ws, &q, &kk, &v, &decay, beta, &mut wu, &mut wo);
        let mut wn = vec![0f32; dk];
        scalar::l2norm(&q, 1e-6, &mut wn);
        let mut ks = simd_kernels();
        ks.push(spec());
        for k in ks {
            let (mut s, mut u, mut o) = (st.clone(), vec![0f32; dv], vec![0f32; dv]);
            k.kda_step(&mut s, &q, &kk, &v, &decay, beta, &mut u, &mut o);
            assert_same(&format!("{:?} kda state", k.isa()), &s, &ws);
            assert_same(&format!("{:?} kda out", k.isa()), &o, &wo);
            let mut n = vec![0f32; dk];
            k.l2norm(&q, 1e-6, &mut n);
            assert_same(&format!("{:?} l2norm", k.isa()), &n, &wn);
        }
    }
}

/// `exp` on a sweep of the whole f32 line (every 4099th bit pattern), plus every value within
/// 4096 ulps of both clamps and of ±0, and the rounding ties of `x·log2 e` near every integer.
#[test]
fn exp_sweep() {
    let mut xs: Vec<f32> = (0..=u32::MAX).step_by(4099).map(f32::from_bits).collect();
    for edge in [88.722_84f32, -87.336_54, 0.0, -0.0, 88.72284 * 0.5] {
        let b = edge.to_bits() as i64;
        xs.extend((b - 4096..=b + 4096).map(|v| f32::from_bits(v as u32)));
    }
    for n in -130..=130 {
        let mid = (n as f32 + 0.5) / std::f32::consts::LOG2_E;
        let b = mid.to_bits() as i64;
        xs.extend((b - 64..=b + 64).map(|v| f32::from_bits(v as u32)));
    }
    xs.extend([
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN,
    ]);
    let want: Vec<f32> = xs.iter().map(|&v| scalar::exp(v)).collect();
    for k in simd_kernels() {
        let mut got = xs.clone();
        k.exp(&mut got);
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(
                same(g, w),
                "{:?} exp({:e} = {:#010x}): {g:e} vs {w:e}",
                k.isa(),
                xs[i],
                xs[i].to_bits()
            );
        }
    }
}

/// Softmax edge cases: all −∞, +∞ present, a NaN, a single element, equal maxima of both
/// zero signs.
#[test]
fn softmax_edges() {
    let cases: Vec<Vec<f32>> = vec![
        vec![f32::NEG_INFINITY; 20],
        vec![1.0, f32::INFINITY, 2.0],
        vec![1.0, f32::NAN, 2.0, 3.0],
        vec![5.0],
        vec![0.0, -0.0, -0.0, 0.0, -1.0],
        vec![-0.0; 17],
        (0..33).map(|i| i as f32 * 10.0).collect(),
    ];
    for x in cases {
        let mut want = x.clone();
        spec().softmax(&mut want);
        for k in simd_kernels() {
            let mut got = x.clone();
            k.softmax(&mut got);
            assert_same(&format!("{:?} softmax {x:?}", k.isa()), &got, &want);
        }
    }
}
