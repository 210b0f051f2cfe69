//! DeepSeek-V3.2 (`deepseek_v32`): DeepSeek-V3 with DeepSeek Sparse Attention in every layer
//! ([`crate::attention::dsa`]). A lightning indexer (`index_n_heads` heads of
//! `index_head_dim`, its rotation's pairs split in halves) picks the `index_topk` positions each
//! query attends to. The dense and MoE layers follow `mlp_layer_types`, by default the first
//! `first_k_dense_replace` dense, as in DeepSeek-V3.

use super::{Family, Models};
use crate::ModelError;
use crate::attention::{DsaConfig, IndexerQuery};
use crate::config::{AttentionConfig, Cfg, MlaConfig, MlpKind, ModelConfig};

pub(super) const FAMILY: Family = Family {
    name: "deepseek_v32",
    models: &[Models {
        model_types: &["deepseek_v32"],
        names: "DeepSeek-V3.2",
        features: "DeepSeek-V3's blocks with DeepSeek Sparse Attention: a lightning indexer (its own projections and key cache) picks the `index_topk` positions each query attends to",
    }],
    read,
    gguf: &[],
};

fn read(c: &Cfg<'_>, model_type: &str) -> Result<ModelConfig, ModelError> {
    let v3 = super::deepseek_v3::read_as(c, model_type, FAMILY.name)?;
    let mut cfg = v3.cfg;
    let shared = vec![false; cfg.layers];
    make_sparse(
        c,
        &mut cfg,
        &v3.mla,
        false,
        &shared,
        IndexerQuery::Latent,
        |_, _| {},
    )?;
    Ok(cfg)
}

/// Makes every layer of `cfg` (read by DeepSeek-V3's reader, whose attention is `mla`) sparse:
/// the indexer's `index_*` fields, its rotation `interleaved` or not, the layers `shared[l]`
/// reusing the last full layer's top-k, its queries from `query`, then what the family changes
/// in layer `l`'s (`tweak`); the dense and MoE layers by `mlp_layer_types` when given.
#[allow(clippy::too_many_arguments)]
pub(super) fn make_sparse(
    c: &Cfg<'_>,
    cfg: &mut ModelConfig,
    mla: &MlaConfig,
    interleaved: bool,
    shared: &[bool],
    query: IndexerQuery,
    tweak: impl Fn(usize, &mut DsaConfig),
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
    for (l, plan) in cfg.layer_plan.iter_mut().enumerate() {
        let mut d = DsaConfig {
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
        };
        tweak(l, &mut d);
        plan.attention = AttentionConfig::Dsa(d);
        plan.mlp = MlpKind::moe_or_dense(sparse[l], dense);
    }
    crate::config::check_widths(c, cfg)?;
    Ok(())
}

/// The config reader's tests.
#[cfg(test)]
mod tests {
    use crate::config::test_util::*;

    #[test]
    fn deepseek_v32_reads_the_indexer() {
        let mut v = ds();
        v["model_type"] = json!("deepseek_v32");
        v["index_n_heads"] = json!(8);
        v["index_head_dim"] = json!(32);
        v["index_topk"] = json!(16);
        v["layer_types"] = json!(vec![
            "indexed_attention";
            v["num_hidden_layers"].as_u64().unwrap() as usize
        ]);
        let c = parse(&v).unwrap();
        let AttentionConfig::Dsa(d) = &c.layer_plan[0].attention else {
            panic!("DeepSeek-V3.2 attention is sparse");
        };
        assert_eq!(
            (d.heads, d.head_dim, d.topk, d.interleaved),
            (8, 32, 16, false)
        );
        assert_eq!(c.family, "deepseek_v32");
        for (field, bad) in [
            ("index_topk", json!(0)),
            ("index_head_dim", json!(2)),
            ("layer_types", json!(["full_attention"])),
        ] {
            let mut w = v.clone();
            w[field] = bad;
            assert_eq!(field_of(parse(&w).unwrap_err()), field, "{field}");
        }
        let mut w = v.clone();
        w.as_object_mut().unwrap().remove("index_n_heads");
        assert_eq!(field_of(parse(&w).unwrap_err()), "index_n_heads");
    }
}
