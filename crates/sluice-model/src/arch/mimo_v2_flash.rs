//! MiMo-V2-Flash (`mimo_v2_flash`): hybrid attention — sliding-window layers with twice the KV
//! heads, a per-head attention sink and their own rotary table, and full-attention layers
//! (`layer_types`, by default the first and every sixth) — queries and keys of `head_dim`,
//! values of the smaller `v_head_dim` scaled by `attention_value_scale`, a third of each head
//! rotated (`partial_rotary_factor` 0.334 per layer type); DeepSeek's sigmoid group routing
//! with a selection-only bias and no shared expert; dense layers by `mlp_layer_types`.

use serde_json::Value;

use super::common::{Base, check_groups, gqa_config, layer_kinds, top_k, typed_rope};
use super::{Family, Models};
use crate::ModelError;
use crate::config::{
    AttentionConfig, Cfg, LayerPlan, MlpKind, ModelConfig, MoeConfig, RopeConfig, RouterKind,
    TensorNames,
};

pub(super) const FAMILY: Family = Family {
    name: "mimo_v2_flash",
    models: &[Models {
        model_types: &["mimo_v2_flash"],
        names: "MiMo-V2-Flash",
        features: "sliding layers with sinks, twice the KV heads and their own rotary table beside full attention; values narrower than keys",
    }],
    read,
    gguf: &[],
};

/// transformers' default `partial_rotary_factor` of either layer type.
const PARTIAL: f64 = 0.334;

