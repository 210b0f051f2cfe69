//! Constrained decoding for sluice: a JSON schema, "any JSON object" or a Lark grammar, turned
//! into the set of tokens that may come next, step by step, through
//! [llguidance](https://github.com/guidance-ai/llguidance) (the library behind llama.cpp's and
//! several servers' JSON-schema support).
//!
//! A [`Vocab`] is built once per tokenizer (the bytes every token stands for, in a trie); a
//! [`Constraint`] follows one generation: before each token, [`Constraint::mask`] sets every
//! logit the grammar does not allow to −∞, and after it, [`Constraint::commit`] advances the
//! grammar. The mask depends only on the grammar and the tokens committed so far — never on
//! the memory budget, threads or timing (llguidance's limits count work, not time) — and since
//! sluice's logits are the same bits at every budget, so is constrained output.
//!
//! JSON output is written without free whitespace (`", "` between items, `": "` after keys, the
//! separators of Python's `json.dumps`), so a model cannot wander off into whitespace: a
//! schema's `x-guidance` object overrides that, as llguidance documents.

#![forbid(unsafe_code)]

mod close;

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};
use sluice_text::VocabBytes;

/// What can go wrong building or following a grammar.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The grammar or schema does not compile (the caller's input).
    #[error("{kind}: {msg}")]
    Grammar {
        /// What was given: `json_schema`, `grammar`.
        kind: &'static str,
        /// What llguidance says is wrong with it.
        msg: String,
    },
    /// The vocabulary could not be turned into a token trie.
    #[error("constrained decoding: cannot index the vocabulary: {0}")]
    Vocab(String),
    /// The grammar failed while generating (a token it had allowed was refused, or its limits
    /// were reached).
    #[error("constrained decoding: {0}")]
    Step(String),
}

/// An output grammar.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid against a JSON schema (the subset llguidance supports: objects with
    /// properties, required fields and `additionalProperties`, arrays with item counts,
    /// strings with lengths, patterns and formats, numbers with bounds, `enum`, `const`,
    /// `anyOf`/`oneOf`, local `$ref`).
    JsonSchema(Value),
    /// A grammar in llguidance's Lark syntax (which also embeds JSON schemas with `%json`).
    Lark(String),
}

impl Grammar {
    /// What this grammar is called in errors: `json_object`, `json_schema`, `grammar`.
    pub fn kind(&self) -> &'static str {
        match self {
            Grammar::JsonObject => "json_object",
            Grammar::JsonSchema(_) => "json_schema",
            Grammar::Lark(_) => "grammar",
        }
    }

    /// The grammar of OpenAI's `response_format`: `{"type": "text"}` is none,
    /// `{"type": "json_object"}` any JSON object, and `{"type": "json_schema", "json_schema":
    /// {"name", "schema", "strict", "description"}}` JSON valid against `schema` (enforced
    /// whatever `strict` says). Anything else is an error naming the field.
    pub fn from_response_format(v: &Value) -> Result<Option<Grammar>, Error> {
        let bad = |msg: String| Error::Grammar {
            kind: "response_format",
            msg,
        };
        let obj = v
            .as_object()
            .ok_or_else(|| bad("must be an object with a `type`".into()))?;
        if let Some(k) = obj
            .keys()
            .find(|k| !["type", "json_schema"].contains(&k.as_str()))
        {
            return Err(bad(format!("unknown field `{k}`")));
        }
        match obj.get("type").and_then(Value::as_str) {
            Some("text") => Ok(None),
            Some("json_object") => Ok(Some(Grammar::JsonObject)),
            Some("json_schema") => {
                let js = obj
                    .get("json_schema")
                    .and_then(Value::as_object)
                    .ok_or_else(|| bad("`json_schema` must be an object with a `schema`".into()))?;
                let known = ["name", "schema", "strict", "description"];
                if let Some(k) = js.keys().find(|k| !known.contains(&k.as_str())) {
                    return Err(bad(format!("unknown field `json_schema.{k}`")));
                }
                match js.get("schema") {
                    Some(s @ Value::Object(_)) => Ok(Some(Grammar::JsonSchema(s.clone()))),
                    Some(_) => Err(bad(
                        "`json_schema.schema` must be a JSON schema object".into()
                    )),
                    None => Err(bad("`json_schema.schema` is missing".into())),
                }
            }
            Some(t) => Err(bad(format!(
                "type `{t}` is not text, json_object or json_schema"
            ))),
            None => Err(bad("`type` is missing".into())),
        }
    }

    fn top_level(&self) -> TopLevelGrammar {
        match self {
            Grammar::JsonObject => TopLevelGrammar::from_json_schema(compact(json!({
                "type": "object"
            }))),
            Grammar::JsonSchema(s) => TopLevelGrammar::from_json_schema(compact(s.clone())),
            Grammar::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        }
    }
}

