//! Strict reading of `config.json`.
//!
//! Every field that changes the arithmetic is read explicitly. A missing required field, an
//! unknown `model_type`, or a value this crate does not implement is an error naming the field.
//! Where transformers' configuration class has a default for an absent field, the same default
//! is used and the code says so next to the read (`or_default`); nothing else is assumed.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::ModelError;
use crate::quant::{self, Quantization};

mod kimi;

/// The architectures sluice implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// DeepSeek-V3 / Kimi K2 / K2.5 (`deepseek_v3`, `kimi_k2`).
    DeepseekV3,
    /// Qwen3-MoE (`qwen3_moe`).
    Qwen3Moe,
    /// Qwen2-MoE / Qwen1.5-MoE (`qwen2_moe`).
    Qwen2Moe,
    /// Mixtral (`mixtral`).
    Mixtral,
    /// OLMoE (`olmoe`).
    Olmoe,
    /// GPT-OSS (`gpt_oss`).
    GptOss,
    /// Kimi Linear (`kimi_linear`) and Kimi K3 (`kimi_k3`, a `kimi_linear` text model under
    /// `language_model.`): KDA linear attention mixed with MLA without rotary embeddings.
    KimiLinear,
}

impl Arch {
    /// The `model_type` strings accepted, for error messages.
    pub const KNOWN: &'static str =
        "deepseek_v3, kimi_k2, qwen3_moe, qwen2_moe, mixtral, olmoe, gpt_oss, kimi_linear, kimi_k3";

    /// Name as in `model_type`.
    pub fn name(self) -> &'static str {
        match self {
            Arch::DeepseekV3 => "deepseek_v3",
            Arch::Qwen3Moe => "qwen3_moe",
            Arch::Qwen2Moe => "qwen2_moe",
            Arch::Mixtral => "mixtral",
            Arch::Olmoe => "olmoe",
            Arch::GptOss => "gpt_oss",
            Arch::KimiLinear => "kimi_linear",
        }
    }
}

/// Rotary position embedding.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    /// Base θ.
    pub theta: f64,
    /// Rotated dimensions per head.
    pub dim: usize,
    /// Pairs are adjacent (`(x0, x1), (x2, x3)`) rather than split halves.
    pub interleaved: bool,
    /// Context-extension scaling.
    pub scaling: RopeScaling,
}

/// RoPE scaling variants implemented.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Position interpolation by a constant factor.
    Linear {
        /// The factor.
        factor: f64,
    },
    /// YaRN (as transformers computes it).
    Yarn {
        /// Extension factor.
        factor: f64,
        /// Pre-training context length.
        original_max_position_embeddings: f64,
        /// Fast boundary of the ramp.
        beta_fast: f64,
        /// Slow boundary of the ramp.
        beta_slow: f64,
        /// Explicit cos/sin factor, when given.
        attention_factor: Option<f64>,
        /// `mscale`, when given.
        mscale: Option<f64>,
        /// `mscale_all_dim`, when given.
        mscale_all_dim: Option<f64>,
        /// Whether the correction range is truncated to integers.
        truncate: bool,
    },
}

/// Which norm is applied to queries and keys before RoPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    /// None.
    None,
    /// RMSNorm over each head (`head_dim` weights): Qwen3.
    PerHead,
    /// RMSNorm over the whole projection: OLMoE.
    Full,
}

/// The attention of a layer.
#[derive(Clone, Debug, PartialEq)]
pub enum AttentionConfig {
    /// Grouped-query attention.
    Gqa {
        /// Query heads.
        heads: usize,
        /// Key/value heads.
        kv_heads: usize,
        /// Dimension per head.
        head_dim: usize,
        /// Biases on q, k, v.
        qkv_bias: bool,
        /// Bias on the output projection.
        o_bias: bool,
        /// Query/key norm.
        qk_norm: QkNorm,
        /// Clamp of q, k, v (OLMoE `clip_qkv`).
        clip_qkv: Option<f32>,
        /// Sliding window: a query at position q sees keys k with q − W < k ≤ q.
        sliding_window: Option<usize>,
        /// Which layers use the sliding window (`None`: all of them, when there is one).
        sliding_layers: Option<Vec<bool>>,
        /// A learned per-head sink logit joins each softmax and is dropped after it (GPT-OSS).
        sinks: bool,
    },
    /// Multi-head latent attention (DeepSeek-V2/V3).
    Mla {
        /// Heads.
        heads: usize,
        /// Query low-rank dimension (`None`: a full `q_proj`).
        q_lora_rank: Option<usize>,
        /// Latent key/value dimension.
        kv_lora_rank: usize,
        /// Per-head key/query dimension without rotary embedding.
        qk_nope_head_dim: usize,
        /// Per-head rotary dimension (one shared rotary key).
        qk_rope_head_dim: usize,
        /// Per-head value dimension.
        v_head_dim: usize,
        /// Bias on `q_a_proj`, `kv_a_proj_with_mqa` and `o_proj`.
        bias: bool,
        /// The rotary part is rotated (false: NoPE, as Kimi Linear and K3 — the part still
        /// exists, is cached and takes part in the scores, unrotated).
        rope: bool,
        /// The attention output is multiplied by `σ(g_proj x)` before `o_proj` (Kimi K3
        /// `mla_use_output_gate`).
        output_gate: bool,
    },
}

impl AttentionConfig {
    /// The sliding window of layer `l`, if it has one.
    pub fn window(&self, l: usize) -> Option<usize> {
        match self {
            AttentionConfig::Gqa {
                sliding_window,
                sliding_layers,
                ..
            } => sliding_window.filter(|_| {
                sliding_layers
                    .as_ref()
                    .is_none_or(|s| s.get(l).copied().unwrap_or(false))
            }),
            AttentionConfig::Mla { .. } => None,
        }
    }
}

/// How a router turns logits into expert choices.
#[derive(Clone, Debug, PartialEq)]
pub enum RouterKind {
    /// Softmax over all experts, top-k, optional renormalisation (Mixtral, Qwen, OLMoE).
    Softmax {
        /// Renormalise the top-k weights to sum to 1.
        norm_topk_prob: bool,
    },
    /// Sigmoid scores, a selection-only bias, group-limited top-k (DeepSeek-V3 `noaux_tc`).
    SigmoidGroup {
        /// Groups of experts.
        n_group: usize,
        /// Groups kept.
        topk_group: usize,
        /// Renormalise the top-k weights.
        norm_topk_prob: bool,
        /// Factor on the routed weights.
        routed_scaling_factor: f32,
    },
    /// Top-k of the logits (the router's bias added first), then a softmax over the k chosen
    /// (GPT-OSS).
    TopKSoftmax,
}

