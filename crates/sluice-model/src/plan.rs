//! The memory plan: how a budget is split between the trunk, the KV cache, scratch and the
//! expert cache — computed before any large allocation, and refused when it cannot work.

use sluice_store::io::plan_reads;
use sluice_store::{Piece, Reader, StoreError};

use crate::config::{LayerPlan, MlpKind, ModelConfig, Residual};
use crate::options::ModelOptions;
use crate::weights::WeightLayout;

/// How a budget is split. Trunk first — the head (final norm, lm_head) is pinned first, then
/// whole layers largest first while every planned sequence's full-context KV cache still fits
/// beside them, then the embedding table — streaming whatever does not fit through a ring of
/// one or two slots, once a prefix cache asked for is set aside. What is left
/// is a pool with three tenants: the expert cache, which starts with all of it; the KV caches
/// of the sequences, which take pages from it as positions are written (the expert cache
/// evicting by its policy to give them up, never below [`MemoryPlan::expert_floor`]) and give
/// them back when sequences end; and the prefix cache, which takes up to its share as prompts'
/// states are kept. The share is in the pool on top of what the other two need, so a full
/// prefix cache never stands in a sequence's way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// The budget (`u64::MAX` when unlimited).
    pub budget: u64,
    /// Bytes of the whole trunk (embeddings, attention, norms, routers, shared experts, dense
    /// layers, final norm, lm_head) as buffers.
    pub trunk: u64,
    /// Trunk bytes pinned in memory.
    pub trunk_pinned: u64,
    /// Per layer: its trunk part's bytes and whether it is pinned.
    pub layers: Vec<(u64, bool)>,
    /// Bytes of the head part (always pinned).
    pub head: u64,
    /// Bytes of the multi-token-prediction layer and its input projection and norms, when
    /// loaded ([`ModelOptions::mtp`]): pinned beside the head (its experts are the expert
    /// cache's, counted in [`MemoryPlan::all_expert_bytes`]).
    pub mtp: u64,
    /// Bytes of the embedding table and whether it is pinned (otherwise rows are read per token).
    pub embed: (u64, bool),
    /// Slots of the streaming ring (0 when every layer is pinned).
    pub ring_slots: usize,
    /// Bytes of one ring slot (the largest streamed part).
    pub ring_slot_bytes: u64,
    /// KV cache of `sequences` sequences at full context (`context` positions each; with the
    /// MTP layer loaded, its cache of as many positions too). Not reserved: it is drawn from
    /// [`MemoryPlan::pool`] page by page as positions are written.
    pub kv_cache: u64,
    /// KV-cache bytes per position of one sequence (the model's layers; the MTP layer's cache
    /// is planned in `kv_cache` and `context_fit`).
    pub kv_per_position: u64,
    /// Bytes shared by the expert cache and the sequences' KV pages (`u64::MAX` unlimited).
    pub pool: u64,
    /// The least the expert cache keeps however much KV cache the sequences hold: one token's
    /// routed experts in the worst layer.
    pub expert_floor: u64,
    /// Positions one sequence can hold with every expert but the floor given up (at most
    /// `context`): a prompt and its generation beyond this are refused up front.
    pub context_fit: usize,
    /// Recurrent state of the linear-attention (KDA) layers: fixed per sequence, whatever its
    /// length (see [`recurrent_bytes`]), times `sequences`.
    pub recurrent: u64,
    /// Positions the KV reservation covers, per sequence.
    pub context: usize,
    /// Sequences decoded together (batched decoding) the KV cache, recurrent state and scratch
    /// are reserved for.
    pub sequences: usize,
    /// Activations and scratch for a forward pass of `chunk` rows.
    pub scratch: u64,
    /// Floats of attention scores the tiles of a decode step share (part of `scratch`): enough
    /// that at the full context a tile still holds several heads (see
    /// [`crate::attention::step_score_floats`]).
    pub step_score_floats: usize,
    /// Rows each call inside a layer takes at most (attention, products): what bounds the
    /// scratch. A prefill runs a layer over a whole span of the prompt at a time, in calls of
    /// this many rows.
    pub chunk: usize,
    /// Bytes of activations each prompt token of a prefill span holds while a layer runs over
    /// the span (residual stream, normed inputs, routing, expert outputs): see
    /// [`span_bytes_per_token`].
    pub span_bytes_per_token: u64,
    /// The longest span of a prompt one prefill pass runs each layer over, with nothing else in
    /// the pool lent out: every expert a layer's span routes to is then read once for all of
    /// its rows. Its activations beyond the first `chunk` rows (which `scratch` holds) are lent
    /// by the expert cache for the pass and given back after it, like KV pages; when the pool
    /// has less room at the time, the span is shorter. Never less than `chunk`.
    pub prefill_span: usize,
    /// Memory the caller keeps for itself inside the budget (the tokenizer: its vocabulary and
    /// the peak of encoding the longest prompt that can fit; see [`crate::ModelOptions`]).
    pub text: u64,
    /// Bytes of cached experts at the start (before any KV page is taken), at most all experts.
    pub expert_cache: u64,
    /// Bytes of cached experts when every planned sequence is at full context (never below the
    /// floor; when the pool cannot hold that much KV beside the floor, the floor).
    pub expert_cache_full_context: u64,
    /// Buffer size of the largest routed expert.
    pub expert_bytes: u64,
    /// Routed-expert bytes one token needs in the worst layer (top-k experts).
    pub per_token_expert_bytes: u64,
    /// All routed experts.
    pub all_expert_bytes: u64,
    /// The smallest budget that works (one ring slot, nothing else pinned but the head), with
    /// a prefix cache asked for included.
    pub minimum: u64,
    /// Bytes of the pool the prefix cache may take (0: none), on top of what every planned
    /// sequence's full-context KV cache and the expert floor need. Asked for, it is set aside
    /// before the trunk (and counted in the minimum); by default it is a sixteenth of the
    /// budget, out of what the pool holds beyond those, taking nothing from the trunk. With
    /// unlimited memory the asked size or 1 GiB, which nothing accounts.
    pub prefix_cache: u64,
}

