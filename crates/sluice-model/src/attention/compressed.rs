//! DeepSeek-V4's attention (`deepseek_v4`): shared-KV multi-query attention over a sliding
//! window, beside which a layer may attend to *compressed* entries, each summarising a window
//! of `rate` positions.
//!
//! - **Queries.** `q = rms(q_b_proj(rms(q_a_proj x) · q_a_norm))` per head, the RMS norm
//!   unweighted; the last `rope.dim` dimensions of each head rotated (adjacent pairs).
//! - **One key that is also the value.** `k = v = rms(kv_proj x) · kv_norm`, its last
//!   dimensions rotated. A query at `p` sees the keys of `p − window < j ≤ p` and a learned
//!   sink logit per head joins each softmax (`sinks`). The output's rotated part is rotated
//!   back by the query's own angle (`−sin`), so each value contributes by relative position.
//! - **Grouped output projection.** The heads are taken in `o_groups` groups; each group's
//!   `heads / o_groups × head_dim` outputs go through its own `o_lora_rank` rows of `o_a_proj`,
//!   and `o_b_proj` mixes the groups' outputs to the hidden size.
//! - **Compressed entries** ([`Compressor`]). The compressor projects every position to
//!   `kv` and gate logits (`compressor.kv_proj`, `compressor.gate_proj`); window `w` (positions
//!   `w·rate .. (w+1)·rate`) gives entry `w` when it is complete: per channel the
//!   softmax-weighted sum of its positions' `kv` by `gate + position_bias[j − w·rate]`, then
//!   `kv_norm`, the rotated part at position `w·rate`. With `overlap` (compressed-sparse layers,
//!   `rate` 4) each position projects two series `[Ca | Cb]`, and entry `w` weighs window
//!   `w − 1`'s `Ca` with window `w`'s `Cb` (window 0: `Cb` only). A query at `p` sees the
//!   entries `w < (p + 1) / rate`: heavily compressed layers all of them, compressed-sparse
//!   layers the `top_k` of them a lightning indexer ranks highest ([`Indexer`]).
//! - **The indexer** runs its own overlapping compressor at `index_head_dim` (its
//!   `compressor.indexer.*`), queries `q_b_proj(q latent)` rotated at the query's position, and
//!   scores each visible entry `Σ_h w_h · relu(q_h · k / √index_head_dim)` with
//!   `w = weights_proj(x) / √index_heads`; the best `top_k` are kept (ties to the earlier).
//!
//! Compressed layers rotate by the model's compress table (YaRN, `compress_rope_theta`), sliding
//! layers by the main one ([`CompressedConfig::local_rope`]). The cache is bounded like a
//! recurrent state ([`Cache`]): the last `window − 1` keys, the projections of the open window
//! (and of the one before it, overlapping), and every entry so far, which is all that grows
//! with the context (`1 / rate` of a key a position). Like Kimi Delta Attention's state it can
//! go back only to the start or to a snapshot taken where the latest pass began.

use sluice_store::Blob;

use super::{Ctx, rmsnorm_rows};
use crate::ModelError;
use crate::rope::Rope;
use crate::spec::{MatSpec, PartBuilder, VecSpec};

/// The shape of a DeepSeek-V4 attention layer.
#[derive(Clone, Debug, PartialEq)]
pub struct CompressedConfig {
    /// Query heads (`num_attention_heads`).
    pub heads: usize,
    /// Width of every head and of the shared key (`head_dim`).
    pub head_dim: usize,
    /// The query latent (`q_lora_rank`).
    pub q_lora_rank: usize,
    /// Keys a query sees: `p − window < j ≤ p` (`sliding_window`).
    pub window: usize,
    /// Output groups (`o_groups`).
    pub o_groups: usize,
    /// Each group's intermediate width (`o_lora_rank`).
    pub o_rank: usize,
    /// Rotated by the model's second table (the main one: sliding layers).
    pub local_rope: bool,
    /// Compressed entries beside the window.
    pub compressor: Option<Compressor>,
    /// Softmax scale (`head_dim^-0.5`).
    pub softmax_scale: f32,
}

