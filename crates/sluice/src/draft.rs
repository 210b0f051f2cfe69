//! Speculative decoding's drafts: prompt lookup (n-gram) proposals and how many to make.
//!
//! A draft is a guess at the next tokens, checked by running them through the model in one
//! pass with the token just chosen (each expert read once for all the rows) and sampling each
//! position from its own row exactly as decoding one token at a time would: a draft token is
//! kept only if it equals the token drawn there, so drafting changes the speed, never the text.
//! The checking itself lives with the decoding loop ([`crate::session`]).

/// Whether and how to draft.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Draft {
    /// No drafting: one token per forward pass.
    #[default]
    Off,
    /// Prompt lookup: propose the tokens that followed the latest earlier occurrence of the
    /// longest suffix (up to [`MAX_NGRAM`] tokens) of prompt and output. `tokens`: propose at
    /// most this many each time; `None` adapts to how drafts fare (see `Drafter`).
    Ngram {
        /// A fixed draft length, or `None` to adapt.
        tokens: Option<usize>,
    },
}

/// The longest suffix prompt lookup matches.
pub const MAX_NGRAM: usize = 4;

/// The longest draft (adaptive, or asked for).
pub const MAX_DRAFT: usize = 32;

/// The tokens that followed the latest earlier occurrence of the longest suffix of `seq` (of
/// at most [`MAX_NGRAM`] tokens) that occurs earlier: at most `k` of them, none if no suffix
/// recurs.
pub(crate) fn lookup(seq: &[u32], k: usize) -> Vec<u32> {
    if k == 0 || seq.len() < 2 {
        return Vec::new();
    }
    for n in (1..=MAX_NGRAM.min(seq.len() - 1)).rev() {
        let pat = &seq[seq.len() - n..];
        if let Some(i) = (0..seq.len() - n).rev().find(|&i| &seq[i..i + n] == pat) {
            let start = i + n;
            let end = (start + k).min(seq.len());
            return seq[start..end].to_vec();
        }
    }
    Vec::new()
}

/// One sequence's drafting: proposals and the adaptive length.
///
/// The adaptive length weighs what a draft is likely to give against what it costs. The chance
/// `p` that a draft token is kept is learnt as a moving average over the draft tokens checked
/// (each kept one counts 1, the first rejected one 0), so a draft of `k` tokens is expected to
/// give `E(k) = 1 + p + … + p^k` tokens per pass. A pass over `1 + k` rows costs
/// `t₁ + k·m` seconds, with `t₁` (one row) and `m` (each further row) learnt from the passes
/// timed: the draft length is the `k` that makes the most tokens per second, `E(k) / (1 + k·m/t₁)`
/// — none when no draft beats a pass of one row by 5% (a model whose rows cost the same each,
/// say, or text too unpredictable), and then one token is drafted every [`PROBE_EVERY`] steps to see
/// whether that has changed. Timing steers only which drafts are made, never which tokens come
/// out.
#[derive(Clone, Debug)]
pub(crate) struct Drafter {
    fixed: Option<usize>,
    /// The kept-token chance.
    p: f64,
    /// Seconds of a pass of one row, and of each further row (moving averages).
    one_row: Option<f64>,
    per_row: Option<f64>,
    /// Steps since the last draft, while paused.
    idle: usize,
}

/// How fast the moving averages follow what happens (the weight of each new observation).
const RATE: f64 = 0.15;

/// The kept-token chance a drafter starts with.
const START_P: f64 = 0.6;

/// The cost of a further row relative to a pass of one, until passes have been timed.
const START_COST: f64 = 0.5;

/// No row is taken to cost less than this share of a pass (timing is noisy).
const MIN_COST: f64 = 0.01;

/// A draft must promise at least this many tokens per second relative to no draft: what it
/// wins must be clear of the timing's noise and of the bookkeeping's cost.
const MIN_GAIN: f64 = 1.05;

/// While drafting pauses, one token is drafted every this many steps.
pub const PROBE_EVERY: usize = 8;

fn average(old: Option<f64>, x: f64) -> f64 {
    match old {
        Some(a) => a + RATE * (x - a),
        None => x,
    }
}

impl Drafter {
    /// A drafter for `d`, `None` when drafting is off.
    pub(crate) fn new(d: Draft) -> Option<Drafter> {
        match d {
            Draft::Off => None,
            Draft::Ngram { tokens } => Some(Drafter {
                fixed: tokens.map(|t| t.min(MAX_DRAFT)),
                p: START_P,
                one_row: None,
                per_row: None,
                idle: 0,
            }),
        }
    }

    /// The draft length that makes the most tokens per second (see [`Drafter`]).
    fn best_length(&self) -> usize {
        let cost = match (self.one_row, self.per_row) {
            (Some(t), Some(m)) if t > 0.0 => (m / t).max(MIN_COST),
            _ => START_COST,
        };
        let (mut best, mut best_rate) = (0, MIN_GAIN);
        let (mut expected, mut reach) = (1.0, 1.0);
        for k in 1..=MAX_DRAFT {
            reach *= self.p;
            expected += reach;
            let rate = expected / (1.0 + k as f64 * cost);
            if rate > best_rate {
                (best, best_rate) = (k, rate);
            }
        }
        best
    }

