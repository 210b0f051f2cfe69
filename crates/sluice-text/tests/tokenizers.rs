//! Tokenizer and chat-template parity with the Python reference packages.
//!
//! The fixtures under `testdata/tokenizers/` were made by `tools/reference/tokenizer_fixtures.py`
//! (see the README there): ids and decodes from the `tokenizers` and `tiktoken` packages, renders
//! from transformers' `apply_chat_template`. These tests load the same files through
//! `sluice_text::Tokenizer` and `sluice_text::ChatTemplate` and demand identical output, and check that
//! `StreamDecoder` never emits text it would later have to take back.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proptest::prelude::*;
use serde_json::Value;
use sluice_text::{ChatTemplate, Message, StreamDecoder, Tokenizer};

const TOKENIZERS: [&str; 4] = ["deepseek_v3", "kimi_o200k", "bpe_small", "spm_small"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tokenizers")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A fixture tokenizer's directory, with its gzipped files unpacked (once, into the target's
/// temporary directory).
fn tokenizer_dir(name: &str) -> PathBuf {
    let src = root().join(name);
    let gz: Vec<PathBuf> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "gz"))
        .collect();
    if gz.is_empty() {
        return src;
    }
    let dst = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("sluice-tokenizers/{name}"));
    std::fs::create_dir_all(&dst).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let p = entry.unwrap().path();
        let file = p.file_name().unwrap().to_str().unwrap().to_owned();
        let (target, data) = if let Some(stem) = file.strip_suffix(".gz") {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(std::fs::File::open(&p).unwrap())
                .read_to_end(&mut out)
                .unwrap();
            (dst.join(stem), out)
        } else {
            (dst.join(&file), std::fs::read(&p).unwrap())
        };
        if std::fs::read(&target).ok().as_deref() != Some(&data[..]) {
            let tmp = target.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, &data).unwrap();
            std::fs::rename(&tmp, &target).unwrap();
        }
    }
    dst
}

fn tokenizer(name: &str) -> &'static Tokenizer {
    static CELLS: [OnceLock<Tokenizer>; 4] = [const { OnceLock::new() }; 4];
    let i = TOKENIZERS.iter().position(|n| *n == name).unwrap();
    CELLS[i].get_or_init(|| {
        Tokenizer::from_dir(&tokenizer_dir(name))
            .unwrap()
            .unwrap_or_else(|| panic!("{name}: no tokenizer"))
    })
}

fn expected(name: &str) -> &'static Value {
    static CELLS: [OnceLock<Value>; 4] = [const { OnceLock::new() }; 4];
    let i = TOKENIZERS.iter().position(|n| *n == name).unwrap();
    CELLS[i].get_or_init(|| read_json(&root().join(format!("expected/{name}.json"))))
}