/// The prefix cache with unlimited memory when no size is asked for.
pub const PREFIX_CACHE_UNLIMITED: u64 = 1 << 30;

/// Positions a sequence's KV cache grows by at a time (each page's bytes are taken from the
/// expert cache when the first of its positions is written). The minimum budget holds one page
/// per planned sequence.
pub const KV_PAGE: usize = 64;

/// Bytes of one sequence's recurrent state: per recurrent layer (KDA) its fixed state, twice —
/// the state and its snapshot from before the latest forward pass (what a failed pass or a
/// one-step truncation restores). Zero without recurrent layers.
pub fn recurrent_bytes(cfg: &ModelConfig) -> u64 {
    let floats: usize = cfg
        .layer_plan
        .iter()
        .map(|p| p.attention.recurrent_floats())
        .sum();
    (2 * floats * 4) as u64
}

/// KV-cache bytes per position of the checkpoint's first MTP layer (0 without one).
fn mtp_kv_bytes_per_position(cfg: &ModelConfig) -> u64 {
    cfg.mtp
        .as_ref()
        .and_then(|m| m.plans.first())
        .map_or(0, |p| kv_bytes_per_position(&cfg.one_layer(p)))
}

/// KV-cache bytes per position (every layer with a KV cache; recurrent layers keep none).
pub fn kv_bytes_per_position(cfg: &ModelConfig) -> u64 {
    let floats: usize = cfg.layer_plan.iter().map(|p| p.attention.kv_floats()).sum();
    (floats * 4) as u64
}

/// Floats per token a residual scheme holds beyond one stream: with attention residuals every
/// completed block's running sum, kept for the whole pass; with hyper-connections the other
/// streams, the mixed input and the gates (0 with plain residual adds).
fn residual_floats(cfg: &ModelConfig) -> usize {
    match cfg.residual {
        Residual::AttnRes { block_size } => (cfg.layers.div_ceil(block_size) + 3) * cfg.hidden,
        Residual::Hyper(hc) => hc.streams * cfg.hidden + hc.gates() + hc.streams,
        Residual::Add => 0,
    }
}

