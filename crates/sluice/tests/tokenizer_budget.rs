//! Issue 18 class 5: the tokenizer's memory is planned inside `--memory`, beside the model's.

mod common;

use common::{demo, minimum};
use sluice::tools::fmt_bytes;
use sluice::tools::inspect::inspect;
use sluice::{Description, Engine, Memory, Tokenizer};
use sluice_model::ModelOptions;

/// The model's own minimum at the demo's context, planned with nothing kept for a tokenizer.
fn model_minimum() -> u64 {
    let desc = Description::open(demo()).unwrap();
    let shards = desc.shards(true).unwrap();
    let opts = ModelOptions {
        memory: Some(1 << 20),
        context: 4096,
        ..ModelOptions::default()
    };
    match desc.plan(&shards, &opts) {
        Err(sluice_model::ModelError::Store(sluice_store::StoreError::BudgetTooSmall {
            minimum,
            ..
        })) => minimum,
        other => panic!("expected a budget refusal, got {other:?}"),
    }
}

#[test]
fn the_tokenizer_is_planned_inside_the_budget() {
    let tok = Tokenizer::from_dir(&demo()).unwrap().unwrap();
    // The demo's context is 512 positions (the builder's 4096 capped by the model).
    let text = tok.memory_bytes(512, 1);
    // Its vocabulary (about 8 × its 265 kB file) and the encoding of an 8 kB prompt.
    assert!(text > 2 << 20, "{text}");
    // 16 bytes per position: the demo's longest token is 16 bytes, so 2 × 16 is the larger.
    assert_eq!(tok.max_token_bytes(), 16);
    assert_eq!(
        tok.max_prompt_bytes(512),
        512 * sluice_text::MAX_BYTES_PER_TOKEN
    );

    let engine_min = minimum(Engine::builder().model(demo()));
    assert_eq!(engine_min, model_minimum() + text);

    // A budget the model alone would take is refused, naming the tokenizer's share.
    let e = Engine::builder()
        .model(demo())
        .memory(Memory::Bytes(model_minimum()))
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("tokenizer {} +", fmt_bytes(text))),
        "{e}"
    );

    // `sluice inspect` plans the same.
    let i = inspect(&demo(), Memory::Bytes(16 << 20), 4096, 64).unwrap();
    assert_eq!(i.plan.minimum, engine_min);
    assert_eq!(i.plan.tokenizer, text);

    // More sequences encode more prompts at once.
    let four = minimum(Engine::builder().model(demo()).sequences(4));
    assert!(four - engine_min >= 3 * (tok.max_prompt_bytes(512) as u64) * 220);

    // Without a budget the minimum still counts it.
    let i = inspect(&demo(), Memory::Unlimited, 4096, 64).unwrap();
    assert_eq!(i.plan.minimum, engine_min);
}
