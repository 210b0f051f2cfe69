//! Tokenizers and chat templates built from GGUF metadata (`Tokenizer::from_gguf`,
//! `ChatTemplate::from_gguf`), held to three references:
//!
//! - llama.cpp's vocab tests (`testdata/gguf/vocab/ggml-vocab-*.gguf.{inp,out}`, ids made by each
//!   model's own Hugging Face tokenizer, no special tokens added): every text of every committed
//!   vocabulary;
//! - `llama_cpp.json`: llama.cpp's own tokenizer (llama-cpp-python 0.3.36) on a varied set of
//!   texts, special tokens parsed, with and without the BOS/EOS it adds;
//! - `transformers.json`: transformers 5.24's tokenizer loaded from the same GGUF file (patched
//!   where its GGUF loader does not build the model's tokenizer; see
//!   `tools/reference/make_gguf_tokenizer_fixtures.py`): ids with and without special tokens,
//!   decodes, vocabulary sizes, special tokens and chat-template renders.
//!
//! Beside those: DeepSeek-V3's and Kimi's real vocabularies (`testdata/tokenizers/`) written as
//! GGUF metadata the way llama.cpp's converter writes them and compared with the `tokenizer.json`
//! and `tiktoken.model` tokenizers they came from, and refusals of bad metadata.

use std::collections::HashMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proptest::prelude::*;
use serde_json::Value as Json;
use sluice_format::gguf::{Array, Gguf, Value};
use sluice_text::{ChatTemplate, Message, Tokenizer};

fn vocab_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/gguf/vocab")
}

fn tokenizers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tokenizers")
}

/// llama.cpp's vocab files, outside the repository (for the ignored survey test).
const LLAMA_CPP_MODELS: &str = "/work/llama/llama_cpp_python-0.3.36/vendor/llama.cpp/models";

fn read_json(path: &Path) -> Json {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn gunzip(path: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_end(&mut out)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    out
}

/// A GGUF header read from a file, gunzipped first if its name ends in `.gz`.
fn read_gguf(path: &Path) -> Gguf {
    let bytes = if path.extension().is_some_and(|x| x == "gz") {
        gunzip(path)
    } else {
        std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    sluice_format::gguf::parse(&bytes, bytes.len() as u64, path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// llama.cpp's vocab test cases: the texts of `.inp` (each followed by
/// `"\n__ggml_vocab_test__\n"`) and the ids of `.out` (one line of ids per text).
fn vocab_cases(inp: &Path, out: &Path) -> Vec<(String, Vec<u32>)> {
    const SEP: &str = "\n__ggml_vocab_test__\n";
    let inp = std::fs::read_to_string(inp).unwrap();
    let out = std::fs::read_to_string(out).unwrap();
    // Each text is followed by a separator, except in files whose last one is not.
    let body = inp.strip_suffix(SEP).unwrap_or(&inp);
    let texts: Vec<&str> = body.split(SEP).collect();
    let lines: Vec<&str> = out.split('\n').collect();
    assert!(
        lines.len() >= texts.len(),
        "{} texts, {} lines",
        texts.len(),
        lines.len()
    );
    texts
        .iter()
        .zip(&lines)
        .map(|(t, l)| {
            let ids = l.split_whitespace().map(|x| x.parse().unwrap()).collect();
            (t.to_string(), ids)
        })
        .collect()
}

/// The texts whose ids differ from `.out`, described.
fn vocab_mismatches(tok: &Tokenizer, cases: &[(String, Vec<u32>)]) -> Vec<String> {
    let mut bad = Vec::new();
    for (text, want) in cases {
        let got = tok.encode(text, false).unwrap();
        if &got != want {
            bad.push(format!("{text:?}: want {want:?}, got {got:?}"));
        }
    }
    bad
}

#[test]
#[ignore = "reads llama.cpp's models/ directory outside the repository"]
fn survey_llama_cpp_vocab_files() {
    let dir = Path::new(LLAMA_CPP_MODELS);
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| {
            let n = e.unwrap().file_name().into_string().unwrap();
            n.strip_suffix(".gguf.inp").map(str::to_owned)
        })
        .collect();
    names.sort();
    let mut failed = Vec::new();
    for name in names {
        let gguf = dir.join(format!("{name}.gguf"));
        let meta = read_gguf(&gguf);
        let cases = vocab_cases(
            &dir.join(format!("{name}.gguf.inp")),
            &dir.join(format!("{name}.gguf.out")),
        );
        match Tokenizer::from_gguf(&meta, &gguf) {
            Err(e) => println!("{name}: refused: {e}"),
            Ok(tok) => {
                let bad = vocab_mismatches(&tok, &cases);
                println!("{name}: {} of {} texts differ", bad.len(), cases.len());
                for b in bad.iter().take(6) {
                    println!("    {b}");
                }
                if !bad.is_empty() {
                    failed.push(name);
                }
            }
        }
    }
    assert!(failed.is_empty(), "differ: {failed:?}");
}

// ---------------------------------------------------------------------------------------------
// GGUF metadata written here: a header with metadata and no tensors.

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend(x.to_le_bytes()),
        Value::U16(x) => out.extend(x.to_le_bytes()),
        Value::I16(x) => out.extend(x.to_le_bytes()),
        Value::U32(x) => out.extend(x.to_le_bytes()),
        Value::I32(x) => out.extend(x.to_le_bytes()),
        Value::F32(x) => out.extend(x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, s),
        Value::U64(x) => out.extend(x.to_le_bytes()),
        Value::I64(x) => out.extend(x.to_le_bytes()),
        Value::F64(x) => out.extend(x.to_le_bytes()),
        Value::Array(a) => {
            macro_rules! each {
                ($v:expr, $wrap:expr) => {{
                    out.extend(type_id(&$wrap(Default::default())).to_le_bytes());
                    out.extend(($v.len() as u64).to_le_bytes());
                    for x in $v {
                        put_value(out, &$wrap(x.clone()));
                    }
                }};
            }
            match a {
                Array::U8(v) => each!(v, Value::U8),
                Array::I8(v) => each!(v, Value::I8),
                Array::U16(v) => each!(v, Value::U16),
                Array::I16(v) => each!(v, Value::I16),
                Array::U32(v) => each!(v, Value::U32),
                Array::I32(v) => each!(v, Value::I32),
                Array::F32(v) => each!(v, Value::F32),
                Array::Bool(v) => each!(v, Value::Bool),
                Array::String(v) => each!(v, Value::String),
                Array::U64(v) => each!(v, Value::U64),
                Array::I64(v) => each!(v, Value::I64),
                Array::F64(v) => each!(v, Value::F64),
                Array::Array(_) => unreachable!("not written here"),
            }
        }
    }
}

/// A GGUF file (version 3, no tensors) holding `kvs`, parsed back.
/// A byte-level (`gpt2`) vocabulary's metadata under the `deepseek2` architecture, adding no
/// BOS to a text (as the real tokenizers these tests rebuild do).
fn byte_level(
    pre: &str,
    tokens: Vec<String>,
    types: Vec<i32>,
    merges: Vec<String>,
) -> Vec<(String, Value)> {
    vec![
        ("general.architecture".into(), s("deepseek2")),
        ("tokenizer.ggml.model".into(), s("gpt2")),
        ("tokenizer.ggml.pre".into(), s(pre)),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(Array::String(tokens)),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(Array::I32(types)),
        ),
        (
            "tokenizer.ggml.merges".into(),
            Value::Array(Array::String(merges)),
        ),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
    ]
}

