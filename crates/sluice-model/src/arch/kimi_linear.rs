//! Kimi Linear (`kimi_linear`) and Kimi K3 (`kimi_k3`) configurations.
//!
//! Two writers produce these files: Moonshot's releases (Kimi-Linear-48B, Kimi K3, whose
//! `modeling_kimi_linear.py` is the reference) and transformers' `kimi_linear`, which renames
//! some fields (`num_experts_per_token` ↔ `num_experts_per_tok`, `moe_renormalize` ↔
//! `norm_topk_prob`, `num_expert_group` ↔ `n_group`, `model_max_length` ↔
//! `max_position_embeddings`, …) and adds derived ones (`layer_types`, `mlp_layer_types`,
//! `linear_head_dim`, …). Both spellings are read; where both are present they must agree.
//!
//! The text config is read strictly: every field is either read and checked, or known not to
//! change the arithmetic (metadata, training settings, values derived from others); a field
//! outside both lists is refused by name, since sluice cannot know what it would change. A
//! Kimi K3 directory nests the text model's config under `text_config` (its own `model_type`
//! must be `kimi_linear`) beside the vision tower's, which the text model does not use; its
//! tensors are named under `language_model.`.

use serde_json::Value;

use super::{Family, Models};
use crate::ModelError;
use crate::config::{
    AttentionConfig, Cfg, ExpertActivation, ExpertNames, GluActivation, KdaConfig, KdaGate,
    LatentMoe, LayerPlan, MlaConfig, MlpKind, ModelConfig, MoeConfig, Residual, RopeConfig,
    RouterKind, SharedExpert, TensorNames, check_widths, shared_width,
};
use crate::quant::{self, Quantization};

pub(super) const FAMILY: Family = Family {
    name: "kimi_linear",
    models: &[Models {
        model_types: &["kimi_linear", "kimi_k3"],
        names: "Kimi Linear, Kimi K3",
        features: "Kimi Delta Attention (recurrent state) beside gated MLA, attention residuals, latent MXFP4 experts",
    }],
    read: |c, model_type| read(c, model_type == "kimi_k3"),
    gguf: &[],
};

/// What mixes tokens in a layer of the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LayerAttention {
    /// MLA without rotary embeddings.
    Full,
    /// Kimi Delta Attention.
    Kda,
}

/// Text-config fields that are read.
const READ: &[&str] = &[
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "qk_head_dim",
    "v_head_dim",
    "mla_use_nope",
    "mla_use_output_gate",
    "attention_bias",
    "hidden_act",
    "activation_situ_beta",
    "activation_situ_linear_beta",
    "rms_norm_eps",
    "first_k_dense_replace",
    "moe_layer_freq",
    "mlp_layer_types",
    "num_experts",
    "num_local_experts",
    "num_experts_per_token",
    "num_experts_per_tok",
    "num_shared_experts",
    "n_shared_experts",
    "routed_expert_hidden_size",
    "latent_moe_use_norm",
    "moe_renormalize",
    "norm_topk_prob",
    "moe_router_activation_func",
    "topk_method",
    "use_grouped_topk",
    "num_expert_group",
    "n_group",
    "topk_group",
    "routed_scaling_factor",
    "attn_res_block_size",
    "linear_attn_config",
    "layer_types",
    "linear_head_dim",
    "linear_num_heads",
    "linear_conv_kernel_dim",
    "max_position_embeddings",
    "model_max_length",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
    "quantization_config",
    "rope_scaling",
];

/// Text-config fields that do not change the arithmetic: metadata, training-only settings,
/// `rope_theta` (no layer is rotated), `head_dim` (transformers' name for the rope part), and
/// `num_nextn_predict_layers` (draft layers for speculative decoding, which generation here
/// does not run).
const NOT_ARITHMETIC: &[&str] = &[
    "model_type",
    "architectures",
    "auto_map",
    "dtype",
    "torch_dtype",
    "transformers_version",
    "_name_or_path",
    "initializer_range",
    "use_cache",
    "pad_token_id",
    "output_router_logits",
    "router_aux_loss_coef",
    "attention_dropout",
    "pretraining_tp",
    "num_nextn_predict_layers",
    "rope_theta",
    "head_dim",
    "ignore_index",
];

