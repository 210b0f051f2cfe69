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

/// A GGUF file's metadata as a family's `config.json` is made from it (`GgufArch::config`):
/// the keys of its architecture `<a>.*`, and the pieces every family's config shares.
pub(crate) struct Meta<'a> {
    /// The file set.
    pub set: &'a GgufSet,
    /// `general.architecture`.
    pub arch: &'a str,
}

impl<'a> Meta<'a> {
    pub(super) fn new(set: &'a GgufSet, arch: &'a str) -> Meta<'a> {
        Meta { set, arch }
    }

    fn h(&self) -> &Gguf {
        self.set.header()
    }

    /// The full name of the architecture's key `s`: `<arch>.s`.
    pub fn key(&self, s: &str) -> String {
        format!("{}.{s}", self.arch)
    }

    /// An error about the architecture's key `s`, naming the file.
    pub fn err(&self, s: &str, msg: impl std::fmt::Display) -> ModelError {
        key_err(self.h(), &self.key(s), msg)
    }

    /// The key `s`, a positive integer.
    pub fn pos(&self, s: &str) -> Result<u64, ModelError> {
        pos(self.h(), &self.key(s))
    }

    /// The key `s`, an integer, required.
    pub fn need(&self, s: &str) -> Result<u64, ModelError> {
        self.opt_uint(s)?.ok_or_else(|| self.err(s, "missing"))
    }

    /// The key `s`, an integer, when present.
    pub fn opt_uint(&self, s: &str) -> Result<Option<u64>, ModelError> {
        opt_uint(self.h(), &self.key(s))
    }

    /// The key `s`, a float, when present.
    pub fn opt_float(&self, s: &str) -> Result<Option<f64>, ModelError> {
        opt_float(self.h(), &self.key(s))
    }

    /// The key `s`, a boolean, when present.
    pub fn opt_bool(&self, s: &str) -> Result<Option<bool>, ModelError> {
        let key = self.key(s);
        match self.h().value(&key) {
            None => Ok(None),
            Some(_) => Ok(Some(self.h().get_bool(&key)?)),
        }
    }

    /// The raw value of the key `s`.
    pub fn value(&self, s: &str) -> Option<&Value> {
        self.h().value(&self.key(s))
    }

    /// Whether the file holds the tensor `name`.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.set.tensor(name).is_some()
    }

    /// The keys every config has ([`shared_keys`]), as `model_type` saved as `class`.
    pub fn common(&self, model_type: &str, class: &str) -> Result<Map<String, Json>, ModelError> {
        shared_keys(self.set, self.arch, model_type, class)
    }

    /// [`Meta::common`] with grouped-query attention's keys: key-value heads, the head size
    /// (refusing values of another size and partial rotation) and `rope_scaling`.
    pub fn gqa(&self, model_type: &str, class: &str) -> Result<Map<String, Json>, ModelError> {
        let hidden = self.pos("embedding_length")?;
        let heads = self.pos("attention.head_count")?;
        let kv_heads = self.opt_uint("attention.head_count_kv")?.unwrap_or(heads);
        let head_dim = match self.opt_uint("attention.key_length")? {
            Some(d) => d,
            None => hidden / heads,
        };
        if let Some(v) = self.opt_uint("attention.value_length")?
            && v != head_dim
        {
            return Err(self.err(
                "attention.value_length",
                format!("{v} differs from the key length {head_dim}: not supported"),
            ));
        }
        if let Some(r) = self.opt_uint("rope.dimension_count")?
            && r != head_dim
        {
            return Err(self.err(
                "rope.dimension_count",
                format!(
                    "{r}: partial rotary embeddings (head dimension {head_dim}) are not supported"
                ),
            ));
        }
        let mut c = self.common(model_type, class)?;
        c.insert("num_key_value_heads".into(), json!(kv_heads));
        c.insert("head_dim".into(), json!(head_dim));
        if let Some(s) = self.rope_scaling()? {
            c.insert("rope_scaling".into(), s);
        }
        Ok(c)
    }

    /// `rope_scaling` from `<arch>.rope.scaling.*`: none, linear or YaRN.
    pub fn rope_scaling(&self) -> Result<Option<Json>, ModelError> {
        rope_scaling(self.h(), self.arch)
    }

    /// Which of `layers` layers slide their attention window, by the key `s` ([`sliding_layers`]).
    pub fn sliding_layers(&self, s: &str, layers: u64) -> Result<Vec<bool>, ModelError> {
        sliding_layers(self.value(s), layers).map_err(|e| self.err(s, e))
    }

    /// The config `c` with the tokenizer's `bos_token_id` and `eos_token_id`.
    pub fn finish(&self, mut c: Map<String, Json>) -> Result<Json, ModelError> {
        token_ids(self.h(), &mut c)?;
        Ok(Json::Object(c))
    }
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
