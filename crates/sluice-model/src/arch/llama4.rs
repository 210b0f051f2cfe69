//! Llama 4's text model (`llama4_text`, and `llama4`, the multimodal checkpoint as released:
//! `text_config`, tensors under `language_model.`, the vision tower not read): grouped-query attention with interleaved rotary pairs
//! on most layers and none on every `no_rope_layer_interval`-th (NoPE layers, whose queries get
//! the attention temperature `log1p(⌊(p + 1) / floor_scale⌋) · attn_scale + 1`); on the rotated
//! layers, keys and queries divided by their root mean square after rotation (`use_qk_norm`)
//! and attention within chunks of `attention_chunk_size` positions; MoE layers (`moe_layers`,
//! by default every `interleave_moe_layer_step`-th) with a top-k router whose sigmoid weights
//! scale each expert's *input*, experts fused in the `x @ W` layout under `feed_forward`, and a
//! shared expert; the other layers a dense MLP of `intermediate_size_mlp`.

use serde_json::Value;

use super::common::{Base, gqa_rope, text_config, top_k};
use super::{Family, Models};
use crate::ModelError;
use crate::config::{
    AttentionConfig, Cfg, ExpertNames, LayerPlan, MlpKind, ModelConfig, MoeConfig, RouterKind,
    SharedExpert, TensorNames,
};

pub(super) const FAMILY: Family = Family {
    name: "llama4",
    models: &[Models {
        model_types: &["llama4", "llama4_text"],
        names: "Llama 4 Scout / Maverick (text model; the multimodal checkpoint's vision tower not read)",
        features: "chunked attention, NoPE layers with attention temperature, top-1 experts whose weight scales their input, experts fused `x @ W`",
    }],
    read,
    gguf: &[],
};