fn read(c: &Cfg<'_>, model_type: &str) -> Result<ModelConfig, ModelError> {
    let base = Base::read(c, false)?;
    // transformers defaults: full attention for the first layer and every sixth; the first
    // layer dense, the others MoE.
    let sliding = layer_kinds(
        c,
        "layer_types",
        base.layers,
        ["sliding_attention", "full_attention"],
        |i| !(i == 0 || (i + 1).is_multiple_of(6)),
    )?;
    let sparse = layer_kinds(
        c,
        "mlp_layer_types",
        base.layers,
        ["sparse", "dense"],
        |i| i > 0,
    )?;

    // Grouped-query attention with the rotary table of each layer type.
    let (full, full_rope) = gqa_rope_typed(c, &base, "full_attention")?;
    let (mut swa, swa_rope) = gqa_rope_typed(c, &base, "sliding_attention")?;
    let v_head_dim = c.pos_usize("v_head_dim")?;
    // transformers: the released configs' `sliding_window_size` counts the previous tokens,
    // the window the query too.
    let window = match c.opt_usize("sliding_window_size")? {
        Some(w) => w + 1,
        None => c.pos_usize("sliding_window")?,
    };
    let v_scale = match c.get("attention_value_scale") {
        None | Some(Value::Null) => None,
        Some(_) => Some(c.f32("attention_value_scale")?),
    };
    let bias = c.bool_or("attention_bias", false)?;
    let mut full = full;
    for (g, sw) in [(&mut full, false), (&mut swa, true)] {
        g.qkv_bias = bias;
        g.v_head_dim = v_head_dim;
        g.v_scale = v_scale;
        if sw {
            g.kv_heads *= 2;
            if !g.heads.is_multiple_of(g.kv_heads) {
                return Err(c.err(
                    "num_key_value_heads",
                    "twice it (the sliding layers' KV heads) does not divide num_attention_heads",
                ));
            }
            g.window = Some(window);
            g.sinks = true;
            g.local_rope = true;
        }
    }

    let experts = c.pos_usize("n_routed_experts")?;
    let intermediate = c.pos_usize("moe_intermediate_size")?;
    let top_k = top_k(c, experts)?;
    let n_group = c.opt_usize("n_group")?.unwrap_or(1);
    let topk_group = c.opt_usize("topk_group")?.unwrap_or(1);
    if n_group == 0 || topk_group == 0 {
        return Err(c.err("n_group", "n_group and topk_group must be positive"));
    }
    check_groups(c, experts, top_k, n_group, topk_group)?;
    // The hub config stores `routed_scaling_factor` as null: 1.
    let scaling = match c.get("routed_scaling_factor") {
        None | Some(Value::Null) => 1.0,
        Some(_) => c.pos_f32("routed_scaling_factor")?,
    };
    let moe = MoeConfig::routed(
        experts,
        top_k,
        intermediate,
        RouterKind::SigmoidGroup {
            n_group,
            topk_group,
            norm_topk_prob: c.bool_or("norm_topk_prob", true)?,
            routed_scaling_factor: scaling,
        },
    );
    let dense = if sparse.iter().all(|&s| s) {
        0
    } else {
        c.pos_usize("intermediate_size")?
    };
    let layer_plan = (0..base.layers)
        .map(|l| {
            LayerPlan::new(
                AttentionConfig::Gqa(if sliding[l] {
                    swa.clone()
                } else {
                    full.clone()
                }),
                MlpKind::moe_or_dense(sparse[l], dense),
            )
        })
        .collect();
    let names = TensorNames {
        router_bias: Some("gate.e_score_correction_bias"),
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
    cfg.local_rope = Some(swa_rope);
    Ok(cfg)
}

/// Grouped-query attention read with the rotary parameters of `layer_type`
/// (`rope_parameters.{layer_type}`: its `rope_theta` and `partial_rotary_factor`; only the
/// default rotation is implemented).
fn gqa_rope_typed(
    c: &Cfg<'_>,
    base: &Base,
    layer_type: &str,
) -> Result<(crate::config::GqaConfig, RopeConfig), ModelError> {
    let Some(all) = c.get("rope_parameters") else {
        return Err(c.err("rope_parameters", "required field is missing"));
    };
    let gqa = gqa_config(c, base, true)?;
    let rope = typed_rope(
        c,
        all,
        layer_type,
        gqa.head_dim,
        base.max_positions,
        PARTIAL,
    )?;
    Ok((gqa, rope))
}

/// The config reader's tests.
#[cfg(test)]
mod tests {
    use crate::config::test_util::*;

    #[test]
    fn mimo_v2_flash_layer_types_and_two_rotary_tables() {
        let v = json!({
            "model_type": "mimo_v2_flash", "vocab_size": 512, "hidden_size": 64,
            "num_hidden_layers": 7, "rms_norm_eps": 1e-5, "num_attention_heads": 4,
            "num_key_value_heads": 1, "head_dim": 192, "v_head_dim": 128,
            "max_position_embeddings": 256, "hidden_act": "silu", "intermediate_size": 128,
            "moe_intermediate_size": 32, "n_routed_experts": 8, "num_experts_per_tok": 2,
            "routed_scaling_factor": null, "sliding_window_size": 128,
            "attention_value_scale": 0.707,
            "rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.334},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.334}
            }
        });
        let c = parse(&v).unwrap();
        // transformers' defaults: full attention on layer 0 and every sixth, layer 0 dense.
        let windows: Vec<_> = (0..7).map(|l| gqa(&c, l).window).collect();
        assert_eq!(
            windows,
            [
                None,
                Some(129),
                Some(129),
                Some(129),
                Some(129),
                None,
                Some(129)
            ]
        );
        assert!(!c.is_moe(0) && (1..7).all(|l| c.is_moe(l)));
        let (full, swa) = (gqa(&c, 0), gqa(&c, 1));
        assert_eq!((full.kv_heads, swa.kv_heads), (1, 2));
        assert!(swa.sinks && swa.local_rope && !full.sinks && !full.local_rope);
        assert_eq!((full.v_head_dim, full.v_scale), (128, Some(0.707)));
        // int(192 × 0.334) = 64 rotated dimensions, each table its own theta.
        assert_eq!((c.rope.dim, c.rope.theta), (64, 5e6));
        let local = c.local_rope.as_ref().unwrap();
        assert_eq!((local.dim, local.theta), (64, 1e4));
        assert!(matches!(
            c.moe.router,
            RouterKind::SigmoidGroup { routed_scaling_factor, .. } if routed_scaling_factor == 1.0
        ));
        let mut w = v.clone();
        w["rope_parameters"]["sliding_attention"]["rope_type"] = json!("yarn");
        assert_eq!(
            field_of(parse(&w).unwrap_err()),
            "rope_parameters.sliding_attention.rope_type"
        );
        let mut w = v.clone();
        w["rope_parameters"]
            .as_object_mut()
            .unwrap()
            .remove("full_attention");
        assert_eq!(
            field_of(parse(&w).unwrap_err()),
            "rope_parameters.full_attention"
        );
        let mut w = v;
        w["mlp_layer_types"] = json!(["dense"]);
        assert_eq!(field_of(parse(&w).unwrap_err()), "mlp_layer_types");
    }
}
