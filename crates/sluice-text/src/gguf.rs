//! Tokenizers built from a GGUF file's `tokenizer.ggml.*` metadata.
//!
//! A GGUF file carries no `tokenizer.json`: its vocabulary, merges, token types and special-token
//! ids are metadata under llama.cpp's key names. This module builds the `tokenizers` pipeline
//! that metadata describes, the way transformers 5.24's GGUF loader builds it
//! (`integrations/gguf/gguf_tokenizer_mapping.py`), except where that loader does not give the ids
//! of the model's own tokenizer; there it follows llama.cpp (`src/llama-vocab.cpp`), whose vocab
//! tests (`models/ggml-vocab-*.gguf.out`, made by each model's own Hugging Face tokenizer) it is
//! held to. What is built:
//!
//! - `tokenizer.ggml.model = "gpt2"`: byte-level BPE. A token written in GPT-2's byte alphabet is
//!   kept, any other is respelled in it from its UTF-8 bytes, as transformers does. The merges
//!   (`"a b"`, required) rank in file order. The pre-tokenizer is chosen by `tokenizer.ggml.pre`
//!   from [`PRE_TOKENIZERS`]; an unknown value is refused. The decoder is byte-level.
//! - `tokenizer.ggml.model = "llama"`: SentencePiece as BPE with byte fallback (`<0xNN>`). The
//!   merges are the file's, or, when it has none, derived from the vocabulary and
//!   `tokenizer.ggml.scores` as transformers' `generate_merges` derives them. Spaces become `▁`
//!   and, unless `tokenizer.ggml.add_space_prefix` is false, a `▁` is prepended to each piece of
//!   text between special tokens (the normalizer of the original Llama `tokenizer.json`); the
//!   decoder undoes both.
//! - Token types (`tokenizer.ggml.token_type`): control (3) tokens become special added tokens,
//!   user-defined (4) tokens non-special added tokens, both matched whole in the text; so do the
//!   tokens named by `tokenizer.ggml.{bos,eos,unknown,padding}_token_id`, and the defaults of
//!   transformers' tokenizer classes when the vocabulary has them (`<|endoftext|>` for byte-level;
//!   `<unk>`, `<s>`, `</s>` for SentencePiece). Other types are ordinary vocabulary.
//! - `tokenizer.ggml.add_bos_token` / `add_eos_token` (defaults: BOS for `llama`, nothing for
//!   `gpt2`, as in transformers) put the BOS/EOS ids in a template post-processor.
//!
//! Where transformers 5.24 differs from the model's own tokenizer, and sluice follows the model
//! (and llama.cpp):
//! - SentencePiece: transformers uses a `Metaspace` pre-tokenizer that adds no `▁` to text that
//!   already starts with a space (`" "` → `▁`, the model gives `▁▁`) or that follows a special
//!   token, and it ignores `add_space_prefix = false`;
//! - `tokenizer.ggml.pre` values transformers does not map (DeepSeek, Falcon, StarCoder, Refact,
//!   SmolLM, Command-R, Kimi K2, ...) fall back there to GPT-2's regex; here each gets the
//!   pre-tokenizer of its model's `tokenizer.json` (the splits llama.cpp lists);
//! - Llama 3-style BPE (`llama-bpe`, `llama3`, `tekken`, `glm4`, ...) sets `ignore_merges` (a word
//!   that is a token is that token), as the model's `tokenizer.json` and llama.cpp do;
//! - a control token written outside the byte alphabet (DeepSeek's `<｜begin▁of▁sentence｜>`)
//!   keeps its id; transformers drops it and appends a new id past the vocabulary for the BOS
//!   that names it, as it does for a class default the vocabulary lacks (`<|endoftext|>` in
//!   Llama 3): sluice never makes an id the file does not have.
//!
//! Where llama.cpp differs from the model's tokenizer and transformers, and sluice follows those:
//! it adds a BOS to Llama 3-style vocabularies whose file has no `add_bos_token` (sluice and
//! transformers add none); it strips the whitespace after Phi-3's special tokens when
//! `general.name` says Phi-3; it makes strings that read as an end of generation (`</s>`, ...)
//! control tokens whatever their type; and for a byte-level file without `tokenizer.ggml.pre`
//! (read as `default`) it splits with a regex of its own where sluice and transformers use
//! GPT-2's.
//!
//! `tests/gguf_tokenizer.rs` holds these to llama.cpp's vocab tests, to llama.cpp itself and to
//! transformers on real vocabularies, which check the pre-tokenizers of `gpt-2`, `mpt`,
//! `starcoder`, `refact`, `command-r`, `falcon`, `deepseek-coder`, `deepseek-llm`,
//! `deepseek-v3`, `qwen2`, `qwen35`, `llama-bpe` and `kimi-k2`; the other names of
//! [`PRE_TOKENIZERS`] share one of those (as llama.cpp maps them) or are transformers' (`tekken`,
//! `gpt-4o` and its aliases), unchecked against a vocabulary of their own.
//!
//! Refused, each with one line naming the file and the key: a missing `tokenizer.ggml.tokens`, any
//! other model (`bert`, `t5`, `rwkv`, `gemma4`, ...), SentencePiece vocabularies of Gemma
//! architectures (transformers rebuilds those its own way), an unknown `tokenizer.ggml.pre`,
//! arrays of other lengths than the token list, a merge that is not two tokens of the vocabulary
//! separated by one space, a token type outside 0..=6, a special-token id past the vocabulary, and
//! any key of the wrong type.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use sluice_format::gguf::{Array, Gguf, Value};
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::punctuation::Punctuation;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
    SplitDelimiterBehavior,
};

