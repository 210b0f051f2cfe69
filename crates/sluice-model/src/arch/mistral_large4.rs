//! Mistral Large 4 (`mistral_large4`, the multimodal checkpoint as released; its text model,
//! read from `text_config` (`mistral_large4_text`), is what runs, and the vision tower is not
//! read). GLM-5's blocks ([`super::glm_moe_dsa`]: MLA with DeepSeek Sparse Attention, the
//! indexer's pairs interleaved, `indexer_types` sharing top-k) with these differences:
//!
//! - **No query LoRA.** MLA's queries come from a full `q_proj`, and so the indexer's `wq_b`
//!   reads a LayerNorm (`q_input_norm`, with bias, eps 10⁻⁶) of the layer's input
//!   ([`IndexerQuery::Input`]).
//! - **Log-position query scaling.** Each head's query, in attention and in the indexer, is
//!   multiplied by `scale_h · ln(pos + 1) + bias_h` (`softmax_scaling.{scale,bias}`).
//! - **NoPE layers.** `no_rope_layers[l] = 0` (by default every fourth layer) has no rotary part:
//!   its heads are `qk_nope_head_dim + qk_rope_head_dim` wide, all unrotated, the latent cache
//!   holds no rotary key, and its indexer rotates nothing.
//! - **Shared latent caches.** `kv_source_layers[l] = s < l` makes layer `l` attend to layer
//!   `s`'s cache with its own `kv_b_proj` (it has no `kv_a_proj_with_mqa`); `s` must be its own
//!   source, have the same rotary part, and be the last layer before `l` whose cache is shared
//!   among those with that rotary part (transformers hands a sharing layer the latest such
//!   cache).
//! - **LeRoPE.** YaRN's inverse frequencies times `exp(α)`, `α` the learned `rotary_emb.alpha`.
//! - **Routing.** Softmax probabilities (the router weight kept in f32), DeepSeek's
//!   group-limited top-k without a bias, always renormalised, times `routed_scaling_factor`.
//! - **Norms.** The latent norm `kv_a_layernorm` takes `rms_norm_eps` (DeepSeek's: 10⁻⁶).
//! - **Soft-capped logits**, `c · tanh(z / c)` with `c = final_logit_softcapping` (default 30).
//! - **Mistral's tensor names.** The checkpoint names its tensors as Mistral's own code does,
//!   and transformers renames them on load ([`canonical`], the text model's part of its
//!   conversion mapping): `tok_embeddings`, `layers.{l}.attention.{wq, wkv_a_with_mqa,
//!   kv_a_norm, wkv_b, wo, ssmax_scaling.{s,b}, indexer.*}`, `attention_norm`, `ffn_norm`,
//!   `feed_forward.w{1,2,3}` (gate, down, up), `gate`, `experts.{e}.w{1,2,3}`,
//!   `shared_experts.w{1,2,3}`, `lerope.alpha`, `norm`, `output`. Errors name the renamed
//!   tensors. The vision tower and the `mtp_dspark.*` draft head are not read.

use serde_json::Value;

use super::common::{Base, layer_list, text_config};
use super::{Family, Models};
use crate::ModelError;
use crate::attention::{DsaConfig, IndexerQuery};
use crate::config::{Cfg, ExpertNames, ModelConfig, Rename, RouterKind, TensorNames};

pub(super) const FAMILY: Family = Family {
    name: "mistral_large4",
    models: &[Models {
        model_types: &["mistral_large4"],
        names: "Mistral Large 4",
        features: "GLM-5's sparse attention without a query LoRA (the indexer reads a LayerNorm of the input); layers attending to an earlier layer's latent cache (`kv_source_layers`); NoPE layers; per-head log-position query scaling; learned rotary factors over YaRN; grouped softmax routing; soft-capped logits; the multimodal checkpoint's text model under Mistral's own tensor names (vision tower not read)",
    }],
    read,
    gguf: &[],
};

/// transformers' `final_logit_softcapping` default.
const SOFTCAP: f32 = 30.0;

