//! Kimi Delta Attention (KDA), the linear attention of Kimi Linear and Kimi K3.
//!
//! Per head, a `head_dim × head_dim` state `S` (key channels by value channels) is carried from
//! token to token. For each token: q, k and v are projections of the input passed through short
//! causal depthwise convolutions with SiLU (their last `kernel − 1` inputs are carried too);
//! q and k are L2-normalised and q scaled by `head_dim^−½`; the forget gate gives a log-decay
//! per key channel from a low-rank projection, `dt_bias` and `A_log` (softplus form for Kimi
//! Linear, a sigmoid with a lower bound for K3), β = σ(b x) per head; then the delta rule
//! `S ← diag(e^g) S`, `S ← S + k (β (v − Sᵀk))ᵀ`, `o = Sᵀ q`. The output is RMS-normalised per
//! head, multiplied by σ of an output gate and projected back.
//!
//! The recurrence runs token by token with the same per-token arithmetic whatever the number
//! of tokens in a call (transformers' chunked form for prefill is algebraically the same and
//! differs only in rounding), so chunked prefill gives the same bits as decoding one token at a
//! time. Heads are independent: threads own whole heads.

use sluice_store::Blob;

use super::Ctx;
use crate::ModelError;
use crate::spec::{MatSpec, PartBuilder, VecSpec};

/// How KDA's forget gate turns `z = f_b(f_a(x)) + dt_bias` into the log-decay `g` of each key
/// channel (`A` = `A_log[head]`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KdaGate {
    /// `g = −exp(A) · softplus(z)` (Kimi Linear).
    Softplus,
    /// `g = lower_bound · σ(exp(A) · z)` (Kimi K3, `gate_lower_bound`).
    LowerBound(f32),
}

/// Kimi Delta Attention (`linear_attn_config`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KdaConfig {
    /// Heads.
    pub heads: usize,
    /// Key and value dimension per head.
    pub head_dim: usize,
    /// Taps of the short causal convolutions on q, k and v.
    pub conv_kernel: usize,
    /// The forget gate.
    pub gate: KdaGate,
    /// The output gate is one full-rank `g_proj` (K3) rather than `g_b_proj(g_a_proj(x))`.
    pub full_rank_output_gate: bool,
}

/// KDA's output gate.
#[derive(Clone, Copy, Debug)]
pub enum OutputGate {
    /// `g_proj` `[heads × head_dim, hidden]` (Kimi K3).
    Full(MatSpec),
    /// `g_a_proj` `[head_dim, hidden]` then `g_b_proj` `[heads × head_dim, head_dim]`.
    LowRank(MatSpec, MatSpec),
}

/// The weights of a Kimi Delta Attention layer (`C` = heads × head_dim).
#[derive(Clone, Copy, Debug)]
pub struct KdaWeights {
    /// `q_proj` `[C, hidden]`.
    pub q: MatSpec,
    /// `k_proj` `[C, hidden]`.
    pub k: MatSpec,
    /// `v_proj` `[C, hidden]`.
    pub v: MatSpec,
    /// Depthwise causal convolution taps of q, k, v, each `[C, 1, kernel]`.
    pub conv: [VecSpec; 3],
    /// Forget gate, low rank: `f_a_proj` `[head_dim, hidden]`.
    pub f_a: MatSpec,
    /// `f_b_proj` `[C, head_dim]`.
    pub f_b: MatSpec,
    /// `A_log`, one per head (the first `heads` values of the stored tensor).
    pub a_log: VecSpec,
    /// `dt_bias` `[C]`.
    pub dt_bias: VecSpec,
    /// `b_proj` `[heads, hidden]`: β = σ(b x) per head.
    pub b: MatSpec,
    /// Output gate.
    pub gate: OutputGate,
    /// `o_norm` `[head_dim]`, RMSNorm per head before the gate.
    pub o_norm: VecSpec,
    /// `o_proj` `[hidden, C]`.
    pub o: MatSpec,
}

impl KdaConfig {
    /// `heads × head_dim`.
    pub fn width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Floats of one layer's recurrent state: `heads × head_dim²`.
    pub fn state_len(&self) -> usize {
        self.heads * self.head_dim * self.head_dim
    }

    /// Floats of one layer's convolution state: the last `conv_kernel − 1` inputs of q, k, v.
    pub fn conv_len(&self) -> usize {
        3 * (self.conv_kernel - 1) * self.width()
    }

    /// Floats of scratch per token: q, k, v, decay, gate, output and its per-head copy, and the
    /// low-rank projections.
    pub fn scratch_floats(&self) -> usize {
        8 * self.width() + 2 * self.head_dim + self.heads
    }

