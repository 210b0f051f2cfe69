//! The one generation loop, shared by [`Session`](crate::Session)(crate::Session) and the continuous batcher
//! ([`crate::Batcher`]): the options, the chunked prefill, one decode step (sampler,
//! end-of-sequence, stop strings, streaming decode, finish reasons) and the figures.
//!
//! A caller owns the sequence's state and history and runs the model's forward pass for the
//! decode steps itself — a session one sequence at a time, the batcher all its sequences in one
//! batched pass — but everything a sequence decides between two passes happens here, so a
//! sequence gives the same tokens, text, finish reason and figures either way.

use std::time::Instant;

use sluice_model::{Logits, PrefillEvent, PrefillOptions, State};
use sluice_store::ExpertStats;

use crate::Error;
use crate::decoding::{Choice, Decoding};
use crate::engine::Engine;
use crate::options::{FinishReason, GenerateOptions, MAX_TOP_LOGPROBS, PrefillProgress};
use crate::stats::{GenerationStats, PrefillSpanStats, stats_since};

/// One step of a generation: a generated token and the text it completes.
#[derive(Clone, Debug, PartialEq)]
pub struct Token {
    /// The token's id; `None` for the last item of a generation when it only releases text
    /// that was held back (a partial stop string, or bytes of an unfinished character).
    pub id: Option<u32>,
    /// The text it completes (whole UTF-8 characters; may be empty).
    pub text: String,
    /// Its log-probability and the most likely alternatives, when asked for
    /// ([`GenerateOptions::logprobs`]); `None` for an item without an id.
    pub logprobs: Option<TokenLogprobs>,
}

/// A generated token's log-probability under the model and the most likely tokens at its
/// position.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// `log p(token)`: the log-softmax of the position's raw logits.
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, most likely first (ties by id).
    pub top: Vec<(u32, f32)>,
}

/// The log-softmax of `logits` at `id` and its `n` largest entries: `x − max − ln Σ e^(x − max)`,
/// the sum in f64 in index order (so the same logits give the same bits).
pub(crate) fn logprobs_of(logits: &[f32], id: u32, n: usize) -> TokenLogprobs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&x| ((x - max) as f64).exp()).sum();
    let lse = sum.ln();
    let lp = |x: f32| ((x - max) as f64 - lse) as f32;
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n > 0 {
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let by = |a: &u32, b: &u32| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        };
        let n = n.min(idx.len());
        if n < idx.len() {
            idx.select_nth_unstable_by(n - 1, by);
            idx.truncate(n);
        }
        idx.sort_by(by);
        top.extend(idx.into_iter().map(|i| (i, lp(logits[i as usize]))));
    }
    TokenLogprobs {
        logprob: lp(logits[id as usize]),
        top,
    }
}

/// The checks every generation's options pass before any work: sampling in range, stop
/// strings non-empty, a prefill chunk of at least one token.
pub(crate) fn check_options(opts: &GenerateOptions) -> Result<(), Error> {
    opts.sampling.validate()?;
    if opts.logprobs.is_some_and(|n| n > MAX_TOP_LOGPROBS) {
        return Err(Error::Usage(format!(
            "logprobs: at most {MAX_TOP_LOGPROBS} alternatives per token"
        )));
    }
    crate::decoding::check_stops(&opts.stop)?;
    if opts.prefill_chunk == 0 {
        return Err(Error::Usage("prefill_chunk must be at least 1".into()));
    }
    if let Some(n) = opts.draft.tokens()
        && !(1..=crate::options::MAX_DRAFT).contains(&n)
    {
        return Err(Error::Usage(format!(
            "draft tokens: {n} is not 1 to {}",
            crate::options::MAX_DRAFT
        )));
    }
    if opts.prefill_span == Some(0) {
        return Err(Error::Usage("prefill_span must be at least 1".into()));
    }
    Ok(())
}

/// The prefill chunk a generation uses: the one asked for, but under a memory budget never
/// more than the chunk the plan's scratch was made for.
pub(crate) fn prefill_chunk(engine: &Engine, asked: usize) -> usize {
    match engine.budget() {
        Some(_) => asked.min(engine.prefill_chunk()),
        None => asked,
    }
}

