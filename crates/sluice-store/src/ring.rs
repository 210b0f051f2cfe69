//! Reads queued on one io_uring (Linux): the store's alternative to its reader threads for
//! O_DIRECT shards. One thread owns the ring; readers hand it reads (demand reads ahead of
//! background ones), it keeps at most `depth` of them in flight, queues the rest of a short read
//! again, and calls each read's completion on its own thread once the kernel is done with the
//! buffer. `sluice doctor` measures both ways of reading on the machine at hand.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Called once with the bytes read (fewer than asked only at the end of the file) or the error.
pub(crate) type RingDone = Box<dyn FnOnce(io::Result<usize>) + Send>;

/// One read: `len` bytes at `offset` of `fd` into `dst`.
pub(crate) struct RingRead {
    /// The file, open until the completion is called.
    pub fd: RawFd,
    pub offset: u64,
    /// Valid for writes of `len` bytes, and not otherwise touched, until the completion is
    /// called.
    pub dst: *mut u8,
    pub len: usize,
    pub done: RingDone,
}

// SAFETY: `dst` is written only by the kernel on the ring thread's behalf, over a range its
// submitter gave up until the completion runs (the contract of `RingReader::submit`).
unsafe impl Send for RingRead {}

#[derive(Default)]
struct Queues {
    demand: VecDeque<RingRead>,
    background: VecDeque<RingRead>,
    shutdown: bool,
}

struct RingShared {
    queues: Mutex<Queues>,
    /// Written to wake the ring thread; an eventfd.
    wake: OwnedFd,
}

impl RingShared {
    fn wake(&self) {
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }
}

/// One io_uring and the thread that owns it.
pub(crate) struct RingReader {
    shared: Arc<RingShared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for RingReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RingReader")
    }
}

/// `user_data` of the eventfd's read.
const WAKE: u64 = u64::MAX;

impl RingReader {
    /// A ring keeping at most `depth` reads in flight; an error where the kernel has no
    /// io_uring or refuses it.
    pub(crate) fn new(depth: usize) -> io::Result<RingReader> {
        let depth = depth.max(1);
        let entries = ((depth + 1).next_power_of_two() * 2) as u32;
        // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor that
        // nothing else owns.
        let wake = unsafe {
            let fd = libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd)
        };
        let shared = Arc::new(RingShared {
            queues: Mutex::new(Queues::default()),
            wake,
        });
        let sh = Arc::clone(&shared);
        // The ring is made on the thread that uses it: only that thread ever enters it.
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("sluice-ring".into())
            .spawn(move || match io_uring::IoUring::new(entries) {
                Ok(ring) => {
                    let _ = tx.send(Ok(()));
                    run(ring, &sh, depth);
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            })?;
        if let Err(e) = rx
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("the io_uring thread died")))
        {
            let _ = thread.join();
            return Err(e);
        }
        Ok(RingReader {
            shared,
            thread: Some(thread),
        })
    }

    /// Queues a read (`demand` ahead of background reads).
    ///
    /// # Safety
    /// `r.fd` must stay open, and `r.dst` valid for writes of `r.len` bytes and untouched by
    /// anyone else, until `r.done` has been called.
    pub(crate) unsafe fn submit(&self, r: RingRead, demand: bool) {
        match self.shared.queues.lock() {
            Ok(mut q) => {
                if demand {
                    q.demand.push_back(r);
                } else {
                    q.background.push_back(r);
                }
            }
            Err(_) => {
                (r.done)(Err(io::Error::other("the io_uring reader failed")));
                return;
            }
        }
        self.shared.wake();
    }
}

impl Drop for RingReader {
    fn drop(&mut self) {
        if let Ok(mut q) = self.shared.queues.lock() {
            q.shutdown = true;
        }
        self.shared.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A read in flight and the bytes it has so far.
struct InFlight {
    read: RingRead,
    got: usize,
}

/// Calls a completion; a panic in it must not take the ring thread (and every read after it)
/// down.
fn complete(done: RingDone, r: io::Result<usize>) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || done(r)));
}

/// Queues the rest of slot `k`'s read; false when the submission queue is full (it never is:
/// it holds twice `depth` + 1 entries and at most `depth` + 1 are queued).
fn push(ring: &mut io_uring::IoUring, k: usize, f: &InFlight) -> bool {
    use io_uring::{opcode, types};
    let r = &f.read;
    let left = r.len - f.got;
    // SAFETY: `got < len`, so the range stays inside the buffer the submitter gave.
    let dst = unsafe { r.dst.add(f.got) };
    let e = opcode::Read::new(types::Fd(r.fd), dst, left.min(u32::MAX as usize) as u32)
        .offset(r.offset + f.got as u64)
        .build()
        .user_data(k as u64);
    // SAFETY: the fd and buffer stay valid until the completion is reaped (the submitter's
    // contract; the slot is freed only then).
    unsafe { ring.submission().push(&e) }.is_ok()
}

