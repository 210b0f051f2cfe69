//! The engine (immutable, shared) and sessions (one per conversation or stream).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use sluice_kernels::{Isa, Kernels, Numerics};
use sluice_model::{Description, MemoryPlan, Model, ModelOptions, PolicyChoice};
use sluice_sampler::SamplingOptions;
use sluice_store::{ExpertStats, TraceEvent};
use sluice_text::{ChatTemplate, Message, Tokenizer};

use crate::Error;
use crate::stats::{EngineStats, GenerationStats};

/// How much memory sluice may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Memory {
    /// No limit: everything the model reads stays resident.
    #[default]
    Unlimited,
    /// `MemAvailable` minus headroom.
    Auto,
    /// At most this many bytes.
    Bytes(u64),
}

/// Builds an [`Engine`].
#[derive(Clone, Debug)]
pub struct EngineBuilder {
    model: Option<PathBuf>,
    memory: Memory,
    threads: Option<usize>,
    isa: Option<Isa>,
    numerics: Numerics,
    policy: PolicyChoice,
    prefetch: bool,
    prefetch_precision: f64,
    direct_io: bool,
    io_uring: bool,
    trace: bool,
    verify_pack: bool,
    context: usize,
    prefill_chunk: usize,
    sequences: usize,
    prefix_cache: Option<u64>,
    mtp: bool,
}

impl Default for EngineBuilder {
    fn default() -> Self {
        EngineBuilder {
            model: None,
            memory: Memory::Unlimited,
            threads: None,
            isa: None,
            numerics: Numerics::Exact,
            policy: PolicyChoice::default(),
            prefetch: true,
            prefetch_precision: sluice_store::PREFETCH_PRECISION,
            direct_io: true,
            io_uring: false,
            trace: false,
            verify_pack: true,
            context: 4096,
            prefill_chunk: 64,
            sequences: 1,
            prefix_cache: None,
            mtp: false,
        }
    }
}

/// The budget in bytes a [`Memory`] setting means (None: unlimited).
pub fn resolve_memory(m: Memory) -> Result<Option<u64>, Error> {
    Ok(match m {
        Memory::Unlimited => None,
        Memory::Auto => Some(auto_budget()?),
        Memory::Bytes(b) => Some(b),
    })
}

/// The budget `Memory::Auto` gives: what this process may use (the machine's `MemAvailable`,
/// or its memory cgroup's room when that is smaller) less headroom
/// ([`crate::sysmem::Available::auto_budget`]).
fn auto_budget() -> Result<u64, Error> {
    crate::sysmem::available()
        .map(|a| a.auto_budget())
        .map_err(|e| Error::Usage(format!("--memory auto: {e}")))
}

impl EngineBuilder {
    /// The model directory (a Hugging Face checkpoint).
    pub fn model(mut self, dir: impl AsRef<Path>) -> Self {
        self.model = Some(dir.as_ref().to_path_buf());
        self
    }

    /// The memory budget.
    pub fn memory(mut self, m: Memory) -> Self {
        self.memory = m;
        self
    }

