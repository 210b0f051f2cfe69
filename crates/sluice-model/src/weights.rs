//! Where every weight of a model lives, checked against its role.
//!
//! The trunk is split into parts (one per layer, plus the head: final norm and lm_head); each
//! part is a list of byte ranges read together into one [`Blob`]. Routed experts are one blob
//! each. Specs record, for each role, which piece of the blob holds it and how to view it.

use std::collections::HashMap;

use sluice_format::{Checkpoint, Dtype, TensorInfo};
use sluice_kernels::{Codes, Matrix};
use sluice_store::{Blob, Piece};

use crate::ModelError;
use crate::config::{Arch, AttentionConfig, MlpKind, ModelConfig, QkNorm};

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
}

impl MatSpec {
    /// The matrix in `blob`.
    pub fn view<'a>(&self, blob: &'a Blob) -> Result<Matrix<'a>, ModelError> {
        Ok(Matrix::dense(
            self.codes,
            blob.piece(self.piece),
            self.rows,
            self.cols,
        )?)
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
    pub fn new<'c>(ck: &'c Checkpoint, names: &[String]) -> Result<PartLayout, ModelError> {
        let mut infos: Vec<&'c TensorInfo> = names
            .iter()
            .map(|n| ck.tensor(n))
            .collect::<Result<_, _>>()?;
        infos.sort_by_key(|t| (t.shard, t.offset));
        infos.dedup_by_key(|t| (t.shard, t.offset, t.len));
        let pieces = infos
            .iter()
            .map(|t| Piece {
                shard: t.shard as u32,
                offset: t.offset,
                len: t.len,
            })
            .collect();
        let index = infos
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(PartLayout { pieces, index })
    }

    fn piece(&self, name: &str) -> usize {
        // Every name passed to `new` is present.
        self.index[name]
    }

    /// Total bytes.
    pub fn bytes(&self) -> u64 {
        self.pieces.iter().map(|p| p.len).sum()
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

/// Checks a matrix tensor's shape and dtype and records its spec.
fn mat(
    ck: &Checkpoint,
    part: &PartLayout,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<MatSpec, ModelError> {
    let t = ck.tensor(name)?;
    if t.shape != [rows, cols] {
        return Err(ModelError::Tensor {
            tensor: name.to_owned(),
            msg: format!("shape {:?}, expected [{rows}, {cols}]", t.shape),
        });
    }
    Ok(MatSpec {
        piece: part.piece(name),
        codes: codes_of(t)?,
        rows,
        cols,
    })
}

/// Checks a vector tensor's shape and dtype and records its spec.
fn vec(ck: &Checkpoint, part: &PartLayout, name: &str, len: usize) -> Result<VecSpec, ModelError> {
    let t = ck.tensor(name)?;
    if t.shape != [len] {
        return Err(ModelError::Tensor {
            tensor: name.to_owned(),
            msg: format!("shape {:?}, expected [{len}]", t.shape),
        });
    }
    if !matches!(t.dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16) {
        return Err(ModelError::Tensor {
            tensor: name.to_owned(),
            msg: format!("dtype {} is not supported for a vector", t.dtype),
        });
    }
    Ok(VecSpec {
        piece: part.piece(name),
        dtype: t.dtype,
        len,
    })
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

/// Attention weights of a layer.
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
    },
}

/// Feed-forward weights of a layer kept in the trunk.
#[derive(Clone, Debug)]
pub enum FfnSpec {
    /// A dense block.
    Dense(MlpSpec),
    /// The trunk side of a mixture of experts.
    Moe {
        /// Router weight [experts, hidden].
        router: MatSpec,
        /// Selection bias (DeepSeek `e_score_correction_bias`).
        bias: Option<VecSpec>,
        /// Shared expert.
        shared: Option<MlpSpec>,
        /// Shared-expert gate [1, hidden] (Qwen2-MoE).
        shared_gate: Option<MatSpec>,
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
}

/// The head: final norm and lm_head.
#[derive(Clone, Copy, Debug)]
pub struct HeadSpec {
    /// Final norm.
    pub norm: VecSpec,
    /// lm_head [vocab, hidden].
    pub lm_head: MatSpec,
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
    /// Per MoE layer, per expert: pieces.
    pub experts: Vec<Vec<Vec<Piece>>>,
    /// Per MoE layer, per expert: specs into the expert's blob.
    pub expert_specs: Vec<Vec<MlpSpec>>,
}

/// Tensor names of an architecture.
struct Names {
    arch: Arch,
}

impl Names {
    fn layer(&self, l: usize, rest: &str) -> String {
        format!("model.layers.{l}.{rest}")
    }

    fn moe(&self, l: usize, rest: &str) -> String {
        let block = if self.arch == Arch::Mixtral {
            "block_sparse_moe"
        } else {
            "mlp"
        };
        self.layer(l, &format!("{block}.{rest}"))
    }

    fn expert(&self, l: usize, e: usize) -> [String; 3] {
        if self.arch == Arch::Mixtral {
            ["w1", "w3", "w2"].map(|w| self.moe(l, &format!("experts.{e}.{w}.weight")))
        } else {
            ["gate_proj", "up_proj", "down_proj"]
                .map(|w| self.moe(l, &format!("experts.{e}.{w}.weight")))
        }
    }
}

fn mlp_names(prefix: &str) -> [String; 3] {
    ["gate_proj", "up_proj", "down_proj"].map(|w| format!("{prefix}.{w}.weight"))
}

fn mlp_spec(
    ck: &Checkpoint,
    part: &PartLayout,
    n: &[String; 3],
    hidden: usize,
    inter: usize,
) -> Result<MlpSpec, ModelError> {
    Ok(MlpSpec {
        gate: mat(ck, part, &n[0], inter, hidden)?,
        up: mat(ck, part, &n[1], inter, hidden)?,
        down: mat(ck, part, &n[2], hidden, inter)?,
    })
}

impl WeightLayout {
    /// Finds and checks every tensor the model needs.
    pub fn new(ck: &Checkpoint, cfg: &ModelConfig) -> Result<WeightLayout, ModelError> {
        let names = Names { arch: cfg.arch };
        let h = cfg.hidden;

        let embed_name = "model.embed_tokens.weight".to_owned();
        let embed = PartLayout::new(ck, std::slice::from_ref(&embed_name))?;
        let embed_spec = mat(ck, &embed, &embed_name, cfg.vocab, h)?;

        let mut layers = Vec::with_capacity(cfg.layers);
        let mut layer_specs = Vec::with_capacity(cfg.layers);
        let mut experts = Vec::with_capacity(cfg.layers);
        let mut expert_specs = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let mut want: Vec<String> = vec![
                names.layer(l, "input_layernorm.weight"),
                names.layer(l, "post_attention_layernorm.weight"),
            ];
            let opt = |name: String, want: &mut Vec<String>| -> Option<String> {
                ck.get(&name).map(|_| {
                    want.push(name.clone());
                    name
                })
            };
            // Attention tensor names.
            match &cfg.attention {
                AttentionConfig::Gqa {
                    qkv_bias,
                    o_bias,
                    qk_norm,
                    ..
                } => {
                    for p in ["q_proj", "k_proj", "v_proj", "o_proj"] {
                        want.push(names.layer(l, &format!("self_attn.{p}.weight")));
                    }
                    if *qkv_bias {
                        for p in ["q_proj", "k_proj", "v_proj"] {
                            want.push(names.layer(l, &format!("self_attn.{p}.bias")));
                        }
                    }
                    if *o_bias {
                        want.push(names.layer(l, "self_attn.o_proj.bias"));
                    }
                    if *qk_norm != QkNorm::None {
                        want.push(names.layer(l, "self_attn.q_norm.weight"));
                        want.push(names.layer(l, "self_attn.k_norm.weight"));
                    }
                }
                AttentionConfig::Mla {
                    q_lora_rank, bias, ..
                } => {
                    if q_lora_rank.is_some() {
                        for p in ["q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight"] {
                            want.push(names.layer(l, &format!("self_attn.{p}")));
                        }
                    } else {
                        want.push(names.layer(l, "self_attn.q_proj.weight"));
                    }
                    for p in [
                        "kv_a_proj_with_mqa.weight",
                        "kv_a_layernorm.weight",
                        "kv_b_proj.weight",
                        "o_proj.weight",
                    ] {
                        want.push(names.layer(l, &format!("self_attn.{p}")));
                    }
                    if *bias {
                        for p in ["q_a_proj.bias", "kv_a_proj_with_mqa.bias", "o_proj.bias"] {
                            let _ = opt(names.layer(l, &format!("self_attn.{p}")), &mut want);
                        }
                    }
                }
            }
            // Feed-forward tensor names.
            let moe = cfg.is_moe(l);
            if moe {
                want.push(names.moe(l, "gate.weight"));
                if cfg.arch == Arch::DeepseekV3 {
                    want.push(names.moe(l, "gate.e_score_correction_bias"));
                }
                if let Some(sh) = &cfg.moe.shared {
                    let prefix = if sh.gated {
                        "shared_expert"
                    } else {
                        "shared_experts"
                    };
                    want.extend(mlp_names(&names.moe(l, prefix)));
                    if sh.gated {
                        want.push(names.moe(l, "shared_expert_gate.weight"));
                    }
                }
            } else {
                want.extend(mlp_names(&names.layer(l, "mlp")));
            }
            let part = PartLayout::new(ck, &want)?;

            let attn = match &cfg.attention {
                AttentionConfig::Gqa {
                    heads,
                    kv_heads,
                    head_dim,
                    qkv_bias,
                    o_bias,
                    qk_norm,
                    ..
                } => {
                    let (qd, kd) = (heads * head_dim, kv_heads * head_dim);
                    let a = |p: &str| names.layer(l, &format!("self_attn.{p}"));
                    AttnSpec::Gqa {
                        q: mat(ck, &part, &a("q_proj.weight"), qd, h)?,
                        k: mat(ck, &part, &a("k_proj.weight"), kd, h)?,
                        v: mat(ck, &part, &a("v_proj.weight"), kd, h)?,
                        o: mat(ck, &part, &a("o_proj.weight"), h, qd)?,
                        qkv_bias: if *qkv_bias {
                            Some([
                                vec(ck, &part, &a("q_proj.bias"), qd)?,
                                vec(ck, &part, &a("k_proj.bias"), kd)?,
                                vec(ck, &part, &a("v_proj.bias"), kd)?,
                            ])
                        } else {
                            None
                        },
                        o_bias: if *o_bias {
                            Some(vec(ck, &part, &a("o_proj.bias"), h)?)
                        } else {
                            None
                        },
                        qk_norm: match qk_norm {
                            QkNorm::None => None,
                            QkNorm::PerHead => Some([
                                vec(ck, &part, &a("q_norm.weight"), *head_dim)?,
                                vec(ck, &part, &a("k_norm.weight"), *head_dim)?,
                            ]),
                            QkNorm::Full => Some([
                                vec(ck, &part, &a("q_norm.weight"), qd)?,
                                vec(ck, &part, &a("k_norm.weight"), kd)?,
                            ]),
                        },
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
                } => {
                    let a = |p: &str| names.layer(l, &format!("self_attn.{p}"));
                    let qk = qk_nope_head_dim + qk_rope_head_dim;
                    let (q_a, q_b) = match q_lora_rank {
                        Some(r) => (
                            Some((
                                mat(ck, &part, &a("q_a_proj.weight"), *r, h)?,
                                vec(ck, &part, &a("q_a_layernorm.weight"), *r)?,
                            )),
                            mat(ck, &part, &a("q_b_proj.weight"), heads * qk, *r)?,
                        ),
                        None => (None, mat(ck, &part, &a("q_proj.weight"), heads * qk, h)?),
                    };
                    let bias = if *bias {
                        let b = |name: &str, n: usize| -> Result<Option<VecSpec>, ModelError> {
                            if ck.get(&a(name)).is_some() {
                                vec(ck, &part, &a(name), n).map(Some)
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
                        kv_a: mat(
                            ck,
                            &part,
                            &a("kv_a_proj_with_mqa.weight"),
                            kv_lora_rank + qk_rope_head_dim,
                            h,
                        )?,
                        kv_a_norm: vec(ck, &part, &a("kv_a_layernorm.weight"), *kv_lora_rank)?,
                        kv_b: mat(
                            ck,
                            &part,
                            &a("kv_b_proj.weight"),
                            heads * (qk_nope_head_dim + v_head_dim),
                            *kv_lora_rank,
                        )?,
                        o: mat(ck, &part, &a("o_proj.weight"), h, heads * v_head_dim)?,
                        bias,
                    }
                }
            };

            let ffn = if moe {
                let m = &cfg.moe;
                let shared = match &m.shared {
                    Some(sh) => {
                        let prefix = if sh.gated {
                            "shared_expert"
                        } else {
                            "shared_experts"
                        };
                        Some(mlp_spec(
                            ck,
                            &part,
                            &mlp_names(&names.moe(l, prefix)),
                            h,
                            sh.intermediate,
                        )?)
                    }
                    None => None,
                };
                let shared_gate = match &m.shared {
                    Some(sh) if sh.gated => Some(mat(
                        ck,
                        &part,
                        &names.moe(l, "shared_expert_gate.weight"),
                        1,
                        h,
                    )?),
                    _ => None,
                };
                FfnSpec::Moe {
                    router: mat(ck, &part, &names.moe(l, "gate.weight"), m.experts, h)?,
                    bias: if cfg.arch == Arch::DeepseekV3 {
                        Some(vec(
                            ck,
                            &part,
                            &names.moe(l, "gate.e_score_correction_bias"),
                            m.experts,
                        )?)
                    } else {
                        None
                    },
                    shared,
                    shared_gate,
                }
            } else {
                let MlpKind::Dense { intermediate } = cfg.mlp[l] else {
                    unreachable!("checked by is_moe")
                };
                FfnSpec::Dense(mlp_spec(
                    ck,
                    &part,
                    &mlp_names(&names.layer(l, "mlp")),
                    h,
                    intermediate,
                )?)
            };

            let spec = LayerSpec {
                input_norm: vec(ck, &part, &names.layer(l, "input_layernorm.weight"), h)?,
                post_norm: vec(
                    ck,
                    &part,
                    &names.layer(l, "post_attention_layernorm.weight"),
                    h,
                )?,
                attn,
                ffn,
            };

            // Routed experts: one blob each.
            let (mut lp, mut ls) = (Vec::new(), Vec::new());
            if moe {
                for e in 0..cfg.moe.experts {
                    let n = names.expert(l, e);
                    let p = PartLayout::new(ck, &n)?;
                    ls.push(mlp_spec(ck, &p, &n, h, cfg.moe.intermediate)?);
                    lp.push(p.pieces);
                }
            }
            layers.push(part);
            layer_specs.push(spec);
            experts.push(lp);
            expert_specs.push(ls);
        }

        let lm_name = if cfg.tie_embeddings {
            embed_name.clone()
        } else {
            "lm_head.weight".to_owned()
        };
        let head_names = vec!["model.norm.weight".to_owned(), lm_name.clone()];
        let head = PartLayout::new(ck, &head_names)?;
        let head_spec = HeadSpec {
            norm: vec(ck, &head, "model.norm.weight", h)?,
            lm_head: mat(ck, &head, &lm_name, cfg.vocab, h)?,
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
}
