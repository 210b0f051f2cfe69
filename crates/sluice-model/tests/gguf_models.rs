//! GGUF files made by llama.cpp's own converter and `llama-quantize` against transformers
//! (`testdata/gguf/models/`, see testdata/README.md): the logits of every prompt position
//! within 1e-4 × max|logit|, the routed experts and 32 greedy ids equal; the file's blocks
//! multiplied in place give the bits of the dequantized checkpoint transformers loads from it;
//! and a budget that streams the experts from the file changes no bit.

use std::path::{Path, PathBuf};

mod common;
use common::Reference;
use sluice_model::{Logits, Model, ModelOptions};

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

fn opts(memory: Option<u64>) -> ModelOptions {
    ModelOptions {
        threads: 2,
        memory,
        ..Default::default()
    }
}

fn open(path: &Path, memory: Option<u64>) -> Model {
    Model::open(path, opts(memory)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The GGUF of a fixture, its reference, and the checkpoint of the same values (when the
/// fixture has one).
fn fixture(name: &str) -> (PathBuf, Reference, Option<PathBuf>) {
    let d = testdata().join("gguf/models").join(name);
    // Converted from a transformers fixture, whose reference it shares
    // (tools/reference/make_gguf_converted.py).
    let converted = match name {
        "gpt_oss-mxfp4" => Some("quant/gpt_oss-mxfp4".to_owned()),
        "gpt_oss-bf16-f32" => Some("quant/gpt_oss-bf16".to_owned()),
        _ => name
            .strip_suffix("-f32")
            .map(|family| format!("models/{family}-fp32")),
    };
    if let Some(src) = converted {
        let src = testdata().join(src);
        let r = Reference::open(&src.join("reference.safetensors"));
        let gguf = testdata().join(format!("gguf_converted/{name}.gguf"));
        return (gguf, r, Some(src));
    }
    let r = Reference::open(&d.join("reference.safetensors"));
    (d.join("model.gguf"), r, Some(d.join("dequant")))
}

fn check(name: &str, bitwise: bool) {
    let (gguf, r, dequant) = fixture(name);
    let model = open(&gguf, None);
    common::check_prompts_of(&model, &r, name);
    common::check_greedy_of(&model, &r, name);

    let ids = r.ids("prompt33.ids");
    let run = |m: &Model| {
        let mut st = m.new_state();
        m.forward(&mut st, &ids, Logits::All).unwrap()
    };
    let base = run(&model);
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    if let (true, Some(d)) = (bitwise, dequant) {
        assert!(
            same(&base, &run(&open(&d, None))),
            "{name}: the GGUF's bits differ from its dequantized checkpoint's"
        );
    }
    // The smallest budget the model takes streams its experts (and layers) from the file.
    let min = sluice_model::Description::open(&gguf)
        .unwrap()
        .plan(
            &sluice_store::ShardSet::open(std::slice::from_ref(&gguf), false).unwrap(),
            &opts(Some(u64::MAX / 4)),
        )
        .unwrap()
        .minimum;
    // (Planned without a budget, the minimum leaves out a few KiB a budget adds: a margin.)
    let budget = min + min / 16;
    let small = open(&gguf, Some(budget));
    assert!(
        same(&base, &run(&small)),
        "{name}: a budget of {budget} changes bits"
    );
    assert!(
        small.trunk_bytes_read() > 0,
        "{name}: under {budget} bytes nothing streamed from the file"
    );
}

#[test]
fn llama_q4_k_m() {
    check("llama-q4_k_m", true);
}

#[test]
fn llama_q8_0() {
    check("llama-q8_0", true);
}

#[test]
fn qwen3_moe_q5_k_m() {
    check("qwen3_moe-q5_k_m", true);
}

#[test]
fn qwen2_moe_q6_k() {
    check("qwen2_moe-q6_k", true);
}

#[test]
fn qwen3_iq4_xs() {
    check("qwen3-iq4_xs", true);
}

/// Mixtral as llama.cpp writes it (`llama` with experts, Q/K rows permuted): F32 rows read
/// back in Hugging Face's order give the checkpoint's bits.
#[test]
fn mixtral_f32() {
    check("mixtral-f32", true);
}

/// A dense Llama with Llama 3's rope scaling (stored as `rope_freqs.weight` factors, read back
/// as the parameters they came from) and attention biases (the query and key ones permuted).
#[test]
fn llama_f32() {
    check("llama-f32", true);
}

/// DeepSeek-V3 as `deepseek2`: the split `kv_b_proj` runs its keys' half as a plain product
/// (not row by row), so its bits differ from the checkpoint's within the tolerance.
#[test]
fn deepseek_v3_f32() {
    check("deepseek_v3-f32", false);
}

/// GPT-OSS as `gpt-oss`, its experts in GGUF's MXFP4 blocks: the fused, interleaved
/// `gate_up_proj` split by the converter into stacked gate and up experts with stacked biases,
/// the sinks, the sliding layers and YaRN without truncation (which the file does not store).
/// The checkpoint's MXFP4 rows are dotted group by group and scaled per group, the GGUF's
/// blocks decoded to their values first: the same values, other roundings, so the bits differ
/// within the tolerance.
#[test]
fn gpt_oss_mxfp4() {
    check("gpt_oss-mxfp4", false);
}

/// The same architecture from BF16 experts widened to F32: the converter transposed GPT-OSS's
/// `x @ W` matrices to `[out, in]`, which are dotted row by row where the checkpoint's are
/// accumulated column by column, so the bits differ within the tolerance.
#[test]
fn gpt_oss_bf16_f32() {
    check("gpt_oss-bf16-f32", false);
}

/// The integer mode (`Numerics::Int8`) on files of the formats it multiplies in integers: its
/// logits differ from the exact mode's (the mode runs) but stay close to them (measured
/// 2026-12-07 on the first four: top-1 equal at 31–32 of 33 positions, the largest difference
/// 1.6–2.6% of max|logit|; GPT-OSS's MXFP4 file 29 of 33, a few positions routed elsewhere),
/// and its bits are the same at every thread count, ISA, split of the prompt and budget.
#[test]
fn int8_numerics_keep_the_contract() {
    use sluice_kernels::{Isa, Kernels, Numerics};
    for name in [
        "llama-q4_k_m",
        "llama-q8_0",
        "qwen3_moe-q5_k_m",
        "qwen2_moe-q6_k",
        "qwen3-iq4_xs",
        "gpt_oss-mxfp4",
    ] {
        let (gguf, r, _) = fixture(name);
        let ids = r.ids("prompt33.ids");
        let with = |isa: Isa, threads: usize, memory: Option<u64>| {
            let o = ModelOptions {
                kernels: Kernels::new(isa).unwrap().with_numerics(Numerics::Int8),
                threads,
                memory,
                ..Default::default()
            };
            Model::open(&gguf, o).unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        let all = |m: &Model| {
            let mut st = m.new_state();
            m.forward(&mut st, &ids, Logits::All).unwrap()
        };
        let m = with(Isa::best(), 2, None);
        assert_eq!(m.numerics(), Numerics::Int8);
        let base = all(&m);
        let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());

        // Close to the exact mode, and not it.
        let exact = all(&open(&gguf, None));
        assert!(
            !same(&base, &exact),
            "{name}: int8 gave the exact mode's bits"
        );
        let vocab = m.config().vocab;
        let top = |l: &[f32]| {
            l.chunks_exact(vocab)
                .map(common::argmax)
                .collect::<Vec<_>>()
        };
        let agree = top(&base)
            .iter()
            .zip(top(&exact))
            .filter(|(a, b)| **a == *b)
            .count();
        let scale = exact.iter().fold(0f32, |s, v| s.max(v.abs()));
        // Positions whose logits all lie within 5% of max|logit| of the exact mode's (a near
        // tie in a router can send a position to other experts: that position then differs).
        let close = base
            .chunks_exact(vocab)
            .zip(exact.chunks_exact(vocab))
            .filter(|(a, b)| a.iter().zip(*b).all(|(x, y)| (x - y).abs() <= 0.05 * scale))
            .count();
        assert!(
            agree * 10 >= ids.len() * 8 && close * 10 >= ids.len() * 8,
            "{name}: int8 against exact: top-1 agrees at {agree} and logits are close at {close} of {} positions",
            ids.len()
        );
        for isa in Isa::available() {
            for threads in [1, 3] {
                assert!(
                    same(&base, &all(&with(isa, threads, None))),
                    "{name}: int8 bits change with {isa}, {threads} threads"
                );
            }
        }
        // Token by token.
        let mut st = m.new_state();
        let mut steps = Vec::new();
        for &t in &ids {
            steps.extend(m.forward(&mut st, &[t], Logits::All).unwrap());
        }
        assert!(
            same(&base, &steps),
            "{name}: int8 bits change token by token"
        );
        // A budget that streams.
        let min = sluice_model::Description::open(&gguf)
            .unwrap()
            .plan(
                &sluice_store::ShardSet::open(std::slice::from_ref(&gguf), false).unwrap(),
                &opts(Some(u64::MAX / 4)),
            )
            .unwrap()
            .minimum;
        assert!(
            same(&base, &all(&with(Isa::best(), 2, Some(min + min / 16)))),
            "{name}: int8 bits change under a budget"
        );
    }
}