fn gguf_of(kvs: &[(String, Value)]) -> Gguf {
    let mut out = Vec::new();
    out.extend(b"GGUF");
    out.extend(3u32.to_le_bytes());
    out.extend(0u64.to_le_bytes());
    out.extend((kvs.len() as u64).to_le_bytes());
    for (k, v) in kvs {
        put_str(&mut out, k);
        out.extend(type_id(v).to_le_bytes());
        put_value(&mut out, v);
    }
    sluice_format::gguf::parse(&out, out.len() as u64, Path::new("synthetic.gguf")).unwrap()
}

/// `meta`'s metadata with `key` set to `value` (added if absent), or removed when `None`.
fn with_key(meta: &Gguf, key: &str, value: Option<Value>) -> Gguf {
    let mut kvs: Vec<(String, Value)> = meta
        .metadata
        .iter()
        .filter(|(k, _)| k != key)
        .cloned()
        .collect();
    if let Some(v) = value {
        kvs.push((key.to_owned(), v));
    }
    gguf_of(&kvs)
}

fn s(x: &str) -> Value {
    Value::String(x.to_owned())
}

fn strs(xs: &[&str]) -> Value {
    Value::Array(Array::String(xs.iter().map(|x| x.to_string()).collect()))
}

// ---------------------------------------------------------------------------------------------
// The committed vocabularies.

/// The committed vocabularies (`ggml-vocab-NAME.gguf.gz`), and `qwen35`, which is `qwen2`'s with
/// `tokenizer.ggml.pre = "qwen35"` (the fixture script checks the two files differ in that key
/// alone).
fn vocab_meta(name: &str) -> &'static Gguf {
    static CELLS: OnceLock<std::sync::Mutex<HashMap<String, &'static Gguf>>> = OnceLock::new();
    let cells = CELLS.get_or_init(Default::default);
    if let Some(g) = cells.lock().unwrap().get(name) {
        return g;
    }
    let g = match name {
        "qwen35" => with_key(vocab_meta("qwen2"), "tokenizer.ggml.pre", Some(s("qwen35"))),
        "llama-spm+no_space_prefix" => with_key(
            vocab_meta("llama-spm"),
            "tokenizer.ggml.add_space_prefix",
            Some(Value::Bool(false)),
        ),
        _ => read_gguf(&vocab_dir().join(format!("ggml-vocab-{name}.gguf.gz"))),
    };
    let g: &'static Gguf = Box::leak(Box::new(g));
    cells.lock().unwrap().insert(name.to_owned(), g);
    g
}

fn vocab_path(name: &str) -> PathBuf {
    vocab_dir().join(format!("ggml-vocab-{name}.gguf"))
}

fn vocab_tokenizer(name: &str) -> &'static Tokenizer {
    static CELLS: OnceLock<std::sync::Mutex<HashMap<String, &'static Tokenizer>>> = OnceLock::new();
    let cells = CELLS.get_or_init(Default::default);
    if let Some(t) = cells.lock().unwrap().get(name) {
        return t;
    }
    let t = Tokenizer::from_gguf(vocab_meta(name), &vocab_path(name))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let t: &'static Tokenizer = Box::leak(Box::new(t));
    cells.lock().unwrap().insert(name.to_owned(), t);
    t
}

/// Every text of llama.cpp's vocab test for `name` gives the ids of its `.out` file.
fn check_llama_cpp_vocab_test(name: &str) {
    let cases = vocab_cases(
        &vocab_dir().join(format!("ggml-vocab-{name}.gguf.inp")),
        &vocab_dir().join(format!("ggml-vocab-{name}.gguf.out")),
    );
    assert!(cases.len() >= 46, "{name}: {} texts", cases.len());
    let bad = vocab_mismatches(vocab_tokenizer(name), &cases);
    assert!(
        bad.is_empty(),
        "{name}: {} of {} texts differ:\n{}",
        bad.len(),
        cases.len(),
        bad.join("\n")
    );
}

macro_rules! vocab_tests {
    ($($test:ident => $name:literal),* $(,)?) => {$(
        #[test]
        fn $test() {
            check_llama_cpp_vocab_test($name);
        }
    )*};
}

vocab_tests! {
    vocab_test_llama_spm => "llama-spm",
    vocab_test_phi_3 => "phi-3",
    vocab_test_gpt_2 => "gpt-2",
    vocab_test_mpt => "mpt",
    vocab_test_starcoder => "starcoder",
    vocab_test_refact => "refact",
    vocab_test_falcon => "falcon",
    vocab_test_deepseek_coder => "deepseek-coder",
    vocab_test_deepseek_llm => "deepseek-llm",
    vocab_test_qwen2 => "qwen2",
    vocab_test_qwen35 => "qwen35",
    vocab_test_llama_bpe => "llama-bpe",
    vocab_test_command_r => "command-r",
}

// ---------------------------------------------------------------------------------------------
// llama.cpp's tokenizer on more texts.

fn llama_cpp_fixture() -> &'static Json {
    static F: OnceLock<Json> = OnceLock::new();
    F.get_or_init(|| read_json(&vocab_dir().join("llama_cpp.json")))
}

/// Files whose `add_special` differs from llama.cpp's by design: the file has no
/// `tokenizer.ggml.add_bos_token`, llama.cpp adds a BOS for its pre-tokenizer (Llama 3's), and
/// sluice adds none, as transformers adds none.
const BOS_DEFAULT_DIFFERS: &[&str] = &["llama-bpe"];

