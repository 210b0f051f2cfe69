//! Grouped-query attention, with the Qwen3 / OLMoE query-key norms, OLMoE's clamp, sliding
//! windows, GPT-OSS's attention sinks, partial rotary (GLM-4.5, MiniMax-M2: only the first
//! `rope.dim` dimensions of each head are rotated), Qwen3-Next's sigmoid output gate, and
//! MiMo-V2-Flash's values of their own width and scale and its per-layer-type rotary table, and
//! Llama 4's NoPE layers, attention temperature, RMS-divided q/k after rotation and chunked
//! attention, and Step-3.7's per-head sigmoid gate. The cache holds every position's keys and
//! values per KV head.

use sluice_store::Blob;

use super::{Ctx, add_bias, f32_matrix, rmsnorm_rows};
use crate::ModelError;
use crate::spec::{MatSpec, PartBuilder, VecSpec};

/// Which norm is applied to queries and keys before RoPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    /// None.
    None,
    /// RMSNorm over each head (`head_dim` weights): Qwen3.
    PerHead,
    /// RMSNorm over the whole projection: OLMoE.
    Full,
}

/// The shape of a grouped-query attention layer.
#[derive(Clone, Debug, PartialEq)]
pub struct GqaConfig {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Dimension per head.
    pub head_dim: usize,
    /// Biases on q, k, v.
    pub qkv_bias: bool,
    /// Bias on the output projection.
    pub o_bias: bool,
    /// Query/key norm.
    pub qk_norm: QkNorm,
    /// Clamp of q, k, v (OLMoE `clip_qkv`).
    pub clip_qkv: Option<f32>,
    /// This layer's sliding window: a query at position q sees keys k with q − W < k ≤ q.
    pub window: Option<usize>,
    /// A learned per-head sink logit joins each softmax and is dropped after it (GPT-OSS).
    pub sinks: bool,
    /// `q_proj` also gives a gate per query dimension (per head `[q | gate]`); the attention
    /// output is multiplied by its sigmoid before `o_proj` (Qwen3-Next).
    pub output_gate: bool,
    /// `g_proj` gives one gate per query head; the head's attention output is multiplied by
    /// its sigmoid before `o_proj` (Step-3.7's per-head gating).
    pub head_gate: bool,
    /// The q/k norms scale by `1 + w` (Qwen3-Next's zero-centred norms).
    pub zero_centred_qk_norm: bool,
    /// Dimension of a value head (MiMo-V2-Flash: smaller than `head_dim`; else equal).
    pub v_head_dim: usize,
    /// Values are multiplied by this after their projection (MiMo's `attention_value_scale`).
    pub v_scale: Option<f32>,
    /// Rotated by the model's second table ([`crate::ModelConfig::local_rope`]).
    pub local_rope: bool,
    /// Not rotated at all (Llama 4's NoPE layers).
    pub nope: bool,
    /// Queries and keys, after rotation, divided per head by their root mean square (with the
    /// model's eps, no weight: Llama 4's `L2Norm`).
    pub rms_qk_after_rope: bool,
    /// Llama 4's attention temperature on queries, `(floor_scale, attn_scale)`: at position p
    /// they are multiplied by `log1p(floor((p + 1) / floor_scale)) · attn_scale + 1`.
    pub temperature: Option<(f32, f32)>,
    /// Chunked attention: a query sees only the keys of its own chunk of this many positions
    /// (Llama 4's `attention_chunk_size`).
    pub chunk: Option<usize>,
    /// Softmax scale of the scores.
    pub softmax_scale: f32,
}

