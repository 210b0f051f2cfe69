//! What a generation is asked for — its options, how it drafts, why it ended — apart from the
//! machinery that runs it (`generate`, `decoding`, `draft`), which all read these.

use serde::Serialize;
use sluice_sampler::SamplingOptions;

/// How to generate.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Sampling.
    pub sampling: SamplingOptions,
    /// Strings that end the generation (not included in the text).
    pub stop: Vec<String>,
    /// Stop at the model's end-of-sequence tokens.
    pub stop_at_eos: bool,
    /// Prompt rows each call inside a layer takes at most during the prefill (at least 1):
    /// attention runs over the prompt this many queries at a time, and each product this many
    /// rows at a time.
    ///
    /// Under a memory budget the scratch is planned for the engine's chunk
    /// ([`EngineBuilder::prefill_chunk`](crate::EngineBuilder::prefill_chunk), see
    /// [`Engine::prefill_chunk`](crate::Engine::prefill_chunk)); a larger value is clamped to it, so that no caller can take
    /// more scratch than the budget holds. Chunking never changes the output, so the clamp
    /// changes only the prefill's speed ([`GenerationStats::prefill_chunk`](crate::GenerationStats::prefill_chunk) is the value used).
    /// With [`Memory::Unlimited`](crate::Memory::Unlimited) the value is used as given.
    pub prefill_chunk: usize,
    /// Most prompt tokens one prefill pass runs each layer over (None: as many as the memory
    /// plan allows, the whole prompt when its activations fit). Every layer's experts are read
    /// once per pass for all of its tokens, so a shorter span reads them more often; the output
    /// is the same whatever the span ([`GenerationStats::prefill_spans`](crate::GenerationStats::prefill_spans)).
    pub prefill_span: Option<usize>,
    /// Called as the prefill goes (after each layer of each pass).
    pub on_prefill: Option<PrefillHook>,
    /// Keep every row of logits (prompt positions and each step) in the result.
    pub keep_logits: bool,
    /// Report each generated token's log-probability under the model (the log-softmax of its
    /// raw logits, before temperature or any filter) and this many most likely alternatives
    /// ([`Token::logprobs`](crate::Token::logprobs)); `None` reports nothing. At most [`MAX_TOP_LOGPROBS`].
    pub logprobs: Option<usize>,
    /// Constrain the output to a grammar (a JSON schema, any JSON object, a Lark grammar),
    /// compiled once by [`crate::Engine::compile_grammar`]: at each step the tokens it does
    /// not allow get −∞ before sampling, and the generation ends when the grammar is complete
    /// and allows nothing more (finish reason `Eos`). Near `max_tokens` a token after which
    /// the grammar could not be finished in the tokens left is drawn again without it, so a
    /// reply cut by `max_tokens` is still whole whenever `max_tokens` allows the grammar's
    /// smallest sentence (finish reason `Length`). The log-probabilities reported are still
    /// the model's own, before the mask.
    pub grammar: Option<crate::CompiledGrammar>,
    /// Speculative decoding ([`Draft`]): drafts checked in one pass with the token
    /// before them. It changes the speed, never the output. In the continuous batcher each
    /// sequence drafts on its own and one pass runs every sequence's rows.
    pub draft: Draft,
    /// A position of the prompt (tokens from its start) where the prefix cache keeps the
    /// state too, besides at the prompt's end: what other prompts share, such as a system
    /// prompt. Only models with a recurrent state (KDA, gated DeltaNet) need it — theirs cannot
    /// be cut back to a shared prefix, a KV cache can — and there the prefill runs in two
    /// passes, to it and on (the same bits). `None` lets a chat prompt mark the end of its
    /// leading system messages ([`crate::Batcher::submit`], [`crate::Session::generate`]).
    pub cache_prefix: Option<usize>,
}

/// The most alternatives [`GenerateOptions::logprobs`] may ask for.
pub const MAX_TOP_LOGPROBS: usize = 20;

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 128,
            sampling: SamplingOptions::default(),
            stop: Vec::new(),
            stop_at_eos: true,
            prefill_chunk: 64,
            prefill_span: None,
            on_prefill: None,
            keep_logits: false,
            logprobs: None,
            grammar: None,
            draft: Draft::Off,
            cache_prefix: None,
        }
    }
}

/// How far a prefill has got, for a progress display.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrefillProgress {
    /// Prompt tokens done: the passes finished, and of the current one the share of its layers
    /// done.
    pub done: usize,
    /// Prompt tokens in all.
    pub total: usize,
    /// Seconds since the prefill began.
    pub seconds: f64,
    /// Expert bytes read from disk since it began.
    pub expert_bytes_read: u64,
}

/// A callback hearing of a prefill's progress ([`GenerateOptions::on_prefill`]).
#[derive(Clone)]
pub struct PrefillHook(pub std::sync::Arc<dyn Fn(&PrefillProgress) + Send + Sync>);

impl std::fmt::Debug for PrefillHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PrefillHook")
    }
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// `max_tokens` reached.
    Length,
    /// An end-of-sequence token.
    Eos,
    /// A stop string.
    Stop,
}

/// Whether and how to draft.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Draft {
    /// No drafting: one token per forward pass.
    #[default]
    Off,
    /// Prompt lookup: propose the tokens that followed the latest earlier occurrence of the
    /// longest suffix (up to [`MAX_NGRAM`] tokens) of prompt and output. `tokens`: propose at
    /// most this many each time; `None` adapts to how drafts fare (see the drafter in `draft.rs`).
    Ngram {
        /// A fixed draft length, or `None` to adapt.
        tokens: Option<usize>,
    },
    /// The checkpoint's multi-token-prediction layer ([`crate::EngineBuilder::mtp`]): from
    /// the model's hidden state at the latest position and the token just chosen it predicts
    /// the next token (its most likely one), then goes on from its own output for a longer
    /// draft. `tokens` as for [`Draft::Ngram`].
    Mtp {
        /// A fixed draft length, or `None` to adapt.
        tokens: Option<usize>,
    },
}

impl Draft {
    /// The fixed draft length asked for, if any.
    pub fn tokens(self) -> Option<usize> {
        match self {
            Draft::Off => None,
            Draft::Ngram { tokens } | Draft::Mtp { tokens } => tokens,
        }
    }
}

/// Hidden rows the model's state keeps for the MTP layer ([`sluice_model::State::keep_hidden`]):
/// the most positions of the prompt its own cache starts from.
pub const MTP_WINDOW: usize = 512;

/// The longest suffix prompt lookup matches.
pub const MAX_NGRAM: usize = 4;

/// The longest draft (adaptive, or asked for).
pub const MAX_DRAFT: usize = 32;
