//! `quantization_config`: which weights a checkpoint stores packed, and how.
//!
//! Read strictly: every field that changes what the stored bytes mean is checked, and a value
//! sluice does not implement is refused with the field's dotted name. Fields that only describe
//! how the checkpoint was made (observers, `global_compression_ratio`, …) are not read.
//!
//! Three methods are implemented:
//! - `fp8` (DeepSeek-V3, Kimi K2): a weight stored as `float8_e4m3fn` carries
//!   `weight_scale_inv` with one scale per `weight_block_size` block, the grid rounded up at the
//!   edges; value = code × the scale of its block. Which weights are FP8 is what the checkpoint
//!   stores (the dtype), and every FP8 weight must have its scales.
//! - `compressed-tensors` with `pack-quantized` (INT4, symmetric, group scales: Kimi K2 Thinking
//!   and K2.5) or `mxfp4-pack-quantized` (E2M1 with E8M0 scales per 32: Kimi K3): a linear layer
//!   is packed exactly when one config group's `targets` match it and no `ignore` entry does —
//!   matched the way compressed-tensors matches (`re:` prefixes are Python `re.match` from the
//!   start of the module name, `Linear` matches every linear layer, anything else is an exact
//!   module name).
//! - `mxfp4` (GPT-OSS): the fused experts are stored as `*_blocks` / `*_scales` unless
//!   `modules_to_not_convert` names them (matched as transformers matches it).

use std::path::Path;

use fancy_regex::Regex;
use serde_json::Value;

use crate::ModelError;

/// How a compressed-tensors group stores its weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtScheme {
    /// `pack-quantized`: symmetric INT4, eight codes per little-endian int32 (low bits first),
    /// value = (code − 8) × scale, one scale per `group` columns; `weight_packed`,
    /// `weight_scale`, `weight_shape`.
    PackInt4 {
        /// Columns per scale.
        group: usize,
    },
    /// `mxfp4-pack-quantized`: two E2M1 codes per byte (low nibble = even column), one E8M0
    /// scale per 32 columns; `weight_packed`, `weight_scale`.
    Mxfp4,
}

/// One entry of `config_groups`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CtGroup {
    /// The group's key (`group_0`, …), for messages.
    pub name: String,
    /// What it applies to.
    pub targets: Vec<String>,
    /// How its weights are stored.
    pub scheme: CtScheme,
}

/// The quantization of a checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Quantization {
    /// No `quantization_config`: every weight is plain.
    #[default]
    None,
    /// FP8 E4M3 weights with block scales (`quant_method: fp8`).
    Fp8 {
        /// Rows per scale block.
        block_rows: usize,
        /// Columns per scale block.
        block_cols: usize,
        /// Weights stored as I8 are FP4 (`expert_dtype: fp4`, DeepSeek-V4's routed experts):
        /// two E2M1 codes per byte, low nibble first, and one `weight_scale_inv` per 32
        /// columns.
        fp4: bool,
    },
    /// compressed-tensors (`quant_method: compressed-tensors`).
    CompressedTensors {
        /// `config_groups`, in key order.
        groups: Vec<CtGroup>,
        /// `ignore`.
        ignore: Vec<String>,
    },
    /// GPT-OSS MXFP4 experts (`quant_method: mxfp4`).
    Mxfp4 {
        /// `modules_to_not_convert`.
        not_converted: Vec<String>,
    },
}

impl Quantization {
    /// The `quant_method` as written (`none` without a config).
    pub fn method(&self) -> &'static str {
        match self {
            Quantization::None => "none",
            Quantization::Fp8 { .. } => "fp8",
            Quantization::CompressedTensors { .. } => "compressed-tensors",
            Quantization::Mxfp4 { .. } => "mxfp4",
        }
    }
}

/// A JSON object inside `quantization_config`, with its dotted path for messages.
struct Q<'a> {
    v: &'a Value,
    file: &'a Path,
    path: String,
}