/// What a routed expert computes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ExpertActivation {
    /// `down(silu(gate x) ⊙ up x)`.
    SwiGlu,
    /// `down(situ(gate x, up x))` (Kimi K3's SiTU-GLU, see [`GluActivation::Situ`]).
    Situ {
        /// `activation_situ_beta`.
        beta: f32,
        /// `activation_situ_linear_beta`.
        linear_beta: Option<f32>,
    },
    /// GPT-OSS: gate and up interleaved in one projection with biases; `g = min(gate, limit)`,
    /// `u = clamp(up, −limit, limit)`, `down((u + 1) · g · σ(alpha · g)) + bias`.
    ClampedSwiGlu {
        /// Sigmoid gain (`swiglu_alpha`).
        alpha: f32,
        /// Clamp (`swiglu_limit`).
        limit: f32,
    },
}

/// The activation of a gated linear unit (dense layers and shared experts).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GluActivation {
    /// SwiGLU: `silu(g) · u`.
    Silu,
    /// SiTU-GLU: `β·tanh(g/β)·σ(g) · β_lin·tanh(u/β_lin)` (the up factor uncapped without
    /// `linear_beta`).
    Situ {
        /// `activation_situ_beta`.
        beta: f32,
        /// `activation_situ_linear_beta`.
        linear_beta: Option<f32>,
    },
}

/// Routed experts computed in a smaller latent space (Kimi K3): the token is projected down by
/// `routed_expert_down_proj`, the experts' weighted sum is (optionally) RMS-normalised and
/// projected back up by `routed_expert_up_proj`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatentMoe {
    /// The latent width (`routed_expert_hidden_size`).
    pub dim: usize,
    /// RMSNorm (`routed_expert_norm`, eps `rms_norm_eps`) on the aggregate.
    pub norm: bool,
}

/// What mixes tokens in a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerAttention {
    /// Softmax attention as [`ModelConfig::attention`] describes it, with a KV cache.
    Full,
    /// Kimi Delta Attention ([`ModelConfig::kda`]), with a fixed-size recurrent state.
    Kda,
}

/// How KDA's forget gate turns `z = f_b(f_a(x)) + dt_bias` into the log-decay `g` of each key
/// channel (`A` = `A_log[head]`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KdaGate {
    /// `g = −exp(A) · softplus(z)` (Kimi Linear).
    Softplus,
    /// `g = lower_bound · σ(exp(A) · z)` (Kimi K3, `gate_lower_bound`).
    LowerBound(f32),
}

/// Kimi Delta Attention (`linear_attn_config`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KdaConfig {
    /// Heads.
    pub heads: usize,
    /// Key and value dimension per head.
    pub head_dim: usize,
    /// Taps of the short causal convolutions on q, k and v.
    pub conv_kernel: usize,
    /// The forget gate.
    pub gate: KdaGate,
    /// The output gate is one full-rank `g_proj` (K3) rather than `g_b_proj(g_a_proj(x))`.
    pub full_rank_output_gate: bool,
}

impl KdaConfig {
    /// `heads × head_dim`.
    pub fn width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Floats of one layer's recurrent state: `heads × head_dim²`.
    pub fn state_len(&self) -> usize {
        self.heads * self.head_dim * self.head_dim
    }

    /// Floats of one layer's convolution state: the last `conv_kernel − 1` inputs of q, k, v.
    pub fn conv_len(&self) -> usize {
        3 * (self.conv_kernel - 1) * self.width()
    }
}

/// How layer outputs reach the next layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residual {
    /// `h ← h + f(norm(h))` around attention and around the feed-forward block.
    Add,
    /// Attention residuals (Kimi K3): layer outputs are summed within blocks of `block_size`
    /// layers; before attention, before the feed-forward block and before the final norm, the
    /// input is a softmax-weighted mix of the completed blocks' sums (and the embeddings) and the
    /// running sum of the current block, scored by `proj · RMSNorm(source)`.
    AttnRes {
        /// Layers per block (`attn_res_block_size`).
        block_size: usize,
    },
}

/// A shared expert added to the routed ones.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedExpert {
    /// Intermediate size.
    pub intermediate: usize,
    /// Scaled by `sigmoid(shared_expert_gate · x)` (Qwen2-MoE).
    pub gated: bool,
}

/// The mixture of experts of a layer.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    /// Routed experts.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Intermediate size of one routed expert.
    pub intermediate: usize,
    /// Routing.
    pub router: RouterKind,
    /// Shared expert, if any.
    pub shared: Option<SharedExpert>,
    /// What each routed expert computes.
    pub activation: ExpertActivation,
    /// Experts run in a latent space (Kimi K3).
    pub latent: Option<LatentMoe>,
}

impl MoeConfig {
    /// The width routed experts read and write: the latent width, or the hidden size.
    pub fn expert_width(&self, hidden: usize) -> usize {
        self.latent.map_or(hidden, |l| l.dim)
    }
}

/// The feed-forward block of a layer.
#[derive(Clone, Debug, PartialEq)]
pub enum MlpKind {
    /// A dense SwiGLU block.
    Dense {
        /// Intermediate size.
        intermediate: usize,
    },
    /// A mixture of experts.
    Moe,
}

