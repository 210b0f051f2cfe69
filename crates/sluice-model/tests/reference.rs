//! The forward pass against Hugging Face transformers on the committed fixtures
//! (`testdata/models/*`, produced by `tools/reference/make_fixtures.py`, and
//! `testdata/kimi/kimi_linear-*`, produced by `tools/reference/make_kimi_fixtures.py`).

use std::path::{Path, PathBuf};

mod common;
use common::{check_greedy, check_invariance, check_prompts};

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

macro_rules! arch_tests {
    ($($modname:ident => $fixture:literal),* $(,)?) => {
        $(
            mod $modname {
                #[test]
                fn prompts() { super::check_prompts(&super::fixture($fixture), $fixture) }
                #[test]
                fn greedy() { super::check_greedy(&super::fixture($fixture), $fixture) }
                #[test]
                fn invariance() { super::check_invariance(&super::fixture($fixture), $fixture) }
            }
        )*
        /// Every fixture checked here.
        const FIXTURES: &[&str] = &[$($fixture),*];
    };
}

/// The list above is the common table's (`common::FIXTURES`' `REF` rows).
#[test]
fn the_fixtures_are_the_common_tables() {
    let want = common::fixtures_in(common::REF, &["models", "kimi"], "models");
    assert_eq!(
        FIXTURES, want,
        "tests/reference.rs and common::FIXTURES differ"
    );
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
