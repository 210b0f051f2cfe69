//! Where every weight of a model lives, checked against its role.
//!
//! The trunk is split into parts (one per layer, plus the head: final norm and lm_head); each
//! part is a list of byte ranges read together into one [`Blob`](sluice_store::Blob). Routed experts are one blob
//! each. Specs record, for each role, which piece of the blob holds it and how to view it.
//!
//! The loader is family-agnostic: the names come from the config's [`TensorNames`](crate::config::TensorNames), the
//! attention tensors from the layer's attention kind ([`crate::attention`]), and each tensor is
//! named once (`spec::builder`). How a stored format is recognised is in `spec::linear`; experts
//! fused per layer in [`fused`].

mod fused;
mod mtp;

use sluice_format::Checkpoint;
use sluice_store::Piece;

use crate::spec::{Ctx, PartBuilder, build_part};
pub use crate::spec::{MatSpec, PartLayout, ScaleSpec, TableSpec, VecSpec};
pub use mtp::{MtpCopy, MtpHeadSpec, MtpLayout};
use mtp::{mtp_layout, mtp_prefix};

use crate::ModelError;
pub use crate::attention::AttnSpec;
use crate::config::{ExpertNames, MlpKind, ModelConfig, MtpHead, Residual};

/// A SwiGLU block: down(silu(gate x) ⊙ up x).
#[derive(Clone, Copy, Debug)]
pub struct MlpSpec {
    /// Gate projection.
    pub gate: MatSpec,
    /// Up projection.
    pub up: MatSpec,
    /// Down projection.
    pub down: MatSpec,
}

/// A fused expert (GPT-OSS): `gate_up` interleaves gate (even rows) and up (odd rows), both
/// with biases.
#[derive(Clone, Copy, Debug)]
pub struct FusedExpertSpec {
    /// Fused gate/up projection, `[2 × intermediate, hidden]`.
    pub gate_up: MatSpec,
    /// Its bias.
    pub gate_up_bias: VecSpec,
    /// Down projection, `[hidden, intermediate]`.
    pub down: MatSpec,
    /// Its bias.
    pub down_bias: VecSpec,
}

/// A SwiGLU expert whose gate and up are one matrix (Llama 4): the product's first
/// `intermediate` outputs are the gate, the next the up.
#[derive(Clone, Copy, Debug)]
pub struct GateUpSpec {
    /// Gate and up, `[2 × intermediate, hidden]` (as a view; stored `x @ W`).
    pub gate_up: MatSpec,
    /// Down projection, `[hidden, intermediate]`.
    pub down: MatSpec,
}

/// A clamped-SwiGLU expert whose gate, up and down are separate matrices, each with a bias
/// (GPT-OSS as llama.cpp's converter stores it: the fused `gate_up_proj`'s even rows are the
/// gate, its odd rows the up).
#[derive(Clone, Copy, Debug)]
pub struct BiasedMlpSpec {
    /// The three projections.
    pub mlp: MlpSpec,
    /// The gate's bias.
    pub gate_bias: VecSpec,
    /// The up projection's bias.
    pub up_bias: VecSpec,
    /// The down projection's bias.
    pub down_bias: VecSpec,
}

/// What one routed expert holds, as specs into its blob.
#[derive(Clone, Copy, Debug)]
pub enum ExpertSpec {
    /// Separate gate, up and down matrices.
    SwiGlu(MlpSpec),
    /// Gate and up as one matrix, no biases (Llama 4).
    GateUp(GateUpSpec),
    /// Fused gate/up and down projections with biases (GPT-OSS).
    Fused(FusedExpertSpec),
    /// Separate gate, up and down matrices with biases (GPT-OSS from a GGUF file).
    Biased(BiasedMlpSpec),
}

/// One attention-residual mix: `norm` RMSNorm weights and the `[1, hidden]` score projection.
#[derive(Clone, Copy, Debug)]
pub struct AttnResWeights {
    /// `*_res_norm.weight`.
    pub norm: VecSpec,
    /// `*_res_proj.weight`.
    pub proj: VecSpec,
}

