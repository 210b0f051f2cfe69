//! The network a forward pass runs: the configuration, where the weights are, the stores that
//! hold them, the kernels and the rotary tables. [`crate::Model`] owns one and adds what a
//! pass does not read (the memory plan's bookkeeping, KV charging, the compute pool's
//! admission); the pass itself (`pass.rs`, and `mtp.rs` for the multi-token-prediction layer)
//! is written over this value, so the runtime imports the pass and never the reverse.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_store::{Blob, ExpertStore, Piece, Reader, TrunkStore, read_blob};

use crate::ModelError;
use crate::config::ModelConfig;
use crate::exec::Exec;
use crate::rope::Rope;
use crate::weights::{ExpertSpec, FfnSpec, LayerSpec, MoeSpec, WeightLayout};

/// What a forward pass reads (see the module's documentation).
#[derive(Debug)]
pub(crate) struct Net {
    pub(crate) cfg: ModelConfig,
    pub(crate) layout: WeightLayout,
    pub(crate) exec: Exec,
    pub(crate) rope: Rope,
    /// The second rotary table ([`ModelConfig::local_rope`]).
    pub(crate) local_rope: Option<Rope>,
    /// The embedding table when pinned; otherwise rows are read per token.
    pub(crate) embed: Option<Arc<Blob>>,
    /// Parts 0..layers are the layers, part `layers` the head (then the MTP layer's, when
    /// loaded).
    pub(crate) trunk: TrunkStore,
    pub(crate) reader: Arc<dyn Reader>,
    pub(crate) embed_bytes_read: AtomicU64,
    pub(crate) experts: Arc<ExpertStore>,
    /// Lookahead prefetch runs.
    pub(crate) prefetch: bool,
    /// Every expert fits in the cache: a layer's experts are taken as a group and computed
    /// together (see `ffn::schedule`).
    pub(crate) gather_experts: bool,
    /// The memory plan's rows per call inside a layer.
    pub(crate) chunk: usize,
    /// The attention tiles' room in a decode step or a draft's check: the planned scratch's
    /// under a budget (room for tiles of several heads at the full context), the prefill's
    /// without one (nothing to plan for).
    pub(crate) step_score_floats: usize,
}

impl Net {
    /// The configuration.
    pub(crate) fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Where the weights are.
    pub(crate) fn layout(&self) -> &WeightLayout {
        &self.layout
    }

    /// Kernels and threads.
    pub(crate) fn exec(&self) -> &Exec {
        &self.exec
    }

    /// The rotary table.
    pub(crate) fn rope(&self) -> &Rope {
        &self.rope
    }

    /// The second rotary table, when the model has one.
    pub(crate) fn local_rope(&self) -> Option<&Rope> {
        self.local_rope.as_ref()
    }

    /// Whether a layer's experts are taken as a group (every expert fits; see `ffn::schedule`).
    pub(crate) fn gathers_experts(&self) -> bool {
        self.gather_experts
    }

    /// The expert store.
    pub(crate) fn experts(&self) -> &Arc<ExpertStore> {
        &self.experts
    }

    /// The trunk store.
    pub(crate) fn trunk(&self) -> &TrunkStore {
        &self.trunk
    }

    /// Whether lookahead prefetch runs.
    pub(crate) fn prefetch(&self) -> bool {
        self.prefetch
    }

    /// The trunk part of layer `l` (the MTP layer's after the head).
    pub(crate) fn part_of(&self, l: usize) -> usize {
        if l < self.cfg.layers { l } else { l + 1 }
    }

    /// Layer `l`'s index in its state (the MTP layer's state holds only it).
    pub(crate) fn state_index(&self, l: usize) -> usize {
        if l < self.cfg.layers {
            l
        } else {
            l - self.cfg.layers
        }
    }

    /// Layer `l`'s weights.
    pub(crate) fn layer_spec(&self, l: usize) -> &LayerSpec {
        let n = self.cfg.layers;
        match (l.checked_sub(n), &self.layout.mtp) {
            (Some(i), Some(m)) => &m.layer_specs[i],
            _ => &self.layout.layer_specs[l],
        }
    }

