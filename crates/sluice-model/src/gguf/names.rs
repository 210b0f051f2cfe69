//! The tensors of a GGUF file under their transformers names: each one expert's slab of a
//! stacked tensor a byte range of its own.

use super::*;

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

/// The Hugging Face place of layer `l`'s tensor `base` (`attn_q`, `ffn_up_exps`, ...) with its
/// `suffix` (`weight` or `bias`), by llama.cpp's common naming and the family's `names`.
fn place(names: &GgufNames, l: &str, base: &str, suffix: &str) -> Option<Place> {
    let layer = format!("model.layers.{l}.");
    let whole = format!("{base}.{suffix}");
    for &(gguf, hf) in names.extra {
        if gguf == whole {
            return Some(Place::One(format!("{layer}{hf}")));
        }
        if gguf == base {
            return Some(Place::One(format!("{layer}{hf}.{suffix}")));
        }
    }
    let GgufNames {
        moe,
        shared,
        experts: [gate, up, down],
        ..
    } = *names;
    let one = |s: &str| Some(Place::One(format!("{layer}{s}.{suffix}")));
    let experts = |proj| {
        (suffix == "weight" || names.expert_biases).then(|| Place::Experts {
            prefix: format!("{layer}{moe}.experts."),
            proj,
            suffix: suffix.to_owned(),
        })
    };
    match base {
        "attn_norm" => one("input_layernorm"),
        "ffn_norm" => one("post_attention_layernorm"),
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
        _ if names.per_expert_tensors => {
            // One tensor per expert, `ffn_{gate,up,down}.{e}`.
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
pub(super) fn tensors(
    ck: &Checkpoint,
    set: &GgufSet,
    arch: &GgufArch,
    config: &Json,
) -> Result<(Vec<(String, TensorInfo)>, HashMap<String, usize>), ModelError> {
    let h = set.header();
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
                    .then(|| place(&arch.names, l, base, suffix))
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
