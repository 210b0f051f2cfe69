//! The engine (immutable, shared) and sessions (one per conversation or stream).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use sluice_kernels::{Isa, Kernels};
use sluice_model::{Logits, MemoryPlan, Model, ModelOptions, PolicyChoice, State};
use sluice_sampler::SamplingOptions;
use sluice_store::{ExpertStats, TraceEvent};

use crate::Error;
use crate::decoding::Decoding;
use sluice_text::{ChatTemplate, Message, Tokenizer};

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
    policy: PolicyChoice,
    prefetch: bool,
    prefetch_precision: f64,
    direct_io: bool,
    trace: bool,
    verify_pack: bool,
    context: usize,
    prefill_chunk: usize,
    sequences: usize,
}

impl Default for EngineBuilder {
    fn default() -> Self {
        EngineBuilder {
            model: None,
            memory: Memory::Unlimited,
            threads: None,
            isa: None,
            policy: PolicyChoice::default(),
            prefetch: true,
            prefetch_precision: sluice_store::PREFETCH_PRECISION,
            direct_io: true,
            trace: false,
            verify_pack: true,
            context: 4096,
            prefill_chunk: 64,
            sequences: 1,
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

/// Headroom `Memory::Auto` leaves for the rest of the system: 10% of what is available, at
/// least 512 MiB.
fn auto_budget() -> Result<u64, Error> {
    let text = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| Error::Usage(format!("--memory auto needs /proc/meminfo: {e}")))?;
    let kb = text
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or_else(|| Error::Usage("--memory auto: no MemAvailable in /proc/meminfo".into()))?;
    let avail = kb * 1024;
    Ok(avail.saturating_sub((avail / 10).max(512 << 20)))
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

    /// The expert-cache eviction policy by name: `lfu` (default), `s3fifo`, `lru`, `fifo`, `sieve`.
    pub fn policy(mut self, name: &str) -> Self {
        self.policy = PolicyChoice::Named(name.to_owned());
        self
    }

    /// A policy of your own through the public [`Policy`](crate::Policy) trait; `make(n)` builds
    /// one for a cache of about `n` experts.
    pub fn custom_policy(
        mut self,
        make: impl Fn(usize) -> Box<dyn crate::Policy> + Send + Sync + 'static,
    ) -> Self {
        self.policy = PolicyChoice::Custom(Arc::new(make));
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

    /// Prompt tokens per prefill chunk (default 64); scratch memory is planned for it.
    pub fn prefill_chunk(mut self, n: usize) -> Self {
        self.prefill_chunk = n;
        self
    }

    /// Sequences decoded together by a [`crate::batch::Batcher`] (default 1): the memory plan
    /// reserves the KV cache and recurrent state of this many sequences inside the budget.
    pub fn sequences(mut self, n: usize) -> Self {
        self.sequences = n;
        self
    }

    /// Loads the model.
    pub fn build(self) -> Result<Engine, Error> {
        let dir = self
            .model
            .ok_or(Error::Usage("no model directory given".into()))?;
        if !dir.is_dir() {
            return Err(Error::Usage(format!(
                "model directory {} does not exist",
                dir.display()
            )));
        }
        let kernels = match self.isa {
            Some(isa) => Kernels::new(isa).map_err(|e| Error::Usage(e.to_string()))?,
            None => Kernels::best(),
        };
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
        let opts = ModelOptions {
            kernels,
            threads,
            memory,
            policy: self.policy.clone(),
            prefetch: self.prefetch,
            prefetch_precision: self.prefetch_precision,
            readers: 4,
            direct_io: self.direct_io,
            record_trace: self.trace,
            context: self.context,
            chunk: self.prefill_chunk,
            sequences: self.sequences,
            verify: None,
            verify_pack: self.verify_pack,
        };
        let model = Model::open(&dir, opts)?;
        let tokenizer = Tokenizer::from_dir(&dir)?;
        let template = ChatTemplate::from_dir(&dir)?;
        let mut eos = model.config().eos_token_ids.clone();
        let gen_path = dir.join("generation_config.json");
        let gen_cfg = if sluice_format::file::present(&gen_path) {
            Some(sluice_format::read_json(&gen_path, 16 << 20)?)
        } else {
            None
        };
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
        let bos = model.config().bos_token_id;
        let sampling = gen_cfg.as_ref().map(sampling_defaults).unwrap_or_default();
        Ok(Engine {
            inner: Arc::new(Inner {
                dir,
                model,
                tokenizer,
                template,
                eos,
                bos,
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
            }),
        })
    }
}

struct Inner {
    dir: PathBuf,
    model: Model,
    tokenizer: Option<Tokenizer>,
    template: Option<ChatTemplate>,
    eos: Vec<u32>,
    bos: Option<u32>,
    sampling: SamplingOptions,
    memory: Memory,
    budget: Option<u64>,
    prefill_chunk: usize,
    threads: usize,
    stats: Mutex<EngineStats>,
    slots: Arc<Slots>,
}

/// The sequences whose state (KV cache, recurrent state) the memory plan holds inside the
/// budget: each open [`Session`] takes one, a [`crate::batch::Batcher`] takes its width, and
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
/// number of [`Session`]s may run on it at once.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Engine({})", self.inner.dir.display())
    }
}

/// Totals over the engine's life.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct EngineStats {
    /// Generations run.
    pub generations: u64,
    /// Prompt tokens processed.
    pub prefill_tokens: u64,
    /// Tokens generated.
    pub decode_tokens: u64,
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

