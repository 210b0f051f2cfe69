//! O_DIRECT on a real file system leaves nothing in the page cache; tmpfs falls back to buffered
//! reads; faults (I/O errors, short reads, a shard truncated while open) end a request with a
//! typed error and leave the store serving the next one.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use sluice_store::PolicyChoice;
use sluice_store::io::{has_direct_flag, page_cache_residency};
use sluice_store::{
    ExpertStore, ExpertStoreConfig, Guess, IoMode, Piece, Reader, ShardSet, StoreError,
};

const EXPERT: u64 = 3 * 40_000 + 17;

/// A shard with 16 "experts" of three adjacent pieces each, not aligned to anything.
fn write_shard(dir: &Path) -> (PathBuf, Vec<Vec<Vec<Piece>>>) {
    let path = dir.join("shard.bin");
    let bytes: Vec<u8> = (0..(100 + 16 * EXPERT))
        .map(|i| (i * 131 % 251) as u8)
        .collect();
    std::fs::write(&path, &bytes).unwrap();
    // Write back and drop the pages so that the page cache starts empty.
    let f = std::fs::File::open(&path).unwrap();
    f.sync_all().unwrap();
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
    let experts = (0..16u64)
        .map(|e| {
            let base = 100 + e * EXPERT;
            vec![
                Piece {
                    shard: 0,
                    offset: base,
                    len: 40_000,
                },
                Piece {
                    shard: 0,
                    offset: base + 40_000,
                    len: 40_000,
                },
                Piece {
                    shard: 0,
                    offset: base + 80_000,
                    len: 40_017,
                },
            ]
        })
        .collect();
    (path, vec![experts])
}

fn config(capacity: u64) -> ExpertStoreConfig {
    ExpertStoreConfig {
        capacity,
        policy: PolicyChoice::S3Fifo.make(4),
        readers: 2,
        uring: false,
        record_trace: false,
        prefetch_precision: sluice_store::PREFETCH_PRECISION,
    }
}

fn expected(path: &Path, p: &Piece) -> Vec<u8> {
    let b = std::fs::read(path).unwrap();
    b[p.offset as usize..(p.offset + p.len) as usize].to_vec()
}

#[test]
fn direct_reads_leave_no_pages_cached() {
    // CARGO_TARGET_TMPDIR lives under target/, on the build's real file system.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (path, specs) = write_shard(dir.path());
    let shards = Arc::new(ShardSet::open(&[&path], true).unwrap());
    assert_eq!(
        shards.mode(),
        IoMode::Direct,
        "O_DIRECT refused on {}",
        dir.path().display()
    );
    assert!(has_direct_flag(shards.files()[0].fd()).unwrap());
    let store = ExpertStore::new(shards, specs.clone(), config(1 << 20)).unwrap();
    for e in 0..16 {
        let b = store.fetch(0, &[e]).unwrap();
        for (i, p) in specs[0][e as usize].iter().enumerate() {
            assert_eq!(
                b[0].piece(i),
                &expected(&path, p)[..],
                "expert {e} piece {i}"
            );
        }
    }
    // `expected` read the file through the page cache; drop that, read everything again with
    // O_DIRECT, and look.
    let f = std::fs::File::open(&path).unwrap();
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
    store.clear();
    for e in 0..16 {
        store.fetch(0, &[e]).unwrap();
    }
    let (cached, total) = page_cache_residency(&path).unwrap();
    assert!(total > 400);
    assert_eq!(
        cached, 0,
        "{cached} of {total} pages in the page cache after O_DIRECT reads"
    );
    let s = store.stats();
    assert_eq!(s.requests, s.hits + s.misses);
    assert!(s.bytes_read >= 16 * EXPERT);
}