    /// The product the arithmetic multiplies out, and the field that names it.
    pub fn widest(&self) -> (usize, usize, &'static str, &'static str) {
        (
            self.heads,
            self.head_dim,
            "linear_attn_config.num_heads",
            "linear_attn_config num_heads × head_dim",
        )
    }

    pub(crate) fn new_cache(&self) -> Cache {
        Cache::new(self.conv_len(), self.state_len())
    }

    /// Finds and checks the layer's tensors; `a` names a tensor of the attention module.
    pub(crate) fn load(
        &self,
        p: &mut PartBuilder<'_, '_>,
        a: &dyn Fn(&str) -> String,
        h: usize,
    ) -> Result<KdaWeights, ModelError> {
        let (c, d, heads) = (self.width(), self.head_dim, self.heads);
        let kk = self.conv_kernel;
        Ok(KdaWeights {
            q: p.linear(&a("q_proj"), c, h)?,
            k: p.linear(&a("k_proj"), c, h)?,
            v: p.linear(&a("v_proj"), c, h)?,
            conv: [
                p.vector_any(&a("q_conv1d.weight"), &[c, 1, kk])?,
                p.vector_any(&a("k_conv1d.weight"), &[c, 1, kk])?,
                p.vector_any(&a("v_conv1d.weight"), &[c, 1, kk])?,
            ],
            f_a: p.linear(&a("f_a_proj"), d, h)?,
            f_b: p.linear(&a("f_b_proj"), c, d)?,
            a_log: a_log(p, &a("A_log"), heads)?,
            dt_bias: p.vector_any(&a("dt_bias"), &[c])?,
            b: p.linear(&a("b_proj"), heads, h)?,
            gate: if self.full_rank_output_gate {
                OutputGate::Full(p.linear(&a("g_proj"), c, h)?)
            } else {
                OutputGate::LowRank(
                    p.linear(&a("g_a_proj"), d, h)?,
                    p.linear(&a("g_b_proj"), c, d)?,
                )
            },
            o_norm: p.vector(&a("o_norm.weight"), d)?,
            o: p.linear(&a("o_proj"), h, c)?,
        })
    }
}

/// KDA's `A_log`: one value per head. Kimi K3 ships it padded with zeros to `head_dim` values
/// (`F32 [128]` for 96 heads); the padding is checked to be exactly zero, since anything else
/// would mean a layout sluice does not understand.
fn a_log(p: &mut PartBuilder<'_, '_>, name: &str, heads: usize) -> Result<VecSpec, ModelError> {
    let t = p.checkpoint().tensor(name)?;
    let n: usize = t.shape.iter().product();
    if n == heads {
        return p.vector_any(name, &[heads]);
    }
    if t.shape.len() != 1 || n < heads {
        return Err(crate::spec::tensor_err(
            name,
            format!(
                "shape {:?}: expected {heads} values (one per head), or a vector zero-padded \
                 past them",
                t.shape
            ),
        ));
    }
    let codes = crate::spec::vector_codes(t)?;
    if p.resolving() {
        let bytes = p.checkpoint().read(t)?;
        let values = sluice_kernels::decode::decode_vec(codes, &bytes, n);
        if let Some(i) = (heads..n).find(|&i| values[i] != 0.0) {
            return Err(crate::spec::tensor_err(
                name,
                format!(
                    "{n} values for {heads} heads, and value {i} past the heads is not zero: \
                     not the zero padding Kimi K3 ships"
                ),
            ));
        }
    }
    Ok(p.vector_as(name, codes, heads))
}

/// The state of one delta-rule layer (KDA, and Gated DeltaNet in [`super::gdn`]): fixed in
/// size, whatever the sequence length.
#[derive(Clone, Debug)]
pub(crate) struct Cache {
    /// Positions absorbed.
    pos: usize,
    /// The last `kernel − 1` inputs of the convolutions, oldest first (KDA:
    /// `[3][kernel − 1][heads × head_dim]`; zeros before the first token).
    pub(super) conv: Vec<f32>,
    /// Per head, the `[key dim, value dim]` state matrix.
    pub(super) state: Vec<f32>,
    /// `conv` and `state` as they were at position `undo_pos`, before the latest forward pass
    /// that changed them: what a failed pass, or a truncation back to that position, restores.
    undo: Option<(usize, Vec<f32>, Vec<f32>)>,
}

impl Cache {
    /// A zero state of `conv` and `state` floats.
    pub(super) fn new(conv: usize, state: usize) -> Cache {
        Cache {
            pos: 0,
            conv: vec![0.0; conv],
            state: vec![0.0; state],
            undo: None,
        }
    }

