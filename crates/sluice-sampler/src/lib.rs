//! sluice's sampler: turns a row of logits into the next token.
//!
//! Greedy decoding, temperature, top-k, top-p (nucleus), min-p, and repetition, presence and
//! frequency penalties, drawn from a seeded ChaCha8 stream. Every step is a fixed sequence of
//! operations on the logits (no clocks, no hash-map order, `libm` for the exponential), so the
//! same logits and seed give the same token on every machine — and since sluice's logits are
//! bit-identical at every memory budget, cache policy and thread count, so is the text.
//!
//! The options mean what they mean in Hugging Face transformers' `generate`, applied in its
//! order (penalties, temperature, top-k, top-p, min-p), and [`Sampler::candidates`] keeps the same
//! tokens with the same probabilities as its logits processors (`tests/transformers.rs` checks
//! that against fixtures made with them). Presence and frequency penalties follow OpenAI and
//! count generated tokens only. docs/SAMPLING.md states every rule.
//!
//! ```
//! use sluice_sampler::{Sampler, SamplingOptions};
//! let mut s = Sampler::new(SamplingOptions { temperature: 0.8, top_p: 0.9, seed: 7, ..Default::default() }).unwrap();
//! let mut logits = vec![0.1, 2.0, 0.3, -1.0];
//! let tok = s.sample(&mut logits, &[]);
//! assert!(tok < 4);
//! ```

#![forbid(unsafe_code)]

use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

/// Sampling settings. The defaults are greedy decoding.
///
/// The order and meaning of every option are those of Hugging Face transformers' `generate`
/// (`_get_logits_processor` for a `GenerationConfig` with `do_sample`): penalties, then
/// temperature, top-k, top-p, min-p; see [`Sampler::candidates`] for each step exactly.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingOptions {
    /// Softmax temperature; 0 means greedy (argmax). Any temperature > 0 is safe: the logits are
    /// divided in f64, where even `f32::MAX / 1e-45` is finite, so a tiny temperature gives the
    /// T → 0 limit (the most likely token; exactly tied maxima equally likely).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens, and every token tied with the `top_k`-th (as
    /// transformers' `TopKLogitsWarper` does); 0 turns it off.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`; 1 turns it
    /// off. Tokens tied at the cut are taken lower id first.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` × the most likely one (after temperature, top-k and
    /// top-p); 0 turns it off.
    pub min_p: f32,
    /// Repetition penalty (as in transformers, over every token of the history, prompt included):
    /// a seen token's logit is divided by it if ≥ 0, multiplied if negative; 1 turns it off.
    pub repetition_penalty: f32,
    /// OpenAI's presence penalty: subtracted once from the logit of every token that was
    /// *generated* (not prompt tokens) at least once; 0 turns it off.
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty: subtracted once per occurrence among the *generated* tokens
    /// (not prompt tokens); 0 turns it off.
    pub frequency_penalty: f32,
    /// Only the last `penalty_last_n` tokens of the history count for penalties (for presence
    /// and frequency: the generated ones among them); 0 means all of them.
    pub penalty_last_n: usize,
    /// Seed of the random stream.
    pub seed: u64,
}

impl Default for SamplingOptions {
    fn default() -> Self {
        SamplingOptions {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 0,
            seed: 0,
        }
    }
}

/// A sampling option out of range.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("sampling option `{option}` = {value}: {why}")]
pub struct SamplerError {
    /// The option.
    pub option: &'static str,
    /// Its value.
    pub value: String,
    /// The accepted range.
    pub why: &'static str,
}

impl SamplingOptions {
    /// Checks every option's range.
    pub fn validate(&self) -> Result<(), SamplerError> {
        let bad = |option, value: f32, why| {
            Err(SamplerError {
                option,
                value: value.to_string(),
                why,
            })
        };
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(
                "temperature",
                self.temperature,
                "must be a finite number ≥ 0",
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", self.top_p, "must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", self.min_p, "must be in [0, 1]");
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad(
                "repetition_penalty",
                self.repetition_penalty,
                "must be a finite number > 0",
            );
        }
        if !self.presence_penalty.is_finite() {
            return bad("presence_penalty", self.presence_penalty, "must be finite");
        }
        if !self.frequency_penalty.is_finite() {
            return bad(
                "frequency_penalty",
                self.frequency_penalty,
                "must be finite",
            );
        }
        Ok(())
    }

    /// Whether this is plain greedy decoding (no randomness).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// A token the sampler may draw, with its probability.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// The token id.
    pub id: u32,
    /// Its probability among the candidates (they sum to 1).
    pub prob: f64,
}

