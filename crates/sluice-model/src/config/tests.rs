//! Tests of the strict config readers, across families.

use super::*;
use serde_json::Value;
use serde_json::json;

fn ds() -> Value {
    json!({
        "model_type": "deepseek_v3", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 3,
        "rms_norm_eps": 1e-6, "num_attention_heads": 4, "num_key_value_heads": 4,
        "max_position_embeddings": 256, "q_lora_rank": 32, "kv_lora_rank": 32,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "hidden_act": "silu",
        "rope_theta": 10000.0, "num_experts_per_tok": 4, "n_routed_experts": 16,
        "moe_intermediate_size": 32, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
        "n_shared_experts": 1, "first_k_dense_replace": 1, "intermediate_size": 128,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                         "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}
    })
}

fn parse(v: &Value) -> Result<ModelConfig, ModelError> {
    ModelConfig::from_json(v, Path::new("config.json"))
}

/// Layer 0's softmax scale.
fn scale(c: &ModelConfig) -> f32 {
    match &c.layer_plan[0].attention {
        AttentionConfig::Gqa(g) => g.softmax_scale,
        AttentionConfig::Mla(m) => m.softmax_scale,
        AttentionConfig::Dsa(d) => d.mla.softmax_scale,
        AttentionConfig::Compressed(c) => c.softmax_scale,
        AttentionConfig::Kda(_) | AttentionConfig::Gdn(_) => panic!("no softmax"),
    }
}

fn field_of(e: ModelError) -> String {
    match e {
        ModelError::Config { field, .. } => field,
        e => panic!("not a config error: {e}"),
    }
}

#[test]
fn deepseek_reads() {
    let c = parse(&ds()).unwrap();
    assert_eq!(c.family, "deepseek_v3");
    assert_eq!(c.layer_plan[0].mlp, MlpKind::Dense { intermediate: 128 });
    assert!(c.is_moe(1) && c.is_moe(2));
    let m = yarn_get_mscale(4.0, 1.0);
    assert!((scale(&c) as f64 - 24f64.powf(-0.5) * m * m).abs() < 1e-7);
    assert!(matches!(
        c.rope.scaling,
        RopeScaling::Yarn { factor: 4.0, .. }
    ));
    assert!(c.rope.interleaved);
    assert_eq!(c.rope.dim, 8);
}

#[test]
fn missing_field_is_named() {
    for f in [
        "hidden_size",
        "kv_lora_rank",
        "n_group",
        "routed_scaling_factor",
        "rms_norm_eps",
    ] {
        let mut v = ds();
        v.as_object_mut().unwrap().remove(f);
        let e = parse(&v).unwrap_err();
        assert!(e.to_string().contains(f), "{e}");
        assert_eq!(field_of(e), f);
    }
}

#[test]
fn unsupported_values_are_named() {
    let mut v = ds();
    v["model_type"] = json!("llama5");
    assert_eq!(field_of(parse(&v).unwrap_err()), "model_type");
    let mut v = ds();
    v["hidden_act"] = json!("gelu");
    let e = parse(&v).unwrap_err();
    assert!(e.to_string().contains("gelu"), "{e}");
    let mut v = ds();
    v["rope_scaling"]["type"] = json!("dynamic");
    assert_eq!(field_of(parse(&v).unwrap_err()), "rope_scaling.type");
    let mut v = ds();
    v["scoring_func"] = json!("softmax");
    assert_eq!(field_of(parse(&v).unwrap_err()), "scoring_func");
    let mut v = ds();
    v["n_group"] = json!(3);
    assert_eq!(field_of(parse(&v).unwrap_err()), "n_group");
    let mut v = ds();
    v["hidden_size"] = json!("64");
    assert_eq!(field_of(parse(&v).unwrap_err()), "hidden_size");
    let mut v = ds();
    v["quantization_config"] = json!({"quant_method": "gptq"});
    assert_eq!(
        field_of(parse(&v).unwrap_err()),
        "quantization_config.quant_method"
    );
}

fn gpt_oss() -> Value {
    json!({
        "model_type": "gpt_oss", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 4,
        "rms_norm_eps": 1e-5, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": 256, "hidden_act": "silu", "num_local_experts": 8,
        "num_experts_per_tok": 2, "intermediate_size": 32, "sliding_window": 8,
        "swiglu_limit": 7.0, "rope_theta": 150000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": false,
                         "original_max_position_embeddings": 64},
        "quantization_config": {"quant_method": "mxfp4",
            "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}
    })
}

#[test]
fn gpt_oss_reads() {
    let c = parse(&gpt_oss()).unwrap();
    assert_eq!(c.family, "gpt_oss");
    assert_eq!(c.moe.router, RouterKind::TopKSoftmax);
    assert_eq!(
        c.moe.activation,
        ExpertActivation::ClampedSwiGlu {
            alpha: 1.702,
            limit: 7.0
        }
    );
    assert_eq!(c.quant.method(), "mxfp4");
    // transformers' default layer_types: even layers slide.
    assert_eq!(
        (0..4)
            .map(|l| c.layer_plan[l].attention.window())
            .collect::<Vec<_>>(),
        [Some(8), None, Some(8), None]
    );
    let AttentionConfig::Gqa(GqaConfig {
        qkv_bias,
        o_bias,
        sinks,
        ..
    }) = c.layer_plan[0].attention
    else {
        panic!()
    };
    assert!(qkv_bias && o_bias && sinks);
    assert!(!c.rope.interleaved);
    assert!((scale(&c) - 0.25).abs() < 1e-7);
    let mut v = gpt_oss();
    v["layer_types"] = json!(["full_attention", "sliding_attention", "full_attention"]);
    assert_eq!(field_of(parse(&v).unwrap_err()), "layer_types");
    let mut v = gpt_oss();
    v["layer_types"] = json!([
        "full_attention",
        "chunked_attention",
        "full_attention",
        "full_attention"
    ]);
    assert_eq!(field_of(parse(&v).unwrap_err()), "layer_types");
    let mut v = gpt_oss();
    v["quantization_config"] = json!({"quant_method": "fp8", "weight_block_size": [128, 128]});
    assert_eq!(
        field_of(parse(&v).unwrap_err()),
        "quantization_config.quant_method"
    );
}

