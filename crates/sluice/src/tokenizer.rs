//! Tokenizers: `tokenizer.json` through the `tokenizers` crate, and streaming decode that never
//! emits broken UTF-8.

use std::path::{Path, PathBuf};

use crate::Error;

/// A tokenizer loaded from a model directory.
pub struct Tokenizer {
    inner: Inner,
    path: PathBuf,
}

enum Inner {
    Hf(Box<tokenizers::Tokenizer>),
    Tiktoken(Box<crate::tiktoken::Tiktoken>),
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokenizer({})", self.path.display())
    }
}

impl Tokenizer {
    /// Loads the tokenizer of a model directory: `tokenizer.json`, else `tiktoken.model` with
    /// `tokenizer_config.json`. `Ok(None)` when the directory has neither.
    pub fn from_dir(dir: &Path) -> Result<Option<Tokenizer>, Error> {
        let json = dir.join("tokenizer.json");
        if json.exists() {
            return Tokenizer::from_file(&json).map(Some);
        }
        let tt = dir.join("tiktoken.model");
        if tt.exists() {
            let t = crate::tiktoken::Tiktoken::from_dir(dir)?;
            return Ok(Some(Tokenizer {
                inner: Inner::Tiktoken(Box::new(t)),
                path: tt,
            }));
        }
        Ok(None)
    }

    /// Loads a `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<Tokenizer, Error> {
        let t = tokenizers::Tokenizer::from_file(path).map_err(|e| Error::Tokenizer {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })?;
        Ok(Tokenizer {
            inner: Inner::Hf(Box::new(t)),
            path: path.to_path_buf(),
        })
    }

    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, e: impl std::fmt::Display) -> Error {
        Error::Tokenizer {
            path: self.path.clone(),
            msg: e.to_string(),
        }
    }

    /// Encodes text. Special tokens written in the text are recognised; `add_special` adds what
    /// the tokenizer's post-processor adds (a BOS, typically).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, Error> {
        match &self.inner {
            Inner::Hf(t) => Ok(t
                .encode(text, add_special)
                .map_err(|e| self.err(e))?
                .get_ids()
                .to_vec()),
            Inner::Tiktoken(t) => Ok(t.encode(text)),
        }
    }

    /// Decodes ids to text, keeping special tokens (lossy where ids end mid-character).
    pub fn decode(&self, ids: &[u32]) -> Result<String, Error> {
        match &self.inner {
            Inner::Hf(t) => t.decode(ids, false).map_err(|e| self.err(e)),
            Inner::Tiktoken(t) => Ok(String::from_utf8_lossy(&t.decode_bytes(ids)).into_owned()),
        }
    }

    /// The id of a token written as text (a special token such as `</s>`), if any.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        match &self.inner {
            Inner::Hf(t) => t.token_to_id(token),
            Inner::Tiktoken(t) => t.token_id(token),
        }
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        match &self.inner {
            Inner::Hf(t) => t.get_vocab_size(true),
            Inner::Tiktoken(t) => t.vocab_size(),
        }
    }
}

/// Turns a stream of token ids into text deltas that are always whole UTF-8 characters.
///
/// Each step decodes a small window of recent ids and emits only what is new and complete; an
/// id that ends mid-character is held until the character completes. The concatenated deltas
/// equal the decode of all ids.
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
}

impl StreamDecoder {
    /// A decoder with nothing decoded yet.
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// Adds one id; returns the text it completes (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String, Error> {
        self.ids.push(id);
        let prefix_text = tok.decode(&self.ids[self.prefix..self.read])?;
        let new_text = tok.decode(&self.ids[self.prefix..])?;
        if new_text.len() > prefix_text.len()
            && !new_text.ends_with('\u{FFFD}')
            && new_text.starts_with(&prefix_text)
        {
            let delta = new_text[prefix_text.len()..].to_owned();
            self.prefix = self.read;
            self.read = self.ids.len();
            Ok(delta)
        } else {
            Ok(String::new())
        }
    }

    /// Whatever is still held back (an incomplete character at the very end), lossily.
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<String, Error> {
        let prefix_text = tok.decode(&self.ids[self.prefix..self.read])?;
        let new_text = tok.decode(&self.ids[self.prefix..])?;
        self.prefix = self.ids.len();
        self.read = self.ids.len();
        Ok(new_text
            .strip_prefix(&prefix_text)
            .map(str::to_owned)
            .unwrap_or_default())
    }
}