/// Texts where llama.cpp's ids differ from sluice's and transformers' (whose ids for these very
/// texts `transformers_*` checks), with why. The test demands that exactly these differ.
const LLAMA_CPP_DIFFERS: &[(&str, &str, &str)] = &[
    // llama.cpp strips the whitespace after Phi-3's special tokens when `general.name` contains
    // "phi-3" (its copy of the `rstrip` flags of Phi-3's `tokenizer.json`, which a GGUF file does
    // not carry); transformers' GGUF tokenizer does not, nor does sluice.
    (
        "phi-3",
        "special_phi-3_0",
        "rstrip after special tokens, by model name",
    ),
    (
        "phi-3",
        "special_phi-3_1",
        "rstrip after special tokens, by model name",
    ),
    // llama.cpp makes `</s>` (an ordinary token of Qwen2's vocabulary) a control token because
    // it reads as an end of generation; Qwen2's tokenizer, and transformers', cut it into pieces.
    (
        "qwen2",
        "special_inline",
        "`</s>` taken for a control token",
    ),
    ("qwen2", "long_mixed", "`</s>` taken for a control token"),
    (
        "qwen35",
        "special_inline",
        "`</s>` taken for a control token",
    ),
    ("qwen35", "long_mixed", "`</s>` taken for a control token"),
];

fn ids_of(v: &Json) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn check_llama_cpp(name: &str) {
    let f = llama_cpp_fixture();
    let texts = &f["texts"];
    let entry = &f["files"][name];
    let tok = vocab_tokenizer(name);
    let prefix = ids_of(&entry["add_special"]["prefix"]);
    let suffix = ids_of(&entry["add_special"]["suffix"]);
    let (prefix, suffix) = if BOS_DEFAULT_DIFFERS.contains(&name) {
        assert_eq!(prefix.len(), 1, "{name}: llama.cpp adds one BOS");
        (Vec::new(), suffix)
    } else {
        (prefix, suffix)
    };
    let ids = entry["ids"].as_object().unwrap();
    assert!(ids.len() >= 36, "{name}: {} texts", ids.len());
    let mut bad = Vec::new();
    for (tname, want) in ids {
        let text = texts[tname].as_str().unwrap();
        let want = ids_of(want);
        let got = tok.encode(text, false).unwrap();
        let full: Vec<u32> = prefix.iter().chain(&want).chain(&suffix).copied().collect();
        let got_full = tok.encode(text, true).unwrap();
        let known = LLAMA_CPP_DIFFERS
            .iter()
            .any(|(f, t, _)| *f == name && t == tname);
        if known {
            if got == want {
                bad.push(format!(
                    "{tname}: listed as differing from llama.cpp, but equal"
                ));
            }
        } else {
            if got != want {
                bad.push(format!(
                    "{tname} {text:?}: llama.cpp {want:?}, sluice {got:?}"
                ));
            }
            if got_full != full {
                bad.push(format!(
                    "{tname} {text:?} (add_special): llama.cpp {full:?}, sluice {got_full:?}"
                ));
            }
        }
    }
    assert!(bad.is_empty(), "{name}:\n{}", bad.join("\n"));
}

macro_rules! llama_cpp_tests {
    ($($test:ident => $name:literal),* $(,)?) => {$(
        #[test]
        fn $test() {
            check_llama_cpp($name);
        }
    )*};
}

llama_cpp_tests! {
    llama_cpp_llama_spm => "llama-spm",
    llama_cpp_llama_spm_no_space_prefix => "llama-spm+no_space_prefix",
    llama_cpp_phi_3 => "phi-3",
    llama_cpp_gpt_2 => "gpt-2",
    llama_cpp_mpt => "mpt",
    llama_cpp_starcoder => "starcoder",
    llama_cpp_refact => "refact",
    llama_cpp_falcon => "falcon",
    llama_cpp_deepseek_coder => "deepseek-coder",
    llama_cpp_deepseek_llm => "deepseek-llm",
    llama_cpp_qwen2 => "qwen2",
    llama_cpp_qwen35 => "qwen35",
    llama_cpp_llama_bpe => "llama-bpe",
    llama_cpp_command_r => "command-r",
}

#[test]
fn llama_cpp_fixture_covers_every_committed_vocabulary() {
    let files = llama_cpp_fixture()["files"].as_object().unwrap();
    let mut names: Vec<&str> = files.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "command-r",
            "deepseek-coder",
            "deepseek-llm",
            "falcon",
            "gpt-2",
            "llama-bpe",
            "llama-spm",
            "llama-spm+no_space_prefix",
            "mpt",
            "phi-3",
            "qwen2",
            "qwen35",
            "refact",
            "starcoder",
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// transformers.

fn transformers_fixture() -> &'static Json {
    static F: OnceLock<Json> = OnceLock::new();
    F.get_or_init(|| read_json(&vocab_dir().join("transformers.json")))
}

fn messages(conversation: &str) -> Vec<Message> {
    serde_json::from_value(transformers_fixture()["conversations"][conversation].clone()).unwrap()
}

/// Renders of a template against a fixture's `renders`.
fn check_renders(name: &str, t: &ChatTemplate, renders: &Json) {
    let renders = renders.as_array().unwrap();
    assert!(!renders.is_empty());
    for r in renders {
        let conv = r["conversation"].as_str().unwrap();
        let add_gen = r["add_generation_prompt"].as_bool().unwrap();
        let want = r["text"]
            .as_str()
            .unwrap_or_else(|| panic!("{name} {conv}: transformers raised {}", r["error"]));
        let got = t.render(&messages(conv), add_gen).unwrap();
        assert_eq!(got, want, "{name} {conv} add_generation_prompt={add_gen}");
    }
}

fn special_map(t: &ChatTemplate) -> HashMap<String, String> {
    t.special_tokens().iter().cloned().collect()
}

fn json_map(v: &Json) -> HashMap<String, String> {
    v.as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect()
}

