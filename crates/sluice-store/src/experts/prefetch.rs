//! Lookahead prefetch: the predictions of each layer, how often each confidence rank of them
//! came true, and the speculative reads of the ranks that have earned it.

use std::sync::Arc;

use super::cache::take_spare;
use super::{ExpertStore, PREFETCH_WARMUP, READ_PART, Shared};
use crate::StoreError;
use crate::io::{Blob, read_blob_parts};
use crate::policy::{FixedMap, Key};

/// When a prediction of a layer's experts is made, relative to the layer before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guess {
    /// While the layer before computes its experts, from its residual before them: the most
    /// time for the reads, the least information.
    Early,
    /// While the layer before waits for its reads, from its residual plus the experts it has
    /// computed: the reads queue behind those the layer waits for, so the disk goes on to the
    /// next layer's instead of idling through the rest of the layer and the next attention.
    /// Its ranks are read at the early bar ([`PREFETCH_PRECISION`](super::PREFETCH_PRECISION)).
    Mid,
    /// From the output of the layer before, just before this layer's attention: less time,
    /// and a router input that lacks only this layer's attention.
    Late,
}

/// The number of [`Guess`] stages.
const STAGES: usize = 3;

/// One stage's prediction for one layer: the step it was made in, the experts (most
/// confident first) and whether the real routing has been compared with it yet.
type Prediction = (u64, Vec<u32>, bool);

/// What prefetch has learnt.
#[derive(Default)]
pub(super) struct Lookahead {
    /// Per stage ([`Guess`] as index) and layer: the latest prediction.
    predicted: [FixedMap<u32, Prediction>; STAGES],
    /// Per stage and confidence rank of a prediction: (predictions compared, predictions the
    /// router then chose), the precision that decides how many of the ranks prefetch reads.
    /// The stages keep their own: a late guess is right more often than an early one.
    ranks: [Vec<(u64, u64)>; STAGES],
}

/// The predictions a request is compared with: the last one made before it (the late one
/// when there is one, else the mid one), and the early and mid ones.
pub(super) struct Checked {
    pub(super) last: Vec<u32>,
    pub(super) early: Option<Vec<u32>>,
    pub(super) mid: Option<Vec<u32>>,
}

impl Lookahead {
    /// Remembers the prediction of `layer` made in `step`, most confident first.
    fn predict(&mut self, stage: Guess, layer: usize, step: u64, experts: &[u32]) {
        self.predicted[stage as usize].insert(layer as u32, (step, experts.to_vec(), false));
    }

    /// How many of the leading ranks of a `stage` prediction of `n` experts to read: those
    /// with at least [`PREFETCH_WARMUP`] predictions compared and at least `precision` of them
    /// right (all `n` with a precision of 0).
    fn width(&self, stage: Guess, precision: f64, n: usize) -> usize {
        if precision <= 0.0 {
            return n;
        }
        self.ranks[stage as usize]
            .iter()
            .take_while(|&&(n, right)| n >= PREFETCH_WARMUP && right as f64 >= precision * n as f64)
            .count()
    }

    /// Whether a `stage` guess has a chance of earning reads at `precision`: its first rank
    /// has not been scored enough times yet, or is right at least `precision − `
    /// [`GUESS_MARGIN`] of the time.
    fn promising(&self, stage: Guess, precision: f64) -> bool {
        match self.ranks[stage as usize].first() {
            Some(&(n, right)) if n >= PREFETCH_WARMUP => {
                right as f64 >= (precision - GUESS_MARGIN) * n as f64
            }
            _ => true,
        }
    }

    /// The predictions made for `layer` in `step`, if any, for the request of `keys` just
    /// admitted; the first request of a step and layer also scores each rank of each stage's
    /// prediction against the router. (When a layer's experts come in several calls, because
    /// the cache cannot pin them all at once, only the first call's share is seen: prefetch
    /// then trusts less, which suits a cache that small.)
    pub(super) fn check(&mut self, layer: usize, step: u64, keys: &[Key]) -> Option<Checked> {
        let mut now: [Option<Vec<u32>>; STAGES] = Default::default();
        for (stage, made) in self.predicted.iter_mut().enumerate() {
            let Some((p, scored)) = made
                .get_mut(&(layer as u32))
                .filter(|p| p.0 == step)
                .map(|p| (p.1.clone(), std::mem::replace(&mut p.2, true)))
            else {
                continue;
            };
            if !scored {
                let ranks = &mut self.ranks[stage];
                if ranks.len() < p.len() {
                    ranks.resize(p.len(), (0, 0));
                }
                for (r, e) in p.iter().enumerate() {
                    ranks[r].0 += 1;
                    ranks[r].1 += u64::from(keys.iter().any(|k| k.expert == *e));
                }
            }
            now[stage] = Some(p);
        }
        let [early, mid, late] = now;
        Some(Checked {
            last: late.or_else(|| mid.clone()).or_else(|| early.clone())?,
            early,
            mid,
        })
    }
}