/// A model's configuration, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Architecture.
    pub arch: Arch,
    /// Vocabulary size.
    pub vocab: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Number of layers.
    pub layers: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// lm_head shares the embedding matrix.
    pub tie_embeddings: bool,
    /// Maximum positions the model was configured for.
    pub max_positions: usize,
    /// Attention (the same for every layer).
    pub attention: AttentionConfig,
    /// Rotary embedding.
    pub rope: RopeConfig,
    /// Softmax scale of attention scores.
    pub softmax_scale: f32,
    /// Per layer: dense or MoE.
    pub mlp: Vec<MlpKind>,
    /// The MoE shape (for layers that have one).
    pub moe: MoeConfig,
    /// Beginning-of-sequence token, if configured.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens, if configured.
    pub eos_token_ids: Vec<u32>,
    /// How weights are stored (`quantization_config`).
    pub quant: Quantization,
    /// Prefix of every tensor name (`language_model.` for Kimi K3, else empty).
    pub prefix: String,
    /// Per layer: softmax attention or KDA.
    pub layer_attention: Vec<LayerAttention>,
    /// KDA's shape, when some layer uses it.
    pub kda: Option<KdaConfig>,
    /// How layer outputs are combined.
    pub residual: Residual,
    /// The activation of dense layers and shared experts.
    pub mlp_act: GluActivation,
    /// Draft layers after the last (`num_nextn_predict_layers`, DeepSeek-V3's multi-token
    /// prediction): their tensors may be in the checkpoint, and are not used.
    pub draft_layers: usize,
}

/// The largest value a size field of `config.json` may have (2^24 = 16,777,216): far above any
/// released model (the largest vocabularies are about 260,000) and small enough that a product
/// of two sizes cannot overflow, so a hostile config is refused before anything proportional to
/// it is allocated. Fields with their own limits are in [`limit_of`].
pub const MAX_SIZE: usize = 1 << 24;
/// The most layers a config may declare (released models have at most a few hundred).
pub const MAX_LAYERS: usize = 4096;
/// The most routed experts per layer (released models have at most a few hundred).
pub const MAX_EXPERTS: usize = 1 << 16;
/// The most positions a config may declare (2^32).
pub const MAX_POSITIONS: usize = 1 << 32;

/// The limit of the size field `field` (its name without any `text_config.` prefix).
pub fn limit_of(field: &str) -> usize {
    match field {
        "num_hidden_layers" => MAX_LAYERS,
        "n_routed_experts"
        | "num_experts"
        | "num_local_experts"
        | "num_experts_per_tok"
        | "num_experts_per_token"
        | "n_shared_experts"
        | "num_shared_experts"
        | "n_group"
        | "num_expert_group"
        | "topk_group" => MAX_EXPERTS,
        "max_position_embeddings" | "model_max_length" | "sliding_window" => MAX_POSITIONS,
        _ => MAX_SIZE,
    }
}

/// A JSON object with the file it came from, for error messages.
struct Cfg<'a> {
    v: &'a Value,
    file: &'a Path,
    prefix: String,
}

impl<'a> Cfg<'a> {
    fn err(&self, field: &str, msg: impl Into<String>) -> ModelError {
        ModelError::Config {
            file: self.file.to_path_buf(),
            field: format!("{}{field}", self.prefix),
            msg: msg.into(),
        }
    }

    fn get(&self, field: &str) -> Option<&'a Value> {
        self.v.get(field).filter(|v| !v.is_null())
    }

    fn req(&self, field: &str) -> Result<&'a Value, ModelError> {
        self.get(field)
            .ok_or_else(|| self.err(field, "required field is missing"))
    }

    /// A size field: a non-negative integer of at most [`MAX_SIZE`] (or the field's own limit
    /// from [`limit_of`]), so nothing proportional to it is allocated before it is checked.
    fn usize(&self, field: &str) -> Result<usize, ModelError> {
        let v = self.req(field)?;
        let n = v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| self.err(field, format!("expected a non-negative integer, got {v}")))?;
        let max = limit_of(field);
        if n > max {
            return Err(self.err(
                field,
                format!("{n} is more than the {max} sluice accepts for this field"),
            ));
        }
        Ok(n)
    }

    fn opt_usize(&self, field: &str) -> Result<Option<usize>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(_) => self.usize(field).map(Some),
        }
    }

    fn pos_usize(&self, field: &str) -> Result<usize, ModelError> {
        let n = self.usize(field)?;
        if n == 0 {
            return Err(self.err(field, "must be positive"));
        }
        Ok(n)
    }

    fn f64(&self, field: &str) -> Result<f64, ModelError> {
        let v = self.req(field)?;
        v.as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| self.err(field, format!("expected a number, got {v}")))
    }

    fn opt_f64(&self, field: &str) -> Result<Option<f64>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(_) => self.f64(field).map(Some),
        }
    }

    /// A number used as an `f32`: finite as an `f32` too (`1e308` is refused, not made ∞).
    fn f32(&self, field: &str) -> Result<f32, ModelError> {
        let x = self.f64(field)?;
        let y = x as f32;
        if !y.is_finite() {
            return Err(self.err(field, format!("{x} does not fit in a 32-bit float")));
        }
        Ok(y)
    }

    fn opt_f32(&self, field: &str) -> Result<Option<f32>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(_) => self.f32(field).map(Some),
        }
    }

    /// A positive `f32` (an epsilon, a scaling factor): 0, negative values and values that
    /// underflow to 0 as an `f32` are refused.
    fn pos_f32(&self, field: &str) -> Result<f32, ModelError> {
        let y = self.f32(field)?;
        if y <= 0.0 {
            return Err(self.err(field, format!("{} must be positive", self.f64(field)?)));
        }
        Ok(y)
    }

    fn bool_or(&self, field: &str, default: bool) -> Result<bool, ModelError> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.err(field, format!("expected true or false, got {v}"))),
        }
    }

    fn str(&self, field: &str) -> Result<&'a str, ModelError> {
        let v = self.req(field)?;
        v.as_str()
            .ok_or_else(|| self.err(field, format!("expected a string, got {v}")))
    }

    fn expect_str(&self, field: &str, default: &str, allowed: &[&str]) -> Result<(), ModelError> {
        let s = match self.get(field) {
            None => default,
            Some(_) => self.str(field)?,
        };
        if !allowed.contains(&s) {
            return Err(self.err(
                field,
                format!("`{s}` is not supported (supported: {})", allowed.join(", ")),
            ));
        }
        Ok(())
    }

    fn token_ids(&self, field: &str) -> Result<Vec<u32>, ModelError> {
        match self.get(field) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| self.err(field, "expected token ids"))
                })
                .collect(),
            Some(v) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .map(|n| vec![n])
                .ok_or_else(|| self.err(field, format!("expected a token id, got {v}"))),
        }
    }
}

