//! The guards the expert store gives out: [`Pinned`] experts (the pin guard) and [`Lease`]s on
//! the cache's capacity. Each gives back what it holds when dropped, under the store's lock,
//! and wakes whoever waits for it. (The third handle, a request's
//! [`Arrivals`](super::Arrivals), lives with the reads in [`super::arrivals`].)

use std::mem::ManuallyDrop;
use std::sync::Arc;

use super::{Shared, poisoned};
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
        let unpinned = g.cache.unpin(self.key);
        let wake = unpinned && g.turns.anyone_waits();
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
        let free = g.cache.capacity.saturating_sub(g.cache.floor);
        if extra > free {
            return Err(StoreError::NoRoom {
                wanted: extra,
                free,
                floor: g.cache.floor,
            });
        }
        g.cache.capacity -= extra;
        self.bytes = bytes;
        // Evict what no longer fits (its buffers are freed: the memory is the lease's now).
        loop {
            let mut spare = Vec::new();
            let fits = g.make_room(0, &[], None, &mut spare);
            drop(spare);
            if fits {
                return Ok(());
            }
            g.turns.lease_waiters += 1;
            let woken = sh.cond.wait(g);
            g = match woken {
                Ok(g) => g,
                Err(_) => return Err(poisoned()),
            };
            g.turns.lease_waiters -= 1;
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
        g.cache.capacity += back;
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