/// `linear_attn_config` keys.
const LINEAR_KEYS: &[&str] = &[
    "full_attn_layers",
    "kda_layers",
    "head_dim",
    "num_heads",
    "short_conv_kernel_size",
    "gate_lower_bound",
    "use_full_rank_gate",
];

/// Reads a Kimi config: `c` is the whole `config.json`; `k3` says its `model_type` is
/// `kimi_k3`.
fn read(c: &Cfg<'_>, k3: bool) -> Result<ModelConfig, ModelError> {
    let (t, prefix) = if k3 {
        let Some(tv) = c.get("text_config") else {
            return Err(c.err("text_config", "required field is missing"));
        };
        if !tv.is_object() {
            return Err(c.err("text_config", "expected an object"));
        }
        let t = Cfg {
            v: tv,
            file: c.file,
            prefix: "text_config.".into(),
        };
        t.expect_str("model_type", "", &["kimi_linear"])?;
        (t, "language_model.")
    } else {
        (
            Cfg {
                v: c.v,
                file: c.file,
                prefix: String::new(),
            },
            "",
        )
    };
    if let Some(o) = t.v.as_object() {
        for key in o.keys() {
            if !READ.contains(&key.as_str()) && !NOT_ARITHMETIC.contains(&key.as_str()) {
                return Err(t.err(
                    key,
                    "not a field sluice knows for kimi_linear; it may change the arithmetic, so \
                     the model is refused rather than guessed at",
                ));
            }
        }
    }

    // quantization_config: in the text config or at the top level of a K3 wrapper, not both.
    let quant = match (
        t.get("quantization_config"),
        k3.then(|| c.get("quantization_config")),
    ) {
        (Some(_), Some(Some(_))) => {
            return Err(c.err(
                "quantization_config",
                "given both at the top level and in text_config",
            ));
        }
        (Some(q), _) => quant::read(q, t.file, false)?,
        (None, Some(Some(q))) => quant::read(q, c.file, false)?,
        _ => Quantization::None,
    };

    let vocab = t.pos_usize("vocab_size")?;
    let hidden = t.pos_usize("hidden_size")?;
    let layers = t.pos_usize("num_hidden_layers")?;
    let eps = t.pos_f32("rms_norm_eps")?;
    let max_positions = alias_usize(&t, &["max_position_embeddings", "model_max_length"])?
        .ok_or_else(|| t.err("max_position_embeddings", "required field is missing"))?;
    let tie_embeddings = {
        let inner = t.get("tie_word_embeddings").is_some();
        let outer = k3 && c.get("tie_word_embeddings").is_some();
        let a = t.bool_or("tie_word_embeddings", false)?;
        let b = if k3 {
            c.bool_or("tie_word_embeddings", false)?
        } else {
            a
        };
        if inner && outer && a != b {
            return Err(t.err(
                "tie_word_embeddings",
                "differs from the top-level tie_word_embeddings",
            ));
        }
        if inner { a } else { b }
    };
    if t.get("rope_scaling").is_some() {
        return Err(t.err(
            "rope_scaling",
            "Kimi Linear attention has no rotary embedding to scale",
        ));
    }

    // Activation.
    let act = t.str("hidden_act")?;
    let mlp_act = match act {
        "silu" => GluActivation::Silu,
        "situ" => {
            // Moonshot's code: `beta or 1.0`; linear_beta optional.
            let beta = match t.opt_f32("activation_situ_beta")? {
                Some(b) if b != 0.0 => b,
                _ => 1.0,
            };
            let linear_beta = t.opt_f32("activation_situ_linear_beta")?;
            if linear_beta == Some(0.0) {
                return Err(t.err("activation_situ_linear_beta", "must not be 0"));
            }
            GluActivation::Situ { beta, linear_beta }
        }
        other => {
            return Err(t.err(
                "hidden_act",
                format!("`{other}` is not supported (supported: silu, situ)"),
            ));
        }
    };

    // Multi-head latent attention (the `full_attn_layers`).
    let heads = t.pos_usize("num_attention_heads")?;
    if let Some(kvh) = t.opt_usize("num_key_value_heads")?
        && kvh != heads
    {
        return Err(t.err(
            "num_key_value_heads",
            format!("{kvh} differs from num_attention_heads {heads}; MLA has one latent"),
        ));
    }
    let q_lora_rank = t.opt_usize("q_lora_rank")?;
    if q_lora_rank == Some(0) {
        return Err(t.err("q_lora_rank", "must be positive or null"));
    }
    let kv_lora_rank = t.pos_usize("kv_lora_rank")?;
    let nope = t.pos_usize("qk_nope_head_dim")?;
    let rope_dim = t.pos_usize("qk_rope_head_dim")?;
    let v_head_dim = t.pos_usize("v_head_dim")?;
    if let Some(q) = t.opt_usize("qk_head_dim")?
        && q != nope + rope_dim
    {
        return Err(t.err(
            "qk_head_dim",
            format!(
                "{q} is not qk_nope_head_dim + qk_rope_head_dim = {}",
                nope + rope_dim
            ),
        ));
    }
    if !t.bool_or("mla_use_nope", true)? {
        return Err(t.err(
            "mla_use_nope",
            "false is not supported: Kimi's MLA has no rotary embedding (Moonshot's code asserts \
             it)",
        ));
    }
    if t.bool_or("attention_bias", false)? {
        return Err(t.err("attention_bias", "true is not supported"));
    }
    // Moonshot: q_head_dim ** -0.5 with q_head_dim = nope + rope (1/√192 for K3).
    let softmax_scale = ((nope + rope_dim) as f64).powf(-0.5) as f32;
    let mla = AttentionConfig::Mla(MlaConfig {
        heads,
        q_lora_rank,
        kv_lora_rank,
        qk_nope_head_dim: nope,
        qk_rope_head_dim: rope_dim,
        v_head_dim,
        bias: false,
        rope: false,
        output_gate: t.bool_or("mla_use_output_gate", false)?.then_some("g_proj"),
        sinks: false,
        softmax_scale,
        lora_scales: None,
        norm_eps: crate::attention::mla::MLA_NORM_EPS,
        log_scaling: false,
        kv_source: None,
    });
    let rope = RopeConfig::none();

    // Kimi Delta Attention and the layer plan.
    let (kda, layer_attention) = read_linear(&t, layers)?;

    // Feed-forward blocks.
    let experts = alias_usize(&t, &["num_experts", "num_local_experts"])?
        .ok_or_else(|| t.err("num_experts", "required field is missing"))?;
    if experts == 0 {
        return Err(t.err("num_experts", "must be positive"));
    }
    let top_k = alias_usize(&t, &["num_experts_per_token", "num_experts_per_tok"])?
        .ok_or_else(|| t.err("num_experts_per_token", "required field is missing"))?;
    if top_k == 0 || top_k > experts {
        return Err(t.err(
            "num_experts_per_token",
            format!("{top_k} experts per token of {experts}"),
        ));
    }
    let intermediate = t.pos_usize("moe_intermediate_size")?;
    t.expect_str("moe_router_activation_func", "sigmoid", &["sigmoid"])?;
    t.expect_str("topk_method", "noaux_tc", &["noaux_tc"])?;
    t.bool_or("use_grouped_topk", true)?; // Moonshot's code groups by num_expert_group alone
    let n_group = alias_usize(&t, &["num_expert_group", "n_group"])?.unwrap_or(1);
    let topk_group = t.opt_usize("topk_group")?.unwrap_or(1);
    if n_group == 0 || !experts.is_multiple_of(n_group) {
        return Err(t.err(
            "num_expert_group",
            format!("{n_group} groups do not divide the {experts} experts"),
        ));
    }
    if topk_group == 0 || topk_group > n_group {
        return Err(t.err(
            "topk_group",
            format!("{topk_group} groups kept of {n_group}"),
        ));
    }
    if n_group > 1 && experts / n_group < 2 {
        return Err(t.err(
            "num_expert_group",
            "groups need at least 2 experts (group score = sum of the top 2)",
        ));
    }
    if top_k > topk_group * (experts / n_group) {
        return Err(t.err(
            "num_experts_per_token",
            "more than the experts in the kept groups",
        ));
    }
    let renormalize = alias_bool(&t, &["moe_renormalize", "norm_topk_prob"], true)?;
    if renormalize && top_k == 1 {
        return Err(t.err(
            "moe_renormalize",
            "with one expert per token Moonshot's code leaves the weight as it is while \
             transformers renormalises it to 1; refusing the ambiguity",
        ));
    }
    let routed_scaling_factor = t.pos_f32("routed_scaling_factor")?;
    let n_shared = alias_usize(&t, &["num_shared_experts", "n_shared_experts"])?.unwrap_or(0);
    let shared = (n_shared > 0)
        .then(|| shared_width(&t, "num_shared_experts", n_shared, intermediate))
        .transpose()?
        .map(|intermediate| SharedExpert {
            intermediate,
            gated: false,
        });
    let latent = match t.opt_usize("routed_expert_hidden_size")? {
        Some(0) => return Err(t.err("routed_expert_hidden_size", "must be positive")),
        Some(dim) => Some(LatentMoe {
            dim,
            norm: t.bool_or("latent_moe_use_norm", false)?,
        }),
        None => {
            if t.bool_or("latent_moe_use_norm", false)? {
                return Err(t.err(
                    "latent_moe_use_norm",
                    "true without routed_expert_hidden_size",
                ));
            }
            None
        }
    };
    let activation = match mlp_act {
        // (Kimi's activation is read above as one of these two.)
        GluActivation::Silu
        | GluActivation::SiluClamped { .. }
        | GluActivation::SiluInputsClamped { .. } => ExpertActivation::SwiGlu,
        GluActivation::Situ { beta, linear_beta } => ExpertActivation::Situ { beta, linear_beta },
    };
    let first_dense = t.opt_usize("first_k_dense_replace")?.unwrap_or(1); // transformers default
    if let Some(f) = t.opt_usize("moe_layer_freq")?
        && f != 1
    {
        return Err(t.err("moe_layer_freq", format!("{f} is not supported (only 1)")));
    }
    let dense = t.pos_usize("intermediate_size")?;
    let mlp: Vec<MlpKind> = (0..layers)
        .map(|l| MlpKind::moe_or_dense(l >= first_dense, dense))
        .collect();
    if let Some(v) = t.get("mlp_layer_types") {
        let kinds = strings(&t, "mlp_layer_types", v, layers)?;
        for (l, k) in kinds.iter().enumerate() {
            let want = if matches!(mlp[l], MlpKind::Moe) {
                "sparse"
            } else {
                "dense"
            };
            if k != want {
                return Err(t.err(
                    "mlp_layer_types",
                    format!(
                        "layer {l} is `{k}`, but first_k_dense_replace {first_dense} makes it \
                         `{want}`"
                    ),
                ));
            }
        }
    }

    let residual = match t.opt_usize("attn_res_block_size")? {
        Some(0) => return Err(t.err("attn_res_block_size", "must be positive")),
        Some(block_size) => Residual::AttnRes { block_size },
        None => Residual::Add,
    };

    let ids = |f: &str| -> Result<Vec<u32>, ModelError> {
        let inner = t.token_ids(f)?;
        if inner.is_empty() && k3 {
            c.token_ids(f)
        } else {
            Ok(inner)
        }
    };
    let bos_token_id = ids("bos_token_id")?.first().copied();
    let eos_token_ids = ids("eos_token_id")?;

    let layer_plan = layer_attention
        .iter()
        .zip(mlp)
        .map(|(a, mlp)| {
            LayerPlan::new(
                match a {
                    LayerAttention::Full => mla.clone(),
                    LayerAttention::Kda => AttentionConfig::Kda(kda),
                },
                mlp,
            )
        })
        .collect();
    let cfg = ModelConfig {
        family: FAMILY.name,
        model_type: if k3 { "kimi_k3" } else { "kimi_linear" }.to_owned(),
        vocab,
        hidden,
        layers,
        eps,
        tie_embeddings,
        max_positions,
        rope,
        local_rope: None,
        layer_plan,
        moe: MoeConfig {
            shared,
            activation,
            latent,
            ..MoeConfig::routed(
                experts,
                top_k,
                intermediate,
                RouterKind::SigmoidGroup {
                    n_group,
                    topk_group,
                    norm_topk_prob: renormalize,
                    routed_scaling_factor,
                },
            )
        },
        bos_token_id,
        eos_token_ids,
        quant,
        names: TensorNames {
            prefix: prefix.to_owned(),
            model: "model.",
            attention: "self_attn",
            linear_attention: None,
            // transformers saves Kimi Linear's MLPs as `block_sparse_moe.*` (it renames
            // `block_sparse_moe` to `mlp` on load and back on save, dense layers included),
            // Moonshot's checkpoints dense layers as `mlp.*`: either is read.
            moe: "block_sparse_moe",
            dense: &["mlp", "block_sparse_moe"],
            router: "gate",
            router_bias: Some("gate.e_score_correction_bias"),
            shared: "shared_experts",
            shared_in_layer: false,
            sublayers: 1,
            experts: ExpertNames::Separate {
                gate: "w1",
                up: "w3",
                down: "w2",
            },
            rename: None,
        },
        residual,
        mlp_act,
        draft_layers: t.opt_usize("num_nextn_predict_layers")?.unwrap_or(0),
        zero_centred_norms: false,
        mtp: None,
        logit_softcap: None,
        layers_field: format!("{}num_hidden_layers", t.prefix),
    };
    check_widths(&t, &cfg)?;
    Ok(cfg)
}