fn check_transformers(name: &str) {
    let f = &transformers_fixture()["files"][name];
    let tok = vocab_tokenizer(name);
    assert_eq!(
        tok.vocab_size() as u64,
        f["vocab_size"].as_u64().unwrap(),
        "{name}: vocabulary size"
    );
    let encodings = f["encodings"].as_array().unwrap();
    assert!(encodings.len() >= 36);
    let mut bad = Vec::new();
    for e in encodings {
        let tname = e["name"].as_str().unwrap();
        let text = e["text"].as_str().unwrap();
        for (key, add) in [("ids", false), ("ids_add_special", true)] {
            let want = ids_of(&e[key]);
            let got = tok.encode(text, add).unwrap();
            if got != want {
                bad.push(format!(
                    "{tname} {key}: transformers {want:?}, sluice {got:?}"
                ));
            }
        }
        let decoded = tok.decode(&ids_of(&e["ids"])).unwrap();
        if decoded != e["decoded"].as_str().unwrap() {
            bad.push(format!("{tname} decode: {:?} vs {decoded:?}", e["decoded"]));
        }
    }
    assert!(bad.is_empty(), "{name}:\n{}", bad.join("\n"));
    let meta = vocab_meta(name);
    match ChatTemplate::from_gguf(meta, &vocab_path(name)).unwrap() {
        Some(t) => {
            assert_eq!(
                special_map(&t),
                json_map(&f["special_tokens_map"]),
                "{name}"
            );
            check_renders(name, &t, &f["renders"]);
        }
        None => assert!(
            f.get("renders").is_none(),
            "{name}: transformers has a template"
        ),
    }
}

macro_rules! transformers_tests {
    ($($test:ident => $name:literal),* $(,)?) => {$(
        #[test]
        fn $test() {
            check_transformers($name);
        }
    )*};
}

transformers_tests! {
    transformers_gpt_2 => "gpt-2",
    transformers_qwen2 => "qwen2",
    transformers_phi_3 => "phi-3",
    transformers_llama_spm => "llama-spm",
    transformers_llama_bpe => "llama-bpe",
}

/// The patches the reference needed are the documented ones, and unpatched transformers does
/// differ there (so the patches are not idle).
#[test]
fn transformers_patches_are_the_documented_ones() {
    let files = transformers_fixture()["files"].as_object().unwrap();
    let patches: HashMap<&str, Vec<&str>> = files
        .iter()
        .map(|(k, v)| {
            let p = v["patches"].as_array().unwrap();
            (k.as_str(), p.iter().map(|x| x.as_str().unwrap()).collect())
        })
        .collect();
    let want: HashMap<&str, Vec<&str>> = [
        ("gpt-2", vec![]),
        ("qwen2", vec![]),
        ("phi-3", vec![]),
        ("llama-spm", vec!["prepend_normalizer"]),
        ("llama-bpe", vec!["ignore_merges", "drop_appended"]),
    ]
    .into_iter()
    .collect();
    assert_eq!(patches, want);
    for (name, f) in files {
        let differ = f["differ_unpatched"].as_u64().unwrap();
        assert_eq!(
            differ == 0,
            patches[name.as_str()].is_empty(),
            "{name}: {differ}"
        );
    }
    // transformers appends `<|endoftext|>` past Llama 3's 128,256 tokens; sluice does not.
    assert_eq!(files["llama-bpe"]["transformers_vocab_size"], 128_257);
    assert_eq!(files["llama-bpe"]["vocab_size"], 128_256);
}

#[test]
fn command_r_renders_its_default_template_not_the_named_ones() {
    let f = &transformers_fixture()["template_only"]["command-r"];
    let meta = vocab_meta("command-r");
    let t = ChatTemplate::from_gguf(meta, &vocab_path("command-r"))
        .unwrap()
        .unwrap();
    let Some(Value::String(default)) = meta.value("tokenizer.chat_template") else {
        panic!("command-r has a default template");
    };
    assert_eq!(t.source(), default);
    for named in [
        "tokenizer.chat_template.tool_use",
        "tokenizer.chat_template.rag",
    ] {
        let Some(Value::String(other)) = meta.value(named) else {
            panic!("command-r has {named}");
        };
        assert_ne!(other, default);
    }
    assert_eq!(special_map(&t), json_map(&f["special_tokens_map"]));
    check_renders("command-r", &t, &f["renders"]);
}

// ---------------------------------------------------------------------------------------------
// Real vocabularies written as GGUF metadata, against the tokenizers they came from.

fn texts() -> Vec<(String, String)> {
    let v = read_json(&tokenizers_dir().join("texts.json"));
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_owned(),
                t["text"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// GPT-2's byte-to-character table.
fn byte_chars() -> Vec<char> {
    let mut out = Vec::with_capacity(256);
    let mut next = 0x100u32;
    for b in 0..=255u8 {
        let c = b as char;
        if matches!(c, '!'..='~' | '\u{00A1}'..='\u{00AC}' | '\u{00AE}'..='\u{00FF}') {
            out.push(c);
        } else {
            out.push(char::from_u32(next).unwrap());
            next += 1;
        }
    }
    out
}

fn spelled(bytes: &[u8], chars: &[char]) -> String {
    bytes.iter().map(|&b| chars[b as usize]).collect()
}

/// Both tokenizers give the same ids (with and without special tokens) and decodes.
fn assert_same_encodings(name: &str, a: &Tokenizer, b: &Tokenizer, texts: &[(String, String)]) {
    let mut bad = Vec::new();
    for (tname, text) in texts {
        for add in [false, true] {
            let x = a.encode(text, add).unwrap();
            let y = b.encode(text, add).unwrap();
            if x != y {
                let i = x
                    .iter()
                    .zip(&y)
                    .position(|(p, q)| p != q)
                    .unwrap_or(x.len().min(y.len()));
                bad.push(format!(
                    "{tname} add_special={add}: from GGUF {:?}, reference {:?} (from {i})",
                    &x[i..(i + 8).min(x.len())],
                    &y[i..(i + 8).min(y.len())]
                ));
            }
        }
        let ids = b.encode(text, false).unwrap();
        if a.decode(&ids).unwrap() != b.decode(&ids).unwrap() {
            bad.push(format!("{tname}: decodes differ"));
        }
    }
    assert!(bad.is_empty(), "{name}:\n{}", bad.join("\n"));
}

/// DeepSeek-V3's `tokenizer.json` as llama.cpp's converter writes it: the vocabulary by id with
/// the added tokens in place (special ones control, the others user-defined), the merges as
/// `"a b"`, `tokenizer.ggml.pre = "deepseek-v3"`.
#[test]
fn deepseek_v3_from_gguf_metadata_matches_its_tokenizer_json() {
    let bytes = gunzip(&tokenizers_dir().join("deepseek_v3/tokenizer.json.gz"));
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("sluice-gguf-deepseek-v3");
    std::fs::create_dir_all(&dir).unwrap();
    let json_path = dir.join(format!("tokenizer.{}.json", std::process::id()));
    std::fs::write(&json_path, &bytes).unwrap();
    let reference = Tokenizer::from_file(&json_path).unwrap();
    std::fs::remove_file(&json_path).unwrap();

    let j: Json = serde_json::from_slice(&bytes).unwrap();
    let vocab = j["model"]["vocab"].as_object().unwrap();
    let added = j["added_tokens"].as_array().unwrap();
    let n = vocab
        .values()
        .map(|v| v.as_u64().unwrap())
        .chain(added.iter().map(|a| a["id"].as_u64().unwrap()))
        .max()
        .unwrap() as usize
        + 1;
    let mut tokens: Vec<Option<String>> = vec![None; n];
    let mut types = vec![1i32; n];
    for (t, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = Some(t.clone());
    }
    for a in added {
        let id = a["id"].as_u64().unwrap() as usize;
        tokens[id] = Some(a["content"].as_str().unwrap().to_owned());
        types[id] = if a["special"].as_bool().unwrap() {
            3
        } else {
            4
        };
    }
    let tokens: Vec<String> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            t.unwrap_or_else(|| {
                types[i] = 5;
                format!("[PAD{i}]")
            })
        })
        .collect();
    let merges: Vec<String> = j["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Json::String(s) => s.clone(),
            Json::Array(p) => format!("{} {}", p[0].as_str().unwrap(), p[1].as_str().unwrap()),
            _ => panic!("merge {m}"),
        })
        .collect();
    let bos = tokens
        .iter()
        .position(|t| t == "<｜begin▁of▁sentence｜>")
        .unwrap();
    let eos = tokens
        .iter()
        .position(|t| t == "<｜end▁of▁sentence｜>")
        .unwrap();
    let mut kv = byte_level("deepseek-v3", tokens, types, merges);
    kv.push(("tokenizer.ggml.bos_token_id".into(), Value::U32(bos as u32)));
    kv.push(("tokenizer.ggml.eos_token_id".into(), Value::U32(eos as u32)));
    let meta = gguf_of(&kv);
    let tok = Tokenizer::from_gguf(&meta, Path::new("deepseek-v3.gguf")).unwrap();
    assert_eq!(tok.vocab_size(), reference.vocab_size());
    assert_same_encodings("deepseek-v3", &tok, &reference, &texts());
    assert_eq!(tok.encode("x", false).unwrap().len(), 1);
}