#[test]
fn rope_parameters_form() {
    let mut v = ds();
    let o = v.as_object_mut().unwrap();
    o.remove("rope_scaling");
    o.remove("rope_theta");
    o.insert(
        "rope_parameters".into(),
        json!({"rope_type": "default", "rope_theta": 5e4}),
    );
    let c = parse(&v).unwrap();
    assert_eq!(c.rope.theta, 5e4);
    assert_eq!(c.rope.scaling, RopeScaling::None);
    assert!((scale(&c) - 24f32.powf(-0.5)).abs() < 1e-7);
}

/// Found by the `model_config` fuzz target (docs/RELIABILITY.md): `"head_dim": 0` is even,
/// so it used to be accepted, giving a softmax scale of 0^-0.5 = infinity and zero-width
/// heads. It is refused, naming the field, for every GQA architecture.
#[test]
fn zero_head_dim_is_refused() {
    let mut v = gpt_oss();
    v["head_dim"] = json!(0);
    let e = parse(&v).unwrap_err();
    assert!(e.to_string().contains("must be positive"), "{e}");
    assert_eq!(field_of(e), "head_dim");
    for model_type in ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"] {
        let mut v = gpt_oss();
        let o = v.as_object_mut().unwrap();
        o.remove("quantization_config");
        o.remove("rope_scaling");
        o.remove("sliding_window");
        o.remove("swiglu_limit");
        o.insert("model_type".into(), json!(model_type));
        o.insert("moe_intermediate_size".into(), json!(32));
        o.insert("num_experts".into(), json!(8));
        o.insert("shared_expert_intermediate_size".into(), json!(32));
        assert!(parse(&v).is_ok(), "{model_type}: {:?}", parse(&v).err());
        v["head_dim"] = json!(0);
        assert_eq!(field_of(parse(&v).unwrap_err()), "head_dim", "{model_type}");
    }
}

/// Issue 18 class 2: sizes are checked before anything proportional to them is allocated,
/// shape products cannot wrap, and floats must fit an f32 and be positive where they scale.
#[test]
fn hostile_sizes_and_floats_are_refused_naming_the_field() {
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "num_hidden_layers",
            json!(1_000_000_000u64),
            "num_hidden_layers",
        ),
        ("num_hidden_layers", json!(u64::MAX), "num_hidden_layers"),
        (
            "n_shared_experts",
            json!(1_000_000_000_000_000_000u64),
            "n_shared_experts",
        ),
        ("n_routed_experts", json!(1u64 << 40), "n_routed_experts"),
        ("vocab_size", json!(1u64 << 25), "vocab_size"),
        (
            "max_position_embeddings",
            json!(1u64 << 40),
            "max_position_embeddings",
        ),
        ("rms_norm_eps", json!(1e308), "rms_norm_eps"),
        ("rms_norm_eps", json!(-1e-6), "rms_norm_eps"),
        ("rms_norm_eps", json!(0.0), "rms_norm_eps"),
        ("rms_norm_eps", json!(1e-300), "rms_norm_eps"),
        (
            "routed_scaling_factor",
            json!(-2.5),
            "routed_scaling_factor",
        ),
        (
            "routed_scaling_factor",
            json!(1e39),
            "routed_scaling_factor",
        ),
        (
            "num_attention_heads",
            json!(1u64 << 20),
            "num_attention_heads",
        ),
    ];
    for (field, value, named) in cases {
        let mut v = ds();
        v[field] = value.clone();
        if field == "num_attention_heads" {
            v["num_key_value_heads"] = value.clone(); // MLA: one latent for all heads
        }
        let e = parse(&v).unwrap_err();
        assert_eq!(field_of(e), named, "{field} = {value}");
    }
    // n_shared_experts × moe_intermediate_size beyond MAX_SIZE (it used to wrap).
    let mut v = ds();
    v["n_shared_experts"] = json!(MAX_EXPERTS);
    v["moe_intermediate_size"] = json!(MAX_SIZE);
    let e = parse(&v).unwrap_err();
    assert!(e.to_string().contains("wider"), "{e}");
    assert_eq!(field_of(e), "n_shared_experts");
    // GPT-OSS's clamp and the Kimi floats go through the same checks.
    let mut v = gpt_oss();
    v["swiglu_limit"] = json!(1e300);
    assert_eq!(field_of(parse(&v).unwrap_err()), "swiglu_limit");
    // The largest accepted values still parse.
    let mut v = ds();
    v["num_hidden_layers"] = json!(MAX_LAYERS);
    assert!(parse(&v).is_ok(), "{:?}", parse(&v).err());
}

fn dense(model_type: &str) -> Value {
    json!({
        "model_type": model_type, "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 4,
        "rms_norm_eps": 1e-6, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "max_position_embeddings": 256, "hidden_act": "silu",
        "intermediate_size": 96, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}
    })
}

fn gqa(c: &ModelConfig, l: usize) -> &GqaConfig {
    match &c.layer_plan[l].attention {
        AttentionConfig::Gqa(g) => g,
        a => panic!("layer {l}: {a:?}"),
    }
}

#[test]
fn dense_families_read() {
    for t in ["llama", "mistral", "qwen2", "qwen3"] {
        let c = parse(&dense(t)).unwrap();
        assert_eq!(c.moe_layers(), 0, "{t}");
        assert_eq!(c.moe.experts, 0, "{t}");
        assert!(
            c.layer_plan
                .iter()
                .all(|p| p.mlp == MlpKind::Dense { intermediate: 96 }),
            "{t}"
        );
    }
    // Qwen2 always has q/k/v biases; Qwen3 per-head q/k norms; Llama biases by the flag.
    assert!(gqa(&parse(&dense("qwen2")).unwrap(), 0).qkv_bias);
    assert_eq!(
        gqa(&parse(&dense("qwen3")).unwrap(), 0).qk_norm,
        QkNorm::PerHead
    );
    let mut v = dense("llama");
    v["attention_bias"] = json!(true);
    let g = gqa(&parse(&v).unwrap(), 0).clone();
    assert!(g.qkv_bias && g.o_bias);
    v["mlp_bias"] = json!(true);
    assert_eq!(field_of(parse(&v).unwrap_err()), "mlp_bias");
}

