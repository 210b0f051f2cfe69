//! Requests: admission in turn (FIFO tickets), pinning the hits and counting the request, and
//! handing the misses to the reader pool ([`super::arrivals`]).

use std::collections::VecDeque;
use std::sync::{MutexGuard, mpsc};
use std::time::Instant;

use super::arrivals::Landed;
use super::cache::Waiter;
use super::{Arrivals, ExpertStore, Inner, Pinned, poisoned};
use crate::policy::{FixedSet, Key};
use crate::{AlignedBuf, StoreError};

/// Whose turn it is: the tickets of the requests waiting for room, and the leases waiting for
/// pins to go.
#[derive(Default)]
pub(super) struct Turns {
    /// Tickets of the requests waiting for their turn, oldest first. A request that cannot be
    /// admitted at once takes a ticket; only the oldest may be admitted, so a request that
    /// needs the whole cache is not overtaken forever by smaller ones, and newcomers never jump
    /// the queue.
    queue: VecDeque<u64>,
    next_ticket: u64,
    /// Leases waiting for pinned experts to go so that what is cached fits their new size.
    pub(super) lease_waiters: usize,
}

impl Turns {
    /// Requests waiting for their turn.
    pub(super) fn waiting(&self) -> usize {
        self.queue.len()
    }

    /// Whether no request waits for its turn.
    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether anyone (a request or a lease) waits for pins to be released.
    pub(super) fn anyone_waits(&self) -> bool {
        !self.queue.is_empty() || self.lease_waiters > 0
    }

    /// Whether the holder of `ticket` (None: a newcomer) may try to be admitted now.
    fn my_turn(&self, ticket: Option<u64>) -> bool {
        match ticket {
            None => self.queue.is_empty(),
            Some(t) => self.queue.front() == Some(&t),
        }
    }

    /// A ticket at the back of the queue.
    fn take(&mut self) -> u64 {
        let t = self.next_ticket;
        self.next_ticket += 1;
        self.queue.push_back(t);
        t
    }

    /// The oldest ticket was admitted.
    fn admitted(&mut self) {
        self.queue.pop_front();
    }

    /// `ticket` gives up its turn.
    fn leave(&mut self, ticket: u64) {
        self.queue.retain(|&q| q != ticket);
    }
}

/// A request that may be admitted: how many of its experts can be taken and their distinct
/// misses (their room made).
type Admitted<'a> = (MutexGuard<'a, Inner>, usize, Vec<Key>);

impl ExpertStore {
    /// The bytes of the given experts of a layer, in the order asked. The handles pin the bytes
    /// until dropped. Misses are read in parallel, in file-offset order; an expert another
    /// request or a prefetch is already reading is waited for, not read twice.
    pub fn fetch(&self, layer: usize, experts: &[u32]) -> Result<Vec<Pinned>, StoreError> {
        let mut out: Vec<Option<Pinned>> = (0..experts.len()).map(|_| None).collect();
        for a in self.fetch_each(layer, experts, &[])? {
            let (i, blob) = a?;
            out[i] = Some(blob);
        }
        out.into_iter()
            .enumerate()
            .map(|(i, b)| {
                b.ok_or_else(|| {
                    StoreError::Shared(format!(
                        "expert {} of layer {layer} never arrived",
                        experts[i]
                    ))
                })
            })
            .collect()
    }

    /// Like [`fetch`](ExpertStore::fetch), but tells the policy how many tokens each expert
    /// serves (`rows[i]` for `experts[i]`; empty: one each) and hands each expert over as soon
    /// as it is in memory: first the ones already resident, then the misses (and the experts
    /// others were already reading) in the order their reads land, as `(index into experts,
    /// bytes)`. The misses are read in parts of
    /// [`READ_PART`](crate::READ_PART) bytes, in file-offset order, several parts in flight, so
    /// they land one after another and the caller computes with the first while the rest are
    /// still being read. Every expert asked for is pinned from this call until its handle is
    /// dropped; dropping the iterator early waits for the reads it started (nothing is left
    /// half-read).
    ///
    /// # Waiting
    ///
    /// A request whose misses do not fit beside the pinned experts of other requests waits,
    /// holding nothing, until pins are released; waiting requests are admitted strictly in the
    /// order they arrived, and a request never overtakes one that is waiting. Pins are released
    /// by dropping the [`Pinned`] handles, which wakes the waiters. Reads land on the reader
    /// threads whoever asked for them, so no request ever waits on another request's progress —
    /// only on its pins. A caller must therefore never hold a handle while making another
    /// request (the model drops a group's handles before fetching the next group): then every
    /// waiting request is eventually admitted, as long as it asks for no more than
    /// [`max_pinned`](ExpertStore::max_pinned) experts, or uses
    /// [`fetch_some`](ExpertStore::fetch_some).
    pub fn fetch_each(
        &self,
        layer: usize,
        experts: &[u32],
        rows: &[u32],
    ) -> Result<Arrivals, StoreError> {
        self.request(layer, experts, rows, true).map(|(_, a)| a)
    }

    /// Like [`fetch_each`](ExpertStore::fetch_each) for the longest prefix of `experts` that
    /// the cache can pin at once at the moment it is admitted (at least one expert): returns
    /// how many were taken and their arrivals. The capacity shrinks and grows as
    /// [`Lease`](crate::Lease)s take and give back memory, so a caller that walks a layer's
    /// experts with this never asks for more than fits.
    pub fn fetch_some(
        &self,
        layer: usize,
        experts: &[u32],
        rows: &[u32],
    ) -> Result<(usize, Arrivals), StoreError> {
        self.request(layer, experts, rows, false)
    }