fn read(top: &Cfg<'_>, model_type: &str) -> Result<ModelConfig, ModelError> {
    let c = &text_config(top, "mistral_large4_text")?;
    if c.get("q_lora_rank").is_some_and(|v| !v.is_null()) {
        return Err(c.err("q_lora_rank", "Mistral Large 4 has no query LoRA"));
    }
    let base = Base::read_multimodal(top, c)?;
    let eps = base.eps;
    let v3 = super::deepseek_v3::read_with(c, base, model_type, FAMILY.name, None)?;
    let mut cfg = v3.cfg;
    let layers = cfg.layers;

    let (n_group, topk_group, routed_scaling_factor) = v3.groups;
    cfg.moe.router = RouterKind::SoftmaxGroup {
        n_group,
        topk_group,
        routed_scaling_factor,
    };
    cfg.names = TensorNames {
        model: "model.language_model.",
        experts: ExpertNames::Separate {
            gate: "w1",
            up: "w3",
            down: "w2",
        },
        rename: Some(Rename {
            dialect: "mistral",
            canonical,
        }),
        ..TensorNames::standard()
    };
    cfg.rope.learned = true;
    // (null turns the cap off; absent is transformers' default.)
    cfg.logit_softcap = match c.v.get("final_logit_softcapping") {
        None => Some(SOFTCAP),
        Some(Value::Null) => None,
        Some(_) => Some(c.pos_f32("final_logit_softcapping")?),
    };

    let shared =
        super::glm_moe_dsa::indexer_types(c, layers, super::glm_moe_dsa::default_types(c)?)?;
    if shared.first() == Some(&true) {
        return Err(c.err(
            "indexer_types",
            "layer 0 is `shared`, but no layer before it has an indexer",
        ));
    }
    let rope = rope_layers(c, layers)?;
    let sources = kv_sources(c, &rope)?;
    let sparse = |l: usize, d: &mut DsaConfig| {
        let m = &mut d.mla;
        m.norm_eps = eps;
        m.log_scaling = true;
        if !rope[l] {
            m.rope = false;
            m.qk_nope_head_dim += m.qk_rope_head_dim;
            m.qk_rope_head_dim = 0;
        }
        m.kv_source = (sources[l] != l).then_some(sources[l]);
    };
    let query = IndexerQuery::Input;
    super::deepseek_v32::make_sparse(c, &mut cfg, &v3.mla, true, &shared, query, sparse)?;
    Ok(cfg)
}

/// Per layer, whether it is rotated: `no_rope_layers` (1 rotates; at least one entry per
/// layer), else every layer but each `no_rope_layer_interval`-th (default 4).
fn rope_layers(c: &Cfg<'_>, layers: usize) -> Result<Vec<bool>, ModelError> {
    let field = "no_rope_layers";
    let list = layer_list(c, field)?;
    if list.is_empty() {
        let every = c.opt_usize("no_rope_layer_interval")?.unwrap_or(4);
        if every == 0 {
            return Err(c.err("no_rope_layer_interval", "must be positive"));
        }
        return Ok((0..layers)
            .map(|l| !(l + 1).is_multiple_of(every))
            .collect());
    }
    if list.len() < layers {
        return Err(c.err(field, format!("{} entries for {layers} layers", list.len())));
    }
    list[..layers]
        .iter()
        .map(|&v| match v {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(c.err(field, format!("entries are 0 or 1, got {v}"))),
        })
        .collect()
}

/// Per layer, the layer whose latent cache it attends to (`kv_source_layers`, itself when
/// absent), checked as transformers' cache sharing needs.
fn kv_sources(c: &Cfg<'_>, rope: &[bool]) -> Result<Vec<usize>, ModelError> {
    let field = "kv_source_layers";
    let n = rope.len();
    let list = layer_list(c, field)?;
    if list.is_empty() {
        return Ok((0..n).collect());
    }
    if list.len() != n {
        return Err(c.err(field, format!("{} entries for {n} layers", list.len())));
    }
    let kind = |r: bool| if r { "a rotary part" } else { "no rotary part" };
    for (l, &s) in list.iter().enumerate() {
        if s == l {
            continue;
        }
        if s > l || list[s] != s {
            return Err(c.err(
                field,
                format!("layer {l} must share an earlier layer's own cache, got {s}"),
            ));
        }
        if rope[s] != rope[l] {
            return Err(c.err(
                field,
                format!(
                    "layer {l} has {} and shares layer {s}'s cache, which has {}",
                    kind(rope[l]),
                    kind(rope[s])
                ),
            ));
        }
        // The cache transformers hands layer `l`: the latest shared one of its kind.
        let latest = (0..l)
            .rev()
            .find(|&p| rope[p] == rope[l] && list[p + 1..].contains(&p));
        if latest != Some(s) {
            return Err(c.err(
                field,
                format!(
                    "layer {l} shares layer {s}'s cache, but layer {} shares its own later \
                     (transformers would give layer {l} that one)",
                    latest.unwrap_or(s)
                ),
            ));
        }
    }
    Ok(list)
}

