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
use crate::net::Net;
use crate::state::State;
use crate::weights::{MatSpec, MtpHeadSpec, VecSpec, WeightLayout};
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
            return Err(ModelError::Mtp(
                "the checkpoint's MTP layout has no layer".into(),
            ));
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

impl Net {
    pub(crate) fn mtp_inner(
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
            return Err(ModelError::Mtp(
                "the checkpoint's MTP layout has no input projection".into(),
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
