//! DeepSeek's multi-head latent attention, computed on the compressed cache by weight
//! absorption: the cache holds per position the normalised latent `c` (`kv_lora_rank` values)
//! and the shared rope key; scores are `q_lat · c + q_rope · k_rope` with `q_lat = W_ukᵀ q_nope`,
//! and the attention-weighted latent is multiplied by `W_uv` afterwards.
//!
//! Every head reads the same cache, so queries are taken in tiles of query-head rows
//! ([`super::tile_rows`]): the scores of a whole tile are one product against the cache, and
//! each cached row is read once per tile for the weighted sum, instead of once per query and
//! head. Each row's arithmetic — its dot products, its softmax over its own positions, its sum
//! in position order — is the same whatever the tile, so a prompt gives the same bits in one
//! pass, in chunks or token by token.

use sluice_store::Blob;

use super::{Ctx, add_bias, f32_matrix, rmsnorm_rows};
use crate::ModelError;
use crate::spec::{MatSpec, PartBuilder, VecSpec};

/// The eps of DeepSeek's `q_a_layernorm` / `kv_a_layernorm` (transformers constructs them without
/// passing `rms_norm_eps`); the families whose latent norms take `rms_norm_eps` say so in
/// [`MlaConfig::norm_eps`].
pub const MLA_NORM_EPS: f32 = 1e-6;

/// The shape of a multi-head latent attention layer (DeepSeek-V2/V3).
#[derive(Clone, Debug, PartialEq)]
pub struct MlaConfig {
    /// Heads.
    pub heads: usize,
    /// Query low-rank dimension (`None`: a full `q_proj`).
    pub q_lora_rank: Option<usize>,
    /// Latent key/value dimension.
    pub kv_lora_rank: usize,
    /// Per-head key/query dimension without rotary embedding.
    pub qk_nope_head_dim: usize,
    /// Per-head rotary dimension (one shared rotary key).
    pub qk_rope_head_dim: usize,
    /// Per-head value dimension.
    pub v_head_dim: usize,
    /// Bias on `q_a_proj`, `kv_a_proj_with_mqa` and `o_proj` (each where the checkpoint has it).
    pub bias: bool,
    /// The rotary part is rotated (false: NoPE, as Kimi Linear and K3 — the part still
    /// exists, is cached and takes part in the scores, unrotated).
    pub rope: bool,
    /// The attention output is multiplied by `σ(W x)` before `o_proj`, `W` the tensor named
    /// here (Kimi K3's `mla_use_output_gate`: `g_proj`; Hy4: `gate_proj`).
    pub output_gate: Option<&'static str>,
    /// A learned per-head sink logit (`sinks`, `[heads]`) joins each softmax and is dropped
    /// after it (Hy4).
    pub sinks: bool,
    /// Softmax scale of the scores.
    pub softmax_scale: f32,
    /// Factors on the queries (after `q_b_proj`, before rotation) and on the normalised latent
    /// (before it is cached): LongCat-Flash's `mla_scale_q_lora` and `mla_scale_kv_lora`.
    pub lora_scales: Option<(f32, f32)>,
    /// The eps of the latent norms (`q_a_layernorm`, `kv_a_layernorm`).
    pub norm_eps: f32,
    /// Each head's query is multiplied by `scale_h · ln(pos + 1) + bias_h` at position `pos`,
    /// from the tensors `softmax_scaling.{scale,bias}` (Mistral Large 4).
    pub log_scaling: bool,
    /// The layer computes no latent of its own: it attends to the cache of this earlier layer
    /// (Mistral Large 4's `kv_source_layers`), which has the same rotary part, and has no
    /// `kv_a_proj_with_mqa` or `kv_a_layernorm`; its own cache holds nothing.
    pub kv_source: Option<usize>,
}

/// The up-projection of the latent: keys' `W_uk` and values' `W_uv`, per head.
#[derive(Clone, Copy, Debug)]
pub enum KvB {
    /// `kv_b_proj` `[heads · (nope + v), rank]`: each head's `nope` rows of `W_uk`, then its
    /// `v` rows of `W_uv`. A query's latent is `W_ukᵀ q_nope`, the transposed product over
    /// the head's rows (`absorb`).
    Joint(MatSpec),
    /// llama.cpp's layout of DeepSeek's GGUF files: `k_b_proj` `[heads · rank, nope]` holds
    /// each head's `W_ukᵀ` (so a query's latent is a plain product, in the contract's lane
    /// order rather than row by row) and `v_b_proj` `[heads · v, rank]` each head's `W_uv`.
    Split {
        /// `W_ukᵀ` per head.
        k_b: MatSpec,
        /// `W_uv` per head.
        v_b: MatSpec,
    },
}

