//! The typed description of a model, read strictly from `config.json`.
//!
//! Every field that changes the arithmetic is read explicitly, by the model's family (one
//! module per family under [`crate::arch`]; the registry there maps `model_type` to it). A
//! missing required field, an unknown `model_type`, or a value sluice does not implement is an
//! error naming the field. Where transformers' configuration class has a default for an absent
//! field, the same default is used and the code says so next to the read (`or_default`);
//! nothing else is assumed. Outside `arch/`, the model crate works from this description
//! alone: it never asks which family a model is.

use std::path::{Path, PathBuf};

use crate::ModelError;
use crate::quant::Quantization;

mod reader;
mod rope;

pub(crate) use crate::rope::yarn_get_mscale;
pub use crate::rope::{RopeConfig, RopeScaling};
pub(crate) use reader::Cfg;
pub(crate) use rope::{read_rope, read_rope_object};

pub use crate::attention::{AttentionConfig, GqaConfig, KdaConfig, KdaGate, MlaConfig, QkNorm};

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
    /// The top-k of the logits, each weighted by its sigmoid, not renormalised (Llama 4).
    TopKSigmoid,
    /// Softmax over all experts; the top-k of the probabilities plus a selection-only bias
    /// ([`TensorNames::router_bias`]); the chosen probabilities divided by their sum, clamped
    /// below at `norm_min` (ERNIE 4.5's `moe_statics`).
    SoftmaxBiased {
        /// The smallest divisor (`moe_norm_min`).
        norm_min: f32,
    },
    /// Softmax over all experts, DeepSeek's group-limited top-k of the probabilities (no bias),
    /// the chosen probabilities renormalised and times `routed_scaling_factor` (Mistral Large
    /// 4).
    SoftmaxGroup {
        /// Groups of experts.
        n_group: usize,
        /// Groups kept.
        topk_group: usize,
        /// Factor on the routed weights.
        routed_scaling_factor: f32,
    },
    /// Scores `√softplus(logit)`; the top-k of the scores plus a selection-only bias (none in
    /// hash-routed layers, whose experts come from the token, [`LayerPlan::hash_routed`]);
    /// the chosen scores divided by their sum, times `routed_scaling_factor` (DeepSeek-V4).
    SqrtSoftplus {
        /// Factor on the routed weights.
        routed_scaling_factor: f32,
    },
    /// Softmax over all experts; the top-k of the probabilities plus a selection-only bias;
    /// the chosen probabilities, not renormalised, times `routed_scaling_factor`
    /// (LongCat-Flash).
    SoftmaxScaled {
        /// Factor on the routed weights.
        routed_scaling_factor: f32,
    },
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
    /// `down(silu(min(gate x, limit)) · clamp(up x, −limit, limit))` (Hy4's `swiglu_limit`).
    SwiGluInputsClamped {
        /// The bound.
        limit: f32,
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
    /// SwiGLU with both factors bounded: `min(silu(g), limit) · clamp(u, −limit, limit)`
    /// (Step-3.7's per-layer `swiglu_limits`).
    SiluClamped {
        /// The bound.
        limit: f32,
    },
    /// SwiGLU of bounded inputs: `silu(min(g, limit)) · clamp(u, −limit, limit)` (Hy4's
    /// routed experts).
    SiluInputsClamped {
        /// The bound.
        limit: f32,
    },
}

impl GluActivation {
    /// This activation with SwiGLU's factors bounded by `limit` where one is given.
    /// Only SwiGLU takes a bound (the families that set one use it).
    pub fn limited(self, limit: Option<f32>) -> GluActivation {
        match (self, limit) {
            (GluActivation::Silu, Some(limit)) => GluActivation::SiluClamped { limit },
            (a, _) => a,
        }
    }
}

/// Per layer, bounds on the SwiGLU factors (Step-3.7's `swiglu_limits_shared` and
/// `swiglu_limits`); `None`: unbounded.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GluLimits {
    /// Of the dense MLP or the shared expert.
    pub mlp: Option<f32>,
    /// Of the routed experts.
    pub experts: Option<f32>,
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

/// The feed-forward block of a layer.
#[derive(Clone, Debug, PartialEq)]
pub enum MlpKind {
    /// A dense gated MLP.
    Dense {
        /// Intermediate size.
        intermediate: usize,
    },
    /// A mixture of experts ([`ModelConfig::moe`]).
    Moe,
}

