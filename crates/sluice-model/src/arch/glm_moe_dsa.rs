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