#[test]
fn buffered_reads_drop_their_pages() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (path, specs) = write_shard(dir.path());
    let shards = Arc::new(ShardSet::open(&[&path], false).unwrap());
    assert_eq!(shards.mode(), IoMode::Buffered);
    assert!(!has_direct_flag(shards.files()[0].fd()).unwrap());
    let store = ExpertStore::new(shards, specs, config(1 << 20)).unwrap();
    for e in 0..16 {
        store.fetch(0, &[e]).unwrap();
    }
    let (cached, total) = page_cache_residency(&path).unwrap();
    // Pages the kernel still holds in its per-CPU LRU batches (up to 15 per CPU) escape one
    // DONTNEED; everything else is gone.
    let slack = 16 * std::thread::available_parallelism().map_or(2, |n| n.get());
    assert!(cached <= slack, "{cached} of {total} pages still cached");
}

#[test]
#[cfg(target_os = "linux")]
fn tmpfs_falls_back_to_buffered() {
    let shm = Path::new("/dev/shm");
    assert!(shm.is_dir(), "this Linux machine has no /dev/shm tmpfs");
    // Recent kernels accept O_DIRECT on tmpfs; sluice reads it buffered on purpose (no page cache
    // to bypass).
    let dir = tempfile::tempdir_in(shm).unwrap();
    let (path, specs) = write_shard(dir.path());
    let shards = Arc::new(ShardSet::open(&[&path], true).unwrap());
    assert_eq!(shards.mode(), IoMode::Buffered, "tmpfs accepted O_DIRECT");
    let store = ExpertStore::new(shards, specs.clone(), config(1 << 20)).unwrap();
    let b = store.fetch(0, &[5, 9]).unwrap();
    assert_eq!(b[1].piece(2), &expected(&path, &specs[0][9][2])[..]);
}

/// A reader that fails on demand.
#[derive(Debug)]
struct Faulty {
    inner: ShardSet,
    /// Fail reads that touch this offset.
    poison: AtomicU64,
    /// 1: the next read returns half of what is asked; 2: the next read is end-of-file.
    short: AtomicU8,
}

impl Reader for Faulty {
    fn read_at(&self, shard: u32, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let p = self.poison.load(Ordering::SeqCst);
        if offset <= p && p < offset + buf.len() as u64 {
            return Err(io::Error::other("injected I/O error"));
        }
        match self.short.load(Ordering::SeqCst) {
            1 => {
                let half = buf.len() / 2;
                self.short.store(2, Ordering::SeqCst);
                return self.inner.read_at(shard, offset, &mut buf[..half]);
            }
            2 => {
                self.short.store(0, Ordering::SeqCst);
                return Ok(0);
            }
            _ => {}
        }
        self.inner.read_at(shard, offset, buf)
    }
    fn align(&self, shard: u32) -> usize {
        self.inner.align(shard)
    }
    fn path(&self, shard: u32) -> &Path {
        self.inner.path(shard)
    }
    fn mode(&self, shard: u32) -> IoMode {
        Reader::mode(&self.inner, shard)
    }
}

#[test]
fn injected_errors_end_the_request_and_the_store_recovers() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (path, specs) = write_shard(dir.path());
    let faulty = Arc::new(Faulty {
        inner: ShardSet::open(&[&path], false).unwrap(),
        poison: AtomicU64::new(u64::MAX),
        short: AtomicU8::new(0),
    });
    let store = ExpertStore::new(faulty.clone(), specs.clone(), config(1 << 20)).unwrap();

    faulty
        .poison
        .store(specs[0][3][1].offset + 5, Ordering::SeqCst);
    match store.fetch(0, &[2, 3, 4]) {
        Err(StoreError::Io {
            path: p, source, ..
        }) => {
            assert_eq!(p, path);
            assert!(source.to_string().contains("injected"), "{source}");
        }
        other => panic!("expected an I/O error, got {other:?}"),
    }
    // Nothing half-read stays behind; other experts are served; the fault clears and 3 reads.
    assert!(store.fetch(0, &[2, 4]).is_ok());
    faulty.poison.store(u64::MAX, Ordering::SeqCst);
    let b = store.fetch(0, &[3]).unwrap();
    assert_eq!(b[0].piece(1), &expected(&path, &specs[0][3][1])[..]);

    // A short read (half, then end of file) is an error too, never garbage.
    faulty.short.store(1, Ordering::SeqCst);
    store.clear();
    let r = store.fetch(0, &[7]);
    assert!(matches!(r, Err(StoreError::ShortRead { .. })), "{r:?}");
    assert!(store.fetch(0, &[7]).is_ok());
    assert!(store.used() <= store.capacity());
}