    /// Compute threads (default: the machine's available parallelism).
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = Some(n);
        self
    }

    /// Forces an instruction set (default: the best this CPU has).
    pub fn isa(mut self, isa: Isa) -> Self {
        self.isa = Some(isa);
        self
    }

    /// The numeric mode of products with quantized GGUF weights (default
    /// [`Numerics::Exact`]; [`Numerics::Int8`]: 8-bit activations and exact integer dot
    /// products, as llama.cpp computes them). Output bits depend on it, and on nothing else
    /// this builder sets.
    pub fn numerics(mut self, numerics: Numerics) -> Self {
        self.numerics = numerics;
        self
    }

    /// The expert-cache eviction policy (default [`PolicyChoice::Lfu`]; a shipped one parses
    /// from its name, e.g. `"s3fifo".parse()?`, and [`PolicyChoice::ALL`] lists them).
    pub fn policy(mut self, policy: PolicyChoice) -> Self {
        self.policy = policy;
        self
    }

    /// A policy of your own through the public [`Policy`](crate::Policy) trait; `make(n)` builds
    /// one for a cache of about `n` experts.
    pub fn custom_policy(
        mut self,
        make: impl Fn(usize) -> Box<dyn crate::Policy> + Send + Sync + 'static,
    ) -> Self {
        self.policy = PolicyChoice::custom(make);
        self
    }

    /// Lookahead prefetch of the next layer's predicted experts (default on). A hint only: the
    /// output never changes.
    pub fn prefetch(mut self, on: bool) -> Self {
        self.prefetch = on;
        self
    }

    /// How sure lookahead must be before it reads: the share of a confidence rank's
    /// predictions that must have come true before prefetch reads that rank (default
    /// [`PREFETCH_PRECISION`](sluice_store::PREFETCH_PRECISION); 0 reads every prediction).
    pub fn prefetch_precision(mut self, p: f64) -> Self {
        self.prefetch_precision = p;
        self
    }

    /// Read with O_DIRECT where the file system allows it (default on).
    pub fn direct_io(mut self, on: bool) -> Self {
        self.direct_io = on;
        self
    }

    /// Queue expert reads of O_DIRECT shards on one io_uring instead of reader threads
    /// (default off; Linux only, and building the engine fails where the kernel refuses
    /// io_uring). Output bits do not depend on it.
    pub fn io_uring(mut self, on: bool) -> Self {
        self.io_uring = on;
        self
    }

    /// For a pack directory: verify the packed trunk's checksums (default on; off loads faster
    /// and says so).
    pub fn verify_pack(mut self, on: bool) -> Self {
        self.verify_pack = on;
        self
    }

    /// Record every expert request (see [`Engine::take_trace`]).
    pub fn trace(mut self, on: bool) -> Self {
        self.trace = on;
        self
    }

    /// Positions the KV cache is planned for (default 4096, capped by the model's maximum).
    pub fn context(mut self, n: usize) -> Self {
        self.context = n;
        self
    }

    /// Prompt tokens per prefill chunk (default 64); scratch memory is planned for it, and
    /// under a memory budget no generation's chunk exceeds it
    /// ([`GenerateOptions::prefill_chunk`](crate::GenerateOptions::prefill_chunk) is clamped).
    pub fn prefill_chunk(mut self, n: usize) -> Self {
        self.prefill_chunk = n;
        self
    }

    /// Sequences decoded together by a [`crate::Batcher`] (default 1): the memory plan
    /// reserves the KV cache and recurrent state of this many sequences inside the budget.
    pub fn sequences(mut self, n: usize) -> Self {
        self.sequences = n;
        self
    }

    /// Bytes the prefix cache may hold (0: off). It keeps the state of recent prompts so that a
    /// prompt starting like one of them computes only the rest (see
    /// [`Engine::prefix_cache_stats`]); the output is the same bits either way. Under a budget
    /// this much is planned into the pool before the trunk (and counted in the minimum), the
    /// expert cache using what the entries do not; by default the share is a sixteenth of the
    /// budget, out of what the pool holds beyond every planned sequence's full-context KV
    /// cache and the expert floor ([`MemoryPlan::prefix_cache`]). With unlimited memory the
    /// default is 1 GiB.
    pub fn prefix_cache(mut self, bytes: u64) -> Self {
        self.prefix_cache = Some(bytes);
        self
    }

    /// Loads the checkpoint's multi-token-prediction layer for drafting with
    /// [`crate::Draft::Mtp`] (default off): it is pinned in memory, its routed experts read and
    /// cached beside the model's. A model without one (or whose kind is not run yet) is refused.
    pub fn mtp(mut self, on: bool) -> Self {
        self.mtp = on;
        self
    }

    /// Loads the model.
    pub fn build(self) -> Result<Engine, Error> {
        let dir = self
            .model
            .ok_or(Error::Usage("no model directory given".into()))?;
        if !crate::is_model_path(&dir) {
            return Err(Error::Usage(format!(
                "model {} does not exist (a model directory or a .gguf file)",
                dir.display()
            )));
        }
        let kernels = match self.isa {
            Some(isa) => Kernels::new(isa).map_err(|e| Error::Usage(e.to_string()))?,
            None => Kernels::best(),
        }
        .with_numerics(self.numerics);
        let threads = self
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        if threads == 0 {
            return Err(Error::Usage("threads must be at least 1".into()));
        }
        let (max, cores) = max_threads();
        if threads > max {
            return Err(Error::Usage(format!(
                "threads: {threads} is more than the limit of {max} (8 × the {cores} available cores)"
            )));
        }
        if self.prefill_chunk == 0 {
            return Err(Error::Usage("prefill chunk must be at least 1".into()));
        }
        if self.sequences == 0 {
            return Err(Error::Usage("sequences must be at least 1".into()));
        }
        let memory = resolve_memory(self.memory)?;
        let desc = Description::open(&dir)?;
        let crate::Text {
            tokenizer,
            template,
            error: text_error,
        } = crate::load_text(&desc)?;
        let text_memory = text_memory(
            tokenizer.as_ref(),
            self.context.min(desc.config.max_positions),
            self.sequences,
        );
        let opts = ModelOptions {
            kernels,
            threads,
            memory,
            policy: self.policy.clone(),
            prefetch: self.prefetch,
            prefetch_precision: self.prefetch_precision,
            readers: 4,
            direct_io: self.direct_io,
            io_uring: self.io_uring,
            record_trace: self.trace,
            context: self.context,
            chunk: self.prefill_chunk,
            sequences: self.sequences,
            verify: None,
            verify_pack: self.verify_pack,
            text_memory,
            prefix_cache: self.prefix_cache,
            mtp: self.mtp,
        };
        let model = Model::from_description(desc, opts)?;
        let prefix = crate::prefix::PrefixCache::new(model.plan().prefix_cache, memory.is_some());
        let mut eos = model.config().eos_token_ids.clone();
        let gen_cfg = model.generation_config().cloned();
        if let Some(g) = &gen_cfg
            && let Some(v) = g.get("eos_token_id")
        {
            let ids: Vec<u32> = match v {
                serde_json::Value::Array(a) => a
                    .iter()
                    .filter_map(|x| x.as_u64())
                    .map(|x| x as u32)
                    .collect(),
                x => x.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
            };
            eos.extend(ids);
        }
        eos.sort_unstable();
        eos.dedup();
        let sampling = gen_cfg.as_ref().map(sampling_defaults).unwrap_or_default();
        // A template (untrusted: it comes with the model) writes at most what a prompt of the
        // context can hold, beyond what it is given (see `RenderLimits`).
        let template = template.map(|t| match &tokenizer {
            Some(tok) => {
                let bytes = tok.max_prompt_bytes(model.max_positions());
                t.with_limits(sluice_text::chat::RenderLimits::for_prompt_bytes(bytes))
            }
            None => t,
        });
        Ok(Engine {
            inner: Arc::new(Inner {
                dir,
                model,
                tokenizer,
                template,
                text_error,
                eos,
                sampling,
                memory: self.memory,
                budget: memory,
                prefill_chunk: self.prefill_chunk,
                threads,
                stats: Mutex::new(EngineStats::default()),
                slots: Arc::new(Slots {
                    limit: memory.map(|_| self.sequences),
                    taken: Mutex::new(0),
                }),
                grammar: Mutex::new(None),
                prefix,
                fingerprint: std::sync::OnceLock::new(),
            }),
        })
    }
}

