//! Kimi's `tiktoken.model` tokenizer: byte-level BPE by merge rank, as the Python `tiktoken`
//! package computes it, driven the way Kimi's `TikTokenTokenizer.encode` drives it.
//!
//! `tiktoken.model` holds one `base64(token bytes) rank` pair per line; every single byte must
//! have a rank (a byte-level table), and no rank or token may appear twice. Special tokens come
//! from `tokenizer_config.json` (`added_tokens_decoder`); ids from the rank count up to 256 past
//! it that the config does not name are called `<|reserved_token_{id}|>`, as Kimi's tokenizer
//! calls them (Kimi's Python code reserves two more ids, past the model's 163,840-row embedding;
//! sluice stops at 256). The split pattern is the config's `pat_str` when present (a sluice extension),
//! else Kimi's published pattern ([`KIMI_PATTERN`]).
//!
//! Encoding follows Kimi's `TikTokenTokenizer.encode` with special tokens allowed:
//! 1. the text is cut into chunks of at most 400,000 characters, and each chunk into pieces with
//!    no more than 25,000 consecutive whitespace (Python `str.isspace`) or non-whitespace
//!    characters;
//! 2. in each piece, special tokens written in the text become their ids;
//! 3. the text between them is split with the pattern (`fancy-regex`, the engine `tiktoken`
//!    itself uses) and each match is merged by rank: repeatedly the adjacent pair whose
//!    concatenation has the lowest rank, leftmost first. Short matches use `tiktoken`'s own
//!    quadratic scan, long ones (a run of 10,000 spaces) an equivalent heap-ordered merge that
//!    is O(n log n).
//!
//! The pattern covers every character, so nothing falls between matches; with a custom
//! `pat_str` that does not, sluice encodes the gap as its own piece where `tiktoken` would drop
//! it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::path::Path;

use base64::Engine as _;
use fancy_regex::Regex;

use crate::Error;

/// The pre-tokenisation pattern of Kimi K2 / K3: `TikTokenTokenizer.pat_str` of Kimi's
/// `tokenization_kimi.py`, alternatives joined with `|` in the same order. The letter classes are
/// intersected with `[^\p{Han}]` so Han runs split apart from other letters.
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

/// Kimi's encoder cuts text into chunks of this many characters.
const MAX_CHUNK_CHARS: usize = 400_000;
/// ... and chunks into pieces with at most this many consecutive whitespace or non-whitespace
/// characters.
const MAX_RUN_CHARS: usize = 25_000;
/// How many special ids past the ranks get a reserved name when the config does not name them.
const RESERVED_SPECIALS: usize = 256;
/// Ranks and special ids above this are refused (a hostile file cannot make us allocate more).
const MAX_ID: u32 = 1 << 24;
/// Pieces longer than this merge through the heap; shorter ones through `tiktoken`'s scan.
const SHORT_PIECE: usize = 128;

/// A rank-based byte-pair encoder.
pub struct Tiktoken {
    encoder: HashMap<Box<[u8]>, u32, FxBuild>,
    /// Bytes of each id (ranks and specials); empty for ids nothing names.
    decoder: Vec<Box<[u8]>>,
    n_ranks: usize,
    specials: HashMap<String, u32>,
    special_re: Option<Regex>,
    pattern: Regex,
}

impl std::fmt::Debug for Tiktoken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tiktoken")
            .field("ranks", &self.n_ranks)
            .field("specials", &self.specials.len())
            .finish()
    }
}

