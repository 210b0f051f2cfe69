//! The expert store: routed experts read in place from the shards, behind a byte-budgeted cache
//! with a pluggable eviction policy, pins, single-flight reads, a reader pool and prefetch.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, mpsc};
use std::time::Instant;

use crate::io::{Blob, Piece, Reader, plan_reads, read_blob_parts};
use crate::policy::{FixedMap, FixedSet, Key, Policy};
use crate::pool::ReaderPool;
use crate::trace::TraceEvent;
use crate::{AlignedBuf, StoreError};

mod handles;

pub use handles::{Arrivals, Lease, Pinned};

/// How to build an [`ExpertStore`].
pub struct ExpertStoreConfig {
    /// Bytes the cache may hold (buffers of resident and in-flight experts).
    pub capacity: u64,
    /// Eviction policy.
    pub policy: Box<dyn Policy>,
    /// Reader threads (0 reads on the caller's thread).
    pub readers: usize,
    /// Record every request for offline replay.
    pub record_trace: bool,
    /// Share of a confidence rank's predictions that must have come true before
    /// [`prefetch`](ExpertStore::prefetch) reads that rank ([`PREFETCH_PRECISION`] by default;
    /// 0 reads every prediction from the first step).
    pub prefetch_precision: f64,
}

impl std::fmt::Debug for ExpertStoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ExpertStoreConfig({} bytes, {}, {} readers)",
            self.capacity,
            self.policy.name(),
            self.readers
        )
    }
}

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
    /// Experts predicted by prefetch that the real router then chose.
    pub prefetch_predicted: u64,
    /// Requests made in layers where a prediction had been made (the recall denominator).
    pub prefetch_checked: u64,
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

    /// Fraction of the real router's choices that prefetch had predicted.
    pub fn prefetch_recall(&self) -> f64 {
        if self.prefetch_checked == 0 {
            0.0
        } else {
            self.prefetch_predicted as f64 / self.prefetch_checked as f64
        }
    }
}

enum Entry {
    Ready {
        blob: Arc<Blob>,
        bytes: u64,
        prefetched_step: Option<u64>,
        /// Live [`Pinned`] handles: a pinned entry is never evicted.
        pins: u32,
    },
    Loading,
}

struct Inner {
    entries: FixedMap<Key, Entry>,
    policy: Box<dyn Policy>,
    used: u64,
    /// Bytes the cache may hold now: the configured capacity less what is lent out
    /// ([`Lease`]s: sessions' KV pages).
    capacity: u64,
    /// The capacity never goes below this.
    floor: u64,
    stats: ExpertStats,
    step: u64,
    /// Per layer: the step of the last prediction, the experts predicted (most confident
    /// first) and whether the real routing has been compared with it yet.
    predicted: FixedMap<u32, (u64, Vec<u32>, bool)>,
    /// Per confidence rank of a prediction: (predictions compared, predictions the router then
    /// chose), the precision that decides how many of the ranks prefetch reads.
    ranks: Vec<(u64, u64)>,
    /// Experts already asked for in the current step.
    touched: FixedSet<Key>,
    trace: Option<Vec<TraceEvent>>,
    /// Tickets of the requests waiting for their turn, oldest first. A request that cannot be
    /// admitted at once takes a ticket; only the oldest may be admitted, so a request that
    /// needs the whole cache is not overtaken forever by smaller ones, and newcomers never jump
    /// the queue.
    queue: VecDeque<u64>,
    next_ticket: u64,
    /// Leases waiting for pinned experts to go so that what is cached fits their new size.
    lease_waiters: usize,
}

struct Shared {
    reader: Arc<dyn Reader>,
    specs: Vec<Vec<Vec<Piece>>>,
    /// Buffer bytes of each expert once read (payload plus alignment, the same for every
    /// expert of a layer).
    footprints: Vec<Vec<u64>>,
    /// Bytes one read of each expert takes from the disk (payload widened to the alignment).
    read_bytes: Vec<Vec<u64>>,
    prefetch_precision: f64,
    inner: Mutex<Inner>,
    cond: Condvar,
}

