//! Tokenizers: `tokenizer.json` through the `tokenizers` crate, Kimi's `tiktoken.model` through
//! [`crate::tiktoken`], a GGUF file's vocabulary through [`crate::gguf`], and streaming decode
//! that never emits broken UTF-8.
//!
//! Both paths give the ids their Python reference gives (the `tokenizers` package for
//! `tokenizer.json`; `tiktoken` driven as Kimi's `TikTokenTokenizer` drives it for
//! `tiktoken.model`); `tests/tokenizers.rs` checks this against fixtures made by those packages.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::Error;

/// A tokenizer loaded from a model directory.
pub struct Tokenizer {
    pub(crate) inner: Inner,
    path: PathBuf,
    /// Ids of `<0xNN>` tokens when the decoder has a `ByteFallback` step: a run of them decodes
    /// as one group, so the stream decoder holds them until the run ends.
    byte_fallback: HashSet<u32>,
    /// The longest token written out, in bytes (at least 1): no token stands for more bytes
    /// of text, so a text longer than `n × max_token_bytes` needs more than `n` tokens.
    max_token_bytes: usize,
    /// Bytes of the file it was read from (for a GGUF vocabulary, of the `tokenizer.json` that
    /// would hold it: see [`crate::gguf`]).
    source_bytes: u64,
}

/// Bytes of memory a loaded tokenizer holds per byte of its file (its vocabulary, merges and
/// their indices): measured 8.0 for DeepSeek-V3's `tokenizer.json` (7.8 MB of JSON, 62 MB
/// resident once loaded).
pub const RESIDENT_PER_SOURCE_BYTE: u64 = 8;

/// The most bytes of text per position of the context a prompt may have before it is refused
/// untokenized (16; text averages 3–5 bytes per token, and long runs of one character are
/// what comes near 16): it bounds the encoding memory the plan keeps.
pub const MAX_BYTES_PER_TOKEN: usize = 16;

/// Peak bytes encoding takes per byte of text (pre-tokenized pieces, offsets, the ids):
/// measured 75 on 400 kB of English with DeepSeek-V3's tokenizer and 220 on a 10 MB line;
/// the larger is used.
pub const ENCODE_PER_BYTE: u64 = 220;

pub(crate) enum Inner {
    Hf(Box<tokenizers::Tokenizer>),
    Tiktoken(Box<crate::tiktoken::Tiktoken>),
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokenizer({})", self.path.display())
    }
}

fn has_byte_fallback(d: &tokenizers::DecoderWrapper) -> bool {
    use tokenizers::DecoderWrapper as D;
    match d {
        D::ByteFallback(_) => true,
        D::Sequence(s) => s.get_decoders().iter().any(has_byte_fallback),
        _ => false,
    }
}

fn is_byte_token(s: &str) -> bool {
    s.len() == 6
        && s.starts_with("<0x")
        && s.ends_with('>')
        && u8::from_str_radix(&s[3..5], 16).is_ok()
}

/// The longest added or special token accepted, in bytes (1 KiB; those of released
/// vocabularies are at most a few dozen bytes). Matching added tokens takes an automaton that
/// grows with their length — about 170 bytes of memory per byte, so a 60 MB token would take
/// 10 GB — and the longest token sets how much text a prompt may hold, so longer ones are
/// refused, naming the token, before anything is built.
pub const MAX_ADDED_TOKEN_BYTES: usize = 1024;

/// Refuses an added or special token longer than [`MAX_ADDED_TOKEN_BYTES`]; `what` names it
/// (`added token 4095`).
pub(crate) fn check_added_token(path: &Path, what: &str, content: &str) -> Result<(), Error> {
    if content.len() > MAX_ADDED_TOKEN_BYTES {
        return Err(Error::Tokenizer {
            path: path.to_path_buf(),
            msg: format!(
                "{what} is {} bytes long; sluice accepts added and special tokens of at most {MAX_ADDED_TOKEN_BYTES} bytes",
                content.len()
            ),
        });
    }
    Ok(())
}

/// The largest `tokenizer.json` read (256 MiB; released ones are at most a few tens of MB).
pub const MAX_TOKENIZER_LEN: u64 = 256 << 20;

/// The largest `tiktoken.model`, `tokenizer_config.json` or `chat_template.jinja` read (64 MiB).
pub const MAX_SMALL_FILE_LEN: u64 = 64 << 20;