#[test]
fn dense_windows_follow_transformers() {
    // Mistral: every layer slides.
    let mut v = dense("mistral");
    v["sliding_window"] = json!(8);
    let c = parse(&v).unwrap();
    assert!((0..4).all(|l| gqa(&c, l).window == Some(8)));
    v["sliding_window"] = json!(0);
    assert_eq!(field_of(parse(&v).unwrap_err()), "sliding_window");
    // Qwen2: only with use_sliding_window, from max_window_layers on unless layer_types says.
    let mut v = dense("qwen2");
    v["sliding_window"] = json!(8);
    v["max_window_layers"] = json!(2);
    let c = parse(&v).unwrap();
    assert!((0..4).all(|l| gqa(&c, l).window.is_none()));
    v["use_sliding_window"] = json!(true);
    let c = parse(&v).unwrap();
    let w: Vec<_> = (0..4).map(|l| gqa(&c, l).window).collect();
    assert_eq!(w, [None, None, Some(8), Some(8)]);
    v["layer_types"] = json!([
        "sliding_attention",
        "full_attention",
        "full_attention",
        "full_attention"
    ]);
    let c = parse(&v).unwrap();
    let w: Vec<_> = (0..4).map(|l| gqa(&c, l).window).collect();
    assert_eq!(w, [Some(8), None, None, None]);
    v["layer_types"] = json!(vec!["chunked_attention"; 4]);
    assert_eq!(field_of(parse(&v).unwrap_err()), "layer_types");
}

#[test]
fn llama3_rope_is_read_and_checked() {
    let mut v = dense("llama");
    v["rope_parameters"] = json!({
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192
    });
    let c = parse(&v).unwrap();
    assert_eq!(
        c.rope.scaling,
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0
        }
    );
    for (field, bad) in [
        ("high_freq_factor", json!(1.0)),
        ("factor", json!(0.0)),
        ("original_max_position_embeddings", json!(-1.0)),
    ] {
        let mut w = v.clone();
        w["rope_parameters"][field] = bad;
        assert_eq!(
            field_of(parse(&w).unwrap_err()),
            format!("rope_parameters.{field}")
        );
    }
    let mut w = v.clone();
    w["rope_parameters"]
        .as_object_mut()
        .unwrap()
        .remove("low_freq_factor");
    assert_eq!(
        field_of(parse(&w).unwrap_err()),
        "rope_parameters.low_freq_factor"
    );
}

#[test]
fn ernie_moe_layers_follow_start_end_and_interval() {
    let mut v = json!({
        "model_type": "ernie4_5_moe", "vocab_size": 512, "hidden_size": 64,
        "num_hidden_layers": 6, "rms_norm_eps": 1e-5, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 256, "hidden_act": "silu",
        "intermediate_size": 128, "moe_intermediate_size": 32, "moe_num_experts": 8,
        "moe_k": 2, "moe_layer_start_index": 1, "moe_layer_end_index": -1,
        "moe_layer_interval": 2, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}
    });
    let c = parse(&v).unwrap();
    let moe: Vec<bool> = (0..6).map(|l| c.is_moe(l)).collect();
    assert_eq!(moe, [false, true, false, true, false, true]);
    assert!(c.tie_embeddings, "ERNIE ties embeddings by default");
    assert!(c.rope.interleaved);
    assert_eq!(c.moe.router, RouterKind::SoftmaxBiased { norm_min: 1e-12 });
    assert_eq!(c.moe.shared.as_ref().map(|s| s.intermediate), Some(64));
    v["moe_layer_end_index"] = json!(3);
    let c = parse(&v).unwrap();
    assert_eq!(c.moe_layers(), 2);
    for (field, bad) in [
        ("moe_layer_end_index", json!(-2)),
        ("moe_layer_interval", json!(0)),
        ("moe_k", json!(9)),
        ("use_bias", json!(true)),
        ("moe_norm_min", json!(0.0)),
    ] {
        let mut w = v.clone();
        w[field] = bad;
        assert_eq!(field_of(parse(&w).unwrap_err()), field);
    }
}

#[test]
fn qwen3_next_hybrid_plan_and_checks() {
    let v = json!({
        "model_type": "qwen3_next", "vocab_size": 512, "hidden_size": 64,
        "num_hidden_layers": 8, "rms_norm_eps": 1e-6, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256,
        "hidden_act": "silu", "intermediate_size": 128, "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 8,
        "linear_conv_kernel_dim": 4, "num_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
        "mlp_only_layers": [5], "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}
    });
    let c = parse(&v).unwrap();
    // transformers' default: every fourth layer full attention.
    let kinds: Vec<&str> = c.layer_plan.iter().map(|p| p.attention.kind()).collect();
    assert_eq!(
        kinds,
        ["gdn", "gdn", "gdn", "gqa", "gdn", "gdn", "gdn", "gqa"]
    );
    assert!(c.zero_centred_norms);
    assert_eq!(c.moe_layers(), 7);
    assert!(!c.is_moe(5));
    let g = gqa(&c, 3);
    assert!(g.output_gate && g.zero_centred_qk_norm);
    // a quarter of each head rotated by default
    assert_eq!(c.rope.dim, 4);
    assert_eq!(
        c.names.attention_of(&c.layer_plan[0].attention),
        "linear_attn"
    );
    assert_eq!(
        c.names.attention_of(&c.layer_plan[3].attention),
        "self_attn"
    );
    for (field, bad) in [
        ("linear_num_value_heads", json!(3)),
        ("linear_conv_kernel_dim", json!(0)),
        ("layer_types", json!(["linear_attention"])),
        ("full_attention_interval", json!(0)),
    ] {
        let mut w = v.clone();
        w[field] = bad;
        assert_eq!(field_of(parse(&w).unwrap_err()), field);
    }
    let mut w = v.clone();
    w["num_experts"] = json!(0);
    assert_eq!(parse(&w).unwrap().moe_layers(), 0);
    // One MTP layer by default (checked when the checkpoint has it): full attention, MoE.
    let m = c.mtp.as_ref().unwrap();
    assert_eq!(
        (m.module, m.layers, m.plans.len(), &m.plans[0].mlp, m.head),
        ("mtp.", 1, 1, &MlpKind::Moe, MtpHead::Concat)
    );
    assert_eq!(m.plans[0].attention.kind(), "gqa");
    let mut w = v.clone();
    w["mtp_num_hidden_layers"] = json!(0);
    assert!(parse(&w).unwrap().mtp.is_none());
    w["mtp_num_hidden_layers"] = json!(2);
    let m = parse(&w).unwrap().mtp.unwrap();
    assert_eq!((m.layers, m.plans.len()), (2, 2));
}

