//! DeepSeek Sparse Attention (DeepSeek-V3.2, `deepseek_v32`): multi-head latent attention
//! whose queries each attend only to the `topk` past positions a lightning indexer ranks
//! highest. Below `topk` visible positions the attention is dense.
//!
//! The indexer has its own projections: `wq_b` from MLA's normalised query latent (Mistral
//! Large 4, whose queries have no latent: from a LayerNorm `q_input_norm` of the layer's input,
//! then scaled per head by `softmax_scaling` as MLA's are, see [`MlaConfig::log_scaling`]), and
//! `wk` with a LayerNorm `k_norm` from the layer's input. The first `qk_rope_head_dim` dimensions
//! of its keys and queries are rotated by the model's table (DeepSeek-V3.2: pairs split in
//! halves; GLM-5: interleaved). Its cache holds one key per position, beside MLA's latent
//! cache. A query at position `p` scores every position `j ≤ p` as
//! `Σ_h w_h · relu(q_h · k_j / √head_dim)`, with `w = weights_proj(x) / √heads`, and keeps the
//! `topk` best (ties to the lower position). MLA then attends to those positions only
//! ([`MlaConfig::forward_selected`]).

use sluice_store::Blob;

use super::mla::{self, MlaConfig, MlaWeights};

/// Per row of a pass, the positions its query keeps (`None`: all it sees).
pub(crate) type Selection = Vec<Option<Vec<usize>>>;
use super::{Ctx, rmsnorm_rows};
use crate::ModelError;
use crate::spec::{MatSpec, PartBuilder, VecSpec};

/// The eps of the indexer's LayerNorms `k_norm` and `q_input_norm` as transformers builds
/// them for DeepSeek-V3.2 (Hy4's `k_norm` takes `rms_norm_eps`: [`DsaConfig::key_eps`]).
pub const INDEXER_EPS: f32 = 1e-6;

/// Where the indexer's queries come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexerQuery {
    /// MLA's normalised query latent (DeepSeek-V3.2, GLM-5).
    Latent,
    /// A LayerNorm (`q_input_norm`, with bias) of the layer's input, its queries then scaled
    /// per head and position by `softmax_scaling` (Mistral Large 4).
    Input,
}

/// The shape of a sparse-attention layer.
#[derive(Clone, Debug, PartialEq)]
pub struct DsaConfig {
    /// The latent attention it restricts.
    pub mla: MlaConfig,
    /// Indexer heads (`index_n_heads`).
    pub heads: usize,
    /// Indexer head dimension (`index_head_dim`): the first `mla.qk_rope_head_dim` rotated.
    pub head_dim: usize,
    /// Positions each query keeps (`index_topk`).
    pub topk: usize,
    /// The indexer's rotary pairs are adjacent (GLM-5) rather than split halves
    /// (DeepSeek-V3.2).
    pub interleaved: bool,
    /// No indexer of its own: the layer reuses the top-k of the last layer that has one
    /// (GLM-5's `indexer_types` `shared`).
    pub shared: bool,
    /// What the indexer's `wq_b` reads.
    pub query: IndexerQuery,
    /// The rotated part of the indexer's heads is their last `qk_rope_head_dim` dimensions
    /// (Hy4) rather than their first.
    pub rope_last: bool,
    /// The eps of the indexer's `k_norm`.
    pub key_eps: f32,
    /// The indexer scores pools of keys rather than single positions (GLM-5.3).
    pub pool: Option<KeyPool>,
}

/// GLM-5.3's pooled indexer (`index_kpool`): the positions are taken in pools of `size`
/// (`0..size`, `size..2·size`, …); a pool's key is the per-channel softmax-weighted mean of its
/// keys, weighted by `index_kpool_compress_gate · x + index_kpool_compress_ape`; a query scores
/// the pools it sees whole and keeps the best `topk / size` of them (all when it sees no more),
/// and with `tail` the positions after its last whole pool too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyPool {
    /// Positions per pool (`index_kpool`).
    pub size: usize,
    /// The positions past the last whole pool are kept (`index_kpool_always_select_tail`).
    pub tail: bool,
}

