//! Helpers shared by the facade's integration tests.

// Each test crate uses some of them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use sluice::{EngineBuilder, Error, Memory};

/// The bundled demo model.
pub fn demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo")
}

/// Every fixture family's fp32 model (softmax attention of every kind, the recurrent KDA and
/// gated-DeltaNet states), then the demo model.
pub fn families() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("models"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with("-fp32"))
        .collect();
    dirs.sort();
    dirs.push(root.join("kimi/kimi_linear-fp32"));
    dirs.push(demo());
    dirs
}

/// The smallest budget `builder`'s plan accepts, read from its refusal of a budget far too
/// small.
pub fn minimum(builder: EngineBuilder) -> u64 {
    let e = builder.memory(Memory::Bytes(1 << 20)).build().unwrap_err();
    let s = match &e {
        Error::Store(s) | Error::Model(sluice_model::ModelError::Store(s)) => s,
        other => panic!("expected a budget refusal, got {other}"),
    };
    match s {
        sluice_store::StoreError::BudgetTooSmall { minimum, .. } => *minimum,
        other => panic!("expected a budget refusal, got {other}"),
    }
}

/// The share of a budget the demo's tokenizer is planned (see `Tokenizer::memory_bytes`): a
/// test budget calibrated for the model alone adds it to stay in the same regime.
pub fn text(context: usize, sequences: usize) -> u64 {
    sluice::Tokenizer::from_dir(&demo())
        .unwrap()
        .unwrap()
        .memory_bytes(context, sequences)
}

/// Runs `jobs` through a batcher of width `n` and returns each one's result, in job order;
/// a failed job panics.
pub fn batched(
    engine: &sluice::Engine,
    n: usize,
    jobs: Vec<(sluice::OwnedPrompt, sluice::GenerateOptions)>,
) -> Vec<sluice::Finished> {
    let b = sluice::Batcher::new(engine.clone(), n).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let count = jobs.len();
    for (i, (p, o)) in jobs.into_iter().enumerate() {
        let tx = tx.clone();
        b.submit(
            &p,
            o,
            Box::new(move |e| {
                let _ = tx.send((i, e));
                true
            }),
        )
        .unwrap();
    }
    drop(tx);
    let mut got: Vec<Option<sluice::Finished>> = (0..count).map(|_| None).collect();
    for (i, e) in rx {
        match e {
            sluice::Event::Token(_) => {}
            sluice::Event::Done(f) => got[i] = Some(*f),
            sluice::Event::Failed(e) => panic!("job {i}: {e}"),
        }
    }
    got.into_iter()
        .map(|f| f.expect("every job finishes"))
        .collect()
}