/// A layer's compressor.
#[derive(Clone, Debug, PartialEq)]
pub struct Compressor {
    /// Positions per entry (`compress_rates`).
    pub rate: usize,
    /// Entries weigh the previous window's first series with their own second (compressed
    /// sparse attention) rather than their own window only (heavily compressed attention).
    pub overlap: bool,
    /// The indexer choosing each query's entries; `None`: every visible entry.
    pub indexer: Option<Indexer>,
}

/// A compressed-sparse layer's lightning indexer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Indexer {
    /// Heads (`index_n_heads`).
    pub heads: usize,
    /// Head width (`index_head_dim`).
    pub head_dim: usize,
    /// Entries each query keeps (`index_topk`).
    pub top_k: usize,
}

/// A compressor's weights: `kv_proj`, `gate_proj` (`[series × width, hidden]`), the
/// `position_bias` (`[rate, series × width]`) and `kv_norm`.
#[derive(Clone, Copy, Debug)]
pub struct CompressorWeights {
    /// `kv_proj`.
    pub kv: MatSpec,
    /// `gate_proj`.
    pub gate: MatSpec,
    /// `position_bias`.
    pub bias: VecSpec,
    /// `kv_norm`.
    pub norm: VecSpec,
}

/// The weights of a DeepSeek-V4 attention layer.
#[derive(Clone, Debug)]
pub struct CompressedWeights {
    /// `q_a_proj`.
    pub q_a: MatSpec,
    /// `q_a_norm`.
    pub q_a_norm: VecSpec,
    /// `q_b_proj`.
    pub q_b: MatSpec,
    /// `kv_proj`.
    pub kv: MatSpec,
    /// `kv_norm`.
    pub kv_norm: VecSpec,
    /// `o_a_proj` `[groups × rank, heads × head_dim / groups]`.
    pub o_a: MatSpec,
    /// `o_b_proj`.
    pub o_b: MatSpec,
    /// `sinks`.
    pub sinks: VecSpec,
    /// `compressor.*`.
    pub compressor: Option<CompressorWeights>,
    /// `compressor.indexer.*`: its compressor, `q_b_proj` and `scorer.weights_proj`.
    pub indexer: Option<(CompressorWeights, MatSpec, MatSpec)>,
}

/// One compressor's state in a sequence's cache: the projections (`kv` then gate logits,
/// `2 × series × width` floats a position) of the positions from [`Shape::proj_from`] on, and
/// the entries of every complete window.
#[derive(Clone, Debug, Default)]
pub(crate) struct Series {
    proj: Vec<f32>,
    entries: Vec<f32>,
}

/// The cache of one layer, bounded like a recurrent state: the keys of the last `window − 1`
/// positions, the compressors' projections of the open window and the one before it (what the
/// next entries need), and every entry so far (`1 / rate` of a key a position). It can go back
/// to the start, or to where it was before the latest pass (a snapshot taken then, as Kimi
/// Delta Attention keeps one).
#[derive(Clone, Debug)]
pub(crate) struct Cache {
    /// Positions held.
    pos: usize,
    kv: Vec<f32>,
    comp: Series,
    index: Series,
    /// The state before the latest pass: its position, keys and projections (the entries
    /// only grow: going back cuts them).
    undo: Option<Box<Undo>>,
    shape: Shape,
}

/// [`Cache`]'s snapshot.
#[derive(Clone, Debug)]
struct Undo {
    pos: usize,
    kv: Vec<f32>,
    comp: Vec<f32>,
    index: Vec<f32>,
}

/// What the cache's buffers hold per position and per entry.
#[derive(Clone, Copy, Debug)]
struct Shape {
    head_dim: usize,
    window: usize,
    rate: usize,
    /// Entries weigh the previous window too (so its projections are kept).
    overlap: bool,
    /// Floats of the compressor's projections per position (0: none).
    comp_per: usize,
    /// The same for the indexer's.
    index_per: usize,
    index_dim: usize,
}

