//! GLM-5.3-Flash (`glm5_next`, the multimodal checkpoint as released; its text model, read
//! from `text_config` (`glm5_next_text`), is what runs, and the vision tower is not read; a
//! flat text-only config is read the same way).
//!
//! - **Two kinds of layer** by `layer_types` (by default every fourth `indexed_attention`, the
//!   rest `linear_attention`): Kimi Delta Attention ([`crate::attention::kda`], the forget gate
//!   `linear_lower_bound · σ(exp(A_log) · z)`, or Kimi Linear's softplus form when the bound is
//!   null; the output RMS-normalised per head and gated by `σ(g_b(g_a x))`), and MLA with
//!   DeepSeek Sparse Attention and **no rotary embedding** (`qk_rope_head_dim` must be 0; its
//!   latent norms take `rms_norm_eps`).
//! - **A pooled indexer** ([`KeyPool`]): keys in pools of `index_kpool`, a pool's key the
//!   gated softmax mean of its keys; a query keeps the best `index_topk / index_kpool` pools it
//!   sees whole, and the positions after them (`index_kpool_always_select_tail`). A `shared`
//!   layer (`indexer_types`) reuses the top-k of the layer just before it, which must be a full
//!   sparse layer (transformers hands a layer only its predecessor's).
//! - **Hyper-connections with a mixing matrix** (mHC, [`HyperConfig`]): `hc_mult` streams, the
//!   streams mixed by a Sinkhorn-normalised matrix (`hc_sinkhorn_iters`), and their plain mean
//!   before the final norm.
//! - **Feed-forward.** SwiGLU of bounded inputs (`swiglu_limit`) in every MLP: the dense
//!   layers', the shared experts' and the routed experts' (per expert in the checkpoint);
//!   sigmoid routing with a selection bias as DeepSeek-V3's; dense layers by `mlp_layer_types`
//!   (by default the first three).
//! - **Tensors** are the Kimi-style ones transformers writes (`q_conv1d`, `f_a_proj`, `A_log`
//!   per head, …) under `model.language_model.`; the hyper-connections' `hc_attn_fn` and the
//!   like are renamed to transformers' `attn_hc.fn` as the checkpoint opens. One
//!   multi-token-prediction layer after the last may be present (the release's `layers.45`);
//!   it is not read.

use serde_json::Value;

use super::common::{Base, check_groups, kinds_of, layer_kinds, text_config, top_k};
use super::{Family, Models};
use crate::ModelError;
use crate::attention::dsa::INDEXER_EPS;
use crate::attention::{DsaConfig, IndexerQuery, KeyPool, MlaConfig};
use crate::config::{
    AttentionConfig, Cfg, ExpertActivation, GluActivation, HyperConfig, KdaConfig, KdaGate,
    LayerPlan, MlpKind, ModelConfig, MoeConfig, Rename, Residual, RopeConfig, RouterKind,
    TensorNames,
};

pub(super) const FAMILY: Family = Family {
    name: "glm5_next",
    models: &[Models {
        model_types: &["glm5_next"],
        names: "GLM-5.3-Flash",
        features: "Kimi Delta Attention layers beside NoPE sparse MLA whose indexer scores pools of keys (plus the tail); hyper-connections with a Sinkhorn-normalised mixing matrix (mHC); bounded SwiGLU inputs in every MLP; the multimodal checkpoint's text model (vision tower not read) or a flat text config",
    }],
    read,
    gguf: &[],
};

