//! What a model is and how a budget would be spent on it — without loading it.

use std::path::Path;

use serde::Serialize;
use sluice_model::config::Residual;
use sluice_model::plan::{kv_bytes_per_position, recurrent_bytes};
use sluice_model::{Description, ModelOptions};

use crate::Error;
use crate::engine::{Memory, resolve_memory, text_memory};

/// A model's figures and the plan a budget gives it.
#[derive(Clone, Debug, Serialize)]
pub struct Inspection {
    /// The model directory.
    pub dir: String,
    /// `model_type`.
    pub model_type: String,
    /// Layers.
    pub layers: usize,
    /// Layers with routed experts.
    pub moe_layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// Routed experts per MoE layer.
    pub experts: usize,
    /// Zero-compute experts beside the routed ones (LongCat-Flash's: a chosen one adds its
    /// weight times the input and reads nothing).
    pub zero_experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// The attention kinds of the layers joined by `+`, those with a KV cache first (`mla`,
    /// `gqa`, `mla+kda`).
    pub attention: String,
    /// Layers with a KV cache (softmax attention).
    pub full_attention_layers: usize,
    /// Layers with a fixed recurrent state instead (Kimi Delta Attention).
    pub recurrent_layers: usize,
    /// Layers that attend to an earlier layer's latent cache and cache none of their own
    /// (Mistral Large 4's `kv_source_layers`).
    pub shared_kv_layers: usize,
    /// Attention-residual block size, when the model mixes block sums (Kimi K3).
    pub attn_res_block_size: Option<usize>,
    /// Residual streams per token, when the model has hyper-connections (Hy4).
    pub hyper_streams: Option<usize>,
    /// Layers whose experts come from the token rather than the router (DeepSeek-V4's hash
    /// routing; their prefetch is exact).
    pub hash_routed_layers: usize,
    /// DeepSeek-V4's compressed attention, when the model has it.
    pub compressed_attention: Option<CompressedSummary>,
    /// Multi-token-prediction layers in the checkpoint (found and checked).
    pub mtp_layers: usize,
    /// Whether `--draft mtp` runs them (the first; Qwen3-Next's kind).
    pub mtp_drafts: bool,
    /// Bytes of GGUF block weights whose products `--numerics int8` computes in integers
    /// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4); 0 for
    /// safetensors checkpoints.
    pub int8_bytes: u64,
    /// Bytes of GGUF block weights of other types, which that mode computes exactly.
    pub block_bytes_exact: u64,
    /// Their bytes on disk, routed experts included (in `checkpoint_bytes`, in no other figure).
    pub mtp_bytes: u64,
    /// Shards.
    pub shards: usize,
    /// Bytes of all tensors on disk.
    pub checkpoint_bytes: u64,
    /// Trunk bytes (every tensor but the routed experts).
    pub trunk_bytes: u64,
    /// Routed-expert bytes.
    pub expert_bytes: u64,
    /// Bytes of one routed expert (the largest, as read).
    pub bytes_per_expert: u64,
    /// Routed-expert bytes one token reads when nothing is cached (top-k in every MoE layer).
    pub expert_bytes_per_token: u64,
    /// Weight bytes one decode step reads, every byte in memory: the trunk but the embedding
    /// table (one row of it), and top-k routed experts in every MoE layer. Divided by the
    /// memory bandwidth, the fastest a token can be decoded in RAM.
    pub decode_touched_bytes_per_token: u64,
    /// KV-cache bytes per position.
    pub kv_bytes_per_position: u64,
    /// Recurrent-state bytes per sequence (KDA state and convolution inputs, with the snapshot
    /// kept for one-step rollback), whatever the sequence length.
    pub recurrent_bytes: u64,
    /// `direct` or `buffered`.
    pub io_mode: String,
    /// The plan.
    pub plan: PlanSummary,
}