/// A grammar compiled for an engine ([`Engine::compile_grammar`]): cheap to clone, and under a
/// memory budget holding the memory it is lent by the expert cache until the last clone goes.
#[derive(Clone, Debug)]
pub struct CompiledGrammar {
    pub(crate) compiled: sluice_grammar::Compiled,
    _lease: Arc<Option<sluice_store::Lease>>,
}

impl CompiledGrammar {
    /// What was given: `json_object`, `json_schema`, `grammar`.
    pub fn kind(&self) -> &'static str {
        self.compiled.kind()
    }

    /// The length in bytes of the grammar's smallest sentence the search found
    /// ([`sluice_grammar::Compiled::smallest`]).
    pub fn smallest(&self) -> Option<usize> {
        self.compiled.smallest()
    }

    /// Bytes of the memory budget the compiled grammar holds (0 without a budget).
    pub fn charged_bytes(&self) -> u64 {
        self._lease.as_ref().as_ref().map_or(0, |l| l.bytes())
    }
}

/// The vocabulary's index for grammars and the expert-cache lease that pays for it.
struct GrammarIndex {
    vocab: sluice_grammar::Vocab,
    _lease: Option<sluice_store::Lease>,
}

struct Inner {
    dir: PathBuf,
    model: Model,
    tokenizer: Option<Tokenizer>,
    template: Option<ChatTemplate>,
    /// Why a GGUF model has no tokenizer, when its vocabulary could not be built.
    text_error: Option<String>,
    eos: Vec<u32>,
    sampling: SamplingOptions,
    memory: Memory,
    budget: Option<u64>,
    prefill_chunk: usize,
    threads: usize,
    stats: Mutex<EngineStats>,
    slots: Arc<Slots>,
    /// The vocabulary indexed for constrained decoding, built at the first grammar, and under a
    /// budget the memory it was given, lent by the expert cache for the engine's life.
    /// (A failure is not kept: the cache may give the memory up later, as leases end.)
    grammar: Mutex<Option<Arc<GrammarIndex>>>,
    /// The model's identity for session files, computed at the first save or load.
    fingerprint: std::sync::OnceLock<[u8; 16]>,
    /// The state of recent prompts.
    prefix: crate::prefix::PrefixCache,
}