impl ModelConfig {
    /// Reads `config.json` (already parsed) strictly. `file` names it in errors.
    pub fn from_json(v: &Value, file: &Path) -> Result<ModelConfig, ModelError> {
        let c = Cfg {
            v,
            file,
            prefix: String::new(),
        };
        if !v.is_object() {
            return Err(c.err("", "top level is not an object"));
        }
        let model_type = c.str("model_type")?;
        if matches!(model_type, "kimi_linear" | "kimi_k3") {
            return kimi::read(&c, model_type == "kimi_k3");
        }
        let arch = match model_type {
            "deepseek_v3" | "kimi_k2" => Arch::DeepseekV3,
            "qwen3_moe" => Arch::Qwen3Moe,
            "qwen2_moe" => Arch::Qwen2Moe,
            "mixtral" => Arch::Mixtral,
            "olmoe" => Arch::Olmoe,
            "gpt_oss" => Arch::GptOss,
            other => {
                return Err(c.err(
                    "model_type",
                    format!("`{other}` is not supported (supported: {})", Arch::KNOWN),
                ));
            }
        };
        let quant = match c.get("quantization_config") {
            Some(q) => quant::read(q, file, arch == Arch::GptOss)?,
            None => Quantization::None,
        };
        c.expect_str("hidden_act", "silu", &["silu"])?;
        let vocab = c.pos_usize("vocab_size")?;
        let hidden = c.pos_usize("hidden_size")?;
        let layers = c.pos_usize("num_hidden_layers")?;
        let eps = c.pos_f32("rms_norm_eps")?;
        let heads = c.pos_usize("num_attention_heads")?;
        let max_positions = c.pos_usize("max_position_embeddings")?;
        // transformers' default for every architecture here is `false`.
        let tie_embeddings = c.bool_or("tie_word_embeddings", false)?;

        let (attention, rope_dim, interleaved, qk_head_dim) = match arch {
            Arch::DeepseekV3 => {
                let q_lora_rank = c.opt_usize("q_lora_rank")?;
                let kv_lora_rank = c.pos_usize("kv_lora_rank")?;
                let nope = c.pos_usize("qk_nope_head_dim")?;
                let rope = c.pos_usize("qk_rope_head_dim")?;
                let v_head_dim = c.pos_usize("v_head_dim")?;
                if let Some(kvh) = c.opt_usize("num_key_value_heads")?
                    && kvh != heads
                {
                    return Err(c.err(
                        "num_key_value_heads",
                        format!(
                            "{kvh} differs from num_attention_heads {heads}; MLA has one latent"
                        ),
                    ));
                }
                if !rope.is_multiple_of(2) {
                    return Err(c.err("qk_rope_head_dim", "must be even"));
                }
                // transformers default: rope_interleave = true; attention_bias = false.
                let interleaved = c.bool_or("rope_interleave", true)?;
                let bias = c.bool_or("attention_bias", false)?;
                let att = AttentionConfig::Mla {
                    heads,
                    q_lora_rank,
                    kv_lora_rank,
                    qk_nope_head_dim: nope,
                    qk_rope_head_dim: rope,
                    v_head_dim,
                    bias,
                    rope: true,
                    output_gate: false,
                };
                (att, rope, interleaved, nope + rope)
            }
            _ => {
                let kv_heads = c.pos_usize("num_key_value_heads")?;
                if !heads.is_multiple_of(kv_heads) {
                    return Err(c.err(
                        "num_key_value_heads",
                        format!("{kv_heads} does not divide num_attention_heads {heads}"),
                    ));
                }
                let head_dim = match c.opt_usize("head_dim")? {
                    Some(0) => return Err(c.err("head_dim", "must be positive")),
                    Some(d) => d,
                    None if arch == Arch::Qwen3Moe => {
                        return Err(c.err("head_dim", "required field is missing"));
                    }
                    None => {
                        if !hidden.is_multiple_of(heads) {
                            return Err(c.err(
                                "head_dim",
                                "missing, and hidden_size is not a multiple of num_attention_heads",
                            ));
                        }
                        hidden / heads
                    }
                };
                if !head_dim.is_multiple_of(2) {
                    return Err(c.err("head_dim", "must be even"));
                }
                let (qkv_bias, o_bias) = match arch {
                    // transformers default: qkv_bias = true.
                    Arch::Qwen2Moe => (c.bool_or("qkv_bias", true)?, false),
                    Arch::Mixtral => (false, false),
                    // transformers default: attention_bias = true.
                    Arch::GptOss => {
                        let b = c.bool_or("attention_bias", true)?;
                        (b, b)
                    }
                    _ => {
                        let b = c.bool_or("attention_bias", false)?;
                        (b, b)
                    }
                };
                let qk_norm = match arch {
                    Arch::Qwen3Moe => QkNorm::PerHead,
                    Arch::Olmoe => QkNorm::Full,
                    _ => QkNorm::None,
                };
                let clip_qkv = if arch == Arch::Olmoe {
                    c.opt_f32("clip_qkv")?
                } else {
                    None
                };
                let mut sliding_layers = None;
                let sliding_window = match arch {
                    Arch::Mixtral => c.opt_usize("sliding_window")?,
                    Arch::GptOss => {
                        let kinds = read_layer_types(&c, layers)?;
                        let w = c.opt_usize("sliding_window")?;
                        if w.is_none() && kinds.iter().any(|&s| s) {
                            return Err(c.err(
                                "sliding_window",
                                "missing, and layer_types has sliding_attention layers",
                            ));
                        }
                        sliding_layers = Some(kinds);
                        w
                    }
                    Arch::Qwen2Moe | Arch::Qwen3Moe => {
                        if c.bool_or("use_sliding_window", false)? {
                            return Err(c.err(
                                "use_sliding_window",
                                "sliding-window layers are not supported for this architecture",
                            ));
                        }
                        None
                    }
                    _ => None,
                };
                if sliding_window == Some(0) {
                    return Err(c.err("sliding_window", "must be positive"));
                }
                let att = AttentionConfig::Gqa {
                    heads,
                    kv_heads,
                    head_dim,
                    qkv_bias,
                    o_bias,
                    qk_norm,
                    clip_qkv,
                    sliding_window,
                    sliding_layers,
                    sinks: arch == Arch::GptOss,
                };
                (att, head_dim, false, head_dim)
            }
        };

        let (rope, yarn_mscale_all) = read_rope(&c, rope_dim, interleaved, max_positions)?;
        let mut softmax_scale = (qk_head_dim as f64).powf(-0.5);
        if arch == Arch::DeepseekV3
            && let Some((factor, all)) = yarn_mscale_all
        {
            let m = yarn_get_mscale(factor, all);
            softmax_scale = softmax_scale * m * m;
        }

        let (moe, mlp) = read_moe(&c, arch, layers)?;
        let bos_token_id = c.token_ids("bos_token_id")?.first().copied();
        let eos_token_ids = c.token_ids("eos_token_id")?;
        let cfg = ModelConfig {
            arch,
            vocab,
            hidden,
            layers,
            eps,
            tie_embeddings,
            max_positions,
            attention,
            rope,
            softmax_scale: softmax_scale as f32,
            mlp,
            moe,
            bos_token_id,
            eos_token_ids,
            quant,
            prefix: String::new(),
            layer_attention: vec![LayerAttention::Full; layers],
            kda: None,
            residual: Residual::Add,
            mlp_act: GluActivation::Silu,
            draft_layers: c.opt_usize("num_nextn_predict_layers")?.unwrap_or(0),
        };
        check_widths(&c, &cfg)?;
        Ok(cfg)
    }

