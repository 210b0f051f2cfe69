//! The multi-token-prediction (MTP) layer as a drafter: a checkpoint's extra layer that, from
//! the model's final-normed hidden state at a position and the token after it, predicts the
//! token after that. Three kinds run ([`crate::config::MtpHead`]):
//!
//! - **Qwen3-Next's and Qwen3.5's `mtp.*`** (`Concat`): the token's embedding and the hidden
//!   row, each RMS-normed by its own weights, are concatenated (embedding first) and projected
//!   by `fc` to the hidden width; that runs through the MTP layer (its attention against its
//!   own KV cache, its MoE) and is normed by the MTP `norm`; the model's lm_head gives the
//!   logits. The normed output row is the hidden row a further draft step starts from. This is
//!   vLLM's `Qwen3NextMultiTokenPredictor` (transformers does not instantiate the layer).
//! - **DeepSeek-V3's and GLM-4.5's layers after the last** (`Trailing`): the same with `enorm`,
//!   `hnorm`, `eh_proj` and `shared_head.norm`, except that the embedding at position 0 is
//!   zero and a further step starts from the layer's output before the norm (vLLM's
//!   `DeepSeekMultiTokenPredictor`). The layer's copies of the embedding and the head must
//!   equal the model's ([`check_copies`]), which are used.
//! - **DeepSeek-V4's `mtp.{i}.`** (`PerLayer`, DeepSeek's `MTPBlock`, vLLM's
//!   `DeepSeekV4MultiTokenPredictorLayer`): it works on the
//!   hyper-connection streams. The model hands it, per position, its streams after the last
//!   layer (the hyper head's input, not the final-normed row); each stream is normed by
//!   `hnorm` and projected by `h_proj`, and `e_proj` of the `enorm`-normed embedding (zero at
//!   position 0, as for V3) is added to every stream. The block runs with its own
//!   hyper-connections; its own hyper head (`hc_head`), `norm` and the model's head give the
//!   logits. A further step starts from the block's output streams.
//!
//! `tools/reference/make_mtp_fixtures.py` builds all three from transformers' decoder layers
//! (and, for V4, its hyper head) and checks them.
//!
//! The layer is loaded only when asked for ([`crate::ModelOptions::mtp`]). It is numbered
//! after the model's layers everywhere a layer index is used: layer `L` of
//! `MtpRun::cfg` (the model's configuration with the MTP layer appended), trunk part
//! `L + 1` (the head is `L`) with its input projection and norms in part `L + 2`, both pinned;
//! its routed experts are layer `L` of the expert store, read and cached like every other
//! layer's. Its KV cache is a [`State`] of its own ([`Model::new_mtp_state`]), charged to the
//! budget like a sequence's. Drafts never change an output bit: they are checked by the model
//! itself (`sluice::Draft`).

use crate::ModelError;
use crate::config::ModelConfig;
use crate::config::{MtpHead, Residual};
use crate::model::Model;
use crate::state::State;
use crate::weights::{ExpertSpec, LayerSpec, MatSpec, MtpHeadSpec, VecSpec, WeightLayout};
use sluice_store::{Piece, Reader, read_blob};

/// What running the MTP layer needs besides the model's own.
#[derive(Debug)]
pub(crate) struct MtpRun {
    /// The model's configuration with the MTP layer appended as layer `layers`.
    pub(crate) cfg: ModelConfig,
    /// A configuration whose only layer is the MTP layer: what its state is built from.
    pub(crate) state_cfg: ModelConfig,
    /// KV-cache bytes per position of the MTP layer.
    pub(crate) kv_per_position: u64,
}

impl MtpRun {
    /// The run of the checkpoint's first MTP layer, or why it cannot run.
    pub(crate) fn new(cfg: &ModelConfig, layout: &WeightLayout) -> Result<MtpRun, ModelError> {
        if let Some(e) = &layout.mtp_error {
            return Err(ModelError::Mtp(format!(
                "the checkpoint's multi-token-prediction layer is damaged: {e}"
            )));
        }
        let (Some(m), Some(ml)) = (&cfg.mtp, &layout.mtp) else {
            return Err(ModelError::Mtp(
                "the checkpoint has no multi-token-prediction layers sluice can run".into(),
            ));
        };
        match cfg.residual {
            Residual::Add => {}
            Residual::Hyper(_) if m.head == MtpHead::PerLayer => {}
            _ => {
                return Err(ModelError::Mtp(
                    "MTP layers of a model with attention residuals are not run yet".into(),
                ));
            }
        }
        let (Some(plan), Some(_), Some(_)) = (m.plans.first(), ml.layers.first(), ml.heads.first())
        else {
            return Err(ModelError::Internal("an MTP layout without layers".into()));
        };
        let mut ext = cfg.clone();
        ext.layer_plan.push(plan.clone());
        ext.layers += 1;
        let one = cfg.one_layer(plan);
        let kv_per_position = crate::plan::kv_bytes_per_position(&one);
        Ok(MtpRun {
            cfg: ext,
            state_cfg: one,
            kv_per_position,
        })
    }
}