#[test]
fn qwen3_5_multimodal_reads_its_text_config() {
    let text = json!({
        "model_type": "qwen3_5_moe_text", "vocab_size": 512, "hidden_size": 64,
        "num_hidden_layers": 4, "rms_norm_eps": 1e-6, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256,
        "hidden_act": "silu", "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 16, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
        "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 64,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                            "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0]}
    });
    let c = parse(&text).unwrap();
    assert_eq!(c.names.model, "model.");
    assert!(matches!(
        c.layer_plan[0].attention,
        AttentionConfig::Gdn(g) if g.split
    ));
    let mm = json!({"model_type": "qwen3_5_moe", "text_config": text, "vision_config": {}});
    let c = parse(&mm).unwrap();
    assert_eq!(c.names.model, "model.language_model.");
    assert_eq!(c.moe_layers(), 4);
    let mut bad = mm.clone();
    bad["text_config"]["linear_key_head_dim"] = json!("16");
    assert_eq!(
        field_of(parse(&bad).unwrap_err()),
        "text_config.linear_key_head_dim"
    );
    let mut bad = mm.clone();
    bad.as_object_mut().unwrap().remove("text_config");
    assert_eq!(field_of(parse(&bad).unwrap_err()), "text_config");
    // Quantization is read at the top (Qwen3.5's FP8 releases), strictly.
    let mut q = mm.clone();
    q["quantization_config"] = json!({"quant_method": "fp8", "fmt": "e4m3",
        "activation_scheme": "dynamic", "weight_block_size": [128, 128]});
    assert!(parse(&q).is_ok());
    q["quantization_config"]["quant_method"] = json!("gptq");
    assert_eq!(
        field_of(parse(&q).unwrap_err()),
        "quantization_config.quant_method"
    );
    let mut both = mm;
    let fp8 = json!({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
        "weight_block_size": [128, 128]});
    both["quantization_config"] = fp8.clone();
    both["text_config"]["quantization_config"] = fp8;
    assert_eq!(field_of(parse(&both).unwrap_err()), "quantization_config");
}

#[test]
fn mimo_v2_flash_layer_types_and_two_rotary_tables() {
    let v = json!({
        "model_type": "mimo_v2_flash", "vocab_size": 512, "hidden_size": 64,
        "num_hidden_layers": 7, "rms_norm_eps": 1e-5, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 192, "v_head_dim": 128,
        "max_position_embeddings": 256, "hidden_act": "silu", "intermediate_size": 128,
        "moe_intermediate_size": 32, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "routed_scaling_factor": null, "sliding_window_size": 128,
        "attention_value_scale": 0.707,
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.334},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.334}
        }
    });
    let c = parse(&v).unwrap();
    // transformers' defaults: full attention on layer 0 and every sixth, layer 0 dense.
    let windows: Vec<_> = (0..7).map(|l| gqa(&c, l).window).collect();
    assert_eq!(
        windows,
        [
            None,
            Some(129),
            Some(129),
            Some(129),
            Some(129),
            None,
            Some(129)
        ]
    );
    assert!(!c.is_moe(0) && (1..7).all(|l| c.is_moe(l)));
    let (full, swa) = (gqa(&c, 0), gqa(&c, 1));
    assert_eq!((full.kv_heads, swa.kv_heads), (1, 2));
    assert!(swa.sinks && swa.local_rope && !full.sinks && !full.local_rope);
    assert_eq!((full.v_head_dim, full.v_scale), (128, Some(0.707)));
    // int(192 × 0.334) = 64 rotated dimensions, each table its own theta.
    assert_eq!((c.rope.dim, c.rope.theta), (64, 5e6));
    let local = c.local_rope.as_ref().unwrap();
    assert_eq!((local.dim, local.theta), (64, 1e4));
    assert!(matches!(
        c.moe.router,
        RouterKind::SigmoidGroup { routed_scaling_factor, .. } if routed_scaling_factor == 1.0
    ));
    let mut w = v.clone();
    w["rope_parameters"]["sliding_attention"]["rope_type"] = json!("yarn");
    assert_eq!(
        field_of(parse(&w).unwrap_err()),
        "rope_parameters.sliding_attention.rope_type"
    );
    let mut w = v.clone();
    w["rope_parameters"]
        .as_object_mut()
        .unwrap()
        .remove("full_attention");
    assert_eq!(
        field_of(parse(&w).unwrap_err()),
        "rope_parameters.full_attention"
    );
    let mut w = v;
    w["mlp_layer_types"] = json!(["dense"]);
    assert_eq!(field_of(parse(&w).unwrap_err()), "mlp_layer_types");
}

#[test]
fn llama4_layers_follow_transformers_defaults() {
    let v = json!({
        "model_type": "llama4_text", "vocab_size": 512, "hidden_size": 64,
        "num_hidden_layers": 8, "rms_norm_eps": 1e-5, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256,
        "hidden_act": "silu", "intermediate_size": 32, "intermediate_size_mlp": 96,
        "num_local_experts": 8, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}
    });
    let c = parse(&v).unwrap();
    // Every 4th layer NoPE (with the temperature), the others rotated, normed and chunked.
    for l in 0..8 {
        let g = gqa(&c, l);
        let nope = (l + 1) % 4 == 0;
        assert_eq!(g.nope, nope, "layer {l}");
        assert_eq!(g.rms_qk_after_rope, !nope, "layer {l}");
        assert_eq!(g.chunk, (!nope).then_some(8192), "layer {l}");
        assert_eq!(g.temperature, nope.then_some((8192.0, 0.1)), "layer {l}");
    }
    assert!(c.rope.interleaved);
    let moe: Vec<usize> = (0..8).filter(|&l| c.is_moe(l)).collect();
    assert_eq!(moe, [1, 3, 5, 7]);
    assert!(c.moe.weight_on_input);
    assert_eq!(c.moe.router, RouterKind::TopKSigmoid);
    assert_eq!(c.layer_plan[0].mlp, MlpKind::Dense { intermediate: 96 });
    for (field, bad) in [
        ("no_rope_layers", json!([1, 0, 2, 1, 1, 1, 1, 1])),
        ("moe_layers", json!([9])),
        ("interleave_moe_layer_step", json!(0)),
        ("floor_scale", json!(0)),
    ] {
        let mut w = v.clone();
        w[field] = bad;
        assert_eq!(field_of(parse(&w).unwrap_err()), field);
    }
    let mut w = v.clone();
    w["attention_chunk_size"] = json!(null);
    let c = parse(&w).unwrap();
    assert!((0..8).all(|l| gqa(&c, l).chunk.is_none()));
    // The released multimodal checkpoint: `text_config`, tensors under `language_model.`.
    let mm = json!({"model_type": "llama4", "text_config": v, "vision_config": {}});
    let c = parse(&mm).unwrap();
    assert_eq!(
        (c.names.prefix.as_str(), c.names.model),
        ("language_model.", "model.")
    );
    let mut bad = mm;
    bad["text_config"]["model_type"] = json!("llama");
    assert_eq!(field_of(parse(&bad).unwrap_err()), "text_config.model_type");
}