/// Serves the bytes of routed experts by (layer, expert id).
///
/// The handles returned by [`fetch`](ExpertStore::fetch) pin the bytes: a pinned expert is never
/// evicted. Memory held never exceeds the capacity: a request waits for other requests to release
/// pins rather than overrun it.
pub struct ExpertStore {
    shared: Arc<Shared>,
    pool: ReaderPool,
    max_footprint: u64,
}

impl std::fmt::Debug for ExpertStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ExpertStore({} bytes)", self.capacity())
    }
}

fn poisoned() -> StoreError {
    StoreError::Shared("expert cache lock poisoned by a panic in another thread".into())
}

impl ExpertStore {
    /// A store over `reader` where `specs[layer][expert]` lists the pieces of one expert (layers
    /// without routed experts have an empty list).
    ///
    /// Fails when the capacity cannot hold the largest expert of any layer.
    pub fn new(
        reader: Arc<dyn Reader>,
        specs: Vec<Vec<Vec<Piece>>>,
        cfg: ExpertStoreConfig,
    ) -> Result<ExpertStore, StoreError> {
        // One buffer size per layer, the largest of its experts (they differ by a page or so
        // where alignment falls differently), so that an evicted expert's buffer fits any other
        // expert of the layer and is read into again.
        let plans: Vec<Vec<(u64, u64)>> = specs
            .iter()
            .map(|layer| {
                layer
                    .iter()
                    .map(|pieces| {
                        let (runs, _, len) = plan_reads(reader.as_ref(), pieces);
                        (len as u64, runs.iter().map(|r| r.len).sum())
                    })
                    .collect()
            })
            .collect();
        let footprints: Vec<Vec<u64>> = plans
            .iter()
            .zip(&specs)
            .map(|(plan, layer)| {
                let max = plan.iter().map(|p| p.0).max().unwrap_or(0);
                layer
                    .iter()
                    .map(|pieces| if pieces.is_empty() { 0 } else { max })
                    .collect()
            })
            .collect();
        let read_bytes = plans
            .iter()
            .map(|plan| plan.iter().map(|p| p.1).collect())
            .collect();
        let max_footprint = footprints.iter().flatten().copied().max().unwrap_or(0);
        if cfg.capacity < max_footprint {
            return Err(StoreError::BudgetTooSmall {
                budget: cfg.capacity,
                minimum: max_footprint,
                what: "the expert cache cannot hold one expert".into(),
            });
        }
        let inner = Inner {
            entries: FixedMap::default(),
            policy: cfg.policy,
            used: 0,
            capacity: cfg.capacity,
            floor: max_footprint,
            stats: ExpertStats::default(),
            step: 0,
            predicted: FixedMap::default(),
            ranks: Vec::new(),
            touched: FixedSet::default(),
            trace: cfg.record_trace.then(Vec::new),
            queue: VecDeque::new(),
            next_ticket: 0,
            lease_waiters: 0,
        };
        let shared = Arc::new(Shared {
            reader,
            specs,
            footprints,
            read_bytes,
            prefetch_precision: cfg.prefetch_precision,
            inner: Mutex::new(inner),
            cond: Condvar::new(),
        });
        Ok(ExpertStore {
            shared,
            pool: ReaderPool::new(cfg.readers),
            max_footprint,
        })
    }

    /// A store that keeps every expert it reads (capacity for all of them), LRU-ordered.
    pub fn unbounded(
        reader: Arc<dyn Reader>,
        specs: Vec<Vec<Vec<Piece>>>,
    ) -> Result<ExpertStore, StoreError> {
        let cfg = ExpertStoreConfig {
            capacity: u64::MAX,
            policy: Box::new(crate::policy::Lru::default()),
            readers: 0,
            record_trace: false,
            prefetch_precision: PREFETCH_PRECISION,
        };
        ExpertStore::new(reader, specs, cfg)
    }

    /// The pieces of one expert.
    pub fn spec(&self, layer: usize, expert: u32) -> Result<&[Piece], StoreError> {
        self.shared.spec(layer, expert)
    }

    /// Bytes the cache may hold now (the configured capacity less what [`Lease`]s hold).
    pub fn capacity(&self) -> u64 {
        self.shared.inner.lock().map_or(0, |g| g.capacity)
    }