#[test]
fn a_shard_truncated_while_open_is_a_short_read() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (path, specs) = write_shard(dir.path());
    // Direct reads from threads and on the io_uring, and buffered ones.
    for (direct, uring) in [(true, false), (true, true), (false, false)] {
        let shards = Arc::new(ShardSet::open(&[&path], direct).unwrap());
        assert_eq!(
            shards.mode() == IoMode::Direct,
            direct,
            "O_DIRECT refused here"
        );
        let cfg = ExpertStoreConfig {
            uring,
            ..config(1 << 20)
        };
        let store = ExpertStore::new(shards, specs.clone(), cfg).unwrap();
        store.fetch(0, &[0]).unwrap();
        let full = std::fs::read(&path).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(100 + 10 * EXPERT)
            .unwrap();
        let r = store.fetch(0, &[12]);
        assert!(
            matches!(&r, Err(StoreError::ShortRead { path: p, .. }) if *p == path),
            "{r:?}"
        );
        // Still serves what exists.
        assert!(store.fetch(0, &[1]).is_ok());
        std::fs::write(&path, &full).unwrap();
    }
}

#[test]
fn capacity_below_one_expert_is_refused() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (path, specs) = write_shard(dir.path());
    let r = ExpertStore::new(
        Arc::new(ShardSet::open(&[&path], false).unwrap()),
        specs,
        config(1000),
    );
    assert!(matches!(r, Err(StoreError::BudgetTooSmall { .. })));
}

#[test]
fn concurrent_fetches_share_reads_and_hold_the_budget() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (path, specs) = write_shard(dir.path());
    let shards = Arc::new(ShardSet::open(&[&path], true).unwrap());
    let store =
        Arc::new(ExpertStore::new(shards, specs.clone(), config(5 * (EXPERT + 8192))).unwrap());
    std::thread::scope(|s| {
        for t in 0..6u32 {
            let store = &store;
            let specs = &specs;
            let path = &path;
            s.spawn(move || {
                for i in 0..40u32 {
                    let ids = [(t + i) % 16, (t * 3 + i * 7) % 16];
                    let ids: Vec<u32> = if ids[0] == ids[1] {
                        vec![ids[0]]
                    } else {
                        ids.to_vec()
                    };
                    let b = store.fetch(0, &ids).unwrap();
                    assert!(store.used() <= store.capacity());
                    let p = &specs[0][ids[0] as usize][0];
                    assert_eq!(&b[0].piece(0)[..64], &expected(path, p)[..64]);
                }
            });
        }
    });
    let s = store.stats();
    assert_eq!(s.requests, s.hits + s.misses);
    assert!(s.evictions > 0);
}

/// A shard with 4 experts of three pieces each, every expert several read parts long.
fn write_large_shard(dir: &Path) -> (PathBuf, Vec<Vec<Vec<Piece>>>) {
    const PIECE: u64 = 900_001;
    let path = dir.join("large.bin");
    let bytes: Vec<u8> = (0..(333 + 4 * 3 * PIECE))
        .map(|i| (i * 131 % 251) as u8)
        .collect();
    std::fs::write(&path, &bytes).unwrap();
    let experts = (0..4u64)
        .map(|e| {
            (0..3)
                .map(|p| Piece {
                    shard: 0,
                    offset: 333 + (e * 3 + p) * PIECE,
                    len: PIECE,
                })
                .collect()
        })
        .collect();
    (path, vec![experts])
}