impl Shape {
    /// The first position whose key is kept at `pos` positions.
    fn kv_from(&self, pos: usize) -> usize {
        (pos + 1).saturating_sub(self.window)
    }

    /// The first position whose projections are kept at `pos` positions: the open window's
    /// first, or with overlapping windows its predecessor's.
    fn proj_from(&self, pos: usize) -> usize {
        match pos.checked_div(self.rate) {
            Some(w) if self.overlap => w.saturating_sub(1) * self.rate,
            Some(w) => w * self.rate,
            None => pos,
        }
    }

    /// Floats of the entries at `pos` positions, of entries `width` wide (`per` 0: none).
    fn entries(&self, pos: usize, per: usize, width: usize) -> usize {
        if per == 0 { 0 } else { pos / self.rate * width }
    }

    /// The lengths of the five buffers at `pos` positions.
    fn lens(&self, pos: usize) -> [usize; 5] {
        let proj = pos - self.proj_from(pos);
        [
            (pos - self.kv_from(pos)) * self.head_dim,
            proj * self.comp_per,
            self.entries(pos, self.comp_per, self.head_dim),
            proj * self.index_per,
            self.entries(pos, self.index_per, self.index_dim),
        ]
    }
}

impl Cache {
    fn buffers(&self) -> [&Vec<f32>; 5] {
        [
            &self.kv,
            &self.comp.proj,
            &self.comp.entries,
            &self.index.proj,
            &self.index.entries,
        ]
    }

    /// Its buffers, for saving.
    pub(crate) fn parts(&self) -> Vec<&[f32]> {
        self.buffers().into_iter().map(Vec::as_slice).collect()
    }

    /// Takes saved buffers of `pos` positions (as [`Cache::parts`] gave them).
    pub(crate) fn restore(&mut self, parts: Vec<Vec<f32>>, pos: usize) -> Result<(), String> {
        let want = self.shape.lens(pos);
        if parts.len() != want.len() {
            return Err(format!("{} buffers, expected {}", parts.len(), want.len()));
        }
        if parts.iter().zip(want).any(|(p, w)| p.len() != w) {
            return Err(format!(
                "compressed-attention buffers are not those of {pos} positions"
            ));
        }
        let mut it = parts.into_iter();
        let mut next = || it.next().unwrap_or_default();
        self.kv = next();
        self.comp = Series {
            proj: next(),
            entries: next(),
        };
        self.index = Series {
            proj: next(),
            entries: next(),
        };
        self.pos = pos;
        self.undo = None;
        Ok(())
    }

    /// Saves the state before a pass changes it.
    fn save(&mut self) {
        let u = Undo {
            pos: self.pos,
            kv: self.kv.clone(),
            comp: self.comp.proj.clone(),
            index: self.index.proj.clone(),
        };
        self.undo = Some(Box::new(u));
    }

    /// Whether the cache can go back to `pos`: it is there, or it was there before the latest
    /// pass, or `pos` is the start.
    pub(crate) fn can_back_to(&self, pos: usize) -> bool {
        self.pos == pos || pos == 0 || self.undo.as_ref().is_some_and(|u| u.pos == pos)
    }

    /// The position besides the start the cache can go back to, if any.
    pub(crate) fn undo_pos(&self) -> Option<usize> {
        self.undo.as_ref().map(|u| u.pos)
    }

    /// Goes back to `pos` positions if it can (see [`Cache::can_back_to`]).
    pub(crate) fn back_to(&mut self, pos: usize) -> bool {
        if self.pos == pos {
            return true;
        }
        if pos == 0 {
            self.kv.clear();
            self.comp = Series::default();
            self.index = Series::default();
            self.pos = 0;
            self.undo = None;
            return true;
        }
        match self.undo.take() {
            Some(u) if u.pos == pos => {
                let s = self.shape;
                let u = *u;
                self.pos = u.pos;
                self.kv = u.kv;
                self.comp.proj = u.comp;
                self.index.proj = u.index;
                self.comp
                    .entries
                    .truncate(s.entries(pos, s.comp_per, s.head_dim));
                self.index
                    .entries
                    .truncate(s.entries(pos, s.index_per, s.index_dim));
                true
            }
            other => {
                self.undo = other;
                false
            }
        }
    }

