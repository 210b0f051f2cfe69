//! The trunk: parts (one per layer, plus the head) either pinned in memory or streamed through a
//! ring of one or two slots, the next part read while the current one computes.
//!
//! Not LRU: on the cyclic scan of a forward pass LRU never hits. Pinned parts stay; every other
//! part passes through the ring each forward pass.

use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use crate::StoreError;
use crate::io::{Blob, Piece, Reader, plan_reads, read_blob};
use crate::pool::ReaderPool;

/// Checks a part's bytes after every read (e.g. a checksum from a packed trunk's manifest).
pub type Verifier = Arc<dyn Fn(usize, &Blob) -> Result<(), StoreError> + Send + Sync>;

/// Counters of the trunk store.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrunkStats {
    /// Parts asked for.
    pub requests: u64,
    /// Parts served from memory (pinned, or already in the ring).
    pub hits: u64,
    /// Bytes read from disk for streamed parts (including alignment).
    pub bytes_read: u64,
    /// Seconds spent waiting for streamed parts.
    pub wait_seconds: f64,
}

enum Slot {
    Empty,
    Loading(usize),
    Ready(usize, Arc<Blob>),
}

struct Ring {
    slots: Vec<Slot>,
    stats: TrunkStats,
    /// Tickets of the requests waiting for a free slot, oldest first: slots go to them in the
    /// order they asked, and a newcomer never takes a slot while someone waits.
    queue: VecDeque<u64>,
    next_ticket: u64,
}

struct Shared {
    reader: Arc<dyn Reader>,
    parts: Vec<Vec<Piece>>,
    verify: Option<Verifier>,
    ring: Mutex<Ring>,
    cond: Condvar,
}

/// Serves trunk parts by index.
pub struct TrunkStore {
    shared: Arc<Shared>,
    pinned: Vec<Option<Arc<Blob>>>,
    pool: ReaderPool,
}

impl std::fmt::Debug for TrunkStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pinned = self.pinned.iter().filter(|p| p.is_some()).count();
        write!(
            f,
            "TrunkStore({} parts, {pinned} pinned, ring of {})",
            self.shared.parts.len(),
            self.ring_slots()
        )
    }
}

fn poisoned() -> StoreError {
    StoreError::Shared("trunk ring lock poisoned by a panic in another thread".into())
}

/// Buffer bytes of a part once read.
pub fn part_footprint(reader: &dyn Reader, pieces: &[Piece]) -> u64 {
    plan_reads(reader, pieces).2 as u64
}

impl TrunkStore {
    /// Reads the parts whose `pin[i]` is true now (verifying them) and streams the others
    /// through `ring_slots` slots (0 only when everything is pinned).
    pub fn new(
        reader: Arc<dyn Reader>,
        parts: Vec<Vec<Piece>>,
        pin: &[bool],
        ring_slots: usize,
        verify: Option<Verifier>,
    ) -> Result<TrunkStore, StoreError> {
        let streamed = pin.iter().filter(|p| !**p).count();
        let ring_slots = if streamed == 0 { 0 } else { ring_slots.max(1) };
        let mut pinned = Vec::with_capacity(parts.len());
        for (i, pieces) in parts.iter().enumerate() {
            if pin.get(i).copied().unwrap_or(true) {
                let b = read_blob(reader.as_ref(), pieces)?;
                if let Some(v) = &verify {
                    v(i, &b)?;
                }
                pinned.push(Some(Arc::new(b)));
            } else {
                pinned.push(None);
            }
        }
        let ring = Ring {
            slots: (0..ring_slots).map(|_| Slot::Empty).collect(),
            stats: TrunkStats::default(),
            queue: VecDeque::new(),
            next_ticket: 0,
        };
        // One reader thread streams the next part while the current one computes.
        let pool = ReaderPool::new(usize::from(ring_slots > 1));
        Ok(TrunkStore {
            shared: Arc::new(Shared {
                reader,
                parts,
                verify,
                ring: Mutex::new(ring),
                cond: Condvar::new(),
            }),
            pinned,
            pool,
        })
    }

    /// Slots of the streaming ring.
    pub fn ring_slots(&self) -> usize {
        self.shared.ring.lock().map(|r| r.slots.len()).unwrap_or(0)
    }

    /// Whether part `i` is pinned.
    pub fn is_pinned(&self, i: usize) -> bool {
        self.pinned.get(i).is_some_and(Option::is_some)
    }

    /// Counters so far.
    pub fn stats(&self) -> TrunkStats {
        self.shared
            .ring
            .lock()
            .map(|r| r.stats.clone())
            .unwrap_or_default()
    }