impl<'a> Q<'a> {
    fn err(&self, field: &str, msg: impl Into<String>) -> ModelError {
        let field = if field.is_empty() {
            self.path.clone()
        } else {
            format!("{}.{field}", self.path)
        };
        ModelError::Config {
            file: self.file.to_path_buf(),
            field,
            msg: msg.into(),
        }
    }

    fn get(&self, field: &str) -> Option<&'a Value> {
        self.v.get(field).filter(|v| !v.is_null())
    }

    fn sub(&self, field: &str) -> Result<Q<'a>, ModelError> {
        let v = self
            .get(field)
            .ok_or_else(|| self.err(field, "required field is missing"))?;
        if !v.is_object() {
            return Err(self.err(field, "expected an object"));
        }
        Ok(Q {
            v,
            file: self.file,
            path: format!("{}.{field}", self.path),
        })
    }

    fn str_or(&self, field: &str, default: Option<&'a str>) -> Result<&'a str, ModelError> {
        match self.get(field) {
            None => default.ok_or_else(|| self.err(field, "required field is missing")),
            Some(v) => v
                .as_str()
                .ok_or_else(|| self.err(field, format!("expected a string, got {v}"))),
        }
    }

    /// A string field that must be one of `allowed` (`default` when absent or null).
    fn one_of(
        &self,
        field: &str,
        default: Option<&'a str>,
        allowed: &[&str],
    ) -> Result<&'a str, ModelError> {
        let s = self.str_or(field, default)?;
        if !allowed.contains(&s) {
            return Err(self.err(
                field,
                format!("`{s}` is not supported (supported: {})", allowed.join(", ")),
            ));
        }
        Ok(s)
    }

    fn usize(&self, field: &str) -> Result<usize, ModelError> {
        let v = self
            .get(field)
            .ok_or_else(|| self.err(field, "required field is missing"))?;
        v.as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n > 0)
            .ok_or_else(|| self.err(field, format!("expected a positive integer, got {v}")))
    }

    fn bool_or(&self, field: &str, default: bool) -> Result<bool, ModelError> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.err(field, format!("expected true or false, got {v}"))),
        }
    }

    /// A field that must be absent or null: something sluice does not implement.
    fn absent(&self, field: &str, what: &str) -> Result<(), ModelError> {
        match self.get(field) {
            None => Ok(()),
            Some(v) => Err(self.err(field, format!("{v}: {what} is not supported"))),
        }
    }

    /// A field that must be absent, null, `{}` or declare the `dense` format (what
    /// llm-compressor writes when nothing of the kind was applied).
    fn absent_or_empty(&self, field: &str, what: &str) -> Result<(), ModelError> {
        match self.get(field) {
            Some(Value::Object(o))
                if o.is_empty() || o.get("format").and_then(Value::as_str) == Some("dense") =>
            {
                Ok(())
            }
            _ => self.absent(field, what),
        }
    }

    fn strings(&self, field: &str) -> Result<Vec<String>, ModelError> {
        match self.get(field) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| self.err(field, format!("expected strings, got {x}")))
                })
                .collect(),
            Some(v) => Err(self.err(field, format!("expected a list of strings, got {v}"))),
        }
    }
}