/// The weights of a sparse-attention layer.
#[derive(Clone, Debug)]
pub struct DsaWeights {
    /// The latent attention's.
    pub mla: MlaWeights,
    /// The indexer's, unless the layer shares another's top-k.
    pub indexer: Option<IndexerWeights>,
}

/// The weights of a lightning indexer.
#[derive(Clone, Debug)]
pub struct IndexerWeights {
    /// `indexer.wq_b` `[heads × head_dim, q_lora_rank]`.
    pub wq_b: MatSpec,
    /// `indexer.wk` `[head_dim, hidden]`.
    pub wk: MatSpec,
    /// `indexer.k_norm` weight and bias (a LayerNorm).
    pub k_norm: [VecSpec; 2],
    /// `indexer.weights_proj` `[heads, hidden]`.
    pub weights_proj: MatSpec,
    /// `indexer.q_input_norm` weight and bias, and `indexer.softmax_scaling` scale and bias
    /// ([`IndexerQuery::Input`]).
    pub input: Option<[VecSpec; 4]>,
    /// `indexer.index_kpool_compress_ape` `[size, head_dim]` and
    /// `indexer.index_kpool_compress_gate` `[head_dim, hidden]` ([`KeyPool`]).
    pub pool: Option<(VecSpec, MatSpec)>,
}

/// The latent cache and the indexer's keys, `[pos, head_dim]`.
#[derive(Clone, Debug)]
pub(crate) struct Cache {
    pub(crate) mla: mla::Cache,
    keys: Vec<f32>,
    head_dim: usize,
}

impl Cache {
    pub(crate) fn truncate(&mut self, pos: usize) {
        self.mla.truncate(pos);
        self.keys.truncate(pos * self.head_dim);
    }

    /// Its buffers, for saving: the latent cache, then the indexer's keys.
    pub(crate) fn parts(&self) -> Vec<&[f32]> {
        let mut p = self.mla.parts();
        p.push(&self.keys);
        p
    }

    /// Takes saved buffers of `pos` positions.
    pub(crate) fn restore(&mut self, mut parts: Vec<Vec<f32>>, pos: usize) -> Result<(), String> {
        match parts.pop() {
            Some(k) if k.len() == pos * self.head_dim => {
                self.mla.restore(parts, pos)?;
                self.keys = k;
                Ok(())
            }
            _ => Err(format!("the indexer's keys are not {pos} positions long")),
        }
    }

    /// A copy of the first `pos` positions.
    pub(crate) fn prefix(&self, pos: usize) -> Cache {
        Cache {
            mla: self.mla.prefix(pos),
            keys: self.keys[..pos * self.head_dim].to_vec(),
            head_dim: self.head_dim,
        }
    }

    pub(crate) fn reserve(&mut self, positions: usize) {
        self.mla.reserve(positions);
        super::room(&mut self.keys, positions * self.head_dim);
    }

    pub(crate) fn bytes(&self) -> usize {
        self.mla.bytes() + self.keys.len() * 4
    }
}

impl DsaConfig {
    /// Floats cached per position: MLA's and one indexer key (none when shared).
    pub fn kv_floats(&self) -> usize {
        self.mla.kv_floats() + self.key_floats()
    }

    /// Per position: the indexer's key (and with pools, its pool gate's logits).
    fn key_floats(&self) -> usize {
        match (self.shared, self.pool) {
            (true, _) => 0,
            (false, None) => self.head_dim,
            (false, Some(_)) => 2 * self.head_dim,
        }
    }