    /// Reads and validates `config.json` from a file.
    pub fn from_file(path: &Path) -> Result<ModelConfig, ModelError> {
        let v = sluice_format::read_json(path, 16 << 20)?;
        ModelConfig::from_json(&v, path)
    }

    /// Whether layer `l` has a mixture of experts.
    pub fn is_moe(&self, l: usize) -> bool {
        matches!(self.mlp.get(l), Some(MlpKind::Moe))
    }

    /// Whether layer `l` mixes tokens with Kimi Delta Attention.
    pub fn is_kda(&self, l: usize) -> bool {
        matches!(self.layer_attention.get(l), Some(LayerAttention::Kda))
    }

    /// Layers with softmax attention (and a KV cache).
    pub fn full_attention_layers(&self) -> usize {
        self.layer_attention
            .iter()
            .filter(|a| **a == LayerAttention::Full)
            .count()
    }
}

/// transformers' `yarn_get_mscale`.
pub fn yarn_get_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

/// Reads rope parameters from `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling`
/// (older configs). Returns the config and, for YaRN with `mscale_all_dim`, (factor, mscale_all_dim).
fn read_rope(
    c: &Cfg<'_>,
    dim: usize,
    interleaved: bool,
    max_positions: usize,
) -> Result<(RopeConfig, Option<(f64, f64)>), ModelError> {
    let (params, prefix) = match c.get("rope_parameters") {
        Some(p) => (Some(p), "rope_parameters."),
        None => (c.get("rope_scaling"), "rope_scaling."),
    };
    let p = params.map(|v| Cfg {
        v,
        file: c.file,
        prefix: prefix.to_owned(),
    });
    let theta = match p.as_ref().and_then(|p| p.get("rope_theta")) {
        Some(_) => p
            .as_ref()
            .map(|p| p.f64("rope_theta"))
            .transpose()?
            .unwrap_or(0.0),
        None => c.f64("rope_theta")?,
    };
    if theta <= 0.0 {
        return Err(c.err("rope_theta", "must be positive"));
    }
    let Some(p) = p else {
        return Ok((
            RopeConfig {
                theta,
                dim,
                interleaved,
                scaling: RopeScaling::None,
            },
            None,
        ));
    };
    if !p.v.is_object() {
        return Err(c.err(prefix.trim_end_matches('.'), "expected an object"));
    }
    let ty = match (p.get("rope_type"), p.get("type")) {
        (Some(_), _) => p.str("rope_type")?,
        (None, Some(_)) => p.str("type")?,
        (None, None) => "default",
    };
    if let Some(f) = p.opt_f64("partial_rotary_factor")?
        && f != 1.0
    {
        return Err(p.err(
            "partial_rotary_factor",
            format!("{f} is not supported (only 1.0)"),
        ));
    }
    let mut extra = None;
    let scaling = match ty {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: p.f64("factor")?,
        },
        "yarn" => {
            let factor = p.f64("factor")?;
            let original = match p.opt_f64("original_max_position_embeddings")? {
                Some(o) => o,
                // transformers: falls back to max_position_embeddings.
                None => max_positions as f64,
            };
            let mscale = p.opt_f64("mscale")?;
            let mscale_all_dim = p.opt_f64("mscale_all_dim")?;
            if let Some(all) = mscale_all_dim
                && all != 0.0
            {
                extra = Some((factor, all));
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original,
                // transformers: `or 32` / `or 1` (a zero counts as absent).
                beta_fast: p
                    .opt_f64("beta_fast")?
                    .filter(|&b| b != 0.0)
                    .unwrap_or(32.0),
                beta_slow: p.opt_f64("beta_slow")?.filter(|&b| b != 0.0).unwrap_or(1.0),
                attention_factor: p.opt_f64("attention_factor")?,
                mscale,
                mscale_all_dim,
                truncate: p.bool_or("truncate", true)?,
            }
        }
        other => {
            let field = if p.get("rope_type").is_some() {
                "rope_type"
            } else {
                "type"
            };
            return Err(p.err(
                field,
                format!("`{other}` is not supported (supported: default, linear, yarn)"),
            ));
        }
    };
    Ok((
        RopeConfig {
            theta,
            dim,
            interleaved,
            scaling,
        },
        extra,
    ))
}