#[test]
fn large_experts_arrive_in_parts_one_after_another() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (path, specs) = write_large_shard(dir.path());
    assert!(specs[0][0].iter().map(|p| p.len).sum::<u64>() > 2 * sluice_store::READ_PART);
    // Reader threads, and the io_uring with one and three reads in flight.
    for (readers, uring) in [(0, false), (1, false), (3, false), (1, true), (3, true)] {
        let shards = Arc::new(ShardSet::open(&[&path], true).unwrap());
        assert_eq!(shards.mode(), IoMode::Direct, "O_DIRECT refused here");
        let cfg = ExpertStoreConfig {
            readers,
            uring,
            ..config(16 << 20)
        };
        let store = ExpertStore::new(shards, specs.clone(), cfg).unwrap();
        store.fetch(0, &[0]).unwrap();
        // 0 is resident and comes first; 1 is asked for twice and read once.
        let asked = [3, 1, 0, 2, 1];
        let got: Vec<(usize, sluice_store::Pinned)> = store
            .fetch_each(0, &asked, &[4, 1, 2, 9, 1])
            .unwrap()
            .map(|a| a.unwrap())
            .collect();
        let order: Vec<usize> = got.iter().map(|g| g.0).collect();
        assert_eq!(
            order[0], 2,
            "{readers} readers, io_uring {uring}: {order:?}"
        );
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            vec![0, 1, 2, 3, 4],
            "{readers} readers, io_uring {uring}"
        );
        if readers <= 1 {
            // One reader takes the parts in file order, so the misses land in file order.
            assert_eq!(order, vec![2, 1, 4, 3, 0]);
        }
        for (i, b) in &got {
            for (p, piece) in specs[0][asked[*i] as usize].iter().enumerate() {
                assert!(
                    b.piece(p) == &expected(&path, piece)[..],
                    "{readers} readers, io_uring {uring}: expert {} piece {p}",
                    asked[*i]
                );
            }
        }
        let s = store.stats();
        // Both asks of 1 are misses (it was not resident when asked), but it is read once.
        assert_eq!((s.requests, s.hits, s.misses, s.reads), (6, 1, 5, 4));

        // Dropped after the first arrival: the reads it started still land and are cached.
        drop(got);
        store.clear();
        assert_eq!(store.used(), 0);
        assert!(store.fetch_each(0, &[2, 3], &[1]).is_err());
        let mut it = store.fetch_each(0, &[2, 3], &[]).unwrap();
        assert!(it.next().unwrap().is_ok());
        drop(it);
        let used = store.used();
        assert!(used > store.max_footprint() && used <= 2 * store.max_footprint());
        let before = store.stats().reads;
        store.fetch(0, &[2, 3]).unwrap();
        assert_eq!(
            store.stats().reads,
            before,
            "{readers} readers, io_uring {uring}"
        );
    }
}

