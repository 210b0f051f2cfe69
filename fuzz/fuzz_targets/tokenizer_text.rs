//! The fixture tokenizers on arbitrary text and ids: a byte-level BPE `tokenizer.json`
//! (`bpe_small`), Kimi-style `tiktoken.model` (`kimi_o200k`), a byte-fallback BPE (`spm_small`)
//! and DeepSeek-V3's real `tokenizer.json`. Never a panic; and
//! - text: `decode(encode(text)) == text` where the Python reference round-trips too (every
//!   text for `bpe_small` without `<mask>`, whose `lstrip` eats a space, and for `kimi_o200k`;
//!   DeepSeek-V3 and `spm_small` normalise), and streaming the ids gives the full decode with
//!   no U+FFFD in any delta;
//! - ids (any, including ones past the vocabulary): the stream's deltas and flush concatenate
//!   to the full decode, and a delta holds U+FFFD only where the full decode does.
//!
//! Input: byte 0 picks the tokenizer, byte 1's low bit the mode; the rest is the text (lossy
//! UTF-8) or ids (3 bytes each, little-endian, taken modulo the vocabulary size + 16).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sluice::{StreamDecoder, Tokenizer};
use sluice_fuzz::{TOKENIZERS, tokenizer};

fn stream(tok: &Tokenizer, ids: &[u32]) -> Vec<String> {
    let mut d = StreamDecoder::new();
    let mut out: Vec<String> = ids
        .iter()
        .map(|&id| d.push(tok, id).expect("stream decode"))
        .collect();
    out.push(d.flush(tok).expect("flush"));
    out
}

fn check_stream(tok: &Tokenizer, ids: &[u32], full: &str) {
    let deltas = stream(tok, ids);
    // Deltas that concatenate to the full decode are pieces of it: a U+FFFD in a delta is one
    // the full decode has, and no character is ever emitted in parts.
    assert_eq!(
        deltas.concat(),
        full,
        "stream != decode for {ids:?}: {deltas:?}"
    );
}

fuzz_target!(|data: &[u8]| {
    let [which, mode, rest @ ..] = data else {
        return;
    };
    let which = *which as usize % TOKENIZERS.len();
    let name = TOKENIZERS[which];
    let tok = tokenizer(which);
    if mode % 2 == 0 {
        let text = String::from_utf8_lossy(rest);
        let ids = tok.encode(&text, false).expect("encode");
        let _ = tok.encode(&text, true).expect("encode with specials");
        let decoded = tok.decode(&ids).expect("decode");
        let round_trips = match name {
            "kimi_o200k" => true,
            "bpe_small" => !text.contains("<mask>"),
            _ => false,
        };
        if round_trips {
            assert_eq!(decoded, text, "{name}: round trip of {ids:?}");
        }
        check_stream(tok, &ids, &decoded);
    } else {
        // `vocab_size` builds the whole vocabulary map of a `tokenizer.json`: ask once.
        static VOCAB: [OnceLock<u32>; TOKENIZERS.len()] = [const { OnceLock::new() }; 4];
        let n = *VOCAB[which].get_or_init(|| tok.vocab_size() as u32) + 16;
        let ids: Vec<u32> = rest
            .chunks(3)
            .map(|c| {
                let mut b = [0u8; 4];
                b[..c.len()].copy_from_slice(c);
                u32::from_le_bytes(b) % n
            })
            .collect();
        let full = tok.decode(&ids).expect("decode");
        check_stream(tok, &ids, &full);
    }
});
