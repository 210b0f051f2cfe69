//! Per-sequence state: the position, the KV cache of softmax-attention layers, and the
//! recurrent and convolution state of Kimi Delta Attention layers.

use crate::ModelError;
use crate::config::{AttentionConfig, KdaConfig, LayerAttention, ModelConfig};

/// The state of one KDA layer: fixed in size, whatever the sequence length.
#[derive(Clone, Debug)]
pub(crate) struct KdaCache {
    /// Positions absorbed.
    pub(crate) pos: usize,
    /// The last `kernel − 1` inputs of the q, k and v convolutions, oldest first:
    /// `[3][kernel − 1][heads × head_dim]` (zeros before the first token).
    pub(crate) conv: Vec<f32>,
    /// Per head, the `[head_dim (key), head_dim (value)]` state matrix.
    pub(crate) state: Vec<f32>,
    /// `conv` and `state` as they were at position `undo_pos`, before the latest forward pass
    /// that changed them: what a failed pass, or a truncation back to that position, restores.
    undo: Option<(usize, Vec<f32>, Vec<f32>)>,
}

impl KdaCache {
    fn new(k: &KdaConfig) -> KdaCache {
        KdaCache {
            pos: 0,
            conv: vec![0.0; k.conv_len()],
            state: vec![0.0; k.state_len()],
            undo: None,
        }
    }

    /// Saves the state before a forward pass changes it.
    pub(crate) fn save(&mut self) {
        match &mut self.undo {
            Some((p, c, s)) => {
                *p = self.pos;
                c.copy_from_slice(&self.conv);
                s.copy_from_slice(&self.state);
            }
            None => self.undo = Some((self.pos, self.conv.clone(), self.state.clone())),
        }
    }

    /// Goes back to `pos` positions if it can: it is where the state is, or where it was
    /// before the latest pass, or the start.
    fn back_to(&mut self, pos: usize) -> bool {
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

    fn bytes(&self) -> usize {
        let undo = self.undo.as_ref().map_or(0, |(_, c, s)| c.len() + s.len());
        (self.conv.len() + self.state.len() + undo) * 4
    }
}

/// The cache of one layer.
#[derive(Clone, Debug)]
pub(crate) enum LayerCache {
    /// Keys and values per KV head, `[pos, head_dim]` each.
    Gqa {
        /// Keys.
        k: Vec<Vec<f32>>,
        /// Values.
        v: Vec<Vec<f32>>,
    },
    /// MLA's compressed latent `[pos, kv_lora_rank]` and the shared rotated key `[pos, rope]`.
    Mla {
        /// Normalised latent.
        c: Vec<f32>,
        /// Rotated rope key.
        kr: Vec<f32>,
    },
    /// Kimi Delta Attention's recurrent and convolution state.
    Kda(KdaCache),
}

/// The experts one token was routed to in one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    /// Position of the token.
    pub pos: usize,
    /// Layer.
    pub layer: usize,
    /// Expert ids, ascending.
    pub experts: Vec<u32>,
    /// Routing weights in the same order (what multiplies each expert's output).
    pub weights: Vec<f32>,
}

/// The memory a sequence's KV cache is charged for, lent by the expert cache and given back
/// on drop, and the positions its buffers have room for. A clone of a state starts with
/// neither (its buffers are cloned without spare room, and it takes its own lease on its next
/// forward pass).
#[derive(Debug, Default)]
pub(crate) struct KvLease {
    pub(crate) lease: Option<sluice_store::Lease>,
    pub(crate) positions: usize,
}

impl Clone for KvLease {
    fn clone(&self) -> KvLease {
        KvLease::default()
    }
}

/// The state of one sequence: its position, KV cache and recurrent state.
#[derive(Clone, Debug)]
pub struct State {
    pub(crate) pos: usize,
    pub(crate) layers: Vec<LayerCache>,
    /// What the KV cache is charged for.
    pub(crate) kv: KvLease,
    /// When `Some`, every forward pass appends the routing decisions here.
    pub routes: Option<Vec<Route>>,
    /// When `Some`, every forward pass appends named intermediate tensors here (row-major,
    /// one row per token of the pass): `embeddings` `[t, hidden]`; per layer `layer{L}.output`
    /// (the layer's output: with attention residuals the running sum of the current block)
    /// and, with attention residuals, `layer{L}.block_residual` `[t, blocks, hidden]` (the
    /// completed blocks after layer L's boundary); `final_norm_input` and `final_hidden` (after
    /// the final norm) for the rows whose logits are computed. For localising errors against
    /// a reference, not for production.
    pub debug: Option<Vec<(String, Vec<f32>)>>,
}

