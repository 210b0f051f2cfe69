//! The wait protocol of the expert cache and the trunk ring: a request that cannot get its room
//! waits holding nothing, is woken when pins are released (by dropping handles, nothing else),
//! is admitted in the order it asked, and never waits forever. Every wait below runs under a
//! watchdog that fails the test instead of hanging it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sluice_store::PolicyChoice;
use sluice_store::{ExpertStore, ExpertStoreConfig, Piece, ShardSet, TrunkStore};

/// Bytes of one expert (one piece each), and of its buffer once read: the shards are read
/// buffered here, so with no alignment widening.
const EXPERT: u64 = 50_000;
const FOOTPRINT: u64 = EXPERT;

/// How long a step of these tests may take before it counts as a hang.
const WATCHDOG: Duration = Duration::from_secs(60);

/// A shard of `n` experts (or trunk parts) of `EXPERT` bytes, each filled with its own index.
fn shard(dir: &Path, n: u64) -> (PathBuf, Vec<Vec<Piece>>) {
    let path = dir.join("shard.bin");
    let bytes: Vec<u8> = (0..n * EXPERT).map(|i| (i / EXPERT) as u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    let pieces = (0..n)
        .map(|e| {
            vec![Piece {
                shard: 0,
                offset: e * EXPERT,
                len: EXPERT,
            }]
        })
        .collect();
    (path, pieces)
}

fn store(dir: &Path, layers: usize, experts: u64, cache: u64, readers: usize) -> ExpertStore {
    store_with(dir, layers, experts, cache, readers, PolicyChoice::Lfu)
}

fn store_with(
    dir: &Path,
    layers: usize,
    experts: u64,
    cache: u64,
    readers: usize,
    policy: PolicyChoice,
) -> ExpertStore {
    let (path, pieces) = shard(dir, experts);
    let shards = Arc::new(ShardSet::open(&[&path], false).unwrap());
    let cfg = ExpertStoreConfig {
        capacity: cache * FOOTPRINT,
        policy: policy.make(cache as usize),
        readers,
        uring: false,
        record_trace: false,
        prefetch_precision: 0.0,
    };
    let s = ExpertStore::new(shards, vec![pieces; layers], cfg).unwrap();
    assert_eq!(
        s.max_pinned(0),
        cache as usize,
        "footprint assumed by the test"
    );
    s
}

/// Polls `cond` until it holds; panics (naming `what`) when the watchdog runs out.
fn until(what: &str, cond: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < WATCHDOG, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn dropping_a_pin_wakes_a_waiting_request() {
    for readers in [0, 2] {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let store = Arc::new(store(dir.path(), 1, 8, 2, readers));
        // The whole cache pinned here.
        let held = store.fetch(0, &[0, 1]).unwrap();
        let (tx, rx) = mpsc::channel();
        let s = Arc::clone(&store);
        std::thread::spawn(move || {
            let b = s.fetch(0, &[2]).map(|b| b[0].piece(0)[0]);
            let _ = tx.send(b);
        });
        until("the second request waits", || store.waiting() == 1);
        // Nothing else happens in the store: only the pins go.
        drop(held);
        let got = rx
            .recv_timeout(WATCHDOG)
            .expect("a request waiting for room was never woken when the pins were dropped");
        assert_eq!(got.unwrap(), 2, "{readers} readers");
        assert_eq!(store.waiting(), 0);
    }
}

#[test]
fn waiting_requests_are_admitted_in_the_order_they_asked() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let store = Arc::new(store(dir.path(), 1, 8, 4, 2));
    let held = store.fetch(0, &[0, 1]).unwrap();
    // B needs the whole cache; C would fit beside the held pins at once, but asks after B.
    let (done_tx, done_rx) = mpsc::channel();
    let (release_b_tx, release_b_rx) = mpsc::channel::<()>();
    {
        let (s, tx) = (Arc::clone(&store), done_tx.clone());
        std::thread::spawn(move || {
            let b = s.fetch(0, &[4, 5, 6, 7]).unwrap();
            tx.send('B').unwrap();
            let _ = release_b_rx.recv_timeout(WATCHDOG);
            drop(b);
        });
    }
    until("B waits", || store.waiting() == 1);
    {
        let (s, tx) = (Arc::clone(&store), done_tx);
        std::thread::spawn(move || {
            let c = s.fetch(0, &[2]).unwrap();
            drop(c);
            tx.send('C').unwrap();
        });
    }
    // C must queue behind B rather than take the room B is waiting for.
    until("C waits behind B", || store.waiting() == 2);
    drop(held);
    assert_eq!(done_rx.recv_timeout(WATCHDOG), Ok('B'));
    // B holds the whole cache: C is still waiting.
    assert_eq!(store.waiting(), 1);
    release_b_tx.send(()).unwrap();
    assert_eq!(done_rx.recv_timeout(WATCHDOG), Ok('C'));
    assert!(store.used() <= store.capacity());
}

#[test]
fn dropping_a_ring_part_wakes_a_waiting_request() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (path, parts) = shard(dir.path(), 4);
    let shards = Arc::new(ShardSet::open(&[&path], false).unwrap());
    let trunk =
        Arc::new(TrunkStore::new(shards, parts, &[true, false, false, false], 1, None).unwrap());
    assert_eq!(trunk.ring_slots(), 1);
    let held = trunk.part(1).unwrap();
    assert_eq!(held.piece(0)[0], 1);
    let (tx, rx) = mpsc::channel();
    let t = Arc::clone(&trunk);
    std::thread::spawn(move || {
        let p = t.part(2).map(|p| p.piece(0)[0]);
        let _ = tx.send(p);
    });
    // The other request finds the only slot busy and waits; then the holder lets go.
    std::thread::sleep(Duration::from_millis(100));
    drop(held);
    let got = rx
        .recv_timeout(WATCHDOG)
        .expect("a request waiting for a ring slot was never woken when the part was dropped");
    assert_eq!(got.unwrap(), 2);
}