/// One hyper-connection ([`crate::config::Residual::Hyper`]): the `[gates, streams × hidden]`
/// projection `fn`, its `base` `[gates]` and `scale` (one per kind of gate).
#[derive(Clone, Copy, Debug)]
pub struct HyperWeights {
    /// `fn`.
    pub proj: MatSpec,
    /// `base`.
    pub base: VecSpec,
    /// `scale`.
    pub scale: VecSpec,
}

/// The weights of a mix of the residual stream, by residual kind.
#[derive(Clone, Copy, Debug)]
pub enum MixWeights {
    /// Attention residuals.
    AttnRes(AttnResWeights),
    /// A hyper-connection.
    Hyper(HyperWeights),
}

/// The latent projections of a Kimi K3 mixture of experts.
#[derive(Clone, Copy, Debug)]
pub struct LatentSpec {
    /// `routed_expert_down_proj` `[latent, hidden]`.
    pub down: MatSpec,
    /// `routed_expert_up_proj` `[hidden, latent]`.
    pub up: MatSpec,
    /// `routed_expert_norm` on the experts' weighted sum.
    pub norm: Option<VecSpec>,
}

/// Feed-forward weights of a layer kept in the trunk.
// One per layer, built once at load: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum FfnSpec {
    /// A dense block.
    Dense(MlpSpec),
    /// The trunk side of a mixture of experts.
    Moe(MoeSpec),
}

/// The trunk side of a mixture of experts: what every token's routing and the block around
/// the routed experts read (the experts themselves are in the store).
#[derive(Clone, Debug)]
pub struct MoeSpec {
    /// Router weight [experts, hidden].
    pub router: MatSpec,
    /// DeepSeek's selection-only `e_score_correction_bias`, or GPT-OSS's router bias (added
    /// to the logits).
    pub bias: Option<VecSpec>,
    /// Shared expert.
    pub shared: Option<MlpSpec>,
    /// Shared-expert gate [1, hidden] (Qwen2-MoE).
    pub shared_gate: Option<MatSpec>,
    /// Latent projections (Kimi K3).
    pub latent: Option<LatentSpec>,
    /// The token-to-experts table of a hash-routed layer (`gate.tid2eid`).
    pub hash: Option<TableSpec>,
}

/// The trunk weights of one layer.
#[derive(Clone, Debug)]
pub struct LayerSpec {
    /// Pre-attention norm.
    pub input_norm: VecSpec,
    /// Pre-MLP norm.
    pub post_norm: VecSpec,
    /// Attention.
    pub attn: AttnSpec,
    /// Feed-forward.
    pub ffn: FfnSpec,
    /// Attention-residual mixes before attention and before the feed-forward block.
    pub mix: Option<[MixWeights; 2]>,
}

/// The head: final norm and lm_head.
#[derive(Clone, Copy, Debug)]
pub struct HeadSpec {
    /// Final norm.
    pub norm: VecSpec,
    /// lm_head [vocab, hidden].
    pub lm_head: MatSpec,
    /// The attention-residual mix before the final norm.
    pub mix: Option<MixWeights>,
    /// The learned rotary factors `rotary_emb.alpha` ([`crate::config::RopeConfig::learned`]).
    pub rope_alpha: Option<VecSpec>,
}

