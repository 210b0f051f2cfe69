//! Step-3.7-Flash (`step3p7`, the multimodal checkpoint as released; its text model, read from
//! `text_config` (`step3p5`), is what runs, and the vision tower is not read).
//!
//! - **Attention.** Grouped-query attention with per-head q/k norms, and a per-head sigmoid
//!   gate from `g_proj` on each head's output. Sliding and full layers follow `layer_types`.
//!   The sliding layers may have their own head count (`per_layer_config`,
//!   `num_sliding_attention_heads` or the legacy `attention_other_setting`), their own rotary
//!   table and their own `partial_rotary_factor` (`rope_parameters` per layer type, or the
//!   legacy per-layer `rope_theta` / `partial_rotary_factors` lists). Scores are scaled by
//!   `query_pre_attn_scalar^-½`.
//! - **Norms.** Gemma's: every RMSNorm, the q/k norms included, scales by `1 + w`.
//! - **Feed-forward.** Dense layers and MoE layers follow `mlp_layer_types` (or the legacy
//!   `moe_layers_enum`; by default the first three are dense). MoE layers use sigmoid routing
//!   with a selection-only bias: the top-k are renormalised, then scaled by
//!   `moe_router_scaling_factor`. The shared expert is `share_expert`, beside the MoE.
//! - **Bounds.** Per-layer SwiGLU bounds, `min(silu(g), L) · clamp(u, ±L)`:
//!   `swiglu_limits` for the routed experts, `swiglu_limits_shared` for the shared expert and
//!   the dense MLP. A 0 or null entry means none.
//! - **Released layout.** Tensors are `model.layers.*`. The experts are stacked per
//!   projection (`moe.{gate,up,down}_proj.weight`), and the router is `moe.gate.weight` with
//!   `moe.router_bias`. The MTP layers after the last (`num_nextn_predict_layers`) are not
//!   read; per-layer lists padded with their entries are cut to `num_hidden_layers`, as
//!   transformers does.

use serde_json::Value;

use super::common::{Base, check_groups, gqa_heads, kinds_of, top_k, typed_rope};
use super::{Family, Models};
use crate::ModelError;
use crate::config::{
    AttentionConfig, Cfg, ExpertNames, GluLimits, GqaConfig, LayerPlan, MlpKind, ModelConfig,
    MoeConfig, QkNorm, RopeConfig, RouterKind, SharedExpert, TensorNames, read_rope,
};
use crate::quant::{self, Quantization};

pub(super) const FAMILY: Family = Family {
    name: "step3p7",
    models: &[Models {
        model_types: &["step3p7"],
        names: "Step-3.7-Flash (text model of the multimodal checkpoint; vision tower not read)",
        features: "sliding layers with their own head count and rotary table, a per-head sigmoid gate (`g_proj`), Gemma norms, per-layer SwiGLU bounds, experts stacked per projection, sigmoid routing with a bias",
    }],
    read,
    gguf: &[],
};