#[test]
fn longcat_flash_runs_two_sublayers_per_layer() {
    let v = json!({
        "model_type": "longcat_flash", "vocab_size": 512, "hidden_size": 64, "num_layers": 3,
        "rms_norm_eps": 1e-6, "num_attention_heads": 4, "num_key_value_heads": 4,
        "max_position_embeddings": 256, "hidden_act": "silu", "ffn_hidden_size": 96,
        "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
        "head_dim": 8, "v_head_dim": 16, "n_routed_experts": 8, "zero_expert_num": 4,
        "moe_topk": 4, "expert_ffn_hidden_size": 32, "routed_scaling_factor": 6.0,
        "zero_expert_type": "identity", "mla_scale_q_lora": true, "mla_scale_kv_lora": true,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e7}
    });
    let c = parse(&v).unwrap();
    assert_eq!(c.layers, 6);
    let moe: Vec<bool> = (0..6).map(|l| c.is_moe(l)).collect();
    assert_eq!(moe, [true, false, true, false, true, false]);
    assert_eq!(c.layer_plan[1].mlp, MlpKind::Dense { intermediate: 96 });
    assert!(c.moe.shortcut);
    assert_eq!((c.moe.experts, c.moe.router_width()), (8, 12));
    assert_eq!(
        c.moe.router,
        RouterKind::SoftmaxScaled {
            routed_scaling_factor: 6.0
        }
    );
    let AttentionConfig::Mla(m) = &c.layer_plan[0].attention else {
        panic!("LongCat attention is MLA");
    };
    assert_eq!(m.lora_scales, Some((2f32.sqrt(), 2.0)));
    assert!(c.rope.interleaved);
    assert_eq!(
        c.names.layer_module(3, "self_attn"),
        "model.layers.1.self_attn.1"
    );
    assert_eq!(c.names.moe_module(3), "model.layers.1.mlp");
    // Top-k may reach into the zero experts, not past them.
    let mut w = v.clone();
    w["moe_topk"] = json!(12);
    assert!(parse(&w).is_ok());
    for (field, bad) in [
        ("head_dim", json!(16)),
        ("qk_head_dim", json!(20)),
        ("num_key_value_heads", json!(2)),
        ("moe_topk", json!(13)),
        ("zero_expert_type", json!("zero")),
        ("mla_scale_kv_lora", json!(false)),
        ("router_bias", json!(true)),
        ("num_layers", json!(0)),
    ] {
        let mut w = v.clone();
        w[field] = bad;
        assert_eq!(field_of(parse(&w).unwrap_err()), field, "{field}");
    }
    let mut w = v.clone();
    w.as_object_mut().unwrap().remove("q_lora_rank");
    assert_eq!(field_of(parse(&w).unwrap_err()), "q_lora_rank");
}

/// Step-3.7's text config as transformers writes it, inside the multimodal one.
fn step3p7() -> Value {
    json!({
        "model_type": "step3p7",
        "text_config": {
            "model_type": "step3p5", "vocab_size": 512, "hidden_size": 64,
            "num_hidden_layers": 4, "rms_norm_eps": 1e-6, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256,
            "hidden_act": "silu", "intermediate_size": 96,
            "layer_types": ["full_attention", "sliding_attention", "full_attention",
                            "sliding_attention"],
            "sliding_window": 8, "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
            "per_layer_config": {"1": {"num_attention_heads": 2}, "3": {"num_attention_heads": 2}},
            "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "share_expert_dim": 48, "moe_router_scaling_factor": 2.5,
            "swiglu_limits": [0, 0.5, null, 0.8], "swiglu_limits_shared": [0.6, 0, 0.7, null],
            "query_pre_attn_scalar": 20,
            "rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": 1e4,
                                   "partial_rotary_factor": 0.5},
                "sliding_attention": {"rope_type": "default", "rope_theta": 500.0,
                                      "partial_rotary_factor": 1.0}
            }
        }
    })
}

#[test]
fn step3p7_reads_per_layer_heads_tables_and_bounds() {
    let v = step3p7();
    let c = parse(&v).unwrap();
    let heads: Vec<usize> = (0..4).map(|l| gqa(&c, l).heads).collect();
    assert_eq!(heads, [4, 2, 4, 2]);
    assert!(gqa(&c, 0).head_gate && gqa(&c, 0).zero_centred_qk_norm);
    assert_eq!(gqa(&c, 1).window, Some(8));
    assert!(gqa(&c, 1).local_rope && !gqa(&c, 0).local_rope);
    assert_eq!((c.rope.theta, c.rope.dim), (1e4, 8));
    let local = c.local_rope.as_ref().unwrap();
    assert_eq!((local.theta, local.dim), (500.0, 16));
    assert!((gqa(&c, 0).softmax_scale - 20f32.powf(-0.5)).abs() < 1e-7);
    assert!(c.zero_centred_norms);
    assert_eq!(
        (0..4).map(|l| c.is_moe(l)).collect::<Vec<_>>(),
        [false, true, true, true]
    );
    assert_eq!(c.expert_limit(1), Some(0.5));
    assert_eq!(c.expert_limit(2), None);
    assert_eq!(c.mlp_act_of(0), GluActivation::SiluClamped { limit: 0.6 });
    assert_eq!(c.mlp_act_of(1), GluActivation::Silu);
    for (field, bad) in [
        ("gating", json!(false)),
        ("use_bidirectional_attention", json!(true)),
        ("swiglu_limits", json!([0, -1, 0, 0])),
        ("swiglu_limits_shared", json!([0, 0])),
        (
            "layer_types",
            json!(["chunked", "chunked", "chunked", "chunked"]),
        ),
        (
            "mlp_layer_types",
            json!(["dense", "moe", "sparse", "sparse"]),
        ),
        ("hidden_act", json!("gelu")),
        ("model_type", json!("step3")),
    ] {
        let mut w = v.clone();
        w["text_config"][field] = bad;
        assert_eq!(
            field_of(parse(&w).unwrap_err()),
            format!("text_config.{field}"),
            "{field}"
        );
    }
    let mut w = v.clone();
    w["text_config"]["per_layer_config"]["1"]["head_dim"] = json!(8);
    assert_eq!(
        field_of(parse(&w).unwrap_err()),
        "text_config.per_layer_config.1.head_dim"
    );
}