    /// Sets the least capacity that leases must leave (at least the largest expert's buffer,
    /// which is also the default).
    pub fn set_floor(&self, bytes: u64) {
        if let Ok(mut g) = self.shared.inner.lock() {
            g.floor = bytes.max(self.max_footprint);
        }
    }

    /// The least capacity leases must leave.
    pub fn floor(&self) -> u64 {
        self.shared.inner.lock().map_or(0, |g| g.floor)
    }

    /// An empty lease on the cache's capacity: memory a caller (a session's KV cache) takes
    /// from the expert cache as it grows, and gives back when the lease is dropped.
    pub fn lease(&self) -> Lease {
        Lease {
            shared: Arc::clone(&self.shared),
            bytes: 0,
        }
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.shared.inner.lock().map(|i| i.used).unwrap_or(0)
    }

    /// The largest expert's buffer size.
    pub fn max_footprint(&self) -> u64 {
        self.max_footprint
    }

    /// The policy's name.
    pub fn policy_name(&self) -> String {
        self.shared
            .inner
            .lock()
            .map(|i| i.policy.name().to_owned())
            .unwrap_or_default()
    }

    /// How many experts of `layer` can be pinned at once (the model fetches at most this many
    /// per call).
    pub fn max_pinned(&self, layer: usize) -> usize {
        let f = self
            .shared
            .footprints
            .get(layer)
            .and_then(|l| l.iter().max())
            .copied()
            .unwrap_or(0)
            .max(1);
        usize::try_from(self.capacity() / f)
            .unwrap_or(usize::MAX)
            .max(1)
    }

    /// Counters so far.
    pub fn stats(&self) -> ExpertStats {
        self.shared
            .inner
            .lock()
            .map(|i| i.stats.clone())
            .unwrap_or_default()
    }

    /// Marks the start of a forward step (a prefill chunk or one decoded token): hits on experts a
    /// prefetch reads from now on count as prefetch hits, not resident hits.
    pub fn begin_step(&self) {
        if let Ok(mut i) = self.shared.inner.lock() {
            i.step += 1;
            i.touched.clear();
        }
    }

    /// Takes the recorded trace (empty unless recording was asked for).
    pub fn take_trace(&self) -> Vec<TraceEvent> {
        self.shared
            .inner
            .lock()
            .ok()
            .and_then(|mut i| i.trace.as_mut().map(std::mem::take))
            .unwrap_or_default()
    }

    /// The bytes of the given experts of a layer, in the order asked. The handles pin the bytes
    /// until dropped. Misses are read in parallel, in file-offset order; an expert another
    /// request is already reading is waited for, not read twice.
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
    /// as it is in memory: first the ones already resident, then the misses in the order their
    /// reads land, as `(index into experts, bytes)`. The misses are read in parts of [`READ_PART`] bytes,
    /// in file-offset order, several parts in flight, so they land one after another and the
    /// caller computes with the first while the rest are still being read. Every expert asked
    /// for is pinned from this call until its handle is dropped; dropping the iterator early
    /// waits for the reads it started (nothing is left half-read).
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
    /// how many were taken and their arrivals. The capacity shrinks and grows as [`Lease`]s
    /// take and give back memory, so a caller that walks a layer's experts with this never
    /// asks for more than fits.
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
        let mut g = sh.inner.lock().map_err(|_| poisoned())?;
        let mut ticket: Option<u64> = None;
        let (n, ready, misses) = loop {
            let my_turn = match ticket {
                None => g.queue.is_empty(),
                Some(t) => g.queue.front() == Some(&t),
            };
            // The longest prefix whose distinct experts the capacity can hold at once.
            let (mut n, mut total) = (0, 0u64);
            let mut distinct: FixedSet<Key> = FixedSet::default();
            for k in &keys {
                if !distinct.contains(k) {
                    let f = sh.footprint(*k);
                    if total + f > g.capacity {
                        break;
                    }
                    total += f;
                    distinct.insert(*k);
                }
                n += 1;
            }
            if n == 0 || (whole && n < keys.len()) {
                if ticket.is_some() {
                    g.queue.retain(|&q| Some(q) != ticket);
                    sh.cond.notify_all();
                }
                let all: u64 = keys.iter().map(|k| sh.footprint(*k)).sum();
                return Err(StoreError::BudgetTooSmall {
                    budget: g.capacity,
                    minimum: all,
                    what: format!("{} experts of layer {layer} at once", keys.len()),
                });
            }
            let taken = &keys[..n];
            if my_turn
                && !taken
                    .iter()
                    .any(|k| matches!(g.entries.get(k), Some(Entry::Loading)))
            {
                let mut misses: Vec<Key> = taken
                    .iter()
                    .copied()
                    .filter(|k| !g.entries.contains_key(k))
                    .collect();
                misses.sort();
                misses.dedup();
                let need: u64 = misses.iter().map(|k| sh.footprint(*k)).sum();
                if sh.make_room(&mut g, need, taken, None, &mut spare) {
                    if ticket.is_some() {
                        // The next in line may now try.
                        g.queue.pop_front();
                        sh.cond.notify_all();
                    }
                    let rows = &rows[..n.min(rows.len())];
                    break (n, self.admit(&mut g, layer, taken, rows, &misses), misses);
                }
                // Evicted buffers are no use to a request that must wait: give them back.
                spare.clear();
            }
            if ticket.is_none() {
                let t = g.next_ticket;
                g.next_ticket += 1;
                g.queue.push_back(t);
                ticket = Some(t);
            }
            g = sh.cond.wait(g).map_err(|_| poisoned())?;
        };
        g.stats.wait_seconds += t0.elapsed().as_secs_f64();
        drop(g);