    /// The prefill chunk size.
    pub fn prefill_chunk(&self) -> usize {
        self.inner.prefill_chunk
    }

    /// Takes the expert requests recorded so far (with [`EngineBuilder::trace`]).
    pub fn take_trace(&self) -> Vec<TraceEvent> {
        self.inner.model.experts().take_trace()
    }

    /// Totals so far.
    pub fn stats(&self) -> EngineStats {
        self.inner
            .stats
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    /// A new session (an empty KV cache).
    ///
    /// Under a memory budget the plan holds the KV cache and recurrent state of
    /// [`EngineBuilder::sequences`] sequences (default 1), and each open session takes one of
    /// them until it is dropped (a [`crate::batch::Batcher`] takes as many as it is wide).
    /// Opening more fails at once with [`Error::Sequences`], so that the sessions' state
    /// never grows past the budget; it never waits. With [`Memory::Unlimited`] any number of
    /// sessions may be open. Sessions open at the same time share the expert cache: their
    /// steps take turns for room in it, in the order they ask, so each one completes.
    pub fn session(&self) -> Result<Session, Error> {
        Ok(Session {
            _claim: self.claim(1)?,
            engine: self.clone(),
            state: self.inner.model.new_state(),
            history: Vec::new(),
        })
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

    /// Token ids of a prompt. Text is encoded with the tokenizer (with its BOS when it adds
    /// one); chat messages go through the chat template first.
    pub fn encode(&self, prompt: &Prompt<'_>) -> Result<Vec<u32>, Error> {
        match prompt {
            Prompt::Ids(ids) => Ok(ids.to_vec()),
            Prompt::Text(t) => {
                let tok = self.tokenizer().ok_or_else(|| {
                    Error::Usage(format!(
                        "{} has no tokenizer: give token ids",
                        self.dir().display()
                    ))
                })?;
                tok.check_fits(t, self.model().max_positions())?;
                let mut ids = tok.encode(t, true)?;
                if let Some(b) = self.inner.bos
                    && ids.first() != Some(&b)
                    && tok.encode("", true)?.is_empty()
                {
                    ids.insert(0, b);
                }
                Ok(ids)
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
    /// Prompt tokens per prefill chunk.
    pub prefill_chunk: usize,
    /// Keep every row of logits (prompt positions and each step) in the result.
    pub keep_logits: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 128,
            sampling: SamplingOptions::default(),
            stop: Vec::new(),
            stop_at_eos: true,
            prefill_chunk: 64,
            keep_logits: false,
        }
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

/// One step of a generation: a generated token and the text it completes.
#[derive(Clone, Debug, PartialEq)]
pub struct Token {
    /// The token's id; `None` for the last item of a generation when it only releases text
    /// that was held back (a partial stop string, or bytes of an unfinished character).
    pub id: Option<u32>,
    /// The text it completes (whole UTF-8 characters; may be empty).
    pub text: String,
}

/// Figures of one generation. Expert and I/O counters are the engine's counters over the
/// generation's span (with concurrent sessions they include the others' work).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct GenerationStats {
    /// Prompt tokens processed.
    pub prefill_tokens: usize,
    /// Seconds spent on the prompt.
    pub prefill_seconds: f64,
    /// Tokens generated.
    pub decode_tokens: usize,
    /// Seconds spent generating.
    pub decode_seconds: f64,
    /// Routed experts asked for.
    pub expert_requests: u64,
    /// Of those, found in memory.
    pub expert_hits: u64,
    /// Of the hits, experts resident before the step that used them (not brought in by that
    /// step's prefetch).
    pub expert_resident_hits: u64,
    /// Bytes of experts read from disk.
    pub expert_bytes_read: u64,
    /// Bytes of trunk read from disk while generating.
    pub trunk_bytes_read: u64,
    /// Buffer bytes of the distinct experts each forward step asked for, summed over steps: what
    /// a cold cache would have to read at least.
    pub expert_touched_bytes: u64,
    /// Of `expert_bytes_read`, bytes read during the prompt.
    pub prefill_expert_bytes_read: u64,
    /// Of `trunk_bytes_read`, bytes read during the prompt.
    pub prefill_trunk_bytes_read: u64,
    /// Each prefill chunk's figures.
    pub prefill_chunks: Vec<PrefillChunkStats>,
    /// Seconds spent waiting on expert reads.
    pub io_seconds: f64,
    /// Prefetch recall: the fraction of routed experts that lookahead had predicted.
    pub prefetch_recall: f64,
    /// Experts read by lookahead prefetch.
    pub prefetch_reads: u64,
    /// Requests served by an expert a prefetch read during the same step.
    pub prefetch_hits: u64,
    /// Experts evicted from the cache.
    pub expert_evictions: u64,
    /// `direct` or `buffered`.
    pub io_mode: String,
    /// Peak resident memory of the process so far.
    pub peak_rss_bytes: u64,
    /// The memory budget (0: unlimited).
    pub memory_budget_bytes: u64,
    /// Bytes the expert cache could hold when the generation began (the pool less every
    /// sequence's KV pages then).
    pub expert_cache_start_bytes: u64,
    /// The same when the figures were taken: lower when this or another sequence's KV cache
    /// grew, higher when a sequence ended.
    pub expert_cache_end_bytes: u64,
    /// Bytes of this sequence's KV cache when the figures were taken (whole pages).
    pub kv_cache_bytes: u64,
    /// Expert-cache policy.
    pub policy: String,
    /// Compute threads.
    pub threads: usize,
    /// Instruction set.
    pub isa: String,
}

/// Figures of one prefill chunk (one forward step).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct PrefillChunkStats {
    /// Tokens in the chunk.
    pub tokens: usize,
    /// Seconds it took.
    pub seconds: f64,
    /// Routed experts asked for.
    pub expert_requests: u64,
    /// Of those, found in memory.
    pub expert_hits: u64,
    /// Distinct experts asked for.
    pub experts_touched: u64,
    /// Their buffer bytes.
    pub expert_touched_bytes: u64,
    /// Expert bytes read from disk during the chunk (demand and prefetch).
    pub expert_bytes_read: u64,
}

/// Peak resident set size of this process (`VmHWM`), 0 where unknown.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// A session: a KV cache and the tokens in it. Generations continue from what the session has
/// seen (a chat keeps its history).
#[derive(Debug)]
pub struct Session {
    /// Held for the session's life: its place in the memory plan.
    _claim: SlotClaim,
    engine: Engine,
    state: State,
    history: Vec<u32>,
}

impl Session {
    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Tokens in the cache.
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    /// Forgets everything (an empty cache).
    pub fn reset(&mut self) {
        self.state = self.engine.inner.model.new_state();
        self.history.clear();
    }

    /// Starts a generation from `prompt` appended to what the session has seen. Tokens come
    /// from the returned iterator.
    pub fn generate(
        &mut self,
        prompt: Prompt<'_>,
        opts: &GenerateOptions,
    ) -> Result<Generation<'_>, Error> {
        let ids = self.engine.encode(&prompt)?;
        self.generate_ids(ids, opts)
    }

    /// Starts a generation from `prompt` taken as the *whole* context (typically a chat
    /// rendered with every turn so far). The session keeps the KV cache of the longest prefix it
    /// shares with what it has seen and processes only the rest; the result is the same as on a
    /// fresh session.
    pub fn generate_full(
        &mut self,
        prompt: Prompt<'_>,
        opts: &GenerateOptions,
    ) -> Result<Generation<'_>, Error> {
        let ids = self.engine.encode(&prompt)?;
        let mut keep = self
            .history
            .iter()
            .zip(&ids)
            .take_while(|(a, b)| a == b)
            .count();
        // Keep only positions the cache holds (the last sampled token of a generation is not fed
        // until the next call), and feed at least one token to get the next logits.
        keep = keep.min(self.state.pos());
        if keep == ids.len() {
            keep = keep.saturating_sub(1);
        }
        let model = &self.engine.inner.model;
        if self.state.truncate(keep, model.config()).is_err() {
            // A recurrent state (KDA) cannot step back to an arbitrary prefix: start over,
            // which gives the same bits.
            keep = 0;
            self.state = model.new_state();
        }
        self.history.truncate(keep);
        self.generate_ids(ids[keep..].to_vec(), opts)
    }

    /// Starts a generation from token ids appended to the session's history.
    pub fn generate_ids(
        &mut self,
        ids: Vec<u32>,
        opts: &GenerateOptions,
    ) -> Result<Generation<'_>, Error> {
        if ids.is_empty() && self.history.is_empty() {
            return Err(Error::Usage("empty prompt".into()));
        }
        opts.sampling.validate()?;
        if opts.prefill_chunk == 0 {
            return Err(Error::Usage("prefill_chunk must be at least 1".into()));
        }
        let model = &self.engine.inner.model;
        // The last token of the previous generation was sampled but not fed: it goes first.
        let fed = self.state.pos();
        let mut feed: Vec<u32> = self.history[fed..].to_vec();
        self.history.truncate(fed);
        feed.extend_from_slice(&ids);
        if feed.is_empty() {
            // Nothing new: recompute the last position's logits. A recurrent state (KDA) steps
            // back only to where its latest pass began; otherwise the whole history runs again
            // (the same bits: chunking changes none).
            let last = fed - 1;
            if self.state.truncate(last, model.config()).is_ok() {
                feed.push(self.history[last]);
                self.history.truncate(last);
            } else {
                self.state = model.new_state();
                feed = std::mem::take(&mut self.history);
            }
        }
        let t0 = Instant::now();
        let expert0 = model.experts().stats();
        let trunk0 = model.trunk_bytes_read();
        let cache0 = model.experts().capacity();
        let mut prompt_logits = Vec::new();
        let mut last = Vec::new();
        let mut chunk_stats = Vec::new();
        let n_chunks = feed.len().div_ceil(opts.prefill_chunk);
        for (ci, chunk) in feed.chunks(opts.prefill_chunk).enumerate() {
            let (c0, e0) = (Instant::now(), model.experts().stats());
            let want = if opts.keep_logits {
                Logits::All
            } else if ci + 1 == n_chunks {
                Logits::Last
            } else {
                Logits::None
            };
            let l = model.forward(&mut self.state, chunk, want)?;
            let e1 = model.experts().stats();
            chunk_stats.push(PrefillChunkStats {
                tokens: chunk.len(),
                seconds: c0.elapsed().as_secs_f64(),
                expert_requests: e1.requests - e0.requests,
                expert_hits: e1.hits - e0.hits,
                experts_touched: e1.touched - e0.touched,
                expert_touched_bytes: e1.touched_bytes - e0.touched_bytes,
                expert_bytes_read: e1.bytes_read - e0.bytes_read,
            });
            self.history.extend_from_slice(chunk);
            if ci + 1 == n_chunks {
                let v = model.config().vocab;
                last = l[l.len() - v..].to_vec();
            }
            if opts.keep_logits {
                prompt_logits.extend(l);
            }
        }
        let stats = GenerationStats {
            prefill_tokens: feed.len(),
            prefill_seconds: t0.elapsed().as_secs_f64(),
            prefill_expert_bytes_read: model.experts().stats().bytes_read - expert0.bytes_read,
            prefill_trunk_bytes_read: model.trunk_bytes_read() - trunk0,
            prefill_chunks: chunk_stats,
            io_mode: model.io_mode().name().to_owned(),
            memory_budget_bytes: self.engine.inner.budget.unwrap_or(0),
            expert_cache_start_bytes: cache0,
            policy: model.experts().policy_name(),
            threads: model.threads(),
            isa: model.isa().name().to_owned(),
            ..Default::default()
        };
        Ok(Generation {
            session: self,
            d: Decoding::new(opts)?,
            next_logits: Some(last),
            prompt_ids: ids,
            prompt_logits,
            step_logits: Vec::new(),
            stats,
            expert0,
            trunk0,
        })
    }
}