impl MlpKind {
    /// A mixture of experts when `moe`, else a dense MLP of `intermediate`.
    pub fn moe_or_dense(moe: bool, intermediate: usize) -> MlpKind {
        if moe {
            MlpKind::Moe
        } else {
            MlpKind::Dense { intermediate }
        }
    }
}

/// What one layer is: its attention, its feed-forward block, and the facts a family sets per
/// layer.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerPlan {
    /// What mixes tokens.
    pub attention: AttentionConfig,
    /// The feed-forward block.
    pub mlp: MlpKind,
    /// Bounds on its SwiGLU factors (Step-3.7); none by default.
    pub glu: GluLimits,
    /// Its experts are chosen by the token rather than by the router (DeepSeek-V4's `hash_moe`
    /// layers: row `token` of the layer's `gate.tid2eid` table; the router still weighs them).
    pub hash_routed: bool,
}

impl LayerPlan {
    /// A layer of `attention` and `mlp`, with no per-layer bounds and a learned router: the
    /// base a family sets its per-layer facts on, so a new one is one edit here.
    pub fn new(attention: AttentionConfig, mlp: MlpKind) -> LayerPlan {
        LayerPlan {
            attention,
            mlp,
            glu: GluLimits::default(),
            hash_routed: false,
        }
    }
}

/// How the routed experts of a layer are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertNames {
    /// One module per expert, `{moe}.experts.{e}.{gate|up|down}` (the three names given) — or,
    /// when the checkpoint has `{moe}.experts.gate_up_proj` instead, all of them fused as
    /// transformers 5 holds them: `gate_up_proj` `[experts, 2 × inter, in]` (gate rows, then up
    /// rows) and `down_proj` `[experts, out, inter]`, no biases.
    Separate {
        /// Gate projection (`gate_proj`, `w1`).
        gate: &'static str,
        /// Up projection (`up_proj`, `w3`).
        up: &'static str,
        /// Down projection (`down_proj`, `w2`).
        down: &'static str,
    },
    /// All experts of a layer fused in `{moe}.experts.gate_up_proj` (gate and up interleaved
    /// by row) and `{moe}.experts.down_proj`, `[experts, in, out]`, with biases, or as MXFP4
    /// blocks and scales (GPT-OSS).
    FusedGateUp,
    /// Every expert of a layer stacked in one tensor per projection directly under the MoE
    /// module: `{moe}.{gate}` and `{moe}.{up}` `[experts, inter, in]`, `{moe}.{down}`
    /// `[experts, out, inter]` (Step-3.7's `moe.gate_proj.weight`).
    Stacked {
        /// Stacked gate projections (`gate_proj.weight`).
        gate: &'static str,
        /// Stacked up projections (`up_proj.weight`).
        up: &'static str,
        /// Stacked down projections (`down_proj.weight`).
        down: &'static str,
    },
    /// All experts of a layer fused in the `x @ W` layout without biases, gate and up halves
    /// side by side: `{moe}.experts.gate_up_proj` `[experts, in, 2 × inter]` (the gate's
    /// columns, then the up's) and `{moe}.experts.down_proj` `[experts, inter, out]` (Llama 4).
    FusedXw,
}

