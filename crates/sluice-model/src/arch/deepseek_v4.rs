//! DeepSeek-V4 (`deepseek_v4`, V4-Flash and V4-Pro), as transformers 5.24 runs it:
//!
//! - **Attention** ([`crate::attention::compressed`]): one shared key-value head over a sliding
//!   window of `sliding_window` positions with per-head sinks, queries through a LoRA
//!   (`q_lora_rank`), the grouped output projection (`o_groups`, `o_lora_rank`), the last
//!   `head_dim · partial_rotary_factor` dimensions rotated with adjacent pairs. Per
//!   `layer_types`: `sliding_attention` layers only that; `heavily_compressed_attention` layers
//!   also attend to every entry of a compressor over windows of `compress_rates` (128);
//!   `compressed_sparse_attention` layers to an indexer's `index_topk` of overlapping windows'
//!   entries (4). Sliding layers rotate by `rope_parameters.main` (θ `rope_theta`), compressed
//!   ones by `rope_parameters.compress` (θ `compress_rope_theta`, YaRN with `attention_factor`
//!   1: the reference does not scale cos/sin).
//! - **Residual**: mHC hyper-connections (`hc_mult` streams, Sinkhorn-Knopp mixing of
//!   `hc_sinkhorn_iters`, the gain 2 on `post`) and the gated hyper head.
//! - **Experts**: `√softplus` scores (`scoring_func`), the top-k of scores plus the selection
//!   bias, renormalised, times `routed_scaling_factor`; `mlp_layer_types` `hash_moe` layers take
//!   their experts from the token (`gate.tid2eid[token]`, [`crate::config::LayerPlan::hash_routed`]);
//!   SwiGLU of inputs bounded by `swiglu_limit` in the routed and the shared experts.
//! - **Tensor names.** Checkpoints use DeepSeek's names (`layers.{l}.attn.wq_a`, `.ffn.experts.{e}.w1`,
//!   `hc_attn_fn`, `attn_sink`, `embed`, `head`, with or without the `model.` transformers
//!   writes); they are renamed as transformers' conversion mapping renames them on load
//!   ([`canonical`]), the routed experts kept one module per expert (`w1`, `w3`, `w2`).
//! - **Multi-token prediction.** `num_nextn_predict_layers` (1) MTP layers under `mtp.{i}.`,
//!   which transformers does not instantiate, are found and checked when present (a checkpoint
//!   without them reads the same); the first drafts with `--draft mtp` over the model's
//!   hyper-connection streams ([`crate::mtp`]): each a block like the model's (its attention from
//!   the `layer_types` / `compress_ratios` entry past the last layer, sliding when there is
//!   none; learned routing, `ffn.gate.bias`) with its own head, `e_proj` and `h_proj`
//!   `[hidden, hidden]` over the embedding normed by `enorm` and the hidden state normed by
//!   `hnorm`, the final `norm` and a hyper head `hc_head_{fn,base,scale}`. The names are those of
//!   the released V4-Flash checkpoint (its MTP shard holds `mtp.0.*` only: 256 experts in FP4,
//!   the rest FP8 with UE8M0 scales, `hc_*` in f32), read as `mtp.layers.{i}.` ([`canonical`]).

use serde_json::Value;

use super::common::{Base, top_k};
use super::{Family, Models};
use crate::ModelError;
use crate::attention::{CompressedConfig, Compressor, Indexer};
use crate::config::{
    AttentionConfig, Cfg, ExpertActivation, ExpertNames, GluActivation, HyperConfig, LayerPlan,
    MAX_LAYERS, MAX_SIZE, MlpKind, ModelConfig, MoeConfig, MtpConfig, MtpHead, Rename, Residual,
    RopeConfig, RopeScaling, RouterKind, TensorNames, read_rope_object,
};