/// How far below the bar a stage's most confident rank may be and still be guessed every
/// step: it may yet cross it (the demo model's late ranks are right 90–93% of the time
/// against 95%).
pub const GUESS_MARGIN: f64 = 0.05;

/// A stage whose guesses cannot earn reads is still guessed in one step of this many, so
/// that its record follows the router and the recall figures keep a sample.
pub const GUESS_PROBE_EVERY: u64 = 8;

impl ExpertStore {
    /// Whether a `stage` guess is worth making in this step: always when every guess is read
    /// (a precision of 0); otherwise when the stage's record gives it a chance of reaching its
    /// bar, and in one step of [`GUESS_PROBE_EVERY`] when it does not. A guess costs a router
    /// product (both stages together 0.5 ms per token in the pass's other phase on the
    /// synthetic model of docs/PERFORMANCE.md), and one that cannot earn reads reads nothing.
    pub fn wants_guess(&self, stage: Guess) -> bool {
        let sh = &self.shared;
        if sh.prefetch_precision <= 0.0 {
            return true;
        }
        let Ok(g) = sh.inner.lock() else { return false };
        g.step.is_multiple_of(GUESS_PROBE_EVERY)
            || g.lookahead.promising(stage, sh.precision(stage))
    }

    /// Takes a prediction of the experts `layer` will ask for in this step, most confident
    /// first, and reads in the background the leading ranks that have earned it: a rank is read
    /// once at least [`PREFETCH_WARMUP`] of its predictions were compared with the router's
    /// choice and at least the configured precision ([`PREFETCH_PRECISION`] by default) of them
    /// were right (a wrong guess costs a whole read on a disk that is the bottleneck; a right
    /// one only moves a read earlier). With a precision of 0 every prediction is read.
    ///
    /// Reads go without pins, and only into room that neither needs a pinned expert evicted
    /// nor one the policy ranks above the guess ([`Policy::displaces`]), and never while a
    /// request waits for room: a guess never pushes out what the cache has learnt to keep, nor
    /// takes what a waiting request needs. They queue behind demand reads, in parts. A hint: it
    /// never changes what a later [`fetch`](ExpertStore::fetch) returns.
    ///
    /// [`PREFETCH_PRECISION`]: super::PREFETCH_PRECISION
    /// [`Policy::displaces`]: crate::Policy::displaces
    pub fn prefetch(&self, layer: usize, experts: &[u32]) {
        self.prefetch_guess(Guess::Early, layer, experts);
    }

    /// [`prefetch`](ExpertStore::prefetch) for a prediction made at `stage`: each stage's
    /// ranks earn their reads on their own record (a late rank against the higher bar
    /// [`PREFETCH_PRECISION_LATE`](super::PREFETCH_PRECISION_LATE)), and a request is
    /// compared with the last prediction made (recall) as well as with the early one.
    pub fn prefetch_guess(&self, stage: Guess, layer: usize, experts: &[u32]) {
        let sh = &self.shared;
        let Ok(mut g) = sh.inner.lock() else { return };
        let step = g.step;
        g.lookahead.predict(stage, layer, step, experts);
        if !g.turns.is_empty() {
            return;
        }
        let precision = sh.precision(stage);
        let width = g.lookahead.width(stage, precision, experts.len());
        let mut jobs = Vec::new();
        let mut spare = Vec::new();
        for &e in experts.iter().take(width) {
            let k = Key::new(layer, e);
            if sh.spec(layer, e).is_err() || g.cache.entries.contains_key(&k) {
                continue;
            }
            let bytes = sh.footprint(k);
            if !g.make_room(bytes, &[k], Some(k), &mut spare) {
                break;
            }
            g.cache.start_loading(k, bytes, Some(step));
            g.tally.stats.reads += 1;
            g.tally.stats.prefetch_reads += 1;
            jobs.push(k);
        }
        drop(g);
        for k in jobs {
            let land_sh = Arc::clone(&self.shared);
            let step = Some(step);
            // A failed prefetch leaves nothing behind; a later fetch reads again and reports
            // the error.
            let done = Box::new(move |r: Result<Blob, StoreError>| {
                let _ = Shared::land(&land_sh, k, r, 0, step);
            });
            read_blob_parts(
                &sh.reader,
                &sh.specs[k.layer as usize][k.expert as usize],
                take_spare(&mut spare, sh.footprint(k)),
                sh.footprint(k) as usize,
                READ_PART,
                &|job| self.pool.spawn(job),
                self.ring.as_ref().map(|r| (r, false)),
                done,
            );
        }
    }
}