/// Where a family's tensors are. Layer tensors are `{prefix}{model}layers.{l}.{module}.…`, the
/// embeddings `{prefix}{model}embed_tokens`, the final norm `{prefix}{model}norm` and the head
/// `{prefix}lm_head`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorNames {
    /// Prefix of every tensor name (`language_model.` for Kimi K3, else empty).
    pub prefix: String,
    /// The module holding the layers, embeddings and final norm, under the prefix (`model.`;
    /// `model.language_model.` for Qwen3.5's multimodal checkpoints).
    pub model: &'static str,
    /// The attention module (`self_attn`).
    pub attention: &'static str,
    /// The module of the recurrent (linear-attention) layers, when it is not
    /// [`Self::attention`] (Qwen3-Next's `linear_attn`).
    pub linear_attention: Option<&'static str>,
    /// The mixture-of-experts module (`mlp`, `block_sparse_moe`).
    pub moe: &'static str,
    /// The modules a dense layer's MLP may be under, tried in order: the first that has a
    /// `gate_proj.weight` (else the first).
    pub dense: &'static [&'static str],
    /// The router's module under [`Self::moe`] (`gate`, `router`); its weight is `.weight`.
    pub router: &'static str,
    /// The router's bias under [`Self::moe`], if it has one: DeepSeek's selection-only
    /// `gate.e_score_correction_bias` with [`RouterKind::SigmoidGroup`], GPT-OSS's
    /// `router.bias` (added to the logits) with [`RouterKind::TopKSoftmax`], ERNIE's
    /// selection-only `moe_statics.e_score_correction_bias` (`[1, experts]`) with
    /// [`RouterKind::SoftmaxBiased`].
    pub router_bias: Option<&'static str>,
    /// The shared expert's module under [`Self::moe`] (`shared_experts`, `shared_expert`); a
    /// gated one's gate is `{shared}_gate`.
    pub shared: &'static str,
    /// The shared expert is the layer's module [`Self::shared`] (a sublayer's own MLP, so
    /// `{shared}.{i}` with [`Self::sublayers`]) rather than one under [`Self::moe`]
    /// (LongCat-Flash, whose first MLP plays the shared expert of its shortcut MoE).
    pub shared_in_layer: bool,
    /// Layers per checkpoint layer (1, or LongCat-Flash's 2). With `n > 1`, layer `l` is
    /// sublayer `i = l % n` of the checkpoint's layer `l / n`: its norms, attention and dense
    /// MLP are the `{module}.{i}` entries there, while [`Self::moe`] is the checkpoint
    /// layer's own (one per checkpoint layer, run by the sublayer whose plan has it).
    pub sublayers: usize,
    /// How routed experts are stored.
    pub experts: ExpertNames,
    /// The checkpoint's tensors go by other names than the ones above, and are renamed to them
    /// as the checkpoint is opened (as transformers' conversion mapping renames them on load).
    pub rename: Option<Rename>,
}

/// A family's renaming of stored tensor names to the names sluice asks for
/// ([`TensorNames::rename`]): `canonical` maps a stored name to its new one, or `None` to
/// leave it.
#[derive(Clone, Copy)]
pub struct Rename {
    /// What the stored names are (`mistral`), for display and comparison.
    pub dialect: &'static str,
    /// The renaming.
    pub canonical: fn(&str) -> Option<String>,
}

impl std::fmt::Debug for Rename {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Rename({})", self.dialect)
    }
}

impl PartialEq for Rename {
    fn eq(&self, o: &Rename) -> bool {
        self.dialect == o.dialect
    }
}

impl Eq for Rename {}

impl TensorNames {
    /// The names most families use: `self_attn`, `mlp`, `mlp.gate`, `shared_experts`,
    /// `experts.{e}.{gate,up,down}_proj`, no prefix.
    pub fn standard() -> TensorNames {
        TensorNames {
            prefix: String::new(),
            model: "model.",
            attention: "self_attn",
            linear_attention: None,
            moe: "mlp",
            dense: &["mlp"],
            router: "gate",
            router_bias: None,
            shared: "shared_experts",
            shared_in_layer: false,
            sublayers: 1,
            experts: ExpertNames::Separate {
                gate: "gate_proj",
                up: "up_proj",
                down: "down_proj",
            },
            rename: None,
        }
    }

    /// Layer `l`'s module `module`: `{prefix}{model}layers.{l}.{module}`, or with sublayers
    /// `…layers.{l / n}.{module}.{l % n}`.
    pub fn layer_module(&self, l: usize, module: &str) -> String {
        let n = self.sublayers.max(1);
        if n == 1 {
            format!("{}{}layers.{l}.{module}", self.prefix, self.model)
        } else {
            format!(
                "{}{}layers.{}.{module}.{}",
                self.prefix,
                self.model,
                l / n,
                l % n
            )
        }
    }

    /// Layer `l`'s mixture-of-experts module: `{prefix}{model}layers.{l / n}.{moe}`.
    pub fn moe_module(&self, l: usize) -> String {
        let n = self.sublayers.max(1);
        format!("{}{}layers.{}.{}", self.prefix, self.model, l / n, self.moe)
    }
}

impl TensorNames {
    /// The module a layer of `attention` keeps its tensors under.
    pub fn attention_of(&self, attention: &AttentionConfig) -> &'static str {
        match self.linear_attention {
            Some(m) if attention.recurrent_floats() > 0 => m,
            _ => self.attention,
        }
    }
}

/// How layer outputs reach the next layer.
#[derive(Clone, Copy, Debug, PartialEq)]
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
    /// Hyper-connections: several residual streams per token ([`HyperConfig`]).
    Hyper(HyperConfig),
}

