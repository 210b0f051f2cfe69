//! The residual stream of a forward pass: plain addition, or Kimi K3's attention residuals.

use std::borrow::Cow;

use sluice_kernels::Kernels;
use sluice_store::Blob;

use crate::ModelError;
use crate::config::Residual;
use crate::weights::AttnResWeights;

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
}

/// What a mix needs besides the stream: kernels, the model's eps and width.
pub(crate) struct Mixing<'a> {
    pub k: &'a Kernels,
    pub eps: f32,
    pub hidden: usize,
}

fn weights(w: Option<&AttnResWeights>) -> Result<&AttnResWeights, ModelError> {
    w.ok_or_else(|| ModelError::Internal("attention residuals without their weights".into()))
}

impl Stream {
    /// The stream of a pass starting from the embeddings `hs`.
    pub(crate) fn new(residual: Residual, hs: Vec<f32>) -> Stream {
        match residual {
            Residual::Add => Stream::Add(hs),
            Residual::AttnRes { block_size } => Stream::AttnRes {
                block_size,
                blocks: Vec::new(),
                prefix: hs,
            },
        }
    }

    /// Layer `l`'s attention input (before its norm); `w` is the layer's pre-attention mix.
    /// At an attention-residual block boundary the running sum becomes a source and restarts.
    pub(crate) fn before_attention(
        &mut self,
        m: &Mixing<'_>,
        w: Option<&AttnResWeights>,
        blob: &Blob,
        l: usize,
    ) -> Result<Cow<'_, [f32]>, ModelError> {
        match self {
            Stream::Add(hs) => Ok(Cow::Borrowed(hs)),
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
        &self,
        m: &Mixing<'_>,
        w: Option<&AttnResWeights>,
        blob: &Blob,
    ) -> Result<Cow<'_, [f32]>, ModelError> {
        match self {
            Stream::Add(hs) => Ok(Cow::Borrowed(hs)),
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

    /// Adds the feed-forward block's output.
    pub(crate) fn add_ffn(&mut self, f: &[f32]) {
        add(self.output_mut(), f);
    }

    fn output_mut(&mut self) -> &mut Vec<f32> {
        match self {
            Stream::Add(hs) => hs,
            Stream::AttnRes { prefix, .. } => prefix,
        }
    }

    /// The latest layer's output: the stream, or the current block's running sum.
    pub(crate) fn output(&self) -> &[f32] {
        match self {
            Stream::Add(hs) => hs,
            Stream::AttnRes { prefix, .. } => prefix,
        }
    }

    /// The completed blocks, with attention residuals.
    pub(crate) fn blocks(&self) -> Option<&[Vec<f32>]> {
        match self {
            Stream::Add(_) => None,
            Stream::AttnRes { blocks, .. } => Some(blocks),
        }
    }

    /// The final norm's input for `rows`; `w` is the head's mix.
    pub(crate) fn final_rows(
        &self,
        m: &Mixing<'_>,
        w: Option<&AttnResWeights>,
        blob: &Blob,
        rows: std::ops::Range<usize>,
    ) -> Result<Vec<f32>, ModelError> {
        let h = m.hidden;
        match self {
            Stream::Add(hs) => Ok(hs[rows.start * h..rows.end * h].to_vec()),
            Stream::AttnRes { blocks, prefix, .. } => {
                Ok(mix(m, blocks, prefix, weights(w)?, blob, rows))
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