    /// Its buffers, for saving: the convolutions' inputs and the state matrices.
    pub(crate) fn parts(&self) -> Vec<&[f32]> {
        vec![&self.conv, &self.state]
    }

    /// Takes saved buffers after `pos` positions; no snapshot to go back to but the start.
    pub(crate) fn restore(&mut self, mut parts: Vec<Vec<f32>>, pos: usize) -> Result<(), String> {
        let state = parts.pop();
        let conv = parts.pop();
        match (conv, state) {
            (Some(c), Some(s))
                if parts.is_empty()
                    && c.len() == self.conv.len()
                    && s.len() == self.state.len() =>
            {
                self.conv = c;
                self.state = s;
                self.pos = pos;
                self.undo = None;
                Ok(())
            }
            _ => Err("the recurrent state's buffers do not match the layer".into()),
        }
    }

    /// Whether this call starts the pass that began at `pass_start` (so the state is saved).
    pub(super) fn at_pass_start(&self, pass_start: usize) -> bool {
        self.pos == pass_start
    }

    /// `t` more positions absorbed.
    pub(super) fn advance(&mut self, t: usize) {
        self.pos += t;
    }

    /// Saves the state before a forward pass changes it.
    pub(super) fn save(&mut self) {
        match &mut self.undo {
            Some((p, c, s)) => {
                *p = self.pos;
                c.copy_from_slice(&self.conv);
                s.copy_from_slice(&self.state);
            }
            None => self.undo = Some((self.pos, self.conv.clone(), self.state.clone())),
        }
    }

    /// Whether the state can go back to `pos`: it is there, or it was there before the
    /// latest pass, or `pos` is the start.
    pub(crate) fn can_back_to(&self, pos: usize) -> bool {
        self.pos == pos || pos == 0 || self.undo.as_ref().is_some_and(|u| u.0 == pos)
    }

    /// The position besides the start the state can go back to, if any.
    pub(crate) fn undo_pos(&self) -> Option<usize> {
        self.undo.as_ref().map(|u| u.0)
    }