/// The memory a budget keeps for the tokenizer, planned inside it like scratch: what the
/// tokenizer holds and the peak of encoding the longest prompt that can fit `context`
/// positions, for as many prompts at once as `sequences` (see
/// [`Tokenizer::memory_bytes`]). Nothing without a tokenizer; counted in the plan's minimum
/// even when memory is unlimited.
pub(crate) fn text_memory(tokenizer: Option<&Tokenizer>, context: usize, sequences: usize) -> u64 {
    tokenizer.map_or(0, |t| t.memory_bytes(context.max(1), sequences))
}

/// The sequences whose state (KV cache, recurrent state) the memory plan holds inside the
/// budget: each open [`Session`](crate::Session) takes one, a [`crate::Batcher`] takes its width, and
/// they are given back when those end. Unlimited memory has no limit.
#[derive(Debug)]
struct Slots {
    limit: Option<usize>,
    taken: Mutex<usize>,
}

/// A claim on some of the plan's sequences, given back when dropped.
#[derive(Debug)]
pub(crate) struct SlotClaim {
    slots: Arc<Slots>,
    n: usize,
}

impl Drop for SlotClaim {
    fn drop(&mut self) {
        let mut t = match self.slots.taken.lock() {
            Ok(t) => t,
            Err(p) => p.into_inner(),
        };
        *t = t.saturating_sub(self.n);
    }
}

/// A loaded model with its tokenizer and chat template. Cheap to clone; `Send + Sync`; any
/// number of [`Session`](crate::Session)s may run on it at once.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Engine({})", self.inner.dir.display())
    }
}

impl Engine {
    /// A builder.
    pub fn builder() -> EngineBuilder {
        EngineBuilder::default()
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.inner.model
    }

