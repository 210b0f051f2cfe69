//! A small pool of reader threads: several reads in flight, demand reads ahead of prefetches.

use std::collections::VecDeque;
use std::sync::mpsc;
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
        if self.threads.is_empty() {
            f();
            return;
        }
        if let Ok(mut q) = self.shared.queues.lock() {
            q.background.push_back(Box::new(f));
        }
        self.shared.cond.notify_one();
    }

    /// Runs jobs ahead of background work and waits for all; results in the order given
    /// (`None` for a job that panicked).
    pub(crate) fn run<T, F, I>(&self, jobs: I) -> Vec<Option<T>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
        I: IntoIterator<Item = F>,
    {
        if self.threads.is_empty() {
            return jobs
                .into_iter()
                .map(|f| std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok())
                .collect();
        }
        let (tx, rx) = mpsc::channel();
        let mut n = 0;
        if let Ok(mut q) = self.shared.queues.lock() {
            for (i, f) in jobs.into_iter().enumerate() {
                let tx = tx.clone();
                q.demand.push_back(Box::new(move || {
                    let _ = tx.send((i, f()));
                }));
                n += 1;
            }
        }
        drop(tx);
        self.shared.cond.notify_all();
        let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
        for (i, v) in rx.iter().take(n) {
            out[i] = Some(v);
        }
        out
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

    #[test]
    fn results_in_order_with_and_without_threads() {
        for n in [0, 1, 3] {
            let p = ReaderPool::new(n);
            let out = p.run((0..20).map(|i| move || i * 2));
            assert_eq!(out, (0..20).map(|i| Some(i * 2)).collect::<Vec<_>>());
            let out = p.run((0..3).map(|i| move || if i == 1 { panic!("boom") } else { i }));
            assert_eq!(out, vec![Some(0), None, Some(2)]);
            let (tx, rx) = mpsc::channel();
            p.spawn(move || tx.send(7).unwrap());
            assert_eq!(rx.recv().unwrap(), 7);
        }
    }
}