        // Read the misses, in file order, in parts on the reader pool. Each lands in the cache
        // on the thread that read its last part, pinned once for every index that asked for it.
        let mut order = misses;
        order.sort_by_key(|k| {
            sh.specs[k.layer as usize][k.expert as usize]
                .first()
                .map(|p| (p.shard, p.offset))
        });
        let (tx, rx) = mpsc::channel();
        let outstanding = order.len();
        // The indices that asked for each miss (an expert may be asked for more than once).
        let mut asked: FixedMap<Key, Vec<usize>> = FixedMap::default();
        for (i, k) in keys[..n].iter().enumerate() {
            asked.entry(*k).or_default().push(i);
        }
        for k in order {
            let idx = asked.remove(&k).unwrap_or_default();
            let tx = tx.clone();
            let land_sh = Arc::clone(&self.shared);
            read_blob_parts(
                &sh.reader,
                &sh.specs[k.layer as usize][k.expert as usize],
                take_spare(&mut spare, sh.footprint(k)),
                sh.footprint(k) as usize,
                READ_PART,
                &|job| self.pool.submit(job),
                Box::new(move |r| {
                    let landed = Shared::land(&land_sh, k, r, idx.len() as u32, None)
                        .map(|pins| idx.into_iter().zip(pins).collect());
                    // The receiver is gone only when the caller's thread unwound: the handles
                    // are dropped here, which unpins them.
                    let _ = tx.send(landed);
                }),
            );
        }
        Ok((
            n,
            Arrivals {
                shared: Arc::clone(&self.shared),
                ready,
                outstanding,
                rx,
            },
        ))
    }

    /// Accounts an admitted request (policy, statistics, trace, prefetch scoring), pins its
    /// hits and marks its misses as loading.
    fn admit(
        &self,
        g: &mut MutexGuard<'_, Inner>,
        layer: usize,
        keys: &[Key],
        rows: &[u32],
        misses: &[Key],
    ) -> VecDeque<(usize, Pinned)> {
        let sh = &self.shared;
        let step = g.step;
        let mut ready = VecDeque::new();
        let predicted = g
            .predicted
            .get_mut(&(layer as u32))
            .filter(|p| p.0 == step)
            .map(|p| (p.1.clone(), std::mem::replace(&mut p.2, true)));
        // Once per step and layer, score each rank of the prediction against the router. (When
        // a layer's experts come in several calls, because the cache cannot pin them all at
        // once, only the first call's share is seen: prefetch then trusts less, which suits
        // a cache that small.)
        if let Some((p, false)) = &predicted {
            if g.ranks.len() < p.len() {
                g.ranks.resize(p.len(), (0, 0));
            }
            for (r, e) in p.iter().enumerate() {
                g.ranks[r].0 += 1;
                g.ranks[r].1 += u64::from(keys.iter().any(|k| k.expert == *e));
            }
        }
        let predicted = predicted.map(|p| p.0);
        for (i, &k) in keys.iter().enumerate() {
            let inner = &mut **g;
            inner.stats.requests += 1;
            let n = rows.get(i).copied().unwrap_or(1);
            inner.policy.request(k, n);
            if inner.touched.insert(k) {
                inner.stats.touched += 1;
                inner.stats.touched_bytes += sh.footprint(k);
            }
            if let Some(t) = inner.trace.as_mut() {
                t.push(TraceEvent {
                    step,
                    layer: k.layer,
                    expert: k.expert,
                    rows: n,
                });
            }
            if let Some(p) = &predicted {
                inner.stats.prefetch_checked += 1;
                if p.contains(&k.expert) {
                    inner.stats.prefetch_predicted += 1;
                }
            }
            match inner.entries.get_mut(&k) {
                Some(Entry::Ready {
                    blob,
                    prefetched_step,
                    pins,
                    ..
                }) => {
                    inner.stats.hits += 1;
                    if *prefetched_step == Some(step) {
                        inner.stats.prefetch_hits += 1;
                    } else {
                        inner.stats.resident_hits += 1;
                    }
                    *pins += 1;
                    ready.push_back((i, Pinned::new(&self.shared, k, Arc::clone(blob))));
                    inner.policy.hit(k);
                }
                _ => inner.stats.misses += 1,
            }
        }
        for &k in misses {
            let bytes = sh.footprint(k);
            g.entries.insert(k, Entry::Loading);
            g.used += bytes;
            g.stats.reads += 1;
        }
        ready
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
    pub fn prefetch(&self, layer: usize, experts: &[u32]) {
        let sh = &self.shared;
        let Ok(mut g) = sh.inner.lock() else { return };
        let step = g.step;
        g.predicted
            .insert(layer as u32, (step, experts.to_vec(), false));
        if !g.queue.is_empty() {
            return;
        }
        let p = sh.prefetch_precision;
        let width = if p <= 0.0 {
            experts.len()
        } else {
            g.ranks
                .iter()
                .take_while(|&&(n, right)| n >= PREFETCH_WARMUP && right as f64 >= p * n as f64)
                .count()
        };
        let mut jobs = Vec::new();
        let mut spare = Vec::new();
        for &e in experts.iter().take(width) {
            let k = Key::new(layer, e);
            if sh.spec(layer, e).is_err() || g.entries.contains_key(&k) {
                continue;
            }
            let bytes = sh.footprint(k);
            if !sh.make_room(&mut g, bytes, &[k], Some(k), &mut spare) {
                break;
            }
            g.entries.insert(k, Entry::Loading);
            g.used += bytes;
            g.stats.reads += 1;
            g.stats.prefetch_reads += 1;
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
                &self.shared.reader,
                &self.shared.specs[k.layer as usize][k.expert as usize],
                take_spare(&mut spare, self.shared.footprint(k)),
                self.shared.footprint(k) as usize,
                READ_PART,
                &|job| self.pool.spawn(job),
                done,
            );
        }
    }

    /// Drops every unpinned expert (memory returns to the allocator).
    pub fn clear(&self) {
        let Ok(mut g) = self.shared.inner.lock() else {
            return;
        };
        let keys: Vec<Key> = g
            .entries
            .iter()
            .filter(|(_, e)| matches!(e, Entry::Ready { pins: 0, .. }))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            if let Some(Entry::Ready { bytes, .. }) = g.entries.remove(&k) {
                g.used -= bytes;
                g.policy.remove(k);
            }
        }
        drop(g);
        self.shared.cond.notify_all();
    }

    /// Requests waiting for their turn now (for tests and diagnostics).
    pub fn waiting(&self) -> usize {
        self.shared.inner.lock().map_or(0, |g| g.queue.len())
    }
}

