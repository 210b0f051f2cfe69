//! Tests of the Kimi Linear / Kimi K3 config reader.

use std::path::Path;

use serde_json::json;

use super::*;

fn k3() -> Value {
    serde_json::from_str(
        r#"{
        "model_type": "kimi_k3", "bos_token_id": 500, "eos_token_id": 502,
        "tie_word_embeddings": false, "vision_config": {"patch_size": 14},
        "text_config": {
            "model_type": "kimi_linear", "vocab_size": 512, "hidden_size": 128,
            "intermediate_size": 256, "num_hidden_layers": 8, "num_attention_heads": 4,
            "num_key_value_heads": 4, "q_lora_rank": 48, "kv_lora_rank": 32,
            "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
            "mla_use_nope": true, "mla_use_output_gate": true, "hidden_act": "situ",
            "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
            "rms_norm_eps": 1e-5, "first_k_dense_replace": 1, "moe_layer_freq": 1,
            "num_experts": 16, "num_experts_per_token": 4, "num_shared_experts": 2,
            "moe_intermediate_size": 64, "routed_expert_hidden_size": 64,
            "latent_moe_use_norm": true, "moe_renormalize": true,
            "moe_router_activation_func": "sigmoid", "topk_method": "noaux_tc",
            "use_grouped_topk": true, "num_expert_group": 1, "topk_group": 1,
            "routed_scaling_factor": 2.5, "attn_res_block_size": 3,
            "linear_attn_config": {"full_attn_layers": [4, 7, 8], "kda_layers": [1, 2, 3, 5, 6],
                "gate_lower_bound": -5.0, "head_dim": 32, "num_heads": 4,
                "short_conv_kernel_size": 4, "use_full_rank_gate": true},
            "max_position_embeddings": 4096, "num_nextn_predict_layers": 0,
            "initializer_range": 0.02, "use_cache": true, "dtype": "float32"
        }
    }"#,
    )
    .unwrap()
}

fn parse(v: &Value) -> Result<ModelConfig, ModelError> {
    ModelConfig::from_json(v, Path::new("config.json"))
}

/// The plan's kind per layer.
fn kinds(c: &ModelConfig) -> Vec<LayerAttention> {
    c.layer_plan
        .iter()
        .map(|p| match p.attention {
            AttentionConfig::Kda(_) => LayerAttention::Kda,
            _ => LayerAttention::Full,
        })
        .collect()
}

/// The KDA shape of the plan's KDA layers.
fn kda_of(c: &ModelConfig) -> Option<KdaConfig> {
    c.layer_plan.iter().find_map(|p| match p.attention {
        AttentionConfig::Kda(k) => Some(k),
        _ => None,
    })
}

/// The MLA layers' softmax scale.
fn mla_scale(c: &ModelConfig) -> f32 {
    c.layer_plan
        .iter()
        .find_map(|p| match &p.attention {
            AttentionConfig::Mla(m) => Some(m.softmax_scale),
            _ => None,
        })
        .unwrap()
}

fn field_of(e: ModelError) -> String {
    match e {
        ModelError::Config { field, .. } => field,
        e => panic!("not a config error: {e}"),
    }
}

#[test]
fn k3_reads() {
    let c = parse(&k3()).unwrap();
    assert_eq!(c.family, "kimi_linear");
    assert_eq!(c.names.prefix, "language_model.");
    use LayerAttention::{Full as F, Kda as K};
    assert_eq!(kinds(&c), [K, K, K, F, K, K, F, F]);
    assert_eq!(c.residual, Residual::AttnRes { block_size: 3 });
    assert_eq!(
        kda_of(&c),
        Some(KdaConfig {
            heads: 4,
            head_dim: 32,
            conv_kernel: 4,
            gate: KdaGate::LowerBound(-5.0),
            full_rank_output_gate: true
        })
    );
    assert!((mla_scale(&c) - 48f32.powf(-0.5)).abs() < 1e-7);
    assert_eq!(
        c.moe.latent,
        Some(LatentMoe {
            dim: 64,
            norm: true
        })
    );
    assert_eq!(c.moe.shared.as_ref().unwrap().intermediate, 128);
    assert_eq!(
        c.mlp_act,
        GluActivation::Situ {
            beta: 4.0,
            linear_beta: Some(25.0)
        }
    );
    assert_eq!(c.bos_token_id, Some(500));
    assert_eq!(c.eos_token_ids, [502]);
    assert!(!c.is_moe(0) && c.is_moe(1));
    assert_eq!(
        kinds(&c)
            .iter()
            .filter(|k| **k == LayerAttention::Full)
            .count(),
        3
    );
}

