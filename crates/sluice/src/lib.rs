//! Run mixture-of-experts language models far larger than RAM on one CPU.
//!
//! sluice keeps the dense trunk of a model in memory and reads the routed experts from the
//! checkpoint's own files behind an expert cache. The memory budget is a dial: the same model,
//! prompt and sampling options give byte-identical output at every budget, cache policy and
//! thread count — only the speed changes.
//!
//! An [`Engine`] is the loaded model (immutable, `Send + Sync`, cheap to clone); a [`Session`]
//! holds one conversation's KV cache. Several sessions may run on one engine at once.
//!
//! ```no_run
//! use sluice::{Engine, GenerateOptions, Prompt};
//! let engine = Engine::builder().model("models/demo").threads(2).build()?;
//! let mut session = engine.session()?;
//! let opts = GenerateOptions { max_tokens: 32, ..Default::default() };
//! for token in session.generate(Prompt::Text("It is a truth universally acknowledged"), &opts)? {
//!     print!("{}", token?.text);
//! }
//! # Ok::<(), sluice::Error>(())
//! ```

#![forbid(unsafe_code)]

mod batch;
mod decoding;
mod draft;
mod engine;
mod generate;
mod options;
mod prefix;
mod saved;
#[cfg(feature = "server")]
pub mod server;
mod session;
mod stats;
mod sysmem;
#[cfg(feature = "server")]
mod toolcall;
pub mod tools;

// The API a program running models needs, each name at one path: the modules behind it are
// private. The tools' helpers (doctor, inspect, pack, synth, traces and their replay) live in
// `tools`; the HTTP server (feature `server`) in `server`.
pub use batch::{Batcher, BatcherStats, Event, Finished, OwnedPrompt, Sink};
pub use engine::{
    CompiledGrammar, Engine, EngineBuilder, Memory, Prompt, max_threads, resolve_memory,
};
pub use generate::{Token, TokenLogprobs};
pub use options::{
    Draft, FinishReason, GenerateOptions, MAX_DRAFT, MAX_TOP_LOGPROBS, PrefillHook, PrefillProgress,
};
pub use prefix::PrefixCacheStats;
pub use session::{Generation, Session};
pub use sluice_grammar::Grammar;
pub use sluice_kernels::{Isa, Numerics};
pub use sluice_model::{Description, MemoryPlan, ModelConfig};
pub use sluice_sampler::SamplingOptions;
pub use sluice_store::{
    ExpertStats, IoMode, Key as ExpertKey, PREFETCH_PRECISION, Policy, PolicyChoice, PolicyFactory,
};
pub use sluice_text::{ChatTemplate, Message, StreamDecoder, Tokenizer, tiktoken};
pub use stats::{EngineStats, GenerationStats, PrefillSpanStats, peak_rss_bytes};

/// Whether `path` can name a model: a directory (Hugging Face, a pack, or one holding a GGUF
/// model) or a `.gguf` file.
pub fn is_model_path(path: &std::path::Path) -> bool {
    path.is_dir()
        || (path.is_file()
            && path
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("gguf")))
}

/// A model's text side: its tokenizer and chat template, when it has them.
pub(crate) struct Text {
    pub(crate) tokenizer: Option<Tokenizer>,
    pub(crate) template: Option<ChatTemplate>,
    /// Why a GGUF model has no tokenizer: its vocabulary could not be built.
    pub(crate) error: Option<String>,
}

/// The tokenizer and chat template of a described model: from a GGUF model's metadata, else
/// from the files of its directory. A GGUF vocabulary sluice cannot build (another kind, or
/// metadata llama.cpp would refuse too) leaves the model without one — token ids still run —
/// and [`Text::error`] says why, for the error a text prompt then gets.
pub(crate) fn load_text(desc: &Description) -> Result<Text, Error> {
    let ck = &desc.checkpoint;
    if let Some(set) = ck.gguf() {
        let h = set.header();
        return Ok(match Tokenizer::from_gguf(h, &h.path) {
            Ok(t) => Text {
                tokenizer: Some(t),
                template: ChatTemplate::from_gguf(h, &h.path)?,
                error: None,
            },
            Err(e) => Text {
                tokenizer: None,
                template: None,
                error: Some(e.to_string()),
            },
        });
    }
    Ok(Text {
        tokenizer: Tokenizer::from_dir(ck.dir())?,
        template: ChatTemplate::from_dir(ck.dir())?,
        error: None,
    })
}

use std::path::PathBuf;