/// Refuses MTP layers whose copies of the model's embedding or head ([`MtpCopy`]) hold other
/// bytes: the layer runs with the model's own, which would not be the layer the checkpoint
/// trained. Reads both, a slice at a time.
pub(crate) fn check_copies(layout: &WeightLayout, reader: &dyn Reader) -> Result<(), ModelError> {
    const SLICE: u64 = 16 << 20;
    let Some(m) = &layout.mtp else {
        return Ok(());
    };
    for c in &m.copies {
        let mut at = 0;
        while at < c.copy.len {
            let len = SLICE.min(c.copy.len - at);
            let slice = |p: &Piece| Piece {
                shard: p.shard,
                offset: p.offset + at,
                len,
            };
            let (a, b) = (
                read_blob(reader, &[slice(&c.copy)])?,
                read_blob(reader, &[slice(&c.original)])?,
            );
            if let Some(i) = a.piece(0).iter().zip(b.piece(0)).position(|(x, y)| x != y) {
                return Err(ModelError::Mtp(format!(
                    "`{}` differs from the model's `{}` at byte {}; the MTP layer runs with the \
                     model's own, so this checkpoint's is not run; use --draft ngram",
                    c.name,
                    c.of,
                    at + i as u64
                )));
            }
            at += len;
        }
    }
    Ok(())
}

/// Whether `--draft mtp` can run the checkpoint's MTP layer (`Err` says why not).
pub fn mtp_runs(cfg: &ModelConfig, layout: &WeightLayout) -> Result<(), ModelError> {
    MtpRun::new(cfg, layout).map(drop)
}

impl Model {
    /// Whether the MTP layer is loaded ([`crate::ModelOptions::mtp`]).
    pub fn has_mtp(&self) -> bool {
        self.mtp_run().is_some()
    }

    /// A fresh state (KV cache) for the MTP layer, when it is loaded.
    pub fn new_mtp_state(&self) -> Option<State> {
        self.mtp_run().map(|r| State::new(&r.state_cfg))
    }

    /// The trunk part of layer `l` (the MTP layer's after the head).
    pub(crate) fn part_of(&self, l: usize) -> usize {
        if l < self.config().layers { l } else { l + 1 }
    }

    /// Layer `l`'s index in its state (the MTP layer's state holds only it).
    pub(crate) fn state_index(&self, l: usize) -> usize {
        if l < self.config().layers {
            l
        } else {
            l - self.config().layers
        }
    }

    /// Layer `l`'s weights.
    pub(crate) fn layer_spec(&self, l: usize) -> &LayerSpec {
        let n = self.config().layers;
        match (l.checked_sub(n), &self.layout().mtp) {
            (Some(i), Some(m)) => &m.layer_specs[i],
            _ => &self.layout().layer_specs[l],
        }
    }

    /// Layer `l`'s routed experts' weights.
    pub(crate) fn expert_specs_of(&self, l: usize) -> &[ExpertSpec] {
        let n = self.config().layers;
        match (l.checked_sub(n), &self.layout().mtp) {
            (Some(i), Some(m)) => &m.expert_specs[i],
            _ => &self.layout().expert_specs[l],
        }
    }

