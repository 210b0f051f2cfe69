//! Synthetic checkpoints: DeepSeek-V3- or DeepSeek-V4-shaped models of any size written straight
//! to disk in Hugging Face layout (sharded like real releases), with router weights that make
//! some experts hotter than others. For tests and benchmarks (`sluice synth`); no Python needed.
//! A tool, not part of the engine: it uses nothing of the model crate, and sluice-model's tests
//! check that what it writes loads and runs.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};
use sluice_format::Dtype;
use sluice_kernels::decode::f32_to_bf16;

/// The shape of a synthetic DeepSeek-V3 model.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthSpec {
    /// Vocabulary size.
    pub vocab: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Layers.
    pub layers: usize,
    /// Leading dense layers.
    pub first_dense: usize,
    /// Dense intermediate size.
    pub dense_inter: usize,
    /// Routed experts per MoE layer.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Expert intermediate size.
    pub moe_inter: usize,
    /// Shared experts.
    pub shared: usize,
    /// Attention heads.
    pub heads: usize,
    /// Query low rank (0: none).
    pub q_lora: usize,
    /// Latent KV rank.
    pub kv_lora: usize,
    /// Non-rotary head dim.
    pub nope: usize,
    /// Rotary head dim.
    pub rope: usize,
    /// Value head dim.
    pub v_head: usize,
    /// Layers per shard (1: one layer per shard, as releases do).
    pub layers_per_shard: usize,
    /// How much hotter popular experts are: 0 gives a flat router; 1 a strong Zipf-like skew.
    pub skew: f32,
    /// Seed of every value.
    pub seed: u64,
    /// How the routed experts are stored.
    pub experts_format: ExpertFormat,
    /// Which architecture.
    pub arch: SynthArch,
}

/// The architecture of a synthetic model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SynthArch {
    /// DeepSeek-V3: MLA, sigmoid group routing, the first `first_dense` layers dense.
    #[default]
    DeepseekV3,
    /// DeepSeek-V4 under DeepSeek's tensor names: shared-KV attention with heads of
    /// `nope + rope` (the last `rope` rotated) over a window of 128, transformers' default
    /// layer types (two heavily compressed layers, then compressed-sparse and heavily
    /// compressed alternating; windows of 4 and 128, an indexer keeping 64 entries), the grouped
    /// output projection (2 groups of `kv_lora`), 4 hyper-connection streams, √softplus routing
    /// with the first three layers hash-routed, every layer MoE; BF16 experts only.
    DeepseekV4,
}

impl SynthArch {
    /// By name: `deepseek_v3` or `deepseek_v4`.
    pub fn from_name(s: &str) -> Option<SynthArch> {
        match s {
            "deepseek_v3" => Some(SynthArch::DeepseekV3),
            "deepseek_v4" => Some(SynthArch::DeepseekV4),
            _ => None,
        }
    }
}

/// DeepSeek-V4's synthetic shape beyond [`SynthSpec`]'s fields.
const V4_WINDOW: usize = 128;
const V4_SPARSE_RATE: usize = 4;
const V4_HEAVY_RATE: usize = 128;
const V4_INDEX_TOP_K: usize = 64;
const V4_STREAMS: usize = 4;
const V4_HASH_LAYERS: usize = 3;

/// How a synthetic model stores its routed experts (everything else is BF16).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExpertFormat {
    /// BF16.
    #[default]
    Bf16,
    /// compressed-tensors `pack-quantized`: symmetric INT4, eight codes per int32, one BF16
    /// scale per 32 columns (Kimi K2 Thinking's layout).
    Int4,
    /// compressed-tensors `mxfp4-pack-quantized`: E2M1 codes two per byte, one E8M0 scale per
    /// 32 columns (Kimi K3's layout).
    Mxfp4,
}

impl ExpertFormat {
    /// By name: `bf16`, `int4` or `mxfp4`.
    pub fn from_name(s: &str) -> Option<ExpertFormat> {
        match s {
            "bf16" => Some(ExpertFormat::Bf16),
            "int4" => Some(ExpertFormat::Int4),
            "mxfp4" => Some(ExpertFormat::Mxfp4),
            _ => None,
        }
    }
}