/// Where everything is.
#[derive(Debug)]
pub struct WeightLayout {
    /// Embedding table part (one piece).
    pub embed: PartLayout,
    /// The embedding matrix [vocab, hidden].
    pub embed_spec: MatSpec,
    /// One trunk part per layer.
    pub layers: Vec<PartLayout>,
    /// Specs per layer.
    pub layer_specs: Vec<LayerSpec>,
    /// Head part.
    pub head: PartLayout,
    /// Head spec.
    pub head_spec: HeadSpec,
    /// Per MoE layer, per expert: pieces (an expert's bytes exactly as stored: packed codes and
    /// their scales stay packed).
    pub experts: Vec<Vec<Vec<Piece>>>,
    /// Per MoE layer, per expert: specs into the expert's blob.
    pub expert_specs: Vec<Vec<ExpertSpec>>,
    /// The multi-token-prediction layers, when the checkpoint has them
    /// ([`crate::config::MtpConfig`]): found and checked; only `--draft mtp` runs them.
    pub mtp: Option<MtpLayout>,
    /// Why the checkpoint's multi-token-prediction layers could not be laid out (a missing or
    /// misshapen tensor), when it has some. The model runs without them; only `--draft mtp`
    /// is refused, with this error.
    pub mtp_error: Option<Box<ModelError>>,
}

/// The config's `num_hidden_layers` against the layers the checkpoint has tensors for, before
/// anything proportional to it is built: more layers than the checkpoint names the first
/// missing tensor; fewer (a silently truncated model) names the tensors that would go unused.
/// Draft layers (`num_nextn_predict_layers`) directly after the last may be present.
fn check_layer_count(ck: &Checkpoint, cfg: &ModelConfig) -> Result<(), ModelError> {
    let head = format!("{}{}layers.", cfg.names.prefix, cfg.names.model);
    let layer_of = |name: &str| -> Option<usize> {
        let rest = name.strip_prefix(&head)?;
        rest.split('.').next()?.parse().ok()
    };
    let config = ck.dir().join("config.json");
    // Checkpoint layers: with sublayers, each holds `sublayers` of the model's.
    let n = cfg.names.sublayers.max(1);
    let layers = cfg.layers.div_ceil(n);
    let used = layers.saturating_add(cfg.draft_layers);
    let mut unused: Vec<&str> = ck
        .names()
        .filter(|n| layer_of(n).is_some_and(|l| l >= used))
        .collect();
    if !unused.is_empty() {
        unused.sort_unstable();
        let k = unused.len();
        let shown = unused[..k.min(3)].join(", ");
        return Err(ModelError::Config {
            file: config,
            field: cfg.layers_field.clone(),
            msg: format!(
                "{layers} layers, but the checkpoint has more: {k} tensors would go unused \
                 ({shown}{})",
                if k > 3 { ", …" } else { "" }
            ),
        });
    }
    let present = ck.names().filter_map(layer_of).max().map_or(0, |l| l + 1);
    if layers > present {
        return Err(ModelError::Config {
            file: config,
            field: cfg.layers_field.clone(),
            msg: format!(
                "{layers} layers, but the checkpoint has tensors for {present} (nothing named \
                 {head}{present}.*)"
            ),
        });
    }
    Ok(())
}

