//! MiniMax-M2 (`minimax_m2`): grouped-query attention with q/k RMSNorms over the whole
//! projection and partial rotary (`rotary_dim` in released configs, `partial_rotary_factor` in
//! transformers'); every layer a mixture of experts under `block_sparse_moe` (experts
//! `w1/w3/w2`) routed by sigmoid scores with a selection-only `e_score_correction_bias`, the
//! top-k weights renormalised — DeepSeek's routing with one group and no scaling.

use super::common::{Base, all_moe, check_groups, gqa_rope_partial, top_k, uniform_plan};
use super::{Family, Models};
use crate::ModelError;
use crate::config::{
    AttentionConfig, Cfg, ExpertNames, ModelConfig, MoeConfig, QkNorm, RouterKind, TensorNames,
};

pub(super) const FAMILY: Family = Family {
    name: "minimax_m2",
    models: &[Models {
        model_types: &["minimax_m2"],
        names: "MiniMax-M2",
        features: "q/k norms over the whole projection, partial rotary (`rotary_dim`), sigmoid routing with a bias; its FP8 release",
    }],
    read,
    gguf: &[],
};

fn read(c: &Cfg<'_>, model_type: &str) -> Result<ModelConfig, ModelError> {
    let base = Base::read(c, false)?;
    // Released configs say `rotary_dim` (of `head_dim`); transformers turns it into
    // `partial_rotary_factor` when that is absent.
    let head_dim = c.pos_usize("head_dim")?;
    let partial = match c.opt_usize("rotary_dim")? {
        Some(r) if r == 0 || r > head_dim => {
            return Err(c.err(
                "rotary_dim",
                format!("{r} is not in 1..=head_dim {head_dim}"),
            ));
        }
        Some(r) => r as f64 / head_dim as f64,
        None => 1.0,
    };
    let (mut gqa, rope) = gqa_rope_partial(c, &base, true, partial)?;
    if c.bool_or("use_qk_norm", true)? {
        gqa.qk_norm = QkNorm::Full;
    } else {
        return Err(c.err(
            "use_qk_norm",
            "false is not supported (transformers always norms q and k)",
        ));
    }
    if let Some(t) = c.get("qk_norm_type")
        && t.as_str() != Some("per_layer")
    {
        return Err(c.err("qk_norm_type", format!("{t} is not supported (per_layer)")));
    }
    if let Some(s) = c.get("scoring_func")
        && s.as_str() != Some("sigmoid")
    {
        return Err(c.err("scoring_func", format!("{s} is not supported (sigmoid)")));
    }
    let experts = c.pos_usize("num_local_experts")?;
    let intermediate = c.pos_usize("intermediate_size")?;
    let top_k = top_k(c, experts)?;
    check_groups(c, experts, top_k, 1, 1)?;
    let moe = MoeConfig::routed(
        experts,
        top_k,
        intermediate,
        RouterKind::SigmoidGroup {
            n_group: 1,
            topk_group: 1,
            norm_topk_prob: true,
            routed_scaling_factor: 1.0,
        },
    );
    let layer_plan = uniform_plan(&AttentionConfig::Gqa(gqa), all_moe(base.layers));
    let names = TensorNames {
        moe: "block_sparse_moe",
        router_bias: Some("e_score_correction_bias"),
        experts: ExpertNames::Separate {
            gate: "w1",
            up: "w3",
            down: "w2",
        },
        ..TensorNames::standard()
    };
    base.finish(c, FAMILY.name, model_type, rope, layer_plan, moe, names)
}
