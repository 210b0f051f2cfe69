//! What mixes tokens in a layer: one module per attention kind, each owning its configuration,
//! its weights (found and checked in one pass), its cache or state, its forward pass and what
//! the memory planner charges for it. This file only dispatches: adding a kind is its module
//! plus one variant in each enum below.
//!
//! - [`gqa`]: grouped-query attention (Qwen, Mixtral, OLMoE, GPT-OSS), a KV cache.
//! - [`mla`]: DeepSeek's multi-head latent attention on the compressed cache.
//! - [`kda`]: Kimi Delta Attention, a fixed-size recurrent state.
//! - [`gdn`]: Qwen3-Next's Gated DeltaNet, the same delta rule with a decay per head.
//! - [`dsa`]: DeepSeek Sparse Attention, MLA restricted to a lightning indexer's top-k.
//! - [`compressed`]: DeepSeek-V4's shared-KV sliding-window attention with compressed entries.

pub mod compressed;
pub mod dsa;
pub mod gdn;
pub mod gqa;
pub mod kda;
pub mod mla;

use sluice_kernels::{Codes, Matrix};
use sluice_store::Blob;

pub use compressed::{CompressedConfig, CompressedWeights, Compressor, Indexer};
pub use dsa::{DsaConfig, DsaWeights, IndexerQuery, KeyPool};
pub use gdn::{GdnConfig, GdnProj, GdnWeights};
pub use gqa::{GqaConfig, GqaWeights, QkNorm};
pub use kda::{KdaConfig, KdaGate, KdaWeights};
pub use mla::{MlaConfig, MlaWeights};

use crate::ModelError;
use crate::exec::Exec;
use crate::rope::{Angles, Rope};
use crate::spec::PartBuilder;

/// The attention of one layer.
#[derive(Clone, Debug, PartialEq)]
pub enum AttentionConfig {
    /// Grouped-query attention, with a KV cache.
    Gqa(GqaConfig),
    /// Multi-head latent attention, with a compressed KV cache.
    Mla(MlaConfig),
    /// Kimi Delta Attention, with a fixed-size recurrent state.
    Kda(KdaConfig),
    /// Gated DeltaNet (Qwen3-Next).
    Gdn(GdnConfig),
    /// DeepSeek Sparse Attention: MLA over an indexer's top-k.
    Dsa(DsaConfig),
    /// DeepSeek-V4's sliding-window MQA with compressed entries.
    Compressed(CompressedConfig),
}

/// The attention weights of one layer.
// One per layer, built once at load: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum AttnSpec {
    /// Grouped-query attention.
    Gqa(GqaWeights),
    /// Multi-head latent attention.
    Mla(MlaWeights),
    /// Kimi Delta Attention.
    Kda(KdaWeights),
    /// Gated DeltaNet.
    Gdn(GdnWeights),
    /// DeepSeek Sparse Attention.
    Dsa(DsaWeights),
    /// DeepSeek-V4's attention.
    Compressed(CompressedWeights),
}

/// The cache of one layer of one sequence.
#[derive(Clone, Debug)]
pub(crate) enum LayerCache {
    Gqa(gqa::Cache),
    Mla(mla::Cache),
    Kda(kda::Cache),
    /// Gated DeltaNet's state (the same kind as KDA's).
    Gdn(kda::Cache),
    Dsa(dsa::Cache),
    Compressed(compressed::Cache),
}

/// What every kind's forward pass shares: the threads, the rotary table and this pass's
/// angles, and the model's widths.
pub(crate) struct Ctx<'a> {
    /// The top-k of the last full sparse-attention layer for these rows, which a shared one
    /// reuses (GLM-5's `indexer_types`).
    pub sparse: &'a std::cell::RefCell<Option<dsa::Selection>>,
    /// The latent cache of the earlier layer this one attends to, when it reads another's
    /// ([`MlaConfig::kv_source`]).
    pub latent: Option<&'a mla::Cache>,
    pub exec: &'a Exec,
    pub rope: &'a Rope,
    pub angles: &'a Angles,
    /// The second rotary table and its angles, when the model has one.
    pub local: Option<(&'a Rope, &'a Angles)>,
    pub hidden: usize,
    /// The model's RMSNorm epsilon.
    pub eps: f32,
    /// The sequence's first position in this forward pass (a pass over a long span calls a
    /// layer once per chunk of rows; a recurrent kind saves its state only at the first).
    pub pass_start: usize,
    /// Floats of attention scores the pass's tiles may hold at once, all threads together
    /// (see [`tile_rows`]).
    pub score_floats: usize,
}