fn read(top: &Cfg<'_>, model_type: &str) -> Result<ModelConfig, ModelError> {
    let Some(tv) = top.get("text_config") else {
        return Err(top.err("text_config", "required field is missing"));
    };
    if !tv.is_object() {
        return Err(top.err("text_config", "expected an object"));
    }
    let c = &Cfg {
        v: tv,
        file: top.file,
        prefix: "text_config.".into(),
    };
    // transformers drops a hub config's `model_type` here and writes `step3p5`.
    if c.get("model_type").is_some() {
        c.expect_str("model_type", "step3p5", &["step3p5"])?;
    }
    let quant = match (top.get("quantization_config"), c.get("quantization_config")) {
        (Some(_), Some(_)) => {
            return Err(top.err(
                "quantization_config",
                "given both at the top and in text_config",
            ));
        }
        (Some(q), None) => quant::read(q, top.file, false)?,
        (None, Some(q)) => quant::read(q, c.file, false)?,
        (None, None) => Quantization::None,
    };
    // Released configs say `swigluoai`; transformers computes SwiGLU with the bounds below.
    if c.get("hidden_act").is_some() {
        c.expect_str("hidden_act", "silu", &["silu", "swigluoai"])?;
    }
    let layers = c.pos_usize("num_hidden_layers")?;
    let mtp = c.opt_usize("num_nextn_predict_layers")?.unwrap_or(0);
    let base = Base {
        quant,
        vocab: c.pos_usize("vocab_size")?,
        hidden: c.pos_usize("hidden_size")?,
        layers,
        eps: c.pos_f32("rms_norm_eps")?,
        // transformers' defaults: 64 heads, 128000 positions.
        heads: c.opt_usize("num_attention_heads")?.unwrap_or(64),
        max_positions: c.opt_usize("max_position_embeddings")?.unwrap_or(128_000),
        tie_embeddings: c.bool_or("tie_word_embeddings", false)?,
    };
    if base.heads == 0 {
        return Err(c.err("num_attention_heads", "must be positive"));
    }
    for flag in ["attention_bias", "mlp_bias", "use_bidirectional_attention"] {
        if c.bool_or(flag, false)? {
            return Err(c.err(flag, "true is not supported"));
        }
    }
    match c.get("gating") {
        None | Some(Value::Bool(true)) => {}
        Some(Value::String(s)) if s == "per-head" => {}
        Some(v) => {
            return Err(c.err(
                "gating",
                format!("`{v}` is not supported (supported: true, \"per-head\")"),
            ));
        }
    }

    let sliding = kinds(
        c,
        "layer_types",
        layers,
        mtp,
        ["sliding_attention", "full_attention"],
    )?
    .unwrap_or_else(|| vec![false; layers]);
    let sparse = match kinds(c, "mlp_layer_types", layers, mtp, ["sparse", "dense"])? {
        Some(s) => s,
        None => moe_layers_enum(c, layers)?,
    };
    let heads = layer_heads(c, &base, &sliding)?;

    // Attention: grouped-query heads, per-head Gemma q/k norms, the per-head gate.
    let (kv_heads, head_dim) = gqa_heads(c, base.heads, base.hidden, false)?;
    let scalar = match c.get("query_pre_attn_scalar") {
        None | Some(Value::Null) => head_dim as f64,
        Some(_) => c.f64("query_pre_attn_scalar")?,
    };
    if scalar.is_nan() || scalar <= 0.0 {
        return Err(c.err("query_pre_attn_scalar", "must be positive"));
    }
    let window = if sliding.iter().any(|&s| s) {
        Some(c.pos_usize("sliding_window")?)
    } else {
        None
    };
    let gqa = |heads: usize, sliding: bool| -> Result<GqaConfig, ModelError> {
        if !heads.is_multiple_of(kv_heads) {
            return Err(c.err(
                "num_key_value_heads",
                format!("{kv_heads} does not divide a layer's {heads} heads"),
            ));
        }
        Ok(GqaConfig {
            heads,
            kv_heads,
            head_dim,
            qkv_bias: false,
            o_bias: false,
            qk_norm: QkNorm::PerHead,
            clip_qkv: None,
            window: if sliding { window } else { None },
            sinks: false,
            output_gate: false,
            head_gate: true,
            zero_centred_qk_norm: true,
            v_head_dim: head_dim,
            v_scale: None,
            local_rope: sliding,
            nope: false,
            rms_qk_after_rope: false,
            temperature: None,
            chunk: None,
            softmax_scale: scalar.powf(-0.5) as f32,
        })
    };
    let full_rope = rope_of(c, &base, head_dim, "full_attention", &sliding, mtp)?;
    let sliding_rope = if sliding.iter().any(|&s| s) {
        Some(rope_of(
            c,
            &base,
            head_dim,
            "sliding_attention",
            &sliding,
            mtp,
        )?)
    } else {
        None
    };

    // Feed-forward: sigmoid routing with a selection bias, the shared expert beside it.
    let any_moe = sparse.iter().any(|&s| s);
    let moe = if any_moe {
        let experts = c.pos_usize("n_routed_experts")?;
        let top_k = top_k(c, experts)?;
        check_groups(c, experts, top_k, 1, 1)?;
        let scaling = match c.get("moe_router_scaling_factor") {
            None | Some(Value::Null) => 1.0,
            Some(_) => c.pos_f32("moe_router_scaling_factor")?,
        };
        MoeConfig {
            shared: Some(SharedExpert {
                intermediate: c.pos_usize("share_expert_dim")?,
                gated: false,
            }),
            ..MoeConfig::routed(
                experts,
                top_k,
                c.pos_usize("moe_intermediate_size")?,
                RouterKind::SigmoidGroup {
                    n_group: 1,
                    topk_group: 1,
                    norm_topk_prob: true,
                    routed_scaling_factor: scaling,
                },
            )
        }
    } else {
        MoeConfig::none()
    };
    let dense = if sparse.iter().all(|&s| s) {
        0
    } else {
        c.pos_usize("intermediate_size")?
    };
    let layer_plan = (0..layers)
        .map(|l| {
            Ok(LayerPlan::new(
                AttentionConfig::Gqa(gqa(heads[l], sliding[l])?),
                MlpKind::moe_or_dense(sparse[l], dense),
            ))
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    let experts_limits = limits(c, "swiglu_limits", layers, mtp)?;
    let mlp_limits = limits(c, "swiglu_limits_shared", layers, mtp)?;
    let names = TensorNames {
        moe: "moe",
        router: "gate",
        router_bias: Some("router_bias"),
        shared: "share_expert",
        shared_in_layer: true,
        experts: ExpertNames::Stacked {
            gate: "gate_proj.weight",
            up: "up_proj.weight",
            down: "down_proj.weight",
        },
        ..TensorNames::standard()
    };
    let mut cfg = base.finish(
        c,
        FAMILY.name,
        model_type,
        full_rope,
        layer_plan,
        moe,
        names,
    )?;
    cfg.local_rope = sliding_rope;
    cfg.zero_centred_norms = true;
    for (l, p) in cfg.layer_plan.iter_mut().enumerate() {
        p.glu = GluLimits {
            mlp: mlp_limits[l],
            experts: experts_limits[l],
        };
    }
    Ok(cfg)
}

/// A per-layer list of `n` entries, or of `n + mtp` (the hub's, padded with the MTP layers'
/// entries: cut to `n`, as transformers does). `None` when absent or null.
fn per_layer<'a>(
    c: &Cfg<'a>,
    field: &str,
    n: usize,
    mtp: usize,
) -> Result<Option<&'a [Value]>, ModelError> {
    match c.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) if a.len() == n || (mtp > 0 && a.len() == n + mtp) => {
            Ok(Some(&a[..n]))
        }
        Some(Value::Array(a)) => Err(c.err(field, format!("{} entries for {n} layers", a.len()))),
        Some(v) => Err(c.err(field, format!("expected a list, got {v}"))),
    }
}