pub(super) const FAMILY: Family = Family {
    name: "deepseek_v4",
    models: &[Models {
        model_types: &["deepseek_v4"],
        names: "DeepSeek-V4-Flash / Pro",
        features: "one shared key-value head over a sliding window with sinks, beside heavily compressed entries (one per 128 positions) or an indexer's top-k of overlapping compressed entries, per layer; the grouped output projection; mHC hyper-connections with the gated head; √softplus routing, the first layers hash-routed from the token id (their experts prefetched exactly); bounded SwiGLU; DeepSeek's tensor names; FP8 with UE8M0 scales and FP4 experts as released; the MTP layer (`mtp.0.*`) drafts with `--draft mtp`",
    }],
    read,
    gguf: &[],
};

/// transformers' default: 64 of 512 dimensions rotated.
const DEFAULT_PARTIAL: f64 = 64.0 / 512.0;

/// The attention of each layer type.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sliding,
    Sparse,
    Heavy,
}

fn kind_of(c: &Cfg<'_>, field: &str, s: &str) -> Result<Kind, ModelError> {
    Ok(match s {
        "sliding_attention" => Kind::Sliding,
        "compressed_sparse_attention" => Kind::Sparse,
        "heavily_compressed_attention" => Kind::Heavy,
        other => {
            return Err(c.err(
                field,
                format!(
                    "`{other}` is not a DeepSeek-V4 layer type (sliding_attention, \
                     compressed_sparse_attention, heavily_compressed_attention)"
                ),
            ));
        }
    })
}

/// `layer_types`, else the legacy per-layer `compress_ratios` (0, 4, 128), else transformers'
/// default (two heavily compressed layers, then sparse and heavy alternating); then the `mtp`
/// MTP layers' from the entries past the last layer (the released configs' `compress_ratios`
/// end with the MTP layer's 0), sliding where the list stops.
fn layer_kinds(c: &Cfg<'_>, n: usize, mtp: usize) -> Result<Vec<Kind>, ModelError> {
    let list = |field: &str| -> Result<Option<&Vec<Value>>, ModelError> {
        match c.get(field) {
            None => Ok(None),
            Some(Value::Array(a)) if a.len() >= n => Ok(Some(a)),
            Some(Value::Array(a)) => Err(c.err(
                field,
                format!("{} entries for {n} layers (num_hidden_layers)", a.len()),
            )),
            Some(_) => Err(c.err(field, "expected a list")),
        }
    };
    let upto = |a: &Vec<Value>| a.len().min(n.saturating_add(mtp));
    let mut kinds: Vec<Kind> = if let Some(a) = list("layer_types")? {
        a[..upto(a)]
            .iter()
            .enumerate()
            .map(|(l, v)| {
                let field = format!("layer_types.{l}");
                let s = v
                    .as_str()
                    .ok_or_else(|| c.err(&field, "expected a string"))?;
                kind_of(c, &field, s)
            })
            .collect::<Result<_, _>>()?
    } else if let Some(a) = list("compress_ratios")? {
        a[..upto(a)]
            .iter()
            .enumerate()
            .map(|(l, v)| match v.as_u64() {
                Some(0) => Ok(Kind::Sliding),
                Some(4) => Ok(Kind::Sparse),
                Some(128) => Ok(Kind::Heavy),
                _ => Err(c.err(
                    &format!("compress_ratios.{l}"),
                    format!("{v} is not 0, 4 or 128"),
                )),
            })
            .collect::<Result<_, _>>()?
    } else {
        (0..n)
            .map(|l| {
                if l < 2 || l % 2 == 0 {
                    Kind::Heavy
                } else {
                    Kind::Sparse
                }
            })
            .collect()
    };
    kinds.resize(n + mtp, Kind::Sliding);
    Ok(kinds)
}

/// `mlp_layer_types` (`hash_moe` or `moe`), else the first `num_hash_layers` (3) hash-routed.
fn hash_layers(c: &Cfg<'_>, n: usize) -> Result<Vec<bool>, ModelError> {
    match c.get("mlp_layer_types") {
        None => {
            let k = c.opt_usize("num_hash_layers")?.unwrap_or(3);
            Ok((0..n).map(|l| l < k).collect())
        }
        Some(Value::Array(a)) if a.len() >= n => a[..n]
            .iter()
            .enumerate()
            .map(|(l, v)| match v.as_str() {
                Some("hash_moe") => Ok(true),
                Some("moe") => Ok(false),
                _ => Err(c.err(
                    &format!("mlp_layer_types.{l}"),
                    format!("{v} is not `hash_moe` or `moe`"),
                )),
            })
            .collect(),
        Some(_) => Err(c.err(
            "mlp_layer_types",
            format!("expected a list of {n} entries (num_hidden_layers)"),
        )),
    }
}

