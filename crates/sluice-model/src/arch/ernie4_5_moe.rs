//! ERNIE 4.5 MoE (`ernie4_5_moe`): grouped-query attention with interleaved rotary pairs and
//! optional biases everywhere (`use_bias`, refused: none of the released models has them);
//! softmax routing whose top-k is taken over the probabilities plus a selection-only bias
//! (`mlp.moe_statics.e_score_correction_bias`, `[1, experts]`), the chosen probabilities
//! renormalised with the divisor clamped at `moe_norm_min`; shared experts; MoE layers from
//! `moe_layer_start_index` to `moe_layer_end_index` every `moe_layer_interval`, the others
//! dense; embeddings tied by default.

use super::common::{Base, gqa_rope, uniform_plan};
use super::{Family, Models};
use crate::ModelError;
use crate::config::{
    AttentionConfig, Cfg, MlpKind, ModelConfig, MoeConfig, RouterKind, SharedExpert, TensorNames,
    shared_width,
};

pub(super) const FAMILY: Family = Family {
    name: "ernie4_5_moe",
    models: &[Models {
        model_types: &["ernie4_5_moe"],
        names: "ERNIE 4.5 MoE",
        features: "interleaved rotary pairs, softmax routing with a selection bias, MoE layers by start/end/interval, tied embeddings",
    }],
    read,
    gguf: &[],
};

fn read(c: &Cfg<'_>, model_type: &str) -> Result<ModelConfig, ModelError> {
    let mut base = Base::read(c, false)?;
    // transformers default: tie_word_embeddings = true for this family.
    base.tie_embeddings = c.bool_or("tie_word_embeddings", true)?;
    let (gqa, mut rope) = gqa_rope(c, &base, false)?;
    // ERNIE rotates adjacent pairs (`rotate_half` over x[0::2], x[1::2]).
    rope.interleaved = true;
    if c.bool_or("use_bias", false)? {
        return Err(c.err("use_bias", "biases in the linear layers are not supported"));
    }

    // transformers maps num_experts / num_experts_per_tok to these.
    let experts = c.pos_usize("moe_num_experts")?;
    let top_k = {
        let k = c.pos_usize("moe_k")?;
        if k > experts {
            return Err(c.err("moe_k", format!("{k} is more than the {experts} experts")));
        }
        k
    };
    let intermediate = c.pos_usize("moe_intermediate_size")?;
    // transformers defaults: 2 shared experts, MoE layers 1..=last every 1, norm_min 1e-12.
    let n_shared = c.opt_usize("moe_num_shared_experts")?.unwrap_or(2);
    let shared = (n_shared > 0)
        .then(|| shared_width(c, "moe_num_shared_experts", n_shared, intermediate))
        .transpose()?
        .map(|intermediate| SharedExpert {
            intermediate,
            gated: false,
        });
    let start = c.opt_usize("moe_layer_start_index")?.unwrap_or(1);
    let end = match c.get("moe_layer_end_index") {
        None => base.layers - 1,
        Some(v) => match v.as_i64() {
            Some(-1) => base.layers - 1,
            Some(e) if e >= 0 => e as usize,
            _ => {
                return Err(c.err(
                    "moe_layer_end_index",
                    format!("expected a layer index or -1, got {v}"),
                ));
            }
        },
    };
    let interval = c.opt_usize("moe_layer_interval")?.unwrap_or(1);
    if interval == 0 {
        return Err(c.err("moe_layer_interval", "must be positive"));
    }
    let norm_min = c.opt_f32("moe_norm_min")?.unwrap_or(1e-12);
    if !(norm_min > 0.0 && norm_min.is_finite()) {
        return Err(c.err("moe_norm_min", "must be positive"));
    }
    let is_moe = |l: usize| (l + 1).is_multiple_of(interval) && l >= start && l <= end;
    let dense = if (0..base.layers).all(is_moe) {
        0
    } else {
        c.pos_usize("intermediate_size")?
    };
    let mlp = (0..base.layers).map(|l| MlpKind::moe_or_dense(is_moe(l), dense));
    let layer_plan = uniform_plan(&AttentionConfig::Gqa(gqa), mlp);
    let moe = MoeConfig {
        shared,
        ..MoeConfig::routed(
            experts,
            top_k,
            intermediate,
            RouterKind::SoftmaxBiased { norm_min },
        )
    };
    let names = TensorNames {
        router_bias: Some("moe_statics.e_score_correction_bias"),
        ..TensorNames::standard()
    };
    base.finish(c, FAMILY.name, model_type, rope, layer_plan, moe, names)
}

/// The config reader's tests.
#[cfg(test)]
mod tests {
    use crate::config::test_util::*;

    #[test]
    fn ernie_moe_layers_follow_start_end_and_interval() {
        let mut v = json!({
            "model_type": "ernie4_5_moe", "vocab_size": 512, "hidden_size": 64,
            "num_hidden_layers": 6, "rms_norm_eps": 1e-5, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 256, "hidden_act": "silu",
            "intermediate_size": 128, "moe_intermediate_size": 32, "moe_num_experts": 8,
            "moe_k": 2, "moe_layer_start_index": 1, "moe_layer_end_index": -1,
            "moe_layer_interval": 2, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}
        });
        let c = parse(&v).unwrap();
        let moe: Vec<bool> = (0..6).map(|l| c.is_moe(l)).collect();
        assert_eq!(moe, [false, true, false, true, false, true]);
        assert!(c.tie_embeddings, "ERNIE ties embeddings by default");
        assert!(c.rope.interleaved);
        assert_eq!(c.moe.router, RouterKind::SoftmaxBiased { norm_min: 1e-12 });
        assert_eq!(c.moe.shared.as_ref().map(|s| s.intermediate), Some(64));
        v["moe_layer_end_index"] = json!(3);
        let c = parse(&v).unwrap();
        assert_eq!(c.moe_layers(), 2);
        for (field, bad) in [
            ("moe_layer_end_index", json!(-2)),
            ("moe_layer_interval", json!(0)),
            ("moe_k", json!(9)),
            ("use_bias", json!(true)),
            ("moe_norm_min", json!(0.0)),
        ] {
            let mut w = v.clone();
            w[field] = bad;
            assert_eq!(field_of(parse(&w).unwrap_err()), field);
        }
    }
}