    /// A copy at `pos` positions (where [`Cache::can_back_to`] allows), with no spare room and
    /// no snapshot.
    pub(crate) fn prefix(&self, pos: usize) -> Cache {
        let mut c = self.clone();
        let ok = c.back_to(pos);
        debug_assert!(ok, "compressed attention cannot go back to {pos}");
        c.undo = None;
        for v in [
            &mut c.kv,
            &mut c.comp.proj,
            &mut c.comp.entries,
            &mut c.index.proj,
            &mut c.index.entries,
        ] {
            v.shrink_to_fit();
        }
        c
    }

    /// Room for the entries of `positions` positions (the rest is bounded).
    pub(crate) fn reserve(&mut self, positions: usize) {
        let s = self.shape;
        super::room(
            &mut self.comp.entries,
            s.entries(positions, s.comp_per, s.head_dim),
        );
        super::room(
            &mut self.index.entries,
            s.entries(positions, s.index_per, s.index_dim),
        );
    }

    pub(crate) fn bytes(&self) -> usize {
        let undo = self
            .undo
            .as_ref()
            .map_or(0, |u| u.kv.len() + u.comp.len() + u.index.len());
        (self.buffers().iter().map(|v| v.len()).sum::<usize>() + undo) * 4
    }

    /// Drops what the next positions no longer need, once the cache holds `self.pos`.
    fn prune(&mut self, before: usize) {
        let s = self.shape;
        let drop_kv = s.kv_from(self.pos) - s.kv_from(before);
        self.kv.drain(..drop_kv * s.head_dim);
        let drop_proj = s.proj_from(self.pos) - s.proj_from(before);
        self.comp.proj.drain(..drop_proj * s.comp_per);
        self.index.proj.drain(..drop_proj * s.index_per);
    }
}

/// Series a compressor projects per position.
fn series(overlap: bool) -> usize {
    if overlap { 2 } else { 1 }
}

impl CompressedConfig {
    fn shape(&self) -> Shape {
        let (rate, comp_per, index_per, index_dim) = match &self.compressor {
            None => (0, 0, 0, 0),
            Some(c) => {
                let comp = 2 * series(c.overlap) * self.head_dim;
                match c.indexer {
                    Some(i) => (c.rate, comp, 4 * i.head_dim, i.head_dim),
                    None => (c.rate, comp, 0, 0),
                }
            }
        };
        Shape {
            head_dim: self.head_dim,
            window: self.window,
            overlap: self.compressor.as_ref().is_some_and(|c| c.overlap),
            rate,
            comp_per,
            index_per,
            index_dim,
        }
    }

    /// Floats cached per position: the entries' share (rounded up); the rest is bounded
    /// ([`Self::recurrent_floats`]).
    pub fn kv_floats(&self) -> usize {
        let s = self.shape();
        let entries = |w: usize| w.div_ceil(s.rate.max(1));
        let mut f = 0;
        if s.comp_per > 0 {
            f += entries(s.head_dim);
        }
        if s.index_per > 0 {
            f += entries(s.index_dim);
        }
        f
    }

    /// Floats of the bounded part of the cache: the last `window − 1` keys and the projections
    /// of the open window (and, overlapping, the one before it).
    pub fn recurrent_floats(&self) -> usize {
        let s = self.shape();
        let windows = if s.overlap { 2 } else { 1 };
        (s.window.saturating_sub(1)) * s.head_dim + windows * s.rate * (s.comp_per + s.index_per)
    }

