//! Speculative decoding's drafts: prompt lookup (n-gram) proposals and how many to make.
//!
//! A draft is a guess at the next tokens, checked by running them through the model in one
//! pass with the token just chosen (each expert read once for all the rows) and sampling each
//! position from its own row exactly as decoding one token at a time would: a draft token is
//! kept only if it equals the token drawn there, so drafting changes the speed, never the text.
//! `Speculation` keeps one generation's drafts between passes, for sessions and the batcher
//! alike; they run the passes.

use std::collections::VecDeque;

use sluice_model::{Logits, Model, State};
use sluice_sampler::argmax;

use crate::generate::Seq;
use crate::options::{Draft, MAX_DRAFT, MAX_NGRAM};

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
/// give `E(k) = 1 + p + … + p^k` tokens per pass. A pass over `1 + k` rows costs `t₁ + c(k)`
/// seconds (plus `k` steps of the MTP layer, when it drafts), with `t₁` (one row) learnt from
/// passes of one row and `c` from the drafted passes, per number of further rows: each is the
/// least of its latest [`PLAIN_KEPT`] timings (a pass is slowed by what else runs on the host,
/// never sped up, and single timings spread 2–3× on a busy one); between the lengths timed `c`
/// is interpolated, past the longest it grows as that length's cost per row.
/// The draft length is the `k` that makes the most tokens per second, `E(k) / (1 + c(k)/t₁)` —
/// none when no draft beats a pass of one row by 5% (a model whose rows cost the same each,
/// say, or text too unpredictable), and then a probe is drafted every [`PROBE_EVERY`] steps to
/// see whether that has changed; every [`RARE_PROBE_EVERY`] steps when drafts would not pay
/// even if [`HOPEFUL_P`] of them were kept, as measured over at least [`SURE_AFTER`] drafted
/// passes (the rows, or the MTP layer's steps, cost too much: only the costs can change that,
/// and probing them often is what would make drafting slower than none), the wait doubling
/// after each such probe up to [`RARE_PROBE_MAX`] while the costs stay so.
///
/// Rows are not all alike: where experts stream, a pass over more rows reads the experts they
/// share once, so each further row costs less than the one before, and a cost per row timed on
/// short drafts would rule out the long ones that pay most. So prompt lookup, whose drafts cost
/// nothing to make and come right in runs where they do (a copied passage), times longer
/// lengths: while `p` ≥ [`EXPLORE_P`], every [`EXPLORE_EVERY`]th drafted pass tries twice the
/// best length if even free further rows would let it beat the best; while drafting pauses, its
/// probes (while `p` ≥ [`WIDE_PROBE_P`]) time lengths doubling for as long as doubling makes
/// rows cheaper each and the next could pay (a quarter of the usual wait apart while a longer
/// length waits to be timed), and each probe kept whole halves the wait for the next. A length
/// stops the doubling, or is held not worth trying, only once timed [`JUDGED_AFTER`] times. A
/// length judged hopeless needs every such length timed. The MTP layer's drafts, whose
/// steps cost alike each and grow less sure with each, do not explore.
/// Timing steers only which drafts are made, never which tokens come out.
#[derive(Clone, Debug)]
pub(crate) struct Drafter {
    fixed: Option<usize>,
    /// The kept-token chance.
    p: f64,
    /// Seconds of the latest passes of one row ([`PLAIN_KEPT`] of them; their least is the
    /// cost of one row, as a pass is slowed by what else runs, never sped up).
    plain: Latest,
    /// Per number of further rows `r` (up to [`MAX_DRAFT`]), the seconds they added to a pass
    /// of one row in the latest passes that had them ([`PLAIN_KEPT`] of them; their least is
    /// what they cost, see [`Drafter::row_cost`]).
    row_times: Vec<Latest>,
    /// Drafted passes since the drafter last tried a longer draft ([`EXPLORE_EVERY`]).
    since_explore: usize,
    /// Whether the latest draft was a probe, and the probes kept whole in a row: each halves
    /// the wait for the next ([`PROBE_EVERY`]).
    probing: bool,
    probes_kept: u32,
    /// The wait before the next probe while the costs are hopeless ([`RARE_PROBE_EVERY`]).
    rare_every: usize,
    /// Steps since the last draft, while paused.
    idle: usize,
    /// Drafting with the MTP layer (else prompt lookup).
    mtp: Option<MtpDraft>,
    /// Seconds of making each draft token (the MTP layer's steps; moving average).
    per_draft: Option<f64>,
    /// Drafted steps since the last step without a draft (see [`RETIME_EVERY`]).
    since_plain: usize,
    /// Steps left to run without a draft before drafting starts.
    plain_left: usize,
    /// Drafted passes timed.
    row_samples: usize,
}

