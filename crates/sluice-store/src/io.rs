//! Reading byte ranges of checkpoint shards in place: O_DIRECT where the file system allows it,
//! buffered reads that drop their pages otherwise.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rustix::fd::OwnedFd;
use rustix::fs::{Mode, OFlags};

use crate::ring::RingReader;
#[cfg(target_os = "linux")]
use crate::ring::{RingDone, RingRead};
use crate::{AlignedBuf, StoreError};

/// How a shard is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoMode {
    /// `O_DIRECT`: no page cache, aligned reads into aligned buffers.
    Direct,
    /// Buffered reads whose pages are dropped after use (`posix_fadvise(DONTNEED)`); used where
    /// O_DIRECT is refused (tmpfs, some overlay file systems) or not wanted.
    Buffered,
}

impl IoMode {
    /// Name as reported in stats: `direct` or `buffered`.
    pub fn name(self) -> &'static str {
        match self {
            IoMode::Direct => "direct",
            IoMode::Buffered => "buffered",
        }
    }
}

impl fmt::Display for IoMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A byte range of one shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Piece {
    /// Shard index.
    pub shard: u32,
    /// Absolute offset in the shard.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// Whether `path` lives in memory (tmpfs, ramfs): there is no page cache to bypass, so
/// O_DIRECT buys nothing (recent kernels accept it on tmpfs anyway) and buffered reads are used.
fn in_memory_fs(path: &Path) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    rustix::fs::statfs(path).is_ok_and(|s| {
        // `f_type`'s integer type differs between platforms.
        #[allow(clippy::unnecessary_cast)]
        let t = s.f_type as i64;

        t == TMPFS_MAGIC || t == RAMFS_MAGIC
    })
}

/// One open shard.
#[derive(Debug)]
pub struct ShardFile {
    path: PathBuf,
    fd: OwnedFd,
    mode: IoMode,
    align: usize,
    len: u64,
}

/// The default O_DIRECT alignment when the kernel reports none.
pub const DEFAULT_ALIGN: usize = 4096;

impl ShardFile {
    /// Opens a shard for reading, with O_DIRECT when `direct` is asked and the file system
    /// accepts it (probed with a real read), else buffered.
    pub fn open(path: &Path, direct: bool) -> Result<ShardFile, StoreError> {
        let err = |e: rustix::io::Errno| StoreError::Io {
            path: path.to_path_buf(),
            offset: 0,
            source: io::Error::from(e),
        };
        let flags = OFlags::RDONLY | OFlags::CLOEXEC;
        let buffered = || rustix::fs::open(path, flags, Mode::empty()).map_err(err);
        let stat = rustix::fs::statx(
            rustix::fs::CWD,
            path,
            rustix::fs::AtFlags::empty(),
            rustix::fs::StatxFlags::SIZE | rustix::fs::StatxFlags::DIOALIGN,
        )
        .map_err(err)?;
        let len = stat.stx_size;
        let reported = if stat.stx_mask & rustix::fs::StatxFlags::DIOALIGN.bits() != 0 {
            stat.stx_dio_offset_align.max(stat.stx_dio_mem_align) as usize
        } else {
            0
        };
        if direct && (cfg!(target_os = "linux")) {
            // DIOALIGN reports 0 when the file system does not support direct I/O.
            let align = if reported.is_power_of_two() {
                reported.max(512)
            } else {
                DEFAULT_ALIGN
            };
            let supported =
                stat.stx_mask & rustix::fs::StatxFlags::DIOALIGN.bits() == 0 || reported != 0;
            if supported
                && !in_memory_fs(path)
                && let Ok(fd) = rustix::fs::open(path, flags | OFlags::DIRECT, Mode::empty())
            {
                let f = ShardFile {
                    path: path.to_path_buf(),
                    fd,
                    mode: IoMode::Direct,
                    align,
                    len,
                };
                // Some file systems accept the flag at open and refuse the read: probe.
                if len == 0 || f.probe().is_ok() {
                    return Ok(f);
                }
            }
        }
        Ok(ShardFile {
            path: path.to_path_buf(),
            fd: buffered()?,
            mode: IoMode::Buffered,
            align: 1,
            len,
        })
    }

