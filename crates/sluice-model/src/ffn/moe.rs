//! The mixture-of-experts block: route every token, hand the selected experts to the
//! [schedule](super::schedule), then combine their outputs per token and add the shared
//! expert. What the families change about a mixture lives here and in their configuration:
//! zero-compute experts (LongCat), the routing weight applied to the input (Llama 4), a latent
//! space around the experts (Kimi K3), the routed sum carried to the next layer (LongCat's
//! shortcut) and a gated shared expert (Qwen2-MoE).

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Mutex;

use sluice_kernels::scalar;
use sluice_store::{Blob, ExpertStore};

use super::expert::{expert_rows, glu_activation};
use super::glu::{GluJob, glu_rows};
use super::router::{Selection, select};
use super::schedule::{Experts, Mid, Schedule, poisoned};
use crate::ModelError;
use crate::config::{GluActivation, ModelConfig};
use crate::exec::Exec;
use crate::state::Route;
use crate::weights::{ExpertSpec, MlpSpec, MoeSpec};

/// One MoE layer as loaded: its configuration, trunk weights and experts.
pub(crate) struct MoeLayer<'a> {
    pub exec: &'a Exec,
    pub cfg: &'a ModelConfig,
    pub layer: usize,
    /// The trunk side: router, shared expert, latent projections.
    pub spec: &'a MoeSpec,
    /// The trunk bytes `spec` points into.
    pub blob: &'a Blob,
    /// Where the routed experts are.
    pub store: &'a ExpertStore,
    /// Every routed expert's matrices, by id.
    pub experts: &'a [ExpertSpec],
}

/// How a [`MoeLayer`] runs its experts; no output bit depends on it.
pub(crate) struct Run<'a> {
    /// The lookahead for the next layer's experts.
    pub ahead: Ahead<'a>,
    /// Every expert fits the cache (their GLU blocks go to the pool together).
    pub gather: bool,
    /// Rows per product call.
    pub rows_per_call: usize,
    /// Time in routed experts is added here.
    pub expert_seconds: &'a Cell<f64>,
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

/// The routed experts of one forward: which (token, slot) pairs each serves, and their
/// outputs by slot.
struct Routed<'a> {
    layer: &'a MoeLayer<'a>,
    sels: &'a [Selection],
    users: BTreeMap<u32, Vec<(usize, usize)>>,
    /// The rows the experts work on (`[t, w]`).
    xr: &'a [f32],
    w: usize,
    /// The bound on SwiGLU experts' factors in this layer.
    limit: Option<f32>,
    /// `[t, top_k, w]`, slot by slot.
    outs: Mutex<Vec<f32>>,
}

impl Experts for Routed<'_> {
    fn rows(&self, e: u32) -> usize {
        self.users.get(&e).map_or(0, Vec::len)
    }

    fn input(&self, e: u32) -> Vec<f32> {
        let w = self.w;
        let users = self.users.get(&e).map_or(&[][..], |u| &u[..]);
        let mut xe = Vec::with_capacity(users.len() * w);
        for &(i, slot) in users {
            let row = &self.xr[i * w..(i + 1) * w];
            if self.layer.cfg.moe.weight_on_input {
                // Llama 4: the expert sees its routing weight times the row.
                let wt = self.sels[i][slot].1;
                xe.extend(row.iter().map(|&v| v * wt));
            } else {
                xe.extend_from_slice(row);
            }
        }
        xe
    }

    fn run(
        &self,
        exec: &Exec,
        e: u32,
        blob: &Blob,
        x: &[f32],
        per_call: usize,
    ) -> Result<Vec<f32>, ModelError> {
        let spec = self.spec(e)?;
        let n = x.len() / self.w;
        expert_rows(exec, self.layer.cfg, self.limit, spec, blob, x, n, per_call)
    }

    fn glu(&self, e: u32) -> Option<(&MlpSpec, GluActivation)> {
        let act = glu_activation(self.layer.cfg.moe.activation, self.limit)?;
        match self.spec(e).ok()? {
            ExpertSpec::SwiGlu(m) => Some((m, act)),
            _ => None,
        }
    }

    fn put(&self, e: u32, y: &[f32]) {
        let (w, k) = (self.w, self.layer.cfg.moe.top_k);
        let Ok(mut outs) = self.outs.lock() else {
            return;
        };
        for (r, &(i, slot)) in self.users.get(&e).into_iter().flatten().enumerate() {
            outs[(i * k + slot) * w..(i * k + slot + 1) * w]
                .copy_from_slice(&y[r * w..(r + 1) * w]);
        }
    }
}

