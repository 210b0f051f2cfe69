//! GLM-5 (`glm_moe_dsa`): DeepSeek-V3.2's sparse attention with two differences. The
//! indexer's rotation is interleaved. And the indexer may be shared across layers: a layer
//! whose `indexer_types` entry is `shared` has no indexer and reuses the top-k of the last
//! `full` layer before it. `indexer_types` is given per layer or by the legacy
//! `index_topk_pattern` (`F`/`S` per layer); without either, layer `i` is full when
//! `max(i − index_skip_topk_offset + 1, 0)` is a multiple of `index_topk_freq` (defaults 2 and
//! 1: every layer full). The rest is DeepSeek-V3's blocks.

use serde_json::Value;

use super::{Family, Models};
use crate::ModelError;
use crate::attention::IndexerQuery;
use crate::config::{Cfg, ModelConfig};

pub(super) const FAMILY: Family = Family {
    name: "glm_moe_dsa",
    models: &[Models {
        model_types: &["glm_moe_dsa"],
        names: "GLM-5",
        features: "DeepSeek-V3.2's sparse attention with interleaved indexer rotation; layers that reuse the top-k of the last layer with an indexer (`indexer_types`)",
    }],
    read,
    gguf: &[],
};

fn read(c: &Cfg<'_>, model_type: &str) -> Result<ModelConfig, ModelError> {
    let v3 = super::deepseek_v3::read_as(c, model_type, FAMILY.name)?;
    let mut cfg = v3.cfg;
    let shared = indexer_types(c, cfg.layers, default_types(c)?)?;
    if shared.first() == Some(&true) {
        return Err(c.err(
            "indexer_types",
            "layer 0 is `shared`, but no layer before it has an indexer",
        ));
    }
    super::deepseek_v32::make_sparse(
        c,
        &mut cfg,
        &v3.mla,
        true,
        &shared,
        IndexerQuery::Latent,
        |_, _| {},
    )?;
    Ok(cfg)
}

/// GLM-5's default `indexer_types`: layer `i` shares unless
/// `max(i − index_skip_topk_offset + 1, 0)` is a multiple of `index_topk_freq`.
pub(super) fn default_types(c: &Cfg<'_>) -> Result<impl Fn(usize) -> bool, ModelError> {
    let freq = c.opt_usize("index_topk_freq")?.unwrap_or(1).max(1);
    let offset = c.opt_usize("index_skip_topk_offset")?.unwrap_or(2);
    Ok(move |i: usize| !(i + 1).saturating_sub(offset).is_multiple_of(freq))
}

/// Per layer, whether it shares the last full layer's top-k: `indexer_types`, else the legacy
/// `index_topk_pattern`, else `default(layer)`.
pub(super) fn indexer_types(
    c: &Cfg<'_>,
    n: usize,
    default: impl Fn(usize) -> bool,
) -> Result<Vec<bool>, ModelError> {
    let kind = |field: &str, s: &str| match s {
        "full" | "F" => Ok(false),
        "shared" | "S" => Ok(true),
        other => Err(c.err(
            field,
            format!("`{other}` is not supported (supported: full, shared)"),
        )),
    };
    for field in ["indexer_types", "index_topk_pattern"] {
        let list: Vec<String> = match c.get(field) {
            None | Some(Value::Null) => continue,
            Some(Value::String(s)) if field == "index_topk_pattern" => {
                s.chars().map(String::from).collect()
            }
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| c.err(field, "expected names"))
                })
                .collect::<Result<_, _>>()?,
            Some(v) => return Err(c.err(field, format!("expected a list, got {v}"))),
        };
        if list.len() != n {
            return Err(c.err(field, format!("{} entries for {n} layers", list.len())));
        }
        return list.iter().map(|s| kind(field, s)).collect();
    }
    Ok((0..n).map(default).collect())
}

/// The config reader's tests.
#[cfg(test)]
mod tests {
    use crate::config::test_util::*;

    #[test]
    fn glm_moe_dsa_shares_indexers_by_indexer_types_or_pattern() {
        let mut v = ds();
        v["model_type"] = json!("glm_moe_dsa");
        v["index_n_heads"] = json!(8);
        v["index_head_dim"] = json!(16);
        v["index_topk"] = json!(16);
        let n = v["num_hidden_layers"].as_u64().unwrap() as usize;
        let shared = |c: &ModelConfig| -> Vec<bool> {
            c.layer_plan
                .iter()
                .map(|p| match &p.attention {
                    AttentionConfig::Dsa(d) => {
                        assert!(d.interleaved, "GLM-5's indexer pairs are interleaved");
                        d.shared
                    }
                    _ => panic!("GLM-5 attention is sparse"),
                })
                .collect()
        };
        // Defaults: offset 2, frequency 1: every layer full.
        assert_eq!(shared(&parse(&v).unwrap()), vec![false; n]);
        let mut w = v.clone();
        w["index_topk_freq"] = json!(2);
        let want: Vec<bool> = (0..n).map(|i| (i + 1).saturating_sub(2) % 2 == 1).collect();
        assert_eq!(shared(&parse(&w).unwrap()), want);
        let pattern: String = (0..n).map(|i| if i % 2 == 1 { 'S' } else { 'F' }).collect();
        let mut w = v.clone();
        w["index_topk_pattern"] = json!(pattern);
        let alt: Vec<bool> = (0..n).map(|i| i % 2 == 1).collect();
        assert_eq!(shared(&parse(&w).unwrap()), alt);
        let mut w = v.clone();
        w["indexer_types"] = json!(
            alt.iter()
                .map(|&s| if s { "shared" } else { "full" })
                .collect::<Vec<_>>()
        );
        assert_eq!(shared(&parse(&w).unwrap()), alt);
        // A shared first layer has nothing to share; a wrong length or name is refused.
        for bad in [
            json!(vec!["shared"; n]),
            json!(["full"]),
            json!(vec!["half"; n]),
        ] {
            let mut w = v.clone();
            w["indexer_types"] = bad;
            assert_eq!(field_of(parse(&w).unwrap_err()), "indexer_types");
        }
    }
}