fn read(top: &Cfg<'_>, model_type: &str) -> Result<ModelConfig, ModelError> {
    let multimodal = top.get("text_config").is_some();
    let text;
    let (c, base) = if multimodal {
        text = text_config(top, "glm5_next_text")?;
        let base = Base::read_multimodal(top, &text)?;
        (&text, base)
    } else {
        (top, Base::read(top, false)?)
    };
    let layers = base.layers;
    let heads = base.heads;
    let eps = base.eps;
    if let Some(kvh) = c.opt_usize("num_key_value_heads")?
        && kvh != heads
    {
        return Err(c.err(
            "num_key_value_heads",
            format!("{kvh} differs from num_attention_heads {heads}; MLA has one latent"),
        ));
    }
    if c.bool_or("attention_bias", false)? {
        return Err(c.err("attention_bias", "true is not supported"));
    }

    // Attention: NoPE MLA with sparse attention, and Kimi Delta Attention.
    let rope_dim = c.opt_usize("qk_rope_head_dim")?.unwrap_or(0);
    if rope_dim != 0 {
        return Err(c.err(
            "qk_rope_head_dim",
            format!("{rope_dim}: GLM-5.3's attention has no rotary part (0 only)"),
        ));
    }
    let nope = c.pos_usize("qk_nope_head_dim")?;
    let mla = MlaConfig {
        heads,
        q_lora_rank: Some(c.pos_usize("q_lora_rank")?),
        kv_lora_rank: c.pos_usize("kv_lora_rank")?,
        qk_nope_head_dim: nope,
        qk_rope_head_dim: 0,
        v_head_dim: c.pos_usize("v_head_dim")?,
        bias: false,
        rope: false,
        output_gate: None,
        sinks: false,
        softmax_scale: super::common::mla_softmax_scale(nope, None),
        lora_scales: None,
        norm_eps: eps,
        log_scaling: false,
        kv_source: None,
    };
    let kpool = c.opt_usize("index_kpool")?.unwrap_or(16);
    if kpool == 0 {
        return Err(c.err("index_kpool", "must be positive"));
    }
    let topk = c.pos_usize("index_topk")?;
    if !topk.is_multiple_of(kpool) {
        return Err(c.err(
            "index_topk",
            format!("{topk} is not a multiple of index_kpool {kpool}"),
        ));
    }
    let pool = KeyPool {
        size: kpool,
        tail: c.bool_or("index_kpool_always_select_tail", true)?,
    };
    let kda = kda_config(c)?;
    let kinds = ["linear_attention", "indexed_attention"];
    let linear = match c.get("layer_types") {
        // transformers reads `full_attention` as `indexed_attention`.
        Some(Value::Array(a)) if a.len() == layers => {
            let a: Vec<Value> = a
                .iter()
                .map(|v| match v.as_str() {
                    Some("full_attention") => Value::from(kinds[1]),
                    _ => v.clone(),
                })
                .collect();
            kinds_of(c, "layer_types", &a, kinds)?
        }
        _ => layer_kinds(c, "layer_types", layers, kinds, |l| l % 4 != 3)?,
    };
    let shared =
        super::glm_moe_dsa::indexer_types(c, layers, super::glm_moe_dsa::default_types(c)?)?;
    for l in 0..layers {
        if !linear[l] && shared[l] && (l == 0 || linear[l - 1] || shared[l - 1]) {
            return Err(c.err(
                "indexer_types",
                format!(
                    "layer {l} is `shared`, but the layer before it is no sparse layer with an \
                     indexer of its own"
                ),
            ));
        }
    }
    let (index_heads, index_dim) = (
        c.pos_usize("index_n_heads")?,
        c.pos_usize("index_head_dim")?,
    );
    let dsa = |shared: bool| DsaConfig {
        mla: mla.clone(),
        heads: index_heads,
        head_dim: index_dim,
        topk,
        interleaved: false,
        shared,
        query: IndexerQuery::Latent,
        rope_last: false,
        key_eps: INDEXER_EPS,
        pool: Some(pool),
    };

    // Feed-forward blocks.
    let experts = c.pos_usize("n_routed_experts")?;
    let intermediate = c.pos_usize("moe_intermediate_size")?;
    let k = top_k(c, experts)?;
    let n_group = c.opt_usize("n_group")?.unwrap_or(1);
    let topk_group = c.opt_usize("topk_group")?.unwrap_or(1);
    check_groups(c, experts, k, n_group, topk_group)?;
    let n_shared = c.opt_usize("n_shared_experts")?.unwrap_or(1);
    let limit = super::common::swiglu_limit(c)?;
    let moe = MoeConfig {
        shared: super::common::shared_experts(c, n_shared, intermediate)?,
        activation: ExpertActivation::SwiGluInputsClamped { limit },
        ..MoeConfig::routed(
            experts,
            k,
            intermediate,
            RouterKind::SigmoidGroup {
                n_group,
                topk_group,
                norm_topk_prob: c.bool_or("norm_topk_prob", true)?,
                routed_scaling_factor: c.opt_f32("routed_scaling_factor")?.unwrap_or(2.5),
            },
        )
    };
    let sparse = layer_kinds(c, "mlp_layer_types", layers, ["sparse", "dense"], |l| {
        l >= 3
    })?;
    let dense = c.pos_usize("intermediate_size")?;
    let layer_plan: Vec<LayerPlan> = (0..layers)
        .map(|l| {
            LayerPlan::new(
                if linear[l] {
                    AttentionConfig::Kda(kda)
                } else {
                    AttentionConfig::Dsa(dsa(shared[l]))
                },
                MlpKind::moe_or_dense(sparse[l], dense),
            )
        })
        .collect();

    let names = TensorNames {
        model: if multimodal {
            "model.language_model."
        } else {
            "model."
        },
        router_bias: Some("gate.e_score_correction_bias"),
        rename: Some(Rename {
            dialect: "glm",
            canonical,
        }),
        ..TensorNames::standard()
    };
    let rope = RopeConfig::none();
    let mut cfg = base.finish(c, FAMILY.name, model_type, rope, layer_plan, moe, names)?;
    let streams = super::common::hc_streams(c)?;
    cfg.residual = Residual::Hyper(HyperConfig {
        streams,
        gain: 2.0,
        eps: c.opt_f32("hc_eps")?.unwrap_or(1e-6),
        sinkhorn: Some(c.opt_usize("hc_sinkhorn_iters")?.unwrap_or(20).max(1)),
        mean_head: true,
    });
    // The dense MLPs and the shared experts clamp their inputs as the routed experts do.
    cfg.mlp_act = GluActivation::SiluInputsClamped { limit };
    // The release's multi-token-prediction layer after the last.
    cfg.draft_layers = 1;
    Ok(cfg)
}

