//! A model as a plain description — its configuration, where its weights are, its generation
//! defaults — built from the checkpoint's headers without loading its weights,
//! and planned for a budget by the same planner [`crate::Model`] uses. `sluice inspect`, the
//! engine and the batch planner all go through here.

use std::path::Path;

use serde_json::Value;
use sluice_format::Checkpoint;
use sluice_store::{Reader, ShardSet};

use crate::ModelError;
use crate::config::ModelConfig;
use crate::options::ModelOptions;
use crate::plan::MemoryPlan;
use crate::weights::WeightLayout;

/// A checkpoint read as a model: config, weight layout and generation defaults.
#[derive(Debug)]
pub struct Description {
    /// The checkpoint (headers and small JSON files; no weights).
    pub checkpoint: Checkpoint,
    /// The configuration, read strictly by the model's family.
    pub config: ModelConfig,
    /// Where every weight is, checked against its role.
    pub layout: WeightLayout,
}

impl Description {
    /// Reads the checkpoint in `dir`: `config.json` by its family, every tensor header checked
    /// against its role. Of the weights it reads only the few small tensors whose values are
    /// checked (INT4 `weight_shape`, Kimi K3's zero-padded `A_log`).
    pub fn open(dir: impl AsRef<Path>) -> Result<Description, ModelError> {
        let mut checkpoint = Checkpoint::open(dir.as_ref())?;
        // A GGUF model's config is made from its metadata: errors name the file.
        let config_path = if checkpoint.gguf().is_some() {
            crate::gguf::to_hf(&mut checkpoint, &crate::arch::gguf_arches())?;
            checkpoint.dir().to_path_buf()
        } else {
            checkpoint.dir().join("config.json")
        };
        let config = ModelConfig::from_json(checkpoint.config(), &config_path)?;
        if let Some(r) = config.names.rename {
            checkpoint.rename(r.canonical)?;
        }
        let layout =
            WeightLayout::new(&checkpoint, &config).map_err(|e| match (checkpoint.gguf(), e) {
                (Some(_), e @ ModelError::Tensor { .. }) => ModelError::InFile {
                    path: checkpoint.dir().to_path_buf(),
                    source: Box::new(e),
                },
                (_, e) => e,
            })?;
        Ok(Description {
            checkpoint,
            config,
            layout,
        })
    }

    /// `generation_config.json`, parsed, when the model has one (read once, with the
    /// checkpoint).
    pub fn generation_config(&self) -> Option<&Value> {
        self.checkpoint.generation_config()
    }

    /// Opens the shards for reading (O_DIRECT where the file system accepts it and
    /// `direct_io` asks for it).
    pub fn shards(&self, direct_io: bool) -> Result<ShardSet, ModelError> {
        let paths: Vec<_> = self
            .checkpoint
            .shards()
            .iter()
            .map(|s| s.path.clone())
            .collect();
        Ok(ShardSet::open(&paths, direct_io)?)
    }

    /// The memory plan `opts` gives this model read through `reader`: what [`crate::Model`]
    /// would allocate, computed without allocating it.
    pub fn plan(&self, reader: &dyn Reader, opts: &ModelOptions) -> Result<MemoryPlan, ModelError> {
        plan(&self.config, &self.layout, reader, opts)
    }
}

/// The plan for `cfg` and `layout` under `opts`.
pub(crate) fn plan(
    cfg: &ModelConfig,
    layout: &WeightLayout,
    reader: &dyn Reader,
    opts: &ModelOptions,
) -> Result<MemoryPlan, ModelError> {
    Ok(MemoryPlan::new(cfg, layout, reader, opts)?)
}