/// Reads `quantization_config` (`v` is its value; `file` names it in errors). `fused` says
/// whether the family stores its experts fused per layer (GPT-OSS), the only layout whose
/// experts `mxfp4` describes.
pub(crate) fn read(v: &Value, file: &Path, fused: bool) -> Result<Quantization, ModelError> {
    let q = Q {
        v,
        file,
        path: "quantization_config".into(),
    };
    if !v.is_object() {
        return Err(q.err("", "expected an object"));
    }
    let method = q.one_of(
        "quant_method",
        None,
        &["fp8", "compressed-tensors", "mxfp4"],
    )?;
    match (method, fused) {
        ("mxfp4", false) => {
            return Err(q.err(
                "quant_method",
                "`mxfp4` (GPT-OSS `*_blocks` / `*_scales`) is only supported for gpt_oss",
            ));
        }
        ("fp8" | "compressed-tensors", true) => {
            return Err(q.err(
                "quant_method",
                format!("`{method}` is not supported for gpt_oss (supported: mxfp4)"),
            ));
        }
        _ => {}
    }
    match method {
        "fp8" => {
            q.one_of("fmt", Some("e4m3"), &["e4m3"])?;
            q.one_of("activation_scheme", Some("dynamic"), &["dynamic"])?;
            // `ue8m0` (DeepSeek-V3.1, V4) only says the stored scales are powers of two (F32 or
            // F8_E8M0).
            q.one_of("scale_fmt", Some("float"), &["float", "ue8m0"])?;
            let fp4 = q.one_of("expert_dtype", Some("fp8"), &["fp8", "fp4"])? == "fp4";
            q.strings("modules_to_not_convert")?;
            q.strings("ignored_layers")?;
            let bad = || {
                q.err(
                    "weight_block_size",
                    "expected [rows, columns] of positive integers",
                )
            };
            let b = match q.get("weight_block_size") {
                None => return Err(q.err("weight_block_size", "required field is missing")),
                Some(Value::Array(a)) if a.len() == 2 => a
                    .iter()
                    .map(|x| {
                        x.as_u64()
                            .and_then(|n| usize::try_from(n).ok())
                            .filter(|&n| n > 0)
                    })
                    .collect::<Option<Vec<usize>>>()
                    .ok_or_else(bad)?,
                Some(_) => return Err(bad()),
            };
            if !b[1].is_multiple_of(16) {
                return Err(q.err(
                    "weight_block_size",
                    format!("block columns {} are not a multiple of 16", b[1]),
                ));
            }
            Ok(Quantization::Fp8 {
                block_rows: b[0],
                block_cols: b[1],
                fp4,
            })
        }
        "mxfp4" => Ok(Quantization::Mxfp4 {
            not_converted: {
                let n = q.strings("modules_to_not_convert")?;
                for key in &n {
                    Regex::new(key)
                        .map_err(|e| q.err("modules_to_not_convert", format!("`{key}`: {e}")))?;
                }
                n
            },
        }),
        _ => read_compressed_tensors(&q),
    }
}

fn read_compressed_tensors(q: &Q<'_>) -> Result<Quantization, ModelError> {
    q.one_of("quantization_status", Some("compressed"), &["compressed"])?;
    q.absent("kv_cache_scheme", "a quantized KV cache")?;
    q.absent_or_empty("sparsity_config", "sparsity compression")?;
    q.absent_or_empty("transform_config", "a weight transform")?;
    let formats = ["pack-quantized", "mxfp4-pack-quantized"];
    let top_format = q.get("format");
    let groups_q = q.sub("config_groups")?;
    let Some(map) = groups_q.v.as_object() else {
        return Err(q.err("config_groups", "expected an object"));
    };
    if map.is_empty() {
        return Err(q.err("config_groups", "no groups"));
    }
    let mut groups = Vec::with_capacity(map.len());
    for key in map.keys() {
        let g = groups_q.sub(key)?;
        // A group's own format wins; without one the top-level format applies.
        let format = if g.get("format").is_some() {
            g.one_of("format", None, &formats)?
        } else if top_format.is_some() {
            q.one_of("format", None, &formats)?
        } else {
            return Err(g.err(
                "format",
                "required field is missing (no top-level format either)",
            ));
        };
        g.absent("input_activations", "activation quantization")?;
        g.absent("output_activations", "output quantization")?;
        let targets = g.strings("targets")?;
        if targets.is_empty() {
            return Err(g.err("targets", "no targets"));
        }
        for t in &targets {
            check_target(&g, "targets", t)?;
        }
        let w = g.sub("weights")?;
        let bits = w.usize("num_bits")?;
        if bits != 4 {
            return Err(w.err("num_bits", format!("{bits} is not supported (only 4)")));
        }
        if !w.bool_or("symmetric", true)? {
            return Err(w.err(
                "symmetric",
                "asymmetric (zero-point) weights are not supported",
            ));
        }
        if w.bool_or("dynamic", false)? {
            return Err(w.err("dynamic", "dynamic weight quantization is not supported"));
        }
        w.one_of("strategy", None, &["group"])?;
        w.absent("actorder", "activation ordering")?;
        w.absent("block_structure", "a block structure")?;
        let group = w.usize("group_size")?;
        let scheme = match format {
            "pack-quantized" => {
                w.one_of("type", Some("int"), &["int"])?;
                if !group.is_multiple_of(16) {
                    return Err(w.err("group_size", format!("{group} is not a multiple of 16")));
                }
                CtScheme::PackInt4 { group }
            }
            _ => {
                w.one_of("type", None, &["float"])?;
                w.one_of(
                    "scale_dtype",
                    Some("torch.uint8"),
                    &["torch.uint8", "torch.float8_e8m0fnu"],
                )?;
                if group != 32 {
                    return Err(w.err(
                        "group_size",
                        format!("{group} is not supported for MXFP4 (only 32)"),
                    ));
                }
                CtScheme::Mxfp4
            }
        };
        groups.push(CtGroup {
            name: key.clone(),
            targets,
            scheme,
        });
    }
    let ignore = q.strings("ignore")?;
    for t in &ignore {
        check_target(q, "ignore", t)?;
    }
    Ok(Quantization::CompressedTensors { groups, ignore })
}

