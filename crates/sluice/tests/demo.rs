//! The bundled demo model: its greedy continuation of a fixed prompt is pinned to transformers'
//! (so a regression in any layer shows up as changed text), and a budget below the model's size
//! gives the same output, streamed from disk.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use sluice::{Engine, GenerateOptions, Memory, Prompt, SamplingOptions};

fn demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo")
}

fn reference() -> HashMap<String, Vec<u8>> {
    let path = demo().join("reference.safetensors");
    let (h, _) = sluice_format::safetensors::read_header(&path).unwrap();
    let b = std::fs::read(&path).unwrap();
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

const PROMPT: &str = "It is a truth universally acknowledged";

#[test]
fn greedy_continuation_matches_transformers() {
    let r = reference();
    let engine = Engine::builder().model(demo()).threads(2).build().unwrap();
    assert_eq!(
        engine.encode(&Prompt::Text(PROMPT)).unwrap(),
        ids(&r["greedy.prompt_ids"])
    );
    let want = ids(&r["greedy.ids"]);
    let greedy = GenerateOptions {
        max_tokens: want.len(),
        sampling: SamplingOptions::default(),
        keep_logits: true,
        ..Default::default()
    };
    let mut s = engine.session().unwrap();
    let mut g = s.generate(Prompt::Text(PROMPT), &greedy).unwrap();
    let text = g.run().unwrap();
    assert_eq!(
        g.ids(),
        &want[..],
        "the demo's greedy continuation changed: {text:?}"
    );
    // The logits each token was chosen from, within 1e-4 of transformers' scale.
    let step: Vec<f32> = r["greedy.step_logits"]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let logits = g.logits();
    let vocab = engine.model().config().vocab;
    let ours = &logits[logits.len() - step.len()..];
    let scale = step.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = ours
        .iter()
        .zip(&step)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        worst <= 1e-4 * scale,
        "worst logit error {worst} (scale {scale}), vocab {vocab}"
    );
    assert!(text.starts_with(", and the most uniform"), "{text:?}");
}

#[test]
fn a_budget_below_the_model_gives_the_same_text() {
    let model_bytes: u64 = std::fs::metadata(demo().join("model.safetensors"))
        .unwrap()
        .len();
    let run = |memory: Memory| {
        let engine = Engine::builder()
            .model(demo())
            .memory(memory)
            .threads(2)
            .build()
            .unwrap();
        // The defaults of generation_config.json: sampling with seed 0.
        let opts = GenerateOptions {
            max_tokens: 48,
            sampling: engine.default_sampling().clone(),
            ..Default::default()
        };
        let mut s = engine.session().unwrap();
        let mut g = s.generate(Prompt::Text(PROMPT), &opts).unwrap();
        let text = g.run().unwrap();
        (text, g.stats())
    };
    let (full, _) = run(Memory::Unlimited);
    let budget = (10 << 20) + common::text(512, 1);
    assert!(budget < model_bytes);
    let (small, stats) = run(Memory::Bytes(budget));
    assert_eq!(full, small);
    assert!(
        stats.expert_bytes_read > 0 && stats.trunk_bytes_read > 0,
        "{stats:?}"
    );
    assert!(full.split_whitespace().count() > 20, "{full:?}");
}