/// The name transformers gives a tensor of the checkpoint as it loads it (the text model's
/// part of `conversion_mapping`'s `mistral_large4` and `mistral_large4_text` entries, with the
/// routed experts kept per expert); `None` for the tensors it does not rename here (the vision
/// tower's).
pub(crate) fn canonical(name: &str) -> Option<String> {
    const LM: &str = "model.language_model.";
    if let Some(rest) = name.strip_prefix("layers.") {
        let (l, rest) = rest.split_once('.')?;
        l.parse::<usize>().ok()?;
        return Some(format!("{LM}layers.{l}.{}", layer_tensor(rest)));
    }
    if let Some(rest) = name.strip_prefix("tok_embeddings.") {
        return Some(format!("{LM}embed_tokens.{rest}"));
    }
    if name.starts_with("norm.") {
        return Some(format!("{LM}{name}"));
    }
    if name == "lerope.alpha" {
        return Some(format!("{LM}rotary_emb.alpha"));
    }
    name.strip_prefix("output.")
        .map(|rest| format!("lm_head.{rest}"))
}

/// A layer's tensor `rest` (after `layers.{l}.`) as transformers names it.
fn layer_tensor(rest: &str) -> String {
    let parts: Vec<&str> = rest.split('.').collect();
    let (module, tail) = match parts.split_first() {
        Some((m, t)) => (*m, t),
        None => return rest.to_owned(),
    };
    let mlp = |t: &[&str]| -> Vec<String> {
        let mut t: Vec<String> = t.iter().map(|s| (*s).to_owned()).collect();
        if let Some(first) = t.first_mut() {
            let to = match first.as_str() {
                "w1" => "gate_proj",
                "w2" => "down_proj",
                "w3" => "up_proj",
                other => other,
            };
            *first = to.to_owned();
        }
        t
    };
    let out: Vec<String> = match module {
        "attention" => {
            let mut out = vec!["self_attn".to_owned()];
            out.extend(attention(tail));
            out
        }
        "attention_norm" => once("input_layernorm", tail),
        "ffn_norm" => once("post_attention_layernorm", tail),
        "feed_forward" => {
            let mut out = vec!["mlp".to_owned()];
            out.extend(mlp(tail));
            out
        }
        "shared_experts" => {
            let mut out = vec!["mlp".to_owned(), "shared_experts".to_owned()];
            out.extend(mlp(tail));
            out
        }
        "gate" | "experts" => once(&format!("mlp.{module}"), tail),
        _ => return rest.to_owned(),
    };
    out.join(".")
}

/// `head` then `tail`, as names.
fn once(head: &str, tail: &[&str]) -> Vec<String> {
    std::iter::once(head.to_owned())
        .chain(tail.iter().map(|s| (*s).to_owned()))
        .collect()
}

/// An attention tensor after `attention.` (the indexer's keep their names but for the
/// query scaling).
fn attention(tail: &[&str]) -> Vec<String> {
    let (indexer, tail) = match tail.split_first() {
        Some((&"indexer", t)) => (true, t),
        _ => (false, tail),
    };
    let mut out: Vec<String> = Vec::with_capacity(tail.len() + 1);
    if indexer {
        out.push("indexer".to_owned());
    }
    let Some((first, rest)) = tail.split_first() else {
        return out;
    };
    let module = match *first {
        "wq" if !indexer => "q_proj",
        "wkv_a_with_mqa" if !indexer => "kv_a_proj_with_mqa",
        "wkv_b" if !indexer => "kv_b_proj",
        "wo" if !indexer => "o_proj",
        "kv_a_norm" if !indexer => "kv_a_layernorm",
        "ssmax_scaling" => {
            out.push("softmax_scaling".to_owned());
            out.extend(rest.iter().map(|s| match *s {
                "s" => "scale".to_owned(),
                "b" => "bias".to_owned(),
                other => other.to_owned(),
            }));
            return out;
        }
        other => other,
    };
    out.push(module.to_owned());
    out.extend(rest.iter().map(|s| (*s).to_owned()));
    out
}

