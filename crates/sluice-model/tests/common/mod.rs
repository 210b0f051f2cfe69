//! Helpers shared by the reference tests: reading reference outputs, comparing logits, and the
//! checks every fixture gets (prompt logits and routes, greedy steps, bit-invariance).
//! (Each test binary uses a subset.)
#![allow(dead_code, unused_macros)]

use std::collections::HashMap;
use std::path::Path;

use sluice_format::Dtype;
use sluice_kernels::{Isa, Kernels};
use sluice_model::{Logits, Model, ModelOptions};

/// Tensors of a reference file, by name.
pub struct Reference {
    tensors: HashMap<String, (Dtype, Vec<u8>)>,
}

impl Reference {
    pub fn open(path: &Path) -> Reference {
        let (header, _) = sluice_format::safetensors::read_header(path).unwrap();
        let bytes = std::fs::read(path).unwrap();
        let tensors = header
            .tensors
            .into_iter()
            .map(|t| {
                let data = bytes[t.offset as usize..(t.offset + t.len) as usize].to_vec();
                (t.name, (t.dtype, data))
            })
            .collect();
        Reference { tensors }
    }

    fn get(&self, name: &str) -> &(Dtype, Vec<u8>) {
        self.tensors
            .get(name)
            .unwrap_or_else(|| panic!("reference has no `{name}`"))
    }

    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn f32(&self, name: &str) -> Vec<f32> {
        let (d, b) = self.get(name);
        assert_eq!(*d, Dtype::F32, "{name}");
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// Token or expert ids, stored as I64 (transformers) or I32 (Moonshot's K3 references).
    pub fn ids(&self, name: &str) -> Vec<u32> {
        match self.get(name) {
            (Dtype::I64, b) => b
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
                .collect(),
            (Dtype::I32, b) => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32)
                .collect(),
            (d, _) => panic!("{name}: ids stored as {d:?}"),
        }
    }
}

/// The first index of the largest value.
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// Worst |a − b| and the reference's max |b|.
pub fn compare(got: &[f32], want: &[f32]) -> (f32, f32) {
    assert_eq!(got.len(), want.len());
    let mut worst = 0f32;
    let mut scale = 0f32;
    for (&g, &w) in got.iter().zip(want) {
        assert!(g.is_finite(), "non-finite value");
        worst = worst.max((g - w).abs());
        scale = scale.max(w.abs());
    }
    (worst, scale)
}

