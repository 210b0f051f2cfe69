//! The determinism matrix: one hash over all logits of a fixed generation, the same across 12
//! budgets × every policy × prefetch on/off × 1 and 2 threads × every ISA this CPU has, and at
//! every budget with expert reads queued on an io_uring.

use std::path::Path;

use sluice_kernels::{Isa, Kernels};
use sluice_model::{Logits, Model, ModelOptions, PolicyChoice};

fn hash_generation(dir: &Path, opts: ModelOptions) -> String {
    hash_model(&Model::open(dir, opts).unwrap())
}

fn hash_model(m: &Model) -> String {
    let mut st = m.new_state();
    let mut logits = m
        .forward(&mut st, &[7, 300, 12, 45, 9, 401, 88], Logits::All)
        .unwrap();
    let v = m.config().vocab;
    for _ in 0..6 {
        let last = &logits[logits.len() - v..];
        let next = last
            .iter()
            .enumerate()
            .fold(0, |b, (i, &x)| if x > last[b] { i } else { b }) as u32;
        logits.extend(m.forward(&mut st, &[next], Logits::Last).unwrap());
    }
    let bytes: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
    sluice_format::packed::xxh3_hex([&bytes[..]])
}

#[test]
fn one_hash_across_budgets_policies_prefetch_threads_and_isas() {
    matrix("models/deepseek_v3-fp32");
}

/// Kimi K3 (MXFP4 experts, KDA recurrent state, attention residuals): the same matrix.
#[test]
fn kimi_k3_one_hash_across_budgets_policies_prefetch_threads_and_isas() {
    matrix("kimi/k3/k3-tiny-mxfp4");
}

/// A dense model (no experts: every budget below the whole model streams its layers): the
/// same matrix.
#[test]
fn dense_llama_one_hash_across_budgets_policies_prefetch_threads_and_isas() {
    matrix("models/llama-fp32");
}

/// Qwen3-Next (Gated DeltaNet state beside gated full attention, zero-centred norms): the same
/// matrix.
#[test]
fn qwen3_next_one_hash_across_budgets_policies_prefetch_threads_and_isas() {
    matrix("models/qwen3_next-fp32");
}

/// LongCat-Flash (a shortcut MoE's routed sum carried across a sublayer, zero-compute
/// experts): the same matrix.
#[test]
fn longcat_flash_one_hash_across_budgets_policies_prefetch_threads_and_isas() {
    matrix("models/longcat_flash-fp32");
}

/// DeepSeek-V3.2 (sparse attention: the indexer's top-k, its key cache): the same matrix.
#[test]
fn deepseek_v32_one_hash_across_budgets_policies_prefetch_threads_and_isas() {
    matrix("models/deepseek_v32-fp32");
}

/// Mistral Large 4 (layers attending to an earlier layer's latent cache, NoPE layers, the
/// indexer's queries from the input, soft-capped logits): the same matrix.
#[test]
fn mistral_large4_one_hash_across_budgets_policies_prefetch_threads_and_isas() {
    matrix("models/mistral_large4-fp32");
}

/// Hy4 (hyper-connection streams, sinks on sparse attention): the same matrix.
#[test]
fn hy_v4_one_hash_across_budgets_policies_prefetch_threads_and_isas() {
    matrix("models/hy_v4-fp32");
}

/// GLM-5.3-Flash (KDA state beside sparse MLA with a pooled indexer, mHC): the same matrix.
#[test]
fn glm5_next_one_hash_across_budgets_policies_prefetch_threads_and_isas() {
    matrix("models/glm5_next-fp32");
}

/// DeepSeek-V4 (sliding, heavily compressed and compressed-sparse layers, hash routing, mHC):
/// the same matrix.
#[test]
fn deepseek_v4_one_hash_across_budgets_policies_prefetch_threads_and_isas() {
    matrix("models/deepseek_v4-fp32");
}

fn matrix(fixture: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(fixture);
    let base = ModelOptions {
        context: 64,
        chunk: 8,
        ..Default::default()
    };
    let probe = Model::open(&dir, base.clone()).unwrap();
    let p = probe.plan().clone();
    let top = p.trunk + p.kv_cache + p.recurrent + p.scratch + p.all_expert_bytes;
    // 12 budgets from the minimum (layers streamed) to everything resident.
    let budgets: Vec<u64> = (0..12)
        .map(|i| p.minimum + (top - p.minimum) * i / 11)
        .collect();
    let want = hash_generation(&dir, base.clone());
    let mut runs = 0;
    for &memory in &budgets {
        for policy in PolicyChoice::ALL {
            for prefetch in [false, true] {
                for threads in [1, 2] {
                    for isa in Isa::available() {
                        let o = ModelOptions {
                            memory: Some(memory),
                            policy: policy.clone(),
                            prefetch,
                            // Every prediction read, so prefetch reads happen.
                            prefetch_precision: 0.0,
                            threads,
                            kernels: Kernels::new(isa).unwrap(),
                            ..base.clone()
                        };
                        let got = hash_generation(&dir, o);
                        assert_eq!(
                            got, want,
                            "budget {memory}, {policy}, prefetch {prefetch}, {threads} threads, {isa}"
                        );
                        runs += 1;
                    }
                }
            }
        }
    }
    // Expert reads queued on an io_uring instead of reader threads, at every budget.
    for &memory in &budgets {
        let o = ModelOptions {
            memory: Some(memory),
            prefetch_precision: 0.0,
            threads: 2,
            io_uring: true,
            ..base.clone()
        };
        let m = Model::open(&dir, o).unwrap();
        assert_eq!(
            m.io_name(),
            "io_uring",
            "O_DIRECT refused for {}",
            dir.display()
        );
        let got = hash_model(&m);
        assert_eq!(got, want, "budget {memory}, io_uring");
        runs += 1;
    }
    assert_eq!(
        runs,
        12 * PolicyChoice::ALL.len() * 2 * 2 * Isa::available().len() + 12
    );
    eprintln!("{fixture}: {runs} configurations, one hash: {want}");
}