/// Everything that can go wrong, by layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller asked for something impossible (bad option, missing directory). Only for
    /// the caller's input: failures while running have variants of their own.
    #[error("{0}")]
    Usage(String),
    /// A file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The tokenizer failed to load or run.
    #[error("{}: {msg}", path.display())]
    Tokenizer {
        /// Its file.
        path: PathBuf,
        /// What went wrong.
        msg: String,
    },
    /// The chat template failed to compile or render.
    #[error("{}: chat template: {msg}", path.display())]
    Template {
        /// Its file.
        path: PathBuf,
        /// What went wrong.
        msg: String,
    },
    /// A sampling option is out of range.
    #[error(transparent)]
    Sampler(#[from] sluice_sampler::SamplerError),
    /// A grammar or JSON schema that does not compile, or constrained decoding that failed
    /// while generating.
    #[error(transparent)]
    Grammar(#[from] sluice_grammar::Error),
    /// The model failed.
    #[error(transparent)]
    Model(#[from] sluice_model::ModelError),
    /// The checkpoint is malformed.
    #[error(transparent)]
    Format(#[from] sluice_format::FormatError),
    /// The expert store failed.
    #[error(transparent)]
    Store(#[from] sluice_store::StoreError),
    /// The batcher's worker has stopped (the batcher is being dropped, or its thread ended
    /// abnormally), so it takes no more jobs and a job in flight gets no result. A failure
    /// while running, not the caller's input.
    #[error("the batcher has stopped: its worker thread is no longer running")]
    BatcherStopped,
    /// A thread the engine needs could not be started.
    #[error("cannot start the {name} thread: {source}")]
    Thread {
        /// The thread's name.
        name: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// The server could not listen on its address (in use, not this machine's, not
    /// permitted).
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// More sequences (sessions, batch slots) than the memory plan holds state for.
    #[error(
        "the memory plan holds the KV cache of {planned} sequences inside the budget and {open} are in use, so {wanted} more do not fit: drop a session or batcher, or build the engine for more (EngineBuilder::sequences, --batch-size)"
    )]
    Sequences {
        /// Sequences asked for.
        wanted: usize,
        /// Sequences in use (open sessions, batcher widths).
        open: usize,
        /// Sequences the plan holds.
        planned: usize,
    },
}

impl From<sluice_text::Error> for Error {
    fn from(e: sluice_text::Error) -> Error {
        use sluice_text::Error as T;
        match e {
            T::Tokenizer { path, msg } => Error::Tokenizer { path, msg },
            T::Template { path, msg } => Error::Template { path, msg },
            T::Format(f) => Error::Format(f),
            // A prompt too long for the context is the caller's input.
            e @ T::PromptTooLong { .. } => Error::Usage(e.to_string()),
            e => Error::Usage(e.to_string()),
        }
    }
}

impl Error {
    /// Whether the error is the user's input (bad option, malformed model files) rather than a
    /// failure while running. The CLI exits 2 for these, 1 otherwise.
    pub fn is_input_error(&self) -> bool {
        use sluice_model::ModelError as M;
        use sluice_store::StoreError as S;
        let store_input = |s: &S| {
            matches!(
                s,
                S::BudgetTooSmall { .. } | S::UnknownPolicy(_) | S::Corrupt(_)
            )
        };
        fn model_input(m: &M, store_input: &dyn Fn(&S) -> bool) -> bool {
            match m {
                M::Store(s) => store_input(s),
                // A tensor of a GGUF file: the file's fault as much as the tensor's.
                M::InFile { source, .. } => model_input(source, store_input),
                m => matches!(
                    m,
                    M::Config { .. }
                        | M::Tensor { .. }
                        | M::Token { .. }
                        | M::Format(_)
                        | M::ContextFull { .. }
                        | M::NonFinite { .. }
                        | M::Mtp(_)
                ),
            }
        }
        match self {
            Error::Usage(_)
            | Error::Tokenizer { .. }
            | Error::Template { .. }
            | Error::Sampler(_)
            | Error::Sequences { .. }
            | Error::Format(_) => true,
            // A grammar that fails part-way (its limits reached) is the caller's grammar too.
            Error::Grammar(g) => !matches!(g, sluice_grammar::Error::Vocab(_)),
            Error::Store(s) => store_input(s),
            Error::Model(m) => model_input(m, &store_input),
            Error::Io { .. }
            | Error::BatcherStopped
            | Error::Thread { .. }
            | Error::Listen { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Error;

    #[test]
    fn runtime_failures_are_not_input_errors() {
        // The CLI exits 2 for input errors and 1 for the rest: a stopped batcher, a thread
        // that would not start or an address it cannot listen on are not bad flags.
        assert!(Error::Usage("bad flag".into()).is_input_error());
        assert!(!Error::BatcherStopped.is_input_error());
        let io = || std::io::Error::other("x");
        assert!(
            !Error::Thread {
                name: "sluice-batcher",
                source: io()
            }
            .is_input_error()
        );
        assert!(
            !Error::Listen {
                addr: ([127, 0, 0, 1], 1).into(),
                source: io()
            }
            .is_input_error()
        );
        // A prompt too long for the context is the caller's input.
        let long = sluice_text::Error::PromptTooLong {
            bytes: 10,
            context: 1,
            max: 2,
        };
        assert!(Error::from(long).is_input_error());
    }
}

/// README.md's library example compiles against this crate (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

/// docs/LIBRARY.md's examples compile against this crate (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../../../docs/LIBRARY.md")]
struct LibraryDoctests;
