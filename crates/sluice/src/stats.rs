//! The figures of a generation and the engine's totals, assembled in one place for sessions
//! and the batcher.

use serde::Serialize;
use sluice_model::{ModelConfig, State};
use sluice_store::ExpertStats;

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

/// Figures of one generation. Expert and I/O counters are the engine's counters over the
/// generation's span (with concurrent sessions they include the others' work).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct GenerationStats {
    /// Prompt tokens processed.
    pub prefill_tokens: usize,
    /// Prompt tokens whose state came from the prefix cache instead (not computed; see
    /// [`crate::EngineBuilder::prefix_cache`]).
    pub cached_tokens: usize,
    /// Seconds spent on the prompt.
    pub prefill_seconds: f64,
    /// Tokens generated.
    pub decode_tokens: usize,
    /// Seconds spent generating.
    pub decode_seconds: f64,
    /// Of `decode_seconds`, the forward passes' attention (projections, the cache, scores).
    /// A batched pass counts for each of its sequences its time ÷ their number, like
    /// `decode_seconds`.
    pub decode_attention_seconds: f64,
    /// Of `decode_seconds`, the passes' routed experts: waiting for their reads and their
    /// products.
    pub decode_expert_seconds: f64,
    /// Of `decode_seconds`, the passes' final norm and lm_head.
    pub decode_head_seconds: f64,
    /// Of `decode_seconds`, the rest of the passes: embeddings, norms, routers, shared experts,
    /// dense blocks, the residual streams.
    pub decode_other_seconds: f64,
    /// Of `decode_seconds`, choosing each token from its logits: penalties, grammar masks,
    /// sampling, log-probabilities, detokenizing and stop strings. What is left of
    /// `decode_seconds` after the five phases is the engine's bookkeeping between passes.
    pub decode_sampling_seconds: f64,
    /// Draft tokens proposed for checking (speculative decoding, [`crate::Draft`]).
    pub draft_proposed: usize,
    /// Of those, kept: tokens that came without a forward pass of their own.
    pub draft_accepted: usize,
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
    /// Buffer bytes of the distinct experts the whole prompt routed to (each layer's union
    /// over every prompt token): what a prefill with a cold cache must read at least, and
    /// reads exactly once when the prompt is one span.
    pub prefill_expert_touched_bytes: u64,
    /// Of `trunk_bytes_read`, bytes read during the prompt.
    pub prefill_trunk_bytes_read: u64,
    /// Seconds of the prefill in attention.
    pub prefill_attention_seconds: f64,
    /// Seconds of the prefill in routed experts (waiting for reads, and their products, with
    /// the shared expert's, which runs beside them).
    pub prefill_expert_seconds: f64,
    /// Seconds of the prefill in the final norm and the lm_head (the last span's last row,
    /// or every row when the prompt's logits are kept).
    pub prefill_head_seconds: f64,
    /// Seconds of the prefill's passes in everything else (embeddings, norms, routers, dense
    /// blocks, bookkeeping).
    pub prefill_other_seconds: f64,
    /// Rows each call inside a layer took at most during the prefill.
    pub prefill_chunk: usize,
    /// Each prefill pass's figures: a pass runs every layer over a span of the prompt.
    pub prefill_spans: Vec<PrefillSpanStats>,
    /// Seconds spent waiting on expert reads.
    pub io_seconds: f64,
    /// Prefetch recall: the fraction of routed experts that lookahead had predicted, by the
    /// last prediction made before the router asked (from the output of the layer before).
    pub prefetch_recall: f64,
    /// [`Self::prefetch_recall`] of the early predictions alone (made while the layer before
    /// computes its experts, which leaves the reads more time).
    pub prefetch_recall_early: f64,
    /// [`Self::prefetch_recall`] of the mid predictions alone (made while the layer before
    /// waits for its reads, from its experts computed so far; 0 when none was made).
    pub prefetch_recall_mid: f64,
    /// [`Self::prefetch_recall`] per layer (`null` for a layer with no prediction checked:
    /// dense layers, the first MoE layer, layers not resident when predicted).
    pub prefetch_recall_by_layer: Vec<Option<f64>>,
    /// [`Self::prefetch_recall`] over the hash-routed layers alone (DeepSeek-V4's, whose
    /// experts are known from the tokens: 1 by construction when any was checked; `null`
    /// otherwise). [`Self::prefetch_recall`] counts them too.
    pub prefetch_recall_hash_routed: Option<f64>,
    /// Experts read by lookahead prefetch.
    pub prefetch_reads: u64,
    /// Requests served by an expert a prefetch read during the same step.
    pub prefetch_hits: u64,
    /// Experts evicted from the cache.
    pub expert_evictions: u64,
    /// How expert reads were issued: `direct` or `buffered` from reader threads, or
    /// `io_uring` (O_DIRECT reads queued on one io_uring).
    pub io_mode: String,
    /// Peak resident memory of the process so far.
    pub peak_rss_bytes: u64,
    /// The memory budget (0: unlimited).
    pub memory_budget_bytes: u64,
    /// Bytes the expert cache could hold when the generation began (the pool less every
    /// sequence's KV pages and the prefix cache's entries then; 0 with unlimited memory).
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
    /// Numeric mode of products with quantized weights (`exact` or `int8`).
    pub numerics: String,
}

