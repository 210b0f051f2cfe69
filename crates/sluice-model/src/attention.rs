//! Attention: grouped-query (with the Qwen3 / OLMoE query-key norms, sliding windows and
//! GPT-OSS's attention sinks) and DeepSeek's multi-head latent attention computed on the
//! compressed cache by weight absorption.

use sluice_kernels::{Codes, Matrix};
use sluice_store::Blob;

use crate::ModelError;
use crate::config::{AttentionConfig, ModelConfig, QkNorm};
use crate::exec::{Exec, decode_row};
use crate::rope::{Angles, Rope};
use crate::state::LayerCache;
use crate::weights::{AttnSpec, VecSpec};

/// The f32 matrix `[rows, cols]` held in `data`.
fn f32_matrix(data: &[f32], rows: usize, cols: usize) -> Result<Matrix<'_>, ModelError> {
    Ok(Matrix::dense(
        Codes::F32,
        bytemuck::cast_slice(data),
        rows,
        cols,
    )?)
}

fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (a, &b) in row.iter_mut().zip(bias) {
            *a += b;
        }
    }
}

fn rmsnorm_rows(exec: &Exec, x: &mut [f32], w: &[f32], eps: f32) {
    let mut tmp = vec![0f32; w.len()];
    for row in x.chunks_exact_mut(w.len()) {
        exec.kernels().rmsnorm(row, w, eps, &mut tmp);
        row.copy_from_slice(&tmp);
    }
}

/// `probs · V` over cached rows: `out[d] = Σ_j p[j] · v[j, d]`, accumulated in position order.
fn weighted_sum(exec: &Exec, p: &[f32], v: &[f32], dim: usize, out: &mut [f32]) {
    out.fill(0.0);
    for (j, &pj) in p.iter().enumerate() {
        exec.kernels().axpy(pj, &v[j * dim..(j + 1) * dim], out);
    }
}

/// The eps of DeepSeek's `q_a_layernorm` / `kv_a_layernorm` (transformers constructs them without
/// passing `rms_norm_eps`).
const MLA_NORM_EPS: f32 = 1e-6;

