//! The request core every API dialect shares: sampling options, a chat turn (messages, tools,
//! a forced call, a response format, thinking, a continued prefill), preparing it off the
//! request workers, submitting its choices to the batcher, reading a finished choice back as
//! content, reasoning and calls, and what a stream may send of it before it is whole
//! ([`Unfold`]). A dialect (`openai`, `responses`, `anthropic`, `ollama`) only translates its
//! request into these and these into its replies: the same request in any dialect gives the
//! same tokens.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::App;
use crate::batch::{Event, Finished, OwnedPrompt};
use crate::generate::Token;
use crate::options::{FinishReason, GenerateOptions};
use crate::toolcall::{Calls, ToolCall};
use crate::{Engine, Error};
use sluice_text::Message;

/// Which API a request came in by: errors are answered in its shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Dialect {
    /// OpenAI's: `{"error": {"message", "type", "param", "code"}}`.
    OpenAi,
    /// Anthropic's: `{"type": "error", "error": {"type", "message"}}`.
    Anthropic,
    /// Ollama's: `{"error": "…"}`.
    Ollama,
}

impl Dialect {
    /// The dialect a path belongs to.
    pub(super) fn of_path(path: &str) -> Dialect {
        if path.starts_with("/v1/messages") {
            Dialect::Anthropic
        } else if path.starts_with("/api/") {
            Dialect::Ollama
        } else {
            Dialect::OpenAi
        }
    }
}

/// A request error: an HTTP status and a message, answered in the dialect's shape
/// ([`ApiError::into_dialect`]; as a plain `IntoResponse`, OpenAI's).
#[derive(Debug)]
pub(super) struct ApiError(pub StatusCode, pub String);

impl ApiError {
    /// The error as `dialect` writes one.
    pub(super) fn into_dialect(self, dialect: Dialect) -> Response {
        let (status, msg) = (self.0, self.1);
        let body = match dialect {
            Dialect::OpenAi => {
                // OpenAI's types: the server's own failures are `server_error`, a missing or
                // wrong key `authentication_error`, the client's mistakes
                // `invalid_request_error`.
                let kind = if status.is_server_error() {
                    "server_error"
                } else if status == StatusCode::UNAUTHORIZED {
                    "authentication_error"
                } else {
                    "invalid_request_error"
                };
                json!({"error": {"message": msg, "type": kind, "param": null, "code": null}})
            }
            Dialect::Anthropic => {
                let kind = match status.as_u16() {
                    401 => "authentication_error",
                    403 => "permission_error",
                    404 => "not_found_error",
                    413 => "request_too_large",
                    429 => "rate_limit_error",
                    s if s >= 500 => "api_error",
                    _ => "invalid_request_error",
                };
                json!({"type": "error", "error": {"type": kind, "message": msg}})
            }
            Dialect::Ollama => json!({"error": msg}),
        };
        (status, axum::Json(body)).into_response()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.into_dialect(Dialect::OpenAi)
    }
}

/// A 400.
pub(super) fn bad(msg: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, msg.into())
}

/// The text of a field that is a string or a list of typed parts (`{"type", "text"}`), the
/// parts of a type in `text` joined: a part of a type in `media` is refused as not text, any
/// other type as unsupported; errors name the field and the part (`noun`: "block", "part").
pub(super) fn text_parts(
    v: &Value,
    what: &str,
    text: &[&str],
    media: &[&str],
    noun: &str,
) -> Result<String, ApiError> {
    let Value::Array(parts) = v else {
        return match v {
            Value::String(s) => Ok(s.clone()),
            _ => Err(bad(format!(
                "{what} must be a string or a list of {}",
                if noun == "block" {
                    "text blocks"
                } else {
                    "parts"
                }
            ))),
        };
    };
    let mut out = String::new();
    for (i, p) in parts.iter().enumerate() {
        match p.get("type").and_then(Value::as_str) {
            Some(t) if text.contains(&t) => out.push_str(
                p.get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{what}[{i}].text must be a string")))?,
            ),
            Some(t) if media.contains(&t) => {
                return Err(bad(format!(
                    "{what}[{i}]: `{t}` is not supported (sluice reads text only)"
                )));
            }
            Some(t) => {
                return Err(bad(format!(
                    "{what}[{i}]: a {noun} of type `{t}` is not supported here"
                )));
            }
            None => return Err(bad(format!("{what}[{i}].type is missing"))),
        }
    }
    Ok(out)
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        let status = if e.is_input_error() {
            StatusCode::BAD_REQUEST
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        };
        ApiError(status, e.to_string())
    }
}