    fn probe(&self) -> io::Result<()> {
        let mut b = AlignedBuf::zeroed(self.align, self.align).map_err(io::Error::other)?;
        rustix::io::pread(&self.fd, b.as_mut_slice(), 0)?;
        Ok(())
    }

    /// The path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The I/O mode in use.
    pub fn mode(&self) -> IoMode {
        self.mode
    }

    /// The read alignment (1 for buffered reads).
    pub fn align(&self) -> usize {
        self.align
    }

    /// Length when opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file was empty when opened.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The open descriptor.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Drops cached pages of a range, widened to whole pages (buffered mode only; a no-op for
    /// O_DIRECT).
    pub fn drop_pages(&self, offset: u64, len: u64) {
        if self.mode == IoMode::Buffered {
            let page = rustix::param::page_size() as u64;
            let start = offset / page * page;
            let end = (offset + len).div_ceil(page) * page;
            let len = std::num::NonZeroU64::new(end - start);
            let _ = rustix::fs::fadvise(&self.fd, start, len, rustix::fs::Advice::DontNeed);
        }
    }
}

/// Where bytes come from. The real implementation is [`ShardSet`]; tests inject faults by
/// wrapping it.
pub trait Reader: Send + Sync + fmt::Debug {
    /// Reads up to `buf.len()` bytes at `offset` of shard `shard`, like `pread`.
    fn read_at(&self, shard: u32, offset: u64, buf: &mut [u8]) -> io::Result<usize>;
    /// Alignment that offsets, lengths and buffer addresses must have for this shard.
    fn align(&self, shard: u32) -> usize;
    /// The path of a shard, for error messages.
    fn path(&self, shard: u32) -> &Path;
    /// The I/O mode of a shard.
    fn mode(&self, shard: u32) -> IoMode;
    /// Called after the bytes of a range have been copied out (drops page-cache pages).
    fn done(&self, _shard: u32, _offset: u64, _len: u64) {}
    /// A descriptor reads of this shard may be queued on an io_uring with, bypassing
    /// [`read_at`](Reader::read_at) (whose bytes are then reported to
    /// [`count_read`](Reader::count_read)); `None` keeps every read on `read_at`.
    fn raw_fd(&self, _shard: u32) -> Option<std::os::fd::RawFd> {
        None
    }
    /// Counts bytes read outside [`read_at`](Reader::read_at).
    fn count_read(&self, _bytes: u64) {}
}

/// The shards of a checkpoint, open for reading.
#[derive(Debug)]
pub struct ShardSet {
    files: Vec<ShardFile>,
    bytes_read: AtomicU64,
}

impl ShardSet {
    /// Opens every path (O_DIRECT where possible when `direct`).
    pub fn open<P: AsRef<Path>>(paths: &[P], direct: bool) -> Result<ShardSet, StoreError> {
        let files = paths
            .iter()
            .map(|p| ShardFile::open(p.as_ref(), direct))
            .collect::<Result<_, _>>()?;
        Ok(ShardSet {
            files,
            bytes_read: AtomicU64::new(0),
        })
    }

    /// The open shards.
    pub fn files(&self) -> &[ShardFile] {
        &self.files
    }

    /// The mode most shards use (`direct` if any shard is direct).
    pub fn mode(&self) -> IoMode {
        if self.files.iter().any(|f| f.mode == IoMode::Direct) {
            IoMode::Direct
        } else {
            IoMode::Buffered
        }
    }

    /// Bytes read from disk so far (including alignment widening).
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }
}

impl Reader for ShardSet {
    fn read_at(&self, shard: u32, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let f = self
            .files
            .get(shard as usize)
            .ok_or_else(|| io::Error::other("no such shard"))?;
        let n = rustix::io::pread(&f.fd, buf, offset)?;
        self.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    fn align(&self, shard: u32) -> usize {
        self.files.get(shard as usize).map_or(1, |f| f.align)
    }

    /// O_DIRECT shards only: a buffered read on an io_uring goes to the kernel's own worker
    /// threads, no better than the reader pool.
    fn raw_fd(&self, shard: u32) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.files
            .get(shard as usize)
            .filter(|f| f.mode == IoMode::Direct)
            .map(|f| f.fd.as_raw_fd())
    }

