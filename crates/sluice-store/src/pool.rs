//! A small pool of reader threads: several reads in flight, demand reads ahead of prefetches.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

type Job = Box<dyn FnOnce() + Send + 'static>;

#[derive(Default)]
struct Queues {
    demand: VecDeque<Job>,
    background: VecDeque<Job>,
    shutdown: bool,
}

struct PoolShared {
    queues: Mutex<Queues>,
    cond: Condvar,
}

/// Reader threads. With zero threads every job runs on the caller's thread.
pub(crate) struct ReaderPool {
    shared: Arc<PoolShared>,
    threads: Vec<JoinHandle<()>>,
}

impl ReaderPool {
    /// A pool of `n` threads.
    pub(crate) fn new(n: usize) -> ReaderPool {
        let shared = Arc::new(PoolShared {
            queues: Mutex::new(Queues::default()),
            cond: Condvar::new(),
        });
        let threads = (0..n)
            .filter_map(|i| {
                let sh = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("sluice-reader-{i}"))
                    .spawn(move || worker(&sh))
                    .ok()
            })
            .collect();
        ReaderPool { shared, threads }
    }

    /// Runs a background job (a prefetch) when a reader is free; inline without readers.
    pub(crate) fn spawn(&self, f: impl FnOnce() + Send + 'static) {
        self.enqueue(Box::new(f), false);
    }

    /// Runs jobs ahead of background work and waits for all; results in the order given
    /// (`None` for a job that panicked).
    /// Queues a demand job (ahead of background ones) without waiting for it; with no reader
    /// threads it runs at once on the caller's thread.
    pub(crate) fn submit(&self, f: impl FnOnce() + Send + 'static) {
        self.enqueue(Box::new(f), true);
    }

    /// Queues a job on the demand or background queue; with no reader threads it runs at once
    /// (a panic in it is caught, as on a reader).
    fn enqueue(&self, f: Job, demand: bool) {
        if self.threads.is_empty() {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            return;
        }
        if let Ok(mut q) = self.shared.queues.lock() {
            if demand {
                q.demand.push_back(f);
            } else {
                q.background.push_back(f);
            }
        }
        self.shared.cond.notify_one();
    }
}

fn worker(sh: &PoolShared) {
    loop {
        let job = {
            let Ok(mut q) = sh.queues.lock() else { return };
            loop {
                if let Some(j) = q.demand.pop_front().or_else(|| q.background.pop_front()) {
                    break j;
                }
                if q.shutdown {
                    return;
                }
                q = match sh.cond.wait(q) {
                    Ok(q) => q,
                    Err(_) => return,
                };
            }
        };
        // A panicking job must not take a reader down with it; its caller sees no result.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    }
}

impl Drop for ReaderPool {
    fn drop(&mut self) {
        if let Ok(mut q) = self.shared.queues.lock() {
            q.shutdown = true;
        }
        self.shared.cond.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn every_job_runs_once_with_and_without_threads() {
        for n in [0, 1, 3] {
            let p = ReaderPool::new(n);
            let (tx, rx) = mpsc::channel();
            for i in 0..20 {
                let tx = tx.clone();
                p.submit(move || tx.send(i * 2).unwrap());
            }
            // A panicking job does not take its reader down.
            p.submit(|| panic!("boom"));
            let tx2 = tx.clone();
            p.spawn(move || tx2.send(1000).unwrap());
            drop(tx);
            let mut got: Vec<i32> = rx.iter().take(21).collect();
            got.sort();
            let mut want: Vec<i32> = (0..20).map(|i| i * 2).collect();
            want.push(1000);
            assert_eq!(got, want, "{n} threads");
        }
    }
}