use crate::Error;

/// `tokenizer.ggml.model`.
pub const MODEL: &str = "tokenizer.ggml.model";
/// `tokenizer.ggml.pre`.
pub const PRE: &str = "tokenizer.ggml.pre";
/// `tokenizer.ggml.tokens`.
pub const TOKENS: &str = "tokenizer.ggml.tokens";
/// `tokenizer.ggml.scores`.
pub const SCORES: &str = "tokenizer.ggml.scores";
/// `tokenizer.ggml.token_type`.
pub const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
/// `tokenizer.ggml.merges`.
pub const MERGES: &str = "tokenizer.ggml.merges";
/// `tokenizer.ggml.bos_token_id`.
pub const BOS_ID: &str = "tokenizer.ggml.bos_token_id";
/// `tokenizer.ggml.eos_token_id`.
pub const EOS_ID: &str = "tokenizer.ggml.eos_token_id";
/// `tokenizer.ggml.unknown_token_id`.
pub const UNK_ID: &str = "tokenizer.ggml.unknown_token_id";
/// `tokenizer.ggml.padding_token_id`.
pub const PAD_ID: &str = "tokenizer.ggml.padding_token_id";
/// `tokenizer.ggml.add_bos_token`.
pub const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
/// `tokenizer.ggml.add_eos_token`.
pub const ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
/// `tokenizer.ggml.add_space_prefix`.
pub const ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
/// `general.architecture`.
const ARCHITECTURE: &str = "general.architecture";

/// The named special tokens transformers reads from a GGUF file, with their id keys, in the
/// order of its `special_tokens_map`.
pub const NAMED_TOKENS: [(&str, &str); 4] = [
    ("bos_token", BOS_ID),
    ("eos_token", EOS_ID),
    ("unk_token", UNK_ID),
    ("pad_token", PAD_ID),
];

/// llama.cpp's token types (`llama_token_type`).
const TYPE_CONTROL: u8 = 3;
const TYPE_USER_DEFINED: u8 = 4;
const MAX_TOKEN_TYPE: u8 = 6;

/// The most work (the sum over tokens of their length squared, in bytes) spent deriving
/// SentencePiece merges from the vocabulary: 2^31, a second or two; real vocabularies need well
/// under 2^27 (Llama 2's 32,000 tokens: 4.6 million).
const MAX_MERGE_DERIVATION_WORK: u64 = 1 << 31;

/// Bytes counted per token and per merge beyond their text, so that `RESIDENT_PER_SOURCE_BYTE`
/// (8, measured on `tokenizer.json` files) applies to a vocabulary read from GGUF metadata: with
/// 14, eight times the estimate was within -10%..+18% of the resident memory measured once
/// built (Llama 3: 72 MB for 61 measured; Qwen2: 53 for 53; Command-R: 96 for 95; DeepSeek LLM:
/// 35 for 35; GPT-2: 15.5 for 17; Llama 2: 14.5 for 16).
const JSON_BYTES_PER_ENTRY: u64 = 14;

/// One step of a pre-tokenizer.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// `Split(Regex(..), behavior = Isolated)`: matches and the text between them are pieces.
    Split(&'static str),
    /// `Digits(individual_digits)`.
    Digits(bool),
    /// `Punctuation(behavior = Contiguous)`.
    Punctuation,
    /// `ByteLevel(add_prefix_space = false, use_regex = true)`: GPT-2's regex, then the bytes.
    Gpt2,
}

