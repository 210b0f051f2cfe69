//! Tests of the strict config readers across families (each family's own are in its module).

use super::test_util::*;

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
