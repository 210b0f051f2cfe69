//! Hy4 (`hy_v4`, Tencent): GLM-5's blocks ([`super::glm_moe_dsa`]: MLA with DeepSeek Sparse
//! Attention, `indexer_types` sharing top-k; by default layer 0 and every fourth from layer 1
//! have an indexer) with these differences:
//!
//! - **Hyper-connections** (iHC, [`Residual::Hyper`]): `hc_mult` residual streams per token,
//!   gated in and out of every attention and feed-forward block by sigmoid gates computed from
//!   the streams (`attn_hc`, `ffn_hc`; the `post` gates times `hc_magnitude`), collapsed by the
//!   hyper head (`hc_head`) before the final norm. No mixing matrix between the streams (that is
//!   DeepSeek-V4's mHC).
//! - **Attention sinks and an output gate.** A learned sink logit per head joins each softmax;
//!   each head's output is multiplied by `σ(gate_proj x)` before `o_proj`.
//! - **Rotation.** Pairs split in halves (no `rope_interleave`), in attention and in the
//!   indexer, whose rotated part is the *last* `qk_rope_head_dim` dimensions of its heads; the
//!   indexer's `k_norm` takes `rms_norm_eps`.
//! - **Experts.** SwiGLU of bounded inputs, `silu(min(g, L)) · clamp(u, ±L)` with
//!   `L = swiglu_limit`, fused per layer as transformers holds them (`experts.gate_up_proj`);
//!   sigmoid routing with a selection bias, as DeepSeek-V3's.
//! - **Tencent's tensor names.** transformers writes and reads `hc_pre.hc_attn_layer.hc_fn`,
//!   `hc_pre.hc_head.hc_head_fn`, `learnable_sink_param` and `linear_gate` (the attention's gate
//!   and every MLP's gate projection); they are renamed as the checkpoint opens ([`canonical`]).
//!   The multi-token-prediction layers (`model.mtp_layers.*`) are not read.

use super::{Family, Models};
use crate::ModelError;
use crate::attention::{DsaConfig, IndexerQuery};
use crate::config::{Cfg, ExpertActivation, HyperConfig, ModelConfig, Rename, Residual};

pub(super) const FAMILY: Family = Family {
    name: "hy_v4",
    models: &[Models {
        model_types: &["hy_v4"],
        names: "Hy4",
        features: "GLM-5's sparse attention with per-head sinks and an output gate, the indexer's rotated part last; hyper-connections (several residual streams per token, gated in and out of each block, collapsed by a hyper head); SwiGLU of bounded inputs in the routed experts; Tencent's tensor names",
    }],
    read,
    gguf: &[],
};

fn read(c: &Cfg<'_>, model_type: &str) -> Result<ModelConfig, ModelError> {
    // transformers' default: one dense layer, then MoE.
    let base = super::common::Base::read(c, false)?;
    let eps = base.eps;
    let v3 = super::deepseek_v3::read_with(c, base, model_type, FAMILY.name, Some(1))?;
    let mut cfg = v3.cfg;
    let layers = cfg.layers;
    cfg.rope.interleaved = false;

    let streams = super::common::hc_streams(c)?;
    cfg.residual = Residual::Hyper(HyperConfig {
        streams,
        gain: c.opt_f32("hc_magnitude")?.unwrap_or(2.0),
        eps: c.opt_f32("hc_eps")?.unwrap_or(1e-6),
        sinkhorn: None,
        mean_head: false,
    });
    let limit = super::common::swiglu_limit(c)?;
    cfg.moe.activation = ExpertActivation::SwiGluInputsClamped { limit };
    cfg.names.rename = Some(Rename {
        dialect: "tencent",
        canonical,
    });

    // Layer 0 and every fourth from layer 1 have an indexer.
    let shared = super::glm_moe_dsa::indexer_types(c, layers, |l| l != 0 && (l - 1) % 4 != 0)?;
    if shared.first() == Some(&true) {
        return Err(c.err(
            "indexer_types",
            "layer 0 is `shared`, but no layer before it has an indexer",
        ));
    }
    let sparse = |_: usize, d: &mut DsaConfig| {
        d.rope_last = true;
        d.key_eps = eps;
        d.mla.output_gate = Some("gate_proj");
        d.mla.sinks = true;
    };
    let query = IndexerQuery::Latent;
    super::deepseek_v32::make_sparse(c, &mut cfg, &v3.mla, false, &shared, query, sparse)?;
    Ok(cfg)
}