/// Runs one layer's attention for `t` tokens at positions `pos0..pos0 + t` and appends their
/// keys and values to `cache` (or, for Kimi Delta Attention, advances its recurrent state). `x` is the normed input `[t, hidden]`; returns `[t, hidden]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    exec: &Exec,
    cfg: &ModelConfig,
    rope: &Rope,
    angles: &Angles,
    spec: &AttnSpec,
    blob: &Blob,
    cache: &mut LayerCache,
    pos0: usize,
    x: &[f32],
) -> Result<Vec<f32>, ModelError> {
    let h = cfg.hidden;
    let t = x.len() / h;
    match (spec, &cfg.attention, cache) {
        (
            AttnSpec::Gqa {
                q,
                k,
                v,
                o,
                qkv_bias,
                o_bias,
                qk_norm,
                sinks,
                window,
            },
            AttentionConfig::Gqa {
                heads,
                kv_heads,
                head_dim: hd,
                qk_norm: norm_kind,
                clip_qkv,
                ..
            },
            LayerCache::Gqa { k: kc, v: vc },
        ) => {
            let (heads, kvh, hd) = (*heads, *kv_heads, *hd);
            let mut qs = vec![0f32; t * heads * hd];
            let mut ks = vec![0f32; t * kvh * hd];
            let mut vs = vec![0f32; t * kvh * hd];
            exec.matmul(&q.view(blob)?, x, &mut qs);
            exec.matmul(&k.view(blob)?, x, &mut ks);
            exec.matmul(&v.view(blob)?, x, &mut vs);
            if let Some([qb, kb, vb]) = qkv_bias {
                add_bias(&mut qs, &qb.to_f32(blob));
                add_bias(&mut ks, &kb.to_f32(blob));
                add_bias(&mut vs, &vb.to_f32(blob));
            }
            if let Some([qn, kn]) = qk_norm {
                let (qn, kn) = (qn.to_f32(blob), kn.to_f32(blob));
                // Full: over the whole projection (OLMoE); per head: over each head (Qwen3).
                rmsnorm_rows(exec, &mut qs, &qn, cfg.eps);
                rmsnorm_rows(exec, &mut ks, &kn, cfg.eps);
                debug_assert!(*norm_kind != QkNorm::None);
            }
            if let Some(c) = clip_qkv {
                for a in qs.iter_mut().chain(ks.iter_mut()).chain(vs.iter_mut()) {
                    *a = a.clamp(-c, *c);
                }
            }
            for i in 0..t {
                let (cos, sin) = angles.get(i);
                for head in qs[i * heads * hd..(i + 1) * heads * hd].chunks_exact_mut(hd) {
                    rope.apply(head, cos, sin);
                }
                for head in ks[i * kvh * hd..(i + 1) * kvh * hd].chunks_exact_mut(hd) {
                    rope.apply(head, cos, sin);
                }
                for g in 0..kvh {
                    let at = (i * kvh + g) * hd;
                    kc[g].extend_from_slice(&ks[at..at + hd]);
                    vc[g].extend_from_slice(&vs[at..at + hd]);
                }
            }
            let group = heads / kvh;
            let scale = cfg.softmax_scale;
            let sinks = sinks.map(|s| s.to_f32(blob));
            let sinks = sinks.as_deref();
            let mut out = vec![0f32; t * heads * hd];
            let (kc, vc) = (&*kc, &*vc);
            let qs = &qs;
            exec.for_each_chunk(&mut out, hd, |idx, o| {
                let (i, head) = (idx / heads, idx % heads);
                let p = pos0 + i;
                let lo = window.map_or(0, |w| (p + 1).saturating_sub(w));
                let n = p + 1 - lo;
                let g = head / group;
                let kmat = &kc[g][lo * hd..(p + 1) * hd];
                let qh = &qs[(i * heads + head) * hd..(i * heads + head + 1) * hd];
                // With a sink, one more logit joins the softmax and is dropped after it.
                let mut scores = vec![0f32; n + usize::from(sinks.is_some())];
                // Shapes are consistent by construction.
                if let Ok(m) = f32_matrix(kmat, n, hd) {
                    exec.kernels().matmul(&m, qh, &mut scores[..n], 0..n);
                }
                for s in &mut scores[..n] {
                    *s *= scale;
                }
                if let Some(sk) = sinks {
                    scores[n] = sk[head];
                }
                exec.kernels().softmax(&mut scores);
                weighted_sum(exec, &scores[..n], &vc[g][lo * hd..(p + 1) * hd], hd, o);
            });
            let mut y = vec![0f32; t * h];
            exec.matmul(&o.view(blob)?, &out, &mut y);
            if let Some(b) = o_bias {
                add_bias(&mut y, &b.to_f32(blob));
            }
            Ok(y)
        }
        (
            AttnSpec::Mla {
                q_a,
                q_b,
                kv_a,
                kv_a_norm,
                kv_b,
                o,
                bias,
                gate,
            },
            AttentionConfig::Mla {
                heads,
                kv_lora_rank,
                qk_nope_head_dim,
                qk_rope_head_dim,
                v_head_dim,
                rope: rotate,
                ..
            },
            LayerCache::Mla { c: cc, kr: krc },
        ) => {
            let (heads, r, nope, rd, vd) = (
                *heads,
                *kv_lora_rank,
                *qk_nope_head_dim,
                *qk_rope_head_dim,
                *v_head_dim,
            );
            let qk = nope + rd;
            let bias_of =
                |i: usize| -> Option<&VecSpec> { bias.as_ref().and_then(|b| b[i].as_ref()) };
            // Queries.
            let mut qs = vec![0f32; t * heads * qk];
            match q_a {
                Some((qa, qa_norm)) => {
                    let mut lat = vec![0f32; t * qa.rows];
                    exec.matmul(&qa.view(blob)?, x, &mut lat);
                    if let Some(b) = bias_of(0) {
                        add_bias(&mut lat, &b.to_f32(blob));
                    }
                    rmsnorm_rows(exec, &mut lat, &qa_norm.to_f32(blob), MLA_NORM_EPS);
                    exec.matmul(&q_b.view(blob)?, &lat, &mut qs);
                }
                None => exec.matmul(&q_b.view(blob)?, x, &mut qs),
            }
            // Compressed keys/values.
            let mut ckv = vec![0f32; t * (r + rd)];
            exec.matmul(&kv_a.view(blob)?, x, &mut ckv);
            if let Some(b) = bias_of(1) {
                add_bias(&mut ckv, &b.to_f32(blob));
            }
            let norm_w = kv_a_norm.to_f32(blob);
            let mut normed = vec![0f32; r];
            for i in 0..t {
                let (cos, sin) = angles.get(i);
                let row = &mut ckv[i * (r + rd)..(i + 1) * (r + rd)];
                exec.kernels()
                    .rmsnorm(&row[..r], &norm_w, MLA_NORM_EPS, &mut normed);
                cc.extend_from_slice(&normed);
                if *rotate {
                    rope.apply(&mut row[r..], cos, sin);
                    for head in qs[i * heads * qk..(i + 1) * heads * qk].chunks_exact_mut(qk) {
                        rope.apply(&mut head[nope..], cos, sin);
                    }
                }
                krc.extend_from_slice(&row[r..]);
            }
            let kvb = kv_b.view(blob)?;
            let scale = cfg.softmax_scale;
            let mut out = vec![0f32; t * heads * vd];
            let (cc, krc, qs) = (&*cc, &*krc, &qs);
            exec.for_each_chunk(&mut out, vd, |idx, o| {
                let (i, head) = (idx / heads, idx % heads);
                let p = pos0 + i;
                let n = p + 1;
                let qh = &qs[(i * heads + head) * qk..(i * heads + head + 1) * qk];
                // Absorb W_uk into the query: q_lat = W_ukᵀ q_nope.
                let base = head * (nope + vd);
                let mut q_lat = vec![0f32; r];
                absorb(exec, &kvb, base..base + nope, &qh[..nope], &mut q_lat);
                let mut scores = vec![0f32; n];
                let mut rs = vec![0f32; n];
                if let (Ok(cm), Ok(km)) = (
                    f32_matrix(&cc[..n * r], n, r),
                    f32_matrix(&krc[..n * rd], n, rd),
                ) {
                    exec.kernels().matmul(&cm, &q_lat, &mut scores, 0..n);
                    exec.kernels().matmul(&km, &qh[nope..], &mut rs, 0..n);
                }
                for (s, b) in scores.iter_mut().zip(&rs) {
                    *s = (*s + b) * scale;
                }
                exec.kernels().softmax(&mut scores);
                let mut o_lat = vec![0f32; r];
                weighted_sum(exec, &scores, &cc[..n * r], r, &mut o_lat);
                // Values: W_uv o_lat.
                exec.kernels()
                    .matmul(&kvb, &o_lat, o, base + nope..base + nope + vd);
            });
            if let Some(g) = gate {
                // Kimi K3: the attention output times σ(g_proj x), before o_proj.
                let mut gl = vec![0f32; t * heads * vd];
                exec.matmul(&g.view(blob)?, x, &mut gl);
                exec.kernels().mul_sigmoid(&mut out, &gl);
            }
            let mut y = vec![0f32; t * h];
            exec.matmul(&o.view(blob)?, &out, &mut y);
            if let Some(b) = bias_of(2) {
                add_bias(&mut y, &b.to_f32(blob));
            }
            Ok(y)
        }
        (AttnSpec::Kda(k), _, LayerCache::Kda(c)) => match &cfg.kda {
            Some(kc) => crate::kda::kda(exec, cfg, kc, k, blob, c, x),
            None => Err(ModelError::Internal(
                "KDA layer without a KDA config".into(),
            )),
        },
        _ => Err(ModelError::Internal(
            "attention spec does not match the configuration".into(),
        )),
    }
}

/// `out = Σ_i x[i] · m[rows.start + i, :]` (a transposed product over a row range), accumulated
/// row by row with fma; packed rows are decoded with their scales (FP8 `kv_b_proj`).
fn absorb(exec: &Exec, m: &Matrix<'_>, rows: std::ops::Range<usize>, x: &[f32], out: &mut [f32]) {
    out.fill(0.0);
    let mut row = vec![0f32; m.cols()];
    for (i, r) in rows.enumerate() {
        decode_row(m, r, 0..m.cols(), &mut row);
        exec.kernels().axpy(x[i], &row, out);
    }
}
