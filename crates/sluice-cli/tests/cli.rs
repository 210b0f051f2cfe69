//! The `sluice` binary end to end, spawned as a process: exit codes, `--json` keys,
//! `--dump-logits` shape, one-line errors, and peak RSS under a budget.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

#[path = "../../sluice-model/tests/scratch/mod.rs"]
mod scratch;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/models")
        .join(name)
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `args` and checks the user-mistake contract: exit 2 and one `error: ` line on stderr,
/// no panic. Returns the line.
fn one_line_error(args: &[&str]) -> String {
    let o = run(args);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
    assert!(e.starts_with("error: "), "{args:?}: {e}");
    assert_eq!(e.trim_end().lines().count(), 1, "{args:?}: {e}");
    assert!(!e.contains("panicked"), "{args:?}: {e}");
    e
}

fn json(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "failed: {}", stderr(o));
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

/// The bundled demo model.
fn demo_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo")
}

/// `sluice run --model <demo> --json ARGS`, its JSON (ARGS end with the prompt).
fn run_demo_json(args: &[&str]) -> serde_json::Value {
    let demo = demo_model();
    let mut a = vec!["run", "--model", demo.to_str().unwrap(), "--json"];
    a.extend_from_slice(args);
    json(&run(&a))
}

/// A synthetic model with ~300 MB of experts and a trunk of a few MB.
fn synthetic() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = scratch::shared_dir(Path::new(env!("CARGO_TARGET_TMPDIR")), "sluice-cli-synth-");
        let out = d.join("m");
        let o = run(&[
            "synth",
            out.to_str().unwrap(),
            "--hidden",
            "512",
            "--moe-inter",
            "512",
            "--layers",
            "4",
            "--vocab",
            "2048",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        d
    })
    .as_path()
}

#[test]
fn json_has_the_documented_keys() {
    let m = fixture("deepseek_v3-fp32");
    let v = json(&run(&[
        "run",
        "--model",
        m.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "5",
        "--json",
    ]));
    assert_eq!(v["prompt_ids"], serde_json::json!([1, 2, 3]));
    assert_eq!(v["ids"].as_array().unwrap().len(), 5);
    assert!(v["text"].is_string());
    for k in [
        "prefill_tokens",
        "prefill_seconds",
        "decode_tokens",
        "decode_seconds",
        "expert_requests",
        "expert_hits",
        "expert_resident_hits",
        "expert_bytes_read",
        "trunk_bytes_read",
        "io_seconds",
        "io_mode",
        "peak_rss_bytes",
        "memory_budget_bytes",
        "policy",
        "threads",
        "isa",
        "prefill_expert_bytes_read",
        "prefill_expert_touched_bytes",
        "prefill_attention_seconds",
        "prefill_expert_seconds",
        "prefill_head_seconds",
        "prefill_other_seconds",
        "decode_attention_seconds",
        "decode_expert_seconds",
        "decode_head_seconds",
        "decode_other_seconds",
        "decode_sampling_seconds",
        "prefill_chunk",
        "draft_proposed",
        "draft_accepted",
        "cached_tokens",
    ] {
        assert!(
            !v["stats"][k].is_null(),
            "stats lacks `{k}`: {}",
            v["stats"]
        );
    }
    assert_eq!(v["stats"]["decode_tokens"], 5);
    // The decode phases are parts of the decode time: each was spent (the fixture's four
    // decode passes have attention, experts and a head, and five tokens were chosen), and
    // together they are no more than the whole they are measured inside.
    let s = &v["stats"];
    let phases = ["attention", "expert", "head", "other", "sampling"]
        .map(|p| s[format!("decode_{p}_seconds")].as_f64().unwrap());
    assert!(phases.iter().all(|&x| x > 0.0), "{phases:?}");
    let total = s["decode_seconds"].as_f64().unwrap();
    assert!(
        phases.iter().sum::<f64>() <= total * (1.0 + 1e-9),
        "{phases:?} within {total}"
    );
    // One pass over the 3-token prompt.
    assert_eq!(
        v["stats"]["prefill_spans"][0]["tokens"], 3,
        "{}",
        v["stats"]
    );
}

/// `--prefill-span` caps each layer-major prefill pass and changes no token.
#[test]
fn prefill_span_caps_the_passes_and_changes_nothing() {
    let m = fixture("deepseek_v3-fp32");
    let go = |extra: &[&str]| {
        let mut a = vec![
            "run",
            "--model",
            m.to_str().unwrap(),
            "--prompt-ids",
            "1,2,3,4,5,6,7",
            "--max-tokens",
            "4",
            "--json",
        ];
        a.extend_from_slice(extra);
        json(&run(&a))
    };
    let whole = go(&[]);
    let capped = go(&["--prefill-span", "2", "--prefill-chunk", "1"]);
    assert_eq!(whole["ids"], capped["ids"]);
    let spans: Vec<u64> = capped["stats"]["prefill_spans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(spans, vec![2, 2, 2, 1]);
    assert_eq!(capped["stats"]["prefill_chunk"], 1);
}

#[test]
fn dump_logits_shape() {
    let m = fixture("qwen3_moe-fp32");
    let d = tempfile::tempdir().unwrap();
    for (max, rows) in [(0, 4), (3, 7)] {
        let f = d.path().join(format!("l{max}.npy"));
        let o = run(&[
            "run",
            "--model",
            m.to_str().unwrap(),
            "--prompt-ids",
            "7,8,9,10",
            "--max-tokens",
            &max.to_string(),
            "--json",
            "--dump-logits",
            f.to_str().unwrap(),
        ]);
        json(&o);
        let b = std::fs::read(&f).unwrap();
        let hl = u16::from_le_bytes([b[8], b[9]]) as usize;
        let header = std::str::from_utf8(&b[10..10 + hl]).unwrap();
        assert!(
            header.contains(&format!("'shape': ({rows}, 512)")),
            "{header}"
        );
        assert_eq!(b.len(), 10 + hl + rows * 512 * 4);
    }
}

#[test]
fn user_mistakes_exit_2_with_one_line() {
    let m = fixture("deepseek_v3-fp32");
    let m = m.to_str().unwrap();
    for args in [
        vec!["run", "--model", "/nonexistent/dir", "--prompt-ids", "1"],
        vec![
            "run",
            "--model",
            m,
            "--prompt-ids",
            "1",
            "--memory",
            "12 parsecs",
        ],
        vec!["run", "--model", m, "--prompt-ids", "1", "--memory", "1KiB"],
        vec!["run", "--model", m, "--prompt-ids", "1", "--policy", "arc"],
        vec![
            "run",
            "--model",
            m,
            "--prompt-ids",
            "1",
            "--prefetch",
            "maybe",
        ],
        vec!["run", "--model", m, "--prompt-ids", "1,x"],
        vec!["run", "--model", m, "--prompt-ids", "999999"],
        vec!["run", "--model", m, "--prompt-ids", "1", "--isa", "neon"],
        vec!["run", "--model", m, "--prompt-ids", "1", "--top-p", "0"],
        vec!["run", "--model", m, "--no-such-flag"],
        vec![
            "run",
            "--model",
            m,
            "--prompt-ids",
            "1",
            "--prefix-cache",
            "lots",
        ],
        vec!["run", "--model", m],
    ] {
        one_line_error(&args);
    }
    // The budget error states the minimum.
    let e = stderr(&run(&[
        "run",
        "--model",
        m,
        "--prompt-ids",
        "1",
        "--memory",
        "1KiB",
    ]));
    assert!(e.contains("at least"), "{e}");
    // A prefix cache asked for is part of the minimum.
    let e = one_line_error(&[
        "run",
        "--model",
        m,
        "--prompt-ids",
        "1",
        "--memory",
        "8MiB",
        "--prefix-cache",
        "1TiB",
    ]);
    assert!(e.contains("the prefix cache asked for 1024.00 GiB"), "{e}");
}

#[test]
fn synth_refuses_to_overwrite() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("keep.txt"), "mine").unwrap();
    let o = run(&["synth", d.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        std::fs::read_to_string(d.path().join("keep.txt")).unwrap(),
        "mine"
    );
}

