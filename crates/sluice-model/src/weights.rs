//! Where every weight of a model lives, checked against its role.
//!
//! The trunk is split into parts (one per layer, plus the head: final norm and lm_head); each
//! part is a list of byte ranges read together into one [`Blob`]. Routed experts are one blob
//! each. Specs record, for each role, which piece of the blob holds it and how to view it.

use std::collections::HashMap;

use sluice_format::{Checkpoint, Dtype, TensorInfo};
use sluice_kernels::{Codes, Matrix, ScaleType, Scales};
use sluice_store::{Blob, Piece};

use crate::ModelError;
use crate::config::{Arch, AttentionConfig, KdaConfig, MlpKind, ModelConfig, QkNorm, Residual};
use crate::quant::{CtScheme, Matcher, Quantization, Stored};

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
    /// Element type (F32, BF16 or F16).
    pub dtype: Dtype,
    /// Elements.
    pub len: usize,
}

impl VecSpec {
    /// The vector as f32 (exact conversion).
    pub fn to_f32(&self, blob: &Blob) -> Vec<f32> {
        let b = blob.piece(self.piece);
        let codes = match self.dtype {
            Dtype::BF16 => Codes::BF16,
            Dtype::F16 => Codes::F16,
            _ => Codes::F32,
        };
        (0..self.len)
            .map(|j| sluice_kernels::scalar::code(codes, b, j))
            .collect()
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

    fn piece(&self, name: &str) -> usize {
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

fn codes_of(t: &TensorInfo) -> Result<Codes, ModelError> {
    match t.dtype {
        Dtype::F32 => Ok(Codes::F32),
        Dtype::BF16 => Ok(Codes::BF16),
        Dtype::F16 => Ok(Codes::F16),
        d => Err(ModelError::Tensor {
            tensor: t.name.clone(),
            msg: format!("dtype {d} is not supported for a weight matrix here"),
        }),
    }
}

fn tensor_err(tensor: &str, msg: impl Into<String>) -> ModelError {
    ModelError::Tensor {
        tensor: tensor.to_owned(),
        msg: msg.into(),
    }
}

fn check_shape(t: &TensorInfo, want: &[usize], why: &str) -> Result<(), ModelError> {
    if t.shape != want {
        return Err(tensor_err(
            &t.name,
            format!("shape {:?}, expected {want:?}{why}", t.shape),
        ));
    }
    Ok(())
}

fn check_dtype(t: &TensorInfo, allowed: &[Dtype], role: &str) -> Result<(), ModelError> {
    if !allowed.contains(&t.dtype) {
        let names: Vec<&str> = allowed.iter().map(|d| d.safetensors_name()).collect();
        return Err(tensor_err(
            &t.name,
            format!(
                "dtype {} for {role}, expected {}",
                t.dtype,
                names.join(" or ")
            ),
        ));
    }
    Ok(())
}

/// The scale type of a scale tensor's dtype.
fn scale_type(t: &TensorInfo, allowed: &[Dtype]) -> Result<ScaleType, ModelError> {
    check_dtype(t, allowed, "scales")?;
    Ok(match t.dtype {
        Dtype::F32 => ScaleType::F32,
        Dtype::BF16 => ScaleType::BF16,
        Dtype::F16 => ScaleType::F16,
        _ => ScaleType::E8M0, // U8 / F8_E8M0: biased exponents
    })
}

/// Checks a plain matrix tensor's shape and dtype and records its spec.
fn mat(
    ck: &Checkpoint,
    part: &PartLayout,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<MatSpec, ModelError> {
    let t = ck.tensor(name)?;
    check_shape(t, &[rows, cols], "")?;
    Ok(MatSpec::dense(part.piece(name), codes_of(t)?, rows, cols))
}

/// Checks a vector tensor's shape and dtype and records its spec.
fn vec(ck: &Checkpoint, part: &PartLayout, name: &str, len: usize) -> Result<VecSpec, ModelError> {
    let t = ck.tensor(name)?;
    check_shape(t, &[len], "")?;
    check_dtype(t, &[Dtype::F32, Dtype::BF16, Dtype::F16], "a vector")?;
    Ok(VecSpec {
        piece: part.piece(name),
        dtype: t.dtype,
        len,
    })
}

/// A linear layer's weight as the checkpoint stores it.
#[derive(Clone, Debug)]
enum Linear {
    /// `weight` in F32, BF16 or F16.
    Plain { weight: String },
    /// `weight` in FP8 E4M3 with `weight_scale_inv` per block.
    Fp8 {
        weight: String,
        scale: String,
        block: (usize, usize),
    },
    /// compressed-tensors pack-quantized INT4: `weight_packed`, `weight_scale`, `weight_shape`.
    Int4 {
        packed: String,
        scale: String,
        shape: String,
        group: usize,
    },
    /// compressed-tensors MXFP4: `weight_packed`, `weight_scale`.
    Mxfp4 { packed: String, scale: String },
}

impl Linear {
    /// The tensors read into the blob. INT4's `weight_shape` is checked at load, not kept.
    fn names(&self) -> Vec<String> {
        match self {
            Linear::Plain { weight } => vec![weight.clone()],
            Linear::Fp8 { weight, scale, .. } => vec![weight.clone(), scale.clone()],
            Linear::Int4 { packed, scale, .. } | Linear::Mxfp4 { packed, scale } => {
                vec![packed.clone(), scale.clone()]
            }
        }
    }
}

/// Reads `weight_shape` (I64 as compressed-tensors writes it, or I32) of a packed weight.
fn read_weight_shape(ck: &Checkpoint, name: &str) -> Result<Vec<i64>, ModelError> {
    let t = ck.tensor(name)?;
    check_dtype(t, &[Dtype::I64, Dtype::I32], "weight_shape")?;
    check_shape(t, &[2], "")?;
    let bytes = ck.read(t)?;
    Ok(match t.dtype {
        Dtype::I64 => bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
            .collect(),
    })
}

/// What the weight builder needs: the checkpoint and how its weights are quantized.
struct Ctx<'a> {
    ck: &'a Checkpoint,
    cfg: &'a ModelConfig,
    m: Matcher<'a>,
}

impl<'a> Ctx<'a> {
    /// How the linear layer `module` (its weight is `{module}.weight` when plain) is stored,
    /// as the quantization config and the checkpoint say together.
    fn linear(&self, module: &str) -> Result<Linear, ModelError> {
        let ck = self.ck;
        let weight = format!("{module}.weight");
        match self.m.linear(module, true)? {
            Stored::ByDtype => {
                let t = ck.tensor(&weight)?;
                if t.dtype != Dtype::F8E4M3 {
                    return Ok(Linear::Plain { weight });
                }
                let Quantization::Fp8 {
                    block_rows,
                    block_cols,
                } = self.cfg.quant
                else {
                    return Err(tensor_err(
                        &weight,
                        "F8_E4M3 weight, but config.json has no quantization_config with \
                         quant_method fp8 (the block size is unknown)",
                    ));
                };
                let scale = format!("{module}.weight_scale_inv");
                if ck.get(&scale).is_none() {
                    return Err(tensor_err(
                        &scale,
                        format!("missing: `{weight}` is F8_E4M3 and needs its block scales"),
                    ));
                }
                Ok(Linear::Fp8 {
                    weight,
                    scale,
                    block: (block_rows, block_cols),
                })
            }
            Stored::Plain => {
                let packed = format!("{module}.weight_packed");
                if ck.get(&weight).is_none() && ck.get(&packed).is_some() {
                    return Err(tensor_err(
                        &weight,
                        format!(
                            "missing: the checkpoint stores `{packed}`, but quantization_config \
                             does not target `{module}` (it is ignored or in no group)"
                        ),
                    ));
                }
                Ok(Linear::Plain { weight })
            }
            Stored::Packed(g) => {
                let packed = format!("{module}.weight_packed");
                let scale = format!("{module}.weight_scale");
                let fmt = match g.scheme {
                    CtScheme::PackInt4 { .. } => "pack-quantized",
                    CtScheme::Mxfp4 => "mxfp4-pack-quantized",
                };
                for n in [&packed, &scale] {
                    if ck.get(n).is_none() {
                        return Err(tensor_err(
                            n,
                            format!(
                                "missing: quantization_config group `{}` ({fmt}) targets `{module}`",
                                g.name
                            ),
                        ));
                    }
                }
                Ok(match g.scheme {
                    CtScheme::PackInt4 { group } => {
                        let shape = format!("{module}.weight_shape");
                        if ck.get(&shape).is_none() {
                            return Err(tensor_err(
                                &shape,
                                format!(
                                    "missing: quantization_config group `{}` ({fmt}) targets \
                                     `{module}`",
                                    g.name
                                ),
                            ));
                        }
                        Linear::Int4 {
                            packed,
                            scale,
                            shape,
                            group,
                        }
                    }
                    CtScheme::Mxfp4 => Linear::Mxfp4 { packed, scale },
                })
            }
        }
    }

    /// Checks a linear layer's tensors against the `[rows, cols]` the model needs and records
    /// its spec in `part`.
    fn spec(
        &self,
        part: &PartLayout,
        lin: &Linear,
        rows: usize,
        cols: usize,
    ) -> Result<MatSpec, ModelError> {
        let ck = self.ck;
        match lin {
            Linear::Plain { weight } => mat(ck, part, weight, rows, cols),
            Linear::Fp8 {
                weight,
                scale,
                block: (br, bc),
            } => {
                let t = ck.tensor(weight)?;
                check_shape(t, &[rows, cols], "")?;
                let s = ck.tensor(scale)?;
                let ty = scale_type(s, &[Dtype::F32, Dtype::BF16, Dtype::F16, Dtype::F8E8M0])?;
                check_shape(
                    s,
                    &[rows.div_ceil(*br), cols.div_ceil(*bc)],
                    &format!(
                        ": one scale per {br}x{bc} block of the [{rows}, {cols}] weight, \
                         the grid rounded up"
                    ),
                )?;
                Ok(MatSpec {
                    piece: part.piece(weight),
                    codes: Codes::E4M3,
                    rows,
                    cols,
                    scales: Some(ScaleSpec {
                        piece: part.piece(scale),
                        ty,
                        group_rows: *br,
                        group_cols: *bc,
                    }),
                    transposed: false,
                })
            }
            Linear::Int4 {
                packed,
                scale,
                shape,
                group,
            } => {
                let ws = read_weight_shape(ck, shape)?;
                if ws != [rows as i64, cols as i64] {
                    return Err(tensor_err(
                        shape,
                        format!("says {ws:?}, but the model needs [{rows}, {cols}]"),
                    ));
                }
                let p = ck.tensor(packed)?;
                check_dtype(p, &[Dtype::I32], "pack-quantized INT4 codes")?;
                if !cols.is_multiple_of(8) {
                    return Err(tensor_err(
                        packed,
                        format!("{cols} columns are not a whole number of int32 words of 8 codes"),
                    ));
                }
                check_shape(
                    p,
                    &[rows, cols / 8],
                    &format!(" (weight_shape [{rows}, {cols}], eight 4-bit codes per int32)"),
                )?;
                let s = ck.tensor(scale)?;
                let ty = scale_type(s, &[Dtype::BF16, Dtype::F16, Dtype::F32])?;
                check_shape(
                    s,
                    &[rows, cols.div_ceil(*group)],
                    &format!(": one scale per {group} columns of [{rows}, {cols}]"),
                )?;
                Ok(MatSpec {
                    piece: part.piece(packed),
                    codes: Codes::Int4,
                    rows,
                    cols,
                    scales: Some(ScaleSpec {
                        piece: part.piece(scale),
                        ty,
                        group_rows: 1,
                        group_cols: *group,
                    }),
                    transposed: false,
                })
            }
            Linear::Mxfp4 { packed, scale } => {
                let p = ck.tensor(packed)?;
                check_dtype(p, &[Dtype::U8], "MXFP4 codes")?;
                if !cols.is_multiple_of(2) {
                    return Err(tensor_err(packed, format!("{cols} columns are odd")));
                }
                check_shape(p, &[rows, cols / 2], " (two E2M1 codes per byte)")?;
                let s = ck.tensor(scale)?;
                let ty = scale_type(s, &[Dtype::U8, Dtype::F8E8M0])?;
                check_shape(
                    s,
                    &[rows, cols.div_ceil(32)],
                    &format!(": one E8M0 scale per 32 columns of [{rows}, {cols}]"),
                )?;
                Ok(MatSpec {
                    piece: part.piece(packed),
                    codes: Codes::E2M1,
                    rows,
                    cols,
                    scales: Some(ScaleSpec {
                        piece: part.piece(scale),
                        ty,
                        group_rows: 1,
                        group_cols: 32,
                    }),
                    transposed: false,
                })
            }
        }
    }
}

/// The tensors of one part, collected before their specs are made.
struct PartBuilder<'c, 'a> {
    ctx: &'c Ctx<'a>,
    names: Vec<String>,
    lins: HashMap<String, Linear>,
}

impl<'c, 'a> PartBuilder<'c, 'a> {
    fn new(ctx: &'c Ctx<'a>) -> Self {
        PartBuilder {
            ctx,
            names: Vec::new(),
            lins: HashMap::new(),
        }
    }

    /// A plain tensor (norm, bias, router, embedding).
    fn tensor(&mut self, name: String) {
        self.names.push(name);
    }

    /// A linear layer, by module name.
    fn linear(&mut self, module: String) -> Result<(), ModelError> {
        let l = self.ctx.linear(&module)?;
        self.names.extend(l.names());
        self.lins.insert(module, l);
        Ok(())
    }

    fn finish(self) -> Result<Part, ModelError> {
        Ok(Part {
            layout: PartLayout::new(self.ctx.ck, &self.names)?,
            lins: self.lins,
        })
    }
}

/// A part's layout and the linear layers in it.
struct Part {
    layout: PartLayout,
    lins: HashMap<String, Linear>,
}

impl Part {
    fn mat(
        &self,
        ctx: &Ctx<'_>,
        module: &str,
        rows: usize,
        cols: usize,
    ) -> Result<MatSpec, ModelError> {
        let lin = self
            .lins
            .get(module)
            .ok_or_else(|| ModelError::Internal(format!("{module} was not collected")))?;
        ctx.spec(&self.layout, lin, rows, cols)
    }

    fn mlp(
        &self,
        ctx: &Ctx<'_>,
        prefix: &str,
        hidden: usize,
        inter: usize,
    ) -> Result<MlpSpec, ModelError> {
        let [g, u, d] = mlp_modules(prefix);
        Ok(MlpSpec {
            gate: self.mat(ctx, &g, inter, hidden)?,
            up: self.mat(ctx, &u, inter, hidden)?,
            down: self.mat(ctx, &d, hidden, inter)?,
        })
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

/// A GPT-OSS expert: `gate_up` interleaves gate (even rows) and up (odd rows), both with biases.
#[derive(Clone, Copy, Debug)]
pub struct GptOssExpertSpec {
    /// Fused gate/up projection, `[2 × intermediate, hidden]`.
    pub gate_up: MatSpec,
    /// Its bias.
    pub gate_up_bias: VecSpec,
    /// Down projection, `[hidden, intermediate]`.
    pub down: MatSpec,
    /// Its bias.
    pub down_bias: VecSpec,
}

/// What one routed expert holds, as specs into its blob.
#[derive(Clone, Copy, Debug)]
pub enum ExpertSpec {
    /// Separate gate, up and down matrices.
    SwiGlu(MlpSpec),
    /// GPT-OSS's fused projections with biases.
    GptOss(GptOssExpertSpec),
}

/// Attention weights of a layer.
// One per layer, built once at load: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum AttnSpec {
    /// Grouped-query attention.
    Gqa {
        /// Projections.
        q: MatSpec,
        /// Key projection.
        k: MatSpec,
        /// Value projection.
        v: MatSpec,
        /// Output projection.
        o: MatSpec,
        /// Biases of q, k, v.
        qkv_bias: Option<[VecSpec; 3]>,
        /// Output bias.
        o_bias: Option<VecSpec>,
        /// Query and key norm weights.
        qk_norm: Option<[VecSpec; 2]>,
        /// Per-head sink logits (GPT-OSS).
        sinks: Option<VecSpec>,
        /// This layer's sliding window, if it has one.
        window: Option<usize>,
    },
    /// Multi-head latent attention.
    Mla {
        /// `q_a_proj` and `q_a_layernorm` when q is low-rank.
        q_a: Option<(MatSpec, VecSpec)>,
        /// `q_b_proj` (or `q_proj`).
        q_b: MatSpec,
        /// `kv_a_proj_with_mqa`.
        kv_a: MatSpec,
        /// `kv_a_layernorm`.
        kv_a_norm: VecSpec,
        /// `kv_b_proj`.
        kv_b: MatSpec,
        /// `o_proj`.
        o: MatSpec,
        /// Biases of `q_a_proj`, `kv_a_proj_with_mqa`, `o_proj` when `attention_bias`.
        bias: Option<[Option<VecSpec>; 3]>,
        /// Output gate `g_proj` (Kimi K3).
        gate: Option<MatSpec>,
    },
    /// Kimi Delta Attention.
    Kda(KdaSpec),
}

/// KDA's output gate.
#[derive(Clone, Copy, Debug)]
pub enum KdaOutputGate {
    /// `g_proj` `[heads × head_dim, hidden]` (Kimi K3).
    Full(MatSpec),
    /// `g_a_proj` `[head_dim, hidden]` then `g_b_proj` `[heads × head_dim, head_dim]`.
    LowRank(MatSpec, MatSpec),
}

/// The weights of a Kimi Delta Attention layer (`C` = heads × head_dim).
#[derive(Clone, Copy, Debug)]
pub struct KdaSpec {
    /// `q_proj` `[C, hidden]`.
    pub q: MatSpec,
    /// `k_proj` `[C, hidden]`.
    pub k: MatSpec,
    /// `v_proj` `[C, hidden]`.
    pub v: MatSpec,
    /// Depthwise causal convolution taps of q, k, v, each `[C, 1, kernel]`.
    pub conv: [VecSpec; 3],
    /// Forget gate, low rank: `f_a_proj` `[head_dim, hidden]`.
    pub f_a: MatSpec,
    /// `f_b_proj` `[C, head_dim]`.
    pub f_b: MatSpec,
    /// `A_log`, one per head (the first `heads` values of the stored tensor).
    pub a_log: VecSpec,
    /// `dt_bias` `[C]`.
    pub dt_bias: VecSpec,
    /// `b_proj` `[heads, hidden]`: β = σ(b x) per head.
    pub b: MatSpec,
    /// Output gate.
    pub gate: KdaOutputGate,
    /// `o_norm` `[head_dim]`, RMSNorm per head before the gate.
    pub o_norm: VecSpec,
    /// `o_proj` `[hidden, C]`.
    pub o: MatSpec,
}

/// One attention-residual mix: `norm` RMSNorm weights and the `[1, hidden]` score projection.
#[derive(Clone, Copy, Debug)]
pub struct AttnResWeights {
    /// `*_res_norm.weight`.
    pub norm: VecSpec,
    /// `*_res_proj.weight`.
    pub proj: VecSpec,
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
    Moe {
        /// Router weight [experts, hidden].
        router: MatSpec,
        /// DeepSeek's selection-only `e_score_correction_bias`, or GPT-OSS's router bias (added
        /// to the logits).
        bias: Option<VecSpec>,
        /// Shared expert.
        shared: Option<MlpSpec>,
        /// Shared-expert gate [1, hidden] (Qwen2-MoE).
        shared_gate: Option<MatSpec>,
        /// Latent projections (Kimi K3).
        latent: Option<LatentSpec>,
    },
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
    pub attn_res: Option<[AttnResWeights; 2]>,
}

/// The head: final norm and lm_head.
#[derive(Clone, Copy, Debug)]
pub struct HeadSpec {
    /// Final norm.
    pub norm: VecSpec,
    /// lm_head [vocab, hidden].
    pub lm_head: MatSpec,
    /// The attention-residual mix before the final norm.
    pub attn_res: Option<AttnResWeights>,
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
}

/// Tensor names of an architecture.
struct Names {
    arch: Arch,
    /// Prefix of every name (`language_model.` for Kimi K3).
    prefix: String,
}

impl Names {
    /// A name outside the layers.
    fn top(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    fn layer(&self, l: usize, rest: &str) -> String {
        format!("{}model.layers.{l}.{rest}", self.prefix)
    }

    fn moe(&self, l: usize, rest: &str) -> String {
        let block = if matches!(self.arch, Arch::Mixtral | Arch::KimiLinear) {
            "block_sparse_moe"
        } else {
            "mlp"
        };
        self.layer(l, &format!("{block}.{rest}"))
    }

    /// The module of layer `l`'s dense MLP. transformers saves Kimi Linear's as
    /// `block_sparse_moe.{gate,up,down}_proj` (it renames `block_sparse_moe` to `mlp` on load and
    /// back on save, dense layers included), Moonshot's checkpoints as `mlp.*`: either is read.
    fn dense(&self, ck: &Checkpoint, l: usize) -> String {
        let mlp = self.layer(l, "mlp");
        if self.arch == Arch::KimiLinear
            && ck.get(&format!("{mlp}.gate_proj.weight")).is_none()
            && ck.get(&self.moe(l, "gate_proj.weight")).is_some()
        {
            return self.layer(l, "block_sparse_moe");
        }
        mlp
    }

    /// Module names of expert `e`'s gate, up and down projections.
    fn expert(&self, l: usize, e: usize) -> [String; 3] {
        if matches!(self.arch, Arch::Mixtral | Arch::KimiLinear) {
            ["w1", "w3", "w2"].map(|w| self.moe(l, &format!("experts.{e}.{w}")))
        } else {
            ["gate_proj", "up_proj", "down_proj"].map(|w| self.moe(l, &format!("experts.{e}.{w}")))
        }
    }

    /// The router's weight (and GPT-OSS's bias).
    fn router(&self, l: usize) -> (String, Option<String>) {
        if self.arch == Arch::GptOss {
            (
                self.moe(l, "router.weight"),
                Some(self.moe(l, "router.bias")),
            )
        } else {
            (self.moe(l, "gate.weight"), None)
        }
    }
}

fn mlp_modules(prefix: &str) -> [String; 3] {
    ["gate_proj", "up_proj", "down_proj"].map(|w| format!("{prefix}.{w}"))
}

/// The byte range of entry `i` of the `n` along a tensor's first dimension.
fn slice(t: &TensorInfo, i: usize, n: usize) -> Piece {
    let per = t.len / n as u64;
    Piece {
        shard: t.shard as u32,
        offset: t.offset + i as u64 * per,
        len: per,
    }
}

/// GPT-OSS's fused experts of layer `l`, cut into one blob per expert: each expert's slice of a
/// fused tensor is a contiguous byte range.
fn gpt_oss_experts(
    ctx: &Ctx<'_>,
    names: &Names,
    l: usize,
) -> Result<(Vec<Vec<Piece>>, Vec<ExpertSpec>), ModelError> {
    let ck = ctx.ck;
    let cfg = ctx.cfg;
    let (n, h, inter) = (cfg.moe.experts, cfg.hidden, cfg.moe.intermediate);
    let base = names.moe(l, "experts");
    let mxfp4 = ctx.m.gpt_oss_mxfp4(&base);
    // (tensor stem, output features, input features)
    let projs = [("gate_up_proj", 2 * inter, h), ("down_proj", h, inter)];
    struct Fused<'t> {
        stem: &'static str,
        rows: usize,
        cols: usize,
        weight: &'t TensorInfo,
        scales: Option<(&'t TensorInfo, ScaleType)>,
        bias: &'t TensorInfo,
    }
    let mut fused = Vec::with_capacity(2);
    for (stem, rows, cols) in projs {
        let name = format!("{base}.{stem}");
        let (weight, scales) = if mxfp4 {
            let bn = format!("{name}_blocks");
            let sn = format!("{name}_scales");
            for t in [&bn, &sn] {
                if ck.get(t).is_none() {
                    return Err(tensor_err(
                        t,
                        format!(
                            "missing: quantization_config (quant_method mxfp4) converts `{base}` \
                             to MXFP4 blocks and scales"
                        ),
                    ));
                }
            }
            let b = ck.tensor(&bn)?;
            if !cols.is_multiple_of(32) {
                return Err(tensor_err(
                    &bn,
                    format!("{cols} input features are not whole blocks of 32"),
                ));
            }
            check_dtype(b, &[Dtype::U8], "MXFP4 blocks")?;
            check_shape(
                b,
                &[n, rows, cols / 32, 16],
                " ([experts, out, in / 32, 16]: 32 E2M1 codes in 16 bytes per block)",
            )?;
            let s = ck.tensor(&sn)?;
            let ty = scale_type(s, &[Dtype::U8, Dtype::F8E8M0])?;
            check_shape(s, &[n, rows, cols / 32], ": one E8M0 scale per block of 32")?;
            (b, Some((s, ty)))
        } else {
            let Some(w) = ck.get(&name) else {
                let blocks = format!("{name}_blocks");
                return Err(tensor_err(
                    &name,
                    if ck.get(&blocks).is_some() {
                        format!(
                            "missing: the checkpoint stores `{blocks}`; reading it needs \
                             quantization_config with quant_method mxfp4 that converts `{base}`"
                        )
                    } else {
                        "missing".to_owned()
                    },
                ));
            };
            codes_of(w)?;
            check_shape(
                w,
                &[n, cols, rows],
                " ([experts, in, out]: the x @ W layout)",
            )?;
            (w, None)
        };
        let bias = ck.tensor(&format!("{name}_bias"))?;
        check_dtype(bias, &[Dtype::F32, Dtype::BF16, Dtype::F16], "a bias")?;
        check_shape(bias, &[n, rows], "")?;
        fused.push(Fused {
            stem,
            rows,
            cols,
            weight,
            scales,
            bias,
        });
    }
    let mut pieces = Vec::with_capacity(n);
    let mut specs = Vec::with_capacity(n);
    for e in 0..n {
        let mut items = Vec::with_capacity(6);
        for f in &fused {
            items.push((f.stem.to_owned(), slice(f.weight, e, n)));
            items.push((format!("{}.bias", f.stem), slice(f.bias, e, n)));
            if let Some((s, _)) = f.scales {
                items.push((format!("{}.scales", f.stem), slice(s, e, n)));
            }
        }
        let part = PartLayout::from_ranges(items);
        let spec = |f: &Fused<'_>| -> Result<(MatSpec, VecSpec), ModelError> {
            let m = MatSpec {
                piece: part.piece(f.stem),
                codes: match f.scales {
                    Some(_) => Codes::E2M1,
                    None => codes_of(f.weight)?,
                },
                rows: f.rows,
                cols: f.cols,
                scales: f.scales.map(|(_, ty)| ScaleSpec {
                    piece: part.piece(&format!("{}.scales", f.stem)),
                    ty,
                    group_rows: 1,
                    group_cols: 32,
                }),
                transposed: f.scales.is_none(),
            };
            let b = VecSpec {
                piece: part.piece(&format!("{}.bias", f.stem)),
                dtype: f.bias.dtype,
                len: f.rows,
            };
            Ok((m, b))
        };
        let (gate_up, gate_up_bias) = spec(&fused[0])?;
        let (down, down_bias) = spec(&fused[1])?;
        specs.push(ExpertSpec::GptOss(GptOssExpertSpec {
            gate_up,
            gate_up_bias,
            down,
            down_bias,
        }));
        pieces.push(part.pieces);
    }
    Ok((pieces, specs))
}

/// Collects a layer's softmax-attention tensors.
fn collect_attention(
    pb: &mut PartBuilder<'_, '_>,
    ck: &Checkpoint,
    a: &dyn Fn(&str) -> String,
    att: &AttentionConfig,
) -> Result<(), ModelError> {
    match att {
        AttentionConfig::Gqa {
            qkv_bias,
            o_bias,
            qk_norm,
            sinks,
            ..
        } => {
            for p in ["q_proj", "k_proj", "v_proj", "o_proj"] {
                pb.linear(a(p))?;
            }
            if *qkv_bias {
                for p in ["q_proj", "k_proj", "v_proj"] {
                    pb.tensor(a(&format!("{p}.bias")));
                }
            }
            if *o_bias {
                pb.tensor(a("o_proj.bias"));
            }
            if *qk_norm != QkNorm::None {
                pb.tensor(a("q_norm.weight"));
                pb.tensor(a("k_norm.weight"));
            }
            if *sinks {
                pb.tensor(a("sinks"));
            }
        }
        AttentionConfig::Mla {
            q_lora_rank,
            bias,
            output_gate,
            ..
        } => {
            if q_lora_rank.is_some() {
                pb.linear(a("q_a_proj"))?;
                pb.tensor(a("q_a_layernorm.weight"));
                pb.linear(a("q_b_proj"))?;
            } else {
                pb.linear(a("q_proj"))?;
            }
            pb.linear(a("kv_a_proj_with_mqa"))?;
            pb.tensor(a("kv_a_layernorm.weight"));
            pb.linear(a("kv_b_proj"))?;
            pb.linear(a("o_proj"))?;
            if *output_gate {
                pb.linear(a("g_proj"))?;
            }
            if *bias {
                for p in ["q_a_proj.bias", "kv_a_proj_with_mqa.bias", "o_proj.bias"] {
                    if ck.get(&a(p)).is_some() {
                        pb.tensor(a(p));
                    }
                }
            }
        }
    }
    Ok(())
}

/// The specs of layer `l`'s softmax attention.
fn attention_spec(
    ctx: &Ctx<'_>,
    part: &Part,
    a: &dyn Fn(&str) -> String,
    cfg: &ModelConfig,
    l: usize,
) -> Result<AttnSpec, ModelError> {
    let ck = ctx.ck;
    let pl = &part.layout;
    let h = cfg.hidden;
    Ok(match &cfg.attention {
        AttentionConfig::Gqa {
            heads,
            kv_heads,
            head_dim,
            qkv_bias,
            o_bias,
            qk_norm,
            sinks,
            ..
        } => {
            let (qd, kd) = (heads * head_dim, kv_heads * head_dim);
            AttnSpec::Gqa {
                q: part.mat(ctx, &a("q_proj"), qd, h)?,
                k: part.mat(ctx, &a("k_proj"), kd, h)?,
                v: part.mat(ctx, &a("v_proj"), kd, h)?,
                o: part.mat(ctx, &a("o_proj"), h, qd)?,
                qkv_bias: if *qkv_bias {
                    Some([
                        vec(ck, pl, &a("q_proj.bias"), qd)?,
                        vec(ck, pl, &a("k_proj.bias"), kd)?,
                        vec(ck, pl, &a("v_proj.bias"), kd)?,
                    ])
                } else {
                    None
                },
                o_bias: if *o_bias {
                    Some(vec(ck, pl, &a("o_proj.bias"), h)?)
                } else {
                    None
                },
                qk_norm: match qk_norm {
                    QkNorm::None => None,
                    QkNorm::PerHead => Some([
                        vec(ck, pl, &a("q_norm.weight"), *head_dim)?,
                        vec(ck, pl, &a("k_norm.weight"), *head_dim)?,
                    ]),
                    QkNorm::Full => Some([
                        vec(ck, pl, &a("q_norm.weight"), qd)?,
                        vec(ck, pl, &a("k_norm.weight"), kd)?,
                    ]),
                },
                sinks: if *sinks {
                    Some(vec(ck, pl, &a("sinks"), *heads)?)
                } else {
                    None
                },
                window: cfg.attention.window(l),
            }
        }
        AttentionConfig::Mla {
            heads,
            q_lora_rank,
            kv_lora_rank,
            qk_nope_head_dim,
            qk_rope_head_dim,
            v_head_dim,
            bias,
            output_gate,
            ..
        } => {
            let qk = qk_nope_head_dim + qk_rope_head_dim;
            let (q_a, q_b) = match q_lora_rank {
                Some(r) => (
                    Some((
                        part.mat(ctx, &a("q_a_proj"), *r, h)?,
                        vec(ck, pl, &a("q_a_layernorm.weight"), *r)?,
                    )),
                    part.mat(ctx, &a("q_b_proj"), heads * qk, *r)?,
                ),
                None => (None, part.mat(ctx, &a("q_proj"), heads * qk, h)?),
            };
            let bias = if *bias {
                let b = |name: &str, n: usize| -> Result<Option<VecSpec>, ModelError> {
                    if ck.get(&a(name)).is_some() {
                        vec(ck, pl, &a(name), n).map(Some)
                    } else {
                        Ok(None)
                    }
                };
                Some([
                    match q_lora_rank {
                        Some(r) => b("q_a_proj.bias", *r)?,
                        None => None,
                    },
                    b("kv_a_proj_with_mqa.bias", kv_lora_rank + qk_rope_head_dim)?,
                    b("o_proj.bias", h)?,
                ])
            } else {
                None
            };
            AttnSpec::Mla {
                q_a,
                q_b,
                kv_a: part.mat(
                    ctx,
                    &a("kv_a_proj_with_mqa"),
                    kv_lora_rank + qk_rope_head_dim,
                    h,
                )?,
                kv_a_norm: vec(ck, pl, &a("kv_a_layernorm.weight"), *kv_lora_rank)?,
                kv_b: part.mat(
                    ctx,
                    &a("kv_b_proj"),
                    heads * (qk_nope_head_dim + v_head_dim),
                    *kv_lora_rank,
                )?,
                o: part.mat(ctx, &a("o_proj"), h, heads * v_head_dim)?,
                bias,
                gate: if *output_gate {
                    Some(part.mat(ctx, &a("g_proj"), heads * v_head_dim, h)?)
                } else {
                    None
                },
            }
        }
    })
}

/// Collects a KDA layer's tensors.
fn collect_kda(
    pb: &mut PartBuilder<'_, '_>,
    a: &dyn Fn(&str) -> String,
    k: &KdaConfig,
) -> Result<(), ModelError> {
    for p in [
        "q_proj", "k_proj", "v_proj", "f_a_proj", "f_b_proj", "b_proj", "o_proj",
    ] {
        pb.linear(a(p))?;
    }
    if k.full_rank_output_gate {
        pb.linear(a("g_proj"))?;
    } else {
        pb.linear(a("g_a_proj"))?;
        pb.linear(a("g_b_proj"))?;
    }
    for p in [
        "q_conv1d.weight",
        "k_conv1d.weight",
        "v_conv1d.weight",
        "A_log",
        "dt_bias",
        "o_norm.weight",
    ] {
        pb.tensor(a(p));
    }
    Ok(())
}

/// The specs of a KDA layer.
fn kda_spec(
    ctx: &Ctx<'_>,
    part: &Part,
    a: &dyn Fn(&str) -> String,
    k: &KdaConfig,
    h: usize,
) -> Result<AttnSpec, ModelError> {
    let ck = ctx.ck;
    let pl = &part.layout;
    let (c, d, heads) = (k.width(), k.head_dim, k.heads);
    let conv = |p: &str| vec_any(ck, pl, &a(p), &[c, 1, k.conv_kernel]);
    Ok(AttnSpec::Kda(KdaSpec {
        q: part.mat(ctx, &a("q_proj"), c, h)?,
        k: part.mat(ctx, &a("k_proj"), c, h)?,
        v: part.mat(ctx, &a("v_proj"), c, h)?,
        conv: [
            conv("q_conv1d.weight")?,
            conv("k_conv1d.weight")?,
            conv("v_conv1d.weight")?,
        ],
        f_a: part.mat(ctx, &a("f_a_proj"), d, h)?,
        f_b: part.mat(ctx, &a("f_b_proj"), c, d)?,
        a_log: a_log(ck, pl, &a("A_log"), heads)?,
        dt_bias: vec_any(ck, pl, &a("dt_bias"), &[c])?,
        b: part.mat(ctx, &a("b_proj"), heads, h)?,
        gate: if k.full_rank_output_gate {
            KdaOutputGate::Full(part.mat(ctx, &a("g_proj"), c, h)?)
        } else {
            KdaOutputGate::LowRank(
                part.mat(ctx, &a("g_a_proj"), d, h)?,
                part.mat(ctx, &a("g_b_proj"), c, d)?,
            )
        },
        o_norm: vec(ck, pl, &a("o_norm.weight"), d)?,
        o: part.mat(ctx, &a("o_proj"), h, c)?,
    }))
}

/// A vector stored in any shape of `numel(want)` elements: `[1, n]` projections, `[c, 1, k]`
/// convolution taps, transformers' `[1, 1, h, 1]` `A_log`. A shape of another rank is accepted
/// when its element count matches (checkpoints disagree on these singleton dimensions).
fn vec_any(
    ck: &Checkpoint,
    part: &PartLayout,
    name: &str,
    want: &[usize],
) -> Result<VecSpec, ModelError> {
    let t = ck.tensor(name)?;
    let len: usize = want.iter().product();
    let n: usize = t.shape.iter().product();
    if n != len {
        return Err(tensor_err(
            name,
            format!("shape {:?} ({n} elements), expected {want:?}", t.shape),
        ));
    }
    check_dtype(t, &[Dtype::F32, Dtype::BF16, Dtype::F16], "a vector")?;
    Ok(VecSpec {
        piece: part.piece(name),
        dtype: t.dtype,
        len,
    })
}

/// KDA's `A_log`: one value per head. Kimi K3 ships it padded with zeros to `head_dim` values
/// (`F32 [128]` for 96 heads); the padding is checked to be exactly zero, since anything else
/// would mean a layout sluice does not understand.
fn a_log(
    ck: &Checkpoint,
    part: &PartLayout,
    name: &str,
    heads: usize,
) -> Result<VecSpec, ModelError> {
    let t = ck.tensor(name)?;
    let n: usize = t.shape.iter().product();
    if n == heads {
        return vec_any(ck, part, name, &[heads]);
    }
    if t.shape.len() != 1 || n < heads {
        return Err(tensor_err(
            name,
            format!(
                "shape {:?}: expected {heads} values (one per head), or a vector zero-padded \
                 past them",
                t.shape
            ),
        ));
    }
    check_dtype(t, &[Dtype::F32, Dtype::BF16, Dtype::F16], "a vector")?;
    let bytes = ck.read(t)?;
    let codes = match t.dtype {
        Dtype::BF16 => Codes::BF16,
        Dtype::F16 => Codes::F16,
        _ => Codes::F32,
    };
    if let Some(i) = (heads..n).find(|&i| sluice_kernels::scalar::code(codes, &bytes, i) != 0.0) {
        return Err(tensor_err(
            name,
            format!(
                "{n} values for {heads} heads, and value {i} past the heads is not zero: not \
                 the zero padding Kimi K3 ships"
            ),
        ));
    }
    Ok(VecSpec {
        piece: part.piece(name),
        dtype: t.dtype,
        len: heads,
    })
}

/// The config's `num_hidden_layers` against the layers the checkpoint has tensors for, before
/// anything proportional to it is built: more layers than the checkpoint names the first
/// missing tensor; fewer (a silently truncated model) names the tensors that would go unused.
/// Draft layers (`num_nextn_predict_layers`) directly after the last may be present.
fn check_layer_count(ck: &Checkpoint, cfg: &ModelConfig) -> Result<(), ModelError> {
    let head = format!("{}model.layers.", cfg.prefix);
    let layer_of = |name: &str| -> Option<usize> {
        let rest = name.strip_prefix(&head)?;
        rest.split('.').next()?.parse().ok()
    };
    let config = ck.dir().join("config.json");
    let used = cfg.layers.saturating_add(cfg.draft_layers);
    let mut unused: Vec<&str> = ck
        .tensors()
        .iter()
        .filter(|t| layer_of(&t.name).is_some_and(|l| l >= used))
        .map(|t| t.name.as_str())
        .collect();
    if !unused.is_empty() {
        unused.sort_unstable();
        let n = unused.len();
        let shown = unused[..n.min(3)].join(", ");
        return Err(ModelError::Config {
            file: config,
            field: "num_hidden_layers".into(),
            msg: format!(
                "{} layers, but the checkpoint has more: {n} tensors would go unused ({shown}{})",
                cfg.layers,
                if n > 3 { ", …" } else { "" }
            ),
        });
    }
    let present = ck
        .tensors()
        .iter()
        .filter_map(|t| layer_of(&t.name))
        .max()
        .map_or(0, |l| l + 1);
    if cfg.layers > present {
        return Err(ModelError::Config {
            file: config,
            field: "num_hidden_layers".into(),
            msg: format!(
                "{} layers, but the checkpoint has tensors for {present} (nothing named \
                 {head}{present}.*)",
                cfg.layers
            ),
        });
    }
    Ok(())
}

impl WeightLayout {
    /// Finds and checks every tensor the model needs, packed ones against the model's
    /// `quantization_config`.
    pub fn new(ck: &Checkpoint, cfg: &ModelConfig) -> Result<WeightLayout, ModelError> {
        let ctx = Ctx {
            ck,
            cfg,
            m: Matcher::new(&cfg.quant),
        };
        let names = Names {
            arch: cfg.arch,
            prefix: cfg.prefix.clone(),
        };
        check_layer_count(ck, cfg)?;
        let h = cfg.hidden;
        let attn_res = matches!(cfg.residual, Residual::AttnRes { .. });

        let embed_name = names.top("model.embed_tokens.weight");
        let embed = PartLayout::new(ck, std::slice::from_ref(&embed_name))?;
        let embed_spec = mat(ck, &embed, &embed_name, cfg.vocab, h)?;

        let mut layers = Vec::with_capacity(cfg.layers);
        let mut layer_specs = Vec::with_capacity(cfg.layers);
        let mut experts = Vec::with_capacity(cfg.layers);
        let mut expert_specs = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let mut pb = PartBuilder::new(&ctx);
            pb.tensor(names.layer(l, "input_layernorm.weight"));
            pb.tensor(names.layer(l, "post_attention_layernorm.weight"));
            let a = |p: &str| names.layer(l, &format!("self_attn.{p}"));
            // Attention tensors.
            let kda = match (cfg.is_kda(l), &cfg.kda) {
                (true, Some(k)) => Some(*k),
                (true, None) => {
                    return Err(ModelError::Internal(format!(
                        "layer {l} is KDA but the config has no linear_attn_config"
                    )));
                }
                (false, _) => None,
            };
            if let Some(k) = &kda {
                collect_kda(&mut pb, &a, k)?;
            } else {
                collect_attention(&mut pb, ck, &a, &cfg.attention)?;
            }
            if attn_res {
                for p in [
                    "self_attention_res_norm.weight",
                    "self_attention_res_proj.weight",
                    "mlp_res_norm.weight",
                    "mlp_res_proj.weight",
                ] {
                    pb.tensor(names.layer(l, p));
                }
            }
            // Feed-forward tensors.
            let moe = cfg.is_moe(l);
            let dense_prefix = names.dense(ck, l);
            let shared_prefix = |gated: bool| {
                names.moe(
                    l,
                    if gated {
                        "shared_expert"
                    } else {
                        "shared_experts"
                    },
                )
            };
            let has_score_bias = matches!(cfg.arch, Arch::DeepseekV3 | Arch::KimiLinear);
            if moe {
                let (rw, rb) = names.router(l);
                pb.tensor(rw);
                if let Some(rb) = rb {
                    pb.tensor(rb);
                }
                if has_score_bias {
                    pb.tensor(names.moe(l, "gate.e_score_correction_bias"));
                }
                if let Some(sh) = &cfg.moe.shared {
                    for m in mlp_modules(&shared_prefix(sh.gated)) {
                        pb.linear(m)?;
                    }
                    if sh.gated {
                        pb.linear(names.moe(l, "shared_expert_gate"))?;
                    }
                }
                if let Some(lat) = &cfg.moe.latent {
                    pb.linear(names.moe(l, "routed_expert_down_proj"))?;
                    pb.linear(names.moe(l, "routed_expert_up_proj"))?;
                    if lat.norm {
                        pb.tensor(names.moe(l, "routed_expert_norm.weight"));
                    }
                }
            } else {
                for m in mlp_modules(&dense_prefix) {
                    pb.linear(m)?;
                }
            }
            let part = pb.finish()?;
            let pl = &part.layout;

            let attn = match &kda {
                Some(k) => kda_spec(&ctx, &part, &a, k, h)?,
                None => attention_spec(&ctx, &part, &a, cfg, l)?,
            };

            let ffn = if moe {
                let m = &cfg.moe;
                let shared = match &m.shared {
                    Some(sh) => {
                        Some(part.mlp(&ctx, &shared_prefix(sh.gated), h, sh.intermediate)?)
                    }
                    None => None,
                };
                let shared_gate = match &m.shared {
                    Some(sh) if sh.gated => {
                        Some(part.mat(&ctx, &names.moe(l, "shared_expert_gate"), 1, h)?)
                    }
                    _ => None,
                };
                let (rw, rb) = names.router(l);
                let bias = match (has_score_bias, rb) {
                    (true, _) => Some(vec(
                        ck,
                        pl,
                        &names.moe(l, "gate.e_score_correction_bias"),
                        m.experts,
                    )?),
                    (_, Some(rb)) => Some(vec(ck, pl, &rb, m.experts)?),
                    _ => None,
                };
                let latent = match &m.latent {
                    Some(lat) => Some(LatentSpec {
                        down: part.mat(
                            &ctx,
                            &names.moe(l, "routed_expert_down_proj"),
                            lat.dim,
                            h,
                        )?,
                        up: part.mat(&ctx, &names.moe(l, "routed_expert_up_proj"), h, lat.dim)?,
                        norm: if lat.norm {
                            Some(vec(
                                ck,
                                pl,
                                &names.moe(l, "routed_expert_norm.weight"),
                                lat.dim,
                            )?)
                        } else {
                            None
                        },
                    }),
                    None => None,
                };
                FfnSpec::Moe {
                    router: mat(ck, pl, &rw, m.experts, h)?,
                    bias,
                    shared,
                    shared_gate,
                    latent,
                }
            } else {
                let MlpKind::Dense { intermediate } = cfg.mlp[l] else {
                    unreachable!("checked by is_moe")
                };
                FfnSpec::Dense(part.mlp(&ctx, &dense_prefix, h, intermediate)?)
            };

            let res = if attn_res {
                let pair = |norm: &str, proj: &str| -> Result<AttnResWeights, ModelError> {
                    Ok(AttnResWeights {
                        norm: vec(ck, pl, &names.layer(l, norm), h)?,
                        proj: vec_any(ck, pl, &names.layer(l, proj), &[1, h])?,
                    })
                };
                Some([
                    pair(
                        "self_attention_res_norm.weight",
                        "self_attention_res_proj.weight",
                    )?,
                    pair("mlp_res_norm.weight", "mlp_res_proj.weight")?,
                ])
            } else {
                None
            };

            let spec = LayerSpec {
                input_norm: vec(ck, pl, &names.layer(l, "input_layernorm.weight"), h)?,
                post_norm: vec(
                    ck,
                    pl,
                    &names.layer(l, "post_attention_layernorm.weight"),
                    h,
                )?,
                attn,
                ffn,
                attn_res: res,
            };

            // Routed experts: one blob each.
            let (mut lp, mut ls) = (Vec::new(), Vec::new());
            if moe {
                if cfg.arch == Arch::GptOss {
                    (lp, ls) = gpt_oss_experts(&ctx, &names, l)?;
                } else {
                    let width = cfg.moe.expert_width(h);
                    for e in 0..cfg.moe.experts {
                        let mut eb = PartBuilder::new(&ctx);
                        let mods = names.expert(l, e);
                        for m in &mods {
                            eb.linear(m.clone())?;
                        }
                        let p = eb.finish()?;
                        let inter = cfg.moe.intermediate;
                        ls.push(ExpertSpec::SwiGlu(MlpSpec {
                            gate: p.mat(&ctx, &mods[0], inter, width)?,
                            up: p.mat(&ctx, &mods[1], inter, width)?,
                            down: p.mat(&ctx, &mods[2], width, inter)?,
                        }));
                        lp.push(p.layout.pieces);
                    }
                }
            }
            layers.push(part.layout);
            layer_specs.push(spec);
            experts.push(lp);
            expert_specs.push(ls);
        }

        let lm_module = if cfg.tie_embeddings {
            None
        } else {
            Some(names.top("lm_head"))
        };
        let norm_name = names.top("model.norm.weight");
        let (res_norm, res_proj) = (
            names.top("model.output_attn_res_norm.weight"),
            names.top("model.output_attn_res_proj.weight"),
        );
        let mut hb = PartBuilder::new(&ctx);
        hb.tensor(norm_name.clone());
        match &lm_module {
            Some(m) => hb.linear(m.clone())?,
            None => hb.tensor(embed_name.clone()),
        }
        if attn_res {
            hb.tensor(res_norm.clone());
            hb.tensor(res_proj.clone());
        }
        let head = hb.finish()?;
        let head_spec = HeadSpec {
            norm: vec(ck, &head.layout, &norm_name, h)?,
            lm_head: match &lm_module {
                Some(m) => head.mat(&ctx, m, cfg.vocab, h)?,
                None => mat(ck, &head.layout, &embed_name, cfg.vocab, h)?,
            },
            attn_res: if attn_res {
                Some(AttnResWeights {
                    norm: vec(ck, &head.layout, &res_norm, h)?,
                    proj: vec_any(ck, &head.layout, &res_proj, &[1, h])?,
                })
            } else {
                None
            },
        };
        Ok(WeightLayout {
            embed,
            embed_spec,
            layers,
            layer_specs,
            head: head.layout,
            head_spec,
            experts,
            expert_specs,
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
