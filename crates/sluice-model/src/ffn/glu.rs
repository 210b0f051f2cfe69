//! The gated linear unit every feed-forward block is made of: `down(act(gate x, up x))` for
//! dense layers, shared experts and SwiGLU-shaped routed experts, over rows in calls of bounded
//! size, and several blocks at once for a decode step.

use sluice_store::Blob;

use crate::ModelError;
use crate::config::GluActivation;
use crate::exec::Exec;
use crate::weights::{MatSpec, MlpSpec, VecSpec};

/// `y = x · Wᵀ` for the matrix of `spec` in `blob` (`x` is `[t, cols]`, `y` is `[t, rows]`),
/// whichever way it is stored.
pub(super) fn linear(
    exec: &Exec,
    spec: &MatSpec,
    blob: &Blob,
    x: &[f32],
    y: &mut [f32],
) -> Result<(), ModelError> {
    let m = spec.view(blob)?;
    if spec.transposed {
        exec.matmul_xw(&m, x, y);
    } else {
        exec.matmul(&m, x, y);
    }
    Ok(())
}

pub(super) fn add_bias(y: &mut [f32], bias: &VecSpec, blob: &Blob) {
    let b = bias.to_f32(blob);
    for row in y.chunks_exact_mut(b.len()) {
        for (a, &v) in row.iter_mut().zip(&b) {
            *a += v;
        }
    }
}

/// `down(act(gate x, up x))` for `[t, width]` rows of `x`: SwiGLU or SiTU-GLU.
pub(crate) fn glu(
    exec: &Exec,
    spec: &MlpSpec,
    blob: &Blob,
    x: &[f32],
    t: usize,
    act: GluActivation,
) -> Result<Vec<f32>, ModelError> {
    let inter = spec.gate.rows;
    let mut g = vec![0f32; t * inter];
    let mut u = vec![0f32; t * inter];
    linear(exec, &spec.gate, blob, x, &mut g)?;
    linear(exec, &spec.up, blob, x, &mut u)?;
    let mut a = vec![0f32; t * inter];
    activate(exec, act, &g, &u, &mut a);
    let mut y = vec![0f32; t * spec.down.rows];
    linear(exec, &spec.down, blob, &a, &mut y)?;
    Ok(y)
}

/// `a = act(g, u)` elementwise.
pub(super) fn activate(exec: &Exec, act: GluActivation, g: &[f32], u: &[f32], a: &mut [f32]) {
    match act {
        GluActivation::Silu => exec.kernels().silu_mul(g, u, a),
        GluActivation::Situ { beta, linear_beta } => {
            exec.kernels().situ_mul(g, u, beta, linear_beta, a)
        }
        GluActivation::SiluInputsClamped { limit } => {
            let gc: Vec<f32> = g.iter().map(|v| v.min(limit)).collect();
            let uc: Vec<f32> = u.iter().map(|v| v.clamp(-limit, limit)).collect();
            exec.kernels().silu_mul(&gc, &uc, a);
        }
        GluActivation::SiluClamped { limit } => {
            // silu(g) as the kernels compute it (times 1, which is exact), then the bounds.
            let ones = vec![1f32; g.len()];
            exec.kernels().silu_mul(g, &ones, a);
            for (a, &u) in a.iter_mut().zip(u) {
                *a = a.min(limit) * u.clamp(-limit, limit);
            }
        }
    }
}

/// `f(part, rows_of_part)` over the `[t, width]` rows of `x` in calls of at most `rows` rows,
/// the outputs concatenated (each row's arithmetic is the same either way: the calls only
/// bound the scratch).
pub(super) fn in_calls(
    x: &[f32],
    width: usize,
    rows: usize,
    f: impl Fn(&[f32], usize) -> Result<Vec<f32>, ModelError>,
) -> Result<Vec<f32>, ModelError> {
    let width = width.max(1);
    let t = x.len() / width;
    if t <= rows {
        return f(x, t);
    }
    let mut y = Vec::new();
    for part in x.chunks(rows.max(1) * width) {
        y.extend(f(part, part.len() / width)?);
    }
    Ok(y)
}

/// [`glu`] over the rows of `x` in calls of at most `rows` rows.
pub(crate) fn glu_rows(
    exec: &Exec,
    spec: &MlpSpec,
    blob: &Blob,
    x: &[f32],
    act: GluActivation,
    rows: usize,
) -> Result<Vec<f32>, ModelError> {
    in_calls(x, spec.gate.cols, rows, |part, t| {
        glu(exec, spec, blob, part, t, act)
    })
}

/// One GLU block of a [`glu_many`] call: its matrices, their bytes, its `[t, width]` input and
/// activation.
#[derive(Clone, Copy)]
pub(crate) struct GluJob<'a> {
    pub spec: &'a MlpSpec,
    pub blob: &'a Blob,
    pub x: &'a [f32],
    pub t: usize,
    pub act: GluActivation,
}

/// [`glu`] for several blocks at once, with the same arithmetic per block: the gate and up
/// projections of all of them go to the pool together, then all the down projections
/// ([`Exec::matmul_many`]), so a decode step synchronises the threads twice for the lot
/// rather than three times per block.
pub(crate) fn glu_many(exec: &Exec, jobs: &[GluJob<'_>]) -> Result<Vec<Vec<f32>>, ModelError> {
    let transposed = |m: &MlpSpec| m.gate.transposed || m.up.transposed || m.down.transposed;
    if jobs.len() < 2 || jobs.iter().any(|j| transposed(j.spec)) {
        return jobs
            .iter()
            .map(|j| glu(exec, j.spec, j.blob, j.x, j.t, j.act))
            .collect();
    }
    let mut gs: Vec<Vec<f32>> = jobs
        .iter()
        .map(|j| vec![0f32; j.t * j.spec.gate.rows])
        .collect();
    let mut us: Vec<Vec<f32>> = jobs
        .iter()
        .map(|j| vec![0f32; j.t * j.spec.gate.rows])
        .collect();
    let mut work = Vec::with_capacity(2 * jobs.len());
    for ((j, g), u) in jobs.iter().zip(&mut gs).zip(&mut us) {
        work.push((j.spec.gate.view(j.blob)?, j.x, &mut g[..]));
        work.push((j.spec.up.view(j.blob)?, j.x, &mut u[..]));
    }
    exec.matmul_many(work);
    let mut acts = Vec::with_capacity(jobs.len());
    for ((j, g), u) in jobs.iter().zip(&gs).zip(&us) {
        let mut a = vec![0f32; g.len()];
        activate(exec, j.act, g, u, &mut a);
        acts.push(a);
    }
    let mut ys: Vec<Vec<f32>> = jobs
        .iter()
        .map(|j| vec![0f32; j.t * j.spec.down.rows])
        .collect();
    let mut work = Vec::with_capacity(jobs.len());
    for ((j, a), y) in jobs.iter().zip(&acts).zip(&mut ys) {
        work.push((j.spec.down.view(j.blob)?, &a[..], &mut y[..]));
    }
    exec.matmul_many(work);
    Ok(ys)
}