/// The linear layers' Kimi Delta Attention: `linear_*`, or the legacy `linear_attn_config`.
fn kda_config(c: &Cfg<'_>) -> Result<KdaConfig, ModelError> {
    let legacy = c.get("linear_attn_config");
    let lc = legacy.map(|v| Cfg {
        v,
        file: c.file,
        prefix: format!("{}linear_attn_config.", c.prefix),
    });
    let field = |new: &str, old: &str| -> Result<Option<usize>, ModelError> {
        match &lc {
            Some(l) if l.get(old).is_some() => l.opt_usize(old),
            _ => c.opt_usize(new),
        }
    };
    let heads = field("linear_num_heads", "num_heads")?.unwrap_or(64);
    let head_dim = field("linear_head_dim", "head_dim")?.unwrap_or(128);
    let conv_kernel = field("linear_conv_kernel_dim", "short_conv_kernel_size")?.unwrap_or(4);
    for (f, v) in [
        ("linear_num_heads", heads),
        ("linear_head_dim", head_dim),
        ("linear_conv_kernel_dim", conv_kernel),
    ] {
        if v == 0 {
            return Err(c.err(f, "must be positive"));
        }
    }
    // transformers' default bound is -5; null means the softplus form.
    let bound = match (&lc, c.v.get("linear_lower_bound")) {
        (Some(l), _) if l.get("gate_lower_bound").is_some() => l.opt_f32("gate_lower_bound")?,
        (_, None) => Some(-5.0),
        (_, Some(Value::Null)) => None,
        (_, Some(_)) => c.opt_f32("linear_lower_bound")?,
    };
    let gate = match bound {
        None => KdaGate::Softplus,
        Some(b) if b < 0.0 => KdaGate::LowerBound(b),
        Some(b) => {
            return Err(c.err(
                "linear_lower_bound",
                format!("{b}: a lower bound on a log-decay must be negative"),
            ));
        }
    };
    Ok(KdaConfig {
        heads,
        head_dim,
        conv_kernel,
        gate,
        full_rank_output_gate: false,
    })
}

/// The name transformers gives a stored tensor as it loads it, for the hyper-connections
/// (`conversion_mapping`'s `glm5_next` entry; its other renames, the forget gate's module and
/// the fused convolution and experts, are of layouts the loader reads as stored).
pub(crate) fn canonical(name: &str) -> Option<String> {
    let mut s = name.to_owned();
    for (from, to) in [
        ("hc_attn_fn", "attn_hc.fn"),
        ("hc_attn_base", "attn_hc.base"),
        ("hc_attn_scale", "attn_hc.scale"),
        ("hc_ffn_fn", "ffn_hc.fn"),
        ("hc_ffn_base", "ffn_hc.base"),
        ("hc_ffn_scale", "ffn_hc.scale"),
    ] {
        s = s.replace(from, to);
    }
    (s != name).then_some(s)
}