impl Tiktoken {
    /// Loads `tiktoken.model` and `tokenizer_config.json` (optional) from a model directory.
    pub fn from_dir(dir: &Path) -> Result<Tiktoken, Error> {
        let model = dir.join("tiktoken.model");
        let bytes = sluice_format::file::read_capped(&model, crate::tokenizer::MAX_SMALL_FILE_LEN)?;
        let text = String::from_utf8(bytes).map_err(|_| Error::Tokenizer {
            path: model.clone(),
            msg: "not valid UTF-8".into(),
        })?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg = if sluice_format::file::present(&cfg_path) {
            Some(sluice_format::read_json(
                &cfg_path,
                crate::tokenizer::MAX_SMALL_FILE_LEN,
            )?)
        } else {
            None
        };
        let mut specials: Vec<(String, u32)> = Vec::new();
        if let Some(d) = cfg
            .as_ref()
            .and_then(|c| c.get("added_tokens_decoder"))
            .and_then(|d| d.as_object())
        {
            for (id, v) in d {
                let content = v.get("content").and_then(|c| c.as_str());
                let (Some(content), Ok(id)) = (content, id.parse::<u32>()) else {
                    return Err(Error::Tokenizer {
                        path: cfg_path,
                        msg: format!("added_tokens_decoder: bad entry `{id}`"),
                    });
                };
                crate::tokenizer::check_added_token(
                    &cfg_path,
                    &format!("added_tokens_decoder `{id}`"),
                    content,
                )?;
                specials.push((content.to_owned(), id));
            }
        }
        let pattern = cfg
            .as_ref()
            .and_then(|c| c.get("pat_str"))
            .and_then(|p| p.as_str())
            .unwrap_or(KIMI_PATTERN);
        Tiktoken::new(&text, specials, pattern).map_err(|msg| Error::Tokenizer { path: model, msg })
    }

