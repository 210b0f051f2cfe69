//! Llama and Mistral (`llama`, `mistral`): dense transformers of grouped-query attention and a
//! SwiGLU MLP in every layer — Llama with optional attention biases (`attention_bias`) and
//! Llama 3's rope scaling, Mistral with a sliding window on every layer (`sliding_window`).
//! No layer has experts: the whole model is trunk, tiered like any trunk when it does not fit.

use super::common::{Base, check_window, gqa_rope, uniform_plan};
use super::{Family, Models};
use crate::ModelError;
use crate::config::{AttentionConfig, Cfg, MlpKind, ModelConfig, MoeConfig, TensorNames};
use crate::gguf::{GgufArch, GgufNames, Meta};
use serde_json::{Value as Json, json};

pub(super) const FAMILY: Family = Family {
    name: "llama",
    models: &[Models {
        model_types: &["llama", "mistral"],
        names: "Llama 2/3 (Llama 3 rope scaling), Mistral, SmolLM2",
        features: "dense",
    }],
    read,
    gguf: &[GgufArch {
        name: "llama",
        with_experts: Some(false),
        permuted_qk: true,
        names: GgufNames::STANDARD,
        config: gguf_config,
    }],
};

fn read(c: &Cfg<'_>, model_type: &str) -> Result<ModelConfig, ModelError> {
    let base = Base::read(c, false)?;
    let (mut gqa, rope) = gqa_rope(c, &base, false)?;
    if model_type == "llama" {
        // transformers defaults: attention_bias = mlp_bias = false.
        let b = c.bool_or("attention_bias", false)?;
        (gqa.qkv_bias, gqa.o_bias) = (b, b);
        if c.bool_or("mlp_bias", false)? {
            return Err(c.err("mlp_bias", "biases in the MLP are not supported"));
        }
    } else {
        // Mistral: every layer slides when `sliding_window` is set (transformers ignores
        // `layer_types` for this model type).
        gqa.window = c.opt_usize("sliding_window")?;
        check_window(c, gqa.window)?;
    }
    let intermediate = c.pos_usize("intermediate_size")?;
    let mlp = (0..base.layers).map(|_| MlpKind::Dense { intermediate });
    let layer_plan = uniform_plan(&AttentionConfig::Gqa(gqa), mlp);
    base.finish(
        c,
        FAMILY.name,
        model_type,
        rope,
        layer_plan,
        MoeConfig::none(),
        TensorNames::standard(),
    )
}

/// Llama's `config.json` from a GGUF `llama` file without experts.
fn gguf_config(m: &Meta<'_>) -> Result<Json, ModelError> {
    let mut c = m.gqa("llama", "LlamaForCausalLM")?;
    c.insert(
        "intermediate_size".into(),
        json!(m.need("feed_forward_length")?),
    );
    c.insert(
        "attention_bias".into(),
        json!(m.has_tensor("blk.0.attn_q.bias")),
    );
    m.finish(c)
}

/// The config reader's tests.
#[cfg(test)]
mod tests {
    use crate::config::test_util::*;

    #[test]
    fn llama3_rope_is_read_and_checked() {
        let mut v = dense("llama");
        v["rope_parameters"] = json!({
            "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192
        });
        let c = parse(&v).unwrap();
        assert_eq!(
            c.rope.scaling,
            RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192.0
            }
        );
        for (field, bad) in [
            ("high_freq_factor", json!(1.0)),
            ("factor", json!(0.0)),
            ("original_max_position_embeddings", json!(-1.0)),
        ] {
            let mut w = v.clone();
            w["rope_parameters"][field] = bad;
            assert_eq!(
                field_of(parse(&w).unwrap_err()),
                format!("rope_parameters.{field}")
            );
        }
        let mut w = v.clone();
        w["rope_parameters"]
            .as_object_mut()
            .unwrap()
            .remove("low_freq_factor");
        assert_eq!(
            field_of(parse(&w).unwrap_err()),
            "rope_parameters.low_freq_factor"
        );
    }
}
