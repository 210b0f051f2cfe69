//! Measuring a disk the way the store reads it: random reads of one size (an expert's, say) at
//! random aligned offsets of some files, with a number of reads in flight, O_DIRECT or buffered
//! with the pages dropped after each read — so every byte counted came from the device.
//!
//! `sluice doctor` reports these figures, and `sluice bench` uses the same method on a model's
//! own shards for the disk bandwidth its I/O floor is computed from.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::io::{IoMode, ShardFile};
use crate::{AlignedBuf, StoreError};

/// One read measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadProbe {
    /// Bytes per read.
    pub block: usize,
    /// Reads in flight (one reader thread each, issuing `pread`).
    pub depth: usize,
    /// Ask for O_DIRECT (files that refuse it are read buffered; the figure says which ran).
    pub direct: bool,
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
    /// Reads completed.
    pub reads: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Wall-clock seconds.
    pub seconds: f64,
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

    /// Mean latency of one read in milliseconds (each reader has one read in flight).
    pub fn latency_ms(&self) -> f64 {
        if self.reads == 0 {
            0.0
        } else {
            1e3 * self.seconds * self.depth as f64 / self.reads as f64
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
    // Where a read may start in each file: aligned offsets in [0, len - block].
    let align = |f: &ShardFile| f.align().max(4096) as u64;
    let slots: Vec<u64> = files
        .iter()
        .map(|f| (f.len() - block as u64) / align(f) + 1)
        .collect();
    let total_slots: u64 = slots.iter().sum();
    let buf_len = block.div_ceil(4096) * 4096;
    let bytes = AtomicU64::new(0);
    let reads = AtomicU64::new(0);
    let depth = probe.depth.max(1);
    let t0 = Instant::now();
    let errors: Vec<StoreError> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..depth)
            .map(|t| {
                let (files, slots, bytes, reads) = (&files, &slots, &bytes, &reads);
                s.spawn(move || -> Result<(), StoreError> {
                    let mut buf = AlignedBuf::zeroed(buf_len, 4096)?;
                    let mut rng = probe.seed ^ (t as u64).wrapping_mul(0x2545_f491_4f6c_dd1d);
                    while t0.elapsed().as_secs_f64() < probe.seconds
                        && bytes.load(Ordering::Relaxed) < probe.max_bytes
                    {
                        let mut r = mix(&mut rng) % total_slots;
                        let mut i = 0;
                        while r >= slots[i] {
                            r -= slots[i];
                            i += 1;
                        }
                        let f = &files[i];
                        let off = r * align(f);
                        let dst = &mut buf.as_mut_slice()[..block];
                        let mut got = 0;
                        while got < block {
                            match rustix::io::pread(f.fd(), &mut dst[got..], off + got as u64) {
                                Ok(0) => break,
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
                        f.drop_pages(off, block as u64);
                        bytes.fetch_add(got as u64, Ordering::Relaxed);
                        reads.fetch_add(1, Ordering::Relaxed);
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
    let seconds = t0.elapsed().as_secs_f64();
    if let Some(e) = errors.into_iter().next() {
        return Err(e);
    }
    Ok(ReadFigure {
        block,
        depth,
        mode,
        reads: reads.into_inner(),
        bytes: bytes.into_inner(),
        seconds,
    })
}

/// A scratch file for [`measure_reads`], removed when dropped.
#[derive(Debug)]
pub struct ProbeFile {
    path: PathBuf,
}

impl ProbeFile {
    /// Writes `bytes` of incompressible data to a new file in `dir`, syncs it and drops its
    /// pages from the page cache.
    pub fn create(dir: &Path, bytes: u64) -> Result<ProbeFile, StoreError> {
        let path = dir.join(format!(".sluice-doctor-{}.tmp", std::process::id()));
        let io = |e: std::io::Error| StoreError::Write {
            path: path.clone(),
            source: e,
        };
        // A new file only (a file of the user's by that name is neither overwritten nor, by
        // the guard below, removed).
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io)?;
        let file = ProbeFile { path: path.clone() };
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
        let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed);
        Ok(file)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ProbeFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_and_cleans_up() {
        let d = tempfile::tempdir().unwrap();
        let f = ProbeFile::create(d.path(), 4 << 20).unwrap();
        let p = f.path().to_path_buf();
        for direct in [true, false] {
            let fig = measure_reads(
                std::slice::from_ref(&p),
                &ReadProbe {
                    block: 1 << 20,
                    depth: 2,
                    direct,
                    seconds: 10.0,
                    max_bytes: 8 << 20,
                    seed: 1,
                },
            )
            .unwrap();
            assert!(fig.reads >= 8 && fig.bytes == fig.reads << 20, "{fig:?}");
            if !direct {
                assert_eq!(fig.mode, IoMode::Buffered);
            }
        }
        assert!(
            measure_reads(
                std::slice::from_ref(&p),
                &ReadProbe {
                    block: 8 << 20,
                    depth: 1,
                    direct: true,
                    seconds: 1.0,
                    max_bytes: 1,
                    seed: 1
                }
            )
            .is_err()
        );
        drop(f);
        assert!(!p.exists());
    }
}