/// The schema with llguidance's JSON layout options set to Python's `json.dumps` separators
/// and no free whitespace, unless the schema sets its own `x-guidance`.
fn compact(mut schema: Value) -> Value {
    if let Value::Object(m) = &mut schema
        && !m.contains_key("x-guidance")
    {
        m.insert(
            "x-guidance".into(),
            json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            }),
        );
    }
    schema
}

/// The token trie llguidance walks, and how it tokenizes bytes (only for prompts and forced
/// tokens, which sluice does not use: greedy over the trie).
struct Env {
    trie: TokTrie,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }
}

/// Bytes a [`Vocab`] may take, plus [`INDEX_BYTES_PER_TOKEN`] per token: an upper bound on
/// what indexing a vocabulary adds to a process's peak RSS, from measurements with `sluice run`
/// (2.3 MiB for a 4,096-token vocabulary, 7.4 MiB for SmolLM2's 49,152, 35 MiB for
/// DeepSeek-V3's 129,280, the trie and llguidance's per-class slices together).
pub const INDEX_BASE_BYTES: u64 = 2 << 20;

/// See [`INDEX_BASE_BYTES`].
pub const INDEX_BYTES_PER_TOKEN: u64 = 320;

/// The memory to set aside for indexing a vocabulary of `tokens` tokens.
pub fn index_bytes(tokens: usize) -> u64 {
    INDEX_BASE_BYTES + INDEX_BYTES_PER_TOKEN * tokens as u64
}

/// A tokenizer's vocabulary indexed for constrained decoding; built once per engine and shared
/// by every [`Constraint`].
pub struct Vocab {
    factory: ParserFactory,
    /// Width of a row of logits.
    logits: usize,
    /// End-of-sequence ids: allowed once the grammar is complete.
    eos: Vec<u32>,
    /// The text tokens, for following JSON output (what each stands for, `None` for special
    /// tokens and padding), and whether each can sit inside a string unchanged.
    texts: Arc<Texts>,
}

/// The vocabulary's text, as [`Constraint`] follows JSON with it.
struct Texts {
    bytes: Vec<Option<Vec<u8>>>,
    plain: Vec<bool>,
    /// How much a token can lengthen the shortest completion of a JSON text: 7 bytes per byte
    /// (a `"` opening a key adds `": null` beside it) of the longest token.
    max_growth: usize,
}

impl std::fmt::Debug for Vocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Vocab({} logits, eos {:?})", self.logits, self.eos)
    }
}

