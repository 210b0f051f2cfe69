//! Reads several families share: the top-level sizes, grouped-query attention's heads, the
//! softmax router, the count check of experts per token, and the assembly of the description.

use serde_json::Value;

use crate::ModelError;
use crate::config::{
    AttentionConfig, Cfg, GluActivation, GqaConfig, LayerPlan, MlpKind, ModelConfig, MoeConfig,
    QkNorm, Residual, RopeConfig, RouterKind, SharedExpert, TensorNames, check_widths, read_rope,
    shared_width,
};
use crate::quant::{self, Quantization};

/// A multimodal checkpoint's text model (Qwen3.5, Llama 4): its `text_config`, whose
/// `model_type` must be `text_type`.
pub(super) fn text_config<'a>(top: &Cfg<'a>, text_type: &str) -> Result<Cfg<'a>, ModelError> {
    let Some(tv) = top.get("text_config") else {
        return Err(top.err("text_config", "required field is missing"));
    };
    if !tv.is_object() {
        return Err(top.err("text_config", "expected an object"));
    }
    let text = Cfg {
        v: tv,
        file: top.file,
        prefix: "text_config.".into(),
    };
    text.expect_str("model_type", text_type, &[text_type])?;
    Ok(text)
}

/// The fields every non-Kimi family reads first, in this order.
pub(super) struct Base {
    pub quant: Quantization,
    pub vocab: usize,
    pub hidden: usize,
    pub layers: usize,
    pub eps: f32,
    pub heads: usize,
    pub max_positions: usize,
    pub tie_embeddings: bool,
}

impl Base {
    /// [`Base::read`] of a multimodal checkpoint's text config `text`: its quantization is said
    /// at the top (`top`), beside `text_config`; one given in both places is refused.
    pub fn read_multimodal(top: &Cfg<'_>, text: &Cfg<'_>) -> Result<Base, ModelError> {
        let mut base = Base::read(text, false)?;
        if let Some(q) = top.get("quantization_config") {
            if text.get("quantization_config").is_some() {
                return Err(top.err(
                    "quantization_config",
                    "given both at the top and in text_config",
                ));
            }
            base.quant = quant::read(q, top.file, false)?;
        }
        Ok(base)
    }

    /// `quantization_config` (MXFP4 of fused experts allowed when `fused_mxfp4`), then the
    /// sizes. `hidden_act` must be `silu`.
    pub fn read(c: &Cfg<'_>, fused_mxfp4: bool) -> Result<Base, ModelError> {
        let quant = match c.get("quantization_config") {
            Some(q) => quant::read(q, c.file, fused_mxfp4)?,
            None => Quantization::None,
        };
        c.expect_str("hidden_act", "silu", &["silu"])?;
        Ok(Base {
            quant,
            vocab: c.pos_usize("vocab_size")?,
            hidden: c.pos_usize("hidden_size")?,
            layers: c.pos_usize("num_hidden_layers")?,
            eps: c.pos_f32("rms_norm_eps")?,
            heads: c.pos_usize("num_attention_heads")?,
            max_positions: c.pos_usize("max_position_embeddings")?,
            // transformers' default for every architecture here is `false`.
            tie_embeddings: c.bool_or("tie_word_embeddings", false)?,
        })
    }

    /// The description, with the token ids and draft layers read here; residuals add and dense
    /// blocks are SwiGLU.
    #[allow(clippy::too_many_arguments)]
    pub fn finish(
        self,
        c: &Cfg<'_>,
        family: &'static str,
        model_type: &str,
        rope: RopeConfig,
        layer_plan: Vec<LayerPlan>,
        moe: MoeConfig,
        names: TensorNames,
    ) -> Result<ModelConfig, ModelError> {
        let cfg = ModelConfig {
            family,
            model_type: model_type.to_owned(),
            vocab: self.vocab,
            hidden: self.hidden,
            layers: self.layers,
            eps: self.eps,
            tie_embeddings: self.tie_embeddings,
            max_positions: self.max_positions,
            rope,
            local_rope: None,
            layer_plan,
            moe,
            bos_token_id: c.token_ids("bos_token_id")?.first().copied(),
            eos_token_ids: c.token_ids("eos_token_id")?,
            quant: self.quant,
            names,
            residual: Residual::Add,
            mlp_act: GluActivation::Silu,
            draft_layers: c.opt_usize("num_nextn_predict_layers")?.unwrap_or(0),
            zero_centred_norms: false,
            mtp: None,
            logit_softcap: None,
            layers_field: format!("{}num_hidden_layers", c.prefix),
        };
        check_widths(c, &cfg)?;
        Ok(cfg)
    }
}

