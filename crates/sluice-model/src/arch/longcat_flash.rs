//! LongCat-Flash (`longcat_flash`): each of its `num_layers` layers is two sublayers, and
//! sluice runs it as `2 × num_layers` layers.
//!
//! - **Sublayer 0**: multi-head latent attention (`self_attn.0`, with LoRA scaling of the
//!   queries and the latent), then `mlps.0` and the shortcut MoE, both over the same normed
//!   input. `mlps.0` joins the stream now and plays the MoE's shared expert.
//! - **Sublayer 1**: attention (`self_attn.1`), then `mlps.1`, and then the MoE's routed sum
//!   carried from sublayer 0 ([`crate::config::MoeConfig::shortcut`]).
//!
//! The router is a softmax over `n_routed_experts + zero_expert_num` choices. It takes the
//! top-k of the probabilities plus a selection-only bias; the weights are the chosen
//! probabilities times `routed_scaling_factor`, not renormalised. A chosen zero-compute
//! expert returns its input times its weight.
//!
//! Rotation is interleaved and needs `head_dim` = `qk_rope_head_dim`: transformers builds the
//! table from `head_dim`. The MTP layers (`model.mtp.*`) are not read.
//!
//! transformers saves the zero experts' unused `gate_proj`/`up_proj` rows as
//! `experts.{n_routed..}`. They are not read, and a checkpoint without them reads the same.

use super::common::{Base, mla_softmax_scale};
use super::{Family, Models};
use crate::ModelError;
use crate::config::{
    AttentionConfig, Cfg, LayerPlan, MlaConfig, MlpKind, ModelConfig, MoeConfig, RouterKind,
    SharedExpert, TensorNames, read_rope,
};
use crate::quant::{self, Quantization};

pub(super) const FAMILY: Family = Family {
    name: "longcat_flash",
    models: &[Models {
        model_types: &["longcat_flash"],
        names: "LongCat-Flash",
        features: "two sublayers per layer (each MLA with LoRA scaling and a dense MLP), a shortcut MoE whose routed sum joins after the second, zero-compute experts",
    }],
    read,
    gguf: &[],
};

fn read(c: &Cfg<'_>, model_type: &str) -> Result<ModelConfig, ModelError> {
    let quant = match c.get("quantization_config") {
        Some(q) => quant::read(q, c.file, false)?,
        None => Quantization::None,
    };
    c.expect_str("hidden_act", "silu", &["silu"])?;
    let logical = c.pos_usize("num_layers")?;
    if logical > crate::config::MAX_LAYERS / 2 {
        return Err(c.err(
            "num_layers",
            format!(
                "{logical} is more than the {} sluice accepts",
                crate::config::MAX_LAYERS / 2
            ),
        ));
    }
    let base = Base {
        quant,
        vocab: c.pos_usize("vocab_size")?,
        hidden: c.pos_usize("hidden_size")?,
        layers: 2 * logical,
        eps: c.pos_f32("rms_norm_eps")?,
        heads: c.pos_usize("num_attention_heads")?,
        max_positions: c.pos_usize("max_position_embeddings")?,
        // transformers' default.
        tie_embeddings: c.bool_or("tie_word_embeddings", false)?,
    };
    let (heads, hidden) = (base.heads, base.hidden);
    // transformers: num_key_value_heads defaults to the heads; MLA has one latent.
    if let Some(kvh) = c.opt_usize("num_key_value_heads")?
        && kvh != heads
    {
        return Err(c.err(
            "num_key_value_heads",
            format!("{kvh} differs from num_attention_heads {heads}; MLA has one latent"),
        ));
    }
    // LongCat always projects queries through a low rank.
    let q_lora_rank = c.pos_usize("q_lora_rank")?;
    let kv_lora_rank = c.pos_usize("kv_lora_rank")?;
    let nope = c.pos_usize("qk_nope_head_dim")?;
    let rope_dim = c.pos_usize("qk_rope_head_dim")?;
    let v_head_dim = c.pos_usize("v_head_dim")?;
    if !rope_dim.is_multiple_of(2) {
        return Err(c.err("qk_rope_head_dim", "must be even"));
    }
    if let Some(qk) = c.opt_usize("qk_head_dim")?
        && qk != nope + rope_dim
    {
        return Err(c.err(
            "qk_head_dim",
            format!(
                "{qk} is not qk_nope_head_dim + qk_rope_head_dim = {}",
                nope + rope_dim
            ),
        ));
    }
    // The rotary table is built from head_dim (its default is 64).
    let table_dim = c.opt_usize("head_dim")?.unwrap_or(64);
    if table_dim != rope_dim {
        return Err(c.err(
            "head_dim",
            format!(
                "{table_dim} differs from qk_rope_head_dim {rope_dim}; transformers rotates by \
                 a head_dim-wide table"
            ),
        ));
    }
    if c.bool_or("attention_bias", false)? {
        return Err(c.err("attention_bias", "true is not supported"));
    }
    if c.bool_or("router_bias", false)? {
        return Err(c.err("router_bias", "true is not supported"));
    }
    // Released configs state these; transformers always applies the scaling.
    for flag in ["mla_scale_q_lora", "mla_scale_kv_lora"] {
        if !c.bool_or(flag, true)? {
            return Err(c.err(flag, "false is not supported (transformers always scales)"));
        }
    }
    if c.get("zero_expert_type").is_some() {
        c.expect_str("zero_expert_type", "identity", &["identity"])?;
    }
    let (rope, yarn_mscale_all) = read_rope(c, rope_dim, true, base.max_positions, None)?;
    let softmax_scale = mla_softmax_scale(nope + rope_dim, yarn_mscale_all);
    let attention = AttentionConfig::Mla(MlaConfig {
        heads,
        q_lora_rank: Some(q_lora_rank),
        kv_lora_rank,
        qk_nope_head_dim: nope,
        qk_rope_head_dim: rope_dim,
        v_head_dim,
        bias: false,
        rope: true,
        output_gate: None,
        sinks: false,
        softmax_scale,
        lora_scales: Some((
            (hidden as f64 / q_lora_rank as f64).sqrt() as f32,
            (hidden as f64 / kv_lora_rank as f64).sqrt() as f32,
        )),
        norm_eps: crate::attention::mla::MLA_NORM_EPS,
        log_scaling: false,
        kv_source: None,
    });

    let experts = c.pos_usize("n_routed_experts")?;
    let zero_experts = c.usize("zero_expert_num")?;
    if zero_experts > crate::config::MAX_EXPERTS {
        return Err(c.err(
            "zero_expert_num",
            format!(
                "{zero_experts} is more than the {} sluice accepts",
                crate::config::MAX_EXPERTS
            ),
        ));
    }
    let top_k = c.pos_usize("moe_topk")?;
    if top_k > experts + zero_experts {
        return Err(c.err(
            "moe_topk",
            format!(
                "{top_k} is more than the {} experts",
                experts + zero_experts
            ),
        ));
    }
    let dense = c.pos_usize("ffn_hidden_size")?;
    let layer_plan = (0..base.layers)
        .map(|l| {
            LayerPlan::new(
                attention.clone(),
                MlpKind::moe_or_dense(l.is_multiple_of(2), dense),
            )
        })
        .collect();
    let moe = MoeConfig {
        // The first sublayer's MLP, added now; the routed sum waits for the second.
        shared: Some(SharedExpert {
            intermediate: dense,
            gated: false,
        }),
        zero_experts,
        shortcut: true,
        ..MoeConfig::routed(
            experts,
            top_k,
            c.pos_usize("expert_ffn_hidden_size")?,
            RouterKind::SoftmaxScaled {
                routed_scaling_factor: c.pos_f32("routed_scaling_factor")?,
            },
        )
    };
    let names = TensorNames {
        dense: &["mlps"],
        router: "router.classifier",
        router_bias: Some("router.e_score_correction_bias"),
        shared: "mlps",
        shared_in_layer: true,
        sublayers: 2,
        ..TensorNames::standard()
    };
    let mut cfg = base.finish(c, FAMILY.name, model_type, rope, layer_plan, moe, names)?;
    cfg.layers_field = format!("{}num_layers", c.prefix);
    Ok(cfg)
}