/// The weights of a grouped-query attention layer.
#[derive(Clone, Debug)]
pub struct GqaWeights {
    /// Query projection.
    pub q: MatSpec,
    /// Key projection.
    pub k: MatSpec,
    /// Value projection.
    pub v: MatSpec,
    /// Output projection.
    pub o: MatSpec,
    /// Biases of q, k, v.
    pub qkv_bias: Option<[VecSpec; 3]>,
    /// Output bias.
    pub o_bias: Option<VecSpec>,
    /// Query and key norm weights.
    pub qk_norm: Option<[VecSpec; 2]>,
    /// Per-head sink logits (GPT-OSS).
    pub sinks: Option<VecSpec>,
    /// The per-head gate's projection `g_proj` `[heads, hidden]` (Step-3.7).
    pub head_gate: Option<MatSpec>,
}

/// Keys and values per KV head, `[pos, head_dim]` and `[pos, v_head_dim]`.
#[derive(Clone, Debug)]
pub(crate) struct Cache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    head_dim: usize,
    v_head_dim: usize,
}

impl Cache {
    /// Its buffers, for saving: every KV head's keys, then every head's values.
    pub(crate) fn parts(&self) -> Vec<&[f32]> {
        self.k.iter().chain(&self.v).map(Vec::as_slice).collect()
    }

    /// Takes saved buffers of `pos` positions (as [`Cache::parts`] gave them).
    pub(crate) fn restore(&mut self, mut parts: Vec<Vec<f32>>, pos: usize) -> Result<(), String> {
        let heads = self.k.len();
        if parts.len() != 2 * heads {
            return Err(format!("{} buffers for {heads} KV heads", parts.len()));
        }
        let v = parts.split_off(heads);
        if parts.iter().any(|x| x.len() != pos * self.head_dim)
            || v.iter().any(|x| x.len() != pos * self.v_head_dim)
        {
            return Err(format!("KV buffers are not {pos} positions long"));
        }
        self.k = parts;
        self.v = v;
        Ok(())
    }

    pub(crate) fn truncate(&mut self, pos: usize) {
        for x in &mut self.k {
            x.truncate(pos * self.head_dim);
        }
        for x in &mut self.v {
            x.truncate(pos * self.v_head_dim);
        }
    }

    /// A copy of the first `pos` positions (at most those held), with no spare room.
    pub(crate) fn prefix(&self, pos: usize) -> Cache {
        let cut = |b: &[Vec<f32>], w: usize| b.iter().map(|x| x[..pos * w].to_vec()).collect();
        Cache {
            k: cut(&self.k, self.head_dim),
            v: cut(&self.v, self.v_head_dim),
            head_dim: self.head_dim,
            v_head_dim: self.v_head_dim,
        }
    }

    pub(crate) fn reserve(&mut self, positions: usize) {
        for x in &mut self.k {
            super::room(x, positions * self.head_dim);
        }
        for x in &mut self.v {
            super::room(x, positions * self.v_head_dim);
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(|x| x.len() * 4).sum()
    }
}

impl GqaConfig {
    /// `heads × head_dim` and `kv_heads × head_dim`.
    fn widths(&self) -> (usize, usize) {
        (self.heads * self.head_dim, self.kv_heads * self.head_dim)
    }

    /// Floats cached per position.
    pub fn kv_floats(&self) -> usize {
        self.kv_heads * (self.head_dim + self.v_head_dim)
    }

    /// Floats of scratch per token of a pass.
    pub fn scratch_floats(&self) -> usize {
        let gate = if self.output_gate { 2 * self.heads } else { 0 };
        (self.heads + 2 * self.kv_heads + gate) * self.head_dim.max(self.v_head_dim)
    }

    /// The product the arithmetic multiplies out, and the field that names it, for the
    /// config's size checks.
    pub fn widest(&self) -> (usize, usize, &'static str, &'static str) {
        (
            self.heads,
            self.head_dim,
            "num_attention_heads",
            "num_attention_heads × head_dim",
        )
    }

    pub(crate) fn new_cache(&self) -> Cache {
        Cache {
            k: vec![Vec::new(); self.kv_heads],
            v: vec![Vec::new(); self.kv_heads],
            head_dim: self.head_dim,
            v_head_dim: self.v_head_dim,
        }
    }