/// The weights of a multi-head latent attention layer.
#[derive(Clone, Debug)]
pub struct MlaWeights {
    /// `q_a_proj` and `q_a_layernorm` when q is low-rank.
    pub q_a: Option<(MatSpec, VecSpec)>,
    /// `q_b_proj` (or `q_proj`).
    pub q_b: MatSpec,
    /// `kv_a_proj_with_mqa` and `kv_a_layernorm`, unless the layer reads another's latents.
    pub kv_a: Option<(MatSpec, VecSpec)>,
    /// `kv_b_proj`, or the halves llama.cpp's converter splits it into.
    pub kv_b: KvB,
    /// `o_proj`.
    pub o: MatSpec,
    /// Biases of `q_a_proj`, `kv_a_proj_with_mqa`, `o_proj` when `attention_bias`.
    pub bias: Option<[Option<VecSpec>; 3]>,
    /// Output gate (Kimi K3, Hy4).
    pub gate: Option<MatSpec>,
    /// Per-head sink logits.
    pub sinks: Option<VecSpec>,
    /// `softmax_scaling.scale` and `.bias` (`[heads]` each), with [`MlaConfig::log_scaling`].
    pub log_scaling: Option<[VecSpec; 2]>,
}

/// MLA's cache: per position the compressed latent (`kv_lora_rank` values) followed by the
/// shared rotated key (`rope` values), `[pos, rank + rope]`, so that a query's scores are one
/// dot product per position with `[q_lat, q_rope]`.
#[derive(Clone, Debug)]
pub(crate) struct Cache {
    ckr: Vec<f32>,
    rank: usize,
    rope: usize,
}

impl Cache {
    fn width(&self) -> usize {
        self.rank + self.rope
    }

    pub(crate) fn truncate(&mut self, pos: usize) {
        self.ckr.truncate(pos * self.width());
    }

    /// Its buffer, for saving: `[latent, rope key]` per position.
    pub(crate) fn parts(&self) -> Vec<&[f32]> {
        vec![&self.ckr]
    }

    /// Takes a saved buffer of `pos` positions.
    pub(crate) fn restore(&mut self, mut parts: Vec<Vec<f32>>, pos: usize) -> Result<(), String> {
        match parts.pop() {
            Some(c) if parts.is_empty() && c.len() == pos * self.width() => {
                self.ckr = c;
                Ok(())
            }
            _ => Err(format!("the latent cache is not {pos} positions long")),
        }
    }

    /// A copy of the first `pos` positions (at most those held), with no spare room.
    pub(crate) fn prefix(&self, pos: usize) -> Cache {
        Cache {
            ckr: self.ckr[..pos * self.width()].to_vec(),
            rank: self.rank,
            rope: self.rope,
        }
    }

    pub(crate) fn reserve(&mut self, positions: usize) {
        let w = self.width();
        super::room(&mut self.ckr, positions * w);
    }

    pub(crate) fn bytes(&self) -> usize {
        self.ckr.len() * 4
    }
}

/// Multiplies each head's row of `q` (one position's queries, `[heads, d]`) by
/// `scale_h · ln(pos + 1) + bias_h`, as transformers' `MistralLarge4TextSoftmaxScaling` does.
pub(crate) fn log_scale(q: &mut [f32], scale: &[f32], bias: &[f32], pos: usize) {
    let lp = ((pos + 1) as f32).ln();
    let d = q.len() / scale.len();
    for ((head, &s), &b) in q.chunks_exact_mut(d).zip(scale).zip(bias) {
        let f = s * lp + b;
        for v in head {
            *v *= f;
        }
    }
}

impl MlaConfig {
    /// Floats cached per position (none when the layer reads another's cache).
    pub fn kv_floats(&self) -> usize {
        if self.kv_source.is_some() {
            return 0;
        }
        self.latent_width()
    }

    /// A cached position's width: the latent and the rotary key.
    fn latent_width(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// Floats of scratch per token of a pass.
    pub fn scratch_floats(&self) -> usize {
        self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)
            + self.kv_lora_rank * 2
    }

    /// The product the arithmetic multiplies out, and the field that names it.
    pub fn widest(&self) -> (usize, usize, &'static str, &'static str) {
        (
            self.heads,
            self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim,
            "num_attention_heads",
            "num_attention_heads × (qk_nope_head_dim + qk_rope_head_dim + v_head_dim)",
        )
    }