    fn count_read(&self, bytes: u64) {
        self.bytes_read.fetch_add(bytes, Ordering::Relaxed);
    }

    fn path(&self, shard: u32) -> &Path {
        self.files
            .get(shard as usize)
            .map_or(Path::new("?"), |f| &f.path)
    }

    fn mode(&self, shard: u32) -> IoMode {
        self.files
            .get(shard as usize)
            .map_or(IoMode::Buffered, |f| f.mode)
    }

    fn done(&self, shard: u32, offset: u64, len: u64) {
        if let Some(f) = self.files.get(shard as usize) {
            f.drop_pages(offset, len);
        }
    }
}

/// The bytes of several pieces, read together.
pub struct Blob {
    buf: AlignedBuf,
    spans: Vec<(usize, usize)>,
}

impl fmt::Debug for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Blob({} pieces, {} bytes)",
            self.spans.len(),
            self.buf.len()
        )
    }
}

impl Blob {
    /// The bytes of piece `i`.
    ///
    /// # Panics
    /// When `i` is out of range.
    pub fn piece(&self, i: usize) -> &[u8] {
        let (s, l) = self.spans[i];
        &self.buf.as_slice()[s..s + l]
    }

    /// Number of pieces.
    pub fn pieces(&self) -> usize {
        self.spans.len()
    }

    /// The buffer, to be read into again.
    pub(crate) fn into_buf(self) -> AlignedBuf {
        self.buf
    }

    /// Bytes held in memory (including alignment padding).
    pub fn footprint(&self) -> usize {
        self.buf.len()
    }

    /// A blob built from bytes already in memory (one piece per slice).
    pub fn from_slices(parts: &[&[u8]]) -> Result<Blob, StoreError> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut buf = AlignedBuf::zeroed(total, 64)?;
        let mut spans = Vec::with_capacity(parts.len());
        let mut at = 0;
        for p in parts {
            buf.as_mut_slice()[at..at + p.len()].copy_from_slice(p);
            spans.push((at, p.len()));
            at += p.len();
        }
        Ok(Blob { buf, spans })
    }
}

/// One read: a run of pieces contiguous in one shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// Shard.
    pub shard: u32,
    /// Aligned start offset in the shard.
    pub start: u64,
    /// Aligned length.
    pub len: u64,
    /// Bytes from `start` that carry payload (the rest is alignment padding).
    pub need: u64,
    /// Where the run starts in the blob buffer.
    pub buf_at: usize,
}

/// The reads needed for a list of pieces: contiguous pieces merge into one read, each widened
/// to the shard's alignment. Returns the runs, the span of every piece in the buffer, and the
/// buffer size.
pub fn plan_reads(reader: &dyn Reader, pieces: &[Piece]) -> (Vec<Run>, Vec<(usize, usize)>, usize) {
    let mut runs: Vec<Run> = Vec::new();
    let mut spans = Vec::with_capacity(pieces.len());
    let mut buf_len = 0usize;
    let mut i = 0;
    while i < pieces.len() {
        let first = pieces[i];
        let mut end = first.offset + first.len;
        let mut j = i + 1;
        while j < pieces.len() && pieces[j].shard == first.shard && pieces[j].offset == end {
            end += pieces[j].len;
            j += 1;
        }
        let a = reader.align(first.shard).max(1) as u64;
        let start = first.offset / a * a;
        let aligned_end = end.div_ceil(a) * a;
        let buf_at = buf_len.div_ceil(a as usize) * a as usize;
        for p in &pieces[i..j] {
            spans.push((buf_at + (p.offset - start) as usize, p.len as usize));
        }
        runs.push(Run {
            shard: first.shard,
            start,
            len: aligned_end - start,
            need: end - start,
            buf_at,
        });
        buf_len = buf_at + (aligned_end - start) as usize;
        i = j;
    }
    (runs, spans, buf_len)
}