    /// Floats of scratch per token of a pass.
    pub fn scratch_floats(&self) -> usize {
        self.mla.scratch_floats()
            + self.heads * self.head_dim
            + self.head_dim
            + self.heads
            + match self.query {
                IndexerQuery::Latent => self.mla.q_lora_rank.unwrap_or(0),
                IndexerQuery::Input => 0,
            }
    }

    /// The product the arithmetic multiplies out, and the field that names it.
    pub fn widest(&self) -> (usize, usize, &'static str, &'static str) {
        let (a, b, f, w) = self.mla.widest();
        if self.heads * self.head_dim > a * b {
            return (
                self.heads,
                self.head_dim,
                "index_n_heads",
                "index_n_heads × index_head_dim",
            );
        }
        (a, b, f, w)
    }

    pub(crate) fn new_cache(&self) -> Cache {
        Cache {
            mla: self.mla.new_cache(),
            keys: Vec::new(),
            head_dim: self.key_floats(),
        }
    }

    /// Finds and checks the layer's tensors; `a` names a tensor of the attention module.
    pub(crate) fn load(
        &self,
        p: &mut PartBuilder<'_, '_>,
        a: &dyn Fn(&str) -> String,
        h: usize,
    ) -> Result<DsaWeights, ModelError> {
        let mla = self.mla.load(p, a, h)?;
        let qr = match (self.query, self.mla.q_lora_rank) {
            (IndexerQuery::Latent, Some(qr)) => qr,
            (IndexerQuery::Latent, None) => {
                return Err(ModelError::Mismatch {
                    what: "sparse attention needs the query latent".into(),
                });
            }
            (IndexerQuery::Input, _) => h,
        };
        let (heads, d) = (self.heads, self.head_dim);
        let indexer = if self.shared {
            None
        } else {
            Some(IndexerWeights {
                input: match self.query {
                    IndexerQuery::Latent => None,
                    IndexerQuery::Input => Some([
                        p.vector(&a("indexer.q_input_norm.weight"), h)?,
                        p.vector(&a("indexer.q_input_norm.bias"), h)?,
                        p.vector(&a("indexer.softmax_scaling.scale"), heads)?,
                        p.vector(&a("indexer.softmax_scaling.bias"), heads)?,
                    ]),
                },
                pool: match self.pool {
                    Some(kp) => Some((
                        p.vector_any(&a("indexer.index_kpool_compress_ape"), &[kp.size, d])?,
                        p.matrix(&a("indexer.index_kpool_compress_gate"), d, h)?,
                    )),
                    None => None,
                },
                wq_b: p.linear(&a("indexer.wq_b"), heads * d, qr)?,
                wk: p.linear(&a("indexer.wk"), d, h)?,
                k_norm: [
                    p.vector(&a("indexer.k_norm.weight"), d)?,
                    p.vector(&a("indexer.k_norm.bias"), d)?,
                ],
                weights_proj: p.linear(&a("indexer.weights_proj"), heads, h)?,
            })
        };
        Ok(DsaWeights { mla, indexer })
    }

    /// The layer over `x` `[t, hidden]` at positions `pos0..pos0 + t`, appending to `cache`.
    pub(crate) fn forward(
        &self,
        cx: &Ctx<'_>,
        w: &DsaWeights,
        blob: &Blob,
        cache: &mut Cache,
        pos0: usize,
        x: &[f32],
    ) -> Result<Vec<f32>, ModelError> {
        let select = match &w.indexer {
            Some(iw) => {
                let s = self.select(cx, &w.mla, iw, blob, cache, pos0, x)?;
                *cx.sparse.borrow_mut() = Some(s.clone());
                s
            }
            None => cx
                .sparse
                .borrow()
                .clone()
                .ok_or_else(|| ModelError::Mismatch {
                    what: "a shared sparse layer before any with an indexer".into(),
                })?,
        };
        self.mla
            .forward_selected(cx, &w.mla, blob, &mut cache.mla, pos0, x, Some(&select))
    }

