//! GGUF models read as the Hugging Face checkpoints llama.cpp's converter made them from.
//!
//! A GGUF file describes its model in `<arch>.*` metadata and names its tensors as llama.cpp
//! does (`blk.3.attn_q.weight`, a stacked `blk.3.ffn_up_exps.weight` holding every expert).
//! This module maps both onto what the families read from a Hugging Face directory — a
//! `config.json` written as transformers would write it for the model, and tensors under
//! their transformers names, each one expert's slab of a stacked tensor a byte range of its
//! own — so that the families, the loader and the stores work on GGUF unchanged: routed
//! experts stay in the file and are read in place, in their packed size.
//!
//! The map follows transformers' GGUF loader (`integrations/ggml.py`,
//! `modeling_gguf_pytorch_utils.py`) and llama.cpp's converter: the query and key projections
//! of the `llama` architecture (Llama, Mistral, Mixtral) were permuted by the converter so that
//! each head's rotary pairs are adjacent; their rows are read back in Hugging Face's order
//! ([`Checkpoint::rope_rows`]). DeepSeek's `kv_b_proj` was split into `attn_k_b` (each head's
//! `W_ukᵀ`) and `attn_v_b`, which multi-head latent attention reads as they are
//! ([`crate::attention::mla::KvB::Split`]). GPT-OSS's fused, interleaved `gate_up_proj` was
//! split into stacked gate and up experts with stacked biases, which become one biased expert
//! each ([`crate::weights::ExpertSpec::Biased`]). Architectures: `llama` (dense, or Mixtral when
//! it has experts), `qwen2`, `qwen3`, `qwen2moe`, `qwen3moe`, `deepseek2` with sigmoid routing
//! (DeepSeek-V3/R1, Kimi K2) and `gpt-oss`. This is the one place that knows GGUF's names for
//! the families: anything else — an architecture, a tensor this map does not place, a feature it does not
//! carry (DeepSeek-V2's softmax routing, `rope_freqs` factors that are not Llama 3's rope
//! scaling) — is refused with one line naming the file and the key or tensor. Llama 3's rope
//! scaling, which the converter stores as per-pair factors, is read back as its parameters.

use std::collections::HashMap;

use serde_json::{Map, Value as Json, json};
use sluice_format::gguf::{Array, GgmlType, Gguf, GgufSet, Value};
use sluice_format::{Checkpoint, Dtype, TensorInfo};

use crate::ModelError;

/// How one GGUF architecture maps onto a transformers model.
struct Arch {
    /// `general.architecture`.
    name: &'static str,
    /// The converter permuted `attn_q` and `attn_k` for the rotary layout.
    permuted_qk: bool,
}

/// The architectures read, with the transformers model types they become.
const ARCHES: [Arch; 7] = [
    Arch {
        name: "llama",
        permuted_qk: true,
    },
    Arch {
        name: "qwen2",
        permuted_qk: false,
    },
    Arch {
        name: "qwen3",
        permuted_qk: false,
    },
    Arch {
        name: "qwen2moe",
        permuted_qk: false,
    },
    Arch {
        name: "qwen3moe",
        permuted_qk: false,
    },
    Arch {
        name: "deepseek2",
        permuted_qk: false,
    },
    Arch {
        name: "gpt-oss",
        permuted_qk: false,
    },
];

/// The GGUF architectures sluice reads.
pub fn architectures() -> Vec<&'static str> {
    ARCHES.iter().map(|a| a.name).collect()
}

fn key_err(h: &Gguf, key: &str, msg: impl std::fmt::Display) -> ModelError {
    ModelError::Format(sluice_format::FormatError::GgufKey {
        path: h.path.clone(),
        key: key.to_owned(),
        msg: msg.to_string(),
    })
}

fn tensor_err(h: &Gguf, tensor: &str, msg: impl std::fmt::Display) -> ModelError {
    ModelError::Format(sluice_format::FormatError::GgufTensor {
        path: h.path.clone(),
        tensor: tensor.to_owned(),
        msg: msg.to_string(),
    })
}

/// Reads `key` as a positive integer.
fn pos(h: &Gguf, key: &str) -> Result<u64, ModelError> {
    match h.get_uint(key)? {
        0 => Err(key_err(h, key, "must be positive")),
        n => Ok(n),
    }
}

/// Reads an optional integer key.
fn opt_uint(h: &Gguf, key: &str) -> Result<Option<u64>, ModelError> {
    match h.value(key) {
        None => Ok(None),
        Some(_) => Ok(Some(h.get_uint(key)?)),
    }
}