/// The hub's remote-code form: `moe_layers_enum`, `attention_other_setting`, per-layer
/// `rope_theta` and `partial_rotary_factors`, lists padded with the MTP layer's entries.
#[test]
fn step3p7_reads_the_legacy_hub_fields() {
    let mut v = step3p7();
    let t = v["text_config"].as_object_mut().unwrap();
    for k in [
        "mlp_layer_types",
        "per_layer_config",
        "rope_parameters",
        "model_type",
    ] {
        t.remove(k);
    }
    t.insert("hidden_act".into(), json!("swigluoai"));
    t.insert("num_nextn_predict_layers".into(), json!(1));
    t.insert("moe_layers_enum".into(), json!("1,2,3,4"));
    t.insert(
        "attention_other_setting".into(),
        json!({"num_attention_heads": 2}),
    );
    t.insert("rope_theta".into(), json!([1e4, 500.0, 1e4, 500.0, 1e4]));
    t.insert(
        "partial_rotary_factors".into(),
        json!([0.5, 1.0, 0.5, 1.0, 0.5]),
    );
    t.insert(
        "layer_types".into(),
        json!([
            "full_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "full_attention"
        ]),
    );
    t.insert("swiglu_limits".into(), json!([0, 0.5, 0, 0.8, 0]));
    let c = parse(&v).unwrap();
    assert_eq!(c.draft_layers, 1);
    assert_eq!(
        (0..4).map(|l| c.is_moe(l)).collect::<Vec<_>>(),
        [false, true, true, true]
    );
    assert_eq!(
        (0..4).map(|l| gqa(&c, l).heads).collect::<Vec<_>>(),
        [4, 2, 4, 2]
    );
    assert_eq!((c.rope.theta, c.rope.dim), (1e4, 8));
    let local = c.local_rope.as_ref().unwrap();
    assert_eq!((local.theta, local.dim), (500.0, 16));
    assert_eq!(c.expert_limit(3), Some(0.8));
    // Without moe_layers_enum, transformers makes every layer from the fourth on MoE.
    v["text_config"]
        .as_object_mut()
        .unwrap()
        .remove("moe_layers_enum");
    let c = parse(&v).unwrap();
    assert_eq!(
        (0..4).map(|l| c.is_moe(l)).collect::<Vec<_>>(),
        [false, false, false, true]
    );
}

#[test]
fn deepseek_v32_reads_the_indexer() {
    let mut v = ds();
    v["model_type"] = json!("deepseek_v32");
    v["index_n_heads"] = json!(8);
    v["index_head_dim"] = json!(32);
    v["index_topk"] = json!(16);
    v["layer_types"] = json!(vec![
        "indexed_attention";
        v["num_hidden_layers"].as_u64().unwrap() as usize
    ]);
    let c = parse(&v).unwrap();
    let AttentionConfig::Dsa(d) = &c.layer_plan[0].attention else {
        panic!("DeepSeek-V3.2 attention is sparse");
    };
    assert_eq!(
        (d.heads, d.head_dim, d.topk, d.interleaved),
        (8, 32, 16, false)
    );
    assert_eq!(c.family, "deepseek_v32");
    for (field, bad) in [
        ("index_topk", json!(0)),
        ("index_head_dim", json!(2)),
        ("layer_types", json!(["full_attention"])),
    ] {
        let mut w = v.clone();
        w[field] = bad;
        assert_eq!(field_of(parse(&w).unwrap_err()), field, "{field}");
    }
    let mut w = v.clone();
    w.as_object_mut().unwrap().remove("index_n_heads");
    assert_eq!(field_of(parse(&w).unwrap_err()), "index_n_heads");
}

#[test]
fn glm_moe_dsa_shares_indexers_by_indexer_types_or_pattern() {
    let mut v = ds();
    v["model_type"] = json!("glm_moe_dsa");
    v["index_n_heads"] = json!(8);
    v["index_head_dim"] = json!(16);
    v["index_topk"] = json!(16);
    let n = v["num_hidden_layers"].as_u64().unwrap() as usize;
    let shared = |c: &ModelConfig| -> Vec<bool> {
        c.layer_plan
            .iter()
            .map(|p| match &p.attention {
                AttentionConfig::Dsa(d) => {
                    assert!(d.interleaved, "GLM-5's indexer pairs are interleaved");
                    d.shared
                }
                _ => panic!("GLM-5 attention is sparse"),
            })
            .collect()
    };
    // Defaults: offset 2, frequency 1: every layer full.
    assert_eq!(shared(&parse(&v).unwrap()), vec![false; n]);
    let mut w = v.clone();
    w["index_topk_freq"] = json!(2);
    let want: Vec<bool> = (0..n).map(|i| (i + 1).saturating_sub(2) % 2 == 1).collect();
    assert_eq!(shared(&parse(&w).unwrap()), want);
    let pattern: String = (0..n).map(|i| if i % 2 == 1 { 'S' } else { 'F' }).collect();
    let mut w = v.clone();
    w["index_topk_pattern"] = json!(pattern);
    let alt: Vec<bool> = (0..n).map(|i| i % 2 == 1).collect();
    assert_eq!(shared(&parse(&w).unwrap()), alt);
    let mut w = v.clone();
    w["indexer_types"] = json!(
        alt.iter()
            .map(|&s| if s { "shared" } else { "full" })
            .collect::<Vec<_>>()
    );
    assert_eq!(shared(&parse(&w).unwrap()), alt);
    // A shared first layer has nothing to share; a wrong length or name is refused.
    for bad in [
        json!(vec!["shared"; n]),
        json!(["full"]),
        json!(vec!["half"; n]),
    ] {
        let mut w = v.clone();
        w["indexer_types"] = bad;
        assert_eq!(field_of(parse(&w).unwrap_err()), "indexer_types");
    }
}

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

