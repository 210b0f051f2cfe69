//! Qwen3-Next (`qwen3_next`) and Qwen3.5 MoE (`qwen3_5_moe_text`, and `qwen3_5_moe`, the text
//! model of the multimodal checkpoint: `text_config`, tensors under `model.language_model.`,
//! the vision tower ignored): a hybrid of Gated DeltaNet layers (`linear_attention`, the
//! `linear_*` fields, tensors under `linear_attn`) and gated full-attention layers
//! (`full_attention`: grouped-query attention whose `q_proj` also gives a sigmoid output gate
//! per head, per-head q/k norms, a quarter of each head rotated by default); every RMSNorm of
//! the trunk zero-centred (it scales by `1 + w`) except the DeltaNet's gated one; MoE with
//! softmax routing and a sigmoid-gated shared expert, dense layers by `decoder_sparse_step` /
//! `mlp_only_layers`. Qwen3.5 differs only in its DeltaNet's four separate input projections
//! (and multimodal rotary sections, which for text-only positions are the plain rotation). The
//! checkpoint's multi-token-prediction layers (`mtp.*`: `mtp_num_hidden_layers` full-attention
//! layers with the MoE, `fc` and three norms) are checked when present and not run.

use super::common::{
    Base, gqa_rope_partial, layer_kinds, layer_list, softmax_router, text_config, top_k,
};
use super::{Family, Models};
use crate::ModelError;
use crate::attention::GdnConfig;
use crate::config::{
    AttentionConfig, Cfg, LayerPlan, MlpKind, ModelConfig, MoeConfig, MtpConfig, MtpHead, QkNorm,
    SharedExpert, TensorNames,
};

pub(super) const FAMILY: Family = Family {
    name: "qwen3_next",
    models: &[
        Models {
            model_types: &["qwen3_next"],
            names: "Qwen3-Next",
            features: "Gated DeltaNet layers (recurrent state, key heads serving value heads) beside gated full attention; zero-centred norms; the MTP layer (`mtp.*`) drafts with `--draft mtp`",
        },
        Models {
            model_types: &["qwen3_5_moe", "qwen3_5_moe_text"],
            names: "Qwen3.5 MoE (e.g. 35B-A3B)",
            features: "Qwen3-Next's blocks with four DeltaNet projections; the text model of the multimodal checkpoint (vision tower not read), experts per expert or fused, FP8 releases",
        },
    ],
    read,
    gguf: &[],
};

