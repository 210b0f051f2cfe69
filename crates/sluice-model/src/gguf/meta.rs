//! The metadata of a GGUF file as the `config.json` and `generation_config.json` transformers
//! would write for the model.

use super::*;

/// The `generation_config.json` of the sampling defaults llama.cpp's converter copied from the
/// model's own into `general.sampling.*` (`temp`, `top_k`, `top_p`, `min_p`,
/// `penalty_repeat`), which llama.cpp samples with unless told otherwise. The converter keeps
/// the values, not `do_sample`: a file that names a positive temperature samples by default,
/// as llama.cpp does with it; one without these keys decodes greedily, as from a directory
/// without `generation_config.json`. `None` when the file has none of them.
pub(super) fn generation_config(h: &Gguf) -> Result<Option<Json>, ModelError> {
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
pub(super) fn config(set: &GgufSet, arch: &Arch) -> Result<Json, ModelError> {
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
pub(super) fn deepseek2(set: &GgufSet) -> Result<Json, ModelError> {
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
pub(super) fn llama3_scaling(ck: &Checkpoint, h: &Gguf, config: &Json) -> Result<Json, ModelError> {
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