/// Reads an optional float key (f32 or f64 as writers store them), as the f64 of its value.
fn opt_float(h: &Gguf, key: &str) -> Result<Option<f64>, ModelError> {
    match h.value(key) {
        None => Ok(None),
        Some(Value::F32(v)) => Ok(Some(f64::from(*v))),
        Some(Value::F64(v)) => Ok(Some(*v)),
        Some(v) => Err(key_err(
            h,
            key,
            format!("is {:?}, not a float", v.value_type()),
        )),
    }
}

/// Gives a GGUF checkpoint its Hugging Face view: the config and the tensors under their
/// transformers names (see the module documentation).
pub fn to_hf(ck: &mut Checkpoint) -> Result<(), ModelError> {
    let Some(set) = ck.gguf() else {
        return Ok(());
    };
    let h = set.header();
    let arch_name = h.get_str("general.architecture")?;
    let Some(arch) = ARCHES.iter().find(|a| a.name == arch_name) else {
        return Err(key_err(
            h,
            "general.architecture",
            format!(
                "`{arch_name}` is not supported (supported: {})",
                architectures().join(", ")
            ),
        ));
    };
    let mut config = if arch.name == "deepseek2" {
        deepseek2(set)?
    } else {
        config(set, arch)?
    };
    if set.tensor("rope_freqs.weight").is_some() {
        let scaling = llama3_scaling(ck, h, &config)?;
        config["rope_scaling"] = scaling;
    }
    let (tensors, rope_rows) = tensors(ck, set, arch, &config)?;
    let generation = generation_config(h)?;
    ck.set_gguf_layout(config, tensors, rope_rows)?;
    if let Some(g) = generation {
        ck.set_generation_config(g);
    }
    Ok(())
}

/// The `generation_config.json` of the sampling defaults llama.cpp's converter copied from the
/// model's own into `general.sampling.*` (`temp`, `top_k`, `top_p`, `min_p`,
/// `penalty_repeat`), which llama.cpp samples with unless told otherwise. The converter keeps
/// the values, not `do_sample`: a file that names a positive temperature samples by default,
/// as llama.cpp does with it; one without these keys decodes greedily, as from a directory
/// without `generation_config.json`. `None` when the file has none of them.
fn generation_config(h: &Gguf) -> Result<Option<Json>, ModelError> {
    let key = |s: &str| format!("general.sampling.{s}");
    let mut g = Map::new();
    for (gguf, hf) in [
        ("temp", "temperature"),
        ("top_p", "top_p"),
        ("min_p", "min_p"),
        ("penalty_repeat", "repetition_penalty"),
    ] {
        if let Some(v) = opt_float(h, &key(gguf))? {
            if !v.is_finite() || v < 0.0 {
                return Err(key_err(h, &key(gguf), format!("{v} is not a valid value")));
            }
            g.insert(hf.into(), json!(v));
        }
    }
    if let Some(k) = opt_uint(h, &key("top_k"))? {
        g.insert("top_k".into(), json!(k));
    }
    if g.is_empty() {
        return Ok(None);
    }
    let samples = g
        .get("temperature")
        .and_then(Json::as_f64)
        .is_some_and(|t| t > 0.0);
    g.insert("do_sample".into(), json!(samples));
    Ok(Some(Json::Object(g)))
}