/// Hyper-connections (Hy4's iHC; GLM-5.3's and DeepSeek-V4's mHC with `sinkhorn`): `streams`
/// residual streams per token, all the embeddings at first. Before attention and before the
/// feed-forward block, per token: `m = (W · s) / √(mean(s²) + ε_rms)` over the streams `s`
/// flattened (`W` the layer's `attn_hc.fn` / `ffn_hc.fn`), `pre = σ(m[..n] · scale₀ + base) +
/// ε` and `post = gain · σ(m[n..2n] · scale₁ + base) (+ ε in iHC)`; the block reads
/// `Σ pre_i s_i` and its output `y` joins the streams, `s_i ← post_i · y + s_i` (iHC) or
/// `s_k ← post_k · y + Σ_j C_jk s_j` (mHC, `C` the `n × n` softmax of `m[2n..] · scale₂ + base`
/// made doubly stochastic by Sinkhorn-Knopp iterations). The final norm reads the hyper head's
/// `Σ pre_i s_i` (`hc_head`: `pre = σ(m · scale + base) + ε`), or the streams' mean.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HyperConfig {
    /// Streams (`hc_mult`).
    pub streams: usize,
    /// The gain on `post` (`hc_magnitude`; 2 in mHC).
    pub gain: f32,
    /// Added to the gates (`hc_eps`).
    pub eps: f32,
    /// Sinkhorn-Knopp iterations of the mixing matrix (`hc_sinkhorn_iters`); `None`: no
    /// matrix (iHC), and `eps` is added to `post` too.
    pub sinkhorn: Option<usize>,
    /// The final norm reads the streams' mean (GLM-5.3) rather than a gated head.
    pub mean_head: bool,
}

impl HyperConfig {
    /// Gates per block: `pre`, `post` and, with a mixing matrix, its `n²` entries.
    pub fn gates(&self) -> usize {
        let n = self.streams;
        if self.sinkhorn.is_some() {
            (2 + n) * n
        } else {
            2 * n
        }
    }

    /// Scales per block (one per kind of gate).
    pub fn scales(&self) -> usize {
        if self.sinkhorn.is_some() { 3 } else { 2 }
    }
}

impl Residual {
    /// Floats one token's residual stream holds (the hidden size, or one per stream).
    pub fn stream_floats(&self, hidden: usize) -> usize {
        match self {
            Residual::Hyper(h) => h.streams * hidden,
            _ => hidden,
        }
    }
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
    /// The routing weight scales each expert's input rather than its output (Llama 4:
    /// `expert(w · x)`, the outputs summed unweighted).
    pub weight_on_input: bool,
    /// Zero-compute experts after the routed ones (LongCat-Flash's `zero_expert_num`): the
    /// router scores `experts + zero_experts` choices, and a chosen id at or past
    /// [`Self::experts`] contributes its weight times the expert's input, reading nothing.
    pub zero_experts: usize,
    /// The routed sum (the shared expert excepted) is added to the stream after the *next*
    /// layer's feed-forward block rather than this one's (LongCat-Flash's shortcut MoE: the
    /// MoE reads the first sublayer's MLP input and its output joins after the second).
    pub shortcut: bool,
}

impl MoeConfig {
    /// The mixture of a model without one (a dense transformer): no experts, and no layer
    /// whose plan is [`MlpKind::Moe`].
    pub fn none() -> MoeConfig {
        MoeConfig {
            experts: 0,
            top_k: 0,
            intermediate: 0,
            router: RouterKind::Softmax {
                norm_topk_prob: false,
            },
            shared: None,
            activation: ExpertActivation::SwiGlu,
            latent: None,
            weight_on_input: false,
            zero_experts: 0,
            shortcut: false,
        }
    }

    /// Routed experts with `router`, each a SwiGLU block of `intermediate`, and nothing else:
    /// the base a family's mixture starts from (`MoeConfig { shared, ..MoeConfig::routed(..) }`),
    /// so a new field is one edit here.
    pub fn routed(
        experts: usize,
        top_k: usize,
        intermediate: usize,
        router: RouterKind,
    ) -> MoeConfig {
        MoeConfig {
            experts,
            top_k,
            intermediate,
            router,
            ..MoeConfig::none()
        }
    }

    /// The router's outputs: the routed experts and the zero-compute ones.
    pub fn router_width(&self) -> usize {
        self.experts + self.zero_experts
    }

