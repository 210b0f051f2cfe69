//! Where every weight of a model lives, checked against its role.
//!
//! The trunk is split into parts (one per layer, plus the head: final norm and lm_head); each
//! part is a list of byte ranges read together into one [`Blob`]. Routed experts are one blob
//! each. Specs record, for each role, which piece of the blob holds it and how to view it.
//!
//! The loader is family-agnostic: the names come from the config's [`TensorNames`], the
//! attention tensors from the layer's attention kind ([`crate::attention`]), and each tensor is
//! named once ([`builder`]). How a stored format is recognised is in [`linear`]; experts fused
//! per layer in [`fused`].

mod builder;
mod fused;
mod linear;
mod mtp;

use std::collections::HashMap;

use sluice_format::Checkpoint;
use sluice_kernels::{Codes, Matrix, ScaleType, Scales};
use sluice_store::{Blob, Piece};

use builder::{Ctx, build_part};
pub(crate) use builder::{PartBuilder, tensor_err, vector_codes};
pub use mtp::{MtpCopy, MtpHeadSpec, MtpLayout};
use mtp::{mtp_layout, mtp_prefix};

use crate::ModelError;
pub use crate::attention::AttnSpec;
use crate::config::{ExpertNames, MlpKind, ModelConfig, MtpHead, Residual};

/// Group scales of a packed matrix: another piece of the same blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScaleSpec {
    /// Piece holding the scales, row-major `[ceil(rows / group_rows), ceil(cols / group_cols)]`.
    pub piece: usize,
    /// Their element type.
    pub ty: ScaleType,
    /// Rows per scale (1 for per-row groups, 128 for FP8 blocks).
    pub group_rows: usize,
    /// Columns per scale.
    pub group_cols: usize,
}

/// How to view one piece of a blob as a weight matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatSpec {
    /// Piece holding the weights.
    pub piece: usize,
    /// Coding.
    pub codes: Codes,
    /// Output features.
    pub rows: usize,
    /// Input features.
    pub cols: usize,
    /// Scales, for packed codings (FP8, INT4, MXFP4).
    pub scales: Option<ScaleSpec>,
    /// Stored `[cols, rows]` (the `x @ W` layout of GPT-OSS's fused BF16 experts) rather than
    /// `[rows, cols]`.
    pub transposed: bool,
    /// The head dimension of a GGUF query or key projection whose rows llama.cpp's converter
    /// stored in its rotary order (read back in Hugging Face's, see
    /// [`sluice_kernels::Matrix::with_rope_rows`]); 0 for rows as stored.
    pub rope_rows: usize,
}

impl MatSpec {
    /// A dense `[rows, cols]` matrix in piece `piece`.
    pub fn dense(piece: usize, codes: Codes, rows: usize, cols: usize) -> MatSpec {
        MatSpec {
            piece,
            codes,
            rows,
            cols,
            scales: None,
            transposed: false,
            rope_rows: 0,
        }
    }

    /// The matrix in `blob`, as stored (`[cols, rows]` when [`transposed`](Self::transposed)).
    pub fn view<'a>(&self, blob: &'a Blob) -> Result<Matrix<'a>, ModelError> {
        let (r, c) = if self.transposed {
            (self.cols, self.rows)
        } else {
            (self.rows, self.cols)
        };
        let data = blob.piece(self.piece);
        Ok(match self.scales {
            None if self.rope_rows > 0 => {
                Matrix::dense(self.codes, data, r, c)?.with_rope_rows(self.rope_rows)?
            }
            None => Matrix::dense(self.codes, data, r, c)?,
            Some(s) => Matrix::quantized(
                self.codes,
                data,
                r,
                c,
                Scales {
                    data: blob.piece(s.piece),
                    ty: s.ty,
                    group_cols: s.group_cols,
                    group_rows: s.group_rows,
                },
            )?,
        })
    }
}

