//! Tokenizer speed on a real-sized Kimi-style tiktoken table (163,584 ranks): load time and
//! encode time of long inputs. Timings belong here, not in tests.
//!
//! `cargo bench -p sluice --bench tokenizers`

use std::io::Read as _;
use std::path::Path;
use std::time::Instant;

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("tokenizers: run with `cargo bench` for figures");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tokenizers");
    let src = root.join("kimi_o200k");
    let dst = tempfile::tempdir().expect("tempdir");
    for entry in std::fs::read_dir(&src).expect("fixture") {
        let p = entry.expect("entry").path();
        let name = p
            .file_name()
            .and_then(|n| n.to_str())
            .expect("name")
            .to_owned();
        match name.strip_suffix(".gz") {
            Some(stem) => {
                let mut out = Vec::new();
                flate2::read::GzDecoder::new(std::fs::File::open(&p).expect("open"))
                    .read_to_end(&mut out)
                    .expect("gunzip");
                std::fs::write(dst.path().join(stem), out).expect("write");
            }
            None => {
                std::fs::copy(&p, dst.path().join(&name)).expect("copy");
            }
        }
    }
    let t0 = Instant::now();
    let tok = sluice::Tokenizer::from_dir(dst.path())
        .expect("load")
        .expect("a tokenizer");
    println!(
        "kimi_o200k (163,584 ranks): load {:.0} ms",
        t0.elapsed().as_secs_f64() * 1e3
    );
    let texts: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("texts.json")).expect("texts"))
            .expect("json");
    for t in texts.as_array().expect("array") {
        let (name, text) = (
            t["name"].as_str().unwrap_or(""),
            t["text"].as_str().unwrap_or(""),
        );
        if text.len() < 1000 {
            continue;
        }
        let t0 = Instant::now();
        let mut n = 0;
        for _ in 0..5 {
            n = tok.encode(text, false).expect("encode").len();
        }
        println!(
            "  {name:>14}: {:6} bytes -> {n:5} ids in {:7.2} ms",
            text.len(),
            t0.elapsed().as_secs_f64() * 1e3 / 5.0
        );
    }
}