/// While drafts are mostly kept ([`EXPLORE_P`]), every this many drafted passes try twice the
/// best length until its cost is judged ([`JUDGED_AFTER`]; twice this many after).
pub const EXPLORE_EVERY: usize = 2;

/// The kept-token chance from which drafted passes try longer drafts.
const EXPLORE_P: f64 = 0.75;

/// Doubling the draft length is worth going on with while the cost per row falls to at most
/// this share of what it was (noisy timing aside: below, a cost that did not fall).
const CHEAPER: f64 = 1.0;

/// A probe times a longer draft length ([`Drafter::wider`]) while at least this share of the
/// draft tokens is kept; a single token otherwise.
const WIDE_PROBE_P: f64 = 0.5;

/// Drafted passes timed before the costs may rule drafting out for long ([`RARE_PROBE_EVERY`]).
const SURE_AFTER: usize = 4;

/// Passes of one row, and of each number of further rows, whose times are kept.
const PLAIN_KEPT: usize = 3;

/// Steps without a draft a generation starts with: the first pass after the prompt's is often
/// slow (caches cold after prefill), so a second one times a pass of one row.
const PLAIN_FIRST: usize = 2;

/// How fast the moving averages follow what happens (the weight of each new observation).
const RATE: f64 = 0.15;

/// Passes of a draft length timed before its cost may stop the drafter trying it or longer
/// ones: a single pass's time spreads 2–3× on a busy host (docs/PERFORMANCE.md, a trace of the
/// drafts).
const JUDGED_AFTER: usize = 2;

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

/// While drafting pauses because it would not pay even when [`HOPEFUL_P`] of the draft tokens
/// were kept, one token is drafted after this many steps (a probe of the MTP layer runs it
/// over its latest rows again: a few passes' worth).
pub const RARE_PROBE_EVERY: usize = 64;

/// The longest wait between such probes: it doubles after each while the costs stay hopeless.
pub const RARE_PROBE_MAX: usize = 512;

/// The adaptive length's first [`PLAIN_FIRST`] steps, and one in every this many after drafted
/// ones, draft nothing: costs are judged against a pass of one row, which a drafter that always
/// drafts (the MTP layer always has a guess) would otherwise never time again.
pub const RETIME_EVERY: usize = 16;

/// The kept-token chance against which the costs are judged hopeless.
pub const HOPEFUL_P: f64 = 0.9;

/// The latest [`PLAIN_KEPT`] timings of one kind of pass; their least is its cost, as a pass is
/// slowed by what else runs on the host, never sped up.
#[derive(Clone, Debug, Default)]
struct Latest(Vec<f64>);

impl Latest {
    fn push(&mut self, seconds: f64) {
        if self.0.len() == PLAIN_KEPT {
            self.0.remove(0);
        }
        self.0.push(seconds);
    }