/// How to view one piece of a blob as a vector (norm weights, biases).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VecSpec {
    /// Piece.
    pub piece: usize,
    /// Element coding (F32, BF16 or F16).
    pub codes: Codes,
    /// Elements.
    pub len: usize,
    /// The weight of a zero-centred RMSNorm (Qwen3-Next): what is used is `1 + w`, rounded
    /// once in f32 as transformers computes `1.0 + weight.float()`.
    pub plus_one: bool,
    /// The head dimension of a GGUF query or key bias stored in llama.cpp's rotary order
    /// (read back in Hugging Face's, as [`MatSpec::rope_rows`]); 0 as stored. (A `u32`: the
    /// spec stays 24 bytes.)
    pub rope_rows: u32,
}

impl VecSpec {
    /// The vector as f32 (exact conversion; `1 + w` when [`VecSpec::plus_one`]).
    pub fn to_f32(&self, blob: &Blob) -> Vec<f32> {
        let mut v =
            sluice_kernels::decode::decode_vec(self.codes, blob.piece(self.piece), self.len);
        if self.rope_rows > 0 {
            // Element h·d + j·d/2 + i is stored at h·d + 2i + j.
            let d = self.rope_rows as usize;
            let stored = v.clone();
            for (r, x) in v.iter_mut().enumerate() {
                let (h, l) = (r / d, r % d);
                *x = stored[h * d + 2 * (l % (d / 2)) + l / (d / 2)];
            }
        }
        if self.plus_one {
            for x in &mut v {
                *x += 1.0;
            }
        }
        v
    }

    /// The same vector as the weight of a zero-centred norm when `zero_centred`.
    pub fn norm(self, zero_centred: bool) -> VecSpec {
        VecSpec {
            plus_one: zero_centred,
            ..self
        }
    }
}

/// How to view one piece of a blob as a table of integers `[rows, cols]` (little-endian I32,
/// or I64 when `wide`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableSpec {
    /// The tensor, for messages.
    pub name: String,
    /// Piece.
    pub piece: usize,
    /// Eight bytes per entry.
    pub wide: bool,
    /// Rows.
    pub rows: usize,
    /// Entries per row.
    pub cols: usize,
}

impl TableSpec {
    /// Row `r`, each entry checked to be below `limit` (an error names the tensor otherwise).
    pub fn row(&self, blob: &Blob, r: usize, limit: usize) -> Result<Vec<u32>, ModelError> {
        if r >= self.rows {
            return Err(tensor_err(
                &self.name,
                format!("has {} rows, asked for row {r}", self.rows),
            ));
        }
        let data = blob.piece(self.piece);
        let size = if self.wide { 8 } else { 4 };
        let mut out = Vec::with_capacity(self.cols);
        for c in 0..self.cols {
            let at = (r * self.cols + c) * size;
            let v: i64 = match data.get(at..at + size) {
                Some(b) if self.wide => i64::from_le_bytes(b.try_into().unwrap_or([0; 8])),
                Some(b) => i64::from(i32::from_le_bytes(b.try_into().unwrap_or([0; 4]))),
                None => -1,
            };
            if v < 0 || v as u64 >= limit as u64 {
                return Err(tensor_err(
                    &self.name,
                    format!("row {r} holds {v}, not an id below {limit}"),
                ));
            }
            out.push(v as u32);
        }
        Ok(out)
    }
}

/// A part: the tensors read together, sorted by file position, and their indices by name.
#[derive(Debug, Default)]
pub struct PartLayout {
    /// Byte ranges in read order.
    pub pieces: Vec<Piece>,
    index: HashMap<String, usize>,
}

