//! Residency: which experts are in memory or being read, the bytes they hold against the
//! capacity, their pins, and eviction through the policy. Everything here runs under the
//! store's lock; nothing here waits or wakes anyone (the callers do, see [`super::Shared`]).

use std::sync::{Arc, mpsc};

use super::ExpertStats;
use super::arrivals::Landed;
use crate::AlignedBuf;
use crate::io::Blob;
use crate::policy::{FixedMap, Key, Policy};

/// One expert known to the cache.
pub(super) enum Entry {
    Ready {
        blob: Arc<Blob>,
        bytes: u64,
        /// The step of the prefetch that read it, if a prefetch did.
        prefetched_step: Option<u64>,
        /// Live [`Pinned`](super::Pinned) handles: a pinned entry is never evicted.
        pins: u32,
    },
    /// Being read; its bytes are already counted in [`Cache::used`].
    Loading {
        /// The step of the prefetch reading it, if a prefetch is.
        prefetched_step: Option<u64>,
        /// Requests admitted while it was being read, handed it when it lands.
        waiters: Vec<Waiter>,
    },
}

/// One expert of an admitted request that another read is bringing in: where to send it and
/// the index the request asked for it at.
pub(super) struct Waiter {
    pub(super) tx: mpsc::Sender<Landed>,
    pub(super) index: usize,
}

/// The resident and in-flight experts and the byte accounting behind them.
pub(super) struct Cache {
    pub(super) entries: FixedMap<Key, Entry>,
    pub(super) policy: Box<dyn Policy>,
    /// Bytes held: buffers of resident experts and of reads in flight.
    pub(super) used: u64,
    /// Bytes the cache may hold now: the configured capacity less what is lent out
    /// ([`Lease`](super::Lease)s: sessions' KV pages).
    pub(super) capacity: u64,
    /// The capacity never goes below this.
    pub(super) floor: u64,
}

impl Cache {
    pub(super) fn new(policy: Box<dyn Policy>, capacity: u64, floor: u64) -> Cache {
        Cache {
            entries: FixedMap::default(),
            policy,
            used: 0,
            capacity,
            floor,
        }
    }

    /// Counts `bytes` for a read of `k` about to be issued (by a prefetch in `prefetched_step`,
    /// or on demand).
    pub(super) fn start_loading(&mut self, k: Key, bytes: u64, prefetched_step: Option<u64>) {
        self.entries.insert(
            k,
            Entry::Loading {
                prefetched_step,
                waiters: Vec::new(),
            },
        );
        self.used += bytes;
    }

    /// If `k` is being read, has its landing sent to `waiter` too and returns the step of
    /// the prefetch reading it (`Some(None)` for a demand read).
    pub(super) fn await_read(&mut self, k: Key, waiter: Waiter) -> Option<Option<u64>> {
        match self.entries.get_mut(&k) {
            Some(Entry::Loading {
                prefetched_step,
                waiters,
            }) => {
                waiters.push(waiter);
                Some(*prefetched_step)
            }
            _ => None,
        }
    }

    /// The requests waiting for the read of `k` (none unless it is being read).
    pub(super) fn take_waiters(&mut self, k: Key) -> Vec<Waiter> {
        match self.entries.get_mut(&k) {
            Some(Entry::Loading { waiters, .. }) => std::mem::take(waiters),
            _ => Vec::new(),
        }
    }

    /// Makes the finished read of `k` resident, pinned `pins` times.
    pub(super) fn land(
        &mut self,
        k: Key,
        blob: Arc<Blob>,
        bytes: u64,
        pins: u32,
        prefetched_step: Option<u64>,
    ) {
        self.entries.insert(
            k,
            Entry::Ready {
                blob,
                bytes,
                prefetched_step,
                pins,
            },
        );
        self.policy.insert(k);
    }

    /// Forgets the failed read of `k` and the `bytes` it was counted for.
    pub(super) fn forget(&mut self, k: Key, bytes: u64) {
        self.entries.remove(&k);
        self.used -= bytes;
    }

    /// Pins `k` if it is resident and tells the policy of the hit: its bytes, and the step of
    /// the prefetch that read it.
    pub(super) fn pin(&mut self, k: Key) -> Option<(Arc<Blob>, Option<u64>)> {
        let Some(Entry::Ready {
            blob,
            prefetched_step,
            pins,
            ..
        }) = self.entries.get_mut(&k)
        else {
            return None;
        };
        *pins += 1;
        let out = (Arc::clone(blob), *prefetched_step);
        self.policy.hit(k);
        Some(out)
    }

    /// Gives back one pin of `k`; true when that was its last.
    pub(super) fn unpin(&mut self, k: Key) -> bool {
        match self.entries.get_mut(&k) {
            Some(Entry::Ready { pins, .. }) => {
                *pins = pins.saturating_sub(1);
                *pins == 0
            }
            _ => false,
        }
    }

    /// Evicts unpinned experts (never one of `keep`) until `need` more bytes fit, putting their
    /// buffers in `spare` for the reads that need the room. False when pinned or in-flight
    /// experts leave too little room, or, for a speculative read of `guess`, at the first
    /// victim the policy would not give up for it.
    pub(super) fn make_room(
        &mut self,
        need: u64,
        keep: &[Key],
        guess: Option<Key>,
        spare: &mut Vec<AlignedBuf>,
        stats: &mut ExpertStats,
    ) -> bool {
        while self.used + need > self.capacity {
            let entries = &self.entries;
            let evictable = |k: Key| {
                !keep.contains(&k) && matches!(entries.get(&k), Some(Entry::Ready { pins: 0, .. }))
            };
            // A policy that names no victim while one exists would leave a request waiting
            // for room that nothing frees (S3-FIFO once did): the least key goes instead.
            let victim = self
                .policy
                .victim(&mut |k| evictable(k))
                .or_else(|| entries.keys().copied().filter(|&k| evictable(k)).min());
            let Some(v) = victim else { return false };
            if let Some(guess) = guess
                && !self.policy.displaces(guess, v)
            {
                return false;
            }
            if let Some(Entry::Ready { bytes, blob, .. }) = self.entries.remove(&v) {
                self.used -= bytes;
                // Unpinned: every handle gave its reference back (under this lock) before the
                // pin count reached zero, so the buffer is free to be read into again.
                if let Ok(b) = Arc::try_unwrap(blob) {
                    spare.push(b.into_buf());
                }
            }
            self.policy.remove(v);
            stats.evictions += 1;
        }
        true
    }

    /// Drops every unpinned expert (their memory returns to the allocator).
    pub(super) fn clear_unpinned(&mut self) {
        let keys: Vec<Key> = self
            .entries
            .iter()
            .filter(|(_, e)| matches!(e, Entry::Ready { pins: 0, .. }))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            if let Some(Entry::Ready { bytes, .. }) = self.entries.remove(&k) {
                self.used -= bytes;
                self.policy.remove(k);
            }
        }
    }
}

/// A spare buffer of exactly `len` bytes, if there is one. Reading into the buffer of an expert
/// just evicted, rather than a fresh one, spares the kernel a page fault and a zeroed page for
/// every 4 KiB read (a million faults in a few seconds of streaming), and the unmap after.
pub(super) fn take_spare(spare: &mut Vec<AlignedBuf>, len: u64) -> Option<AlignedBuf> {
    let i = spare.iter().position(|b| b.len() as u64 == len)?;
    Some(spare.swap_remove(i))
}