    /// The lightning indexer over `x`: its keys appended to `cache`, each row's top-k.
    #[allow(clippy::too_many_arguments)]
    fn select(
        &self,
        cx: &Ctx<'_>,
        mw: &MlaWeights,
        w: &IndexerWeights,
        blob: &Blob,
        cache: &mut Cache,
        pos0: usize,
        x: &[f32],
    ) -> Result<Selection, ModelError> {
        let exec = cx.exec;
        let h = cx.hidden;
        let t = x.len() / h;
        let (heads, d) = (self.heads, self.head_dim);
        let rd = self.mla.qk_rope_head_dim;
        let mut q = vec![0f32; t * heads * d];
        match (&w.input, &mw.q_a) {
            (Some([nw, nb, ss, sb]), _) => {
                // A LayerNorm of the input; the queries scaled per head and position.
                let (nw, nb) = (nw.to_f32(blob), nb.to_f32(blob));
                let mut xn = x.to_vec();
                for row in xn.chunks_exact_mut(h) {
                    layer_norm(row, &nw, &nb, INDEXER_EPS);
                }
                exec.matmul(&w.wq_b.view(blob)?, &xn, &mut q);
                let (ss, sb) = (ss.to_f32(blob), sb.to_f32(blob));
                for (i, qi) in q.chunks_exact_mut(heads * d).enumerate() {
                    mla::log_scale(qi, &ss, &sb, pos0 + i);
                }
            }
            (None, Some((qa, qa_norm))) => {
                // The query latent, as MLA computes it.
                let mut lat = vec![0f32; t * qa.rows];
                exec.matmul(&qa.view(blob)?, x, &mut lat);
                if let Some(Some(b)) = mw.bias.as_ref().map(|b| &b[0]) {
                    super::add_bias(&mut lat, &b.to_f32(blob));
                }
                rmsnorm_rows(exec, &mut lat, &qa_norm.to_f32(blob), self.mla.norm_eps);
                exec.matmul(&w.wq_b.view(blob)?, &lat, &mut q);
            }
            (None, None) => {
                return Err(ModelError::Mismatch {
                    what: "sparse attention needs the query latent".into(),
                });
            }
        }
        let mut k = vec![0f32; t * d];
        exec.matmul(&w.wk.view(blob)?, x, &mut k);
        let (nw, nb) = (w.k_norm[0].to_f32(blob), w.k_norm[1].to_f32(blob));
        for row in k.chunks_exact_mut(d) {
            layer_norm(row, &nw, &nb, self.key_eps);
        }
        let rotate = |v: &mut [f32], cos: &[f32], sin: &[f32]| {
            if self.interleaved {
                sluice_kernels::scalar::rope_interleaved(v, cos, sin)
            } else {
                sluice_kernels::scalar::rope_half(v, cos, sin)
            }
        };
        let rot = if self.rope_last { d - rd..d } else { 0..rd };
        for i in 0..t {
            let (cos, sin) = cx.angles.get(i);
            for head in q[i * heads * d..(i + 1) * heads * d].chunks_exact_mut(d) {
                rotate(&mut head[rot.clone()], cos, sin);
            }
            rotate(&mut k[i * d..(i + 1) * d][rot.clone()], cos, sin);
        }
        let mut wts = vec![0f32; t * heads];
        exec.matmul(&w.weights_proj.view(blob)?, x, &mut wts);
        let wscale = (heads as f32).powf(-0.5);
        let scale = (d as f32).powf(-0.5);
        if let (Some(kp), Some((ape, gate))) = (self.pool, &w.pool) {
            let mut gs = vec![0f32; t * d];
            exec.matmul(&gate.view(blob)?, x, &mut gs);
            for (kr, gr) in k.chunks_exact(d).zip(gs.chunks_exact(d)) {
                cache.keys.extend_from_slice(kr);
                cache.keys.extend_from_slice(gr);
            }
            let pools = pool_keys(&cache.keys, d, kp.size, &ape.to_f32(blob));
            let keep_pools = self.topk / kp.size;
            return Ok(exec.map(t, |i| {
                let n = pos0 + i + 1;
                let whole = n / kp.size;
                if whole <= keep_pools && (kp.tail || whole * kp.size == n) {
                    return None;
                }
                let qi = &q[i * heads * d..(i + 1) * heads * d];
                let wi = &wts[i * heads..(i + 1) * heads];
                let mut chosen: Vec<usize> = (0..whole).collect();
                if whole > keep_pools {
                    let mut scored: Vec<(f32, usize)> = chosen
                        .iter()
                        .map(|&p| (score(qi, wi, &pools[p * d..(p + 1) * d], wscale, scale), p))
                        .collect();
                    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                    chosen = scored[..keep_pools].iter().map(|s| s.1).collect();
                    chosen.sort_unstable();
                }
                let mut keep: Vec<usize> = chosen
                    .iter()
                    .flat_map(|&p| p * kp.size..(p + 1) * kp.size)
                    .collect();
                if kp.tail {
                    keep.extend(whole * kp.size..n);
                }
                Some(keep)
            }));
        }
        cache.keys.extend_from_slice(&k);
        // Per query, the positions it keeps when it sees more than `topk`.
        let keys = &cache.keys;
        Ok(exec.map(t, |i| {
            let n = pos0 + i + 1;
            if n <= self.topk {
                return None;
            }
            let qi = &q[i * heads * d..(i + 1) * heads * d];
            let wi = &wts[i * heads..(i + 1) * heads];
            let mut scored: Vec<(f32, usize)> = (0..n)
                .map(|j| (score(qi, wi, &keys[j * d..(j + 1) * d], wscale, scale), j))
                .collect();
            scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            let mut keep: Vec<usize> = scored[..self.topk].iter().map(|p| p.1).collect();
            keep.sort_unstable();
            Some(keep)
        }))
    }
}

