//! OLMoE (`olmoe`): grouped-query attention with a query/key RMSNorm over the whole projection
//! and an optional clamp of q, k, v (`clip_qkv`), softmax routing.

use super::common::{Base, all_moe, gqa_rope, softmax_router, top_k, uniform_plan};
use super::{Family, Models};
use crate::ModelError;
use crate::config::{AttentionConfig, Cfg, ModelConfig, MoeConfig, QkNorm, TensorNames};

pub(super) const FAMILY: Family = Family {
    name: "olmoe",
    models: &[Models {
        model_types: &["olmoe"],
        names: "OLMoE",
        features: "q/k norms over the projection, `clip_qkv`",
    }],
    read,
    gguf: &[],
};

fn read(c: &Cfg<'_>, model_type: &str) -> Result<ModelConfig, ModelError> {
    let base = Base::read(c, false)?;
    let (mut gqa, rope) = gqa_rope(c, &base, false)?;
    // transformers default: attention_bias = false.
    let b = c.bool_or("attention_bias", false)?;
    (gqa.qkv_bias, gqa.o_bias) = (b, b);
    gqa.qk_norm = QkNorm::Full;
    gqa.clip_qkv = c.opt_f32("clip_qkv")?;
    let experts = c.pos_usize("num_experts")?;
    let intermediate = c.pos_usize("intermediate_size")?;
    let moe = MoeConfig::routed(
        experts,
        top_k(c, experts)?,
        intermediate,
        // transformers default: norm_topk_prob = false.
        softmax_router(c, false)?,
    );
    let layer_plan = uniform_plan(&AttentionConfig::Gqa(gqa), all_moe(base.layers));
    base.finish(
        c,
        FAMILY.name,
        model_type,
        rope,
        layer_plan,
        moe,
        TensorNames::standard(),
    )
}
