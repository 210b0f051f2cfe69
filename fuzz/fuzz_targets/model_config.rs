//! `config.json` through `ModelConfig::from_json`, `quantization_config` included: an error or
//! a configuration that is internally consistent — never a panic, never an allocation sized by
//! the file.
//!
//! Input: one byte choosing a fixture config, then JSON. The JSON is read on its own, and, when
//! it is an object, also merged over the chosen fixture (objects merged one level deep, so
//! `{"quantization_config": {"group_size": 0}}` changes one field of a real config), which keeps
//! most inputs close to configs that are accepted.
//!
//! When the first byte's top bit is set, the rest is instead a list of (size or float field,
//! value) pairs built by `arbitrary` and written over the chosen fixture: every field that sizes
//! an allocation or a shape product (layers, experts, widths, ranks, heads, positions, shared
//! experts) and every float used as an `f32`, set to values around the limits, powers of two,
//! 2^64 − 1, negative and non-finite-as-f32 numbers (issue 18, class 2). An accepted config must
//! then keep every size within `sluice_model::config`'s limits, so no allocation or product
//! sized by the file can be large or wrap.
#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use libfuzzer_sys::arbitrary::{self, Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use sluice_model::ModelConfig;
use sluice_model::config::{
    AttentionConfig, MAX_EXPERTS, MAX_LAYERS, MAX_POSITIONS, MAX_SIZE, MlpKind, RouterKind,
};

const BASES: [&str; 14] = [
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
    "kimi/kimi_linear-bf16/config.json",
    "kimi/k3/k3-tiny-bf16/config.json",
    "models/qwen2_moe-fp32/config.json",
    "models/mixtral-fp32/config.json",
];

/// Fields that size an allocation or enter a shape product (`linear_attn_config.` ones go into
/// that object; `text_config.` is added for Kimi K3).
const SIZE_FIELDS: [&str; 33] = [
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "model_max_length",
    "intermediate_size",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "n_routed_experts",
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "num_experts_per_token",
    "n_shared_experts",
    "num_shared_experts",
    "n_group",
    "topk_group",
    "num_expert_group",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "first_k_dense_replace",
    "sliding_window",
    "routed_expert_hidden_size",
    "attn_res_block_size",
    "linear_attn_config.num_heads",
    "linear_attn_config.head_dim",
    "linear_attn_config.short_conv_kernel_size",
];

/// Floats used as `f32`.
const FLOAT_FIELDS: [&str; 8] = [
    "rms_norm_eps",
    "routed_scaling_factor",
    "swiglu_limit",
    "swiglu_alpha",
    "clip_qkv",
    "activation_situ_beta",
    "activation_situ_linear_beta",
    "linear_attn_config.gate_lower_bound",
];

/// A hostile value for a size field.
#[derive(Arbitrary, Debug)]
enum Size {
    Small(u8),
    /// 2^k, 2^k − 1 or 2^k + 1.
    Pow2(u8, i8),
    Any(u64),
    /// A float where an integer is expected.
    Float(f64),
}

impl Size {
    fn json(&self) -> Value {
        match *self {
            Size::Small(n) => Value::from(n),
            Size::Pow2(k, d) => {
                let p = 1u64.checked_shl(u32::from(k % 64)).unwrap_or(0);
                Value::from(p.wrapping_add_signed(i64::from(d.signum())))
            }
            Size::Any(n) => Value::from(n),
            Size::Float(x) => serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number),
        }
    }
}

/// A hostile value for a float field.
#[derive(Arbitrary, Debug)]
enum Float {
    /// ±10^e.
    Exp(bool, i16),
    Any(f64),
}

impl Float {
    fn json(&self) -> Value {
        let x = match *self {
            Float::Exp(neg, e) => {
                let x = 10f64.powi(i32::from(e % 400));
                if neg { -x } else { x }
            }
            Float::Any(x) => x,
        };
        serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
    }
}

#[derive(Arbitrary, Debug)]
enum Override {
    Size(u8, Size),
    Float(u8, Float),
}