/// A running generation: an iterator of tokens.
pub struct Generation<'s> {
    session: &'s mut Session,
    d: Decoding,
    next_logits: Option<Vec<f32>>,
    prompt_ids: Vec<u32>,
    prompt_logits: Vec<f32>,
    step_logits: Vec<f32>,
    stats: GenerationStats,
    expert0: ExpertStats,
    trunk0: u64,
}

impl std::fmt::Debug for Generation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Generation({} tokens)", self.d.ids.len())
    }
}

/// Counters of `now` since `then`, with the engine's figures filled in.
pub(crate) fn stats_since(
    engine: &Engine,
    base: &GenerationStats,
    expert0: &ExpertStats,
    trunk0: u64,
    state: &State,
) -> GenerationStats {
    let mut s = base.clone();
    let now = engine.expert_stats();
    s.expert_cache_end_bytes = engine.inner.model.experts().capacity();
    s.kv_cache_bytes = state.kv_bytes();
    s.trunk_bytes_read = engine.inner.model.trunk_bytes_read() - trunk0;
    s.expert_requests = now.requests - expert0.requests;
    s.expert_hits = now.hits - expert0.hits;
    s.expert_resident_hits = now.resident_hits - expert0.resident_hits;
    s.expert_bytes_read = now.bytes_read - expert0.bytes_read;
    s.expert_touched_bytes = now.touched_bytes - expert0.touched_bytes;
    s.prefetch_reads = now.prefetch_reads - expert0.prefetch_reads;
    s.prefetch_hits = now.prefetch_hits - expert0.prefetch_hits;
    s.expert_evictions = now.evictions - expert0.evictions;
    s.io_seconds = now.wait_seconds - expert0.wait_seconds;
    let checked = now.prefetch_checked - expert0.prefetch_checked;
    s.prefetch_recall = if checked == 0 {
        0.0
    } else {
        (now.prefetch_predicted - expert0.prefetch_predicted) as f64 / checked as f64
    };
    s.peak_rss_bytes = peak_rss_bytes();
    s
}

