//! sluice's sampler: turns a row of logits into the next token.
//!
//! Greedy decoding, temperature, top-k, top-p (nucleus), min-p, and repetition, presence and
//! frequency penalties, drawn from a seeded ChaCha8 stream. Every step is a fixed sequence of
//! operations on the logits (no clocks, no hash-map order, `libm` for the exponential), so the
//! same logits and seed give the same token on every machine — and since sluice's logits are
//! bit-identical at every memory budget, cache policy and thread count, so is the text.
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
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingOptions {
    /// Softmax temperature; 0 means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 turns it off.
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p`; 1 turns it off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` × the most likely one; 0 turns it off.
    pub min_p: f32,
    /// Repetition penalty (as in transformers): a seen token's positive logit is divided by it,
    /// a negative one multiplied; 1 turns it off.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token already seen; 0 turns it off.
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of every token already seen; 0 turns it off.
    pub frequency_penalty: f32,
    /// Only the last `penalty_last_n` tokens count for penalties; 0 means all of them.
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

/// A seeded sampler. Cloning it clones the random stream's position.
#[derive(Clone, Debug)]
pub struct Sampler {
    opts: SamplingOptions,
    rng: ChaCha8Rng,
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

impl Sampler {
    /// A sampler with these options.
    pub fn new(opts: SamplingOptions) -> Result<Sampler, SamplerError> {
        opts.validate()?;
        let rng = ChaCha8Rng::seed_from_u64(opts.seed);
        Ok(Sampler { opts, rng })
    }

    /// The options.
    pub fn options(&self) -> &SamplingOptions {
        &self.opts
    }

    /// Applies the penalties to `logits` for the tokens in `history`.
    pub fn apply_penalties(&self, logits: &mut [f32], history: &[u32]) {
        let o = &self.opts;
        if o.repetition_penalty == 1.0 && o.presence_penalty == 0.0 && o.frequency_penalty == 0.0 {
            return;
        }
        let recent = if o.penalty_last_n == 0 || o.penalty_last_n >= history.len() {
            history
        } else {
            &history[history.len() - o.penalty_last_n..]
        };
        let mut ids: Vec<u32> = recent
            .iter()
            .copied()
            .filter(|&t| (t as usize) < logits.len())
            .collect();
        ids.sort_unstable();
        for run in ids.chunk_by(|a, b| a == b) {
            let l = &mut logits[run[0] as usize];
            if o.repetition_penalty != 1.0 {
                *l = if *l > 0.0 {
                    *l / o.repetition_penalty
                } else {
                    *l * o.repetition_penalty
                };
            }
            *l -= o.presence_penalty + o.frequency_penalty * run.len() as f32;
        }
    }

    /// Draws the next token from `logits` (modified in place by the penalties), given the
    /// tokens seen so far.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.apply_penalties(logits, history);
        let o = &self.opts;
        if o.is_greedy() || logits.len() <= 1 {
            return argmax(logits);
        }
        // Candidates, most likely first; ties to the lower id.
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, key(l) / o.temperature))
            .collect();
        let by_rank = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if o.top_k > 0 && o.top_k < cand.len() {
            cand.select_nth_unstable_by(o.top_k - 1, by_rank);
            cand.truncate(o.top_k);
        }
        cand.sort_unstable_by(by_rank);
        let max = cand[0].1;
        if !max.is_finite() {
            return cand[0].0;
        }
        let mut p: Vec<f64> = cand.iter().map(|c| libm::exp((c.1 - max) as f64)).collect();
        let total: f64 = p.iter().sum();
        for x in &mut p {
            *x /= total;
        }
        let mut keep = p.len();
        if o.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, &x) in p.iter().enumerate() {
                acc += x;
                if acc >= o.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        if o.min_p > 0.0 {
            let floor = o.min_p as f64 * p[0];
            keep = keep.min(p.iter().take_while(|&&x| x >= floor).count().max(1));
        }
        let kept = &p[..keep];
        let mass: f64 = kept.iter().sum();
        let u = (self.rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64) * mass;
        let mut acc = 0.0;
        for (i, &x) in kept.iter().enumerate() {
            acc += x;
            if u < acc {
                return cand[i].0;
            }
        }
        cand[keep - 1].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(temperature: f32) -> SamplingOptions {
        SamplingOptions {
            temperature,
            seed: 42,
            ..Default::default()
        }
    }

    #[test]
    fn greedy_is_argmax_with_low_index_ties() {
        let mut s = Sampler::new(SamplingOptions::default()).unwrap();
        assert_eq!(s.sample(&mut [1.0, 3.0, 3.0, f32::NAN], &[]), 1);
        assert_eq!(argmax(&[f32::NAN, -1.0]), 1);
    }

    #[test]
    fn validation_names_the_option() {
        for (o, name) in [
            (
                SamplingOptions {
                    temperature: -1.0,
                    ..Default::default()
                },
                "temperature",
            ),
            (
                SamplingOptions {
                    top_p: 0.0,
                    ..Default::default()
                },
                "top_p",
            ),
            (
                SamplingOptions {
                    top_p: 1.5,
                    ..Default::default()
                },
                "top_p",
            ),
            (
                SamplingOptions {
                    min_p: 2.0,
                    ..Default::default()
                },
                "min_p",
            ),
            (
                SamplingOptions {
                    repetition_penalty: 0.0,
                    ..Default::default()
                },
                "repetition_penalty",
            ),
            (
                SamplingOptions {
                    presence_penalty: f32::NAN,
                    ..Default::default()
                },
                "presence_penalty",
            ),
        ] {
            assert_eq!(Sampler::new(o).unwrap_err().option, name);
        }
    }

    #[test]
    fn seeded_streams_repeat() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let run = |seed| {
            let mut s = Sampler::new(SamplingOptions { seed, ..opts(1.0) }).unwrap();
            (0..64)
                .map(|_| s.sample(&mut logits.clone(), &[]))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }

    #[test]
    fn top_k_never_leaves_the_k_best() {
        let logits: Vec<f32> = (0..20).map(|i| i as f32 * 0.1).collect();
        let mut s = Sampler::new(SamplingOptions {
            top_k: 3,
            ..opts(5.0)
        })
        .unwrap();
        for _ in 0..500 {
            assert!(s.sample(&mut logits.clone(), &[]) >= 17);
        }
    }

    #[test]
    fn top_p_never_samples_outside_the_nucleus() {
        // Probabilities 0.5, 0.25, 0.125, ... : the 0.8 nucleus is the first three tokens.
        let logits: Vec<f32> = (0..12)
            .map(|i| -(i as f32) * std::f32::consts::LN_2)
            .collect();
        let mut s = Sampler::new(SamplingOptions {
            top_p: 0.8,
            ..opts(1.0)
        })
        .unwrap();
        let mut seen = [0usize; 12];
        for _ in 0..4000 {
            seen[s.sample(&mut logits.clone(), &[]) as usize] += 1;
        }
        assert!(seen[3..].iter().all(|&n| n == 0), "{seen:?}");
        assert!(seen[..3].iter().all(|&n| n > 0), "{seen:?}");
        // Frequencies follow the renormalised nucleus: 4/7, 2/7, 1/7.
        let f0 = seen[0] as f64 / 4000.0;
        assert!((f0 - 4.0 / 7.0).abs() < 0.04, "{f0}");
    }

    #[test]
    fn min_p_drops_unlikely_tokens() {
        let logits = [0.0f32, -0.5, -5.0, -6.0];
        let mut s = Sampler::new(SamplingOptions {
            min_p: 0.1,
            ..opts(1.0)
        })
        .unwrap();
        for _ in 0..500 {
            assert!(s.sample(&mut logits.clone(), &[]) < 2);
        }
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let logits = [0.0f32, (2.0f32).ln(), (3.0f32).ln()];
        let mut s = Sampler::new(opts(1.0)).unwrap();
        let mut seen = [0f64; 3];
        let n = 12000;
        for _ in 0..n {
            seen[s.sample(&mut logits.clone(), &[]) as usize] += 1.0;
        }
        for (i, want) in [1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0].iter().enumerate() {
            assert!(
                (seen[i] / n as f64 - want).abs() < 0.02,
                "{i}: {}",
                seen[i] / n as f64
            );
        }
    }

    #[test]
    fn penalties() {
        let s = Sampler::new(SamplingOptions {
            repetition_penalty: 2.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..opts(1.0)
        })
        .unwrap();
        let mut l = [4.0f32, -4.0, 1.0];
        s.apply_penalties(&mut l, &[0, 1, 1, 7]);
        assert_eq!(l, [4.0 / 2.0 - 0.75, -8.0 - 1.0, 1.0]);
        let s = Sampler::new(SamplingOptions {
            repetition_penalty: 2.0,
            penalty_last_n: 1,
            ..opts(1.0)
        })
        .unwrap();
        let mut l = [4.0f32, 4.0];
        s.apply_penalties(&mut l, &[0, 1]);
        assert_eq!(l, [4.0, 2.0]);
        // Greedy with a repetition penalty changes the choice.
        let mut g = Sampler::new(SamplingOptions {
            repetition_penalty: 4.0,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(g.sample(&mut [2.0, 1.0], &[0]), 1);
    }
}