impl PartLayout {
    /// Gathers the named tensors, sorted by (shard, offset) so adjacent tensors merge into one read.
    pub fn new(ck: &Checkpoint, names: &[String]) -> Result<PartLayout, ModelError> {
        let items = names
            .iter()
            .map(|n| {
                ck.tensor(n).map(|t| {
                    (
                        n.clone(),
                        Piece {
                            shard: t.shard as u32,
                            offset: t.offset,
                            len: t.len,
                        },
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PartLayout::from_ranges(items))
    }

    /// Gathers labelled byte ranges (whole tensors or slices of them), sorted by (shard, offset);
    /// a range given twice is read once.
    pub fn from_ranges(mut items: Vec<(String, Piece)>) -> PartLayout {
        items.sort_by_key(|(_, p)| (p.shard, p.offset, p.len));
        let mut pieces: Vec<Piece> = Vec::with_capacity(items.len());
        let mut index = HashMap::with_capacity(items.len());
        for (name, p) in items {
            if pieces.last() != Some(&p) {
                pieces.push(p);
            }
            index.insert(name, pieces.len() - 1);
        }
        PartLayout { pieces, index }
    }

    pub(super) fn piece(&self, name: &str) -> usize {
        // Every name passed to `new` is present.
        self.index[name]
    }

    /// Total bytes.
    pub fn bytes(&self) -> u64 {
        self.pieces.iter().map(|p| p.len).sum()
    }

    /// The piece holding the named range, if it is in this part.
    pub fn piece_of(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    /// Tensor names in piece order.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<(&str, usize)> = self.index.iter().map(|(n, &i)| (n.as_str(), i)).collect();
        v.sort_by_key(|p| p.1);
        v.into_iter().map(|p| p.0).collect()
    }
}

/// A SwiGLU block: down(silu(gate x) ⊙ up x).
#[derive(Clone, Copy, Debug)]
pub struct MlpSpec {
    /// Gate projection.
    pub gate: MatSpec,
    /// Up projection.
    pub up: MatSpec,
    /// Down projection.
    pub down: MatSpec,
}

/// A fused expert (GPT-OSS): `gate_up` interleaves gate (even rows) and up (odd rows), both
/// with biases.
#[derive(Clone, Copy, Debug)]
pub struct FusedExpertSpec {
    /// Fused gate/up projection, `[2 × intermediate, hidden]`.
    pub gate_up: MatSpec,
    /// Its bias.
    pub gate_up_bias: VecSpec,
    /// Down projection, `[hidden, intermediate]`.
    pub down: MatSpec,
    /// Its bias.
    pub down_bias: VecSpec,
}

/// A SwiGLU expert whose gate and up are one matrix (Llama 4): the product's first
/// `intermediate` outputs are the gate, the next the up.
#[derive(Clone, Copy, Debug)]
pub struct GateUpSpec {
    /// Gate and up, `[2 × intermediate, hidden]` (as a view; stored `x @ W`).
    pub gate_up: MatSpec,
    /// Down projection, `[hidden, intermediate]`.
    pub down: MatSpec,
}

/// A clamped-SwiGLU expert whose gate, up and down are separate matrices, each with a bias
/// (GPT-OSS as llama.cpp's converter stores it: the fused `gate_up_proj`'s even rows are the
/// gate, its odd rows the up).
#[derive(Clone, Copy, Debug)]
pub struct BiasedMlpSpec {
    /// The three projections.
    pub mlp: MlpSpec,
    /// The gate's bias.
    pub gate_bias: VecSpec,
    /// The up projection's bias.
    pub up_bias: VecSpec,
    /// The down projection's bias.
    pub down_bias: VecSpec,
}

/// What one routed expert holds, as specs into its blob.
#[derive(Clone, Copy, Debug)]
pub enum ExpertSpec {
    /// Separate gate, up and down matrices.
    SwiGlu(MlpSpec),
    /// Gate and up as one matrix, no biases (Llama 4).
    GateUp(GateUpSpec),
    /// Fused gate/up and down projections with biases (GPT-OSS).
    Fused(FusedExpertSpec),
    /// Separate gate, up and down matrices with biases (GPT-OSS from a GGUF file).
    Biased(BiasedMlpSpec),
}

/// One attention-residual mix: `norm` RMSNorm weights and the `[1, hidden]` score projection.
#[derive(Clone, Copy, Debug)]
pub struct AttnResWeights {
    /// `*_res_norm.weight`.
    pub norm: VecSpec,
    /// `*_res_proj.weight`.
    pub proj: VecSpec,
}

/// One hyper-connection ([`crate::config::Residual::Hyper`]): the `[gates, streams × hidden]`
/// projection `fn`, its `base` `[gates]` and `scale` (one per kind of gate).
#[derive(Clone, Copy, Debug)]
pub struct HyperWeights {
    /// `fn`.
    pub proj: MatSpec,
    /// `base`.
    pub base: VecSpec,
    /// `scale`.
    pub scale: VecSpec,
}

/// The weights of a mix of the residual stream, by residual kind.
#[derive(Clone, Copy, Debug)]
pub enum MixWeights {
    /// Attention residuals.
    AttnRes(AttnResWeights),
    /// A hyper-connection.
    Hyper(HyperWeights),
}

/// The latent projections of a Kimi K3 mixture of experts.
#[derive(Clone, Copy, Debug)]
pub struct LatentSpec {
    /// `routed_expert_down_proj` `[latent, hidden]`.
    pub down: MatSpec,
    /// `routed_expert_up_proj` `[hidden, latent]`.
    pub up: MatSpec,
    /// `routed_expert_norm` on the experts' weighted sum.
    pub norm: Option<VecSpec>,
}

/// Feed-forward weights of a layer kept in the trunk.
// One per layer, built once at load: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum FfnSpec {
    /// A dense block.
    Dense(MlpSpec),
    /// The trunk side of a mixture of experts.
    Moe(MoeSpec),
}

/// The trunk side of a mixture of experts: what every token's routing and the block around
/// the routed experts read (the experts themselves are in the store).
#[derive(Clone, Debug)]
pub struct MoeSpec {
    /// Router weight [experts, hidden].
    pub router: MatSpec,
    /// DeepSeek's selection-only `e_score_correction_bias`, or GPT-OSS's router bias (added
    /// to the logits).
    pub bias: Option<VecSpec>,
    /// Shared expert.
    pub shared: Option<MlpSpec>,
    /// Shared-expert gate [1, hidden] (Qwen2-MoE).
    pub shared_gate: Option<MatSpec>,
    /// Latent projections (Kimi K3).
    pub latent: Option<LatentSpec>,
    /// The token-to-experts table of a hash-routed layer (`gate.tid2eid`).
    pub hash: Option<TableSpec>,
}

/// The trunk weights of one layer.
#[derive(Clone, Debug)]
pub struct LayerSpec {
    /// Pre-attention norm.
    pub input_norm: VecSpec,
    /// Pre-MLP norm.
    pub post_norm: VecSpec,
    /// Attention.
    pub attn: AttnSpec,
    /// Feed-forward.
    pub ffn: FfnSpec,
    /// Attention-residual mixes before attention and before the feed-forward block.
    pub mix: Option<[MixWeights; 2]>,
}

/// The head: final norm and lm_head.
#[derive(Clone, Copy, Debug)]
pub struct HeadSpec {
    /// Final norm.
    pub norm: VecSpec,
    /// lm_head [vocab, hidden].
    pub lm_head: MatSpec,
    /// The attention-residual mix before the final norm.
    pub mix: Option<MixWeights>,
    /// The learned rotary factors `rotary_emb.alpha` ([`crate::config::RopeConfig::learned`]).
    pub rope_alpha: Option<VecSpec>,
}

/// Where everything is.
#[derive(Debug)]
pub struct WeightLayout {
    /// Embedding table part (one piece).
    pub embed: PartLayout,
    /// The embedding matrix [vocab, hidden].
    pub embed_spec: MatSpec,
    /// One trunk part per layer.
    pub layers: Vec<PartLayout>,
    /// Specs per layer.
    pub layer_specs: Vec<LayerSpec>,
    /// Head part.
    pub head: PartLayout,
    /// Head spec.
    pub head_spec: HeadSpec,
    /// Per MoE layer, per expert: pieces (an expert's bytes exactly as stored: packed codes and
    /// their scales stay packed).
    pub experts: Vec<Vec<Vec<Piece>>>,
    /// Per MoE layer, per expert: specs into the expert's blob.
    pub expert_specs: Vec<Vec<ExpertSpec>>,
    /// The multi-token-prediction layers, when the checkpoint has them
    /// ([`crate::config::MtpConfig`]): found and checked; only `--draft mtp` runs them.
    pub mtp: Option<MtpLayout>,
    /// Why the checkpoint's multi-token-prediction layers could not be laid out (a missing or
    /// misshapen tensor), when it has some. The model runs without them; only `--draft mtp`
    /// is refused, with this error.
    pub mtp_error: Option<Box<ModelError>>,
}

/// The config's `num_hidden_layers` against the layers the checkpoint has tensors for, before
/// anything proportional to it is built: more layers than the checkpoint names the first
/// missing tensor; fewer (a silently truncated model) names the tensors that would go unused.
/// Draft layers (`num_nextn_predict_layers`) directly after the last may be present.
fn check_layer_count(ck: &Checkpoint, cfg: &ModelConfig) -> Result<(), ModelError> {
    let head = format!("{}{}layers.", cfg.names.prefix, cfg.names.model);
    let layer_of = |name: &str| -> Option<usize> {
        let rest = name.strip_prefix(&head)?;
        rest.split('.').next()?.parse().ok()
    };
    let config = ck.dir().join("config.json");
    // Checkpoint layers: with sublayers, each holds `sublayers` of the model's.
    let n = cfg.names.sublayers.max(1);
    let layers = cfg.layers.div_ceil(n);
    let used = layers.saturating_add(cfg.draft_layers);
    let mut unused: Vec<&str> = ck
        .names()
        .filter(|n| layer_of(n).is_some_and(|l| l >= used))
        .collect();
    if !unused.is_empty() {
        unused.sort_unstable();
        let k = unused.len();
        let shown = unused[..k.min(3)].join(", ");
        return Err(ModelError::Config {
            file: config,
            field: cfg.layers_field.clone(),
            msg: format!(
                "{layers} layers, but the checkpoint has more: {k} tensors would go unused \
                 ({shown}{})",
                if k > 3 { ", …" } else { "" }
            ),
        });
    }
    let present = ck.names().filter_map(layer_of).max().map_or(0, |l| l + 1);
    if layers > present {
        return Err(ModelError::Config {
            file: config,
            field: cfg.layers_field.clone(),
            msg: format!(
                "{layers} layers, but the checkpoint has tensors for {present} (nothing named \
                 {head}{present}.*)"
            ),
        });
    }
    Ok(())
}

impl WeightLayout {
    /// Finds and checks every tensor the model needs, packed ones against the model's
    /// `quantization_config`.
    pub fn new(ck: &Checkpoint, cfg: &ModelConfig) -> Result<WeightLayout, ModelError> {
        check_layer_count(ck, cfg)?;
        let ctx = Ctx::new(ck, &cfg.quant);
        let names = &cfg.names;
        let h = cfg.hidden;
        let embed_name = format!("{}{}embed_tokens.weight", names.prefix, names.model);
        let (embed, embed_spec) = build_part(&ctx, |p| p.matrix(&embed_name, cfg.vocab, h))?;

        let mut layers = Vec::with_capacity(cfg.layers);
        let mut layer_specs = Vec::with_capacity(cfg.layers);
        let mut experts = Vec::with_capacity(cfg.layers);
        let mut expert_specs = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let (part, spec) = build_part(&ctx, |p| layer(p, cfg, l))?;
            let (lp, ls) = if cfg.is_moe(l) {
                routed_experts(&ctx, cfg, l)?
            } else {
                (Vec::new(), Vec::new())
            };
            layers.push(part);
            layer_specs.push(spec);
            experts.push(lp);
            expert_specs.push(ls);
        }
        let (head, head_spec) = build_part(&ctx, |p| head(p, cfg, &embed_name))?;
        // The MTP layers are loaded only to draft with: a damaged one leaves the model as it is.
        let (mtp, mtp_error) = match &cfg.mtp {
            Some(m) if ck.names().any(|n| n.starts_with(&mtp_prefix(cfg, m))) => {
                match mtp_layout(&ctx, cfg, m) {
                    Ok(l) => (Some(l), None),
                    Err(e) => (None, Some(Box::new(e))),
                }
            }
            _ => (None, None),
        };
        Ok(WeightLayout {
            embed,
            embed_spec,
            layers,
            layer_specs,
            head,
            head_spec,
            experts,
            expert_specs,
            mtp,
            mtp_error,
        })
    }

    /// Bytes of the trunk (everything but routed experts; the embedding table included).
    pub fn trunk_bytes(&self) -> u64 {
        self.embed.bytes()
            + self.layers.iter().map(PartLayout::bytes).sum::<u64>()
            + self.head.bytes()
    }

    /// Bytes of all routed experts.
    pub fn expert_bytes(&self) -> u64 {
        self.experts.iter().flatten().flatten().map(|p| p.len).sum()
    }

    /// Bytes on disk of expert `e` of layer `layer` (0 when there is none): what the expert
    /// cache holds for it, before read alignment. Packed experts stay packed.
    pub fn bytes_of_expert(&self, layer: usize, e: usize) -> u64 {
        self.experts
            .get(layer)
            .and_then(|l| l.get(e))
            .map_or(0, |p| p.iter().map(|p| p.len).sum())
    }

    /// Routed-expert bytes on disk one token needs when nothing is cached: the `top_k` largest
    /// experts of every MoE layer.
    pub fn expert_bytes_per_token(&self, top_k: usize) -> u64 {
        self.experts
            .iter()
            .map(|layer| {
                let mut sizes: Vec<u64> = layer
                    .iter()
                    .map(|p| p.iter().map(|p| p.len).sum())
                    .collect();
                sizes.sort_unstable_by(|a, b| b.cmp(a));
                sizes.iter().take(top_k).sum::<u64>()
            })
            .sum()
    }

    /// Bytes on disk of the largest routed expert.
    pub fn bytes_per_expert(&self) -> u64 {
        self.experts
            .iter()
            .flatten()
            .map(|p| p.iter().map(|p| p.len).sum())
            .max()
            .unwrap_or(0)
    }
}

/// `{module}.{gate,up,down}_proj` as one gated MLP of `[hidden → inter → hidden]`.
fn mlp(
    p: &mut PartBuilder<'_, '_>,
    module: &str,
    hidden: usize,
    inter: usize,
) -> Result<MlpSpec, ModelError> {
    Ok(MlpSpec {
        gate: p.linear(&format!("{module}.gate_proj"), inter, hidden)?,
        up: p.linear(&format!("{module}.up_proj"), inter, hidden)?,
        down: p.linear(&format!("{module}.down_proj"), hidden, inter)?,
    })
}

/// One attention-residual mix: `{stem}_res_norm.weight` and `{stem}_res_proj.weight`.
fn attn_res(
    p: &mut PartBuilder<'_, '_>,
    stem: &str,
    h: usize,
) -> Result<AttnResWeights, ModelError> {
    Ok(AttnResWeights {
        norm: p.vector(&format!("{stem}_res_norm.weight"), h)?,
        proj: p.vector_any(&format!("{stem}_res_proj.weight"), &[1, h])?,
    })
}

/// One hyper-connection: `{module}.{stem}fn` `[gates, width]`, `{module}.{stem}base` `[gates]`
/// and `{module}.{stem}scale` `[scales]`.
fn hyper(
    p: &mut PartBuilder<'_, '_>,
    module: &str,
    stem: &str,
    gates: usize,
    scales: usize,
    width: usize,
) -> Result<HyperWeights, ModelError> {
    Ok(HyperWeights {
        proj: p.matrix(&format!("{module}.{stem}fn"), gates, width)?,
        base: p.vector(&format!("{module}.{stem}base"), gates)?,
        scale: p.vector(&format!("{module}.{stem}scale"), scales)?,
    })
}

/// The trunk part of layer `l`: norms, attention, attention-residual mixes, and the dense MLP
/// or the trunk side of the mixture of experts.
fn layer(
    p: &mut PartBuilder<'_, '_>,
    cfg: &ModelConfig,
    l: usize,
) -> Result<LayerSpec, ModelError> {
    let names = &cfg.names;
    let h = cfg.hidden;
    // Layer `l`'s module `m` (with sublayers, the sublayer's entry of it).
    let at = |m: &str| names.layer_module(l, m);
    let zc = cfg.zero_centred_norms;
    let input_norm = p
        .vector(&format!("{}.weight", at("input_layernorm")), h)?
        .norm(zc);
    let post_norm = p
        .vector(&format!("{}.weight", at("post_attention_layernorm")), h)?
        .norm(zc);
    let plan = &cfg.layer_plan[l];
    let attention = at(names.attention_of(&plan.attention));
    let attn = plan.attention.load(p, &|x| format!("{attention}.{x}"), h)?;
    let mix = match cfg.residual {
        Residual::AttnRes { .. } => Some([
            MixWeights::AttnRes(attn_res(p, &at("self_attention"), h)?),
            MixWeights::AttnRes(attn_res(p, &at("mlp"), h)?),
        ]),
        Residual::Hyper(hc) => {
            let (g, s, w) = (hc.gates(), hc.scales(), hc.streams * h);
            Some([
                MixWeights::Hyper(hyper(p, &at("attn_hc"), "", g, s, w)?),
                MixWeights::Hyper(hyper(p, &at("ffn_hc"), "", g, s, w)?),
            ])
        }
        Residual::Add => None,
    };
    let ffn = match plan.mlp {
        MlpKind::Dense { intermediate } => {
            // The first module the checkpoint has a gate projection under.
            let ck = p.checkpoint();
            let module = names
                .dense
                .iter()
                .map(|m| at(m))
                .find(|m| ck.get(&format!("{m}.gate_proj.weight")).is_some())
                .unwrap_or_else(|| at(names.dense[0]));
            FfnSpec::Dense(mlp(p, &module, h, intermediate)?)
        }
        MlpKind::Moe => {
            let m = &cfg.moe;
            let module = names.moe_module(l);
            let moe = |rest: &str| format!("{module}.{rest}");
            let width = m.router_width();
            let router = p.matrix(&moe(&format!("{}.weight", names.router)), width, h)?;
            let hashed = cfg.is_hash_routed(l);
            let bias = match names.router_bias {
                // `[experts]`, or ERNIE's `[1, experts]`; hash-routed layers select by the token.
                Some(b) if !hashed => Some(p.vector_any(&moe(b), &[width])?),
                _ => None,
            };
            let hash = if hashed {
                Some(p.table(
                    &moe(&format!("{}.tid2eid", names.router)),
                    cfg.vocab,
                    m.top_k,
                )?)
            } else {
                None
            };
            let shared_module = if names.shared_in_layer {
                at(names.shared)
            } else {
                moe(names.shared)
            };
            let (shared, shared_gate) = match &m.shared {
                Some(sh) => (
                    Some(mlp(p, &shared_module, h, sh.intermediate)?),
                    if sh.gated {
                        Some(p.linear(&format!("{shared_module}_gate"), 1, h)?)
                    } else {
                        None
                    },
                ),
                None => (None, None),
            };
            let latent = match &m.latent {
                Some(lat) => Some(LatentSpec {
                    down: p.linear(&moe("routed_expert_down_proj"), lat.dim, h)?,
                    up: p.linear(&moe("routed_expert_up_proj"), h, lat.dim)?,
                    norm: if lat.norm {
                        Some(p.vector(&moe("routed_expert_norm.weight"), lat.dim)?)
                    } else {
                        None
                    },
                }),
                None => None,
            };
            FfnSpec::Moe(MoeSpec {
                router,
                bias,
                shared,
                shared_gate,
                latent,
                hash,
            })
        }
    };
    Ok(LayerSpec {
        input_norm,
        post_norm,
        attn,
        ffn,
        mix,
    })
}

/// The routed experts of layer `l`, one blob each.
fn routed_experts(
    ctx: &Ctx<'_>,
    cfg: &ModelConfig,
    l: usize,
) -> Result<(Vec<Vec<Piece>>, Vec<ExpertSpec>), ModelError> {
    let names = &cfg.names;
    let moe = names.moe_module(l);
    let (gate, up, down) = match names.experts {
        ExpertNames::FusedGateUp => {
            return fused::fused_experts(ctx, cfg, &format!("{moe}.experts"));
        }
        ExpertNames::FusedXw => {
            return fused::xw_experts(ctx, cfg, &format!("{moe}.experts"));
        }
        ExpertNames::Stacked { gate, up, down } => {
            return fused::stacked_experts(ctx, cfg, &moe, [gate, up, down]);
        }
        ExpertNames::Separate { .. }
            if ctx.ck.get(&format!("{moe}.experts.gate_up_proj")).is_some() =>
        {
            return fused::concat_experts(ctx, cfg, &format!("{moe}.experts"));
        }
        ExpertNames::Separate { gate, up, down } => (gate, up, down),
    };
    let width = cfg.moe.expert_width(cfg.hidden);
    let inter = cfg.moe.intermediate;
    let mut pieces = Vec::with_capacity(cfg.moe.experts);
    let mut specs = Vec::with_capacity(cfg.moe.experts);
    for e in 0..cfg.moe.experts {
        let name = |w: &str| format!("{moe}.experts.{e}.{w}");
        let (part, spec) = build_part(ctx, |p| {
            Ok(MlpSpec {
                gate: p.linear(&name(gate), inter, width)?,
                up: p.linear(&name(up), inter, width)?,
                down: p.linear(&name(down), width, inter)?,
            })
        })?;
        pieces.push(part.pieces);
        specs.push(ExpertSpec::SwiGlu(spec));
    }
    Ok((pieces, specs))
}

/// The head: the final norm, lm_head (the embedding matrix when tied) and the final
/// attention-residual mix.
fn head(
    p: &mut PartBuilder<'_, '_>,
    cfg: &ModelConfig,
    embed: &str,
) -> Result<HeadSpec, ModelError> {
    let top = |rest: &str| format!("{}{rest}", cfg.names.prefix);
    let model = |rest: &str| top(&format!("{}{rest}", cfg.names.model));
    let h = cfg.hidden;
    Ok(HeadSpec {
        norm: p
            .vector(&model("norm.weight"), h)?
            .norm(cfg.zero_centred_norms),
        lm_head: if cfg.tie_embeddings {
            p.matrix(embed, cfg.vocab, h)?
        } else {
            p.linear(&top("lm_head"), cfg.vocab, h)?
        },
        mix: match cfg.residual {
            Residual::AttnRes { .. } => {
                Some(MixWeights::AttnRes(attn_res(p, &model("output_attn"), h)?))
            }
            Residual::Hyper(hc) if hc.mean_head => None,
            Residual::Hyper(hc) => Some(MixWeights::Hyper(hyper(
                p,
                &model("hc_head"),
                "hc_",
                hc.streams,
                1,
                hc.streams * h,
            )?)),
            Residual::Add => None,
        },
        rope_alpha: if cfg.rope.learned {
            Some(p.vector(&model("rotary_emb.alpha"), cfg.rope.dim / 2)?)
        } else {
            None
        },
    })
}