/// A seeded sampler for one generation. Cloning it clones the random stream's position.
#[derive(Clone, Debug)]
pub struct Sampler {
    opts: SamplingOptions,
    rng: ChaCha8Rng,
    /// How many tokens [`Sampler::sample`] has returned.
    drawn: usize,
}

/// The ordering key of a logit: NaN ranks below everything.
fn key(x: f32) -> f32 {
    if x.is_nan() { f32::NEG_INFINITY } else { x }
}

/// The index of the largest logit; ties go to the lowest index; NaN never wins unless all are NaN.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in logits.iter().enumerate() {
        if key(v) > key(logits[best]) {
            best = i;
        }
    }
    best as u32
}

/// [`argmax`] over f64 logits (NaN ranks below everything).
fn argmax64(logits: &[f64]) -> u32 {
    let k = |x: f64| if x.is_nan() { f64::NEG_INFINITY } else { x };
    let mut best = 0usize;
    for (i, &v) in logits.iter().enumerate() {
        if k(v) > k(logits[best]) {
            best = i;
        }
    }
    best as u32
}

/// Stores penalised logits back into the caller's f32 row.
fn write_back(logits: &mut [f32], l: &[f64]) {
    for (x, &p) in logits.iter_mut().zip(l) {
        *x = p as f32;
    }
}

impl Sampler {
    /// A sampler with these options.
    pub fn new(opts: SamplingOptions) -> Result<Sampler, SamplerError> {
        opts.validate()?;
        let rng = ChaCha8Rng::seed_from_u64(opts.seed);
        Ok(Sampler {
            opts,
            rng,
            drawn: 0,
        })
    }

    /// The options.
    pub fn options(&self) -> &SamplingOptions {
        &self.opts
    }

    /// The logits after the penalties, in f64. `history` is every token of the sequence so far
    /// (prompt and generated), oldest first; its last `generated` tokens are the generated ones.
    ///
    /// 1. Repetition penalty `r` (transformers' `RepetitionPenaltyLogitsProcessor`): for each
    ///    distinct token of the history, `l / r` if `l ≥ 0`, else `l × r`.
    /// 2. Presence `a` and frequency `b` penalties (OpenAI's definition): for each token `j`
    ///    generated `c_j` times, `l_j − a·[c_j > 0] − b·c_j`. Prompt tokens do not count.
    ///
    /// With `penalty_last_n = n > 0` only the last `n` tokens of the history count for either.
    /// Ids outside the vocabulary are ignored.
    pub fn penalised(&self, logits: &[f32], history: &[u32], generated: usize) -> Vec<f64> {
        let o = &self.opts;
        let mut l: Vec<f64> = logits.iter().map(|&x| x as f64).collect();
        let n = if o.penalty_last_n == 0 {
            history.len()
        } else {
            o.penalty_last_n.min(history.len())
        };
        let recent = &history[history.len() - n..];
        let gen_recent = &recent[recent.len() - generated.min(recent.len())..];
        let runs = |toks: &[u32]| {
            let mut ids: Vec<u32> = toks
                .iter()
                .copied()
                .filter(|&t| (t as usize) < logits.len())
                .collect();
            ids.sort_unstable();
            ids
        };
        if o.repetition_penalty != 1.0 {
            let r = o.repetition_penalty as f64;
            let ids = runs(recent);
            for run in ids.chunk_by(|a, b| a == b) {
                let x = &mut l[run[0] as usize];
                *x = if *x < 0.0 { *x * r } else { *x / r };
            }
        }
        if o.presence_penalty != 0.0 || o.frequency_penalty != 0.0 {
            let (a, b) = (o.presence_penalty as f64, o.frequency_penalty as f64);
            let ids = runs(gen_recent);
            for run in ids.chunk_by(|a, b| a == b) {
                l[run[0] as usize] -= a + b * run.len() as f64;
            }
        }
        l
    }

    /// Applies the penalties to `logits` (see [`Sampler::penalised`]; the result rounded to f32).
    pub fn apply_penalties(&self, logits: &mut [f32], history: &[u32], generated: usize) {
        if self.has_penalties() {
            let l = self.penalised(logits, history, generated);
            write_back(logits, &l);
        }
    }

