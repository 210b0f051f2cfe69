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

//! Compiling takes work that grows with the grammar, so it is bounded: a schema or grammar
//! is checked against [`limits`] first (size, nesting, `$ref` chains, object width, literal
//! lengths, rule counts), then compiled once by [`Vocab::compile`] on a thread of its own with a
//! large stack — never on the caller's — under llguidance's limits and [`COMPILE_SECONDS`], and
//! its first mask is computed there, so a grammar that cannot take a first step is refused up
//! front. The [`Compiled`] grammar is shared: each generation starts a [`Constraint`] from it.
//!
//! Near `max_tokens` the output is kept finishable: after each token the constraint looks for
//! a way to complete the grammar in the tokens left (a search over single-byte tokens through
//! the grammar itself, so what a schema requires is included), and a token after which none is
//! found is drawn again without it. A reply cut by `max_tokens` is then always a whole sentence
//! of the grammar whenever `max_tokens` allows its smallest one.

#![forbid(unsafe_code)]

mod close;
pub mod limits;
mod search;

use search::Search;
pub use search::{SEARCH_LEXER_BYTES, SEARCH_OPS, SMALLEST_OPS};

use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};
use sluice_text::VocabBytes;

/// What can go wrong building or following a grammar.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The grammar or schema does not compile, is over a limit, or cannot take a first step
    /// (the caller's input).
    #[error("{kind}: {msg}")]
    Grammar {
        /// What was given: `json_schema`, `grammar`.
        kind: &'static str,
        /// What is wrong with it.
        msg: String,
    },
    /// The vocabulary could not be turned into a token trie.
    #[error("constrained decoding: cannot index the vocabulary: {0}")]
    Vocab(String),
    /// The grammar failed while generating (its limits were reached, or it allowed no token).
    #[error("constrained decoding: {0}")]
    Step(String),
}

/// How long a grammar may take to compile (and take its first step) before it is refused:
/// 10 s. What passes [`limits`] compiles in well under a second; this bounds what the limits
/// cannot foresee. The compile thread is not stopped (it cannot be), but its result is dropped.
pub const COMPILE_SECONDS: u64 = 10;

/// Stack of a compile thread (512 MiB of address space; only what the recursion touches is
/// ever backed by memory). [`limits::MAX_DEPTH`] levels need a small part of it.
const COMPILE_STACK: usize = 512 << 20;

/// Grammars compiled at once, at most; more wait their turn (their wait counts against
/// [`COMPILE_SECONDS`]). One: what a compilation holds before the grammar is charged to the
/// budget (see [`parser_limits`]) is then held once.
const COMPILE_THREADS: usize = 1;

/// The longest completion looked for near `max_tokens`, in bytes.
pub const MAX_COMPLETION: usize = 16 << 10;

/// The most states a grammar's lexer may build (llguidance's default is 250,000). A state
/// takes about 3 kB, so this bounds the lexer near 30 MB; a 4 KiB literal
/// ([`limits::MAX_LITERAL_BYTES`]) takes about as many states as bytes.
pub const MAX_LEXER_STATES: usize = 10_000;