impl Tokenizer {
    /// Loads the tokenizer of a model directory: `tokenizer.json`, else `tiktoken.model` with
    /// `tokenizer_config.json`. `Ok(None)` when the directory has neither.
    pub fn from_dir(dir: &Path) -> Result<Option<Tokenizer>, Error> {
        let json = dir.join("tokenizer.json");
        if sluice_format::file::present(&json) {
            return Tokenizer::from_file(&json).map(Some);
        }
        let tt = dir.join("tiktoken.model");
        if sluice_format::file::present(&tt) {
            let t = crate::tiktoken::Tiktoken::from_dir(dir)?;
            let max_token_bytes = (0..t.vocab_size() as u32)
                .filter_map(|id| t.token_bytes(id).map(<[u8]>::len))
                .max()
                .unwrap_or(1)
                .max(1);
            let source_bytes = std::fs::metadata(&tt).map_or(0, |m| m.len());
            return Ok(Some(Tokenizer {
                inner: Inner::Tiktoken(Box::new(t)),
                path: tt,
                byte_fallback: HashSet::new(),
                max_token_bytes,
                source_bytes,
            }));
        }
        Ok(None)
    }

    /// Loads a `tokenizer.json` (a regular file of at most [`MAX_TOKENIZER_LEN`] bytes).
    pub fn from_file(path: &Path) -> Result<Tokenizer, Error> {
        let bytes = sluice_format::file::read_capped(path, MAX_TOKENIZER_LEN)?;
        // The added tokens' lengths first: only they are read, everything else is skipped.
        #[derive(serde::Deserialize)]
        struct Added {
            id: Option<serde_json::Value>,
            content: String,
        }
        #[derive(serde::Deserialize)]
        struct Head {
            #[serde(default)]
            added_tokens: Vec<Added>,
        }
        if let Ok(h) = serde_json::from_slice::<Head>(&bytes) {
            for a in &h.added_tokens {
                let id = a.id.as_ref().map_or_else(String::new, |i| format!(" {i}"));
                check_added_token(path, &format!("added token{id}"), &a.content)?;
            }
        }
        let t = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| Error::Tokenizer {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })?;
        Ok(Tokenizer::from_hf(t, path, bytes.len() as u64))
    }

    /// Builds the tokenizer a GGUF file's `tokenizer.ggml.*` metadata describes (see
    /// [`crate::gguf`] for what is supported, what is refused, and where it differs from
    /// transformers' GGUF loader). `path` is the file, for messages and [`Tokenizer::path`].
    pub fn from_gguf(meta: &sluice_format::gguf::Gguf, path: &Path) -> Result<Tokenizer, Error> {
        let (t, source_bytes) = crate::gguf::build(meta, path)?;
        Ok(Tokenizer::from_hf(t, path, source_bytes))
    }

    /// A `tokenizers` tokenizer with what the stream decoder and the memory plan need to know
    /// of it; `source_bytes` is the size of its `tokenizer.json`, or an estimate of it.
    fn from_hf(t: tokenizers::Tokenizer, path: &Path, source_bytes: u64) -> Tokenizer {
        let byte_fallback = if t.get_decoder().is_some_and(has_byte_fallback) {
            t.get_vocab(true)
                .into_iter()
                .filter(|(s, _)| is_byte_token(s))
                .map(|(_, id)| id)
                .collect()
        } else {
            HashSet::new()
        };
        // A token's written form is never shorter than the text it stands for (byte-level
        // characters, `▁` for a space and `<0xNN>` are all at least as long).
        let max_token_bytes = t
            .get_vocab(true)
            .keys()
            .map(String::len)
            .max()
            .unwrap_or(1)
            .max(1);
        Tokenizer {
            inner: Inner::Hf(Box::new(t)),
            path: path.to_path_buf(),
            byte_fallback,
            max_token_bytes,
            source_bytes,
        }
    }

    /// The longest prompt, in bytes, that [`Tokenizer::check_fits`] lets through for `context`
    /// tokens: `context × min(2 × max_token_bytes, MAX_BYTES_PER_TOKEN)`.
    pub fn max_prompt_bytes(&self, context: usize) -> usize {
        context.saturating_mul(
            self.max_token_bytes
                .saturating_mul(2)
                .min(MAX_BYTES_PER_TOKEN),
        )
    }

    /// The memory a budget keeps for the tokenizer: what it holds once loaded (about
    /// [`RESIDENT_PER_SOURCE_BYTE`] per byte of its file) plus the peak of encoding the
    /// longest prompt [`Tokenizer::check_fits`] lets through for `context` tokens, `prompts`
    /// of them at once (about [`ENCODE_PER_BYTE`] per byte of text). An estimate from
    /// measurements, not an accounting of each allocation.
    pub fn memory_bytes(&self, context: usize, prompts: usize) -> u64 {
        let resident = self.source_bytes.saturating_mul(RESIDENT_PER_SOURCE_BYTE);
        let encode = (self.max_prompt_bytes(context) as u64)
            .saturating_mul(ENCODE_PER_BYTE)
            .saturating_mul(prompts.max(1) as u64);
        resident.saturating_add(encode)
    }

    /// The longest token in bytes: no token stands for more bytes of text.
    pub fn max_token_bytes(&self) -> usize {
        self.max_token_bytes
    }

    /// Refuses, before tokenizing, a text too long to fit `context` tokens: more than
    /// [`Tokenizer::max_prompt_bytes`] — `2 × context × max_token_bytes` bytes (no token
    /// stands for more text than its written form; twice, for normalizers that shorten text),
    /// or [`MAX_BYTES_PER_TOKEN`] bytes per position of the context when that is less (text
    /// averages 3–5 bytes per token). Tokenizing it would only spend memory to find it does not
    /// fit, and the memory plan keeps room for encoding no more than this.
    pub fn check_fits(&self, text: &str, context: usize) -> Result<(), Error> {
        let max = self.max_prompt_bytes(context);
        if text.len() > max {
            return Err(Error::PromptTooLong {
                bytes: text.len(),
                context,
                max,
            });
        }
        Ok(())
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
    /// a `tokenizer.json`'s post-processor adds (a BOS, typically). Kimi's `tiktoken.model`
    /// tokenizer adds nothing either way.
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

    /// Decodes ids to text, keeping special tokens. Bytes that do not form valid UTF-8 (ids
    /// that end mid-character) become U+FFFD, as Python's decoders do.
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

    /// Whether the stream decoder must hold this id back until a different kind of id follows:
    /// a byte-fallback token, or — with a byte-fallback decoder — an id the tokenizer does not
    /// know (past the vocabulary, as a padded embedding can produce), which decodes to nothing
    /// and so does not end a run of byte tokens either.
    fn holds(&self, id: u32) -> bool {
        !self.byte_fallback.is_empty() && (self.byte_fallback.contains(&id) || !self.knows(id))
    }

    /// Whether the id names a token.
    fn knows(&self, id: u32) -> bool {
        match &self.inner {
            Inner::Hf(t) => t.id_to_token(id).is_some(),
            Inner::Tiktoken(t) => t.token_bytes(id).is_some(),
        }
    }
}