    /// Layer `l`'s routed experts' weights.
    pub(crate) fn expert_specs_of(&self, l: usize) -> &[ExpertSpec] {
        let n = self.cfg.layers;
        match (l.checked_sub(n), &self.layout.mtp) {
            (Some(i), Some(m)) => &m.expert_specs[i],
            _ => &self.layout.expert_specs[l],
        }
    }

    /// The embeddings of `tokens`, `[t, hidden]`: from the pinned table, or read row by row.
    pub(crate) fn embed_rows(&self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let spec = &self.layout.embed_spec;
        let h = self.cfg.hidden;
        let mut hs = vec![0f32; tokens.len() * h];
        let decode = |row: &[u8], out: &mut [f32]| {
            out.copy_from_slice(&sluice_kernels::decode::decode_vec(spec.codes, row, h));
        };
        match &self.embed {
            Some(b) => {
                let m = spec.view(b)?;
                for (i, &id) in tokens.iter().enumerate() {
                    decode(m.row(id as usize), &mut hs[i * h..(i + 1) * h]);
                }
            }
            None => {
                let base = self.layout.embed.pieces[0];
                // Checked when the layout was made.
                let rb = spec.codes.row_bytes(spec.cols).unwrap_or(0) as u64;
                let pieces: Vec<Piece> = tokens
                    .iter()
                    .map(|&id| Piece {
                        shard: base.shard,
                        offset: base.offset + id as u64 * rb,
                        len: rb,
                    })
                    .collect();
                let blob = read_blob(self.reader.as_ref(), &pieces)?;
                self.embed_bytes_read
                    .fetch_add(blob.footprint() as u64, Ordering::Relaxed);
                for i in 0..tokens.len() {
                    decode(blob.piece(i), &mut hs[i * h..(i + 1) * h]);
                }
            }
        }
        Ok(hs)
    }

    /// Lookahead: the experts layer `l`'s router would pick from the current residual stream
    /// (`[t, hidden]`), most confident (largest routing weight, summed over rows) first, as a
    /// hint for prefetch. `None` when `l` has no routed experts.
    pub(crate) fn predict(
        &self,
        l: usize,
        hs: &[f32],
        tokens: &[u32],
    ) -> Result<Option<(usize, Vec<u32>)>, ModelError> {
        if l >= self.cfg.layers || !self.cfg.is_moe(l) {
            return Ok(None);
        }
        // Only when the layer is in memory already: never wait on (or hold) a ring slot here.
        let Some(part) = self.trunk.try_part(l) else {
            return Ok(None);
        };
        let blob: &Blob = &part;
        let spec = &self.layout.layer_specs[l];
        let FfnSpec::Moe(MoeSpec {
            router, bias, hash, ..
        }) = &spec.ffn
        else {
            return Ok(None);
        };
        // A hash-routed layer's experts are known from the tokens: exactly those.
        if let Some(table) = hash {
            let mut ids: Vec<u32> = Vec::new();
            for &tok in tokens {
                ids.extend(table.row(blob, tok as usize, self.cfg.moe.experts)?);
            }
            ids.sort_unstable();
            ids.dedup();
            return Ok(Some((l, ids)));
        }
        let h = self.cfg.hidden;
        let w = spec.post_norm.to_f32(blob);
        let mut xn = vec![0f32; hs.len()];
        for (x, o) in hs.chunks_exact(h).zip(xn.chunks_exact_mut(h)) {
            self.exec.kernels().rmsnorm(x, &w, self.cfg.eps, o);
        }
        let ne = self.cfg.moe.router_width();
        let mut logits = vec![0f32; (hs.len() / h) * ne];
        self.exec.matmul(&router.view(blob)?, &xn, &mut logits);
        let bias = bias.map(|b| b.to_f32(blob));
        let mut score: BTreeMap<u32, f32> = BTreeMap::new();
        for lg in logits.chunks_exact_mut(ne) {
            for (e, w) in crate::ffn::route(&self.cfg, lg, bias.as_deref()) {
                // Zero-compute experts have nothing to read.
                if (e as usize) < self.cfg.moe.experts {
                    *score.entry(e).or_default() += w;
                }
            }
        }
        let mut ranked: Vec<(u32, f32)> = score.into_iter().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        Ok(Some((l, ranked.into_iter().map(|p| p.0).collect())))
    }
}