/// A byte-level pre-tokenizer: its steps (a `ByteLevel` without regex follows unless a
/// [`Step::Gpt2`] is among them) and whether the BPE takes a word that is a token as is.
#[derive(Clone, Copy, Debug)]
struct Pre {
    steps: &'static [Step],
    ignore_merges: bool,
}

const GPT2: &[Step] = &[Step::Gpt2];

/// transformers' `_LLAMA3_SPLIT`, Llama 3's `tokenizer.json` regex.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3: &[Step] = &[Step::Split(LLAMA3_SPLIT)];

/// transformers' `_TEKKEN_SPLIT` (Mistral's Tekken).
const TEKKEN: &[Step] = &[Step::Split(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)];

/// transformers' `_GPT4O_SPLIT` (o200k).
const GPT4O: &[Step] = &[Step::Split(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)];

/// Qwen2's `PRETOKENIZE_REGEX` in transformers.
const QWEN2: &[Step] = &[Step::Split(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)];

/// Qwen3.5's `PRETOKENIZE_REGEX` in transformers.
const QWEN35: &[Step] = &[Step::Split(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)];

/// DeepSeek LLM's splits (llama.cpp's `LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM`).
const DEEPSEEK_LLM: &[Step] = &[
    Step::Split("[\r\n]"),
    Step::Split(
        "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+",
    ),
    Step::Split(
        "\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+",
    ),
    Step::Split("\\s+$"),
    Step::Split("[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+"),
    Step::Split("\\p{N}+"),
];

/// DeepSeek Coder's splits (llama.cpp's `LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_CODER`).
const DEEPSEEK_CODER: &[Step] = &[
    Step::Split("[\r\n]"),
    Step::Split("\\s?\\p{L}+"),
    Step::Split("\\s?\\p{P}+"),
    Step::Split("[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+"),
    Step::Split("\\p{N}"),
];

/// DeepSeek-V3's `tokenizer.json` pre-tokenizer (llama.cpp's `DEEPSEEK3_LLM`).
const DEEPSEEK_V3: &[Step] = &[
    Step::Split("\\p{N}{1,3}"),
    Step::Split("[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+"),
    Step::Split(
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    ),
];

/// Falcon's `tokenizer.json` pre-tokenizer: contiguous punctuation, GPT-2's regex, digit runs,
/// then runs of three digits.
const FALCON: &[Step] = &[
    Step::Punctuation,
    Step::Gpt2,
    Step::Digits(false),
    Step::Split("[0-9][0-9][0-9]"),
];

/// StarCoder's (and SmolLM's, Refact's, Command-R's) pre-tokenizer: each digit alone, then
/// GPT-2's regex.
const STARCODER: &[Step] = &[Step::Digits(true), Step::Gpt2];

/// Kimi K2's pattern ([`crate::tiktoken::KIMI_PATTERN`]).
const KIMI_K2: &[Step] = &[Step::Split(crate::tiktoken::KIMI_PATTERN)];

/// The `tokenizer.ggml.pre` values a byte-level vocabulary may name, llama.cpp's names for each
/// pre-tokenizer (`llama_vocab::impl::load`); `ignore_merges` where llama.cpp sets it. An absent
/// `tokenizer.ggml.pre` reads as `default`.
pub const PRE_TOKENIZERS: &[&str] = &[
    "default",
    "gpt-2",
    "phi-2",
    "gigachat",
    "a.x-4.0",
    "mellum",
    "mpt",
    "olmo",
    "jais",
    "trillion",
    "granite-docling",
    "exaone4",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "jina-v5-nano",
    "dbrx",
    "smaug-bpe",
    "chatglm-bpe",
    "glm4",
    "glm5",
    "tekken",
    "qwen2",
    "deepseek-r1-qwen",
    "kormo",
    "f2llmv2",
    "megrez",
    "stablelm2",
    "hunyuan",
    "solar-open",
    "grok-2",
    "qwen35",
    "gpt-4o",
    "llama4",
    "kanana2",
    "talkie",
    "minimax-m2",
    "deepseek-llm",
    "deepseek-coder",
    "deepseek-v3",
    "hunyuan-dense",
    "joyai-llm",
    "hy_v4",
    "falcon",
    "starcoder",
    "refact",
    "command-r",
    "smollm",
    "codeshell",
    "exaone",
    "minerva-7b",
    "mellum2",
    "kimi-k2",
];

