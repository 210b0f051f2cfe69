//! What the config readers' tests share: parsing a `config.json` value, the field an error
//! names, and base configs several families' tests start from.

pub(crate) use super::*;
pub(crate) use serde_json::Value;
pub(crate) use serde_json::json;

pub(crate) fn ds() -> Value {
    json!({
        "model_type": "deepseek_v3", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 3,
        "rms_norm_eps": 1e-6, "num_attention_heads": 4, "num_key_value_heads": 4,
        "max_position_embeddings": 256, "q_lora_rank": 32, "kv_lora_rank": 32,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "hidden_act": "silu",
        "rope_theta": 10000.0, "num_experts_per_tok": 4, "n_routed_experts": 16,
        "moe_intermediate_size": 32, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
        "n_shared_experts": 1, "first_k_dense_replace": 1, "intermediate_size": 128,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                         "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}
    })
}

pub(crate) fn parse(v: &Value) -> Result<ModelConfig, ModelError> {
    ModelConfig::from_json(v, Path::new("config.json"))
}

/// Layer 0's softmax scale.
pub(crate) fn scale(c: &ModelConfig) -> f32 {
    match &c.layer_plan[0].attention {
        AttentionConfig::Gqa(g) => g.softmax_scale,
        AttentionConfig::Mla(m) => m.softmax_scale,
        AttentionConfig::Dsa(d) => d.mla.softmax_scale,
        AttentionConfig::Compressed(c) => c.softmax_scale,
        AttentionConfig::Kda(_) | AttentionConfig::Gdn(_) => panic!("no softmax"),
    }
}

pub(crate) fn field_of(e: ModelError) -> String {
    match e {
        ModelError::Config { field, .. } => field,
        e => panic!("not a config error: {e}"),
    }
}

pub(crate) fn gpt_oss() -> Value {
    json!({
        "model_type": "gpt_oss", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 4,
        "rms_norm_eps": 1e-5, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": 256, "hidden_act": "silu", "num_local_experts": 8,
        "num_experts_per_tok": 2, "intermediate_size": 32, "sliding_window": 8,
        "swiglu_limit": 7.0, "rope_theta": 150000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": false,
                         "original_max_position_embeddings": 64},
        "quantization_config": {"quant_method": "mxfp4",
            "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}
    })
}

pub(crate) fn dense(model_type: &str) -> Value {
    json!({
        "model_type": model_type, "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 4,
        "rms_norm_eps": 1e-6, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "max_position_embeddings": 256, "hidden_act": "silu",
        "intermediate_size": 96, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}
    })
}

pub(crate) fn gqa(c: &ModelConfig, l: usize) -> &GqaConfig {
    match &c.layer_plan[l].attention {
        AttentionConfig::Gqa(g) => g,
        a => panic!("layer {l}: {a:?}"),
    }
}