fn check_target(q: &Q<'_>, field: &str, t: &str) -> Result<(), ModelError> {
    if let Some(re) = t.strip_prefix("re:") {
        Regex::new(re).map_err(|e| q.err(field, format!("`{t}`: {e}")))?;
    }
    Ok(())
}

/// A compiled compressed-tensors target (`re:` regex, `Linear`, or an exact module name).
enum Target {
    Regex(Regex),
    Linear,
    Name(String),
}

impl Target {
    fn new(t: &str) -> Target {
        match t.strip_prefix("re:") {
            // Python's re.match: anchored at the start only. Checked when the config was read.
            Some(re) => Regex::new(&format!("^(?:{re})"))
                .map(Target::Regex)
                .unwrap_or_else(|_| Target::Name(t.to_owned())),
            None if t == "Linear" => Target::Linear,
            None => Target::Name(t.to_owned()),
        }
    }

    fn matches(&self, module: &str, linear: bool) -> bool {
        match self {
            Target::Regex(r) => r.is_match(module).unwrap_or(false),
            Target::Linear => linear,
            Target::Name(n) => n == module,
        }
    }
}

/// How one weight is stored, as the quantization config says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stored<'a> {
    /// Decide by the stored dtype (plain, or FP8 with block scales).
    ByDtype,
    /// Packed by a compressed-tensors group.
    Packed(&'a CtGroup),
    /// Plain (a compressed-tensors checkpoint that does not target this module).
    Plain,
}

/// Answers "is this module packed?" for a checkpoint's quantization.
pub(crate) struct Matcher<'a> {
    q: &'a Quantization,
    groups: Vec<Vec<Target>>,
    ignore: Vec<Target>,
    not_converted: Vec<Regex>,
}