#[test]
fn bench_and_doctor_reject_bad_flags_with_one_line_naming_the_flag() {
    let m = fixture("deepseek_v3-bf16");
    let m = m.to_str().unwrap();
    let missing = std::env::temp_dir().join("sluice-no-such-model-dir");
    for (args, flag) in [
        (
            vec!["bench", "--model", m, "--policies", "s3fifo,arc"],
            "--policies",
        ),
        (
            vec!["bench", "--model", m, "--prefetch", "maybe"],
            "--prefetch",
        ),
        (vec!["bench", "--model", m, "--io", "mmap"], "--io"),
        (
            vec!["bench", "--model", m, "--ladder", "unlimited,12 parsecs"],
            "--ladder",
        ),
        (vec!["bench", "--model", m, "--ladder", "x%"], "--ladder"),
        (
            vec!["bench", "--model", m, "--max-tokens", "1"],
            "--max-tokens",
        ),
        (
            vec!["bench", "--model", missing.to_str().unwrap()],
            "--model",
        ),
        (vec!["doctor", "--depths", "1,0"], "--depths"),
        (vec!["doctor", "--blocks", "1MiB,big"], "--blocks"),
        (vec!["doctor", "--file-size", "1KiB"], "--file-size"),
    ] {
        let e = one_line_error(&args);
        assert!(e.contains(flag), "{args:?}: {e}");
    }
}

#[test]
fn synth_rejects_an_unknown_or_unpackable_experts_format() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("m");
    let out = out.to_str().unwrap();
    for (args, flag) in [
        (
            vec!["synth", out, "--experts-format", "fp8"],
            "--experts-format",
        ),
        (
            vec![
                "synth",
                out,
                "--experts-format",
                "int4",
                "--hidden",
                "48",
                "--heads",
                "4",
            ],
            "--hidden",
        ),
        (vec!["synth", out, "--arch", "deepseek_v5"], "--arch"),
        (
            vec![
                "synth",
                out,
                "--arch",
                "deepseek_v4",
                "--experts-format",
                "int4",
            ],
            "--experts-format",
        ),
    ] {
        let e = one_line_error(&args);
        assert!(e.contains(flag), "{args:?}: {e}");
        assert!(!std::path::Path::new(out).exists(), "{args:?}: wrote {out}");
    }
}

