//! The memory plan: how a budget is split between the trunk, the KV cache, scratch and the
//! expert cache — computed before any large allocation, and refused when it cannot work.

use sluice_store::io::plan_reads;
use sluice_store::{Piece, Reader, StoreError};

use crate::config::{AttentionConfig, ModelConfig};
use crate::weights::WeightLayout;

/// What the budget must hold besides the expert cache, and what is left for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// The budget (`u64::MAX` when unlimited).
    pub budget: u64,
    /// Trunk bytes held resident (embeddings, attention, norms, routers, shared experts, dense
    /// layers, lm_head).
    pub trunk: u64,
    /// KV cache reserved for `context` positions.
    pub kv_cache: u64,
    /// Positions the KV reservation covers.
    pub context: usize,
    /// Activations and scratch for a prefill chunk.
    pub scratch: u64,
    /// Bytes for cached experts.
    pub expert_cache: u64,
    /// Buffer size of the largest routed expert.
    pub expert_bytes: u64,
    /// Routed-expert bytes one token needs in the worst layer (top-k experts).
    pub per_token_expert_bytes: u64,
    /// All routed experts.
    pub all_expert_bytes: u64,
    /// The smallest budget that works.
    pub minimum: u64,
}

/// KV-cache bytes per position (all layers).
pub fn kv_bytes_per_position(cfg: &ModelConfig) -> u64 {
    let per_layer = match &cfg.attention {
        AttentionConfig::Gqa {
            kv_heads, head_dim, ..
        } => 2 * kv_heads * head_dim,
        AttentionConfig::Mla {
            kv_lora_rank,
            qk_rope_head_dim,
            ..
        } => kv_lora_rank + qk_rope_head_dim,
    };
    (per_layer * cfg.layers * 4) as u64
}

/// Scratch for a forward pass over `chunk` tokens: hidden states, projections, expert
/// activations and one row of logits per token (an estimate with margin).
pub fn scratch_bytes(cfg: &ModelConfig, chunk: usize) -> u64 {
    let widest_attn = match &cfg.attention {
        AttentionConfig::Gqa {
            heads,
            kv_heads,
            head_dim,
            ..
        } => (heads + 2 * kv_heads) * head_dim,
        AttentionConfig::Mla {
            heads,
            qk_nope_head_dim,
            qk_rope_head_dim,
            v_head_dim,
            kv_lora_rank,
            ..
        } => heads * (qk_nope_head_dim + qk_rope_head_dim + v_head_dim) + kv_lora_rank * 2,
    };
    let widest_ffn = cfg
        .mlp
        .iter()
        .map(|m| match m {
            crate::config::MlpKind::Dense { intermediate } => *intermediate,
            crate::config::MlpKind::Moe => cfg
                .moe
                .intermediate
                .max(cfg.moe.shared.as_ref().map_or(0, |s| s.intermediate)),
        })
        .max()
        .unwrap_or(0);
    let per_token = 8 * cfg.hidden
        + 2 * widest_attn
        + 3 * widest_ffn
        + cfg.moe.top_k * cfg.hidden
        + cfg.vocab
        + cfg.moe.experts;
    (per_token * chunk * 4) as u64 + (1 << 20)
}

impl MemoryPlan {
    /// Splits `budget` (None: unlimited) for a model whose experts `reader` will read.
    pub fn new(
        cfg: &ModelConfig,
        layout: &WeightLayout,
        reader: &dyn Reader,
        budget: Option<u64>,
        context: usize,
        chunk: usize,
    ) -> Result<MemoryPlan, StoreError> {
        let footprint = |pieces: &[Piece]| plan_reads(reader, pieces).2 as u64;
        let mut expert_bytes = 0;
        let mut per_token_expert_bytes = 0;
        let mut all_expert_bytes = 0;
        for layer in &layout.experts {
            let mut sizes: Vec<u64> = layer.iter().map(|p| footprint(p)).collect();
            all_expert_bytes += sizes.iter().sum::<u64>();
            sizes.sort_unstable_by(|a, b| b.cmp(a));
            expert_bytes = expert_bytes.max(sizes.first().copied().unwrap_or(0));
            per_token_expert_bytes =
                per_token_expert_bytes.max(sizes.iter().take(cfg.moe.top_k).sum());
        }
        let trunk = layout.trunk_bytes();
        let kv_cache = kv_bytes_per_position(cfg) * context as u64;
        let scratch = scratch_bytes(cfg, chunk);
        let fixed = trunk + kv_cache + scratch;
        let minimum = fixed + per_token_expert_bytes;
        let budget_v = budget.unwrap_or(u64::MAX);
        if budget_v < minimum {
            return Err(StoreError::BudgetTooSmall {
                budget: budget_v,
                minimum,
                what: format!(
                    "trunk {} + KV cache for {context} positions {} + scratch {} + one token's routed experts {}",
                    fmt_bytes(trunk),
                    fmt_bytes(kv_cache),
                    fmt_bytes(scratch),
                    fmt_bytes(per_token_expert_bytes)
                ),
            });
        }
        let expert_cache = if budget.is_none() {
            all_expert_bytes.max(expert_bytes)
        } else {
            (budget_v - fixed).min(all_expert_bytes.max(expert_bytes))
        };
        Ok(MemoryPlan {
            budget: budget_v,
            trunk,
            kv_cache,
            context,
            scratch,
            expert_cache,
            expert_bytes,
            per_token_expert_bytes,
            all_expert_bytes,
            minimum,
        })
    }
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
