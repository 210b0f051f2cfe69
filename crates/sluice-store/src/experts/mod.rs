//! The expert store: routed experts read in place from the shards, behind a byte-budgeted cache
//! with a pluggable eviction policy, pins, single-flight reads, a reader pool and prefetch.
//!
//! One lock ([`Shared::inner`]) guards the state of every concern, each in its own module:
//! residency and eviction ([`cache`]), admission in turn ([`fetch`]), reads and their landing
//! ([`arrivals`]), lookahead learning ([`prefetch`]) and the counters ([`stats`]); the guards
//! that give back what they hold when dropped are in [`handles`].

use std::sync::{Arc, Condvar, Mutex};

use crate::io::{Piece, Reader, plan_reads};
use crate::policy::{Key, Policy};
use crate::pool::ReaderPool;
use crate::trace::TraceEvent;
use crate::{AlignedBuf, StoreError};

mod arrivals;
mod cache;
mod fetch;
mod handles;
mod prefetch;
mod stats;

pub use arrivals::Arrivals;
pub use handles::{Lease, Pinned};
pub use prefetch::{GUESS_MARGIN, GUESS_PROBE_EVERY, Guess};
pub use stats::ExpertStats;

use cache::Cache;
use fetch::Turns;
use prefetch::Lookahead;
use stats::Tally;

/// How to build an [`ExpertStore`].
pub struct ExpertStoreConfig {
    /// Bytes the cache may hold (buffers of resident and in-flight experts).
    pub capacity: u64,
    /// Eviction policy.
    pub policy: Box<dyn Policy>,
    /// Reader threads (0 reads on the caller's thread).
    pub readers: usize,
    /// Queue the reads of O_DIRECT shards on one io_uring (at most `readers` in flight, at
    /// least one) instead of handing them to the reader threads; an error where the kernel
    /// has no io_uring or refuses it.
    pub uring: bool,
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
            "ExpertStoreConfig({} bytes, {}, {} readers{})",
            self.capacity,
            self.policy.name(),
            self.readers,
            if self.uring { ", io_uring" } else { "" }
        )
    }
}

/// Everything under the store's lock, by concern.
struct Inner {
    /// Residency, bytes and eviction.
    cache: Cache,
    /// Requests and leases waiting for their turn.
    turns: Turns,
    /// Prefetch's predictions and how often they came true.
    lookahead: Lookahead,
    /// Counters and the trace.
    tally: Tally,
    /// The forward step (see [`ExpertStore::begin_step`]).
    step: u64,
}