impl Vocab {
    /// Indexes a vocabulary. `eos` are the model's end-of-sequence ids (the grammar's end);
    /// `logits` is the width of the model's rows of logits (ids past the tokenizer's
    /// vocabulary, a padded embedding's, are never allowed).
    pub fn new(bytes: &VocabBytes, eos: &[u32], logits: usize) -> Result<Vocab, Error> {
        let mut words: Vec<Vec<u8>> = bytes
            .tokens
            .iter()
            .zip(&bytes.special)
            .map(|(b, &special)| {
                if special {
                    // A special token is reachable only where a grammar names it.
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(b);
                    w
                } else {
                    b.clone()
                }
            })
            .collect();
        let placeholder = |i: usize| {
            let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
            w.extend_from_slice(format!("<[sluice:{i}]>").as_bytes());
            w
        };
        while words.len() < logits {
            words.push(placeholder(words.len()));
        }
        let mut eos: Vec<u32> = eos
            .iter()
            .copied()
            .filter(|&e| (e as usize) < words.len())
            .collect();
        if eos.is_empty() {
            // No end-of-sequence id: the grammar's end is a token no logit stands for, which
            // [`Constraint::mask`] reports as the end.
            eos.push(words.len() as u32);
            words.push(placeholder(words.len()));
        }
        let info = TokRxInfo::new(words.len() as u32, eos[0]);
        let mut trie = TokTrie::from(&info, &words);
        if eos.len() > 1 {
            trie = trie.with_eos_tokens(&eos);
        }
        let env: TokEnv = Arc::new(Env { trie });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| Error::Vocab(e.to_string()))?;
        factory.quiet();
        let text: Vec<Option<Vec<u8>>> = bytes
            .tokens
            .iter()
            .zip(&bytes.special)
            .map(|(b, &special)| (!special).then(|| b.clone()))
            .collect();
        let longest = text.iter().flatten().map(Vec::len).max().unwrap_or(1);
        let texts = Texts {
            plain: text
                .iter()
                .map(|b| b.as_deref().is_some_and(close::plain))
                .collect(),
            bytes: text,
            max_growth: 7 * longest,
        };
        Ok(Vocab {
            factory,
            logits,
            eos,
            texts: Arc::new(texts),
        })
    }

    /// Compiles a grammar and starts following it (a fresh generation).
    pub fn constrain(&self, g: &Grammar) -> Result<Constraint, Error> {
        let parser = self
            .factory
            .create_parser(g.top_level())
            .map_err(|e| Error::Grammar {
                kind: g.kind(),
                msg: one_line(&e.to_string()),
            })?;
        let m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            return Err(Error::Grammar {
                kind: g.kind(),
                msg: one_line(&e),
            });
        }
        Ok(Constraint {
            m,
            eos: self.eos.clone(),
            logits: self.logits,
            mask: None,
            json: matches!(g, Grammar::JsonObject | Grammar::JsonSchema(_))
                .then(close::JsonPrefix::new),
            texts: self.texts.clone(),
            steered: false,
        })
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What may come after the mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Sample from the masked logits.
    Sample,
    /// The grammar is complete and allows nothing more: the generation ends here.
    End,
}

/// One generation following a grammar.
pub struct Constraint {
    m: Matcher,
    eos: Vec<u32>,
    logits: usize,
    /// The mask of the last [`Constraint::mask`], until the token it allowed is committed.
    mask: Option<SimpleVob>,
    /// The JSON written so far, under a JSON grammar.
    json: Option<close::JsonPrefix>,
    texts: Arc<Texts>,
    /// Tokens were kept out so that the JSON could be finished within the tokens left.
    steered: bool,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Constraint(stopped: {})", self.m.is_stopped())
    }
}

