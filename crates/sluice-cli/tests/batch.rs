//! `sluice batch`: JSONL in, JSONL out in input order, bad lines reported and skipped, and a
//! rerun resumes where an interrupted job stopped.

use std::path::Path;
use std::process::{Command, Output};

mod common;
use common::{demo, solo};
use serde_json::Value;

fn batch(input: &Path, output: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["batch", "--model"])
        .arg(demo())
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
