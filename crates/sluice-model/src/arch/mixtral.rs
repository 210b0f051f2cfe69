//! Mixtral (`mixtral`): grouped-query attention with an optional sliding window on every
//! layer, softmax routing always renormalised, experts `block_sparse_moe.experts.{e}.w1/w3/w2`.

use super::common::{Base, all_moe, check_window, gqa_rope, top_k, uniform_plan};
use super::{Family, Models};
use crate::ModelError;
use crate::config::{
    AttentionConfig, Cfg, ExpertNames, ModelConfig, MoeConfig, RouterKind, TensorNames,
};
use crate::gguf::{GgufArch, GgufNames, Meta};
use serde_json::{Value as Json, json};

pub(super) const FAMILY: Family = Family {
    name: "mixtral",
    models: &[Models {
        model_types: &["mixtral"],
        names: "Mixtral",
        features: "sliding window, renormalised softmax routing",
    }],
    read,
    gguf: &[GgufArch {
        name: "llama",
        with_experts: Some(true),
        permuted_qk: true,
        names: GgufNames {
            moe: "block_sparse_moe",
            experts: ["w1", "w3", "w2"],
            per_expert_tensors: true,
            ..GgufNames::STANDARD
        },
        config: gguf_config,
    }],
};

fn read(c: &Cfg<'_>, model_type: &str) -> Result<ModelConfig, ModelError> {
    let base = Base::read(c, false)?;
    let (mut gqa, rope) = gqa_rope(c, &base, false)?;
    gqa.window = c.opt_usize("sliding_window")?;
    check_window(c, gqa.window)?;
    let experts = c.pos_usize("num_local_experts")?;
    let intermediate = c.pos_usize("intermediate_size")?;
    let moe = MoeConfig::routed(
        experts,
        top_k(c, experts)?,
        intermediate,
        // Mixtral always renormalises.
        RouterKind::Softmax {
            norm_topk_prob: true,
        },
    );
    let layer_plan = uniform_plan(&AttentionConfig::Gqa(gqa), all_moe(base.layers));
    let names = TensorNames {
        moe: "block_sparse_moe",
        experts: ExpertNames::Separate {
            gate: "w1",
            up: "w3",
            down: "w2",
        },
        ..TensorNames::standard()
    };
    base.finish(c, FAMILY.name, model_type, rope, layer_plan, moe, names)
}

/// Mixtral's `config.json` from a GGUF `llama` file with experts.
fn gguf_config(m: &Meta<'_>) -> Result<Json, ModelError> {
    let mut c = m.gqa("mixtral", "MixtralForCausalLM")?;
    c.insert(
        "intermediate_size".into(),
        json!(m.need("feed_forward_length")?),
    );
    c.insert("num_local_experts".into(), json!(m.pos("expert_count")?));
    c.insert(
        "num_experts_per_tok".into(),
        json!(m.pos("expert_used_count")?),
    );
    m.finish(c)
}
