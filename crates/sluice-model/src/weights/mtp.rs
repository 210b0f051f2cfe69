//! Where a checkpoint's multi-token-prediction layers are: found by the same code as the
//! model's own layers, with their input side, their norms and the tensors that must be copies
//! of the model's.

use super::*;

/// Where a checkpoint's multi-token-prediction layers are.
#[derive(Debug)]
pub struct MtpLayout {
    /// One part per layer.
    pub layers: Vec<PartLayout>,
    /// Specs per layer.
    pub layer_specs: Vec<LayerSpec>,
    /// Per layer, per routed expert: pieces.
    pub experts: Vec<Vec<Vec<Piece>>>,
    /// Per layer, per routed expert: specs.
    pub expert_specs: Vec<Vec<ExpertSpec>>,
    /// The parts holding the input projections and the norms: one for all layers
    /// ([`MtpHead::Concat`](crate::config::MtpHead)), or one per layer.
    pub heads: Vec<PartLayout>,
    /// The input projections and the norms, as `heads`.
    pub head_specs: Vec<MtpHeadSpec>,
    /// Copies of the model's tensors the layers carry ([`MtpHead::Trailing`]'s
    /// `embed_tokens` and `shared_head.head`): not loaded, the model's own are used; they
    /// must hold the same bytes ([`MtpCopy`]).
    pub copies: Vec<MtpCopy>,
}

/// A tensor of the MTP layers that should be a byte-for-byte copy of one of the model's.
#[derive(Clone, Debug)]
pub struct MtpCopy {
    /// The copy's name.
    pub name: String,
    /// The model's tensor it copies.
    pub of: String,
    /// Where the copy is.
    pub copy: Piece,
    /// Where the model's is.
    pub original: Piece,
}

impl MtpLayout {
    /// Bytes of everything they hold, routed experts included.
    pub fn bytes(&self) -> u64 {
        let parts = self.layers.iter().chain(&self.heads).map(PartLayout::bytes);
        let experts = self.experts.iter().flatten().flatten().map(|p| p.len);
        parts.sum::<u64>() + experts.sum::<u64>()
    }
}

/// The input side and the final norm of the multi-token-prediction layers.
#[derive(Clone, Debug)]
pub enum MtpHeadSpec {
    /// [`MtpHead::Concat`](crate::config::MtpHead).
    Concat {
        /// `fc` `[hidden, 2 × hidden]`: the normed embedding and hidden state, concatenated.
        fc: MatSpec,
        /// `pre_fc_norm_embedding`.
        norm_embedding: VecSpec,
        /// `pre_fc_norm_hidden`.
        norm_hidden: VecSpec,
        /// `norm`, before the model's lm_head.
        norm: VecSpec,
    },
    /// [`MtpHead::PerLayer`](crate::config::MtpHead).
    PerLayer {
        /// `e_proj` `[hidden, hidden]`, over the normed embedding.
        e_proj: MatSpec,
        /// `h_proj` `[hidden, hidden]`, over the normed hidden state.
        h_proj: MatSpec,
        /// `enorm`.
        enorm: VecSpec,
        /// `hnorm`.
        hnorm: VecSpec,
        /// `norm`, before the model's lm_head.
        norm: VecSpec,
        /// With hyper-connections, the layer's hyper head (`hc_head`).
        mix: Option<HyperWeights>,
    },
    /// [`MtpHead::Trailing`](crate::config::MtpHead).
    Trailing {
        /// `eh_proj` `[hidden, 2 × hidden]`: the normed embedding and hidden state,
        /// concatenated.
        eh_proj: MatSpec,
        /// `enorm`.
        enorm: VecSpec,
        /// `hnorm`.
        hnorm: VecSpec,
        /// `shared_head.norm`, before the model's lm_head.
        norm: VecSpec,
    },
}