/// llguidance's limits as sluice sets them: errors kept to one line (no parser state dumps),
/// fewer lexer states (each 1–3 kB; 250,000 is half a gigabyte), and less lexer fuel, the work
/// of building the lexer's expressions (about 170 bytes a point: llguidance's 1,000,000 at
/// compile time let `(a{1000}){1000}` take 173 MB before it was refused; 200,000 bounds a
/// compilation near 35 MB, 100,000 a step near 17 MB).
fn parser_limits() -> ParserLimits {
    ParserLimits {
        max_lexer_states: MAX_LEXER_STATES,
        initial_lexer_fuel: 200_000,
        step_lexer_fuel: 100_000,
        max_grammar_size: 250_000,
        verbose_errors: false,
        ..ParserLimits::default()
    }
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

    /// Checks the grammar against [`limits`].
    pub fn check_limits(&self) -> Result<(), Error> {
        let r = match self {
            Grammar::JsonObject => Ok(()),
            Grammar::JsonSchema(s) => limits::check_schema(s),
            Grammar::Lark(g) => limits::check_lark(g),
        };
        r.map_err(|msg| Error::Grammar {
            kind: self.kind(),
            msg,
        })
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
/// by every grammar compiled against it (cheap to clone).
#[derive(Clone)]
pub struct Vocab {
    inner: Arc<VocabInner>,
}

struct VocabInner {
    factory: ParserFactory,
    /// Width of a row of logits.
    logits: usize,
    /// End-of-sequence ids: allowed once the grammar is complete.
    eos: Vec<u32>,
    /// The text tokens, for following JSON output and completing it.
    texts: Arc<Texts>,
}

/// The vocabulary's text, as [`Constraint`] follows and completes output with it.
struct Texts {
    /// What each text token stands for (`None` for special tokens and padding).
    bytes: Vec<Option<Vec<u8>>>,
    /// The token standing for each single byte, where there is one.
    byte_token: [Option<u32>; 256],
}

impl std::fmt::Debug for Vocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Vocab({} logits, eos {:?})",
            self.inner.logits, self.inner.eos
        )
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
        *factory.limits_mut() = parser_limits();
        let text: Vec<Option<Vec<u8>>> = bytes
            .tokens
            .iter()
            .zip(&bytes.special)
            .map(|(b, &special)| (!special).then(|| b.clone()))
            .collect();
        let mut byte_token = [None; 256];
        for (id, b) in text.iter().enumerate() {
            if let Some(b) = b
                && let [one] = b.as_slice()
                && byte_token[*one as usize].is_none()
                && id < logits
            {
                byte_token[*one as usize] = Some(id as u32);
            }
        }
        Ok(Vocab {
            inner: Arc::new(VocabInner {
                factory,
                logits,
                eos,
                texts: Arc::new(Texts {
                    bytes: text,
                    byte_token,
                }),
            }),
        })
    }

    /// Compiles a grammar: checks it against [`limits`], then compiles it and takes its first
    /// step on a thread with a large stack (at most [`COMPILE_THREADS`] at once), waiting at
    /// most [`COMPILE_SECONDS`]; and looks for its smallest sentence (see
    /// [`Compiled::smallest`]). Every refusal is one line naming what was given.
    pub fn compile(&self, g: &Grammar) -> Result<Compiled, Error> {
        g.check_limits()?;
        let kind = g.kind();
        let refuse = |msg: String| Error::Grammar { kind, msg };
        let (tx, rx) = mpsc::channel();
        let vocab = self.clone();
        let grammar = g.clone();
        let slot = CompileSlot::take(Duration::from_secs(COMPILE_SECONDS)).ok_or_else(|| {
            refuse(format!(
                "waited {COMPILE_SECONDS} s for a turn to compile (other grammars are compiling)"
            ))
        })?;
        std::thread::Builder::new()
            .name("sluice-grammar".into())
            .stack_size(COMPILE_STACK)
            .spawn(move || {
                let _slot = slot;
                let _ = tx.send(vocab.compile_here(&grammar));
            })
            .map_err(|e| refuse(format!("cannot start a thread to compile it: {e}")))?;
        match rx.recv_timeout(Duration::from_secs(COMPILE_SECONDS)) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Timeout) => Err(refuse(format!(
                "took longer than {COMPILE_SECONDS} s to compile; simplify it"
            ))),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(refuse("its compilation failed".into()))
            }
        }
    }

    /// [`Vocab::compile`]'s work, on the thread it runs on.
    fn compile_here(&self, g: &Grammar) -> Result<Compiled, Error> {
        let v = &self.inner;
        let refuse = |msg: String| Error::Grammar {
            kind: g.kind(),
            msg: short(&msg),
        };
        let parser = v
            .factory
            .create_parser(g.top_level())
            .map_err(|e| refuse(e.to_string()))?;
        // The parser at its start, sharing the lexer the first step and the search below
        // build: each generation starts from a deep copy of it (its own lexer, so a
        // generation's steps do not depend on what others explored).
        let keep = parser.clone();
        let probe = parser.clone();
        let mut m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            return Err(refuse(e));
        }
        // The first step, before anything runs: what cannot take it is the caller's input.
        m.compute_mask().map_err(|e| refuse(e.to_string()))?;
        let json = matches!(g, Grammar::JsonObject | Grammar::JsonSchema(_));
        let mut c = Constraint {
            m,
            probe,
            eos: v.eos.clone(),
            logits: v.logits,
            mask: None,
            json: json.then(close::JsonPrefix::new),
            texts: v.texts.clone(),
            steered: false,
            plan: None,
            checking: false,
        };
        // The smallest sentence, searched for on a copy: a search that runs into llguidance's
        // limits (the lexer's states) is a grammar nothing could finish.
        let mut probe_c = c.shallow_copy();
        let search = probe_c.completion(MAX_COMPLETION, SMALLEST_OPS);
        if let Some(e) = probe_c.m.get_error() {
            return Err(refuse(format!("no sentence of it fits the limits: {e}")));
        }
        let not_found = matches!(search, Search::NotFound);
        let smallest = match search {
            Search::Found(p) => Some(p),
            Search::NotFound | Search::GaveUp => None,
        };
        if json && not_found {
            // For JSON the search follows the schema closely: a schema it cannot finish has no
            // document of a usable size (or none at all: a required property containing itself).
            return Err(refuse(format!(
                "no document of it is shorter than {MAX_COMPLETION} bytes (or it has none, as when a required property contains itself)"
            )));
        }
        c.checking = smallest.is_some();
        c.plan = smallest.clone();
        let lexer_bytes = c.lexer_bytes();
        Ok(Compiled {
            inner: Arc::new(CompiledInner {
                start: Mutex::new((keep, c)),
                lexer_bytes,
                kind: g.kind(),
                smallest: smallest.map(|s| s.len()),
                source_bytes: g.source_bytes(),
            }),
        })
    }
}