/// Writes `field` = `value` into the text config of `cfg` (under `text_config` for Kimi K3,
/// and into `linear_attn_config` for its fields).
fn set(cfg: &mut Value, field: &str, value: Value) {
    let text = if cfg.get("text_config").is_some_and(Value::is_object) {
        &mut cfg["text_config"]
    } else {
        cfg
    };
    match field.strip_prefix("linear_attn_config.") {
        Some(f) => {
            if let Some(o) = text
                .get_mut("linear_attn_config")
                .and_then(Value::as_object_mut)
            {
                o.insert(f.to_owned(), value);
            }
        }
        None => {
            if let Some(o) = text.as_object_mut() {
                o.insert(field.to_owned(), value);
            }
        }
    }
}

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
    assert_eq!(c.layer_plan.len(), c.layers);
    // Sizes within the limits: nothing sized by the file is large, no product wraps.
    assert!(c.layers <= MAX_LAYERS, "{} layers", c.layers);
    assert!(c.moe.experts <= MAX_EXPERTS, "{} experts", c.moe.experts);
    assert!(c.max_positions <= MAX_POSITIONS);
    for (what, n) in [
        ("vocab", c.vocab),
        ("hidden", c.hidden),
        ("moe intermediate", c.moe.intermediate),
        (
            "shared intermediate",
            c.moe.shared.as_ref().map_or(0, |s| s.intermediate),
        ),
        ("latent", c.moe.latent.map_or(0, |l| l.dim)),
    ] {
        assert!(n <= MAX_SIZE, "{what} {n}");
    }
    for p in &c.layer_plan {
        if let MlpKind::Dense { intermediate } = p.mlp {
            assert!(intermediate <= MAX_SIZE);
        }
        // Every kind's widest product is bounded (the config's size check).
        let (a, b, _, what) = p.attention.widest();
        assert!(
            a.checked_mul(b).is_some_and(|w| w <= MAX_SIZE),
            "{what}: {a} × {b}"
        );
        let _ = (
            p.attention.kv_floats(),
            p.attention.recurrent_floats(),
            p.attention.scratch_floats(),
        ); // cannot overflow within the limits
        match &p.attention {
            // The rotary part must be even only when it is rotated (Kimi's MLA is NoPE).
            AttentionConfig::Mla(m) => {
                assert!(m.kv_lora_rank <= MAX_SIZE && m.q_lora_rank.unwrap_or(0) <= MAX_SIZE);
                assert!(m.heads > 0 && (!m.rope || m.qk_rope_head_dim % 2 == 0));
                assert!(m.softmax_scale.is_finite() && m.softmax_scale > 0.0);
            }
            AttentionConfig::Gqa(g) => {
                assert!(g.kv_heads > 0 && g.heads % g.kv_heads == 0 && g.head_dim % 2 == 0);
                assert!(g.window != Some(0));
                assert!(g.softmax_scale.is_finite() && g.softmax_scale > 0.0);
            }
            AttentionConfig::Kda(k) => {
                assert!(k.conv_kernel <= MAX_SIZE);
                let _ = (k.state_len(), k.conv_len());
            }
        }
    }
    // Floats used as f32 are finite; epsilon and scaling factors positive.
    assert!(c.eps.is_finite() && c.eps > 0.0, "eps {}", c.eps);
    if let RouterKind::SigmoidGroup {
        routed_scaling_factor,
        ..
    } = c.moe.router
    {
        assert!(routed_scaling_factor.is_finite() && routed_scaling_factor > 0.0);
    }
    assert!(c.vocab > 0 && c.hidden > 0 && c.layers > 0);
    assert!(c.moe.top_k >= 1 && c.moe.top_k <= c.moe.experts);
    assert!(c.rope.theta > 0.0 && c.rope.theta.is_finite());
    if let Some(first) = c.layer_plan.iter().position(|p| p.mlp == MlpKind::Moe) {
        assert!(c.is_moe(first));
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, json)) = data.split_first() else {
        return;
    };
    if sel & 0x80 != 0 {
        let Ok(overrides) = Vec::<Override>::arbitrary_take_rest(Unstructured::new(json)) else {
            return;
        };
        let mut v = bases()[sel as usize % BASES.len()].clone();
        for o in overrides.iter().take(8) {
            match o {
                Override::Size(f, s) => set(
                    &mut v,
                    SIZE_FIELDS[*f as usize % SIZE_FIELDS.len()],
                    s.json(),
                ),
                Override::Float(f, x) => set(
                    &mut v,
                    FLOAT_FIELDS[*f as usize % FLOAT_FIELDS.len()],
                    x.json(),
                ),
            }
        }
        check(&v);
        return;
    }
    let Ok(v) = serde_json::from_slice::<Value>(json) else {
        return;
    };
    check(&v);
    if let Value::Object(over) = &v {
        check(&merge(&bases()[sel as usize % BASES.len()], over));
    }
});