/// A request field, when present and not null.
pub(super) fn field<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    v.get(name).filter(|x| !x.is_null())
}

/// A numeric field (absent or null: `None`), naming the field when it is not a number.
pub(super) fn number(v: &Value, name: &str) -> Result<Option<f32>, ApiError> {
    match field(v, name) {
        None => Ok(None),
        Some(x) => x
            .as_f64()
            .map(|f| Some(f as f32))
            .ok_or_else(|| bad(format!("`{name}` must be a number"))),
    }
}

/// A true-or-false field (absent or null: `None`).
pub(super) fn flag(v: &Value, name: &str) -> Result<Option<bool>, ApiError> {
    match field(v, name) {
        None => Ok(None),
        Some(x) => x
            .as_bool()
            .map(Some)
            .ok_or_else(|| bad(format!("`{name}` must be true or false"))),
    }
}

/// A field that must be a positive integer (absent or null: `None`).
pub(super) fn positive(v: &Value, name: &str) -> Result<Option<usize>, ApiError> {
    match field(v, name) {
        None => Ok(None),
        Some(x) => x
            .as_u64()
            .filter(|&n| n >= 1)
            .map(|n| Some(usize::try_from(n).unwrap_or(usize::MAX)))
            .ok_or_else(|| bad(format!("`{name}` must be a positive integer"))),
    }
}

/// The most choices one request may ask for.
pub(super) const MAX_CHOICES: usize = 16;

/// Sampling and length, as every dialect names them once translated.
#[derive(Clone, Debug, Default)]
pub(super) struct Sampling {
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// Only the last this many tokens count for penalties (0: all of them).
    pub penalty_last_n: Option<usize>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    /// Each token's log-probability with this many alternatives.
    pub logprobs: Option<usize>,
    /// The length is an upper bound, as agents mean it (Anthropic's, the Responses API's,
    /// Ollama's): none, or one over the server's limit, is as long as the server allows, and
    /// a reply that would not fit the context is held to what it leaves ([`submit`]'s `fit`).
    /// Otherwise (OpenAI's chat and completions) none is the server's default and one over
    /// the limit is refused.
    pub up_to: bool,
}

impl App {
    /// Generation options from a request's sampling: the model's defaults with the request's
    /// values on top, `max_tokens` within the server's limit, every value checked.
    pub(super) fn options(&self, s: &Sampling) -> Result<GenerateOptions, ApiError> {
        let limit = self.opts.max_tokens_limit;
        let max = match (s.max_tokens, s.up_to) {
            (Some(n), true) => n.min(limit),
            (None, true) => limit,
            (m, false) => m.unwrap_or(self.opts.default_max_tokens),
        };
        if max > limit {
            return Err(bad(format!(
                "`max_tokens` {max} is over this server's limit of {}",
                self.opts.max_tokens_limit
            )));
        }
        let mut o = self.batcher.engine().default_sampling().clone();
        if let Some(t) = s.temperature {
            o.temperature = t;
        }
        if let Some(p) = s.top_p {
            o.top_p = p;
        }
        if let Some(k) = s.top_k {
            o.top_k = k;
        }
        if let Some(m) = s.min_p {
            o.min_p = m;
        }
        if let Some(r) = s.repetition_penalty {
            o.repetition_penalty = r;
        }
        if let Some(p) = s.presence_penalty {
            o.presence_penalty = p;
        }
        if let Some(f) = s.frequency_penalty {
            o.frequency_penalty = f;
        }
        if let Some(n) = s.penalty_last_n {
            o.penalty_last_n = n;
        }
        o.seed = s.seed.unwrap_or(0);
        o.validate().map_err(|e| bad(e.to_string()))?;
        if s.stop.iter().any(String::is_empty) {
            return Err(bad("a stop sequence is empty"));
        }
        if s.logprobs.is_some_and(|n| n > crate::MAX_TOP_LOGPROBS) {
            return Err(bad(format!(
                "at most {} alternatives per token (`top_logprobs` / `logprobs`)",
                crate::MAX_TOP_LOGPROBS
            )));
        }
        Ok(GenerateOptions {
            max_tokens: max,
            sampling: o,
            stop: s.stop.clone(),
            logprobs: s.logprobs,
            draft: self.opts.draft,
            ..Default::default()
        })
    }
}