/// The main and compress rotary tables: `rope_parameters.{main,compress}`, or (older configs)
/// `rope_theta` for the main one and the flat `rope_parameters` / `rope_scaling` with
/// `compress_rope_theta` for the other, as transformers folds them.
fn ropes(
    c: &Cfg<'_>,
    head_dim: usize,
    max_positions: usize,
    partial: f64,
) -> Result<(RopeConfig, RopeConfig), ModelError> {
    let nested = c.get("rope_parameters").filter(|p| {
        p.get("main").is_some_and(Value::is_object)
            && p.get("compress").is_some_and(Value::is_object)
    });
    let (main, mut compress) = match nested {
        Some(p) => {
            let sub = |k: &str| Cfg {
                v: &p[k],
                file: c.file,
                prefix: format!("{}rope_parameters.{k}.", c.prefix),
            };
            let main =
                read_rope_object(&sub("main"), head_dim, true, max_positions, Some(partial))?;
            let compress = read_rope_object(
                &sub("compress"),
                head_dim,
                true,
                max_positions,
                Some(partial),
            )?;
            (main, compress)
        }
        None => {
            let theta = c.opt_f64("rope_theta")?.unwrap_or(10000.0);
            let ctheta = c.opt_f64("compress_rope_theta")?.unwrap_or(160000.0);
            let mut flat = serde_json::Map::new();
            if let Some(Value::Object(o)) = c.get("rope_parameters").or(c.get("rope_scaling")) {
                flat.extend(o.clone());
            }
            flat.insert("rope_theta".into(), ctheta.into());
            let flat = Value::Object(flat);
            let fc = Cfg {
                v: &flat,
                file: c.file,
                prefix: format!("{}rope_parameters.", c.prefix),
            };
            let compress = read_rope_object(&fc, head_dim, true, max_positions, Some(partial))?;
            let main = RopeConfig {
                theta,
                scaling: RopeScaling::None,
                ..compress.clone()
            };
            (main, compress)
        }
    };
    // transformers forces `attention_factor` 1 on the compress table's YaRN.
    if let RopeScaling::Yarn {
        attention_factor, ..
    } = &mut compress.scaling
        && attention_factor.is_none()
    {
        *attention_factor = Some(1.0);
    }
    if main.dim != compress.dim {
        return Err(c.err(
            "rope_parameters",
            format!(
                "main rotates {} dimensions and compress {}; DeepSeek-V4 rotates the same",
                main.dim, compress.dim
            ),
        ));
    }
    Ok((main, compress))
}

