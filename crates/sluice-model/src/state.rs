//! Per-sequence state: the position, the KV cache of softmax-attention layers, and the
//! recurrent and convolution state of Kimi Delta Attention layers.

use crate::ModelError;
use crate::attention::LayerCache;
use crate::config::ModelConfig;

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
        let layers = cfg
            .layer_plan
            .iter()
            .map(|l| l.attention.new_cache())
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
    pub fn truncate(&mut self, pos: usize) -> Result<(), ModelError> {
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
        self.rollback(pos);
        Ok(())
    }

    /// Whether every recurrent layer can go back to `pos`.
    fn can_rollback(&self, pos: usize) -> bool {
        self.layers.iter().all(|l| l.can_back_to(pos))
    }

    /// The position a recurrent state can go back to besides the start, if any.
    fn undo_pos(&self) -> Option<usize> {
        self.layers.iter().find_map(LayerCache::undo_pos)
    }

    /// Cuts every layer's cache back to `pos` positions (after a forward pass that failed
    /// part-way, some layers hold positions others do not). Recurrent layers go back to their
    /// snapshot from the start of the pass, which is always `pos` here.
    pub(crate) fn rollback(&mut self, pos: usize) {
        for l in &mut self.layers {
            l.back_to(pos);
        }
        self.pos = pos;
    }

    /// Gives every softmax-attention layer's buffers room for exactly `positions` positions
    /// (never less than they hold), so that what the KV cache allocates is what was charged
    /// for it rather than whatever a doubling growth would give.
    pub(crate) fn reserve_positions(&mut self, positions: usize) {
        for l in &mut self.layers {
            l.reserve(positions);
        }
        self.kv.positions = self.kv.positions.max(positions);
    }

    /// Bytes the KV cache is charged for (lent by the expert cache).
    pub fn kv_bytes(&self) -> u64 {
        self.kv.lease.as_ref().map_or(0, |l| l.bytes())
    }

    /// Bytes held by the KV cache and the recurrent state (its snapshot included).
    pub fn cache_bytes(&self) -> usize {
        self.layers.iter().map(LayerCache::bytes).sum()
    }
}
