//! Measuring a disk the way the store reads it: random reads of one size (an expert's, say) at
//! random aligned offsets of some files, with a number of reads in flight, O_DIRECT or buffered
//! with the pages dropped after each read — so every byte counted came from the device.
//!
//! Reads are in flight either as one thread per read issuing `pread` (what the store's reader
//! pool does) or, on Linux, as one thread keeping them all queued on an io_uring; each figure
//! also says how much CPU time the reading took, since on a machine of few cores that time is
//! taken from the kernels.
//!
//! `sluice doctor` reports these figures, and `sluice bench` uses the same method on a model's
//! own shards for the disk bandwidth its I/O floor is computed from.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::io::{IoMode, ShardFile};
use crate::{AlignedBuf, StoreError};

/// How the reads in flight are issued.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadEngine {
    /// One thread per read in flight, each issuing `pread` (the store's reader pool).
    #[default]
    Threads,
    /// One thread keeping every read in flight queued on an io_uring (Linux 5.6 and later; an
    /// error where the kernel has none or refuses it).
    Uring,
}

impl ReadEngine {
    /// Name as reported: `threads` or `io_uring`.
    pub fn name(self) -> &'static str {
        match self {
            ReadEngine::Threads => "threads",
            ReadEngine::Uring => "io_uring",
        }
    }
}

/// One read measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadProbe {
    /// Bytes per read.
    pub block: usize,
    /// Reads in flight.
    pub depth: usize,
    /// Ask for O_DIRECT (files that refuse it are read buffered; the figure says which ran).
    pub direct: bool,
    /// How the reads are issued.
    pub engine: ReadEngine,
    /// Stop after this many seconds...
    pub seconds: f64,
    /// ...or this many bytes, whichever comes first.
    pub max_bytes: u64,
    /// Seed of the offsets.
    pub seed: u64,
}

/// What a [`ReadProbe`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadFigure {
    /// Bytes per read.
    pub block: usize,
    /// Reads in flight.
    pub depth: usize,
    /// The mode that ran.
    pub mode: IoMode,
    /// How the reads were issued.
    pub engine: ReadEngine,
    /// Reads completed.
    pub reads: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// CPU seconds the process spent meanwhile (user and system, every thread).
    pub cpu_seconds: f64,
}

impl ReadFigure {
    /// Bytes per second, in GB/s (10⁹).
    pub fn gbps(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 / self.seconds / 1e9
        } else {
            0.0
        }
    }

    /// Mean latency of one read in milliseconds (`depth` reads always in flight).
    pub fn latency_ms(&self) -> f64 {
        if self.reads == 0 {
            0.0
        } else {
            1e3 * self.seconds * self.depth as f64 / self.reads as f64
        }
    }

    /// CPU seconds per GB read.
    pub fn cpu_seconds_per_gb(&self) -> f64 {
        if self.bytes == 0 {
            0.0
        } else {
            self.cpu_seconds / (self.bytes as f64 / 1e9)
        }
    }
}