    /// The model directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The tokenizer, when the model directory has one.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.inner.tokenizer.as_ref()
    }

    /// The chat template, when the model directory has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.inner.template.as_ref()
    }

    /// Sampling defaults from the model's `generation_config.json` (`do_sample`, `temperature`,
    /// `top_k`, `top_p`, `repetition_penalty`); greedy when it says nothing.
    pub fn default_sampling(&self) -> &SamplingOptions {
        &self.inner.sampling
    }

    /// End-of-sequence ids.
    pub fn eos_ids(&self) -> &[u32] {
        &self.inner.eos
    }

    /// Compiles a grammar against the model's vocabulary: checked against
    /// [`sluice_grammar::limits`], compiled and its first step taken on a thread of its own
    /// (never the caller's: see [`sluice_grammar::Vocab::compile`]), at most
    /// [`sluice_grammar::COMPILE_SECONDS`]. The result goes in
    /// [`GenerateOptions::grammar`](crate::GenerateOptions::grammar); one compiled grammar
    /// serves any number of generations (a request's choices, a batch's lines).
    ///
    /// The vocabulary is indexed once, at the first call; under a memory budget the index's
    /// memory ([`sluice_grammar::index_bytes`]) is lent by the expert cache from then on, as KV
    /// pages are, and so is each compiled grammar's ([`sluice_grammar::Compiled::memory_bytes`])
    /// for as long as it is held, and each generation's copy of its lexer while it runs: a
    /// budget whose cache cannot give it up refuses the grammar (or fails the generation).
    pub fn compile_grammar(
        &self,
        grammar: &sluice_grammar::Grammar,
    ) -> Result<CompiledGrammar, Error> {
        let index = {
            let mut slot = match self.inner.grammar.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            match &*slot {
                Some(i) => Arc::clone(i),
                None => {
                    let i = Arc::new(self.index_vocab().map_err(Error::Usage)?);
                    *slot = Some(Arc::clone(&i));
                    i
                }
            }
        };
        let compiled = index.vocab.compile(grammar)?;
        let lease = match self.budget() {
            None => None,
            Some(_) => {
                let bytes = compiled.memory_bytes();
                let mut l = self.model().experts().lease();
                l.grow_to(bytes).map_err(|e| {
                    Error::Usage(format!(
                        "{}: the grammar needs {:.1} MiB of the memory budget and the expert cache cannot give it up ({e}): raise --memory or simplify the grammar",
                        grammar.kind(),
                        bytes as f64 / (1u64 << 20) as f64
                    ))
                })?;
                Some(l)
            }
        };
        Ok(CompiledGrammar {
            compiled,
            _lease: Arc::new(lease),
        })
    }

    /// The model's identity for session files (`saved.rs`'s `fingerprint`).
    pub(crate) fn fingerprint(&self) -> Result<[u8; 16], Error> {
        if let Some(f) = self.inner.fingerprint.get() {
            return Ok(*f);
        }
        let f = crate::saved::fingerprint(&self.inner.dir)?;
        Ok(*self.inner.fingerprint.get_or_init(|| f))
    }

    /// Indexes the vocabulary for grammars (see [`Engine::constrain`]).
    fn index_vocab(&self) -> Result<GrammarIndex, String> {
        let tok = self.tokenizer().ok_or_else(|| {
            format!(
                "{}: constrained decoding needs the model's tokenizer (tokenizer.json or tiktoken.model), and the model directory has none",
                self.inner.dir.display()
            )
        })?;
        let lease = match self.budget() {
            None => None,
            Some(_) => {
                let bytes = sluice_grammar::index_bytes(tok.vocab_size());
                let mut l = self.model().experts().lease();
                l.grow_to(bytes).map_err(|e| {
                    format!(
                        "constrained decoding needs {:.1} MiB of the memory budget to index the vocabulary, and the expert cache cannot give it up ({e}): raise --memory",
                        bytes as f64 / (1u64 << 20) as f64
                    )
                })?;
                Some(l)
            }
        };
        let vocab = sluice_grammar::Vocab::new(
            &tok.vocab_bytes(),
            self.eos_ids(),
            self.model().config().vocab,
        )
        .map_err(|e| e.to_string())?;
        Ok(GrammarIndex {
            vocab,
            _lease: lease,
        })
    }

    /// The memory setting.
    pub fn memory(&self) -> Memory {
        self.inner.memory
    }

    /// Compute threads.
    pub fn threads(&self) -> usize {
        self.inner.threads
    }

    /// The ISA in use.
    pub fn isa(&self) -> Isa {
        self.inner.model.isa()
    }

    /// The expert store's counters since the engine started.
    pub fn expert_stats(&self) -> ExpertStats {
        self.inner.model.experts().stats()
    }

    /// The memory plan in force.
    pub fn plan(&self) -> &MemoryPlan {
        self.inner.model.plan()
    }

    /// The budget in bytes (None: unlimited).
    pub fn budget(&self) -> Option<u64> {
        self.inner.budget
    }

    /// The prefill chunk the scratch is planned for: under a memory budget, the most a
    /// generation's [`GenerateOptions::prefill_chunk`](crate::GenerateOptions::prefill_chunk)
    /// takes.
    pub fn prefill_chunk(&self) -> usize {
        self.inner.prefill_chunk
    }

    /// Takes the expert requests recorded so far (with [`EngineBuilder::trace`]).
    pub fn take_trace(&self) -> Vec<TraceEvent> {
        self.inner.model.experts().take_trace()
    }

    /// The prefix cache's figures: its limit, what it holds, lookups, hits and prompt tokens
    /// reused ([`EngineBuilder::prefix_cache`]).
    pub fn prefix_cache_stats(&self) -> crate::PrefixCacheStats {
        self.inner.prefix.stats()
    }

    /// The prefix cache.
    pub(crate) fn prefix(&self) -> &crate::prefix::PrefixCache {
        &self.inner.prefix
    }

    /// Totals so far.
    pub fn stats(&self) -> EngineStats {
        self.inner
            .stats
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    /// What the expert cache can hold now, as the figures report it: 0 with unlimited memory
    /// (where the store's capacity is a sentinel, not a size).
    pub(crate) fn cache_capacity(&self) -> u64 {
        match self.budget() {
            Some(_) => self.model().experts().capacity(),
            None => 0,
        }
    }

    /// The engine's figures now, for a generation's counters.
    pub(crate) fn figures_now(&self) -> crate::stats::Now<'_> {
        crate::stats::Now {
            experts: self.expert_stats(),
            trunk_bytes_read: self.model().trunk_bytes_read(),
            cache_bytes: self.cache_capacity(),
            cfg: self.model().config(),
        }
    }

    /// Adds a finished generation to the totals.
    pub(crate) fn count_generation(&self, g: &GenerationStats) {
        if let Ok(mut s) = self.inner.stats.lock() {
            s.generations += 1;
            s.prefill_tokens += g.prefill_tokens as u64;
            s.decode_tokens += g.decode_tokens as u64;
        }
    }

    /// Takes `n` of the sequences the memory plan holds state for.
    pub(crate) fn claim(&self, n: usize) -> Result<SlotClaim, Error> {
        let slots = &self.inner.slots;
        let mut taken = match slots.taken.lock() {
            Ok(t) => t,
            Err(p) => p.into_inner(),
        };
        if let Some(limit) = slots.limit
            && *taken + n > limit
        {
            return Err(Error::Sequences {
                wanted: n,
                open: *taken,
                planned: limit,
            });
        }
        *taken += n;
        Ok(SlotClaim {
            slots: Arc::clone(slots),
            n,
        })
    }

    /// Sequences in use now (open sessions plus the width of running batchers), and how many
    /// the memory plan holds (None: unlimited memory, no limit).
    pub fn sequences_in_use(&self) -> (usize, Option<usize>) {
        let s = &self.inner.slots;
        (s.taken.lock().map_or(0, |t| *t), s.limit)
    }

    /// Whether the model has a recurrent state (KDA, gated DeltaNet), which cannot be cut back
    /// to an arbitrary prefix.
    pub(crate) fn recurrent(&self) -> bool {
        self.model()
            .config()
            .layer_plan
            .iter()
            .any(|l| l.attention.recurrent_floats() > 0)
    }

    /// For a model with a recurrent state, where a chat's leading system (or developer)
    /// messages end in its tokens `ids`: the tokens of those messages rendered on their own,
    /// when they start `ids` and more follows. The prefix cache keeps the state there, the
    /// part that requests share ([`GenerateOptions::cache_prefix`](crate::GenerateOptions)).
    pub(crate) fn chat_system_end(&self, msgs: &[Message], ids: &[u32]) -> Option<usize> {
        let n = self.system_boundary(msgs)?;
        let text = self.chat_template()?.render(&msgs[..n], false).ok()?;
        self.prefix_end(&text, ids)
    }

    /// How many leading system (or developer) messages a chat has, when the prefix cache should
    /// keep the state where they end: the model's state is recurrent, the cache is on, and
    /// other messages follow them.
    pub(crate) fn system_boundary(&self, msgs: &[Message]) -> Option<usize> {
        let n = msgs
            .iter()
            .take_while(|m| m.role == "system" || m.role == "developer")
            .count();
        (n > 0 && n < msgs.len() && self.prefix().enabled() && self.recurrent()).then_some(n)
    }

    /// The length of `text`'s tokens (as a chat template's output is encoded) when they start
    /// `ids` and more follows.
    pub(crate) fn prefix_end(&self, text: &str, ids: &[u32]) -> Option<usize> {
        let head = self.tokenizer()?.encode(text, false).ok()?;
        (!head.is_empty() && head.len() < ids.len() && ids.starts_with(&head)).then_some(head.len())
    }

    /// Token ids of a prompt. Text is encoded with the tokenizer, with the special tokens its
    /// post-processor adds (a BOS where it adds one), as transformers' tokenizer of the
    /// directory does; chat messages go through the chat template first.
    pub fn encode(&self, prompt: &Prompt<'_>) -> Result<Vec<u32>, Error> {
        match prompt {
            Prompt::Ids(ids) => Ok(ids.to_vec()),
            Prompt::Text(t) => {
                let tok = self
                    .tokenizer()
                    .ok_or_else(|| match &self.inner.text_error {
                        Some(e) => Error::Usage(format!("no tokenizer ({e}): give token ids")),
                        None => Error::Usage(format!(
                            "{} has no tokenizer: give token ids",
                            self.dir().display()
                        )),
                    })?;
                tok.check_fits(t, self.model().max_positions())?;
                // What transformers 5's tokenizer of the directory gives: the special tokens of
                // tokenizer.json's post-processor, nothing from config.json's `bos_token_id`.
                Ok(tok.encode(t, true)?)
            }
            Prompt::Chat(msgs) => {
                let tpl = self.chat_template().ok_or_else(|| {
                    Error::Usage(format!(
                        "{} has no chat template: use a raw prompt",
                        self.dir().display()
                    ))
                })?;
                let text = tpl.render(msgs, true)?;
                let tok = self.tokenizer().ok_or_else(|| {
                    Error::Usage("no tokenizer for the chat template's text".into())
                })?;
                tok.check_fits(&text, self.model().max_positions())?;
                // The template writes BOS itself where the model wants one.
                Ok(tok.encode(&text, false)?)
            }
        }
    }
}