/// The `config.json` transformers would write for the model.
fn config(set: &GgufSet, arch: &Arch) -> Result<Json, ModelError> {
    let h = set.header();
    let a = arch.name;
    let k = |s: &str| format!("{a}.{s}");
    let experts = opt_uint(h, &k("expert_count"))?.unwrap_or(0);
    let model_type = match a {
        "llama" if experts > 0 => "mixtral",
        "llama" => "llama",
        "qwen2moe" => "qwen2_moe",
        "qwen3moe" => "qwen3_moe",
        "gpt-oss" => "gpt_oss",
        other => other,
    };
    let hidden = pos(h, &k("embedding_length"))?;
    let heads = pos(h, &k("attention.head_count"))?;
    let kv_heads = opt_uint(h, &k("attention.head_count_kv"))?.unwrap_or(heads);
    let head_dim = match opt_uint(h, &k("attention.key_length"))? {
        Some(d) => d,
        None => hidden / heads,
    };
    if let Some(v) = opt_uint(h, &k("attention.value_length"))?
        && v != head_dim
    {
        return Err(key_err(
            h,
            &k("attention.value_length"),
            format!("{v} differs from the key length {head_dim}: not supported"),
        ));
    }
    if let Some(r) = opt_uint(h, &k("rope.dimension_count"))?
        && r != head_dim
    {
        return Err(key_err(
            h,
            &k("rope.dimension_count"),
            format!("{r}: partial rotary embeddings (head dimension {head_dim}) are not supported"),
        ));
    }
    let mut c = shared_keys(set, a, model_type, architecture(model_type))?;
    c.insert("num_key_value_heads".into(), json!(kv_heads));
    c.insert("head_dim".into(), json!(head_dim));
    if let Some(mut s) = rope_scaling(h, a)? {
        if model_type == "gpt_oss" && s["rope_type"] == "yarn" {
            // GPT-OSS computes YaRN's correction range without rounding it to whole
            // dimensions (`truncate: false` in every release); the converter does not store it.
            s["truncate"] = json!(false);
        }
        c.insert("rope_scaling".into(), s);
    }
    let ff = opt_uint(h, &k("feed_forward_length"))?;
    let need_ff = || ff.ok_or_else(|| key_err(h, &k("feed_forward_length"), "missing"));
    match model_type {
        "llama" => {
            c.insert("intermediate_size".into(), json!(need_ff()?));
            let bias = set.tensor("blk.0.attn_q.bias").is_some();
            c.insert("attention_bias".into(), json!(bias));
        }
        "mixtral" => {
            c.insert("intermediate_size".into(), json!(need_ff()?));
            c.insert("num_local_experts".into(), json!(experts));
            c.insert(
                "num_experts_per_tok".into(),
                json!(pos(h, &k("expert_used_count"))?),
            );
        }
        "qwen2" | "qwen3" => {
            c.insert("intermediate_size".into(), json!(need_ff()?));
        }
        "gpt_oss" => {
            c.insert(
                "intermediate_size".into(),
                json!(pos(h, &k("expert_feed_forward_length"))?),
            );
            c.insert(
                "num_local_experts".into(),
                json!(pos(h, &k("expert_count"))?),
            );
            c.insert(
                "num_experts_per_tok".into(),
                json!(pos(h, &k("expert_used_count"))?),
            );
            let bias = set.tensor("blk.0.attn_q.bias").is_some();
            c.insert("attention_bias".into(), json!(bias));
            let window = pos(h, &k("attention.sliding_window"))?;
            c.insert("sliding_window".into(), json!(window));
            let layers = c["num_hidden_layers"].as_u64().unwrap_or(0);
            let pattern = k("attention.sliding_window_pattern");
            let sliding =
                sliding_layers(h.value(&pattern), layers).map_err(|e| key_err(h, &pattern, e))?;
            let types: Vec<&str> = sliding
                .iter()
                .map(|&s| {
                    if s {
                        "sliding_attention"
                    } else {
                        "full_attention"
                    }
                })
                .collect();
            c.insert("layer_types".into(), json!(types));
        }
        "qwen2_moe" | "qwen3_moe" => {
            c.insert("num_experts".into(), json!(pos(h, &k("expert_count"))?));
            c.insert(
                "num_experts_per_tok".into(),
                json!(pos(h, &k("expert_used_count"))?),
            );
            c.insert(
                "moe_intermediate_size".into(),
                json!(pos(h, &k("expert_feed_forward_length"))?),
            );
            // llama.cpp normalises the chosen weights for Qwen3's MoE and not for Qwen2's.
            c.insert("norm_topk_prob".into(), json!(model_type == "qwen3_moe"));
            if let Some(ff) = ff {
                c.insert("intermediate_size".into(), json!(ff));
            }
            if model_type == "qwen2_moe" {
                let shared = opt_uint(h, &k("expert_shared_feed_forward_length"))?.unwrap_or(0);
                if shared == 0 && set.tensor("blk.0.ffn_up_shexp.weight").is_some() {
                    return Err(key_err(
                        h,
                        &k("expert_shared_feed_forward_length"),
                        "missing, but the layers have a shared expert",
                    ));
                }
                c.insert("shared_expert_intermediate_size".into(), json!(shared));
            }
        }
        _ => {}
    }
    token_ids(h, &mut c)?;
    Ok(Json::Object(c))
}