/// The alignment a buffer for `runs` needs: the strictest of their shards', and at least a
/// cache line.
fn buffer_align(reader: &dyn Reader, runs: &[Run]) -> usize {
    runs.iter()
        .map(|r| reader.align(r.shard))
        .max()
        .unwrap_or(1)
        .max(64)
}

/// Reads pieces into one aligned blob: one read per run of contiguous pieces.
pub fn read_blob(reader: &dyn Reader, pieces: &[Piece]) -> Result<Blob, StoreError> {
    let (runs, spans, buf_len) = plan_reads(reader, pieces);
    let align = buffer_align(reader, &runs);
    let mut buf = AlignedBuf::zeroed(buf_len, align)?;
    for run in &runs {
        read_run(
            reader,
            run,
            &mut buf.as_mut_slice()[run.buf_at..run.buf_at + run.len as usize],
        )?;
    }
    Ok(Blob { buf, spans })
}

/// A completion callback of [`read_blob_parts`].
pub(crate) type BlobDone = Box<dyn FnOnce(Result<Blob, StoreError>) + Send>;

/// The address of a buffer that several jobs fill at disjoint ranges.
struct FillPtr(*mut u8);
// SAFETY: the pointer is only dereferenced by `read_blob_parts`' jobs, each over its own range.
unsafe impl Send for FillPtr {}
// SAFETY: as above; no two jobs touch the same byte.
unsafe impl Sync for FillPtr {}

/// A blob being filled by several part reads.
struct Filling {
    /// Owns the memory `base` points into; taken by the job that lands last.
    buf: Mutex<Option<AlignedBuf>>,
    base: FillPtr,
    spans: Vec<(usize, usize)>,
    left: AtomicUsize,
    err: Mutex<Option<StoreError>>,
    done: Mutex<Option<BlobDone>>,
}

/// Counts one part as landed when dropped, even if its read panicked; the last one hands the
/// blob (or the first error) to the completion callback.
struct PartLanded {
    fill: Arc<Filling>,
    ok: bool,
}

impl PartLanded {
    /// The part's read ran to its end (successfully or with an error it recorded).
    fn succeed(&mut self) {
        self.ok = true;
    }
}

impl Drop for PartLanded {
    fn drop(&mut self) {
        let f = &self.fill;
        if !self.ok
            && let Ok(mut e) = f.err.lock()
        {
            e.get_or_insert(StoreError::Shared("a reader thread panicked".into()));
        }
        if f.left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let err = f.err.lock().ok().and_then(|mut e| e.take());
        let buf = f.buf.lock().ok().and_then(|mut b| b.take());
        let r = match (err, buf) {
            (Some(e), _) => Err(e),
            (None, Some(buf)) => Ok(Blob {
                buf,
                spans: f.spans.clone(),
            }),
            (None, None) => Err(StoreError::Shared("a part read lost its buffer".into())),
        };
        if let Some(done) = f.done.lock().ok().and_then(|mut d| d.take()) {
            done(r);
        }
    }
}