impl Generation<'_> {
    /// The prompt's token ids.
    pub fn prompt_ids(&self) -> &[u32] {
        &self.prompt_ids
    }

    /// Generated ids so far.
    pub fn ids(&self) -> &[u32] {
        &self.d.ids
    }

    /// Generated text so far (up to any stop string).
    pub fn text(&self) -> &str {
        &self.d.text
    }

    /// Why it ended, once it has.
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.d.finish
    }

    /// Figures so far.
    pub fn stats(&self) -> GenerationStats {
        stats_since(
            &self.session.engine,
            &self.stats,
            &self.expert0,
            self.trunk0,
            &self.session.state,
        )
    }

    /// Logits of every prompt position then of every step, `[rows, vocab]` (with
    /// `keep_logits`).
    pub fn logits(&self) -> Vec<f32> {
        let mut v = self.prompt_logits.clone();
        v.extend_from_slice(&self.step_logits);
        v
    }

    /// Runs to the end, returning the text.
    pub fn run(&mut self) -> Result<String, Error> {
        for t in self.by_ref() {
            t?;
        }
        Ok(self.d.text.clone())
    }

    fn step(&mut self) -> Result<Option<Token>, Error> {
        if self.d.finish.is_some() {
            return Ok(None);
        }
        if self.d.ids.len() >= self.d.opts.max_tokens {
            return Ok(self.finish_with(FinishReason::Length));
        }
        let Some(mut logits) = self.next_logits.take() else {
            return Ok(None);
        };
        let t0 = Instant::now();
        if self.d.opts.keep_logits {
            self.step_logits.extend_from_slice(&logits);
        }
        let engine = self.session.engine.clone();
        let id = match self
            .d
            .choose(&mut logits, &self.session.history, engine.eos_ids())
        {
            crate::decoding::Choice::Finish(r) => {
                self.stats.decode_seconds += t0.elapsed().as_secs_f64();
                return Ok(self.finish_with(r));
            }
            crate::decoding::Choice::Token(id) => id,
        };
        self.stats.decode_tokens += 1;
        // Compute the next position's logits unless this was the last token — or the last that
        // fits: with the context full the generation ends here with `length` (issue 18).
        let context_full =
            self.d.wants_more() && self.session.state.pos() >= engine.inner.model.max_positions();
        if self.d.wants_more() && !context_full {
            let l = engine
                .inner
                .model
                .forward(&mut self.session.state, &[id], Logits::Last)?;
            self.next_logits = Some(l);
        }
        self.session.history.push(id);
        let mut delta = self.d.emit(engine.tokenizer(), id)?;
        if self.d.finish.is_some() {
            self.next_logits = None;
            self.count_finished();
        } else if context_full && let Some(rest) = self.finish_with(FinishReason::Length) {
            delta.push_str(&rest.text);
        }
        self.stats.decode_seconds += t0.elapsed().as_secs_f64();
        Ok(Some(Token {
            id: Some(id),
            text: delta,
        }))
    }

    fn count_finished(&self) {
        if let Ok(mut s) = self.session.engine.inner.stats.lock() {
            s.generations += 1;
            s.prefill_tokens += self.stats.prefill_tokens as u64;
            s.decode_tokens += self.stats.decode_tokens as u64;
        }
    }

    fn finish_with(&mut self, r: FinishReason) -> Option<Token> {
        self.next_logits = None;
        let engine = self.session.engine.clone();
        let rest = self.d.finish(r, engine.tokenizer());
        self.count_finished();
        if rest.is_empty() {
            None
        } else {
            Some(Token {
                id: None,
                text: rest,
            })
        }
    }
}

impl Iterator for Generation<'_> {
    type Item = Result<Token, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.d.finish.is_none() && self.next_logits.is_none() && !self.d.wants_more() {
            // max_tokens reached: the last token needed no further logits.
            return self.finish_with(FinishReason::Length).map(Ok);
        }
        match self.step() {
            Ok(Some(t)) => Some(Ok(t)),
            Ok(None) => None,
            Err(e) => {
                self.d.finish = Some(FinishReason::Length);
                self.next_logits = None;
                Some(Err(e))
            }
        }
    }
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