fn pre_tokenizer(name: &str) -> Option<Pre> {
    let (steps, ignore_merges) = match name {
        "default" | "gpt-2" | "phi-2" | "gigachat" | "a.x-4.0" | "mellum" | "mpt" | "olmo"
        | "jais" | "trillion" | "granite-docling" | "exaone4" => (GPT2, false),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" | "glm4" | "glm5" => (LLAMA3, true),
        "dbrx" | "smaug-bpe" | "chatglm-bpe" => (LLAMA3, false),
        "tekken" => (TEKKEN, true),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2" | "hunyuan"
        | "solar-open" | "grok-2" => (QWEN2, false),
        "qwen35" => (QWEN35, false),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => (GPT4O, false),
        "deepseek-llm" => (DEEPSEEK_LLM, false),
        "deepseek-coder" => (DEEPSEEK_CODER, false),
        "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => (DEEPSEEK_V3, false),
        "falcon" => (FALCON, false),
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b"
        | "mellum2" => (STARCODER, false),
        "kimi-k2" => (KIMI_K2, false),
        _ => return None,
    };
    Some(Pre {
        steps,
        ignore_merges,
    })
}

/// Reads metadata keys, with errors naming the file and the key.
struct Meta<'a> {
    meta: &'a Gguf,
    path: &'a Path,
}

/// At most this many characters of a value go into an error message.
const SHOWN_CHARS: usize = 60;

/// A value for an error message: debug-quoted (one line), cut to [`SHOWN_CHARS`] characters.
fn shown(s: &str) -> String {
    if s.chars().count() <= SHOWN_CHARS {
        format!("{s:?}")
    } else {
        let cut: String = s.chars().take(SHOWN_CHARS).collect();
        format!("{cut:?}...")
    }
}

impl<'a> Meta<'a> {
    fn err(&self, key: &str, msg: impl std::fmt::Display) -> Error {
        Error::Tokenizer {
            path: self.path.to_path_buf(),
            msg: format!("GGUF key `{key}`: {msg}"),
        }
    }

    fn wrong_type(&self, key: &str, v: &Value, want: &str) -> Error {
        let got = match v {
            Value::Array(a) => format!("an array of {:?}", a.elem_type()),
            v => format!("{:?}", v.value_type()),
        };
        self.err(key, format!("is {got}, not {want}"))
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>, Error> {
        match self.meta.value(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.wrong_type(key, v, "a string")),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, Error> {
        match self.meta.value(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong_type(key, v, "a boolean")),
        }
    }

    fn strings(&self, key: &str) -> Result<Option<&'a [String]>, Error> {
        match self.meta.value(key) {
            None => Ok(None),
            Some(Value::Array(Array::String(v))) => Ok(Some(v)),
            Some(v) => Err(self.wrong_type(key, v, "an array of strings")),
        }
    }