/// How a turn's tools may be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum ToolChoice {
    /// The model calls a tool or not, in its own syntax.
    Auto,
    /// As if there were no tools.
    None,
    /// At least one call, forced by a grammar.
    Required,
    /// A call of this tool, forced by a grammar.
    Named(String),
}

/// A chat turn as every dialect translates it: messages in OpenAI's shape (`role`, `content`
/// as a string, an assistant's `tool_calls`, a tool message's `tool_call_id`), OpenAI function
/// tools, how they may be used, a response format, and whether the model should think.
#[derive(Clone, Debug)]
pub(super) struct Turn {
    pub messages: Vec<Value>,
    pub tools: Vec<Value>,
    pub choice: ToolChoice,
    pub parallel: bool,
    pub format: Option<crate::Grammar>,
    /// `Some` when the request asks for thinking (on or off); a template with a thinking
    /// switch gets it, others ignore it.
    pub thinking: Option<bool>,
    /// A last assistant message with text is continued, not answered (Anthropic's and
    /// Ollama's prefill): the reply goes on from its last character.
    pub continue_final: bool,
}

/// A prompt as a request gives it, before it is tokenized.
pub(super) enum PromptSpec {
    /// Text, token ids, or plain chat messages (through the template).
    Owned(OwnedPrompt),
    /// A chat rendered with template arguments (`tools`, a thinking switch): the messages as
    /// OpenAI writes them; `plain` for finding where the system messages end.
    Rich {
        full: Vec<Value>,
        plain: Vec<Message>,
        kwargs: Value,
        /// The last message's text, to go on from, when it is the assistant's to continue.
        prefill: Option<String>,
    },
}

/// A request's prompt tokenized and its grammar compiled.
pub(super) struct Prepared {
    pub ids: Vec<u32>,
    pub cache_prefix: Option<usize>,
    pub grammar: Option<crate::CompiledGrammar>,
}

/// Renders and tokenizes a prompt and compiles its grammar — once for every choice, and on
/// the blocking pool, never on the server's two async workers, so `/health` and every other
/// request go on answering meanwhile. Compilation is bounded (see
/// [`crate::Engine::compile_grammar`]); so is rendering (the template's own limits).
pub(super) async fn prepare(
    app: &App,
    prompt: PromptSpec,
    grammar: Option<crate::Grammar>,
) -> Result<Prepared, ApiError> {
    let engine = app.batcher.engine().clone();
    let work = move || -> Result<Prepared, ApiError> {
        let grammar = grammar.map(|g| engine.compile_grammar(&g)).transpose()?;
        let (ids, cache_prefix) = match prompt {
            PromptSpec::Owned(p) => {
                let ids = engine.encode(&p.as_prompt())?;
                let cache = match &p {
                    OwnedPrompt::Chat(m) => engine.chat_system_end(m, &ids),
                    _ => None,
                };
                (ids, cache)
            }
            PromptSpec::Rich {
                full,
                plain,
                kwargs,
                prefill,
            } => {
                let tpl = engine
                    .chat_template()
                    .ok_or_else(|| bad("this model has no chat template"))?;
                let tok = engine
                    .tokenizer()
                    .ok_or_else(|| bad("this model has no tokenizer"))?;
                let text = match &prefill {
                    None => tpl.render_with(&full, true, &kwargs),
                    Some(_) => tpl.render_with(&full, false, &kwargs),
                }
                .map_err(|e| bad(e.to_string()))?;
                let text = match &prefill {
                    None => text,
                    Some(p) => continued(text, p)?,
                };
                tok.check_fits(&text, engine.model().max_positions())
                    .map_err(|e| bad(e.to_string()))?;
                let ids = tok.encode(&text, false).map_err(|e| bad(e.to_string()))?;
                // Where the system messages end (with the tools, as the template puts them): a
                // recurrent model's prefix cache keeps the state there for requests that
                // share them.
                let cache = engine.system_boundary(&plain).and_then(|system| {
                    tpl.render_with(&full[..system], false, &kwargs)
                        .ok()
                        .and_then(|t| engine.prefix_end(&t, &ids))
                });
                (ids, cache)
            }
        };
        Ok(Prepared {
            ids,
            cache_prefix,
            grammar,
        })
    };
    tokio::task::spawn_blocking(work).await.map_err(|e| {
        ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("preparing the request failed: {e}"),
        )
    })?
}