#[cfg(test)]
mod tests {
    use super::canonical;

    #[test]
    fn names_are_renamed_as_transformers_loads_them() {
        let lm = "model.language_model.";
        for (stored, want) in [
            ("tok_embeddings.weight", "embed_tokens.weight"),
            ("norm.weight", "norm.weight"),
            ("lerope.alpha", "rotary_emb.alpha"),
            (
                "layers.3.attention.wq.weight",
                "layers.3.self_attn.q_proj.weight",
            ),
            (
                "layers.3.attention.wkv_a_with_mqa.weight",
                "layers.3.self_attn.kv_a_proj_with_mqa.weight",
            ),
            (
                "layers.3.attention.wkv_b.weight",
                "layers.3.self_attn.kv_b_proj.weight",
            ),
            (
                "layers.3.attention.wo.weight",
                "layers.3.self_attn.o_proj.weight",
            ),
            (
                "layers.3.attention.kv_a_norm.weight",
                "layers.3.self_attn.kv_a_layernorm.weight",
            ),
            (
                "layers.3.attention.ssmax_scaling.s",
                "layers.3.self_attn.softmax_scaling.scale",
            ),
            (
                "layers.3.attention.indexer.ssmax_scaling.b",
                "layers.3.self_attn.indexer.softmax_scaling.bias",
            ),
            (
                "layers.3.attention.indexer.wq_b.weight",
                "layers.3.self_attn.indexer.wq_b.weight",
            ),
            (
                "layers.3.attention.indexer.k_norm.bias",
                "layers.3.self_attn.indexer.k_norm.bias",
            ),
            (
                "layers.0.attention_norm.weight",
                "layers.0.input_layernorm.weight",
            ),
            (
                "layers.0.ffn_norm.weight",
                "layers.0.post_attention_layernorm.weight",
            ),
            (
                "layers.0.feed_forward.w1.weight",
                "layers.0.mlp.gate_proj.weight",
            ),
            (
                "layers.0.feed_forward.w2.weight",
                "layers.0.mlp.down_proj.weight",
            ),
            (
                "layers.0.feed_forward.w3.weight",
                "layers.0.mlp.up_proj.weight",
            ),
            ("layers.1.gate.weight", "layers.1.mlp.gate.weight"),
            (
                "layers.1.experts.7.w3.weight",
                "layers.1.mlp.experts.7.w3.weight",
            ),
            (
                "layers.1.shared_experts.w2.weight",
                "layers.1.mlp.shared_experts.down_proj.weight",
            ),
        ] {
            assert_eq!(
                canonical(stored).as_deref(),
                Some(&*format!("{lm}{want}")),
                "{stored}"
            );
        }
        assert_eq!(
            canonical("output.weight").as_deref(),
            Some("lm_head.weight")
        );
        for kept in [
            "vision_encoder.transformer.layers.0.attention.wq.weight",
            "patch_merger.merging_layer.weight",
            "mtp_dspark.layers.0.attention.wq.weight",
            "layers.x.attention.wq.weight",
        ] {
            assert_eq!(canonical(kept), None, "{kept}");
        }
    }

    use crate::config::test_util::*;

    /// A Mistral Large 4 config: the fixture's text model, 5 layers.
    fn ml4() -> Value {
        let mut t = ds();
        let o = t.as_object_mut().unwrap();
        for k in ["q_lora_rank", "rope_scaling"] {
            o.remove(k);
        }
        t["model_type"] = json!("mistral_large4_text");
        t["num_hidden_layers"] = json!(5);
        t["index_n_heads"] = json!(8);
        t["index_head_dim"] = json!(16);
        t["index_topk"] = json!(8);
        t["no_rope_layers"] = json!([1, 1, 0, 0, 1]);
        t["kv_source_layers"] = json!([0, 0, 2, 2, 4]);
        json!({"model_type": "mistral_large4", "text_config": t, "vision_config": {}})
    }