/// The routed experts and their weights of every MoE layer of `routes` (one forward pass over
/// the `t` tokens of prompt `t`) against the reference's `prompt{t}.layer{l}.*`; a MoE layer
/// the reference lacks is an error. Returns how many (layer, token) routes were compared.
pub fn check_routes(
    name: &str,
    t: usize,
    r: &Reference,
    cfg: &sluice_model::ModelConfig,
    routes: &[sluice_model::Route],
) -> usize {
    let mut checked = 0;
    for l in 0..cfg.layers {
        let key = format!("prompt{t}.layer{l}.experts");
        if !r.has(&key) {
            assert!(
                !cfg.is_moe(l),
                "{name}: reference lacks routes of MoE layer {l}"
            );
            continue;
        }
        let want = r.ids(&key);
        let want_w = r.f32(&format!("prompt{t}.layer{l}.weights"));
        let k = want.len() / t;
        for (i, route) in routes.iter().filter(|x| x.layer == l).enumerate() {
            assert_eq!(
                route.experts,
                want[i * k..(i + 1) * k],
                "{name} prompt{t} layer {l} token {i}"
            );
            for (g, w) in route.weights.iter().zip(&want_w[i * k..(i + 1) * k]) {
                assert!(
                    (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "{name} layer {l} token {i}: weight {g} vs {w}"
                );
            }
            checked += 1;
        }
    }
    checked
}

/// A fixture model opened with the best kernels and `threads` threads.
pub fn open_fixture(dir: &Path, threads: usize) -> Model {
    let opts = ModelOptions {
        kernels: Kernels::best(),
        threads,
        ..Default::default()
    };
    Model::open(dir, opts).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// Logits agree with the reference within this share of the largest reference logit.
pub const REL_TOL: f32 = 1e-4;

/// Prompt logits and routed experts for the three prompts.
pub fn check_prompts(dir: &Path, name: &str) {
    let r = Reference::open(&dir.join("reference.safetensors"));
    check_prompts_of(&open_fixture(dir, 1), &r, name);
}

/// [`check_prompts`] of a model opened by the caller against its reference.
pub fn check_prompts_of(model: &Model, r: &Reference, name: &str) {
    let vocab = model.config().vocab;
    let mut worst_ratio = 0f32;
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
        worst_ratio = worst_ratio.max(worst / scale);
        assert!(
            worst <= REL_TOL * scale,
            "{name} prompt{t}: worst {worst} > {REL_TOL} × {scale}"
        );
        // Routed experts, per MoE layer and token.
        let routes = st.routes.take().unwrap();
        let checked = check_routes(name, t, r, model.config(), &routes);
        if model.config().moe_layers() > 0 {
            assert!(checked > 0, "{name}: no routes compared");
        } else {
            assert!(routes.is_empty(), "{name}: a dense model reported routes");
        }
    }
    println!("{name} prompts: worst logit error ratio {worst_ratio:.2e}");
}

/// 32 greedy tokens with the KV cache, and the logits each was chosen from.
pub fn check_greedy(dir: &Path, name: &str) {
    let r = Reference::open(&dir.join("reference.safetensors"));
    check_greedy_of(&open_fixture(dir, 1), &r, name);
}

/// [`check_greedy`] of a model opened by the caller against its reference.
pub fn check_greedy_of(model: &Model, r: &Reference, name: &str) {
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

/// Chunked prefill, thread counts and ISAs change no bit.
pub fn check_invariance(dir: &Path, name: &str) {
    let r = Reference::open(&dir.join("reference.safetensors"));
    let ids = r.ids("prompt33.ids");
    let base = {
        let m = open_fixture(dir, 1);
        let mut st = m.new_state();
        m.forward(&mut st, &ids, Logits::All).unwrap()
    };
    for threads in [1, 2, 3] {
        let m = open_fixture(dir, threads);
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
            dir,
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

/// Runs against its reference (transformers, or Moonshot's code): `tests/reference.rs`.
pub const REF: u8 = 1;
/// Batched steps give each sequence its solo logits: `tests/batch.rs`.
pub const BATCH: u8 = 2;
/// The same bits at every budget, policy, prefetch, thread count and chunk: `tests/budget.rs`.
pub const BUDGET: u8 = 4;
/// A whole-prompt layer-major prefill equals spans and token-by-token: `tests/layer_major.rs`.
pub const LAYER_MAJOR: u8 = 8;

/// The fixture table: every fixture once, as `name "path under testdata/" [MATRICES]`, the
/// matrices it runs in among [`REF`], [`BATCH`], [`BUDGET`] and [`LAYER_MAJOR`]. It calls the
/// macro `$m` with every row: [`FIXTURES`] is made from it, `tests/reference.rs` and
/// `tests/budget.rs` expand it into one `#[test]` per row of their matrix (through [`if_in!`]),
/// and `tests/batch.rs` and `tests/layer_major.rs` iterate [`FIXTURES`]. Adding a fixture is one
/// row here. `tests/model_table.rs` fails when a family in `arch::FAMILIES` has no `REF` row.
macro_rules! fixture_table {
    ($m:ident) => {
        $m! {
            // MLA attention, sigmoid-group routing, a shared expert.
            deepseek_v3_fp32 "models/deepseek_v3-fp32" [REF BATCH BUDGET LAYER_MAJOR],
            deepseek_v3_bf16 "models/deepseek_v3-bf16" [REF],
            deepseek_v3_noqlora_fp32 "models/deepseek_v3_noqlora-fp32" [REF],
            deepseek_v3_noqlora_bf16 "models/deepseek_v3_noqlora-bf16" [REF BATCH],
            qwen3_moe_fp32 "models/qwen3_moe-fp32" [REF BATCH],
            // Grouped-query attention with QK norms.
            qwen3_moe_bf16 "models/qwen3_moe-bf16" [REF BUDGET LAYER_MAJOR],
            qwen2_moe_fp32 "models/qwen2_moe-fp32" [REF],
            qwen2_moe_bf16 "models/qwen2_moe-bf16" [REF BATCH],
            mixtral_fp32 "models/mixtral-fp32" [REF BATCH BUDGET],
            // Grouped-query attention with a sliding window.
            mixtral_bf16 "models/mixtral-bf16" [REF LAYER_MAJOR],
            olmoe_fp32 "models/olmoe-fp32" [REF],
            olmoe_bf16 "models/olmoe-bf16" [REF BATCH],
            kimi_linear_fp32 "kimi/kimi_linear-fp32" [REF BATCH BUDGET],
            kimi_linear_bf16 "kimi/kimi_linear-bf16" [REF],
            // Partial rotary with per-head q/k norms, sigmoid group routing, a shared expert.
            glm4_moe_fp32 "models/glm4_moe-fp32" [REF BATCH LAYER_MAJOR],
            glm4_moe_bf16 "models/glm4_moe-bf16" [REF BUDGET],
            minimax_m2_fp32 "models/minimax_m2-fp32" [REF BUDGET],
            minimax_m2_bf16 "models/minimax_m2-bf16" [REF BATCH],
            ernie4_5_moe_fp32 "models/ernie4_5_moe-fp32" [REF],
            ernie4_5_moe_bf16 "models/ernie4_5_moe-bf16" [REF BATCH BUDGET],
            qwen3_next_fp32 "models/qwen3_next-fp32" [REF BUDGET],
            // Gated DeltaNet and gated full attention, zero-centred norms, a gated shared expert.
            qwen3_next_bf16 "models/qwen3_next-bf16" [REF BATCH LAYER_MAJOR],
            qwen3_5_moe_fp32 "models/qwen3_5_moe-fp32" [REF],
            qwen3_5_moe_bf16 "models/qwen3_5_moe-bf16" [REF],
            qwen3_5_moe_multimodal_bf16 "models/qwen3_5_moe_multimodal-bf16" [REF BATCH BUDGET],
            mimo_v2_flash_fp32 "models/mimo_v2_flash-fp32" [REF],
            // Sliding layers with sinks and their own rotary table, values narrower than keys.
            mimo_v2_flash_bf16 "models/mimo_v2_flash-bf16" [REF BATCH LAYER_MAJOR],
            // Chunked attention, NoPE layers with temperature, routing weights on expert inputs.
            llama4_fp32 "models/llama4-fp32" [REF BATCH LAYER_MAJOR],
            llama4_bf16 "models/llama4-bf16" [REF],
            llama4_multimodal_bf16 "models/llama4_multimodal-bf16" [REF],
            longcat_flash_fp32 "models/longcat_flash-fp32" [REF BUDGET],
            // Two sublayers per layer, the shortcut MoE carried across them, zero-compute experts.
            longcat_flash_bf16 "models/longcat_flash-bf16" [REF BATCH LAYER_MAJOR],
            // Per-layer heads and rotary tables, a per-head gate, bounded SwiGLU, stacked experts.
            step3p7_fp32 "models/step3p7-fp32" [REF LAYER_MAJOR],
            step3p7_bf16 "models/step3p7-bf16" [REF BATCH BUDGET],
            deepseek_v32_fp32 "models/deepseek_v32-fp32" [REF BUDGET],
            // Sparse attention: each query over its indexer's top 8, the indexer's key cache.
            deepseek_v32_bf16 "models/deepseek_v32-bf16" [REF BATCH LAYER_MAJOR],
            // Layers sharing the top-k of the full sparse layer before them.
            glm_moe_dsa_fp32 "models/glm_moe_dsa-fp32" [REF BUDGET LAYER_MAJOR],
            glm_moe_dsa_bf16 "models/glm_moe_dsa-bf16" [REF BATCH],
            // Layers reading an earlier layer's latent cache, NoPE layers, log-position query scaling.
            mistral_large4_fp32 "models/mistral_large4-fp32" [REF BUDGET LAYER_MAJOR],
            mistral_large4_bf16 "models/mistral_large4-bf16" [REF BATCH],
            // Hyper-connection streams, attention sinks and gates on sparse MLA, bounded SwiGLU inputs.
            hy_v4_fp32 "models/hy_v4-fp32" [REF LAYER_MAJOR],
            hy_v4_bf16 "models/hy_v4-bf16" [REF BATCH BUDGET],
            // KDA beside NoPE sparse MLA with a pooled indexer, mHC's Sinkhorn-mixed streams.
            glm5_next_fp32 "models/glm5_next-fp32" [REF BUDGET LAYER_MAJOR],
            glm5_next_bf16 "models/glm5_next-bf16" [REF BATCH],
            deepseek_v4_fp32 "models/deepseek_v4-fp32" [REF BUDGET LAYER_MAJOR],
            deepseek_v4_bf16 "models/deepseek_v4-bf16" [REF BATCH],
            llama_fp32 "models/llama-fp32" [REF BATCH],
            llama_bf16 "models/llama-bf16" [REF],
            mistral_fp32 "models/mistral-fp32" [REF BUDGET],
            mistral_bf16 "models/mistral-bf16" [REF],
            // A dense model: sliding and full layers, no experts.
            qwen2_fp32 "models/qwen2-fp32" [REF LAYER_MAJOR],
            qwen2_bf16 "models/qwen2-bf16" [REF BATCH],
            qwen3_fp32 "models/qwen3-fp32" [REF],
            qwen3_bf16 "models/qwen3-bf16" [REF BUDGET],
            quant_deepseek_v3_fp8 "quant/deepseek_v3-fp8" [REF],
            quant_deepseek_v3_fp8_ue8m0_fp4 "quant/deepseek_v3-fp8-ue8m0-fp4" [REF],
            quant_minimax_m2_fp8 "quant/minimax_m2-fp8" [REF],
            quant_qwen3_5_moe_fp8 "quant/qwen3_5_moe-fp8" [REF],
            quant_glm4_moe_fp8 "quant/glm4_moe-fp8" [REF],
            quant_deepseek_v3_int4 "quant/deepseek_v3-int4" [REF BATCH],
            quant_qwen3_moe_mxfp4 "quant/qwen3_moe-mxfp4" [REF],
            quant_gpt_oss_bf16 "quant/gpt_oss-bf16" [REF],
            quant_gpt_oss_mxfp4 "quant/gpt_oss-mxfp4" [REF BATCH],
            // KDA recurrent layers, attention residuals, MXFP4 experts in a latent space. (Kimi K3's
            // reference is Moonshot's code, checked in tests/kimi_k3.rs.)
            k3_tiny_mxfp4 "kimi/k3/k3-tiny-mxfp4" [BATCH BUDGET LAYER_MAJOR],
            k3_tiny_bf16 "kimi/k3/k3-tiny-bf16" [BUDGET],
        }
    };
}

/// Expands the braced body when the bracketed matrices hold the first one.
macro_rules! if_in {
    (REF [REF $($r:ident)*] {$($b:tt)*}) => { $($b)* };
    (BATCH [BATCH $($r:ident)*] {$($b:tt)*}) => { $($b)* };
    (BUDGET [BUDGET $($r:ident)*] {$($b:tt)*}) => { $($b)* };
    (LAYER_MAJOR [LAYER_MAJOR $($r:ident)*] {$($b:tt)*}) => { $($b)* };
    ($w:ident [$x:ident $($r:ident)*] $b:tt) => { if_in! { $w [$($r)*] $b } };
    ($w:ident [] $b:tt) => {};
}

macro_rules! fixtures_const {
    ($($name:ident $path:literal [$($flag:ident)*],)*) => {
        /// Every fixture by its path under `testdata/`, and the matrices it runs in
        /// ([`fixture_table!`]'s rows).
        pub const FIXTURES: &[(&str, u8)] = &[$(($path, 0 $(| $flag)*)),*];
    };
}

fixture_table!(fixtures_const);

/// The fixtures that run in `matrix`, by their paths under `testdata/`.
pub fn fixtures(matrix: u8) -> impl Iterator<Item = &'static str> {
    FIXTURES
        .iter()
        .filter(move |f| f.1 & matrix != 0)
        .map(|f| f.0)
}

/// The fixtures of `matrix` under any of `dirs`, as a test file names them (the path under
/// `own`, or under `testdata/` for another directory).
pub fn fixtures_in(matrix: u8, dirs: &[&str], own: &str) -> Vec<String> {
    fixtures(matrix)
        .filter(|p| dirs.iter().any(|d| p.starts_with(&format!("{d}/"))))
        .map(|p| p.strip_prefix(&format!("{own}/")).unwrap_or(p).to_string())
        .collect()
}