    /// Floats of scratch per token of a pass.
    pub fn scratch_floats(&self) -> usize {
        let s = self.shape();
        let q = self.heads * self.head_dim;
        let index = self
            .compressor
            .as_ref()
            .and_then(|c| c.indexer)
            .map_or(0, |i| i.heads * (i.head_dim + 1));
        // The keys and projections of a call's rows join the cache before it is pruned.
        3 * q
            + self.q_lora_rank
            + self.o_groups * self.o_rank
            + s.head_dim
            + s.comp_per
            + s.index_per
            + index
    }

    /// The product the arithmetic multiplies out, and the field that names it.
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
            pos: 0,
            kv: Vec::new(),
            comp: Series::default(),
            index: Series::default(),
            undo: None,
            shape: self.shape(),
        }
    }

    /// Finds and checks the layer's tensors; `a` names a tensor of the attention module.
    pub(crate) fn load(
        &self,
        p: &mut PartBuilder<'_, '_>,
        a: &dyn Fn(&str) -> String,
        h: usize,
    ) -> Result<CompressedWeights, ModelError> {
        let (hd, q) = (self.head_dim, self.heads * self.head_dim);
        let groups = self.o_groups * self.o_rank;
        let compressor = |p: &mut PartBuilder<'_, '_>,
                          m: &str,
                          width: usize,
                          overlap: bool,
                          rate: usize|
         -> Result<CompressorWeights, ModelError> {
            let w = series(overlap) * width;
            Ok(CompressorWeights {
                kv: p.linear(&a(&format!("{m}.kv_proj")), w, h)?,
                gate: p.linear(&a(&format!("{m}.gate_proj")), w, h)?,
                bias: p.vector_any(&a(&format!("{m}.position_bias")), &[rate, w])?,
                norm: p.vector(&a(&format!("{m}.kv_norm.weight")), width)?,
            })
        };
        let (comp, index) = match &self.compressor {
            None => (None, None),
            Some(c) => {
                let comp = compressor(p, "compressor", hd, c.overlap, c.rate)?;
                let index = match c.indexer {
                    None => None,
                    Some(i) => Some((
                        compressor(p, "compressor.indexer", i.head_dim, true, c.rate)?,
                        p.linear(
                            &a("compressor.indexer.q_b_proj"),
                            i.heads * i.head_dim,
                            self.q_lora_rank,
                        )?,
                        p.linear(&a("compressor.indexer.scorer.weights_proj"), i.heads, h)?,
                    )),
                };
                (Some(comp), index)
            }
        };
        Ok(CompressedWeights {
            q_a: p.linear(&a("q_a_proj"), self.q_lora_rank, h)?,
            q_a_norm: p.vector(&a("q_a_norm.weight"), self.q_lora_rank)?,
            q_b: p.linear(&a("q_b_proj"), q, self.q_lora_rank)?,
            kv: p.linear(&a("kv_proj"), hd, h)?,
            kv_norm: p.vector(&a("kv_norm.weight"), hd)?,
            o_a: p.linear(&a("o_a_proj"), groups, q / self.o_groups)?,
            o_b: p.linear(&a("o_b_proj"), h, groups)?,
            sinks: p.vector(&a("sinks"), self.heads)?,
            compressor: comp,
            indexer: index,
        })
    }

    /// The layer over `x` `[t, hidden]` at positions `pos0..pos0 + t`, appending to `cache`.
    pub(crate) fn forward(
        &self,
        cx: &Ctx<'_>,
        w: &CompressedWeights,
        blob: &Blob,
        cache: &mut Cache,
        pos0: usize,
        x: &[f32],
    ) -> Result<Vec<f32>, ModelError> {
        let exec = cx.exec;
        let k = exec.kernels();
        let h = cx.hidden;
        let t = x.len() / h;
        let (heads, hd) = (self.heads, self.head_dim);
        let (rope, angles) = match (self.local_rope, cx.local) {
            (true, Some(local)) => local,
            (true, None) => {
                return Err(ModelError::Mismatch {
                    what: "a layer asks for the second rotary table, which the model lacks".into(),
                });
            }
            (false, _) => (cx.rope, cx.angles),
        };
        let rot = 2 * rope.pairs();
        if rot > hd {
            return Err(ModelError::Mismatch {
                what: "rotated part wider than a head".into(),
            });
        }

        // Queries: the normalised latent (the indexer reads it too), then unweighted RMS per head.
        let mut q_res = vec![0f32; t * self.q_lora_rank];
        exec.matmul(&w.q_a.view(blob)?, x, &mut q_res);
        rmsnorm_rows(exec, &mut q_res, &w.q_a_norm.to_f32(blob), cx.eps);
        let mut qs = vec![0f32; t * heads * hd];
        exec.matmul(&w.q_b.view(blob)?, &q_res, &mut qs);
        let ones = vec![1f32; hd];
        rmsnorm_rows(exec, &mut qs, &ones, cx.eps);
        let mut kv = vec![0f32; t * hd];
        exec.matmul(&w.kv.view(blob)?, x, &mut kv);
        rmsnorm_rows(exec, &mut kv, &w.kv_norm.to_f32(blob), cx.eps);
        for i in 0..t {
            let (cos, sin) = angles.get(i);
            for head in qs[i * heads * hd..(i + 1) * heads * hd].chunks_exact_mut(hd) {
                rope.apply(&mut head[hd - rot..], cos, sin);
            }
            rope.apply(&mut kv[i * hd + hd - rot..(i + 1) * hd], cos, sin);
        }
        if cache.pos != pos0 {
            return Err(ModelError::Mismatch {
                what: format!(
                    "compressed attention holds {} positions, asked to run from {pos0}",
                    cache.pos
                ),
            });
        }
        // The state the pass started from, to go back to if it fails.
        if pos0 == cx.pass_start {
            cache.save();
        }
        let shape = cache.shape;
        let (kv_from, proj_from) = (shape.kv_from(pos0), shape.proj_from(pos0));
        cache.kv.extend_from_slice(&kv);
        let end = pos0 + t;

        // The compressors: this pass's projections, then the entries of the windows completed.
        // Per row, the entries the indexer chose (`None`: every visible one).
        let mut selected: Vec<Option<Vec<usize>>> = Vec::new();
        // Positions per entry (0: no compressor).
        let mut rate = 0usize;
        if let (Some(c), Some(cw)) = (&self.compressor, &w.compressor) {
            compress(
                cx,
                rope,
                cw,
                blob,
                x,
                &mut cache.comp,
                c.rate,
                hd,
                c.overlap,
                (proj_from, end),
            )?;
            if let (Some(ix), Some((iw, iq, iwp))) = (c.indexer, &w.indexer) {
                compress(
                    cx,
                    rope,
                    iw,
                    blob,
                    x,
                    &mut cache.index,
                    c.rate,
                    ix.head_dim,
                    true,
                    (proj_from, end),
                )?;
                selected = index_select(
                    cx,
                    rope,
                    angles,
                    ix,
                    (iq, iwp),
                    blob,
                    x,
                    &q_res,
                    &cache.index.entries,
                    (pos0, c.rate),
                )?;
            }
            rate = c.rate;
        }

        let sinks = w.sinks.to_f32(blob);
        let (kc, entries) = (&cache.kv, &cache.comp.entries);
        let scale = self.softmax_scale;
        let window = self.window;
        let qs = &qs;
        let selected = &selected;
        let outs = exec.map(t, |i| {
            let p = pos0 + i;
            let lo = (p + 1).saturating_sub(window);
            // The entries this query sees, in order.
            let n_vis = (p + 1).checked_div(rate).unwrap_or(0);
            let chosen: Vec<usize> = match selected.get(i) {
                Some(Some(ids)) => ids.clone(),
                _ => (0..n_vis).collect(),
            };
            let key = |j: usize| -> &[f32] {
                if j < p + 1 - lo {
                    &kc[(lo + j - kv_from) * hd..(lo + j - kv_from + 1) * hd]
                } else {
                    let e = chosen[j - (p + 1 - lo)];
                    &entries[e * hd..(e + 1) * hd]
                }
            };
            let nk = p + 1 - lo + chosen.len();
            let mut out = vec![0f32; heads * hd];
            let mut row = Vec::with_capacity(nk + 1);
            for head in 0..heads {
                let qh = &qs[(i * heads + head) * hd..(i * heads + head + 1) * hd];
                row.clear();
                row.extend((0..nk).map(|j| k.dot(qh, key(j)) * scale));
                row.push(sinks[head]);
                k.softmax(&mut row);
                let o = &mut out[head * hd..(head + 1) * hd];
                for (j, &pj) in row[..nk].iter().enumerate() {
                    for (a, &v) in o.iter_mut().zip(key(j)) {
                        *a += pj * v;
                    }
                }
            }
            out
        });
        cache.pos = end;
        cache.prune(pos0);
        // Each head's rotated part rotated back by its query's angle.
        let mut att = Vec::with_capacity(t * heads * hd);
        for (i, mut o) in outs.into_iter().enumerate() {
            let (cos, sin) = angles.get(i);
            let neg: Vec<f32> = sin.iter().map(|s| -s).collect();
            for head in o.chunks_exact_mut(hd) {
                rope.apply(&mut head[hd - rot..], cos, &neg);
            }
            att.extend_from_slice(&o);
        }

        // The grouped output projection: group g's inputs through o_a's rows of group g.
        let (g, r) = (self.o_groups, self.o_rank);
        let per = heads * hd / g;
        let oa = w.o_a.view(blob)?;
        let parts = exec.map(g, |gi| {
            let mut xg = Vec::with_capacity(t * per);
            for row in att.chunks_exact(heads * hd) {
                xg.extend_from_slice(&row[gi * per..(gi + 1) * per]);
            }
            let mut y = vec![0f32; t * r];
            k.matmul(&oa, &xg, &mut y, gi * r..(gi + 1) * r);
            y
        });
        let mut mid = vec![0f32; t * g * r];
        for (gi, y) in parts.iter().enumerate() {
            for i in 0..t {
                mid[(i * g + gi) * r..(i * g + gi + 1) * r].copy_from_slice(&y[i * r..(i + 1) * r]);
            }
        }
        let mut y = vec![0f32; t * h];
        exec.matmul(&w.o_b.view(blob)?, &mid, &mut y);
        Ok(y)
    }
}