fn read(top: &Cfg<'_>, model_type: &str) -> Result<ModelConfig, ModelError> {
    // The released checkpoints are multimodal (`llama4`): the text model's config is
    // `text_config` and its tensors are under `language_model.` (the vision tower and the
    // projector are not read).
    let multimodal = model_type == "llama4";
    let text;
    let (c, base) = if multimodal {
        text = text_config(top, "llama4_text")?;
        (&text, Base::read_multimodal(top, &text)?)
    } else {
        (top, Base::read(top, false)?)
    };
    let (mut gqa, mut rope) = gqa_rope(c, &base, false)?;
    // Llama 4 rotates adjacent pairs (complex multiplication of (x0, x1), (x2, x3), ...).
    rope.interleaved = true;
    let b = c.bool_or("attention_bias", false)?;
    (gqa.qkv_bias, gqa.o_bias) = (b, b);
    let layers = base.layers;

    // transformers defaults: every 4th layer NoPE; rotated layers chunked when a chunk size is
    // given (default 8192); q/k norm and temperature tuning on; floor_scale 8192, attn_scale 0.1.
    let uses_rope = match flags(c, "no_rope_layers", layers)? {
        Some(v) => v,
        None => {
            let every = c.opt_usize("no_rope_layer_interval")?.unwrap_or(4);
            if every == 0 {
                return Err(c.err("no_rope_layer_interval", "must be positive"));
            }
            (0..layers)
                .map(|l| !(l + 1).is_multiple_of(every))
                .collect()
        }
    };
    // An explicit null turns chunking off (`get` treats null as absent, so look at the value).
    let chunk_size = match c.v.get("attention_chunk_size") {
        Some(Value::Null) => None,
        None => Some(8192),
        Some(_) => Some(c.pos_usize("attention_chunk_size")?),
    };
    let chunked: Vec<bool> = match c.get("layer_types") {
        None | Some(Value::Null) => (0..layers)
            .map(|l| uses_rope[l] && chunk_size.is_some())
            .collect(),
        Some(Value::Array(a)) if a.len() == layers => a
            .iter()
            .map(|x| match x.as_str() {
                Some("chunked_attention") if chunk_size.is_some() => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(c.err(
                    "layer_types",
                    format!(
                        "`{x}` is not supported (supported: chunked_attention with \
                         attention_chunk_size, full_attention)"
                    ),
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(c.err("layer_types", format!("expected {layers} layer types"))),
    };
    let qk_norm = c.bool_or("use_qk_norm", true)?;
    let temperature = if c.bool_or("attn_temperature_tuning", true)? {
        let floor = c.opt_f32("floor_scale")?.unwrap_or(8192.0);
        if floor <= 0.0 || !floor.is_finite() {
            return Err(c.err("floor_scale", "must be positive"));
        }
        Some((floor, c.opt_f32("attn_scale")?.unwrap_or(0.1)))
    } else {
        None
    };

    let experts = c.pos_usize("num_local_experts")?;
    let intermediate = c.pos_usize("intermediate_size")?;
    let moe_layers: Vec<usize> = match c.get("moe_layers") {
        None | Some(Value::Null) => {
            let step = c.opt_usize("interleave_moe_layer_step")?.unwrap_or(1);
            if step == 0 {
                return Err(c.err("interleave_moe_layer_step", "must be positive"));
            }
            (step - 1..layers).step_by(step).collect()
        }
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_u64()
                    .map(|n| n as usize)
                    .filter(|&n| n < layers)
                    .ok_or_else(|| c.err("moe_layers", format!("`{x}` is not a layer index")))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(c.err("moe_layers", "expected a list of layer indices")),
    };
    let dense = if moe_layers.len() < layers {
        c.pos_usize("intermediate_size_mlp")?
    } else {
        0
    };
    let moe = MoeConfig {
        shared: Some(SharedExpert {
            intermediate,
            gated: false,
        }),
        weight_on_input: true,
        ..MoeConfig::routed(
            experts,
            top_k(c, experts)?,
            intermediate,
            RouterKind::TopKSigmoid,
        )
    };
    let layer_plan = (0..layers)
        .map(|l| {
            let mut g = gqa.clone();
            g.nope = !uses_rope[l];
            g.rms_qk_after_rope = qk_norm && uses_rope[l];
            g.temperature = temperature.filter(|_| !uses_rope[l]);
            g.chunk = chunk_size.filter(|_| chunked[l]);
            LayerPlan::new(
                AttentionConfig::Gqa(g),
                MlpKind::moe_or_dense(moe_layers.contains(&l), dense),
            )
        })
        .collect();
    let names = TensorNames {
        prefix: if multimodal {
            "language_model.".into()
        } else {
            String::new()
        },
        moe: "feed_forward",
        dense: &["feed_forward"],
        router: "router",
        shared: "shared_expert",
        experts: ExpertNames::FusedXw,
        ..TensorNames::standard()
    };
    base.finish(c, FAMILY.name, model_type, rope, layer_plan, moe, names)
}

/// A list of `layers` 0/1 flags (`no_rope_layers`: 1 where the layer is rotated), if present.
fn flags(c: &Cfg<'_>, field: &str, layers: usize) -> Result<Option<Vec<bool>>, ModelError> {
    match c.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) if a.is_empty() => Ok(None),
        Some(Value::Array(a)) if a.len() == layers => a
            .iter()
            .map(|x| match x.as_u64() {
                Some(0) => Ok(false),
                Some(1) => Ok(true),
                _ => Err(c.err(field, format!("`{x}` is not 0 or 1"))),
            })
            .collect::<Result<_, _>>()
            .map(Some),
        Some(_) => Err(c.err(field, format!("expected {layers} flags of 0 or 1"))),
    }
}

/// The config reader's tests.
#[cfg(test)]
mod tests {
    use crate::config::test_util::*;

    #[test]
    fn llama4_layers_follow_transformers_defaults() {
        let v = json!({
            "model_type": "llama4_text", "vocab_size": 512, "hidden_size": 64,
            "num_hidden_layers": 8, "rms_norm_eps": 1e-5, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256,
            "hidden_act": "silu", "intermediate_size": 32, "intermediate_size_mlp": 96,
            "num_local_experts": 8, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}
        });
        let c = parse(&v).unwrap();
        // Every 4th layer NoPE (with the temperature), the others rotated, normed and chunked.
        for l in 0..8 {
            let g = gqa(&c, l);
            let nope = (l + 1) % 4 == 0;
            assert_eq!(g.nope, nope, "layer {l}");
            assert_eq!(g.rms_qk_after_rope, !nope, "layer {l}");
            assert_eq!(g.chunk, (!nope).then_some(8192), "layer {l}");
            assert_eq!(g.temperature, nope.then_some((8192.0, 0.1)), "layer {l}");
        }
        assert!(c.rope.interleaved);
        let moe: Vec<usize> = (0..8).filter(|&l| c.is_moe(l)).collect();
        assert_eq!(moe, [1, 3, 5, 7]);
        assert!(c.moe.weight_on_input);
        assert_eq!(c.moe.router, RouterKind::TopKSigmoid);
        assert_eq!(c.layer_plan[0].mlp, MlpKind::Dense { intermediate: 96 });
        for (field, bad) in [
            ("no_rope_layers", json!([1, 0, 2, 1, 1, 1, 1, 1])),
            ("moe_layers", json!([9])),
            ("interleave_moe_layer_step", json!(0)),
            ("floor_scale", json!(0)),
        ] {
            let mut w = v.clone();
            w[field] = bad;
            assert_eq!(field_of(parse(&w).unwrap_err()), field);
        }
        let mut w = v.clone();
        w["attention_chunk_size"] = json!(null);
        let c = parse(&w).unwrap();
        assert!((0..8).all(|l| gqa(&c, l).chunk.is_none()));
        // The released multimodal checkpoint: `text_config`, tensors under `language_model.`.
        let mm = json!({"model_type": "llama4", "text_config": v, "vision_config": {}});
        let c = parse(&mm).unwrap();
        assert_eq!(
            (c.names.prefix.as_str(), c.names.model),
            ("language_model.", "model.")
        );
        let mut bad = mm;
        bad["text_config"]["model_type"] = json!("llama");
        assert_eq!(field_of(parse(&bad).unwrap_err()), "text_config.model_type");
    }
}