/// Kimi's `tiktoken.model` (the o200k-based fixture) as llama.cpp's converter writes it: each
/// rank's bytes spelled in GPT-2's alphabet, the merges recovered from the ranks (the two parts
/// BPE over lower ranks leaves of each token), the special tokens as control tokens,
/// `tokenizer.ggml.pre = "kimi-k2"`. Texts longer than 25,000 characters are left out: Kimi's
/// `TikTokenTokenizer` cuts runs of more than 25,000 whitespace or non-whitespace characters
/// before BPE, which neither a GGUF tokenizer (llama.cpp's or transformers') nor sluice's does.
#[test]
fn kimi_k2_from_gguf_metadata_matches_its_tiktoken_model() {
    let src = tokenizers_dir().join("kimi_o200k");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("sluice-gguf-kimi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("tiktoken.model"),
        gunzip(&src.join("tiktoken.model.gz")),
    )
    .unwrap();
    std::fs::copy(
        src.join("tokenizer_config.json"),
        dir.join("tokenizer_config.json"),
    )
    .unwrap();
    let reference = Tokenizer::from_dir(&dir).unwrap().unwrap();
    let tt = sluice_text::tiktoken::Tiktoken::from_dir(&dir).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    let chars = byte_chars();
    let n_ranks = tt.n_ranks();
    let by_rank: Vec<&[u8]> = (0..n_ranks as u32)
        .map(|r| tt.token_bytes(r).unwrap())
        .collect();
    let ranks: HashMap<&[u8], u32> = by_rank
        .iter()
        .enumerate()
        .map(|(r, b)| (*b, r as u32))
        .collect();
    let mut merges = Vec::new();
    for (rank, tok) in by_rank.iter().enumerate() {
        if tok.len() == 1 {
            continue;
        }
        let mut parts: Vec<Vec<u8>> = tok.iter().map(|&b| vec![b]).collect();
        loop {
            let mut best: Option<(usize, u32)> = None;
            for i in 0..parts.len() - 1 {
                let joined = [parts[i].as_slice(), parts[i + 1].as_slice()].concat();
                if let Some(&r) = ranks.get(joined.as_slice())
                    && best.is_none_or(|(_, b)| r < b)
                {
                    best = Some((i, r));
                }
            }
            match best {
                Some((i, r)) if (r as usize) < rank => {
                    let right = parts.remove(i + 1);
                    parts[i].extend(right);
                }
                _ => break,
            }
        }
        assert_eq!(parts.len(), 2, "rank {rank}");
        merges.push(format!(
            "{} {}",
            spelled(&parts[0], &chars),
            spelled(&parts[1], &chars)
        ));
    }
    let n = tt.vocab_size();
    let mut tokens: Vec<String> = by_rank.iter().map(|b| spelled(b, &chars)).collect();
    tokens.resize(n, String::new());
    let mut types = vec![1i32; n];
    for (name, &id) in tt.special_tokens() {
        tokens[id as usize] = name.clone();
        types[id as usize] = 3;
    }
    assert!(tokens.iter().all(|t| !t.is_empty()));
    let meta = gguf_of(&byte_level("kimi-k2", tokens, types, merges));
    let tok = Tokenizer::from_gguf(&meta, Path::new("kimi-k2.gguf")).unwrap();
    assert_eq!(tok.vocab_size(), reference.vocab_size());
    let texts: Vec<_> = texts()
        .into_iter()
        .filter(|(_, t)| t.chars().count() <= 25_000)
        .collect();
    assert_eq!(texts.len(), 27);
    assert_same_encodings("kimi-k2", &tok, &reference, &texts);
}

// ---------------------------------------------------------------------------------------------
// What sluice does where transformers' GGUF loader does not give the model's tokenizer.