fn read(c: &Cfg<'_>, model_type: &str) -> Result<ModelConfig, ModelError> {
    let base = Base::read(c, false)?;
    let n = base.layers;
    let heads = base.heads;
    let head_dim = c.pos_usize("head_dim")?;
    if let Some(kvh) = c.opt_usize("num_key_value_heads")?
        && kvh != 1
    {
        return Err(c.err(
            "num_key_value_heads",
            format!("{kvh} is not supported (DeepSeek-V4 shares one key-value head)"),
        ));
    }
    let partial = match (
        c.opt_f64("partial_rotary_factor")?,
        c.opt_usize("qk_rope_head_dim")?,
    ) {
        (Some(f), _) => f,
        (None, Some(r)) => r as f64 / head_dim as f64,
        (None, None) => DEFAULT_PARTIAL,
    };
    let (main, compress) = ropes(c, head_dim, base.max_positions, partial)?;
    let q_lora_rank = c.pos_usize("q_lora_rank")?;
    let o_groups = c.pos_usize("o_groups")?;
    let o_rank = c.pos_usize("o_lora_rank")?;
    if !heads.is_multiple_of(o_groups) {
        return Err(c.err(
            "o_groups",
            format!("{o_groups} does not divide num_attention_heads {heads}"),
        ));
    }
    let window = c.pos_usize("sliding_window")?;
    let rate_of = |key: &str, default: usize| -> Result<usize, ModelError> {
        let r = match c.get("compress_rates") {
            Some(Value::Object(o)) => match o.get(key) {
                // A compressor's position bias is `rate × 2·head_dim` floats.
                Some(v) => v
                    .as_u64()
                    .map(|v| v as usize)
                    .filter(|&v| v > 0 && v.saturating_mul(2 * head_dim) <= MAX_SIZE)
                    .ok_or_else(|| {
                        c.err(
                            &format!("compress_rates.{key}"),
                            format!(
                                "expected a positive integer with rate × 2 × head_dim at most \
                                 {MAX_SIZE}"
                            ),
                        )
                    })?,
                None => default,
            },
            Some(_) => return Err(c.err("compress_rates", "expected an object")),
            None => default,
        };
        Ok(r)
    };
    let sparse_rate = rate_of("compressed_sparse_attention", 4)?;
    let heavy_rate = rate_of("heavily_compressed_attention", 128)?;
    let indexer = Indexer {
        heads: c.pos_usize("index_n_heads")?,
        head_dim: c.pos_usize("index_head_dim")?,
        top_k: c.pos_usize("index_topk")?,
    };
    if indexer.head_dim < main.dim {
        return Err(c.err(
            "index_head_dim",
            format!(
                "{} is narrower than the {} rotated dimensions",
                indexer.head_dim, main.dim
            ),
        ));
    }
    // The MTP layers (`mtp.{i}.`, not instantiated by transformers): checked when present.
    let mtp = c.opt_usize("num_nextn_predict_layers")?.unwrap_or(1);
    if mtp > MAX_LAYERS {
        return Err(c.err(
            "num_nextn_predict_layers",
            format!("{mtp} is more than {MAX_LAYERS}"),
        ));
    }
    let mut kinds = layer_kinds(c, n, mtp)?;
    let mtp_kinds = kinds.split_off(n);
    let attention = |k: Kind| {
        AttentionConfig::Compressed(CompressedConfig {
            heads,
            head_dim,
            q_lora_rank,
            window,
            o_groups,
            o_rank,
            local_rope: k == Kind::Sliding,
            compressor: match k {
                Kind::Sliding => None,
                Kind::Heavy => Some(Compressor {
                    rate: heavy_rate,
                    overlap: false,
                    indexer: None,
                }),
                Kind::Sparse => Some(Compressor {
                    rate: sparse_rate,
                    overlap: true,
                    indexer: Some(indexer),
                }),
            },
            softmax_scale: (head_dim as f32).powf(-0.5),
        })
    };
    let layer_plan: Vec<LayerPlan> = kinds
        .iter()
        .map(|&k| LayerPlan::new(attention(k), MlpKind::Moe))
        .collect();

    let experts = c.pos_usize("n_routed_experts")?;
    let intermediate = c.pos_usize("moe_intermediate_size")?;
    let top_k = top_k(c, experts)?;
    let scale = c.pos_f32("routed_scaling_factor")?;
    let router = match c
        .get("scoring_func")
        .and_then(Value::as_str)
        .unwrap_or("sqrtsoftplus")
    {
        "sqrtsoftplus" => RouterKind::SqrtSoftplus {
            routed_scaling_factor: scale,
        },
        "sigmoid" => RouterKind::SigmoidGroup {
            n_group: 1,
            topk_group: 1,
            norm_topk_prob: true,
            routed_scaling_factor: scale,
        },
        other => {
            return Err(c.err(
                "scoring_func",
                format!("`{other}` is not supported (supported: sqrtsoftplus, sigmoid)"),
            ));
        }
    };
    if !c.bool_or("norm_topk_prob", true)? {
        return Err(c.err(
            "norm_topk_prob",
            "false is not supported (DeepSeek-V4's routers always renormalise)",
        ));
    }
    let n_shared = c.usize("n_shared_experts")?;
    let shared = super::common::shared_experts(c, n_shared, intermediate)?;
    let limit = super::common::swiglu_limit(c)?;
    let moe = MoeConfig {
        shared,
        activation: ExpertActivation::SwiGluInputsClamped { limit },
        ..MoeConfig::routed(experts, top_k, intermediate, router)
    };
    let names = TensorNames {
        router_bias: Some("gate.e_score_correction_bias"),
        experts: ExpertNames::Separate {
            gate: "w1",
            up: "w3",
            down: "w2",
        },
        rename: Some(Rename {
            dialect: "deepseek",
            canonical,
        }),
        ..TensorNames::standard()
    };
    let streams = super::common::hc_streams(c)?;
    let iters = c.opt_usize("hc_sinkhorn_iters")?.unwrap_or(20);
    let hash_routed = hash_layers(c, n)?;
    let eps = c.opt_f32("hc_eps")?.unwrap_or(1e-6);
    let mut cfg = base.finish(c, FAMILY.name, model_type, compress, layer_plan, moe, names)?;
    cfg.local_rope = Some(main);
    cfg.residual = Residual::Hyper(HyperConfig {
        streams,
        gain: 2.0,
        eps,
        sinkhorn: Some(iters.max(1)),
        mean_head: false,
    });
    cfg.mlp_act = GluActivation::SiluInputsClamped { limit };
    for (p, &hash) in cfg.layer_plan.iter_mut().zip(&hash_routed) {
        p.hash_routed = hash;
    }
    // transformers does not instantiate the MTP layers; their tensors live under `mtp.`, which
    // the layer count does not see.
    cfg.draft_layers = 0;
    cfg.mtp = (mtp > 0).then(|| MtpConfig {
        module: "model.mtp.",
        first: 0,
        layers: mtp,
        plans: mtp_kinds
            .iter()
            .map(|&k| LayerPlan::new(attention(k), MlpKind::Moe))
            .collect(),
        head: MtpHead::PerLayer,
    });
    Ok(cfg)
}