/// A turn at compiling (see [`COMPILE_THREADS`]), given back when dropped.
struct CompileSlot;

static SLOTS: Mutex<usize> = Mutex::new(0);
static SLOT_FREED: Condvar = Condvar::new();

impl CompileSlot {
    /// Waits up to `wait` for a turn.
    fn take(wait: Duration) -> Option<CompileSlot> {
        let lock = |m: &'static Mutex<usize>| m.lock().unwrap_or_else(|p| p.into_inner());
        let mut n = lock(&SLOTS);
        let deadline = std::time::Instant::now() + wait;
        while *n >= COMPILE_THREADS {
            let left = deadline.checked_duration_since(std::time::Instant::now())?;
            n = SLOT_FREED
                .wait_timeout(n, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        *n += 1;
        Some(CompileSlot)
    }
}

impl Drop for CompileSlot {
    fn drop(&mut self) {
        let mut n = SLOTS.lock().unwrap_or_else(|p| p.into_inner());
        *n = n.saturating_sub(1);
        SLOT_FREED.notify_one();
    }
}

impl Grammar {
    /// Bytes of the grammar's source (the schema as JSON, or the Lark text).
    fn source_bytes(&self) -> usize {
        match self {
            Grammar::JsonObject => 0,
            Grammar::JsonSchema(s) => serde_json::to_vec(s).map_or(0, |v| v.len()),
            Grammar::Lark(g) => g.len(),
        }
    }
}

/// A grammar compiled against a vocabulary, its first step taken: what every generation
/// following it starts from (cheap to clone; `Send + Sync`).
#[derive(Clone)]
pub struct Compiled {
    inner: Arc<CompiledInner>,
}

struct CompiledInner {
    /// The parser at the start, and the constraint that took the first step: each generation
    /// is a deep copy of the first with the rest of the second.
    start: Mutex<(llguidance::TokenParser, Constraint)>,
    /// Bytes of the lexer the compilation built (each generation starts with a copy).
    lexer_bytes: u64,
    kind: &'static str,
    smallest: Option<usize>,
    source_bytes: usize,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Compiled({}, smallest {:?} bytes)",
            self.inner.kind, self.inner.smallest
        )
    }
}

/// Bytes a compiled grammar is charged beyond its lexer: 1 MiB (its parser's tables and
/// rows) ...
pub const COMPILED_BASE_BYTES: u64 = 1 << 20;

/// ... plus this many per byte of its source (the grammar's rules: a 25 kB Lark grammar of
/// 1,500 chained rules took 8.8 MB, about 350 per byte; schemas take less).
pub const COMPILED_BYTES_PER_SOURCE_BYTE: u64 = 384;

impl Compiled {
    /// A fresh generation following the grammar.
    pub fn start(&self) -> Constraint {
        let start = self.inner.start.lock().unwrap_or_else(|p| p.into_inner());
        let (keep, c) = &*start;
        let parser = keep.deep_clone();
        let probe = parser.clone();
        Constraint {
            m: Matcher::new(Ok(parser)),
            probe,
            ..c.shallow_copy()
        }
    }

