//! The residual stream of a forward pass: plain addition, Kimi K3's attention residuals, or
//! Hy4's hyper-connections.

use std::borrow::Cow;

use sluice_kernels::Kernels;
use sluice_kernels::scalar::sigmoid;
use sluice_store::Blob;

use crate::ModelError;
use crate::config::{HyperConfig, Residual};
use crate::weights::{AttnResWeights, HyperWeights, MixWeights};

/// The residual stream of a forward pass over `t` rows.
pub(crate) enum Stream {
    /// `h`, to which every attention and feed-forward output is added.
    Add(Vec<f32>),
    /// Attention residuals: the completed blocks' sums, the embeddings first, and the running
    /// sum of the current block (`[t, hidden]` each).
    AttnRes {
        /// Layers per block.
        block_size: usize,
        /// Completed blocks.
        blocks: Vec<Vec<f32>>,
        /// The current block's running sum (the embeddings before layer 0).
        prefix: Vec<f32>,
    },
    /// Hyper-connections: `[t, n, hidden]` streams and, per token, the `post` gates (and the
    /// `n × n` mixing matrix) of the block running now.
    Hyper {
        /// The scheme.
        hc: HyperConfig,
        /// The streams.
        s: Vec<f32>,
        /// The running block's gates.
        post: Vec<f32>,
    },
}

/// What a mix needs besides the stream: kernels, the model's eps and width.
pub(crate) struct Mixing<'a> {
    pub k: &'a Kernels,
    pub eps: f32,
    pub hidden: usize,
}

fn weights(w: Option<&MixWeights>) -> Result<&AttnResWeights, ModelError> {
    match w {
        Some(MixWeights::AttnRes(w)) => Ok(w),
        _ => Err(ModelError::Mismatch {
            what: "attention residuals without their weights".into(),
        }),
    }
}

fn hyper_weights(w: Option<&MixWeights>) -> Result<&HyperWeights, ModelError> {
    match w {
        Some(MixWeights::Hyper(w)) => Ok(w),
        _ => Err(ModelError::Mismatch {
            what: "hyper-connections without their weights".into(),
        }),
    }
}

impl Stream {
    /// The stream of a pass starting from the embeddings `hs` (`[t, hidden]`).
    pub(crate) fn new(residual: Residual, hs: Vec<f32>, hidden: usize) -> Stream {
        match residual {
            Residual::Add => Stream::Add(hs),
            Residual::AttnRes { block_size } => Stream::AttnRes {
                block_size,
                blocks: Vec::new(),
                prefix: hs,
            },
            Residual::Hyper(hc) => {
                // Every stream starts as the embeddings.
                let mut s = Vec::with_capacity(hs.len() * hc.streams);
                for row in hs.chunks_exact(hidden.max(1)) {
                    for _ in 0..hc.streams {
                        s.extend_from_slice(row);
                    }
                }
                Stream::Hyper {
                    hc,
                    s,
                    post: Vec::new(),
                }
            }
        }
    }

    /// The stream of a pass starting from `x`: with hyper-connections the streams themselves
    /// (`[t, n, hidden]`, what a DeepSeek-V4 MTP layer enters with), otherwise as [`Self::new`].
    pub(crate) fn entering(residual: Residual, x: Vec<f32>, hidden: usize) -> Stream {
        match residual {
            Residual::Hyper(hc) => Stream::Hyper {
                hc,
                s: x,
                post: Vec::new(),
            },
            _ => Stream::new(residual, x, hidden),
        }
    }

    /// The stream's `rows` as they are, `width` floats each (with hyper-connections the
    /// streams, `[rows, n, hidden]`): what a DeepSeek-V4 MTP layer takes from the model.
    pub(crate) fn raw_rows(&self, rows: std::ops::Range<usize>, width: usize) -> &[f32] {
        &self.output()[rows.start * width..rows.end * width]
    }