fn read_moe(
    c: &Cfg<'_>,
    arch: Arch,
    layers: usize,
) -> Result<(MoeConfig, Vec<MlpKind>), ModelError> {
    let top_k = c.pos_usize("num_experts_per_tok")?;
    let (experts, intermediate) = match arch {
        Arch::KimiLinear => {
            return Err(ModelError::Internal(
                "kimi_linear is read by its own reader".into(),
            ));
        }
        Arch::DeepseekV3 => (
            c.pos_usize("n_routed_experts")?,
            c.pos_usize("moe_intermediate_size")?,
        ),
        Arch::Qwen3Moe | Arch::Qwen2Moe => {
            // Hub configs say `num_experts`; transformers 5 writes `num_local_experts` for Qwen3.
            let n = if c.get("num_experts").is_some() {
                c.pos_usize("num_experts")?
            } else {
                c.pos_usize("num_local_experts")?
            };
            (n, c.pos_usize("moe_intermediate_size")?)
        }
        Arch::Mixtral => (
            c.pos_usize("num_local_experts")?,
            c.pos_usize("intermediate_size")?,
        ),
        Arch::Olmoe => (
            c.pos_usize("num_experts")?,
            c.pos_usize("intermediate_size")?,
        ),
        // transformers maps `num_experts` to `num_local_experts`.
        Arch::GptOss => {
            let n = if c.get("num_local_experts").is_some() {
                c.pos_usize("num_local_experts")?
            } else {
                c.pos_usize("num_experts")?
            };
            (n, c.pos_usize("intermediate_size")?)
        }
    };
    if top_k > experts {
        return Err(c.err(
            "num_experts_per_tok",
            format!("{top_k} is more than the {experts} experts"),
        ));
    }
    let router = match arch {
        Arch::DeepseekV3 => {
            c.expect_str("scoring_func", "sigmoid", &["sigmoid"])?;
            c.expect_str("topk_method", "noaux_tc", &["noaux_tc"])?;
            let n_group = c.pos_usize("n_group")?;
            let topk_group = c.pos_usize("topk_group")?;
            if !experts.is_multiple_of(n_group) {
                return Err(c.err(
                    "n_group",
                    format!("{n_group} does not divide the {experts} experts"),
                ));
            }
            if topk_group > n_group {
                return Err(c.err(
                    "topk_group",
                    format!("{topk_group} is more than n_group {n_group}"),
                ));
            }
            if experts / n_group < 2 {
                return Err(c.err(
                    "n_group",
                    "groups need at least 2 experts (group score = sum of the top 2)",
                ));
            }
            if top_k > topk_group * (experts / n_group) {
                return Err(c.err(
                    "num_experts_per_tok",
                    "more than the experts in the kept groups",
                ));
            }
            RouterKind::SigmoidGroup {
                n_group,
                topk_group,
                norm_topk_prob: c.bool_or("norm_topk_prob", true)?,
                routed_scaling_factor: c.pos_f32("routed_scaling_factor")?,
            }
        }
        Arch::GptOss => RouterKind::TopKSoftmax,
        // Mixtral always renormalises.
        Arch::Mixtral => RouterKind::Softmax {
            norm_topk_prob: true,
        },
        // transformers default: norm_topk_prob = false (Qwen2, OLMoE), true (Qwen3).
        Arch::Qwen3Moe => RouterKind::Softmax {
            norm_topk_prob: c.bool_or("norm_topk_prob", true)?,
        },
        _ => RouterKind::Softmax {
            norm_topk_prob: c.bool_or("norm_topk_prob", false)?,
        },
    };
    let shared = match arch {
        Arch::DeepseekV3 => {
            let n = c.usize("n_shared_experts")?;
            (n > 0)
                .then(|| shared_width(c, "n_shared_experts", n, intermediate))
                .transpose()?
                .map(|intermediate| SharedExpert {
                    intermediate,
                    gated: false,
                })
        }
        Arch::Qwen2Moe => {
            let n = c.usize("shared_expert_intermediate_size")?;
            (n > 0).then_some(SharedExpert {
                intermediate: n,
                gated: true,
            })
        }
        _ => None,
    };
    let mlp = match arch {
        Arch::DeepseekV3 => {
            let first_dense = c.usize("first_k_dense_replace")?;
            if let Some(f) = c.opt_usize("moe_layer_freq")?
                && f != 1
            {
                return Err(c.err("moe_layer_freq", format!("{f} is not supported (only 1)")));
            }
            let dense = c.pos_usize("intermediate_size")?;
            (0..layers)
                .map(|l| {
                    if l < first_dense {
                        MlpKind::Dense {
                            intermediate: dense,
                        }
                    } else {
                        MlpKind::Moe
                    }
                })
                .collect()
        }
        Arch::Qwen3Moe | Arch::Qwen2Moe => {
            let step = match c.opt_usize("decoder_sparse_step")? {
                Some(0) => return Err(c.err("decoder_sparse_step", "must be positive")),
                Some(s) => s,
                None => 1, // transformers default
            };
            let only: Vec<usize> = match c.get("mlp_only_layers") {
                None => Vec::new(),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|x| {
                        x.as_u64()
                            .map(|n| n as usize)
                            .ok_or_else(|| c.err("mlp_only_layers", "expected layer indices"))
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err(c.err("mlp_only_layers", "expected a list of layer indices")),
            };
            let dense = if only.is_empty() && step == 1 {
                0
            } else {
                c.pos_usize("intermediate_size")?
            };
            (0..layers)
                .map(|l| {
                    if !only.contains(&l) && (l + 1).is_multiple_of(step) {
                        MlpKind::Moe
                    } else {
                        MlpKind::Dense {
                            intermediate: dense,
                        }
                    }
                })
                .collect()
        }
        _ => vec![MlpKind::Moe; layers],
    };
    let activation = match arch {
        Arch::GptOss => {
            // transformers defaults (GPT-OSS releases set only the limit).
            let alpha = c.opt_f32("swiglu_alpha")?.unwrap_or(1.702);
            let limit = c.opt_f32("swiglu_limit")?.unwrap_or(7.0);
            if limit <= 0.0 {
                return Err(c.err("swiglu_limit", "must be positive"));
            }
            ExpertActivation::ClampedSwiGlu { alpha, limit }
        }
        _ => ExpertActivation::SwiGlu,
    };
    Ok((
        MoeConfig {
            experts,
            top_k,
            intermediate,
            router,
            shared,
            activation,
            latent: None,
        },
        mlp,
    ))
}

/// `n` shared experts of `intermediate` each, as one MLP: refused, naming `field`, when the
/// product is more than [`MAX_SIZE`].
fn shared_width(
    c: &Cfg<'_>,
    field: &str,
    n: usize,
    intermediate: usize,
) -> Result<usize, ModelError> {
    n.checked_mul(intermediate)
        .filter(|&w| w <= MAX_SIZE)
        .ok_or_else(|| {
            c.err(
                field,
                format!(
                    "{n} shared experts of {intermediate} make an MLP wider than the {MAX_SIZE} \
                     sluice accepts"
                ),
            )
        })
}

/// Checks the widths the model's arithmetic multiplies out (attention projections, KDA), so
/// that no shape product can overflow: each must be at most [`MAX_SIZE`].
fn check_widths(c: &Cfg<'_>, cfg: &ModelConfig) -> Result<(), ModelError> {
    let too_wide = |field: &str, what: &str| {
        c.err(
            field,
            format!("{what} is wider than the {MAX_SIZE} sluice accepts"),
        )
    };
    let width = |a: usize, b: usize| a.checked_mul(b).filter(|&w| w <= MAX_SIZE);
    match &cfg.attention {
        AttentionConfig::Gqa {
            heads, head_dim, ..
        } => {
            width(*heads, *head_dim)
                .ok_or_else(|| too_wide("num_attention_heads", "num_attention_heads × head_dim"))?;
        }
        AttentionConfig::Mla {
            heads,
            qk_nope_head_dim,
            qk_rope_head_dim,
            v_head_dim,
            ..
        } => {
            width(*heads, qk_nope_head_dim + qk_rope_head_dim + v_head_dim).ok_or_else(|| {
                too_wide(
                    "num_attention_heads",
                    "num_attention_heads × (qk_nope_head_dim + qk_rope_head_dim + v_head_dim)",
                )
            })?;
        }
    }
    if let Some(k) = &cfg.kda {
        width(k.heads, k.head_dim).ok_or_else(|| {
            too_wide(
                "linear_attn_config.num_heads",
                "linear_attn_config num_heads × head_dim",
            )
        })?;
    }
    Ok(())
}

/// GPT-OSS `layer_types`: true for `sliding_attention`. transformers' default when absent:
/// even layers slide, odd layers are full.
fn read_layer_types(c: &Cfg<'_>, layers: usize) -> Result<Vec<bool>, ModelError> {
    match c.get("layer_types") {
        None => Ok((0..layers).map(|l| l % 2 == 0).collect()),
        Some(Value::Array(a)) => {
            if a.len() != layers {
                return Err(c.err(
                    "layer_types",
                    format!("{} entries for {layers} layers", a.len()),
                ));
            }
            a.iter()
                .map(|x| match x.as_str() {
                    Some("sliding_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    _ => Err(c.err(
                        "layer_types",
                        format!(
                            "`{x}` is not supported (supported: sliding_attention, full_attention)"
                        ),
                    )),
                })
                .collect()
        }
        Some(v) => Err(c.err("layer_types", format!("expected a list, got {v}"))),
    }
}