/// Bytes each token of a prefill span holds while a layer runs over the whole span: the
/// residual stream (with attention residuals, every completed block; with hyper-connections,
/// every stream), the normed attention and feed-forward inputs, the attention and feed-forward
/// outputs, the shared expert's output, the router's logits and choices, each routed slot's
/// output and their combination (in the experts' latent space where they have one). What each
/// call of `chunk` rows works with beyond that is [`scratch_bytes`].
pub fn span_bytes_per_token(cfg: &ModelConfig) -> u64 {
    let attn_res = residual_floats(cfg);
    let w = cfg.moe.latent.map_or(cfg.hidden, |l| l.dim);
    let k = cfg.moe.top_k;
    // A shortcut MoE's routed sum waits one layer beside the stream.
    let carry = if cfg.moe.shortcut { cfg.hidden } else { 0 };
    let floats =
        7 * cfg.hidden + attn_res + carry + cfg.moe.router_width() + k * w + 2 * w + 6 * k + 16;
    (floats * 4) as u64
}

/// The largest of `f` over the model's layers (0 without layers).
fn widest(cfg: &ModelConfig, f: impl Fn(&LayerPlan) -> usize) -> usize {
    cfg.layer_plan.iter().map(f).max().unwrap_or(0)
}

/// Scratch for a forward pass over `chunk` tokens: hidden states, projections, expert
/// activations and one row of logits per token (an estimate with margin).
pub fn scratch_bytes(cfg: &ModelConfig, chunk: usize) -> u64 {
    let widest_attn = widest(cfg, |p| p.attention.scratch_floats());
    let widest_ffn = widest(cfg, |p| match p.mlp {
        MlpKind::Dense { intermediate } => intermediate,
        MlpKind::Moe => cfg
            .moe
            .intermediate
            .max(cfg.moe.shared.as_ref().map_or(0, |s| s.intermediate)),
    });
    let attn_res = residual_floats(cfg);
    let latent = cfg.moe.latent.map_or(0, |l| 2 * l.dim);
    let per_token = 8 * cfg.hidden
        + 2 * widest_attn
        + attn_res
        + latent
        + 3 * widest_ffn
        + cfg.moe.top_k * cfg.hidden
        + cfg.vocab
        + cfg.moe.router_width();
    (per_token * chunk * 4) as u64 + (1 << 20)
}