    /// The tokens the next draw can return and their probabilities, most likely first (ties:
    /// lower id first). Computed in f64 from the f32 logits, step by step as transformers'
    /// processors do:
    ///
    /// 1. the penalties ([`Sampler::penalised`]);
    /// 2. greedy (temperature 0): the argmax alone, ties to the lowest id;
    /// 3. temperature: `s = l / T`; NaN counts as −∞, and −∞ tokens are never candidates;
    /// 4. top-k: keep the tokens whose `s` is ≥ the k-th largest (ties at the k-th all stay);
    /// 5. softmax over what is left: `p = exp(s − max) / Σ`;
    /// 6. top-p: keep a token iff the mass of the tokens before it in the order above is
    ///    `< top_p` (so the set is the smallest prefix reaching `top_p`; where the mass lands
    ///    exactly on `top_p` no further token is kept; among tokens tied at the cut, lower ids
    ///    first — transformers leaves that order to `torch.sort`);
    /// 7. min-p: keep a token iff `p ≥ min_p × p_max`, i.e. `exp(s − max) ≥ min_p`;
    /// 8. renormalise; a token whose probability underflows to 0 is dropped.
    ///
    /// If some logit is `+∞`, the lowest such id alone; if none is finite, token 0 (no draw is
    /// taken from the random stream in either case).
    pub fn candidates(&self, logits: &[f32], history: &[u32], generated: usize) -> Vec<Candidate> {
        self.choices(&self.penalised(logits, history, generated)).0
    }

    fn has_penalties(&self) -> bool {
        let o = &self.opts;
        o.repetition_penalty != 1.0 || o.presence_penalty != 0.0 || o.frequency_penalty != 0.0
    }

    /// [`Sampler::candidates`], and whether a draw takes a number from the random stream (not
    /// for greedy, a vocabulary of one or no finite logit).
    fn choices(&self, l: &[f64]) -> (Vec<Candidate>, bool) {
        let mut k = match self.kept(l) {
            Kept::Only(id) => return (vec![Candidate { id, prob: 1.0 }], false),
            Kept::Some(k) => k,
        };
        k.rank(k.cand.len());
        let p: Vec<f64> = k.cand.iter().map(|c| c.v / k.total).collect();
        let mass: f64 = p.iter().sum();
        let kept = k
            .cand
            .iter()
            .zip(&p)
            .filter(|(_, x)| **x > 0.0)
            .map(|(c, &x)| Candidate {
                id: c.id,
                prob: x / mass,
            })
            .collect();
        (kept, true)
    }

    /// Steps 3–7 of [`Sampler::candidates`]: the tokens kept, the most likely ones in rank
    /// order as far as top-p needed to look, the rest in id order (see [`Kept`]).
    fn kept(&self, l: &[f64]) -> Kept {
        let o = &self.opts;
        if o.is_greedy() || l.len() <= 1 {
            return Kept::Only(argmax64(l));
        }
        let t = o.temperature as f64;
        let mut cand: Vec<Ranked> = l
            .iter()
            .enumerate()
            .map(|(i, &x)| Ranked {
                id: i as u32,
                v: x / t,
            })
            .filter(|c| c.v > f64::NEG_INFINITY) // NaN and -inf
            .collect();
        if cand.is_empty() || cand.iter().any(|c| c.v == f64::INFINITY) {
            return Kept::Only(argmax64(l));
        }
        // `cand` is in id order, or after top-k in rank order: either way an order that no sort
        // algorithm's handling of equal keys can change, so neither can the softmax sum.
        let mut ranked = 0;
        if o.top_k > 0 && o.top_k < cand.len() {
            cand.select_nth_unstable_by(o.top_k - 1, by_rank);
            let kth = cand[o.top_k - 1].v;
            // Ties with the k-th stay, as in transformers (only `scores < kth` are removed).
            let mut n = o.top_k;
            for i in o.top_k..cand.len() {
                if cand[i].v >= kth {
                    cand.swap(n, i);
                    n += 1;
                }
            }
            cand.truncate(n);
            cand.sort_unstable_by(by_rank);
            ranked = n;
        }
        let max = cand.iter().fold(f64::NEG_INFINITY, |m, c| m.max(c.v));
        // From here on each candidate holds exp(s − max), taken once: the softmax sum, min-p,
        // top-p, the rank order (that of p) and the probabilities all use it.
        for c in &mut cand {
            c.v = libm::exp(c.v - max);
        }
        let total: f64 = cand.iter().map(|c| c.v).sum();
        if o.min_p > 0.0 {
            // p ≥ min_p × p_max ⟺ exp(s − max) ≥ min_p. The kept set is a prefix of the rank
            // order, as top-p's is, so taking it first changes nothing but the work.
            let floor = o.min_p as f64;
            cand.retain(|c| c.v >= floor);
            ranked = ranked.min(cand.len());
        }
        // A probability that underflows to 0 (an `s` more than ~745 below the top) adds nothing
        // to a sum or a walk; it is dropped where candidates are listed or a walk ends.
        let mut k = KeptSet {
            cand,
            ranked,
            total,
        };
        if o.top_p < 1.0 {
            // The rank order only as far as top-p needs.
            let mut m = k.cand.len().min(256);
            let keep = loop {
                k.rank(m);
                let mut acc = 0.0;
                let reached = k.cand[..m].iter().position(|c| {
                    acc += c.v / total;
                    acc >= o.top_p as f64
                });
                match reached {
                    Some(i) => break i + 1,
                    None if m == k.cand.len() => break m,
                    None => m = (m * 4).min(k.cand.len()),
                }
            };
            k.cand.truncate(keep);
            k.ranked = keep;
        }
        Kept::Some(k)
    }