#[test]
fn a_lease_takes_room_from_the_cache_and_gives_it_back() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let store = store(dir.path(), 1, 8, 4, 2);
    drop(store.fetch(0, &[0, 1, 2, 3]).unwrap());
    assert_eq!(store.used(), 4 * FOOTPRINT);
    let mut lease = store.lease();
    lease.grow_to(2 * FOOTPRINT).unwrap();
    // Two experts were evicted to make the room; the cache now pins at most two.
    assert_eq!(store.capacity(), 2 * FOOTPRINT);
    assert_eq!(store.used(), 2 * FOOTPRINT);
    assert_eq!(store.stats().evictions, 2);
    assert_eq!(store.max_pinned(0), 2);
    // Past the floor: refused, nothing changed.
    store.set_floor(2 * FOOTPRINT);
    assert!(matches!(
        lease.grow_to(3 * FOOTPRINT),
        Err(sluice_store::StoreError::NoRoom { .. })
    ));
    assert_eq!(
        (lease.bytes(), store.capacity()),
        (2 * FOOTPRINT, 2 * FOOTPRINT)
    );
    lease.shrink_to(FOOTPRINT);
    assert_eq!(store.capacity(), 3 * FOOTPRINT);
    drop(lease);
    assert_eq!(store.capacity(), 4 * FOOTPRINT);
    // A request for more than the shrunken cache holds: fetch_some takes what fits,
    // fetch_each refuses.
    let mut lease = store.lease();
    lease.grow_to(FOOTPRINT).unwrap();
    let (n, arrivals) = store.fetch_some(0, &[4, 5, 6, 7], &[]).unwrap();
    assert_eq!(n, 3);
    assert_eq!(arrivals.count(), 3);
    assert!(store.fetch_each(0, &[4, 5, 6, 7], &[]).is_err());
}

#[test]
fn a_lease_waits_for_the_pins_in_its_way() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let store = Arc::new(store(dir.path(), 1, 8, 4, 2));
    let held = store.fetch(0, &[0, 1, 2]).unwrap();
    let (tx, rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let s = Arc::clone(&store);
    std::thread::spawn(move || {
        let mut lease = s.lease();
        let r = lease.grow_to(2 * FOOTPRINT).map(|_| s.used());
        let _ = tx.send(r);
        let _ = done_rx.recv_timeout(WATCHDOG);
    });
    // Three pinned experts do not fit in two: the lease waits, the capacity already lowered
    // so that nothing new is admitted meanwhile.
    until("the capacity shrinks", || store.capacity() == 2 * FOOTPRINT);
    assert!(
        rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "the lease did not wait for the pins"
    );
    drop(held);
    let used = rx
        .recv_timeout(WATCHDOG)
        .expect("a lease waiting for pins was never woken when they were dropped")
        .unwrap();
    assert!(used <= 2 * FOOTPRINT, "{used}");
    done_tx.send(()).unwrap();
}