    fn request(
        &self,
        layer: usize,
        experts: &[u32],
        rows: &[u32],
        whole: bool,
    ) -> Result<(usize, Arrivals), StoreError> {
        let sh = &self.shared;
        if !rows.is_empty() && rows.len() != experts.len() {
            return Err(StoreError::Shared(format!(
                "{} row counts for {} experts",
                rows.len(),
                experts.len()
            )));
        }
        for &e in experts {
            sh.spec(layer, e)?;
        }
        let keys: Vec<Key> = experts.iter().map(|&e| Key::new(layer, e)).collect();
        let t0 = Instant::now();
        // Buffers of the experts evicted to make room, for the misses to be read into.
        let mut spare = Vec::new();
        let (tx, rx) = mpsc::channel();
        let g = sh.inner.lock().map_err(|_| poisoned())?;
        let (mut g, n, misses) = self.wait_turn(g, layer, &keys, whole, &mut spare)?;
        let (ready, awaited) = self.admit(
            &mut g,
            layer,
            &keys[..n],
            &rows[..n.min(rows.len())],
            &misses,
            &tx,
        );
        g.tally.stats.wait_seconds += t0.elapsed().as_secs_f64();
        drop(g);
        let arrivals = self.read_misses(&keys[..n], misses, ready, spare, (tx, rx), awaited);
        Ok((n, arrivals))
    }

    /// Waits, holding nothing, until the request for `keys` can be admitted: its turn has come
    /// (tickets, oldest first) and the room for its misses was made (experts being read by
    /// another request or a prefetch are not misses: they are handed over as they land).
    /// Returns how many keys are taken and their misses.
    fn wait_turn<'a>(
        &'a self,
        mut g: MutexGuard<'a, Inner>,
        layer: usize,
        keys: &[Key],
        whole: bool,
        spare: &mut Vec<AlignedBuf>,
    ) -> Result<Admitted<'a>, StoreError> {
        let sh = &self.shared;
        let mut ticket: Option<u64> = None;
        loop {
            let my_turn = g.turns.my_turn(ticket);
            let n = self.fit_prefix(keys, g.cache.capacity);
            if n == 0 || (whole && n < keys.len()) {
                if let Some(t) = ticket {
                    g.turns.leave(t);
                    sh.cond.notify_all();
                }
                let all: u64 = keys.iter().map(|k| sh.footprint(*k)).sum();
                return Err(StoreError::BudgetTooSmall {
                    budget: g.cache.capacity,
                    minimum: all,
                    what: format!("{} experts of layer {layer} at once", keys.len()),
                });
            }
            let taken = &keys[..n];
            if my_turn {
                let mut misses: Vec<Key> = taken
                    .iter()
                    .copied()
                    .filter(|k| !g.cache.entries.contains_key(k))
                    .collect();
                misses.sort();
                misses.dedup();
                let need: u64 = misses.iter().map(|k| sh.footprint(*k)).sum();
                if g.make_room(need, taken, None, spare) {
                    if ticket.is_some() {
                        // The next in line may now try.
                        g.turns.admitted();
                        sh.cond.notify_all();
                    }
                    return Ok((g, n, misses));
                }
                // Evicted buffers are no use to a request that must wait: give them back.
                spare.clear();
            }
            if ticket.is_none() {
                ticket = Some(g.turns.take());
            }
            g = sh.cond.wait(g).map_err(|_| poisoned())?;
        }
    }

    /// The longest prefix of `keys` whose distinct experts `capacity` can hold at once.
    fn fit_prefix(&self, keys: &[Key], capacity: u64) -> usize {
        let (mut n, mut total) = (0, 0u64);
        let mut distinct: FixedSet<Key> = FixedSet::default();
        for k in keys {
            if !distinct.contains(k) {
                let f = self.shared.footprint(*k);
                if total + f > capacity {
                    break;
                }
                total += f;
                distinct.insert(*k);
            }
            n += 1;
        }
        n
    }

    /// Accounts an admitted request (policy, statistics, trace, prefetch scoring), pins its
    /// hits, marks its misses as loading and has the experts that others are reading sent to
    /// `tx` when they land. Returns the hits and how many were left to others' reads.
    fn admit(
        &self,
        g: &mut Inner,
        layer: usize,
        keys: &[Key],
        rows: &[u32],
        misses: &[Key],
        tx: &mpsc::Sender<Landed>,
    ) -> (VecDeque<(usize, Pinned)>, usize) {
        let sh = &self.shared;
        let step = g.step;
        let mut ready = VecDeque::new();
        let mut awaited = 0;
        let predicted = g.lookahead.check(layer, step, keys);
        for (i, &k) in keys.iter().enumerate() {
            let n = rows.get(i).copied().unwrap_or(1);
            g.tally
                .request(step, k, n, sh.footprint(k), predicted.as_ref());
            g.cache.policy.request(k, n);
            if let Some((blob, prefetched_step)) = g.cache.pin(k) {
                g.tally.hit(prefetched_step == Some(step));
                ready.push_back((i, Pinned::new(&self.shared, k, blob)));
                continue;
            }
            let waiter = Waiter {
                tx: tx.clone(),
                index: i,
            };
            match g.cache.await_read(k, waiter) {
                // Read by a prefetch of this step or by another request: a hit once it lands.
                Some(prefetched_step) => {
                    g.tally.hit(prefetched_step == Some(step));
                    awaited += 1;
                }
                None => g.tally.stats.misses += 1,
            }
        }
        for &k in misses {
            g.cache.start_loading(k, sh.footprint(k), None);
            g.tally.stats.reads += 1;
        }
        (ready, awaited)
    }
}