    fn least(&self) -> Option<f64> {
        self.0.iter().copied().reduce(f64::min)
    }
}

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
            Draft::Ngram { tokens } | Draft::Mtp { tokens } => Some(Drafter {
                fixed: tokens.map(|t| t.min(MAX_DRAFT)),
                p: START_P,
                plain: Latest::default(),
                row_times: vec![Latest::default(); MAX_DRAFT + 1],
                since_explore: 0,
                probing: false,
                probes_kept: 0,
                rare_every: RARE_PROBE_EVERY,
                idle: 0,
                mtp: matches!(d, Draft::Mtp { .. }).then(MtpDraft::default),
                per_draft: None,
                since_plain: 0,
                plain_left: PLAIN_FIRST,
                row_samples: 0,
            }),
        }
    }

    /// The draft length that makes the most tokens per second (see [`Drafter`]).
    #[cfg(test)]
    fn best_length(&self) -> usize {
        self.best_length_at(self.p)
    }

    /// Seconds of a pass of one row, once one has been timed.
    fn one_row(&self) -> Option<f64> {
        self.plain.least()
    }

    /// The seconds `r` further rows add to a pass of one row taking `t`: as timed at `r`,
    /// interpolated between the lengths timed around it, or past the longest timed at its cost
    /// per row (before any: [`START_COST`] of a pass each); never under [`MIN_COST`] each.
    fn extra_cost(&self, r: usize, t: f64) -> f64 {
        let timed = |i: usize| self.row_cost(i).map(|c| (i, c));
        let below = (1..=r.min(MAX_DRAFT)).rev().find_map(timed);
        let above = (r + 1..=MAX_DRAFT).find_map(timed);
        let rf = r as f64;
        let c = match (below, above) {
            (Some((a, ca)), _) if a == r => ca,
            (Some((a, ca)), Some((b, cb))) => ca + (cb - ca) * (r - a) as f64 / (b - a) as f64,
            (Some((a, ca)), None) => ca * rf / a as f64,
            (None, Some((b, cb))) => cb * rf / b as f64,
            (None, None) => START_COST * t * rf,
        };
        c.max(MIN_COST * t * rf)
    }

    /// [`Drafter::best_length`] if the kept-token chance were `p`.
    fn best_length_at(&self, p: f64) -> usize {
        self.best_at(p).0
    }

    /// The draft length that makes the most tokens per second at the kept-token chance `p`,
    /// and that rate relative to a pass of one row (0 and [`MIN_GAIN`] when no draft clears
    /// it).
    fn best_at(&self, p: f64) -> (usize, f64) {
        let unit = self.unit();
        let (mut best, mut best_rate) = (0, MIN_GAIN);
        for k in 1..=MAX_DRAFT {
            let rate = self.rate(k, p, self.extra_cost(k, unit));
            if rate > best_rate {
                (best, best_rate) = (k, rate);
            }
        }
        (best, best_rate)
    }

    /// The seconds costs are judged against: a pass of one row (1 before one is timed).
    fn unit(&self) -> f64 {
        self.one_row().filter(|&t| t > 0.0).unwrap_or(1.0)
    }

    /// Tokens per second, relative to passes of one row, of drafts of `k` tokens kept with the
    /// chance `p` whose further rows add `extra` seconds to a pass.
    fn rate(&self, k: usize, p: f64, extra: f64) -> f64 {
        let unit = self.unit();
        let per_draft = self.one_row().and(self.per_draft).unwrap_or(0.0);
        let (mut expected, mut reach) = (1.0, 1.0);
        for _ in 0..k {
            reach *= p;
            expected += reach;
        }
        expected / (1.0 + (extra + k as f64 * per_draft) / unit)
    }

    /// Whether drafts of `w` tokens could beat `than` (a rate relative to passes of one row)
    /// if their rows beyond the longest length timed cost nothing: the most that timing `w`
    /// could show. (The MTP layer's steps, which cost alike each, are counted.)
    fn worth_trying(&self, w: usize, p: f64, than: f64) -> bool {
        let unit = self.unit();
        let floor = (1..=w)
            .rev()
            .find_map(|i| self.row_cost(i).filter(|_| i < w || self.judged(i)))
            .unwrap_or(0.0)
            .max(MIN_COST * unit * w as f64);
        self.rate(w, p, floor) > than
    }

    fn length(&mut self) -> usize {
        if let Some(k) = self.fixed {
            return k;
        }
        // (A probe that found nothing to propose had no outcome: the next draft is not one.)
        self.probing = false;
        if self.plain_left > 0 || self.since_plain >= RETIME_EVERY {
            self.plain_left = self.plain_left.saturating_sub(1);
            self.since_plain = 0;
            return 0;
        }
        let (k, rate) = self.best_at(self.p);
        // Prompt lookup's drafts cost nothing to make, and where they are right they come in
        // runs (a copied passage): it times longer lengths (see [`Drafter`]). The MTP layer's
        // steps cost alike each and its guesses grow less sure with each: it does not.
        let explores = self.mtp.is_none();
        let wider = self.wider().filter(|_| explores);
        if k > 0 {
            self.idle = 0;
            self.rare_every = RARE_PROBE_EVERY;
            self.since_plain += 1;
            self.since_explore += 1;
            // While drafts are mostly kept, twice the length now and then, if it could pay:
            // often until its cost is judged, less often after (it may have been timed when all
            // ran slow).
            let w = (2 * k).min(MAX_DRAFT);
            let every = if !self.judged(w) {
                EXPLORE_EVERY
            } else {
                2 * EXPLORE_EVERY
            };
            if explores
                && w > k
                && self.p >= EXPLORE_P
                && self.since_explore >= every
                && self.worth_trying(w, self.p, rate)
            {
                self.since_explore = 0;
                return w;
            }
            return k;
        }
        self.idle += 1;
        // While drafts are mostly kept, a probe times a longer length that could pay (see
        // `wider`).
        let wide_probe =
            wider.filter(|&w| self.p >= WIDE_PROBE_P && self.worth_trying(w, self.p, MIN_GAIN));
        let hopeful = |w: usize| self.worth_trying(w, HOPEFUL_P, MIN_GAIN);
        let hopeless = self.row_samples >= SURE_AFTER
            && !wider.is_some_and(hopeful)
            && self.best_length_at(HOPEFUL_P) == 0;
        let every = if hopeless {
            self.rare_every
        } else if explores {
            // Sooner while a longer length waits to be timed and drafts are mostly kept (the
            // probes make `p` known sooner, and time that length once it could pay).
            let first = if wider.is_some() && self.p >= WIDE_PROBE_P {
                PROBE_EVERY / 4
            } else {
                PROBE_EVERY
            };
            (first >> self.probes_kept.min(8)).max(1)
        } else {
            PROBE_EVERY
        };
        if self.idle < every {
            return 0;
        }
        self.idle = 0;
        self.probing = true;
        if hopeless {
            self.rare_every = (2 * self.rare_every).min(RARE_PROBE_MAX);
        } else {
            self.rare_every = RARE_PROBE_EVERY;
        }
        wide_probe.unwrap_or(1)
    }

    /// The next draft length worth timing: twice the longest timed (one before any), while the
    /// last doubling timed brought the cost per row under [`CHEAPER`] of what it was (rows that
    /// share what they read: experts streaming); `None` once it has not (rows that cost alike)
    /// or at [`MAX_DRAFT`].
    fn wider(&self) -> Option<usize> {
        let mut timed = (1..=MAX_DRAFT)
            .rev()
            .filter_map(|i| self.row_cost(i).map(|c| (i, c)));
        let Some((longest, c)) = timed.next() else {
            return Some(1);
        };
        if longest >= MAX_DRAFT {
            return None;
        }
        if let Some((shorter, cs)) = timed.next()
            && c / longest as f64 >= CHEAPER * cs / shorter as f64
        {
            // Not cheaper per row: once sure of it (else time that length again).
            return (!self.judged(longest)).then_some(longest);
        }
        Some((2 * longest).min(MAX_DRAFT))
    }

    /// Whether `r` further rows have been timed often enough to be judged ([`JUDGED_AFTER`]).
    fn judged(&self, r: usize) -> bool {
        self.row_times[r].0.len() >= JUDGED_AFTER
    }

    /// The seconds `r` further rows add to a pass of one row, once timed: the least of their
    /// latest timings, as with a pass of one row (a pass is slowed by what else runs, never
    /// sped up).
    fn row_cost(&self, r: usize) -> Option<f64> {
        self.row_times[r].least()
    }

    /// A draft of at most `limit` tokens to follow `seq` (prompt lookup).
    #[cfg(test)]
    pub(crate) fn propose(&mut self, seq: &[u32], limit: usize) -> Vec<u32> {
        let k = self.length().min(limit);
        lookup(seq, k)
    }

    /// A draft of at most `limit` tokens to follow `seq`, whose positions but the last are in
    /// `state`: by prompt lookup, or by the MTP layer from the hidden rows `state` keeps.
    pub(crate) fn propose_for(
        &mut self,
        seq: &[u32],
        limit: usize,
        model: &Model,
        state: &State,
    ) -> Vec<u32> {
        let k = self.length().min(limit);
        let Some(m) = &mut self.mtp else {
            return lookup(seq, k);
        };
        if k == 0 {
            return Vec::new();
        }
        let t0 = std::time::Instant::now();
        let (d, fresh) = m.propose(model, state, seq, k);
        // A cache started afresh (the prompt's rows, or a restart after a pause) is what
        // resuming costs, not what each draft costs while drafting goes on: not counted.
        if !d.is_empty() && !fresh {
            let each = t0.elapsed().as_secs_f64() / d.len() as f64;
            self.per_draft = Some(average(self.per_draft, each));
        }
        d
    }

    /// Learns from a checked draft: `accepted` of its `proposed` tokens were kept.
    pub(crate) fn outcome(&mut self, proposed: usize, accepted: usize) {
        if proposed == 0 {
            return;
        }
        if std::mem::take(&mut self.probing) {
            self.probes_kept = if accepted == proposed {
                self.probes_kept + 1
            } else {
                0
            };
        }
        for _ in 0..accepted {
            self.p += RATE * (1.0 - self.p);
        }
        if accepted < proposed {
            self.p -= RATE * self.p;
        }
    }

    /// Learns from a timed forward pass with `extra` rows beyond the one a sequence needs
    /// (its draft, and chosen tokens run again).
    pub(crate) fn timed(&mut self, extra: usize, seconds: f64) {
        match (extra, self.one_row()) {
            (0, _) => self.plain.push(seconds),
            (r, Some(t)) => {
                // (More further rows than a draft has, chosen tokens run again, are not kept.)
                if let Some(times) = self.row_times.get_mut(r) {
                    times.push((seconds - t).max(0.0));
                }
                self.row_samples += 1;
            }
            (_, None) => {}
        }
    }
}