/// Turns a stream of token ids into text deltas that are always whole UTF-8 characters.
///
/// Each step decodes a small window of recent ids (the previous emitted group, for decoders
/// that treat the first token of a decode specially, and the new ones) and emits only what is
/// new and complete. An id that ends mid-character is held until the character completes, as
/// is a run of byte-fallback tokens (`<0xNN>`), which decoders turn into text as one group. The
/// concatenation of all deltas and [`StreamDecoder::flush`] equals [`Tokenizer::decode`] of all
/// the ids, and a delta holds U+FFFD only where that full decode does.
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
        if tok.holds(id) {
            return Ok(String::new());
        }
        let prefix_text = tok.decode(&self.ids[self.prefix..self.read])?;
        let new_text = tok.decode(&self.ids[self.prefix..])?;
        if new_text.len() > prefix_text.len()
            && !new_text.ends_with('\u{FFFD}')
            && new_text.starts_with(&prefix_text)
        {
            let delta = new_text[prefix_text.len()..].to_owned();
            // Ids before the window are final; keep only what the next step needs.
            self.ids.drain(..self.prefix);
            self.prefix = self.read - self.prefix;
            self.read = self.ids.len();
            Ok(delta)
        } else {
            Ok(String::new())
        }
    }

    /// Whatever is still held back (an incomplete character at the very end), lossily, and
    /// starts afresh.
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<String, Error> {
        let prefix_text = tok.decode(&self.ids[self.prefix..self.read])?;
        let new_text = tok.decode(&self.ids[self.prefix..])?;
        self.ids.clear();
        self.prefix = 0;
        self.read = 0;
        Ok(match new_text.strip_prefix(&prefix_text) {
            Some(rest) => rest.to_owned(),
            // The decoder rewrote text already emitted; emit what follows the common prefix.
            None => {
                let common = prefix_text
                    .char_indices()
                    .zip(new_text.chars())
                    .find(|((_, a), b)| a != b)
                    .map_or(prefix_text.len().min(new_text.len()), |((i, _), _)| i);
                new_text[common..].to_owned()
            }
        })
    }
}