/// The config reader's tests.
#[cfg(test)]
mod tests {
    use crate::config::test_util::*;

    #[test]
    fn longcat_flash_runs_two_sublayers_per_layer() {
        let v = json!({
            "model_type": "longcat_flash", "vocab_size": 512, "hidden_size": 64, "num_layers": 3,
            "rms_norm_eps": 1e-6, "num_attention_heads": 4, "num_key_value_heads": 4,
            "max_position_embeddings": 256, "hidden_act": "silu", "ffn_hidden_size": 96,
            "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
            "head_dim": 8, "v_head_dim": 16, "n_routed_experts": 8, "zero_expert_num": 4,
            "moe_topk": 4, "expert_ffn_hidden_size": 32, "routed_scaling_factor": 6.0,
            "zero_expert_type": "identity", "mla_scale_q_lora": true, "mla_scale_kv_lora": true,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e7}
        });
        let c = parse(&v).unwrap();
        assert_eq!(c.layers, 6);
        let moe: Vec<bool> = (0..6).map(|l| c.is_moe(l)).collect();
        assert_eq!(moe, [true, false, true, false, true, false]);
        assert_eq!(c.layer_plan[1].mlp, MlpKind::Dense { intermediate: 96 });
        assert!(c.moe.shortcut);
        assert_eq!((c.moe.experts, c.moe.router_width()), (8, 12));
        assert_eq!(
            c.moe.router,
            RouterKind::SoftmaxScaled {
                routed_scaling_factor: 6.0
            }
        );
        let AttentionConfig::Mla(m) = &c.layer_plan[0].attention else {
            panic!("LongCat attention is MLA");
        };
        assert_eq!(m.lora_scales, Some((2f32.sqrt(), 2.0)));
        assert!(c.rope.interleaved);
        assert_eq!(
            c.names.layer_module(3, "self_attn"),
            "model.layers.1.self_attn.1"
        );
        assert_eq!(c.names.moe_module(3), "model.layers.1.mlp");
        // Top-k may reach into the zero experts, not past them.
        let mut w = v.clone();
        w["moe_topk"] = json!(12);
        assert!(parse(&w).is_ok());
        for (field, bad) in [
            ("head_dim", json!(16)),
            ("qk_head_dim", json!(20)),
            ("num_key_value_heads", json!(2)),
            ("moe_topk", json!(13)),
            ("zero_expert_type", json!("zero")),
            ("mla_scale_kv_lora", json!(false)),
            ("router_bias", json!(true)),
            ("num_layers", json!(0)),
        ] {
            let mut w = v.clone();
            w[field] = bad;
            assert_eq!(field_of(parse(&w).unwrap_err()), field, "{field}");
        }
        let mut w = v.clone();
        w.as_object_mut().unwrap().remove("q_lora_rank");
        assert_eq!(field_of(parse(&w).unwrap_err()), "q_lora_rank");
    }
}
