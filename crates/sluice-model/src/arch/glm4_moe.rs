//! GLM-4.5 / GLM-4.6 (`glm4_moe`): grouped-query attention rotating half of each head
//! (`partial_rotary_factor`, default 0.5) with q/k/v biases (`attention_bias`) and optional
//! per-head q/k norms (`use_qk_norm`); DeepSeek-V3's routing (sigmoid scores, a selection-only
//! `e_score_correction_bias`, group-limited top-k, renormalised and scaled); shared experts;
//! the first `first_k_dense_replace` layers dense; MTP layers (`num_mtp_layers`, hub configs'
//! `num_nextn_predict_layers`) may follow the last layer in the checkpoint: DeepSeek-V3's kind,
//! run by `--draft mtp` ([`crate::config::MtpHead::Trailing`]).

use super::common::{Base, check_groups, gqa_rope_partial, top_k, uniform_plan};
use super::{Family, Models};
use crate::ModelError;
use crate::config::{
    AttentionConfig, Cfg, MlpKind, ModelConfig, MoeConfig, MtpConfig, QkNorm, RouterKind,
    TensorNames,
};

pub(super) const FAMILY: Family = Family {
    name: "glm4_moe",
    models: &[Models {
        model_types: &["glm4_moe"],
        names: "GLM-4.5, GLM-4.6",
        features: "grouped-query attention rotating half of each head, DeepSeek routing, shared experts; the MTP layer after the last drafts with `--draft mtp`",
    }],
    read,
    gguf: &[],
};

fn read(c: &Cfg<'_>, model_type: &str) -> Result<ModelConfig, ModelError> {
    let base = Base::read(c, false)?;
    // transformers defaults: partial_rotary_factor 0.5, attention_bias and use_qk_norm false.
    let (mut gqa, rope) = gqa_rope_partial(c, &base, false, 0.5)?;
    gqa.qkv_bias = c.bool_or("attention_bias", false)?;
    if c.bool_or("use_qk_norm", false)? {
        gqa.qk_norm = QkNorm::PerHead;
    }

    let experts = c.pos_usize("n_routed_experts")?;
    let intermediate = c.pos_usize("moe_intermediate_size")?;
    let top_k = top_k(c, experts)?;
    // transformers defaults: n_group = topk_group = 1, norm_topk_prob true, scaling 1.0,
    // one shared expert, the first layer dense.
    let n_group = c.opt_usize("n_group")?.unwrap_or(1);
    let topk_group = c.opt_usize("topk_group")?.unwrap_or(1);
    if n_group == 0 {
        return Err(c.err("n_group", "must be positive"));
    }
    if topk_group == 0 {
        return Err(c.err("topk_group", "must be positive"));
    }
    check_groups(c, experts, top_k, n_group, topk_group)?;
    let scaling = c.opt_f32("routed_scaling_factor")?.unwrap_or(1.0);
    if scaling <= 0.0 || !scaling.is_finite() {
        return Err(c.err("routed_scaling_factor", "must be positive"));
    }
    let router = RouterKind::SigmoidGroup {
        n_group,
        topk_group,
        norm_topk_prob: c.bool_or("norm_topk_prob", true)?,
        routed_scaling_factor: scaling,
    };
    let n_shared = c.opt_usize("n_shared_experts")?.unwrap_or(1);
    let shared = super::common::shared_experts(c, n_shared, intermediate)?;
    let first_dense = c.opt_usize("first_k_dense_replace")?.unwrap_or(1);
    let dense = if first_dense > 0 {
        c.pos_usize("intermediate_size")?
    } else {
        0
    };
    let mlp = (0..base.layers).map(|l| MlpKind::moe_or_dense(l >= first_dense, dense));
    let layer_plan = uniform_plan(&AttentionConfig::Gqa(gqa), mlp);
    let moe = MoeConfig {
        shared,
        ..MoeConfig::routed(experts, top_k, intermediate, router)
    };
    let names = TensorNames {
        router_bias: Some("gate.e_score_correction_bias"),
        ..TensorNames::standard()
    };
    let draft = c.opt_usize("num_mtp_layers")?;
    let mut cfg = base.finish(c, FAMILY.name, model_type, rope, layer_plan, moe, names)?;
    if let Some(d) = draft {
        cfg.draft_layers = d;
    }
    // The multi-token-prediction layers after the last.
    cfg.mtp = MtpConfig::trailing(&cfg);
    Ok(cfg)
}