fn read(top: &Cfg<'_>, model_type: &str) -> Result<ModelConfig, ModelError> {
    // Qwen3.5's released checkpoints are multimodal: the text model's config is `text_config`
    // and its tensors are under `model.language_model.` (the vision tower is not read).
    let multimodal = model_type == "qwen3_5_moe";
    let text;
    let (c, base) = if multimodal {
        text = text_config(top, "qwen3_5_moe_text")?;
        (&text, Base::read_multimodal(top, &text)?)
    } else {
        (top, Base::read(top, false)?)
    };
    let qwen3_5 = model_type != "qwen3_next";
    // transformers defaults: partial_rotary_factor 0.25, attention_bias false.
    let (mut gqa, rope) = gqa_rope_partial(c, &base, true, 0.25)?;
    let b = c.bool_or("attention_bias", false)?;
    (gqa.qkv_bias, gqa.o_bias) = (b, b);
    gqa.qk_norm = QkNorm::PerHead;
    gqa.zero_centred_qk_norm = true;
    gqa.output_gate = true;

    let k_heads = c.pos_usize("linear_num_key_heads")?;
    let v_heads = c.pos_usize("linear_num_value_heads")?;
    if !v_heads.is_multiple_of(k_heads) {
        return Err(c.err(
            "linear_num_value_heads",
            format!("{v_heads} is not a multiple of linear_num_key_heads {k_heads}"),
        ));
    }
    let gdn = GdnConfig {
        k_heads,
        v_heads,
        k_dim: c.pos_usize("linear_key_head_dim")?,
        v_dim: c.pos_usize("linear_value_head_dim")?,
        conv_kernel: c.pos_usize("linear_conv_kernel_dim")?,
        split: qwen3_5,
    };
    let linear = read_layer_kinds(c, base.layers)?;

    let experts = c.usize("num_experts")?;
    let (moe, sparse) = if experts == 0 {
        (MoeConfig::none(), Vec::new())
    } else {
        let intermediate = c.pos_usize("moe_intermediate_size")?;
        let shared = c.usize("shared_expert_intermediate_size")?;
        let moe = MoeConfig {
            shared: (shared > 0).then_some(SharedExpert {
                intermediate: shared,
                gated: true,
            }),
            ..MoeConfig::routed(
                experts,
                top_k(c, experts)?,
                intermediate,
                // transformers default: norm_topk_prob = true.
                softmax_router(c, true)?,
            )
        };
        let step = match c.opt_usize("decoder_sparse_step")? {
            Some(0) => return Err(c.err("decoder_sparse_step", "must be positive")),
            Some(s) => s,
            None => 1,
        };
        let only = layer_list(c, "mlp_only_layers")?;
        let sparse = (0..base.layers)
            .map(|l| !only.contains(&l) && (l + 1).is_multiple_of(step))
            .collect();
        (moe, sparse)
    };
    let dense = if (0..base.layers).all(|l| sparse.get(l) == Some(&true)) {
        0
    } else {
        c.pos_usize("intermediate_size")?
    };
    let layer_plan = (0..base.layers)
        .map(|l| {
            LayerPlan::new(
                if linear[l] {
                    AttentionConfig::Gdn(gdn)
                } else {
                    AttentionConfig::Gqa(gqa.clone())
                },
                MlpKind::moe_or_dense(sparse.get(l) == Some(&true), dense),
            )
        })
        .collect();
    let names = TensorNames {
        model: if multimodal {
            "model.language_model."
        } else {
            "model."
        },
        linear_attention: Some("linear_attn"),
        shared: "shared_expert",
        ..TensorNames::standard()
    };
    // The MTP layers: `mtp_num_hidden_layers` as the hub configs say it (vLLM's
    // `num_nextn_predict_layers`; absent, 1), each a full-attention layer with the MoE.
    let mtp_layers = match c.opt_usize("mtp_num_hidden_layers")? {
        Some(n) => n,
        None => c.opt_usize("num_nextn_predict_layers")?.unwrap_or(1),
    };
    let mtp_plan = LayerPlan::new(
        AttentionConfig::Gqa(gqa.clone()),
        if experts > 0 {
            MlpKind::Moe
        } else {
            MlpKind::Dense {
                intermediate: c.pos_usize("intermediate_size")?,
            }
        },
    );
    let mut cfg = base.finish(c, FAMILY.name, model_type, rope, layer_plan, moe, names)?;
    cfg.zero_centred_norms = true;
    // (base.finish read `num_nextn_predict_layers` as DeepSeek-style trailing layers; Qwen's
    // are under `mtp.`, and `model.layers.*` has none.)
    cfg.draft_layers = 0;
    cfg.mtp = (mtp_layers > 0).then_some(MtpConfig {
        module: "mtp.",
        first: 0,
        layers: mtp_layers,
        plans: vec![mtp_plan; mtp_layers],
        head: MtpHead::Concat,
    });
    Ok(cfg)
}

/// `layer_types` (true for `linear_attention`); when absent, transformers' default from
/// `full_attention_interval` (4): every interval-th layer full, the others linear.
fn read_layer_kinds(c: &Cfg<'_>, layers: usize) -> Result<Vec<bool>, ModelError> {
    let every = c.opt_usize("full_attention_interval")?.unwrap_or(4);
    if every == 0 {
        return Err(c.err("full_attention_interval", "must be positive"));
    }
    layer_kinds(
        c,
        "layer_types",
        layers,
        ["linear_attention", "full_attention"],
        |l| !(l + 1).is_multiple_of(every),
    )
}

/// The config reader's tests.
#[cfg(test)]
mod tests {
    use crate::config::test_util::*;