    /// Draws the next token. `logits` get the penalties applied in place; `history` is every
    /// token of the sequence so far (prompt and generated), of which the last `generated` were
    /// generated (they alone count for the presence and frequency penalties).
    pub fn sample_with(&mut self, logits: &mut [f32], history: &[u32], generated: usize) -> u32 {
        // Greedy without penalties: the argmax of the f32 row is that of its exact f64 copy,
        // without copying a vocabulary's worth of logits every token.
        if self.opts.is_greedy() && !self.has_penalties() {
            self.drawn += 1;
            return argmax(logits);
        }
        let l = self.penalised(logits, history, generated);
        if self.has_penalties() {
            write_back(logits, &l);
        }
        let kept = self.kept(&l);
        self.drawn += 1;
        let mut k = match kept {
            Kept::Only(id) => return id,
            Kept::Some(k) => k,
        };
        // The first candidate, most likely first, whose cumulative probability exceeds u (as
        // a share of the candidates' mass): the rank order is found only as far as the walk
        // goes, which on a trained model's row is a few tokens.
        let total = k.total;
        let p = |c: &Ranked| c.v / total;
        let mass: f64 = k.cand.iter().map(p).sum();
        let u = (self.rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64) * mass;
        let mut acc = 0.0;
        let mut i = 0;
        while i < k.cand.len() {
            if i == k.ranked {
                k.rank((4 * i).max(64));
            }
            acc += p(&k.cand[i]);
            if u < acc {
                return k.cand[i].id;
            }
            i += 1;
        }
        // Rounding left u at the very end: the least likely candidate with a probability.
        k.cand
            .iter()
            .rev()
            .find(|c| p(c) > 0.0)
            .map_or(k.cand[0].id, |c| c.id)
    }

    /// Draws the next token (see [`Sampler::sample_with`]), taking the generated tokens to be the
    /// ones this sampler has returned: the last `min(n, history.len())` of `history` after `n`
    /// draws. That holds when one sampler serves one generation and every token it returns is
    /// appended to `history` before the next call.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        let generated = self.drawn.min(history.len());
        self.sample_with(logits, history, generated)
    }

    /// Draws again for the step of the last [`Sampler::sample`], whose token was not taken (a
    /// constraint refused it): the same tokens count as generated, and the next draw of the
    /// random stream decides. `logits` must be the row as the last draw got it (before its
    /// penalties), with the refused tokens at −∞.
    pub fn redraw(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.drawn = self.drawn.saturating_sub(1);
        self.sample(logits, history)
    }
}

/// A candidate: its id and `v`, its scaled logit `s` through top-k, then `exp(s − max)`.
#[derive(Clone, Copy, Debug)]
struct Ranked {
    id: u32,
    v: f64,
}

/// Most likely first, ties to the lower id: the rank order (by scaled logit for top-k, by
/// probability after it, the same order but where rounding ties two probabilities).
fn by_rank(a: &Ranked, b: &Ranked) -> std::cmp::Ordering {
    b.v.total_cmp(&a.v).then(a.id.cmp(&b.id))
}

/// What steps 3–7 leave.
enum Kept {
    /// One token, taken without a draw (greedy, a vocabulary of one, an infinite logit or none
    /// finite).
    Only(u32),
    /// Candidates to draw from.
    Some(KeptSet),
}

/// The candidates kept, each holding exp(s − max): `cand[..ranked]` in rank order ([`by_rank`])
/// and every one of them at least as likely as the rest, `cand[ranked..]` in id order until a
/// selection reorders them; `total` the softmax's sum.
struct KeptSet {
    cand: Vec<Ranked>,
    ranked: usize,
    total: f64,
}

impl KeptSet {
    /// Puts the `m` most likely candidates in rank order in `cand[..m]` (at most all of them);
    /// the rest are left in an order of the selection's making. The rank order is total (ids
    /// differ), so which candidates come first, and in what order, does not depend on how
    /// they are found; nothing is summed over the rest after a selection (see `kept` and
    /// `sample_with`).
    fn rank(&mut self, m: usize) {
        let m = m.min(self.cand.len());
        if m <= self.ranked {
            return;
        }
        let rest = &mut self.cand[self.ranked..];
        let want = m - self.ranked;
        if want < rest.len() {
            rest.select_nth_unstable_by(want - 1, by_rank);
        }
        rest[..want].sort_unstable_by(by_rank);
        self.ranked = m;
    }
}

#[cfg(test)]
mod tests;
