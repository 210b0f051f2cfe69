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
    // Q5_K_M: Q5_K and Q6_K blocks, every one with an integer product.
    let int8 = v["int8_bytes"].as_u64().unwrap();
    assert!(int8 > 0 && v["block_bytes_exact"] == 0, "{v}");
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

/// The fixture's bytes with one thing broken, each run as `sluice run`: exit 2, one line naming
/// the file, no panic.
#[test]
fn a_corrupt_file_is_one_line_and_exit_2() {
    let good = std::fs::read(fixture().join("model.gguf")).unwrap();
    let u64_at =
        |b: &mut Vec<u8>, at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    // The first tensor's info: its name, then rank (u32), dims (u64 each), type (u32), offset.
    let name = b"token_embd.weight";
    let at = good
        .windows(name.len())
        .position(|w| w == name)
        .expect("the embedding's tensor info")
        + name.len();
    let rank = u32::from_le_bytes(good[at..at + 4].try_into().unwrap()) as usize;
    let ty_at = at + 4 + 8 * rank;
    let mut cases: Vec<(&str, &str, Vec<u8>)> = Vec::new();
    cases.push(("truncated", "truncated", good[..good.len() / 2].to_vec()));
    let mut b = good.clone();
    u64_at(&mut b, 8, 1 << 40);
    cases.push((
        "a tensor count past what the file holds",
        "tensors exceed",
        b,
    ));
    let mut b = good.clone();
    u64_at(&mut b, 24, 1 << 40);
    cases.push(("an oversized string", "string of", b));
    let mut b = good.clone();
    b[ty_at..ty_at + 4].copy_from_slice(&99u32.to_le_bytes());
    cases.push(("an unknown type", "unknown ggml type 99", b));
    let mut b = good.clone();
    let off = u64::from_le_bytes(b[ty_at + 4..ty_at + 12].try_into().unwrap());
    u64_at(&mut b, ty_at + 4, off + 1);
    cases.push(("a misaligned offset", "alignment", b));
    let d = tempfile::tempdir().unwrap();
    for (what, says, bytes) in cases {
        let p = d.path().join("bad.gguf");
        std::fs::write(&p, &bytes).unwrap();
        let o = sluice(&["run", "--model", p.to_str().unwrap(), "--prompt-ids", "1,2"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{what}: {err}");
        assert!(!err.contains("panicked"), "{what}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{what}: {err}");
        assert!(
            err.contains("bad.gguf"),
            "{what}: the file is not named: {err}"
        );
        assert!(err.contains(says), "{what}: `{says}` not said: {err}");
    }
}

/// The bundled demo model converted by llama.cpp and quantized to Q4_K_M
/// (tools/reference/make_gguf_converted.py): a trained model with a real vocabulary.
fn demo_gguf() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/gguf_converted/demo-q4_k_m.gguf")
}

fn run_text(model: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "run",
        "--model",
        model,
        "It is a truth universally acknowledged",
        "--max-tokens",
        "24",
        "--json",
    ];
    args.extend_from_slice(extra);
    ok_json(&sluice(&args))
}

#[test]
fn the_files_vocabulary_and_sampling_defaults_are_the_models() {
    let gguf = demo_gguf();
    let g = gguf.to_str().unwrap();
    let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/demo");
    // The vocabulary from `tokenizer.ggml.*` encodes as the checkpoint's tokenizer.json.
    let want_ids = run_text(demo.to_str().unwrap(), &["--temperature", "0"])["prompt_ids"].clone();
    let greedy = run_text(g, &["--temperature", "0"]);
    assert_eq!(greedy["prompt_ids"], want_ids);
    assert!(!greedy["text"].as_str().unwrap().is_empty(), "{greedy}");
    // Unset sampling options are the file's `general.sampling.*` (the demo's
    // generation_config.json, which samples), not greedy decoding.
    let default = run_text(g, &["--seed", "5"]);
    let explicit = run_text(
        g,
        &[
            "--seed",
            "5",
            "--temperature",
            "0.8",
            "--top-p",
            "0.95",
            "--top-k",
            "50",
            "--repetition-penalty",
            "1.1",
        ],
    );
    assert_eq!(default["ids"], explicit["ids"]);
    assert_ne!(default["ids"], greedy["ids"], "the defaults did not sample");
    // Sampled text is the same at a budget that streams the experts and layers from the file.
    let small = run_text(g, &["--seed", "5", "--memory", "10MiB"]);
    assert_eq!(small["ids"], default["ids"]);
    let stats = &small["stats"];
    assert!(
        stats["trunk_bytes_read"].as_u64().unwrap() > 0,
        "nothing streamed: {stats}"
    );
}

/// `--numerics int8` runs (the stats say so; its logits are not the exact mode's), and gives the
/// same ids at any thread count and budget.
#[test]
fn int8_numerics_run_and_keep_their_bits() {
    let gguf = fixture().join("model.gguf");
    let g = gguf.to_str().unwrap();
    let d = tempfile::tempdir().unwrap();
    let run = |numerics: &str, threads: &str, memory: &str| {
        let dump = d.path().join(format!("{numerics}-{threads}-{memory}.npy"));
        let v = ok_json(&sluice(&[
            "run",
            "--model",
            g,
            "--prompt-ids",
            "17,200,3,99,45,6,128,250",
            "--max-tokens",
            "24",
            "--temperature",
            "0",
            "--numerics",
            numerics,
            "--threads",
            threads,
            "--memory",
            memory,
            "--dump-logits",
            dump.to_str().unwrap(),
            "--json",
        ]));
        assert_eq!(v["stats"]["numerics"], numerics, "{v}");
        (v["ids"].clone(), std::fs::read(&dump).unwrap())
    };
    let int8 = run("int8", "2", "unlimited");
    assert_eq!(run("int8", "1", "unlimited"), int8);
    assert_eq!(run("int8", "3", "4MiB"), int8);
    let exact = run("exact", "2", "unlimited");
    assert_ne!(int8.1, exact.1, "int8 gave the exact mode's logits");
    let o = sluice(&["run", "--model", g, "--numerics", "int4"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("--numerics"), "{err}");
}