    /// Part `i`'s bytes. A streamed part is read into a free ring slot unless it is already
    /// there or on its way; the handle keeps the slot busy until dropped, and dropping it wakes
    /// the requests waiting for a slot. Requests that need a slot get one in the order they
    /// asked. Callers must not hold one part while asking for another, or two streams could
    /// wait on each other.
    pub fn part(&self, i: usize) -> Result<TrunkPart, StoreError> {
        if let Some(Some(b)) = self.pinned.get(i) {
            if let Ok(mut r) = self.shared.ring.lock() {
                r.stats.requests += 1;
                r.stats.hits += 1;
            }
            return Ok(TrunkPart::pinned(b));
        }
        if i >= self.shared.parts.len() {
            return Err(StoreError::Shared(format!("no trunk part {i}")));
        }
        let sh = &self.shared;
        let t0 = Instant::now();
        let mut r = sh.ring.lock().map_err(|_| poisoned())?;
        r.stats.requests += 1;
        let mut counted_hit = false;
        let mut ticket: Option<u64> = None;
        loop {
            // A part already in the ring, or on its way, takes no slot: no turn needed.
            if let Some(b) = r.slots.iter().find_map(|s| match s {
                Slot::Ready(p, b) if *p == i => Some(Arc::clone(b)),
                _ => None,
            }) {
                if !counted_hit {
                    r.stats.hits += 1;
                }
                r.stats.wait_seconds += t0.elapsed().as_secs_f64();
                if let Some(t) = ticket {
                    r.queue.retain(|&q| q != t);
                    drop(r);
                    sh.cond.notify_all();
                }
                return Ok(TrunkPart::streamed(sh, b));
            }
            let loading = r
                .slots
                .iter()
                .any(|s| matches!(s, Slot::Loading(p) if *p == i));
            if loading && !counted_hit {
                // A prefetch is bringing it: that counts as a hit for the ring.
                r.stats.hits += 1;
                counted_hit = true;
            }
            let my_turn = match ticket {
                None => r.queue.is_empty(),
                Some(t) => r.queue.front() == Some(&t),
            };
            let free = if loading || !my_turn {
                None
            } else {
                free_slot(&r.slots)
            };
            let Some(slot) = free else {
                if ticket.is_none() && !loading {
                    let t = r.next_ticket;
                    r.next_ticket += 1;
                    r.queue.push_back(t);
                    ticket = Some(t);
                }
                r = sh.cond.wait(r).map_err(|_| poisoned())?;
                continue;
            };
            if ticket.is_some() {
                r.queue.pop_front();
            }
            r.slots[slot] = Slot::Loading(i);
            drop(r);
            // The next in line may look for another slot.
            sh.cond.notify_all();
            let res = sh.load(i);
            let mut r = sh.ring.lock().map_err(|_| poisoned())?;
            let out = match res {
                Ok(b) => {
                    let b = Arc::new(b);
                    r.stats.bytes_read += b.footprint() as u64;
                    r.slots[slot] = Slot::Ready(i, Arc::clone(&b));
                    Ok(TrunkPart::streamed(sh, b))
                }
                Err(e) => {
                    r.slots[slot] = Slot::Empty;
                    Err(e)
                }
            };
            r.stats.wait_seconds += t0.elapsed().as_secs_f64();
            drop(r);
            sh.cond.notify_all();
            return out;
        }
    }

    /// Part `i` if it is in memory now (pinned or ready in the ring), without waiting or reading.
    pub fn try_part(&self, i: usize) -> Option<TrunkPart> {
        if let Some(Some(b)) = self.pinned.get(i) {
            return Some(TrunkPart::pinned(b));
        }
        let r = self.shared.ring.lock().ok()?;
        r.slots.iter().find_map(|s| match s {
            Slot::Ready(p, b) if *p == i => Some(TrunkPart::streamed(&self.shared, Arc::clone(b))),
            _ => None,
        })
    }

    /// Starts reading streamed part `i` into a free ring slot in the background (nothing when it
    /// is pinned, already there, or no slot is free).
    pub fn prefetch(&self, i: usize) {
        if self.is_pinned(i) || i >= self.shared.parts.len() {
            return;
        }
        let sh = &self.shared;
        let Ok(mut r) = sh.ring.lock() else { return };
        // A slot someone waits for is theirs, not a guess's.
        if !r.queue.is_empty() {
            return;
        }
        if r.slots
            .iter()
            .any(|s| matches!(s, Slot::Loading(p) | Slot::Ready(p, _) if *p == i))
        {
            return;
        }
        let Some(slot) = free_slot(&r.slots) else {
            return;
        };
        r.slots[slot] = Slot::Loading(i);
        drop(r);
        let sh = Arc::clone(&self.shared);
        self.pool.spawn(move || {
            let res = sh.load(i);
            if let Ok(mut r) = sh.ring.lock() {
                match res {
                    Ok(b) => {
                        r.stats.bytes_read += b.footprint() as u64;
                        r.slots[slot] = Slot::Ready(i, Arc::new(b));
                    }
                    // A failed prefetch leaves the slot empty: the demand read tries again
                    // and reports its own error.
                    Err(_) => r.slots[slot] = Slot::Empty,
                }
            }
            sh.cond.notify_all();
        });
    }
}