/// Which of `layers` layers slide their attention window, as llama.cpp reads it: `key` as one
/// flag per layer, or as a period `n` (layer `l` slides when `l % n < n − 1`; 0: every layer),
/// else GPT-OSS's period of 2 — the even layers, as transformers does when `layer_types` is
/// absent.
fn sliding_layers(value: Option<&Value>, layers: u64) -> Result<Vec<bool>, String> {
    let period = |n: u64| (0..layers).map(|l| n == 0 || l % n < n - 1).collect();
    match value {
        None => Ok(period(2)),
        Some(Value::Array(Array::Bool(flags))) if flags.len() as u64 == layers => Ok(flags.clone()),
        Some(Value::Array(Array::Bool(flags))) => {
            Err(format!("{} flags for {layers} layers", flags.len()))
        }
        Some(v) => v.as_uint().map(period).ok_or_else(|| {
            format!(
                "is {:?}, not a period or one flag per layer",
                v.value_type()
            )
        }),
    }
}

/// `bos_token_id` and `eos_token_id` from the tokenizer's metadata: the end of a turn (`eot`,
/// `eom`) stops generation as the end of the text does.
fn token_ids(h: &Gguf, c: &mut Map<String, Json>) -> Result<(), ModelError> {
    let token = |key: &str| opt_uint(h, &format!("tokenizer.ggml.{key}"));
    if let Some(b) = token("bos_token_id")? {
        c.insert("bos_token_id".into(), json!(b));
    }
    let mut eos: Vec<u64> = Vec::new();
    for key in ["eos_token_id", "eot_token_id", "eom_token_id"] {
        if let Some(id) = token(key)?
            && !eos.contains(&id)
        {
            eos.push(id);
        }
    }
    match eos.len() {
        0 => {}
        1 => {
            c.insert("eos_token_id".into(), json!(eos[0]));
        }
        _ => {
            c.insert("eos_token_id".into(), json!(eos));
        }
    }
    Ok(())
}

/// DeepSeek-V3's `config.json` from a `deepseek2` file (DeepSeek-V3/R1, Kimi K2: sigmoid
/// group routing). The converter stores MLA as multi-query attention over the latent
/// (`key_length` = rank + rope), so the head sizes come from the `*_mla` keys.
fn deepseek2(set: &GgufSet) -> Result<Json, ModelError> {
    let h = set.header();
    let k = |s: &str| format!("deepseek2.{s}");
    match opt_uint(h, &k("expert_gating_func"))? {
        Some(2) => {}
        g => {
            return Err(key_err(
                h,
                &k("expert_gating_func"),
                format!(
                    "{}: only sigmoid routing (2, DeepSeek-V3 and later) is supported",
                    g.map_or("absent (softmax, DeepSeek-V2)".to_owned(), |g| g
                        .to_string())
                ),
            ));
        }
    }
    let rope = pos(h, &k("rope.dimension_count"))?;
    let key_mla = pos(h, &k("attention.key_length_mla"))?;
    if key_mla <= rope {
        return Err(key_err(
            h,
            &k("attention.key_length_mla"),
            format!("{key_mla} leaves no room for the rotary part of {rope}"),
        ));
    }
    let mut c = shared_keys(set, "deepseek2", "deepseek_v3", "DeepseekV3ForCausalLM")?;
    // MLA has one latent, which transformers counts as a key-value head per query head.
    c.insert(
        "num_key_value_heads".into(),
        c["num_attention_heads"].clone(),
    );
    let mut put = |key: &str, v: Json| {
        c.insert(key.into(), v);
    };
    if let Some(q) = opt_uint(h, &k("attention.q_lora_rank"))? {
        put("q_lora_rank", json!(q));
    } else {
        put("q_lora_rank", Json::Null);
    }
    put("kv_lora_rank", json!(pos(h, &k("attention.kv_lora_rank"))?));
    put("qk_rope_head_dim", json!(rope));
    put("qk_nope_head_dim", json!(key_mla - rope));
    put(
        "v_head_dim",
        json!(pos(h, &k("attention.value_length_mla"))?),
    );
    put("n_routed_experts", json!(pos(h, &k("expert_count"))?));
    put(
        "num_experts_per_tok",
        json!(pos(h, &k("expert_used_count"))?),
    );
    put(
        "n_group",
        json!(opt_uint(h, &k("expert_group_count"))?.unwrap_or(1)),
    );
    put(
        "topk_group",
        json!(opt_uint(h, &k("expert_group_used_count"))?.unwrap_or(1)),
    );
    put(
        "n_shared_experts",
        json!(opt_uint(h, &k("expert_shared_count"))?.unwrap_or(0)),
    );
    put(
        "first_k_dense_replace",
        json!(opt_uint(h, &k("leading_dense_block_count"))?.unwrap_or(0)),
    );
    put(
        "moe_intermediate_size",
        json!(pos(h, &k("expert_feed_forward_length"))?),
    );
    put(
        "intermediate_size",
        json!(pos(h, &k("feed_forward_length"))?),
    );
    // The converter writes these only when set: absent means 1 and false.
    put(
        "routed_scaling_factor",
        json!(opt_float(h, &k("expert_weights_scale"))?.unwrap_or(1.0)),
    );
    let norm = match h.value(&k("expert_weights_norm")) {
        None => false,
        Some(_) => h.get_bool(&k("expert_weights_norm"))?,
    };
    put("norm_topk_prob", json!(norm));
    put("scoring_func", json!("sigmoid"));
    put("topk_method", json!("noaux_tc"));
    if let Some(mut s) = rope_scaling(h, "deepseek2")? {
        // `yarn_log_multiplier` is 0.1 × `mscale_all_dim` (the converter's DeepSeek rule);
        // the releases have `mscale` equal to it.
        if let Some(m) = opt_float(h, &k("rope.scaling.yarn_log_multiplier"))? {
            let all = (m * 10.0 * 1e6).round() / 1e6;
            s["mscale_all_dim"] = json!(all);
            s["mscale"] = json!(all);
        }
        put("rope_scaling", s);
    }
    token_ids(h, &mut c)?;
    Ok(Json::Object(c))
}