#[test]
fn a_failed_part_fails_only_its_expert() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (path, specs) = write_large_shard(dir.path());
    let faulty = Arc::new(Faulty {
        inner: ShardSet::open(&[&path], true).unwrap(),
        poison: AtomicU64::new(u64::MAX),
        short: AtomicU8::new(0),
    });
    let store = ExpertStore::new(faulty.clone(), specs.clone(), config(16 << 20)).unwrap();
    // Poison a byte in the middle of expert 2 (its second read part).
    faulty
        .poison
        .store(specs[0][2][1].offset + 500_000, Ordering::SeqCst);
    let mut ok = Vec::new();
    let mut errs = 0;
    for a in store.fetch_each(0, &[1, 2, 3], &[]).unwrap() {
        match a {
            Ok((i, _)) => ok.push(i),
            Err(StoreError::Io { source, .. }) => {
                assert!(source.to_string().contains("injected"));
                errs += 1;
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
    ok.sort();
    assert_eq!((ok, errs), (vec![0, 2], 1));
    // Nothing of expert 2 stays behind; the others are cached.
    let used = store.used();
    assert!(used > store.max_footprint() && used <= 2 * store.max_footprint());
    faulty.poison.store(u64::MAX, Ordering::SeqCst);
    let b = store.fetch(0, &[2]).unwrap();
    assert!(b[0].piece(1) == &expected(&path, &specs[0][2][1])[..]);
}

/// A store over a fresh shard in `dir` that reads on the calling thread.
fn inline_store(dir: &Path) -> ExpertStore {
    inline_store_reading(dir, sluice_store::PREFETCH_PRECISION)
}

/// [`inline_store`] reading a guess's ranks from `precision` right (0: every guess).
fn inline_store_reading(dir: &Path, precision: f64) -> ExpertStore {
    let (path, specs) = write_shard(dir);
    let shards = Arc::new(ShardSet::open(&[&path], false).unwrap());
    let cfg = ExpertStoreConfig {
        readers: 0,
        uring: false,
        prefetch_precision: precision,
        ..config(1 << 20)
    };
    ExpertStore::new(shards, specs, cfg).unwrap()
}

/// One step of a prefetch test: `guess(a, b)` predicts with `a = i % 8` and `b = 8 + i % 8`,
/// then the router picks `a`. Returns the prefetch reads the guesses started.
fn prefetch_step(store: &ExpertStore, i: u32, guess: impl Fn(u32, u32)) -> u64 {
    store.begin_step();
    let (a, b) = (i % 8, 8 + i % 8);
    let reads = store.stats().prefetch_reads;
    guess(a, b);
    let read = store.stats().prefetch_reads - reads;
    store.fetch(0, &[a]).unwrap();
    store.clear();
    read
}

#[test]
fn prefetch_reads_only_the_ranks_that_have_been_right() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let store = inline_store(dir.path());
    // Each step predicts [a, b]; the router then picks a (rank 0 right, rank 1 wrong).
    let step = |i| prefetch_step(&store, i, |a, b| store.prefetch(0, &[a, b]));
    // Untrusted ranks are not read while their record builds up.
    for i in 0..sluice_store::PREFETCH_WARMUP as u32 {
        assert_eq!(step(i), 0, "step {i}");
    }
    // Then rank 0 is read and rank 1 (never right) is not.
    for i in 0..8 {
        assert_eq!(step(i), 1, "step {i}");
    }
    let s = store.stats();
    assert_eq!(s.prefetch_hits, 8);
    assert!((s.prefetch_recall() - 1.0).abs() < 1e-12);
}

#[test]
fn early_and_late_guesses_keep_their_own_records() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let store = inline_store(dir.path());
    // Each step the early guess is b (always wrong), the late one a, which the router picks.
    let step = |i| {
        prefetch_step(&store, i, |a, b| {
            store.prefetch_guess(Guess::Early, 0, &[b]);
            store.prefetch_guess(Guess::Late, 0, &[a]);
        })
    };
    for i in 0..sluice_store::PREFETCH_WARMUP as u32 {
        assert_eq!(step(i), 0, "step {i}");
    }
    // The late rank has earned its reads (above even its higher bar); the early one has not,
    // for all that the late one's record is perfect.
    for i in 0..8 {
        assert_eq!(step(i), 1, "step {i}");
    }
    let s = store.stats();
    assert_eq!(s.prefetch_hits, 8);
    // Recall is the last guess's; the early one's is counted apart.
    assert_eq!((s.prefetch_checked, s.prefetch_predicted), (24, 24));
    assert_eq!(
        (s.prefetch_checked_early, s.prefetch_predicted_early),
        (24, 0)
    );
}

/// A policy that never names a victim.
struct Mute;
impl sluice_store::Policy for Mute {
    fn name(&self) -> &str {
        "mute"
    }
    fn insert(&mut self, _: sluice_store::Key) {}
    fn hit(&mut self, _: sluice_store::Key) {}
    fn remove(&mut self, _: sluice_store::Key) {}
    fn victim(
        &mut self,
        _: &mut dyn FnMut(sluice_store::Key) -> bool,
    ) -> Option<sluice_store::Key> {
        None
    }
}