impl Default for SynthSpec {
    /// A small model (~40 MB): hidden 256, 4 layers, 64 experts top-6.
    fn default() -> Self {
        SynthSpec {
            vocab: 1024,
            hidden: 256,
            layers: 4,
            first_dense: 1,
            dense_inter: 512,
            experts: 64,
            top_k: 6,
            moe_inter: 128,
            shared: 1,
            heads: 4,
            q_lora: 64,
            kv_lora: 64,
            nope: 32,
            rope: 16,
            v_head: 32,
            layers_per_shard: 1,
            skew: 0.5,
            seed: 1,
            experts_format: ExpertFormat::Bf16,
            arch: SynthArch::DeepseekV3,
        }
    }
}

/// A tensor to write: name, shape, generator.
struct Planned {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    fill: Fill,
}

#[derive(Clone, Copy)]
enum Fill {
    /// Uniform in ±scale, bf16.
    Uniform(f32),
    /// All ones (norm weights), bf16.
    Ones,
    /// The selection bias: a fixed Zipf-like profile of strength `skew`, F32.
    Bias(f32),
    /// Random bytes (packed codes).
    Bytes,
    /// Every element the same little-endian 16-bit value.
    Const16(u16),
    /// Every element the same byte.
    Const8(u8),
    /// A `weight_shape` tensor: two int64.
    Shape(u32, u32),
    /// A token-to-experts table (`tid2eid`), int64: each row the given number of distinct
    /// experts of `0..experts`.
    Hash(u32),
}