    /// The width routed experts read and write: the latent width, or the hidden size.
    pub fn expert_width(&self, hidden: usize) -> usize {
        self.latent.map_or(hidden, |l| l.dim)
    }
}

/// A model's configuration, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// The family that read it (its module under `arch/`), for display.
    pub family: &'static str,
    /// `model_type` as the file says.
    pub model_type: String,
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
    /// Rotary embedding (of every rotated layer but those that take [`Self::local_rope`]).
    pub rope: RopeConfig,
    /// A second rotary table, for the grouped-query layers whose `local_rope` is set
    /// (MiMo-V2-Flash's sliding-window layers have their own θ).
    pub local_rope: Option<RopeConfig>,
    /// Per layer: its attention and feed-forward block.
    pub layer_plan: Vec<LayerPlan>,
    /// The MoE shape (for layers that have one).
    pub moe: MoeConfig,
    /// Beginning-of-sequence token, if configured.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens, if configured.
    pub eos_token_ids: Vec<u32>,
    /// How weights are stored (`quantization_config`).
    pub quant: Quantization,
    /// Where the tensors are.
    pub names: TensorNames,
    /// How layer outputs are combined.
    pub residual: Residual,
    /// The activation of dense layers and shared experts.
    pub mlp_act: GluActivation,
    /// Draft layers after the last (`num_nextn_predict_layers`, DeepSeek-V3's multi-token
    /// prediction): their tensors may be in the checkpoint, and are not used.
    pub draft_layers: usize,
    /// The trunk's RMSNorms (before attention and the MLP, the final norm, q/k norms) scale by
    /// `1 + w` rather than `w` (Qwen3-Next's zero-centred norms).
    pub zero_centred_norms: bool,
    /// Multi-token-prediction layers the checkpoint may carry, checked and not run.
    pub mtp: Option<MtpConfig>,
    /// Logits are soft-capped, `c · tanh(z / c)` (Mistral Large 4's `final_logit_softcapping`).
    pub logit_softcap: Option<f32>,
    /// The `config.json` field that gives the layer count, as messages name it
    /// (`num_hidden_layers`, `text_config.num_hidden_layers`, LongCat-Flash's `num_layers`).
    pub layers_field: String,
}

/// Multi-token-prediction layers a checkpoint may carry beside the model (Qwen3-Next's and
/// Qwen3.5's `mtp.*`, DeepSeek-V4's `mtp.{i}.*`, DeepSeek-V3's and GLM-4.5's layers after the
/// last). When the checkpoint has them they are found and checked like every other weight, by
/// role, shape and dtype (a damaged one refuses the model, naming the tensor); they run only as
/// a drafter (`--draft mtp`). A checkpoint without them (many re-uploads strip them) reads the
/// same.
#[derive(Clone, Debug, PartialEq)]
pub struct MtpConfig {
    /// The module holding them, as tensors are found (after the family's renaming): the layers
    /// are `{module}layers.{i}`, layer `i` of `plans[i]` (never hash-routed). Empty for
    /// [`MtpHead::Trailing`]: the model's own layers module, from layer `first` on.
    pub module: &'static str,
    /// The index of the first MTP layer under `{module}layers.`: 0, or the model's layer count
    /// for [`MtpHead::Trailing`].
    pub first: usize,
    /// How many layers.
    pub layers: usize,
    /// What each layer is, `layers` of them.
    pub plans: Vec<LayerPlan>,
    /// How the embedding and the hidden state enter them, and how they end.
    pub head: MtpHead,
}

/// The input side and the end of the multi-token-prediction layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MtpHead {
    /// One for all layers (Qwen3-Next): `{module}fc` `[hidden, 2 × hidden]` over the embedding
    /// and the hidden state, each normed first (`{module}pre_fc_norm_embedding`,
    /// `{module}pre_fc_norm_hidden`), concatenated; `{module}norm` at the end.
    Concat,
    /// Each layer its own (DeepSeek): `e_proj` and `h_proj` `[hidden, hidden]` over the normed
    /// embedding (`enorm`) and hidden state (`hnorm`), summed; `norm` at the end and, with
    /// hyper-connections, the layer's own hyper head (`hc_head`), all under
    /// `{module}layers.{i}.`.
    PerLayer,
    /// Each layer its own, numbered after the model's layers (DeepSeek-V3, GLM-4.5: the
    /// model's `layers.{first + i}.`): `eh_proj` `[hidden, 2 × hidden]` over the normed
    /// embedding (`enorm`, zero at position 0) and hidden state (`hnorm`), concatenated;
    /// `shared_head.norm` then the model's lm_head. Their copies of the embedding and the head
    /// (`embed_tokens`, `shared_head.head`), when present, must equal the model's.
    Trailing,
}

