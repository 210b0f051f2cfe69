//! The maths of one routed expert, by how its weights are stored and which activation the
//! family gives it: SwiGLU (or SiTU-GLU) blocks, Llama 4's fused gate-and-up product, and
//! GPT-OSS's clamped SwiGLU with biased, fused or separate projections.

use sluice_kernels::scalar;
use sluice_store::Blob;

use super::glu::{activate, add_bias, glu, in_calls, linear};
use crate::ModelError;
use crate::config::{ExpertActivation, GluActivation, ModelConfig};
use crate::exec::Exec;
use crate::weights::{BiasedMlpSpec, ExpertSpec, FusedExpertSpec, GateUpSpec};

/// The GLU activation of SwiGLU-shaped routed experts (None for GPT-OSS's clamped form).
pub(super) fn glu_activation(a: ExpertActivation, limit: Option<f32>) -> Option<GluActivation> {
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
    let a = cfg.moe.activation;
    if limit.is_some() && !matches!(a, ExpertActivation::SwiGlu) {
        return Err(ModelError::Mismatch {
            what: "a bound on the experts' factors with an activation other than SwiGLU".into(),
        });
    }
    match (spec, glu_activation(a, limit), a) {
        (ExpertSpec::SwiGlu(m), Some(act), _) => glu(exec, m, blob, x, t, act),
        (ExpertSpec::GateUp(g), Some(act), _) if !matches!(a, ExpertActivation::Situ { .. }) => {
            gate_up_expert(exec, g, blob, x, t, act)
        }
        (ExpertSpec::Fused(g), None, ExpertActivation::ClampedSwiGlu { alpha, limit }) => {
            clamped_expert(exec, g, blob, x, t, alpha, limit)
        }
        (ExpertSpec::Biased(b), None, ExpertActivation::ClampedSwiGlu { alpha, limit }) => {
            biased_expert(exec, b, blob, x, t, alpha, limit)
        }
        _ => Err(ModelError::Mismatch {
            what: "expert spec does not match the configured activation".into(),
        }),
    }
}