/// The most rows the MTP cache catches up over once it has begun; see [`MtpDraft`].
pub(crate) const MTP_GAP: usize = 48;

/// The rows a restarted MTP cache begins with; see [`MtpDraft`].
pub(crate) const MTP_REWARM: usize = 16;

/// The MTP layer's side of a generation's drafting: its own KV cache, which starts at the
/// model's position `origin` (the first hidden row the model's state kept) and holds `valid`
/// positions made from the model's hidden rows and chosen tokens — each position `i` from the
/// hidden row of `i` and the token at `i + 1` — and, beyond those, the positions of the latest
/// draft's further steps, which are cut off before the next (a cache that cannot be cut back
/// over more than one pass, DeepSeek-V4's sliding window, comes back to a snapshot instead).
///
/// A catch-up over more than [`MTP_GAP`] rows (drafting paused for a while) starts the cache
/// afresh over the latest [`MTP_REWARM`] rows instead: the hidden rows carry the model's whole
/// context, and a probe after a pause then costs a short pass of the layer rather than one over
/// every row since (which, with the experts streaming, reads most of the layer's experts).
#[derive(Clone, Debug, Default)]
pub(crate) struct MtpDraft {
    state: Option<State>,
    origin: usize,
    valid: usize,
}

impl MtpDraft {
    /// At most `k` tokens to follow `seq` (its last token chosen, not yet in `main`), or none
    /// when the hidden row of the position before that token is not kept (a prompt the prefix
    /// cache answered whole) or the MTP layer cannot run (no room for its cache); and whether
    /// the layer's cache was started afresh for them.
    fn propose(&mut self, model: &Model, main: &State, seq: &[u32], k: usize) -> (Vec<u32>, bool) {
        let h = model.config().mtp_row_width();
        let n = seq.len();
        let (first, rows) = main.hidden_rows();
        let held = rows.len() / h.max(1);
        // The position whose hidden row and the token after it (the one just chosen) give the
        // first draft token; only rows of positions the state holds are real.
        let Some(last) = n.checked_sub(2) else {
            return (Vec::new(), false);
        };
        if held == 0 || last < first || last >= first + held || last >= main.pos() {
            return (Vec::new(), false);
        }
        let mut start = self.origin + self.valid;
        let restart = if self.state.is_none() || start < first || start > last {
            Some(first)
        } else if last + 1 - start > MTP_GAP {
            Some(last + 1 - MTP_REWARM)
        } else {
            None
        };
        if let Some(origin) = restart {
            self.state = model.new_mtp_state();
            self.origin = origin;
            self.valid = 0;
            start = origin;
        }
        let fresh = restart.is_some();
        let Some(state) = self.state.as_mut() else {
            return (Vec::new(), fresh);
        };
        match Self::steps(
            model,
            state,
            self.origin,
            self.valid,
            &rows[(start - first) * h..(last + 1 - first) * h],
            &seq[start + 1..=last + 1],
            k,
        ) {
            Ok(d) => {
                self.valid = last + 1 - self.origin;
                (d, fresh)
            }
            Err(_) => {
                // Drafting never fails a generation: the next draft starts afresh.
                self.state = None;
                (Vec::new(), fresh)
            }
        }
    }