/// No id past the file's token list, ever: DeepSeek's BOS keeps its id (transformers drops the
/// control token written outside the byte alphabet and appends a new one for the BOS), and
/// `<|endoftext|>`, which Llama 3's vocabulary lacks, is not appended.
#[test]
fn no_ids_past_the_token_list() {
    let texts = &llama_cpp_fixture()["texts"];
    for name in [
        "llama-spm",
        "phi-3",
        "gpt-2",
        "mpt",
        "starcoder",
        "refact",
        "falcon",
        "deepseek-coder",
        "deepseek-llm",
        "qwen2",
        "llama-bpe",
        "command-r",
    ] {
        let n = match vocab_meta(name).value("tokenizer.ggml.tokens") {
            Some(Value::Array(a)) => a.len(),
            _ => panic!("{name}"),
        };
        let tok = vocab_tokenizer(name);
        assert!(tok.vocab_size() <= n, "{name}: {} > {n}", tok.vocab_size());
        for text in texts.as_object().unwrap().values() {
            let ids = tok.encode(text.as_str().unwrap(), true).unwrap();
            assert!(ids.iter().all(|&id| (id as usize) < n), "{name}: {text}");
        }
    }
    let ds = vocab_tokenizer("deepseek-coder");
    assert_eq!(ds.encode("x", true).unwrap()[0], 32013);
    assert_eq!(
        ds.encode("<｜begin▁of▁sentence｜>", false).unwrap(),
        [32013]
    );
    assert_eq!(ds.token_id("<｜begin▁of▁sentence｜>"), Some(32013));
    let llama3 = vocab_tokenizer("llama-bpe");
    assert_eq!(llama3.vocab_size(), 128_256);
    assert!(llama3.encode("<|endoftext|>", false).unwrap().len() > 1);
}

/// `tokenizer.ggml.add_space_prefix = false` drops the `▁` before the text (and its removal on
/// decode), as llama.cpp does (`llama_cpp_llama_spm_no_space_prefix` holds the ids to llama.cpp's);
/// transformers ignores the key.
#[test]
fn add_space_prefix_false_adds_no_prefix() {
    let with = vocab_tokenizer("llama-spm");
    let without = vocab_tokenizer("llama-spm+no_space_prefix");
    assert_eq!(with.encode("Hello world", false).unwrap(), [15043, 3186]);
    assert_eq!(without.encode("Hello world", false).unwrap(), [10994, 3186]);
    assert_eq!(without.decode(&[29871, 10994]).unwrap(), " Hello");
    assert_eq!(with.decode(&[15043, 3186]).unwrap(), "Hello world");
}

#[test]
fn byte_fallback_and_token_lengths_are_known() {
    let spm = vocab_tokenizer("llama-spm");
    // The prefix `▁`, then the emoji's four bytes as `<0xF0>`.. (ids 3..=258 are `<0x00>`..`<0xFF>`).
    let ids = spm.encode("\u{1F600}", false).unwrap();
    assert_eq!(ids, [29871, 0xF0 + 3, 0x9F + 3, 0x98 + 3, 0x80 + 3]);
    let mut sd = sluice_text::StreamDecoder::new();
    let mut out = String::new();
    for &id in &ids {
        out += &sd.push(spm, id).unwrap();
    }
    out += &sd.flush(spm).unwrap();
    assert_eq!(out, "\u{1F600}");
    assert_eq!(spm.decode(&ids).unwrap(), "\u{1F600}");
    assert!(spm.max_token_bytes() >= 6);
    let vb = vocab_tokenizer("gpt-2").vocab_bytes();
    assert_eq!(vb.tokens[50256], b"<|endoftext|>");
    assert!(vb.special[50256]);
    assert_eq!(vb.tokens[220], b" ");
}

// ---------------------------------------------------------------------------------------------
// Bad metadata: one-line errors naming the file and the key, never a panic.

fn tiny_gpt2() -> Vec<(String, Value)> {
    vec![
        ("general.architecture".into(), s("gpt2")),
        ("tokenizer.ggml.model".into(), s("gpt2")),
        ("tokenizer.ggml.pre".into(), s("gpt-2")),
        (
            "tokenizer.ggml.tokens".into(),
            strs(&["a", "b", "ab", "<|x|>", "Ġ"]),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(Array::I32(vec![1, 1, 1, 3, 1])),
        ),
        ("tokenizer.ggml.merges".into(), strs(&["a b"])),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(3)),
    ]
}

fn tiny_spm() -> Vec<(String, Value)> {
    vec![
        ("general.architecture".into(), s("llama")),
        ("tokenizer.ggml.model".into(), s("llama")),
        (
            "tokenizer.ggml.tokens".into(),
            strs(&["<unk>", "<s>", "</s>", "▁", "a", "▁a"]),
        ),
        (
            "tokenizer.ggml.scores".into(),
            Value::Array(Array::F32(vec![0.0, 0.0, 0.0, -1.0, -2.0, -0.5])),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(Array::I32(vec![2, 3, 3, 1, 1, 1])),
        ),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(2)),
    ]
}

fn set(mut kvs: Vec<(String, Value)>, key: &str, v: Option<Value>) -> Vec<(String, Value)> {
    kvs.retain(|(k, _)| k != key);
    if let Some(v) = v {
        kvs.push((key.to_owned(), v));
    }
    kvs
}

#[test]
fn tiny_vocabularies_build() {
    let t = Tokenizer::from_gguf(&gguf_of(&tiny_gpt2()), Path::new("synthetic.gguf")).unwrap();
    assert_eq!(t.encode("ab<|x|>a b", false).unwrap(), [2, 3, 0, 4, 1]);
    assert_eq!(
        t.encode("ab", true).unwrap(),
        [2],
        "no BOS by default for gpt2"
    );
    let t = Tokenizer::from_gguf(&gguf_of(&tiny_spm()), Path::new("synthetic.gguf")).unwrap();
    assert_eq!(t.encode("a a", false).unwrap(), [5, 5]);
    assert_eq!(
        t.encode("a</s>", true).unwrap(),
        [1, 5, 2],
        "BOS by default for llama"
    );
    // The decoder strips the prefix space only at the very start.
    assert_eq!(t.decode(&[5, 5]).unwrap(), "a a");
    assert_eq!(t.decode(&[1, 5, 5]).unwrap(), "<s> a a");
}

/// Builds, expecting an error: one line, naming the file and every given fragment.
fn refused(kvs: Vec<(String, Value)>, fragments: &[&str]) {
    let meta = gguf_of(&kvs);
    let e = Tokenizer::from_gguf(&meta, Path::new("synthetic.gguf"))
        .expect_err("refused")
        .to_string();
    assert!(!e.contains('\n'), "one line: {e}");
    assert!(e.starts_with("synthetic.gguf: "), "{e}");
    for f in fragments {
        assert!(e.contains(f), "{e:?} lacks {f:?}");
    }
}