    /// The token list: present, not empty, ids fit `u32`.
    fn tokens(&self) -> Result<&'a [String], Error> {
        let tokens = self
            .strings(TOKENS)?
            .ok_or_else(|| self.err(TOKENS, "missing: the file has no vocabulary"))?;
        if tokens.is_empty() {
            return Err(self.err(TOKENS, "is empty"));
        }
        if u32::try_from(tokens.len()).is_err() {
            return Err(self.err(TOKENS, format!("has {} tokens", tokens.len())));
        }
        Ok(tokens)
    }

    /// An array that must have one element per token.
    fn same_len(&self, key: &str, len: usize, n: usize) -> Result<(), Error> {
        if len != n {
            return Err(self.err(
                key,
                format!("has {len} entries, but `{TOKENS}` has {n} tokens"),
            ));
        }
        Ok(())
    }

    /// A token id: a non-negative integer below `n`.
    fn id(&self, key: &str, n: usize) -> Result<Option<u32>, Error> {
        let Some(v) = self.meta.value(key) else {
            return Ok(None);
        };
        let id = v
            .as_uint()
            .ok_or_else(|| self.wrong_type(key, v, "a non-negative integer"))?;
        if id >= n as u64 {
            return Err(self.err(
                key,
                format!("id {id} is out of range: `{TOKENS}` has {n} tokens"),
            ));
        }
        Ok(Some(id as u32))
    }

    /// `tokenizer.ggml.scores`, one per token.
    fn scores(&self, n: usize) -> Result<Option<Vec<f64>>, Error> {
        let v = match self.meta.value(SCORES) {
            None => return Ok(None),
            Some(Value::Array(Array::F32(v))) => v.iter().map(|&x| f64::from(x)).collect(),
            Some(Value::Array(Array::F64(v))) => v.clone(),
            Some(v) => return Err(self.wrong_type(SCORES, v, "an array of F32")),
        };
        self.same_len(SCORES, Vec::len(&v), n)?;
        Ok(Some(v))
    }

    /// `tokenizer.ggml.token_type`, one per token, each 0..=6.
    fn types(&self, n: usize) -> Result<Option<Vec<u8>>, Error> {
        let Some(v) = self.meta.value(TOKEN_TYPE) else {
            return Ok(None);
        };
        let wide: Vec<i128> = match v {
            Value::Array(Array::I32(v)) => v.iter().map(|&x| x.into()).collect(),
            Value::Array(Array::U32(v)) => v.iter().map(|&x| x.into()).collect(),
            Value::Array(Array::I8(v)) => v.iter().map(|&x| x.into()).collect(),
            Value::Array(Array::U8(v)) => v.iter().map(|&x| x.into()).collect(),
            Value::Array(Array::I16(v)) => v.iter().map(|&x| x.into()).collect(),
            Value::Array(Array::U16(v)) => v.iter().map(|&x| x.into()).collect(),
            Value::Array(Array::I64(v)) => v.iter().map(|&x| x.into()).collect(),
            Value::Array(Array::U64(v)) => v.iter().map(|&x| x.into()).collect(),
            v => return Err(self.wrong_type(TOKEN_TYPE, v, "an array of integers")),
        };
        self.same_len(TOKEN_TYPE, wide.len(), n)?;
        wide.iter()
            .enumerate()
            .map(|(i, &t)| {
                u8::try_from(t)
                    .ok()
                    .filter(|&t| t <= MAX_TOKEN_TYPE)
                    .ok_or_else(|| {
                        self.err(
                            TOKEN_TYPE,
                            format!("entry {i} is {t}, not a token type (0 to {MAX_TOKEN_TYPE})"),
                        )
                    })
            })
            .collect::<Result<Vec<u8>, Error>>()
            .map(Some)
    }

    /// The named special-token ids (bos, eos, unk, pad), checked against the vocabulary size.
    fn named_ids(&self, n: usize) -> Result<[Option<u32>; 4], Error> {
        let mut out = [None; 4];
        for (slot, (_, key)) in out.iter_mut().zip(NAMED_TOKENS) {
            *slot = self.id(key, n)?;
        }
        Ok(out)
    }
}

/// The named special tokens (`bos_token`, `eos_token`, `unk_token`, `pad_token`) a GGUF file
/// gives by id, as transformers exposes them to a chat template: each the file's token string
/// for that id. A name without an id is left out. Ids past the token list are refused.
pub(crate) fn named_tokens(meta: &Gguf, path: &Path) -> Result<Vec<(String, String)>, Error> {
    let m = Meta { meta, path };
    if NAMED_TOKENS
        .iter()
        .all(|(_, key)| meta.value(key).is_none())
    {
        return Ok(Vec::new());
    }
    let tokens = m.tokens()?;
    let ids = m.named_ids(tokens.len())?;
    Ok(NAMED_TOKENS
        .iter()
        .zip(ids)
        .filter_map(|((name, _), id)| id.map(|id| (name.to_string(), tokens[id as usize].clone())))
        .collect())
}

/// GPT-2's byte-to-character table: the printable character byte-level BPE writes for each byte.
fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut next = 0x100u32;
    for b in 0..=255u8 {
        let c = b as char;
        out[b as usize] = if matches!(c, '!'..='~' | '\u{00A1}'..='\u{00AC}' | '\u{00AE}'..='\u{00FF}')
        {
            c
        } else {
            let c = char::from_u32(next).unwrap_or('\u{FFFD}');
            next += 1;
            c
        };
    }
    out
}

/// The merges of the file, each `"a b"`, checked against the vocabulary.
fn file_merges(
    m: &Meta<'_>,
    merges: &[String],
    vocab: &Vocab,
) -> Result<Vec<(String, String)>, Error> {
    let mut out = Vec::with_capacity(merges.len());
    let mut joined = String::new();
    for (i, s) in merges.iter().enumerate() {
        let pair = s
            .split_once(' ')
            .filter(|(a, b)| !a.is_empty() && !b.is_empty() && !b.contains(' '));
        let Some((a, b)) = pair else {
            return Err(m.err(
                MERGES,
                format!(
                    "entry {i} ({}) is not two tokens separated by one space",
                    shown(s)
                ),
            ));
        };
        joined.clear();
        joined.push_str(a);
        joined.push_str(b);
        for part in [a, b, joined.as_str()] {
            if !vocab.contains_key(part) {
                return Err(m.err(
                    MERGES,
                    format!(
                        "entry {i} ({}) makes {}, which is not a token of `{TOKENS}`",
                        shown(s),
                        shown(part)
                    ),
                ));
            }
        }
        out.push((a.to_owned(), b.to_owned()));
    }
    Ok(out)
}