/// Appends this call's projections of `x` to `s` (which holds them from position `from`) and
/// computes the entries of every window complete by position `end` (see the module
/// documentation).
#[allow(clippy::too_many_arguments)]
fn compress(
    cx: &Ctx<'_>,
    rope: &Rope,
    w: &CompressorWeights,
    blob: &Blob,
    x: &[f32],
    s: &mut Series,
    rate: usize,
    width: usize,
    overlap: bool,
    (from, end): (usize, usize),
) -> Result<(), ModelError> {
    let exec = cx.exec;
    let t = x.len() / cx.hidden;
    let sw = series(overlap) * width;
    let mut kv = vec![0f32; t * sw];
    let mut gate = vec![0f32; t * sw];
    exec.matmul(&w.kv.view(blob)?, x, &mut kv);
    exec.matmul(&w.gate.view(blob)?, x, &mut gate);
    for (a, b) in kv.chunks_exact(sw).zip(gate.chunks_exact(sw)) {
        s.proj.extend_from_slice(a);
        s.proj.extend_from_slice(b);
    }
    let bias = w.bias.to_f32(blob);
    let norm = w.norm.to_f32(blob);
    let per = 2 * sw;
    let rot = 2 * rope.pairs();
    let (mut cos, mut sin) = (vec![0f32; rope.pairs()], vec![0f32; rope.pairs()]);
    let mut tmp = vec![0f32; width];
    // Slots of an entry: (position, series) pairs.
    let mut slots: Vec<(usize, usize)> = Vec::with_capacity(2 * rate);
    let mut logits = Vec::with_capacity(2 * rate);
    while (s.entries.len() / width + 1) * rate <= end {
        let e = s.entries.len() / width;
        slots.clear();
        if overlap && e > 0 {
            slots.extend(((e - 1) * rate..e * rate).map(|j| (j, 0)));
        }
        let second = usize::from(overlap);
        slots.extend((e * rate..(e + 1) * rate).map(|j| (j, second)));
        let mut entry = vec![0f32; width];
        for (d, out) in entry.iter_mut().enumerate() {
            logits.clear();
            logits.extend(slots.iter().map(|&(j, sr)| {
                s.proj[(j - from) * per + sw + sr * width + d]
                    + bias[(j % rate) * sw + sr * width + d]
            }));
            sluice_kernels::scalar::softmax(&mut logits);
            let mut acc = 0f32;
            for (&(j, sr), &pj) in slots.iter().zip(&logits) {
                acc += s.proj[(j - from) * per + sr * width + d] * pj;
            }
            *out = acc;
        }
        exec.kernels().rmsnorm(&entry, &norm, cx.eps, &mut tmp);
        rope.angles(e * rate, &mut cos, &mut sin);
        rope.apply(&mut tmp[width - rot..], &cos, &sin);
        s.entries.extend_from_slice(&tmp);
    }
    Ok(())
}