#[test]
fn a_budget_far_below_the_model_streams_the_same_ids_within_its_rss() {
    let m = synthetic().join("m");
    let m = m.to_str().unwrap();
    let args = |memory: &str| {
        vec![
            "run",
            "--model",
            m,
            "--prompt-ids",
            "5,6,7,8,9,10,11,12",
            "--max-tokens",
            "12",
            "--json",
            "--memory",
            memory,
            "--context",
            "256",
            "--threads",
            "2",
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>()
    };
    let full = json(&bin().args(args("unlimited")).output().unwrap());
    let budget: u64 = 48 << 20;
    let small = json(&bin().args(args("48MiB")).output().unwrap());
    assert_eq!(full["ids"], small["ids"]);
    let s = &small["stats"];
    assert!(s["expert_bytes_read"].as_u64().unwrap() > 0);
    assert_eq!(s["memory_budget_bytes"].as_u64().unwrap(), budget);
    let rss = s["peak_rss_bytes"].as_u64().unwrap();
    assert!(
        rss > 0 && rss <= budget + (64 << 20),
        "peak RSS {rss} over budget {budget} + 64 MiB"
    );
    assert!(s["expert_hits"].as_u64().unwrap() <= s["expert_requests"].as_u64().unwrap());

    // Every prefetch setting gives the same ids; `all` reads predictions, `off` none.
    let with = |prefetch: &str| {
        let mut a = args("48MiB");
        a.extend(["--prefetch".to_owned(), prefetch.to_owned()]);
        json(&bin().args(a).output().unwrap())
    };
    let all = with("all");
    let off = with("off");
    assert_eq!(all["ids"], full["ids"]);
    assert_eq!(off["ids"], full["ids"]);
    assert!(all["stats"]["prefetch_reads"].as_u64().unwrap() > 0);
    assert_eq!(off["stats"]["prefetch_reads"].as_u64().unwrap(), 0);
}

#[test]
fn an_interrupted_pack_leaves_the_output_untouched_and_a_rerun_succeeds() {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let src = tmp.path().join("src");
    // ~400 MB of trunk so the copy takes long enough to be killed half-way.
    sluice::tools::synth::SynthSpec {
        vocab: 2048,
        hidden: 1024,
        layers: 32,
        dense_inter: 1024,
        experts: 4,
        top_k: 2,
        moe_inter: 64,
        shared: 4,
        heads: 16,
        q_lora: 512,
        kv_lora: 256,
        nope: 64,
        rope: 32,
        v_head: 64,
        ..Default::default()
    }
    .write(&src)
    .unwrap();
    let out = tmp.path().join("packed");
    let partial = tmp.path().join(".packed.sluice-partial");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["pack", src.to_str().unwrap(), out.to_str().unwrap()])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    let mut killed = false;
    while t0.elapsed() < std::time::Duration::from_secs(60) {
        let written = std::fs::metadata(partial.join("trunk.bin"))
            .map(|m| m.len())
            .unwrap_or(0);
        if written > 32 << 20 {
            child.kill().unwrap();
            killed = true;
            break;
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    child.wait().unwrap();
    assert!(killed, "the pack finished before it could be interrupted");
    assert!(!out.exists(), "an interrupted pack left {}", out.display());
    assert!(partial.exists());
    // A rerun clears the partial directory and completes.
    let o = run(&["pack", src.to_str().unwrap(), out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!partial.exists());
    let v = json(&run(&[
        "run",
        "--model",
        out.to_str().unwrap(),
        "--prompt-ids",
        "1,2",
        "--max-tokens",
        "2",
        "--json",
    ]));
    assert_eq!(v["ids"].as_array().unwrap().len(), 2);
}

#[test]
fn a_trunk_four_times_the_budget_streams_within_its_rss() {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dir = tmp.path().join("m");
    sluice::tools::synth::SynthSpec {
        vocab: 2048,
        hidden: 1024,
        layers: 16,
        first_dense: 1,
        dense_inter: 1024,
        experts: 8,
        top_k: 2,
        moe_inter: 256,
        shared: 4,
        heads: 16,
        q_lora: 512,
        kv_lora: 256,
        nope: 64,
        rope: 32,
        v_head: 64,
        layers_per_shard: 1,
        skew: 0.3,
        seed: 7,
        ..Default::default()
    }
    .write(&dir)
    .unwrap();
    let d = dir.to_str().unwrap();
    let info = json(&run(&["inspect", d, "--json", "--context", "256"]));
    // Unlimited memory: a prefill pass can take the whole context, in calls of 64 rows.
    assert_eq!(info["plan"]["prefill_span"], 256, "{info}");
    assert_eq!(info["plan"]["chunk"], 64, "{info}");
    assert!(info["plan"]["span_bytes_per_token"].as_u64().unwrap() > 0);
    let trunk = info["trunk_bytes"].as_u64().unwrap();
    let budget = info["plan"]["minimum"].as_u64().unwrap() + (8 << 20);
    assert!(
        trunk >= 4 * budget,
        "trunk {trunk} is not 4x the budget {budget}"
    );
    let args = |memory: String| {
        vec![
            "run",
            "--model",
            d,
            "--prompt-ids",
            "5,6,7,8",
            "--max-tokens",
            "6",
            "--json",
            "--context",
            "256",
            "--memory",
        ]
        .into_iter()
        .map(String::from)
        .chain([memory])
        .collect::<Vec<_>>()
    };
    let full = json(&bin().args(args("unlimited".into())).output().unwrap());
    let small = json(&bin().args(args(budget.to_string())).output().unwrap());
    assert_eq!(full["ids"], small["ids"]);
    let s = &small["stats"];
    assert!(s["trunk_bytes_read"].as_u64().unwrap() > trunk, "{s}");
    let rss = s["peak_rss_bytes"].as_u64().unwrap();
    assert!(
        rss <= budget + (64 << 20),
        "peak RSS {rss} over budget {budget} + 64 MiB"
    );
}

#[test]
fn run_defaults_to_the_demo_model_and_chat_reads_stdin() {
    use std::io::Write as _;
    let o = bin()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["run", "It is a truth", "--max-tokens", "8", "--json"])
        .output()
        .unwrap();
    let v = json(&o);
    assert_eq!(v["ids"].as_array().unwrap().len(), 8);
    assert!(v["text"].as_str().unwrap().len() > 8);
    let mut child = bin()
        .args(["chat", "--max-tokens", "6"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"Elizabeth smiled.\nShe left.\n\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    // Two replies, one line each.
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).lines().count(),
        2,
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

#[test]
fn a_thousand_tokens_under_a_small_budget_stay_within_it() {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dir = tmp.path().join("m");
    sluice::tools::synth::SynthSpec {
        skew: 0.3,
        ..Default::default()
    }
    .write(&dir)
    .unwrap();
    let d = dir.to_str().unwrap();
    let info = json(&run(&["inspect", d, "--json", "--context", "1100"]));
    let budget = info["plan"]["minimum"].as_u64().unwrap() + (4 << 20);
    assert!(budget < info["checkpoint_bytes"].as_u64().unwrap() / 2);
    let o = run(&[
        "run",
        "--model",
        d,
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "1000",
        "--ignore-eos",
        "--json",
        "--context",
        "1100",
        "--memory",
        &budget.to_string(),
    ]);
    let v = json(&o);
    assert_eq!(v["ids"].as_array().unwrap().len(), 1000);
    let rss = v["stats"]["peak_rss_bytes"].as_u64().unwrap();
    assert!(
        rss <= budget + (64 << 20),
        "peak RSS {rss} over budget {budget} + 64 MiB"
    );
    // A prompt longer than the planned context: a clear error, not an OOM.
    let o = run(&[
        "run",
        "--model",
        d,
        "--prompt-ids",
        "1,2,3,4,5,6,7,8,9",
        "--max-tokens",
        "10",
        "--context",
        "8",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("context full"), "{}", stderr(&o));
}

/// Issue 18 class 6: `--threads 50000` used to spawn them all. More than 8 × the available
/// cores is refused with the limit stated, by every command that builds an engine.
#[test]
fn too_many_threads_are_refused_with_the_limit() {
    let cores = std::thread::available_parallelism().unwrap().get();
    let limit = (8 * cores).to_string();
    let m = fixture("deepseek_v3-fp32");
    let m = m.to_str().unwrap();
    for cmd in ["run", "batch", "serve", "chat"] {
        let mut args = vec![cmd, "--model", m, "--threads", "50000"];
        if cmd == "run" {
            args.extend(["--prompt-ids", "1,2"]);
        }
        if cmd == "batch" {
            args.extend([
                "--input",
                "/dev/null",
                "--output",
                "/tmp/sluice-threads-never.jsonl",
            ]);
        }
        if cmd == "serve" {
            args.extend(["--port", "0"]);
        }
        let e = one_line_error(&args);
        assert!(e.contains("50000") && e.contains(&limit), "{cmd}: {e}");
    }
    // The limit itself is accepted.
    let v = json(&run(&[
        "run",
        "--model",
        m,
        "--prompt-ids",
        "1,2",
        "--max-tokens",
        "1",
        "--threads",
        &limit,
        "--json",
    ]));
    assert_eq!(v["stats"]["threads"].as_u64(), Some(8 * cores as u64));
}

/// Issue 18 class 10: an empty stop string means the same everywhere (refused: it would end
/// every generation at once; serve already said so, run and batch stopped at once silently),
/// and `--trace` / `--dump-logits` paths are checked before the model loads, not after the
/// generation.
#[test]
fn empty_stops_and_unwritable_outputs_are_refused_up_front() {
    let m = fixture("deepseek_v3-fp32");
    let m = m.to_str().unwrap();
    let e = one_line_error(&["run", "--model", m, "--prompt-ids", "1,2", "--stop", ""]);
    assert!(e.contains("stop"), "{e}");
    let d = tempfile::tempdir().unwrap();
    let input = d.path().join("in.jsonl");
    std::fs::write(
        &input,
        r#"{"id": 1, "prompt": "It is", "stop": [""], "max_tokens": 2}"#,
    )
    .unwrap();
    let out = d.path().join("out.jsonl");
    let o = bin()
        .args(["batch", "--input", input.to_str().unwrap(), "--output"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("line 1: stop: an empty stop string"),
        "{}",
        stderr(&o)
    );
    let missing = d.path().join("no-such-dir/x");
    for flag in ["--trace", "--dump-logits"] {
        for path in [
            missing.to_str().unwrap(),
            "/dev/full",
            d.path().to_str().unwrap(),
        ] {
            let e = one_line_error(&[
                "run",
                "--model",
                m,
                "--prompt-ids",
                "1,2",
                "--max-tokens",
                "2",
                flag,
                path,
            ]);
            assert!(e.starts_with(&format!("error: {flag} {path}")), "{e}");
        }
    }
    assert!(!missing.exists());
}

/// Issue 18 class 9: `run --max-tokens` past the planned context used to generate to the end,
/// then exit 2 and (with `--json`) print nothing. It stops with `length` when the context is
/// full — the last token sampled needs no position — and prints the JSON, as batch and serve
/// decide up front.
#[test]
fn max_tokens_past_the_context_stops_with_length() {
    let m = fixture("deepseek_v3-fp32");
    let v = json(&run(&[
        "run",
        "--model",
        m.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "10",
        "--ignore-eos",
        "--json",
        "--context",
        "8",
    ]));
    assert_eq!(v["finish_reason"], "length", "{v}");
    assert_eq!(v["ids"].as_array().unwrap().len(), 8 - 3 + 1, "{v}");
    // Streaming text (no --json) ends the same way, exit 0.
    let o = run(&[
        "run",
        "--model",
        m.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "10",
        "--context",
        "8",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn doctor_measures_a_scratch_file_and_removes_it() {
    let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    // A quick doctor on a 16 MiB scratch file in `d`, 1 MiB reads.
    let doctor = |extra: &[&str]| {
        let mut args = vec![
            "doctor",
            "--dir",
            d.path().to_str().unwrap(),
            "--file-size",
            "16MiB",
            "--blocks",
            "1MiB",
            "--seconds",
            "0.05",
            "--json",
        ];
        args.extend_from_slice(extra);
        json(&run(&args))
    };
    let v = doctor(&["--depths", "1,2"]);
    let reads = v["reads"].as_array().unwrap();
    // direct from threads, direct through io_uring and buffered, two depths each
    assert_eq!(reads.len(), 6, "{v}");
    assert!(v["uring_error"].is_null(), "{v}");
    let engines = |e: &str| reads.iter().filter(|r| r["engine"] == e).count();
    assert_eq!((engines("threads"), engines("io_uring")), (4, 2), "{v}");
    assert!(
        reads.iter().all(|r| r["gbps"].as_f64().unwrap() > 0.0
            && r["cpu_seconds_per_gb"].as_f64().unwrap() >= 0.0),
        "{v}"
    );
    assert!(v["memory"]["read_gbps_1_thread"].as_f64().unwrap() > 0.0);
    assert!(v["memory"]["auto_budget_bytes"].as_u64().is_some());
    assert!(!v["cpu"]["isas"].as_array().unwrap().is_empty());
    assert!(
        v["cpu"]["fma_gmacs_per_thread"].as_f64().unwrap() > 0.0,
        "{v}"
    );
    assert_eq!(
        std::fs::read_dir(d.path()).unwrap().count(),
        0,
        "scratch file left behind"
    );
    // Without io_uring: the threads' rows only.
    let v = doctor(&["--depths", "2", "--no-uring", "--no-buffered"]);
    let reads = v["reads"].as_array().unwrap();
    assert_eq!(reads.len(), 1, "{v}");
    assert_eq!(reads[0]["engine"], "threads", "{v}");
}

#[test]
fn bench_runs_a_ladder_in_child_processes_with_identical_output() {
    let m = synthetic().join("m");
    let v = json(&run(&[
        "bench",
        "--model",
        m.to_str().unwrap(),
        "--ladder",
        "below-trunk,unlimited",
        "--policies",
        "s3fifo",
        "--prefetch",
        "on",
        "--prompt-tokens",
        "6",
        "--max-tokens",
        "3",
        "--prefill-chunk",
        "4",
        "--disk-seconds",
        "0.1",
        "--threads",
        "1",
        "--json",
    ]));
    assert_eq!(v["identical_output"], true, "{v}");
    let runs = v["runs"].as_array().unwrap();
    // The unlimited rung runs cold and warm.
    assert_eq!(runs.len(), 3, "{v}");
    assert_eq!(runs[0]["trunk"], "tiered");
    for r in runs {
        assert_eq!(r["ids"].as_array().unwrap().len(), 3);
        assert!(r["peak_rss_bytes"].as_u64().unwrap() > 0);
        let b = r["belady_hit_rate"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&b));
        // One layer-major pass over the whole prompt (6 tokens, calls of 4 rows): every expert
        // it routed to is read once (a warm run reads none).
        assert_eq!(r["prefill_spans"], 1, "{r}");
        if r["warm"] == false {
            let ratio = r["prefill_read_over_touched"].as_f64().unwrap();
            assert!((0.5..=1.10).contains(&ratio), "{r}");
        } else {
            assert!(r["prefill_read_over_touched"].is_null(), "{r}");
        }
    }
    // Under the tiered budget every trunk layer streams each token.
    assert!(runs[0]["decode_trunk_bytes_per_token"].as_f64().unwrap() > 0.0);
}

/// Issue 26: `sluice bench` states the memory-bandwidth ceiling of decoding in RAM — the weight
/// bytes a step reads, the bandwidth measured in the same run — and the fraction of it each run
/// reached, where every weight is in memory (not at a rung where weights stream).
#[test]
fn bench_states_the_ram_ceiling() {
    let demo = demo_model();
    let o = run(&[
        "bench",
        "--model",
        demo.to_str().unwrap(),
        "--ladder",
        "unlimited,14MiB",
        "--policies",
        "lfu",
        "--prefetch",
        "on",
        "--prompt-tokens",
        "8",
        "--max-tokens",
        "4",
        "--disk-seconds",
        "0.2",
        "--json",
    ]);
    let v = json(&o);
    let inspect = json(&run(&["inspect", demo.to_str().unwrap(), "--json"]));
    let touched = v["decode_touched_bytes_per_token"].as_u64().unwrap();
    assert_eq!(
        touched,
        inspect["decode_touched_bytes_per_token"].as_u64().unwrap()
    );
    // The trunk but the embedding table, plus top-2 experts in each of the 5 MoE layers.
    let experts = inspect["expert_bytes_per_token"].as_u64().unwrap();
    let trunk = inspect["trunk_bytes"].as_u64().unwrap();
    assert!(touched > experts && touched < trunk + experts, "{touched}");
    let gbps = v["memory_gbps"].as_f64().unwrap();
    assert!(gbps > 0.0);
    let ceiling = v["ram_ceiling_s_per_token"].as_f64().unwrap();
    assert!((ceiling - touched as f64 / (gbps * 1e9)).abs() <= 1e-12 + ceiling * 1e-9);
    let runs = v["runs"].as_array().unwrap();
    // Unlimited cold and warm, then the streaming rung.
    let labels: Vec<&str> = runs.iter().map(|r| r["rung"].as_str().unwrap()).collect();
    assert_eq!(labels, ["unlimited", "unlimited (warm)", "14MiB"], "{v}");
    // Only the warm run decodes from memory alone: it reads no expert, and it alone is set
    // against the ceiling.
    for r in runs {
        let warm = r["warm"].as_bool().unwrap();
        assert_eq!(r["ram_ceiling_fraction"].is_null(), !warm, "{r}");
        let phases = &r["decode_phases_s_per_token"];
        for p in ["attention", "experts", "head", "other", "sampling"] {
            assert!(phases[p].as_f64().unwrap() > 0.0, "{p}: {r}");
        }
    }
    assert_eq!(runs[1]["decode_expert_bytes_per_token"].as_f64(), Some(0.0));
    assert!(runs[1]["ram_ceiling_fraction"].as_f64().unwrap() > 0.0);
}

#[test]
fn run_json_can_carry_each_tokens_logprobs() {
    let demo = demo_model();
    let go = |extra: &[&str]| {
        let mut a = vec!["--max-tokens", "5", "--temperature", "0"];
        a.extend_from_slice(extra);
        a.push("It is a truth");
        run_demo_json(&a)
    };
    let plain = go(&[]);
    assert!(plain.get("logprobs").is_none());
    let v = go(&["--logprobs", "3"]);
    assert_eq!(
        v["ids"], plain["ids"],
        "asking for log-probabilities changes no token"
    );
    let lp = v["logprobs"].as_array().unwrap();
    assert_eq!(lp.len(), v["ids"].as_array().unwrap().len());
    for (e, id) in lp.iter().zip(v["ids"].as_array().unwrap()) {
        assert_eq!(&e["id"], id);
        let top = e["top"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely.
        assert_eq!(top[0]["id"], e["id"]);
        assert_eq!(top[0]["logprob"], e["logprob"]);
    }
    let err = one_line_error(&[
        "run",
        "--model",
        demo.to_str().unwrap(),
        "--json",
        "--logprobs",
        "21",
        "x",
    ]);
    assert!(err.contains("logprobs"), "{err}");
}

#[test]
fn run_follows_a_json_schema_or_a_grammar_at_any_budget_and_refuses_bad_files() {
    let demo = demo_model();
    let dir = tempfile::tempdir().unwrap();
    let schema = dir.path().join("schema.json");
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"mood": {"enum": ["happy", "sad"]},
            "age": {"type": "integer", "minimum": 1, "maximum": 99},
            "friends": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2}},
            "required": ["mood", "age", "friends"], "additionalProperties": false}"#,
    )
    .unwrap();
    let lark = dir.path().join("answer.lark");
    std::fs::write(
        &lark,
        "start: \"The answer is \" ANSWER \".\"\nANSWER: \"yes\" | \"no\" | /[0-9]{1,3}/\n",
    )
    .unwrap();
    let go = |extra: &[&str]| {
        let mut a = vec!["--max-tokens", "80", "--temperature", "0.8", "--seed", "3"];
        a.extend_from_slice(extra);
        a.push("It is a truth universally acknowledged");
        run_demo_json(&a)
    };
    let s = schema.to_str().unwrap();
    let v = go(&["--json-schema", s]);
    assert_eq!(v["finish_reason"], "eos", "{v}");
    let out: serde_json::Value = serde_json::from_str(v["text"].as_str().unwrap()).unwrap();
    assert!(
        ["happy", "sad"].contains(&out["mood"].as_str().unwrap()),
        "{out}"
    );
    assert!((1..=99).contains(&out["age"].as_i64().unwrap()), "{out}");
    assert!(out["friends"].as_array().unwrap().len() <= 2, "{out}");
    assert_eq!(out.as_object().unwrap().len(), 3, "{out}");
    // A budget that streams the experts: the same ids.
    let small = go(&["--json-schema", s, "--memory", "24MiB"]);
    assert_eq!(small["ids"], v["ids"]);
    assert!(small["stats"]["expert_evictions"].as_u64().unwrap() > 0);
    let g = go(&["--grammar", lark.to_str().unwrap()]);
    let text = g["text"].as_str().unwrap();
    assert!(
        text.starts_with("The answer is ") && text.ends_with('.'),
        "{text}"
    );
    assert_eq!(g["finish_reason"], "eos");
    // Bad files: one line naming the flag and the file.
    let missing = dir.path().join("missing.json");
    let not_json = dir.path().join("x.json");
    std::fs::write(&not_json, "{oops").unwrap();
    let bad_schema = dir.path().join("bad.json");
    std::fs::write(&bad_schema, r#"{"type": "no-such-type"}"#).unwrap();
    let bad_lark = dir.path().join("bad.lark");
    std::fs::write(&bad_lark, "start: undefined_rule\n").unwrap();
    for (flag, p, says) in [
        ("--json-schema", &missing, "missing.json"),
        ("--json-schema", &not_json, "not JSON"),
        ("--json-schema", &bad_schema, "json_schema"),
        ("--grammar", &bad_lark, "grammar"),
    ] {
        let e = one_line_error(&[
            "run",
            "--model",
            demo.to_str().unwrap(),
            flag,
            p.to_str().unwrap(),
            "x",
        ]);
        assert!(e.contains(flag) && e.contains(says), "{e}");
    }
}

#[test]
fn draft_ngram_changes_no_token_and_counts_its_drafts() {
    let demo = demo_model();
    let go = |extra: &[&str]| {
        let mut a = vec![
            "--raw",
            "--max-tokens",
            "64",
            "--temperature",
            "0",
            "--memory",
            "17MiB",
        ];
        a.extend_from_slice(extra);
        a.push("<|user|>\nTell me of Elizabeth.\n<|assistant|>\n");
        run_demo_json(&a)
    };
    let off = go(&[]);
    assert_eq!(off["stats"]["draft_proposed"], 0);
    // Adaptive drafts depend on how fast passes run here, so only the fixed length's counts
    // are known to be non-zero.
    let adaptive = go(&["--draft", "ngram"]);
    assert_eq!(adaptive["ids"], off["ids"]);
    let fixed = go(&["--draft", "ngram", "--draft-tokens", "5"]);
    assert_eq!(fixed["ids"], off["ids"]);
    let p = fixed["stats"]["draft_proposed"].as_u64().unwrap();
    let a = fixed["stats"]["draft_accepted"].as_u64().unwrap();
    assert!(p > 0 && a > 0 && a < p, "{a} of {p}");
    // The demo model's own MTP layer (trained, `tools/demo-model/train_mtp.py`): the same ids,
    // and some of its drafts kept.
    let mtp = go(&["--draft", "mtp", "--draft-tokens", "2"]);
    assert_eq!(mtp["ids"], off["ids"]);
    let p = mtp["stats"]["draft_proposed"].as_u64().unwrap();
    let a = mtp["stats"]["draft_accepted"].as_u64().unwrap();
    assert!(p > 0 && a > 0 && a <= p, "{a} of {p}");
    // A checkpoint without an MTP layer.
    let plain = fixture("deepseek_v3-fp32");
    let e = one_line_error(&[
        "run",
        "--model",
        plain.to_str().unwrap(),
        "--draft",
        "mtp",
        "--prompt-ids",
        "1,2,3",
    ]);
    assert!(e.contains("no multi-token-prediction"), "{e}");
    for (args, says) in [
        (
            &["--draft-tokens", "3"][..],
            "--draft-tokens needs --draft ngram",
        ),
        (
            &["--draft", "ngram", "--draft-tokens", "0"],
            "--draft-tokens 0",
        ),
        (&["--draft", "sometimes"], "--draft"),
    ] {
        let mut a = vec!["run", "--model", demo.to_str().unwrap()];
        a.extend_from_slice(args);
        a.push("x");
        let e = one_line_error(&a);
        assert!(e.contains(says), "{e}");
    }
}

/// `--draft mtp` loads the checkpoint's MTP layer and drafts with it: the same ids as
/// without, and drafts proposed (the Qwen3-Next fixture with an MTP layer).
#[test]
fn run_drafts_with_the_mtp_layer() {
    let m = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/mtp/qwen3_next-fp32");
    let m = m.to_str().unwrap();
    let go = |extra: &[&str]| {
        let mut a = vec!["run", "--model", m, "--max-tokens", "16", "--json"];
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--prompt-ids", "5,9,33,5,9,33,5,9"]);
        json(&run(&a))
    };
    let off = go(&[]);
    assert_eq!(off["ids"].as_array().unwrap().len(), 16, "{off}");
    for extra in [
        &["--draft", "mtp"][..],
        &["--draft", "mtp", "--draft-tokens", "2"],
    ] {
        let v = go(extra);
        assert_eq!(v["ids"], off["ids"], "{extra:?}");
        assert!(v["stats"]["draft_proposed"].as_u64().unwrap() > 0, "{v}");
    }
    let v = json(&run(&["inspect", m, "--json"]));
    assert_eq!(v["mtp_drafts"], true, "{v}");
}

#[test]
fn run_session_resumes_and_refuses_what_is_not_its_own() {
    let demo = demo_model();
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("talk.sluice");
    let go = |prompt: &str, session: bool| {
        let mut a = vec!["--raw", "--max-tokens", "12", "--temperature", "0"];
        if session {
            a.extend_from_slice(&["--session", file.to_str().unwrap()]);
        }
        a.push(prompt);
        run_demo_json(&a)
    };
    let p1 = "It is a truth universally acknowledged";
    let first = go(p1, true);
    assert!(file.is_file());
    let whole = format!("{p1}{} And so", first["text"].as_str().unwrap());
    let resumed = go(&whole, true);
    let cold = go(&whole, false);
    // The same text as a cold run of the whole context, computing only what is new.
    assert_eq!(resumed["ids"], cold["ids"]);
    let (r, c) = (
        resumed["stats"]["prefill_tokens"].as_u64().unwrap(),
        cold["stats"]["prefill_tokens"].as_u64().unwrap(),
    );
    assert!(r < c / 2, "resumed prefilled {r} of {c}");
    // A file that is not a session is refused, left as it was, and nothing is generated.
    let notes = d.path().join("notes.txt");
    std::fs::write(&notes, "my notes").unwrap();
    let e = one_line_error(&[
        "run",
        "--model",
        demo.to_str().unwrap(),
        "--session",
        notes.to_str().unwrap(),
        "x",
    ]);
    assert!(
        e.contains("notes.txt") && e.contains("not a sluice session file"),
        "{e}"
    );
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "my notes");
    // Another model's session: refused.
    let e = one_line_error(&[
        "run",
        "--model",
        fixture("qwen3-fp32").to_str().unwrap(),
        "--session",
        file.to_str().unwrap(),
        "--prompt-ids",
        "1,2",
    ]);
    assert!(e.contains("another model"), "{e}");
}

#[test]
fn chat_session_resumes_a_conversation_as_if_never_stopped() {
    use std::io::Write as _;
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("chat.sluice");
    let chat = |input: &[u8], session: bool| {
        let mut args = vec!["chat", "--max-tokens", "8", "--temperature", "0"];
        if session {
            args.extend_from_slice(&["--session", file.to_str().unwrap()]);
        }
        let mut child = bin()
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(&args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        (String::from_utf8_lossy(&o.stdout).into_owned(), stderr(&o))
    };
    let (whole, _) = chat(b"Elizabeth smiled.\nShe left.\n\n", false);
    let (first, _) = chat(b"Elizabeth smiled.\n\n", true);
    let (second, err) = chat(b"She left.\n\n", true);
    assert!(err.contains("resumed"), "{err}");
    // The two sessions' replies are the uninterrupted chat's.
    assert_eq!(format!("{first}{second}"), whole);
}

/// `sluice inspect` shows the prefix cache's share: the default, one asked for (which comes out
/// of the trunk's room, not the KV cache's), or none.
#[test]
fn inspect_shows_the_prefix_cache_share() {
    let m = demo_model();
    let share = |extra: &[&str]| {
        let mut args = vec![
            "inspect",
            m.to_str().unwrap(),
            "--memory",
            "20MiB",
            "--json",
        ];
        args.extend_from_slice(extra);
        let v = json(&run(&args));
        (
            v["plan"]["prefix_cache"].as_u64().unwrap(),
            v["plan"]["context_fit"].as_u64().unwrap(),
        )
    };
    let (default, fit) = share(&[]);
    assert!(default > 0 && default <= (20 << 20) / 16, "{default}");
    assert_eq!(share(&["--prefix-cache", "2MiB"]), (2 << 20, fit));
    assert_eq!(share(&["--prefix-cache", "off"]).0, 0);
    one_line_error(&["inspect", m.to_str().unwrap(), "--prefix-cache", "lots"]);
}

/// The minimum `sluice inspect` prints is a budget that runs, to the byte: one byte less is
/// refused (the rounded MiB figure alone was 34 KiB short on the demo model).
#[test]
fn inspect_prints_the_minimum_budget_to_the_byte() {
    let m = demo_model();
    let o = run(&["inspect", m.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("minimum budget"))
        .unwrap_or_else(|| panic!("no minimum in {out}"));
    let bytes: u64 = line
        .split("--memory ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no byte count in {line:?}"));
    let at = run(&[
        "run",
        "--model",
        m.to_str().unwrap(),
        "--memory",
        &bytes.to_string(),
        "--max-tokens",
        "2",
        "Hello",
    ]);
    assert!(at.status.success(), "{}", stderr(&at));
    let e = one_line_error(&[
        "run",
        "--model",
        m.to_str().unwrap(),
        "--memory",
        &(bytes - 1).to_string(),
        "Hello",
    ]);
    assert!(e.contains("too small"), "{e}");
}

/// `sluice inspect` explains DeepSeek-V4's state: the window, the compressed layers of each
/// kind, the hash-routed layers, and the MTP layer the checkpoint carries.
#[test]
fn inspect_explains_compressed_attention_and_hash_routing() {
    let m = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models/deepseek_v4-fp32");
    let m = m.to_str().unwrap();
    let v = json(&run(&["inspect", m, "--json"]));
    let c = &v["compressed_attention"];
    assert_eq!(
        (
            c["window"].as_u64(),
            c["sliding_layers"].as_u64(),
            c["heavy_layers"].as_u64(),
            c["heavy_rate"].as_u64(),
            c["sparse_layers"].as_u64(),
            c["sparse_rate"].as_u64(),
            c["sparse_top_k"].as_u64()
        ),
        (
            Some(8),
            Some(1),
            Some(2),
            Some(8),
            Some(2),
            Some(4),
            Some(3)
        )
    );
    assert_eq!(v["hash_routed_layers"].as_u64(), Some(2));
    assert_eq!(v["attention"].as_str(), Some("hca+csa+swa"));
    let o = run(&["inspect", m]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("compressed attn   a window of 8 positions"),
        "{text}"
    );
    assert!(text.contains("hash routing      2 layers"), "{text}");
    assert_eq!(v["mtp_layers"].as_u64(), Some(1));
    assert_eq!(v["mtp_drafts"], true, "DeepSeek-V4's MTP layer drafts");
    assert!(
        text.contains("--draft mtp runs the first"),
        "inspect says the layer drafts: {text}"
    );
    let mtp = v["mtp_bytes"].as_u64().unwrap();
    let (ck, trunk, experts) = (
        v["checkpoint_bytes"].as_u64().unwrap(),
        v["trunk_bytes"].as_u64().unwrap(),
        v["expert_bytes"].as_u64().unwrap(),
    );
    assert_eq!(
        ck,
        trunk + experts + mtp,
        "the MTP layer is the rest of the checkpoint"
    );
    assert!(text.contains("MTP layers        1 ("), "{text}");
    // A model without them says nothing of them.
    let plain = fixture("deepseek_v3-fp32");
    let plain = plain.to_str().unwrap();
    let v = json(&run(&["inspect", plain, "--json"]));
    assert!(v["compressed_attention"].is_null());
    assert_eq!(v["hash_routed_layers"].as_u64(), Some(0));
    assert_eq!(v["mtp_layers"].as_u64(), Some(0));
    assert!(!String::from_utf8_lossy(&run(&["inspect", plain]).stdout).contains("MTP"));
    // The demo model's trained MTP layer (DeepSeek-V3's kind) runs.
    let demo = json(&run(&["inspect", demo_model().to_str().unwrap(), "--json"]));
    assert_eq!(demo["mtp_layers"].as_u64(), Some(1));
    assert_eq!(demo["mtp_drafts"], true, "{demo}");
}

/// DeepSeek-V4's hash-routed layers (0 and 1 in the fixture) are prefetched from the tokens
/// alone, so every expert they route to was predicted; the ids are those of an unlimited run.
#[test]
fn hash_routed_layers_are_prefetched_exactly() {
    let m = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models/deepseek_v4-fp32");
    let go = |memory: &str| {
        json(&run(&[
            "run",
            "--model",
            m.to_str().unwrap(),
            "--prompt-ids",
            "1,2,3,4,5,6,7,8,9,10,11,12",
            "--max-tokens",
            "16",
            "--prefetch",
            "all",
            "--memory",
            memory,
            "--json",
        ]))
    };
    let (cold, free) = (go("4MiB"), go("unlimited"));
    assert_eq!(cold["ids"], free["ids"]);
    let s = &cold["stats"];
    assert_eq!(s["prefetch_recall_hash_routed"].as_f64(), Some(1.0), "{s}");
    let by_layer = s["prefetch_recall_by_layer"].as_array().unwrap();
    assert_eq!(by_layer[0].as_f64(), Some(1.0), "{s}");
    assert_eq!(by_layer[1].as_f64(), Some(1.0), "{s}");
    // Learned layers are predicted, not known.
    assert!(s["prefetch_recall"].as_f64().unwrap() < 1.0, "{s}");
    // With every expert in memory nothing is prefetched, so nothing is checked.
    assert!(free["stats"]["prefetch_recall_hash_routed"].is_null());
}

/// Lookahead on a trained router (the demo model's): the late guess, from the output of the
/// layer before plus the token before's attention, recalls at least 77% of the experts the
/// router then picks (83% when written), at least as many as the mid guess and that more than the early
/// one; and reading every guess changes no output bit.
#[test]
fn lookahead_recalls_most_of_a_trained_routers_experts() {
    let m = demo_model();
    let go = |prefetch: &str| {
        json(&run(&[
            "run",
            "--model",
            m.to_str().unwrap(),
            "--memory",
            "16MiB",
            "--prefetch",
            prefetch,
            "--max-tokens",
            "64",
            "--json",
            "It is a truth universally acknowledged",
        ]))
    };
    let (all, off) = (go("all"), go("off"));
    assert_eq!(all["ids"], off["ids"]);
    let s = &all["stats"];
    let (late, early) = (
        s["prefetch_recall"].as_f64().unwrap(),
        s["prefetch_recall_early"].as_f64().unwrap(),
    );
    assert!(late >= 0.77 && late > early && early > 0.0, "{s}");
    // The mid guess, made while a layer waits for its reads from what its experts computed
    // so far, knows more than the early one (79% against 63% when written).
    let mid = s["prefetch_recall_mid"].as_f64().unwrap();
    assert!(mid > early && mid <= late, "{s}");
    assert!(s["prefetch_reads"].as_u64().unwrap() > 0, "{s}");
    assert_eq!(off["stats"]["prefetch_reads"].as_u64(), Some(0));
}

/// `sluice inspect` names LongCat-Flash's zero-compute experts beside the routed ones.
#[test]
fn inspect_names_zero_compute_experts() {
    let m = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models/longcat_flash-fp32");
    let m = m.to_str().unwrap();
    let v = json(&run(&["inspect", m, "--json"]));
    let zero = v["zero_experts"].as_u64().unwrap();
    assert!(zero > 0, "{v}");
    let text = String::from_utf8_lossy(&run(&["inspect", m]).stdout).into_owned();
    assert!(text.contains(&format!("(+{zero} zero-compute")), "{text}");
    let demo = json(&run(&["inspect", demo_model().to_str().unwrap(), "--json"]));
    assert_eq!(demo["zero_experts"].as_u64(), Some(0));
}

/// `--io uring` streams the experts through an io_uring, says so in the stats, and gives the
/// ids the reader threads give; a mode it does not know is refused naming the flag.
#[test]
fn io_uring_reads_give_the_same_ids() {
    let m = synthetic().join("m");
    let go = |io: &str| {
        json(&run(&[
            "run",
            "--model",
            m.to_str().unwrap(),
            "--prompt-ids",
            "5,9,300,41,7",
            "--max-tokens",
            "12",
            "--memory",
            "64MiB",
            "--io",
            io,
            "--json",
        ]))
    };
    let threads = go("direct");
    let ring = go("uring");
    assert_eq!(threads["stats"]["io_mode"], "direct", "{threads}");
    assert_eq!(ring["stats"]["io_mode"], "io_uring", "{ring}");
    assert!(
        ring["stats"]["expert_bytes_read"].as_u64().unwrap() > 0,
        "{ring}"
    );
    assert_eq!(threads["ids"], ring["ids"]);
    let o = run(&[
        "run",
        "--model",
        m.to_str().unwrap(),
        "--prompt-ids",
        "1",
        "--io",
        "ring",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("--io") && e.lines().count() == 1, "{e}");
}