    /// What was given: `json_object`, `json_schema`, `grammar`.
    pub fn kind(&self) -> &'static str {
        self.inner.kind
    }

    /// Bytes of the lexer's automaton compiling built: each generation starts with a copy
    /// of it, and grows its own ([`Constraint::lexer_bytes`]).
    pub fn lexer_bytes(&self) -> u64 {
        self.inner.lexer_bytes
    }

    /// The length in bytes of the smallest sentence of the grammar the search found (for a
    /// schema, its smallest document as written), `None` if it found none within
    /// [`MAX_COMPLETION`] bytes. A `max_tokens` at least this large is always enough to finish.
    pub fn smallest(&self) -> Option<usize> {
        self.inner.smallest
    }

    /// The memory the compiled grammar holds, as charged: [`COMPILED_BASE_BYTES`],
    /// [`COMPILED_BYTES_PER_SOURCE_BYTE`] per byte of its source, and its lexer's automaton
    /// ([`Compiled::lexer_bytes`]). An estimate from measurements. Each generation holds its
    /// own copy of the lexer besides ([`Constraint::lexer_bytes`]).
    pub fn memory_bytes(&self) -> u64 {
        COMPILED_BASE_BYTES
            + COMPILED_BYTES_PER_SOURCE_BYTE.saturating_mul(self.inner.source_bytes as u64)
            + self.lexer_bytes()
    }
}

/// An error message cut to one line of at most 300 characters.
fn short(s: &str) -> String {
    let one = one_line(s);
    match one.char_indices().nth(300) {
        Some((i, _)) => format!("{}…", &one[..i]),
        None => one,
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

/// What [`Constraint::commit_within`] made of a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Commit {
    /// Taken: the grammar can still be finished in the tokens left.
    Taken,
    /// Not taken: after it the grammar could not be finished in the tokens left. Draw again
    /// without it.
    Refused,
}

/// One generation following a grammar.
pub struct Constraint {
    m: Matcher,
    /// A parser sharing the matcher's lexer, to read the lexer's size.
    probe: llguidance::TokenParser,
    eos: Vec<u32>,
    logits: usize,
    /// The mask of the last [`Constraint::mask`], until the token it allowed is committed.
    mask: Option<SimpleVob>,
    /// The JSON written so far, under a JSON grammar (it guides the completion search).
    json: Option<close::JsonPrefix>,
    texts: Arc<Texts>,
    /// A token was refused so that the output could be finished within the tokens left.
    steered: bool,
    /// A completion of what is written so far, one byte per token, found by the last search.
    plan: Option<Vec<u8>>,
    /// Whether tokens are checked for leaving a way to finish (see
    /// [`Constraint::commit_within`]).
    checking: bool,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Constraint(stopped: {})", self.m.is_stopped())
    }
}

impl Constraint {
    /// A copy following the same grammar from the same point. The lexer's cache is shared
    /// (it only memoizes the lexer's automaton, whoever explores it); the parser's state is the
    /// copy's own.
    fn shallow_copy(&self) -> Constraint {
        Constraint {
            m: self.m.clone(),
            probe: self.probe.clone(),
            eos: self.eos.clone(),
            logits: self.logits,
            mask: None,
            json: self.json.clone(),
            texts: self.texts.clone(),
            steered: false,
            plan: self.plan.clone(),
            checking: self.checking,
        }
    }
}

impl Constraint {
    /// Sets every logit the grammar does not allow next to −∞ (end-of-sequence ids stay only
    /// when the grammar may end here). [`Next::End`] when the grammar is complete and nothing
    /// but its end may follow: then the logits are left as they were.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<Next, Error> {
        if self.m.is_stopped() {
            return self.stopped();
        }
        let mask = self.m.compute_mask().map_err(|e| self.err(e))?;
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

    /// Bytes this generation's lexer automaton holds now: it starts as a copy of the compiled
    /// grammar's and grows (up to [`MAX_LEXER_STATES`] states) as the generation explores it.
    pub fn lexer_bytes(&self) -> u64 {
        self.probe.parser.lexer_stats().num_bytes as u64
    }

    /// Whether tokens were refused so that the output could be finished within the tokens
    /// left: the output was cut short to fit, though it is whole.
    pub fn steered(&self) -> bool {
        self.steered
    }

    fn stopped(&self) -> Result<Next, Error> {
        match self.m.get_error() {
            Some(e) => Err(Error::Step(short(&e))),
            None => Ok(Next::End),
        }
    }

