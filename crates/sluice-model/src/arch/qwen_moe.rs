//! Qwen3-MoE and Qwen2-MoE / Qwen1.5-MoE (`qwen3_moe`, `qwen2_moe`): grouped-query attention
//! (Qwen3 with a per-head query/key norm, Qwen2 with q/k/v biases), softmax routing, Qwen2's
//! sigmoid-gated shared expert, and dense layers by `decoder_sparse_step` / `mlp_only_layers`.

use serde_json::Value;

use super::Family;
use super::common::{Base, gqa_rope, softmax_router, top_k, uniform_plan};
use crate::ModelError;
use crate::config::{
    AttentionConfig, Cfg, ExpertActivation, MlpKind, ModelConfig, MoeConfig, QkNorm, SharedExpert,
    TensorNames,
};

pub(super) const FAMILY: Family = Family {
    name: "qwen_moe",
    model_types: &["qwen3_moe", "qwen2_moe"],
    read,
};

fn read(c: &Cfg<'_>, model_type: &str) -> Result<ModelConfig, ModelError> {
    let qwen3 = model_type == "qwen3_moe";
    let base = Base::read(c, false)?;
    let (mut gqa, rope) = gqa_rope(c, &base, qwen3)?;
    if qwen3 {
        // transformers default: attention_bias = false.
        let b = c.bool_or("attention_bias", false)?;
        (gqa.qkv_bias, gqa.o_bias) = (b, b);
        gqa.qk_norm = QkNorm::PerHead;
    } else {
        // transformers default: qkv_bias = true.
        gqa.qkv_bias = c.bool_or("qkv_bias", true)?;
    }
    if c.bool_or("use_sliding_window", false)? {
        return Err(c.err(
            "use_sliding_window",
            "sliding-window layers are not supported for this architecture",
        ));
    }

    // Hub configs say `num_experts`; transformers 5 writes `num_local_experts` for Qwen3.
    let experts = if c.get("num_experts").is_some() {
        c.pos_usize("num_experts")?
    } else {
        c.pos_usize("num_local_experts")?
    };
    let intermediate = c.pos_usize("moe_intermediate_size")?;
    let top_k = top_k(c, experts)?;
    // transformers default: norm_topk_prob = true (Qwen3), false (Qwen2).
    let router = softmax_router(c, qwen3)?;
    let shared = if qwen3 {
        None
    } else {
        let n = c.usize("shared_expert_intermediate_size")?;
        (n > 0).then_some(SharedExpert {
            intermediate: n,
            gated: true,
        })
    };
    let step = match c.opt_usize("decoder_sparse_step")? {
        Some(0) => return Err(c.err("decoder_sparse_step", "must be positive")),
        Some(s) => s,
        None => 1, // transformers default
    };
    let only: Vec<usize> = match c.get("mlp_only_layers") {
        None => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_u64()
                    .map(|n| n as usize)
                    .ok_or_else(|| c.err("mlp_only_layers", "expected layer indices"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(c.err("mlp_only_layers", "expected a list of layer indices")),
    };
    let dense = if only.is_empty() && step == 1 {
        0
    } else {
        c.pos_usize("intermediate_size")?
    };
    let mlp = (0..base.layers).map(|l| {
        if !only.contains(&l) && (l + 1).is_multiple_of(step) {
            MlpKind::Moe
        } else {
            MlpKind::Dense {
                intermediate: dense,
            }
        }
    });
    let layer_plan = uniform_plan(&AttentionConfig::Gqa(gqa), mlp);
    let moe = MoeConfig {
        experts,
        top_k,
        intermediate,
        router,
        shared,
        activation: ExpertActivation::SwiGlu,
        latent: None,
    };
    let names = TensorNames {
        shared: "shared_expert",
        ..TensorNames::standard()
    };
    base.finish(c, FAMILY.name, model_type, rope, layer_plan, moe, names)
}