    #[test]
    fn qwen3_next_hybrid_plan_and_checks() {
        let v = json!({
            "model_type": "qwen3_next", "vocab_size": 512, "hidden_size": 64,
            "num_hidden_layers": 8, "rms_norm_eps": 1e-6, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256,
            "hidden_act": "silu", "intermediate_size": 128, "linear_num_key_heads": 2,
            "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 8,
            "linear_conv_kernel_dim": 4, "num_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
            "mlp_only_layers": [5], "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}
        });
        let c = parse(&v).unwrap();
        // transformers' default: every fourth layer full attention.
        let kinds: Vec<&str> = c.layer_plan.iter().map(|p| p.attention.kind()).collect();
        assert_eq!(
            kinds,
            ["gdn", "gdn", "gdn", "gqa", "gdn", "gdn", "gdn", "gqa"]
        );
        assert!(c.zero_centred_norms);
        assert_eq!(c.moe_layers(), 7);
        assert!(!c.is_moe(5));
        let g = gqa(&c, 3);
        assert!(g.output_gate && g.zero_centred_qk_norm);
        // a quarter of each head rotated by default
        assert_eq!(c.rope.dim, 4);
        assert_eq!(
            c.names.attention_of(&c.layer_plan[0].attention),
            "linear_attn"
        );
        assert_eq!(
            c.names.attention_of(&c.layer_plan[3].attention),
            "self_attn"
        );
        for (field, bad) in [
            ("linear_num_value_heads", json!(3)),
            ("linear_conv_kernel_dim", json!(0)),
            ("layer_types", json!(["linear_attention"])),
            ("full_attention_interval", json!(0)),
        ] {
            let mut w = v.clone();
            w[field] = bad;
            assert_eq!(field_of(parse(&w).unwrap_err()), field);
        }
        let mut w = v.clone();
        w["num_experts"] = json!(0);
        assert_eq!(parse(&w).unwrap().moe_layers(), 0);
        // One MTP layer by default (checked when the checkpoint has it): full attention, MoE.
        let m = c.mtp.as_ref().unwrap();
        assert_eq!(
            (m.module, m.layers, m.plans.len(), &m.plans[0].mlp, m.head),
            ("mtp.", 1, 1, &MlpKind::Moe, MtpHead::Concat)
        );
        assert_eq!(m.plans[0].attention.kind(), "gqa");
        let mut w = v.clone();
        w["mtp_num_hidden_layers"] = json!(0);
        assert!(parse(&w).unwrap().mtp.is_none());
        w["mtp_num_hidden_layers"] = json!(2);
        let m = parse(&w).unwrap().mtp.unwrap();
        assert_eq!((m.layers, m.plans.len()), (2, 2));
    }

    #[test]
    fn qwen3_5_multimodal_reads_its_text_config() {
        let text = json!({
            "model_type": "qwen3_5_moe_text", "vocab_size": 512, "hidden_size": 64,
            "num_hidden_layers": 4, "rms_norm_eps": 1e-6, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256,
            "hidden_act": "silu", "linear_num_key_heads": 2, "linear_num_value_heads": 4,
            "linear_key_head_dim": 16, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
            "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 64,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0]}
        });
        let c = parse(&text).unwrap();
        assert_eq!(c.names.model, "model.");
        assert!(matches!(
            c.layer_plan[0].attention,
            AttentionConfig::Gdn(g) if g.split
        ));
        let mm = json!({"model_type": "qwen3_5_moe", "text_config": text, "vision_config": {}});
        let c = parse(&mm).unwrap();
        assert_eq!(c.names.model, "model.language_model.");
        assert_eq!(c.moe_layers(), 4);
        let mut bad = mm.clone();
        bad["text_config"]["linear_key_head_dim"] = json!("16");
        assert_eq!(
            field_of(parse(&bad).unwrap_err()),
            "text_config.linear_key_head_dim"
        );
        let mut bad = mm.clone();
        bad.as_object_mut().unwrap().remove("text_config");
        assert_eq!(field_of(parse(&bad).unwrap_err()), "text_config");
        // Quantization is read at the top (Qwen3.5's FP8 releases), strictly.
        let mut q = mm.clone();
        q["quantization_config"] = json!({"quant_method": "fp8", "fmt": "e4m3",
            "activation_scheme": "dynamic", "weight_block_size": [128, 128]});
        assert!(parse(&q).is_ok());
        q["quantization_config"]["quant_method"] = json!("gptq");
        assert_eq!(
            field_of(parse(&q).unwrap_err()),
            "quantization_config.quant_method"
        );
        let mut both = mm;
        let fp8 = json!({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [128, 128]});
        both["quantization_config"] = fp8.clone();
        both["text_config"]["quantization_config"] = fp8;
        assert_eq!(field_of(parse(&both).unwrap_err()), "quantization_config");
    }
}