impl<'a> Matcher<'a> {
    pub(crate) fn new(q: &'a Quantization) -> Matcher<'a> {
        let (groups, ignore, not_converted) = match q {
            Quantization::CompressedTensors { groups, ignore } => (
                groups
                    .iter()
                    .map(|g| g.targets.iter().map(|t| Target::new(t)).collect())
                    .collect(),
                ignore.iter().map(|t| Target::new(t)).collect(),
                Vec::new(),
            ),
            Quantization::Mxfp4 { not_converted } => (
                Vec::new(),
                Vec::new(),
                not_converted
                    .iter()
                    // transformers' should_convert_module: from the start, ending at a module
                    // boundary. Checked when the config was read.
                    .filter_map(|k| Regex::new(&format!(r"^(?:{k})(?:(?<=\.)|(?=\.|$))")).ok())
                    .collect(),
            ),
            _ => (Vec::new(), Vec::new(), Vec::new()),
        };
        Matcher {
            q,
            groups,
            ignore,
            not_converted,
        }
    }

    /// How the weight of `module` (a module name such as `model.layers.3.mlp.experts.7.up_proj`)
    /// is stored; `linear` says whether the module is a linear layer (what the `Linear` target
    /// matches). Errors when two groups claim the module.
    pub(crate) fn linear(&self, module: &str, linear: bool) -> Result<Stored<'a>, ModelError> {
        let Quantization::CompressedTensors { groups, .. } = self.q else {
            return Ok(Stored::ByDtype);
        };
        if self.ignore.iter().any(|t| t.matches(module, linear)) {
            return Ok(Stored::Plain);
        }
        let mut found: Option<&'a CtGroup> = None;
        for (g, targets) in groups.iter().zip(&self.groups) {
            if targets.iter().any(|t| t.matches(module, linear)) {
                if let Some(prev) = found {
                    return Err(ModelError::Tensor {
                        tensor: format!("{module}.weight"),
                        msg: format!(
                            "quantization_config groups `{}` and `{}` both target it",
                            prev.name, g.name
                        ),
                    });
                }
                found = Some(g);
            }
        }
        Ok(found.map_or(Stored::Plain, Stored::Packed))
    }