/// Issue 59: a long control token took quadratic time and memory to build (25 s at 20 KB,
/// 6 GB at 60 MB). Control and user-defined tokens are capped before anything is built;
/// ordinary tokens are not added tokens and are left alone.
#[test]
fn overlong_control_and_user_tokens_are_refused() {
    let long = format!("<|{}|>", "x".repeat(5000));
    for kind in [3, 4] {
        let mut kvs = set(
            tiny_gpt2(),
            "tokenizer.ggml.tokens",
            Some(strs(&["a", "b", "ab", &long, "Ġ"])),
        );
        kvs = set(
            kvs,
            "tokenizer.ggml.token_type",
            Some(Value::Array(Array::I32(vec![1, 1, 1, kind, 1]))),
        );
        refused(
            kvs,
            &["`tokenizer.ggml.tokens`[3]", "5004 bytes", "at most 1024"],
        );
    }
    let ok = format!("<|{}|>", "x".repeat(1020));
    let kvs = set(
        tiny_gpt2(),
        "tokenizer.ggml.tokens",
        Some(strs(&["a", "b", "ab", &ok, "Ġ"])),
    );
    Tokenizer::from_gguf(&gguf_of(&kvs), Path::new("synthetic.gguf")).unwrap();
}

#[test]
fn bad_metadata_is_refused_naming_the_key() {
    let g = tiny_gpt2;
    refused(
        set(g(), "tokenizer.ggml.tokens", None),
        &["`tokenizer.ggml.tokens`", "missing"],
    );
    refused(
        set(g(), "tokenizer.ggml.tokens", Some(s("a"))),
        &["`tokenizer.ggml.tokens`", "not an array of strings"],
    );
    refused(
        set(g(), "tokenizer.ggml.tokens", Some(strs(&[]))),
        &["`tokenizer.ggml.tokens`", "empty"],
    );
    refused(
        set(g(), "tokenizer.ggml.model", None),
        &["`tokenizer.ggml.model`", "missing"],
    );
    for model in ["bert", "t5", "rwkv", "gemma4", "plamo2"] {
        refused(
            set(g(), "tokenizer.ggml.model", Some(s(model))),
            &[
                "`tokenizer.ggml.model`",
                &format!("{model:?}"),
                "not supported",
            ],
        );
    }
    refused(
        set(g(), "tokenizer.ggml.model", Some(Value::U32(1))),
        &["`tokenizer.ggml.model`", "not a string"],
    );
    refused(
        set(g(), "tokenizer.ggml.pre", Some(s("no-such-pre"))),
        &[
            "`tokenizer.ggml.pre`",
            "\"no-such-pre\"",
            "refused rather than guessed",
        ],
    );
    refused(
        set(
            g(),
            "tokenizer.ggml.token_type",
            Some(Value::Array(Array::I32(vec![1, 1]))),
        ),
        &["`tokenizer.ggml.token_type`", "2 entries", "5 tokens"],
    );
    refused(
        set(
            g(),
            "tokenizer.ggml.token_type",
            Some(Value::Array(Array::I32(vec![1, 1, 1, 9, 1]))),
        ),
        &["`tokenizer.ggml.token_type`", "entry 3 is 9"],
    );
    refused(
        set(
            g(),
            "tokenizer.ggml.token_type",
            Some(Value::Array(Array::I32(vec![1, -1, 1, 1, 1]))),
        ),
        &["`tokenizer.ggml.token_type`", "entry 1 is -1"],
    );
    refused(
        set(
            g(),
            "tokenizer.ggml.token_type",
            Some(strs(&["1", "1", "1", "1", "1"])),
        ),
        &["`tokenizer.ggml.token_type`", "not an array of integers"],
    );
    refused(
        set(
            g(),
            "tokenizer.ggml.scores",
            Some(Value::Array(Array::F32(vec![0.0; 4]))),
        ),
        &["`tokenizer.ggml.scores`", "4 entries", "5 tokens"],
    );
    refused(
        set(g(), "tokenizer.ggml.bos_token_id", Some(Value::U32(5))),
        &[
            "`tokenizer.ggml.bos_token_id`",
            "id 5 is out of range",
            "5 tokens",
        ],
    );
    refused(
        set(g(), "tokenizer.ggml.eos_token_id", Some(Value::I32(-1))),
        &[
            "`tokenizer.ggml.eos_token_id`",
            "not a non-negative integer",
        ],
    );
    refused(
        set(
            g(),
            "tokenizer.ggml.padding_token_id",
            Some(Value::U64(u64::MAX)),
        ),
        &["`tokenizer.ggml.padding_token_id`", "out of range"],
    );
    refused(
        set(g(), "tokenizer.ggml.unknown_token_id", Some(s("0"))),
        &[
            "`tokenizer.ggml.unknown_token_id`",
            "not a non-negative integer",
        ],
    );
    refused(
        set(g(), "tokenizer.ggml.add_bos_token", Some(Value::U8(1))),
        &["`tokenizer.ggml.add_bos_token`", "not a boolean"],
    );
    for merge in ["ab", "a b c", " a b", "a  b", "a ", ""] {
        refused(
            set(g(), "tokenizer.ggml.merges", Some(strs(&["a b", merge]))),
            &[
                "`tokenizer.ggml.merges`",
                "entry 1",
                "not two tokens separated by one space",
            ],
        );
    }
    refused(
        set(g(), "tokenizer.ggml.merges", Some(strs(&["a x"]))),
        &["`tokenizer.ggml.merges`", "entry 0", "\"x\"", "not a token"],
    );
    refused(
        set(g(), "tokenizer.ggml.merges", Some(strs(&["b a"]))),
        &["`tokenizer.ggml.merges`", "\"ba\"", "not a token"],
    );
    refused(
        set(g(), "tokenizer.ggml.merges", None),
        &["`tokenizer.ggml.merges`", "missing"],
    );
    let p = tiny_spm;
    refused(
        set(p(), "tokenizer.ggml.scores", None),
        &["`tokenizer.ggml.scores`", "missing"],
    );
    refused(
        set(
            p(),
            "tokenizer.ggml.scores",
            Some(Value::Array(Array::I32(vec![0; 6]))),
        ),
        &["`tokenizer.ggml.scores`", "not an array of F32"],
    );
    refused(
        set(p(), "tokenizer.ggml.add_space_prefix", Some(s("no"))),
        &["`tokenizer.ggml.add_space_prefix`", "not a boolean"],
    );
    for arch in ["gemma", "gemma2", "gemma3"] {
        refused(
            set(p(), "general.architecture", Some(s(arch))),
            &[
                "`general.architecture`",
                &format!("{arch:?}"),
                "not supported",
            ],
        );
    }
    // A SentencePiece vocabulary with merges uses them, checked the same way.
    refused(
        set(p(), "tokenizer.ggml.merges", Some(strs(&["▁ b"]))),
        &["`tokenizer.ggml.merges`", "\"b\"", "not a token"],
    );
}