impl Constraint {
    /// Sets every logit the grammar does not allow next to −∞ (end-of-sequence ids stay only
    /// when the grammar may end here). [`Next::End`] when the grammar is complete and nothing
    /// but its end may follow: then the logits are left as they were.
    ///
    /// With `left` tokens left to write, a JSON grammar also keeps out, near the end, every
    /// token after which the JSON could no longer be finished in the tokens that remain
    /// (each at least one byte; see [`Constraint::steered`]). So JSON output parses even when
    /// it reaches the limit, as long as the grammar allows its shortest completion (a schema's
    /// required fields may not).
    pub fn mask(&mut self, logits: &mut [f32], left: Option<usize>) -> Result<Next, Error> {
        if self.m.is_stopped() {
            return self.stopped();
        }
        let mut mask = self.m.compute_mask().map_err(|e| self.err(e))?;
        if let Some(left) = left {
            self.steer(&mut mask, left);
        }
        let width = logits.len().min(self.logits);
        let mut text = false;
        mask.iter_set_entries(|i| {
            if i < width && !self.eos.contains(&(i as u32)) {
                text = true;
            }
        });
        let ends = self.eos.iter().any(|&e| mask.is_allowed(e));
        if !text {
            if ends {
                return Ok(Next::End);
            }
            return Err(Error::Step(
                "the grammar allows no token of the vocabulary here".into(),
            ));
        }
        for (i, l) in logits.iter_mut().enumerate() {
            if i >= self.logits || !mask.is_allowed(i as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
        self.mask = Some(mask);
        Ok(Next::Sample)
    }

    /// Keeps out of `mask` the tokens after which the JSON written so far could not be
    /// finished within `left − 1` more bytes, when the finish is near enough for any token to
    /// matter, and at least one token keeps it possible.
    fn steer(&mut self, mask: &mut SimpleVob, left: usize) {
        let Some(json) = &self.json else {
            return;
        };
        let Some(suffix) = json.suffix() else {
            return;
        };
        let texts = &*self.texts;
        if left > suffix.len() + texts.max_growth {
            return;
        }
        let room = left - 1;
        let plain_string = json.in_plain_string();
        let fits = |id: usize| -> bool {
            if self.eos.contains(&(id as u32)) {
                return true;
            }
            let Some(Some(b)) = texts.bytes.get(id) else {
                return false;
            };
            if plain_string && texts.plain[id] {
                return suffix.len() <= room;
            }
            let mut after = json.clone();
            after.push(b);
            after.suffix().is_some_and(|s| s.len() <= room)
        };
        let mut keep = Vec::new();
        let mut drop = Vec::new();
        mask.iter_set_entries(|i| {
            if fits(i) {
                keep.push(i);
            } else {
                drop.push(i);
            }
        });
        if keep.is_empty() || drop.is_empty() {
            return;
        }
        for i in drop {
            mask.disallow_token(i as u32);
        }
        self.steered = true;
    }

    /// Whether tokens were kept out so that the JSON could be finished within the tokens left:
    /// the output was cut short to fit, though it parses.
    pub fn steered(&self) -> bool {
        self.steered
    }

    fn stopped(&self) -> Result<Next, Error> {
        match self.m.get_error() {
            Some(e) => Err(Error::Step(one_line(&e))),
            None => Ok(Next::End),
        }
    }

    fn err(&self, e: impl std::fmt::Display) -> Error {
        Error::Step(one_line(&e.to_string()))
    }

    /// Whether the last mask allows `id`.
    pub fn allows(&self, id: u32) -> bool {
        self.mask.as_ref().is_some_and(|m| m.is_allowed(id))
    }

    /// The lowest id the last mask allows among the logits (for a row whose allowed logits
    /// were all −∞ or NaN, so that sampling could not tell them apart).
    pub fn first_allowed(&self) -> Option<u32> {
        let m = self.mask.as_ref()?;
        (0..self.logits as u32).find(|&i| m.is_allowed(i))
    }

    /// Advances the grammar by the token chosen from the masked logits. An end-of-sequence id
    /// ends it.
    pub fn commit(&mut self, id: u32) -> Result<(), Error> {
        self.mask = None;
        if let Some(j) = &mut self.json
            && let Some(Some(b)) = self.texts.bytes.get(id as usize)
        {
            j.push(b);
        }
        self.m.consume_token(id).map_err(|e| self.err(e))
    }

    /// Whether the output so far is a complete sentence of the grammar (it may end here).
    pub fn is_complete(&mut self) -> bool {
        self.m.is_accepting().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte vocabulary: ids 0..=255 are single bytes, 256 is `<eos>` (special), 257 `"ab"`.
    fn vocab() -> Vocab {
        let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        tokens.push(b"<eos>".to_vec());
        tokens.push(b"ab".to_vec());
        let mut special = vec![false; 258];
        special[256] = true;
        Vocab::new(&VocabBytes { tokens, special }, &[256], 260).unwrap()
    }

    /// Greedy decoding under the constraint with logits that prefer `prefs` bytes in order.
    fn greedy(c: &mut Constraint, prefs: &[u8], max: usize) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        for _ in 0..max {
            let mut logits = vec![0.0f32; 260];
            for (rank, &b) in prefs.iter().enumerate() {
                logits[b as usize] = 100.0 - rank as f32;
            }
            logits[256] = 50.0;
            if c.mask(&mut logits, None).unwrap() == Next::End {
                return (out, true);
            }
            let id = (0..260).max_by(|&a, &b| logits[a].total_cmp(&logits[b]).then(b.cmp(&a)));
            let id = id.unwrap() as u32;
            assert!(c.allows(id));
            c.commit(id).unwrap();
            if id == 256 {
                return (out, true);
            }
            out.push(id as u8);
        }
        (out, false)
    }

    /// Decoding under the constraint with `max` tokens, the logits preferring `prefs` bytes
    /// in order; the output, and whether the grammar ended it.
    fn within(g: &Grammar, prefs: &[u8], max: usize) -> (Vec<u8>, bool, bool) {
        let v = vocab();
        let mut c = v.constrain(g).unwrap();
        let mut out = Vec::new();
        for i in 0..max {
            let mut logits = vec![0.0f32; 260];
            for (rank, &b) in prefs.iter().enumerate() {
                logits[b as usize] = 100.0 - rank as f32;
            }
            logits[257] = 99.5; // "ab"
            if c.mask(&mut logits, Some(max - i)).unwrap() == Next::End {
                return (out, true, c.steered());
            }
            let id = (0..260)
                .max_by(|&a, &b| logits[a].total_cmp(&logits[b]).then(b.cmp(&a)))
                .unwrap() as u32;
            assert!(c.allows(id));
            c.commit(id).unwrap();
            if id == 256 {
                return (out, true, c.steered());
            }
            if id == 257 {
                out.extend_from_slice(b"ab");
            } else {
                out.push(id as u8);
            }
        }
        (out, false, c.steered())
    }

    #[test]
    fn json_that_would_run_past_max_tokens_is_closed_in_time() {
        // Logits that open strings, objects and arrays, and never close anything.
        for prefs in [&b"x"[..], b"{[\\\"a", b"\"[{", b"1.e-", b"tn[", b"{\"a"] {
            for max in 2..48 {
                // (Ended by the grammar, or by running out of tokens: whole either way.)
                let (out, _, steered) = within(&Grammar::JsonObject, prefs, max);
                let s = String::from_utf8(out).unwrap();
                assert!(s.len() <= 2 * max, "{s:?}");
                let v: Value = serde_json::from_str(&s)
                    .unwrap_or_else(|e| panic!("{prefs:?} max {max}: {s:?}: {e}"));
                assert!(v.is_object(), "{s:?}");
                // Past the smallest limits, something had to be kept out.
                assert!(
                    steered || max < 8,
                    "{prefs:?} max {max}: {s:?} was not steered"
                );
            }
        }
        // Far from the limit nothing is kept out: the same prefix as with no limit.
        let (long, _, _) = within(&Grammar::JsonObject, b"\"x", 400);
        let v = vocab();
        let mut c = v.constrain(&Grammar::JsonObject).unwrap();
        let (free, _) = greedy(&mut c, b"\"x", 100);
        assert_eq!(&long[..100], &free[..100]);
    }

    #[test]
    fn a_json_that_closes_by_itself_is_not_steered() {
        // The logits write `{}` at once.
        let (out, ended, steered) = within(&Grammar::JsonObject, b"{}", 10);
        assert_eq!((out.as_slice(), ended, steered), (&b"{}"[..], true, false));
    }

    #[test]
    fn a_schema_forces_valid_json_whatever_the_logits_prefer() {
        let v = vocab();
        let schema = json!({
            "type": "object",
            "properties": {"k": {"enum": ["yes", "no"]}},
            "required": ["k"],
            "additionalProperties": false
        });
        let mut c = v.constrain(&Grammar::JsonSchema(schema)).unwrap();
        // The logits want "zzz" forever; the grammar allows only the one object.
        let (out, ended) = greedy(&mut c, b"zyn", 64);
        assert!(ended);
        let s = String::from_utf8(out).unwrap();
        let parsed: Value = serde_json::from_str(&s).unwrap();
        assert!(
            parsed == json!({"k": "no"}) || parsed == json!({"k": "yes"}),
            "{s}"
        );
        // Python's separators, no free whitespace.
        assert!(s.starts_with("{\"k\": \""), "{s}");
    }

    #[test]
    fn ids_past_the_vocabulary_and_special_tokens_are_masked() {
        let v = vocab();
        let mut c = v.constrain(&Grammar::JsonObject).unwrap();
        let mut logits = vec![1.0f32; 260];
        assert_eq!(c.mask(&mut logits, None).unwrap(), Next::Sample);
        assert_eq!(logits[b'{' as usize], 1.0);
        assert_eq!(logits[b'x' as usize], f32::NEG_INFINITY);
        assert_eq!(logits[256], f32::NEG_INFINITY, "eos before the object");
        assert_eq!(
            logits[258],
            f32::NEG_INFINITY,
            "padding past the vocabulary"
        );
        assert_eq!(c.first_allowed(), Some(b'{' as u32));
    }

    #[test]
    fn a_lark_grammar_ends_when_nothing_more_may_follow() {
        let v = vocab();
        let mut c = v
            .constrain(&Grammar::Lark("start: \"ab\" | \"ac\"".into()))
            .unwrap();
        let (out, ended) = greedy(&mut c, b"ac", 8);
        assert_eq!(out, b"ac");
        assert!(ended);
    }

    #[test]
    fn bad_grammars_are_errors_that_name_what_was_given() {
        let v = vocab();
        let e = v
            .constrain(&Grammar::Lark("start: undefined_rule".into()))
            .unwrap_err();
        assert!(e.to_string().starts_with("grammar: "), "{e}");
        let e = v
            .constrain(&Grammar::JsonSchema(json!({"type": "no-such-type"})))
            .unwrap_err();
        assert!(e.to_string().starts_with("json_schema: "), "{e}");
        assert!(!e.to_string().contains('\n'));
    }

    #[test]
    fn response_formats_are_read_as_openai_writes_them() {
        let rf = |v: Value| Grammar::from_response_format(&v);
        assert_eq!(rf(json!({"type": "text"})).unwrap(), None);
        assert_eq!(
            rf(json!({"type": "json_object"})).unwrap(),
            Some(Grammar::JsonObject)
        );
        let s = json!({"type": "object"});
        assert_eq!(
            rf(json!({"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": s}}))
                .unwrap(),
            Some(Grammar::JsonSchema(s))
        );
        for (v, says) in [
            (json!({"type": "yaml"}), "`yaml`"),
            (json!({}), "`type` is missing"),
            (json!({"type": "json_schema"}), "`json_schema`"),
            (
                json!({"type": "json_schema", "json_schema": {"name": "x"}}),
                "schema` is missing",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"schema": {}, "strikt": true}}),
                "`json_schema.strikt`",
            ),
            (json!({"type": "text", "extra": 1}), "`extra`"),
        ] {
            let e = rf(v).unwrap_err().to_string();
            assert!(
                e.starts_with("response_format: ") && e.contains(says),
                "{e}"
            );
        }
    }

    #[test]
    fn no_eos_id_still_ends_the_grammar() {
        let tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        let v = Vocab::new(
            &VocabBytes {
                special: vec![false; 256],
                tokens,
            },
            &[],
            256,
        )
        .unwrap();
        let mut c = v.constrain(&Grammar::Lark("start: \"x\"".into())).unwrap();
        let (out, ended) = greedy(&mut c, b"x", 4);
        assert_eq!(out, b"x");
        assert!(ended);
    }
}