    pub(crate) fn new_cache(&self) -> Cache {
        let own = self.kv_source.is_none();
        Cache {
            ckr: Vec::new(),
            rank: if own { self.kv_lora_rank } else { 0 },
            rope: if own { self.qk_rope_head_dim } else { 0 },
        }
    }

    /// Finds and checks the layer's tensors; `a` names a tensor of the attention module.
    pub(crate) fn load(
        &self,
        p: &mut PartBuilder<'_, '_>,
        a: &dyn Fn(&str) -> String,
        h: usize,
    ) -> Result<MlaWeights, ModelError> {
        let (heads, r, rd) = (self.heads, self.kv_lora_rank, self.qk_rope_head_dim);
        let qk = self.qk_nope_head_dim + rd;
        let (q_a, q_b) = match self.q_lora_rank {
            Some(qr) => (
                Some((
                    p.linear(&a("q_a_proj"), qr, h)?,
                    p.vector(&a("q_a_layernorm.weight"), qr)?,
                )),
                p.linear(&a("q_b_proj"), heads * qk, qr)?,
            ),
            None => (None, p.linear(&a("q_proj"), heads * qk, h)?),
        };
        let kv_a = match self.kv_source {
            None => Some((
                p.linear(&a("kv_a_proj_with_mqa"), r + rd, h)?,
                p.vector(&a("kv_a_layernorm.weight"), r)?,
            )),
            Some(_) => None,
        };
        let log_scaling = if self.log_scaling {
            Some([
                p.vector(&a("softmax_scaling.scale"), heads)?,
                p.vector(&a("softmax_scaling.bias"), heads)?,
            ])
        } else {
            None
        };
        let ck = p.checkpoint();
        let kv_b = if ck.get(&a("kv_b_proj.weight")).is_none()
            && ck.get(&a("k_b_proj.weight")).is_some()
        {
            KvB::Split {
                k_b: p.linear(&a("k_b_proj"), heads * r, self.qk_nope_head_dim)?,
                v_b: p.linear(&a("v_b_proj"), heads * self.v_head_dim, r)?,
            }
        } else {
            KvB::Joint(p.linear(
                &a("kv_b_proj"),
                heads * (self.qk_nope_head_dim + self.v_head_dim),
                r,
            )?)
        };
        let o = p.linear(&a("o_proj"), h, heads * self.v_head_dim)?;
        let gate = match self.output_gate {
            Some(name) => Some(p.linear(&a(name), heads * self.v_head_dim, h)?),
            None => None,
        };
        let sinks = if self.sinks {
            Some(p.vector(&a("sinks"), heads)?)
        } else {
            None
        };
        let bias = if self.bias {
            Some([
                match self.q_lora_rank {
                    Some(qr) => p.optional_vector(&a("q_a_proj.bias"), qr)?,
                    None => None,
                },
                match self.kv_source {
                    None => p.optional_vector(&a("kv_a_proj_with_mqa.bias"), r + rd)?,
                    Some(_) => None,
                },
                p.optional_vector(&a("o_proj.bias"), h)?,
            ])
        } else {
            None
        };
        Ok(MlaWeights {
            q_a,
            q_b,
            kv_a,
            kv_b,
            o,
            bias,
            gate,
            log_scaling,
            sinks,
        })
    }

    /// The layer over `x` `[t, hidden]` at positions `pos0..pos0 + t`, appending to `cache`.
    pub(crate) fn forward(
        &self,
        cx: &Ctx<'_>,
        w: &MlaWeights,
        blob: &Blob,
        cache: &mut Cache,
        pos0: usize,
        x: &[f32],
    ) -> Result<Vec<f32>, ModelError> {
        self.forward_selected(cx, w, blob, cache, pos0, x, None)
    }

