//! Reads and their landing: a request's misses go to the reader pool in file order, each
//! lands in the cache on the reader thread that read its last part (pinned for the request
//! that asked), and the request's [`Arrivals`] hand the experts over as they land.

use std::collections::VecDeque;
use std::sync::{Arc, mpsc};
use std::time::Instant;

use super::cache::take_spare;
use super::{ExpertStore, READ_PART, Shared, poisoned};
use crate::io::{Blob, read_blob_parts};
use crate::policy::{FixedMap, Key};
use crate::{AlignedBuf, Pinned, StoreError};

impl ExpertStore {
    /// Reads the `misses` of an admitted request for `taken`, in file order, in parts on the
    /// reader pool. Each lands in the cache on the thread that read its last part, pinned once
    /// for every index that asked for it; `ready` holds the hits, already pinned. `awaited`
    /// experts of the request are being read by others, who send them to `tx` as they land.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn read_misses(
        &self,
        taken: &[Key],
        misses: Vec<Key>,
        ready: VecDeque<(usize, Pinned)>,
        mut spare: Vec<AlignedBuf>,
        (tx, rx): (mpsc::Sender<Landed>, mpsc::Receiver<Landed>),
        awaited: usize,
    ) -> Arrivals {
        let sh = &self.shared;
        let mut order = misses;
        order.sort_by_key(|k| {
            sh.specs[k.layer as usize][k.expert as usize]
                .first()
                .map(|p| (p.shard, p.offset))
        });
        let outstanding = order.len() + awaited;
        // The indices that asked for each miss (an expert may be asked for more than once).
        let mut asked: FixedMap<Key, Vec<usize>> = FixedMap::default();
        for (i, k) in taken.iter().enumerate() {
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
                self.ring.as_ref().map(|r| (r, true)),
                Box::new(move |r| {
                    let landed = Shared::land(&land_sh, k, r, idx.len() as u32, None)
                        .map(|pins| idx.into_iter().zip(pins).collect());
                    // The receiver is gone only when the caller's thread unwound: the handles
                    // are dropped here, which unpins them.
                    let _ = tx.send(landed);
                }),
            );
        }
        Arrivals {
            shared: Arc::clone(&self.shared),
            ready,
            outstanding,
            rx,
        }
    }
}

impl Shared {
    /// Puts a finished read of `k` in the cache (`prefetched`: the step of the prefetch that
    /// read it), pinned `pins` times for the caller and once for each request admitted while
    /// it was being read (those are sent theirs), or forgets the entry if the read failed
    /// (the waiting requests are sent the error); wakes every waiter either way. Returns the
    /// caller's handles.
    pub(super) fn land(
        sh: &Arc<Shared>,
        k: Key,
        r: Result<Blob, StoreError>,
        pins: u32,
        prefetched: Option<u64>,
    ) -> Result<Vec<Pinned>, StoreError> {
        let mut g = sh.inner.lock().map_err(|_| poisoned())?;
        let bytes = sh.footprint(k);
        let waiters = g.cache.take_waiters(k);
        let mut sends: Vec<(mpsc::Sender<Landed>, Landed)> = Vec::with_capacity(waiters.len());
        let out = match r {
            Ok(blob) => {
                let blob = Arc::new(blob);
                g.tally.stats.bytes_read += sh.read_bytes[k.layer as usize][k.expert as usize];
                let all = pins + waiters.len() as u32;
                g.cache.land(k, Arc::clone(&blob), bytes, all, prefetched);
                for w in waiters {
                    // As if the request had pinned it on arrival.
                    g.cache.policy.hit(k);
                    let pinned = Pinned::new(sh, k, Arc::clone(&blob));
                    sends.push((w.tx, Ok(vec![(w.index, pinned)])));
                }
                Ok((0..pins)
                    .map(|_| Pinned::new(sh, k, Arc::clone(&blob)))
                    .collect())
            }
            Err(e) => {
                g.cache.forget(k, bytes);
                for w in waiters {
                    sends.push((w.tx, Err(StoreError::Shared(e.to_string()))));
                }
                Err(e)
            }
        };
        drop(g);
        // Outside the lock: a handle whose request is gone unpins (which locks) as it drops.
        for (tx, landed) in sends {
            let _ = tx.send(landed);
        }
        sh.cond.notify_all();
        out
    }
}

/// What a read that landed sends to its request: a handle per index that asked for the
/// expert, or the read's error.
pub(super) type Landed = Result<Vec<(usize, Pinned)>, StoreError>;

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
    /// Whether every expert in memory has been handed over and only reads remain: what the
    /// caller computes next waits on the disk (unless a read has just landed), so it is the
    /// moment for work that does not need them.
    pub fn only_reads_left(&self) -> bool {
        self.ready.is_empty() && self.outstanding > 0
    }

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
            g.tally.stats.wait_seconds += t0.elapsed().as_secs_f64();
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