/// The name transformers gives a stored tensor as it loads it (`conversion_mapping`'s
/// `deepseek_v4` entry, the experts' merge aside), `None` when it keeps it.
pub(crate) fn canonical(name: &str) -> Option<String> {
    let bare = name.strip_prefix("model.").unwrap_or(name);
    let renamed = match bare {
        "head.weight" | "lm_head.weight" => {
            return (name != "lm_head.weight").then(|| "lm_head.weight".into());
        }
        "embed.weight" => "embed_tokens.weight".to_owned(),
        // The final norm keeps its name (`.norm.` is the attention's `kv_norm` elsewhere).
        "norm.weight" => "norm.weight".to_owned(),
        "hc_head_fn" => "hc_head.hc_fn".to_owned(),
        "hc_head_base" => "hc_head.hc_base".to_owned(),
        "hc_head_scale" => "hc_head.hc_scale".to_owned(),
        _ => match mtp_layer(bare) {
            // The multi-token-prediction layers, `mtp.{i}.`, as `mtp.layers.{i}.` (transformers
            // drops them; [`crate::config::MtpConfig`]): the block renamed as the model's, its
            // own head (`e_proj`, `h_proj`, `enorm`, `hnorm`, `norm`, `hc_head_*`) kept.
            Some((i, rest)) => {
                let rest = match rest {
                    "norm.weight" => rest.to_owned(),
                    "hc_head_fn" => "hc_head.hc_fn".to_owned(),
                    "hc_head_base" => "hc_head.hc_base".to_owned(),
                    "hc_head_scale" => "hc_head.hc_scale".to_owned(),
                    _ => block_name(rest),
                };
                format!("mtp.layers.{i}.{rest}")
            }
            None => block_name(bare),
        },
    };
    let full = format!("model.{renamed}");
    (full != name).then_some(full)
}

