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
//! each ([`crate::weights::ExpertSpec::Biased`]).
//!
//! What differs between families is theirs: each family that llama.cpp converts names its
//! GGUF architectures in its registry row (`Family::gguf`, a [`GgufArch`]: the architecture,
//! its `config.json` from the metadata through [`Meta`], the few tensor names that differ,
//! [`GgufNames`]). Read today: `llama` (Llama, or Mixtral when it has experts), `qwen2`,
//! `qwen3`, `qwen2moe`, `qwen3moe`, `deepseek2` with sigmoid routing (DeepSeek-V3/R1, Kimi K2)
//! and `gpt-oss`. Anything else — an architecture, a tensor no mapping places, a feature it
//! does not carry (DeepSeek-V2's softmax routing, `rope_freqs` factors that are not Llama 3's
//! rope scaling) — is refused with one line naming the file and the key or tensor. Llama 3's
//! rope scaling, which the converter stores as per-pair factors, is read back as its
//! parameters.

use std::collections::HashMap;

use serde_json::{Map, Value as Json, json};
use sluice_format::gguf::{Array, GgmlType, Gguf, GgufSet, Value};
use sluice_format::{Checkpoint, Dtype, TensorInfo};

use crate::ModelError;

/// How one GGUF architecture maps onto a family's transformers checkpoint. The families
/// supply these (`Family::gguf` in `arch/`); this module knows GGUF's layout, not the families.
pub(crate) struct GgufArch {
    /// `general.architecture`.
    pub name: &'static str,
    /// Files of this architecture with routed experts (`<arch>.expert_count` > 0) are this
    /// family's when `Some(true)`, those without when `Some(false)`, all when `None` (llama.cpp's
    /// `llama` is Llama, or Mixtral when it has experts).
    pub with_experts: Option<bool>,
    /// The converter permuted `attn_q` and `attn_k` for the rotary layout.
    pub permuted_qk: bool,
    /// Where the layers' tensors go.
    pub names: GgufNames,
    /// The `config.json` transformers would write for the model, from the file's metadata.
    pub config: fn(&Meta<'_>) -> Result<Json, ModelError>,
}

/// A family's tensor names, as far as they differ between the families a GGUF layer is
/// mapped onto (everything else is llama.cpp's common naming, in `names.rs`).
#[derive(Clone, Copy)]
pub(crate) struct GgufNames {
    /// The MoE block's module (`mlp`; Mixtral's `block_sparse_moe`).
    pub moe: &'static str,
    /// The routed experts' gate, up and down projections.
    pub experts: [&'static str; 3],
    /// The shared expert's module (`shared_expert`; DeepSeek's `shared_experts`).
    pub shared: &'static str,
    /// Names of this architecture's own, tried first: `(gguf, hf)` maps `blk.{l}.{gguf}` to
    /// `model.layers.{l}.{hf}` when `gguf` names the whole tensor (`attn_sinks.weight`), or
    /// `blk.{l}.{gguf}.{suffix}` to `model.layers.{l}.{hf}.{suffix}` when it names the base.
    pub extra: &'static [(&'static str, &'static str)],
    /// Stacked expert biases (`[experts, rows]`) are split as the weights are (GPT-OSS).
    pub expert_biases: bool,
    /// Older files may hold one tensor per expert, `ffn_{gate,up,down}.{e}` (Mixtral).
    pub per_expert_tensors: bool,
}

impl GgufNames {
    /// llama.cpp's naming of the Qwen and Llama layouts.
    pub const STANDARD: GgufNames = GgufNames {
        moe: "mlp",
        experts: ["gate_proj", "up_proj", "down_proj"],
        shared: "shared_expert",
        extra: &[],
        expert_biases: false,
        per_expert_tensors: false,
    };
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
/// transformers names (see the module documentation), by the first of `arches` that reads
/// the file's architecture.
pub(crate) fn to_hf(ck: &mut Checkpoint, arches: &[&GgufArch]) -> Result<(), ModelError> {
    let Some(set) = ck.gguf() else {
        return Ok(());
    };
    let h = set.header();
    let arch_name = h.get_str("general.architecture")?;
    let meta = Meta::new(set, arch_name);
    let experts = meta.opt_uint("expert_count")?.unwrap_or(0) > 0;
    let Some(arch) = arches
        .iter()
        .find(|a| a.name == arch_name && a.with_experts.is_none_or(|w| w == experts))
    else {
        let mut names: Vec<&str> = Vec::new();
        for a in arches {
            if !names.contains(&a.name) {
                names.push(a.name);
            }
        }
        return Err(key_err(
            h,
            "general.architecture",
            format!(
                "`{arch_name}` is not supported (supported: {})",
                names.join(", ")
            ),
        ));
    };
    let mut config = (arch.config)(&meta)?;
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

mod meta;
mod names;

pub(crate) use meta::Meta;
use meta::{generation_config, llama3_scaling};
use names::tensors;