impl WeightLayout {
    /// Finds and checks every tensor the model needs, packed ones against the model's
    /// `quantization_config`.
    pub fn new(ck: &Checkpoint, cfg: &ModelConfig) -> Result<WeightLayout, ModelError> {
        check_layer_count(ck, cfg)?;
        let ctx = Ctx::new(ck, &cfg.quant);
        let names = &cfg.names;
        let h = cfg.hidden;
        let embed_name = format!("{}{}embed_tokens.weight", names.prefix, names.model);
        let (embed, embed_spec) = build_part(&ctx, |p| p.matrix(&embed_name, cfg.vocab, h))?;

        let mut layers = Vec::with_capacity(cfg.layers);
        let mut layer_specs = Vec::with_capacity(cfg.layers);
        let mut experts = Vec::with_capacity(cfg.layers);
        let mut expert_specs = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let (part, spec) = build_part(&ctx, |p| layer(p, cfg, l))?;
            let (lp, ls) = if cfg.is_moe(l) {
                routed_experts(&ctx, cfg, l)?
            } else {
                (Vec::new(), Vec::new())
            };
            layers.push(part);
            layer_specs.push(spec);
            experts.push(lp);
            expert_specs.push(ls);
        }
        let (head, head_spec) = build_part(&ctx, |p| head(p, cfg, &embed_name))?;
        // The MTP layers are loaded only to draft with: a damaged one leaves the model as it is.
        let (mtp, mtp_error) = match &cfg.mtp {
            Some(m) if ck.names().any(|n| n.starts_with(&mtp_prefix(cfg, m))) => {
                match mtp_layout(&ctx, cfg, m) {
                    Ok(l) => (Some(l), None),
                    Err(e) => (None, Some(Box::new(e))),
                }
            }
            _ => (None, None),
        };
        Ok(WeightLayout {
            embed,
            embed_spec,
            layers,
            layer_specs,
            head,
            head_spec,
            experts,
            expert_specs,
            mtp,
            mtp_error,
        })
    }

    /// Bytes of the trunk (everything but routed experts; the embedding table included).
    pub fn trunk_bytes(&self) -> u64 {
        self.embed.bytes()
            + self.layers.iter().map(PartLayout::bytes).sum::<u64>()
            + self.head.bytes()
    }

    /// Bytes of all routed experts.
    pub fn expert_bytes(&self) -> u64 {
        self.experts.iter().flatten().flatten().map(|p| p.len).sum()
    }

    /// Bytes on disk of expert `e` of layer `layer` (0 when there is none): what the expert
    /// cache holds for it, before read alignment. Packed experts stay packed.
    pub fn bytes_of_expert(&self, layer: usize, e: usize) -> u64 {
        self.experts
            .get(layer)
            .and_then(|l| l.get(e))
            .map_or(0, |p| p.iter().map(|p| p.len).sum())
    }

    /// Routed-expert bytes on disk one token needs when nothing is cached: the `top_k` largest
    /// experts of every MoE layer.
    pub fn expert_bytes_per_token(&self, top_k: usize) -> u64 {
        self.experts
            .iter()
            .map(|layer| {
                let mut sizes: Vec<u64> = layer
                    .iter()
                    .map(|p| p.iter().map(|p| p.len).sum())
                    .collect();
                sizes.sort_unstable_by(|a, b| b.cmp(a));
                sizes.iter().take(top_k).sum::<u64>()
            })
            .sum()
    }

    /// Bytes on disk of the largest routed expert.
    pub fn bytes_per_expert(&self) -> u64 {
        self.experts
            .iter()
            .flatten()
            .map(|p| p.iter().map(|p| p.len).sum())
            .max()
            .unwrap_or(0)
    }
}

/// `{module}.{gate,up,down}_proj` as one gated MLP of `[hidden → inter → hidden]`.
fn mlp(
    p: &mut PartBuilder<'_, '_>,
    module: &str,
    hidden: usize,
    inter: usize,
) -> Result<MlpSpec, ModelError> {
    Ok(MlpSpec {
        gate: p.linear(&format!("{module}.gate_proj"), inter, hidden)?,
        up: p.linear(&format!("{module}.up_proj"), inter, hidden)?,
        down: p.linear(&format!("{module}.down_proj"), hidden, inter)?,
    })
}

/// One attention-residual mix: `{stem}_res_norm.weight` and `{stem}_res_proj.weight`.
fn attn_res(
    p: &mut PartBuilder<'_, '_>,
    stem: &str,
    h: usize,
) -> Result<AttnResWeights, ModelError> {
    Ok(AttnResWeights {
        norm: p.vector(&format!("{stem}_res_norm.weight"), h)?,
        proj: p.vector_any(&format!("{stem}_res_proj.weight"), &[1, h])?,
    })
}

