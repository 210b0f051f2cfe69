//! The `tiktoken.model` ranks parser (`Tiktoken::new(ranks, specials, pattern)`) on arbitrary
//! tables, special tokens and split patterns: an error, or an encoder that never panics and
//! whose every id decodes back to the text it came from (`encode` and `encode_ordinary`), each
//! id inside the vocabulary.
//!
//! Input sections are separated by 0xFF bytes (never in UTF-8): flags, ranks text, special
//! tokens (`id text` per line), split pattern, text to encode. Flag bit 0 prepends a complete
//! single-byte table (ranks 0..=255) so that short inputs reach the merges; bits 1-2 choose the
//! split pattern: 1 the pattern section, 2 Kimi's, otherwise a small ASCII pattern in the same
//! style (Kimi's Unicode classes take a large part of a second to compile with the sanitizer,
//! which would starve the fuzzer; its behaviour on text is `tokenizer_text`'s subject).
#![no_main]

use base64::Engine as _;
use libfuzzer_sys::fuzz_target;
use sluice::tiktoken::{KIMI_PATTERN, Tiktoken};

const ASCII_PATTERN: &str =
    r"[A-Z]*[a-z]+(?i:'s|'t|'re)?|[0-9]{1,3}| ?[^\sA-Za-z0-9]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fuzz_target!(|data: &[u8]| {
    let mut sec = data.splitn(5, |&b| b == 0xFF);
    let flags = sec.next().and_then(|f| f.first().copied()).unwrap_or(0);
    let ranks = String::from_utf8_lossy(sec.next().unwrap_or_default());
    let specials_text = String::from_utf8_lossy(sec.next().unwrap_or_default());
    let pattern = String::from_utf8_lossy(sec.next().unwrap_or_default());
    let text = String::from_utf8_lossy(sec.next().unwrap_or_default());

    let ranks = if flags & 1 == 1 {
        let b64 = &base64::engine::general_purpose::STANDARD;
        let mut t: String = (0..=255u8)
            .map(|b| format!("{} {b}\n", b64.encode([b])))
            .collect();
        t.push_str(&ranks);
        t
    } else {
        ranks.into_owned()
    };
    let specials: Vec<(String, u32)> = specials_text
        .lines()
        .filter_map(|l| {
            let (id, s) = l.split_once(' ')?;
            Some((s.to_owned(), id.parse().ok()?))
        })
        .collect();
    let pattern = match (flags >> 1) & 3 {
        1 => &pattern[..],
        2 => KIMI_PATTERN,
        _ => ASCII_PATTERN,
    };
    let Ok(t) = Tiktoken::new(&ranks, specials, pattern) else {
        return;
    };
    let n = t.vocab_size();
    for ids in [t.encode(&text), t.encode_ordinary(&text)] {
        assert!(
            ids.iter().all(|&i| (i as usize) < n),
            "id past the vocabulary"
        );
        assert!(
            t.decode_bytes(&ids) == text.as_bytes(),
            "round trip of {text:?} through {ids:?}"
        );
    }
});
