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
    /// Where the forward passes this state took part in spent their time, summed (its share
    /// of a batched pass: the pass's time ÷ its sequences).
    pub(crate) times: crate::options::PassTimes,
    /// Lookahead's hint, kept only on single-token steps with prefetch on: per layer, this
    /// sequence's attention output for its latest token (empty when none). Added to the
    /// output of the layer before, it estimates that layer's router input; it never touches
    /// an output bit. Layers × hidden floats per decoding sequence, outside the memory plan
    /// (1.75 MB at DeepSeek-V3's 61 × 7168, about what 12 positions of its MLA cache take).
    pub(crate) last_attention: Vec<Vec<f32>>,
    /// Final-normed hidden rows (or streams) kept for multi-token-prediction drafts
    /// ([`State::keep_hidden`]).
    pub(crate) hidden: HiddenRows,
}

/// The final-normed hidden rows (what the lm_head reads) of a sequence's latest positions — for
/// DeepSeek-V4's MTP layer the hyper-connection streams before the hyper head,
/// [`ModelConfig::mtp_row_width`] floats each — kept across forward passes for a
/// multi-token-prediction layer to draft from: at most `keep` rows, of consecutive positions
/// from `first`. A pass that starts at or before the
/// end of what is kept replaces the rows from its first position on (the same positions
/// computed again, or a draft's rows after a rejection); one that starts after a gap starts
/// afresh.
#[derive(Clone, Debug, Default)]
pub(crate) struct HiddenRows {
    pub(crate) keep: usize,
    pub(crate) first: usize,
    pub(crate) rows: Vec<f32>,
}

/// What a [`State`] held at one point ([`State::snapshot`]).
#[derive(Clone, Debug)]
pub struct Snapshot {
    pos: usize,
    layers: Vec<LayerCache>,
}