/// A spare buffer of exactly `len` bytes, if there is one. Reading into the buffer of an expert
/// just evicted, rather than a fresh one, spares the kernel a page fault and a zeroed page for
/// every 4 KiB read (a million faults in a few seconds of streaming), and the unmap after.
fn take_spare(spare: &mut Vec<AlignedBuf>, len: u64) -> Option<AlignedBuf> {
    let i = spare.iter().position(|b| b.len() as u64 == len)?;
    Some(spare.swap_remove(i))
}

/// Predictions of a rank that must have been scored before prefetch trusts it.
pub const PREFETCH_WARMUP: u64 = 16;

/// Share of a rank's predictions that must have been right for prefetch to read that rank.
pub const PREFETCH_PRECISION: f64 = 0.8;

/// Parts of at most this many bytes are what the read of one expert is split into: small enough
/// that a layer's misses land one after another with several parts in flight, large enough that
/// each read is efficient (`sluice doctor` on the development machine, 4 in flight: 1.03 GB/s
/// for 1 MiB random reads, 1.01 and 1.16 GB/s for 4 and 16 MiB ones).
pub const READ_PART: u64 = 1 << 20;

impl Shared {
    fn spec(&self, layer: usize, expert: u32) -> Result<&[Piece], StoreError> {
        self.specs
            .get(layer)
            .and_then(|l| l.get(expert as usize))
            .filter(|p| !p.is_empty())
            .map(Vec::as_slice)
            .ok_or(StoreError::NoSuchExpert { layer, expert })
    }