/// The ring thread: keeps up to `depth` reads in flight until shut down with nothing left.
fn run(mut ring: io_uring::IoUring, sh: &RingShared, depth: usize) {
    use io_uring::{opcode, types};
    let mut slots: Vec<Option<InFlight>> = (0..depth).map(|_| None).collect();
    let mut in_flight = 0usize;
    // The eventfd's counter lands here; a read of it is always queued, so that a submitter's
    // wake-up ends the wait for completions. Leaked: the kernel may hold the last read of it
    // until the ring is torn down.
    let wake_buf: &'static mut [u8; 8] = Box::leak(Box::new([0u8; 8]));
    let wake_ptr = wake_buf.as_mut_ptr();
    let arm = |ring: &mut io_uring::IoUring| {
        let e = opcode::Read::new(types::Fd(sh.wake.as_raw_fd()), wake_ptr, 8)
            .build()
            .user_data(WAKE);
        // SAFETY: the eventfd lives as long as `sh`, beyond the ring; the buffer is leaked.
        unsafe { ring.submission().push(&e) }.is_ok()
    };
    let mut armed = arm(&mut ring);
    let mut done = Vec::new();
    loop {
        // Take queued reads into free slots, demand first.
        let shutdown = {
            let Ok(mut q) = sh.queues.lock() else { break };
            while in_flight < depth {
                let Some(read) = q.demand.pop_front().or_else(|| q.background.pop_front()) else {
                    break;
                };
                let Some(k) = slots.iter().position(Option::is_none) else {
                    q.demand.push_front(read);
                    break;
                };
                let f = InFlight { read, got: 0 };
                if push(&mut ring, k, &f) {
                    slots[k] = Some(f);
                    in_flight += 1;
                } else {
                    q.demand.push_front(f.read);
                    break;
                }
            }
            q.shutdown && q.demand.is_empty() && q.background.is_empty()
        };
        if shutdown && in_flight == 0 {
            break;
        }
        if !armed {
            armed = arm(&mut ring);
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                ) => {}
            Err(_) => {
                // Reads in flight still own their buffers: wait and try again, never drop them.
                std::thread::sleep(std::time::Duration::from_millis(1));
                continue;
            }
        }
        done.clear();
        done.extend(ring.completion().map(|c| (c.user_data(), c.result())));
        for &(k, res) in &done {
            if k == WAKE {
                armed = false;
                continue;
            }
            let k = k as usize;
            let Some(mut f) = slots[k].take() else {
                continue;
            };
            in_flight -= 1;
            if res == -libc::EINTR || res == -libc::EAGAIN {
                if push(&mut ring, k, &f) {
                    slots[k] = Some(f);
                    in_flight += 1;
                } else {
                    complete(f.read.done, Err(io::Error::from_raw_os_error(-res)));
                }
                continue;
            }
            if res < 0 {
                complete(f.read.done, Err(io::Error::from_raw_os_error(-res)));
                continue;
            }
            f.got += res as usize;
            if res > 0 && f.got < f.read.len {
                if push(&mut ring, k, &f) {
                    slots[k] = Some(f);
                    in_flight += 1;
                    continue;
                }
                complete(f.read.done, Err(io::Error::other("io_uring queue full")));
                continue;
            }
            complete(f.read.done, Ok(f.got));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::mpsc;

    /// Every read lands with the file's bytes, demand and background alike, with more reads
    /// queued than fit in flight, one running into the end of the file (a short count) and one
    /// on a descriptor that is not open (an error, which the ring survives).
    #[test]
    fn reads_land_with_the_files_bytes() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let data: Vec<u8> = (0..256 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::File::create(&p).unwrap().write_all(&data).unwrap();
        let file = std::fs::File::open(&p).unwrap();
        let ring = RingReader::new(3).unwrap();
        let (tx, rx) = mpsc::channel();
        let mut bufs: Vec<Vec<u8>> = (0..40).map(|_| vec![0u8; 10_000]).collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            let tx = tx.clone();
            // The last read starts 4,000 bytes before the end of the file.
            let offset = if i == 39 {
                data.len() as u64 - 4000
            } else {
                i as u64 * 6007
            };
            let r = RingRead {
                fd: file.as_raw_fd(),
                offset,
                dst: b.as_mut_ptr(),
                len: b.len(),
                done: Box::new(move |r| tx.send((i, offset, r.unwrap())).unwrap()),
            };
            // SAFETY: the file and the buffers outlive every completion (all are received
            // below before either is dropped).
            unsafe { ring.submit(r, i % 2 == 0) };
        }
        let mut b = [0u8; 16];
        {
            let tx = tx.clone();
            let r = RingRead {
                fd: -1,
                offset: 0,
                dst: b.as_mut_ptr(),
                len: b.len(),
                done: Box::new(move |r| tx.send((usize::MAX, 0, r.map_or(7, |_| 0))).unwrap()),
            };
            // SAFETY: as above; `b` lives until the completion is received.
            unsafe { ring.submit(r, true) };
        }
        let mut all: Vec<(usize, u64, usize)> = rx.iter().take(41).collect();
        all.sort();
        assert_eq!(
            all.pop(),
            Some((usize::MAX, 0, 7)),
            "a read of a bad descriptor fails"
        );
        let got = all;
        drop(ring);
        assert_eq!(got.len(), 40);
        for (i, offset, n) in got {
            let o = offset as usize;
            let want = (data.len() - o).min(10_000);
            assert_eq!(n, want, "read {i}");
            assert_eq!(bufs[i][..n], data[o..o + n], "read {i}");
        }
    }
}