/// Llama 3's rope scaling from the frequency factors llama.cpp's converter stores in
/// `rope_freqs.weight` (one per rotary pair: 1 for the high frequencies, `factor` for the low,
/// a smooth blend between): the `rope_scaling` whose factors these are — `factor` their
/// largest, `low_freq_factor`, `high_freq_factor` and `original_max_position_embeddings`
/// searched over the values released models use — so the rotation is computed as
/// transformers computes it. Factors no such parameters give are refused.
fn llama3_scaling(ck: &Checkpoint, h: &Gguf, config: &Json) -> Result<Json, ModelError> {
    let name = "rope_freqs.weight";
    if config.get("rope_scaling").is_some() {
        return Err(tensor_err(h, name, "beside rope.scaling.* metadata"));
    }
    let head_dim = config["head_dim"].as_u64().unwrap_or(0) as usize;
    let info = ck
        .get(name)
        .ok_or_else(|| tensor_err(h, name, "not found"))?;
    if info.dtype != Dtype::Ggml(GgmlType::F32) || info.shape != [head_dim / 2] {
        return Err(tensor_err(
            h,
            name,
            format!(
                "{} {:?}: expected F32 [{}] (one factor per rotary pair)",
                info.dtype,
                info.shape,
                head_dim / 2
            ),
        ));
    }
    let got: Vec<f64> = ck
        .read(info)?
        .chunks_exact(4)
        .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
        .collect();
    let theta = config["rope_theta"].as_f64().unwrap_or(10_000.0);
    let factor = got.iter().copied().fold(0f64, f64::max);
    let dim = head_dim as f64;
    let fits = |low: f64, high: f64, orig: f64| {
        got.iter().enumerate().all(|(i, &g)| {
            let freq = 1.0 / theta.powf(2.0 * i as f64 / dim);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let want = if wavelen < orig / high {
                1.0
            } else if wavelen > orig / low {
                factor
            } else {
                let smooth = (orig / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            (g - want).abs() <= 1e-4 * want
        })
    };
    for (low, high) in [
        (1.0, 4.0),
        (1.0, 2.0),
        (2.0, 4.0),
        (1.0, 8.0),
        (2.0, 8.0),
        (4.0, 16.0),
    ] {
        for orig in (8..=20).map(|p| f64::from(1u32 << p)) {
            if factor > 0.0 && fits(low, high, orig) {
                return Ok(json!({
                    "rope_type": "llama3",
                    "factor": factor,
                    "low_freq_factor": low,
                    "high_freq_factor": high,
                    "original_max_position_embeddings": orig as u64,
                }));
            }
        }
    }
    Err(tensor_err(
        h,
        name,
        "these frequency factors are not Llama 3's rope scaling for any parameters tried",
    ))
}

/// The keys every config here has, from `<a>.*`: the model type and class, sizes, the norm's
/// epsilon, the context length, the rotary base, and tied embeddings when the file has no
/// `output.weight`. `vocab_size` is the key's, else the embedding's rows.
fn shared_keys(
    set: &GgufSet,
    a: &str,
    model_type: &str,
    class: &str,
) -> Result<Map<String, Json>, ModelError> {
    let h = set.header();
    let k = |s: &str| format!("{a}.{s}");
    let vocab = match opt_uint(h, &k("vocab_size"))? {
        Some(v) => v,
        None => set
            .tensor("token_embd.weight")
            .map(|(_, t)| t.matrix_dims().0)
            .ok_or_else(|| tensor_err(h, "token_embd.weight", "missing"))?,
    };
    let eps_key = k("attention.layer_norm_rms_epsilon");
    let eps = opt_float(h, &eps_key)?.ok_or_else(|| key_err(h, &eps_key, "missing"))?;
    let mut c = Map::new();
    c.insert("model_type".into(), json!(model_type));
    c.insert("architectures".into(), json!([class]));
    c.insert("hidden_act".into(), json!("silu"));
    c.insert("vocab_size".into(), json!(vocab));
    c.insert("hidden_size".into(), json!(pos(h, &k("embedding_length"))?));
    c.insert(
        "num_hidden_layers".into(),
        json!(pos(h, &k("block_count"))?),
    );
    c.insert(
        "num_attention_heads".into(),
        json!(pos(h, &k("attention.head_count"))?),
    );
    c.insert("rms_norm_eps".into(), json!(eps));
    c.insert(
        "max_position_embeddings".into(),
        json!(pos(h, &k("context_length"))?),
    );
    c.insert(
        "rope_theta".into(),
        json!(opt_float(h, &k("rope.freq_base"))?.unwrap_or(10_000.0)),
    );
    c.insert(
        "tie_word_embeddings".into(),
        json!(set.tensor("output.weight").is_none()),
    );
    Ok(c)
}

/// The transformers class a model type is saved as.
fn architecture(model_type: &str) -> &'static str {
    match model_type {
        "mixtral" => "MixtralForCausalLM",
        "qwen2" => "Qwen2ForCausalLM",
        "qwen3" => "Qwen3ForCausalLM",
        "qwen2_moe" => "Qwen2MoeForCausalLM",
        "qwen3_moe" => "Qwen3MoeForCausalLM",
        "gpt_oss" => "GptOssForCausalLM",
        _ => "LlamaForCausalLM",
    }
}

/// `rope_scaling` from `<arch>.rope.scaling.*`: none, linear or YaRN.
fn rope_scaling(h: &Gguf, a: &str) -> Result<Option<Json>, ModelError> {
    let key = format!("{a}.rope.scaling.type");
    let ty = match h.value(&key) {
        None => return Ok(None),
        Some(_) => h.get_str(&key)?,
    };
    let factor_key = format!("{a}.rope.scaling.factor");
    let factor = || opt_float(h, &factor_key)?.ok_or_else(|| key_err(h, &factor_key, "missing"));
    Ok(match ty {
        "none" => None,
        "linear" => Some(json!({"rope_type": "linear", "factor": factor()?})),
        "yarn" => {
            let orig = format!("{a}.rope.scaling.original_context_length");
            let mut s = json!({
                "rope_type": "yarn",
                "factor": factor()?,
                "original_max_position_embeddings": pos(h, &orig)?,
            });
            for (key, hf) in [
                ("yarn_beta_fast", "beta_fast"),
                ("yarn_beta_slow", "beta_slow"),
            ] {
                if let Some(v) = opt_float(h, &format!("{a}.rope.scaling.{key}"))? {
                    s[hf] = json!(v);
                }
            }
            Some(s)
        }
        other => {
            return Err(key_err(
                h,
                &key,
                format!("`{other}` is not supported (none, linear, yarn)"),
            ));
        }
    })
}

/// The dtype a GGUF tensor is read as: the plain floats as themselves, block types as GGUF's.
fn dtype(t: GgmlType) -> Dtype {
    match t {
        GgmlType::F32 => Dtype::F32,
        GgmlType::F16 => Dtype::F16,
        GgmlType::BF16 => Dtype::BF16,
        t => Dtype::Ggml(t),
    }
}

/// Where a layer's tensor goes: the Hugging Face name of `blk.{l}.{base}` (with its
/// `.weight` or `.bias`), or a stacked expert tensor to split.
enum Place {
    One(String),
    /// `{prefix}{e}.{proj}.{suffix}` for every expert `e` (`weight`, or `bias` for GPT-OSS's
    /// stacked `[experts, rows]` biases).
    Experts {
        prefix: String,
        proj: &'static str,
        suffix: String,
    },
}

/// The Hugging Face place of layer `l`'s tensor `base` (`attn_q`, `ffn_up_exps`, ...).
fn place(model_type: &str, l: &str, base: &str, suffix: &str) -> Option<Place> {
    let layer = format!("model.layers.{l}.");
    let mixtral = model_type == "mixtral";
    let gpt_oss = model_type == "gpt_oss";
    let shared = if model_type == "deepseek_v3" {
        "shared_experts"
    } else {
        "shared_expert"
    };
    let (moe, gate, up, down) = if mixtral {
        ("block_sparse_moe", "w1", "w3", "w2")
    } else {
        ("mlp", "gate_proj", "up_proj", "down_proj")
    };
    let one = |s: &str| Some(Place::One(format!("{layer}{s}.{suffix}")));
    let experts = |proj| {
        (suffix == "weight" || gpt_oss).then(|| Place::Experts {
            prefix: format!("{layer}{moe}.experts."),
            proj,
            suffix: suffix.to_owned(),
        })
    };
    match base {
        "attn_norm" => one("input_layernorm"),
        "ffn_norm" => one("post_attention_layernorm"),
        // GPT-OSS's name for the norm before the experts.
        "post_attention_norm" if gpt_oss => one("post_attention_layernorm"),
        // The converter gave GPT-OSS's per-head sinks a `.weight`; transformers' have none.
        "attn_sinks" if gpt_oss && suffix == "weight" => {
            Some(Place::One(format!("{layer}self_attn.sinks")))
        }
        "ffn_gate_inp" if gpt_oss => one("mlp.router"),
        "attn_q" => one("self_attn.q_proj"),
        "attn_k" => one("self_attn.k_proj"),
        "attn_v" => one("self_attn.v_proj"),
        "attn_output" => one("self_attn.o_proj"),
        "attn_q_norm" => one("self_attn.q_norm"),
        "attn_q_a" => one("self_attn.q_a_proj"),
        "attn_q_a_norm" => one("self_attn.q_a_layernorm"),
        "attn_q_b" => one("self_attn.q_b_proj"),
        "attn_kv_a_mqa" => one("self_attn.kv_a_proj_with_mqa"),
        "attn_kv_a_norm" => one("self_attn.kv_a_layernorm"),
        "attn_kv_b" => one("self_attn.kv_b_proj"),
        // llama.cpp's split of `kv_b_proj` (see `attention::mla::KvB::Split`).
        "attn_k_b" => one("self_attn.k_b_proj"),
        "attn_v_b" => one("self_attn.v_b_proj"),
        "exp_probs_b" if suffix == "bias" => Some(Place::One(format!(
            "{layer}mlp.gate.e_score_correction_bias"
        ))),
        "attn_k_norm" => one("self_attn.k_norm"),
        "ffn_gate" => one("mlp.gate_proj"),
        "ffn_up" => one("mlp.up_proj"),
        "ffn_down" => one("mlp.down_proj"),
        "ffn_gate_inp" => one(&format!("{moe}.gate")),
        "ffn_gate_exps" => experts(gate),
        "ffn_up_exps" => experts(up),
        "ffn_down_exps" => experts(down),
        "ffn_gate_shexp" => one(&format!("mlp.{shared}.gate_proj")),
        "ffn_up_shexp" => one(&format!("mlp.{shared}.up_proj")),
        "ffn_down_shexp" => one(&format!("mlp.{shared}.down_proj")),
        "ffn_gate_inp_shexp" => one("mlp.shared_expert_gate"),
        _ if mixtral => {
            // Older Mixtral files: one tensor per expert, `ffn_{gate,up,down}.{e}`.
            let (proj, e) = base.split_once('.')?;
            e.parse::<u32>().ok()?;
            let w = match proj {
                "ffn_gate" => gate,
                "ffn_up" => up,
                "ffn_down" => down,
                _ => return None,
            };
            one(&format!("{moe}.experts.{e}.{w}"))
        }
        _ => None,
    }
}

/// The tensors under their Hugging Face names, and the rows stored in llama.cpp's rotary order.
#[allow(clippy::type_complexity)]
fn tensors(
    ck: &Checkpoint,
    set: &GgufSet,
    arch: &Arch,
    config: &Json,
) -> Result<(Vec<(String, TensorInfo)>, HashMap<String, usize>), ModelError> {
    let h = set.header();
    let model_type = config["model_type"].as_str().unwrap_or_default();
    let head_dim = config["head_dim"].as_u64().unwrap_or(0) as usize;
    let mut out = Vec::with_capacity(ck.tensors().len());
    let mut rope_rows = HashMap::new();
    for t in ck.tensors() {
        let info = |hf: String, stored: String, shape: Vec<usize>, offset: u64, len: u64| {
            let t = TensorInfo {
                name: stored,
                dtype: match t.dtype {
                    Dtype::Ggml(g) => dtype(g),
                    d => d,
                },
                shape,
                shard: t.shard,
                offset,
                len,
            };
            (hf, t)
        };
        let name = t.name.as_str();
        let top = match name {
            "token_embd.weight" => Some("model.embed_tokens.weight"),
            "output_norm.weight" => Some("model.norm.weight"),
            "output.weight" => Some("lm_head.weight"),
            _ => None,
        };
        if let Some(hf) = top {
            out.push(info(
                hf.to_owned(),
                t.name.clone(),
                t.shape.clone(),
                t.offset,
                t.len,
            ));
            continue;
        }
        if name == "rope_freqs.weight" && config.get("rope_scaling").is_some() {
            // Llama 3's rope scaling, read into the config (see `llama3_scaling`).
            continue;
        }
        let placed = name
            .strip_prefix("blk.")
            .and_then(|r| r.split_once('.'))
            .and_then(|(l, rest)| {
                let (base, suffix) = rest.rsplit_once('.')?;
                l.parse::<u32>().ok()?;
                matches!(suffix, "weight" | "bias")
                    .then(|| place(model_type, l, base, suffix))
                    .flatten()
            });
        let Some(p) = placed else {
            return Err(tensor_err(
                h,
                name,
                format!(
                    "not a tensor of GGUF architecture `{}` sluice places",
                    arch.name
                ),
            ));
        };
        match p {
            Place::One(hf) => {
                let mut shape = t.shape.clone();
                if hf.ends_with("shared_expert_gate.weight") && shape.len() == 1 {
                    // GGUF keeps the shared expert's gate as a vector; transformers' is [1, h].
                    shape.insert(0, 1);
                }
                if (hf.ends_with("k_b_proj.weight") || hf.ends_with("v_b_proj.weight"))
                    && shape.len() == 3
                {
                    // Per head [rows, cols], stacked: one matrix of every head's rows.
                    shape = vec![shape[0] * shape[1], shape[2]];
                }
                // The converter permutes the query and key projections' rows, biases included.
                let qk = [
                    "q_proj.weight",
                    "k_proj.weight",
                    "q_proj.bias",
                    "k_proj.bias",
                ]
                .iter()
                .any(|s| hf.ends_with(&format!("self_attn.{s}")));
                if arch.permuted_qk && qk {
                    rope_rows.insert(hf.clone(), head_dim);
                }
                out.push(info(hf, t.name.clone(), shape, t.offset, t.len));
            }
            Place::Experts {
                prefix,
                proj,
                suffix,
            } => {
                let Some((_, g)) = set.tensor(name) else {
                    return Err(tensor_err(h, name, "not found in the set"));
                };
                let (dims, layout) = match suffix.as_str() {
                    "bias" => (2, "[experts, rows]"),
                    _ => (3, "[experts, rows, cols]"),
                };
                if t.shape.len() != dims {
                    return Err(tensor_err(
                        h,
                        name,
                        format!("shape {:?}: stacked experts are {layout}", t.shape),
                    ));
                }
                for e in 0..t.shape[0] as u64 {
                    let (offset, len) = g
                        .slab(e)
                        .ok_or_else(|| tensor_err(h, name, format!("no slab for expert {e}")))?;
                    out.push(info(
                        format!("{prefix}{e}.{proj}.{suffix}"),
                        format!("{name}[{e}]"),
                        t.shape[1..].to_vec(),
                        offset,
                        len,
                    ));
                }
            }
        }
    }
    Ok((out, rope_rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sliding_layers_follow_llama_cpps_pattern_key() {
        // Absent: GPT-OSS's period of 2, the even layers.
        assert_eq!(sliding_layers(None, 4), Ok(vec![true, false, true, false]));
        // A period of 3: two sliding layers, then a full one; 0 slides every layer.
        let three = Value::U32(3);
        assert_eq!(
            sliding_layers(Some(&three), 6),
            Ok(vec![true, true, false, true, true, false])
        );
        assert_eq!(
            sliding_layers(Some(&Value::U32(0)), 2),
            Ok(vec![true, true])
        );
        let flags = Value::Array(Array::Bool(vec![false, true, true]));
        assert_eq!(sliding_layers(Some(&flags), 3), Ok(vec![false, true, true]));
        assert!(
            sliding_layers(Some(&flags), 4)
                .unwrap_err()
                .contains("3 flags for 4")
        );
        assert!(sliding_layers(Some(&Value::F32(2.0)), 4).is_err());
    }
}