impl MemoryPlan {
    /// Splits `opts.memory` (None: unlimited) for a model whose bytes `reader` will read:
    /// `opts.context` positions (capped by the model's maximum), calls of `opts.chunk` rows,
    /// `opts.sequences` sequences and `opts.text_memory` kept for the caller's tokenizer.
    pub fn new(
        cfg: &ModelConfig,
        layout: &WeightLayout,
        reader: &dyn Reader,
        opts: &ModelOptions,
    ) -> Result<MemoryPlan, StoreError> {
        let budget = opts.memory;
        let context = opts.context.min(cfg.max_positions).max(1);
        let chunk = opts.chunk.max(1);
        let sequences = opts.sequences;
        let text = opts.text_memory;
        let sequences = sequences.max(1);
        let footprint = |pieces: &[Piece]| plan_reads(reader, pieces).2 as u64;
        let mut expert_bytes = 0;
        let mut per_token_expert_bytes = 0;
        let mut all_expert_bytes = 0;
        // The MTP layer, when loaded: its trunk pinned with the head, its experts cached with
        // the model's.
        let mtp_layout = layout.mtp.as_ref().filter(|_| opts.mtp);
        let mtp = mtp_layout.map_or(0, |m| {
            m.layers
                .first()
                .into_iter()
                .chain(m.heads.first())
                .map(|p| footprint(&p.pieces))
                .sum::<u64>()
        });
        let mtp_experts = mtp_layout.and_then(|m| m.experts.first());
        for layer in layout.experts.iter().chain(mtp_experts) {
            let mut sizes: Vec<u64> = layer.iter().map(|p| footprint(p)).collect();
            all_expert_bytes += sizes.iter().sum::<u64>();
            sizes.sort_unstable_by(|a, b| b.cmp(a));
            expert_bytes = expert_bytes.max(sizes.first().copied().unwrap_or(0));
            per_token_expert_bytes =
                per_token_expert_bytes.max(sizes.iter().take(cfg.moe.top_k).sum());
        }
        let layer_bytes: Vec<u64> = layout.layers.iter().map(|p| footprint(&p.pieces)).collect();
        let head = footprint(&layout.head.pieces);
        let embed = footprint(&layout.embed.pieces);
        let all_layers: u64 = layer_bytes.iter().sum();
        let trunk = all_layers + head + embed + mtp;
        let kv_per_position = kv_bytes_per_position(cfg);
        // A sequence drafting with the MTP layer keeps its KV cache too, over at most as many
        // positions as its own: planned with it, so that it never takes the sequence's room.
        let mtp_kv = if mtp_layout.is_some() {
            mtp_kv_bytes_per_position(cfg)
        } else {
            0
        };
        let kv_all = kv_per_position.saturating_add(mtp_kv);
        // Saturating: a context or batch too large for the budget is refused below, not wrapped.
        let kv_cache = kv_all
            .saturating_mul(context as u64)
            .saturating_mul(sequences as u64);
        let recurrent = recurrent_bytes(cfg).saturating_mul(sequences as u64);
        // A forward pass takes a prefill chunk of one sequence or one row per batched sequence.
        let rows = chunk.max(sequences);
        // Embedding rows read on demand need a buffer per row (plus alignment).
        let row_buf = (rows as u64) * (layout.embed_spec.cols as u64 * 4 + 8192);
        // Attention tiles' scores (see `attention::tile_rows`), enough for a decode step at the
        // full context; a prefill span that gets room for more takes it with its activations.
        let tiled_heads = widest(cfg, |p| p.attention.tiled_heads());
        let step_score_floats =
            crate::attention::step_score_floats(tiled_heads, opts.threads, context);
        let tiles = (step_score_floats * 4) as u64;
        let scratch = scratch_bytes(cfg, rows) + row_buf + tiles;
        let max_layer = layer_bytes.iter().copied().max().unwrap_or(0);
        let fixed = recurrent
            .saturating_add(scratch)
            .saturating_add(head)
            .saturating_add(mtp)
            .saturating_add(text);
        let expert_floor = per_token_expert_bytes.max(expert_bytes);
        // One page of KV cache per sequence, so that the smallest budget still runs a prompt.
        let kv_page = kv_all
            .saturating_mul(KV_PAGE.min(context) as u64)
            .saturating_mul(sequences as u64);
        let minimum = fixed
            .saturating_add(max_layer)
            .saturating_add(expert_floor)
            .saturating_add(kv_page);
        let budget_v = budget.unwrap_or(u64::MAX);
        // A prefix cache asked for under a budget is set aside before the trunk, and is part of
        // what the budget must hold; the default takes nothing from the trunk (below).
        let asked_share = match budget {
            Some(_) => opts.prefix_cache.unwrap_or(0),
            None => 0,
        };
        let minimum = minimum.saturating_add(asked_share);
        if budget_v < minimum {
            return Err(StoreError::BudgetTooSmall {
                budget: budget_v,
                minimum,
                what: format!(
                    "tokenizer {} + recurrent state of {sequences} sequences {} + scratch {} + lm_head and final norm {}{} + one streamed layer {} + one token's routed experts {} + a first KV page of {KV_PAGE} positions per sequence {}{}; the KV cache ({} per position) grows into what is left",
                    fmt_bytes(text),
                    fmt_bytes(recurrent),
                    fmt_bytes(scratch),
                    fmt_bytes(head),
                    if mtp > 0 {
                        format!(" + the MTP layer {}", fmt_bytes(mtp))
                    } else {
                        String::new()
                    },
                    fmt_bytes(max_layer),
                    fmt_bytes(expert_floor),
                    fmt_bytes(kv_page),
                    if asked_share > 0 {
                        format!(" + the prefix cache asked for {}", fmt_bytes(asked_share))
                    } else {
                        String::new()
                    },
                    fmt_bytes(kv_per_position)
                ),
            });
        }
        let all_experts = all_expert_bytes.max(expert_bytes);
        // Room for the trunk beyond the head, once one token's experts are set aside.
        let room = budget_v
            .saturating_sub(fixed)
            .saturating_sub(expert_floor)
            .saturating_sub(kv_page)
            .saturating_sub(asked_share);
        let mut pinned = vec![false; layer_bytes.len()];
        let (ring_slots, ring_slot_bytes, embed_pinned);
        // The full-context KV cache beyond the first pages set aside above.
        let kv_rest = kv_cache.saturating_sub(kv_page);
        // The embedding table is pinned only with room to spare beside every planned
        // sequence's full-context KV cache: read a row per token it costs little, while the
        // bytes it would hold are the KV cache's to grow into.
        if room >= all_layers.saturating_add(embed).saturating_add(kv_cache) {
            pinned.iter_mut().for_each(|p| *p = true);
            ring_slots = 0;
            ring_slot_bytes = 0;
            embed_pinned = true;
        } else if room >= all_layers.saturating_add(kv_rest) {
            pinned.iter_mut().for_each(|p| *p = true);
            ring_slots = 0;
            ring_slot_bytes = 0;
            embed_pinned = false;
        } else {
            embed_pinned = false;
            // Two slots (the next layer streams while this one computes) when they fit beside
            // the largest layer, else one.
            ring_slots = if room >= 2 * max_layer { 2 } else { 1 };
            // A pinned layer cannot be given back as a sequence grows, so layers are pinned
            // only beside every planned sequence's full-context KV cache (as far as the
            // budget holds it beside the ring): a long prompt streams more of the trunk rather
            // than being refused. `--context` is the dial between the two.
            let room = room
                .saturating_sub(kv_rest)
                .max(ring_slots as u64 * max_layer);
            // Pin whole layers, largest first, while the rest still fits in the ring.
            let mut order: Vec<usize> = (0..layer_bytes.len()).collect();
            order.sort_by_key(|&l| (std::cmp::Reverse(layer_bytes[l]), l));
            let mut used = 0u64;
            let mut skipped_max = 0u64;
            for (k, &l) in order.iter().enumerate() {
                // The ring must hold the largest layer left unpinned.
                let slot = skipped_max.max(
                    order[k + 1..]
                        .iter()
                        .map(|&m| layer_bytes[m])
                        .max()
                        .unwrap_or(0),
                );
                if slot > 0 && used + layer_bytes[l] + ring_slots as u64 * slot <= room {
                    pinned[l] = true;
                    used += layer_bytes[l];
                } else {
                    skipped_max = skipped_max.max(layer_bytes[l]);
                }
            }

            ring_slot_bytes = (0..layer_bytes.len())
                .filter(|&l| !pinned[l])
                .map(|l| layer_bytes[l])
                .max()
                .unwrap_or(0);
        }
        let trunk_pinned = head
            + mtp
            + layer_bytes
                .iter()
                .zip(&pinned)
                .filter(|(_, p)| **p)
                .map(|(b, _)| b)
                .sum::<u64>()
            + if embed_pinned { embed } else { 0 };
        let ring_bytes = ring_slots as u64 * ring_slot_bytes;
        let pool = if budget.is_none() {
            u64::MAX
        } else {
            budget_v - recurrent - scratch - text - trunk_pinned - ring_bytes
        };
        let expert_cache = pool.min(all_experts);
        let prefix_cache = match (budget, opts.prefix_cache) {
            (None, asked) => asked.unwrap_or(PREFIX_CACHE_UNLIMITED),
            (Some(_), Some(asked)) => asked,
            // By default a sixteenth of the budget, out of what the pool holds beyond every
            // planned sequence's full-context KV cache and the expert floor.
            (Some(b), None) => {
                (b / 16).min(pool.saturating_sub(kv_cache).saturating_sub(expert_floor))
            }
        };
        // What the KV caches and the expert cache share once the prefix cache is full.
        let shared = match budget {
            Some(_) => pool.saturating_sub(prefix_cache),
            None => pool,
        };
        let expert_cache_full_context = shared
            .saturating_sub(kv_cache)
            .max(expert_floor)
            .min(all_experts);
        let span_bytes_per_token = span_bytes_per_token(cfg);
        // The span is planned on the whole pool: a pass takes its room when it runs, shorter
        // when the prefix cache (or anything else) holds some of it then.
        let prefill_span = prefill_span(
            budget.is_none(),
            pool,
            kv_cache,
            all_experts,
            expert_floor,
            kv_per_position,
            span_bytes_per_token,
            ring_slots == 0,
        )
        .clamp(chunk, context.max(chunk));
        let context_fit = shared
            .saturating_sub(expert_floor)
            .checked_div(kv_all)
            .map_or(context, |p| p.min(context as u64) as usize);
        Ok(MemoryPlan {
            budget: budget_v,
            trunk,
            trunk_pinned,
            layers: layer_bytes.into_iter().zip(pinned).collect(),
            head,
            mtp,
            embed: (embed, embed_pinned),
            ring_slots,
            ring_slot_bytes,
            kv_cache,
            kv_per_position,
            pool,
            expert_floor,
            context_fit,
            recurrent,
            context,
            sequences,
            scratch,
            step_score_floats,
            chunk,
            span_bytes_per_token,
            prefill_span,
            text,
            expert_cache,
            expert_cache_full_context,
            expert_bytes,
            per_token_expert_bytes,
            all_expert_bytes,
            minimum,
            prefix_cache,
        })
    }

