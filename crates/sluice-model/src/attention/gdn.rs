//! Gated DeltaNet (GDN), the linear attention of Qwen3-Next and Qwen3.5.
//!
//! Per value head, a `head_k_dim × head_v_dim` state `S` is carried from token to token. For
//! each token: projections give q, k (per key head), v and the output gate z (per value
//! head), b and a (per value head) — two grouped by key head (Qwen3-Next) or four (Qwen3.5); q, k and v pass together through a short
//! causal depthwise convolution with SiLU (its last `kernel − 1` inputs are carried too); q and
//! k are L2-normalised and q divided by `head_k_dim^½`; each key head serves
//! `value heads / key heads` consecutive value heads; the decay is one scalar per value head,
//! `g = −exp(A_log) · softplus(a + dt_bias)`, and β = σ(b); then the delta rule of
//! [`super::kda`] with that decay on every key channel: `S ← e^g S`, `S ← S + k (β (v − Sᵀk))ᵀ`,
//! `o = Sᵀ q` (the kernels' `kda_step`, shared by both). The output is RMS-normalised per value
//! head, multiplied by SiLU(z) and projected back.
//!
//! As for KDA the recurrence runs token by token with the same arithmetic whatever the tokens
//! per call (transformers' chunked prefill is the same algebra, rounded differently), so
//! chunked prefill gives the same bits as decoding one token at a time; the state lives in
//! [`super::kda::Cache`], with its snapshot for failed passes and truncation.

use sluice_store::Blob;

use super::Ctx;
use super::kda::Cache;
use crate::ModelError;
use crate::spec::{MatSpec, PartBuilder, VecSpec};

/// Gated DeltaNet (`linear_*` fields of a Qwen3-Next config).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GdnConfig {
    /// Query/key heads (`linear_num_key_heads`).
    pub k_heads: usize,
    /// Value heads (`linear_num_value_heads`), a multiple of the key heads.
    pub v_heads: usize,
    /// Query/key dimension per head (`linear_key_head_dim`).
    pub k_dim: usize,
    /// Value dimension per head (`linear_value_head_dim`).
    pub v_dim: usize,
    /// Taps of the causal convolution (`linear_conv_kernel_dim`).
    pub conv_kernel: usize,
    /// The projections are separate (Qwen3.5: `in_proj_qkv`, `in_proj_z`, `in_proj_b`,
    /// `in_proj_a`, each in plain head order) rather than Qwen3-Next's two grouped by key head.
    pub split: bool,
}

/// The input projections of a Gated DeltaNet layer.
#[derive(Clone, Copy, Debug)]
pub enum GdnProj {
    /// `in_proj_qkvz` `[2 key_dim + 2 value_dim, hidden]`, grouped by key head: per key head
    /// its q, k, then the v and z of the value heads it serves; `in_proj_ba` `[2 v_heads,
    /// hidden]` grouped the same way (b then a). Qwen3-Next.
    Grouped {
        /// `in_proj_qkvz`.
        qkvz: MatSpec,
        /// `in_proj_ba`.
        ba: MatSpec,
    },
    /// `in_proj_qkv` `[2 key_dim + value_dim, hidden]` (q, k, v in head order), `in_proj_z`
    /// `[value_dim, hidden]`, `in_proj_b` and `in_proj_a` `[v_heads, hidden]`. Qwen3.5.
    Split {
        /// `in_proj_qkv`.
        qkv: MatSpec,
        /// `in_proj_z`.
        z: MatSpec,
        /// `in_proj_b`.
        b: MatSpec,
        /// `in_proj_a`.
        a: MatSpec,
    },
}

/// The weights of a Gated DeltaNet layer.
#[derive(Clone, Copy, Debug)]
pub struct GdnWeights {
    /// The input projections.
    pub proj: GdnProj,
    /// `conv1d.weight` `[conv_dim, 1, kernel]` over the channels `[q | k | v]`.
    pub conv: VecSpec,
    /// `dt_bias` `[v_heads]`.
    pub dt_bias: VecSpec,
    /// `A_log` `[v_heads]`.
    pub a_log: VecSpec,
    /// `norm.weight` `[v_dim]` of the gated RMSNorm (a plain weight, not zero-centred).
    pub norm: VecSpec,
    /// `out_proj` `[hidden, value_dim]`.
    pub out: MatSpec,
}

impl GdnConfig {
    /// `k_heads × k_dim`.
    pub fn key_dim(&self) -> usize {
        self.k_heads * self.k_dim
    }

    /// `v_heads × v_dim`.
    pub fn value_dim(&self) -> usize {
        self.v_heads * self.v_dim
    }

    /// Channels of the convolution: q, k and v.
    fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// Floats of one layer's recurrent state: `v_heads × k_dim × v_dim`.
    pub fn state_len(&self) -> usize {
        self.v_heads * self.k_dim * self.v_dim
    }

    /// Floats of one layer's convolution state: the last `kernel − 1` inputs.
    pub fn conv_len(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim()
    }