impl AttentionConfig {
    /// The kind's short name (`gqa`, `mla`, `kda`), as `sluice inspect` shows it.
    pub fn kind(&self) -> &'static str {
        match self {
            AttentionConfig::Gqa(_) => "gqa",
            AttentionConfig::Mla(_) => "mla",
            AttentionConfig::Kda(_) => "kda",
            AttentionConfig::Gdn(_) => "gdn",
            AttentionConfig::Dsa(_) => "dsa",
            AttentionConfig::Compressed(c) => match &c.compressor {
                None => "swa",
                Some(k) if k.indexer.is_some() => "csa",
                Some(_) => "hca",
            },
        }
    }

    /// The earlier layer whose cache this layer attends to, when it computes none of its own.
    pub fn kv_source(&self) -> Option<usize> {
        match self {
            AttentionConfig::Mla(m) => m.kv_source,
            AttentionConfig::Dsa(d) => d.mla.kv_source,
            _ => None,
        }
    }

    /// The sliding window of the layer, if it has one.
    pub fn window(&self) -> Option<usize> {
        match self {
            AttentionConfig::Gqa(g) => g.window,
            AttentionConfig::Compressed(c) => Some(c.window),
            _ => None,
        }
    }

    /// Floats the layer caches per position (0 for a recurrent kind).
    pub fn kv_floats(&self) -> usize {
        match self {
            AttentionConfig::Gqa(g) => g.kv_floats(),
            AttentionConfig::Mla(m) => m.kv_floats(),
            AttentionConfig::Dsa(d) => d.kv_floats(),
            AttentionConfig::Compressed(c) => c.kv_floats(),
            AttentionConfig::Kda(_) | AttentionConfig::Gdn(_) => 0,
        }
    }

    /// Floats of fixed state the layer keeps per sequence, whatever its length (0 for a
    /// kind with a KV cache); the planner charges it twice, for the snapshot.
    pub fn recurrent_floats(&self) -> usize {
        match self {
            AttentionConfig::Kda(k) => k.state_len() + k.conv_len(),
            AttentionConfig::Gdn(g) => g.state_len() + g.conv_len(),
            AttentionConfig::Compressed(c) => c.recurrent_floats(),
            _ => 0,
        }
    }

    /// Floats of scratch per token of a forward pass.
    pub fn scratch_floats(&self) -> usize {
        match self {
            AttentionConfig::Gqa(g) => g.scratch_floats(),
            AttentionConfig::Mla(m) => m.scratch_floats(),
            AttentionConfig::Kda(k) => k.scratch_floats(),
            AttentionConfig::Gdn(g) => g.scratch_floats(),
            AttentionConfig::Dsa(d) => d.scratch_floats(),
            AttentionConfig::Compressed(c) => c.scratch_floats(),
        }
    }

    /// Query heads whose rows a pass takes in tiles against the cache ([`tile_rows`]); 0 for
    /// kinds that do not tile.
    pub fn tiled_heads(&self) -> usize {
        match self {
            AttentionConfig::Gqa(g) => g.heads,
            AttentionConfig::Mla(m) => m.heads,
            AttentionConfig::Dsa(d) => d.mla.heads,
            AttentionConfig::Kda(_) | AttentionConfig::Gdn(_) | AttentionConfig::Compressed(_) => 0,
        }
    }

    /// `(a, b, field, what)`: the product `a × b` the arithmetic multiplies out, which the
    /// config's size checks bound, and the field and words that name it.
    pub fn widest(&self) -> (usize, usize, &'static str, &'static str) {
        match self {
            AttentionConfig::Gqa(g) => g.widest(),
            AttentionConfig::Mla(m) => m.widest(),
            AttentionConfig::Kda(k) => k.widest(),
            AttentionConfig::Gdn(g) => g.widest(),
            AttentionConfig::Dsa(d) => d.widest(),
            AttentionConfig::Compressed(c) => c.widest(),
        }
    }

    /// An empty cache for one sequence.
    pub(crate) fn new_cache(&self) -> LayerCache {
        match self {
            AttentionConfig::Gqa(g) => LayerCache::Gqa(g.new_cache()),
            AttentionConfig::Mla(m) => LayerCache::Mla(m.new_cache()),
            AttentionConfig::Kda(k) => LayerCache::Kda(k.new_cache()),
            AttentionConfig::Gdn(g) => LayerCache::Gdn(g.new_cache()),
            AttentionConfig::Dsa(d) => LayerCache::Dsa(d.new_cache()),
            AttentionConfig::Compressed(c) => LayerCache::Compressed(c.new_cache()),
        }
    }

    /// Finds and checks the layer's attention tensors (`a` names one in the attention module).
    pub(crate) fn load(
        &self,
        p: &mut PartBuilder<'_, '_>,
        a: &dyn Fn(&str) -> String,
        hidden: usize,
    ) -> Result<AttnSpec, ModelError> {
        Ok(match self {
            AttentionConfig::Gqa(g) => AttnSpec::Gqa(g.load(p, a, hidden)?),
            AttentionConfig::Mla(m) => AttnSpec::Mla(m.load(p, a, hidden)?),
            AttentionConfig::Kda(k) => AttnSpec::Kda(k.load(p, a, hidden)?),
            AttentionConfig::Gdn(g) => AttnSpec::Gdn(g.load(p, a, hidden)?),
            AttentionConfig::Dsa(d) => AttnSpec::Dsa(d.load(p, a, hidden)?),
            AttentionConfig::Compressed(c) => AttnSpec::Compressed(c.load(p, a, hidden)?),
        })
    }

    /// Runs the layer's attention for `t` tokens at positions `pos0..pos0 + t`, appending
    /// their keys and values to `cache` (or advancing its recurrent state). `x` is the normed
    /// input `[t, hidden]`; returns `[t, hidden]`.
    pub(crate) fn forward(
        &self,
        cx: &Ctx<'_>,
        spec: &AttnSpec,
        blob: &Blob,
        cache: &mut LayerCache,
        pos0: usize,
        x: &[f32],
    ) -> Result<Vec<f32>, ModelError> {
        match (self, spec, cache) {
            (AttentionConfig::Gqa(c), AttnSpec::Gqa(w), LayerCache::Gqa(s)) => {
                c.forward(cx, w, blob, s, pos0, x)
            }
            (AttentionConfig::Mla(c), AttnSpec::Mla(w), LayerCache::Mla(s)) => {
                c.forward(cx, w, blob, s, pos0, x)
            }
            (AttentionConfig::Kda(c), AttnSpec::Kda(w), LayerCache::Kda(s)) => {
                kda::forward(c, cx, w, blob, s, x)
            }
            (AttentionConfig::Gdn(c), AttnSpec::Gdn(w), LayerCache::Gdn(s)) => {
                gdn::forward(c, cx, w, blob, s, x)
            }
            (AttentionConfig::Dsa(c), AttnSpec::Dsa(w), LayerCache::Dsa(s)) => {
                c.forward(cx, w, blob, s, pos0, x)
            }
            (
                AttentionConfig::Compressed(c),
                AttnSpec::Compressed(w),
                LayerCache::Compressed(s),
            ) => c.forward(cx, w, blob, s, pos0, x),
            _ => Err(ModelError::Mismatch {
                what: "attention spec does not match the configuration".into(),
            }),
        }
    }
}