/// The checkpoint's multi-token-prediction layers: each a layer of its `m.plans` under
/// `{m.module}layers.{i}` (found by the same code as the model's own layers), its routed
/// experts, and the input projection and norms.
pub(super) fn mtp_layout(
    ctx: &Ctx<'_>,
    cfg: &ModelConfig,
    m: &crate::config::MtpConfig,
) -> Result<MtpLayout, ModelError> {
    let mut mc = cfg.clone();
    if m.head != MtpHead::Trailing {
        mc.names.prefix = String::new();
        mc.names.model = m.module;
        mc.names.sublayers = 1;
    }
    // Layers `first..first + layers` of `mc` are the MTP layers (those before are never built).
    mc.layers = m.first + m.layers;
    mc.layer_plan = m
        .plans
        .iter()
        .take(1)
        .cycle()
        .take(m.first)
        .chain(&m.plans)
        .cloned()
        .collect();
    mc.draft_layers = 0;
    let h = cfg.hidden;
    let zc = cfg.zero_centred_norms;
    let mut out = MtpLayout {
        layers: Vec::with_capacity(m.layers),
        layer_specs: Vec::with_capacity(m.layers),
        experts: Vec::with_capacity(m.layers),
        expert_specs: Vec::with_capacity(m.layers),
        heads: Vec::new(),
        head_specs: Vec::new(),
        copies: Vec::new(),
    };
    let heads: Vec<String> = match m.head {
        MtpHead::Concat => vec![m.module.to_owned()],
        MtpHead::PerLayer | MtpHead::Trailing => (m.first..m.first + m.layers)
            .map(|l| mc.names.layer_module(l, ""))
            .collect(),
    };
    for module in heads {
        let at = |rest: &str| format!("{module}{rest}");
        let (part, spec) = build_part(ctx, |p| {
            Ok(match m.head {
                MtpHead::Concat => MtpHeadSpec::Concat {
                    fc: p.linear(&at("fc"), h, 2 * h)?,
                    norm_embedding: p.vector(&at("pre_fc_norm_embedding.weight"), h)?.norm(zc),
                    norm_hidden: p.vector(&at("pre_fc_norm_hidden.weight"), h)?.norm(zc),
                    norm: p.vector(&at("norm.weight"), h)?.norm(zc),
                },
                MtpHead::PerLayer => MtpHeadSpec::PerLayer {
                    e_proj: p.linear(&at("e_proj"), h, h)?,
                    h_proj: p.linear(&at("h_proj"), h, h)?,
                    enorm: p.vector(&at("enorm.weight"), h)?.norm(zc),
                    hnorm: p.vector(&at("hnorm.weight"), h)?.norm(zc),
                    norm: p.vector(&at("norm.weight"), h)?.norm(zc),
                    mix: match cfg.residual {
                        Residual::Hyper(hc) if !hc.mean_head => Some(hyper(
                            p,
                            &at("hc_head"),
                            "hc_",
                            hc.streams,
                            1,
                            hc.streams * h,
                        )?),
                        _ => None,
                    },
                },
                MtpHead::Trailing => MtpHeadSpec::Trailing {
                    eh_proj: p.linear(&at("eh_proj"), h, 2 * h)?,
                    enorm: p.vector(&at("enorm.weight"), h)?.norm(zc),
                    hnorm: p.vector(&at("hnorm.weight"), h)?.norm(zc),
                    norm: p.vector(&at("shared_head.norm.weight"), h)?.norm(zc),
                },
            })
        })?;
        out.heads.push(part);
        out.head_specs.push(spec);
        if m.head == MtpHead::Trailing {
            let model = format!("{}{}", cfg.names.prefix, cfg.names.model);
            let lm_head = if cfg.tie_embeddings {
                format!("{model}embed_tokens.")
            } else {
                format!("{}lm_head.", cfg.names.prefix)
            };
            out.copies.extend(mtp_copies(
                ctx.ck,
                &at("embed_tokens."),
                &format!("{model}embed_tokens."),
            )?);
            out.copies
                .extend(mtp_copies(ctx.ck, &at("shared_head.head."), &lm_head)?);
        }
    }
    for l in m.first..m.first + m.layers {
        let (part, spec) = build_part(ctx, |p| layer(p, &mc, l))?;
        let (ep, es) = if mc.is_moe(l) {
            routed_experts(ctx, &mc, l)?
        } else {
            (Vec::new(), Vec::new())
        };
        out.layers.push(part);
        out.layer_specs.push(spec);
        out.experts.push(ep);
        out.expert_specs.push(es);
    }
    Ok(out)
}

/// Where the MTP layers' tensors start: `{module}layers.`, or the model's first layer after
/// its own for [`MtpHead::Trailing`].
pub(super) fn mtp_prefix(cfg: &ModelConfig, m: &crate::config::MtpConfig) -> String {
    match m.head {
        MtpHead::Trailing => cfg.names.layer_module(m.first, ""),
        _ => m.module.to_owned(),
    }
}

/// The tensors under `copy` (an MTP layer's copy of the embedding or the head), each paired
/// with the model's tensor of the same suffix under `original`, which must exist with the same
/// dtype and shape. None when the layer carries no copy.
fn mtp_copies(ck: &Checkpoint, copy: &str, original: &str) -> Result<Vec<MtpCopy>, ModelError> {
    let mut out = Vec::new();
    for name in ck.names().filter(|n| n.starts_with(copy)) {
        let of = format!("{original}{}", &name[copy.len()..]);
        let (c, o) = (ck.tensor(name)?, ck.tensor(&of)?);
        if (c.dtype, &c.shape) != (o.dtype, &o.shape) {
            return Err(ModelError::Tensor {
                tensor: name.to_owned(),
                msg: format!(
                    "{:?} {:?}, but the model's `{of}` it copies is {:?} {:?}",
                    c.dtype, c.shape, o.dtype, o.shape
                ),
            });
        }
        let piece = |t: &sluice_format::TensorInfo| Piece {
            shard: t.shard as u32,
            offset: t.offset,
            len: t.len,
        };
        out.push(MtpCopy {
            name: name.to_owned(),
            of,
            copy: piece(c),
            original: piece(o),
        });
    }
    Ok(out)
}