/// A policy that names no victim while one is evictable would leave a request waiting for
/// room that nothing frees: the store evicts the least evictable key instead, so a full cache
/// of unpinned experts still serves the next miss.
#[test]
fn a_policy_that_names_no_victim_cannot_hang_a_request() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (path, specs) = write_shard(dir.path());
    let shards = Arc::new(ShardSet::open(&[&path], false).unwrap());
    let one = ExpertStore::new(shards.clone(), specs.clone(), config(1 << 20))
        .unwrap()
        .max_footprint();
    let cfg = ExpertStoreConfig {
        policy: PolicyChoice::custom(|_| Box::new(Mute)).make(2),
        ..config(2 * one)
    };
    let store = ExpertStore::new(shards, specs.clone(), cfg).unwrap();
    // Under a watchdog: without the store's fallback the second miss waits for ever.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for e in [1, 2, 3, 4, 1] {
            let b = store.fetch(0, &[e]).unwrap();
            assert!(b[0].piece(0) == &expected(&path, &specs[0][e as usize][0])[..]);
        }
        tx.send(store.stats().evictions).unwrap();
    });
    let evictions = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("a miss waited for room for a minute");
    assert!(evictions >= 3, "{evictions}");
}

#[test]
fn an_evicted_experts_buffer_is_read_into_again() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (path, specs) = write_shard(dir.path());
    let shards = Arc::new(ShardSet::open(&[&path], true).unwrap());
    let one = ExpertStore::new(shards.clone(), specs.clone(), config(1 << 20))
        .unwrap()
        .max_footprint();
    // Room for exactly one expert: each fetch evicts the previous one.
    let store = ExpertStore::new(shards, specs.clone(), config(one)).unwrap();
    // The buffer's page: piece 0 starts within the first page (O_DIRECT widens reads to pages).
    let page = |b: &sluice_store::Blob| b.piece(0).as_ptr() as usize & !4095;
    let first = page(&store.fetch(0, &[1]).unwrap()[0]);
    for e in [2, 3, 1, 4] {
        let b = store.fetch(0, &[e]).unwrap();
        // Same buffer, new bytes: the old expert's are overwritten wherever a piece lies.
        assert_eq!(page(&b[0]), first, "expert {e}");
        for (i, p) in specs[0][e as usize].iter().enumerate() {
            assert!(
                b[0].piece(i) == &expected(&path, p)[..],
                "expert {e} piece {i}"
            );
        }
    }
    assert_eq!(store.stats().evictions, 4);
}

/// A stage whose most confident rank is far below its bar is guessed only in one step of
/// `GUESS_PROBE_EVERY`, its record still kept; a stage that may reach its bar, and every
/// stage while each guess is read (precision 0), every step.
#[test]
fn a_stage_that_cannot_earn_reads_is_guessed_only_now_and_then() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let store = inline_store(dir.path());
    let every = sluice_store::GUESS_PROBE_EVERY as usize;
    // The early guess is b (always wrong), the late one a (always right).
    let mut early_made = 0;
    let steps = sluice_store::PREFETCH_WARMUP as usize + 8 * every;
    for i in 0..steps as u32 {
        assert!(store.wants_guess(Guess::Late), "step {i}");
        let early = store.wants_guess(Guess::Early);
        early_made += usize::from(early);
        prefetch_step(&store, i, |a, b| {
            if early {
                store.prefetch_guess(Guess::Early, 0, &[b]);
            }
            store.prefetch_guess(Guess::Late, 0, &[a]);
        });
    }
    // Every step until the early record was scored enough, then one in `every`.
    let warm = sluice_store::PREFETCH_WARMUP as usize;
    assert!(
        early_made >= warm && early_made <= warm + 8 + 1,
        "{early_made}"
    );
    // The checks of the early guess are those it made.
    assert_eq!(store.stats().prefetch_checked_early, early_made as u64);

    // Reading every guess: always worth making.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let all = inline_store_reading(dir.path(), 0.0);
    for i in 0..(warm + 2 * every) as u32 {
        assert!(all.wants_guess(Guess::Early), "step {i}");
        prefetch_step(&all, i, |_, b| all.prefetch_guess(Guess::Early, 0, &[b]));
    }
}

/// A reader whose reads of one offset wait until the gate opens, and then fail if told to.
#[derive(Debug)]
struct Gated {
    inner: ShardSet,
    /// Reads touching this offset wait for the gate.
    at: AtomicU64,
    open: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
    /// Reads touching `at` fail once the gate opens.
    fail: std::sync::atomic::AtomicBool,
}

