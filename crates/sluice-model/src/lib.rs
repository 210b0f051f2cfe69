//! sluice's mixture-of-experts transformers.
//!
//! This crate computes the forward pass — prefill over a chunk of tokens and incremental decode
//! with a KV cache or recurrent state — for every family in [`arch::FAMILIES`] (one module each
//! under `arch/`, each listing the models it runs and what is distinctive in them; README.md's
//! model table is checked against that list), and matches Hugging Face transformers (and, for
//! Kimi K3, Moonshot's own modeling code) on the fixtures under `testdata/`. What mixes tokens
//! is one module per kind under [`attention`]; the feed-forward blocks are under `ffn/`.
//!
//! Checkpoints load as released: FP8 E4M3 with block scales (DeepSeek-V3, Kimi K2),
//! compressed-tensors pack-quantized INT4 (Kimi K2 Thinking, K2.5) and MXFP4 (Kimi K3,
//! GPT-OSS), read from `quantization_config` (see [`quant`]). Packed weights stay packed from
//! the file to the kernels: a cached expert holds exactly its bytes on disk.
//!
//! The router is kept apart from the experts: a layer routes every token of a chunk, then asks
//! the expert store for the union of the experts chosen and runs each once over all the rows
//! that chose it. Because every kernel computes a row the same way however many rows share the
//! call, chunked prefill gives the same bits as token-by-token decode, and the thread count,
//! memory budget and cache policy never change an output bit.

#![forbid(unsafe_code)]

pub mod arch;
pub mod attention;
pub mod config;
mod desc;
mod exec;
mod ffn;
mod gguf;
mod model;
mod mtp;
mod net;
mod options;
mod pass;
pub mod plan;
pub mod quant;
mod residual;
mod rope;
mod spec;
mod state;
pub mod weights;

pub use config::ModelConfig;
pub use desc::Description;
pub use exec::Exec;
pub use model::{
    Logits, Model, ModelOptions, PassTimes, PolicyChoice, PolicyFactory, PrefillEvent,
    PrefillOptions, Prefilled,
};
pub use mtp::mtp_runs;
pub use plan::MemoryPlan;
pub use quant::Quantization;
pub use rope::Rope;
pub use state::{Route, Snapshot, State};

use std::path::PathBuf;

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// `config.json` lacks a field or holds a value that is not supported.
    #[error("{}: `{field}`: {msg}", file.display())]
    Config {
        /// The file.
        file: PathBuf,
        /// The field (dotted path).
        field: String,
        /// What is wrong.
        msg: String,
    },
    /// A tensor has the wrong shape or dtype for its role.
    #[error("tensor `{tensor}`: {msg}")]
    Tensor {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        msg: String,
    },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    Token {
        /// The id.
        id: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// The sequence would exceed the positions available.
    #[error("context full: {positions} positions needed, {max} available")]
    ContextFull {
        /// Positions needed.
        positions: usize,
        /// Positions available.
        max: usize,
    },
    /// The KV cache cannot grow: the budget's pool holds no more pages beside the other
    /// sequences' KV caches and the expert cache's floor.
    #[error(
        "KV cache full: {positions} positions needed, the memory budget holds {held} for this sequence now (the other sequences' KV caches and one token's experts take the rest)"
    )]
    KvFull {
        /// Positions needed.
        positions: usize,
        /// Positions the sequence holds.
        held: usize,
    },
    /// A layer produced NaN or infinite values (NaN/Inf weights in it or in its experts).
    #[error(
        "layer {layer} produced NaN or infinite values: the checkpoint's weights for this layer or its experts are corrupt"
    )]
    NonFinite {
        /// The layer.
        layer: usize,
    },
    /// A recurrent state cannot go back to the position asked for.
    #[error(
        "cannot truncate to position {pos}: at {at}, a recurrent (KDA) state can only go back to 0{}",
        earliest.map(|e| format!(" or {e}")).unwrap_or_default()
    )]
    Truncate {
        /// The position asked for.
        pos: usize,
        /// The current position.
        at: usize,
        /// The position before the latest forward pass, when it can go back there.
        earliest: Option<usize>,
    },
    /// The thread pool could not start.
    #[error("could not start compute threads: {0}")]
    Threads(String),
    /// A checkpoint error.
    #[error(transparent)]
    Format(#[from] sluice_format::FormatError),
    /// An error about a tensor of a file, with the file (a GGUF model, whose tensor errors
    /// would not otherwise say where).
    #[error("{}: {source}", path.display())]
    InFile {
        /// The file.
        path: std::path::PathBuf,
        /// The error.
        source: Box<ModelError>,
    },
    /// An expert-store error.
    #[error(transparent)]
    Store(#[from] sluice_store::StoreError),
    /// A kernel rejected a layout.
    #[error("kernel: {0}")]
    Kernel(#[from] sluice_kernels::KernelError),
    /// The multi-token-prediction layer cannot be loaded or run.
    #[error("draft mtp: {0}")]
    Mtp(String),
    /// The description and the weights (or a layer's cache) disagree in a way loading should
    /// have refused: a defect in sluice, reported rather than panicking.
    #[error("the configuration and the weights disagree: {what} (a defect in sluice)")]
    Mismatch {
        /// Which part, and how.
        what: String,
    },
    /// A call's arguments disagree with each other.
    #[error("{call}: {msg}")]
    Call {
        /// The function called.
        call: &'static str,
        /// What is wrong.
        msg: String,
    },
    /// More sequences in one pass than the memory plan was made for.
    #[error(
        "{asked} sequences in one pass, but the memory plan is for {planned} (ModelOptions::sequences)"
    )]
    Sequences {
        /// Sequences in the pass.
        asked: usize,
        /// Sequences the plan holds.
        planned: usize,
    },
    /// A task computing routed experts panicked, or an expert's read never landed.
    #[error("routed experts: {0}")]
    ExpertTask(String),
}