/// A query's score of a key: `Σ_h w_h · wscale · relu(q_h · k · scale)`.
fn score(q: &[f32], w: &[f32], k: &[f32], wscale: f32, scale: f32) -> f32 {
    let d = k.len();
    let mut s = 0f32;
    for (qh, &wh) in q.chunks_exact(d).zip(w) {
        let dot: f32 = qh.iter().zip(k).map(|(a, b)| a * b).sum();
        s += wh * wscale * (dot * scale).max(0.0);
    }
    s
}

/// The key of every whole pool of `size` positions in `cache` (`[pos, 2d]`: each position's
/// key, then its pool gate's logits): per channel `c`, `Σ_j softmax_j(g_jc + ape_jc) k_jc`
/// over the pool's positions `j`, as transformers computes it.
fn pool_keys(cache: &[f32], d: usize, size: usize, ape: &[f32]) -> Vec<f32> {
    let n = cache.len() / (2 * d);
    let pools = n / size;
    let mut out = vec![0f32; pools * d];
    let mut logits = vec![0f32; size];
    for (p, pk) in out.chunks_exact_mut(d).enumerate() {
        for (c, o) in pk.iter_mut().enumerate() {
            for (j, l) in logits.iter_mut().enumerate() {
                *l = cache[(p * size + j) * 2 * d + d + c] + ape[j * d + c];
            }
            sluice_kernels::scalar::softmax(&mut logits);
            *o = logits
                .iter()
                .enumerate()
                .map(|(j, &pr)| pr * cache[(p * size + j) * 2 * d + c])
                .sum();
        }
    }
    out
}

/// LayerNorm of one row (biased variance, as torch's `nn.LayerNorm`).
fn layer_norm(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    let n = x.len() as f32;
    let mean = x.iter().sum::<f32>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    let r = 1.0 / (var + eps).sqrt();
    for ((v, &w), &b) in x.iter_mut().zip(w).zip(b) {
        *v = (*v - mean) * r * w + b;
    }
}
