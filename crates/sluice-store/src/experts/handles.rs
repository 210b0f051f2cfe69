//! The handles the expert store gives out: [`Pinned`] experts, the [`Arrivals`] of one request,
//! and [`Lease`]s on the cache's capacity. Each gives back what it holds when dropped, under the
//! store's lock, and wakes whoever waits for it.

use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::sync::{Arc, mpsc};
use std::time::Instant;

use super::{Entry, Shared, poisoned};
use crate::StoreError;
use crate::io::Blob;
use crate::policy::Key;

/// The bytes of one cached expert, pinned: while a handle lives the expert is never evicted.
/// Dropping the last handle of an expert wakes the requests waiting for room.
pub struct Pinned {
    /// Released in `drop`, under the store's lock.
    blob: ManuallyDrop<Arc<Blob>>,
    key: Key,
    shared: Arc<Shared>,
}

impl Pinned {
    pub(super) fn new(shared: &Arc<Shared>, key: Key, blob: Arc<Blob>) -> Pinned {
        Pinned {
            blob: ManuallyDrop::new(blob),
            key,
            shared: Arc::clone(shared),
        }
    }

    /// The expert this handle pins.
    pub fn key(&self) -> Key {
        self.key
    }
}

impl std::ops::Deref for Pinned {
    type Target = Blob;

    fn deref(&self) -> &Blob {
        &self.blob
    }
}

impl std::fmt::Debug for Pinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Pinned(layer {} expert {}, {:?})",
            self.key.layer, self.key.expert, self.blob
        )
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let sh = &self.shared;
        // Under the lock, so that a waiter cannot miss the wake-up, and the handle's reference
        // goes before the entry becomes evictable (its buffer can then be read into again).
        let mut g = match sh.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        // SAFETY: `blob` is taken exactly once, here, and `self` is not used after `drop`.
        drop(unsafe { ManuallyDrop::take(&mut self.blob) });
        let unpinned = match g.entries.get_mut(&self.key) {
            Some(Entry::Ready { pins, .. }) => {
                *pins = pins.saturating_sub(1);
                *pins == 0
            }
            _ => false,
        };
        let wake = unpinned && (!g.queue.is_empty() || g.lease_waiters > 0);
        drop(g);
        if wake {
            sh.cond.notify_all();
        }
    }
}

/// Memory lent out of the expert cache's capacity — a session's KV pages — and given back
/// when the lease is dropped (or shrunk). While lent it is not the cache's: the cache evicts
/// by its policy to make room, never below its floor.
pub struct Lease {
    pub(super) shared: Arc<Shared>,
    pub(super) bytes: u64,
}

impl Lease {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Grows the lease to `bytes` in all, taking the difference from the cache's capacity:
    /// unpinned experts are evicted by the policy until what the cache holds fits again, and
    /// if pinned ones are in the way, this waits for their pins to be dropped (holding none
    /// itself, like a request; nothing new is admitted meanwhile), so the cache and the
    /// leases together never hold more than the configured capacity. Fails at once, changing
    /// nothing, when the capacity would fall below the floor.
    ///
    /// Like a request, a caller must not hold a [`Pinned`] handle while growing a lease.
    pub fn grow_to(&mut self, bytes: u64) -> Result<(), StoreError> {
        if bytes <= self.bytes {
            return Ok(());
        }
        let extra = bytes - self.bytes;
        let sh = &self.shared;
        let mut g = sh.inner.lock().map_err(|_| poisoned())?;
        let free = g.capacity.saturating_sub(g.floor);
        if extra > free {
            return Err(StoreError::NoRoom {
                wanted: extra,
                free,
                floor: g.floor,
            });
        }
        g.capacity -= extra;
        self.bytes = bytes;
        // Evict what no longer fits (its buffers are freed: the memory is the lease's now).
        loop {
            let mut spare = Vec::new();
            let fits = sh.make_room(&mut g, 0, &[], None, &mut spare);
            drop(spare);
            if fits {
                return Ok(());
            }
            g.lease_waiters += 1;
            let woken = sh.cond.wait(g);
            g = match woken {
                Ok(g) => g,
                Err(_) => return Err(poisoned()),
            };
            g.lease_waiters -= 1;
        }
    }

    /// Gives back everything above `bytes`.
    pub fn shrink_to(&mut self, bytes: u64) {
        if bytes >= self.bytes {
            return;
        }
        let back = self.bytes - bytes;
        self.bytes = bytes;
        let sh = &self.shared;
        let mut g = match sh.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        g.capacity += back;
        drop(g);
        sh.cond.notify_all();
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lease({} bytes)", self.bytes)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.shrink_to(0);
    }
}

/// What a read that landed sends to its request: a handle per index that asked for the
/// expert, or the read's error.
type Landed = Result<Vec<(usize, Pinned)>, StoreError>;

/// The experts of one [`fetch_each`](ExpertStore::fetch_each) call as they arrive in memory:
/// `(index into the experts asked for, bytes)`, or the error of a read that failed (that expert
/// is not cached; the others still arrive).
pub struct Arrivals {
    pub(super) shared: Arc<Shared>,
    pub(super) ready: VecDeque<(usize, Pinned)>,
    /// Misses still being read.
    pub(super) outstanding: usize,
    pub(super) rx: mpsc::Receiver<Landed>,
}

impl std::fmt::Debug for Arrivals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Arrivals({} ready, {} being read)",
            self.ready.len(),
            self.outstanding
        )
    }
}

impl Arrivals {
    /// Waits for the next read to land (the reader thread has already cached it, or forgotten
    /// it if it failed).
    fn land_next(&mut self) -> Result<(), StoreError> {
        let t0 = Instant::now();
        let r = self.rx.recv().map_err(|_| {
            self.outstanding = 0;
            StoreError::Shared("the reader pool stopped with reads outstanding".into())
        })?;
        self.outstanding -= 1;
        if let Ok(mut g) = self.shared.inner.lock() {
            g.stats.wait_seconds += t0.elapsed().as_secs_f64();
        }
        self.ready.extend(r?);
        Ok(())
    }
}

impl Iterator for Arrivals {
    type Item = Result<(usize, Pinned), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(x) = self.ready.pop_front() {
                return Some(Ok(x));
            }
            if self.outstanding == 0 {
                return None;
            }
            if let Err(e) = self.land_next() {
                return Some(Err(e));
            }
        }
    }
}

impl Drop for Arrivals {
    fn drop(&mut self) {
        // The reads land whether or not anyone waits; waiting keeps "nothing in flight once
        // the call is over" true for the caller.
        while self.outstanding > 0 {
            let _ = self.land_next();
        }
    }
}