/// Figures of one prefill pass: every layer over one span of the prompt.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct PrefillSpanStats {
    /// Tokens in the span.
    pub tokens: usize,
    /// Seconds it took.
    pub seconds: f64,
    /// Routed experts asked for (one request per layer per distinct expert).
    pub expert_requests: u64,
    /// Of those, found in memory.
    pub expert_hits: u64,
    /// Expert bytes read from disk during the pass.
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

/// The engine's figures at one moment, which a generation's counters are taken against
/// ([`crate::Engine::figures_now`]).
pub(crate) struct Now<'a> {
    /// The expert store's counters.
    pub experts: ExpertStats,
    /// Trunk bytes read so far.
    pub trunk_bytes_read: u64,
    /// What the expert cache can hold now (0 with unlimited memory).
    pub cache_bytes: u64,
    /// The model's configuration.
    pub cfg: &'a ModelConfig,
}

/// Counters of `now` since `then`, with the engine's figures filled in.
pub(crate) fn stats_since(
    figures: Now<'_>,
    base: &GenerationStats,
    expert0: &ExpertStats,
    trunk0: u64,
    state: &State,
) -> GenerationStats {
    let mut s = base.clone();
    let now = &figures.experts;
    s.expert_cache_end_bytes = figures.cache_bytes;
    s.kv_cache_bytes = state.kv_bytes();
    s.trunk_bytes_read = figures.trunk_bytes_read - trunk0;
    s.expert_requests = now.requests - expert0.requests;
    s.expert_hits = now.hits - expert0.hits;
    s.expert_resident_hits = now.resident_hits - expert0.resident_hits;
    s.expert_bytes_read = now.bytes_read - expert0.bytes_read;
    s.expert_touched_bytes = now.touched_bytes - expert0.touched_bytes;
    s.prefetch_reads = now.prefetch_reads - expert0.prefetch_reads;
    s.prefetch_hits = now.prefetch_hits - expert0.prefetch_hits;
    s.expert_evictions = now.evictions - expert0.evictions;
    s.io_seconds = now.wait_seconds - expert0.wait_seconds;
    // The predictions checked since the generation began, and their recall.
    let since = sluice_store::ExpertStats {
        prefetch_predicted: now.prefetch_predicted - expert0.prefetch_predicted,
        prefetch_checked: now.prefetch_checked - expert0.prefetch_checked,
        prefetch_predicted_early: now.prefetch_predicted_early - expert0.prefetch_predicted_early,
        prefetch_checked_early: now.prefetch_checked_early - expert0.prefetch_checked_early,
        prefetch_predicted_mid: now.prefetch_predicted_mid - expert0.prefetch_predicted_mid,
        prefetch_checked_mid: now.prefetch_checked_mid - expert0.prefetch_checked_mid,
        ..Default::default()
    };
    s.prefetch_recall = since.prefetch_recall();
    s.prefetch_recall_early = since.prefetch_recall_early();
    s.prefetch_recall_mid = since.prefetch_recall_mid();
    s.prefetch_recall_by_layer = now
        .prefetch_by_layer
        .iter()
        .enumerate()
        .map(|(l, &(c, p))| {
            let (c0, p0) = expert0.prefetch_by_layer.get(l).copied().unwrap_or((0, 0));
            (c > c0).then(|| (p - p0) as f64 / (c - c0) as f64)
        })
        .collect();
    let cfg = figures.cfg;
    let (mut hc, mut hp) = (0u64, 0u64);
    for (l, &(c, p)) in now.prefetch_by_layer.iter().enumerate() {
        if cfg.is_hash_routed(l) {
            let (c0, p0) = expert0.prefetch_by_layer.get(l).copied().unwrap_or((0, 0));
            hc += c - c0;
            hp += p - p0;
        }
    }
    s.prefetch_recall_hash_routed = (hc > 0).then(|| hp as f64 / hc as f64);
    s.peak_rss_bytes = peak_rss_bytes();
    s
}
