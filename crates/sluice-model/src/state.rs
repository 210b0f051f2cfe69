//! Per-sequence state: the KV cache and the position.

use crate::config::{AttentionConfig, ModelConfig};

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

/// The state of one sequence: its position and KV cache.
#[derive(Clone, Debug)]
pub struct State {
    pub(crate) pos: usize,
    pub(crate) layers: Vec<LayerCache>,
    /// When `Some`, every forward pass appends the routing decisions here.
    pub routes: Option<Vec<Route>>,
}

impl State {
    /// An empty state for a model.
    pub fn new(cfg: &ModelConfig) -> State {
        let layers = (0..cfg.layers)
            .map(|_| match &cfg.attention {
                AttentionConfig::Gqa { kv_heads, .. } => LayerCache::Gqa {
                    k: vec![Vec::new(); *kv_heads],
                    v: vec![Vec::new(); *kv_heads],
                },
                AttentionConfig::Mla { .. } => LayerCache::Mla {
                    c: Vec::new(),
                    kr: Vec::new(),
                },
            })
            .collect();
        State {
            pos: 0,
            layers,
            routes: None,
        }
    }

    /// Tokens processed so far.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Forgets every position from `pos` on (to re-run from a shared prefix).
    pub fn truncate(&mut self, pos: usize, cfg: &ModelConfig) {
        if pos >= self.pos {
            return;
        }
        self.rollback(pos, cfg);
    }

    /// Cuts every layer's cache back to `pos` positions (after a forward pass that failed
    /// part-way, some layers hold positions others do not).
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
                _ => {}
            }
        }
        self.pos = pos;
    }

    /// Bytes held by the KV cache.
    pub fn cache_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerCache::Gqa { k, v } => k.iter().chain(v).map(|x| x.len() * 4).sum(),
                LayerCache::Mla { c, kr } => (c.len() + kr.len()) * 4,
            })
            .sum()
    }
}