/// Grouped-query attention's `num_key_value_heads` (dividing `heads`) and `head_dim` (even and
/// positive; when absent, `hidden / heads` unless `head_dim_required`).
pub(super) fn gqa_heads(
    c: &Cfg<'_>,
    heads: usize,
    hidden: usize,
    head_dim_required: bool,
) -> Result<(usize, usize), ModelError> {
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
        None if head_dim_required => {
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
    Ok((kv_heads, head_dim))
}

/// `num_experts_per_tok`, checked against the experts.
pub(super) fn top_k(c: &Cfg<'_>, experts: usize) -> Result<usize, ModelError> {
    let top_k = c.pos_usize("num_experts_per_tok")?;
    if top_k > experts {
        return Err(c.err(
            "num_experts_per_tok",
            format!("{top_k} is more than the {experts} experts"),
        ));
    }
    Ok(top_k)
}

/// The groups of sigmoid group routing (DeepSeek's `noaux_tc`): `n_group` divides the
/// experts into groups of at least 2 (a group scores the sum of its top 2), `topk_group` of
/// them kept, holding at least the `top_k` chosen.
pub(super) fn check_groups(
    c: &Cfg<'_>,
    experts: usize,
    top_k: usize,
    n_group: usize,
    topk_group: usize,
) -> Result<(), ModelError> {
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
    Ok(())
}

/// A refused sliding window of 0.
pub(super) fn check_window(c: &Cfg<'_>, w: Option<usize>) -> Result<(), ModelError> {
    if w == Some(0) {
        return Err(c.err("sliding_window", "must be positive"));
    }
    Ok(())
}

/// The softmax scale `dim^−½`.
pub(super) fn inv_sqrt(dim: usize) -> f64 {
    (dim as f64).powf(-0.5)
}

/// Grouped-query attention read the common way: heads from [`gqa_heads`], the rotary table
/// (`rope_parameters` / `rope_scaling`, pairs split in halves) over the first
/// `partial_rotary_factor` of each head (absent: 1), the scale `head_dim^−½`; the family sets
/// its switches on the result (biases, norms, windows).
pub(super) fn gqa_rope(
    c: &Cfg<'_>,
    base: &Base,
    head_dim_required: bool,
) -> Result<(GqaConfig, RopeConfig), ModelError> {
    gqa_rope_partial(c, base, head_dim_required, 1.0)
}

/// [`gqa_rope`] for a family whose transformers default `partial_rotary_factor` is `partial`.
pub(super) fn gqa_rope_partial(
    c: &Cfg<'_>,
    base: &Base,
    head_dim_required: bool,
    partial: f64,
) -> Result<(GqaConfig, RopeConfig), ModelError> {
    let gqa = gqa_config(c, base, head_dim_required)?;
    let (rope, _) = read_rope(c, gqa.head_dim, false, base.max_positions, Some(partial))?;
    Ok((gqa, rope))
}

/// Grouped-query attention's heads ([`gqa_heads`]) with every switch off and the scale
/// `head_dim^−½`, its rotary table read by the caller.
pub(super) fn gqa_config(
    c: &Cfg<'_>,
    base: &Base,
    head_dim_required: bool,
) -> Result<GqaConfig, ModelError> {
    let (kv_heads, head_dim) = gqa_heads(c, base.heads, base.hidden, head_dim_required)?;
    Ok(GqaConfig {
        heads: base.heads,
        kv_heads,
        head_dim,
        qkv_bias: false,
        o_bias: false,
        qk_norm: QkNorm::None,
        clip_qkv: None,
        window: None,
        sinks: false,
        output_gate: false,
        head_gate: false,
        zero_centred_qk_norm: false,
        v_head_dim: head_dim,
        v_scale: None,
        local_rope: false,
        nope: false,
        rms_qk_after_rope: false,
        temperature: None,
        chunk: None,
        softmax_scale: inv_sqrt(head_dim) as f32,
    })
}

/// The rotary table of `layer_type` from `all`, the `rope_parameters` object (per layer type:
/// `rope_parameters.{layer_type}`; only the default rotation, its `rope_theta` and
/// `partial_rotary_factor`, absent `partial`), over heads of `head_dim`.
pub(super) fn typed_rope(
    c: &Cfg<'_>,
    all: &Value,
    layer_type: &str,
    head_dim: usize,
    max_positions: usize,
    partial: f64,
) -> Result<RopeConfig, ModelError> {
    let Some(p) = all.get(layer_type) else {
        return Err(c.err(
            &format!("rope_parameters.{layer_type}"),
            "required field is missing",
        ));
    };
    let pc = Cfg {
        v: p,
        file: c.file,
        prefix: format!("{}rope_parameters.{layer_type}.", c.prefix),
    };
    pc.expect_str("rope_type", "default", &["default"])?;
    Ok(read_rope(&pc, head_dim, false, max_positions, Some(partial))?.0)
}

/// The softmax router (top-k of a softmax over all experts), renormalised when
/// `norm_topk_prob` (absent: `default`, transformers' default for the family).
pub(super) fn softmax_router(c: &Cfg<'_>, default: bool) -> Result<RouterKind, ModelError> {
    Ok(RouterKind::Softmax {
        norm_topk_prob: c.bool_or("norm_topk_prob", default)?,
    })
}

/// A layer plan of the same attention everywhere, each layer's feed-forward block given.
pub(super) fn uniform_plan(
    attention: &AttentionConfig,
    mlp: impl Iterator<Item = MlpKind>,
) -> Vec<LayerPlan> {
    mlp.map(|mlp| LayerPlan::new(attention.clone(), mlp))
        .collect()
}

/// Every layer a mixture of experts.
pub(super) fn all_moe(layers: usize) -> impl Iterator<Item = MlpKind> {
    (0..layers).map(|_| MlpKind::Moe)
}

/// A per-layer list of `layers` names (`layer_types`, `mlp_layer_types`), each one of `kinds`,
/// as flags: true where a layer is `kinds[0]`. Absent (or null): `default(layer)`, the family's
/// transformers default.
pub(super) fn layer_kinds(
    c: &Cfg<'_>,
    field: &str,
    layers: usize,
    kinds: [&str; 2],
    default: impl Fn(usize) -> bool,
) -> Result<Vec<bool>, ModelError> {
    match c.get(field) {
        None => Ok((0..layers).map(default).collect()),
        Some(Value::Array(a)) if a.len() == layers => kinds_of(c, field, a, kinds),
        Some(Value::Array(a)) => {
            Err(c.err(field, format!("{} entries for {layers} layers", a.len())))
        }
        Some(v) => Err(c.err(field, format!("expected a list, got {v}"))),
    }
}

/// The names of `list` (the per-layer field `field`), each one of `kinds`, as flags: true
/// where an entry is `kinds[0]`.
pub(super) fn kinds_of(
    c: &Cfg<'_>,
    field: &str,
    list: &[Value],
    kinds: [&str; 2],
) -> Result<Vec<bool>, ModelError> {
    list.iter()
        .map(|x| match x.as_str() {
            Some(k) if k == kinds[0] => Ok(true),
            Some(k) if k == kinds[1] => Ok(false),
            _ => Err(c.err(
                field,
                format!(
                    "`{x}` is not supported (supported: {}, {})",
                    kinds[0], kinds[1]
                ),
            )),
        })
        .collect()
}

/// The softmax scale of multi-head latent attention over query/key heads of `qk_dim`:
/// `qk_dim^−½`, times `mscale²` under YaRN with `mscale_all_dim` (`yarn`, as
/// [`read_rope`] returns it; DeepSeek-V3, LongCat-Flash).
pub(super) fn mla_softmax_scale(qk_dim: usize, yarn: Option<(f64, f64)>) -> f32 {
    let mut s = inv_sqrt(qk_dim);
    if let Some((factor, all)) = yarn {
        let m = crate::config::yarn_get_mscale(factor, all);
        s = s * m * m;
    }
    s as f32
}

/// `layer_types`: true for `sliding_attention`, false for `full_attention`; when absent,
/// `default(layer)`.
pub(super) fn read_layer_types(
    c: &Cfg<'_>,
    layers: usize,
    default: impl Fn(usize) -> bool,
) -> Result<Vec<bool>, ModelError> {
    layer_kinds(
        c,
        "layer_types",
        layers,
        ["sliding_attention", "full_attention"],
        default,
    )
}

/// A list of layer indices (absent: empty).
pub(super) fn layer_list(c: &Cfg<'_>, field: &str) -> Result<Vec<usize>, ModelError> {
    match c.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_u64()
                    .map(|n| n as usize)
                    .ok_or_else(|| c.err(field, "expected layer indices"))
            })
            .collect(),
        Some(_) => Err(c.err(field, "expected a list of layer indices")),
    }
}

