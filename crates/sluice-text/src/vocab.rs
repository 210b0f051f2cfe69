//! The bytes of text each token stands for: what a grammar engine needs to know which tokens
//! may follow a given prefix of output.
//!
//! A `tokenizer.json` writes its vocabulary in the alphabet of its decoder, not as text:
//! byte-level BPE maps each byte to a printable character (GPT-2's table), SentencePiece-style
//! vocabularies write a space as `▁` and bytes without a piece as `<0xNN>`. Here each form is
//! turned back into the bytes the decoder would produce for the token on its own, as
//! llguidance's `toktrie_hf_tokenizers` does. A decoder of neither kind falls back to decoding
//! each token alone. Special tokens (added tokens marked special, or written `<…>`) are listed
//! apart: they stand for no text, and a grammar allows them only where it names them.

use std::collections::HashMap;

use crate::tokenizer::{Inner, Tokenizer};

/// Every token's bytes, indexed by id.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VocabBytes {
    /// The bytes of text each id decodes to; for a special token, its written form (such as
    /// `<|im_end|>`); empty for an id that names nothing.
    pub tokens: Vec<Vec<u8>>,
    /// Whether each id is a special token.
    pub special: Vec<bool>,
}

/// GPT-2's byte-to-character table, inverted: the printable character byte-level BPE writes for
/// each byte.
fn byte_level_chars() -> HashMap<char, u8> {
    let self_mapped =
        |c: char| matches!(c, '!'..='~' | '\u{00A1}'..='\u{00AC}' | '\u{00AE}'..='\u{00FF}');
    let mut map = HashMap::with_capacity(256);
    let mut next = 0x100u32;
    for b in 0..=255u8 {
        let c = b as char;
        if self_mapped(c) {
            map.insert(c, b);
        } else {
            // 0x100.. are all valid scalar values.
            map.insert(char::from_u32(next).unwrap_or('\u{FFFD}'), b);
            next += 1;
        }
    }
    map
}

/// How a `tokenizer.json`'s decoder writes text.
#[derive(Debug, Default)]
struct Alphabet {
    byte_level: bool,
    byte_fallback: bool,
    /// The character that stands for a space (`▁` for SentencePiece), if the decoder replaces
    /// one.
    space: Option<char>,
}

fn alphabet(d: &tokenizers::DecoderWrapper, a: &mut Alphabet) {
    use tokenizers::DecoderWrapper as D;
    match d {
        D::ByteLevel(_) => a.byte_level = true,
        D::ByteFallback(_) => a.byte_fallback = true,
        D::Metaspace(m) => a.space = Some(m.get_replacement()),
        D::Replace(r) => {
            // The pattern is private; its serialized form names it.
            if let Ok(v) = serde_json::to_value(r)
                && v["content"].as_str() == Some(" ")
                && let Some(s) = v["pattern"]["String"].as_str()
            {
                let mut cs = s.chars();
                if let (Some(c), None) = (cs.next(), cs.next()) {
                    a.space = Some(c);
                }
            }
        }
        D::Sequence(s) => s.get_decoders().iter().for_each(|d| alphabet(d, a)),
        _ => {}
    }
}

fn byte_token(s: &str) -> Option<u8> {
    (s.len() == 6 && s.starts_with("<0x") && s.ends_with('>'))
        .then(|| u8::from_str_radix(&s[3..5], 16).ok())
        .flatten()
}

fn hf_vocab(t: &tokenizers::Tokenizer) -> VocabBytes {
    let n = t.get_vocab_size(true);
    let mut out = VocabBytes {
        tokens: vec![Vec::new(); n],
        special: vec![false; n],
    };
    let mut a = Alphabet::default();
    if let Some(d) = t.get_decoder() {
        alphabet(d, &mut a);
    }
    let chars = byte_level_chars();
    let added = t.get_added_tokens_decoder();
    for id in 0..n as u32 {
        let i = id as usize;
        if let Some(info) = added.get(&id) {
            if info.special || (info.content.starts_with('<') && info.content.ends_with('>')) {
                out.special[i] = true;
                out.tokens[i] = info.content.clone().into_bytes();
            } else {
                // A non-special added token is matched on the normalized text and stands for
                // its content as written.
                out.tokens[i] = info.content.clone().into_bytes();
            }
            continue;
        }
        let Some(piece) = t.id_to_token(id) else {
            continue;
        };
        out.tokens[i] = if a.byte_level {
            match piece.chars().map(|c| chars.get(&c).copied()).collect() {
                Some(b) => b,
                None => t.decode(&[id], false).unwrap_or_default().into_bytes(),
            }
        } else if a.byte_fallback && byte_token(&piece).is_some() {
            vec![byte_token(&piece).unwrap_or(0)]
        } else if let Some(sp) = a.space {
            piece.replace(sp, " ").into_bytes()
        } else {
            t.decode(&[id], false).unwrap_or_default().into_bytes()
        };
    }
    out
}

fn tiktoken_vocab(t: &crate::tiktoken::Tiktoken) -> VocabBytes {
    let n = t.vocab_size();
    let mut out = VocabBytes {
        tokens: vec![Vec::new(); n],
        special: vec![false; n],
    };
    for id in 0..n as u32 {
        if let Some(b) = t.token_bytes(id) {
            out.tokens[id as usize] = b.to_vec();
        }
    }
    for (name, &id) in t.special_tokens() {
        if let Some(i) = out.special.get_mut(id as usize) {
            *i = true;
            out.tokens[id as usize] = name.clone().into_bytes();
        }
    }
    out
}

impl Tokenizer {
    /// Every token's bytes ([`VocabBytes`]), for constrained decoding.
    pub fn vocab_bytes(&self) -> VocabBytes {
        match &self.inner {
            Inner::Hf(t) => hf_vocab(t),
            Inner::Tiktoken(t) => tiktoken_vocab(t),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn byte_level_table_inverts_gpt2s() {
        let m = super::byte_level_chars();
        assert_eq!(m.len(), 256);
        assert_eq!(m[&'Ġ'], b' ');
        assert_eq!(m[&'Ċ'], b'\n');
        assert_eq!(m[&'a'], b'a');
        assert_eq!(super::byte_token("<0x0A>"), Some(10));
        assert_eq!(super::byte_token("<0xZZ>"), None);
    }
}
