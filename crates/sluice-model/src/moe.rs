//! Feed-forward blocks: dense SwiGLU, and the mixture of experts with its router kept apart from
//! the experts so they can be resident or streamed. Experts are either SwiGLU blocks or GPT-OSS's
//! clamped SwiGLU with fused, biased projections.

use std::collections::BTreeMap;

use sluice_kernels::scalar;
use sluice_store::{Blob, ExpertStore, Pinned};

use crate::ModelError;
use crate::config::{ExpertActivation, GluActivation, ModelConfig, RouterKind};
use crate::exec::Exec;
use crate::state::Route;
use crate::weights::{
    BiasedMlpSpec, ExpertSpec, FfnSpec, FusedExpertSpec, GateUpSpec, MatSpec, MlpSpec, VecSpec,
};

/// `y = x · Wᵀ` for the matrix of `spec` in `blob` (`x` is `[t, cols]`, `y` is `[t, rows]`),
/// whichever way it is stored.
fn linear(
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

fn add_bias(y: &mut [f32], bias: &VecSpec, blob: &Blob) {
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
fn activate(exec: &Exec, act: GluActivation, g: &[f32], u: &[f32], a: &mut [f32]) {
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
fn in_calls(
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

/// The GLU activation of SwiGLU-shaped routed experts (None for GPT-OSS's clamped form).
fn glu_activation(a: ExpertActivation, limit: Option<f32>) -> Option<GluActivation> {
    match a {
        ExpertActivation::SwiGlu => Some(GluActivation::Silu.limited(limit)),
        ExpertActivation::SwiGluInputsClamped { limit } => {
            Some(GluActivation::SiluInputsClamped { limit })
        }
        ExpertActivation::Situ { beta, linear_beta } => {
            Some(GluActivation::Situ { beta, linear_beta })
        }
        ExpertActivation::ClampedSwiGlu { .. } => None,
    }
}

/// Rows from which a layer's routed experts run as tasks across the threads, each on one
/// thread over all of its rows (a prefill), rather than one after another with each product
/// split across the threads (a decode step, whose experts are too small to be tasks).
const EXPERT_TASK_ROWS: usize = 8;

fn poisoned() -> ModelError {
    ModelError::Internal("an expert task panicked".into())
}

/// One GLU block of a [`glu_many`] call: its matrices, their bytes, its `[t, width]` input and
/// activation.
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

/// A fused clamped-SwiGLU expert for `[t, hidden]` rows of `x` (transformers' `GptOssExperts`):
/// `gu = W_gu x + b_gu`, gate = even entries, up = odd entries; `g = min(gate, limit)`,
/// `u = clamp(up, −limit, limit)`; `h = (u + 1) · g · σ(alpha · g)`; `y = W_d h + b_d`.
fn clamped_expert(
    exec: &Exec,
    spec: &FusedExpertSpec,
    blob: &Blob,
    x: &[f32],
    t: usize,
    alpha: f32,
    limit: f32,
) -> Result<Vec<f32>, ModelError> {
    let inter = spec.down.cols;
    let mut gu = vec![0f32; t * 2 * inter];
    linear(exec, &spec.gate_up, blob, x, &mut gu)?;
    add_bias(&mut gu, &spec.gate_up_bias, blob);
    let act: Vec<f32> = gu
        .chunks_exact(2)
        .map(|p| clamped_glu(p[0], p[1], alpha, limit))
        .collect();
    let mut y = vec![0f32; t * spec.down.rows];
    linear(exec, &spec.down, blob, &act, &mut y)?;
    add_bias(&mut y, &spec.down_bias, blob);
    Ok(y)
}

/// GPT-OSS's clamped SwiGLU of one gate and up value.
fn clamped_glu(gate: f32, up: f32, alpha: f32, limit: f32) -> f32 {
    let g = gate.min(limit);
    let u = up.clamp(-limit, limit);
    let glu = g * scalar::sigmoid(g * alpha);
    (u + 1.0) * glu
}

/// [`clamped_expert`] with the gate and up as separate biased products ([`BiasedMlpSpec`]):
/// the same values, as each output is its own row's product.
fn biased_expert(
    exec: &Exec,
    spec: &BiasedMlpSpec,
    blob: &Blob,
    x: &[f32],
    t: usize,
    alpha: f32,
    limit: f32,
) -> Result<Vec<f32>, ModelError> {
    let m = &spec.mlp;
    let inter = m.gate.rows;
    let (mut g, mut u) = (vec![0f32; t * inter], vec![0f32; t * inter]);
    if m.gate.transposed || m.up.transposed {
        linear(exec, &m.gate, blob, x, &mut g)?;
        linear(exec, &m.up, blob, x, &mut u)?;
    } else {
        exec.matmul_many(vec![
            (m.gate.view(blob)?, x, &mut g[..]),
            (m.up.view(blob)?, x, &mut u[..]),
        ]);
    }
    add_bias(&mut g, &spec.gate_bias, blob);
    add_bias(&mut u, &spec.up_bias, blob);
    let act: Vec<f32> = g
        .iter()
        .zip(&u)
        .map(|(&g, &u)| clamped_glu(g, u, alpha, limit))
        .collect();
    let mut y = vec![0f32; t * m.down.rows];
    linear(exec, &m.down, blob, &act, &mut y)?;
    add_bias(&mut y, &spec.down_bias, blob);
    Ok(y)
}

/// An expert whose gate and up are one product (Llama 4's `x @ W` halves): `down(silu(g) · u)`
/// with `[g | u]` = the product's two halves of each row.
fn gate_up_expert(
    exec: &Exec,
    spec: &GateUpSpec,
    blob: &Blob,
    x: &[f32],
    t: usize,
    glu: GluActivation,
) -> Result<Vec<f32>, ModelError> {
    let inter = spec.down.cols;
    let mut gu = vec![0f32; t * 2 * inter];
    linear(exec, &spec.gate_up, blob, x, &mut gu)?;
    let mut act = vec![0f32; t * inter];
    for (row, out) in gu.chunks_exact(2 * inter).zip(act.chunks_exact_mut(inter)) {
        activate(exec, glu, &row[..inter], &row[inter..], out);
    }
    let mut y = vec![0f32; t * spec.down.rows];
    linear(exec, &spec.down, blob, &act, &mut y)?;
    Ok(y)
}

/// One routed expert over `[t, width]` rows, in calls of at most `rows` rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn expert_rows(
    exec: &Exec,
    cfg: &ModelConfig,
    limit: Option<f32>,
    spec: &ExpertSpec,
    blob: &Blob,
    x: &[f32],
    t: usize,
    rows: usize,
) -> Result<Vec<f32>, ModelError> {
    in_calls(x, x.len() / t.max(1), rows, |part, n| {
        expert(exec, cfg, limit, spec, blob, part, n)
    })
}

/// One routed expert over `[t, width]` rows; `limit` bounds a SwiGLU expert's factors.
pub(crate) fn expert(
    exec: &Exec,
    cfg: &ModelConfig,
    limit: Option<f32>,
    spec: &ExpertSpec,
    blob: &Blob,
    x: &[f32],
    t: usize,
) -> Result<Vec<f32>, ModelError> {
    match (spec, cfg.moe.activation) {
        (ExpertSpec::SwiGlu(m), ExpertActivation::SwiGlu) => {
            glu(exec, m, blob, x, t, GluActivation::Silu.limited(limit))
        }
        (ExpertSpec::GateUp(g), ExpertActivation::SwiGlu) => {
            gate_up_expert(exec, g, blob, x, t, GluActivation::Silu.limited(limit))
        }
        (_, _) if limit.is_some() => Err(ModelError::Internal(
            "a bound on the experts' factors with an activation other than SwiGLU".into(),
        )),
        (ExpertSpec::SwiGlu(m), ExpertActivation::Situ { beta, linear_beta }) => glu(
            exec,
            m,
            blob,
            x,
            t,
            GluActivation::Situ { beta, linear_beta },
        ),
        (ExpertSpec::Fused(g), ExpertActivation::ClampedSwiGlu { alpha, limit }) => {
            clamped_expert(exec, g, blob, x, t, alpha, limit)
        }
        (ExpertSpec::Biased(b), ExpertActivation::ClampedSwiGlu { alpha, limit }) => {
            biased_expert(exec, b, blob, x, t, alpha, limit)
        }
        (ExpertSpec::SwiGlu(m), ExpertActivation::SwiGluInputsClamped { limit }) => glu(
            exec,
            m,
            blob,
            x,
            t,
            GluActivation::SiluInputsClamped { limit },
        ),
        (ExpertSpec::GateUp(g), ExpertActivation::SwiGluInputsClamped { limit }) => gate_up_expert(
            exec,
            g,
            blob,
            x,
            t,
            GluActivation::SiluInputsClamped { limit },
        ),
        _ => Err(ModelError::Internal(
            "expert spec does not match the configured activation".into(),
        )),
    }
}

/// One token's routing: `(expert, weight)` sorted by expert id.
pub(crate) type Selection = Vec<(u32, f32)>;

/// Routes one token from its router logits. `bias` is DeepSeek's or ERNIE's selection-only
/// score bias, or GPT-OSS's router bias (added to the logits).
pub(crate) fn route(cfg: &ModelConfig, logits: &mut [f32], bias: Option<&[f32]>) -> Selection {
    let k = cfg.moe.top_k;
    let mut sel: Selection = match &cfg.moe.router {
        RouterKind::Softmax { norm_topk_prob } => {
            scalar::softmax(logits);
            let top = scalar::top_k(logits, k);
            let mut w: Vec<f32> = top.iter().map(|p| p.1).collect();
            if *norm_topk_prob {
                let s: f32 = w.iter().sum();
                for x in &mut w {
                    *x /= s;
                }
            }
            top.iter().zip(w).map(|(p, w)| (p.0 as u32, w)).collect()
        }
        RouterKind::SigmoidGroup {
            n_group,
            topk_group,
            norm_topk_prob,
            routed_scaling_factor,
        } => {
            let scores: Vec<f32> = logits.iter().map(|&l| scalar::sigmoid(l)).collect();
            let choice: Vec<f32> = match bias {
                Some(b) => scores.iter().zip(b).map(|(s, b)| s + b).collect(),
                None => scores.clone(),
            };
            let top = group_top_k(&choice, *n_group, *topk_group, k);
            let mut w: Vec<f32> = top.iter().map(|p| scores[p.0]).collect();
            if *norm_topk_prob {
                let s: f32 = w.iter().sum::<f32>() + 1e-20;
                for x in &mut w {
                    *x /= s;
                }
            }
            for x in &mut w {
                *x *= routed_scaling_factor;
            }
            top.iter().zip(w).map(|(p, w)| (p.0 as u32, w)).collect()
        }
        RouterKind::SoftmaxGroup {
            n_group,
            topk_group,
            routed_scaling_factor,
        } => {
            scalar::softmax(logits);
            let top = group_top_k(logits, *n_group, *topk_group, k);
            let s: f32 = top.iter().map(|p| logits[p.0]).sum::<f32>() + 1e-20;
            top.iter()
                .map(|p| (p.0 as u32, logits[p.0] / s * routed_scaling_factor))
                .collect()
        }
        RouterKind::TopKSigmoid => {
            let top = scalar::top_k(logits, k);
            top.iter()
                .map(|p| (p.0 as u32, scalar::sigmoid(p.1)))
                .collect()
        }
        RouterKind::SoftmaxBiased { norm_min } => {
            scalar::softmax(logits);
            let choice: Vec<f32> = match bias {
                Some(b) => logits.iter().zip(b).map(|(p, b)| p + b).collect(),
                None => logits.to_vec(),
            };
            let top = scalar::top_k(&choice, k);
            let s = top.iter().map(|p| logits[p.0]).sum::<f32>().max(*norm_min);
            top.iter().map(|p| (p.0 as u32, logits[p.0] / s)).collect()
        }
        RouterKind::SoftmaxScaled {
            routed_scaling_factor,
        } => {
            scalar::softmax(logits);
            let choice: Vec<f32> = match bias {
                Some(b) => logits.iter().zip(b).map(|(p, b)| p + b).collect(),
                None => logits.to_vec(),
            };
            let top = scalar::top_k(&choice, k);
            top.iter()
                .map(|p| (p.0 as u32, logits[p.0] * routed_scaling_factor))
                .collect()
        }
        RouterKind::SqrtSoftplus {
            routed_scaling_factor,
        } => {
            let scores = router_scores(&cfg.moe.router, logits).unwrap_or_default();
            let choice: Vec<f32> = match bias {
                Some(b) => scores.iter().zip(b).map(|(s, b)| s + b).collect(),
                None => scores.clone(),
            };
            let ids: Vec<u32> = scalar::top_k(&choice, k)
                .iter()
                .map(|p| p.0 as u32)
                .collect();
            weigh(&scores, &ids, *routed_scaling_factor)
        }
        RouterKind::TopKSoftmax => {
            if let Some(b) = bias {
                for (l, &b) in logits.iter_mut().zip(b) {
                    *l += b;
                }
            }
            let top = scalar::top_k(logits, k);
            let mut w: Vec<f32> = top.iter().map(|p| p.1).collect();
            scalar::softmax(&mut w);
            top.iter().zip(w).map(|(p, w)| (p.0 as u32, w)).collect()
        }
    };
    sel.sort_by_key(|p| p.0);
    sel
}

/// `√softplus(x)` as torch computes it (`softplus` is `x` above 20).
fn sqrt_softplus(x: f32) -> f32 {
    let sp = if x > 20.0 { x } else { libm::log1pf(x.exp()) };
    sp.sqrt()
}

/// The experts `ids`, each weighted by its score over the chosen scores' sum (plus 1e-20),
/// times `scale`.
fn weigh(scores: &[f32], ids: &[u32], scale: f32) -> Selection {
    let s: f32 = ids.iter().map(|&e| scores[e as usize]).sum::<f32>() + 1e-20;
    ids.iter()
        .map(|&e| (e, scores[e as usize] / s * scale))
        .collect()
}

/// Per expert, the score of a router that scores experts independently (DeepSeek-V4's
/// `√softplus`, or sigmoid), which a hash-routed layer weighs its experts by; `None` for the
/// others.
fn router_scores(router: &RouterKind, logits: &[f32]) -> Option<Vec<f32>> {
    match router {
        RouterKind::SqrtSoftplus { .. } => Some(logits.iter().map(|&l| sqrt_softplus(l)).collect()),
        RouterKind::SigmoidGroup { .. } => {
            Some(logits.iter().map(|&l| scalar::sigmoid(l)).collect())
        }
        _ => None,
    }
}

/// Routes one token of a hash-routed layer: the experts its row of the table gives, weighed
/// by the router's scores as [`route`] weighs its choices.
pub(crate) fn route_hashed(
    cfg: &ModelConfig,
    logits: &[f32],
    ids: &[u32],
) -> Result<Selection, ModelError> {
    let scale = match &cfg.moe.router {
        RouterKind::SqrtSoftplus {
            routed_scaling_factor,
        }
        | RouterKind::SigmoidGroup {
            routed_scaling_factor,
            ..
        } => *routed_scaling_factor,
        _ => 1.0,
    };
    let scores = router_scores(&cfg.moe.router, logits).ok_or_else(|| {
        ModelError::Internal("a hash-routed layer with a router that does not score".into())
    })?;
    let mut sel = weigh(&scores, ids, scale);
    sel.sort_by_key(|p| p.0);
    Ok(sel)
}

/// DeepSeek's group-limited top-k of `choice`: the experts in `n_group` equal groups, each group
/// scored by the sum of its two best, the top `k` of the `topk_group` best groups' experts.
fn group_top_k(choice: &[f32], n_group: usize, topk_group: usize, k: usize) -> Vec<(usize, f32)> {
    let gs = choice.len() / n_group;
    let group_scores: Vec<f32> = choice
        .chunks_exact(gs)
        .map(|g| {
            let t = scalar::top_k(g, 2);
            t[0].1 + t[1].1
        })
        .collect();
    let mut keep = vec![false; n_group];
    for (g, _) in scalar::top_k(&group_scores, topk_group) {
        keep[g] = true;
    }
    let masked: Vec<f32> = choice
        .iter()
        .enumerate()
        .map(|(e, &c)| if keep[e / gs] { c } else { f32::NEG_INFINITY })
        .collect();
    scalar::top_k(&masked, k)
}

/// The mixture of experts for `t` tokens: route every token, then run each selected expert once
/// over all the rows that chose it (expert-major, "union" order), fetching experts from the
/// store in groups it can pin at once. Each row's arithmetic is the same as if it were alone.
/// With `gather` (every expert fits in the cache) a group is taken whole and its GLU blocks go
/// to the pool together ([`glu_many`]); otherwise each expert is computed as its read lands.
/// Products take at most `rows_per_call` rows at a time; the time from the first fetch to the
/// last routed expert's product is added to `expert_seconds`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn moe(
    exec: &Exec,
    cfg: &ModelConfig,
    layer: usize,
    spec: &FfnSpec,
    blob: &Blob,
    experts: &ExpertStore,
    expert_specs: &[ExpertSpec],
    x: &[f32],
    tokens: &[u32],
    pos0: usize,
    routes: Option<&mut Vec<Route>>,
    ahead: Ahead<'_>,
    gather: bool,
    rows_per_call: usize,
    expert_seconds: &std::cell::Cell<f64>,
) -> Result<MoeOut, ModelError> {
    let rows_per_call = rows_per_call.max(1);
    let FfnSpec::Moe {
        router,
        bias,
        shared,
        shared_gate,
        latent,
        hash,
    } = spec
    else {
        return Err(ModelError::Internal("moe called on a dense layer".into()));
    };
    let h = cfg.hidden;
    let t = x.len() / h;
    // This layer's activations (Step-3.7 bounds them per layer).
    let (mlp_act, limit) = (cfg.mlp_act_of(layer), cfg.expert_limit(layer));
    let ne = cfg.moe.router_width();
    let mut logits = vec![0f32; t * ne];
    exec.matmul(&router.view(blob)?, x, &mut logits);
    let bias = bias.map(|b| b.to_f32(blob));
    let sels: Vec<Selection> = match hash {
        Some(table) => {
            if tokens.len() != t {
                return Err(ModelError::Internal(
                    "a hash-routed layer needs each row's token".into(),
                ));
            }
            logits
                .chunks_exact(ne)
                .zip(tokens)
                .map(|(l, &tok)| {
                    let ids = table.row(blob, tok as usize, cfg.moe.experts)?;
                    route_hashed(cfg, l, &ids)
                })
                .collect::<Result<_, ModelError>>()?
        }
        None => logits
            .chunks_exact_mut(ne)
            .map(|l| route(cfg, l, bias.as_deref()))
            .collect(),
    };
    if let Some(r) = routes {
        for (i, s) in sels.iter().enumerate() {
            r.push(Route {
                pos: pos0 + i,
                layer,
                experts: s.iter().map(|p| p.0).collect(),
                weights: s.iter().map(|p| p.1).collect(),
            });
        }
    }

    // Kimi K3: the experts work in a latent space.
    let xr_owned;
    let (xr, w) = match latent {
        Some(l) => {
            let mut z = vec![0f32; t * l.down.rows];
            exec.matmul(&l.down.view(blob)?, x, &mut z);
            xr_owned = z;
            (&xr_owned[..], l.down.rows)
        }
        None => (x, h),
    };

    // Which (token, slot) pairs each expert serves. A zero-compute expert's output is its
    // input, filled in here; it reads nothing.
    let k = cfg.moe.top_k;
    let mut outs = vec![0f32; t * k * w];
    let real = cfg.moe.experts as u32;
    let mut users: BTreeMap<u32, Vec<(usize, usize)>> = BTreeMap::new();
    for (i, s) in sels.iter().enumerate() {
        for (slot, &(e, _)) in s.iter().enumerate() {
            if e >= real {
                outs[(i * k + slot) * w..(i * k + slot + 1) * w]
                    .copy_from_slice(&xr[i * w..(i + 1) * w]);
            } else {
                users.entry(e).or_default().push((i, slot));
            }
        }
    }
    let ids: Vec<u32> = users.keys().copied().collect();
    let Ahead {
        early: mut prefetch_next,
        mut mid,
    } = ahead;
    // Experts that work in a latent space add nothing to the stream before the way back (norm
    // and up-projection) of their whole sum: no estimate to guess from.
    if latent.is_some() {
        mid = None;
    }
    let mut shared_y: Option<Vec<f32>> = None;
    // In groups of as many experts as the cache can pin at once when each group is admitted
    // (the capacity moves as KV caches take and give back pages).
    let mut rest = &ids[..];
    let t_experts = std::time::Instant::now();
    let mut shared_seconds = 0.0;
    while !rest.is_empty() {
        let rows: Vec<u32> = rest.iter().map(|e| users[e].len() as u32).collect();
        let (n, arrivals) = experts.fetch_some(layer, rest, &rows)?;
        let chunk = &rest[..n];
        rest = &rest[n..];
        // Once this layer's first experts are pinned, start reading the next layer's predicted
        // experts so the reads overlap this layer's compute.
        if let Some((nl, next)) = prefetch_next.take() {
            experts.prefetch(*nl, next);
        }
        let on_input = cfg.moe.weight_on_input;
        let inputs = |e: u32| -> Result<(Vec<f32>, &ExpertSpec), ModelError> {
            let mut xe = Vec::with_capacity(users[&e].len() * w);
            for &(i, slot) in &users[&e] {
                let row = &xr[i * w..(i + 1) * w];
                if on_input {
                    // Llama 4: the expert sees its routing weight times the row.
                    let wt = sels[i][slot].1;
                    xe.extend(row.iter().map(|&v| v * wt));
                } else {
                    xe.extend_from_slice(row);
                }
            }
            let spec = expert_specs
                .get(e as usize)
                .ok_or(ModelError::Internal(format!("no spec for expert {e}")))?;
            Ok((xe, spec))
        };
        let put = |outs: &mut [f32], e: u32, y: &[f32]| {
            for (r, &(i, slot)) in users[&e].iter().enumerate() {
                outs[(i * k + slot) * w..(i * k + slot + 1) * w]
                    .copy_from_slice(&y[r * w..(r + 1) * w]);
            }
        };
        if t >= EXPERT_TASK_ROWS {
            // A prefill: the experts are tasks across the threads, each run on its own thread
            // over all of its rows as soon as its read lands, so no product waits for the
            // others between experts. This thread lands every read of the group before it
            // waits for the tasks (the end of the scope, the only place it can pick up another
            // session's pass): passes inside the pool keep landing their reads before any
            // parallel wait.
            type Arrival = Result<(usize, Pinned), sluice_store::StoreError>;
            let source = arrivals;
            let serial = exec.serial();
            type Out = Result<Vec<f32>, ModelError>;
            let done: std::sync::Mutex<Vec<(u32, Out)>> =
                std::sync::Mutex::new(Vec::with_capacity(chunk.len()));
            let shared_out: std::sync::Mutex<Option<Out>> = std::sync::Mutex::new(None);
            let (serial, done, shared_out, inputs) = (&serial, &done, &shared_out, &inputs);
            let fed: Result<(), ModelError> = exec.tasks(|sp| {
                if let Some(sh) = shared
                    && shared_y.is_none()
                {
                    sp.spawn(move || {
                        let y = glu_rows(serial, sh, blob, x, mlp_act, rows_per_call);
                        if let Ok(mut s) = shared_out.lock() {
                            *s = Some(y);
                        }
                    });
                }
                let feed = |arrival: Arrival| {
                    let (ci, eb) = arrival?;
                    let e = chunk[ci];
                    sp.spawn(move || {
                        let y = inputs(e).and_then(|(xe, spec)| {
                            let n = xe.len() / w;
                            expert_rows(serial, cfg, limit, spec, &eb, &xe, n, rows_per_call)
                        });
                        drop(eb);
                        if let Ok(mut d) = done.lock() {
                            d.push((e, y));
                        }
                    });
                    Ok::<(), ModelError>(())
                };
                { source }.try_for_each(|a: Arrival| feed(a))
            });
            fed?;
            if let Some(y) = shared_out.lock().ok().and_then(|mut s| s.take()) {
                shared_y = Some(y?);
            }
            let results = std::mem::take(&mut *done.lock().map_err(|_| poisoned())?);
            for (e, y) in results {
                put(&mut outs, e, &y?);
            }
            continue;
        }
        if gather {
            // Every expert fits in the cache, so once warm a step reads nothing: take the whole
            // group, then run its GLU blocks (with the last group, the shared expert's too) in
            // two trips to the pool rather than three per expert.
            let mut blobs: Vec<Option<Pinned>> = (0..chunk.len()).map(|_| None).collect();
            for arrival in arrivals {
                let (ci, eb) = arrival?;
                blobs[ci] = Some(eb);
            }
            let mut ins = Vec::with_capacity(chunk.len());
            for (&e, b) in chunk.iter().zip(blobs) {
                let b = b.ok_or_else(|| {
                    ModelError::Internal(format!("expert {e} of layer {layer} never arrived"))
                })?;
                let (xe, spec) = inputs(e)?;
                ins.push((b, xe, spec));
            }
            let mut jobs = Vec::with_capacity(chunk.len() + 1);
            if let Some(act) = glu_activation(cfg.moe.activation, limit) {
                for (&e, (eb, xe, spec)) in chunk.iter().zip(&ins) {
                    if let ExpertSpec::SwiGlu(m) = spec {
                        jobs.push(GluJob {
                            spec: m,
                            blob: eb,
                            x: xe,
                            t: users[&e].len(),
                            act,
                        });
                    }
                }
            }
            // Over more rows than a call takes, each expert in turn (the synchronisations
            // glu_many saves do not matter there, and its scratch would grow with the rows).
            if jobs.len() == chunk.len() && t <= rows_per_call {
                let with_shared = rest.is_empty() && shared.is_some();
                if let (true, Some(sh)) = (with_shared, shared) {
                    jobs.push(GluJob {
                        spec: sh,
                        blob,
                        x,
                        t,
                        act: mlp_act,
                    });
                }
                let mut ys = glu_many(exec, &jobs)?;
                if with_shared {
                    shared_y = ys.pop();
                }
                for (&e, y) in chunk.iter().zip(&ys) {
                    put(&mut outs, e, y);
                }
            } else {
                for (&e, (eb, xe, spec)) in chunk.iter().zip(&ins) {
                    let n = users[&e].len();
                    put(
                        &mut outs,
                        e,
                        &expert_rows(exec, cfg, limit, spec, eb, xe, n, rows_per_call)?,
                    );
                }
            }
            continue;
        }
        // The shared expert needs nothing from the store: compute it while the misses are read.
        if let Some(sh) = shared
            && shared_y.is_none()
        {
            let t0 = std::time::Instant::now();
            shared_y = Some(glu_rows(exec, sh, blob, x, mlp_act, rows_per_call)?);
            shared_seconds += t0.elapsed().as_secs_f64();
        }
        // Each expert as soon as it is in memory: resident ones first, then reads as they land.
        // Every expert writes only its own rows of `outs`, so the order changes no bit.
        let mut arrivals = arrivals;
        let mut computed: Vec<u32> = Vec::with_capacity(chunk.len());
        loop {
            if arrivals.only_reads_left()
                && let Some(f) = mid.take()
            {
                let partial = so_far(cfg, &sels, &outs, w, &computed, shared_y.as_deref());
                f(&partial)?;
            }
            let Some(arrival) = arrivals.next() else {
                break;
            };
            let (ci, eb) = arrival?;
            let e = chunk[ci];
            let (xe, spec) = inputs(e)?;
            let n = users[&e].len();
            put(
                &mut outs,
                e,
                &expert_rows(exec, cfg, limit, spec, &eb, &xe, n, rows_per_call)?,
            );
            computed.push(e);
        }
    }
    expert_seconds
        .set(expert_seconds.get() + (t_experts.elapsed().as_secs_f64() - shared_seconds).max(0.0));

    // Combine per token in expert-id order: acc += w · y (as transformers' index_add does),
    // or acc += y when the weight went into the input.
    let mut comb = vec![0f32; t * w];
    for (i, s) in sels.iter().enumerate() {
        let acc = &mut comb[i * w..(i + 1) * w];
        for (slot, &(_, wt)) in s.iter().enumerate() {
            let y = &outs[(i * k + slot) * w..(i * k + slot + 1) * w];
            if cfg.moe.weight_on_input {
                for (a, &v) in acc.iter_mut().zip(y) {
                    *a += v;
                }
            } else {
                for (a, &v) in acc.iter_mut().zip(y) {
                    *a += wt * v;
                }
            }
        }
    }
    // Back from the latent space: RMSNorm on the aggregate, then up.
    let out = match latent {
        Some(l) => {
            if let Some(n) = &l.norm {
                let nw = n.to_f32(blob);
                let mut tmp = vec![0f32; w];
                for row in comb.chunks_exact_mut(w) {
                    exec.kernels().rmsnorm(row, &nw, cfg.eps, &mut tmp);
                    row.copy_from_slice(&tmp);
                }
            }
            let mut up = vec![0f32; t * h];
            exec.matmul(&l.up.view(blob)?, &comb, &mut up);
            up
        }
        None => comb,
    };
    // LongCat's shortcut: the routed sum is carried to the next layer, the shared expert (its
    // first sublayer's MLP) joins the stream now.
    let (mut out, carried) = if cfg.moe.shortcut {
        (vec![0f32; t * h], Some(out))
    } else {
        (out, None)
    };
    if let Some(sh) = shared {
        let y = match shared_y {
            Some(y) => y,
            None => glu_rows(exec, sh, blob, x, mlp_act, rows_per_call)?,
        };
        match shared_gate {
            Some(g) => {
                let mut gl = vec![0f32; t];
                exec.matmul(&g.view(blob)?, x, &mut gl);
                for i in 0..t {
                    let s = scalar::sigmoid(gl[i]);
                    for (a, &v) in out[i * h..(i + 1) * h]
                        .iter_mut()
                        .zip(&y[i * h..(i + 1) * h])
                    {
                        *a += s * v;
                    }
                }
            }
            None => {
                for (a, &v) in out.iter_mut().zip(&y) {
                    *a += v;
                }
            }
        }
    }
    Ok(MoeOut { now: out, carried })
}

/// The lookahead a MoE layer runs for the next layer's experts while it computes its own.
pub(crate) struct Ahead<'a> {
    /// The early guess (layer, experts), read once this layer's first experts are pinned.
    pub early: Option<&'a (usize, Vec<u32>)>,
    /// Called at most once, on a decode step, when only reads remain for this layer: with what
    /// the layer adds to the stream so far (`[t, hidden]`), for the mid guess
    /// ([`sluice_store::Guess::Mid`]).
    pub mid: Option<&'a MidGuess<'a>>,
}

/// The mid guess of [`Ahead`]: takes what the layer adds to the stream so far.
pub(crate) type MidGuess<'a> = dyn Fn(&[f32]) -> Result<(), ModelError> + 'a;

/// An estimate of what a MoE layer adds to the stream, from the routed experts `computed` so
/// far (their slots of `outs`, weighted as the combine weighs them, zero-compute slots
/// included) and the shared expert when it has run (ungated). A lookahead input, not a
/// result: no output depends on it.
fn so_far(
    cfg: &ModelConfig,
    sels: &[Selection],
    outs: &[f32],
    w: usize,
    computed: &[u32],
    shared: Option<&[f32]>,
) -> Vec<f32> {
    let k = cfg.moe.top_k;
    let real = cfg.moe.experts as u32;
    let mut acc = vec![0f32; sels.len() * w];
    if !cfg.moe.shortcut {
        for (i, s) in sels.iter().enumerate() {
            let row = &mut acc[i * w..(i + 1) * w];
            for (slot, &(e, wt)) in s.iter().enumerate() {
                if e < real && !computed.contains(&e) {
                    continue;
                }
                let wt = if cfg.moe.weight_on_input { 1.0 } else { wt };
                let y = &outs[(i * k + slot) * w..(i * k + slot + 1) * w];
                for (a, &v) in row.iter_mut().zip(y) {
                    *a += wt * v;
                }
            }
        }
    }
    if let Some(y) = shared.filter(|y| y.len() == acc.len()) {
        for (a, &v) in acc.iter_mut().zip(y) {
            *a += v;
        }
    }
    acc
}

/// What a mixture of experts adds to the stream: now, and (with [`MoeConfig::shortcut`])
/// after the next layer's feed-forward block.
///
/// [`MoeConfig::shortcut`]: crate::config::MoeConfig::shortcut
pub(crate) struct MoeOut {
    /// Added after this layer's feed-forward block.
    pub now: Vec<f32>,
    /// Added after the next layer's.
    pub carried: Option<Vec<f32>>,
}
