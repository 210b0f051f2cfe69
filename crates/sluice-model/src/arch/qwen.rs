//! Qwen (`qwen3_moe`, `qwen2_moe`, and the dense `qwen3`, `qwen2`): grouped-query attention
//! (Qwen3 with a per-head query/key norm, Qwen2 with q/k/v biases); for the MoE models softmax
//! routing, Qwen2's sigmoid-gated shared expert, and dense layers by `decoder_sparse_step` /
//! `mlp_only_layers`; for the dense models an optional sliding window on the layers
//! `layer_types` names (by default those from `max_window_layers` on).

use super::common::{
    Base, check_window, gqa_rope, layer_list, read_layer_types, softmax_router, top_k, uniform_plan,
};
use super::{Family, Models};
use crate::ModelError;
use crate::config::{
    AttentionConfig, Cfg, GqaConfig, LayerPlan, MlpKind, ModelConfig, MoeConfig, QkNorm,
    SharedExpert, TensorNames,
};
use crate::gguf::{GgufArch, GgufNames, Meta};
use serde_json::{Value as Json, json};

pub(super) const FAMILY: Family = Family {
    name: "qwen",
    models: &[
        Models {
            model_types: &["qwen3_moe", "qwen2_moe"],
            names: "Qwen3-MoE, Qwen2/1.5-MoE",
            features: "per-head q/k norms (Qwen3), q/k/v biases and a sigmoid-gated shared expert (Qwen2)",
        },
        Models {
            model_types: &["qwen2", "qwen3"],
            names: "Qwen2/2.5, Qwen3 (dense)",
            features: "dense; sliding layers by `max_window_layers` / `layer_types`",
        },
    ],
    read,
    gguf: &[
        GgufArch {
            name: "qwen2",
            with_experts: None,
            permuted_qk: false,
            names: GgufNames::STANDARD,
            config: |m| dense_gguf(m, "qwen2", "Qwen2ForCausalLM"),
        },
        GgufArch {
            name: "qwen3",
            with_experts: None,
            permuted_qk: false,
            names: GgufNames::STANDARD,
            config: |m| dense_gguf(m, "qwen3", "Qwen3ForCausalLM"),
        },
        GgufArch {
            name: "qwen2moe",
            with_experts: None,
            permuted_qk: false,
            names: GgufNames::STANDARD,
            config: |m| moe_gguf(m, "qwen2_moe", "Qwen2MoeForCausalLM"),
        },
        GgufArch {
            name: "qwen3moe",
            with_experts: None,
            permuted_qk: false,
            names: GgufNames::STANDARD,
            config: |m| moe_gguf(m, "qwen3_moe", "Qwen3MoeForCausalLM"),
        },
    ],
};

fn read(c: &Cfg<'_>, model_type: &str) -> Result<ModelConfig, ModelError> {
    let qwen3 = model_type.starts_with("qwen3");
    let base = Base::read(c, false)?;
    let (mut gqa, rope) = gqa_rope(c, &base, qwen3)?;
    if qwen3 {
        // transformers default: attention_bias = false.
        let b = c.bool_or("attention_bias", false)?;
        (gqa.qkv_bias, gqa.o_bias) = (b, b);
        gqa.qk_norm = QkNorm::PerHead;
    } else if model_type == "qwen2_moe" {
        // transformers default: qkv_bias = true.
        gqa.qkv_bias = c.bool_or("qkv_bias", true)?;
    } else {
        // Qwen2: q, k and v always have biases, o never.
        gqa.qkv_bias = true;
    }
    if !model_type.ends_with("_moe") {
        return dense(c, model_type, base, gqa, rope);
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
    let only = layer_list(c, "mlp_only_layers")?;
    let dense = if only.is_empty() && step == 1 {
        0
    } else {
        c.pos_usize("intermediate_size")?
    };
    let mlp = (0..base.layers)
        .map(|l| MlpKind::moe_or_dense(!only.contains(&l) && (l + 1).is_multiple_of(step), dense));
    let layer_plan = uniform_plan(&AttentionConfig::Gqa(gqa), mlp);
    let moe = MoeConfig {
        shared,
        ..MoeConfig::routed(experts, top_k, intermediate, router)
    };
    let names = TensorNames {
        shared: "shared_expert",
        ..TensorNames::standard()
    };
    base.finish(c, FAMILY.name, model_type, rope, layer_plan, moe, names)
}

/// The dense models: every layer a SwiGLU MLP of `intermediate_size`; the window, when
/// `use_sliding_window`, on the layers `layer_types` says slide.
fn dense(
    c: &Cfg<'_>,
    model_type: &str,
    base: Base,
    gqa: GqaConfig,
    rope: crate::config::RopeConfig,
) -> Result<ModelConfig, ModelError> {
    // transformers: `sliding_window` counts only when `use_sliding_window` (default false);
    // `layer_types` defaults to sliding from `max_window_layers` (default 28) on.
    let window = if c.bool_or("use_sliding_window", false)? {
        let w = c.opt_usize("sliding_window")?;
        check_window(c, w)?;
        w
    } else {
        None
    };
    let from = c.opt_usize("max_window_layers")?.unwrap_or(28);
    let sliding = read_layer_types(c, base.layers, |l| window.is_some() && l >= from)?;
    let intermediate = c.pos_usize("intermediate_size")?;
    let layer_plan = sliding
        .iter()
        .map(|&slides| {
            let mut g = gqa.clone();
            g.window = window.filter(|_| slides);
            LayerPlan::new(AttentionConfig::Gqa(g), MlpKind::Dense { intermediate })
        })
        .collect();
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

/// A dense Qwen's `config.json` from a GGUF `qwen2` or `qwen3` file.
fn dense_gguf(m: &Meta<'_>, model_type: &str, class: &str) -> Result<Json, ModelError> {
    let mut c = m.gqa(model_type, class)?;
    c.insert(
        "intermediate_size".into(),
        json!(m.need("feed_forward_length")?),
    );
    m.finish(c)
}

/// Qwen MoE's `config.json` from a GGUF `qwen2moe` or `qwen3moe` file.
fn moe_gguf(m: &Meta<'_>, model_type: &str, class: &str) -> Result<Json, ModelError> {
    let mut c = m.gqa(model_type, class)?;
    c.insert("num_experts".into(), json!(m.pos("expert_count")?));
    c.insert(
        "num_experts_per_tok".into(),
        json!(m.pos("expert_used_count")?),
    );
    c.insert(
        "moe_intermediate_size".into(),
        json!(m.pos("expert_feed_forward_length")?),
    );
    // llama.cpp normalises the chosen weights for Qwen3's MoE and not for Qwen2's.
    let qwen3 = model_type == "qwen3_moe";
    c.insert("norm_topk_prob".into(), json!(qwen3));
    if let Some(ff) = m.opt_uint("feed_forward_length")? {
        c.insert("intermediate_size".into(), json!(ff));
    }
    if !qwen3 {
        let shared = m
            .opt_uint("expert_shared_feed_forward_length")?
            .unwrap_or(0);
        if shared == 0 && m.has_tensor("blk.0.ffn_up_shexp.weight") {
            return Err(m.err(
                "expert_shared_feed_forward_length",
                "missing, but the layers have a shared expert",
            ));
        }
        c.insert("shared_expert_intermediate_size".into(), json!(shared));
    }
    m.finish(c)
}