impl Inner {
    /// Evicts unpinned experts (never one of `keep`) until `need` more bytes fit; see
    /// [`Cache::make_room`].
    fn make_room(
        &mut self,
        need: u64,
        keep: &[Key],
        guess: Option<Key>,
        spare: &mut Vec<AlignedBuf>,
    ) -> bool {
        self.cache
            .make_room(need, keep, guess, spare, &mut self.tally.stats)
    }
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
    /// With [`ExpertStoreConfig::uring`]: the ring reads of O_DIRECT shards go to.
    ring: Option<crate::ring::RingReader>,
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
        let (footprints, read_bytes) = sizes(reader.as_ref(), &specs);
        let max_footprint = footprints.iter().flatten().copied().max().unwrap_or(0);
        if cfg.capacity < max_footprint {
            return Err(StoreError::BudgetTooSmall {
                budget: cfg.capacity,
                minimum: max_footprint,
                what: "the expert cache cannot hold one expert".into(),
            });
        }
        let inner = Inner {
            cache: Cache::new(cfg.policy, cfg.capacity, max_footprint),
            turns: Turns::default(),
            lookahead: Lookahead::default(),
            tally: Tally::new(cfg.record_trace),
            step: 0,
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
        let ring = if cfg.uring {
            #[cfg(target_os = "linux")]
            let ring = crate::ring::RingReader::new(cfg.readers);
            #[cfg(not(target_os = "linux"))]
            let ring = Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "io_uring is Linux only",
            ));
            Some(ring.map_err(|source| StoreError::Ring {
                path: shared.reader.path(0).to_path_buf(),
                source,
            })?)
        } else {
            None
        };
        Ok(ExpertStore {
            shared,
            ring,
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
            uring: false,
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
        self.shared.inner.lock().map_or(0, |g| g.cache.capacity)
    }

    /// Sets the least capacity that leases must leave (at least the largest expert's buffer,
    /// which is also the default).
    pub fn set_floor(&self, bytes: u64) {
        if let Ok(mut g) = self.shared.inner.lock() {
            g.cache.floor = bytes.max(self.max_footprint);
        }
    }

    /// The least capacity leases must leave.
    pub fn floor(&self) -> u64 {
        self.shared.inner.lock().map_or(0, |g| g.cache.floor)
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
        self.shared.inner.lock().map(|i| i.cache.used).unwrap_or(0)
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
            .map(|i| i.cache.policy.name().to_owned())
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
            .map(|i| i.tally.stats.clone())
            .unwrap_or_default()
    }

    /// Marks the start of a forward step (a prefill chunk or one decoded token): hits on experts a
    /// prefetch reads from now on count as prefetch hits, not resident hits.
    pub fn begin_step(&self) {
        if let Ok(mut i) = self.shared.inner.lock() {
            i.step += 1;
            i.tally.begin_step();
        }
    }

    /// Takes the recorded trace (empty unless recording was asked for).
    pub fn take_trace(&self) -> Vec<TraceEvent> {
        self.shared
            .inner
            .lock()
            .ok()
            .map(|mut i| i.tally.take_trace())
            .unwrap_or_default()
    }

    /// Drops every unpinned expert (memory returns to the allocator).
    pub fn clear(&self) {
        let Ok(mut g) = self.shared.inner.lock() else {
            return;
        };
        g.cache.clear_unpinned();
        drop(g);
        self.shared.cond.notify_all();
    }

    /// Requests waiting for their turn now (for tests and diagnostics).
    pub fn waiting(&self) -> usize {
        self.shared.inner.lock().map_or(0, |g| g.turns.waiting())
    }
}

/// Predictions of a rank that must have been scored before prefetch trusts it.
pub const PREFETCH_WARMUP: u64 = 16;

/// Share of a rank's predictions that must have been right for prefetch to read that rank.
pub const PREFETCH_PRECISION: f64 = 0.8;

/// The same bar for a [`Guess::Late`] rank (unless prefetch reads every guess): a late read
/// lands only the next layer's attention earlier, while a wrong one costs a whole read, so it
/// pays only when wrong ones are rarer than that gain is to a read's time (on the 2.09 GiB
/// synthetic model of docs/PERFORMANCE.md a read takes ~2.6 ms and the attention it may
/// overlap a few tenths of one: the break-even is above 0.9).
pub const PREFETCH_PRECISION_LATE: f64 = 0.95;

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

    /// The share of a `stage` rank's guesses that must have been right for it to be read.
    fn precision(&self, stage: Guess) -> f64 {
        match stage {
            Guess::Late if self.prefetch_precision > 0.0 => {
                self.prefetch_precision.max(PREFETCH_PRECISION_LATE)
            }
            _ => self.prefetch_precision,
        }
    }

    fn footprint(&self, k: Key) -> u64 {
        self.footprints[k.layer as usize][k.expert as usize]
    }
}

/// The buffer bytes of each expert once read and the bytes one read of it takes from the disk
/// (its payload widened to the alignment). An expert's buffer is the largest of its layer's
/// (they differ by a page or so where alignment falls differently), so that an evicted
/// expert's buffer fits any other expert of the layer and is read into again.
fn sizes(reader: &dyn Reader, specs: &[Vec<Vec<Piece>>]) -> (Vec<Vec<u64>>, Vec<Vec<u64>>) {
    let plans: Vec<Vec<(u64, u64)>> = specs
        .iter()
        .map(|layer| {
            layer
                .iter()
                .map(|pieces| {
                    let (runs, _, len) = plan_reads(reader, pieces);
                    (len as u64, runs.iter().map(|r| r.len).sum())
                })
                .collect()
        })
        .collect();
    let footprints = plans
        .iter()
        .zip(specs)
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
    (footprints, read_bytes)
}