    /// Cuts the MTP cache back to its `valid` positions, runs the new rows (`hidden`, `tokens`)
    /// through it in one pass and then one step per further draft token; the draft.
    fn steps(
        model: &Model,
        state: &mut State,
        origin: usize,
        valid: usize,
        hidden: &[f32],
        tokens: &[u32],
        k: usize,
    ) -> Result<Vec<u32>, sluice_model::ModelError> {
        state.truncate(valid)?;
        let h = model.config().mtp_row_width();
        let (mut logits, mut y) = model.mtp_forward(state, origin, hidden, tokens)?;
        // The caught-up state, to come back to after the draft steps when the layer's cache
        // cannot be cut back over more than one of them (DeepSeek-V4's sliding window).
        let caught_up = (k > 2 && !state.cuts_anywhere()).then(|| state.snapshot());
        let mut draft = Vec::with_capacity(k);
        loop {
            let d = argmax(&logits);
            draft.push(d);
            if draft.len() == k {
                if let Some(snap) = caught_up {
                    state.restore(snap);
                }
                return Ok(draft);
            }
            let row = y[y.len() - h..].to_vec();
            (logits, y) = model.mtp_forward(state, origin, &row, &[d])?;
        }
    }
}

/// What a sequence's state holds beyond its chosen tokens, for cutting it back: kept with the
/// state (a session's outlives a generation dropped part-way).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Held {
    /// Where the state's latest forward pass began: what a recurrent state can go back to.
    pub(crate) pass_start: usize,
    /// Draft positions the state holds beyond the chosen tokens.
    pub(crate) drafted: usize,
}