    #[test]
    fn mistral_large4_reads_nope_layers_shared_caches_and_its_router() {
        let c = parse(&ml4()).unwrap();
        assert_eq!(c.family, "mistral_large4");
        assert_eq!(c.logit_softcap, Some(30.0), "transformers' default");
        assert!(c.rope.learned && c.rope.interleaved);
        assert!(matches!(
            c.moe.router,
            RouterKind::SoftmaxGroup {
                n_group: 4,
                topk_group: 2,
                ..
            }
        ));
        assert!(c.names.rename.is_some() && c.names.router_bias.is_none());
        let dsa: Vec<&crate::attention::DsaConfig> = c
            .layer_plan
            .iter()
            .map(|p| match &p.attention {
                AttentionConfig::Dsa(d) => d,
                _ => panic!("Mistral Large 4 attention is sparse"),
            })
            .collect();
        let sources: Vec<Option<usize>> = dsa.iter().map(|d| d.mla.kv_source).collect();
        assert_eq!(sources, [None, Some(0), None, Some(2), None]);
        for (l, d) in dsa.iter().enumerate() {
            let nope = l == 2 || l == 3;
            assert_eq!(d.mla.rope, !nope, "layer {l}");
            assert_eq!(
                d.mla.qk_rope_head_dim,
                if nope { 0 } else { 8 },
                "layer {l}"
            );
            assert_eq!(
                d.mla.qk_nope_head_dim + d.mla.qk_rope_head_dim,
                24,
                "layer {l}"
            );
            assert_eq!(d.query, crate::attention::IndexerQuery::Input);
            assert!(d.mla.log_scaling && d.mla.q_lora_rank.is_none());
            assert_eq!(d.mla.norm_eps, 1e-6, "rms_norm_eps");
        }
        // Layers reading another's cache cache nothing; NoPE layers no rotary key.
        let kv: Vec<usize> = c
            .layer_plan
            .iter()
            .map(|p| p.attention.kv_floats())
            .collect();
        assert_eq!(kv, [32 + 8 + 16, 16, 32 + 16, 16, 32 + 8 + 16]);
        // Defaults: every fourth layer NoPE, every layer its own cache; no cap when null.
        let mut v = ml4();
        let t = v["text_config"].as_object_mut().unwrap();
        t.remove("no_rope_layers");
        t.remove("kv_source_layers");
        t.insert("final_logit_softcapping".into(), json!(null));
        let c = parse(&v).unwrap();
        let rope: Vec<bool> = c
            .layer_plan
            .iter()
            .map(|p| match &p.attention {
                AttentionConfig::Dsa(d) => d.mla.rope && d.mla.kv_source.is_none(),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(rope, [true, true, true, false, true]);
        assert_eq!(c.logit_softcap, None);
    }

    #[test]
    fn mistral_large4_refuses_sharing_transformers_would_not_do() {
        // Layer 4 reading layer 0's cache is what transformers does (the latest shared one).
        let mut v = ml4();
        v["text_config"]["kv_source_layers"] = json!([0, 0, 2, 2, 0]);
        parse(&v).unwrap();
        let all_rope = json!([1, 1, 1, 1, 1]);
        for (field, bad, rope) in [
            // Later, not its own source, the other rotary kind, the wrong length.
            ("kv_source_layers", json!([1, 1, 2, 2, 4]), None),
            ("kv_source_layers", json!([0, 0, 1, 2, 4]), None),
            ("kv_source_layers", json!([0, 0, 0, 2, 4]), None),
            ("kv_source_layers", json!([0, 0, 2]), None),
            // Layer 2 reads layer 0's, but transformers would hand it layer 1's.
            ("kv_source_layers", json!([0, 1, 0, 1, 0]), Some(&all_rope)),
            ("no_rope_layers", json!([1, 1, 0, 2, 1]), None),
            ("no_rope_layers", json!([1, 1]), None),
            ("q_lora_rank", json!(16), None),
            ("final_logit_softcapping", json!(-1.0), None),
        ] {
            let mut v = ml4();
            v["text_config"][field] = bad.clone();
            if let Some(r) = rope {
                v["text_config"]["no_rope_layers"] = r.clone();
            }
            assert_eq!(
                field_of(parse(&v).unwrap_err()),
                format!("text_config.{field}"),
                "{bad}"
            );
        }
    }
}