#[test]
fn unknown_and_unsupported_fields_are_named() {
    let mut v = k3();
    v["text_config"]["sliding_window"] = json!(128);
    assert_eq!(
        field_of(parse(&v).unwrap_err()),
        "text_config.sliding_window"
    );
    let mut v = k3();
    v["text_config"]["linear_attn_config"]["chunk_size"] = json!(64);
    assert_eq!(
        field_of(parse(&v).unwrap_err()),
        "text_config.linear_attn_config.chunk_size"
    );
    for (k, bad) in [
        ("hidden_act", json!("gelu")),
        ("mla_use_nope", json!(false)),
        ("moe_router_activation_func", json!("softmax")),
        ("moe_layer_freq", json!(2)),
        ("num_key_value_heads", json!(2)),
        ("attn_res_block_size", json!(0)),
        ("num_experts_per_tok", json!(3)),
    ] {
        let mut v = k3();
        v["text_config"][k] = bad;
        assert_eq!(
            field_of(parse(&v).unwrap_err()),
            format!("text_config.{k}"),
            "{k}"
        );
    }
    let mut v = k3();
    v["text_config"]["linear_attn_config"]["kda_layers"] = json!([1, 2, 3, 5]);
    assert_eq!(
        field_of(parse(&v).unwrap_err()),
        "text_config.linear_attn_config.kda_layers"
    );
    let mut v = k3();
    v["text_config"]["linear_attn_config"]["full_attn_layers"] = json!([4, 7, 9]);
    assert_eq!(
        field_of(parse(&v).unwrap_err()),
        "text_config.linear_attn_config.full_attn_layers"
    );
    let mut v = k3();
    v["text_config"]["model_type"] = json!("deepseek_v3");
    assert_eq!(field_of(parse(&v).unwrap_err()), "text_config.model_type");
    let mut v = k3();
    v["text_config"]["layer_types"] = json!(vec!["linear_attention"; 8]);
    assert_eq!(field_of(parse(&v).unwrap_err()), "text_config.layer_types");
}

#[test]
fn transformers_spelling_reads_the_same() {
    let v: Value = serde_json::from_str(
        r#"{
        "model_type": "kimi_linear", "vocab_size": 512, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
        "num_key_value_heads": 4, "q_lora_rank": null, "kv_lora_rank": 32,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "qk_head_dim": 24, "head_dim": 8,
        "v_head_dim": 16, "hidden_act": "silu", "rms_norm_eps": 1e-5,
        "first_k_dense_replace": 1, "num_experts": 8, "num_experts_per_token": 2,
        "num_shared_experts": 1, "moe_intermediate_size": 32, "moe_renormalize": true,
        "num_expert_group": 1, "topk_group": 1, "routed_scaling_factor": 2.446,
        "model_max_length": 256, "linear_head_dim": 16, "linear_num_heads": 4,
        "linear_conv_kernel_dim": 4,
        "layer_types": ["linear_attention", "linear_attention", "full_attention",
                        "linear_attention", "linear_attention", "full_attention"],
        "mlp_layer_types": ["dense", "sparse", "sparse", "sparse", "sparse", "sparse"],
        "linear_attn_config": {"full_attn_layers": [3, 6], "kda_layers": [1, 2, 4, 5],
            "head_dim": 16, "num_heads": 4, "short_conv_kernel_size": 4},
        "attention_bias": false, "attention_dropout": 0.0, "pretraining_tp": 1,
        "output_router_logits": false, "tie_word_embeddings": false
    }"#,
    )
    .unwrap();
    let c = parse(&v).unwrap();
    assert_eq!(c.names.prefix, "");
    assert_eq!(kda_of(&c).unwrap().gate, KdaGate::Softplus);
    assert_eq!(c.residual, Residual::Add);
    assert_eq!(c.max_positions, 256);
    assert!(kinds(&c)[0] == LayerAttention::Kda && kinds(&c)[2] == LayerAttention::Full);
    let mut w = v.clone();
    w["linear_head_dim"] = json!(32);
    assert_eq!(field_of(parse(&w).unwrap_err()), "linear_head_dim");
    let mut w = v.clone();
    w["mlp_layer_types"] = json!(["dense", "dense", "sparse", "sparse", "sparse", "sparse"]);
    assert_eq!(field_of(parse(&w).unwrap_err()), "mlp_layer_types");
    let mut w = v.clone();
    w["num_experts_per_tok"] = json!(3);
    assert_eq!(field_of(parse(&w).unwrap_err()), "num_experts_per_tok");
}