    /// Finds and checks the layer's tensors; `a` names a tensor of the attention module.
    pub(crate) fn load(
        &self,
        p: &mut PartBuilder<'_, '_>,
        a: &dyn Fn(&str) -> String,
        h: usize,
    ) -> Result<GqaWeights, ModelError> {
        let (qd, kd) = self.widths();
        let (vd, od) = (
            self.kv_heads * self.v_head_dim,
            self.heads * self.v_head_dim,
        );
        let zc = self.zero_centred_qk_norm;
        // With an output gate, q_proj gives each head's queries and then its gate.
        let qrows = if self.output_gate { 2 * qd } else { qd };
        Ok(GqaWeights {
            q: p.linear(&a("q_proj"), qrows, h)?,
            k: p.linear(&a("k_proj"), kd, h)?,
            v: p.linear(&a("v_proj"), vd, h)?,
            o: p.linear(&a("o_proj"), h, od)?,
            qkv_bias: if self.qkv_bias {
                Some([
                    p.vector(&a("q_proj.bias"), qrows)?,
                    p.vector(&a("k_proj.bias"), kd)?,
                    p.vector(&a("v_proj.bias"), vd)?,
                ])
            } else {
                None
            },
            o_bias: if self.o_bias {
                Some(p.vector(&a("o_proj.bias"), h)?)
            } else {
                None
            },
            qk_norm: match self.qk_norm {
                QkNorm::None => None,
                QkNorm::PerHead => Some([
                    p.vector(&a("q_norm.weight"), self.head_dim)?.norm(zc),
                    p.vector(&a("k_norm.weight"), self.head_dim)?.norm(zc),
                ]),
                QkNorm::Full => Some([
                    p.vector(&a("q_norm.weight"), qd)?.norm(zc),
                    p.vector(&a("k_norm.weight"), kd)?.norm(zc),
                ]),
            },
            // `sinks` (GPT-OSS), or `attention_sink_bias` (MiMo-V2-Flash's checkpoints).
            sinks: if self.sinks {
                let alt = a("attention_sink_bias");
                let name = if p.checkpoint().get(&a("sinks")).is_none()
                    && p.checkpoint().get(&alt).is_some()
                {
                    alt
                } else {
                    a("sinks")
                };
                Some(p.vector(&name, self.heads)?)
            } else {
                None
            },
            head_gate: if self.head_gate {
                Some(p.linear(&a("g_proj"), self.heads, h)?)
            } else {
                None
            },
        })
    }