/// `mtp.{i}.{rest}` as `(i, rest)`.
fn mtp_layer(bare: &str) -> Option<(usize, &str)> {
    let (i, rest) = bare.strip_prefix("mtp.")?.split_once('.')?;
    Some((i.parse().ok()?, rest))
}

/// A layer's tensor (or a name within one) under transformers' names.
fn block_name(name: &str) -> String {
    let mut s = format!(".{name}");
    for (from, to) in [
        (".attn.", ".self_attn."),
        (".ffn.", ".mlp."),
        (".indexer.compressor.", ".compressor.indexer."),
        (".attn_norm.", ".input_layernorm."),
        (".ffn_norm.", ".post_attention_layernorm."),
        (".hc_attn_fn", ".attn_hc.fn"),
        (".hc_attn_base", ".attn_hc.base"),
        (".hc_attn_scale", ".attn_hc.scale"),
        (".hc_ffn_fn", ".ffn_hc.fn"),
        (".hc_ffn_base", ".ffn_hc.base"),
        (".hc_ffn_scale", ".ffn_hc.scale"),
        (".attn_sink", ".sinks"),
        (
            ".indexer.weights_proj.",
            ".compressor.indexer.scorer.weights_proj.",
        ),
        (".indexer.wq_b.", ".compressor.indexer.q_b_proj."),
        (".norm.", ".kv_norm."),
        (".ape", ".position_bias"),
        (".wq_a.", ".q_a_proj."),
        (".self_attn.wq_b.", ".self_attn.q_b_proj."),
        (".wkv.", ".kv_proj."),
        (".wgate.", ".gate_proj."),
        (".wo_a.", ".o_a_proj."),
        (".wo_b.", ".o_b_proj."),
        (".q_norm.", ".q_a_norm."),
        (".gate.bias", ".gate.e_score_correction_bias"),
        (".shared_experts.w1.", ".shared_experts.gate_proj."),
        (".shared_experts.w2.", ".shared_experts.down_proj."),
        (".shared_experts.w3.", ".shared_experts.up_proj."),
    ] {
        s = s.replace(from, to);
    }
    s[1..].to_owned()
}

#[cfg(test)]
mod tests {
    use super::canonical;