/// A chat rendered through its last message, cut where that message's text ends, so that
/// the reply continues it — as transformers' `continue_final_message` does: the text's last
/// occurrence, its trailing spaces kept when the template kept them.
fn continued(rendered: String, last: &str) -> Result<String, ApiError> {
    let at = rendered.rfind(last.trim()).ok_or_else(|| {
        bad("the chat template does not write the last assistant message as given, so it cannot be continued")
    })?;
    let keep = last.trim_start();
    let end = if rendered[at..].starts_with(keep) {
        at + keep.len()
    } else {
        at + last.trim().len()
    };
    let mut rendered = rendered;
    rendered.truncate(end);
    Ok(rendered)
}

/// What a prepared turn needs to be read back: how its calls are written, whether its
/// reasoning is to be split off, and the assistant text it continues (which calls and
/// reasoning are read with).
#[derive(Clone, Debug, Default)]
pub(super) struct Readback {
    pub calls: Option<Calls>,
    pub think: bool,
    pub prefill: String,
}

/// Prepares a chat turn: its tools given to the template (unless `ToolChoice::None`), a
/// forced call's grammar over their schemas (it wins over the response format), the calls
/// read back in the template's syntax otherwise, and a thinking switch for a template that has
/// one.
pub(super) async fn prepare_turn(app: &App, turn: Turn) -> Result<(Prepared, Readback), ApiError> {
    let engine = app.batcher.engine();
    let tools = (!turn.tools.is_empty() && turn.choice != ToolChoice::None).then_some(turn.tools);
    let forced = match &turn.choice {
        ToolChoice::Required | ToolChoice::Named(_) => {
            let name = match &turn.choice {
                ToolChoice::Named(n) => Some(n.as_str()),
                _ => None,
            };
            let (schema, calls) = crate::toolcall::forced_schema(
                tools.as_deref().unwrap_or_default(),
                name,
                turn.parallel,
            )
            .map_err(bad)?;
            Some((crate::Grammar::JsonSchema(schema), calls))
        }
        _ => None,
    };
    let template = engine.chat_template().map(|t| t.source().to_owned());
    let (grammar, calls) = match forced {
        Some((g, c)) => (Some(g), Some(c)),
        None => (
            turn.format,
            tools.as_ref().and_then(|_| {
                template
                    .as_deref()
                    .and_then(crate::toolcall::Syntax::of_template)
                    .map(Calls::Syntax)
            }),
        ),
    };
    // A thinking switch, for the templates that have one (Qwen3's `enable_thinking`).
    let switch = template
        .as_deref()
        .is_some_and(|t| t.contains("enable_thinking"));
    let think = template.as_deref().is_some_and(|t| t.contains("</think>"));
    let mut kwargs = json!({"tools": tools});
    if let (Some(on), true) = (turn.thinking, switch) {
        kwargs["enable_thinking"] = json!(on);
    }
    // The last message, continued: the assistant's, with text and no calls.
    let prefill = turn
        .messages
        .last()
        .filter(|m| {
            turn.continue_final && m["role"] == "assistant" && m.get("tool_calls").is_none()
        })
        .and_then(|m| m["content"].as_str())
        .filter(|c| !c.trim().is_empty())
        .map(str::to_owned);
    let rich = tools.is_some()
        || prefill.is_some()
        || (turn.thinking.is_some() && switch)
        || turn.messages.iter().any(|m| {
            m.get("tool_calls").is_some()
                || m.get("tool_call_id").is_some()
                || m.get("role").and_then(Value::as_str) == Some("tool")
        });
    let plain: Vec<Message> = turn
        .messages
        .iter()
        .map(|m| {
            Message::new(
                m.get("role").and_then(Value::as_str).unwrap_or_default(),
                m.get("content").and_then(Value::as_str).unwrap_or_default(),
            )
        })
        .collect();
    let spec = if rich {
        PromptSpec::Rich {
            full: turn.messages,
            plain,
            kwargs,
            prefill: prefill.clone(),
        }
    } else {
        PromptSpec::Owned(OwnedPrompt::Chat(plain))
    };
    let prepared = prepare(app, spec, grammar).await?;
    Ok((
        prepared,
        Readback {
            calls,
            think,
            prefill: prefill.unwrap_or_default(),
        },
    ))
}