    fn err(&self, e: impl std::fmt::Display) -> Error {
        Error::Step(short(&e.to_string()))
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

    /// The lowest id the last mask allows among the logits, `except` those.
    pub fn first_allowed_except(&self, except: &[u32]) -> Option<u32> {
        let m = self.mask.as_ref()?;
        (0..self.logits as u32).find(|&i| m.is_allowed(i) && !except.contains(&i))
    }

    /// Advances the grammar by the token chosen from the masked logits. An end-of-sequence id
    /// ends it.
    pub fn commit(&mut self, id: u32) -> Result<(), Error> {
        self.mask = None;
        self.m.consume_token(id).map_err(|e| self.err(e))?;
        self.follow(id);
        Ok(())
    }

    /// Follows `id`'s bytes with the JSON guide, and the plan when `id` begins it.
    fn follow(&mut self, id: u32) {
        let bytes = self.texts.bytes.get(id as usize).and_then(Option::as_ref);
        if let (Some(j), Some(b)) = (&mut self.json, bytes) {
            j.push(b);
        }
        self.plan = match (self.plan.take(), bytes) {
            (Some(p), Some(b)) if p.starts_with(b) => Some(p[b.len()..].to_vec()),
            _ => None,
        };
    }

    /// Commits `id` if the grammar can still be finished after it in `left − 1` more tokens
    /// (`left` counts the tokens still to be written, this one included); otherwise leaves the
    /// constraint as it was, and the caller draws again without `id`.
    ///
    /// The guarantee needs a known way to finish: from the start, the grammar's smallest
    /// sentence when it fits `left`. Without one (none was found, or it is longer than the
    /// tokens left), or once a search would cost more than [`SEARCH_OPS`] parser operations,
    /// every token is taken, as [`Constraint::commit`] takes it ([`Constraint::is_checking`]).
    pub fn commit_within(&mut self, id: u32, left: usize) -> Result<Commit, Error> {
        if self.checking && self.plan.as_ref().is_none_or(|p| p.len() > left) {
            // A plan is known while checking, and it fits: keep it so, or stop checking.
            self.plan = match self.plan.take().filter(|p| p.len() <= left) {
                Some(p) => Some(p),
                None => match self.completion(left, SEARCH_OPS) {
                    Search::Found(p) => Some(p),
                    Search::NotFound | Search::GaveUp => None,
                },
            };
            self.checking = self.plan.is_some();
        }
        if !self.checking || self.eos.contains(&id) {
            self.commit(id)?;
            return Ok(Commit::Taken);
        }
        let before = (self.json.clone(), self.plan.clone(), self.mask.take());
        self.m.consume_token(id).map_err(|e| self.err(e))?;
        self.follow(id);
        let room = left.saturating_sub(1);
        if self.plan.as_ref().is_some_and(|p| p.len() <= room) {
            return Ok(Commit::Taken);
        }
        // The way to finish from before this token often still finishes after it (text
        // inside a string, a digit of a number): checking it costs less than a search.
        if let Some(p) = before.1.as_ref().filter(|p| p.len() <= room)
            && self.finishes(p)
        {
            self.plan = Some(p.clone());
            return Ok(Commit::Taken);
        }
        match self.completion(room, SEARCH_OPS) {
            Search::Found(p) => {
                self.plan = Some(p);
                Ok(Commit::Taken)
            }
            Search::GaveUp => {
                // Too costly to check: taken, and no more tokens are checked.
                self.checking = false;
                Ok(Commit::Taken)
            }
            Search::NotFound => {
                self.m.rollback(1).map_err(|e| self.err(e))?;
                (self.json, self.plan, self.mask) = before;
                self.steered = true;
                Ok(Commit::Refused)
            }
        }
    }

    /// The token that starts the plan: when every token drawn has been refused, it is always
    /// one that can be taken (the plan fits the tokens left, one byte per token).
    pub fn planned_token(&self) -> Option<u32> {
        let b = *self.plan.as_ref()?.first()?;
        self.texts.byte_token[b as usize]
    }

    /// Whether tokens are still checked for leaving a way to finish in the tokens left
    /// ([`Constraint::commit_within`]): from the start when the grammar's smallest sentence
    /// was found and fits, until a search costs more than [`SEARCH_OPS`].
    pub fn is_checking(&self) -> bool {
        self.checking
    }

    /// Whether the output so far is a complete sentence of the grammar (it may end here).
    pub fn is_complete(&mut self) -> bool {
        self.m.is_accepting().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests;