/// Reads pieces into one aligned blob of at least `size` bytes like [`read_blob`] — into
/// `recycled` when it has that size and the alignment (its old bytes are overwritten wherever a
/// piece lies; padding may keep them) — but as reads of at most `part` bytes
/// (rounded up to the alignment) handed to `spawn`, so several are in flight for one blob and a
/// queue of blobs completes one after another rather than all at the end. With `ring`, the parts
/// of O_DIRECT shards are queued on that io_uring instead (`true`: ahead of background reads).
/// `done` receives the blob, or the first error, when the last part lands (on the thread that
/// read it, or the ring's).
#[allow(clippy::too_many_arguments)]
pub(crate) fn read_blob_parts(
    reader: &Arc<dyn Reader>,
    pieces: &[Piece],
    recycled: Option<AlignedBuf>,
    size: usize,
    part: u64,
    spawn: &dyn Fn(Box<dyn FnOnce() + Send>),
    ring: Option<(&RingReader, bool)>,
    done: BlobDone,
) {
    let (runs, spans, buf_len) = plan_reads(reader.as_ref(), pieces);
    let align = buffer_align(reader.as_ref(), &runs);
    let size = size.max(buf_len);
    let reuse = recycled.filter(|b| b.len() == size && b.is_aligned_to(align));
    let mut buf = match reuse.map_or_else(|| AlignedBuf::zeroed(size, align), Ok) {
        Ok(b) => b,
        Err(e) => return done(Err(e)),
    };
    let part = part.max(1).div_ceil(align as u64) * align as u64;
    let mut parts = Vec::new();
    for run in &runs {
        let mut off = 0;
        while off < run.len {
            let len = part.min(run.len - off);
            parts.push(Run {
                shard: run.shard,
                start: run.start + off,
                len,
                need: len.min(run.need.saturating_sub(off)),
                buf_at: run.buf_at + off as usize,
            });
            off += len;
        }
    }
    if parts.is_empty() {
        return done(Ok(Blob { buf, spans }));
    }
    let base = FillPtr(buf.as_mut_slice().as_mut_ptr());
    let fill = Arc::new(Filling {
        buf: Mutex::new(Some(buf)),
        base,
        spans,
        left: AtomicUsize::new(parts.len()),
        err: Mutex::new(None),
        done: Mutex::new(Some(done)),
    });
    for p in parts {
        let mut landed = PartLanded {
            fill: Arc::clone(&fill),
            ok: false,
        };
        let reader = Arc::clone(reader);
        #[cfg(target_os = "linux")]
        if let Some((ring, demand)) = ring
            && let Some(fd) = reader.raw_fd(p.shard)
        {
            // SAFETY: as below, `p` lies inside the buffer, which stays alive in `fill.buf`
            // until this part has landed: the completion holds `landed`.
            let dst = unsafe { fill.base.0.add(p.buf_at) };
            let (start, len) = (p.start, p.len as usize);
            let done: RingDone = Box::new(move |r| {
                let f = &landed.fill;
                // SAFETY: the kernel has finished writing the range; it is this part's alone.
                let dst = unsafe { std::slice::from_raw_parts_mut(f.base.0.add(p.buf_at), len) };
                let r = match r {
                    Ok(got) => {
                        reader.count_read(got as u64);
                        finish_run(reader.as_ref(), &p, dst, got)
                    }
                    Err(e) => Err(StoreError::Io {
                        path: reader.path(p.shard).to_path_buf(),
                        offset: p.start,
                        source: e,
                    }),
                };
                if let Err(e) = r
                    && let Ok(mut slot) = f.err.lock()
                {
                    slot.get_or_insert(e);
                }
                landed.succeed();
            });
            let read = RingRead {
                fd,
                offset: start,
                dst,
                len,
                done,
            };
            // SAFETY: the reader the completion holds keeps `fd` open; the range of `dst` is
            // this part's alone and lives until the completion has run.
            unsafe { ring.submit(read, demand) };
            continue;
        }
        #[cfg(not(target_os = "linux"))]
        let _ = ring;
        spawn(Box::new(move || {
            let f = &landed.fill;
            // SAFETY: `p` lies inside the buffer (`plan_reads` sized it to hold every run) and
            // no other part overlaps it; the buffer stays alive in `f.buf` until the last part
            // has landed, and nothing else reads or writes it before then.
            let dst =
                unsafe { std::slice::from_raw_parts_mut(f.base.0.add(p.buf_at), p.len as usize) };
            if let Err(e) = read_run(reader.as_ref(), &p, dst)
                && let Ok(mut slot) = f.err.lock()
            {
                slot.get_or_insert(e);
            }
            landed.succeed();
        }));
    }
}

/// Reads one run into `dst` (exactly `run.len` bytes, aligned), checking that every payload byte
/// arrived; bytes past the end of the file are set to zero (`dst` may be a reused buffer).
pub fn read_run(reader: &dyn Reader, run: &Run, dst: &mut [u8]) -> Result<(), StoreError> {
    let mut got = 0usize;
    while got < dst.len() {
        match reader.read_at(run.shard, run.start + got as u64, &mut dst[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(StoreError::Io {
                    path: reader.path(run.shard).to_path_buf(),
                    offset: run.start + got as u64,
                    source: e,
                });
            }
        }
    }
    finish_run(reader, run, dst, got)
}

