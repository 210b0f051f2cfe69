//! The residual stream of a forward pass: plain addition, Kimi K3's attention residuals, or
//! Hy4's hyper-connections.

use std::borrow::Cow;

use sluice_kernels::Kernels;
use sluice_store::Blob;

use crate::ModelError;
use crate::config::Residual;
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
    /// Hyper-connections: `[t, n, hidden]` streams and the `post` gates `[t, n]` of the block
    /// running now.
    Hyper {
        /// Streams, gain and eps.
        residual: Residual,
        /// The streams.
        s: Vec<f32>,
        /// The running block's `post` gates.
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
        _ => Err(ModelError::Internal(
            "attention residuals without their weights".into(),
        )),
    }
}

fn hyper_weights(w: Option<&MixWeights>) -> Result<&HyperWeights, ModelError> {
    match w {
        Some(MixWeights::Hyper(w)) => Ok(w),
        _ => Err(ModelError::Internal(
            "hyper-connections without their weights".into(),
        )),
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
            Residual::Hyper { streams, .. } => {
                // Every stream starts as the embeddings.
                let mut s = Vec::with_capacity(hs.len() * streams);
                for row in hs.chunks_exact(hidden.max(1)) {
                    for _ in 0..streams {
                        s.extend_from_slice(row);
                    }
                }
                Stream::Hyper {
                    residual,
                    s,
                    post: Vec::new(),
                }
            }
        }
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
            Stream::Hyper { residual, s, post } => {
                let (x, p) = hyper_pre(m, *residual, hyper_weights(w)?, blob, s, true);
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
            Stream::Hyper { s, post, .. } => hyper_post(s, post, &a),
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
            Stream::Hyper { residual, s, post } => {
                let (x, p) = hyper_pre(m, *residual, hyper_weights(w)?, blob, s, true);
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
            Stream::Hyper { s, post, .. } => hyper_post(s, post, f),
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
            Stream::Hyper { residual, s, .. } => {
                let n = residual.stream_floats(h);
                let part = &s[rows.start * n..rows.end * n];
                Ok(hyper_pre(m, *residual, hyper_weights(w)?, blob, part, false).0)
            }
            Stream::AttnRes { blocks, prefix, .. } => {
                Ok(mix(m, blocks, prefix, weights(w)?, blob, rows))
            }
        }
    }
}

/// A hyper-connection's gates over `s` (`[t, n, hidden]`): the mix `Σ pre_i s_i` per token,
/// and with `block` the `post` gates `[t, n]` (without, the hyper head: its gates are `pre`
/// only). See [`Residual::Hyper`].
fn hyper_pre(
    m: &Mixing<'_>,
    residual: Residual,
    w: &HyperWeights,
    blob: &Blob,
    s: &[f32],
    block: bool,
) -> (Vec<f32>, Vec<f32>) {
    let Residual::Hyper {
        streams: n,
        gain,
        eps,
    } = residual
    else {
        return (Vec::new(), Vec::new());
    };
    let h = m.hidden;
    let width = n * h;
    let t = s.len() / width.max(1);
    let gates = if block { 2 * n } else { n };
    let (Ok(proj), base, scale) = (w.proj.view(blob), w.base.to_f32(blob), w.scale.to_f32(blob))
    else {
        return (Vec::new(), Vec::new());
    };
    let mut mixes = vec![0f32; t * gates];
    m.k.matmul(&proj, s, &mut mixes, 0..gates);
    let mut x = vec![0f32; t * h];
    let mut post = Vec::with_capacity(if block { t * n } else { 0 });
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
            let pre = sigmoid(mix[i] * scale[0] + base[i]) + eps;
            for (o, &v) in out.iter_mut().zip(stream) {
                *o += pre * v;
            }
        }
        if block {
            for i in n..2 * n {
                post.push(gain * sigmoid(mix[i] * scale[1] + base[i]) + eps);
            }
        }
    }
    (x, post)
}

/// `s_i ← post_i · y + s_i` per token and stream, `y` the block's output `[t, hidden]`.
fn hyper_post(s: &mut [f32], post: &[f32], y: &[f32]) {
    if y.is_empty() || post.is_empty() {
        return;
    }
    let n = s.len() / y.len();
    let t = post.len() / n.max(1);
    let h = y.len() / t.max(1);
    for ((streams, gates), y) in s
        .chunks_exact_mut(n * h)
        .zip(post.chunks_exact(n))
        .zip(y.chunks_exact(h))
    {
        for (stream, &p) in streams.chunks_exact_mut(h).zip(gates) {
            for (v, &yv) in stream.iter_mut().zip(y) {
                *v += p * yv;
            }
        }
    }
}

fn sigmoid(x: f32) -> f32 {
    sluice_kernels::scalar::sigmoid(x)
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
