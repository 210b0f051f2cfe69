//! `config.json` through `ModelConfig::from_json`, `quantization_config` included: an error or
//! a configuration that is internally consistent — never a panic, never an allocation sized by
//! the file.
//!
//! Input: one byte choosing a fixture config, then JSON. The JSON is read on its own, and, when
//! it is an object, also merged over the chosen fixture (objects merged one level deep, so
//! `{"quantization_config": {"group_size": 0}}` changes one field of a real config), which keeps
//! most inputs close to configs that are accepted.
#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use sluice_model::ModelConfig;
use sluice_model::config::{AttentionConfig, MlpKind};

const BASES: [&str; 10] = [
    "models/deepseek_v3-bf16/config.json",
    "models/deepseek_v3_noqlora-bf16/config.json",
    "models/mixtral-bf16/config.json",
    "models/olmoe-bf16/config.json",
    "models/qwen2_moe-bf16/config.json",
    "models/qwen3_moe-bf16/config.json",
    "quant/deepseek_v3-fp8/config.json",
    "quant/deepseek_v3-int4/config.json",
    "quant/gpt_oss-mxfp4/config.json",
    "quant/qwen3_moe-mxfp4/config.json",
];

fn bases() -> &'static Vec<Value> {
    static B: OnceLock<Vec<Value>> = OnceLock::new();
    B.get_or_init(|| BASES.iter().map(|p| sluice_fuzz::fixture_json(p)).collect())
}

fn merge(base: &Value, over: &serde_json::Map<String, Value>) -> Value {
    let mut out = base.clone();
    let o = out.as_object_mut().expect("fixture configs are objects");
    for (k, v) in over {
        match (o.get_mut(k), v) {
            (Some(Value::Object(b)), Value::Object(v)) => {
                for (k2, v2) in v {
                    b.insert(k2.clone(), v2.clone());
                }
            }
            _ => {
                o.insert(k.clone(), v.clone());
            }
        }
    }
    out
}

fn check(v: &Value) {
    let Ok(c) = ModelConfig::from_json(v, Path::new("config.json")) else {
        return;
    };
    assert_eq!(c.mlp.len(), c.layers);
    assert!(c.vocab > 0 && c.hidden > 0 && c.layers > 0);
    assert!(c.moe.top_k >= 1 && c.moe.top_k <= c.moe.experts);
    assert!(c.rope.theta > 0.0 && c.rope.theta.is_finite());
    match &c.attention {
        AttentionConfig::Mla {
            heads,
            qk_rope_head_dim,
            ..
        } => assert!(*heads > 0 && qk_rope_head_dim % 2 == 0),
        AttentionConfig::Gqa {
            heads,
            kv_heads,
            head_dim,
            sliding_layers,
            ..
        } => {
            assert!(*kv_heads > 0 && heads % kv_heads == 0 && head_dim % 2 == 0);
            if let Some(s) = sliding_layers {
                assert_eq!(s.len(), c.layers);
            }
        }
    }
    assert!(
        c.softmax_scale.is_finite() && c.softmax_scale > 0.0,
        "softmax scale {}",
        c.softmax_scale
    );
    if let Some(first) = c.mlp.iter().position(|k| *k == MlpKind::Moe) {
        assert!(c.is_moe(first));
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, json)) = data.split_first() else {
        return;
    };
    let Ok(v) = serde_json::from_slice::<Value>(json) else {
        return;
    };
    check(&v);
    if let Value::Object(over) = &v {
        check(&merge(&bases()[sel as usize % BASES.len()], over));
    }
});