fn texts() -> &'static Vec<(String, String)> {
    static T: OnceLock<Vec<(String, String)>> = OnceLock::new();
    T.get_or_init(|| {
        read_json(&root().join("texts.json"))
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                (
                    t["name"].as_str().unwrap().to_owned(),
                    t["text"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    })
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Encode and decode parity

fn check_encodings(name: &str) {
    let tok = tokenizer(name);
    let exp = expected(name);
    assert_eq!(
        tok.vocab_size() as u64,
        exp["vocab_size"].as_u64().unwrap(),
        "{name}: vocab size"
    );
    let encs = exp["encodings"].as_array().unwrap();
    assert_eq!(encs.len(), texts().len());
    let mut failures = Vec::new();
    for (e, (tname, text)) in encs.iter().zip(texts()) {
        assert_eq!(e["name"].as_str().unwrap(), tname);
        let want = ids(&e["ids"]);
        let got = tok.encode(text, false).unwrap();
        if got != want {
            let at = got
                .iter()
                .zip(&want)
                .position(|(a, b)| a != b)
                .unwrap_or(got.len().min(want.len()));
            failures.push(format!(
                "{tname}: ids differ at {at} (got {} ids, python {}): got {:?}, python {:?}",
                got.len(),
                want.len(),
                &got[at.saturating_sub(2)..(at + 6).min(got.len())],
                &want[at.saturating_sub(2)..(at + 6).min(want.len())],
            ));
        }
        if let Some(w) = e.get("ids_add_special") {
            let got = tok.encode(text, true).unwrap();
            if got != ids(w) {
                failures.push(format!("{tname}: ids with special tokens differ"));
            }
        }
        let dec = tok.decode(&want).unwrap();
        if dec != e["decoded"].as_str().unwrap() {
            failures.push(format!("{tname}: decode differs: {dec:?}"));
        }
        if e["roundtrip"].as_bool().unwrap() && dec.as_bytes() != text.as_bytes() {
            failures.push(format!("{tname}: decode does not round-trip"));
        }
    }
    assert!(failures.is_empty(), "{name}:\n{}", failures.join("\n"));
}

fn check_decodes(name: &str) {
    let tok = tokenizer(name);
    let mut failures = Vec::new();
    for c in expected(name)["decodes"].as_array().unwrap() {
        let ids = ids(&c["ids"]);
        let got = tok.decode(&ids).unwrap();
        if got != c["text"].as_str().unwrap() {
            failures.push(format!("{ids:?}: got {got:?}, python {:?}", c["text"]));
        }
    }
    assert!(failures.is_empty(), "{name}:\n{}", failures.join("\n"));
}

#[test]
fn deepseek_v3_ids_match_python() {
    check_encodings("deepseek_v3");
}

#[test]
fn kimi_tiktoken_ids_match_python() {
    check_encodings("kimi_o200k");
}

#[test]
fn bytelevel_bpe_ids_match_python() {
    check_encodings("bpe_small");
}

#[test]
fn sentencepiece_style_ids_match_python() {
    check_encodings("spm_small");
}

#[test]
fn lossy_decodes_match_python() {
    for name in TOKENIZERS {
        check_decodes(name);
    }
}

#[test]
fn kimi_layout() {
    let tok = tokenizer("kimi_o200k");
    assert_eq!(tok.vocab_size(), 163_840);
    assert_eq!(tok.token_id("[BOS]"), Some(163_584));
    assert_eq!(tok.token_id("[EOS]"), Some(163_585));
    assert_eq!(tok.token_id("<|im_middle|>"), Some(163_601));
    assert_eq!(tok.token_id("<|reserved_token_163700|>"), Some(163_700));
    assert_eq!(
        tok.encode("[BOS]<|im_end|>", true).unwrap(),
        [163_584, 163_586]
    );
}

// ---------------------------------------------------------------------------------------------
// Streaming decode

/// Feeds `ids` one at a time; every delta must continue the full decode exactly (so no broken
/// character and no U+FFFD the full text lacks is ever emitted), and deltas + flush must equal
/// the full decode.
fn check_stream(tok: &Tokenizer, ids: &[u32]) -> Result<(), String> {
    let full = tok.decode(ids).map_err(|e| e.to_string())?;
    let mut dec = StreamDecoder::new();
    let mut at = 0;
    for (i, &id) in ids.iter().enumerate() {
        let d = dec.push(tok, id).map_err(|e| e.to_string())?;
        if !full[at..].starts_with(&d) {
            return Err(format!(
                "{ids:?}: step {i} emitted {d:?}, but the full decode continues {:?}",
                &full[at..]
            ));
        }
        at += d.len();
    }
    let rest = dec.flush(tok).map_err(|e| e.to_string())?;
    if full[at..] != rest {
        return Err(format!(
            "{ids:?}: flush gave {rest:?}, expected {:?}",
            &full[at..]
        ));
    }
    Ok(())
}

#[test]
fn stream_decoder_on_fixture_sequences() {
    for name in TOKENIZERS {
        let tok = tokenizer(name);
        let exp = expected(name);
        for e in exp["encodings"].as_array().unwrap() {
            let ids = ids(&e["ids"]);
            let ids = &ids[..ids.len().min(3000)];
            check_stream(tok, ids).unwrap_or_else(|m| panic!("{name}/{}: {m}", e["name"]));
        }
        for c in exp["decodes"].as_array().unwrap() {
            check_stream(tok, &ids(&c["ids"])).unwrap_or_else(|m| panic!("{name}: {m}"));
        }
    }
}

/// Sequences the `tokenizer_text` fuzz target found (fuzz/, docs/RELIABILITY.md), minimized.
#[test]
fn stream_decoder_fuzz_regressions() {
    // spm_small: `<0x70>`, an id past the vocabulary, `<0x9C>`. The unknown id decodes to
    // nothing, so the full decode sees one invalid byte run (two U+FFFD); the stream decoder
    // used to end the run at the unknown id and emit `p`.
    check_stream(tokenizer("spm_small"), &[115, 1171, 160]).unwrap();
}

fn byte_ids(name: &str) -> Vec<u32> {
    ids(&expected(name)["byte_ids"])
}

fn stream_strategy(name: &'static str) -> impl Strategy<Value = Vec<u32>> {
    let vocab = tokenizer(name).vocab_size() as u32;
    let bytes = byte_ids(name);
    // Mostly bytes of multi-byte characters, so sequences split characters in every way.
    let id = prop_oneof![
        1 => 0..vocab,
        3 => proptest::sample::select(bytes),
    ];
    proptest::collection::vec(id, 0..24)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn stream_decoder_deepseek(ids in stream_strategy("deepseek_v3")) {
        check_stream(tokenizer("deepseek_v3"), &ids).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn stream_decoder_kimi(ids in stream_strategy("kimi_o200k")) {
        check_stream(tokenizer("kimi_o200k"), &ids).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn stream_decoder_bytelevel(ids in stream_strategy("bpe_small")) {
        check_stream(tokenizer("bpe_small"), &ids).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn stream_decoder_byte_fallback(ids in stream_strategy("spm_small")) {
        check_stream(tokenizer("spm_small"), &ids).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn kimi_encode_round_trips(s in "\\PC{0,40}|[ \t\r\n\u{3000}a-z'漢字]{0,60}") {
        let tok = tokenizer("kimi_o200k");
        let ids = tok.encode(&s, false).unwrap();
        prop_assert_eq!(tok.decode(&ids).unwrap(), s);
    }
}

// ---------------------------------------------------------------------------------------------
// Chat templates

#[test]
fn chat_templates_match_transformers() {
    let chat = root().join("chat");
    let convs = read_json(&chat.join("conversations.json"));
    let exp = read_json(&chat.join("expected.json"));
    let renders = exp["renders"].as_object().unwrap();
    let mut failures = Vec::new();
    let mut n = 0;
    for (name, specials) in exp["special_tokens_maps"].as_object().unwrap() {
        let tpl = ChatTemplate::from_dir(&chat.join(name)).unwrap().unwrap();
        let mut want: Vec<(String, String)> = specials
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
            .collect();
        let mut got = tpl.special_tokens().to_vec();
        want.sort();
        got.sort();
        assert_eq!(got, want, "{name}: special tokens");
        for conv in convs.as_array().unwrap() {
            let cname = conv["name"].as_str().unwrap();
            // Through `Message`, whose fields keep Python's key order (role, content);
            // serde_json's own maps would sort them.
            let messages: Vec<Message> = serde_json::from_value(conv["messages"].clone()).unwrap();
            for agp in [false, true] {
                let key = format!("{name}/{cname}/{}", if agp { "gen" } else { "nogen" });
                let want = &renders[&key];
                let got = tpl.render(&messages, agp);
                n += 1;
                match (got, want.get("text").and_then(Value::as_str)) {
                    (Ok(g), Some(w)) if g == w => {}
                    (Ok(g), Some(w)) => {
                        let at = g
                            .bytes()
                            .zip(w.bytes())
                            .position(|(a, b)| a != b)
                            .unwrap_or(g.len().min(w.len()));
                        let ctx = |s: &str| {
                            let mut a = at.saturating_sub(40);
                            while !s.is_char_boundary(a) {
                                a -= 1;
                            }
                            let mut b = (at + 60).min(s.len());
                            while !s.is_char_boundary(b) {
                                b += 1;
                            }
                            s[a..b].to_owned()
                        };
                        failures.push(format!(
                            "{key}: differs at byte {at}:\n  sluice: {:?}\n  python: {:?}",
                            ctx(&g),
                            ctx(w)
                        ));
                    }
                    (Ok(_), None) => failures.push(format!(
                        "{key}: rendered, but transformers raised {:?}",
                        want["error"]
                    )),
                    (Err(e), Some(_)) => failures.push(format!("{key}: failed: {e}")),
                    (Err(e), None) => {
                        let msg = want["error"].as_str().unwrap();
                        if !e.to_string().contains(msg) {
                            failures.push(format!("{key}: error {e} lacks {msg:?}"));
                        }
                    }
                }
            }
        }
    }
    assert!(n >= 100, "only {n} renders");
    assert!(
        failures.is_empty(),
        "{} of {n} renders differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// Token bytes (what constrained decoding matches text against)

/// The bytes `vocab_bytes` gives each of Python's ids, end to end, are the text itself (a
/// SentencePiece vocabulary writes the first word's space, which its decoder strips).
fn check_vocab_bytes(name: &str) {
    let tok = tokenizer(name);
    let vb = tok.vocab_bytes();
    assert_eq!(vb.tokens.len(), tok.vocab_size(), "{name}");
    assert_eq!(vb.special.len(), tok.vocab_size(), "{name}");
    let mut checked = 0;
    let mut failures = Vec::new();
    for (e, (tname, text)) in expected(name)["encodings"]
        .as_array()
        .unwrap()
        .iter()
        .zip(texts())
    {
        if !e["roundtrip"].as_bool().unwrap() {
            continue;
        }
        let ids = ids(&e["ids"]);
        let cat: Vec<u8> = ids
            .iter()
            .flat_map(|&i| vb.tokens[i as usize].iter().copied())
            .collect();
        let spaced = [b" ".as_slice(), text.as_bytes()].concat();
        if cat != text.as_bytes() && cat != spaced {
            failures.push(format!("{tname}: {:?}", String::from_utf8_lossy(&cat)));
        }
        checked += 1;
    }
    assert!(checked > 5, "{name}: only {checked} texts round-trip");
    assert!(failures.is_empty(), "{name}:\n{}", failures.join("\n"));
}

#[test]
fn token_bytes_spell_the_text_for_every_tokenizer_kind() {
    for name in TOKENIZERS {
        check_vocab_bytes(name);
    }
    // Special tokens are marked, and stand for their written form.
    let ds = tokenizer("deepseek_v3");
    let vb = ds.vocab_bytes();
    let eos = ds.token_id("<｜end▁of▁sentence｜>").unwrap() as usize;
    assert!(vb.special[eos]);
    assert_eq!(vb.tokens[eos], "<｜end▁of▁sentence｜>".as_bytes());
    assert!(!vb.special[ds.token_id("Ġthe").unwrap() as usize]);
}
