//! DeepSeek-V3 and Kimi K2 / K2.5 (`deepseek_v3`, `kimi_k2`): multi-head latent attention with
//! YaRN, sigmoid group routing (`noaux_tc`) with a selection-only bias, shared experts, the
//! first `first_k_dense_replace` layers dense.

use super::common::{Base, check_groups, mla_softmax_scale, top_k};
use super::{Family, Models};
use crate::ModelError;
use crate::config::{
    AttentionConfig, Cfg, LayerPlan, MlaConfig, MlpKind, ModelConfig, MoeConfig, MtpConfig,
    RouterKind, TensorNames, read_rope,
};
use crate::gguf::{GgufArch, GgufNames, Meta};
use serde_json::{Value as Json, json};

pub(super) const FAMILY: Family = Family {
    name: "deepseek_v3",
    models: &[Models {
        model_types: &["deepseek_v3", "kimi_k2"],
        names: "DeepSeek-V3/R1, Kimi K2 / K2.5",
        features: "multi-head latent attention on the compressed cache, YaRN, sigmoid group routing with a selection bias, shared experts; FP8 and INT4 releases; the MTP layer after the last (`num_nextn_predict_layers`) drafts with `--draft mtp`",
    }],
    read,
    gguf: &[GgufArch {
        name: "deepseek2",
        with_experts: None,
        permuted_qk: false,
        names: GgufNames {
            shared: "shared_experts",
            ..GgufNames::STANDARD
        },
        config: gguf_config,
    }],
};

fn read(c: &Cfg<'_>, model_type: &str) -> Result<ModelConfig, ModelError> {
    let mut cfg = read_as(c, model_type, FAMILY.name)?.cfg;
    // The multi-token-prediction layers (`num_nextn_predict_layers`) after the last.
    cfg.mtp = MtpConfig::trailing(&cfg);
    Ok(cfg)
}

/// What DeepSeek-V3's reader read, for the families built on it: the description, the
/// attention every layer has in it and the grouped router's fields.
pub(super) struct V3 {
    pub(super) cfg: ModelConfig,
    /// Every layer's attention (`AttentionConfig::Mla`).
    pub(super) mla: MlaConfig,
    /// `n_group`, `topk_group` and `routed_scaling_factor` (`RouterKind::SigmoidGroup`).
    pub(super) groups: (usize, usize, f32),
}

/// DeepSeek-V3's description, under the family name `family` (DeepSeek-V3.2 builds on it).
pub(super) fn read_as(
    c: &Cfg<'_>,
    model_type: &str,
    family: &'static str,
) -> Result<V3, ModelError> {
    read_with(c, Base::read(c, false)?, model_type, family, None)
}

/// [`read_as`] with the top-level fields `base` already read (a multimodal checkpoint's), and
/// `first_dense` the dense layers when `first_k_dense_replace` is absent (`None`: required).
pub(super) fn read_with(
    c: &Cfg<'_>,
    base: Base,
    model_type: &str,
    family: &'static str,
    first_dense: Option<usize>,
) -> Result<V3, ModelError> {
    let heads = base.heads;
    let q_lora_rank = c.opt_usize("q_lora_rank")?;
    let kv_lora_rank = c.pos_usize("kv_lora_rank")?;
    let nope = c.pos_usize("qk_nope_head_dim")?;
    let rope_dim = c.pos_usize("qk_rope_head_dim")?;
    let v_head_dim = c.pos_usize("v_head_dim")?;
    if let Some(kvh) = c.opt_usize("num_key_value_heads")?
        && kvh != heads
    {
        return Err(c.err(
            "num_key_value_heads",
            format!("{kvh} differs from num_attention_heads {heads}; MLA has one latent"),
        ));
    }
    if !rope_dim.is_multiple_of(2) {
        return Err(c.err("qk_rope_head_dim", "must be even"));
    }
    // transformers default: rope_interleave = true; attention_bias = false.
    let interleaved = c.bool_or("rope_interleave", true)?;
    let bias = c.bool_or("attention_bias", false)?;
    let (rope, yarn_mscale_all) = read_rope(c, rope_dim, interleaved, base.max_positions, None)?;
    let softmax_scale = mla_softmax_scale(nope + rope_dim, yarn_mscale_all);
    let mla = MlaConfig {
        heads,
        q_lora_rank,
        kv_lora_rank,
        qk_nope_head_dim: nope,
        qk_rope_head_dim: rope_dim,
        v_head_dim,
        bias,
        rope: true,
        output_gate: None,
        sinks: false,
        softmax_scale,
        lora_scales: None,
        norm_eps: crate::attention::mla::MLA_NORM_EPS,
        log_scaling: false,
        kv_source: None,
    };

    let experts = c.pos_usize("n_routed_experts")?;
    let intermediate = c.pos_usize("moe_intermediate_size")?;
    let top_k = top_k(c, experts)?;
    c.expect_str("scoring_func", "sigmoid", &["sigmoid"])?;
    c.expect_str("topk_method", "noaux_tc", &["noaux_tc"])?;
    let n_group = c.pos_usize("n_group")?;
    let topk_group = c.pos_usize("topk_group")?;
    check_groups(c, experts, top_k, n_group, topk_group)?;
    let routed_scaling_factor = c.pos_f32("routed_scaling_factor")?;
    let router = RouterKind::SigmoidGroup {
        n_group,
        topk_group,
        norm_topk_prob: c.bool_or("norm_topk_prob", true)?,
        routed_scaling_factor,
    };
    let n_shared = c.usize("n_shared_experts")?;
    let shared = super::common::shared_experts(c, n_shared, intermediate)?;
    let first_dense = match first_dense {
        Some(d) => c.opt_usize("first_k_dense_replace")?.unwrap_or(d),
        None => c.usize("first_k_dense_replace")?,
    };
    if let Some(f) = c.opt_usize("moe_layer_freq")?
        && f != 1
    {
        return Err(c.err("moe_layer_freq", format!("{f} is not supported (only 1)")));
    }
    let dense = c.pos_usize("intermediate_size")?;
    let layer_plan = (0..base.layers)
        .map(|l| {
            LayerPlan::new(
                AttentionConfig::Mla(mla.clone()),
                MlpKind::moe_or_dense(l >= first_dense, dense),
            )
        })
        .collect();
    let moe = MoeConfig {
        shared,
        ..MoeConfig::routed(experts, top_k, intermediate, router)
    };
    let names = TensorNames {
        router_bias: Some("gate.e_score_correction_bias"),
        ..TensorNames::standard()
    };
    let cfg = base.finish(c, family, model_type, rope, layer_plan, moe, names)?;
    Ok(V3 {
        cfg,
        mla,
        groups: (n_group, topk_group, routed_scaling_factor),
    })
}