impl Held {
    /// Drops the draft positions the state holds beyond the chosen tokens. A KV cache is cut
    /// back to the chosen tokens; a recurrent state, which can go back only to where its
    /// latest pass began, goes back there, and the chosen tokens after that run again at the
    /// head of the next pass (the same bits: chunking changes none).
    pub(crate) fn settle(&mut self, state: &mut State, model: &Model) {
        if self.drafted == 0 {
            return;
        }
        let keep = state.pos().saturating_sub(self.drafted);
        self.drafted = 0;
        if state.truncate(keep).is_err() && state.truncate(self.pass_start).is_err() {
            // Cannot happen (a state always goes back to its latest pass's start), but a
            // state that cannot is started afresh rather than left holding drafts.
            *state = model.new_state();
        }
    }
}

/// One generation's speculation: its drafter, the draft tokens its state holds beyond the
/// chosen ones (oldest first), the logits of the position after each, and the current draft's
/// (proposed, accepted) — shared by sessions and the batcher, which differ only in how they run
/// the pass.
#[derive(Debug)]
pub(crate) struct Speculation {
    drafter: Option<Drafter>,
    drafts: VecDeque<u32>,
    rows: VecDeque<Vec<f32>>,
    round: (usize, usize),
}

impl Speculation {
    pub(crate) fn new(d: Draft) -> Speculation {
        Speculation {
            drafter: Drafter::new(d),
            drafts: VecDeque::new(),
            rows: VecDeque::new(),
            round: (0, 0),
        }
    }

    /// After `id` was chosen and the generation goes on: the next position's logits if `id`
    /// is the draft token the state holds next (no pass needed), else `None` — the draft, if
    /// any, is dropped and a pass must run ([`Speculation::segment`]).
    pub(crate) fn chosen(
        &mut self,
        id: u32,
        seq: &mut Seq,
        held: &mut Held,
        state: &mut State,
        model: &Model,
    ) -> Option<Vec<f32>> {
        if self.drafts.front() == Some(&id) {
            self.drafts.pop_front();
            held.drafted = self.drafts.len();
            self.round.1 += 1;
            if self.drafts.is_empty() {
                self.end_round(seq);
            }
            return self.rows.pop_front();
        }
        self.drop(seq, held, state, model);
        None
    }

    /// Forgets the draft (the generation ended, or it was rejected) and cuts the state back.
    pub(crate) fn drop(
        &mut self,
        seq: &mut Seq,
        held: &mut Held,
        state: &mut State,
        model: &Model,
    ) {
        if self.drafts.is_empty() {
            return;
        }
        self.end_round(seq);
        self.drafts.clear();
        self.rows.clear();
        held.settle(state, model);
    }

