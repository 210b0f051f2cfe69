//! Helpers shared by the facade's integration tests.

// Each test crate uses some of them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use sluice::{EngineBuilder, Error, Memory};

/// The bundled demo model.
pub fn demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo")
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