    /// Builds an encoder from the text of a ranks file, special tokens and a split pattern.
    /// Ids from the rank count up to 256 past it that `specials` leaves out get reserved names.
    pub fn new(
        ranks: &str,
        specials: Vec<(String, u32)>,
        pattern: &str,
    ) -> Result<Tiktoken, String> {
        let mut encoder: HashMap<Box<[u8]>, u32, FxBuild> =
            HashMap::with_capacity_and_hasher(ranks.len() / 16, FxBuild);
        let mut decoder: Vec<Box<[u8]>> = Vec::new();
        let b64 = &base64::engine::general_purpose::STANDARD;
        for (n, line) in ranks.lines().enumerate() {
            let mut fields = line.split_ascii_whitespace();
            let Some(tok) = fields.next() else {
                continue;
            };
            let (Some(rank), None) = (fields.next(), fields.next()) else {
                return Err(format!("line {}: expected `<base64> <rank>`", n + 1));
            };
            let bytes = b64
                .decode(tok)
                .map_err(|e| format!("line {}: bad base64: {e}", n + 1))?;
            let rank: u32 = rank
                .parse()
                .ok()
                .filter(|&r| r < MAX_ID)
                .ok_or_else(|| format!("line {}: bad rank `{rank}`", n + 1))?;
            if bytes.is_empty() {
                return Err(format!("line {}: empty token", n + 1));
            }
            let r = rank as usize;
            if decoder.len() <= r {
                decoder.resize(r + 1, Box::default());
            }
            if !decoder[r].is_empty() {
                return Err(format!("line {}: rank {rank} given twice", n + 1));
            }
            decoder[r] = bytes.clone().into_boxed_slice();
            if encoder.insert(bytes.into_boxed_slice(), rank).is_some() {
                return Err(format!("line {}: token of rank {rank} given twice", n + 1));
            }
        }
        if let Some(b) = (0..=255u8).find(|b| !encoder.contains_key(&[*b][..])) {
            return Err(format!(
                "not a byte-level table: byte 0x{b:02x} has no rank"
            ));
        }
        let n_ranks = encoder.len();
        let mut special_map = HashMap::new();
        let mut named = std::collections::HashSet::new();
        for (s, id) in specials {
            if id >= MAX_ID {
                return Err(format!("special token `{s}`: id {id} out of range"));
            }
            named.insert(id);
            special_map.insert(s, id);
        }
        for id in n_ranks..n_ranks + RESERVED_SPECIALS {
            let id = id as u32;
            if !named.contains(&id) && decoder.get(id as usize).is_none_or(|d| d.is_empty()) {
                special_map.insert(format!("<|reserved_token_{id}|>"), id);
            }
        }
        for (s, &id) in &special_map {
            let i = id as usize;
            if decoder.len() <= i {
                decoder.resize(i + 1, Box::default());
            }
            if !decoder[i].is_empty() {
                return Err(format!(
                    "special token `{s}`: id {id} is already a rank or another special token"
                ));
            }
            decoder[i] = s.as_bytes().into();
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
            n_ranks,
            specials: special_map,
            special_re,
            pattern,
        })
    }

    /// Vocabulary size: one past the largest id (ranks and specials).
    pub fn vocab_size(&self) -> usize {
        self.decoder.len()
    }

    /// How many ranks the table holds.
    pub fn n_ranks(&self) -> usize {
        self.n_ranks
    }

    /// The special tokens and their ids.
    pub fn special_tokens(&self) -> &HashMap<String, u32> {
        &self.specials
    }

    /// The id of a special token or of a token whose bytes are `s`.
    pub fn token_id(&self, s: &str) -> Option<u32> {
        self.specials
            .get(s)
            .copied()
            .or_else(|| self.encoder.get(s.as_bytes()).copied())
    }

    /// Encodes text as Kimi's tokenizer does; special tokens written in it become their ids.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3);
        for chunk in kimi_chunks(text) {
            self.encode_with_specials(chunk, &mut out);
        }
        out
    }

    /// Encodes text with no special tokens and no chunking: plain `tiktoken`
    /// `encode_ordinary`.
    pub fn encode_ordinary(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3);
        self.encode_plain(text, &mut out);
        out
    }

    fn encode_with_specials(&self, text: &str, out: &mut Vec<u32>) {
        let mut start = 0;
        if let Some(re) = &self.special_re {
            // A plain alternation of literals: the regex crate runs it, no backtracking limit.
            for m in re.find_iter(text).flatten() {
                self.encode_plain(&text[start..m.start()], out);
                out.push(self.specials[m.as_str()]);
                start = m.end();
            }
        }
        self.encode_plain(&text[start..], out);
    }

    fn encode_plain(&self, text: &str, out: &mut Vec<u32>) {
        let mut at = 0;
        while at < text.len() {
            // A regex error (backtracking limit) on hostile input: fall back to one piece.
            let m = match self.pattern.find_from_pos(text, at) {
                Ok(Some(m)) if m.end() > m.start() => m.start()..m.end(),
                Ok(None) => text.len()..text.len(),
                _ => at..text.len(),
            };
            if m.start > at {
                self.bpe(&text.as_bytes()[at..m.start], out);
            }
            self.bpe(&text.as_bytes()[m.clone()], out);
            at = m.end.max(at + 1);
            while !text.is_char_boundary(at) {
                at += 1;
            }
        }
    }

    fn rank(&self, b: &[u8]) -> Option<u32> {
        self.encoder.get(b).copied()
    }

    fn bpe(&self, piece: &[u8], out: &mut Vec<u32>) {
        if piece.is_empty() {
            return;
        }
        if let Some(r) = self.rank(piece) {
            out.push(r);
            return;
        }
        let bounds = if piece.len() <= SHORT_PIECE {
            self.merge_scan(piece)
        } else {
            self.merge_heap(piece)
        };
        for w in bounds.windows(2) {
            // Every part is a byte or a merge of two ranked parts, so it has a rank.
            if let Some(r) = self.rank(&piece[w[0]..w[1]]) {
                out.push(r);
            }
        }
    }

    /// `tiktoken`'s `_byte_pair_merge`: part boundaries after merging, lowest rank first,
    /// leftmost among equals. Quadratic; the specification for [`Self::merge_heap`].
    fn merge_scan(&self, piece: &[u8]) -> Vec<usize> {
        let n = piece.len();
        let none = u32::MAX;
        let mut parts: Vec<(usize, u32)> = Vec::with_capacity(n + 1);
        for i in 0..n.saturating_sub(1) {
            parts.push((i, self.rank(&piece[i..i + 2]).unwrap_or(none)));
        }
        parts.push((n - 1, none));
        parts.push((n, none));
        let rank_at = |parts: &Vec<(usize, u32)>, i: usize| {
            if i + 3 < parts.len() {
                self.rank(&piece[parts[i].0..parts[i + 3].0])
                    .unwrap_or(none)
            } else {
                none
            }
        };
        loop {
            let mut best = (none, usize::MAX);
            for (i, &(_, r)) in parts[..parts.len() - 1].iter().enumerate() {
                if r < best.0 {
                    best = (r, i);
                }
            }
            if best.0 == none {
                break;
            }
            let i = best.1;
            if i > 0 {
                parts[i - 1].1 = rank_at(&parts, i - 1);
            }
            parts[i].1 = rank_at(&parts, i);
            parts.remove(i + 1);
        }
        parts.into_iter().map(|p| p.0).collect()
    }

    /// The same merge order as [`Self::merge_scan`] in O(n log n): parts form a linked list
    /// and candidate pairs wait in a heap keyed by (rank, start); an entry whose parts have
    /// changed since it was pushed is skipped.
    fn merge_heap(&self, piece: &[u8]) -> Vec<usize> {
        let n = piece.len();
        // next[s]: end of the part starting at s; prev[s]: start of the part before it.
        let mut next: Vec<usize> = (1..=n).collect();
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        let mut alive = vec![true; n];
        let mut heap = BinaryHeap::with_capacity(n);
        for s in 0..n - 1 {
            if let Some(r) = self.rank(&piece[s..s + 2]) {
                heap.push(Reverse((r, s, s + 1, s + 2)));
            }
        }
        while let Some(Reverse((_, s, mid, end))) = heap.pop() {
            if !alive[s] || next[s] != mid || !alive[mid] || next[mid] != end {
                continue;
            }
            alive[mid] = false;
            next[s] = end;
            if end < n {
                prev[end] = s;
                if let Some(r) = self.rank(&piece[s..next[end]]) {
                    heap.push(Reverse((r, s, end, next[end])));
                }
            }
            if s > 0 {
                let p = prev[s];
                if let Some(r) = self.rank(&piece[p..end]) {
                    heap.push(Reverse((r, p, s, end)));
                }
            }
        }
        let mut bounds = vec![0];
        let mut s = 0;
        while s < n {
            s = next[s];
            bounds.push(s);
        }
        bounds
    }

    /// The bytes of a sequence of ids (unknown ids decode to nothing).
    pub fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &i in ids {
            if let Some(b) = self.decoder.get(i as usize) {
                out.extend_from_slice(b);
            }
        }
        out
    }

    /// The bytes of one id, if it names anything.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.decoder
            .get(id as usize)
            .map(|b| &b[..])
            .filter(|b| !b.is_empty())
    }
}