/// What one decode step produced.
pub(crate) enum Step {
    /// The generation ended without a token (end-of-sequence, `max_tokens`); the text it
    /// released, if any.
    End(Option<Token>),
    /// A generated token. `feed`: the sequence goes on, so the caller must run the model on the
    /// token for the next position's logits. When it does not, the sequence has either finished
    /// (a stop string, the context full) or reached `max_tokens` and ends at the next
    /// [`Seq::end`].
    Token {
        /// The token and the text it completes.
        token: Token,
        /// Whether the next logits are needed.
        feed: bool,
    },
}

/// One sequence's generation between prefill and the end: its decoding state and figures.
pub(crate) struct Seq {
    pub(crate) d: Decoding,
    stats: GenerationStats,
    expert0: ExpertStats,
    trunk0: u64,
    /// The state's pass times when the generation's decoding began.
    times0: sluice_model::PassTimes,
    /// Whether the engine's totals have this generation.
    counted: bool,
    /// Alternatives per token to report, when log-probabilities are asked for.
    logprobs: Option<usize>,
}

/// A prefilled sequence: its generation, the logits of its last position, and (with
/// `keep_logits`) those of every prompt position.
pub(crate) struct Prefilled {
    pub(crate) seq: Seq,
    pub(crate) last: Vec<f32>,
    pub(crate) prompt_logits: Vec<f32>,
}