/// The memory plan, flattened for printing.
#[derive(Clone, Debug, Serialize)]
pub struct PlanSummary {
    /// Budget in bytes (0: unlimited).
    pub budget: u64,
    /// Smallest budget that works.
    pub minimum: u64,
    /// Trunk bytes pinned.
    pub trunk_pinned: u64,
    /// Layers pinned, of all layers.
    pub layers_pinned: usize,
    /// The embedding table is pinned (else read a row per token).
    pub embed_pinned: bool,
    /// Ring slots for streamed layers.
    pub ring_slots: usize,
    /// Bytes per ring slot.
    pub ring_slot_bytes: u64,
    /// KV cache at full context (not reserved: it takes pages from the expert cache as
    /// positions are written).
    pub kv_cache: u64,
    /// Positions a sequence can hold with every expert but one token's given up (at most
    /// `context`).
    pub context_fit: usize,
    /// Recurrent state reserved.
    pub recurrent: u64,
    /// Positions it covers.
    pub context: usize,
    /// Scratch (for calls of `chunk` rows).
    pub scratch: u64,
    /// Rows per call inside a layer the scratch is for.
    pub chunk: usize,
    /// The longest prompt span one prefill pass runs each layer over (its experts read once
    /// for all of it), with nothing else lent out of the pool.
    pub prefill_span: usize,
    /// Bytes of activations each token of a span holds, lent by the expert cache for the pass.
    pub span_bytes_per_token: u64,
    /// Kept for the tokenizer (its vocabulary and the peak of encoding the longest prompt that
    /// fits).
    pub tokenizer: u64,
    /// Expert cache at the start (no KV page taken yet).
    pub expert_cache: u64,
    /// Experts the cache holds at the start.
    pub expert_cache_experts: u64,
    /// Expert cache at full context.
    pub expert_cache_full_context: u64,
    /// Experts the cache holds at full context.
    pub expert_cache_full_context_experts: u64,
    /// The least the expert cache keeps (one token's experts).
    pub expert_floor: u64,
    /// The prefix cache's default share (taken from the pool as prompts' states are kept).
    pub prefix_cache: u64,
}

/// Inspects a model directory and plans `memory` for it (`context` positions, prefill chunks of
/// `chunk`, the default prefix-cache share).
pub fn inspect(
    dir: &Path,
    memory: Memory,
    context: usize,
    chunk: usize,
) -> Result<Inspection, Error> {
    inspect_with(dir, memory, context, chunk, None)
}

/// [`inspect`] with a prefix cache of `prefix_cache` bytes asked for (None: the default share).
pub fn inspect_with(
    dir: &Path,
    memory: Memory,
    context: usize,
    chunk: usize,
    prefix_cache: Option<u64>,
) -> Result<Inspection, Error> {
    if !crate::is_model_path(dir) {
        return Err(Error::Usage(format!(
            "model {} does not exist (a model directory or a .gguf file)",
            dir.display()
        )));
    }
    let desc = Description::open(dir)?;
    let shards = desc.shards(true)?;
    let budget = resolve_memory(memory)?;
    let tokenizer = crate::load_text(&desc)?.tokenizer;
    let opts = ModelOptions {
        memory: budget,
        context,
        chunk,
        text_memory: text_memory(
            tokenizer.as_ref(),
            context.min(desc.config.max_positions),
            1,
        ),
        prefix_cache,
        ..ModelOptions::default()
    };
    let plan = desc.plan(&shards, &opts)?;
    let (ck, cfg, layout) = (&desc.checkpoint, &desc.config, &desc.layout);
    let moe_layers = cfg.moe_layers();
    // Layers whose whole state is a recurrent one (Kimi Delta Attention, Gated DeltaNet), not
    // DeepSeek-V4's windowed attention, whose bounded state sits beside its compressed entries.
    let recurrent = |a: &sluice_model::config::AttentionConfig| {
        a.recurrent_floats() > 0 && a.window().is_none()
    };
    // The attention kinds, those with a KV cache first.
    let mut kinds: Vec<(bool, &str)> = Vec::new();
    for p in &cfg.layer_plan {
        let k = (recurrent(&p.attention), p.attention.kind());
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    }
    kinds.sort_by_key(|k| k.0);
    let recurrent_layers = cfg
        .layer_plan
        .iter()
        .filter(|p| recurrent(&p.attention))
        .count();
    Ok(Inspection {
        dir: dir.display().to_string(),
        model_type: cfg.model_type.clone(),
        layers: cfg.layers,
        moe_layers,
        hidden: cfg.hidden,
        vocab: cfg.vocab,
        experts: cfg.moe.experts,
        zero_experts: cfg.moe.zero_experts,
        top_k: cfg.moe.top_k,
        attention: kinds.iter().map(|k| k.1).collect::<Vec<_>>().join("+"),
        full_attention_layers: cfg.layers - recurrent_layers,
        recurrent_layers,
        shared_kv_layers: cfg
            .layer_plan
            .iter()
            .filter(|p| p.attention.kv_source().is_some())
            .count(),
        attn_res_block_size: match cfg.residual {
            Residual::AttnRes { block_size } => Some(block_size),
            _ => None,
        },
        hyper_streams: match cfg.residual {
            Residual::Hyper(hc) => Some(hc.streams),
            _ => None,
        },
        hash_routed_layers: (0..cfg.layers).filter(|&l| cfg.is_hash_routed(l)).count(),
        compressed_attention: compressed_summary(cfg),
        mtp_layers: layout.mtp.as_ref().map_or(0, |m| m.layers.len()),
        mtp_bytes: layout.mtp.as_ref().map_or(0, |m| m.bytes()),
        mtp_drafts: sluice_model::mtp_runs(cfg, layout).is_ok(),
        shards: ck.shards().len(),
        checkpoint_bytes: ck.tensors().iter().map(|t| t.len).sum(),
        int8_bytes: block_bytes(ck, true),
        block_bytes_exact: block_bytes(ck, false),
        trunk_bytes: layout.trunk_bytes(),
        expert_bytes: layout.expert_bytes(),
        bytes_per_expert: plan.expert_bytes,
        expert_bytes_per_token: plan.expert_bytes * (cfg.moe.top_k * moe_layers) as u64,
        decode_touched_bytes_per_token: {
            let embed = layout.embed.bytes();
            let row = embed / cfg.vocab.max(1) as u64;
            layout.trunk_bytes() - embed + row + layout.expert_bytes_per_token(cfg.moe.top_k)
        },
        kv_bytes_per_position: kv_bytes_per_position(cfg),
        recurrent_bytes: recurrent_bytes(cfg),
        io_mode: shards.mode().name().to_owned(),
        plan: PlanSummary {
            budget: budget.unwrap_or(0),
            minimum: plan.minimum,
            trunk_pinned: plan.trunk_pinned,
            layers_pinned: plan.layers.iter().filter(|l| l.1).count(),
            embed_pinned: plan.embed.1,
            ring_slots: plan.ring_slots,
            ring_slot_bytes: plan.ring_slot_bytes,
            kv_cache: plan.kv_cache,
            context_fit: plan.context_fit,
            recurrent: plan.recurrent,
            context: plan.context,
            scratch: plan.scratch,
            chunk: plan.chunk,
            prefill_span: plan.prefill_span,
            span_bytes_per_token: plan.span_bytes_per_token,
            tokenizer: plan.text,
            expert_cache: plan.expert_cache,
            expert_cache_experts: plan.expert_cache / plan.expert_bytes.max(1),
            expert_cache_full_context: plan.expert_cache_full_context,
            expert_cache_full_context_experts: plan.expert_cache_full_context
                / plan.expert_bytes.max(1),
            expert_floor: plan.expert_floor,
            prefix_cache: plan.prefix_cache,
        },
    })
}