    /// Layer `l`'s attention input (before its norm); `w` is the layer's pre-attention mix.
    /// At an attention-residual block boundary the running sum becomes a source and restarts.
    pub(crate) fn before_attention(
        &mut self,
        m: &Mixing<'_>,
        w: Option<&MixWeights>,
        blob: &Blob,
        l: usize,
    ) -> Result<Cow<'_, [f32]>, ModelError> {
        match self {
            Stream::Add(hs) => Ok(Cow::Borrowed(hs)),
            Stream::Hyper { hc, s, post } => {
                let (x, p) = hyper_pre(m, hc, Some(hyper_weights(w)?), blob, s, true)?;
                *post = p;
                Ok(Cow::Owned(x))
            }
            Stream::AttnRes {
                block_size,
                blocks,
                prefix,
            } => {
                let rows = prefix.len() / m.hidden;
                let input = if blocks.is_empty() {
                    None
                } else {
                    Some(mix(m, blocks, prefix, weights(w)?, blob, 0..rows))
                };
                if l.is_multiple_of(*block_size) {
                    let cur = std::mem::take(prefix);
                    let input = input.unwrap_or_else(|| cur.clone());
                    blocks.push(cur);
                    Ok(Cow::Owned(input))
                } else {
                    Ok(input.map_or(Cow::Borrowed(&prefix[..]), Cow::Owned))
                }
            }
        }
    }

    /// Adds layer `l`'s attention output (at a block boundary it starts the new running sum).
    pub(crate) fn add_attention(&mut self, l: usize, a: Vec<f32>) {
        match self {
            Stream::Add(hs) => add(hs, &a),
            Stream::Hyper { hc, s, post } => hyper_post(hc, s, post, &a),
            Stream::AttnRes {
                block_size, prefix, ..
            } => {
                if l.is_multiple_of(*block_size) {
                    *prefix = a;
                } else {
                    add(prefix, &a);
                }
            }
        }
    }

    /// The feed-forward block's input (before its norm); `w` is the layer's pre-MLP mix.
    pub(crate) fn before_ffn(
        &mut self,
        m: &Mixing<'_>,
        w: Option<&MixWeights>,
        blob: &Blob,
    ) -> Result<Cow<'_, [f32]>, ModelError> {
        match self {
            Stream::Add(hs) => Ok(Cow::Borrowed(hs)),
            Stream::Hyper { hc, s, post } => {
                let (x, p) = hyper_pre(m, hc, Some(hyper_weights(w)?), blob, s, true)?;
                *post = p;
                Ok(Cow::Owned(x))
            }
            Stream::AttnRes { blocks, prefix, .. } => {
                let rows = prefix.len() / m.hidden;
                Ok(Cow::Owned(mix(
                    m,
                    blocks,
                    prefix,
                    weights(w)?,
                    blob,
                    0..rows,
                )))
            }
        }
    }

    /// Adds the feed-forward block's output (with hyper-connections, by the `post` gates of the
    /// block [`Self::before_ffn`] began).
    pub(crate) fn add_ffn(&mut self, f: &[f32]) {
        match self {
            Stream::Add(hs) => add(hs, f),
            Stream::AttnRes { prefix, .. } => add(prefix, f),
            Stream::Hyper { hc, s, post } => hyper_post(hc, s, post, f),
        }
    }

    /// The latest layer's output: the stream, the current block's running sum, or the
    /// streams (`[t, n, hidden]`).
    pub(crate) fn output(&self) -> &[f32] {
        match self {
            Stream::Add(hs) => hs,
            Stream::AttnRes { prefix, .. } => prefix,
            Stream::Hyper { s, .. } => s,
        }
    }

    /// The completed blocks, with attention residuals.
    pub(crate) fn blocks(&self) -> Option<&[Vec<f32>]> {
        match self {
            Stream::Add(_) | Stream::Hyper { .. } => None,
            Stream::AttnRes { blocks, .. } => Some(blocks),
        }
    }

    /// The final norm's input for `rows`; `w` is the head's mix.
    pub(crate) fn final_rows(
        &self,
        m: &Mixing<'_>,
        w: Option<&MixWeights>,
        blob: &Blob,
        rows: std::ops::Range<usize>,
    ) -> Result<Vec<f32>, ModelError> {
        let h = m.hidden;
        match self {
            Stream::Add(hs) => Ok(hs[rows.start * h..rows.end * h].to_vec()),
            Stream::Hyper { hc, s, .. } => {
                let n = hc.streams * h;
                let part = &s[rows.start * n..rows.end * n];
                let w = if hc.mean_head {
                    None
                } else {
                    Some(hyper_weights(w)?)
                };
                Ok(hyper_pre(m, hc, w, blob, part, false)?.0)
            }
            Stream::AttnRes { blocks, prefix, .. } => {
                Ok(mix(m, blocks, prefix, weights(w)?, blob, rows))
            }
        }
    }
}