impl State {
    /// An empty state for a model.
    pub fn new(cfg: &ModelConfig) -> State {
        let layers = (0..cfg.layers)
            .map(
                |l| match (cfg.layer_attention[l], &cfg.attention, &cfg.kda) {
                    (LayerAttention::Kda, _, Some(k)) => LayerCache::Kda(KdaCache::new(k)),
                    (_, AttentionConfig::Gqa { kv_heads, .. }, _) => LayerCache::Gqa {
                        k: vec![Vec::new(); *kv_heads],
                        v: vec![Vec::new(); *kv_heads],
                    },
                    (_, AttentionConfig::Mla { .. }, _) => LayerCache::Mla {
                        c: Vec::new(),
                        kr: Vec::new(),
                    },
                },
            )
            .collect();
        State {
            pos: 0,
            layers,
            kv: KvLease::default(),
            routes: None,
            debug: None,
        }
    }

    /// Tokens processed so far.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Forgets every position from `pos` on (to re-run from a shared prefix).
    ///
    /// A KV cache can be cut anywhere; a recurrent state (Kimi Delta Attention) cannot: it can
    /// go back only to the start, or to where it was before the latest forward pass. Anything
    /// else is an error and leaves the state as it was.
    pub fn truncate(&mut self, pos: usize, cfg: &ModelConfig) -> Result<(), ModelError> {
        if pos >= self.pos {
            return Ok(());
        }
        if !self.can_rollback(pos) {
            return Err(ModelError::Truncate {
                pos,
                at: self.pos,
                earliest: self.undo_pos(),
            });
        }
        self.rollback(pos, cfg);
        Ok(())
    }

    /// Whether every recurrent layer can go back to `pos`.
    fn can_rollback(&self, pos: usize) -> bool {
        self.layers.iter().all(|l| match l {
            LayerCache::Kda(k) => {
                k.pos == pos || pos == 0 || k.undo.as_ref().is_some_and(|u| u.0 == pos)
            }
            _ => true,
        })
    }

    /// The position a recurrent state can go back to besides the start, if any.
    fn undo_pos(&self) -> Option<usize> {
        self.layers.iter().find_map(|l| match l {
            LayerCache::Kda(k) => k.undo.as_ref().map(|u| u.0),
            _ => None,
        })
    }

    /// Cuts every layer's cache back to `pos` positions (after a forward pass that failed
    /// part-way, some layers hold positions others do not). Recurrent layers go back to their
    /// snapshot from the start of the pass, which is always `pos` here.
    pub(crate) fn rollback(&mut self, pos: usize, cfg: &ModelConfig) {
        for l in &mut self.layers {
            match (l, &cfg.attention) {
                (LayerCache::Gqa { k, v }, AttentionConfig::Gqa { head_dim, .. }) => {
                    for x in k.iter_mut().chain(v.iter_mut()) {
                        x.truncate(pos * head_dim);
                    }
                }
                (
                    LayerCache::Mla { c, kr },
                    AttentionConfig::Mla {
                        kv_lora_rank,
                        qk_rope_head_dim,
                        ..
                    },
                ) => {
                    c.truncate(pos * kv_lora_rank);
                    kr.truncate(pos * qk_rope_head_dim);
                }
                (LayerCache::Kda(k), _) => {
                    let ok = k.back_to(pos);
                    debug_assert!(ok, "KDA layer cannot go back to {pos}");
                }
                _ => {}
            }
        }
        self.pos = pos;
    }

    /// Gives every softmax-attention layer's buffers room for exactly `positions` positions
    /// (never less than they hold), so that what the KV cache allocates is what was charged
    /// for it rather than whatever a doubling growth would give.
    pub(crate) fn reserve_positions(&mut self, positions: usize, cfg: &ModelConfig) {
        let room = |v: &mut Vec<f32>, n: usize| {
            if v.capacity() < n {
                v.reserve_exact(n - v.len());
            }
        };
        for l in &mut self.layers {
            match (l, &cfg.attention) {
                (LayerCache::Gqa { k, v }, AttentionConfig::Gqa { head_dim, .. }) => {
                    for x in k.iter_mut().chain(v.iter_mut()) {
                        room(x, positions * head_dim);
                    }
                }
                (
                    LayerCache::Mla { c, kr },
                    AttentionConfig::Mla {
                        kv_lora_rank,
                        qk_rope_head_dim,
                        ..
                    },
                ) => {
                    room(c, positions * kv_lora_rank);
                    room(kr, positions * qk_rope_head_dim);
                }
                _ => {}
            }
        }
        self.kv.positions = self.kv.positions.max(positions);
    }

    /// Bytes the KV cache is charged for (lent by the expert cache).
    pub fn kv_bytes(&self) -> u64 {
        self.kv.lease.as_ref().map_or(0, |l| l.bytes())
    }

    /// Bytes held by the KV cache and the recurrent state (its snapshot included).
    pub fn cache_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerCache::Gqa { k, v } => k.iter().chain(v).map(|x| x.len() * 4).sum(),
                LayerCache::Mla { c, kr } => (c.len() + kr.len()) * 4,
                LayerCache::Kda(k) => k.bytes(),
            })
            .sum()
    }
}