    /// The layer over `x` `[t, hidden]` at positions `pos0..pos0 + t`, appending to `cache`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        cx: &Ctx<'_>,
        w: &GqaWeights,
        blob: &Blob,
        cache: &mut Cache,
        pos0: usize,
        x: &[f32],
    ) -> Result<Vec<f32>, ModelError> {
        let exec = cx.exec;
        let h = cx.hidden;
        let t = x.len() / h;
        let (heads, kvh, hd, vd) = (self.heads, self.kv_heads, self.head_dim, self.v_head_dim);
        let qw = if self.output_gate { 2 * hd } else { hd };
        let mut qs = vec![0f32; t * heads * qw];
        let mut ks = vec![0f32; t * kvh * hd];
        let mut vs = vec![0f32; t * kvh * vd];
        exec.matmul(&w.q.view(blob)?, x, &mut qs);
        exec.matmul(&w.k.view(blob)?, x, &mut ks);
        exec.matmul(&w.v.view(blob)?, x, &mut vs);
        if let Some([qb, kb, vb]) = &w.qkv_bias {
            add_bias(&mut qs, &qb.to_f32(blob));
            add_bias(&mut ks, &kb.to_f32(blob));
            add_bias(&mut vs, &vb.to_f32(blob));
        }
        // Split each head's `[q | gate]`.
        let gate = if self.output_gate {
            if vd != hd {
                return Err(ModelError::Mismatch {
                    what: "an output gate needs values as wide as queries".into(),
                });
            }
            let mut q = Vec::with_capacity(t * heads * hd);
            let mut g = Vec::with_capacity(t * heads * hd);
            for head in qs.chunks_exact(2 * hd) {
                q.extend_from_slice(&head[..hd]);
                g.extend_from_slice(&head[hd..]);
            }
            qs = q;
            Some(g)
        } else {
            None
        };
        if let Some([qn, kn]) = &w.qk_norm {
            let (qn, kn) = (qn.to_f32(blob), kn.to_f32(blob));
            // Full: over the whole projection (OLMoE); per head: over each head (Qwen3).
            rmsnorm_rows(exec, &mut qs, &qn, cx.eps);
            rmsnorm_rows(exec, &mut ks, &kn, cx.eps);
        }
        if let Some(c) = self.clip_qkv {
            for a in qs.iter_mut().chain(ks.iter_mut()).chain(vs.iter_mut()) {
                *a = a.clamp(-c, c);
            }
        }
        if let Some(sc) = self.v_scale {
            for a in &mut vs {
                *a *= sc;
            }
        }
        let (rope, angles) = match (self.local_rope, cx.local) {
            (true, Some(local)) => local,
            (true, None) => {
                return Err(ModelError::Mismatch {
                    what: "a layer asks for the second rotary table, which the model lacks".into(),
                });
            }
            (false, _) => (cx.rope, cx.angles),
        };
        let (kc, vc) = (&mut cache.k, &mut cache.v);
        // The first `rot` dimensions of each head are rotated (all of them unless the model
        // rotates part of each head, `partial_rotary_factor`).
        let rot = if self.nope { 0 } else { 2 * rope.pairs() };
        let ones = vec![1f32; if self.rms_qk_after_rope { hd } else { 0 }];
        let mut tmp = vec![0f32; ones.len()];
        for i in 0..t {
            let (cos, sin) = angles.get(i);
            let temp = self.temperature.map(|(floor_scale, attn_scale)| {
                let p = (pos0 + i) as f32;
                libm::log1pf(((p + 1.0) / floor_scale).floor()) * attn_scale + 1.0
            });
            for head in qs[i * heads * hd..(i + 1) * heads * hd].chunks_exact_mut(hd) {
                if rot > 0 {
                    rope.apply(&mut head[..rot], cos, sin);
                }
                if !ones.is_empty() {
                    exec.kernels().rmsnorm(head, &ones, cx.eps, &mut tmp);
                    head.copy_from_slice(&tmp);
                }
                if let Some(s) = temp {
                    for v in head.iter_mut() {
                        *v *= s;
                    }
                }
            }
            for head in ks[i * kvh * hd..(i + 1) * kvh * hd].chunks_exact_mut(hd) {
                if rot > 0 {
                    rope.apply(&mut head[..rot], cos, sin);
                }
                if !ones.is_empty() {
                    exec.kernels().rmsnorm(head, &ones, cx.eps, &mut tmp);
                    head.copy_from_slice(&tmp);
                }
            }
            for g in 0..kvh {
                let at = (i * kvh + g) * hd;
                kc[g].extend_from_slice(&ks[at..at + hd]);
                let av = (i * kvh + g) * vd;
                vc[g].extend_from_slice(&vs[av..av + vd]);
            }
        }
        let group = heads / kvh;
        let scale = self.softmax_scale;
        let (window, chunk) = (self.window, self.chunk);
        let sinks = w.sinks.map(|s| s.to_f32(blob));
        let sinks = sinks.as_deref();
        let (kc, vc) = (&*kc, &*vc);
        let qs = &qs;
        // Tiles of query-head rows of one KV group (rows `(i, head in group)` in that order):
        // the tile's scores are one product against the group's keys, and each cached value
        // row is read once per tile.
        let per_g = t * group;
        let rows = super::tile_rows(pos0 + t, t * heads, exec.threads(), cx.score_floats);
        let tiles: Vec<(usize, usize, usize)> = (0..kvh)
            .flat_map(|g| {
                (0..per_g)
                    .step_by(rows)
                    .map(move |b0| (g, b0, rows.min(per_g - b0)))
            })
            .collect();
        let done = exec.map(tiles.len(), |ti| {
            let (g, b0, nb) = tiles[ti];
            let pos = |b: usize| pos0 + b / group;
            let lo_of = |p: usize| {
                let w = window.map_or(0, |w| (p + 1).saturating_sub(w));
                w.max(chunk.map_or(0, |c| p / c * c))
            };
            // Keys the tile's rows see, together.
            let (lo, hi) = (lo_of(pos(b0)), pos(b0 + nb - 1) + 1);
            let nk = hi - lo;
            let mut qrows = Vec::with_capacity(nb * hd);
            for b in b0..b0 + nb {
                let head = g * group + b % group;
                let i = b / group;
                qrows.extend_from_slice(&qs[(i * heads + head) * hd..(i * heads + head + 1) * hd]);
            }
            let mut scores = vec![0f32; nb * nk];
            // Shapes are consistent by construction.
            if let Ok(m) = f32_matrix(&kc[g][lo * hd..hi * hd], nk, hd) {
                exec.kernels().matmul(&m, &qrows, &mut scores, 0..nk);
            }
            // Per row: its own keys' scores (with a sink, one more logit joins the softmax and
            // is dropped after it); the tile's other keys get probability +0, whose terms
            // fma(+0, v, acc) leave the sum as it is.
            let mut row = Vec::with_capacity(nk + 1);
            for (k, s) in scores.chunks_exact_mut(nk).enumerate() {
                let b = b0 + k;
                let p = pos(b);
                let from = lo_of(p) - lo;
                let n = p + 1 - lo_of(p);
                row.clear();
                row.extend(s[from..from + n].iter().map(|x| x * scale));
                if let Some(sk) = sinks {
                    row.push(sk[g * group + b % group]);
                }
                exec.kernels().softmax(&mut row);
                s.fill(0.0);
                s[from..from + n].copy_from_slice(&row[..n]);
            }
            // o = Σ_j p_j v_j per row, in position order: one product of the tile's
            // probabilities with the cached values.
            let mut o = vec![0f32; nb * vd];
            if let Ok(m) = f32_matrix(&vc[g][lo * vd..hi * vd], nk, vd) {
                exec.kernels().matmul_xw(&m, &scores, &mut o, 0..vd);
            }
            o
        });
        let mut out = vec![0f32; t * heads * vd];
        for (&(g, b0, _), o) in tiles.iter().zip(&done) {
            for (k, ob) in o.chunks_exact(vd).enumerate() {
                let b = b0 + k;
                let head = g * group + b % group;
                let i = b / group;
                out[(i * heads + head) * vd..(i * heads + head + 1) * vd].copy_from_slice(ob);
            }
        }
        if let Some(g) = &gate {
            exec.kernels().mul_sigmoid(&mut out, g);
        }
        if let Some(gp) = &w.head_gate {
            // One gate per row and head, over the head's values.
            let mut gl = vec![0f32; t * heads];
            exec.matmul(&gp.view(blob)?, x, &mut gl);
            for (o, &g) in out.chunks_exact_mut(vd).zip(&gl) {
                let s = sluice_kernels::scalar::sigmoid(g);
                for v in o {
                    *v *= s;
                }
            }
        }
        let mut y = vec![0f32; t * h];
        exec.matmul(&w.o.view(blob)?, &out, &mut y);
        if let Some(b) = &w.o_bias {
            add_bias(&mut y, &b.to_f32(blob));
        }
        Ok(y)
    }
}