/// The config reader's tests.
#[cfg(test)]
mod tests {
    use crate::config::test_util::*;

    /// A GLM-5.3-Flash text config (flat, as text-only checkpoints store it).
    fn glm53() -> Value {
        json!({
            "model_type": "glm5_next", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 5,
            "rms_norm_eps": 1e-5, "num_attention_heads": 4, "num_key_value_heads": 4,
            "max_position_embeddings": 256, "q_lora_rank": 32, "kv_lora_rank": 32,
            "qk_nope_head_dim": 24, "qk_rope_head_dim": 0, "v_head_dim": 16, "hidden_act": "silu",
            "num_experts_per_tok": 2, "n_routed_experts": 8, "moe_intermediate_size": 32,
            "intermediate_size": 128, "index_topk": 8, "index_head_dim": 16, "index_n_heads": 8,
            "index_kpool": 4, "linear_head_dim": 16, "linear_num_heads": 4, "hc_mult": 3,
            "layer_types": ["linear_attention", "indexed_attention", "indexed_attention",
                            "linear_attention", "indexed_attention"],
            "indexer_types": ["full", "full", "shared", "full", "full"]
        })
    }

    #[test]
    fn glm5_next_reads_its_layer_plan_pools_and_mhc() {
        let c = parse(&glm53()).unwrap();
        assert_eq!(c.family, "glm5_next");
        let Residual::Hyper(hc) = c.residual else {
            panic!("GLM-5.3 has hyper-connections");
        };
        assert_eq!(
            (hc.streams, hc.sinkhorn, hc.mean_head, hc.gain),
            (3, Some(20), true, 2.0)
        );
        assert_eq!(c.mlp_act, GluActivation::SiluInputsClamped { limit: 10.0 });
        assert_eq!(c.draft_layers, 1);
        let kinds: Vec<&str> = c.layer_plan.iter().map(|p| p.attention.kind()).collect();
        assert_eq!(kinds, ["kda", "dsa", "dsa", "kda", "dsa"]);
        match (&c.layer_plan[0].attention, &c.layer_plan[2].attention) {
            (AttentionConfig::Kda(k), AttentionConfig::Dsa(d)) => {
                assert_eq!(
                    k.gate,
                    KdaGate::LowerBound(-5.0),
                    "transformers' default bound"
                );
                assert!(d.shared && !d.mla.rope && d.mla.qk_rope_head_dim == 0);
                assert_eq!(
                    d.pool,
                    Some(crate::attention::KeyPool {
                        size: 4,
                        tail: true
                    })
                );
            }
            _ => panic!("layer kinds"),
        }
        // Three dense layers by default.
        assert!((0..3).all(|l| !c.is_moe(l)) && (3..5).all(|l| c.is_moe(l)));
        // transformers reads `full_attention` as `indexed_attention`.
        let mut v = glm53();
        v["layer_types"][1] = json!("full_attention");
        let c2 = parse(&v).unwrap();
        assert_eq!(c2.layer_plan[1].attention.kind(), "dsa");
        let mut v = glm53();
        v["linear_lower_bound"] = json!(null);
        let c = parse(&v).unwrap();
        assert!(
            matches!(&c.layer_plan[0].attention, AttentionConfig::Kda(k) if k.gate == KdaGate::Softplus)
        );
        for (field, bad) in [
            ("qk_rope_head_dim", json!(8)),
            ("index_topk", json!(10)),
            ("index_kpool", json!(0)),
            // Layer 3 is linear: layer 4 has no sparse layer before it to share with.
            (
                "indexer_types",
                json!(["full", "full", "shared", "full", "shared"]),
            ),
            (
                "indexer_types",
                json!(["full", "full", "full", "full", "full", "full"]),
            ),
        ] {
            let mut v = glm53();
            v[field] = bad.clone();
            assert_eq!(field_of(parse(&v).unwrap_err()), field, "{bad}");
        }
    }
}