/// A fast deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn name_seed(seed: u64, name: &str) -> u64 {
    name.bytes().fold(seed ^ 0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

impl SynthSpec {
    /// The model's `config.json`.
    pub fn config(&self) -> Value {
        if self.arch == SynthArch::DeepseekV4 {
            return self.config_v4();
        }
        let mut c = json!({
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": self.dense_inter,
            "moe_intermediate_size": self.moe_inter,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.heads,
            "n_shared_experts": self.shared,
            "n_routed_experts": self.experts,
            "num_experts_per_tok": self.top_k,
            "first_k_dense_replace": self.first_dense,
            "n_group": 1,
            "topk_group": 1,
            "norm_topk_prob": true,
            "routed_scaling_factor": 2.5,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "q_lora_rank": if self.q_lora == 0 { Value::Null } else { json!(self.q_lora) },
            "kv_lora_rank": self.kv_lora,
            "qk_nope_head_dim": self.nope,
            "qk_rope_head_dim": self.rope,
            "v_head_dim": self.v_head,
            "hidden_act": "silu",
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "tie_word_embeddings": false,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "dtype": "bfloat16"
        });
        let q = match self.experts_format {
            ExpertFormat::Bf16 => None,
            ExpertFormat::Int4 => Some(json!({
                "quant_method": "compressed-tensors",
                "format": "pack-quantized",
                "quantization_status": "compressed",
                "config_groups": {"group_0": {
                    "targets": ["re:.*mlp\\.experts\\..*"],
                    "weights": {"num_bits": 4, "type": "int", "symmetric": true,
                                "strategy": "group", "group_size": 32, "dynamic": false,
                                "actorder": null, "block_structure": null},
                    "input_activations": null, "output_activations": null}},
                "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|down)_proj.*"],
                "kv_cache_scheme": null
            })),
            ExpertFormat::Mxfp4 => Some(json!({
                "quant_method": "compressed-tensors",
                "format": "mxfp4-pack-quantized",
                "quantization_status": "compressed",
                "config_groups": {"group_0": {
                    "format": "mxfp4-pack-quantized",
                    "targets": ["re:.*mlp\\.experts\\..*"],
                    "weights": {"num_bits": 4, "type": "float", "symmetric": true,
                                "strategy": "group", "group_size": 32, "dynamic": false,
                                "actorder": null, "block_structure": null,
                                "scale_dtype": "torch.uint8", "zp_dtype": null},
                    "input_activations": null, "output_activations": null}},
                "ignore": ["re:.*self_attn.*", "re:.*mlp\\.gate$", "lm_head"],
                "kv_cache_scheme": null
            })),
        };
        if let (Some(q), Some(obj)) = (q, c.as_object_mut()) {
            obj.insert("quantization_config".into(), q);
        }
        c
    }

    /// DeepSeek-V4's layer types: transformers' default.
    fn v4_heavy(l: usize) -> bool {
        l < 2 || l.is_multiple_of(2)
    }

    /// DeepSeek-V4's head width, indexer head width and output groups.
    fn v4_dims(&self) -> (usize, usize, usize) {
        let groups = if self.heads.is_multiple_of(2) { 2 } else { 1 };
        (self.nope + self.rope, (2 * self.rope).max(16), groups)
    }

    fn config_v4(&self) -> Value {
        let (hd, ihd, groups) = self.v4_dims();
        let layer_types: Vec<&str> = (0..self.layers)
            .map(|l| {
                if Self::v4_heavy(l) {
                    "heavily_compressed_attention"
                } else {
                    "compressed_sparse_attention"
                }
            })
            .collect();
        let mlp_types: Vec<&str> = (0..self.layers)
            .map(|l| {
                if l < V4_HASH_LAYERS {
                    "hash_moe"
                } else {
                    "moe"
                }
            })
            .collect();
        let partial = self.rope as f64 / hd as f64;
        json!({
            "architectures": ["DeepseekV4ForCausalLM"],
            "model_type": "deepseek_v4",
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "moe_intermediate_size": self.moe_inter,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": 1,
            "head_dim": hd,
            "q_lora_rank": self.q_lora.max(1),
            "partial_rotary_factor": partial,
            "n_shared_experts": self.shared,
            "n_routed_experts": self.experts,
            "num_experts_per_tok": self.top_k,
            "norm_topk_prob": true,
            "routed_scaling_factor": 1.5,
            "scoring_func": "sqrtsoftplus",
            "swiglu_limit": 10.0,
            "sliding_window": V4_WINDOW,
            "o_groups": groups,
            "o_lora_rank": self.kv_lora,
            "index_n_heads": self.heads,
            "index_head_dim": ihd,
            "index_topk": V4_INDEX_TOP_K,
            "compress_rates": {
                "compressed_sparse_attention": V4_SPARSE_RATE,
                "heavily_compressed_attention": V4_HEAVY_RATE
            },
            "layer_types": layer_types,
            "mlp_layer_types": mlp_types,
            "hc_mult": V4_STREAMS,
            "hc_sinkhorn_iters": 20,
            "hc_eps": 1e-6,
            "rope_parameters": {
                "main": {"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": partial},
                "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "factor": 16.0,
                             "original_max_position_embeddings": 65536, "beta_fast": 32.0,
                             "beta_slow": 1.0, "attention_factor": 1.0,
                             "partial_rotary_factor": partial}
            },
            "hidden_act": "silu",
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": false,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "num_nextn_predict_layers": 0,
            "dtype": "bfloat16"
        })
    }

    /// DeepSeek-V4's tensors, under DeepSeek's names, one group per layer.
    fn plan_v4(&self) -> Vec<Vec<Planned>> {
        let h = self.hidden;
        let (hd, ihd, groups) = self.v4_dims();
        let q_lora = self.q_lora.max(1);
        let n = V4_STREAMS;
        let u = |fan_in: usize| Fill::Uniform((3.0 / fan_in as f32).sqrt());
        let t = |name: String, shape: Vec<usize>, fill: Fill| Planned {
            name,
            dtype: match fill {
                Fill::Bias(_) => Dtype::F32,
                Fill::Hash(_) => Dtype::I64,
                _ => Dtype::BF16,
            },
            shape,
            fill,
        };
        let mut out = Vec::new();
        for l in 0..self.layers {
            let p = |s: &str| format!("layers.{l}.{s}");
            let mut g = Vec::new();
            if l == 0 {
                g.push(t(
                    "embed.weight".into(),
                    vec![self.vocab, h],
                    Fill::Uniform(1.0),
                ));
            }
            g.push(t(p("attn_norm.weight"), vec![h], Fill::Ones));
            g.push(t(p("ffn_norm.weight"), vec![h], Fill::Ones));
            for hc in ["attn", "ffn"] {
                let gates = (2 + n) * n;
                g.push(t(p(&format!("hc_{hc}_fn")), vec![gates, n * h], u(n * h)));
                g.push(t(
                    p(&format!("hc_{hc}_base")),
                    vec![gates],
                    Fill::Uniform(0.1),
                ));
                g.push(t(p(&format!("hc_{hc}_scale")), vec![3], Fill::Ones));
            }
            let qd = self.heads * hd;
            for (name, shape, fill) in [
                ("attn.wq_a.weight", vec![q_lora, h], u(h)),
                ("attn.q_norm.weight", vec![q_lora], Fill::Ones),
                ("attn.wq_b.weight", vec![qd, q_lora], u(q_lora)),
                ("attn.wkv.weight", vec![hd, h], u(h)),
                ("attn.norm.weight", vec![hd], Fill::Ones),
                (
                    "attn.wo_a.weight",
                    vec![groups * self.kv_lora, qd / groups],
                    u(qd / groups),
                ),
                (
                    "attn.wo_b.weight",
                    vec![h, groups * self.kv_lora],
                    u(groups * self.kv_lora),
                ),
                ("attn.attn_sink", vec![self.heads], Fill::Uniform(1.0)),
            ] {
                g.push(t(p(name), shape, fill));
            }
            let heavy = Self::v4_heavy(l);
            let (rate, series) = if heavy {
                (V4_HEAVY_RATE, 1)
            } else {
                (V4_SPARSE_RATE, 2)
            };
            let mut compressor = |m: &str, width: usize, series: usize| {
                let w = series * width;
                g.push(t(p(&format!("{m}.wkv.weight")), vec![w, h], u(h)));
                g.push(t(p(&format!("{m}.wgate.weight")), vec![w, h], u(h)));
                g.push(t(p(&format!("{m}.ape")), vec![rate, w], Fill::Uniform(0.1)));
                g.push(t(p(&format!("{m}.norm.weight")), vec![width], Fill::Ones));
            };
            compressor("attn.compressor", hd, series);
            if !heavy {
                compressor("attn.indexer.compressor", ihd, 2);
                g.push(t(
                    p("attn.indexer.wq_b.weight"),
                    vec![self.heads * ihd, q_lora],
                    u(q_lora),
                ));
                g.push(t(
                    p("attn.indexer.weights_proj.weight"),
                    vec![self.heads, h],
                    u(h),
                ));
            }
            g.push(t(p("ffn.gate.weight"), vec![self.experts, h], u(h)));
            if l < V4_HASH_LAYERS {
                g.push(t(
                    p("ffn.gate.tid2eid"),
                    vec![self.vocab, self.top_k],
                    Fill::Hash(self.experts as u32),
                ));
            } else {
                g.push(t(
                    p("ffn.gate.bias"),
                    vec![self.experts],
                    Fill::Bias(self.skew),
                ));
            }
            let si = self.moe_inter * self.shared;
            if si > 0 {
                for (w, s) in [
                    ("w1", vec![si, h]),
                    ("w2", vec![h, si]),
                    ("w3", vec![si, h]),
                ] {
                    let fan = s[1];
                    g.push(t(p(&format!("ffn.shared_experts.{w}.weight")), s, u(fan)));
                }
            }
            let mut ids: Vec<usize> = (0..self.experts).collect();
            ids.sort_by_key(|e| e.to_string());
            for e in ids {
                for (w, s) in [
                    ("w1", vec![self.moe_inter, h]),
                    ("w2", vec![h, self.moe_inter]),
                    ("w3", vec![self.moe_inter, h]),
                ] {
                    let fan = s[1];
                    g.push(t(p(&format!("ffn.experts.{e}.{w}.weight")), s, u(fan)));
                }
            }
            if l + 1 == self.layers {
                g.push(t("norm.weight".into(), vec![h], Fill::Ones));
                g.push(t("head.weight".into(), vec![self.vocab, h], u(h)));
                g.push(t("hc_head_fn".into(), vec![n, n * h], u(n * h)));
                g.push(t("hc_head_base".into(), vec![n], Fill::Uniform(0.1)));
                g.push(t("hc_head_scale".into(), vec![1], Fill::Ones));
            }
            out.push(g);
        }
        out
    }

    fn plan(&self) -> Vec<Vec<Planned>> {
        if self.arch == SynthArch::DeepseekV4 {
            return self.plan_v4();
        }
        let h = self.hidden;
        let u = |fan_in: usize| Fill::Uniform((3.0 / fan_in as f32).sqrt());
        let t = |name: String, shape: Vec<usize>, fill: Fill| Planned {
            name,
            dtype: if matches!(fill, Fill::Bias(_)) {
                Dtype::F32
            } else {
                Dtype::BF16
            },
            shape,
            fill,
        };
        let mut groups: Vec<Vec<Planned>> = Vec::new();
        let qk = self.nope + self.rope;
        for l in 0..self.layers {
            let p = |s: &str| format!("model.layers.{l}.{s}");
            let mut g = Vec::new();
            if l == 0 {
                g.push(t(
                    "model.embed_tokens.weight".into(),
                    vec![self.vocab, h],
                    Fill::Uniform(1.0),
                ));
            }
            g.push(t(p("input_layernorm.weight"), vec![h], Fill::Ones));
            g.push(t(p("post_attention_layernorm.weight"), vec![h], Fill::Ones));
            if self.q_lora > 0 {
                g.push(t(
                    p("self_attn.q_a_proj.weight"),
                    vec![self.q_lora, h],
                    u(h),
                ));
                g.push(t(
                    p("self_attn.q_a_layernorm.weight"),
                    vec![self.q_lora],
                    Fill::Ones,
                ));
                g.push(t(
                    p("self_attn.q_b_proj.weight"),
                    vec![self.heads * qk, self.q_lora],
                    u(self.q_lora),
                ));
            } else {
                g.push(t(
                    p("self_attn.q_proj.weight"),
                    vec![self.heads * qk, h],
                    u(h),
                ));
            }
            g.push(t(
                p("self_attn.kv_a_proj_with_mqa.weight"),
                vec![self.kv_lora + self.rope, h],
                u(h),
            ));
            g.push(t(
                p("self_attn.kv_a_layernorm.weight"),
                vec![self.kv_lora],
                Fill::Ones,
            ));
            g.push(t(
                p("self_attn.kv_b_proj.weight"),
                vec![self.heads * (self.nope + self.v_head), self.kv_lora],
                u(self.kv_lora),
            ));
            g.push(t(
                p("self_attn.o_proj.weight"),
                vec![h, self.heads * self.v_head],
                u(self.heads * self.v_head),
            ));
            if l < self.first_dense {
                for (n, s) in [
                    ("gate_proj", vec![self.dense_inter, h]),
                    ("up_proj", vec![self.dense_inter, h]),
                    ("down_proj", vec![h, self.dense_inter]),
                ] {
                    let fan = s[1];
                    g.push(t(p(&format!("mlp.{n}.weight")), s, u(fan)));
                }
            } else {
                g.push(t(p("mlp.gate.weight"), vec![self.experts, h], u(h)));
                g.push(t(
                    p("mlp.gate.e_score_correction_bias"),
                    vec![self.experts],
                    Fill::Bias(self.skew),
                ));
                let si = self.moe_inter * self.shared;
                if si > 0 {
                    for (n, s) in [
                        ("gate_proj", vec![si, h]),
                        ("up_proj", vec![si, h]),
                        ("down_proj", vec![h, si]),
                    ] {
                        let fan = s[1];
                        g.push(t(p(&format!("mlp.shared_experts.{n}.weight")), s, u(fan)));
                    }
                }
                // Experts in the order safetensors writers sort names: 0, 1, 10, 11, ..., 2, ...
                let mut ids: Vec<usize> = (0..self.experts).collect();
                ids.sort_by_key(|e| e.to_string());
                for e in ids {
                    for (n, s) in [
                        ("down_proj", vec![h, self.moe_inter]),
                        ("gate_proj", vec![self.moe_inter, h]),
                        ("up_proj", vec![self.moe_inter, h]),
                    ] {
                        let (rows, cols) = (s[0], s[1]);
                        // Codes spread over ±a like the BF16 weights: INT4 (code − 8) × a/8,
                        // MXFP4 E2M1 (up to ±6) × the power of two nearest a/6.
                        let a = (3.0 / cols as f32).sqrt();
                        let w = |suffix: &str| p(&format!("mlp.experts.{e}.{n}.{suffix}"));
                        let q = |name: String, dtype, shape, fill| Planned {
                            name,
                            dtype,
                            shape,
                            fill,
                        };
                        match self.experts_format {
                            ExpertFormat::Bf16 => g.push(t(w("weight"), s, u(cols))),
                            ExpertFormat::Int4 => {
                                g.push(q(
                                    w("weight_packed"),
                                    Dtype::I32,
                                    vec![rows, cols / 8],
                                    Fill::Bytes,
                                ));
                                g.push(q(
                                    w("weight_scale"),
                                    Dtype::BF16,
                                    vec![rows, cols / 32],
                                    Fill::Const16(f32_to_bf16(a / 8.0)),
                                ));
                                g.push(q(
                                    w("weight_shape"),
                                    Dtype::I64,
                                    vec![2],
                                    Fill::Shape(rows as u32, cols as u32),
                                ));
                            }
                            ExpertFormat::Mxfp4 => {
                                let e8m0 =
                                    (127.0 + (a / 6.0).log2().round()).clamp(1.0, 254.0) as u8;
                                g.push(q(
                                    w("weight_packed"),
                                    Dtype::U8,
                                    vec![rows, cols / 2],
                                    Fill::Bytes,
                                ));
                                g.push(q(
                                    w("weight_scale"),
                                    Dtype::U8,
                                    vec![rows, cols / 32],
                                    Fill::Const8(e8m0),
                                ));
                            }
                        }
                    }
                }
            }
            if l + 1 == self.layers {
                g.push(t("model.norm.weight".into(), vec![h], Fill::Ones));
                g.push(t("lm_head.weight".into(), vec![self.vocab, h], u(h)));
            }
            groups.push(g);
        }
        groups
    }

    /// Total bytes of the weights.
    pub fn bytes(&self) -> u64 {
        self.plan()
            .iter()
            .flatten()
            .map(|t| (t.shape.iter().product::<usize>() * t.dtype.size()) as u64)
            .sum()
    }

    /// Writes the checkpoint into `dir` (created if needed; existing files of the same names
    /// are replaced). Tensors are generated in pieces on all cores and written in place, so the
    /// bytes do not depend on the thread count.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        use rayon::prelude::*;
        use std::os::unix::fs::FileExt;

        std::fs::create_dir_all(dir)?;
        let per = self.layers_per_shard.max(1);
        let groups = self.plan();
        let n_shards = groups.len().div_ceil(per);
        let mut weight_map = serde_json::Map::new();
        let mut total = 0u64;
        // Every piece of work: (shard file, tensor, first element, elements, byte offset).
        let mut files = Vec::new();
        let mut work: Vec<(usize, &Planned, usize, usize, u64)> = Vec::new();
        for (si, chunk) in groups.chunks(per).enumerate() {
            let name = format!("model-{:05}-of-{:05}.safetensors", si + 1, n_shards);
            let tensors: Vec<&Planned> = chunk.iter().flatten().collect();
            let mut entries = Vec::with_capacity(tensors.len());
            let mut off = 0usize;
            let mut offsets = Vec::with_capacity(tensors.len());
            for t in &tensors {
                let len = t.shape.iter().product::<usize>() * t.dtype.size();
                entries.push((t.name.as_str(), t.dtype, &t.shape[..], len));
                offsets.push(off);
                off += len;
                weight_map.insert(t.name.clone(), json!(name));
            }
            total += off as u64;
            let metadata = BTreeMap::from([("format".to_string(), "pt".to_string())]);
            let head = sluice_format::safetensors::header_bytes(&entries, Some(&metadata));
            let data_start = head.len() as u64;
            let f = std::fs::File::create(dir.join(&name))?;
            f.set_len(data_start + off as u64)?;
            f.write_all_at(&head, 0)?;
            for (t, &o) in tensors.iter().zip(&offsets) {
                let n: usize = t.shape.iter().product();
                let step = if matches!(t.fill, Fill::Bias(_) | Fill::Shape(..) | Fill::Hash(_)) {
                    n.max(1)
                } else {
                    PIECE
                };
                let mut e = 0;
                while e < n {
                    let m = step.min(n - e);
                    let at = data_start + (o + e * t.dtype.size()) as u64;
                    work.push((files.len(), *t, e, m, at));
                    e += m;
                }
            }
            files.push(f);
        }
        work.par_iter().try_for_each_init(
            || (Vec::new(), Lut::default()),
            |(buf, lut), &(fi, t, first, n, at)| {
                buf.clear();
                self.fill(t, first, n, buf, lut);
                files[fi].write_all_at(buf, at)
            },
        )?;
        let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            serde_json::to_vec_pretty(&index)?,
        )?;
        std::fs::write(
            dir.join("config.json"),
            serde_json::to_vec_pretty(&self.config())?,
        )?;
        if self.vocab >= TOKENIZER_VOCAB {
            std::fs::write(
                dir.join("tokenizer.json"),
                serde_json::to_vec_pretty(&tokenizer_json())?,
            )?;
        }
        Ok(())
    }

    /// The bytes of elements `first..first + n` of tensor `t` (`first` a multiple of 4, as every
    /// random draw gives four values).
    fn fill(&self, t: &Planned, first: usize, n: usize, buf: &mut Vec<u8>, lut: &mut Lut) {
        let total: usize = t.shape.iter().product();
        match t.fill {
            Fill::Ones => {
                buf.reserve(2 * n);
                for _ in 0..n {
                    buf.extend_from_slice(&0x3f80u16.to_le_bytes());
                }
            }
            Fill::Uniform(a) => {
                debug_assert!(first.is_multiple_of(4));
                // splitmix64 is a counter: jump to the draw that gives element `first`.
                let mut rng = Rng(name_seed(self.seed, &t.name)
                    .wrapping_add((first as u64 / 4).wrapping_mul(0x9e37_79b9_7f4a_7c15)));
                let table = lut.for_scale(a);
                buf.resize(2 * n, 0);
                for out in buf.chunks_mut(8) {
                    let r = rng.next();
                    for (k, o) in out.chunks_exact_mut(2).enumerate() {
                        let v = table[((r >> (16 * k)) & 0xffff) as usize];
                        o.copy_from_slice(&v.to_le_bytes());
                    }
                }
            }
            Fill::Bytes => {
                // Eight bytes per draw; pieces start at multiples of 8 bytes.
                let at = first * t.dtype.size();
                let mut rng = Rng(name_seed(self.seed, &t.name)
                    .wrapping_add((at as u64 / 8).wrapping_mul(0x9e37_79b9_7f4a_7c15)));
                buf.resize(n * t.dtype.size(), 0);
                for out in buf.chunks_mut(8) {
                    let r = rng.next().to_le_bytes();
                    out.copy_from_slice(&r[..out.len()]);
                }
            }
            Fill::Const16(v) => {
                for _ in 0..n {
                    buf.extend_from_slice(&v.to_le_bytes());
                }
            }
            Fill::Const8(v) => buf.resize(n, v),
            Fill::Shape(r, c) => {
                for v in [r as i64, c as i64].iter().skip(first).take(n) {
                    buf.extend_from_slice(&v.to_le_bytes());
                }
            }
            Fill::Hash(experts) => {
                // Per row, a partial Fisher-Yates draw of distinct experts.
                let k = t.shape.get(1).copied().unwrap_or(1).max(1);
                let mut rng = Rng(name_seed(self.seed, &t.name));
                let mut all = Vec::with_capacity(total);
                let mut pool: Vec<u32> = (0..experts).collect();
                for _ in 0..total / k {
                    for i in 0..k.min(pool.len()) {
                        let j = i + (rng.next() % (pool.len() - i) as u64) as usize;
                        pool.swap(i, j);
                        all.push(pool[i] as i64);
                    }
                }
                for v in &all[first..first + n] {
                    buf.extend_from_slice(&v.to_le_bytes());
                }
            }
            Fill::Bias(skew) => {
                // A permuted Zipf-like profile: expert of rank r gets skew × 1/(1 + r/4).
                let mut rng = Rng(name_seed(self.seed, &t.name));
                let mut order: Vec<usize> = (0..total).collect();
                for i in (1..total).rev() {
                    let j = (rng.next() % (i as u64 + 1)) as usize;
                    order.swap(i, j);
                }
                let mut v = vec![0f32; total];
                for (rank, &e) in order.iter().enumerate() {
                    v[e] = skew / (1.0 + rank as f32 / 4.0);
                }
                for x in &v[first..first + n] {
                    buf.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
    }
}

/// Ids the synthetic tokenizer uses (it is written only for vocabularies at least this large).
const TOKENIZER_VOCAB: usize = 266;

/// The bf16 value of every 16-bit draw for one scale: `bf16((draw · 2/65536 − 1) · scale)`.
#[derive(Default)]
struct Lut {
    scale_bits: Option<u32>,
    table: Vec<u16>,
}

impl Lut {
    fn for_scale(&mut self, a: f32) -> &[u16] {
        if self.scale_bits != Some(a.to_bits()) {
            self.table = (0..=0xffffu32)
                .map(|d| f32_to_bf16((d as f32 * (2.0 / 65536.0) - 1.0) * a))
                .collect();
            self.scale_bits = Some(a.to_bits());
        }
        &self.table
    }
}

/// Elements per piece of work when writing (a multiple of 4).
const PIECE: usize = 1 << 20;

mod tokenizer;
use tokenizer::tokenizer_json;

#[cfg(test)]
mod tests;