/// A per-layer list of names, each one of `kinds`, as flags (true: `kinds[0]`).
fn kinds(
    c: &Cfg<'_>,
    field: &str,
    n: usize,
    mtp: usize,
    kinds: [&str; 2],
) -> Result<Option<Vec<bool>>, ModelError> {
    let Some(list) = per_layer(c, field, n, mtp)? else {
        return Ok(None);
    };
    kinds_of(c, field, list, kinds).map(Some)
}

/// The MoE layers by the legacy `moe_layers_enum` (indices, as a list or a comma-separated
/// string); absent, every layer from the fourth on (transformers' default).
fn moe_layers_enum(c: &Cfg<'_>, n: usize) -> Result<Vec<bool>, ModelError> {
    let field = "moe_layers_enum";
    let bad = || c.err(field, "expected layer indices");
    let ids: Vec<usize> = match c.get(field) {
        None | Some(Value::Null) => return Ok((0..n).map(|l| l >= 3).collect()),
        Some(Value::String(s)) => s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().map_err(|_| bad()))
            .collect::<Result<_, _>>()?,
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| match x {
                Value::Number(v) => v.as_u64().map(|v| v as usize).ok_or_else(bad),
                Value::String(s) => s.trim().parse().map_err(|_| bad()),
                _ => Err(bad()),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad()),
    };
    // Indices past the last layer are the MTP layers'.
    Ok((0..n).map(|l| ids.contains(&l)).collect())
}

