//! The expert schedule: the routed experts of one layer fetched from the store in groups it can
//! pin at once, each computed as soon as it is in memory — on its own thread over all of its
//! rows in a prefill, one after another with each product split across the threads on a decode
//! step, or, when every expert fits the cache, a whole group's GLU blocks in two trips to the
//! pool. The next layer's experts are read ahead while this layer computes.
//!
//! The schedule sees experts as ids, each with rows and closures that compute it
//! ([`Experts`]); what an expert's input and maths are, and everything a family changes about
//! them, belongs to the block that calls it. Every expert writes only its own rows, so the
//! order in which reads land changes no bit.

use std::cell::Cell;
use std::sync::Mutex;
use std::time::Instant;

use sluice_store::{Blob, ExpertStore, Pinned, StoreError};

use super::glu::{GluJob, glu_many, glu_rows};
use crate::ModelError;
use crate::config::GluActivation;
use crate::exec::Exec;
use crate::weights::MlpSpec;

/// Rows from which a layer's routed experts run as tasks across the threads, each on one
/// thread over all of its rows (a prefill), rather than one after another with each product
/// split across the threads (a decode step, whose experts are too small to be tasks).
const EXPERT_TASK_ROWS: usize = 8;

/// The routed experts of one layer as the schedule sees them.
pub(super) trait Experts: Sync {
    /// Rows expert `e` serves.
    fn rows(&self, e: u32) -> usize;
    /// Expert `e`'s input rows, `[rows, width]`.
    fn input(&self, e: u32) -> Vec<f32>;
    /// Expert `e` over its input `x` from its bytes, in calls of at most `per_call` rows.
    fn run(
        &self,
        exec: &Exec,
        e: u32,
        blob: &Blob,
        x: &[f32],
        per_call: usize,
    ) -> Result<Vec<f32>, ModelError>;
    /// Expert `e` as one GLU block (its matrices and activation) when it is one, so that a
    /// group of them can go to the pool together.
    fn glu(&self, e: u32) -> Option<(&MlpSpec, GluActivation)>;
    /// Keeps expert `e`'s output (`[rows, width]`).
    fn put(&self, e: u32, y: &[f32]);
}

/// The lookahead guess made while a decode step waits for reads, called at most once per
/// layer when only reads remain: with the experts computed so far and the side block's output
/// if it has run.
pub(super) type Mid<'a> = dyn Fn(&[u32], Option<&[f32]>) -> Result<(), ModelError> + 'a;

/// How one layer's experts run.
pub(super) struct Schedule<'a> {
    pub exec: &'a Exec,
    pub store: &'a ExpertStore,
    pub layer: usize,
    /// The layer's rows: from [`EXPERT_TASK_ROWS`] on, experts are tasks.
    pub t: usize,
    /// Every expert fits the cache: a group is taken whole and its GLU blocks run together.
    pub gather: bool,
    /// Rows per product call.
    pub rows_per_call: usize,
    /// The next layer's guessed experts, read once this layer's first experts are pinned.
    pub early: Option<&'a (usize, Vec<u32>)>,
    /// The guess made while only reads remain (decode steps).
    pub mid: Option<&'a Mid<'a>>,
    /// Seconds from the first fetch to the last expert's product are added here.
    pub expert_seconds: &'a Cell<f64>,
}

pub(super) fn poisoned() -> ModelError {
    ModelError::ExpertTask("a task panicked".into())
}