impl Gated {
    fn close(&self, at: u64) {
        *self.open.lock().unwrap() = false;
        self.at.store(at, Ordering::SeqCst);
    }
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

impl Reader for Gated {
    fn read_at(&self, shard: u32, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let at = self.at.load(Ordering::SeqCst);
        if offset <= at && at < offset + buf.len() as u64 {
            let mut open = self.open.lock().unwrap();
            while !*open {
                open = self.opened.wait(open).unwrap();
            }
            if self.fail.load(Ordering::SeqCst) {
                return Err(io::Error::other("injected I/O error"));
            }
        }
        self.inner.read_at(shard, offset, buf)
    }
    fn align(&self, shard: u32) -> usize {
        self.inner.align(shard)
    }
    fn path(&self, shard: u32) -> &Path {
        self.inner.path(shard)
    }
    fn mode(&self, shard: u32) -> IoMode {
        Reader::mode(&self.inner, shard)
    }
}

/// A request for an expert a prefetch is still reading is admitted at once: its resident
/// experts come first, the prefetched one when its read lands (counted as a prefetch hit, not
/// read twice); a failed prefetch fails that expert of the request alone, and the next request
/// reads it again.
#[test]
fn a_request_does_not_wait_for_a_prefetch_in_flight() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (path, specs) = write_shard(dir.path());
    let gated = Arc::new(Gated {
        inner: ShardSet::open(&[&path], false).unwrap(),
        at: AtomicU64::new(u64::MAX),
        open: std::sync::Mutex::new(true),
        opened: std::sync::Condvar::new(),
        fail: std::sync::atomic::AtomicBool::new(false),
    });
    let cfg = ExpertStoreConfig {
        prefetch_precision: 0.0,
        ..config(1 << 20)
    };
    let store = Arc::new(ExpertStore::new(gated.clone(), specs.clone(), cfg).unwrap());
    store.fetch(0, &[2]).unwrap();

    for fail in [false, true] {
        store.begin_step();
        let before = store.stats();
        gated.fail.store(fail, Ordering::SeqCst);
        gated.close(specs[0][5][1].offset + 7);
        store.prefetch(0, &[5]);
        // Admitted while the prefetch is held: the resident expert arrives, then only the
        // read is left.
        let (tx, rx) = std::sync::mpsc::channel();
        let s = Arc::clone(&store);
        let asker = std::thread::spawn(move || {
            let mut arrivals = s.fetch_each(0, &[5, 2], &[]).unwrap();
            let first = arrivals
                .next()
                .unwrap()
                .map(|(i, b)| (i, b.piece(0).to_vec()));
            tx.send((first, arrivals.only_reads_left())).unwrap();
            arrivals
                .next()
                .unwrap()
                .map(|(i, b)| (i, b.piece(1).to_vec()))
        });
        let (first, waiting) = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("a request for an expert being prefetched waited for the prefetch");
        let (i, bytes) = first.unwrap();
        assert_eq!((i, bytes), (1, expected(&path, &specs[0][2][0])));
        assert!(waiting, "expert 5 is still being read");
        gated.open();
        let last = asker.join().unwrap();
        let s = store.stats();
        if fail {
            match last {
                Err(StoreError::Shared(m)) => assert!(m.contains("injected"), "{m}"),
                other => panic!("expected the prefetch's error, got {other:?}"),
            }
            assert_eq!(s.reads - before.reads, 1, "the failed prefetch only");
            // The next request reads it again, on demand.
            gated.fail.store(false, Ordering::SeqCst);
            let b = store.fetch(0, &[5]).unwrap();
            assert_eq!(b[0].piece(2), &expected(&path, &specs[0][5][2])[..]);
        } else {
            assert_eq!(last.unwrap(), (0, expected(&path, &specs[0][5][1])));
            assert_eq!(s.reads - before.reads, 1, "read once, by the prefetch");
            assert_eq!(s.prefetch_hits - before.prefetch_hits, 1);
            assert_eq!(s.hits - before.hits, 2);
            store.clear();
            store.fetch(0, &[2]).unwrap();
        }
        assert!(store.used() <= store.capacity());
    }
}
