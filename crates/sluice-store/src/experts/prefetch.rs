//! Lookahead prefetch: the predictions of each layer, how often each confidence rank of them
//! came true, and the speculative reads of the ranks that have earned it.

use std::sync::Arc;

use super::cache::take_spare;
use super::{ExpertStore, PREFETCH_WARMUP, READ_PART, Shared};
use crate::StoreError;
use crate::io::{Blob, read_blob_parts};
use crate::policy::{FixedMap, Key};

/// What prefetch has learnt.
#[derive(Default)]
pub(super) struct Lookahead {
    /// Per layer: the step of the last prediction, the experts predicted (most confident
    /// first) and whether the real routing has been compared with it yet.
    predicted: FixedMap<u32, (u64, Vec<u32>, bool)>,
    /// Per confidence rank of a prediction: (predictions compared, predictions the router then
    /// chose), the precision that decides how many of the ranks prefetch reads.
    ranks: Vec<(u64, u64)>,
}

impl Lookahead {
    /// Remembers the prediction of `layer` made in `step`, most confident first.
    fn predict(&mut self, layer: usize, step: u64, experts: &[u32]) {
        self.predicted
            .insert(layer as u32, (step, experts.to_vec(), false));
    }

    /// How many of the leading ranks of a prediction of `n` experts to read: those with at
    /// least [`PREFETCH_WARMUP`] predictions compared and at least `precision` of them right
    /// (all `n` with a precision of 0).
    fn width(&self, precision: f64, n: usize) -> usize {
        if precision <= 0.0 {
            return n;
        }
        self.ranks
            .iter()
            .take_while(|&&(n, right)| n >= PREFETCH_WARMUP && right as f64 >= precision * n as f64)
            .count()
    }

    /// The experts predicted for `layer` in `step`, if any, for the request of `keys` just
    /// admitted; the first request of a step and layer also scores each rank of the prediction
    /// against the router. (When a layer's experts come in several calls, because the cache
    /// cannot pin them all at once, only the first call's share is seen: prefetch then trusts
    /// less, which suits a cache that small.)
    pub(super) fn check(&mut self, layer: usize, step: u64, keys: &[Key]) -> Option<Vec<u32>> {
        let (p, scored) = self
            .predicted
            .get_mut(&(layer as u32))
            .filter(|p| p.0 == step)
            .map(|p| (p.1.clone(), std::mem::replace(&mut p.2, true)))?;
        if !scored {
            if self.ranks.len() < p.len() {
                self.ranks.resize(p.len(), (0, 0));
            }
            for (r, e) in p.iter().enumerate() {
                self.ranks[r].0 += 1;
                self.ranks[r].1 += u64::from(keys.iter().any(|k| k.expert == *e));
            }
        }
        Some(p)
    }
}

impl ExpertStore {
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
        let sh = &self.shared;
        let Ok(mut g) = sh.inner.lock() else { return };
        let step = g.step;
        g.lookahead.predict(layer, step, experts);
        if !g.turns.is_empty() {
            return;
        }
        let width = g.lookahead.width(sh.prefetch_precision, experts.len());
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
            g.cache.start_loading(k, bytes);
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
                done,
            );
        }
    }
}
