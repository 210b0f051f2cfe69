//! `sluice batch`: JSONL in, JSONL out in input order, bad lines reported and skipped, and a
//! rerun resumes where an interrupted job stopped.

use std::path::Path;
use std::process::{Command, Output};

mod common;
use common::{demo, solo};
use serde_json::{Value, json};

fn batch(input: &Path, output: &Path) -> Output {
    batch_on(&demo(), input, output, &[])
}

fn batch_on(model: &Path, input: &Path, output: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["batch", "--model"])
        .arg(model)
        .args(extra)
        .arg("--input")
        .arg(input)
        .arg("--output")
        .arg(output)
        .args(["--batch-size", "3", "--threads", "2"])
        .output()
        .unwrap()
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn results_in_input_order_bad_lines_skipped_and_a_rerun_resumes() {
    let d = tempfile::tempdir().unwrap();
    let input = d.path().join("in.jsonl");
    let output = d.path().join("out.jsonl");
    std::fs::write(
        &input,
        [
            r#"{"id": "a", "prompt": "It is a truth", "max_tokens": 12, "temperature": 0}"#,
            r#"{"id": "b", "prompt": "The weather", "max_tokens": 30, "temperature": 0}"#,
            r#"{"id": "c", "prompt": oops}"#,
            r#"{"id": 4, "prompt": "In the morning", "max_tokens": 5, "temperature": 0.8, "seed": 3}"#,
            r#"{"id": "e", "prompt": "x", "colour": "red"}"#,
            r#"{"id": "a", "prompt": "again"}"#,
            r#"{"id": "f", "prompt": "Mr. Darcy", "max_tokens": 9, "temperature": 0}"#,
        ]
        .join("\n"),
    )
    .unwrap();
    let o = batch(&input, &output);
    let err = String::from_utf8_lossy(&o.stderr);
    // Bad lines are named by number; the job still runs every good one, then exits 2.
    assert_eq!(o.status.code(), Some(2), "{err}");
    for n in ["line 3:", "line 5:", "line 6:"] {
        assert!(err.contains(n), "{n} not reported: {err}");
    }
    assert!(err.contains("colour"), "{err}");
    let first = lines(&output);
    let ids: Vec<String> = first.iter().map(|v| v["id"].to_string()).collect();
    assert_eq!(ids, [r#""a""#, r#""b""#, "4", r#""f""#]);
    for v in &first {
        assert!(v["completion_tokens"].as_u64().unwrap() > 0, "{v}");
        assert!(v["prompt_tokens"].as_u64().unwrap() > 0, "{v}");
        assert!(v["decode_seconds"].as_f64().is_some(), "{v}");
    }
    assert_eq!(first[0]["completion_tokens"], 12);
    assert_eq!(first[2]["completion_tokens"], 5);
    // What a sequence decoded beside others is what it decodes alone.
    assert_eq!(first[0]["text"], solo(&demo(), "It is a truth", 12));
    assert_eq!(first[1]["text"], solo(&demo(), "The weather", 30));
    assert_eq!(first[3]["text"], solo(&demo(), "Mr. Darcy", 9));

    // An interrupted job: only "a" and "f" made it to the file.
    std::fs::write(
        &output,
        format!("{}\n{}\n", first[3], first[0]), // any order
    )
    .unwrap();
    let o = batch(&input, &output);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("2 ids already done"), "{err}");
    assert!(err.contains("2 sequences"), "{err}");
    let second = lines(&output);
    let key = |v: &Vec<Value>| -> Vec<String> {
        v.iter()
            .map(|l| {
                format!(
                    "{} {} {} {}",
                    l["id"], l["text"], l["completion_tokens"], l["finish_reason"]
                )
            })
            .collect()
    };
    assert_eq!(
        key(&second),
        key(&first),
        "the resumed job gives the same results"
    );
    // The two kept lines are kept as they were, timings included.
    assert_eq!(second[0], first[0]);
    assert_eq!(second[3], first[3]);

    // Nothing left to do: a third run changes nothing.
    let before = std::fs::read(&output).unwrap();
    let o = batch(&input, &output);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("4 ids already done"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(std::fs::read(&output).unwrap(), before);
}

/// A GGUF file (the demo converted by llama.cpp, Q4_K_M) under a budget that streams from it:
/// each job's text is what a solo `run` of the file gives.
#[test]
fn batch_takes_a_gguf_file_streaming_from_it() {
    let gguf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/gguf_converted/demo-q4_k_m.gguf");
    let d = tempfile::tempdir().unwrap();
    let input = d.path().join("in.jsonl");
    let output = d.path().join("out.jsonl");
    let prompts = [
        "It is a truth",
        "The weather",
        "In the morning",
        "Mr. Darcy",
    ];
    let jobs: Vec<String> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| json!({"id": i, "prompt": p, "max_tokens": 14, "temperature": 0}).to_string())
        .collect();
    std::fs::write(&input, jobs.join("\n")).unwrap();
    let o = batch_on(&gguf, &input, &output, &["--memory", "16MiB"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got = lines(&output);
    assert_eq!(got.len(), prompts.len());
    for (v, p) in got.iter().zip(prompts) {
        assert_eq!(v["completion_tokens"], 14, "{v}");
        assert_eq!(v["text"], solo(&gguf, p, 14), "{p}");
    }
}

#[test]
fn a_missing_input_is_a_clear_error_and_creates_nothing() {
    let d = tempfile::tempdir().unwrap();
    let output = d.path().join("out.jsonl");
    let o = batch(&d.path().join("nope.jsonl"), &output);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("nope.jsonl"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!output.exists());
}

#[test]
fn a_zero_batch_size_is_refused_by_name() {
    let d = tempfile::tempdir().unwrap();
    let input = d.path().join("in.jsonl");
    std::fs::write(&input, r#"{"id": 1, "prompt": "x"}"#).unwrap();
    let output = d.path().join("out.jsonl");
    let o = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["batch", "--model"])
        .arg(demo())
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .args(["--batch-size", "0"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--batch-size"), "{err}");
    assert!(!output.exists());
}

fn ids(path: &Path) -> Vec<String> {
    lines(path).iter().map(|v| v["id"].to_string()).collect()
}

/// Issue 18 class 4: a result used to be written in many `write()` calls, so an interruption
/// could leave a torn last line; the next run glued the redone result onto it, lost that id
/// and exited 0. A torn last line (here cut inside a UTF-8 sequence, and cut inside the JSON)
/// is now dropped and its id redone.
#[test]
fn a_torn_last_line_is_dropped_and_redone() {
    let d = tempfile::tempdir().unwrap();
    let input = d.path().join("in.jsonl");
    let output = d.path().join("out.jsonl");
    std::fs::write(
        &input,
        concat!(
            r#"{"id": "a", "prompt": "It is a truth", "max_tokens": 6, "temperature": 0}"#,
            "\n",
            r#"{"id": "b", "prompt": "The weather", "max_tokens": 6, "temperature": 0}"#,
            "\n"
        ),
    )
    .unwrap();
    let o = batch(&input, &output);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let full = lines(&output);
    for torn in [
        "{\"id\":\"b\",\"text\":\"caf\u{e9}".as_bytes(),
        b"{\"id\":\"b\",\"text\":\"caf\xc3".as_slice(),
        b"{\"id\":\"b\",\"te".as_slice(),
    ] {
        let mut bytes = format!("{}\n", full[0]).into_bytes();
        bytes.extend_from_slice(torn);
        std::fs::write(&output, &bytes).unwrap();
        let o = batch(&input, &output);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        assert!(err.contains("torn last line"), "{err}");
        let now = lines(&output);
        assert_eq!(now.len(), 2, "after a torn {torn:?}");
        assert_eq!(now[0], full[0], "the kept line is kept as it was");
        for k in ["id", "text", "completion_tokens", "finish_reason"] {
            assert_eq!(now[1][k], full[1][k], "after a torn {torn:?}");
        }
    }
}

/// Issue 18 class 4: `--output` naming the input — by path, through a symlink or a hard link —
/// is refused before anything is written; the jobs file is unchanged.
#[test]
fn the_output_may_not_be_the_input() {
    let d = tempfile::tempdir().unwrap();
    let input = d.path().join("in.jsonl");
    let jobs = r#"{"id": "a", "prompt": "It is a truth", "max_tokens": 3, "temperature": 0}"#;
    std::fs::write(&input, jobs).unwrap();
    std::os::unix::fs::symlink(&input, d.path().join("sym.jsonl")).unwrap();
    std::fs::hard_link(&input, d.path().join("hard.jsonl")).unwrap();
    for out in ["in.jsonl", "sym.jsonl", "hard.jsonl"] {
        let o = batch(&input, &d.path().join(out));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{out}: {err}");
        assert!(err.contains("same file as --input"), "{out}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert_eq!(std::fs::read_to_string(&input).unwrap(), jobs, "{out}");
    }
}

/// Issue 18 class 4: a line of invalid UTF-8 used to abort the whole job; it is a bad line
/// like any other (named by number, skipped, exit 2), as is a line over the length cap.
#[test]
fn invalid_utf8_and_overlong_lines_are_bad_lines() {
    let d = tempfile::tempdir().unwrap();
    let input = d.path().join("in.jsonl");
    let output = d.path().join("out.jsonl");
    let mut bytes =
        br#"{"id": "a", "prompt": "It is a truth", "max_tokens": 3, "temperature": 0}"#.to_vec();
    bytes.extend_from_slice(b"\n{\"id\": \"b\", \"prompt\": \"caf\xe9\"}\n");
    bytes.extend_from_slice(b"{\"id\": \"c\", \"prompt\": \"");
    bytes.resize(bytes.len() + (17 << 20), b'x');
    bytes.extend_from_slice(b"\"}\n");
    bytes.extend_from_slice(
        br#"{"id": "d", "prompt": "The weather", "max_tokens": 3, "temperature": 0}"#,
    );
    std::fs::write(&input, &bytes).unwrap();
    let o = batch(&input, &output);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("line 2: not valid UTF-8"), "{err}");
    assert!(
        err.contains("line 3: ") && err.contains("longer than"),
        "{err}"
    );
    assert_eq!(ids(&output), [r#""a""#, r#""d""#]);
}

/// Issue 18 class 4: an output that cannot be written used to be found after the whole job;
/// it is now refused (exit 2) before the engine loads or anything is generated.
#[test]
fn an_unwritable_output_is_found_before_generating() {
    let d = tempfile::tempdir().unwrap();
    let input = d.path().join("in.jsonl");
    std::fs::write(
        &input,
        r#"{"id": "a", "prompt": "It is a truth", "max_tokens": 3, "temperature": 0}"#,
    )
    .unwrap();
    for out in [
        d.path().join("missing-dir/out.jsonl"),
        d.path().to_path_buf(),
        "/dev/full".into(),
    ] {
        let o = batch(&input, &out);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{}: {err}", out.display());
        assert!(err.starts_with("error: --output"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

/// Issue 18 class 5: a 10 MB batch line under `--memory 20MiB` used to be tokenized whole
/// (2.2 GB peak RSS) before the context check refused it. A prompt whose byte length cannot fit
/// the context is now refused before tokenizing — here under a 1 GiB address-space limit
/// (`ulimit -v`), which the old path could not stay inside.
#[test]
fn a_prompt_too_long_for_the_context_is_refused_before_tokenizing() {
    let d = tempfile::tempdir().unwrap();
    let input = d.path().join("in.jsonl");
    let output = d.path().join("out.jsonl");
    let big = json!({"id": "big", "prompt": "It is a truth ".repeat(700_000), "max_tokens": 2});
    let ok = json!({"id": "ok", "prompt": "It is a truth", "max_tokens": 2, "temperature": 0});
    std::fs::write(&input, format!("{big}\n{ok}\n")).unwrap();
    let o = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 1048576; exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_sluice"))
        .args(["batch", "--model"])
        .arg(demo())
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .args(["--memory", "20MiB", "--batch-size", "1", "--threads", "2"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("line 1: a prompt of 9800000 bytes cannot fit the context"),
        "{err}"
    );
    assert_eq!(ids(&output), [r#""ok""#]);
}

/// Presence and frequency penalties (OpenAI's, as the server takes them) in `run`'s flags and in
/// batch lines: the same penalised sampling everywhere, and a real change of the output.
#[test]
fn presence_and_frequency_penalties_in_run_and_batch_lines() {
    let run = |extra: &[&str]| -> String {
        let o = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["run", "--model"])
            .arg(demo())
            .args(["It is a truth", "--max-tokens", "24", "--temperature", "0"])
            .args(["--raw", "--json"])
            .args(extra)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        v["text"].as_str().unwrap().to_owned()
    };
    let plain = run(&[]);
    let freq = run(&["--frequency-penalty", "3"]);
    let pres = run(&["--presence-penalty", "-2", "--frequency-penalty", "-1.5"]);
    assert_ne!(plain, freq);
    assert_ne!(plain, pres);
    assert_ne!(freq, pres);

    let d = tempfile::tempdir().unwrap();
    let input = d.path().join("in.jsonl");
    let output = d.path().join("out.jsonl");
    let line = |id: &str, extra: &str| {
        format!(
            r#"{{"id": "{id}", "prompt": "It is a truth", "max_tokens": 24, "temperature": 0{extra}}}"#
        )
    };
    std::fs::write(
        &input,
        [
            line("plain", ""),
            line("freq", r#", "frequency_penalty": 3"#),
            line(
                "pres",
                r#", "presence_penalty": -2, "frequency_penalty": -1.5"#,
            ),
        ]
        .join("\n"),
    )
    .unwrap();
    let o = batch(&input, &output);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got: Vec<(String, String)> = lines(&output)
        .iter()
        .map(|v| {
            (
                v["id"].as_str().unwrap().to_owned(),
                v["text"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("plain".to_owned(), plain),
            ("freq".to_owned(), freq),
            ("pres".to_owned(), pres)
        ]
    );

    // A value that is not finite is refused by name, before the model runs.
    let o = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["run", "--model"])
        .arg(demo())
        .args(["It is", "--presence-penalty", "inf"])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("presence_penalty"), "{e}");
}

#[test]
fn lines_may_carry_a_response_format_and_bad_ones_are_skipped() {
    let d = tempfile::tempdir().unwrap();
    let input = d.path().join("in.jsonl");
    let output = d.path().join("out.jsonl");
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["ok", "n"],
        "additionalProperties": false});
    let line = |id: &str, rf: Value| {
        json!({"id": id, "prompt": "It is a truth", "max_tokens": 40, "temperature": 0,
            "response_format": rf})
        .to_string()
    };
    std::fs::write(
        &input,
        [
            line(
                "s",
                json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}),
            ),
            line("t", json!({"type": "text"})),
            line("bad-type", json!({"type": "yaml"})),
            line(
                "bad-schema",
                json!({"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}),
            ),
        ]
        .join("\n"),
    )
    .unwrap();
    let o = batch(&input, &output);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("line 3: response_format") && err.contains("`yaml`"),
        "{err}"
    );
    assert!(err.contains("line 4: json_schema"), "{err}");
    let out = lines(&output);
    assert_eq!(out.len(), 2);
    assert_eq!(out[0]["finish_reason"], "eos", "{}", out[0]);
    let v: Value = serde_json::from_str(out[0]["text"].as_str().unwrap()).unwrap();
    assert!(
        v["ok"].is_boolean() && (0..=9).contains(&v["n"].as_i64().unwrap()),
        "{v}"
    );
    assert_eq!(v.as_object().unwrap().len(), 2);
    // `text` constrains nothing: what the prompt gives alone.
    assert_eq!(out[1]["text"], solo(&demo(), "It is a truth", 40));
}

/// Runs `sluice batch` on the demo model with `batch` sequences and `extra` flags, which must
/// succeed, and returns the output's lines.
fn batch_demo(input: &Path, out: &Path, batch: usize, extra: &[&str]) -> Vec<Value> {
    let o = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["batch", "--model"])
        .arg(demo())
        .arg("--input")
        .arg(input)
        .arg("--output")
        .arg(out)
        .args(["--batch-size", &batch.to_string(), "--threads", "2"])
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    lines(out)
}

#[test]
fn batch_draft_ngram_changes_no_text_and_reports_its_drafts() {
    let d = tempfile::tempdir().unwrap();
    let input = d.path().join("in.jsonl");
    let line = |id: &str, t: f32| {
        json!({"id": id, "prompt": "<|user|>\nTell me of Elizabeth.\n<|assistant|>\n",
            "max_tokens": 64, "temperature": t, "seed": 2})
        .to_string()
    };
    std::fs::write(&input, [line("g", 0.0), line("s", 0.7)].join("\n")).unwrap();
    let run = |out: &Path, extra: &[&str]| batch_demo(&input, out, 2, extra);
    let plain = run(&d.path().join("plain.jsonl"), &[]);
    let drafted = run(
        &d.path().join("drafted.jsonl"),
        &["--draft", "ngram", "--draft-tokens", "3"],
    );
    assert!(plain[0].get("draft_proposed").is_none());
    let mut proposed = 0;
    for (a, b) in plain.iter().zip(&drafted) {
        assert_eq!(a["text"], b["text"], "{b}");
        assert_eq!(a["completion_tokens"], b["completion_tokens"]);
        let p = b["draft_proposed"].as_u64().unwrap();
        assert!(b["draft_accepted"].as_u64().unwrap() <= p);
        proposed += p;
    }
    assert!(proposed > 0);
}

#[test]
fn jobs_sharing_a_document_reuse_its_prefix_with_the_same_text() {
    let d = tempfile::tempdir().unwrap();
    let input = d.path().join("in.jsonl");
    let doc = "The river carried the boats down to the sea, past the mills. ".repeat(5);
    let lines_in: Vec<String> = ["Who waved?", "Where did they go?", "Who waved?"]
        .iter()
        .enumerate()
        .map(|(i, q)| {
            json!({"id": i.to_string(), "prompt": format!("{doc}{q}"), "max_tokens": 8}).to_string()
        })
        .collect();
    std::fs::write(&input, lines_in.join("\n")).unwrap();
    let run = |out: &Path, extra: &[&str]| batch_demo(&input, out, 1, extra);
    let cold = run(&d.path().join("cold.jsonl"), &["--prefix-cache", "off"]);
    let warm = run(&d.path().join("warm.jsonl"), &[]);
    for (a, b) in cold.iter().zip(&warm) {
        assert_eq!(a["text"], b["text"], "{b}");
        assert!(a.get("cached_tokens").is_none(), "{a}");
    }
    assert!(warm[0].get("cached_tokens").is_none(), "{}", warm[0]);
    let shared = warm[1]["cached_tokens"].as_u64().unwrap();
    assert!(shared > 40, "{}", warm[1]);
    // The repeated job takes its whole prompt.
    assert_eq!(
        warm[2]["cached_tokens"], warm[2]["prompt_tokens"],
        "{}",
        warm[2]
    );
}
