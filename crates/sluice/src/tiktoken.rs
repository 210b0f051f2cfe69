//! Kimi's `tiktoken.model` tokenizer: byte-level BPE by merge rank, as the `tiktoken` package
//! computes it.
//!
//! `tiktoken.model` holds one `base64(token bytes) rank` pair per line. Special tokens come from
//! `tokenizer_config.json` (`added_tokens_decoder`); the split pattern from its `pat_str` when
//! present, else Kimi's published pattern ([`KIMI_PATTERN`]).

use std::collections::HashMap;
use std::path::Path;

use base64::Engine as _;
use fancy_regex::Regex;

use crate::Error;

/// The pre-tokenisation pattern of Kimi K2 / K3 (`tokenization_kimi.py`). It intersects letter
/// classes with `[^\p{Han}]` so Han runs split apart from other letters.
pub const KIMI_PATTERN: &str = concat!(
    r"[\p{Han}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"|\s*[\r\n]+",
    r"|\s+(?!\S)",
    r"|\s+",
);

/// A rank-based byte-pair encoder.
pub struct Tiktoken {
    encoder: HashMap<Vec<u8>, u32>,
    decoder: HashMap<u32, Vec<u8>>,
    specials: HashMap<String, u32>,
    special_re: Option<Regex>,
    pattern: Regex,
    vocab: usize,
}

