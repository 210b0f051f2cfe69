//! Running kernels across threads. Threads own whole output rows, so the thread count never
//! changes a bit.

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

    /// The kernels.
    pub fn kernels(&self) -> &Kernels {
        &self.kernels
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.threads
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
