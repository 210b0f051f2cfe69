//! The forward pass against Hugging Face transformers on the committed fixtures
//! (`testdata/models/*`, produced by `tools/reference/make_fixtures.py`, and
//! `testdata/kimi/kimi_linear-*`, produced by `tools/reference/make_kimi_fixtures.py`).

use std::path::{Path, PathBuf};

mod common;
use common::{Reference, argmax, check_routes, compare};
use sluice_kernels::{Isa, Kernels};
use sluice_model::{Logits, Model, ModelOptions};

/// A fixture directory: `name` under `testdata/models/`, or a path under `testdata/` when it
/// has a `/` (`kimi/kimi_linear-fp32`).
fn fixture(name: &str) -> PathBuf {
    let testdata = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata");
    if name.contains('/') {
        testdata.join(name)
    } else {
        testdata.join("models").join(name)
    }
}

fn open(name: &str, threads: usize) -> Model {
    let opts = ModelOptions {
        kernels: Kernels::best(),
        threads,
        ..Default::default()
    };
    Model::open(fixture(name), opts).unwrap_or_else(|e| panic!("{name}: {e}"))
}

const REL_TOL: f32 = 1e-4;

/// Prompt logits and routed experts for the three prompts.
fn check_prompts(name: &str) {
    let model = open(name, 1);
    let r = Reference::open(&fixture(name).join("reference.safetensors"));
    let vocab = model.config().vocab;
    for t in [1, 7, 33] {
        let ids = r.ids(&format!("prompt{t}.ids"));
        let mut st = model.new_state();
        st.routes = Some(Vec::new());
        let logits = model.forward(&mut st, &ids, Logits::All).unwrap();
        assert_eq!(logits.len(), t * vocab);
        let (worst, scale) = compare(&logits, &r.f32(&format!("prompt{t}.logits")));
        println!(
            "{name} prompt{t}: worst |Δlogit| = {worst:.3e} (max|logit| {scale:.2}, ratio {:.2e})",
            worst / scale
        );
        assert!(
            worst <= REL_TOL * scale,
            "{name} prompt{t}: worst {worst} > {REL_TOL} × {scale}"
        );
        // Routed experts, per MoE layer and token.
        let routes = st.routes.take().unwrap();
        let checked = check_routes(name, t, &r, model.config(), &routes);
        if model.config().moe_layers() > 0 {
            assert!(checked > 0, "{name}: no routes compared");
        } else {
            assert!(routes.is_empty(), "{name}: a dense model reported routes");
        }
    }
}

/// 32 greedy tokens with the KV cache, and the logits each was chosen from.
fn check_greedy(name: &str) {
    let model = open(name, 1);
    let r = Reference::open(&fixture(name).join("reference.safetensors"));
    let prompt = r.ids("greedy.prompt_ids");
    let want = r.ids("greedy.ids");
    let want_logits = r.f32("greedy.step_logits");
    let vocab = model.config().vocab;
    let mut st = model.new_state();
    let mut logits = model.forward(&mut st, &prompt, Logits::Last).unwrap();
    let mut got = Vec::new();
    let mut worst_ratio = 0f32;
    for step in 0..want.len() {
        let (worst, scale) = compare(&logits, &want_logits[step * vocab..(step + 1) * vocab]);
        worst_ratio = worst_ratio.max(worst / scale);
        assert!(
            worst <= REL_TOL * scale,
            "{name} step {step}: worst {worst} > {REL_TOL} × {scale}"
        );
        let next = argmax(&logits);
        got.push(next);
        // Teacher-forced on the reference token so one near-tie cannot derail the rest.
        logits = model.forward(&mut st, &[want[step]], Logits::Last).unwrap();
    }
    println!("{name} greedy: worst step logit error ratio {worst_ratio:.2e}");
    assert_eq!(got, want, "{name}: greedy ids differ");
}

/// Chunked prefill and thread counts change no bit.
fn check_invariance(name: &str) {
    let r = Reference::open(&fixture(name).join("reference.safetensors"));
    let ids = r.ids("prompt33.ids");
    let base = {
        let m = open(name, 1);
        let mut st = m.new_state();
        m.forward(&mut st, &ids, Logits::All).unwrap()
    };
    for threads in [1, 2, 3] {
        let m = open(name, threads);
        for chunk in [1, 7, ids.len()] {
            let mut st = m.new_state();
            let mut all = Vec::new();
            for c in ids.chunks(chunk) {
                all.extend(m.forward(&mut st, c, Logits::All).unwrap());
            }
            assert!(
                all.iter()
                    .zip(&base)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name}: threads {threads}, chunk {chunk} changed logits"
            );
        }
    }
    // Every ISA this CPU has gives the same bits.
    for isa in Isa::available() {
        let m = Model::open(
            fixture(name),
            ModelOptions {
                kernels: Kernels::new(isa).unwrap(),
                threads: 2,
                ..Default::default()
            },
        )
        .unwrap();
        let mut st = m.new_state();
        let l = m.forward(&mut st, &ids, Logits::All).unwrap();
        assert!(
            l.iter().zip(&base).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: ISA {isa} changed logits"
        );
    }
}

