//! Text for sluice: tokenizers and chat templates.
//!
//! - [`Tokenizer`]: a model directory's `tokenizer.json` (through the `tokenizers` crate) or
//!   Kimi's `tiktoken.model` (through [`tiktoken`]), giving the ids their Python reference
//!   gives, or the vocabulary of a GGUF file's metadata ([`gguf`]);
//! - [`StreamDecoder`]: token ids to text deltas that are always whole UTF-8 characters;
//! - [`ChatTemplate`]: the Jinja chat template of a model directory or a GGUF file, rendered as
//!   transformers' `apply_chat_template` renders it (see [`chat`] for what that takes).
//!
//! The `sluice` facade re-exports these; its `Error` takes this crate's [`Error`] apart into
//! its own `Tokenizer`, `Template` and `Usage` variants.

#![forbid(unsafe_code)]

pub mod chat;
pub mod gguf;
pub mod tiktoken;
mod tokenizer;
mod vocab;

pub use chat::{ChatTemplate, Message};
pub use tokenizer::{
    MAX_BYTES_PER_TOKEN, MAX_SMALL_FILE_LEN, MAX_TOKENIZER_LEN, StreamDecoder, Tokenizer,
};
pub use vocab::VocabBytes;

use std::path::PathBuf;

/// What can go wrong loading or running a tokenizer or a chat template.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
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
    /// A text too long to fit the context, refused before tokenizing (the caller's input).
    #[error(
        "a prompt of {bytes} bytes cannot fit the context of {context} tokens (at most {max} bytes with this tokenizer); it is refused before tokenizing"
    )]
    PromptTooLong {
        /// The text's length in bytes.
        bytes: usize,
        /// The context in tokens.
        context: usize,
        /// The most bytes that could fit it.
        max: usize,
    },
    /// A file of the model directory could not be read or parsed.
    #[error(transparent)]
    Format(#[from] sluice_format::FormatError),
}