/// The merges a SentencePiece vocabulary implies, as transformers' `generate_merges(vocab,
/// scores)` derives them: every split of a token into two tokens, best score first, then the
/// longer left part, then the longer right part; splits of one token ordered by the ids of
/// their parts; a token listed twice counts once, at its first place, with its last id and
/// score (a Python dict's behaviour).
fn derived_merges(
    m: &Meta<'_>,
    tokens: &[String],
    scores: &[f64],
) -> Result<Vec<(String, String)>, Error> {
    let mut id: HashMap<&str, u32> = HashMap::with_capacity(tokens.len());
    let mut score: HashMap<&str, f64> = HashMap::with_capacity(tokens.len());
    let mut order: Vec<&str> = Vec::with_capacity(tokens.len());
    for (i, (t, &s)) in tokens.iter().zip(scores).enumerate() {
        if id.insert(t, i as u32).is_none() {
            order.push(t);
        }
        // Python compares -0.0 and 0.0 equal; `total_cmp` would not.
        score.insert(t, if s == 0.0 { 0.0 } else { s });
    }
    let work: u64 = order
        .iter()
        .map(|t| (t.len() as u64).saturating_mul(t.len() as u64))
        .fold(0, u64::saturating_add);
    if work > MAX_MERGE_DERIVATION_WORK {
        return Err(m.err(
            TOKENS,
            "tokens too long to derive merges from (the file has no `tokenizer.ggml.merges`)",
        ));
    }
    struct Merge<'t> {
        left: &'t str,
        right: &'t str,
        score: f64,
        left_chars: usize,
        right_chars: usize,
    }
    let mut merges: Vec<Merge<'_>> = Vec::new();
    let mut local: Vec<(u32, u32, &str, &str)> = Vec::new();
    for &t in &order {
        local.clear();
        for (k, _) in t.char_indices().skip(1) {
            let (l, r) = t.split_at(k);
            if let (Some(&il), Some(&ir)) = (id.get(l), id.get(r)) {
                local.push((il, ir, l, r));
            }
        }
        local.sort_by_key(|&(il, ir, _, _)| (il, ir));
        let s = score[t];
        merges.extend(local.iter().map(|&(_, _, l, r)| Merge {
            left: l,
            right: r,
            score: s,
            left_chars: l.chars().count(),
            right_chars: r.chars().count(),
        }));
    }
    // Python's `sorted(..., reverse=True)` is stable too: equal keys keep their order.
    merges.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(b.left_chars.cmp(&a.left_chars))
            .then(b.right_chars.cmp(&a.right_chars))
    });
    Ok(merges
        .into_iter()
        .map(|m| (m.left.to_owned(), m.right.to_owned()))
        .collect())
}

fn tokenizer_err(path: &Path, what: &str, e: impl std::fmt::Display) -> Error {
    Error::Tokenizer {
        path: path.to_path_buf(),
        msg: format!("building the tokenizer from GGUF metadata: {what}: {e}"),
    }
}