/// The hyper head over the streams `s` (`[t, n, hidden]`) with the head weights `w`: `[t, hidden]`.
pub(crate) fn hyper_head(
    m: &Mixing<'_>,
    hc: &HyperConfig,
    w: Option<&HyperWeights>,
    blob: &Blob,
    s: &[f32],
) -> Result<Vec<f32>, ModelError> {
    Ok(hyper_pre(m, hc, w, blob, s, false)?.0)
}

/// A hyper-connection over `s` (`[t, n, hidden]`): per token the block's input `Σ pre_i s_i`,
/// and with `block` the gates [`hyper_post`] applies (`post`, then with a mixing matrix its
/// `n²` entries); without, the hyper head's input (its gates are `pre` only; with no weights,
/// the streams' mean). See [`HyperConfig`].
fn hyper_pre(
    m: &Mixing<'_>,
    hc: &HyperConfig,
    w: Option<&HyperWeights>,
    blob: &Blob,
    s: &[f32],
    block: bool,
) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
    let (n, h) = (hc.streams, m.hidden);
    let width = n * h;
    let t = s.len() / width.max(1);
    let mut x = vec![0f32; t * h];
    let Some(w) = w else {
        // The streams' mean.
        for (row, out) in s.chunks_exact(width).zip(x.chunks_exact_mut(h)) {
            for stream in row.chunks_exact(h) {
                for (o, &v) in out.iter_mut().zip(stream) {
                    *o += v;
                }
            }
            for o in out.iter_mut() {
                *o /= n as f32;
            }
        }
        return Ok((x, Vec::new()));
    };
    let gates = if block { hc.gates() } else { n };
    let (proj, base, scale) = (
        w.proj.view(blob)?,
        w.base.to_f32(blob),
        w.scale.to_f32(blob),
    );
    let mut mixes = vec![0f32; t * gates];
    m.k.matmul(&proj, s, &mut mixes, 0..gates);
    let kept = if block { gates - n } else { 0 };
    let mut post = Vec::with_capacity(t * kept);
    for ((row, mix), out) in s
        .chunks_exact(width)
        .zip(mixes.chunks_exact_mut(gates))
        .zip(x.chunks_exact_mut(h))
    {
        // 1/√(mean(s²) + ε) over the flattened streams (an unweighted RMSNorm's factor).
        let ms = row.iter().map(|v| v * v).sum::<f32>() / width as f32;
        let r = 1.0 / (ms + m.eps).sqrt();
        for v in mix.iter_mut() {
            *v *= r;
        }
        for (i, stream) in row.chunks_exact(h).enumerate() {
            let pre = sigmoid(mix[i] * scale[0] + base[i]) + hc.eps;
            for (o, &v) in out.iter_mut().zip(stream) {
                *o += pre * v;
            }
        }
        if !block {
            continue;
        }
        let post_eps = if hc.sinkhorn.is_some() { 0.0 } else { hc.eps };
        for i in n..2 * n {
            post.push(hc.gain * sigmoid(mix[i] * scale[1] + base[i]) + post_eps);
        }
        if let Some(iters) = hc.sinkhorn {
            post.extend(sinkhorn(
                &mix[2 * n..],
                scale[2],
                &base[2 * n..],
                n,
                hc.eps,
                iters,
            ));
        }
    }
    Ok((x, post))
}

