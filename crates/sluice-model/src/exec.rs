//! Running kernels across threads. Threads own whole output rows, so the thread count never
//! changes a bit.

use std::ops::Range;

use sluice_kernels::{Kernels, Matrix};

use crate::ModelError;

/// Kernels plus a thread pool.
pub struct Exec {
    kernels: Kernels,
    pool: Option<rayon::ThreadPool>,
    threads: usize,
}

impl std::fmt::Debug for Exec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Exec({}, {} threads)", self.kernels.isa(), self.threads)
    }
}

/// Hands tasks to the pool of an [`Exec::tasks`] call.
pub(crate) enum Spawner<'a, 's> {
    /// Tasks run on the pool's threads.
    Pool(&'a rayon::Scope<'s>),
    /// No pool: a task runs at once, on the caller's thread.
    Inline,
}

impl<'s> Spawner<'_, 's> {
    /// Runs `f` as a task.
    pub(crate) fn spawn(&self, f: impl FnOnce() + Send + 's) {
        match self {
            Spawner::Pool(s) => s.spawn(move |_| f()),
            Spawner::Inline => f(),
        }
    }
}

/// Rows below which a product is not split across threads.
const MIN_ROWS_PER_TASK: usize = 16;

impl Exec {
    /// `threads` worker threads (1 runs everything on the caller's thread).
    pub fn new(kernels: Kernels, threads: usize) -> Result<Exec, ModelError> {
        let threads = threads.max(1);
        let pool = if threads > 1 {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("sluice-compute-{i}"))
                    // The main thread's 8 MiB rather than rayon's 2 MiB: an unoptimised build's
                    // forward pass needs more than 2 MiB (the stack is reserved, not used).
                    .stack_size(8 << 20)
                    .build()
                    .map_err(|e| ModelError::Threads(e.to_string()))?,
            )
        } else {
            None
        };
        Ok(Exec {
            kernels,
            pool,
            threads,
        })
    }

    /// The same kernels on the caller's thread alone: for work that is itself one task of a
    /// parallel loop ([`Exec::tasks`]).
    pub(crate) fn serial(&self) -> Exec {
        Exec {
            kernels: self.kernels,
            pool: None,
            threads: 1,
        }
    }

    /// Runs `f` on the caller's thread with a [`Spawner`] whose tasks go to the pool (or run at
    /// once without one); returns when `f` and every task it spawned are done.
    pub(crate) fn tasks<'s, R>(&self, f: impl FnOnce(&Spawner<'_, 's>) -> R) -> R {
        match &self.pool {
            Some(pool) => pool.in_place_scope(|s| f(&Spawner::Pool(s))),
            None => f(&Spawner::Inline),
        }
    }

    /// The kernels.
    pub fn kernels(&self) -> &Kernels {
        &self.kernels
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f` on one of the pool's threads (on the caller's without a pool), so that the
    /// parallel calls inside it start from a worker rather than from outside the pool.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(pool) => pool.install(f),
            None => f(),
        }
    }

    /// [`install`](Exec::install), with the pool's other threads kept awake while `f` runs:
    /// each looks for work in a loop instead of going to sleep between `f`'s parallel calls,
    /// so a call's other half starts at once rather than after a wake-up (on a virtual machine
    /// a futex wake-up and the switch after it cost tens of microseconds, and a decode step
    /// makes hundreds of calls). For `f` that does not share the pool with other long work.
    pub fn install_awake<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        let Some(pool) = &self.pool else {
            return f();
        };
        pool.install(|| {
            let owner = rayon::current_thread_index();
            let done = std::sync::atomic::AtomicBool::new(false);
            rayon::in_place_scope(|s| {
                for _ in 1..self.threads {
                    s.spawn(|_| stay_awake(&done, owner));
                }
                let r = f();
                done.store(true, std::sync::atomic::Ordering::Release);
                r
            })
        })
    }

    /// `y = x · mᵀ` over all rows: `x` is `[b, cols]`, `y` is `[b, rows]`.
    pub fn matmul(&self, m: &Matrix<'_>, x: &[f32], y: &mut [f32]) {
        let rows = m.rows();
        let k = &self.kernels;
        let Some(pool) = self.pool.as_ref().filter(|_| rows >= 2 * MIN_ROWS_PER_TASK) else {
            k.matmul(m, x, y, 0..rows);
            return;
        };
        let tasks = (self.threads * 2).min(rows / MIN_ROWS_PER_TASK).max(1);
        let chunk = rows.div_ceil(tasks);
        let batch = y.len().checked_div(rows).unwrap_or(0);
        use rayon::prelude::*;
        if batch == 1 {
            pool.install(|| {
                y.par_chunks_mut(chunk).enumerate().for_each(|(i, yc)| {
                    let start = i * chunk;
                    k.matmul(m, x, yc, start..start + yc.len());
                })
            });
        } else {
            let parts: Vec<(usize, Vec<f32>)> = pool.install(|| {
                (0..rows.div_ceil(chunk))
                    .into_par_iter()
                    .map(|i| {
                        let start = i * chunk;
                        let end = (start + chunk).min(rows);
                        let mut part = vec![0f32; batch * (end - start)];
                        k.matmul(m, x, &mut part, start..end);
                        (start, part)
                    })
                    .collect()
            });
            for (start, part) in parts {
                let n = part.len() / batch;
                for b in 0..batch {
                    y[b * rows + start..b * rows + start + n]
                        .copy_from_slice(&part[b * n..(b + 1) * n]);
                }
            }
        }
    }

    /// Several independent products `y = x · mᵀ` in one trip to the pool: for one activation
    /// row each (decode), the rows of all of them are split into tasks across the threads, so
    /// the threads synchronise once for the lot instead of once per matrix (a decode step of a
    /// mixture-of-experts layer runs the gate and up projections of every selected expert, then
    /// every down projection). Each output row is computed by the same kernel call on the same
    /// inputs as [`matmul`](Self::matmul) would, so nothing changes a bit. Jobs with several
    /// activation rows run one after the other through [`matmul`](Self::matmul).
    pub fn matmul_many(&self, jobs: Vec<(Matrix<'_>, &[f32], &mut [f32])>) {
        let k = &self.kernels;
        let Some(pool) = self.pool.as_ref() else {
            for (m, x, y) in jobs {
                k.matmul(&m, x, y, 0..m.rows());
            }
            return;
        };
        if jobs.len() < 2 || jobs.iter().any(|(m, _, y)| y.len() != m.rows()) {
            for (m, x, y) in jobs {
                self.matmul(&m, x, y);
            }
            return;
        }
        // Each matrix in `threads` pieces of whole 16-row runs (small ones stay whole).
        let mut tasks: Vec<(Matrix<'_>, &[f32], &mut [f32], usize)> = Vec::new();
        for (m, x, y) in jobs {
            let rows = m.rows();
            let pieces = self.threads.min(rows / MIN_ROWS_PER_TASK).max(1);
            let chunk = rows.div_ceil(pieces).next_multiple_of(MIN_ROWS_PER_TASK);
            let mut start = 0;
            for yc in y.chunks_mut(chunk) {
                let n = yc.len();
                tasks.push((m, x, yc, start));
                start += n;
            }
        }
        use rayon::prelude::*;
        pool.install(|| {
            tasks.into_par_iter().for_each(|(m, x, yc, start)| {
                let n = yc.len();
                k.matmul(&m, x, yc, start..start + n);
            })
        });
    }

    /// `y = x · W` for a matrix stored `[in, out]` (the `x @ W` layout): `x` is `[b, in]` and
    /// `y` is `[b, out]`, with `in = m.rows()`, `out = m.cols()`.
    ///
    /// The kernels' [`Kernels::matmul_xw`] over ranges of output columns, one range per task:
    /// a value depends only on its column, so neither the thread count nor the batch changes a
    /// bit.
    pub fn matmul_xw(&self, m: &Matrix<'_>, x: &[f32], y: &mut [f32]) {
        let (n_in, n_out) = (m.rows(), m.cols());
        let batch = x.len().checked_div(n_in).unwrap_or(0);
        debug_assert_eq!(y.len(), batch * n_out);
        let k = &self.kernels;
        let columns = |cols: Range<usize>| -> Vec<f32> {
            let mut part = vec![0f32; batch * cols.len()];
            k.matmul_xw(m, x, &mut part, cols);
            part
        };
        let Some(pool) = self
            .pool
            .as_ref()
            .filter(|_| n_out >= 2 * MIN_ROWS_PER_TASK)
        else {
            k.matmul_xw(m, x, y, 0..n_out);
            return;
        };
        let tasks = (self.threads * 2).min(n_out / MIN_ROWS_PER_TASK).max(1);
        let chunk = n_out.div_ceil(tasks);
        use rayon::prelude::*;
        let parts: Vec<(usize, Vec<f32>)> = pool.install(|| {
            (0..n_out.div_ceil(chunk))
                .into_par_iter()
                .map(|t| {
                    let start = t * chunk;
                    let end = (start + chunk).min(n_out);
                    (start, columns(start..end))
                })
                .collect()
        });
        for (start, part) in parts {
            let w = part.len() / batch.max(1);
            for b in 0..batch {
                y[b * n_out + start..b * n_out + start + w]
                    .copy_from_slice(&part[b * w..(b + 1) * w]);
            }
        }
    }

    /// `f(0), …, f(n − 1)` across the pool, in order.
    pub fn map<T: Send, F>(&self, n: usize, f: F) -> Vec<T>
    where
        F: Fn(usize) -> T + Send + Sync,
    {
        match &self.pool {
            Some(pool) if n > 1 => {
                use rayon::prelude::*;
                pool.install(|| (0..n).into_par_iter().map(f).collect())
            }
            _ => (0..n).map(f).collect(),
        }
    }

    /// Runs `f(i, chunk)` for every `chunk`-sized piece of `out`, across the pool.
    pub fn for_each_chunk<F>(&self, out: &mut [f32], chunk: usize, f: F)
    where
        F: Fn(usize, &mut [f32]) + Send + Sync,
    {
        match &self.pool {
            Some(pool) if out.len() > chunk => {
                use rayon::prelude::*;
                pool.install(|| {
                    out.par_chunks_mut(chunk)
                        .enumerate()
                        .for_each(|(i, c)| f(i, c))
                });
            }
            _ => out.chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c)),
        }
    }
}

impl Exec {
    /// Runs `f(i, a_i, b_i)` for the `i`-th `ca`-sized piece of `a` and the `i`-th `cb`-sized
    /// piece of `b` (as many pieces in both), across the pool.
    pub fn for_each_chunk_pair<F>(&self, a: &mut [f32], ca: usize, b: &mut [f32], cb: usize, f: F)
    where
        F: Fn(usize, &mut [f32], &mut [f32]) + Send + Sync,
    {
        debug_assert_eq!(a.len() / ca.max(1), b.len() / cb.max(1));
        match &self.pool {
            Some(pool) if a.len() > ca => {
                use rayon::prelude::*;
                pool.install(|| {
                    a.par_chunks_mut(ca)
                        .zip(b.par_chunks_mut(cb))
                        .enumerate()
                        .for_each(|(i, (x, y))| f(i, x, y))
                });
            }
            _ => a
                .chunks_mut(ca)
                .zip(b.chunks_mut(cb))
                .enumerate()
                .for_each(|(i, (x, y))| f(i, x, y)),
        }
    }
}

/// Runs the pool's pending work on this thread until `done`, spinning (and now and then giving
/// the core to other threads, the readers among them) while there is none. Returns at once on
/// `owner`, the thread whose work sets `done`: spinning there would wait for itself.
fn stay_awake(done: &std::sync::atomic::AtomicBool, owner: Option<usize>) {
    if rayon::current_thread_index() == owner {
        return;
    }
    let mut idle = 0u32;
    while !done.load(std::sync::atomic::Ordering::Acquire) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => idle = 0,
            _ => {
                idle = idle.wrapping_add(1);
                if idle.is_multiple_of(64) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }
}