/// The end of a run's read that got `got` bytes into `dst`: the rest (past the end of the file)
/// zeroed, the reader told, and every payload byte checked to have arrived.
fn finish_run(
    reader: &dyn Reader,
    run: &Run,
    dst: &mut [u8],
    got: usize,
) -> Result<(), StoreError> {
    let need = run.need as usize;
    let got = got.min(dst.len());
    dst[got..].fill(0);
    reader.done(run.shard, run.start, run.len);
    if got < need {
        return Err(StoreError::ShortRead {
            path: reader.path(run.shard).to_path_buf(),
            offset: run.start,
            wanted: need as u64,
            got: got as u64,
        });
    }
    Ok(())
}

/// Pages of a file that are in the page cache, and all its pages (Linux `mincore`).
///
/// Used to prove that O_DIRECT reads (and buffered reads that drop their pages) leave nothing
/// cached.
pub fn page_cache_residency(path: &Path) -> io::Result<(usize, usize)> {
    let f = std::fs::File::open(path)?;
    let len = f.metadata()?.len() as usize;
    if len == 0 {
        return Ok((0, 0));
    }
    // SAFETY: the mapping is never read or written, only handed to mincore, so a concurrent
    // change to the file cannot fault this process.
    let map = unsafe { memmap2::Mmap::map(&f)? };
    let page = rustix::param::page_size();
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: `map` is a live mapping of `len` bytes starting at a page boundary, and `vec`
    // holds one byte per page of it, as mincore requires.
    let r = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, len, vec.as_mut_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((vec.iter().filter(|&&b| b & 1 != 0).count(), vec.len()))
}

/// Whether a file descriptor was opened with O_DIRECT.
pub fn has_direct_flag(fd: &OwnedFd) -> io::Result<bool> {
    Ok(rustix::fs::fcntl_getfl(fd)?.contains(OFlags::DIRECT))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(bytes: &[u8]) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new_in(std::env::temp_dir()).unwrap();
        std::fs::write(f.path(), bytes).unwrap();
        f
    }

    #[test]
    fn reads_pieces_in_place() {
        let data: Vec<u8> = (0..20000u32).map(|i| (i * 7 % 251) as u8).collect();
        let f = file_with(&data);
        for direct in [false, true] {
            let set = ShardSet::open(&[f.path()], direct).unwrap();
            let pieces = [
                Piece {
                    shard: 0,
                    offset: 5,
                    len: 100,
                },
                Piece {
                    shard: 0,
                    offset: 105,
                    len: 7,
                },
                Piece {
                    shard: 0,
                    offset: 9000,
                    len: 10000,
                },
                Piece {
                    shard: 0,
                    offset: 19999,
                    len: 1,
                },
            ];
            let b = read_blob(&set, &pieces).unwrap();
            for (i, p) in pieces.iter().enumerate() {
                assert_eq!(
                    b.piece(i),
                    &data[p.offset as usize..(p.offset + p.len) as usize]
                );
            }
            let (runs, _, _) = plan_reads(&set, &pieces);
            // The first two pieces are contiguous: one read for them.
            assert_eq!(runs.len(), 3);
            for r in &runs {
                assert_eq!(r.start % set.align(0) as u64, 0);
                assert_eq!(r.len % set.align(0) as u64, 0);
            }
        }
    }

    #[test]
    fn short_read_is_an_error() {
        let f = file_with(&[1u8; 1000]);
        let set = ShardSet::open(&[f.path()], false).unwrap();
        std::fs::write(f.path(), [1u8; 10]).unwrap();
        let e = read_blob(
            &set,
            &[Piece {
                shard: 0,
                offset: 0,
                len: 1000,
            }],
        )
        .unwrap_err();
        assert!(
            matches!(
                e,
                StoreError::ShortRead {
                    wanted: 1000,
                    got: 10,
                    ..
                }
            ),
            "{e}"
        );
    }
}