/// A small deterministic generator (xorshift64*), one per thread.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Many threads fetch random groups of experts of random layers (up to what the cache can pin
/// at once), hold them for a while, prefetch early and late guesses and clear the cache now and
/// then, on caches of one to four experts, under every shipped policy: every thread finishes,
/// every byte is right, and the budget holds after every admission.
#[test]
fn randomized_pin_wait_evict_stress_never_hangs() {
    const LAYERS: usize = 3;
    const EXPERTS: u64 = 12;
    let configs = [(0, 4, 3), (2, 6, 3), (3, 8, 2), (1, 5, 1), (2, 6, 4)];
    for ((readers, threads, cache), policy) in configs
        .into_iter()
        .flat_map(|c| PolicyChoice::all().map(move |p| (c, p)))
    {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let store = Arc::new(store_with(
            dir.path(),
            LAYERS,
            EXPERTS,
            cache,
            readers,
            policy,
        ));
        let (tx, rx) = mpsc::channel();
        for t in 0..threads {
            let (store, tx) = (Arc::clone(&store), tx.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((t as u64 + 1) * 0x1000_0001));
                let mut lease = store.lease();
                let r = (|| -> Result<(), String> {
                    for _ in 0..1500 {
                        let layer = rng.below(LAYERS as u64) as usize;
                        let n = 1 + rng.below(store.max_pinned(layer) as u64) as usize;
                        let mut ids: Vec<u32> = Vec::new();
                        while ids.len() < n {
                            let e = rng.below(EXPERTS) as u32;
                            if !ids.contains(&e) {
                                ids.push(e);
                            }
                        }
                        match rng.below(13) {
                            0 => store.prefetch(layer, &[rng.below(EXPERTS) as u32]),
                            12 => store.prefetch_guess(
                                sluice_store::Guess::Late,
                                layer,
                                &[rng.below(EXPERTS) as u32],
                            ),
                            1 => store.clear(),
                            // Leases of half an expert at a time, while the floor leaves room.
                            2 => {
                                let _ = lease.grow_to(lease.bytes() + FOOTPRINT / 2);
                            }
                            3 => lease.shrink_to(lease.bytes() / 2),
                            _ => {}
                        }
                        let rows: Vec<u32> = ids.iter().map(|_| 1 + rng.below(4) as u32).collect();
                        let (n, arrivals) = if rng.below(2) == 0 {
                            store
                                .fetch_some(layer, &ids, &rows)
                                .map_err(|e| e.to_string())?
                        } else {
                            match store.fetch_each(layer, &ids, &rows) {
                                Ok(a) => (ids.len(), a),
                                // Leases took room since `max_pinned` was asked.
                                Err(sluice_store::StoreError::BudgetTooSmall { .. }) => continue,
                                Err(e) => return Err(e.to_string()),
                            }
                        };
                        ids.truncate(n);
                        let mut seen = 0;
                        for a in arrivals {
                            let (i, b) = a.map_err(|e| e.to_string())?;
                            if store.used() > cache * FOOTPRINT {
                                return Err(format!(
                                    "{} bytes used of {}",
                                    store.used(),
                                    cache * FOOTPRINT
                                ));
                            }
                            if b.piece(0)[0] != ids[i] as u8
                                || b.piece(0)[EXPERT as usize - 1] != ids[i] as u8
                            {
                                return Err(format!("wrong bytes for expert {}", ids[i]));
                            }
                            seen += 1;
                            if rng.below(3) == 0 {
                                std::thread::yield_now();
                            }
                        }
                        if seen != ids.len() {
                            return Err(format!("{seen} of {} experts arrived", ids.len()));
                        }
                    }
                    Ok(())
                })();
                drop(lease);
                let _ = tx.send((t, r));
            });
        }
        drop(tx);
        for _ in 0..threads {
            let (t, r) = rx.recv_timeout(WATCHDOG).unwrap_or_else(|_| {
                panic!(
                    "{readers} readers, {threads} threads, cache of {cache}: a thread never \
                     finished ({} requests waiting)",
                    store.waiting()
                )
            });
            r.unwrap_or_else(|e| panic!("thread {t} ({readers} readers): {e}"));
        }
        let s = store.stats();
        assert_eq!(s.requests, s.hits + s.misses);
        assert_eq!(store.waiting(), 0);
        // Every thread's lease went back with it.
        assert_eq!(store.capacity(), cache * FOOTPRINT);
        assert!(store.used() <= store.capacity());
    }
}

/// Several "forward passes" at once stream parts through rings of one and two slots, with
/// the next part prefetched: every pass finishes with the right bytes.
#[test]
fn randomized_ring_stress_never_hangs() {
    for slots in [1, 2] {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let (path, parts) = shard(dir.path(), 6);
        let shards = Arc::new(ShardSet::open(&[&path], false).unwrap());
        let pin = [true, false, true, false, false, false];
        let trunk = Arc::new(TrunkStore::new(shards, parts, &pin, slots, None).unwrap());
        let (tx, rx) = mpsc::channel();
        for t in 0..5u64 {
            let (trunk, tx) = (Arc::clone(&trunk), tx.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(t * 7919 + 17);
                let r = (|| -> Result<(), String> {
                    for _ in 0..400 {
                        for i in 0..6 {
                            let p = trunk.part(i).map_err(|e| e.to_string())?;
                            if p.piece(0)[0] != i as u8 {
                                return Err(format!("part {i} has wrong bytes"));
                            }
                            if rng.below(2) == 0 {
                                trunk.prefetch((i + 1) % 6);
                            }
                            if rng.below(4) == 0 {
                                std::thread::yield_now();
                            }
                        }
                    }
                    Ok(())
                })();
                let _ = tx.send(r);
            });
        }
        drop(tx);
        for _ in 0..5 {
            rx.recv_timeout(WATCHDOG)
                .unwrap_or_else(|_| panic!("ring of {slots}: a pass never finished"))
                .unwrap();
        }
    }
}