/// Each layer's query heads: `per_layer_config` (as transformers saves it), else
/// `num_sliding_attention_heads` or the legacy `attention_other_setting.num_attention_heads`
/// for the sliding layers.
fn layer_heads(c: &Cfg<'_>, base: &Base, sliding: &[bool]) -> Result<Vec<usize>, ModelError> {
    let n = sliding.len();
    let mut heads = vec![base.heads; n];
    if let Some(p) = c.get("per_layer_config").filter(|v| !v.is_null()) {
        let Some(map) = p.as_object() else {
            return Err(c.err("per_layer_config", "expected an object"));
        };
        for (k, v) in map {
            let field = format!("per_layer_config.{k}");
            let l: usize = k
                .parse()
                .ok()
                .filter(|&l| l < n)
                .ok_or_else(|| c.err(&field, format!("not a layer index below {n}")))?;
            let Some(o) = v.as_object() else {
                return Err(c.err(&field, "expected an object"));
            };
            for key in o.keys() {
                if key != "num_attention_heads" {
                    return Err(c.err(
                        &format!("{field}.{key}"),
                        "is not supported (only num_attention_heads)",
                    ));
                }
            }
            let lc = Cfg {
                v,
                file: c.file,
                prefix: format!("{}{field}.", c.prefix),
            };
            heads[l] = lc.pos_usize("num_attention_heads")?;
        }
        return Ok(heads);
    }
    let sliding_heads = match c.opt_usize("num_sliding_attention_heads")? {
        Some(h) => Some(h),
        None => match c.get("attention_other_setting") {
            Some(o) if o.is_object() => Cfg {
                v: o,
                file: c.file,
                prefix: format!("{}attention_other_setting.", c.prefix),
            }
            .opt_usize("num_attention_heads")?,
            _ => None,
        },
    };
    if let Some(h) = sliding_heads {
        if h == 0 {
            return Err(c.err("num_sliding_attention_heads", "must be positive"));
        }
        for (x, &s) in heads.iter_mut().zip(sliding) {
            if s {
                *x = h;
            }
        }
    }
    Ok(heads)
}

/// The rotary table of `layer_type`: `rope_parameters.{layer_type}` (default rotation only,
/// its `rope_theta` and `partial_rotary_factor`), or the legacy per-layer `rope_theta` (a list,
/// or one value for all) and `partial_rotary_factors`, taken at the type's first layer.
fn rope_of(
    c: &Cfg<'_>,
    base: &Base,
    head_dim: usize,
    layer_type: &str,
    sliding: &[bool],
    mtp: usize,
) -> Result<RopeConfig, ModelError> {
    let rp = c.get("rope_parameters").filter(|v| !v.is_null());
    if let Some(all) = rp {
        return typed_rope(c, all, layer_type, head_dim, base.max_positions, 1.0);
    }
    let want_sliding = layer_type == "sliding_attention";
    let first = sliding.iter().position(|&s| s == want_sliding).unwrap_or(0);
    let n = sliding.len();
    let theta = match c.get("rope_theta") {
        // transformers' default_theta
        None | Some(Value::Null) => 10_000.0,
        Some(Value::Array(_)) => per_layer(c, "rope_theta", n, mtp)?
            .and_then(|list| list[first].as_f64())
            .ok_or_else(|| c.err("rope_theta", "expected numbers"))?,
        Some(_) => c.f64("rope_theta")?,
    };
    let partial = match per_layer(c, "partial_rotary_factors", n, mtp)? {
        Some(list) => list[first]
            .as_f64()
            .ok_or_else(|| c.err("partial_rotary_factors", "expected numbers"))?,
        None => 1.0,
    };
    let v = serde_json::json!({
        "rope_type": "default",
        "rope_theta": theta,
        "partial_rotary_factor": partial,
    });
    let pc = Cfg {
        v: &v,
        file: c.file,
        prefix: format!("{}rope_theta[{first}].", c.prefix),
    };
    Ok(read_rope(&pc, head_dim, false, base.max_positions, Some(1.0))?.0)
}