/// The path of `config.json` in a model directory.
pub fn config_path(dir: &Path) -> PathBuf {
    dir.join("config.json")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ds() -> Value {
        json!({
            "model_type": "deepseek_v3", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 3,
            "rms_norm_eps": 1e-6, "num_attention_heads": 4, "num_key_value_heads": 4,
            "max_position_embeddings": 256, "q_lora_rank": 32, "kv_lora_rank": 32,
            "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "hidden_act": "silu",
            "rope_theta": 10000.0, "num_experts_per_tok": 4, "n_routed_experts": 16,
            "moe_intermediate_size": 32, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
            "n_shared_experts": 1, "first_k_dense_replace": 1, "intermediate_size": 128,
            "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                             "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}
        })
    }

    fn parse(v: &Value) -> Result<ModelConfig, ModelError> {
        ModelConfig::from_json(v, Path::new("config.json"))
    }

    fn field_of(e: ModelError) -> String {
        match e {
            ModelError::Config { field, .. } => field,
            e => panic!("not a config error: {e}"),
        }
    }

    #[test]
    fn deepseek_reads() {
        let c = parse(&ds()).unwrap();
        assert_eq!(c.arch, Arch::DeepseekV3);
        assert_eq!(c.mlp[0], MlpKind::Dense { intermediate: 128 });
        assert!(c.is_moe(1) && c.is_moe(2));
        let m = yarn_get_mscale(4.0, 1.0);
        assert!((c.softmax_scale as f64 - 24f64.powf(-0.5) * m * m).abs() < 1e-7);
        assert!(matches!(
            c.rope.scaling,
            RopeScaling::Yarn { factor: 4.0, .. }
        ));
        assert!(c.rope.interleaved);
        assert_eq!(c.rope.dim, 8);
    }

    #[test]
    fn missing_field_is_named() {
        for f in [
            "hidden_size",
            "kv_lora_rank",
            "n_group",
            "routed_scaling_factor",
            "rms_norm_eps",
        ] {
            let mut v = ds();
            v.as_object_mut().unwrap().remove(f);
            let e = parse(&v).unwrap_err();
            assert!(e.to_string().contains(f), "{e}");
            assert_eq!(field_of(e), f);
        }
    }

    #[test]
    fn unsupported_values_are_named() {
        let mut v = ds();
        v["model_type"] = json!("llama");
        assert_eq!(field_of(parse(&v).unwrap_err()), "model_type");
        let mut v = ds();
        v["hidden_act"] = json!("gelu");
        let e = parse(&v).unwrap_err();
        assert!(e.to_string().contains("gelu"), "{e}");
        let mut v = ds();
        v["rope_scaling"]["type"] = json!("dynamic");
        assert_eq!(field_of(parse(&v).unwrap_err()), "rope_scaling.type");
        let mut v = ds();
        v["scoring_func"] = json!("softmax");
        assert_eq!(field_of(parse(&v).unwrap_err()), "scoring_func");
        let mut v = ds();
        v["n_group"] = json!(3);
        assert_eq!(field_of(parse(&v).unwrap_err()), "n_group");
        let mut v = ds();
        v["hidden_size"] = json!("64");
        assert_eq!(field_of(parse(&v).unwrap_err()), "hidden_size");
        let mut v = ds();
        v["quantization_config"] = json!({"quant_method": "gptq"});
        assert_eq!(
            field_of(parse(&v).unwrap_err()),
            "quantization_config.quant_method"
        );
    }

    fn gpt_oss() -> Value {
        json!({
            "model_type": "gpt_oss", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 4,
            "rms_norm_eps": 1e-5, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "max_position_embeddings": 256, "hidden_act": "silu", "num_local_experts": 8,
            "num_experts_per_tok": 2, "intermediate_size": 32, "sliding_window": 8,
            "swiglu_limit": 7.0, "rope_theta": 150000.0,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                             "beta_slow": 1.0, "truncate": false,
                             "original_max_position_embeddings": 64},
            "quantization_config": {"quant_method": "mxfp4",
                "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}
        })
    }

    #[test]
    fn gpt_oss_reads() {
        let c = parse(&gpt_oss()).unwrap();
        assert_eq!(c.arch, Arch::GptOss);
        assert_eq!(c.moe.router, RouterKind::TopKSoftmax);
        assert_eq!(
            c.moe.activation,
            ExpertActivation::ClampedSwiGlu {
                alpha: 1.702,
                limit: 7.0
            }
        );
        assert_eq!(c.quant.method(), "mxfp4");
        // transformers' default layer_types: even layers slide.
        assert_eq!(
            (0..4).map(|l| c.attention.window(l)).collect::<Vec<_>>(),
            [Some(8), None, Some(8), None]
        );
        let AttentionConfig::Gqa {
            qkv_bias,
            o_bias,
            sinks,
            ..
        } = c.attention
        else {
            panic!()
        };
        assert!(qkv_bias && o_bias && sinks);
        assert!(!c.rope.interleaved);
        assert!((c.softmax_scale - 0.25).abs() < 1e-7);
        let mut v = gpt_oss();
        v["layer_types"] = json!(["full_attention", "sliding_attention", "full_attention"]);
        assert_eq!(field_of(parse(&v).unwrap_err()), "layer_types");
        let mut v = gpt_oss();
        v["layer_types"] = json!([
            "full_attention",
            "chunked_attention",
            "full_attention",
            "full_attention"
        ]);
        assert_eq!(field_of(parse(&v).unwrap_err()), "layer_types");
        let mut v = gpt_oss();
        v["quantization_config"] = json!({"quant_method": "fp8", "weight_block_size": [128, 128]});
        assert_eq!(
            field_of(parse(&v).unwrap_err()),
            "quantization_config.quant_method"
        );
    }

    #[test]
    fn rope_parameters_form() {
        let mut v = ds();
        let o = v.as_object_mut().unwrap();
        o.remove("rope_scaling");
        o.remove("rope_theta");
        o.insert(
            "rope_parameters".into(),
            json!({"rope_type": "default", "rope_theta": 5e4}),
        );
        let c = parse(&v).unwrap();
        assert_eq!(c.rope.theta, 5e4);
        assert_eq!(c.rope.scaling, RopeScaling::None);
        assert!((c.softmax_scale - 24f32.powf(-0.5)).abs() < 1e-7);
    }

    /// Found by the `model_config` fuzz target (docs/RELIABILITY.md): `"head_dim": 0` is even,
    /// so it used to be accepted, giving a softmax scale of 0^-0.5 = infinity and zero-width
    /// heads. It is refused, naming the field, for every GQA architecture.
    #[test]
    fn zero_head_dim_is_refused() {
        let mut v = gpt_oss();
        v["head_dim"] = json!(0);
        let e = parse(&v).unwrap_err();
        assert!(e.to_string().contains("must be positive"), "{e}");
        assert_eq!(field_of(e), "head_dim");
        for model_type in ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"] {
            let mut v = gpt_oss();
            let o = v.as_object_mut().unwrap();
            o.remove("quantization_config");
            o.remove("rope_scaling");
            o.remove("sliding_window");
            o.remove("swiglu_limit");
            o.insert("model_type".into(), json!(model_type));
            o.insert("moe_intermediate_size".into(), json!(32));
            o.insert("num_experts".into(), json!(8));
            o.insert("shared_expert_intermediate_size".into(), json!(32));
            assert!(parse(&v).is_ok(), "{model_type}: {:?}", parse(&v).err());
            v["head_dim"] = json!(0);
            assert_eq!(field_of(parse(&v).unwrap_err()), "head_dim", "{model_type}");
        }
    }

    /// Issue 18 class 2: sizes are checked before anything proportional to them is allocated,
    /// shape products cannot wrap, and floats must fit an f32 and be positive where they scale.
    #[test]
    fn hostile_sizes_and_floats_are_refused_naming_the_field() {
        let cases: Vec<(&str, Value, &str)> = vec![
            (
                "num_hidden_layers",
                json!(1_000_000_000u64),
                "num_hidden_layers",
            ),
            ("num_hidden_layers", json!(u64::MAX), "num_hidden_layers"),
            (
                "n_shared_experts",
                json!(1_000_000_000_000_000_000u64),
                "n_shared_experts",
            ),
            ("n_routed_experts", json!(1u64 << 40), "n_routed_experts"),
            ("vocab_size", json!(1u64 << 25), "vocab_size"),
            (
                "max_position_embeddings",
                json!(1u64 << 40),
                "max_position_embeddings",
            ),
            ("rms_norm_eps", json!(1e308), "rms_norm_eps"),
            ("rms_norm_eps", json!(-1e-6), "rms_norm_eps"),
            ("rms_norm_eps", json!(0.0), "rms_norm_eps"),
            ("rms_norm_eps", json!(1e-300), "rms_norm_eps"),
            (
                "routed_scaling_factor",
                json!(-2.5),
                "routed_scaling_factor",
            ),
            (
                "routed_scaling_factor",
                json!(1e39),
                "routed_scaling_factor",
            ),
            (
                "num_attention_heads",
                json!(1u64 << 20),
                "num_attention_heads",
            ),
        ];
        for (field, value, named) in cases {
            let mut v = ds();
            v[field] = value.clone();
            if field == "num_attention_heads" {
                v["num_key_value_heads"] = value.clone(); // MLA: one latent for all heads
            }
            let e = parse(&v).unwrap_err();
            assert_eq!(field_of(e), named, "{field} = {value}");
        }
        // n_shared_experts × moe_intermediate_size beyond MAX_SIZE (it used to wrap).
        let mut v = ds();
        v["n_shared_experts"] = json!(MAX_EXPERTS);
        v["moe_intermediate_size"] = json!(MAX_SIZE);
        let e = parse(&v).unwrap_err();
        assert!(e.to_string().contains("wider"), "{e}");
        assert_eq!(field_of(e), "n_shared_experts");
        // GPT-OSS's clamp and the Kimi floats go through the same checks.
        let mut v = gpt_oss();
        v["swiglu_limit"] = json!(1e300);
        assert_eq!(field_of(parse(&v).unwrap_err()), "swiglu_limit");
        // The largest accepted values still parse.
        let mut v = ds();
        v["num_hidden_layers"] = json!(MAX_LAYERS);
        assert!(parse(&v).is_ok(), "{:?}", parse(&v).err());
    }
}