/// The name transformers gives a stored tensor as it loads it (`conversion_mapping`'s `hy_v4`
/// entry), `None` when it keeps it.
pub(crate) fn canonical(name: &str) -> Option<String> {
    let mut s = name.replace(".hc_pre.hc_", ".hc_");
    for (from, to) in [
        (".learnable_sink_param", ".sinks"),
        (".linear_gate", ".gate_proj"),
        (".hc_attn_layer.hc_fn", ".attn_hc.fn"),
        (".hc_attn_layer.hc_base", ".attn_hc.base"),
        (".hc_attn_layer.hc_scale", ".attn_hc.scale"),
        (".hc_mlp_layer.hc_fn", ".ffn_hc.fn"),
        (".hc_mlp_layer.hc_base", ".ffn_hc.base"),
        (".hc_mlp_layer.hc_scale", ".ffn_hc.scale"),
        (".hc_head_fn", ".hc_fn"),
        (".hc_head_base", ".hc_base"),
        (".hc_head_scale", ".hc_scale"),
    ] {
        s = s.replace(from, to);
    }
    (s != name).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::canonical;

    #[test]
    fn names_are_renamed_as_transformers_loads_them() {
        for (stored, want) in [
            (
                "model.layers.2.hc_pre.hc_attn_layer.hc_fn",
                "model.layers.2.attn_hc.fn",
            ),
            (
                "model.layers.2.hc_pre.hc_mlp_layer.hc_scale",
                "model.layers.2.ffn_hc.scale",
            ),
            ("model.hc_pre.hc_head.hc_head_base", "model.hc_head.hc_base"),
            (
                "model.layers.0.self_attn.learnable_sink_param",
                "model.layers.0.self_attn.sinks",
            ),
            (
                "model.layers.0.self_attn.linear_gate.weight",
                "model.layers.0.self_attn.gate_proj.weight",
            ),
            (
                "model.layers.1.mlp.shared_experts.linear_gate.weight",
                "model.layers.1.mlp.shared_experts.gate_proj.weight",
            ),
        ] {
            assert_eq!(canonical(stored).as_deref(), Some(want), "{stored}");
        }
        for kept in [
            "model.layers.1.mlp.experts.gate_up_proj",
            "lm_head.weight",
            "model.norm.weight",
        ] {
            assert_eq!(canonical(kept), None, "{kept}");
        }
    }

    use crate::config::test_util::*;

    /// A Hy4 config: hyper-connections, sinks, an output gate, bounded expert inputs.
    fn hy4() -> Value {
        let mut v = ds();
        let o = v.as_object_mut().unwrap();
        for k in ["rope_scaling", "first_k_dense_replace"] {
            o.remove(k);
        }
        v["model_type"] = json!("hy_v4");
        v["num_hidden_layers"] = json!(6);
        v["index_n_heads"] = json!(8);
        v["index_head_dim"] = json!(16);
        v["index_topk"] = json!(8);
        v["n_group"] = json!(1);
        v["topk_group"] = json!(1);
        v["hc_mult"] = json!(3);
        v["swiglu_limit"] = json!(7.0);
        v
    }

    #[test]
    fn hy_v4_reads_hyper_connections_and_its_attention() {
        let c = parse(&hy4()).unwrap();
        assert_eq!(c.family, "hy_v4");
        assert_eq!(
            c.residual,
            Residual::Hyper(HyperConfig {
                streams: 3,
                gain: 2.0,
                eps: 1e-6,
                sinkhorn: None,
                mean_head: false,
            })
        );
        assert_eq!(
            c.moe.activation,
            ExpertActivation::SwiGluInputsClamped { limit: 7.0 }
        );
        assert!(!c.rope.interleaved, "pairs split in halves");
        // One dense layer by default; layer 0 and every fourth from 1 with an indexer.
        assert!(!c.is_moe(0) && (1..6).all(|l| c.is_moe(l)));
        let shared: Vec<bool> = c
            .layer_plan
            .iter()
            .map(|p| match &p.attention {
                AttentionConfig::Dsa(d) => {
                    assert!(d.rope_last && d.mla.sinks && !d.interleaved);
                    assert_eq!(d.mla.output_gate, Some("gate_proj"));
                    assert_eq!(d.key_eps, 1e-6, "rms_norm_eps");
                    d.shared
                }
                _ => panic!("Hy4 attention is sparse"),
            })
            .collect();
        assert_eq!(shared, [false, false, true, true, true, false]);
        for (field, bad) in [
            ("hc_mult", json!(0)),
            ("swiglu_limit", json!(0.0)),
            (
                "indexer_types",
                json!(["shared", "full", "full", "full", "full", "full"]),
            ),
        ] {
            let mut v = hy4();
            v[field] = bad.clone();
            assert_eq!(field_of(parse(&v).unwrap_err()), field, "{bad}");
        }
    }
}