/// A per-layer list of SwiGLU bounds (absent, or a 0 / null entry: none).
fn limits(c: &Cfg<'_>, field: &str, n: usize, mtp: usize) -> Result<Vec<Option<f32>>, ModelError> {
    let Some(list) = per_layer(c, field, n, mtp)? else {
        return Ok(vec![None; n]);
    };
    list.iter()
        .map(|x| match x {
            Value::Null => Ok(None),
            Value::Number(v) => match v.as_f64() {
                Some(0.0) => Ok(None),
                Some(l) if l > 0.0 && l.is_finite() => Ok(Some(l as f32)),
                _ => Err(c.err(field, format!("{v} is not a positive bound"))),
            },
            v => Err(c.err(field, format!("expected numbers or null, got {v}"))),
        })
        .collect()
}

/// The config reader's tests.
#[cfg(test)]
mod tests {
    use crate::config::test_util::*;

    /// Step-3.7's text config as transformers writes it, inside the multimodal one.
    fn step3p7() -> Value {
        json!({
            "model_type": "step3p7",
            "text_config": {
                "model_type": "step3p5", "vocab_size": 512, "hidden_size": 64,
                "num_hidden_layers": 4, "rms_norm_eps": 1e-6, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256,
                "hidden_act": "silu", "intermediate_size": 96,
                "layer_types": ["full_attention", "sliding_attention", "full_attention",
                                "sliding_attention"],
                "sliding_window": 8, "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
                "per_layer_config": {"1": {"num_attention_heads": 2}, "3": {"num_attention_heads": 2}},
                "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                "share_expert_dim": 48, "moe_router_scaling_factor": 2.5,
                "swiglu_limits": [0, 0.5, null, 0.8], "swiglu_limits_shared": [0.6, 0, 0.7, null],
                "query_pre_attn_scalar": 20,
                "rope_parameters": {
                    "full_attention": {"rope_type": "default", "rope_theta": 1e4,
                                       "partial_rotary_factor": 0.5},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 500.0,
                                          "partial_rotary_factor": 1.0}
                }
            }
        })
    }

    #[test]
    fn step3p7_reads_per_layer_heads_tables_and_bounds() {
        let v = step3p7();
        let c = parse(&v).unwrap();
        let heads: Vec<usize> = (0..4).map(|l| gqa(&c, l).heads).collect();
        assert_eq!(heads, [4, 2, 4, 2]);
        assert!(gqa(&c, 0).head_gate && gqa(&c, 0).zero_centred_qk_norm);
        assert_eq!(gqa(&c, 1).window, Some(8));
        assert!(gqa(&c, 1).local_rope && !gqa(&c, 0).local_rope);
        assert_eq!((c.rope.theta, c.rope.dim), (1e4, 8));
        let local = c.local_rope.as_ref().unwrap();
        assert_eq!((local.theta, local.dim), (500.0, 16));
        assert!((gqa(&c, 0).softmax_scale - 20f32.powf(-0.5)).abs() < 1e-7);
        assert!(c.zero_centred_norms);
        assert_eq!(
            (0..4).map(|l| c.is_moe(l)).collect::<Vec<_>>(),
            [false, true, true, true]
        );
        assert_eq!(c.expert_limit(1), Some(0.5));
        assert_eq!(c.expert_limit(2), None);
        assert_eq!(c.mlp_act_of(0), GluActivation::SiluClamped { limit: 0.6 });
        assert_eq!(c.mlp_act_of(1), GluActivation::Silu);
        for (field, bad) in [
            ("gating", json!(false)),
            ("use_bidirectional_attention", json!(true)),
            ("swiglu_limits", json!([0, -1, 0, 0])),
            ("swiglu_limits_shared", json!([0, 0])),
            (
                "layer_types",
                json!(["chunked", "chunked", "chunked", "chunked"]),
            ),
            (
                "mlp_layer_types",
                json!(["dense", "moe", "sparse", "sparse"]),
            ),
            ("hidden_act", json!("gelu")),
            ("model_type", json!("step3")),
        ] {
            let mut w = v.clone();
            w["text_config"][field] = bad;
            assert_eq!(
                field_of(parse(&w).unwrap_err()),
                format!("text_config.{field}"),
                "{field}"
            );
        }
        let mut w = v.clone();
        w["text_config"]["per_layer_config"]["1"]["head_dim"] = json!(8);
        assert_eq!(
            field_of(parse(&w).unwrap_err()),
            "text_config.per_layer_config.1.head_dim"
        );
    }

    /// The hub's remote-code form: `moe_layers_enum`, `attention_other_setting`, per-layer
    /// `rope_theta` and `partial_rotary_factors`, lists padded with the MTP layer's entries.
    #[test]
    fn step3p7_reads_the_legacy_hub_fields() {
        let mut v = step3p7();
        let t = v["text_config"].as_object_mut().unwrap();
        for k in [
            "mlp_layer_types",
            "per_layer_config",
            "rope_parameters",
            "model_type",
        ] {
            t.remove(k);
        }
        t.insert("hidden_act".into(), json!("swigluoai"));
        t.insert("num_nextn_predict_layers".into(), json!(1));
        t.insert("moe_layers_enum".into(), json!("1,2,3,4"));
        t.insert(
            "attention_other_setting".into(),
            json!({"num_attention_heads": 2}),
        );
        t.insert("rope_theta".into(), json!([1e4, 500.0, 1e4, 500.0, 1e4]));
        t.insert(
            "partial_rotary_factors".into(),
            json!([0.5, 1.0, 0.5, 1.0, 0.5]),
        );
        t.insert(
            "layer_types".into(),
            json!([
                "full_attention",
                "sliding_attention",
                "full_attention",
                "sliding_attention",
                "full_attention"
            ]),
        );
        t.insert("swiglu_limits".into(), json!([0, 0.5, 0, 0.8, 0]));
        let c = parse(&v).unwrap();
        assert_eq!(c.draft_layers, 1);
        assert_eq!(
            (0..4).map(|l| c.is_moe(l)).collect::<Vec<_>>(),
            [false, true, true, true]
        );
        assert_eq!(
            (0..4).map(|l| gqa(&c, l).heads).collect::<Vec<_>>(),
            [4, 2, 4, 2]
        );
        assert_eq!((c.rope.theta, c.rope.dim), (1e4, 8));
        let local = c.local_rope.as_ref().unwrap();
        assert_eq!((local.theta, local.dim), (500.0, 16));
        assert_eq!(c.expert_limit(3), Some(0.8));
        // Without moe_layers_enum, transformers makes every layer from the fourth on MoE.
        v["text_config"]
            .as_object_mut()
            .unwrap()
            .remove("moe_layers_enum");
        let c = parse(&v).unwrap();
        assert_eq!(
            (0..4).map(|l| c.is_moe(l)).collect::<Vec<_>>(),
            [false, false, false, true]
        );
    }
}