impl HiddenRows {
    /// Takes `rows` (`[n, hidden]`, `hidden` floats each) of positions from `first`.
    pub(crate) fn put(&mut self, first: usize, rows: &[f32], hidden: usize) {
        let held = self.rows.len() / hidden.max(1);
        if self.rows.is_empty() || first < self.first || first > self.first + held {
            self.rows.clear();
            self.first = first;
        } else {
            self.rows.truncate((first - self.first) * hidden);
        }
        self.rows.extend_from_slice(rows);
        let n = self.rows.len() / hidden.max(1);
        if n > self.keep {
            let drop = n - self.keep;
            self.rows.drain(..drop * hidden);
            self.first += drop;
        }
    }
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
            times: Default::default(),
            last_attention: vec![Vec::new(); cfg.layers],
            hidden: HiddenRows::default(),
        }
    }

    /// Keeps the final-normed hidden rows of this sequence's latest `rows` positions across
    /// forward passes (0: none, the default), for a multi-token-prediction layer to draft
    /// from ([`State::hidden_rows`]). Outside the memory budget: `rows ×`
    /// [`ModelConfig::mtp_row_width`] floats (the streams, for DeepSeek-V4's layer).
    pub fn keep_hidden(&mut self, rows: usize) {
        self.hidden.keep = rows;
        if rows == 0 {
            self.hidden = HiddenRows::default();
        }
    }

    /// The hidden rows kept ([`State::keep_hidden`]): the position of the first, and
    /// [`ModelConfig::mtp_row_width`] floats per position of consecutive positions.
    pub fn hidden_rows(&self) -> (usize, &[f32]) {
        (self.hidden.first, &self.hidden.rows)
    }

    /// Where the forward passes this state took part in spent their time, summed over its
    /// life (a batched pass counts its time ÷ its sequences). Phase times of a span of a
    /// generation are differences of two readings.
    pub fn pass_times(&self) -> crate::options::PassTimes {
        self.times
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

    /// Whether [`State::truncate`] to `pos` would succeed: always for a KV cache; for a
    /// recurrent state only at or past the end, at the start, or where the latest pass began.
    pub fn can_truncate(&self, pos: usize) -> bool {
        pos >= self.pos || self.can_rollback(pos)
    }

    /// A copy of the state holding its first `pos` positions (at most [`State::pos`]), with
    /// buffers of exactly that size, no KV charge (see `Model::charge`) and no captures; `None`
    /// when a recurrent layer cannot go back to `pos` ([`State::can_truncate`]). What the
    /// prefix cache keeps and hands out.
    pub fn prefix(&self, pos: usize) -> Option<State> {
        if pos > self.pos || !self.can_rollback(pos) {
            return None;
        }
        Some(State {
            pos,
            layers: self.layers.iter().map(|l| l.prefix(pos)).collect(),
            kv: KvLease::default(),
            routes: None,
            debug: None,
            times: Default::default(),
            last_attention: vec![Vec::new(); self.layers.len()],
            hidden: HiddenRows::default(),
        })
    }

    /// Whether [`State::truncate`] can cut the state back to any position it holds: every
    /// layer is a KV cache (no recurrent layer, no DeepSeek-V4 window, which go back only to
    /// where the latest pass began).
    pub fn cuts_anywhere(&self) -> bool {
        self.layers.iter().all(LayerCache::cuts_anywhere)
    }

    /// A copy of what the state holds now, to come back to with [`State::restore`] across
    /// passes it could not be cut back over ([`State::cuts_anywhere`]). A copy of the caches;
    /// outside the memory budget.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            pos: self.pos,
            layers: self.layers.clone(),
        }
    }

    /// Comes back to `snap`, a [`State::snapshot`] of this state: the positions it held then
    /// and nothing after. What the state is charged to the budget stays.
    pub fn restore(&mut self, snap: Snapshot) {
        self.pos = snap.pos;
        self.layers = snap.layers;
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

    /// The state as bytes: its position and every layer's kind and buffers (little-endian;
    /// see [`State::from_bytes`]). The routes and debug captures are not kept.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.cache_bytes());
        out.extend_from_slice(&(self.pos as u64).to_le_bytes());
        out.extend_from_slice(&(self.layers.len() as u32).to_le_bytes());
        for l in &self.layers {
            out.push(l.tag());
            let parts = l.parts();
            out.extend_from_slice(&(parts.len() as u32).to_le_bytes());
            for p in parts {
                out.extend_from_slice(&(p.len() as u64).to_le_bytes());
                for x in p {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
        out
    }

    /// A state of `cfg`'s model from [`State::to_bytes`]: every layer's kind, buffer count and
    /// buffer lengths must be what `cfg` gives for the position saved, and nothing may follow.
    /// What is wrong is said in one line.
    pub fn from_bytes(cfg: &ModelConfig, bytes: &[u8]) -> Result<State, String> {
        let mut r = Reader { b: bytes };
        let mut s = State::new(cfg);
        let pos = r.u64()? as usize;
        let layers = r.u32()? as usize;
        if layers != s.layers.len() {
            return Err(format!(
                "{layers} layers, but the model has {}",
                s.layers.len()
            ));
        }
        for (i, l) in s.layers.iter_mut().enumerate() {
            let tag = r.take(1)?[0];
            if tag != l.tag() {
                return Err(format!("layer {i} is of another attention kind"));
            }
            let n = r.u32()? as usize;
            if n > 1 << 16 {
                return Err(format!("layer {i}: {n} buffers"));
            }
            let mut parts = Vec::with_capacity(n);
            for b in 0..n {
                let len = r.u64()? as usize;
                let raw = r.take(len.checked_mul(4).ok_or("a buffer length overflows")?)?;
                let part: Vec<f32> = raw
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                // A model never caches a non-finite value (a pass that makes one fails), so
                // one here was written into the file, not computed.
                if let Some(j) = part.iter().position(|x| !x.is_finite()) {
                    return Err(format!(
                        "layer {i}: element {j} of buffer {b} is NaN or infinite"
                    ));
                }
                parts.push(part);
            }
            l.restore(parts, pos)
                .map_err(|e| format!("layer {i}: {e}"))?;
        }
        if !r.b.is_empty() {
            return Err(format!("{} bytes after the last layer", r.b.len()));
        }
        s.pos = pos;
        Ok(s)
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

/// Reads little-endian fields off the front of a byte slice.
struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.b.len() {
            return Err("it ends early".into());
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }

    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, String> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
}