    /// The prefix cache's share of the pool (0 with unlimited memory, where nothing is
    /// accounted).
    pub fn prefix_share(&self) -> u64 {
        if self.pool == u64::MAX {
            0
        } else {
            self.prefix_cache
        }
    }

    /// Whether the whole trunk is in memory.
    pub fn trunk_resident(&self) -> bool {
        self.ring_slots == 0
    }

    /// Whether every routed expert stays cached even with every planned sequence at full
    /// context.
    pub fn all_experts_fit(&self) -> bool {
        self.expert_cache_full_context >= self.all_expert_bytes
            && self
                .pool
                .saturating_sub(self.kv_cache)
                .saturating_sub(self.prefix_share())
                >= self.all_expert_bytes
    }
}

/// The longest prefill span a pool holds (before clamping to `chunk..=context`). With every
/// expert staying cached beside full-context KV caches and the trunk resident (passes run in
/// the compute pool and must never wait for room), only what is spare beyond both; otherwise
/// what the pool holds beside the expert floor with the span's own KV pages.
#[allow(clippy::too_many_arguments)]
fn prefill_span(
    unlimited: bool,
    pool: u64,
    kv_cache: u64,
    all_experts: u64,
    floor: u64,
    kv_per_position: u64,
    per_token: u64,
    trunk_resident: bool,
) -> usize {
    if unlimited {
        return usize::MAX;
    }
    let fit = pool.saturating_sub(kv_cache) >= all_experts;
    if fit && trunk_resident {
        let spare = pool.saturating_sub(kv_cache).saturating_sub(all_experts);
        return usize::try_from(spare / per_token.max(1)).unwrap_or(usize::MAX);
    }
    // The span's KV cache is taken in whole pages.
    let room = pool.saturating_sub(floor);
    let need = |s: u64| {
        s.saturating_mul(per_token)
            .saturating_add(s.div_ceil(KV_PAGE as u64) * KV_PAGE as u64 * kv_per_position)
    };
    let mut span = room / (per_token + kv_per_position).max(1);
    while span > 0 && need(span) > room {
        span -= 1;
    }
    usize::try_from(span).unwrap_or(usize::MAX)
}

/// Bytes as `1.50 GiB`, `12.0 MiB`, `512 B`.
pub fn fmt_bytes(b: u64) -> String {
    const K: f64 = 1024.0;
    let f = b as f64;
    if f >= K * K * K {
        format!("{:.2} GiB", f / (K * K * K))
    } else if f >= K * K {
        format!("{:.1} MiB", f / (K * K))
    } else if f >= K {
        format!("{:.1} KiB", f / K)
    } else {
        format!("{b} B")
    }
}
