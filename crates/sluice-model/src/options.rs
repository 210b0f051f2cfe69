//! How to build a model — threads, budget, policy, prefetch, reads, context and chunk the plan
//! is for, and the verifier of a packed trunk — and how to run it: which logits a pass returns,
//! how a prefill runs a prompt and what it reports, where a pass spent its time.

use std::path::Path;
use std::sync::Arc;

use sluice_kernels::Kernels;
use sluice_store::{StoreError, Verifier};

use sluice_store::policy::PolicyChoice;

/// How to build a model.
#[derive(Clone)]
pub struct ModelOptions {
    /// Kernels (their ISA).
    pub kernels: Kernels,
    /// Compute threads.
    pub threads: usize,
    /// Memory budget in bytes for everything sluice allocates (None: unlimited).
    pub memory: Option<u64>,
    /// Expert-cache eviction policy.
    pub policy: PolicyChoice,
    /// Lookahead prefetch of the next layer's predicted experts.
    pub prefetch: bool,
    /// Share of a confidence rank's lookahead predictions that must have come true before
    /// prefetch reads that rank (0: read every prediction). See [`ExpertStore::prefetch`](sluice_store::ExpertStore::prefetch).
    pub prefetch_precision: f64,
    /// Reader threads for expert reads.
    pub readers: usize,
    /// Read shards with O_DIRECT where the file system allows it.
    pub direct_io: bool,
    /// Queue the expert reads of O_DIRECT shards on one io_uring (`readers` in flight) instead
    /// of handing them to reader threads (Linux; an error where the kernel refuses io_uring).
    pub io_uring: bool,
    /// Record every expert request for offline replay.
    pub record_trace: bool,
    /// Positions the KV cache is planned for (capped by the model's maximum).
    pub context: usize,
    /// Prompt tokens per prefill chunk the scratch is planned for.
    pub chunk: usize,
    /// Sequences decoded together ([`Model::forward_batch`](crate::Model::forward_batch)): the KV cache, recurrent state and
    /// scratch are planned for this many.
    pub sequences: usize,
    /// Checks each trunk part after it is read (a packed trunk's checksums). Parts are
    /// numbered: layers `0..layers`, the head `layers`, the embedding table `layers + 1`.
    pub verify: Option<Verifier>,
    /// For a pack directory: verify the packed trunk's checksums (at load, and on every read of
    /// a streamed layer).
    pub verify_pack: bool,
    /// Bytes of the budget kept for the caller's own use beside the model (the engine's
    /// tokenizer): planned first, like scratch.
    pub text_memory: u64,
    /// Bytes for the engine's prefix cache (the state of recent prompts): `None` for the
    /// default share (see [`crate::MemoryPlan::prefix_cache`]), `Some(0)` for none.
    pub prefix_cache: Option<u64>,
    /// Load the checkpoint's multi-token-prediction layer (pinned, its experts beside the
    /// model's) for drafting ([`crate::Model::mtp_forward`]).
    pub mtp: bool,
}

/// A verifier that checks parts read from a packed trunk against the manifest's checksums
/// (see [`sluice_format::packed::TrunkChecksums`]).
pub fn pack_verifier(
    m: &sluice_format::packed::Manifest,
    trunk_file: &Path,
    layers: usize,
) -> Verifier {
    let sums = sluice_format::packed::TrunkChecksums::new(m, trunk_file, layers);
    Arc::new(move |i, blob| {
        sums.verify(i, (0..blob.pieces()).map(|k| blob.piece(k)))
            .map_err(|e| StoreError::Corrupt(e.to_string()))
    })
}

impl std::fmt::Debug for ModelOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelOptions")
            .field("isa", &self.kernels.isa())
            .field("threads", &self.threads)
            .field("memory", &self.memory)
            .field("policy", &self.policy)
            .field("prefetch", &self.prefetch)
            .field("prefetch_precision", &self.prefetch_precision)
            .field("readers", &self.readers)
            .field("direct_io", &self.direct_io)
            .field("io_uring", &self.io_uring)
            .field("record_trace", &self.record_trace)
            .field("context", &self.context)
            .field("chunk", &self.chunk)
            .field("verify", &self.verify.is_some())
            .field("verify_pack", &self.verify_pack)
            .field("text_memory", &self.text_memory)
            .field("prefix_cache", &self.prefix_cache)
            .field("mtp", &self.mtp)
            .finish()
    }
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            kernels: Kernels::best(),
            threads: 1,
            memory: None,
            policy: PolicyChoice::default(),
            prefetch: true,
            prefetch_precision: sluice_store::PREFETCH_PRECISION,
            readers: 4,
            direct_io: true,
            io_uring: false,
            record_trace: false,
            context: 4096,
            chunk: 64,
            sequences: 1,
            verify: None,
            verify_pack: true,
            text_memory: 0,
            prefix_cache: None,
            mtp: false,
        }
    }
}

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

/// What [`Model::prefill`](crate::Model::prefill) reports as it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillEvent {
    /// Layer `layer` (of `layers`) has run over the span of `span` tokens that starts `done`
    /// tokens into the prompt.
    Layer {
        /// Prompt tokens in the state before the span.
        done: usize,
        /// Tokens of the span.
        span: usize,
        /// The layer done.
        layer: usize,
        /// Layers of the model.
        layers: usize,
    },
    /// A span is in the state.
    Span {
        /// Its tokens.
        tokens: usize,
    },
}

/// How [`Model::prefill`](crate::Model::prefill) runs a prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillOptions {
    /// Rows each call inside a layer takes at most (attention, products); under a budget at
    /// most the plan's [`MemoryPlan::chunk`](crate::MemoryPlan::chunk), whose scratch holds them.
    pub chunk: usize,
    /// Most prompt tokens one pass runs each layer over (the memory plan may allow fewer).
    pub max_span: usize,
}

impl Default for PrefillOptions {
    fn default() -> Self {
        PrefillOptions {
            chunk: usize::MAX,
            max_span: usize::MAX,
        }
    }
}

/// Where a forward pass spent its time, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PassTimes {
    /// Attention (projections, the cache, scores).
    pub attention: f64,
    /// Routed experts: waiting for their reads and their products (in a prefill, where the
    /// shared expert runs as a task beside them, its product too).
    pub experts: f64,
    /// The final norm and the lm_head over the rows whose logits are wanted (with a
    /// hyper-connection model, its hyper head too).
    pub head: f64,
    /// Everything else (embeddings, norms, routers, dense blocks, and the shared expert of a
    /// decode step).
    pub other: f64,
}

impl PassTimes {
    /// Every phase's seconds × `f` (a batched pass's share of one of its sequences).
    pub fn scaled(self, f: f64) -> PassTimes {
        PassTimes {
            attention: self.attention * f,
            experts: self.experts * f,
            head: self.head * f,
            other: self.other * f,
        }
    }
}

impl std::ops::AddAssign for PassTimes {
    fn add_assign(&mut self, o: PassTimes) {
        self.attention += o.attention;
        self.experts += o.experts;
        self.head += o.head;
        self.other += o.other;
    }
}

impl std::ops::Sub for PassTimes {
    type Output = PassTimes;
    fn sub(self, o: PassTimes) -> PassTimes {
        PassTimes {
            attention: self.attention - o.attention,
            experts: self.experts - o.experts,
            head: self.head - o.head,
            other: self.other - o.other,
        }
    }
}