impl Tiktoken {
    /// Loads `tiktoken.model` and `tokenizer_config.json` from a model directory.
    pub fn from_dir(dir: &Path) -> Result<Tiktoken, Error> {
        let model = dir.join("tiktoken.model");
        let text = std::fs::read_to_string(&model).map_err(|e| Error::Io {
            path: model.clone(),
            source: e,
        })?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg = if cfg_path.exists() {
            Some(sluice_format::read_json(&cfg_path, 64 << 20)?)
        } else {
            None
        };
        let specials: Vec<(String, u32)> = cfg
            .as_ref()
            .and_then(|c| c.get("added_tokens_decoder"))
            .and_then(|d| d.as_object())
            .map(|d| {
                d.iter()
                    .filter_map(|(id, v)| {
                        Some((v.get("content")?.as_str()?.to_owned(), id.parse().ok()?))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let pattern = cfg
            .as_ref()
            .and_then(|c| c.get("pat_str"))
            .and_then(|p| p.as_str())
            .unwrap_or(KIMI_PATTERN);
        Tiktoken::new(&text, specials, pattern).map_err(|msg| Error::Tokenizer { path: model, msg })
    }

    /// Builds an encoder from the text of a ranks file, special tokens and a split pattern.
    pub fn new(
        ranks: &str,
        specials: Vec<(String, u32)>,
        pattern: &str,
    ) -> Result<Tiktoken, String> {
        let mut encoder = HashMap::new();
        let mut decoder = HashMap::new();
        for (n, line) in ranks.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let (tok, rank) = line
                .split_once(' ')
                .ok_or_else(|| format!("line {}: expected `<base64> <rank>`", n + 1))?;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(tok)
                .map_err(|e| format!("line {}: bad base64: {e}", n + 1))?;
            let rank: u32 = rank
                .trim()
                .parse()
                .map_err(|_| format!("line {}: bad rank `{rank}`", n + 1))?;
            decoder.insert(rank, bytes.clone());
            encoder.insert(bytes, rank);
        }
        let mut vocab = decoder.keys().max().map_or(0, |&m| m as usize + 1);
        let mut special_map = HashMap::new();
        for (s, id) in specials {
            vocab = vocab.max(id as usize + 1);
            decoder.insert(id, s.clone().into_bytes());
            special_map.insert(s, id);
        }
        let special_re = if special_map.is_empty() {
            None
        } else {
            // Longest first so that a special token never matches as a prefix of a longer one.
            let mut names: Vec<&String> = special_map.keys().collect();
            names.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
            let alt: Vec<String> = names
                .iter()
                .map(|s| fancy_regex::escape(s).into_owned())
                .collect();
            Some(Regex::new(&alt.join("|")).map_err(|e| format!("special tokens: {e}"))?)
        };
        let pattern = Regex::new(pattern).map_err(|e| format!("split pattern: {e}"))?;
        Ok(Tiktoken {
            encoder,
            decoder,
            specials: special_map,
            special_re,
            pattern,
            vocab,
        })
    }

    /// Vocabulary size (ranks and specials).
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// The id of a special token or of a token whose bytes are `s`.
    pub fn token_id(&self, s: &str) -> Option<u32> {
        self.specials
            .get(s)
            .copied()
            .or_else(|| self.encoder.get(s.as_bytes()).copied())
    }

    /// Encodes text; special tokens written in it become their ids.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        let mut start = 0;
        if let Some(re) = &self.special_re {
            for m in re.find_iter(text).flatten() {
                self.encode_ordinary(&text[start..m.start()], &mut out);
                out.push(self.specials[m.as_str()]);
                start = m.end();
            }
        }
        self.encode_ordinary(&text[start..], &mut out);
        out
    }

    fn encode_ordinary(&self, text: &str, out: &mut Vec<u32>) {
        let mut at = 0;
        while at < text.len() {
            // A regex error (backtrack limit) on hostile input: fall back to one piece.
            let m = match self.pattern.find_from_pos(text, at) {
                Ok(Some(m)) if m.end() > at => m.start()..m.end(),
                _ => at..text.len(),
            };
            if m.start > at {
                self.bpe(&text.as_bytes()[at..m.start], out);
            }
            self.bpe(&text.as_bytes()[m.clone()], out);
            at = m.end;
        }
    }

    fn rank(&self, b: &[u8]) -> Option<u32> {
        self.encoder.get(b).copied()
    }

    /// tiktoken's byte-pair merge: repeatedly merge the adjacent pair of lowest rank.
    fn bpe(&self, piece: &[u8], out: &mut Vec<u32>) {
        if piece.is_empty() {
            return;
        }
        if let Some(r) = self.rank(piece) {
            out.push(r);
            return;
        }
        let mut parts: Vec<usize> = (0..=piece.len()).collect();
        loop {
            let mut best: Option<(u32, usize)> = None;
            for i in 0..parts.len().saturating_sub(2) {
                if let Some(r) = self.rank(&piece[parts[i]..parts[i + 2]])
                    && best.is_none_or(|(br, _)| r < br)
                {
                    best = Some((r, i));
                }
            }
            match best {
                Some((_, i)) => {
                    parts.remove(i + 1);
                }
                None => break,
            }
        }
        for w in parts.windows(2) {
            // Every single byte has a rank in a byte-level table; an incomplete table maps an
            // unknown byte to nothing rather than panicking.
            if let Some(r) = self.rank(&piece[w[0]..w[1]]) {
                out.push(r);
            }
        }
    }

    /// The bytes of a sequence of ids (unknown ids decode to nothing).
    pub fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        ids.iter()
            .filter_map(|i| self.decoder.get(i))
            .flatten()
            .copied()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy() -> Tiktoken {
        // Ranks: all single bytes, then a few merges.
        let mut lines = Vec::new();
        for b in 0..=255u8 {
            lines.push(format!(
                "{} {}",
                base64::engine::general_purpose::STANDARD.encode([b]),
                b
            ));
        }
        for (i, s) in ["he", "ll", "hell", "hello", " w", "or"].iter().enumerate() {
            lines.push(format!(
                "{} {}",
                base64::engine::general_purpose::STANDARD.encode(s),
                256 + i
            ));
        }
        Tiktoken::new(
            &lines.join("\n"),
            vec![("<|end|>".into(), 300)],
            KIMI_PATTERN,
        )
        .unwrap()
    }

    #[test]
    fn merges_by_rank_and_round_trips() {
        let t = toy();
        let ids = t.encode("hello world<|end|>");
        assert_eq!(ids[0], 259); // "hello"
        assert_eq!(*ids.last().unwrap(), 300);
        assert_eq!(t.decode_bytes(&ids), b"hello world<|end|>");
        for s in [
            "日本語のテキスト",
            "emoji 👩‍👩‍👧 ok",
            "مرحبا بالعالم",
            "fn main() {\n    x\t\t}\n\n\n",
            "   ",
        ] {
            assert_eq!(t.decode_bytes(&t.encode(s)), s.as_bytes(), "{s}");
        }
    }

    #[test]
    fn han_splits_from_latin() {
        let t = toy();
        let m: Vec<&str> = t
            .pattern
            .find_iter("abc漢字def")
            .flatten()
            .map(|m| m.as_str())
            .collect();
        assert_eq!(m, vec!["abc", "漢字", "def"]);
    }
}