fn byte_level_pre(path: &Path, pre: Pre) -> Result<PreTokenizerWrapper, Error> {
    if let [Step::Gpt2] = pre.steps {
        return Ok(ByteLevel::new(false, true, true).into());
    }
    let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(pre.steps.len() + 1);
    for step in pre.steps {
        steps.push(match *step {
            Step::Split(re) => Split::new(
                SplitPattern::Regex(re.to_owned()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| tokenizer_err(path, "pre-tokenizer regex", e))?
            .into(),
            Step::Digits(individual) => Digits::new(individual).into(),
            Step::Punctuation => Punctuation::new(SplitDelimiterBehavior::Contiguous).into(),
            Step::Gpt2 => ByteLevel::new(false, true, true).into(),
        });
    }
    if !pre.steps.iter().any(|s| matches!(s, Step::Gpt2)) {
        steps.push(ByteLevel::new(false, true, false).into());
    }
    Ok(PreSequence::new(steps).into())
}

/// The template post-processor: BOS and EOS around the text as the flags say.
fn post_processor(
    path: &Path,
    bos: Option<(&str, u32)>,
    eos: Option<(&str, u32)>,
) -> Result<PostProcessorWrapper, Error> {
    let special =
        |t: &str, type_id: u32| serde_json::json!({"SpecialToken": {"id": t, "type_id": type_id}});
    let seq =
        |s: &str, type_id: u32| serde_json::json!({"Sequence": {"id": s, "type_id": type_id}});
    let mut single = Vec::new();
    let mut pair = Vec::new();
    for (seq_id, type_id, out) in [("A", 0, &mut single), ("B", 1, &mut pair)] {
        if let Some((t, _)) = bos {
            out.push(special(t, type_id));
        }
        out.push(seq(seq_id, type_id));
        if let Some((t, _)) = eos {
            out.push(special(t, type_id));
        }
    }
    let pair: Vec<_> = single.iter().cloned().chain(pair).collect();
    let mut tokens = serde_json::Map::new();
    for (t, id) in [bos, eos].into_iter().flatten() {
        tokens.insert(
            t.to_owned(),
            serde_json::json!({"id": t, "ids": [id], "tokens": [t]}),
        );
    }
    let v = serde_json::json!({
        "type": "TemplateProcessing",
        "single": single,
        "pair": pair,
        "special_tokens": tokens,
    });
    let t: TemplateProcessing =
        serde_json::from_value(v).map_err(|e| tokenizer_err(path, "post-processor", e))?;
    Ok(t.into())
}

/// The tokenizer a GGUF file's metadata describes, and an estimate of the size of a
/// `tokenizer.json` holding the same vocabulary (for memory planning).
pub(crate) fn build(meta: &Gguf, path: &Path) -> Result<(tokenizers::Tokenizer, u64), Error> {
    let m = Meta { meta, path };
    let model = m
        .str(MODEL)?
        .ok_or_else(|| m.err(MODEL, "missing: the file names no tokenizer model"))?;
    let byte_level = match model {
        "gpt2" => true,
        "llama" => {
            let arch = m.str(ARCHITECTURE)?.unwrap_or("");
            if matches!(arch, "gemma" | "gemma2" | "gemma3" | "gemma3n") {
                return Err(m.err(
                    ARCHITECTURE,
                    format!(
                        "a SentencePiece (`{MODEL}` \"llama\") vocabulary of architecture {arch:?} is not supported: Gemma vocabularies need a rebuild sluice does not do"
                    ),
                ));
            }
            false
        }
        other => {
            return Err(m.err(
                MODEL,
                format!(
                    "tokenizer model {} is not supported (sluice builds \"gpt2\" byte-level BPE and \"llama\" SentencePiece tokenizers)",
                    shown(other)
                ),
            ));
        }
    };
    let pre = if byte_level {
        let name = m.str(PRE)?.unwrap_or("default");
        Some(pre_tokenizer(name).ok_or_else(|| {
            m.err(
                PRE,
                format!(
                    "pre-tokenizer {} is not one sluice knows; it is refused rather than guessed",
                    shown(name)
                ),
            )
        })?)
    } else {
        None
    };
    let tokens = m.tokens()?;
    let n = tokens.len();
    let types = m.types(n)?;
    let scores = m.scores(n)?;
    let merges = m.strings(MERGES)?;
    let named = m.named_ids(n)?;
    let [bos, eos, _, _] = named;
    let type_of = |i: usize| types.as_ref().map_or(1, |t| t[i]);
    let add_bos = m.bool(ADD_BOS)?.unwrap_or(!byte_level) && bos.is_some();
    let add_eos = m.bool(ADD_EOS)?.unwrap_or(false) && eos.is_some();
    let add_space_prefix = m.bool(ADD_SPACE_PREFIX)?.unwrap_or(true);
    let named_set: HashSet<u32> = named.iter().flatten().copied().collect();

    // The vocabulary: a later duplicate of a token takes it over, as in a Python dict.
    let chars = byte_chars();
    let alphabet: HashSet<char> = chars.iter().copied().collect();
    let mut vocab: Vocab = Vocab::with_capacity(n);
    for (i, t) in tokens.iter().enumerate() {
        let written = matches!(type_of(i), TYPE_CONTROL | TYPE_USER_DEFINED)
            || named_set.contains(&(i as u32))
            || !byte_level
            || t.chars().all(|c| alphabet.contains(&c));
        let key = if written {
            t.clone()
        } else {
            t.bytes().map(|b| chars[b as usize]).collect()
        };
        vocab.insert(key, i as u32);
    }

    let merges = match (merges, byte_level) {
        (Some(list), _) => file_merges(&m, list, &vocab)?,
        (None, true) => {
            return Err(m.err(
                MERGES,
                "missing: a byte-level (\"gpt2\") vocabulary needs its merges",
            ));
        }
        (None, false) => {
            let scores = scores.as_deref().ok_or_else(|| {
                m.err(
                    SCORES,
                    format!(
                        "missing: a SentencePiece vocabulary without `{MERGES}` needs its scores"
                    ),
                )
            })?;
            derived_merges(&m, tokens, scores)?
        }
    };
    let source_bytes = tokens
        .iter()
        .map(|t| t.len() as u64 + JSON_BYTES_PER_ENTRY)
        .chain(
            merges
                .iter()
                .map(|(a, b)| (a.len() + b.len()) as u64 + JSON_BYTES_PER_ENTRY),
        )
        .sum();

    let bpe = BPE::builder().vocab_and_merges(vocab, merges);
    let bpe = if byte_level {
        bpe.continuing_subword_prefix(String::new())
            .end_of_word_suffix(String::new())
            .ignore_merges(pre.is_some_and(|p| p.ignore_merges))
    } else {
        bpe.fuse_unk(true).byte_fallback(true)
    };
    let bpe = bpe
        .build()
        .map_err(|e| tokenizer_err(path, "BPE model", e))?;
    let mut t = tokenizers::Tokenizer::new(bpe);
    if let Some(pre) = pre {
        t.with_pre_tokenizer(Some(byte_level_pre(path, pre)?));
        t.with_decoder(Some(DecoderWrapper::from(ByteLevel::default())));
    } else {
        let space = Replace::new(" ", "▁").map_err(|e| tokenizer_err(path, "normalizer", e))?;
        let normalizer: NormalizerWrapper = if add_space_prefix {
            NormalizerSequence::new(vec![Prepend::new("▁".into()).into(), space.into()]).into()
        } else {
            space.into()
        };
        t.with_normalizer(Some(normalizer));
        let mut decoders: Vec<DecoderWrapper> = vec![
            Replace::new("▁", " ")
                .map_err(|e| tokenizer_err(path, "decoder", e))?
                .into(),
            ByteFallback::new().into(),
            Fuse::new().into(),
        ];
        if add_space_prefix {
            decoders.push(Strip::new(' ', 1, 0).into());
        }
        t.with_decoder(Some(DecoderSequence::new(decoders)));
    }

    // Added tokens: matched whole in the text, on the text as written.
    let mut special: Vec<AddedToken> = Vec::new();
    let mut special_seen: HashSet<&str> = HashSet::new();
    let defaults: &[&str] = if byte_level {
        &["<|endoftext|>"]
    } else {
        &["<unk>", "<s>", "</s>"]
    };
    for &d in defaults {
        if t.token_to_id(d).is_some() && special_seen.insert(d) {
            special.push(AddedToken::from(d, true).normalized(false));
        }
    }
    let mut user: Vec<AddedToken> = Vec::new();
    for (i, tok) in tokens.iter().enumerate() {
        if matches!(type_of(i), TYPE_CONTROL | TYPE_USER_DEFINED) {
            crate::tokenizer::check_added_token(
                path,
                &format!("`tokenizer.ggml.tokens`[{i}] (a control or user-defined token)"),
                tok,
            )?;
        }
        match type_of(i) {
            TYPE_CONTROL if special_seen.insert(tok) => {
                special.push(AddedToken::from(tok.as_str(), true).normalized(false));
            }
            TYPE_USER_DEFINED => user.push(AddedToken::from(tok.as_str(), false).normalized(false)),
            _ => {}
        }
    }
    for id in named.iter().flatten() {
        let tok = tokens[*id as usize].as_str();
        if special_seen.insert(tok) {
            special.push(AddedToken::from(tok, true).normalized(false));
        }
    }
    user.retain(|a| !special_seen.contains(a.content.as_str()));
    t.add_special_tokens(&special);
    t.add_tokens(&user);

    let bos = bos
        .filter(|_| add_bos)
        .map(|id| (tokens[id as usize].as_str(), id));
    let eos = eos
        .filter(|_| add_eos)
        .map(|id| (tokens[id as usize].as_str(), id));
    t.with_post_processor(Some(post_processor(path, bos, eos)?));
    Ok((t, source_bytes))
}

#[cfg(test)]
mod tests;