/// Runs `feed` through the model (layer-major spans as long as the memory plan allows, see
/// [`sluice_model::Model::prefill`]), appending each span to `history` once it is in `state`,
/// and starts the sequence's generation. It starts from the prefix cache's longest match and
/// leaves the prompt's state there; `boundary` (a position of `history` + `feed`) is where a
/// recurrent state is kept too ([`GenerateOptions::cache_prefix`]).
pub(crate) fn prefill(
    engine: &Engine,
    state: &mut State,
    history: &mut Vec<u32>,
    feed: &[u32],
    opts: &GenerateOptions,
    keep_logits: bool,
    boundary: Option<usize>,
) -> Result<Prefilled, Error> {
    let d = Decoding::new(engine, opts)?;
    let model = engine.model();
    if matches!(opts.draft, crate::Draft::Mtp { .. }) && !model.has_mtp() {
        return Err(Error::Usage(
            "draft mtp: the engine was built without the model's MTP layer (EngineBuilder::mtp)"
                .into(),
        ));
    }
    let t0 = Instant::now();
    // Start from the longest prefix of the prompt the prefix cache holds, when that is more
    // than the state holds already. Not with every prompt row's logits asked for, nor with
    // routes or intermediates captured: those need every position computed.
    let whole: Vec<u32>;
    let mut feed = feed;
    let mut cached = 0;
    let mut at_hand = None;
    if engine.prefix().enabled() && !keep_logits && state.routes.is_none() && state.debug.is_none()
    {
        whole = history.iter().chain(feed).copied().collect();
        if let Some(mut hit) = engine.prefix().lookup(&whole, history.len())
            && model.charge(&mut hit.state).is_ok()
        {
            cached = hit.tokens - history.len();
            *state = hit.state;
            history.clear();
            history.extend_from_slice(&whole[..hit.tokens]);
            feed = &whole[hit.tokens..];
            at_hand = hit.logits;
        }
    }
    // The MTP layer drafts from the model's hidden rows: the state keeps the latest.
    state.keep_hidden(match opts.draft {
        crate::Draft::Mtp { .. } => crate::options::MTP_WINDOW,
        _ => 0,
    });
    let expert0 = model.experts().stats();
    let trunk0 = model.trunk_bytes_read();
    let cache0 = engine.cache_capacity();
    let chunk = prefill_chunk(engine, opts.prefill_chunk);
    let want = if keep_logits {
        Logits::All
    } else {
        Logits::Last
    };
    // A recurrent state is kept at the boundary too: a first pass runs up to it.
    let split = boundary
        .filter(|&b| b > history.len() && b < history.len() + feed.len() && !keep_logits)
        .filter(|_| at_hand.is_none() && engine.prefix().enabled() && engine.recurrent())
        .map(|b| b - history.len());
    let split_base = if split.is_some() {
        history.clone()
    } else {
        Vec::new()
    };
    let mut span_stats = Vec::new();
    let (mut s0, mut e0) = (Instant::now(), expert0.clone());
    let mut added = 0;
    let total = feed.len();
    let hook = opts.on_prefill.clone();
    let mut on = |ev: &PrefillEvent| match *ev {
        PrefillEvent::Layer {
            done,
            span,
            layer,
            layers,
        } => {
            if let Some(h) = &hook {
                h.0(&PrefillProgress {
                    done: done + span * (layer + 1) / layers.max(1),
                    total,
                    seconds: t0.elapsed().as_secs_f64(),
                    expert_bytes_read: model.experts().stats().bytes_read - expert0.bytes_read,
                });
            }
        }
        PrefillEvent::Span { tokens } => {
            let e1 = model.experts().stats();
            span_stats.push(PrefillSpanStats {
                tokens,
                seconds: s0.elapsed().as_secs_f64(),
                expert_requests: e1.requests - e0.requests,
                expert_hits: e1.hits - e0.hits,
                expert_bytes_read: e1.bytes_read - e0.bytes_read,
            });
            history.extend_from_slice(&feed[added..added + tokens]);
            added += tokens;
            (s0, e0) = (Instant::now(), e1);
        }
    };
    let pre_opts = PrefillOptions {
        chunk,
        max_span: opts.prefill_span.unwrap_or(usize::MAX),
    };
    let v = model.config().vocab;
    let last_row = |l: &[f32]| match l.len() {
        n if n >= v => l[n - v..].to_vec(),
        _ => Vec::new(),
    };
    let (last, out) = match at_hand {
        // The prompt is an entry's whole: nothing to compute.
        Some(l) => (l, sluice_model::Prefilled::default()),
        None => {
            let mut out = sluice_model::Prefilled::default();
            let mut rest = feed;
            if let Some(s) = split {
                let first = model.prefill(state, &feed[..s], want, pre_opts, &mut on)?;
                let head: Vec<u32> = split_base.iter().chain(&feed[..s]).copied().collect();
                engine
                    .prefix()
                    .store(model, &head, state, Some(&last_row(&first.logits)));
                out.spans = first.spans;
                out.times = first.times;
                rest = &feed[s..];
            }
            let more = model.prefill(state, rest, want, pre_opts, &mut on)?;
            out.spans.extend(more.spans);
            out.times += more.times;
            out.logits = more.logits;
            let last = last_row(&out.logits);
            engine.prefix().store(model, history, state, Some(&last));
            (last, out)
        }
    };
    let e1 = model.experts().stats();
    let stats = GenerationStats {
        prefill_tokens: feed.len(),
        cached_tokens: cached,
        prefill_seconds: t0.elapsed().as_secs_f64(),
        prefill_expert_bytes_read: e1.bytes_read - expert0.bytes_read,
        prefill_expert_touched_bytes: e1.touched_bytes - expert0.touched_bytes,
        prefill_trunk_bytes_read: model.trunk_bytes_read() - trunk0,
        prefill_attention_seconds: out.times.attention,
        prefill_expert_seconds: out.times.experts,
        prefill_head_seconds: out.times.head,
        prefill_other_seconds: out.times.other,
        prefill_chunk: chunk,
        prefill_spans: span_stats,
        io_mode: model.io_name().to_owned(),
        memory_budget_bytes: engine.budget().unwrap_or(0),
        expert_cache_start_bytes: cache0,
        policy: model.experts().policy_name(),
        threads: model.threads(),
        isa: model.isa().name().to_owned(),
        numerics: model.numerics().name().to_owned(),
        ..Default::default()
    };
    Ok(Prefilled {
        seq: Seq {
            d,
            stats,
            expert0,
            trunk0,
            times0: state.pass_times(),
            counted: false,
            logprobs: opts.logprobs,
        },
        last,
        prompt_logits: if keep_logits { out.logits } else { Vec::new() },
    })
}

impl Seq {
    /// One decode step from the logits of the sequence's next position: picks the token
    /// (appending it to `history`), decodes its text and applies stop strings. `pos` is the
    /// number of positions `state` holds before the token is fed.
    pub(crate) fn step(
        &mut self,
        engine: &Engine,
        logits: &mut [f32],
        history: &mut Vec<u32>,
        pos: usize,
    ) -> Result<Step, Error> {
        let t0 = Instant::now();
        let r = self.pick(engine, logits, history, pos);
        let secs = t0.elapsed().as_secs_f64();
        self.stats.decode_seconds += secs;
        self.stats.decode_sampling_seconds += secs;
        r
    }