/// splitmix64.
fn mix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// User plus system CPU seconds of this process so far.
fn process_cpu_seconds() -> f64 {
    // SAFETY: `getrusage` fills the struct it is given; a zeroed `rusage` is a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 * 1e-6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// The files read and where a read of `block` bytes may start in each: aligned offsets in
/// [0, len - block], aligned to each file's O_DIRECT alignment (4096 at least).
struct Targets {
    files: Vec<ShardFile>,
    slots: Vec<u64>,
    total_slots: u64,
}

impl Targets {
    fn align(f: &ShardFile) -> u64 {
        f.align().max(4096) as u64
    }

    /// A random read: (file index, offset).
    fn pick(&self, rng: &mut u64) -> (usize, u64) {
        let mut r = mix(rng) % self.total_slots;
        let mut i = 0;
        while r >= self.slots[i] {
            r -= self.slots[i];
            i += 1;
        }
        (i, r * Self::align(&self.files[i]))
    }
}

/// Random reads of `probe.block` bytes over `paths` (files shorter than a block are skipped;
/// offsets are aligned to each file's O_DIRECT alignment, 4096 at least).
pub fn measure_reads(paths: &[PathBuf], probe: &ReadProbe) -> Result<ReadFigure, StoreError> {
    let block = probe.block.max(1);
    let files: Vec<ShardFile> = paths
        .iter()
        .map(|p| ShardFile::open(p, probe.direct))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .filter(|f| f.len() >= block as u64)
        .collect();
    if files.is_empty() {
        return Err(StoreError::Io {
            path: paths.first().cloned().unwrap_or_default(),
            offset: 0,
            source: std::io::Error::other(format!("no file holds a {block}-byte read")),
        });
    }
    let mode = if files.iter().any(|f| f.mode() == IoMode::Direct) {
        IoMode::Direct
    } else {
        IoMode::Buffered
    };
    for f in &files {
        f.drop_pages(0, f.len());
    }
    let slots: Vec<u64> = files
        .iter()
        .map(|f| (f.len() - block as u64) / Targets::align(f) + 1)
        .collect();
    let targets = Targets {
        total_slots: slots.iter().sum(),
        slots,
        files,
    };
    let bytes = AtomicU64::new(0);
    let reads = AtomicU64::new(0);
    let depth = probe.depth.max(1);
    let cpu0 = process_cpu_seconds();
    let t0 = Instant::now();
    let more = || {
        t0.elapsed().as_secs_f64() < probe.seconds
            && bytes.load(Ordering::Relaxed) < probe.max_bytes
    };
    let done = |i: usize, off: u64, _: &[u8]| {
        targets.files[i].drop_pages(off, block as u64);
        bytes.fetch_add(block as u64, Ordering::Relaxed);
        reads.fetch_add(1, Ordering::Relaxed);
    };
    match probe.engine {
        ReadEngine::Threads => thread_reads(&targets, block, depth, probe.seed, &more, &done)?,
        ReadEngine::Uring => {
            uring_reads(&targets, block, depth, probe.seed, &more, &mut |i, o, b| {
                done(i, o, b)
            })?
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    Ok(ReadFigure {
        block,
        depth,
        mode,
        engine: probe.engine,
        reads: reads.into_inner(),
        bytes: bytes.into_inner(),
        seconds,
        cpu_seconds: (process_cpu_seconds() - cpu0).max(0.0),
    })
}

/// `depth` threads, each reading `block` bytes at random offsets with `pread` while `more()`,
/// handing each read to `done(file, offset, bytes)`.
fn thread_reads(
    t: &Targets,
    block: usize,
    depth: usize,
    seed: u64,
    more: &(dyn Fn() -> bool + Sync),
    done: &(dyn Fn(usize, u64, &[u8]) + Sync),
) -> Result<(), StoreError> {
    let buf_len = block.div_ceil(4096) * 4096;
    let errors: Vec<StoreError> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..depth)
            .map(|k| {
                s.spawn(move || -> Result<(), StoreError> {
                    let mut buf = AlignedBuf::zeroed(buf_len, 4096)?;
                    let mut rng = seed ^ (k as u64).wrapping_mul(0x2545_f491_4f6c_dd1d);
                    while more() {
                        let (i, off) = t.pick(&mut rng);
                        let f = &t.files[i];
                        let dst = &mut buf.as_mut_slice()[..block];
                        let mut got = 0;
                        while got < block {
                            match rustix::io::pread(f.fd(), &mut dst[got..], off + got as u64) {
                                Ok(0) => {
                                    return Err(StoreError::ShortRead {
                                        path: f.path().to_path_buf(),
                                        offset: off,
                                        wanted: block as u64,
                                        got: got as u64,
                                    });
                                }
                                Ok(n) => got += n,
                                Err(rustix::io::Errno::INTR) => {}
                                Err(e) => {
                                    return Err(StoreError::Io {
                                        path: f.path().to_path_buf(),
                                        offset: off + got as u64,
                                        source: e.into(),
                                    });
                                }
                            }
                        }
                        done(i, off, dst);
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| match h.join() {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                Err(_) => Some(StoreError::Shared("a probe reader panicked".into())),
            })
            .collect()
    });
    match errors.into_iter().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// `depth` reads of `block` bytes at random offsets kept queued on the store's own io_uring
/// reader ([`RingReader`](crate::ring::RingReader)) while `more()`, each finished read handed to
/// `done(file, offset, bytes)` on this thread. On an error no new read is queued, and the ones in
/// flight are waited for before the buffers they write into are freed.
#[cfg(target_os = "linux")]
fn uring_reads(
    t: &Targets,
    block: usize,
    depth: usize,
    seed: u64,
    more: &dyn Fn() -> bool,
    done: &mut dyn FnMut(usize, u64, &[u8]),
) -> Result<(), StoreError> {
    use crate::ring::{RingRead, RingReader};
    use std::os::fd::AsRawFd;

    let ring = RingReader::new(depth).map_err(|source| StoreError::Ring {
        path: t.files[0].path().to_path_buf(),
        source,
    })?;
    let buf_len = block.div_ceil(4096) * 4096;
    let mut bufs = (0..depth)
        .map(|_| AlignedBuf::zeroed(buf_len, 4096))
        .collect::<Result<Vec<_>, _>>()?;
    let (tx, rx) = std::sync::mpsc::channel();
    // Slot `k`'s read: a random place, its completion sent back here.
    let mut rng = seed;
    let mut queue = |bufs: &mut [AlignedBuf], k: usize| {
        let (i, off) = t.pick(&mut rng);
        let tx = tx.clone();
        let read = RingRead {
            fd: t.files[i].fd().as_raw_fd(),
            offset: off,
            dst: bufs[k].as_mut_slice().as_mut_ptr(),
            len: block,
            done: Box::new(move |r| {
                let _ = tx.send((k, i, off, r));
            }),
        };
        // SAFETY: the files outlive this function; slot `k`'s buffer is not touched until its
        // completion has been received, and every completion is received (or the buffers are
        // leaked) before they are freed.
        unsafe { ring.submit(read, true) };
    };
    let mut in_flight = 0;
    for k in 0..depth {
        if !more() {
            break;
        }
        queue(&mut bufs, k);
        in_flight += 1;
    }
    let mut failed: Option<StoreError> = None;
    while in_flight > 0 {
        let Ok((k, i, off, r)) = rx.recv() else {
            // The ring is gone with reads in flight: their buffers may still be written.
            std::mem::forget(bufs);
            return Err(StoreError::Shared("the io_uring reader stopped".into()));
        };
        in_flight -= 1;
        let path = || t.files[i].path().to_path_buf();
        match r {
            Ok(got) if got == block => {
                if failed.is_none() {
                    done(i, off, &bufs[k].as_slice()[..block]);
                    if more() {
                        queue(&mut bufs, k);
                        in_flight += 1;
                    }
                }
            }
            Ok(got) => {
                failed.get_or_insert(StoreError::ShortRead {
                    path: path(),
                    offset: off,
                    wanted: block as u64,
                    got: got as u64,
                });
            }
            Err(e) => {
                failed.get_or_insert(StoreError::Io {
                    path: path(),
                    offset: off,
                    source: e,
                });
            }
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// No io_uring off Linux.
#[cfg(not(target_os = "linux"))]
fn uring_reads(
    t: &Targets,
    _block: usize,
    _depth: usize,
    _seed: u64,
    _more: &dyn Fn() -> bool,
    _done: &mut dyn FnMut(usize, u64, &[u8]),
) -> Result<(), StoreError> {
    Err(StoreError::Io {
        path: t.files[0].path().to_path_buf(),
        offset: 0,
        source: std::io::Error::new(std::io::ErrorKind::Unsupported, "io_uring is Linux only"),
    })
}

/// A scratch file for [`measure_reads`]. Its name is removed as soon as the file is created,
/// and the readers open it again through `/proc/self/fd`, so the space comes back however the
/// process ends (SIGTERM, SIGKILL, a crash) and nothing is left behind in the directory. Where
/// `/proc` is missing the name stays until the file is dropped.
#[derive(Debug)]
pub struct ProbeFile {
    /// Kept open: the only reference to the file once its name is gone.
    _file: std::fs::File,
    /// The path readers open: `/proc/self/fd/N`, or the name where `/proc` is missing.
    path: PathBuf,
    /// The name, while it still exists (removed when dropped).
    named: Option<PathBuf>,
}

impl ProbeFile {
    /// Writes `bytes` of incompressible data to a new file in `dir`, syncs it and drops its
    /// pages from the page cache.
    pub fn create(dir: &Path, bytes: u64) -> Result<ProbeFile, StoreError> {
        use std::os::fd::AsRawFd;
        let name = dir.join(format!(".sluice-doctor-{}.tmp", std::process::id()));
        let io = |e: std::io::Error| StoreError::Write {
            path: name.clone(),
            source: e,
        };
        // A new file only (a file of the user's by that name is neither overwritten nor
        // removed).
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&name)
            .map_err(io)?;
        // The descriptor kept open below is the one the path names.
        let proc = PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()));
        let file = if proc.exists() && std::fs::remove_file(&name).is_ok() {
            ProbeFile {
                _file: f,
                path: proc,
                named: None,
            }
        } else {
            ProbeFile {
                _file: f,
                path: name.clone(),
                named: Some(name.clone()),
            }
        };
        let mut f = &file._file;
        let mut chunk = vec![0u8; 8 << 20];
        let mut rng = 0x5eed_u64;
        let mut left = bytes;
        while left > 0 {
            for w in chunk.chunks_exact_mut(8) {
                w.copy_from_slice(&mix(&mut rng).to_le_bytes());
            }
            let n = left.min(chunk.len() as u64) as usize;
            f.write_all(&chunk[..n]).map_err(io)?;
            left -= n as u64;
        }
        f.sync_all().map_err(io)?;
        let _ = rustix::fs::fadvise(f, 0, None, rustix::fs::Advice::DontNeed);
        Ok(file)
    }

    /// The path to read it by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether its name is still in the directory (only where `/proc` is missing).
    pub fn is_named(&self) -> bool {
        self.named.is_some()
    }
}

impl Drop for ProbeFile {
    fn drop(&mut self) {
        if let Some(n) = &self.named {
            let _ = std::fs::remove_file(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(block: usize, depth: usize, direct: bool, engine: ReadEngine) -> ReadProbe {
        ReadProbe {
            block,
            depth,
            direct,
            engine,
            seconds: 10.0,
            max_bytes: 8 << 20,
            seed: 1,
        }
    }

    #[test]
    fn measures_and_cleans_up() {
        let d = tempfile::tempdir().unwrap();
        let f = ProbeFile::create(d.path(), 4 << 20).unwrap();
        let p = f.path().to_path_buf();
        // The name is gone at once: a killed process leaves nothing behind.
        assert!(!f.is_named());
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 4 << 20);
        for (direct, engine) in [
            (true, ReadEngine::Threads),
            (false, ReadEngine::Threads),
            (true, ReadEngine::Uring),
            (false, ReadEngine::Uring),
        ] {
            let fig = measure_reads(std::slice::from_ref(&p), &probe(1 << 20, 2, direct, engine))
                .unwrap();
            assert!(fig.reads >= 8 && fig.bytes == fig.reads << 20, "{fig:?}");
            assert_eq!(fig.engine, engine);
            assert!(fig.cpu_seconds >= 0.0 && fig.cpu_seconds_per_gb().is_finite());
            if !direct {
                assert_eq!(fig.mode, IoMode::Buffered);
            }
        }
        for engine in [ReadEngine::Threads, ReadEngine::Uring] {
            let mut big = probe(8 << 20, 1, true, engine);
            big.max_bytes = 1;
            assert!(measure_reads(std::slice::from_ref(&p), &big).is_err());
        }
        drop(f);
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
    }

    /// The bytes each engine hands over are the file's bytes at the offset it names, for reads
    /// of an odd size (not a multiple of the page) and more reads in flight than there are
    /// places to read from.
    #[test]
    fn both_engines_read_the_right_bytes() {
        let d = tempfile::tempdir().unwrap();
        let f = ProbeFile::create(d.path(), 1 << 20).unwrap();
        let want = std::fs::read(f.path()).unwrap();
        let block = 3 * 4096 + 512;
        for direct in [false, true] {
            let targets = {
                let file = ShardFile::open(f.path(), direct).unwrap();
                let slots = vec![(file.len() - block as u64) / Targets::align(&file) + 1];
                Targets {
                    total_slots: slots[0],
                    slots,
                    files: vec![file],
                }
            };
            for engine in [ReadEngine::Threads, ReadEngine::Uring] {
                let count = AtomicU64::new(0);
                let bad = std::sync::Mutex::new(Vec::new());
                let more = || count.load(Ordering::Relaxed) < 200;
                let check = |i: usize, off: u64, got: &[u8]| {
                    count.fetch_add(1, Ordering::Relaxed);
                    let o = off as usize;
                    if i != 0 || got != &want[o..o + block] {
                        bad.lock().unwrap().push(off);
                    }
                };
                match engine {
                    ReadEngine::Threads => {
                        thread_reads(&targets, block, 3, 9, &more, &check).unwrap()
                    }
                    ReadEngine::Uring => {
                        uring_reads(&targets, block, 64, 9, &more, &mut |i, o, b| check(i, o, b))
                            .unwrap()
                    }
                }
                assert!(count.load(Ordering::Relaxed) >= 200, "{engine:?}");
                assert!(
                    bad.lock().unwrap().is_empty(),
                    "{engine:?} direct {direct}: {:?}",
                    bad.lock().unwrap()
                );
            }
        }
    }
}