    #[test]
    fn names_are_renamed_as_transformers_loads_them() {
        for (stored, want) in [
            ("head.weight", "lm_head.weight"),
            ("embed.weight", "model.embed_tokens.weight"),
            ("hc_head_fn", "model.hc_head.hc_fn"),
            ("norm.weight", "model.norm.weight"),
            (
                "model.layers.1.attn.wq_a.weight",
                "model.layers.1.self_attn.q_a_proj.weight",
            ),
            (
                "layers.1.attn.wq_b.weight",
                "model.layers.1.self_attn.q_b_proj.weight",
            ),
            (
                "layers.1.attn.norm.weight",
                "model.layers.1.self_attn.kv_norm.weight",
            ),
            ("layers.1.attn.attn_sink", "model.layers.1.self_attn.sinks"),
            (
                "layers.1.attn.compressor.ape",
                "model.layers.1.self_attn.compressor.position_bias",
            ),
            (
                "layers.1.attn.indexer.compressor.wkv.weight",
                "model.layers.1.self_attn.compressor.indexer.kv_proj.weight",
            ),
            (
                "layers.1.attn.indexer.compressor.norm.weight",
                "model.layers.1.self_attn.compressor.indexer.kv_norm.weight",
            ),
            (
                "layers.1.attn.indexer.wq_b.weight",
                "model.layers.1.self_attn.compressor.indexer.q_b_proj.weight",
            ),
            (
                "layers.1.attn.indexer.weights_proj.weight",
                "model.layers.1.self_attn.compressor.indexer.scorer.weights_proj.weight",
            ),
            ("layers.0.hc_attn_fn", "model.layers.0.attn_hc.fn"),
            (
                "layers.0.attn_norm.weight",
                "model.layers.0.input_layernorm.weight",
            ),
            (
                "layers.0.ffn_norm.weight",
                "model.layers.0.post_attention_layernorm.weight",
            ),
            (
                "layers.0.ffn.gate.tid2eid",
                "model.layers.0.mlp.gate.tid2eid",
            ),
            (
                "layers.3.ffn.gate.bias",
                "model.layers.3.mlp.gate.e_score_correction_bias",
            ),
            (
                "layers.3.ffn.experts.5.w1.weight",
                "model.layers.3.mlp.experts.5.w1.weight",
            ),
            (
                "layers.3.ffn.shared_experts.w3.weight",
                "model.layers.3.mlp.shared_experts.up_proj.weight",
            ),
            // The MTP layers' block, and their own head.
            (
                "mtp.0.attn.wq_a.weight",
                "model.mtp.layers.0.self_attn.q_a_proj.weight",
            ),
            (
                "mtp.0.attn.norm.weight",
                "model.mtp.layers.0.self_attn.kv_norm.weight",
            ),
            ("mtp.1.attn.attn_sink", "model.mtp.layers.1.self_attn.sinks"),
            ("mtp.0.hc_ffn_base", "model.mtp.layers.0.ffn_hc.base"),
            (
                "mtp.0.ffn.experts.7.w2.weight",
                "model.mtp.layers.0.mlp.experts.7.w2.weight",
            ),
            (
                "mtp.0.ffn.gate.bias",
                "model.mtp.layers.0.mlp.gate.e_score_correction_bias",
            ),
            ("mtp.0.e_proj.weight", "model.mtp.layers.0.e_proj.weight"),
            ("mtp.0.h_proj.scale", "model.mtp.layers.0.h_proj.scale"),
            ("mtp.0.enorm.weight", "model.mtp.layers.0.enorm.weight"),
            ("mtp.0.norm.weight", "model.mtp.layers.0.norm.weight"),
            ("mtp.0.hc_head_fn", "model.mtp.layers.0.hc_head.hc_fn"),
            ("mtp.0.hc_head_scale", "model.mtp.layers.0.hc_head.hc_scale"),
        ] {
            assert_eq!(canonical(stored).as_deref(), Some(want), "{stored}");
        }
        for kept in [
            "lm_head.weight",
            "model.norm.weight",
            "model.embed_tokens.weight",
            "model.layers.0.self_attn.q_a_proj.weight",
        ] {
            assert_eq!(canonical(kept), None, "{kept}");
        }
    }

    use crate::config::test_util::*;