/// DeepSeek-V4's compressed attention, summed over the layers
/// ([`sluice_model::attention::compressed`]).
#[derive(Clone, Debug, Default, Serialize)]
pub struct CompressedSummary {
    /// Positions each query sees directly (the sliding window).
    pub window: usize,
    /// Layers with the window only.
    pub sliding_layers: usize,
    /// Layers that also see every entry of a compressor, and its window of positions per entry.
    pub heavy_layers: usize,
    /// Positions per entry of those layers.
    pub heavy_rate: usize,
    /// Layers that see an indexer's top-k of overlapping windows' entries.
    pub sparse_layers: usize,
    /// Positions per entry of those layers.
    pub sparse_rate: usize,
    /// Entries each query of those layers keeps.
    pub sparse_top_k: usize,
}

fn compressed_summary(cfg: &sluice_model::ModelConfig) -> Option<CompressedSummary> {
    use sluice_model::config::AttentionConfig;
    let mut s: Option<CompressedSummary> = None;
    for p in &cfg.layer_plan {
        let AttentionConfig::Compressed(c) = &p.attention else {
            continue;
        };
        let s = s.get_or_insert_with(CompressedSummary::default);
        s.window = c.window;
        match &c.compressor {
            None => s.sliding_layers += 1,
            Some(k) => match k.indexer {
                Some(i) => {
                    s.sparse_layers += 1;
                    (s.sparse_rate, s.sparse_top_k) = (k.rate, i.top_k);
                }
                None => {
                    s.heavy_layers += 1;
                    s.heavy_rate = k.rate;
                }
            },
        }
    }
    s
}

/// Bytes of the checkpoint's GGUF block tensors with (`int8`) or without an integer product.
fn block_bytes(ck: &sluice_format::Checkpoint, int8: bool) -> u64 {
    ck.tensors()
        .iter()
        .filter_map(|t| match sluice_kernels::Codes::for_dtype(t.dtype)? {
            sluice_kernels::Codes::Block(f) => {
                let has = sluice_kernels::int8::ActKind::for_format(f).is_some();
                (has == int8).then_some(t.len)
            }
            _ => None,
        })
        .sum()
}
