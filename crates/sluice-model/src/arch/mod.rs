//! Model families: one module each, owning everything specific to it — the `model_type`
//! values it accepts, its strict config reader (the fields it reads, the ones it knowingly
//! ignores, the error naming a bad one), its tensor names, its layer plan (which layers are
//! dense or MoE, which attention kind each has), its router and any quirk. A family produces
//! a [`ModelConfig`]; nothing outside this directory asks which family a model is.
//!
//! Adding a family is one module here and one row in [`FAMILIES`]; see "How to add a model
//! family" in docs/ARCHITECTURE.md.

use std::path::Path;

use serde_json::Value;

use crate::ModelError;
use crate::config::{Cfg, ModelConfig};
use crate::gguf::GgufArch;

mod common;
mod deepseek_v3;
mod deepseek_v32;
mod deepseek_v4;
mod ernie4_5_moe;
mod glm4_moe;
mod glm5_next;
mod glm_moe_dsa;
mod gpt_oss;
mod hy_v4;
mod kimi_linear;
mod llama;
mod llama4;
mod longcat_flash;
mod mimo_v2_flash;
mod minimax_m2;
mod mistral_large4;
mod mixtral;
mod olmoe;
mod qwen;
mod qwen3_next;
mod step3p7;

/// One row of the model table (README.md's, which a test keeps equal to
/// these): the `model_type` values of some releases, their names, what is distinctive.
pub struct Models {
    /// The `model_type` values, as `config.json` spells them.
    pub model_types: &'static [&'static str],
    /// The models, as users know them.
    pub names: &'static str,
    /// What is distinctive in them (the table's third column).
    pub features: &'static str,
}

/// A model family: its name, the models it runs (whose `model_type` values are the ones it
/// accepts) and its config reader.
pub struct Family {
    /// The module's name.
    pub name: &'static str,
    /// The models it runs, one row of the model table each.
    pub models: &'static [Models],
    /// Reads a `config.json` whose `model_type` is one of [`Family::model_types`] (given).
    pub(crate) read: fn(&Cfg<'_>, &str) -> Result<ModelConfig, ModelError>,
    /// The GGUF architectures read as this family's checkpoints: how llama.cpp's metadata and
    /// tensor names map onto its `config.json` and transformers names.
    pub(crate) gguf: &'static [GgufArch],
}

impl Family {
    /// The `model_type` values it accepts.
    pub fn model_types(&self) -> impl Iterator<Item = &'static str> {
        self.models
            .iter()
            .flat_map(|m| m.model_types.iter().copied())
    }
}

impl std::fmt::Debug for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({})",
            self.name,
            self.model_types().collect::<Vec<_>>().join(", ")
        )
    }
}

/// Every family sluice implements, in the order `model_type`s are listed in errors.
pub static FAMILIES: &[Family] = &[
    deepseek_v3::FAMILY,
    qwen::FAMILY,
    mixtral::FAMILY,
    olmoe::FAMILY,
    gpt_oss::FAMILY,
    kimi_linear::FAMILY,
    llama::FAMILY,
    glm4_moe::FAMILY,
    minimax_m2::FAMILY,
    ernie4_5_moe::FAMILY,
    qwen3_next::FAMILY,
    mimo_v2_flash::FAMILY,
    llama4::FAMILY,
    longcat_flash::FAMILY,
    step3p7::FAMILY,
    deepseek_v32::FAMILY,
    glm_moe_dsa::FAMILY,
    mistral_large4::FAMILY,
    hy_v4::FAMILY,
    glm5_next::FAMILY,
    deepseek_v4::FAMILY,
];

/// Every GGUF architecture read, as the families supply them.
pub(crate) fn gguf_arches() -> Vec<&'static GgufArch> {
    FAMILIES.iter().flat_map(|f| f.gguf).collect()
}

/// The family that reads `model_type`, if any.
pub fn family(model_type: &str) -> Option<&'static Family> {
    FAMILIES
        .iter()
        .find(|f| f.model_types().any(|t| t == model_type))
}

/// Every `model_type` accepted.
pub fn model_types() -> Vec<&'static str> {
    FAMILIES.iter().flat_map(|f| f.model_types()).collect()
}

// Reading a config is the registry's job: `config` holds the types and never asks which family
// a model is.
impl ModelConfig {
    /// Reads `config.json` (already parsed) strictly, by the family its `model_type` names.
    /// `file` names it in errors.
    pub fn from_json(v: &Value, file: &Path) -> Result<ModelConfig, ModelError> {
        let c = Cfg {
            v,
            file,
            prefix: String::new(),
        };
        if !v.is_object() {
            return Err(c.err("", "top level is not an object"));
        }
        let model_type = c.str("model_type")?;
        let Some(family) = family(model_type) else {
            return Err(c.err(
                "model_type",
                format!(
                    "`{model_type}` is not supported (supported: {})",
                    model_types().join(", ")
                ),
            ));
        };
        (family.read)(&c, model_type)
    }

    /// Reads and validates `config.json` from a file.
    pub fn from_file(path: &Path) -> Result<ModelConfig, ModelError> {
        let v = sluice_format::read_json(path, 16 << 20)?;
        ModelConfig::from_json(&v, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_model_type_has_one_family() {
        let all = model_types();
        for t in &all {
            assert_eq!(all.iter().filter(|x| *x == t).count(), 1, "{t}");
            assert!(family(t).is_some_and(|f| f.model_types().any(|x| x == *t)));
        }
        assert!(family("llama5").is_none());
    }
}