    /// A DeepSeek-V4 config as transformers 5.24 writes it (the fixture's shape).
    fn dsv4() -> Value {
        json!({
            "model_type": "deepseek_v4", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 5,
            "rms_norm_eps": 1e-6, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
            "max_position_embeddings": 256, "q_lora_rank": 32, "hidden_act": "silu",
            "partial_rotary_factor": 0.25, "num_experts_per_tok": 2, "n_routed_experts": 8,
            "moe_intermediate_size": 32, "n_shared_experts": 1, "routed_scaling_factor": 1.5,
            "scoring_func": "sqrtsoftplus", "o_groups": 2, "o_lora_rank": 16, "sliding_window": 8,
            "index_n_heads": 8, "index_head_dim": 16, "index_topk": 3, "hc_mult": 3,
            "swiglu_limit": 0.8,
            "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
            "layer_types": ["heavily_compressed_attention", "compressed_sparse_attention",
                            "sliding_attention", "compressed_sparse_attention",
                            "heavily_compressed_attention"],
            "mlp_layer_types": ["hash_moe", "hash_moe", "moe", "moe", "moe"],
            "rope_parameters": {
                "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
                "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "factor": 4.0,
                             "original_max_position_embeddings": 64, "beta_fast": 32.0,
                             "beta_slow": 1.0, "attention_factor": 1.0,
                             "partial_rotary_factor": 0.25}
            }
        })
    }

    #[test]
    fn deepseek_v4_reads_its_layer_kinds_tables_and_hash_layers() {
        let c = parse(&dsv4()).unwrap();
        assert_eq!(c.family, "deepseek_v4");
        let kinds: Vec<&str> = c.layer_plan.iter().map(|p| p.attention.kind()).collect();
        assert_eq!(kinds, ["hca", "csa", "swa", "csa", "hca"]);
        assert_eq!(
            c.layer_plan
                .iter()
                .map(|p| p.hash_routed)
                .collect::<Vec<_>>(),
            [true, true, false, false, false]
        );
        assert!((0..5).all(|l| c.is_moe(l)));
        // Compressed layers rotate by the compress table, sliding ones by the main one.
        assert_eq!(
            (c.rope.theta, c.rope.dim, c.rope.interleaved),
            (160000.0, 8, true)
        );
        let main = c.local_rope.as_ref().unwrap();
        assert_eq!(
            (main.theta, main.scaling.clone()),
            (10000.0, RopeScaling::None)
        );
        match (
            &c.layer_plan[0].attention,
            &c.layer_plan[1].attention,
            &c.layer_plan[2].attention,
        ) {
            (
                AttentionConfig::Compressed(h),
                AttentionConfig::Compressed(s),
                AttentionConfig::Compressed(w),
            ) => {
                let hc = h.compressor.as_ref().unwrap();
                assert_eq!(
                    (hc.rate, hc.overlap, hc.indexer.is_none()),
                    (8, false, true)
                );
                let sc = s.compressor.as_ref().unwrap();
                assert_eq!((sc.rate, sc.overlap), (4, true));
                assert_eq!(
                    sc.indexer.map(|i| (i.heads, i.head_dim, i.top_k)),
                    Some((8, 16, 3))
                );
                assert!(w.local_rope && w.compressor.is_none() && !s.local_rope);
                assert_eq!((w.window, w.o_groups, w.o_rank), (8, 2, 16));
            }
            _ => panic!("layer kinds"),
        }
        let Residual::Hyper(hc) = c.residual else {
            panic!("DeepSeek-V4 has hyper-connections");
        };
        assert_eq!(
            (hc.streams, hc.sinkhorn, hc.mean_head, hc.gain),
            (3, Some(20), false, 2.0)
        );
        assert_eq!(
            c.moe.router,
            RouterKind::SqrtSoftplus {
                routed_scaling_factor: 1.5
            }
        );
        // Defaults as transformers folds them: the first three layers hash-routed; legacy
        // per-layer compress ratios.
        let mut v = dsv4();
        v["mlp_layer_types"] = json!(null);
        v["layer_types"] = json!(null);
        v["compress_ratios"] = json!([128, 128, 4, 0, 4]);
        let c = parse(&v).unwrap();
        assert_eq!(
            c.layer_plan
                .iter()
                .map(|p| p.hash_routed)
                .collect::<Vec<_>>(),
            [true, true, true, false, false]
        );
        let kinds: Vec<&str> = c.layer_plan.iter().map(|p| p.attention.kind()).collect();
        assert_eq!(kinds, ["hca", "hca", "csa", "swa", "csa"]);
        for (field, bad) in [
            ("num_key_value_heads", json!(2)),
            ("o_groups", json!(3)),
            ("scoring_func", json!("softmax")),
            ("layer_types.2", json!("full_attention")),
            ("mlp_layer_types.4", json!("dense")),
            ("compress_rates.compressed_sparse_attention", json!(0)),
            ("rope_parameters.compress.rope_theta", json!(-1.0)),
            ("index_head_dim", json!(4)),
            (
                "compress_rates.heavily_compressed_attention",
                json!(1u64 << 40),
            ),
            ("hc_mult", json!(1000)),
            ("hc_mult", json!(0)),
        ] {
            let mut v = dsv4();
            let mut at = &mut v;
            let parts: Vec<&str> = field.split('.').collect();
            for p in &parts[..parts.len() - 1] {
                at = match p.parse::<usize>() {
                    Ok(i) => &mut at[i],
                    Err(_) => &mut at[*p],
                };
            }
            let last = parts[parts.len() - 1];
            match last.parse::<usize>() {
                Ok(i) => at[i] = bad.clone(),
                Err(_) => at[last] = bad.clone(),
            }
            assert_eq!(field_of(parse(&v).unwrap_err()), field, "{bad}");
        }
    }
}