/// One hyper-connection: `{module}.{stem}fn` `[gates, width]`, `{module}.{stem}base` `[gates]`
/// and `{module}.{stem}scale` `[scales]`.
fn hyper(
    p: &mut PartBuilder<'_, '_>,
    module: &str,
    stem: &str,
    gates: usize,
    scales: usize,
    width: usize,
) -> Result<HyperWeights, ModelError> {
    Ok(HyperWeights {
        proj: p.matrix(&format!("{module}.{stem}fn"), gates, width)?,
        base: p.vector(&format!("{module}.{stem}base"), gates)?,
        scale: p.vector(&format!("{module}.{stem}scale"), scales)?,
    })
}

/// The trunk part of layer `l`: norms, attention, attention-residual mixes, and the dense MLP
/// or the trunk side of the mixture of experts.
fn layer(
    p: &mut PartBuilder<'_, '_>,
    cfg: &ModelConfig,
    l: usize,
) -> Result<LayerSpec, ModelError> {
    let names = &cfg.names;
    let h = cfg.hidden;
    // Layer `l`'s module `m` (with sublayers, the sublayer's entry of it).
    let at = |m: &str| names.layer_module(l, m);
    let zc = cfg.zero_centred_norms;
    let input_norm = p
        .vector(&format!("{}.weight", at("input_layernorm")), h)?
        .norm(zc);
    let post_norm = p
        .vector(&format!("{}.weight", at("post_attention_layernorm")), h)?
        .norm(zc);
    let plan = &cfg.layer_plan[l];
    let attention = at(names.attention_of(&plan.attention));
    let attn = plan.attention.load(p, &|x| format!("{attention}.{x}"), h)?;
    let mix = match cfg.residual {
        Residual::AttnRes { .. } => Some([
            MixWeights::AttnRes(attn_res(p, &at("self_attention"), h)?),
            MixWeights::AttnRes(attn_res(p, &at("mlp"), h)?),
        ]),
        Residual::Hyper(hc) => {
            let (g, s, w) = (hc.gates(), hc.scales(), hc.streams * h);
            Some([
                MixWeights::Hyper(hyper(p, &at("attn_hc"), "", g, s, w)?),
                MixWeights::Hyper(hyper(p, &at("ffn_hc"), "", g, s, w)?),
            ])
        }
        Residual::Add => None,
    };
    let ffn = match plan.mlp {
        MlpKind::Dense { intermediate } => {
            // The first module the checkpoint has a gate projection under.
            let ck = p.checkpoint();
            let module = names
                .dense
                .iter()
                .map(|m| at(m))
                .find(|m| ck.get(&format!("{m}.gate_proj.weight")).is_some())
                .unwrap_or_else(|| at(names.dense[0]));
            FfnSpec::Dense(mlp(p, &module, h, intermediate)?)
        }
        MlpKind::Moe => {
            let m = &cfg.moe;
            let module = names.moe_module(l);
            let moe = |rest: &str| format!("{module}.{rest}");
            let width = m.router_width();
            let router = p.matrix(&moe(&format!("{}.weight", names.router)), width, h)?;
            let hashed = cfg.is_hash_routed(l);
            let bias = match names.router_bias {
                // `[experts]`, or ERNIE's `[1, experts]`; hash-routed layers select by the token.
                Some(b) if !hashed => Some(p.vector_any(&moe(b), &[width])?),
                _ => None,
            };
            let hash = if hashed {
                Some(p.table(
                    &moe(&format!("{}.tid2eid", names.router)),
                    cfg.vocab,
                    m.top_k,
                )?)
            } else {
                None
            };
            let shared_module = if names.shared_in_layer {
                at(names.shared)
            } else {
                moe(names.shared)
            };
            let (shared, shared_gate) = match &m.shared {
                Some(sh) => (
                    Some(mlp(p, &shared_module, h, sh.intermediate)?),
                    if sh.gated {
                        Some(p.linear(&format!("{shared_module}_gate"), 1, h)?)
                    } else {
                        None
                    },
                ),
                None => (None, None),
            };
            let latent = match &m.latent {
                Some(lat) => Some(LatentSpec {
                    down: p.linear(&moe("routed_expert_down_proj"), lat.dim, h)?,
                    up: p.linear(&moe("routed_expert_up_proj"), h, lat.dim)?,
                    norm: if lat.norm {
                        Some(p.vector(&moe("routed_expert_norm.weight"), lat.dim)?)
                    } else {
                        None
                    },
                }),
                None => None,
            };
            FfnSpec::Moe(MoeSpec {
                router,
                bias,
                shared,
                shared_gate,
                latent,
                hash,
            })
        }
    };
    Ok(LayerSpec {
        input_norm,
        post_norm,
        attn,
        ffn,
        mix,
    })
}

