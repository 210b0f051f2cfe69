//! Kimi Delta Attention (KDA), the linear attention of Kimi Linear and Kimi K3.
//!
//! Per head, a `head_dim × head_dim` state `S` (key channels by value channels) is carried from
//! token to token. For each token: q, k and v are projections of the input passed through short
//! causal depthwise convolutions with SiLU (their last `kernel − 1` inputs are carried too);
//! q and k are L2-normalised and q scaled by `head_dim^−½`; the forget gate gives a log-decay
//! per key channel from a low-rank projection, `dt_bias` and `A_log` (softplus form for Kimi
//! Linear, a sigmoid with a lower bound for K3), β = σ(b x) per head; then the delta rule
//! `S ← diag(e^g) S`, `S ← S + k (β (v − Sᵀk))ᵀ`, `o = Sᵀ q`. The output is RMS-normalised per
//! head, multiplied by σ of an output gate and projected back.
//!
//! The recurrence runs token by token with the same per-token arithmetic whatever the number
//! of tokens in a call (transformers' chunked form for prefill is algebraically the same and
//! differs only in rounding), so chunked prefill gives the same bits as decoding one token at a
//! time. Heads are independent: threads own whole heads.

use sluice_store::Blob;

use crate::ModelError;
use crate::config::{KdaConfig, KdaGate, ModelConfig};
use crate::exec::Exec;
use crate::state::KdaCache;
use crate::weights::{KdaOutputGate, KdaSpec};

/// The eps of FLA's L2 norm of q and k.
const L2_EPS: f32 = 1e-6;

/// One KDA layer over the normed input `x` `[t, hidden]`, advancing `cache`; returns
/// `[t, hidden]`. The cache's state before the call is saved first, so a failed pass can
/// restore it.
pub(crate) fn kda(
    exec: &Exec,
    cfg: &ModelConfig,
    kc: &KdaConfig,
    spec: &KdaSpec,
    blob: &Blob,
    cache: &mut KdaCache,
    x: &[f32],
) -> Result<Vec<f32>, ModelError> {
    let h = cfg.hidden;
    let t = x.len() / h;
    let (nh, d, kk) = (kc.heads, kc.head_dim, kc.conv_kernel);
    let c = nh * d;
    let k = exec.kernels();
    cache.save();

    // q, k, v through their short convolutions (with SiLU), carrying the last kk − 1 inputs.
    let mut proj = [vec![0f32; t * c], vec![0f32; t * c], vec![0f32; t * c]];
    for (p, m) in proj.iter_mut().zip([&spec.q, &spec.k, &spec.v]) {
        exec.matmul(&m.view(blob)?, x, p);
    }
    let keep = (kk - 1) * c;
    for (i, p) in proj.iter_mut().enumerate() {
        let taps = spec.conv[i].to_f32(blob); // [c, kk]
        let mut wt = vec![0f32; kk * c]; // [kk, c]
        for ch in 0..c {
            for j in 0..kk {
                wt[j * c + ch] = taps[ch * kk + j];
            }
        }
        let st = &mut cache.conv[i * keep..(i + 1) * keep];
        let mut xs = Vec::with_capacity(keep + t * c);
        xs.extend_from_slice(st);
        xs.extend_from_slice(p);
        for tok in 0..t {
            k.conv_silu(
                &xs[tok * c..(tok + kk) * c],
                &wt,
                &mut p[tok * c..(tok + 1) * c],
            );
        }
        st.copy_from_slice(&xs[t * c..]);
    }
    let [mut qs, mut ks, vs] = proj;

    // The decay of each key channel: e^g.
    let mut fa = vec![0f32; t * d];
    exec.matmul(&spec.f_a.view(blob)?, x, &mut fa);
    let mut decay = vec![0f32; t * c];
    exec.matmul(&spec.f_b.view(blob)?, &fa, &mut decay);
    let dt = spec.dt_bias.to_f32(blob);
    for row in decay.chunks_exact_mut(c) {
        for (z, &b) in row.iter_mut().zip(&dt) {
            *z += b;
        }
    }
    let mut a = spec.a_log.to_f32(blob);
    k.exp(&mut a);
    match kc.gate {
        KdaGate::Softplus => {
            // g = −e^A · softplus(z)
            k.softplus(&mut decay);
            for row in decay.chunks_exact_mut(c) {
                for (hd, seg) in row.chunks_exact_mut(d).enumerate() {
                    for v in seg {
                        *v *= -a[hd];
                    }
                }
            }
        }
        KdaGate::LowerBound(lb) => {
            // g = lb · σ(e^A · z)
            for row in decay.chunks_exact_mut(c) {
                for (hd, seg) in row.chunks_exact_mut(d).enumerate() {
                    for v in seg.iter_mut() {
                        *v *= a[hd];
                    }
                }
            }
            k.sigmoid(&mut decay);
            for v in &mut decay {
                *v *= lb;
            }
        }
    }
    k.exp(&mut decay);

    let mut beta = vec![0f32; t * nh];
    exec.matmul(&spec.b.view(blob)?, x, &mut beta);
    k.sigmoid(&mut beta);

    // L2-normalised q (then scaled) and k, per head.
    let scale = (1.0 / (d as f64).sqrt()) as f32;
    let mut tmp = vec![0f32; d];
    for seg in qs.chunks_exact_mut(d) {
        k.l2norm(seg, L2_EPS, &mut tmp);
        for (s, &v) in seg.iter_mut().zip(&tmp) {
            *s = v * scale;
        }
    }
    for seg in ks.chunks_exact_mut(d) {
        k.l2norm(seg, L2_EPS, &mut tmp);
        seg.copy_from_slice(&tmp);
    }

    // The recurrence, one head per task, tokens in order.
    let mut per_head = vec![0f32; nh * t * d]; // [head][token][d]
    {
        let (qs, ks, vs, decay, beta) = (&qs, &ks, &vs, &decay, &beta);
        exec.for_each_chunk_pair(
            &mut cache.state,
            d * d,
            &mut per_head,
            t * d,
            |hd, st, o| {
                let mut u = vec![0f32; d];
                for tok in 0..t {
                    let at = tok * c + hd * d;
                    k.kda_step(
                        st,
                        &qs[at..at + d],
                        &ks[at..at + d],
                        &vs[at..at + d],
                        &decay[at..at + d],
                        beta[tok * nh + hd],
                        &mut u,
                        &mut o[tok * d..(tok + 1) * d],
                    );
                }
            },
        );
    }

    // Norm per head, then the output gate.
    let on = spec.o_norm.to_f32(blob);
    let mut y = vec![0f32; t * c];
    for hd in 0..nh {
        for tok in 0..t {
            let src = &per_head[(hd * t + tok) * d..(hd * t + tok + 1) * d];
            k.rmsnorm(
                src,
                &on,
                cfg.eps,
                &mut y[tok * c + hd * d..tok * c + (hd + 1) * d],
            );
        }
    }
    let mut gate = vec![0f32; t * c];
    match &spec.gate {
        KdaOutputGate::Full(g) => exec.matmul(&g.view(blob)?, x, &mut gate),
        KdaOutputGate::LowRank(ga, gb) => {
            let mut low = vec![0f32; t * d];
            exec.matmul(&ga.view(blob)?, x, &mut low);
            exec.matmul(&gb.view(blob)?, &low, &mut gate);
        }
    }
    k.mul_sigmoid(&mut y, &gate);
    let mut out = vec![0f32; t * h];
    exec.matmul(&spec.o.view(blob)?, &y, &mut out);
    cache.pos += t;
    Ok(out)
}