    fn length(&mut self) -> usize {
        if let Some(k) = self.fixed {
            return k;
        }
        let k = self.best_length();
        if k > 0 {
            self.idle = 0;
            return k;
        }
        self.idle += 1;
        if self.idle >= PROBE_EVERY {
            self.idle = 0;
            1
        } else {
            0
        }
    }

    /// A draft of at most `limit` tokens to follow `seq`.
    pub(crate) fn propose(&mut self, seq: &[u32], limit: usize) -> Vec<u32> {
        let k = self.length().min(limit);
        lookup(seq, k)
    }

    /// Learns from a checked draft: `accepted` of its `proposed` tokens were kept.
    pub(crate) fn outcome(&mut self, proposed: usize, accepted: usize) {
        for _ in 0..accepted {
            self.p += RATE * (1.0 - self.p);
        }
        if accepted < proposed {
            self.p -= RATE * self.p;
        }
    }

    /// Learns from a timed forward pass over `rows` rows.
    pub(crate) fn timed(&mut self, rows: usize, seconds: f64) {
        match (rows, self.one_row) {
            (0, _) => {}
            (1, _) => self.one_row = Some(average(self.one_row, seconds)),
            (r, Some(t)) => {
                let m = ((seconds - t) / (r - 1) as f64).max(0.0);
                self.per_row = Some(average(self.per_row, m));
            }
            (_, None) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_takes_the_longest_recurring_suffix_at_its_latest_place() {
        // "a b c d x a b c d y a b c" → the suffix "a b c" (and longer "? a b c") recurs;
        // its latest earlier place is followed by "d y".
        let s = [1, 2, 3, 4, 9, 1, 2, 3, 4, 8, 1, 2, 3];
        assert_eq!(lookup(&s, 2), vec![4, 8]);
        assert_eq!(lookup(&s, 9), vec![4, 8, 1, 2, 3]);
        // The 4-gram "8 1 2 3" does not recur; "4 9 1 2"… the longest that does is 3 long.
        let t = [5, 1, 2, 3, 7, 1, 2, 3];
        assert_eq!(lookup(&t, 3), vec![7, 1, 2]);
        // A longer match wins over a later shorter one.
        let u = [1, 2, 6, 3, 2, 7, 1, 2];
        assert_eq!(lookup(&u, 1), vec![6]);
        assert!(lookup(&[1, 2, 3], 4).is_empty());
        assert!(lookup(&[1], 4).is_empty());
        assert!(lookup(&[1, 1], 0).is_empty());
        assert_eq!(lookup(&[1, 1], 3), vec![1]);
    }

    #[test]
    fn the_adaptive_length_weighs_the_kept_chance_against_the_cost_of_rows() {
        // 0..10 twice, then 0 1 2: the suffix "9 0 1 2" recurs with ten tokens after it.
        let s: Vec<u32> = (0..10).chain(0..10).chain(0..3).collect();
        let mut d = Drafter::new(Draft::Ngram { tokens: None }).unwrap();
        // p = 0.6 at half a pass per row: one token (1.6 / 1.5 beats 1).
        assert_eq!(d.propose(&s, 99).len(), 1);
        // Rows that cost almost nothing (a pass bound by reading weights) and drafts that are
        // kept: long drafts.
        d.timed(1, 0.100);
        d.timed(5, 0.104);
        for _ in 0..10 {
            d.outcome(1, 1);
        }
        let k = d.propose(&s, 99).len();
        assert!(k >= 8, "{k}");
        assert_eq!(d.propose(&s, 2).len(), 2, "never past the limit");
        // Rows that cost as much as a pass each: no draft pays, whatever p; probes only.
        let mut e = Drafter::new(Draft::Ngram { tokens: None }).unwrap();
        e.timed(1, 0.100);
        for _ in 0..50 {
            e.timed(2, 0.200);
            e.outcome(1, 1);
        }
        let lens: Vec<usize> = (0..2 * PROBE_EVERY)
            .map(|_| e.propose(&s, 99).len())
            .collect();
        assert_eq!(lens.iter().filter(|&&n| n == 1).count(), 2, "{lens:?}");
        assert_eq!(
            lens.iter().filter(|&&n| n == 0).count(),
            2 * PROBE_EVERY - 2
        );
        // Drafts always rejected: none either, however cheap the rows.
        let mut r = Drafter::new(Draft::Ngram { tokens: None }).unwrap();
        r.timed(1, 0.1);
        r.timed(3, 0.1);
        for _ in 0..20 {
            r.outcome(1, 0);
        }
        assert_eq!(r.best_length(), 0);
        // A fixed length never changes.
        let mut f = Drafter::new(Draft::Ngram { tokens: Some(3) }).unwrap();
        f.outcome(3, 0);
        f.timed(4, 9.0);
        assert_eq!(f.propose(&s, 99).len(), 3);
        assert!(Drafter::new(Draft::Off).is_none());
    }
}