/// DeepSeek-V3's `config.json` from a GGUF `deepseek2` file (DeepSeek-V3/R1, Kimi K2: sigmoid
/// group routing). The converter stores MLA as multi-query attention over the latent
/// (`key_length` = rank + rope), so the head sizes come from the `*_mla` keys.
fn gguf_config(m: &Meta<'_>) -> Result<Json, ModelError> {
    match m.opt_uint("expert_gating_func")? {
        Some(2) => {}
        g => {
            return Err(m.err(
                "expert_gating_func",
                format!(
                    "{}: only sigmoid routing (2, DeepSeek-V3 and later) is supported",
                    g.map_or("absent (softmax, DeepSeek-V2)".to_owned(), |g| g
                        .to_string())
                ),
            ));
        }
    }
    let rope = m.pos("rope.dimension_count")?;
    let key_mla = m.pos("attention.key_length_mla")?;
    if key_mla <= rope {
        return Err(m.err(
            "attention.key_length_mla",
            format!("{key_mla} leaves no room for the rotary part of {rope}"),
        ));
    }
    let mut c = m.common("deepseek_v3", "DeepseekV3ForCausalLM")?;
    // MLA has one latent, which transformers counts as a key-value head per query head.
    c.insert(
        "num_key_value_heads".into(),
        c["num_attention_heads"].clone(),
    );
    let mut put = |key: &str, v: Json| {
        c.insert(key.into(), v);
    };
    put(
        "q_lora_rank",
        m.opt_uint("attention.q_lora_rank")?
            .map_or(Json::Null, |q| json!(q)),
    );
    put("kv_lora_rank", json!(m.pos("attention.kv_lora_rank")?));
    put("qk_rope_head_dim", json!(rope));
    put("qk_nope_head_dim", json!(key_mla - rope));
    put("v_head_dim", json!(m.pos("attention.value_length_mla")?));
    put("n_routed_experts", json!(m.pos("expert_count")?));
    put("num_experts_per_tok", json!(m.pos("expert_used_count")?));
    put(
        "n_group",
        json!(m.opt_uint("expert_group_count")?.unwrap_or(1)),
    );
    put(
        "topk_group",
        json!(m.opt_uint("expert_group_used_count")?.unwrap_or(1)),
    );
    put(
        "n_shared_experts",
        json!(m.opt_uint("expert_shared_count")?.unwrap_or(0)),
    );
    put(
        "first_k_dense_replace",
        json!(m.opt_uint("leading_dense_block_count")?.unwrap_or(0)),
    );
    put(
        "moe_intermediate_size",
        json!(m.pos("expert_feed_forward_length")?),
    );
    put("intermediate_size", json!(m.pos("feed_forward_length")?));
    // The converter writes these only when set: absent means 1 and false.
    put(
        "routed_scaling_factor",
        json!(m.opt_float("expert_weights_scale")?.unwrap_or(1.0)),
    );
    put(
        "norm_topk_prob",
        json!(m.opt_bool("expert_weights_norm")?.unwrap_or(false)),
    );
    put("scoring_func", json!("sigmoid"));
    put("topk_method", json!("noaux_tc"));
    if let Some(mut s) = m.rope_scaling()? {
        // `yarn_log_multiplier` is 0.1 × `mscale_all_dim` (the converter's DeepSeek rule);
        // the releases have `mscale` equal to it.
        if let Some(x) = m.opt_float("rope.scaling.yarn_log_multiplier")? {
            let all = (x * 10.0 * 1e6).round() / 1e6;
            s["mscale_all_dim"] = json!(all);
            s["mscale"] = json!(all);
        }
        put("rope_scaling", s);
    }
    m.finish(c)
}

/// The config reader's tests.
#[cfg(test)]
mod tests {
    use crate::config::test_util::*;

    #[test]
    fn deepseek_reads() {
        let c = parse(&ds()).unwrap();
        assert_eq!(c.family, "deepseek_v3");
        assert_eq!(c.layer_plan[0].mlp, MlpKind::Dense { intermediate: 128 });
        assert!(c.is_moe(1) && c.is_moe(2));
        let m = yarn_get_mscale(4.0, 1.0);
        assert!((scale(&c) as f64 - 24f64.powf(-0.5) * m * m).abs() < 1e-7);
        assert!(matches!(
            c.rope.scaling,
            RopeScaling::Yarn { factor: 4.0, .. }
        ));
        assert!(c.rope.interleaved);
        assert_eq!(c.rope.dim, 8);
    }
}