/// A Hy4 config: hyper-connections, sinks, an output gate, bounded expert inputs.
fn hy4() -> Value {
    let mut v = ds();
    let o = v.as_object_mut().unwrap();
    for k in ["rope_scaling", "first_k_dense_replace"] {
        o.remove(k);
    }
    v["model_type"] = json!("hy_v4");
    v["num_hidden_layers"] = json!(6);
    v["index_n_heads"] = json!(8);
    v["index_head_dim"] = json!(16);
    v["index_topk"] = json!(8);
    v["n_group"] = json!(1);
    v["topk_group"] = json!(1);
    v["hc_mult"] = json!(3);
    v["swiglu_limit"] = json!(7.0);
    v
}

#[test]
fn hy_v4_reads_hyper_connections_and_its_attention() {
    let c = parse(&hy4()).unwrap();
    assert_eq!(c.family, "hy_v4");
    assert_eq!(
        c.residual,
        Residual::Hyper(HyperConfig {
            streams: 3,
            gain: 2.0,
            eps: 1e-6,
            sinkhorn: None,
            mean_head: false,
        })
    );
    assert_eq!(
        c.moe.activation,
        ExpertActivation::SwiGluInputsClamped { limit: 7.0 }
    );
    assert!(!c.rope.interleaved, "pairs split in halves");
    // One dense layer by default; layer 0 and every fourth from 1 with an indexer.
    assert!(!c.is_moe(0) && (1..6).all(|l| c.is_moe(l)));
    let shared: Vec<bool> = c
        .layer_plan
        .iter()
        .map(|p| match &p.attention {
            AttentionConfig::Dsa(d) => {
                assert!(d.rope_last && d.mla.sinks && !d.interleaved);
                assert_eq!(d.mla.output_gate, Some("gate_proj"));
                assert_eq!(d.key_eps, 1e-6, "rms_norm_eps");
                d.shared
            }
            _ => panic!("Hy4 attention is sparse"),
        })
        .collect();
    assert_eq!(shared, [false, false, true, true, true, false]);
    for (field, bad) in [
        ("hc_mult", json!(0)),
        ("swiglu_limit", json!(0.0)),
        (
            "indexer_types",
            json!(["shared", "full", "full", "full", "full", "full"]),
        ),
    ] {
        let mut v = hy4();
        v[field] = bad.clone();
        assert_eq!(field_of(parse(&v).unwrap_err()), field, "{bad}");
    }
}

/// A GLM-5.3-Flash text config (flat, as text-only checkpoints store it).
fn glm53() -> Value {
    json!({
        "model_type": "glm5_next", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 5,
        "rms_norm_eps": 1e-5, "num_attention_heads": 4, "num_key_value_heads": 4,
        "max_position_embeddings": 256, "q_lora_rank": 32, "kv_lora_rank": 32,
        "qk_nope_head_dim": 24, "qk_rope_head_dim": 0, "v_head_dim": 16, "hidden_act": "silu",
        "num_experts_per_tok": 2, "n_routed_experts": 8, "moe_intermediate_size": 32,
        "intermediate_size": 128, "index_topk": 8, "index_head_dim": 16, "index_n_heads": 8,
        "index_kpool": 4, "linear_head_dim": 16, "linear_num_heads": 4, "hc_mult": 3,
        "layer_types": ["linear_attention", "indexed_attention", "indexed_attention",
                        "linear_attention", "indexed_attention"],
        "indexer_types": ["full", "full", "shared", "full", "full"]
    })
}

#[test]
fn glm5_next_reads_its_layer_plan_pools_and_mhc() {
    let c = parse(&glm53()).unwrap();
    assert_eq!(c.family, "glm5_next");
    let Residual::Hyper(hc) = c.residual else {
        panic!("GLM-5.3 has hyper-connections");
    };
    assert_eq!(
        (hc.streams, hc.sinkhorn, hc.mean_head, hc.gain),
        (3, Some(20), true, 2.0)
    );
    assert_eq!(c.mlp_act, GluActivation::SiluInputsClamped { limit: 10.0 });
    assert_eq!(c.draft_layers, 1);
    let kinds: Vec<&str> = c.layer_plan.iter().map(|p| p.attention.kind()).collect();
    assert_eq!(kinds, ["kda", "dsa", "dsa", "kda", "dsa"]);
    match (&c.layer_plan[0].attention, &c.layer_plan[2].attention) {
        (AttentionConfig::Kda(k), AttentionConfig::Dsa(d)) => {
            assert_eq!(
                k.gate,
                KdaGate::LowerBound(-5.0),
                "transformers' default bound"
            );
            assert!(d.shared && !d.mla.rope && d.mla.qk_rope_head_dim == 0);
            assert_eq!(
                d.pool,
                Some(crate::attention::KeyPool {
                    size: 4,
                    tail: true
                })
            );
        }
        _ => panic!("layer kinds"),
    }
    // Three dense layers by default.
    assert!((0..3).all(|l| !c.is_moe(l)) && (3..5).all(|l| c.is_moe(l)));
    // transformers reads `full_attention` as `indexed_attention`.
    let mut v = glm53();
    v["layer_types"][1] = json!("full_attention");
    let c2 = parse(&v).unwrap();
    assert_eq!(c2.layer_plan[1].attention.kind(), "dsa");
    let mut v = glm53();
    v["linear_lower_bound"] = json!(null);
    let c = parse(&v).unwrap();
    assert!(
        matches!(&c.layer_plan[0].attention, AttentionConfig::Kda(k) if k.gate == KdaGate::Softplus)
    );
    for (field, bad) in [
        ("qk_rope_head_dim", json!(8)),
        ("index_topk", json!(10)),
        ("index_kpool", json!(0)),
        // Layer 3 is linear: layer 4 has no sparse layer before it to share with.
        (
            "indexer_types",
            json!(["full", "full", "shared", "full", "shared"]),
        ),
        (
            "indexer_types",
            json!(["full", "full", "full", "full", "full", "full"]),
        ),
    ] {
        let mut v = glm53();
        v[field] = bad.clone();
        assert_eq!(field_of(parse(&v).unwrap_err()), field, "{bad}");
    }
}