fn arb_token() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop::sample::select(vec!['a', 'b', ' ', 'Ġ', '▁', '<', '>', '|', 'é', '字']),
        0..4,
    )
    .prop_map(|v| v.into_iter().collect())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Random small metadata either builds or is refused with one line; what builds encodes and
    /// decodes random text without panicking and never yields an id past the token list.
    #[test]
    fn random_metadata_never_panics(
        model in prop::sample::select(vec!["gpt2", "llama"]),
        pre in prop::sample::select(vec!["gpt-2", "llama-bpe", "deepseek-llm", "falcon", "kimi-k2", "x"]),
        tokens in proptest::collection::vec(arb_token(), 0..12),
        types in proptest::option::of(proptest::collection::vec(-1i32..8, 0..12)),
        scores in proptest::option::of(proptest::collection::vec(-5.0f32..5.0, 0..12)),
        merges in proptest::option::of(proptest::collection::vec(
            (arb_token(), prop::sample::select(vec![" ", "", "  "]), arb_token())
                .prop_map(|(a, sp, b)| format!("{a}{sp}{b}")),
            0..6,
        )),
        bos in proptest::option::of(0u32..14),
        add_bos in proptest::option::of(any::<bool>()),
        text in "[ab Ġ▁<>|é字\n]{0,24}",
    ) {
        let n = tokens.len();
        let mut kvs = vec![
            ("tokenizer.ggml.model".to_owned(), s(model)),
            ("tokenizer.ggml.pre".to_owned(), s(pre)),
            ("tokenizer.ggml.tokens".to_owned(), Value::Array(Array::String(tokens))),
        ];
        if let Some(t) = types {
            kvs.push(("tokenizer.ggml.token_type".into(), Value::Array(Array::I32(t))));
        }
        if let Some(sc) = scores {
            kvs.push(("tokenizer.ggml.scores".into(), Value::Array(Array::F32(sc))));
        }
        if let Some(m) = merges {
            kvs.push(("tokenizer.ggml.merges".into(), Value::Array(Array::String(m))));
        }
        if let Some(b) = bos {
            kvs.push(("tokenizer.ggml.bos_token_id".into(), Value::U32(b)));
        }
        if let Some(a) = add_bos {
            kvs.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(a)));
        }
        let meta = gguf_of(&kvs);
        match Tokenizer::from_gguf(&meta, Path::new("synthetic.gguf")) {
            Err(e) => prop_assert!(!e.to_string().contains('\n'), "{e}"),
            Ok(t) => {
                for add in [false, true] {
                    if let Ok(ids) = t.encode(&text, add) {
                        prop_assert!(ids.iter().all(|&i| (i as usize) < n), "{ids:?}");
                        let _ = t.decode(&ids);
                    }
                }
            }
        }
        let _ = ChatTemplate::from_gguf(&meta, Path::new("synthetic.gguf"));
    }
}

// ---------------------------------------------------------------------------------------------
// Chat templates from GGUF metadata.

#[test]
fn chat_template_reads_the_default_with_the_named_tokens() {
    let src = "{{ bos_token }}|{{ eos_token }}|{{ unk_token }}|{{ pad_token }}|{{ sep_token is defined }}|{% for m in messages %}{{ m.content }}{% endfor %}";
    let kvs = set(tiny_spm(), "tokenizer.chat_template", Some(s(src)));
    let kvs = set(kvs, "tokenizer.chat_template.tool_use", Some(s("named")));
    let kvs = set(kvs, "tokenizer.ggml.unknown_token_id", Some(Value::U32(0)));
    let kvs = set(kvs, "tokenizer.ggml.padding_token_id", Some(Value::U32(3)));
    let meta = gguf_of(&kvs);
    let t = ChatTemplate::from_gguf(&meta, Path::new("synthetic.gguf"))
        .unwrap()
        .unwrap();
    assert_eq!(t.source(), src);
    assert_eq!(
        t.render(&[Message::new("user", "hi")], false).unwrap(),
        "<s>|</s>|<unk>|▁|False|hi"
    );
    // Without ids, the names stay undefined.
    let kvs = set(
        tiny_gpt2(),
        "tokenizer.chat_template",
        Some(s("{{ bos_token }}/{{ eos_token is defined }}")),
    );
    let kvs = set(kvs, "tokenizer.ggml.tokens", None);
    let kvs = set(kvs, "tokenizer.ggml.bos_token_id", None);
    let t = ChatTemplate::from_gguf(&gguf_of(&kvs), Path::new("synthetic.gguf"))
        .unwrap()
        .unwrap();
    assert!(t.special_tokens().is_empty());
    assert_eq!(t.render(&[], false).unwrap(), "/False");
}

#[test]
fn chat_template_absent_named_only_or_bad_is_handled() {
    let none = ChatTemplate::from_gguf(&gguf_of(&tiny_gpt2()), Path::new("synthetic.gguf"));
    assert!(none.unwrap().is_none());
    let err = |kvs: Vec<(String, Value)>, fragments: &[&str]| {
        let e = ChatTemplate::from_gguf(&gguf_of(&kvs), Path::new("synthetic.gguf"))
            .expect_err("refused")
            .to_string();
        assert!(
            !e.contains('\n') && e.starts_with("synthetic.gguf: "),
            "{e}"
        );
        for f in fragments {
            assert!(e.contains(f), "{e:?} lacks {f:?}");
        }
    };
    let named = set(tiny_gpt2(), "tokenizer.chat_template.rag", Some(s("x")));
    let named = set(named, "tokenizer.chat_template.tool_use", Some(s("y")));
    err(named, &["`tokenizer.chat_template`", "rag, tool_use"]);
    err(
        set(tiny_gpt2(), "tokenizer.chat_template", Some(Value::U32(0))),
        &["`tokenizer.chat_template`", "not a string"],
    );
    let with = set(
        tiny_gpt2(),
        "tokenizer.chat_template",
        Some(s("{{ bos_token }}")),
    );
    err(
        set(
            with.clone(),
            "tokenizer.ggml.bos_token_id",
            Some(Value::U32(99)),
        ),
        &["`tokenizer.ggml.bos_token_id`", "id 99 is out of range"],
    );
    err(
        set(with.clone(), "tokenizer.ggml.tokens", None),
        &["`tokenizer.ggml.tokens`", "missing"],
    );
    err(
        set(with, "tokenizer.chat_template", Some(s("{% if %}"))),
        &["chat template"],
    );
}
