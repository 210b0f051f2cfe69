//! The commands on a GGUF file as on a checkpoint directory: `run` gives the ids of the
//! dequantized checkpoint at every budget, `inspect` and `bench` take the file, and a text
//! prompt to a file whose vocabulary cannot be built is one line naming the key (exit 2).

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/gguf/models/qwen3_moe-q5_k_m")
}

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .unwrap()
}

fn ok_json(o: &Output) -> Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn run_ids(model: &str, memory: &str) -> Vec<u64> {
    let o = sluice(&[
        "run",
        "--model",
        model,
        "--prompt-ids",
        "17,200,3,99,45,6,128,250",
        "--max-tokens",
        "24",
        "--memory",
        memory,
        "--threads",
        "2",
        "--json",
    ]);
    let v = ok_json(&o);
    v["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn run_on_the_file_gives_the_dequantized_checkpoints_ids_at_every_budget() {
    let gguf = fixture().join("model.gguf");
    let dequant = fixture().join("dequant");
    let want = run_ids(dequant.to_str().unwrap(), "unlimited");
    assert_eq!(want.len(), 24);
    for memory in ["unlimited", "4MiB"] {
        assert_eq!(
            run_ids(gguf.to_str().unwrap(), memory),
            want,
            "--memory {memory}"
        );
    }
    // A directory holding the file is the same model.
    let d = tempfile::tempdir().unwrap();
    std::fs::copy(&gguf, d.path().join("m.gguf")).unwrap();
    assert_eq!(run_ids(d.path().to_str().unwrap(), "unlimited"), want);
}

#[test]
fn inspect_and_bench_take_the_file() {
    let gguf = fixture().join("model.gguf");
    let g = gguf.to_str().unwrap();
    let v = ok_json(&sluice(&["inspect", g, "--json"]));
    assert_eq!(v["model_type"], "qwen3_moe", "{v}");
    let o = sluice(&[
        "bench",
        "--model",
        g,
        "--ladder",
        "4MiB,unlimited",
        "--policies",
        "lfu",
        "--prefetch",
        "off",
        "--prompt-tokens",
        "8",
        "--max-tokens",
        "4",
        "--disk-seconds",
        "1",
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        out.contains("output identical across all 4 runs: yes"),
        "{out}"
    );
}

#[test]
fn a_text_prompt_without_a_vocabulary_names_the_key() {
    // The fixture's byte-level vocabulary has no merges, which llama.cpp refuses too: ids run
    // (above), text does not.
    let gguf = fixture().join("model.gguf");
    let o = sluice(&["run", "--model", gguf.to_str().unwrap(), "hello"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("tokenizer.ggml.merges"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