impl Schedule<'_> {
    /// Runs the experts `ids` (ascending) and, while reads are in flight, `side`: a GLU block
    /// that needs nothing from the store (a shared expert). Returns the side block's output if
    /// it ran (it does not when the layer has no routed experts, or runs them row-bounded).
    pub(super) fn run(
        self,
        ids: &[u32],
        experts: &dyn Experts,
        side: Option<&GluJob<'_>>,
    ) -> Result<Option<Vec<f32>>, ModelError> {
        let Schedule {
            exec,
            store,
            layer,
            t,
            gather,
            rows_per_call,
            mut early,
            mut mid,
            expert_seconds,
        } = self;
        let rows_per_call = rows_per_call.max(1);
        let mut side_y: Option<Vec<f32>> = None;
        // In groups of as many experts as the cache can pin at once when each group is
        // admitted (the capacity moves as KV caches take and give back pages).
        let mut rest = ids;
        let t_experts = Instant::now();
        let mut side_seconds = 0.0;
        while !rest.is_empty() {
            let rows: Vec<u32> = rest.iter().map(|&e| experts.rows(e) as u32).collect();
            let (n, arrivals) = store.fetch_some(layer, rest, &rows)?;
            let chunk = &rest[..n];
            rest = &rest[n..];
            // Once this layer's first experts are pinned, start reading the next layer's
            // predicted experts so the reads overlap this layer's compute.
            if let Some((nl, next)) = early.take() {
                store.prefetch(*nl, next);
            }
            if t >= EXPERT_TASK_ROWS {
                // A prefill: the experts are tasks across the threads, each run on its own
                // thread over all of its rows as soon as its read lands, so no product waits
                // for the others between experts. This thread lands every read of the group
                // before it waits for the tasks (the end of the scope, the only place it can
                // pick up another session's pass): passes inside the pool keep landing their
                // reads before any parallel wait.
                type Arrival = Result<(usize, Pinned), StoreError>;
                type Out = Result<Vec<f32>, ModelError>;
                let serial = exec.serial();
                let failed: Mutex<Option<ModelError>> = Mutex::new(None);
                let side_out: Mutex<Option<Out>> = Mutex::new(None);
                let (serial, failed, side_out) = (&serial, &failed, &side_out);
                let fed: Result<(), ModelError> = exec.tasks(|sp| {
                    if let Some(s) = side
                        && side_y.is_none()
                    {
                        sp.spawn(move || {
                            let y = glu_rows(serial, s.spec, s.blob, s.x, s.act, rows_per_call);
                            if let Ok(mut o) = side_out.lock() {
                                *o = Some(y);
                            }
                        });
                    }
                    let feed = |arrival: Arrival| {
                        let (ci, eb) = arrival?;
                        let e = chunk[ci];
                        sp.spawn(move || {
                            let xe = experts.input(e);
                            match experts.run(serial, e, &eb, &xe, rows_per_call) {
                                Ok(y) => experts.put(e, &y),
                                Err(err) => {
                                    if let Ok(mut f) = failed.lock() {
                                        f.get_or_insert(err);
                                    }
                                }
                            }
                            drop(eb);
                        });
                        Ok::<(), ModelError>(())
                    };
                    arrivals.into_iter().try_for_each(feed)
                });
                fed?;
                if let Some(y) = side_out.lock().ok().and_then(|mut o| o.take()) {
                    side_y = Some(y?);
                }
                if let Some(err) = failed.lock().map_err(|_| poisoned())?.take() {
                    return Err(err);
                }
                continue;
            }
            if gather {
                // Every expert fits in the cache, so once warm a step reads nothing: take the
                // whole group, then run its GLU blocks (with the last group, the side block's
                // too) in two trips to the pool rather than three per expert.
                let mut blobs: Vec<Option<Pinned>> = (0..chunk.len()).map(|_| None).collect();
                for arrival in arrivals {
                    let (ci, eb) = arrival?;
                    blobs[ci] = Some(eb);
                }
                let mut ins = Vec::with_capacity(chunk.len());
                for (&e, b) in chunk.iter().zip(blobs) {
                    let b = b.ok_or_else(|| {
                        ModelError::ExpertTask(format!("expert {e} of layer {layer} never arrived"))
                    })?;
                    ins.push((b, experts.input(e)));
                }
                let mut jobs = Vec::with_capacity(chunk.len() + 1);
                for (&e, (eb, xe)) in chunk.iter().zip(&ins) {
                    if let Some((spec, act)) = experts.glu(e) {
                        jobs.push(GluJob {
                            spec,
                            blob: eb,
                            x: xe,
                            t: experts.rows(e),
                            act,
                        });
                    }
                }
                // Over more rows than a call takes, each expert in turn (the synchronisations
                // glu_many saves do not matter there, and its scratch would grow with the
                // rows).
                if jobs.len() == chunk.len() && t <= rows_per_call {
                    let with_side = rest.is_empty() && side.is_some();
                    if let (true, Some(s)) = (with_side, side) {
                        jobs.push(*s);
                    }
                    let mut ys = glu_many(exec, &jobs)?;
                    if with_side {
                        side_y = ys.pop();
                    }
                    for (&e, y) in chunk.iter().zip(&ys) {
                        experts.put(e, y);
                    }
                } else {
                    for (&e, (eb, xe)) in chunk.iter().zip(&ins) {
                        experts.put(e, &experts.run(exec, e, eb, xe, rows_per_call)?);
                    }
                }
                continue;
            }
            // The side block needs nothing from the store: compute it while the misses are
            // read.
            if let Some(s) = side
                && side_y.is_none()
            {
                let t0 = Instant::now();
                side_y = Some(glu_rows(exec, s.spec, s.blob, s.x, s.act, rows_per_call)?);
                side_seconds += t0.elapsed().as_secs_f64();
            }
            // Each expert as soon as it is in memory: resident ones first, then reads as they
            // land.
            let mut arrivals = arrivals;
            let mut computed: Vec<u32> = Vec::with_capacity(chunk.len());
            loop {
                if arrivals.only_reads_left()
                    && let Some(f) = mid.take()
                {
                    f(&computed, side_y.as_deref())?;
                }
                let Some(arrival) = arrivals.next() else {
                    break;
                };
                let (ci, eb) = arrival?;
                let e = chunk[ci];
                let xe = experts.input(e);
                experts.put(e, &experts.run(exec, e, &eb, &xe, rows_per_call)?);
                computed.push(e);
            }
        }
        expert_seconds.set(
            expert_seconds.get() + (t_experts.elapsed().as_secs_f64() - side_seconds).max(0.0),
        );
        Ok(side_y)
    }
}