/// Python's `str.isspace`: Unicode `White_Space` plus the four information separators
/// U+001C..U+001F (Python counts bidirectional class B and S as space).
pub(crate) fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Kimi's chunking: 400,000-character chunks, each cut so that no piece holds more than
/// 25,000 consecutive whitespace or non-whitespace characters (`_split_whitespaces_or_nonwhitespaces`).
fn kimi_chunks(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    if text.is_empty() {
        out.push(text);
        return out;
    }
    let mut chunk_chars = 0;
    let mut piece_start = 0;
    let mut run = 0;
    let mut run_is_space = text.chars().next().is_some_and(py_isspace);
    for (i, c) in text.char_indices() {
        if chunk_chars == MAX_CHUNK_CHARS {
            out.push(&text[piece_start..i]);
            piece_start = i;
            chunk_chars = 0;
            run = 0;
            run_is_space = py_isspace(c);
        }
        chunk_chars += 1;
        let now = py_isspace(c);
        if run_is_space != now {
            run = 1;
            run_is_space = now;
        } else {
            run += 1;
            if run > MAX_RUN_CHARS {
                out.push(&text[piece_start..i]);
                piece_start = i;
                run = 1;
            }
        }
    }
    out.push(&text[piece_start..]);
    out
}

/// FxHash (rustc's hasher): fast for the short byte strings of a rank table.
#[derive(Clone, Copy, Default)]
struct FxBuild;

impl BuildHasher for FxBuild {
    type Hasher = FxHasher;
    fn build_hasher(&self) -> FxHasher {
        FxHasher(0)
    }
}

struct FxHasher(u64);