impl ModelConfig {
    /// Floats per position of what the MTP layer takes from the model (what a state keeps for
    /// drafting, [`crate::State::keep_hidden`]): the final-normed hidden row, or, for
    /// DeepSeek-V4's layer over a hyper-connection model, the streams after the last layer
    /// (`[hc_mult, hidden]`, the hyper head's input).
    pub fn mtp_row_width(&self) -> usize {
        self.hidden * self.mtp_streams().unwrap_or(1)
    }

    /// The hyper-connection streams the MTP layer takes, when it takes them rather than the
    /// final-normed row ([`MtpHead::PerLayer`] on a [`Residual::Hyper`] model).
    pub(crate) fn mtp_streams(&self) -> Option<usize> {
        match (&self.mtp, self.residual) {
            (Some(m), Residual::Hyper(hc)) if m.head == MtpHead::PerLayer => Some(hc.streams),
            _ => None,
        }
    }
}

impl MtpConfig {
    /// DeepSeek-V3's kind ([`MtpHead::Trailing`]): `cfg.draft_layers` layers after the model's
    /// own, each a decoder layer like its last. `None` without draft layers.
    pub fn trailing(cfg: &ModelConfig) -> Option<MtpConfig> {
        let last = cfg.layer_plan.last()?;
        (cfg.draft_layers > 0).then(|| MtpConfig {
            module: "",
            first: cfg.layers,
            layers: cfg.draft_layers,
            plans: vec![last.clone(); cfg.draft_layers],
            head: MtpHead::Trailing,
        })
    }
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

impl ModelConfig {
    /// Whether layer `l` has a mixture of experts.
    pub fn is_moe(&self, l: usize) -> bool {
        matches!(self.layer_plan.get(l), Some(p) if p.mlp == MlpKind::Moe)
    }

    /// The activation of layer `l`'s dense MLP or shared expert.
    pub fn mlp_act_of(&self, l: usize) -> GluActivation {
        self.mlp_act
            .limited(self.layer_plan.get(l).and_then(|p| p.glu.mlp))
    }

    /// Whether layer `l`'s experts come from the token ([`LayerPlan::hash_routed`]).
    pub fn is_hash_routed(&self, l: usize) -> bool {
        self.layer_plan.get(l).is_some_and(|p| p.hash_routed)
    }

    /// The bound on layer `l`'s routed experts' SwiGLU factors, if any.
    pub fn expert_limit(&self, l: usize) -> Option<f32> {
        self.layer_plan.get(l).and_then(|p| p.glu.experts)
    }

    /// This configuration with `plan` as its only layer: what an MTP layer's state and cache
    /// are built from.
    pub fn one_layer(&self, plan: &LayerPlan) -> ModelConfig {
        let mut one = self.clone();
        one.layer_plan = vec![plan.clone()];
        one.layers = 1;
        one
    }

    /// Layers with a mixture of experts.
    pub fn moe_layers(&self) -> usize {
        self.layer_plan
            .iter()
            .filter(|p| p.mlp == MlpKind::Moe)
            .count()
    }
}

/// `n` shared experts of `intermediate` each, as one MLP: refused, naming `field`, when the
/// product is more than [`MAX_SIZE`].
pub(crate) fn shared_width(
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

/// Checks the widths the model's arithmetic multiplies out (each layer's attention), so that
/// no shape product can overflow: each must be at most [`MAX_SIZE`]. Every family's reader
/// ends with it, passing the object its fields came from (K3's `text_config`).
pub(crate) fn check_widths(c: &Cfg<'_>, cfg: &ModelConfig) -> Result<(), ModelError> {
    for p in &cfg.layer_plan {
        let (a, b, field, what) = p.attention.widest();
        if a.checked_mul(b).is_none_or(|w| w > MAX_SIZE) {
            return Err(c.err(
                field,
                format!("{what} is wider than the {MAX_SIZE} sluice accepts"),
            ));
        }
    }
    Ok(())
}

/// The path of `config.json` in a model directory.
pub fn config_path(dir: &Path) -> PathBuf {
    dir.join("config.json")
}

#[cfg(test)]
pub(crate) mod test_util;
#[cfg(test)]
mod tests;
