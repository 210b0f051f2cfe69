//! DeepSeek-V3.2 (`deepseek_v32`): DeepSeek-V3 with DeepSeek Sparse Attention in every layer
//! ([`crate::attention::dsa`]). A lightning indexer (`index_n_heads` heads of
//! `index_head_dim`, its rotation's pairs split in halves) picks the `index_topk` positions each
//! query attends to. The dense and MoE layers follow `mlp_layer_types`, by default the first
//! `first_k_dense_replace` dense, as in DeepSeek-V3.

use super::{Family, Models};
use crate::ModelError;
use crate::attention::{DsaConfig, IndexerQuery};
use crate::config::{AttentionConfig, Cfg, MlpKind, ModelConfig};

pub(super) const FAMILY: Family = Family {
    name: "deepseek_v32",
    models: &[Models {
        model_types: &["deepseek_v32"],
        names: "DeepSeek-V3.2",
        features: "DeepSeek-V3's blocks with DeepSeek Sparse Attention: a lightning indexer (its own projections and key cache) picks the `index_topk` positions each query attends to",
    }],
    read,
};

fn read(c: &Cfg<'_>, model_type: &str) -> Result<ModelConfig, ModelError> {
    let mut cfg = super::deepseek_v3::read_as(c, model_type, FAMILY.name)?;
    let shared = vec![false; cfg.layers];
    make_sparse(c, &mut cfg, false, &shared, IndexerQuery::Latent)?;
    Ok(cfg)
}

/// Makes every MLA layer of `cfg` (read by DeepSeek-V3's reader) sparse: the indexer's
/// `index_*` fields, its rotation `interleaved` or not, the layers `shared[l]` reusing the last
/// full layer's top-k, its queries from `query`; the dense and MoE layers by `mlp_layer_types`
/// when given.
pub(super) fn make_sparse(
    c: &Cfg<'_>,
    cfg: &mut ModelConfig,
    interleaved: bool,
    shared: &[bool],
    query: IndexerQuery,
) -> Result<(), ModelError> {
    let heads = c.pos_usize("index_n_heads")?;
    let head_dim = c.pos_usize("index_head_dim")?;
    let topk = c.pos_usize("index_topk")?;
    if let Some(types) = c.get("layer_types").filter(|v| !v.is_null()) {
        let ok = types
            .as_array()
            .is_some_and(|a| a.len() == cfg.layers && a.iter().all(|t| t == "indexed_attention"));
        if !ok {
            return Err(c.err(
                "layer_types",
                format!(
                    "only `indexed_attention` in each of the {} layers is supported",
                    cfg.layers
                ),
            ));
        }
    }
    let sparse =
        super::common::layer_kinds(c, "mlp_layer_types", cfg.layers, ["sparse", "dense"], |l| {
            cfg.is_moe(l)
        })?;
    let dense = c.pos_usize("intermediate_size")?;
    for (l, plan) in cfg.layer_plan.iter_mut().enumerate() {
        let AttentionConfig::Mla(mla) = &plan.attention else {
            return Err(ModelError::Internal("DeepSeek-V3 layers are MLA".into()));
        };
        if query == IndexerQuery::Latent && mla.q_lora_rank.is_none() {
            return Err(c.err(
                "q_lora_rank",
                "required: the indexer reads the query latent",
            ));
        }
        if head_dim < mla.qk_rope_head_dim {
            return Err(c.err(
                "index_head_dim",
                format!(
                    "{head_dim} is less than qk_rope_head_dim {} (the part it rotates)",
                    mla.qk_rope_head_dim
                ),
            ));
        }
        plan.attention = AttentionConfig::Dsa(DsaConfig {
            mla: mla.clone(),
            heads,
            head_dim,
            topk,
            interleaved,
            shared: shared[l],
            query,
            rope_last: false,
            key_eps: crate::attention::dsa::INDEXER_EPS,
            pool: None,
        });
        plan.mlp = MlpKind::moe_or_dense(sparse[l], dense);
    }
    crate::config::check_widths(c, cfg)?;
    Ok(())
}