    /// The tokens of the sequence's next pass: the chosen tokens its state lacks (the one just
    /// chosen, and any a recurrent state had to drop) and a new draft. Drafts past what may
    /// still be generated, past the context, or past `max_rows` rows in all (the rows the
    /// memory plan's scratch holds activations and logits for) are never made.
    pub(crate) fn segment(
        &mut self,
        seq: &Seq,
        history: &[u32],
        held: &mut Held,
        state: &State,
        model: &Model,
        max_rows: usize,
    ) -> (Vec<u32>, usize) {
        let fed = state.pos();
        let mut tokens = history[fed..].to_vec();
        let draft = match &mut self.drafter {
            Some(d) => {
                let left = seq.d.opts.max_tokens - seq.d.ids.len();
                let room = model.max_positions().saturating_sub(fed + tokens.len());
                let rows = max_rows.saturating_sub(tokens.len());
                d.propose_for(
                    history,
                    left.saturating_sub(1).min(room).min(rows),
                    model,
                    state,
                )
            }
            None => Vec::new(),
        };
        tokens.extend_from_slice(&draft);
        held.pass_start = fed;
        held.drafted = draft.len();
        self.drafts = draft.iter().copied().collect();
        self.round = (draft.len(), 0);
        (tokens, draft.len())
    }

    /// The pass over [`Speculation::segment`]'s tokens failed (the state is as it was before
    /// it): no draft is held.
    pub(crate) fn failed(&mut self, held: &mut Held) {
        self.drafts.clear();
        self.rows.clear();
        self.round = (0, 0);
        held.drafted = 0;
    }

    /// Takes the logits of a pass over a segment of `drafted` draft tokens (`out`: every row
    /// of the segment, or only its last when it was one token): the chosen token's row is the
    /// next position's logits, the draft tokens' rows wait their turn.
    pub(crate) fn take_rows(&mut self, out: &[f32], vocab: usize, drafted: usize) -> Vec<f32> {
        let n = out.len() / vocab.max(1);
        let mut rows = out
            .chunks_exact(vocab)
            .skip(n - 1 - drafted)
            .map(<[f32]>::to_vec);
        let next = rows.next().unwrap_or_default();
        self.rows = rows.collect();
        next
    }

    /// Runs one sequence's segment ([`Speculation::segment`]) alone and takes its logits; the
    /// rows the pass had. When the budget has no room for the draft's positions in the KV
    /// cache, the draft is dropped and the chosen tokens run without it: drafting never makes
    /// a sequence fail that would not fail without it. On error the state is as it was and no
    /// draft is held.
    pub(crate) fn run_alone(
        &mut self,
        model: &Model,
        state: &mut State,
        held: &mut Held,
        tokens: &[u32],
        drafted: usize,
    ) -> Result<(Vec<f32>, usize), sluice_model::ModelError> {
        let want = |n: usize| if n == 1 { Logits::Last } else { Logits::All };
        let vocab = model.config().vocab;
        match model.forward(state, tokens, want(tokens.len())) {
            Ok(out) => Ok((self.take_rows(&out, vocab, drafted), tokens.len())),
            Err(sluice_model::ModelError::KvFull { .. }) if drafted > 0 => {
                self.failed(held);
                let base = &tokens[..tokens.len() - drafted];
                match model.forward(state, base, want(base.len())) {
                    Ok(out) => Ok((self.take_rows(&out, vocab, 0), base.len())),
                    Err(e) => Err(e),
                }
            }
            Err(e) => {
                self.failed(held);
                Err(e)
            }
        }
    }

    /// Learns from a pass that took `seconds` with `extra` rows beyond one per sequence.
    pub(crate) fn timed(&mut self, extra: usize, seconds: f64) {
        if let Some(d) = &mut self.drafter {
            d.timed(extra, seconds);
        }
    }

    fn end_round(&mut self, seq: &mut Seq) {
        let (proposed, accepted) = std::mem::take(&mut self.round);
        if proposed > 0 {
            seq.note_draft(proposed, accepted);
            if let Some(d) = &mut self.drafter {
                d.outcome(proposed, accepted);
            }
        }
    }
}

#[cfg(test)]
mod tests;