    fn footprint(&self, k: Key) -> u64 {
        self.footprints[k.layer as usize][k.expert as usize]
    }

    /// Puts a finished read of `k` in the cache (`prefetched`: the step of the prefetch that
    /// read it), pinned `pins` times, or forgets the entry if the read failed; wakes every
    /// waiter either way. Returns the handles.
    fn land(
        sh: &Arc<Shared>,
        k: Key,
        r: Result<Blob, StoreError>,
        pins: u32,
        prefetched: Option<u64>,
    ) -> Result<Vec<Pinned>, StoreError> {
        let mut g = sh.inner.lock().map_err(|_| poisoned())?;
        let bytes = sh.footprint(k);
        let out = match r {
            Ok(blob) => {
                let blob = Arc::new(blob);
                g.stats.bytes_read += sh.read_bytes[k.layer as usize][k.expert as usize];
                g.entries.insert(
                    k,
                    Entry::Ready {
                        blob: Arc::clone(&blob),
                        bytes,
                        prefetched_step: prefetched,
                        pins,
                    },
                );
                g.policy.insert(k);
                Ok((0..pins)
                    .map(|_| Pinned::new(sh, k, Arc::clone(&blob)))
                    .collect())
            }
            Err(e) => {
                g.entries.remove(&k);
                g.used -= bytes;
                Err(e)
            }
        };
        drop(g);
        sh.cond.notify_all();
        out
    }

    /// Evicts unpinned experts (never one of `keep`) until `need` more bytes fit, putting their
    /// buffers in `spare` for the reads that need the room. False when pinned or in-flight
    /// experts leave too little room, or, for a speculative read of `guess`, at the first
    /// victim the policy would not give up for it.
    fn make_room(
        &self,
        g: &mut MutexGuard<'_, Inner>,
        need: u64,
        keep: &[Key],
        guess: Option<Key>,
        spare: &mut Vec<AlignedBuf>,
    ) -> bool {
        while g.used + need > g.capacity {
            let inner = &mut **g;
            let entries = &inner.entries;
            let victim = inner.policy.victim(&mut |k| {
                !keep.contains(&k) && matches!(entries.get(&k), Some(Entry::Ready { pins: 0, .. }))
            });
            let Some(v) = victim else { return false };
            if let Some(guess) = guess
                && !inner.policy.displaces(guess, v)
            {
                return false;
            }
            if let Some(Entry::Ready { bytes, blob, .. }) = inner.entries.remove(&v) {
                inner.used -= bytes;
                // Unpinned: every handle gave its reference back (under this lock) before the
                // pin count reached zero, so the buffer is free to be read into again.
                if let Ok(b) = Arc::try_unwrap(blob) {
                    spare.push(b.into_buf());
                }
            }
            inner.policy.remove(v);
            inner.stats.evictions += 1;
        }
        true
    }
}