impl LayerCache {
    /// The latent attention cache it holds, if any (what a layer sharing it reads).
    pub(crate) fn latent(&self) -> Option<&mla::Cache> {
        match self {
            LayerCache::Mla(c) => Some(c),
            LayerCache::Dsa(c) => Some(&c.mla),
            _ => None,
        }
    }

    /// Whether the cache can be cut back to `pos` positions: a KV cache always can; a
    /// recurrent state only to the start or to where it was before the latest pass.
    pub(crate) fn can_back_to(&self, pos: usize) -> bool {
        match self {
            LayerCache::Kda(k) | LayerCache::Gdn(k) => k.can_back_to(pos),
            LayerCache::Compressed(c) => c.can_back_to(pos),
            _ => true,
        }
    }

    /// Whether the cache can be cut back to any earlier position (a KV cache; not a
    /// recurrent state or DeepSeek-V4's window).
    pub(crate) fn cuts_anywhere(&self) -> bool {
        matches!(
            self,
            LayerCache::Gqa(_) | LayerCache::Mla(_) | LayerCache::Dsa(_)
        )
    }

    /// The position a recurrent state can go back to besides the start, if any.
    pub(crate) fn undo_pos(&self) -> Option<usize> {
        match self {
            LayerCache::Kda(k) | LayerCache::Gdn(k) => k.undo_pos(),
            LayerCache::Compressed(c) => c.undo_pos(),
            _ => None,
        }
    }

