//! The model: weights, the forward pass over a chunk of tokens, logits.

use std::path::Path;
use std::sync::Arc;

use sluice_format::Checkpoint;
use sluice_kernels::{Kernels, scalar};
use sluice_store::{Blob, ExpertStore, ShardSet, read_blob};

use crate::ModelError;
use crate::attention::attention;
use crate::config::ModelConfig;
use crate::exec::Exec;
use crate::moe::{moe, swiglu};
use crate::rope::{Angles, Rope};
use crate::state::State;
use crate::weights::{FfnSpec, WeightLayout};

/// Which logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// One row per input token.
    All,
    /// Only the last token's row.
    Last,
    /// None (prefill of a chunk that is not the last).
    None,
}

/// How to build a model.
#[derive(Clone, Debug)]
pub struct ModelOptions {
    /// Kernels (their ISA).
    pub kernels: Kernels,
    /// Compute threads.
    pub threads: usize,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            kernels: Kernels::best(),
            threads: 1,
        }
    }
}

/// A loaded model, immutable and shareable across threads; per-sequence state lives in [`State`].
#[derive(Debug)]
pub struct Model {
    cfg: ModelConfig,
    layout: WeightLayout,
    exec: Exec,
    rope: Rope,
    embed: Arc<Blob>,
    layers: Vec<Arc<Blob>>,
    head: Arc<Blob>,
    experts: Arc<ExpertStore>,
}

impl Model {
    /// Opens the checkpoint in `dir` with every trunk tensor resident and experts read on demand.
    pub fn open(dir: impl AsRef<Path>, opts: ModelOptions) -> Result<Model, ModelError> {
        let ck = Checkpoint::open(dir.as_ref())?;
        let cfg = ModelConfig::from_json(ck.config(), &ck.dir().join("config.json"))?;
        let layout = WeightLayout::new(&ck, &cfg)?;
        let paths: Vec<_> = ck.shards().iter().map(|s| s.path.clone()).collect();
        let reader: Arc<ShardSet> = Arc::new(ShardSet::open(&paths, false)?);
        let embed = Arc::new(read_blob(reader.as_ref(), &layout.embed.pieces)?);
        let layers = layout
            .layers
            .iter()
            .map(|p| read_blob(reader.as_ref(), &p.pieces).map(Arc::new))
            .collect::<Result<_, _>>()?;
        let head = Arc::new(read_blob(reader.as_ref(), &layout.head.pieces)?);
        let experts = Arc::new(ExpertStore::new(reader, layout.experts.clone()));
        let exec = Exec::new(opts.kernels, opts.threads)?;
        let rope = Rope::new(&cfg.rope);
        Ok(Model {
            cfg,
            layout,
            exec,
            rope,
            embed,
            layers,
            head,
            experts,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Where the weights are.
    pub fn layout(&self) -> &WeightLayout {
        &self.layout
    }

    /// The instruction set of the kernels in use.
    pub fn isa(&self) -> sluice_kernels::Isa {
        self.exec.kernels().isa()
    }

    /// Compute threads.
    pub fn threads(&self) -> usize {
        self.exec.threads()
    }

    /// The expert store.
    pub fn experts(&self) -> &Arc<ExpertStore> {
        &self.experts
    }

    /// A fresh sequence state.
    pub fn new_state(&self) -> State {
        State::new(&self.cfg)
    }

    /// Runs `tokens` through the model after the positions already in `state`, appending to its
    /// cache. Returns the logits asked for, `[rows, vocab]` row-major.
    pub fn forward(
        &self,
        state: &mut State,
        tokens: &[u32],
        want: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        let cfg = &self.cfg;
        let h = cfg.hidden;
        let t = tokens.len();
        if t == 0 {
            return Ok(Vec::new());
        }
        if let Some(&bad) = tokens.iter().find(|&&id| id as usize >= cfg.vocab) {
            return Err(ModelError::Token {
                id: bad,
                vocab: cfg.vocab,
            });
        }
        let pos0 = state.pos;
        if pos0 + t > cfg.max_positions {
            return Err(ModelError::ContextFull {
                positions: pos0 + t,
                max: cfg.max_positions,
            });
        }

        // Embeddings.
        let emb = self.layout.embed_spec.view(&self.embed)?;
        let mut hs = vec![0f32; t * h];
        for (i, &id) in tokens.iter().enumerate() {
            let row = emb.row(id as usize);
            for (j, v) in hs[i * h..(i + 1) * h].iter_mut().enumerate() {
                *v = scalar::code(emb.codes(), row, j);
            }
        }

        let angles = Angles::new(&self.rope, pos0, t);
        let k = self.exec.kernels();
        let mut x = vec![0f32; t * h];
        for l in 0..cfg.layers {
            let blob = &self.layers[l];
            let spec = &self.layout.layer_specs[l];
            let w = spec.input_norm.to_f32(blob);
            for i in 0..t {
                k.rmsnorm(
                    &hs[i * h..(i + 1) * h],
                    &w,
                    cfg.eps,
                    &mut x[i * h..(i + 1) * h],
                );
            }
            let a = attention(
                &self.exec,
                cfg,
                &self.rope,
                &angles,
                &spec.attn,
                blob,
                &mut state.layers[l],
                pos0,
                &x,
            )?;
            for (s, v) in hs.iter_mut().zip(&a) {
                *s += v;
            }
            let w = spec.post_norm.to_f32(blob);
            for i in 0..t {
                k.rmsnorm(
                    &hs[i * h..(i + 1) * h],
                    &w,
                    cfg.eps,
                    &mut x[i * h..(i + 1) * h],
                );
            }
            let f = match &spec.ffn {
                FfnSpec::Dense(m) => swiglu(&self.exec, m, blob, &x, t)?,
                moe_spec @ FfnSpec::Moe { .. } => moe(
                    &self.exec,
                    cfg,
                    l,
                    moe_spec,
                    blob,
                    &self.experts,
                    &self.layout.expert_specs[l],
                    &x,
                    pos0,
                    state.routes.as_mut(),
                )?,
            };
            for (s, v) in hs.iter_mut().zip(&f) {
                *s += v;
            }
        }
        state.pos += t;

        let rows = match want {
            Logits::All => 0..t,
            Logits::Last => t - 1..t,
            Logits::None => return Ok(Vec::new()),
        };
        let head = &self.layout.head_spec;
        let w = head.norm.to_f32(&self.head);
        let mut xn = vec![0f32; rows.len() * h];
        for (o, i) in rows.clone().enumerate() {
            k.rmsnorm(
                &hs[i * h..(i + 1) * h],
                &w,
                cfg.eps,
                &mut xn[o * h..(o + 1) * h],
            );
        }
        let mut logits = vec![0f32; rows.len() * cfg.vocab];
        self.exec
            .matmul(&head.lm_head.view(&self.head)?, &xn, &mut logits);
        Ok(logits)
    }
}