macro_rules! arch_tests {
    ($($modname:ident => $fixture:literal),* $(,)?) => {$(
        mod $modname {
            #[test]
            fn prompts() { super::check_prompts($fixture) }
            #[test]
            fn greedy() { super::check_greedy($fixture) }
            #[test]
            fn invariance() { super::check_invariance($fixture) }
        }
    )*};
}

arch_tests! {
    deepseek_v3_fp32 => "deepseek_v3-fp32",
    deepseek_v3_bf16 => "deepseek_v3-bf16",
    deepseek_v3_noqlora_fp32 => "deepseek_v3_noqlora-fp32",
    deepseek_v3_noqlora_bf16 => "deepseek_v3_noqlora-bf16",
    qwen3_moe_fp32 => "qwen3_moe-fp32",
    qwen3_moe_bf16 => "qwen3_moe-bf16",
    qwen2_moe_fp32 => "qwen2_moe-fp32",
    qwen2_moe_bf16 => "qwen2_moe-bf16",
    mixtral_fp32 => "mixtral-fp32",
    mixtral_bf16 => "mixtral-bf16",
    olmoe_fp32 => "olmoe-fp32",
    olmoe_bf16 => "olmoe-bf16",
    kimi_linear_fp32 => "kimi/kimi_linear-fp32",
    kimi_linear_bf16 => "kimi/kimi_linear-bf16",
    glm4_moe_fp32 => "glm4_moe-fp32",
    glm4_moe_bf16 => "glm4_moe-bf16",
    minimax_m2_fp32 => "minimax_m2-fp32",
    minimax_m2_bf16 => "minimax_m2-bf16",
    ernie4_5_moe_fp32 => "ernie4_5_moe-fp32",
    ernie4_5_moe_bf16 => "ernie4_5_moe-bf16",
    qwen3_next_fp32 => "qwen3_next-fp32",
    qwen3_next_bf16 => "qwen3_next-bf16",
    qwen3_5_moe_fp32 => "qwen3_5_moe-fp32",
    qwen3_5_moe_bf16 => "qwen3_5_moe-bf16",
    qwen3_5_moe_multimodal_bf16 => "qwen3_5_moe_multimodal-bf16",
    mimo_v2_flash_fp32 => "mimo_v2_flash-fp32",
    mimo_v2_flash_bf16 => "mimo_v2_flash-bf16",
    llama4_fp32 => "llama4-fp32",
    llama4_bf16 => "llama4-bf16",
    llama4_multimodal_bf16 => "llama4_multimodal-bf16",
    longcat_flash_fp32 => "longcat_flash-fp32",
    longcat_flash_bf16 => "longcat_flash-bf16",
    step3p7_fp32 => "step3p7-fp32",
    step3p7_bf16 => "step3p7-bf16",
    deepseek_v32_fp32 => "deepseek_v32-fp32",
    deepseek_v32_bf16 => "deepseek_v32-bf16",
    glm_moe_dsa_fp32 => "glm_moe_dsa-fp32",
    glm_moe_dsa_bf16 => "glm_moe_dsa-bf16",
    mistral_large4_fp32 => "mistral_large4-fp32",
    mistral_large4_bf16 => "mistral_large4-bf16",
    hy_v4_fp32 => "hy_v4-fp32",
    hy_v4_bf16 => "hy_v4-bf16",
    glm5_next_fp32 => "glm5_next-fp32",
    glm5_next_bf16 => "glm5_next-bf16",
    deepseek_v4_fp32 => "deepseek_v4-fp32",
    deepseek_v4_bf16 => "deepseek_v4-bf16",
    llama_fp32 => "llama-fp32",
    llama_bf16 => "llama-bf16",
    mistral_fp32 => "mistral-fp32",
    mistral_bf16 => "mistral-bf16",
    qwen2_fp32 => "qwen2-fp32",
    qwen2_bf16 => "qwen2-bf16",
    qwen3_fp32 => "qwen3-fp32",
    qwen3_bf16 => "qwen3-bf16",
}
