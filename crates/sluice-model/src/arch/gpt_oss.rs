//! GPT-OSS (`gpt_oss`): grouped-query attention with biases, per-head attention sinks and
//! sliding-window layers by `layer_types`; a biased router taking the top-k logits, then a
//! softmax over them; clamped SwiGLU experts fused per layer (`gate_up_proj` interleaved by
//! row, with biases), in BF16 or as MXFP4 blocks (`quant_method` `mxfp4`).

use super::common::{Base, all_moe, check_window, gqa_rope, read_layer_types, top_k};
use super::{Family, Models};
use crate::ModelError;
use crate::config::{
    AttentionConfig, Cfg, ExpertActivation, ExpertNames, LayerPlan, ModelConfig, MoeConfig,
    RouterKind, TensorNames,
};
use crate::gguf::{GgufArch, GgufNames, Meta};
use serde_json::{Value as Json, json};

pub(super) const FAMILY: Family = Family {
    name: "gpt_oss",
    models: &[Models {
        model_types: &["gpt_oss"],
        names: "GPT-OSS",
        features: "attention sinks, alternating sliding layers, clamped SwiGLU, fused MXFP4 experts",
    }],
    read,
    gguf: &[GgufArch {
        name: "gpt-oss",
        with_experts: None,
        permuted_qk: false,
        names: GgufNames {
            extra: &[
                // The norm before the experts.
                ("post_attention_norm", "post_attention_layernorm"),
                // The converter gave the per-head sinks a `.weight`; transformers' have none.
                ("attn_sinks.weight", "self_attn.sinks"),
                ("ffn_gate_inp", "mlp.router"),
            ],
            expert_biases: true,
            ..GgufNames::STANDARD
        },
        config: gguf_config,
    }],
};

fn read(c: &Cfg<'_>, model_type: &str) -> Result<ModelConfig, ModelError> {
    let base = Base::read(c, true)?;
    let (mut gqa, rope) = gqa_rope(c, &base, false)?;
    // transformers default: attention_bias = true.
    let b = c.bool_or("attention_bias", true)?;
    (gqa.qkv_bias, gqa.o_bias) = (b, b);
    gqa.sinks = true;
    // transformers default when `layer_types` is absent: even layers slide, odd layers are full.
    let sliding = read_layer_types(c, base.layers, |l| l % 2 == 0)?;
    let window = c.opt_usize("sliding_window")?;
    if window.is_none() && sliding.iter().any(|&s| s) {
        return Err(c.err(
            "sliding_window",
            "missing, and layer_types has sliding_attention layers",
        ));
    }
    check_window(c, window)?;

    // transformers maps `num_experts` to `num_local_experts`.
    let experts = if c.get("num_local_experts").is_some() {
        c.pos_usize("num_local_experts")?
    } else {
        c.pos_usize("num_experts")?
    };
    let intermediate = c.pos_usize("intermediate_size")?;
    let top_k = top_k(c, experts)?;
    // transformers defaults (GPT-OSS releases set only the limit).
    let alpha = c.opt_f32("swiglu_alpha")?.unwrap_or(1.702);
    let limit = c.opt_f32("swiglu_limit")?.unwrap_or(7.0);
    if limit <= 0.0 {
        return Err(c.err("swiglu_limit", "must be positive"));
    }
    let moe = MoeConfig {
        activation: ExpertActivation::ClampedSwiGlu { alpha, limit },
        ..MoeConfig::routed(experts, top_k, intermediate, RouterKind::TopKSoftmax)
    };
    let layer_plan = sliding
        .iter()
        .zip(all_moe(base.layers))
        .map(|(&slides, mlp)| {
            let mut g = gqa.clone();
            g.window = window.filter(|_| slides);
            LayerPlan::new(AttentionConfig::Gqa(g), mlp)
        })
        .collect();
    let names = TensorNames {
        router: "router",
        router_bias: Some("router.bias"),
        experts: ExpertNames::FusedGateUp,
        ..TensorNames::standard()
    };
    base.finish(c, FAMILY.name, model_type, rope, layer_plan, moe, names)
}

/// GPT-OSS's `config.json` from a GGUF `gpt-oss` file.
fn gguf_config(m: &Meta<'_>) -> Result<Json, ModelError> {
    let mut c = m.gqa("gpt_oss", "GptOssForCausalLM")?;
    if let Some(s) = c.get_mut("rope_scaling")
        && s["rope_type"] == "yarn"
    {
        // GPT-OSS computes YaRN's correction range without rounding it to whole dimensions
        // (`truncate: false` in every release); the converter does not store it.
        s["truncate"] = json!(false);
    }
    c.insert(
        "intermediate_size".into(),
        json!(m.pos("expert_feed_forward_length")?),
    );
    c.insert("num_local_experts".into(), json!(m.pos("expert_count")?));
    c.insert(
        "num_experts_per_tok".into(),
        json!(m.pos("expert_used_count")?),
    );
    c.insert(
        "attention_bias".into(),
        json!(m.has_tensor("blk.0.attn_q.bias")),
    );
    c.insert(
        "sliding_window".into(),
        json!(m.pos("attention.sliding_window")?),
    );
    let layers = c["num_hidden_layers"].as_u64().unwrap_or(0);
    let sliding = m.sliding_layers("attention.sliding_window_pattern", layers)?;
    let types: Vec<&str> = sliding
        .iter()
        .map(|&s| {
            if s {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    c.insert("layer_types".into(), json!(types));
    m.finish(c)
}

/// The config reader's tests.
#[cfg(test)]
mod tests {
    use crate::config::test_util::*;

    #[test]
    fn gpt_oss_reads() {
        let c = parse(&gpt_oss()).unwrap();
        assert_eq!(c.family, "gpt_oss");
        assert_eq!(c.moe.router, RouterKind::TopKSoftmax);
        assert_eq!(
            c.moe.activation,
            ExpertActivation::ClampedSwiGlu {
                alpha: 1.702,
                limit: 7.0
            }
        );
        assert_eq!(c.quant.method(), "mxfp4");
        // transformers' default layer_types: even layers slide.
        assert_eq!(
            (0..4)
                .map(|l| c.layer_plan[l].attention.window())
                .collect::<Vec<_>>(),
            [Some(8), None, Some(8), None]
        );
        let AttentionConfig::Gqa(GqaConfig {
            qkv_bias,
            o_bias,
            sinks,
            ..
        }) = c.layer_plan[0].attention
        else {
            panic!()
        };
        assert!(qkv_bias && o_bias && sinks);
        assert!(!c.rope.interleaved);
        assert!((scale(&c) - 0.25).abs() < 1e-7);
        let mut v = gpt_oss();
        v["layer_types"] = json!(["full_attention", "sliding_attention", "full_attention"]);
        assert_eq!(field_of(parse(&v).unwrap_err()), "layer_types");
        let mut v = gpt_oss();
        v["layer_types"] = json!([
            "full_attention",
            "chunked_attention",
            "full_attention",
            "full_attention"
        ]);
        assert_eq!(field_of(parse(&v).unwrap_err()), "layer_types");
        let mut v = gpt_oss();
        v["quantization_config"] = json!({"quant_method": "fp8", "weight_block_size": [128, 128]});
        assert_eq!(
            field_of(parse(&v).unwrap_err()),
            "quantization_config.quant_method"
        );
    }
}
