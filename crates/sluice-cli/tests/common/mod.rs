//! Helpers shared by the CLI's integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The bundled demo model.
pub fn demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo")
}

/// What a solo greedy `sluice run` of `prompt` (raw, `max` tokens) gives.
pub fn solo(model: &Path, prompt: &str, max: usize) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["run", "--model"])
        .arg(model)
        .args([
            prompt,
            "--max-tokens",
            &max.to_string(),
            "--temperature",
            "0",
            "--json",
            "--raw",
        ])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    v["text"].as_str().unwrap().to_owned()
}