    /// [`MlaConfig::forward`] where row `i`'s query may attend only to the positions
    /// `select[i]` holds, when it holds some (DeepSeek Sparse Attention's top-k); the other
    /// positions get probability 0, as transformers' mask gives them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward_selected(
        &self,
        cx: &Ctx<'_>,
        w: &MlaWeights,
        blob: &Blob,
        cache: &mut Cache,
        pos0: usize,
        x: &[f32],
        select: Option<&[Option<Vec<usize>>]>,
    ) -> Result<Vec<f32>, ModelError> {
        let exec = cx.exec;
        let h = cx.hidden;
        let t = x.len() / h;
        let (heads, r, nope, rd, vd) = (
            self.heads,
            self.kv_lora_rank,
            self.qk_nope_head_dim,
            self.qk_rope_head_dim,
            self.v_head_dim,
        );
        let qk = nope + rd;
        let bias_of =
            |i: usize| -> Option<&VecSpec> { w.bias.as_ref().and_then(|b| b[i].as_ref()) };
        // Queries.
        let mut qs = vec![0f32; t * heads * qk];
        match &w.q_a {
            Some((qa, qa_norm)) => {
                let mut lat = vec![0f32; t * qa.rows];
                exec.matmul(&qa.view(blob)?, x, &mut lat);
                if let Some(b) = bias_of(0) {
                    add_bias(&mut lat, &b.to_f32(blob));
                }
                rmsnorm_rows(exec, &mut lat, &qa_norm.to_f32(blob), self.norm_eps);
                exec.matmul(&w.q_b.view(blob)?, &lat, &mut qs);
            }
            None => exec.matmul(&w.q_b.view(blob)?, x, &mut qs),
        }
        let kv_scale = match self.lora_scales {
            Some((q_scale, kv_scale)) => {
                for v in &mut qs {
                    *v *= q_scale;
                }
                Some(kv_scale)
            }
            None => None,
        };
        let cw = r + rd;
        // Compressed keys/values, unless the layer reads another's.
        if let Some((kv_a, kv_a_norm)) = &w.kv_a {
            let mut ckv = vec![0f32; t * cw];
            exec.matmul(&kv_a.view(blob)?, x, &mut ckv);
            if let Some(b) = bias_of(1) {
                add_bias(&mut ckv, &b.to_f32(blob));
            }
            let norm_w = kv_a_norm.to_f32(blob);
            let mut normed = vec![0f32; r];
            for i in 0..t {
                let (cos, sin) = cx.angles.get(i);
                let row = &mut ckv[i * cw..(i + 1) * cw];
                exec.kernels()
                    .rmsnorm(&row[..r], &norm_w, self.norm_eps, &mut normed);
                if let Some(s) = kv_scale {
                    for v in &mut normed {
                        *v *= s;
                    }
                }
                cache.ckr.extend_from_slice(&normed);
                if self.rope {
                    cx.rope.apply(&mut row[r..], cos, sin);
                }
                cache.ckr.extend_from_slice(&row[r..]);
            }
        }
        let log_scaling = w
            .log_scaling
            .as_ref()
            .map(|[s, b]| (s.to_f32(blob), b.to_f32(blob)));
        for i in 0..t {
            let q = &mut qs[i * heads * qk..(i + 1) * heads * qk];
            if self.rope {
                let (cos, sin) = cx.angles.get(i);
                for head in q.chunks_exact_mut(qk) {
                    cx.rope.apply(&mut head[nope..], cos, sin);
                }
            }
            if let Some((s, b)) = &log_scaling {
                log_scale(q, s, b, pos0 + i);
            }
        }
        let ckr: &[f32] = match (&w.kv_a, cx.latent) {
            (Some(_), _) => &cache.ckr,
            (None, Some(src)) if src.width() == cw => &src.ckr,
            (None, _) => {
                return Err(ModelError::Mismatch {
                    what: "a layer sharing another's latent cache was run without it".into(),
                });
            }
        };
        // The keys' and the values' matrices, and where head `h`'s rows start in each:
        // `h · k_stride` and `h · v_stride + v_off`.
        let (kb, vb, k_stride, v_stride, v_off) = match &w.kv_b {
            KvB::Joint(m) => {
                let m = m.view(blob)?;
                (m, m, nope + vd, nope + vd, nope)
            }
            KvB::Split { k_b, v_b } => (k_b.view(blob)?, v_b.view(blob)?, r, vd, 0),
        };
        let (k_at, v_at) = (|h: usize| h * k_stride, |h: usize| h * v_stride + v_off);
        let split = matches!(w.kv_b, KvB::Split { .. });
        // Per query and head, `[q_lat, q_rope]` with q_lat = W_ukᵀ q_nope (W_uk absorbed): each
        // head's queries of every row in one product (heads across the threads), so that its
        // slice of the weights is decoded once per pass, not once per row.
        let mut lat = vec![0f32; heads * t * r];
        exec.for_each_chunk(&mut lat, t * r, |hd, y| {
            let mut xh = Vec::with_capacity(t * nope);
            for i in 0..t {
                let q0 = (i * heads + hd) * qk;
                xh.extend_from_slice(&qs[q0..q0 + nope]);
            }
            let base = k_at(hd);
            if split {
                exec.kernels().matmul(&kb, &xh, y, base..base + r);
            } else {
                exec.kernels().absorb(&kb, base..base + nope, &xh, y);
            }
        });
        let mut qa = vec![0f32; t * heads * cw];
        for (idx, q) in qa.chunks_exact_mut(cw).enumerate() {
            let (i, hd) = (idx / heads, idx % heads);
            q[..r].copy_from_slice(&lat[(hd * t + i) * r..][..r]);
            q[r..].copy_from_slice(&qs[idx * qk + nope..(idx + 1) * qk]);
        }
        drop(lat);
        let scale = self.softmax_scale;
        let sinks = w.sinks.map(|s| s.to_f32(blob));
        let sinks = sinks.as_deref();
        let mut out = vec![0f32; t * heads * vd];
        let rows = super::tile_rows(pos0 + t, t * heads, exec.threads(), cx.score_floats);
        exec.for_each_chunk(&mut out, rows * vd, |tile, o| {
            let b0 = tile * rows;
            let nb = o.len() / vd;
            // Positions the tile's last query sees; each row uses its own prefix of them.
            let n_max = pos0 + (b0 + nb - 1) / heads + 1;
            // Shapes are consistent by construction.
            let Ok(cache_m) = f32_matrix(&ckr[..n_max * cw], n_max, cw) else {
                return;
            };
            let mut scores = vec![0f32; nb * n_max];
            let qrows = &qa[b0 * cw..(b0 + nb) * cw];
            exec.kernels()
                .matmul(&cache_m, qrows, &mut scores, 0..n_max);
            let seen = |k: usize| pos0 + (b0 + k) / heads + 1;
            let mut row = Vec::new();
            for (k, s) in scores.chunks_exact_mut(n_max).enumerate() {
                // With a sink, one more logit joins the softmax and is dropped after it.
                let sink = sinks.map(|sk| sk[(b0 + k) % heads]);
                if let Some(Some(keep)) = select.map(|sel| &sel[(b0 + k) / heads]) {
                    // Only the selected positions take part: their softmax, and +0 elsewhere
                    // (whose terms fma(+0, c, acc) leave the sums as they are).
                    row.clear();
                    row.extend(keep.iter().map(|&j| s[j] * scale));
                    row.extend(sink);
                    exec.kernels().softmax(&mut row);
                    s.fill(0.0);
                    for (&j, &p) in keep.iter().zip(&row) {
                        s[j] = p;
                    }
                    continue;
                }
                let (s, unseen) = s.split_at_mut(seen(k));
                for x in s.iter_mut() {
                    *x *= scale;
                }
                match sink {
                    Some(sk) => {
                        row.clear();
                        row.extend_from_slice(s);
                        row.push(sk);
                        exec.kernels().softmax(&mut row);
                        s.copy_from_slice(&row[..s.len()]);
                    }
                    None => exec.kernels().softmax(s),
                }
                // Positions past the row's own add fma(+0, c, acc) = acc: nothing.
                unseen.fill(0.0);
            }
            // o_lat = Σ_j p_j c_j per row, in position order: one product of the tile's
            // probabilities with the cached latents.
            let mut o_lat = vec![0f32; nb * r];
            exec.kernels()
                .matmul_xw(&cache_m, &scores, &mut o_lat, 0..r);
            // Values: W_uv o_lat, the tile's rows of one head in one product.
            let (mut xs, mut ys) = (Vec::new(), Vec::new());
            for hd in 0..heads {
                let first = (hd + heads - b0 % heads) % heads;
                if first >= nb {
                    continue;
                }
                xs.clear();
                for k in (first..nb).step_by(heads) {
                    xs.extend_from_slice(&o_lat[k * r..(k + 1) * r]);
                }
                ys.resize(xs.len() / r * vd, 0.0);
                let base = v_at(hd);
                exec.kernels().matmul(&vb, &xs, &mut ys, base..base + vd);
                for (j, k) in (first..nb).step_by(heads).enumerate() {
                    o[k * vd..(k + 1) * vd].copy_from_slice(&ys[j * vd..(j + 1) * vd]);
                }
            }
        });
        if let Some(g) = &w.gate {
            // Kimi K3, Hy4: the attention output times σ(W x), before o_proj.
            let mut gl = vec![0f32; t * heads * vd];
            exec.matmul(&g.view(blob)?, x, &mut gl);
            exec.kernels().mul_sigmoid(&mut out, &gl);
        }
        let mut y = vec![0f32; t * h];
        exec.matmul(&w.o.view(blob)?, &out, &mut y);
        if let Some(b) = bias_of(2) {
            add_bias(&mut y, &b.to_f32(blob));
        }
        Ok(y)
    }
}