    fn pick(
        &mut self,
        engine: &Engine,
        logits: &mut [f32],
        history: &mut Vec<u32>,
        pos: usize,
    ) -> Result<Step, Error> {
        if self.d.finish.is_some() {
            return Ok(Step::End(None));
        }
        // The raw logits, before sampling changes them, when log-probabilities are asked for.
        let raw = self.logprobs.map(|_| logits.to_vec());
        let id = match self.d.choose(logits, history, engine.eos_ids())? {
            Choice::Finish(r) => return Ok(Step::End(self.end(engine, r))),
            Choice::Token(id) => id,
        };
        let logprobs = raw
            .zip(self.logprobs)
            .map(|(raw, n)| logprobs_of(&raw, id, n));
        self.stats.decode_tokens += 1;
        // With the context full the generation ends at this token with `length` (issue 18).
        let context_full = self.d.wants_more() && pos >= engine.model().max_positions();
        history.push(id);
        let mut text = self.d.emit(engine.tokenizer(), id)?;
        if self.d.finish.is_some() {
            // A stop string: what followed it is dropped, nothing more to release.
            self.count(engine);
        } else if context_full && let Some(rest) = self.end(engine, FinishReason::Length) {
            text.push_str(&rest.text);
        }
        Ok(Step::Token {
            token: Token {
                id: Some(id),
                text,
                logprobs,
            },
            feed: self.d.wants_more(),
        })
    }

    /// Ends the generation (unless it has ended already) and returns the text held back: a
    /// partial stop string, an unfinished character.
    pub(crate) fn end(&mut self, engine: &Engine, r: FinishReason) -> Option<Token> {
        if self.d.finish.is_some() {
            return None;
        }
        let rest = self.d.finish(r, engine.tokenizer());
        self.count(engine);
        (!rest.is_empty()).then_some(Token {
            id: None,
            text: rest,
            logprobs: None,
        })
    }

    /// Marks the generation failed: it ends without counting.
    pub(crate) fn fail(&mut self) {
        self.d.finish = Some(FinishReason::Length);
    }

    /// Counts a checked draft.
    pub(crate) fn note_draft(&mut self, proposed: usize, accepted: usize) {
        self.stats.draft_proposed += proposed;
        self.stats.draft_accepted += accepted;
    }

    /// Adds time spent on the sequence's forward pass to its decode time.
    pub(crate) fn add_decode_seconds(&mut self, s: f64) {
        self.stats.decode_seconds += s;
    }

    /// Figures so far.
    pub(crate) fn stats(&self, engine: &Engine, state: &State) -> GenerationStats {
        let mut s = stats_since(
            engine.figures_now(),
            &self.stats,
            &self.expert0,
            self.trunk0,
            state,
        );
        let t = state.pass_times() - self.times0;
        s.decode_attention_seconds = t.attention;
        s.decode_expert_seconds = t.experts;
        s.decode_head_seconds = t.head;
        s.decode_other_seconds = t.other;
        s
    }

    /// Adds the finished generation to the engine's totals, once.
    fn count(&mut self, engine: &Engine) {
        if !self.counted {
            self.counted = true;
            engine.count_generation(&self.stats);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_a_log_softmax_with_the_top_sorted_and_ties_by_id() {
        let logits = [1.0f32, 3.0, 3.0, -2.0, 0.5];
        let l = logprobs_of(&logits, 4, 3);
        let total: f64 = logits
            .iter()
            .map(|&x| ((x - 3.0) as f64).exp())
            .sum::<f64>();
        let want = |x: f32| ((x - 3.0) as f64 - total.ln()) as f32;
        assert_eq!(l.logprob, want(0.5));
        assert_eq!(l.top, vec![(1, want(3.0)), (2, want(3.0)), (0, want(1.0))]);
        // exp of every log-probability sums to 1.
        let s: f64 = (0..5)
            .map(|i| (logprobs_of(&logits, i, 0).logprob as f64).exp())
            .sum();
        assert!((s - 1.0).abs() < 1e-6, "{s}");
        // More alternatives than the vocabulary: all of them; none asked: none.
        assert_eq!(logprobs_of(&logits, 0, 9).top.len(), 5);
        assert!(logprobs_of(&logits, 0, 0).top.is_empty());
    }
}