/// `n` ungated shared experts of `intermediate` each, as one MLP (none for 0).
pub(super) fn shared_experts(
    c: &Cfg<'_>,
    n: usize,
    intermediate: usize,
) -> Result<Option<SharedExpert>, ModelError> {
    Ok((n > 0)
        .then(|| shared_width(c, "n_shared_experts", n, intermediate))
        .transpose()?
        .map(|intermediate| SharedExpert {
            intermediate,
            gated: false,
        }))
}

/// `swiglu_limit`, the bound on SwiGLU's inputs (transformers' default 10), positive and finite.
pub(super) fn swiglu_limit(c: &Cfg<'_>) -> Result<f32, ModelError> {
    let limit = c.opt_f32("swiglu_limit")?.unwrap_or(10.0);
    if limit <= 0.0 || !limit.is_finite() {
        return Err(c.err(
            "swiglu_limit",
            format!("{limit} is not supported (SwiGLU's inputs are clamped at it; positive only)"),
        ));
    }
    Ok(limit)
}

/// The most hyper-connection streams a config may declare (released models have 4).
pub(super) const MAX_STREAMS: usize = 64;

/// `hc_mult`, the hyper-connection streams (transformers' default 4): positive, at most
/// [`MAX_STREAMS`] (each token's residual is `streams × hidden` floats).
pub(super) fn hc_streams(c: &Cfg<'_>) -> Result<usize, ModelError> {
    let n = c.opt_usize("hc_mult")?.unwrap_or(4);
    if n == 0 || n > MAX_STREAMS {
        return Err(c.err(
            "hc_mult",
            format!("{n} is not supported (1 to {MAX_STREAMS} streams)"),
        ));
    }
    Ok(n)
}