/// What to generate from.
#[derive(Clone, Debug)]
pub enum Prompt<'a> {
    /// Raw text, tokenised as is.
    Text(&'a str),
    /// Token ids.
    Ids(&'a [u32]),
    /// Chat messages, rendered with the model's chat template.
    Chat(&'a [Message]),
}

/// The most compute threads an engine starts, and the cores it is reckoned from: 8 × the
/// machine's available parallelism (more only adds threads that wait).
pub fn max_threads() -> (usize, usize) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores.saturating_mul(8), cores)
}

/// Sampling defaults as transformers reads them from `generation_config.json`: sampling only
/// when `do_sample` is true; otherwise greedy.
fn sampling_defaults(g: &serde_json::Value) -> SamplingOptions {
    let mut s = SamplingOptions::default();
    let f = |k: &str| g.get(k).and_then(serde_json::Value::as_f64);
    if g.get("do_sample").and_then(serde_json::Value::as_bool) == Some(true) {
        s.temperature = f("temperature").unwrap_or(1.0) as f32;
        s.top_p = f("top_p").unwrap_or(1.0) as f32;
        // transformers' default top_k is 50 when sampling.
        s.top_k = f("top_k").unwrap_or(50.0) as usize;
        if let Some(m) = f("min_p") {
            s.min_p = m as f32;
        }
    }
    if let Some(r) = f("repetition_penalty") {
        s.repetition_penalty = r as f32;
    }
    s
}