    /// Whether fused experts (GPT-OSS's) at `module` (`model.layers.L.mlp.experts`) are stored as MXFP4
    /// blocks.
    pub(crate) fn fused_mxfp4(&self, module: &str) -> bool {
        match self.q {
            Quantization::Mxfp4 { not_converted } => {
                !self.not_converted.iter().zip(not_converted).any(|(r, k)| {
                    r.is_match(module).unwrap_or(false) || module.ends_with(k.as_str())
                })
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn k2_thinking() -> Value {
        json!({
            "config_groups": {"group_0": {"input_activations": null, "output_activations": null,
                "targets": ["Linear"], "weights": {"actorder": null, "block_structure": null,
                "dynamic": false, "group_size": 32, "num_bits": 4, "observer": "minmax",
                "observer_kwargs": {}, "strategy": "group", "symmetric": true, "type": "int"}}},
            "format": "pack-quantized",
            "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                       "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
            "kv_cache_scheme": null, "quant_method": "compressed-tensors",
            "quantization_status": "compressed"
        })
    }

    fn parse(v: &Value, gpt_oss: bool) -> Result<Quantization, ModelError> {
        read(v, Path::new("config.json"), gpt_oss)
    }

    fn field(e: ModelError) -> String {
        match e {
            ModelError::Config { field, .. } => field,
            e => panic!("not a config error: {e}"),
        }
    }

    #[test]
    fn k2_thinking_ignore_list() {
        let q = parse(&k2_thinking(), false).unwrap();
        let m = Matcher::new(&q);
        let packed = |name: &str| matches!(m.linear(name, true).unwrap(), Stored::Packed(_));
        assert!(packed("model.layers.1.mlp.experts.7.gate_proj"));
        assert!(packed("model.layers.60.mlp.experts.383.down_proj"));
        assert!(!packed("model.layers.0.mlp.gate_proj"));
        assert!(!packed("model.layers.1.mlp.shared_experts.up_proj"));
        assert!(!packed("model.layers.1.self_attn.kv_b_proj"));
        assert!(!packed("lm_head"));
        // Not a linear layer: the `Linear` target does not reach it.
        assert_eq!(
            m.linear("model.layers.1.mlp.gate", false).unwrap(),
            Stored::Plain
        );
    }

    #[test]
    fn fp8_reads_and_refuses() {
        let v = json!({"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                       "weight_block_size": [128, 128]});
        assert_eq!(
            parse(&v, false).unwrap(),
            Quantization::Fp8 {
                block_rows: 128,
                block_cols: 128,
                fp4: false,
            }
        );
        // DeepSeek-V4: power-of-two scales, FP4 routed experts.
        let mut v4 = v.clone();
        v4["scale_fmt"] = json!("ue8m0");
        v4["expert_dtype"] = json!("fp4");
        assert!(matches!(
            parse(&v4, false).unwrap(),
            Quantization::Fp8 { fp4: true, .. }
        ));
        for (k, bad, f) in [
            (
                "expert_dtype",
                json!("int4"),
                "quantization_config.expert_dtype",
            ),
            ("scale_fmt", json!("e4m3"), "quantization_config.scale_fmt"),
            ("fmt", json!("e5m2"), "quantization_config.fmt"),
            (
                "activation_scheme",
                json!("static"),
                "quantization_config.activation_scheme",
            ),
            (
                "weight_block_size",
                json!([128]),
                "quantization_config.weight_block_size",
            ),
            (
                "weight_block_size",
                json!([128, 24]),
                "quantization_config.weight_block_size",
            ),
        ] {
            let mut v = v.clone();
            v[k] = bad;
            assert_eq!(field(parse(&v, false).unwrap_err()), f);
        }
        assert_eq!(
            field(parse(&v, true).unwrap_err()),
            "quantization_config.quant_method"
        );
    }

    #[test]
    fn compressed_tensors_fields_are_named() {
        let w = "quantization_config.config_groups.group_0.weights";
        for (path, bad, f) in [
            ("num_bits", json!(8), format!("{w}.num_bits")),
            ("symmetric", json!(false), format!("{w}.symmetric")),
            ("strategy", json!("channel"), format!("{w}.strategy")),
            ("group_size", json!(24), format!("{w}.group_size")),
            ("type", json!("float"), format!("{w}.type")),
            ("actorder", json!("group"), format!("{w}.actorder")),
        ] {
            let mut v = k2_thinking();
            v["config_groups"]["group_0"]["weights"][path] = bad;
            assert_eq!(field(parse(&v, false).unwrap_err()), f, "{path}");
        }
        let mut v = k2_thinking();
        v["format"] = json!("nvfp4-pack-quantized");
        assert_eq!(
            field(parse(&v, false).unwrap_err()),
            "quantization_config.format"
        );
        let mut v = k2_thinking();
        v["config_groups"]["group_0"]["input_activations"] = json!({"num_bits": 8});
        assert_eq!(
            field(parse(&v, false).unwrap_err()),
            "quantization_config.config_groups.group_0.input_activations"
        );
        let mut v = k2_thinking();
        v["ignore"] = json!(["re:(unclosed"]);
        assert_eq!(
            field(parse(&v, false).unwrap_err()),
            "quantization_config.ignore"
        );
        let mut v = k2_thinking();
        v["sparsity_config"] = json!({});
        parse(&v, false).unwrap();
        v["sparsity_config"] = json!({"format": "sparse-24-bitmask"});
        assert_eq!(
            field(parse(&v, false).unwrap_err()),
            "quantization_config.sparsity_config"
        );
        let mut v = k2_thinking();
        v["quant_method"] = json!("gptq");
        assert_eq!(
            field(parse(&v, false).unwrap_err()),
            "quantization_config.quant_method"
        );
    }

    #[test]
    fn gpt_oss_not_converted() {
        let v = json!({"modules_to_not_convert": ["model.layers.*.self_attn",
            "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"});
        let q = parse(&v, true).unwrap();
        let m = Matcher::new(&q);
        assert!(m.fused_mxfp4("model.layers.3.mlp.experts"));
        let v = json!({"modules_to_not_convert": ["model.layers.1.mlp"], "quant_method": "mxfp4"});
        let q = parse(&v, true).unwrap();
        let m = Matcher::new(&q);
        assert!(!m.fused_mxfp4("model.layers.1.mlp.experts"));
        assert!(m.fused_mxfp4("model.layers.11.mlp.experts"));
        assert_eq!(
            field(parse(&v, false).unwrap_err()),
            "quantization_config.quant_method"
        );
    }
}