    /// Runs the MTP layer over `t` rows after the positions `state` holds: row `i` is the
    /// model's final-normed hidden state at a position (`hidden`, `[t, hidden]`; for
    /// DeepSeek-V4's layer the streams after the model's last layer, `[t, hc_mult, hidden]`:
    /// [`ModelConfig::mtp_row_width`] floats per row, what [`State::hidden_rows`] keeps) and
    /// the token that follows it (`tokens[i]`), at rotary position `offset + state.pos() + i`
    /// (the MTP state may start after the model's position 0). Appends to the MTP layer's
    /// cache; returns the logits of the last row (the token after `tokens[t − 1]`, as the MTP
    /// layer predicts it) and every row's output, of the same width, as a further step takes
    /// it as its hidden state (normed or not, as the layer's kind wants). On error the state is
    /// as it was.
    pub fn mtp_forward(
        &self,
        state: &mut State,
        offset: usize,
        hidden: &[f32],
        tokens: &[u32],
    ) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
        let Some(run) = self.mtp_run() else {
            return Err(ModelError::Mtp("the MTP layer is not loaded".into()));
        };
        let cfg = self.config();
        let (w, t) = (cfg.mtp_row_width(), tokens.len());
        if t == 0 || hidden.len() != t * w {
            return Err(ModelError::Internal(format!(
                "mtp_forward: {t} tokens and {} hidden floats",
                hidden.len()
            )));
        }
        if let Some(&bad) = tokens.iter().find(|&&id| id as usize >= cfg.vocab) {
            return Err(ModelError::Token {
                id: bad,
                vocab: cfg.vocab,
            });
        }
        let pos0 = state.pos();
        self.reserve_kv_per(state, pos0 + t, run.kv_per_position)?;
        let r = self.run_in_pool(|| self.mtp_inner(run, state, offset, hidden, tokens));
        if r.is_err() {
            state.rollback(pos0);
        }
        r
    }

    fn mtp_inner(
        &self,
        run: &MtpRun,
        state: &mut State,
        offset: usize,
        hidden: &[f32],
        tokens: &[u32],
    ) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
        let cfg = self.config();
        let (h, t, l) = (cfg.hidden, tokens.len(), cfg.layers);
        let Some(spec) = self
            .layout()
            .mtp
            .as_ref()
            .and_then(|m| m.head_specs.first())
        else {
            return Err(ModelError::Internal(
                "an MTP layout without its head".into(),
            ));
        };
        let entry_blob = self.trunk().part(l + 2)?;
        let mut emb = self.embed_rows(tokens)?;
        // Qwen3-Next's next step starts from the normed rows; DeepSeek's from the layer's
        // output, and their layer sees no embedding at position 0 (vLLM masks it).
        let normed_out = matches!(spec, MtpHeadSpec::Concat { .. });
        if !normed_out && offset + state.pos() == 0 {
            emb[..h].fill(0.0);
        }
        let concat = |proj: &MatSpec, enorm: &VecSpec, hnorm: &VecSpec| {
            let e = self.norm_rows(&emb, &enorm.to_f32(&entry_blob));
            let hn = self.norm_rows(hidden, &hnorm.to_f32(&entry_blob));
            let mut cat = Vec::with_capacity(2 * t * h);
            for (er, hr) in e.chunks_exact(h).zip(hn.chunks_exact(h)) {
                cat.extend_from_slice(er);
                cat.extend_from_slice(hr);
            }
            let mut x = vec![0f32; t * h];
            self.exec().matmul(&proj.view(&entry_blob)?, &cat, &mut x);
            Ok::<_, ModelError>(x)
        };
        let (x, norm, head_mix) = match spec {
            MtpHeadSpec::Concat {
                fc,
                norm_embedding,
                norm_hidden,
                norm,
            } => (concat(fc, norm_embedding, norm_hidden)?, norm, None),
            MtpHeadSpec::Trailing {
                eh_proj,
                enorm,
                hnorm,
                norm,
            } => (concat(eh_proj, enorm, hnorm)?, norm, None),
            MtpHeadSpec::PerLayer {
                e_proj,
                h_proj,
                enorm,
                hnorm,
                norm,
                mix,
            } => {
                // DeepSeek-V4: `h_proj` of every normed stream (every row without
                // hyper-connections), plus `e_proj` of the normed embedding.
                let e = self.norm_rows(&emb, &enorm.to_f32(&entry_blob));
                let mut pe = vec![0f32; t * h];
                self.exec().matmul(&e_proj.view(&entry_blob)?, &e, &mut pe);
                let hn = self.norm_rows(hidden, &hnorm.to_f32(&entry_blob));
                let mut x = vec![0f32; hidden.len()];
                self.exec().matmul(&h_proj.view(&entry_blob)?, &hn, &mut x);
                let width = cfg.mtp_row_width();
                for (row, er) in x.chunks_exact_mut(width).zip(pe.chunks_exact(h)) {
                    for stream in row.chunks_exact_mut(h) {
                        for (a, &b) in stream.iter_mut().zip(er) {
                            *a += b;
                        }
                    }
                }
                (x, norm, mix.as_ref())
            }
        };
        let mut segs = [(&mut *state, tokens)];
        let out = self.run_layers(&run.cfg, &mut segs, offset, x)?;
        state.pos += t;
        // With hyper-connections, the layer's own hyper head first.
        let fin = match cfg.residual {
            Residual::Hyper(hc) => std::borrow::Cow::Owned(crate::residual::hyper_head(
                &self.mixing(),
                &hc,
                head_mix,
                &entry_blob,
                &out,
            )?),
            _ => std::borrow::Cow::Borrowed(&out[..]),
        };
        let y = self.norm_rows(&fin, &norm.to_f32(&entry_blob));
        let head_blob = self.trunk().part(l)?;
        let logits = self.lm_head_rows(&y[(t - 1) * h..], &head_blob)?;
        Ok((logits, if normed_out { y } else { out }))
    }
}