/// Submits `n` jobs of one prepared prompt, choice `i` sampling with seed `seed + i` (so
/// choice 0 is what `n: 1` gives), their events tagged with the choice; the jobs are
/// cancelled when the receiver goes. With `fit` ([`Sampling::up_to`]), `max_tokens` is held
/// to what the context leaves after the prompt.
pub(super) fn submit(
    app: &App,
    prepared: Prepared,
    mut opts: GenerateOptions,
    n: usize,
    fit: bool,
) -> Result<mpsc::UnboundedReceiver<(usize, Event)>, ApiError> {
    let (tx, rx) = mpsc::unbounded_channel();
    let left = app
        .batcher
        .engine()
        .model()
        .max_positions()
        .saturating_sub(prepared.ids.len());
    if fit && left > 0 {
        opts.max_tokens = opts.max_tokens.min(left);
    }
    if opts.cache_prefix.is_none() {
        opts.cache_prefix = prepared.cache_prefix;
    }
    opts.grammar = prepared.grammar;
    let prompt = OwnedPrompt::Ids(prepared.ids);
    for i in 0..n {
        let mut o = opts.clone();
        o.sampling.seed = opts.sampling.seed.wrapping_add(i as u64);
        let tx = tx.clone();
        app.batcher
            .submit(&prompt, o, Box::new(move |e| tx.send((i, e)).is_ok()))?;
    }
    Ok(rx)
}

/// Waits for the end of a request's `n` jobs; returns each with its tokens that carry
/// log-probabilities and the byte offset in the completion where each token's text starts.
pub(super) async fn collect(
    mut rx: mpsc::UnboundedReceiver<(usize, Event)>,
    n: usize,
) -> Result<Vec<(Finished, Vec<(Token, usize)>)>, ApiError> {
    let mut tokens: Vec<Vec<(Token, usize)>> = vec![Vec::new(); n];
    let mut offset = vec![0usize; n];
    let mut done: Vec<Option<Finished>> = (0..n).map(|_| None).collect();
    while let Some((i, e)) = rx.recv().await {
        match e {
            Event::Token(t) => {
                let len = t.text.len();
                if t.logprobs.is_some() {
                    tokens[i].push((t, offset[i]));
                }
                offset[i] += len;
            }
            Event::Done(f) => {
                done[i] = Some(*f);
                if done.iter().all(Option::is_some) {
                    return Ok(done.into_iter().flatten().zip(tokens).collect());
                }
            }
            Event::Failed(e) => return Err(e.into()),
        }
    }
    Err(ApiError(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the generation stopped".into(),
    ))
}