    /// Cuts the cache back to `pos` positions (a recurrent state: see [`Self::can_back_to`]).
    pub(crate) fn back_to(&mut self, pos: usize) {
        match self {
            LayerCache::Gqa(c) => c.truncate(pos),
            LayerCache::Mla(c) => c.truncate(pos),
            LayerCache::Dsa(c) => c.truncate(pos),
            LayerCache::Compressed(c) => {
                let ok = c.back_to(pos);
                debug_assert!(ok, "compressed attention cannot go back to {pos}");
            }
            LayerCache::Kda(k) | LayerCache::Gdn(k) => {
                let ok = k.back_to(pos);
                debug_assert!(ok, "recurrent layer cannot go back to {pos}");
            }
        }
    }

    /// A copy holding the first `pos` positions, buffers without spare room (a recurrent
    /// state: only where [`Self::can_back_to`] allows).
    pub(crate) fn prefix(&self, pos: usize) -> LayerCache {
        match self {
            LayerCache::Gqa(c) => LayerCache::Gqa(c.prefix(pos)),
            LayerCache::Mla(c) => LayerCache::Mla(c.prefix(pos)),
            LayerCache::Dsa(c) => LayerCache::Dsa(c.prefix(pos)),
            LayerCache::Compressed(c) => LayerCache::Compressed(c.prefix(pos)),
            LayerCache::Kda(k) | LayerCache::Gdn(k) => {
                let mut k = k.clone();
                let ok = k.back_to(pos);
                debug_assert!(ok, "recurrent layer cannot go back to {pos}");
                match self {
                    LayerCache::Kda(_) => LayerCache::Kda(k),
                    _ => LayerCache::Gdn(k),
                }
            }
        }
    }

    /// Gives a KV cache's buffers room for exactly `positions` positions.
    pub(crate) fn reserve(&mut self, positions: usize) {
        match self {
            LayerCache::Gqa(c) => c.reserve(positions),
            LayerCache::Mla(c) => c.reserve(positions),
            LayerCache::Dsa(c) => c.reserve(positions),
            LayerCache::Compressed(c) => c.reserve(positions),
            LayerCache::Kda(_) | LayerCache::Gdn(_) => {}
        }
    }

    /// The kind's tag in a saved state.
    pub(crate) fn tag(&self) -> u8 {
        match self {
            LayerCache::Gqa(_) => 1,
            LayerCache::Mla(_) => 2,
            LayerCache::Kda(_) => 3,
            LayerCache::Gdn(_) => 4,
            LayerCache::Dsa(_) => 5,
            LayerCache::Compressed(_) => 6,
        }
    }

    /// Its buffers, for saving.
    pub(crate) fn parts(&self) -> Vec<&[f32]> {
        match self {
            LayerCache::Gqa(c) => c.parts(),
            LayerCache::Mla(c) => c.parts(),
            LayerCache::Dsa(c) => c.parts(),
            LayerCache::Compressed(c) => c.parts(),
            LayerCache::Kda(k) | LayerCache::Gdn(k) => k.parts(),
        }
    }

    /// Takes the buffers a fresh cache of this kind and shape saved after `pos` positions.
    pub(crate) fn restore(&mut self, parts: Vec<Vec<f32>>, pos: usize) -> Result<(), String> {
        match self {
            LayerCache::Gqa(c) => c.restore(parts, pos),
            LayerCache::Mla(c) => c.restore(parts, pos),
            LayerCache::Dsa(c) => c.restore(parts, pos),
            LayerCache::Compressed(c) => c.restore(parts, pos),
            LayerCache::Kda(k) | LayerCache::Gdn(k) => k.restore(parts, pos),
        }
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        match self {
            LayerCache::Gqa(c) => c.bytes(),
            LayerCache::Mla(c) => c.bytes(),
            LayerCache::Dsa(c) => c.bytes(),
            LayerCache::Compressed(c) => c.bytes(),
            LayerCache::Kda(k) | LayerCache::Gdn(k) => k.bytes(),
        }
    }
}

/// Floats of attention scores all threads' tiles hold at once in any pass, at the least:
/// planned as scratch (256 KiB; more for a model with many heads at a long context, see
/// [`step_score_floats`]).
pub const TILE_SCORE_FLOATS: usize = 64 * 1024;

/// The same for a prefill pass whose span holds room for more (16 MiB, lent with the span's
/// activations): tiles of more queries read the cache fewer times.
pub const PREFILL_TILE_SCORE_FLOATS: usize = 4 * 1024 * 1024;

/// Query rows a tile should have at least, room allowing: every tile reads the whole cache it
/// attends over, so a tile of one query (a decode step's head, where a model has few heads)
/// reads it once per head.
const MIN_TILE_ROWS: usize = 4;