    /// Floats of scratch per token: the two projections, the convolved channels, the
    /// per-head outputs and the normed output.
    pub fn scratch_floats(&self) -> usize {
        2 * (2 * self.key_dim() + 2 * self.value_dim()) + 3 * self.value_dim() + 4 * self.v_heads
    }

    /// The product the arithmetic multiplies out, and the field that names it.
    pub fn widest(&self) -> (usize, usize, &'static str, &'static str) {
        (
            self.v_heads,
            self.k_dim.max(self.v_dim),
            "linear_num_value_heads",
            "linear_num_value_heads × head dimension",
        )
    }

    pub(crate) fn new_cache(&self) -> Cache {
        Cache::new(self.conv_len(), self.state_len())
    }

    /// Finds and checks the layer's tensors; `a` names a tensor of the attention module.
    pub(crate) fn load(
        &self,
        p: &mut PartBuilder<'_, '_>,
        a: &dyn Fn(&str) -> String,
        h: usize,
    ) -> Result<GdnWeights, ModelError> {
        let (kd, vd) = (self.key_dim(), self.value_dim());
        let proj = if self.split {
            GdnProj::Split {
                qkv: p.linear(&a("in_proj_qkv"), 2 * kd + vd, h)?,
                z: p.linear(&a("in_proj_z"), vd, h)?,
                b: p.linear(&a("in_proj_b"), self.v_heads, h)?,
                a: p.linear(&a("in_proj_a"), self.v_heads, h)?,
            }
        } else {
            GdnProj::Grouped {
                qkvz: p.linear(&a("in_proj_qkvz"), 2 * kd + 2 * vd, h)?,
                ba: p.linear(&a("in_proj_ba"), 2 * self.v_heads, h)?,
            }
        };
        Ok(GdnWeights {
            proj,
            conv: p.vector_any(&a("conv1d.weight"), &[self.conv_dim(), 1, self.conv_kernel])?,
            dt_bias: p.vector_any(&a("dt_bias"), &[self.v_heads])?,
            a_log: p.vector_any(&a("A_log"), &[self.v_heads])?,
            norm: p.vector(&a("norm.weight"), self.v_dim)?,
            out: p.linear(&a("out_proj"), h, vd)?,
        })
    }
}

/// The eps of the L2 norm of q and k.
const L2_EPS: f32 = 1e-6;