/// mHC's mixing matrix `C` (`[n, n]`, row-major) from its logits `z`: the softmax of each row of
/// `z · scale + base`, plus `eps`, then its columns normalised, then `iters − 1` rounds of rows
/// and columns normalised (each sum plus `eps`), as transformers computes it.
fn sinkhorn(z: &[f32], scale: f32, base: &[f32], n: usize, eps: f32, iters: usize) -> Vec<f32> {
    let mut c: Vec<f32> = z.iter().zip(base).map(|(v, b)| v * scale + b).collect();
    for row in c.chunks_exact_mut(n) {
        sluice_kernels::scalar::softmax(row);
        for v in row.iter_mut() {
            *v += eps;
        }
    }
    let cols = |c: &mut [f32]| {
        for k in 0..n {
            let sum: f32 = (0..n).map(|j| c[j * n + k]).sum::<f32>() + eps;
            for j in 0..n {
                c[j * n + k] /= sum;
            }
        }
    };
    cols(&mut c);
    for _ in 1..iters.max(1) {
        for row in c.chunks_exact_mut(n) {
            let sum: f32 = row.iter().sum::<f32>() + eps;
            for v in row.iter_mut() {
                *v /= sum;
            }
        }
        cols(&mut c);
    }
    c
}

/// The block's output `y` (`[t, hidden]`) into the streams: `s_i ← post_i · y + s_i` (iHC), or
/// `s_k ← post_k · y + Σ_j C_jk s_j` with mHC's mixing matrix.
fn hyper_post(hc: &HyperConfig, s: &mut [f32], gates: &[f32], y: &[f32]) {
    let n = hc.streams;
    if y.is_empty() || n == 0 {
        return;
    }
    let per = if hc.sinkhorn.is_some() { n + n * n } else { n };
    let t = gates.len() / per;
    let h = y.len() / t.max(1);
    let mut old = vec![0f32; n * h];
    for ((streams, g), y) in s
        .chunks_exact_mut(n * h)
        .zip(gates.chunks_exact(per.max(1)))
        .zip(y.chunks_exact(h))
    {
        let (post, comb) = g.split_at(n);
        if hc.sinkhorn.is_none() {
            for (stream, &p) in streams.chunks_exact_mut(h).zip(post) {
                for (v, &yv) in stream.iter_mut().zip(y) {
                    *v += p * yv;
                }
            }
            continue;
        }
        old.copy_from_slice(streams);
        for (k, stream) in streams.chunks_exact_mut(h).enumerate() {
            for (d, v) in stream.iter_mut().enumerate() {
                let mut acc = 0f32;
                for j in 0..n {
                    acc += comb[j * n + k] * old[j * h + d];
                }
                *v = post[k] * y[d] + acc;
            }
        }
    }
}

fn add(s: &mut [f32], v: &[f32]) {
    for (s, v) in s.iter_mut().zip(v) {
        *s += v;
    }
}

/// The attention-residual mix of rows `rows` (Kimi K3): per row, the sources are the completed
/// blocks in order and then `cur`; each is scored `Σ (norm ⊙ proj) ⊙ v · r` with `r =
/// 1/√(mean(v²) + eps)` (the RMSNorm-ed source dotted with the projection), the scores go
/// through a softmax and the mix is the weighted sum of the raw sources, accumulated in source
/// order.
fn mix(
    m: &Mixing<'_>,
    blocks: &[Vec<f32>],
    cur: &[f32],
    w: &AttnResWeights,
    blob: &Blob,
    rows: std::ops::Range<usize>,
) -> Vec<f32> {
    let (k, h) = (m.k, m.hidden);
    let norm = w.norm.to_f32(blob);
    let proj = w.proj.to_f32(blob);
    let sw: Vec<f32> = norm.iter().zip(&proj).map(|(a, b)| a * b).collect();
    let n = blocks.len() + 1;
    let mut out = vec![0f32; rows.len() * h];
    let mut tmp = vec![0f32; h];
    let mut scores = vec![0f32; n];
    for (o, i) in out.chunks_exact_mut(h).zip(rows) {
        let src = |j: usize| -> &[f32] {
            if j < blocks.len() {
                &blocks[j][i * h..(i + 1) * h]
            } else {
                &cur[i * h..(i + 1) * h]
            }
        };
        for (j, s) in scores.iter_mut().enumerate() {
            k.rmsnorm(src(j), &sw, m.eps, &mut tmp);
            *s = k.sum(&tmp);
        }
        k.softmax(&mut scores);
        for (j, &p) in scores.iter().enumerate() {
            k.axpy(p, src(j), o);
        }
    }
    out
}