/// `linear_attn_config` (and transformers' `layer_types` / `linear_*`): KDA's shape and which
/// layers use it.
fn read_linear(t: &Cfg<'_>, layers: usize) -> Result<(KdaConfig, Vec<LayerAttention>), ModelError> {
    let Some(lv) = t.get("linear_attn_config") else {
        return Err(t.err("linear_attn_config", "required field is missing"));
    };
    if !lv.is_object() {
        return Err(t.err("linear_attn_config", "expected an object"));
    }
    let lc = Cfg {
        v: lv,
        file: t.file,
        prefix: format!("{}linear_attn_config.", t.prefix),
    };
    if let Some(o) = lv.as_object() {
        for key in o.keys() {
            if !LINEAR_KEYS.contains(&key.as_str()) {
                return Err(lc.err(
                    key,
                    "not a field sluice knows; refusing rather than guessing",
                ));
            }
        }
    }
    let heads = lc.pos_usize("num_heads")?;
    let head_dim = lc.pos_usize("head_dim")?;
    let conv_kernel = lc.pos_usize("short_conv_kernel_size")?;
    for (field, want) in [
        ("linear_num_heads", heads),
        ("linear_head_dim", head_dim),
        ("linear_conv_kernel_dim", conv_kernel),
    ] {
        if let Some(v) = t.opt_usize(field)?
            && v != want
        {
            return Err(t.err(
                field,
                format!("{v} differs from linear_attn_config's {want}"),
            ));
        }
    }
    let gate = match lc.opt_f32("gate_lower_bound")? {
        None => KdaGate::Softplus,
        Some(b) if b < 0.0 => KdaGate::LowerBound(b),
        Some(b) => {
            return Err(lc.err(
                "gate_lower_bound",
                format!("{b}: a lower bound on a log-decay must be negative"),
            ));
        }
    };
    let kda = KdaConfig {
        heads,
        head_dim,
        conv_kernel,
        gate,
        full_rank_output_gate: lc.bool_or("use_full_rank_gate", false)?,
    };

    // The plan: 1-based lists in linear_attn_config, or transformers' layer_types.
    let from_lists = match (lc.get("full_attn_layers"), lc.get("kda_layers")) {
        (None, None) => None,
        (Some(f), Some(k)) => {
            let mut plan: Vec<Option<LayerAttention>> = vec![None; layers];
            for (field, v, kind) in [
                ("full_attn_layers", f, LayerAttention::Full),
                ("kda_layers", k, LayerAttention::Kda),
            ] {
                let Value::Array(a) = v else {
                    return Err(lc.err(field, "expected a list of 1-based layer numbers"));
                };
                for x in a {
                    let n = x
                        .as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .filter(|&n| (1..=layers).contains(&n))
                        .ok_or_else(|| {
                            lc.err(
                                field,
                                format!("{x} is not a layer number in 1..={layers} (1-based)"),
                            )
                        })?;
                    if plan[n - 1].replace(kind).is_some() {
                        return Err(lc.err(field, format!("layer {n} is listed twice")));
                    }
                }
            }
            if let Some(l) = plan.iter().position(Option::is_none) {
                return Err(lc.err(
                    "kda_layers",
                    format!(
                        "layer {} (1-based) is in neither full_attn_layers nor kda_layers",
                        l + 1
                    ),
                ));
            }
            Some(plan.into_iter().flatten().collect::<Vec<_>>())
        }
        (Some(_), None) => return Err(lc.err("kda_layers", "required with full_attn_layers")),
        (None, Some(_)) => return Err(lc.err("full_attn_layers", "required with kda_layers")),
    };
    let from_types = match t.get("layer_types") {
        None => None,
        Some(v) => Some(
            strings(t, "layer_types", v, layers)?
                .iter()
                .map(|s| match s.as_str() {
                    "full_attention" => Ok(LayerAttention::Full),
                    "linear_attention" => Ok(LayerAttention::Kda),
                    other => Err(t.err(
                        "layer_types",
                        format!(
                            "`{other}` is not supported (supported: full_attention, \
                             linear_attention)"
                        ),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    let plan = match (from_lists, from_types) {
        (Some(a), Some(b)) if a != b => {
            return Err(t.err(
                "layer_types",
                "disagrees with linear_attn_config's full_attn_layers / kda_layers",
            ));
        }
        (Some(a), _) => a,
        (None, Some(b)) => b,
        (None, None) => {
            return Err(lc.err(
                "full_attn_layers",
                "required field is missing (no layer_types either)",
            ));
        }
    };
    Ok((kda, plan))
}

/// A list of `layers` strings.
fn strings(t: &Cfg<'_>, field: &str, v: &Value, layers: usize) -> Result<Vec<String>, ModelError> {
    let Value::Array(a) = v else {
        return Err(t.err(field, "expected a list"));
    };
    if a.len() != layers {
        return Err(t.err(field, format!("{} entries for {layers} layers", a.len())));
    }
    a.iter()
        .map(|x| {
            x.as_str()
                .map(str::to_owned)
                .ok_or_else(|| t.err(field, format!("expected strings, got {x}")))
        })
        .collect()
}

/// A count under any of `names` (all present ones must agree).
fn alias_usize(t: &Cfg<'_>, names: &[&str]) -> Result<Option<usize>, ModelError> {
    let mut found: Option<(usize, &str)> = None;
    for &n in names {
        if let Some(v) = t.opt_usize(n)? {
            if let Some((w, m)) = found
                && w != v
            {
                return Err(t.err(n, format!("{v} differs from {m} = {w}")));
            }
            found.get_or_insert((v, n));
        }
    }
    Ok(found.map(|f| f.0))
}

/// A flag under any of `names` (all present ones must agree), `default` when none is.
fn alias_bool(t: &Cfg<'_>, names: &[&str], default: bool) -> Result<bool, ModelError> {
    let mut found: Option<(bool, &str)> = None;
    for &n in names {
        if t.get(n).is_some() {
            let v = t.bool_or(n, default)?;
            if let Some((w, m)) = found
                && w != v
            {
                return Err(t.err(n, format!("{v} differs from {m} = {w}")));
            }
            found.get_or_insert((v, n));
        }
    }
    Ok(found.map_or(default, |f| f.0))
}

#[cfg(test)]
#[path = "kimi_linear_tests.rs"]
mod tests;
