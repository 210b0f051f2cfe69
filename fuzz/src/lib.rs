//! What the fuzz targets share: the repository's fixtures, the fixture tokenizers (loaded once
//! per process) and bounded arbitrary JSON.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::arbitrary::{self, Unstructured};
use serde_json::Value;

/// `testdata/` of the repository.
pub fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata")
}

/// Reads a fixture file (relative to `testdata/`); panics when it is missing, which is a
/// set-up error rather than a finding.
pub fn fixture(rel: &str) -> Vec<u8> {
    let p = testdata().join(rel);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A gzipped fixture, decompressed.
pub fn gunzip(rel: &str) -> Vec<u8> {
    let gz = fixture(rel);
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut out)
        .unwrap_or_else(|e| panic!("{rel}: {e}"));
    out
}

/// A JSON fixture, parsed.
pub fn fixture_json(rel: &str) -> Value {
    serde_json::from_slice(&fixture(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The fixture tokenizers, by name.
pub const TOKENIZERS: [&str; 4] = ["bpe_small", "kimi_o200k", "spm_small", "deepseek_v3"];

/// A scratch directory for this process, removed by the caller.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sluice-fuzz-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
    d
}

fn load_tokenizer(name: &str) -> sluice::Tokenizer {
    let root = testdata().join("tokenizers").join(name);
    match name {
        "bpe_small" | "spm_small" => sluice::Tokenizer::from_file(&root.join("tokenizer.json"))
            .unwrap_or_else(|e| panic!("{name}: {e}")),
        "deepseek_v3" => {
            let d = scratch(name);
            let p = d.join("tokenizer.json");
            std::fs::write(&p, gunzip("tokenizers/deepseek_v3/tokenizer.json.gz")).unwrap();
            let t = sluice::Tokenizer::from_file(&p).unwrap_or_else(|e| panic!("{name}: {e}"));
            let _ = std::fs::remove_dir_all(&d);
            t
        }
        "kimi_o200k" => {
            let d = scratch(name);
            std::fs::write(
                d.join("tiktoken.model"),
                gunzip("tokenizers/kimi_o200k/tiktoken.model.gz"),
            )
            .unwrap();
            std::fs::copy(
                root.join("tokenizer_config.json"),
                d.join("tokenizer_config.json"),
            )
            .unwrap();
            let t = sluice::Tokenizer::from_dir(&d)
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .expect("a tokenizer");
            let _ = std::fs::remove_dir_all(&d);
            t
        }
        _ => unreachable!("{name}"),
    }
}

/// Fixture tokenizer `i` (of [`TOKENIZERS`]), loaded on first use.
pub fn tokenizer(i: usize) -> &'static sluice::Tokenizer {
    static CELLS: [OnceLock<sluice::Tokenizer>; 4] = [const { OnceLock::new() }; 4];
    CELLS[i].get_or_init(|| load_tokenizer(TOKENIZERS[i]))
}

/// Arbitrary JSON at most `depth` levels deep, with short containers.
pub fn arb_json(u: &mut Unstructured<'_>, depth: u32) -> arbitrary::Result<Value> {
    let kind = if depth == 0 {
        u.int_in_range(0..=4)?
    } else {
        u.int_in_range(0..=6)?
    };
    Ok(match kind {
        0 => Value::Null,
        1 => Value::Bool(u.arbitrary()?),
        2 => {
            let f: f64 = u.arbitrary()?;
            if u.arbitrary()? {
                Value::from(u.arbitrary::<i64>()?)
            } else {
                serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
            }
        }
        3 | 4 => Value::String(u.arbitrary()?),
        5 => {
            let n = u.int_in_range(0..=4)?;
            Value::Array(
                (0..n)
                    .map(|_| arb_json(u, depth - 1))
                    .collect::<arbitrary::Result<_>>()?,
            )
        }
        _ => {
            let n = u.int_in_range(0..=4)?;
            let mut m = serde_json::Map::new();
            for _ in 0..n {
                m.insert(u.arbitrary()?, arb_json(u, depth - 1)?);
            }
            Value::Object(m)
        }
    })
}