/// The bytes of one trunk part. A part streamed through the ring keeps its slot busy while a
/// handle lives; dropping the last one frees the slot and wakes the requests waiting for it.
pub struct TrunkPart {
    /// Released in `drop`, under the ring's lock for a streamed part.
    blob: ManuallyDrop<Arc<Blob>>,
    /// The ring, for a streamed part.
    ring: Option<Arc<Shared>>,
}

impl TrunkPart {
    fn pinned(b: &Arc<Blob>) -> TrunkPart {
        TrunkPart {
            blob: ManuallyDrop::new(Arc::clone(b)),
            ring: None,
        }
    }

    fn streamed(sh: &Arc<Shared>, b: Arc<Blob>) -> TrunkPart {
        TrunkPart {
            blob: ManuallyDrop::new(b),
            ring: Some(Arc::clone(sh)),
        }
    }
}

impl std::ops::Deref for TrunkPart {
    type Target = Blob;

    fn deref(&self) -> &Blob {
        &self.blob
    }
}

impl std::fmt::Debug for TrunkPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TrunkPart({:?})", *self.blob)
    }
}

impl Drop for TrunkPart {
    fn drop(&mut self) {
        // SAFETY: `blob` is taken exactly once, here, and `self` is not used after `drop`.
        let blob = unsafe { ManuallyDrop::take(&mut self.blob) };
        let Some(sh) = &self.ring else { return };
        // Under the lock, so that a waiter that has just found every slot busy cannot miss
        // the wake-up.
        let r = match sh.ring.lock() {
            Ok(r) => r,
            Err(p) => p.into_inner(),
        };
        drop(blob);
        let wake = !r.queue.is_empty();
        drop(r);
        if wake {
            sh.cond.notify_all();
        }
    }
}

/// An empty slot, else one whose part nobody holds.
fn free_slot(slots: &[Slot]) -> Option<usize> {
    slots
        .iter()
        .position(|s| matches!(s, Slot::Empty))
        .or_else(|| {
            slots
                .iter()
                .position(|s| matches!(s, Slot::Ready(_, b) if Arc::strong_count(b) == 1))
        })
}

impl Shared {
    fn load(&self, i: usize) -> Result<Blob, StoreError> {
        let b = read_blob(self.reader.as_ref(), &self.parts[i])?;
        if let Some(v) = &self.verify {
            v(i, &b)?;
        }
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ShardSet;

    fn setup(n: usize, size: u64) -> (tempfile::NamedTempFile, Arc<ShardSet>, Vec<Vec<Piece>>) {
        let f = tempfile::NamedTempFile::new().unwrap();
        let bytes: Vec<u8> = (0..n as u64 * size).map(|i| (i % 253) as u8).collect();
        std::fs::write(f.path(), &bytes).unwrap();
        let set = Arc::new(ShardSet::open(&[f.path()], true).unwrap());
        let parts = (0..n as u64)
            .map(|i| {
                vec![Piece {
                    shard: 0,
                    offset: i * size,
                    len: size,
                }]
            })
            .collect();
        (f, set, parts)
    }

    #[test]
    fn streams_through_the_ring_in_order_with_prefetch() {
        let (_f, set, parts) = setup(6, 100_000);
        for slots in [1, 2] {
            let pin = [true, false, false, true, false, false];
            let t = TrunkStore::new(set.clone(), parts.clone(), &pin, slots, None).unwrap();
            assert_eq!(t.ring_slots(), slots);
            for _pass in 0..3 {
                for i in 0..6 {
                    let b = t.part(i).unwrap();
                    assert_eq!(b.piece(0)[0], ((i as u64 * 100_000) % 253) as u8);
                    t.prefetch((i + 1) % 6);
                }
            }
            let s = t.stats();
            assert_eq!(s.requests, 18);
            if slots == 2 {
                // Prefetch brings every streamed part but the very first before it is asked for.
                assert!(s.hits >= 18 - 1, "{s:?}");
            }
        }
    }

    #[test]
    fn verifier_failures_are_reported() {
        let (_f, set, parts) = setup(3, 5000);
        let v: Verifier = Arc::new(|i, _b| {
            if i == 2 {
                Err(StoreError::Shared(format!("part {i} corrupt")))
            } else {
                Ok(())
            }
        });
        assert!(
            TrunkStore::new(
                set.clone(),
                parts.clone(),
                &[true, true, true],
                1,
                Some(v.clone())
            )
            .is_err()
        );
        let t = TrunkStore::new(set, parts, &[true, true, false], 2, Some(v)).unwrap();
        assert!(t.part(0).is_ok());
        t.prefetch(2);
        let e = t.part(2).unwrap_err();
        assert!(e.to_string().contains("part 2 corrupt"), "{e}");
    }
}