    /// Goes back to `pos` positions if it can (see [`Cache::can_back_to`]).
    pub(crate) fn back_to(&mut self, pos: usize) -> bool {
        if self.pos == pos {
            return true;
        }
        if pos == 0 {
            self.conv.fill(0.0);
            self.state.fill(0.0);
            self.pos = 0;
            return true;
        }
        match &mut self.undo {
            Some((p, c, s)) if *p == pos => {
                std::mem::swap(&mut self.conv, c);
                std::mem::swap(&mut self.state, s);
                self.pos = pos;
                // The swapped-out buffers are no snapshot of anything any more.
                self.undo = None;
                true
            }
            _ => false,
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        let undo = self.undo.as_ref().map_or(0, |(_, c, s)| c.len() + s.len());
        (self.conv.len() + self.state.len() + undo) * 4
    }
}

/// The eps of FLA's L2 norm of q and k.
const L2_EPS: f32 = 1e-6;

/// One KDA layer over the normed input `x` `[t, hidden]`, advancing `cache`; returns
/// `[t, hidden]`. The cache's state before the pass (the first call of a pass that runs the
/// layer chunk by chunk) is saved first, so a failed pass can restore it.
pub(crate) fn forward(
    kc: &KdaConfig,
    cx: &Ctx<'_>,
    spec: &KdaWeights,
    blob: &Blob,
    cache: &mut Cache,
    x: &[f32],
) -> Result<Vec<f32>, ModelError> {
    let exec = cx.exec;
    let h = cx.hidden;
    let t = x.len() / h;
    let (nh, d, kk) = (kc.heads, kc.head_dim, kc.conv_kernel);
    let c = nh * d;
    let k = exec.kernels();
    if cache.pos == cx.pass_start {
        cache.save();
    }

    // q, k, v through their short convolutions (with SiLU), carrying the last kk − 1 inputs.
    let mut proj = [vec![0f32; t * c], vec![0f32; t * c], vec![0f32; t * c]];
    for (p, m) in proj.iter_mut().zip([&spec.q, &spec.k, &spec.v]) {
        exec.matmul(&m.view(blob)?, x, p);
    }
    let keep = (kk - 1) * c;
    for (i, p) in proj.iter_mut().enumerate() {
        let taps = spec.conv[i].to_f32(blob); // [c, kk]
        let mut wt = vec![0f32; kk * c]; // [kk, c]
        for ch in 0..c {
            for j in 0..kk {
                wt[j * c + ch] = taps[ch * kk + j];
            }
        }
        let st = &mut cache.conv[i * keep..(i + 1) * keep];
        let mut xs = Vec::with_capacity(keep + t * c);
        xs.extend_from_slice(st);
        xs.extend_from_slice(p);
        for tok in 0..t {
            k.conv_silu(
                &xs[tok * c..(tok + kk) * c],
                &wt,
                &mut p[tok * c..(tok + 1) * c],
            );
        }
        st.copy_from_slice(&xs[t * c..]);
    }
    let [mut qs, mut ks, vs] = proj;

    // The decay of each key channel: e^g.
    let mut fa = vec![0f32; t * d];
    exec.matmul(&spec.f_a.view(blob)?, x, &mut fa);
    let mut decay = vec![0f32; t * c];
    exec.matmul(&spec.f_b.view(blob)?, &fa, &mut decay);
    let dt = spec.dt_bias.to_f32(blob);
    for row in decay.chunks_exact_mut(c) {
        for (z, &b) in row.iter_mut().zip(&dt) {
            *z += b;
        }
    }
    let mut a = spec.a_log.to_f32(blob);
    k.exp(&mut a);
    match kc.gate {
        KdaGate::Softplus => {
            // g = −e^A · softplus(z)
            k.softplus(&mut decay);
            for row in decay.chunks_exact_mut(c) {
                for (hd, seg) in row.chunks_exact_mut(d).enumerate() {
                    for v in seg {
                        *v *= -a[hd];
                    }
                }
            }
        }
        KdaGate::LowerBound(lb) => {
            // g = lb · σ(e^A · z)
            for row in decay.chunks_exact_mut(c) {
                for (hd, seg) in row.chunks_exact_mut(d).enumerate() {
                    for v in seg.iter_mut() {
                        *v *= a[hd];
                    }
                }
            }
            k.sigmoid(&mut decay);
            for v in &mut decay {
                *v *= lb;
            }
        }
    }
    k.exp(&mut decay);

    let mut beta = vec![0f32; t * nh];
    exec.matmul(&spec.b.view(blob)?, x, &mut beta);
    k.sigmoid(&mut beta);

    // L2-normalised q (then scaled) and k, per head.
    let scale = (1.0 / (d as f64).sqrt()) as f32;
    let mut tmp = vec![0f32; d];
    for seg in qs.chunks_exact_mut(d) {
        k.l2norm(seg, L2_EPS, &mut tmp);
        for (s, &v) in seg.iter_mut().zip(&tmp) {
            *s = v * scale;
        }
    }
    for seg in ks.chunks_exact_mut(d) {
        k.l2norm(seg, L2_EPS, &mut tmp);
        seg.copy_from_slice(&tmp);
    }

    // The recurrence, one head per task, tokens in order.
    let mut per_head = vec![0f32; nh * t * d]; // [head][token][d]
    {
        let (qs, ks, vs, decay, beta) = (&qs, &ks, &vs, &decay, &beta);
        exec.for_each_chunk_pair(
            &mut cache.state,
            d * d,
            &mut per_head,
            t * d,
            |hd, st, o| {
                let mut u = vec![0f32; d];
                for tok in 0..t {
                    let at = tok * c + hd * d;
                    k.kda_step(
                        st,
                        &qs[at..at + d],
                        &ks[at..at + d],
                        &vs[at..at + d],
                        &decay[at..at + d],
                        beta[tok * nh + hd],
                        &mut u,
                        &mut o[tok * d..(tok + 1) * d],
                    );
                }
            },
        );
    }

    // Norm per head, then the output gate.
    let on = spec.o_norm.to_f32(blob);
    let mut y = vec![0f32; t * c];
    for hd in 0..nh {
        for tok in 0..t {
            let src = &per_head[(hd * t + tok) * d..(hd * t + tok + 1) * d];
            k.rmsnorm(
                src,
                &on,
                cx.eps,
                &mut y[tok * c + hd * d..tok * c + (hd + 1) * d],
            );
        }
    }
    let mut gate = vec![0f32; t * c];
    match &spec.gate {
        OutputGate::Full(g) => exec.matmul(&g.view(blob)?, x, &mut gate),
        OutputGate::LowRank(ga, gb) => {
            let mut low = vec![0f32; t * d];
            exec.matmul(&ga.view(blob)?, x, &mut low);
            exec.matmul(&gb.view(blob)?, &low, &mut gate);
        }
    }
    k.mul_sigmoid(&mut y, &gate);
    let mut out = vec![0f32; t * h];
    exec.matmul(&spec.o.view(blob)?, &y, &mut out);
    cache.pos += t;
    Ok(out)
}