/// A DeepSeek-V4 config as transformers 5.24 writes it (the fixture's shape).
fn dsv4() -> Value {
    json!({
        "model_type": "deepseek_v4", "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 5,
        "rms_norm_eps": 1e-6, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
        "max_position_embeddings": 256, "q_lora_rank": 32, "hidden_act": "silu",
        "partial_rotary_factor": 0.25, "num_experts_per_tok": 2, "n_routed_experts": 8,
        "moe_intermediate_size": 32, "n_shared_experts": 1, "routed_scaling_factor": 1.5,
        "scoring_func": "sqrtsoftplus", "o_groups": 2, "o_lora_rank": 16, "sliding_window": 8,
        "index_n_heads": 8, "index_head_dim": 16, "index_topk": 3, "hc_mult": 3,
        "swiglu_limit": 0.8,
        "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        "layer_types": ["heavily_compressed_attention", "compressed_sparse_attention",
                        "sliding_attention", "compressed_sparse_attention",
                        "heavily_compressed_attention"],
        "mlp_layer_types": ["hash_moe", "hash_moe", "moe", "moe", "moe"],
        "rope_parameters": {
            "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
            "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64, "beta_fast": 32.0,
                         "beta_slow": 1.0, "attention_factor": 1.0,
                         "partial_rotary_factor": 0.25}
        }
    })
}

#[test]
fn deepseek_v4_reads_its_layer_kinds_tables_and_hash_layers() {
    let c = parse(&dsv4()).unwrap();
    assert_eq!(c.family, "deepseek_v4");
    let kinds: Vec<&str> = c.layer_plan.iter().map(|p| p.attention.kind()).collect();
    assert_eq!(kinds, ["hca", "csa", "swa", "csa", "hca"]);
    assert_eq!(
        c.layer_plan
            .iter()
            .map(|p| p.hash_routed)
            .collect::<Vec<_>>(),
        [true, true, false, false, false]
    );
    assert!((0..5).all(|l| c.is_moe(l)));
    // Compressed layers rotate by the compress table, sliding ones by the main one.
    assert_eq!(
        (c.rope.theta, c.rope.dim, c.rope.interleaved),
        (160000.0, 8, true)
    );
    let main = c.local_rope.as_ref().unwrap();
    assert_eq!(
        (main.theta, main.scaling.clone()),
        (10000.0, RopeScaling::None)
    );
    match (
        &c.layer_plan[0].attention,
        &c.layer_plan[1].attention,
        &c.layer_plan[2].attention,
    ) {
        (
            AttentionConfig::Compressed(h),
            AttentionConfig::Compressed(s),
            AttentionConfig::Compressed(w),
        ) => {
            let hc = h.compressor.as_ref().unwrap();
            assert_eq!(
                (hc.rate, hc.overlap, hc.indexer.is_none()),
                (8, false, true)
            );
            let sc = s.compressor.as_ref().unwrap();
            assert_eq!((sc.rate, sc.overlap), (4, true));
            assert_eq!(
                sc.indexer.map(|i| (i.heads, i.head_dim, i.top_k)),
                Some((8, 16, 3))
            );
            assert!(w.local_rope && w.compressor.is_none() && !s.local_rope);
            assert_eq!((w.window, w.o_groups, w.o_rank), (8, 2, 16));
        }
        _ => panic!("layer kinds"),
    }
    let Residual::Hyper(hc) = c.residual else {
        panic!("DeepSeek-V4 has hyper-connections");
    };
    assert_eq!(
        (hc.streams, hc.sinkhorn, hc.mean_head, hc.gain),
        (3, Some(20), false, 2.0)
    );
    assert_eq!(
        c.moe.router,
        RouterKind::SqrtSoftplus {
            routed_scaling_factor: 1.5
        }
    );
    // Defaults as transformers folds them: the first three layers hash-routed; legacy
    // per-layer compress ratios.
    let mut v = dsv4();
    v["mlp_layer_types"] = json!(null);
    v["layer_types"] = json!(null);
    v["compress_ratios"] = json!([128, 128, 4, 0, 4]);
    let c = parse(&v).unwrap();
    assert_eq!(
        c.layer_plan
            .iter()
            .map(|p| p.hash_routed)
            .collect::<Vec<_>>(),
        [true, true, true, false, false]
    );
    let kinds: Vec<&str> = c.layer_plan.iter().map(|p| p.attention.kind()).collect();
    assert_eq!(kinds, ["hca", "hca", "csa", "swa", "csa"]);
    for (field, bad) in [
        ("num_key_value_heads", json!(2)),
        ("o_groups", json!(3)),
        ("scoring_func", json!("softmax")),
        ("layer_types.2", json!("full_attention")),
        ("mlp_layer_types.4", json!("dense")),
        ("compress_rates.compressed_sparse_attention", json!(0)),
        ("rope_parameters.compress.rope_theta", json!(-1.0)),
        ("index_head_dim", json!(4)),
        (
            "compress_rates.heavily_compressed_attention",
            json!(1u64 << 40),
        ),
        ("hc_mult", json!(1000)),
        ("hc_mult", json!(0)),
    ] {
        let mut v = dsv4();
        let mut at = &mut v;
        let parts: Vec<&str> = field.split('.').collect();
        for p in &parts[..parts.len() - 1] {
            at = match p.parse::<usize>() {
                Ok(i) => &mut at[i],
                Err(_) => &mut at[*p],
            };
        }
        let last = parts[parts.len() - 1];
        match last.parse::<usize>() {
            Ok(i) => at[i] = bad.clone(),
            Err(_) => at[last] = bad.clone(),
        }
        assert_eq!(field_of(parse(&v).unwrap_err()), field, "{bad}");
    }
}