/// The routed experts of layer `l`, one blob each.
fn routed_experts(
    ctx: &Ctx<'_>,
    cfg: &ModelConfig,
    l: usize,
) -> Result<(Vec<Vec<Piece>>, Vec<ExpertSpec>), ModelError> {
    let names = &cfg.names;
    let moe = names.moe_module(l);
    let (gate, up, down) = match names.experts {
        ExpertNames::FusedGateUp => {
            return fused::fused_experts(ctx, cfg, &format!("{moe}.experts"));
        }
        ExpertNames::FusedXw => {
            return fused::xw_experts(ctx, cfg, &format!("{moe}.experts"));
        }
        ExpertNames::Stacked { gate, up, down } => {
            return fused::stacked_experts(ctx, cfg, &moe, [gate, up, down]);
        }
        ExpertNames::Separate { .. }
            if ctx.ck.get(&format!("{moe}.experts.gate_up_proj")).is_some() =>
        {
            return fused::concat_experts(ctx, cfg, &format!("{moe}.experts"));
        }
        ExpertNames::Separate { gate, up, down } => (gate, up, down),
    };
    let width = cfg.moe.expert_width(cfg.hidden);
    let inter = cfg.moe.intermediate;
    let mut pieces = Vec::with_capacity(cfg.moe.experts);
    let mut specs = Vec::with_capacity(cfg.moe.experts);
    for e in 0..cfg.moe.experts {
        let name = |w: &str| format!("{moe}.experts.{e}.{w}");
        let (part, spec) = build_part(ctx, |p| {
            Ok(MlpSpec {
                gate: p.linear(&name(gate), inter, width)?,
                up: p.linear(&name(up), inter, width)?,
                down: p.linear(&name(down), width, inter)?,
            })
        })?;
        pieces.push(part.pieces);
        specs.push(ExpertSpec::SwiGlu(spec));
    }
    Ok((pieces, specs))
}

/// The head: the final norm, lm_head (the embedding matrix when tied) and the final
/// attention-residual mix.
fn head(
    p: &mut PartBuilder<'_, '_>,
    cfg: &ModelConfig,
    embed: &str,
) -> Result<HeadSpec, ModelError> {
    let top = |rest: &str| format!("{}{rest}", cfg.names.prefix);
    let model = |rest: &str| top(&format!("{}{rest}", cfg.names.model));
    let h = cfg.hidden;
    Ok(HeadSpec {
        norm: p
            .vector(&model("norm.weight"), h)?
            .norm(cfg.zero_centred_norms),
        lm_head: if cfg.tie_embeddings {
            p.matrix(embed, cfg.vocab, h)?
        } else {
            p.linear(&top("lm_head"), cfg.vocab, h)?
        },
        mix: match cfg.residual {
            Residual::AttnRes { .. } => {
                Some(MixWeights::AttnRes(attn_res(p, &model("output_attn"), h)?))
            }
            Residual::Hyper(hc) if hc.mean_head => None,
            Residual::Hyper(hc) => Some(MixWeights::Hyper(hyper(
                p,
                &model("hc_head"),
                "hc_",
                hc.streams,
                1,
                hc.streams * h,
            )?)),
            Residual::Add => None,
        },
        rope_alpha: if cfg.rope.learned {
            Some(p.vector(&model("rotary_emb.alpha"), cfg.rope.dim / 2)?)
        } else {
            None
        },
    })
}