impl FxHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }
    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(merges: &[&str]) -> String {
        let b64 = &base64::engine::general_purpose::STANDARD;
        let mut lines = Vec::new();
        for b in 0..=255u8 {
            lines.push(format!("{} {}", b64.encode([b]), b));
        }
        for (i, s) in merges.iter().enumerate() {
            lines.push(format!("{} {}", b64.encode(s), 256 + i));
        }
        lines.join("\n")
    }

    fn toy() -> Tiktoken {
        let t = table(&["he", "ll", "hell", "hello", " w", "or"]);
        Tiktoken::new(&t, vec![("<|end|>".into(), 300)], KIMI_PATTERN).unwrap()
    }

    /// Issue 59: special tokens are capped before the special-token regex is built.
    #[test]
    fn an_overlong_special_token_is_refused_naming_it() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("tiktoken.model"), table(&[])).unwrap();
        let cfg = |content: String| {
            serde_json::json!({"added_tokens_decoder": {"300": {"content": content, "special": true}}})
                .to_string()
        };
        let path = d.path().join("tokenizer_config.json");
        std::fs::write(&path, cfg(format!("<|{}|>", "x".repeat(2000)))).unwrap();
        let e = Tiktoken::from_dir(d.path()).unwrap_err().to_string();
        assert!(
            e.contains("tokenizer_config.json") && e.contains("`300`") && e.contains("1024"),
            "{e}"
        );
        std::fs::write(&path, cfg("<|end|>".into())).unwrap();
        Tiktoken::from_dir(d.path()).unwrap();
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
    fn reserved_specials_fill_the_gaps() {
        let t = toy();
        // 262 ranks; 300 is named, the rest of 262..518 are reserved.
        assert_eq!(t.n_ranks(), 262);
        assert_eq!(t.token_id("<|reserved_token_262|>"), Some(262));
        assert_eq!(t.token_id("<|reserved_token_517|>"), Some(517));
        assert_eq!(t.token_id("<|reserved_token_300|>"), None);
        assert_eq!(t.vocab_size(), 518);
        assert_eq!(t.encode("<|reserved_token_263|>"), vec![263]);
    }

    #[test]
    fn bad_tables_are_refused() {
        let full = table(&["ab"]);
        let e = Tiktoken::new(&full.replace("YWI= 256", "YWI= 255"), vec![], KIMI_PATTERN);
        assert!(e.unwrap_err().contains("given twice"));
        let no_a = full.replace("YQ== 97\n", "");
        let e = Tiktoken::new(&no_a, vec![], KIMI_PATTERN).unwrap_err();
        assert!(e.contains("byte 0x61"), "{e}");
        let e = Tiktoken::new(&full, vec![("<x>".into(), 256)], KIMI_PATTERN).unwrap_err();
        assert!(e.contains("already a rank"), "{e}");
        let e = Tiktoken::new(&format!("{full}\nYWJj 99999999999"), vec![], KIMI_PATTERN);
        assert!(e.unwrap_err().contains("bad rank"));
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

    #[test]
    fn heap_merge_equals_scan_merge() {
        // Merges that overlap and tie: runs of one letter exercise leftmost-first.
        let t = table(&["aa", "ab", "ba", "aaa", "aab", "bb", "abab", "aaaa", "bab"]);
        let t = Tiktoken::new(&t, vec![], KIMI_PATTERN).unwrap();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for len in 1..300 {
            for _ in 0..4 {
                let piece: Vec<u8> = (0..len)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        [b'a', b'b', b'c'][(state % 3) as usize]
                    })
                    .collect();
                assert_eq!(t.merge_scan(&piece), t.merge_heap(&piece), "{piece:?}");
            }
        }
    }

    #[test]
    fn chunks_follow_kimi() {
        let s = " ".repeat(25_001) + "ab";
        let c = kimi_chunks(&s);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].len(), 25_000);
        assert_eq!(c[1], " ab");
        // U+001F counts as space for Python, not for Rust's char::is_whitespace.
        let s = "\u{1f}".repeat(25_001);
        assert_eq!(kimi_chunks(&s).len(), 2);
        assert_eq!(kimi_chunks(""), vec![""]);
        let s = "é".repeat(30_000);
        let c = kimi_chunks(&s);
        assert_eq!(
            c.iter().map(|p| p.chars().count()).collect::<Vec<_>>(),
            [25_000, 5_000]
        );
    }
}
