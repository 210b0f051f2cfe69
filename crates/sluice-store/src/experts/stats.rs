//! What the store counts: [`ExpertStats`], the experts touched in the current step, and the
//! optional trace of every request for offline replay.

use super::prefetch::Checked;
use crate::policy::{FixedSet, Key};
use crate::trace::TraceEvent;

/// Counters of an expert store.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExpertStats {
    /// Experts asked for.
    pub requests: u64,
    /// Requests served from memory (resident or brought in by a prefetch).
    pub hits: u64,
    /// Hits on experts that were resident before this forward step began.
    pub resident_hits: u64,
    /// Hits on experts a prefetch read during the same step.
    pub prefetch_hits: u64,
    /// Requests that had to be read.
    pub misses: u64,
    /// Expert reads issued (demand and prefetch).
    pub reads: u64,
    /// Bytes read from disk for experts (including alignment widening).
    pub bytes_read: u64,
    /// Seconds the model waited on expert reads.
    pub wait_seconds: f64,
    /// Prefetch reads issued.
    pub prefetch_reads: u64,
    /// Experts predicted by prefetch that the real router then chose (by the last prediction
    /// made before the request: the late one when there was one, [`crate::Guess`]).
    pub prefetch_predicted: u64,
    /// Requests made in layers where a prediction had been made (the recall denominator).
    pub prefetch_checked: u64,
    /// [`Self::prefetch_predicted`] of the early predictions alone.
    pub prefetch_predicted_early: u64,
    /// Requests made in layers where an early prediction had been made.
    pub prefetch_checked_early: u64,
    /// [`Self::prefetch_predicted`] of the mid predictions alone.
    pub prefetch_predicted_mid: u64,
    /// Requests made in layers where a mid prediction had been made (only steps whose layer
    /// before waited for a read make one).
    pub prefetch_checked_mid: u64,
    /// [`Self::prefetch_checked`] and [`Self::prefetch_predicted`] per layer (indexed by layer,
    /// as long as the deepest layer checked).
    pub prefetch_by_layer: Vec<(u64, u64)>,
    /// Experts evicted.
    pub evictions: u64,
    /// Distinct experts asked for, counted once per forward step: what a step must have in
    /// memory at least once.
    pub touched: u64,
    /// Buffer bytes of those experts (the least a step with a cold cache must read).
    pub touched_bytes: u64,
}

impl ExpertStats {
    /// Hits ÷ requests.
    pub fn hit_rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.hits as f64 / self.requests as f64
        }
    }

    /// Fraction of the real router's choices that prefetch had predicted (by the last
    /// prediction made before the request).
    pub fn prefetch_recall(&self) -> f64 {
        share(self.prefetch_predicted, self.prefetch_checked)
    }

    /// [`Self::prefetch_recall`] of the early predictions alone.
    pub fn prefetch_recall_early(&self) -> f64 {
        share(self.prefetch_predicted_early, self.prefetch_checked_early)
    }

    /// [`Self::prefetch_recall`] of the mid predictions alone.
    pub fn prefetch_recall_mid(&self) -> f64 {
        share(self.prefetch_predicted_mid, self.prefetch_checked_mid)
    }
}

/// `part ÷ whole`, 0 when `whole` is.
fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// The counters with what they need to count once per step, and the trace.
pub(super) struct Tally {
    pub(super) stats: ExpertStats,
    /// Experts already asked for in the current step.
    touched: FixedSet<Key>,
    trace: Option<Vec<TraceEvent>>,
}

impl Tally {
    pub(super) fn new(record_trace: bool) -> Tally {
        Tally {
            stats: ExpertStats::default(),
            touched: FixedSet::default(),
            trace: record_trace.then(Vec::new),
        }
    }

    /// A new forward step: every expert counts as untouched again.
    pub(super) fn begin_step(&mut self) {
        self.touched.clear();
    }

    /// Takes the trace recorded so far (empty unless recording).
    pub(super) fn take_trace(&mut self) -> Vec<TraceEvent> {
        self.trace.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Counts a request in `step` for `k` on behalf of `rows` tokens (`footprint`: its buffer
    /// bytes), checked against the experts `predicted` for its layer in this step if any.
    pub(super) fn request(
        &mut self,
        step: u64,
        k: Key,
        rows: u32,
        footprint: u64,
        predicted: Option<&Checked>,
    ) {
        self.stats.requests += 1;
        if self.touched.insert(k) {
            self.stats.touched += 1;
            self.stats.touched_bytes += footprint;
        }
        if let Some(t) = self.trace.as_mut() {
            t.push(TraceEvent {
                step,
                layer: k.layer,
                expert: k.expert,
                rows,
            });
        }
        if let Some(p) = predicted {
            if let Some(early) = &p.early {
                self.stats.prefetch_checked_early += 1;
                self.stats.prefetch_predicted_early += u64::from(early.contains(&k.expert));
            }
            if let Some(mid) = &p.mid {
                self.stats.prefetch_checked_mid += 1;
                self.stats.prefetch_predicted_mid += u64::from(mid.contains(&k.expert));
            }
            let l = k.layer as usize;
            if self.stats.prefetch_by_layer.len() <= l {
                self.stats.prefetch_by_layer.resize(l + 1, (0, 0));
            }
            let right = p.last.contains(&k.expert);
            self.stats.prefetch_checked += 1;
            self.stats.prefetch_by_layer[l].0 += 1;
            if right {
                self.stats.prefetch_predicted += 1;
                self.stats.prefetch_by_layer[l].1 += 1;
            }
        }
    }

    /// Counts a hit: on an expert a prefetch read during this step, or on a resident one.
    pub(super) fn hit(&mut self, by_prefetch: bool) {
        self.stats.hits += 1;
        if by_prefetch {
            self.stats.prefetch_hits += 1;
        } else {
            self.stats.resident_hits += 1;
        }
    }
}