/// A finished choice read back: what it says, its reasoning, its calls, why it ended and, for
/// a stop sequence, which.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Reply {
    pub content: String,
    pub reasoning: Option<String>,
    pub calls: Vec<ToolCall>,
    pub finish: FinishReason,
    pub stop: Option<String>,
}

/// Reads a finished choice back (see [`Reply`]). Reasoning is what a thinking template's
/// model writes before `</think>`; calls are parsed from the rest. Both are read from the
/// continued assistant text and the reply together (a prefill may open a call); the content
/// is the reply's own, without that text.
pub(super) fn reply(engine: &Engine, f: &Finished, back: &Readback, stops: &[String]) -> Reply {
    let (reasoning, content, calls) = read_back(&f.text, back);
    let stop = (f.finish == FinishReason::Stop)
        .then(|| stop_sequence(engine, f, stops))
        .flatten();
    Reply {
        content,
        reasoning,
        calls,
        finish: f.finish,
        stop,
    }
}

/// A reply's text read back: its reasoning, its content and its calls (see [`reply`]).
fn read_back(generated: &str, back: &Readback) -> (Option<String>, String, Vec<ToolCall>) {
    let whole = format!("{}{}", back.prefill, generated);
    let (reasoning, text) = if back.think {
        split_thinking(&whole)
    } else {
        (None, whole)
    };
    // Read for calls, the content starts at its first word (as a stream of it does, which
    // cannot know whether leading spaces come before a call).
    let (content, calls) = match &back.calls {
        Some(c) => {
            let p = c.parse(&text);
            (p.content.trim_start().to_owned(), p.calls)
        }
        None => (text, Vec::new()),
    };
    let prefill = match back.calls {
        Some(_) => back.prefill.trim_start(),
        None => back.prefill.as_str(),
    };
    let content = match content.strip_prefix(prefill) {
        Some(own) if !prefill.is_empty() => own.to_owned(),
        _ => content,
    };
    (reasoning, content, calls)
}

/// What a stream may send of a reply while it is being written: its reasoning once the model
/// has closed it (`</think>`), then its content as it comes — less, when the reply may hold
/// calls, a tail that could begin a call's marker, the spaces at its ends, and everything
/// from the first marker on. What was sent is always the start of the reply read back whole
/// ([`Unfold::rest`]), so a stream carries the same text and calls as a whole reply. Forced
/// calls, harmony's channels and continued prefills are sent whole at the end.
pub(super) struct Unfold {
    live: bool,
    think: bool,
    opener: Option<&'static str>,
    text: String,
    /// Where the content begins in `text`, once the reasoning (if any) has closed.
    content_at: Option<usize>,
    /// Bytes of content sent.
    sent: usize,
    /// A call has begun: nothing more is sent live.
    held: bool,
}

/// A piece [`Unfold`] lets a stream send.
#[derive(Debug, PartialEq)]
pub(super) enum Part {
    /// The whole reasoning, sent once.
    Reasoning(String),
    /// More content.
    Text(String),
}

impl Unfold {
    pub(super) fn new(back: &Readback) -> Unfold {
        let (live, opener) = match &back.calls {
            None => (true, None),
            Some(Calls::Syntax(s)) => (s.opener().is_some(), s.opener()),
            Some(_) => (false, None),
        };
        Unfold {
            live: live && back.prefill.is_empty(),
            think: back.think,
            opener,
            text: String::new(),
            content_at: (!back.think).then_some(0),
            sent: 0,
            held: false,
        }
    }