/// Per row (at positions `pos0..`), the indexer's `top_k` of the entries it sees, in order
/// (ties to the earlier); `None` for a row that sees no more than `top_k`, and no work at all
/// when no row sees more.
#[allow(clippy::too_many_arguments)]
fn index_select(
    cx: &Ctx<'_>,
    rope: &Rope,
    angles: &crate::rope::Angles,
    ix: Indexer,
    (q_b, weights): (&MatSpec, &MatSpec),
    blob: &Blob,
    x: &[f32],
    q_res: &[f32],
    entries: &[f32],
    (pos0, rate): (usize, usize),
) -> Result<Vec<Option<Vec<usize>>>, ModelError> {
    let exec = cx.exec;
    let t = x.len() / cx.hidden;
    let visible = |i: usize| (pos0 + i + 1) / rate;
    if t == 0 || visible(t - 1) <= ix.top_k {
        return Ok(Vec::new());
    }
    let (nh, d) = (ix.heads, ix.head_dim);
    let rot = 2 * rope.pairs();
    let mut q = vec![0f32; t * nh * d];
    exec.matmul(&q_b.view(blob)?, q_res, &mut q);
    for i in 0..t {
        let (cos, sin) = angles.get(i);
        for head in q[i * nh * d..(i + 1) * nh * d].chunks_exact_mut(d) {
            rope.apply(&mut head[d - rot..], cos, sin);
        }
    }
    let mut wts = vec![0f32; t * nh];
    exec.matmul(&weights.view(blob)?, x, &mut wts);
    let wscale = (nh as f32).powf(-0.5);
    let sscale = (d as f32).powf(-0.5);
    let k = exec.kernels();
    Ok(exec.map(t, |i| {
        let n = visible(i);
        if n <= ix.top_k {
            return None;
        }
        let scores: Vec<f32> = (0..n)
            .map(|e| {
                let key = &entries[e * d..(e + 1) * d];
                let mut s = 0f32;
                for hh in 0..nh {
                    let qh = &q[(i * nh + hh) * d..(i * nh + hh + 1) * d];
                    let sc = k.dot(qh, key).max(0.0) * sscale;
                    s += sc * (wts[i * nh + hh] * wscale);
                }
                s
            })
            .collect();
        let mut ids: Vec<usize> = sluice_kernels::scalar::top_k(&scores, ix.top_k)
            .into_iter()
            .map(|p| p.0)
            .collect();
        ids.sort_unstable();
        Some(ids)
    }))
}