/// Rows per tile for `total` query rows on `threads` threads, room aside: few enough that every
/// thread gets several tiles, but not fewer than [`MIN_TILE_ROWS`] while every thread still
/// gets one.
fn balanced_rows(total: usize, threads: usize) -> usize {
    total
        .div_ceil(4 * threads)
        .max(MIN_TILE_ROWS.min(total.div_ceil(threads)))
        .max(1)
}

/// Query-head rows per attention tile over `n` cached positions, for `total` rows on
/// `threads` threads sharing `score_floats` floats of scores: as many as a thread's share holds
/// scores for (at most 256, at least 1), and no more than [`balanced_rows`].
pub(crate) fn tile_rows(n: usize, total: usize, threads: usize, score_floats: usize) -> usize {
    let threads = threads.max(1);
    (score_floats / threads / n.max(1))
        .clamp(1, 256)
        .min(balanced_rows(total, threads))
        .max(1)
}

/// Floats of scores a decode step's tiles are planned to share, for a model whose attention
/// tiles `heads` query heads, on `threads` threads, over up to `context` positions: room for
/// the tiles [`balanced_rows`] gives one row per head at the full context (every tile reads the
/// whole cache, so a tile of one head where there are many reads it once per head), between
/// [`TILE_SCORE_FLOATS`] and [`PREFILL_TILE_SCORE_FLOATS`].
pub fn step_score_floats(heads: usize, threads: usize, context: usize) -> usize {
    let threads = threads.max(1);
    (balanced_rows(heads, threads) * threads)
        .saturating_mul(context)
        .clamp(TILE_SCORE_FLOATS, PREFILL_TILE_SCORE_FLOATS)
}

/// Room for exactly `n` floats in `v` (never less than it holds).
fn room(v: &mut Vec<f32>, n: usize) {
    if v.capacity() < n {
        v.reserve_exact(n - v.len());
    }
}

/// The f32 matrix `[rows, cols]` held in `data`.
fn f32_matrix(data: &[f32], rows: usize, cols: usize) -> Result<Matrix<'_>, ModelError> {
    Ok(Matrix::dense(
        Codes::F32,
        bytemuck::cast_slice(data),
        rows,
        cols,
    )?)
}

fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (a, &b) in row.iter_mut().zip(bias) {
            *a += b;
        }
    }
}

fn rmsnorm_rows(exec: &Exec, x: &mut [f32], w: &[f32], eps: f32) {
    let mut tmp = vec![0f32; w.len()];
    for row in x.chunks_exact_mut(w.len()) {
        exec.kernels().rmsnorm(row, w, eps, &mut tmp);
        row.copy_from_slice(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A decode step of a model with few heads gets tiles of several heads (each tile reads the
    /// whole cache), one with many heads several tiles per thread; the room for scores bounds
    /// both, and a long prefill is capped at 256 rows.
    #[test]
    fn tiles_hold_several_queries_while_every_thread_gets_one() {
        // 8 heads, one row, 2 threads: two tiles of 4, not eight of 1.
        assert_eq!(tile_rows(512, 8, 2, TILE_SCORE_FLOATS), 4);
        // 2 heads on 2 threads: one each.
        assert_eq!(tile_rows(512, 2, 2, TILE_SCORE_FLOATS), 1);
        // 128 heads: four tiles per thread.
        assert_eq!(tile_rows(512, 128, 2, TILE_SCORE_FLOATS), 16);
        // The scores' room comes first: 64 Ki floats over 2 threads and 32 Ki positions.
        assert_eq!(tile_rows(32 * 1024, 8, 2, TILE_SCORE_FLOATS), 1);
        // A long prefill.
        assert_eq!(tile_rows(4096, 4096 * 8, 2, PREFILL_TILE_SCORE_FLOATS), 256);
    }

    /// The room planned for a decode step gives its tiles the rows [`balanced_rows`] allows at
    /// the full context, within the bounds.
    #[test]
    fn a_step_is_planned_room_for_balanced_tiles_at_the_full_context() {
        // Few heads or a short context: the least room.
        assert_eq!(step_score_floats(8, 2, 4096), TILE_SCORE_FLOATS);
        // 128 heads at 32K positions: tiles of 16 heads, 8 of them, not 128 of one.
        let room = step_score_floats(128, 2, 32 * 1024);
        assert_eq!(room, 32 * 32 * 1024);
        assert_eq!(tile_rows(32 * 1024, 128, 2, room), 16);
        assert_eq!(tile_rows(32 * 1024, 128, 2, TILE_SCORE_FLOATS), 1);
        // A very long context is capped at the prefill's room.
        assert_eq!(
            step_score_floats(128, 2, 1 << 20),
            PREFILL_TILE_SCORE_FLOATS
        );
    }
}