/// One Gated DeltaNet layer over the normed input `x` `[t, hidden]`, advancing `cache`;
/// returns `[t, hidden]`. The state before the pass is saved first (the first call of a pass),
/// so a failed pass can restore it.
pub(crate) fn forward(
    gc: &GdnConfig,
    cx: &Ctx<'_>,
    spec: &GdnWeights,
    blob: &Blob,
    cache: &mut Cache,
    x: &[f32],
) -> Result<Vec<f32>, ModelError> {
    let exec = cx.exec;
    let k = exec.kernels();
    let h = cx.hidden;
    let t = x.len() / h;
    let (nk, nv, dk, dv, kk) = (gc.k_heads, gc.v_heads, gc.k_dim, gc.v_dim, gc.conv_kernel);
    let r = nv / nk;
    let (kd, vd) = (gc.key_dim(), gc.value_dim());
    let c = gc.conv_dim();
    if cache.at_pass_start(cx.pass_start) {
        cache.save();
    }

    // Per token: `mixed = [q | k | v]` in head order, z, b and a.
    let mut mixed = vec![0f32; t * c];
    let mut z = vec![0f32; t * vd];
    let mut b = vec![0f32; t * nv];
    let mut a = vec![0f32; t * nv];
    match &spec.proj {
        GdnProj::Split {
            qkv,
            z: zm,
            b: bm,
            a: am,
        } => {
            exec.matmul(&qkv.view(blob)?, x, &mut mixed);
            exec.matmul(&zm.view(blob)?, x, &mut z);
            exec.matmul(&bm.view(blob)?, x, &mut b);
            exec.matmul(&am.view(blob)?, x, &mut a);
        }
        GdnProj::Grouped { qkvz: qm, ba: bam } => {
            let mut qkvz = vec![0f32; t * (2 * kd + 2 * vd)];
            exec.matmul(&qm.view(blob)?, x, &mut qkvz);
            let mut ba = vec![0f32; t * 2 * nv];
            exec.matmul(&bam.view(blob)?, x, &mut ba);
            // Ungroup: each key head's q, k, then its value heads' v and z (and b, a).
            let group = 2 * dk + 2 * r * dv;
            for tok in 0..t {
                let src = &qkvz[tok * (2 * kd + 2 * vd)..(tok + 1) * (2 * kd + 2 * vd)];
                let dst = &mut mixed[tok * c..(tok + 1) * c];
                let zt = &mut z[tok * vd..(tok + 1) * vd];
                for g in 0..nk {
                    let s = &src[g * group..(g + 1) * group];
                    dst[g * dk..(g + 1) * dk].copy_from_slice(&s[..dk]);
                    dst[kd + g * dk..kd + (g + 1) * dk].copy_from_slice(&s[dk..2 * dk]);
                    dst[2 * kd + g * r * dv..2 * kd + (g + 1) * r * dv]
                        .copy_from_slice(&s[2 * dk..2 * dk + r * dv]);
                    zt[g * r * dv..(g + 1) * r * dv].copy_from_slice(&s[2 * dk + r * dv..]);
                }
                let bs = &ba[tok * 2 * nv..(tok + 1) * 2 * nv];
                for g in 0..nk {
                    let s = &bs[g * 2 * r..(g + 1) * 2 * r];
                    b[tok * nv + g * r..tok * nv + (g + 1) * r].copy_from_slice(&s[..r]);
                    a[tok * nv + g * r..tok * nv + (g + 1) * r].copy_from_slice(&s[r..]);
                }
            }
        }
    }

    // The causal convolution with SiLU, carrying the last kk − 1 inputs.
    {
        let taps = spec.conv.to_f32(blob); // [c, kk]
        let mut wt = vec![0f32; kk * c]; // [kk, c]
        for ch in 0..c {
            for j in 0..kk {
                wt[j * c + ch] = taps[ch * kk + j];
            }
        }
        let mut xs = Vec::with_capacity(cache.conv.len() + t * c);
        xs.extend_from_slice(&cache.conv);
        xs.extend_from_slice(&mixed);
        for tok in 0..t {
            k.conv_silu(
                &xs[tok * c..(tok + kk) * c],
                &wt,
                &mut mixed[tok * c..(tok + 1) * c],
            );
        }
        let keep = cache.conv.len();
        cache.conv.copy_from_slice(&xs[t * c..t * c + keep]);
    }

    // β = σ(b); the decay e^g with g = −e^A · softplus(a + dt_bias), per value head.
    k.sigmoid(&mut b);
    let dt = spec.dt_bias.to_f32(blob);
    let mut ea = spec.a_log.to_f32(blob);
    k.exp(&mut ea);
    for row in a.chunks_exact_mut(nv) {
        for (v, &bias) in row.iter_mut().zip(&dt) {
            *v += bias;
        }
    }
    k.softplus(&mut a);
    for row in a.chunks_exact_mut(nv) {
        for (v, &e) in row.iter_mut().zip(&ea) {
            *v *= -e;
        }
    }
    k.exp(&mut a);

    // L2-normalised q (then divided by √dk) and k, per key head.
    let root = (dk as f32).sqrt();
    let mut tmp = vec![0f32; dk];
    for row in mixed.chunks_exact_mut(c) {
        for seg in row[..kd].chunks_exact_mut(dk) {
            k.l2norm(seg, L2_EPS, &mut tmp);
            for (s, &v) in seg.iter_mut().zip(&tmp) {
                *s = v / root;
            }
        }
        for seg in row[kd..2 * kd].chunks_exact_mut(dk) {
            k.l2norm(seg, L2_EPS, &mut tmp);
            seg.copy_from_slice(&tmp);
        }
    }

    // The recurrence, one value head per task, tokens in order.
    let mut per_head = vec![0f32; nv * t * dv]; // [head][token][dv]
    {
        let (mixed, beta, decay) = (&mixed, &b, &a);
        exec.for_each_chunk_pair(
            &mut cache.state,
            dk * dv,
            &mut per_head,
            t * dv,
            |hd, st, o| {
                let g = hd / r;
                let mut u = vec![0f32; dv];
                let mut d = vec![0f32; dk];
                for tok in 0..t {
                    let row = &mixed[tok * c..(tok + 1) * c];
                    d.fill(decay[tok * nv + hd]);
                    k.kda_step(
                        st,
                        &row[g * dk..(g + 1) * dk],
                        &row[kd + g * dk..kd + (g + 1) * dk],
                        &row[2 * kd + hd * dv..2 * kd + (hd + 1) * dv],
                        &d,
                        beta[tok * nv + hd],
                        &mut u,
                        &mut o[tok * dv..(tok + 1) * dv],
                    );
                }
            },
        );
    }

    // The gated RMSNorm per value head: w · norm(o) · SiLU(z).
    let w = spec.norm.to_f32(blob);
    let mut normed = vec![0f32; dv];
    let mut y = vec![0f32; t * vd];
    for hd in 0..nv {
        for tok in 0..t {
            let src = &per_head[(hd * t + tok) * dv..(hd * t + tok + 1) * dv];
            k.rmsnorm(src, &w, cx.eps, &mut normed);
            let at = tok * vd + hd * dv;
            k.silu_mul(&z[at..at + dv], &normed, &mut y[at..at + dv]);
        }
    }
    let mut out = vec![0f32; t * h];
    exec.matmul(&spec.out.view(blob)?, &y, &mut out);
    cache.advance(t);
    Ok(out)
}