    /// A token's text; what may be sent now.
    pub(super) fn push(&mut self, delta: &str) -> Vec<Part> {
        self.text.push_str(delta);
        let mut out = Vec::new();
        if !self.live || self.held {
            return out;
        }
        let at = match self.content_at {
            Some(at) => at,
            None => {
                let Some(i) = self.text.find("</think>") else {
                    return out;
                };
                let (reasoning, _) = split_thinking(&self.text);
                out.push(Part::Reasoning(reasoning.unwrap_or_default()));
                i + "</think>".len()
            }
        };
        // Content read back from reasoning or for calls starts at its first word.
        let at = if self.sent == 0 && (self.think || self.opener.is_some()) {
            at + (self.text[at..].len() - self.text[at..].trim_start().len())
        } else {
            at
        };
        self.content_at = Some(at);
        let region = &self.text[at..];
        let end = match self.opener {
            None => region.len(),
            Some(o) => {
                let end = match region.find(o) {
                    Some(j) => {
                        self.held = true;
                        j
                    }
                    // Hold back a tail that may be the marker's start.
                    None => (1..o.len().min(region.len() + 1))
                        .rev()
                        .find(|&k| {
                            region.is_char_boundary(region.len() - k)
                                && o.starts_with(&region[region.len() - k..])
                        })
                        .map_or(region.len(), |k| region.len() - k),
                };
                region[..end].trim_end().len()
            }
        };
        if end > self.sent {
            out.push(Part::Text(region[self.sent..end].to_owned()));
            self.sent = end;
        }
        out
    }

    /// Whether the reasoning was sent.
    pub(super) fn reasoning_sent(&self) -> bool {
        self.live && self.think && self.content_at.is_some()
    }

    /// The content of the whole reply `r` still to send.
    pub(super) fn rest<'r>(&self, r: &'r Reply) -> &'r str {
        let sent = self
            .content_at
            .and_then(|at| self.text.get(at..at + self.sent))
            .unwrap_or_default();
        // What was sent is the content's start (see the type's doc); were it not, the
        // content would be sent again whole rather than lost.
        r.content.strip_prefix(sent).unwrap_or(&r.content)
    }
}

/// The reasoning before `</think>` (a leading `<think>` dropped) and the text after it.
pub(super) fn split_thinking(text: &str) -> (Option<String>, String) {
    match text.split_once("</think>") {
        Some((r, rest)) => {
            let r = r.trim_start().strip_prefix("<think>").unwrap_or(r);
            (Some(r.trim().to_owned()), rest.trim_start().to_owned())
        }
        None => (None, text.to_owned()),
    }
}

/// Which stop sequence ended a generation: the one its ids continue with past the text (the
/// text ends where the stop sequence begins).
fn stop_sequence(engine: &Engine, f: &Finished, stops: &[String]) -> Option<String> {
    let all = engine.tokenizer()?.decode(&f.ids).ok()?;
    let rest = all.get(f.text.len()..)?;
    stops
        .iter()
        .filter(|s| rest.starts_with(s.as_str()))
        .max_by_key(|s| s.len())
        .or_else(|| stops.iter().find(|s| rest.contains(s.as_str())))
        .cloned()
}

/// The text of one token id as a client sees it (lossy where the id ends mid-character).
pub(super) fn token_text(engine: &Engine, id: u32) -> String {
    engine
        .tokenizer()
        .and_then(|t| t.decode(&[id]).ok())
        .unwrap_or_default()
}

/// Counts of a request's choices: the prompt once, the completions summed, the prompt tokens
/// every choice took from the prefix cache, and the drafts made and kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Usage {
    pub prompt: usize,
    pub completion: usize,
    pub cached: usize,
    pub proposed: usize,
    pub accepted: usize,
}

pub(super) fn usage<'a>(done: impl Iterator<Item = &'a Finished>) -> Usage {
    let mut u = Usage::default();
    let mut cached: Option<usize> = None;
    for f in done {
        u.prompt = f.prompt_ids.len();
        // What every choice took from the prefix cache (the first of `n` choices may be what
        // the others take from).
        cached = Some(cached.map_or(f.stats.cached_tokens, |c| c.min(f.stats.cached_tokens)));
        u.completion += f.ids.len();
        u.proposed += f.stats.draft_proposed;
        u.accepted += f.stats.draft_accepted;
    }
    u.cached = cached.unwrap_or(0);
    u
}

/// Seconds since the epoch.
pub(super) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests;