impl Routed<'_> {
    fn spec(&self, e: u32) -> Result<&ExpertSpec, ModelError> {
        self.layer
            .experts
            .get(e as usize)
            .ok_or(ModelError::Mismatch {
                what: format!("no spec for expert {e}"),
            })
    }
}

impl MoeLayer<'_> {
    /// The mixture of experts for the `[t, hidden]` rows of `x` (`tokens` their tokens, for a
    /// hash-routed layer): route every token, then run each selected expert once over all the
    /// rows that chose it (expert-major, "union" order). Each row's arithmetic is the same as
    /// if it were alone. Each row's route is pushed to `routes`, its position the row's index.
    pub(crate) fn forward(
        &self,
        x: &[f32],
        tokens: &[u32],
        routes: Option<&mut Vec<Route>>,
        run: Run<'_>,
    ) -> Result<MoeOut, ModelError> {
        let (exec, cfg, spec, blob) = (self.exec, self.cfg, self.spec, self.blob);
        let layer = self.layer;
        let rows_per_call = run.rows_per_call.max(1);
        let h = cfg.hidden;
        let t = x.len() / h;
        // This layer's activations (Step-3.7 bounds them per layer).
        let (mlp_act, limit) = (cfg.mlp_act_of(layer), cfg.expert_limit(layer));
        let ne = cfg.moe.router_width();
        let mut logits = vec![0f32; t * ne];
        exec.matmul(&spec.router.view(blob)?, x, &mut logits);
        let bias = spec.bias.map(|b| b.to_f32(blob));
        let sels = select(
            cfg,
            &mut logits,
            bias.as_deref(),
            spec.hash.as_ref(),
            blob,
            tokens,
        )?;
        if let Some(r) = routes {
            for (i, s) in sels.iter().enumerate() {
                r.push(Route {
                    pos: i,
                    layer,
                    experts: s.iter().map(|p| p.0).collect(),
                    weights: s.iter().map(|p| p.1).collect(),
                });
            }
        }

        // Kimi K3: the experts work in a latent space.
        let xr_owned;
        let (xr, w) = match &spec.latent {
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
        let routed = Routed {
            layer: self,
            sels: &sels,
            users,
            xr,
            w,
            limit,
            outs: Mutex::new(outs),
        };
        // The mid guess from the experts computed so far. Experts that work in a latent space
        // add nothing to the stream before the way back (norm and up-projection) of their
        // whole sum: no estimate to guess from.
        let mid_guess = run.ahead.mid.filter(|_| spec.latent.is_none());
        let mid = |computed: &[u32], shared: Option<&[f32]>| -> Result<(), ModelError> {
            let partial = {
                let outs = routed.outs.lock().map_err(|_| poisoned())?;
                so_far(cfg, &sels, &outs, w, computed, shared)
            };
            match mid_guess {
                Some(f) => f(&partial),
                None => Ok(()),
            }
        };
        let side = spec.shared.as_ref().map(|sh| GluJob {
            spec: sh,
            blob,
            x,
            t,
            act: mlp_act,
        });
        let shared_y = Schedule {
            exec,
            store: self.store,
            layer,
            t,
            gather: run.gather,
            rows_per_call,
            early: run.ahead.early,
            mid: mid_guess.is_some().then_some(&mid as &Mid<'_>),
            expert_seconds: run.expert_seconds,
        }
        .run(&ids, &routed, side.as_ref())?;
        let outs = routed.outs.into_inner().map_err(|_| poisoned())?;

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
        let out = match &spec.latent {
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
        // LongCat's shortcut: the routed sum is carried to the next layer, the shared expert
        // (its first sublayer's MLP) joins the stream now.
        let (mut out, carried) = if cfg.moe.shortcut {
            (vec![0f32; t * h], Some(out))
        } else {
            (out, None)
        };
        if let Some(sh) = &spec.shared {
            let y = match shared_y {
                Some(y) => y,
                None => glu_rows(exec, sh, blob, x, mlp_act, rows_per_call)?,
            };
            match &spec.shared_gate {
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
}

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
