//! An OpenAI-compatible HTTP server: `/v1/completions`, `/v1/chat/completions` (with
//! `stream: true` server-sent events), `/v1/models`, `/health`. Requests are decoded together by
//! a [`Batcher`]; a client that disconnects frees its slot.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::batch::{Batcher, Event, Finished, OwnedPrompt};
use crate::generate::{FinishReason, GenerateOptions, Token};
use crate::{Engine, Error};
use sluice_text::Message;

/// Server settings.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Address to bind (127.0.0.1 unless told otherwise).
    pub addr: SocketAddr,
    /// Sequences decoded together.
    pub batch_size: usize,
    /// The largest `max_tokens` a request may ask for.
    pub max_tokens_limit: usize,
    /// `max_tokens` when a request gives none.
    pub default_max_tokens: usize,
    /// The largest request body, in bytes.
    pub max_body_bytes: usize,
    /// The model name reported by `/v1/models` and in responses.
    pub model_name: String,
    /// How long a client has to send a request's headers, and then its body (30 s by default
    /// in `sluice serve`): a connection that sends half a request is closed after it.
    pub read_timeout: Duration,
    /// Speculative decoding for every request ([`crate::Draft`]).
    pub draft: crate::Draft,
}

/// How long, after Ctrl-C, requests being answered get to finish before every connection is
/// dropped (idle and half-read ones are closed at once).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

struct App {
    batcher: Batcher,
    opts: ServerOptions,
    next_id: AtomicU64,
}

/// A request error: HTTP status and message, returned as OpenAI's error object.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // OpenAI's types: the server's own failures are `server_error`, the client's mistakes
        // `invalid_request_error`.
        let kind = if self.0.is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        };
        let body = json!({"error": {"message": self.1, "type": kind, "param": null, "code": null}});
        (self.0, axum::Json(body)).into_response()
    }
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, msg.into())
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

/// A string or a list of strings (`stop`).
#[derive(Deserialize)]
#[serde(untagged)]
enum Strings {
    One(String),
    Many(Vec<String>),
}

/// A completion prompt: text, one-element list of text, or token ids.
#[derive(Deserialize)]
#[serde(untagged)]
enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
}

/// Sampling and length fields shared by both endpoints. Fields OpenAI clients send that sluice
/// does not use are accepted only with their neutral values.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Common {
    model: Option<String>,
    max_tokens: Option<usize>,
    max_completion_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    seed: Option<u64>,
    stop: Option<Strings>,
    stream: Option<bool>,
    stream_options: Option<Value>,
    n: Option<u32>,
    user: Option<String>,
    /// Chat: `true` for each token's log-probability; completions: the number of alternatives.
    logprobs: Option<Value>,
    /// Chat: alternatives per token (0–20), with `logprobs: true`.
    top_logprobs: Option<usize>,
}

/// The most choices one request may ask for (`n`).
const MAX_CHOICES: usize = 16;

/// Which endpoint a request came to: the two spell `logprobs` differently.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Completions,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CompletionRequest {
    prompt: PromptField,
    echo: Option<bool>,
    #[serde(flatten)]
    common: Common,
}

/// A chat message: content as a string or as a list of text parts.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChatMessage {
    role: String,
    /// Absent or null for an assistant message that only calls tools.
    #[serde(default)]
    content: Option<Content>,
    name: Option<String>,
    /// An assistant message's calls, as OpenAI writes them (passed to the template as given).
    tool_calls: Option<Vec<Value>>,
    /// A `tool` message's answer to this call.
    tool_call_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChatRequest {
    messages: Vec<ChatMessage>,
    /// Function tools, given to the chat template as its `tools` variable.
    tools: Option<Vec<Value>>,
    /// `"auto"` (the default with tools), `"none"`, `"required"` or
    /// `{"type": "function", "function": {"name": …}}`; the last two force a call with a grammar.
    tool_choice: Option<Value>,
    /// With a forced call: whether the reply may make more than one (default true).
    parallel_tool_calls: Option<bool>,
    /// `{"type": "text" | "json_object" | "json_schema", …}`: the output follows the grammar.
    response_format: Option<Value>,
    #[serde(flatten)]
    common: Common,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn finish_str(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Length => "length",
        FinishReason::Eos | FinishReason::Stop => "stop",
    }
}

/// Usage of a request's choices: the prompt once, the completions summed.
/// `prompt_tokens_details.cached_tokens`: the prompt tokens every choice took from the prefix
/// cache. With drafting (`sluice serve --draft ngram`), the drafts made and kept, once there
/// were any.
fn usage<'a>(done: impl Iterator<Item = &'a Finished>) -> Value {
    let (mut prompt, mut completion) = (0, 0);
    let (mut proposed, mut accepted) = (0, 0);
    let mut cached: Option<usize> = None;
    for f in done {
        prompt = f.prompt_ids.len();
        // What every choice took from the prefix cache (the first of `n` choices may be what
        // the others take from).
        cached = Some(cached.map_or(f.stats.cached_tokens, |c| c.min(f.stats.cached_tokens)));
        completion += f.ids.len();
        proposed += f.stats.draft_proposed;
        accepted += f.stats.draft_accepted;
    }
    let mut u = json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached.unwrap_or(0)},
    });
    if proposed > 0 {
        u["draft_proposed"] = json!(proposed);
        u["draft_accepted"] = json!(accepted);
    }
    u
}

impl App {
    /// Checks the shared fields and builds generation options.
    fn options(
        &self,
        c: &Common,
        endpoint: Endpoint,
    ) -> Result<(GenerateOptions, usize, bool, bool), ApiError> {
        if let Some(m) = &c.model
            && m != &self.opts.model_name
        {
            return Err(ApiError(
                StatusCode::NOT_FOUND,
                format!(
                    "model `{m}` does not exist; this server runs `{}`",
                    self.opts.model_name
                ),
            ));
        }
        let n = c.n.unwrap_or(1) as usize;
        if n == 0 || n > MAX_CHOICES {
            return Err(bad(format!("`n` must be 1 to {MAX_CHOICES}")));
        }
        // Chat: `logprobs: true` and `top_logprobs: N`; completions: `logprobs: N`.
        let logprobs = match (endpoint, &c.logprobs) {
            (_, None | Some(Value::Null)) | (Endpoint::Chat, Some(Value::Bool(false))) => {
                if c.top_logprobs.is_some() {
                    return Err(bad("`top_logprobs` needs `logprobs: true`"));
                }
                None
            }
            (Endpoint::Chat, Some(Value::Bool(true))) => Some(c.top_logprobs.unwrap_or(0)),
            (Endpoint::Chat, Some(_)) => return Err(bad("`logprobs` must be true or false")),
            (Endpoint::Completions, Some(v)) => {
                if c.top_logprobs.is_some() {
                    return Err(bad(
                        "`top_logprobs` is a chat field; completions take `logprobs: N`",
                    ));
                }
                Some(v.as_u64().map(|n| n as usize).ok_or_else(|| {
                    bad("`logprobs` must be the number of alternatives per token")
                })?)
            }
        };
        if logprobs.is_some_and(|n| n > crate::MAX_TOP_LOGPROBS) {
            return Err(bad(format!(
                "at most {} alternatives per token (`top_logprobs` / `logprobs`)",
                crate::MAX_TOP_LOGPROBS
            )));
        }
        let _ = &c.user;
        let max = c
            .max_completion_tokens
            .or(c.max_tokens)
            .unwrap_or(self.opts.default_max_tokens);
        if max > self.opts.max_tokens_limit {
            return Err(bad(format!(
                "`max_tokens` {max} is over this server's limit of {}",
                self.opts.max_tokens_limit
            )));
        }
        let mut s = self.batcher.engine().default_sampling().clone();
        if let Some(t) = c.temperature {
            s.temperature = t;
        }
        if let Some(p) = c.top_p {
            s.top_p = p;
        }
        if let Some(k) = c.top_k {
            s.top_k = k;
        }
        if let Some(m) = c.min_p {
            s.min_p = m;
        }
        if let Some(r) = c.repetition_penalty {
            s.repetition_penalty = r;
        }
        if let Some(p) = c.presence_penalty {
            s.presence_penalty = p;
        }
        if let Some(f) = c.frequency_penalty {
            s.frequency_penalty = f;
        }
        s.seed = c.seed.unwrap_or(0);
        s.validate().map_err(|e| bad(e.to_string()))?;
        let stop = match &c.stop {
            None => Vec::new(),
            Some(Strings::One(s)) => vec![s.clone()],
            Some(Strings::Many(v)) => v.clone(),
        };
        if stop.len() > 4 || stop.iter().any(String::is_empty) {
            return Err(bad("`stop`: at most 4 non-empty strings"));
        }
        let include_usage = c
            .stream_options
            .as_ref()
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        Ok((
            GenerateOptions {
                max_tokens: max,
                sampling: s,
                stop,
                logprobs,
                draft: self.opts.draft,
                ..Default::default()
            },
            n,
            c.stream.unwrap_or(false),
            include_usage,
        ))
    }

    fn id(&self, prefix: &str) -> String {
        format!("{prefix}-{}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }
}

/// Reads a request body: only `application/json` (a web page can send a form or `text/plain`
/// to a local server without the browser asking first; it cannot send JSON that way), at most
/// `max_body_bytes` (413 otherwise, as an OpenAI-style error), within the read timeout (408).
async fn read_body(app: &App, headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    let json_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"));
    if !json_type {
        return Err(ApiError(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type must be application/json".into(),
        ));
    }
    let max = app.opts.max_body_bytes;
    let too_large = || {
        ApiError(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is over this server's limit of {max} bytes (--max-body)"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large());
    }
    match tokio::time::timeout(app.opts.read_timeout, axum::body::to_bytes(body, max)).await {
        Err(_) => Err(ApiError(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within {} s",
                app.opts.read_timeout.as_secs_f64()
            ),
        )),
        Ok(Err(e)) => {
            let e = e.into_inner();
            if e.is::<http_body_util::LengthLimitError>() {
                Err(too_large())
            } else {
                Err(bad(format!("reading the request body: {e}")))
            }
        }
        Ok(Ok(b)) => Ok(b),
    }
}

fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| bad(format!("bad request body: {e}")))
}

/// A prompt as a request gives it, before it is tokenized.
enum PromptSpec {
    /// Text, token ids, or plain chat messages (through the template).
    Owned(OwnedPrompt),
    /// A chat with tools or a history of calls: the messages as OpenAI sent them, rendered
    /// with the template's `tools` variable set; `plain` for finding the system messages' end.
    Rich {
        full: Vec<Value>,
        plain: Vec<Message>,
        tools: Option<Vec<Value>>,
    },
}

/// A request's prompt tokenized and its grammar compiled.
struct Prepared {
    ids: Vec<u32>,
    cache_prefix: Option<usize>,
    grammar: Option<crate::CompiledGrammar>,
}

/// Renders and tokenizes a prompt and compiles its grammar — once for every choice, and on
/// the blocking pool, never on the server's two async workers, so `/health` and every other
/// request go on answering meanwhile. Compilation is bounded (see
/// [`crate::Engine::compile_grammar`]); so is rendering (the template's own limits).
async fn prepare(
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
            PromptSpec::Rich { full, plain, tools } => {
                let tpl = engine
                    .chat_template()
                    .ok_or_else(|| bad("this model has no chat template"))?;
                let tok = engine
                    .tokenizer()
                    .ok_or_else(|| bad("this model has no tokenizer"))?;
                let text = tpl
                    .render_with(&full, true, &json!({"tools": tools}))
                    .map_err(|e| bad(e.to_string()))?;
                tok.check_fits(&text, engine.model().max_positions())
                    .map_err(|e| bad(e.to_string()))?;
                let ids = tok.encode(&text, false).map_err(|e| bad(e.to_string()))?;
                // Where the system messages end (with the tools, as the template puts them): a
                // recurrent model's prefix cache keeps the state there for requests that
                // share them.
                let cache = engine.system_boundary(&plain).and_then(|system| {
                    tpl.render_with(&full[..system], false, &json!({"tools": tools}))
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

/// Submits `n` jobs of one prepared prompt, choice `i` sampling with seed `seed + i` (so
/// choice 0 is what `n: 1` gives), their events tagged with the choice; the jobs are
/// cancelled when the receiver goes.
fn submit(
    app: &App,
    prepared: Prepared,
    mut opts: GenerateOptions,
    n: usize,
) -> Result<mpsc::UnboundedReceiver<(usize, Event)>, ApiError> {
    let (tx, rx) = mpsc::unbounded_channel();
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

/// Liveness plus the batcher's counters (sequences active, queued, finished, cancelled,
/// failed).
async fn health(State(app): State<Arc<App>>) -> impl IntoResponse {
    let s = app.batcher.stats();
    axum::Json(json!({
        "status": "ok",
        "active": s.active,
        "queued": s.queued,
        "finished": s.finished,
        "cancelled": s.cancelled,
        "failed": s.failed,
        "rejected": s.rejected,
        "max_batch": app.batcher.max_batch(),
    }))
}

async fn models(State(app): State<Arc<App>>) -> impl IntoResponse {
    axum::Json(
        json!({"object": "list", "data": [{"id": app.opts.model_name, "object": "model", "created": 0, "owned_by": "sluice"}]}),
    )
}

async fn completions(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_body(&app, &headers, body).await?;
    let req: CompletionRequest = parse(&body)?;
    if req.echo == Some(true) {
        return Err(bad("`echo` is not supported"));
    }
    let prompt = match req.prompt {
        PromptField::Text(t) => OwnedPrompt::Text(t),
        PromptField::Ids(ids) => OwnedPrompt::Ids(ids),
        PromptField::Texts(mut v) if v.len() == 1 => OwnedPrompt::Text(v.remove(0)),
        PromptField::Texts(_) => return Err(bad("`prompt`: give one prompt per request")),
    };
    let (opts, n, stream, include_usage) = app.options(&req.common, Endpoint::Completions)?;
    let prepared = prepare(&app, PromptSpec::Owned(prompt), None).await?;
    let rx = submit(&app, prepared, opts, n)?;
    let id = app.id("cmpl");
    let name = app.opts.model_name.clone();
    let created = now();
    let engine = app.batcher.engine().clone();
    if stream {
        let chunk = move |i: usize, text: &str, finish: Option<&str>, lp: &[(Token, usize)]| {
            let logprobs = completion_logprobs(&engine, lp);
            json!({"id": id, "object": "text_completion", "created": created, "model": name, "choices": [{"index": i, "text": text, "finish_reason": finish, "logprobs": logprobs}]})
        };
        return Ok(sse(rx, n, chunk, Vec::new(), include_usage).into_response());
    }
    let done = collect(rx, n).await?;
    let u = usage(done.iter().map(|d| &d.0));
    let choices = done.into_iter().enumerate().map(move |(i, (f, lp))| {
        json!({"index": i, "text": f.text, "finish_reason": finish_str(f.finish), "logprobs": completion_logprobs(&engine, &lp)})
            .to_string()
    });
    Ok(json_stream(
        json!({"id": id, "object": "text_completion", "created": created, "model": name}),
        "choices",
        choices,
        "usage",
        u,
    ))
}

/// A JSON object response written as it is sent: the fields of `head`, then `list` as an
/// array whose items (JSON texts) are made one at a time as the body goes out, then `tail`
/// under its name. A reply of many choices with log-probabilities (16 × 400 tokens × 21
/// alternatives is 10 MB of JSON) is never held whole, as a tree or as text.
fn json_stream<I>(head: Value, list: &str, items: I, tail_name: &str, tail: Value) -> Response
where
    I: Iterator<Item = String> + Send + 'static,
{
    let head = head.to_string();
    let open = format!(
        "{}{}\"{list}\":[",
        &head[..head.len() - 1],
        if head.len() > 2 { "," } else { "" }
    );
    let close = format!("],\"{tail_name}\":{tail}}}");
    let mut first = true;
    let chunks = std::iter::once(open)
        .chain(items.map(move |item| {
            let sep = if std::mem::take(&mut first) { "" } else { "," };
            format!("{sep}{item}")
        }))
        .chain(std::iter::once(close))
        .map(|s| Ok::<_, Infallible>(Bytes::from(s)));
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(futures_util::stream::iter(chunks)))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

async fn chat_completions(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_body(&app, &headers, body).await?;
    let req: ChatRequest = parse(&body)?;
    if req.messages.is_empty() {
        return Err(bad("`messages` is empty"));
    }
    // With tools (or a history of calls) the template renders the request as OpenAI sent it,
    // its `tools` variable set; the reply is parsed for calls in the template's syntax.
    // A forced call (`required`, or a named function) is a grammar over the tools' schemas.
    let named = |v: &Value| -> Option<String> {
        let f = v.get("function")?;
        (v.get("type")?.as_str()? == "function").then_some(())?;
        Some(f.get("name")?.as_str()?.to_owned())
    };
    let (tool_choice, forced_name) = match &req.tool_choice {
        None => ("auto", None),
        Some(Value::String(s)) if ["auto", "none", "required"].contains(&s.as_str()) => {
            (s.as_str(), None)
        }
        Some(v @ Value::Object(_)) => match named(v) {
            Some(n) => ("named", Some(n)),
            None => {
                return Err(bad(
                    "`tool_choice` must be auto, none, required or {\"type\": \"function\", \"function\": {\"name\": …}}",
                ));
            }
        },
        Some(v) => {
            return Err(bad(format!(
                "`tool_choice` {v} is not auto, none or required"
            )));
        }
    };
    let tools = req.tools.filter(|t| !t.is_empty() && tool_choice != "none");
    let forced = match tool_choice {
        "required" | "named" => {
            let (schema, calls) = crate::toolcall::forced_schema(
                tools.as_deref().unwrap_or_default(),
                forced_name.as_deref(),
                req.parallel_tool_calls.unwrap_or(true),
            )
            .map_err(bad)?;
            Some((crate::Grammar::JsonSchema(schema), calls))
        }
        _ => None,
    };
    let format = match &req.response_format {
        Some(v) => crate::Grammar::from_response_format(v).map_err(|e| bad(e.to_string()))?,
        None => None,
    };
    let rich = tools.is_some()
        || req
            .messages
            .iter()
            .any(|m| m.tool_calls.is_some() || m.tool_call_id.is_some() || m.role == "tool");
    let mut plain = Vec::with_capacity(req.messages.len());
    let mut full = Vec::with_capacity(req.messages.len());
    for m in req.messages {
        let content = match m.content {
            None => String::new(),
            Some(Content::Text(t)) => t,
            Some(Content::Parts(parts)) => {
                let mut s = String::new();
                for p in parts {
                    if p.kind != "text" {
                        return Err(bad(format!(
                            "content part of type `{}` is not supported",
                            p.kind
                        )));
                    }
                    s.push_str(p.text.as_deref().unwrap_or(""));
                }
                s
            }
        };
        let mut v = json!({"role": m.role, "content": content});
        if let Some(n) = &m.name {
            v["name"] = json!(n);
        }
        if let Some(c) = m.tool_calls {
            v["tool_calls"] = Value::Array(c);
        }
        if let Some(id) = m.tool_call_id {
            v["tool_call_id"] = json!(id);
        }
        full.push(v);
        plain.push(Message::new(m.role, content));
    }
    let (opts, n, stream, include_usage) = app.options(&req.common, Endpoint::Chat)?;
    // A forced call's grammar wins over `response_format`.
    let (grammar, calls) = match forced {
        Some((g, c)) => (Some(g), Some(c)),
        None => (
            format,
            tools.as_ref().and_then(|_| {
                app.batcher
                    .engine()
                    .chat_template()
                    .and_then(|t| crate::toolcall::Syntax::of_template(t.source()))
                    .map(crate::toolcall::Calls::Syntax)
            }),
        ),
    };
    // The grammar is compiled and the prompt rendered before anything runs: what fails is
    // refused with a 400.
    let spec = if rich {
        PromptSpec::Rich { full, plain, tools }
    } else {
        PromptSpec::Owned(OwnedPrompt::Chat(plain))
    };
    let prepared = prepare(&app, spec, grammar).await?;
    let rx = submit(&app, prepared, opts, n)?;
    let id = app.id("chatcmpl");
    let name = app.opts.model_name.clone();
    let created = now();
    if let Some(calls) = calls {
        return tool_reply(
            app.batcher.engine(),
            rx,
            n,
            calls,
            id,
            name,
            created,
            stream,
            include_usage,
        )
        .await;
    }
    let engine = app.batcher.engine().clone();
    if stream {
        let first = (0..n)
            .map(|i| json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": name,
                "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}))
            .collect();
        let chunk = move |i: usize, text: &str, finish: Option<&str>, lp: &[(Token, usize)]| {
            let delta = if finish.is_some() {
                json!({})
            } else {
                json!({"content": text})
            };
            let mut choice = json!({"index": i, "delta": delta, "finish_reason": finish});
            if let Some(l) = chat_logprobs(&engine, lp) {
                choice["logprobs"] = l;
            }
            json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": name, "choices": [choice]})
        };
        return Ok(sse(rx, n, chunk, first, include_usage).into_response());
    }
    let done = collect(rx, n).await?;
    let u = usage(done.iter().map(|d| &d.0));
    let choices = done.into_iter().enumerate().map(move |(i, (f, lp))| {
        let mut choice = json!({"index": i, "message": {"role": "assistant", "content": f.text}, "finish_reason": finish_str(f.finish)});
        if let Some(l) = chat_logprobs(&engine, &lp) {
            choice["logprobs"] = l;
        }
        choice.to_string()
    });
    Ok(json_stream(
        json!({"id": id, "object": "chat.completion", "created": created, "model": name}),
        "choices",
        choices,
        "usage",
        u,
    ))
}

/// A chat reply when the request gave tools: each choice, once finished, parsed for calls (in
/// the template's syntax, or the JSON a forced call's grammar wrote) — `message.tool_calls` (ids `call_…`, `function.arguments` a JSON
/// string) and `finish_reason: "tool_calls"` when it made any, plain content otherwise. A
/// stream carries the same as chunks (role, content, one `delta.tool_calls` per choice, the
/// finish), sent when the choice is complete: a call is not streamed half-written.
#[allow(clippy::too_many_arguments)]
async fn tool_reply(
    engine: &Engine,
    rx: mpsc::UnboundedReceiver<(usize, Event)>,
    n: usize,
    calls: crate::toolcall::Calls,
    id: String,
    name: String,
    created: u64,
    stream: bool,
    include_usage: bool,
) -> Result<Response, ApiError> {
    let (head_id, head_name) = (id.clone(), name.clone());
    let done = collect(rx, n).await?;
    let u = usage(done.iter().map(|d| &d.0));
    let engine = engine.clone();
    // Each choice is parsed and written when its turn comes, as a message and as its chunks.
    let parts = done.into_iter().enumerate().map(move |(i, (f, lp))| {
        let chunk = |choice: Value| {
            json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": name, "choices": [choice]})
                .to_string()
        };
        let parsed = calls.parse(&f.text);
        let calls: Vec<Value> = parsed
            .calls
            .iter()
            .enumerate()
            .map(|(k, c)| {
                json!({"id": format!("call_{id}_{i}_{k}"), "type": "function",
                "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect();
        let finish = if calls.is_empty() {
            finish_str(f.finish)
        } else {
            "tool_calls"
        };
        let content = if calls.is_empty() || !parsed.content.is_empty() {
            json!(parsed.content)
        } else {
            Value::Null
        };
        let mut message = json!({"role": "assistant", "content": content});
        if !calls.is_empty() {
            message["tool_calls"] = json!(calls);
        }
        let mut choice = json!({"index": i, "message": message, "finish_reason": finish});
        let logprobs = chat_logprobs(&engine, &lp);
        if let Some(l) = &logprobs {
            choice["logprobs"] = l.clone();
        }
        // The same as a stream.
        let mut chunks = vec![chunk(
            json!({"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}),
        )];
        if !parsed.content.is_empty() {
            let mut c =
                json!({"index": i, "delta": {"content": parsed.content}, "finish_reason": null});
            if let Some(l) = logprobs {
                c["logprobs"] = l;
            }
            chunks.push(chunk(c));
        }
        if !calls.is_empty() {
            let deltas: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(k, c)| {
                    let mut c = c.clone();
                    c["index"] = json!(k);
                    c
                })
                .collect();
            chunks.push(chunk(
                json!({"index": i, "delta": {"tool_calls": deltas}, "finish_reason": null}),
            ));
        }
        chunks.push(chunk(
            json!({"index": i, "delta": {}, "finish_reason": finish}),
        ));
        (choice.to_string(), chunks)
    });
    if !stream {
        return Ok(json_stream(
            json!({"id": head_id, "object": "chat.completion", "created": created, "model": head_name}),
            "choices",
            parts.map(|(choice, _)| choice),
            "usage",
            u,
        ));
    }
    let mut tail = Vec::new();
    if include_usage {
        tail.push(json!({"choices": [], "usage": u}).to_string());
    }
    tail.push("[DONE]".into());
    let events = futures_util::stream::iter(
        parts
            .flat_map(|(_, chunks)| chunks)
            .chain(tail)
            .map(|d| Ok::<_, Infallible>(SseEvent::default().data(d))),
    );
    Ok(Sse::new(events).into_response())
}

/// The text of one token id as a client sees it (lossy where the id ends mid-character).
fn token_text(engine: &Engine, id: u32) -> String {
    engine
        .tokenizer()
        .and_then(|t| t.decode(&[id]).ok())
        .unwrap_or_default()
}

/// Chat's `logprobs` object for some tokens (`None` when none carries log-probabilities):
/// `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}`.
fn chat_logprobs(engine: &Engine, tokens: &[(Token, usize)]) -> Option<Value> {
    let entry = |id: u32, lp: f32| {
        let t = token_text(engine, id);
        json!({"token": t, "logprob": lp, "bytes": t.as_bytes()})
    };
    let content: Vec<Value> = tokens
        .iter()
        .filter_map(|(t, _)| {
            let (id, l) = (t.id?, t.logprobs.as_ref()?);
            let mut e = entry(id, l.logprob);
            e["top_logprobs"] = l.top.iter().map(|&(i, p)| entry(i, p)).collect();
            Some(e)
        })
        .collect();
    (!content.is_empty()).then(|| json!({"content": content}))
}

/// The completions endpoint's `logprobs` object (`null` when no token carries any):
/// `tokens`, `token_logprobs`, `top_logprobs` (one map per token) and `text_offset` (each
/// token's byte offset in the completion, as given).
fn completion_logprobs(engine: &Engine, tokens: &[(Token, usize)]) -> Value {
    let with: Vec<(&Token, usize)> = tokens
        .iter()
        .filter(|(t, _)| t.id.is_some() && t.logprobs.is_some())
        .map(|(t, o)| (t, *o))
        .collect();
    if with.is_empty() {
        return Value::Null;
    }
    let ids = |t: &Token| t.id.unwrap_or_default();
    json!({
        "tokens": with.iter().map(|(t, _)| token_text(engine, ids(t))).collect::<Vec<_>>(),
        "token_logprobs": with.iter().map(|(t, _)| t.logprobs.as_ref().map(|l| l.logprob)).collect::<Vec<_>>(),
        "top_logprobs": with.iter().map(|(t, _)| {
            let m: serde_json::Map<String, Value> = t.logprobs.iter().flat_map(|l| l.top.iter())
                .map(|&(i, p)| (token_text(engine, i), json!(p))).collect();
            Value::Object(m)
        }).collect::<Vec<_>>(),
        "text_offset": with.iter().map(|(_, o)| *o).collect::<Vec<_>>(),
    })
}

/// Waits for the end of a request's `n` jobs; returns each with its tokens that carry
/// log-probabilities and the byte offset in the completion where each token's text starts.
async fn collect(
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

/// A request's events as server-sent events: `first` (a chunk per choice, if any), a chunk per
/// text delta of each choice, a final chunk per choice with its finish reason, optionally a
/// usage chunk once every choice is done, then `[DONE]`.
fn sse<F>(
    rx: mpsc::UnboundedReceiver<(usize, Event)>,
    n: usize,
    chunk: F,
    first: Vec<Value>,
    include_usage: bool,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>>
where
    F: Fn(usize, &str, Option<&str>, &[(Token, usize)]) -> Value + Send + 'static,
{
    struct St<F> {
        rx: mpsc::UnboundedReceiver<(usize, Event)>,
        chunk: F,
        include_usage: bool,
        queue: std::collections::VecDeque<String>,
        done: bool,
        offset: Vec<usize>,
        finished: Vec<Option<Finished>>,
    }
    let st = St {
        rx,
        chunk,
        include_usage,
        queue: first.into_iter().map(|v| v.to_string()).collect(),
        done: false,
        offset: vec![0; n],
        finished: (0..n).map(|_| None).collect(),
    };
    let stream = futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if let Some(d) = st.queue.pop_front() {
                return Some((Ok(SseEvent::default().data(d)), st));
            }
            if st.done {
                return None;
            }
            match st.rx.recv().await {
                Some((i, Event::Token(t))) => {
                    // A token with log-probabilities gets its chunk even without text, so a
                    // stream carries every token's entry.
                    if !t.text.is_empty() || t.logprobs.is_some() {
                        let text = t.text.clone();
                        let at = st.offset[i];
                        st.offset[i] += text.len();
                        let lp = [(t, at)];
                        let lp = if lp[0].0.logprobs.is_some() {
                            &lp[..]
                        } else {
                            &[]
                        };
                        st.queue
                            .push_back((st.chunk)(i, &text, None, lp).to_string());
                    }
                }
                Some((i, Event::Done(f))) => {
                    let last = (st.chunk)(i, "", Some(finish_str(f.finish)), &[]);
                    st.queue.push_back(last.to_string());
                    st.finished[i] = Some(*f);
                    if st.finished.iter().all(Option::is_some) {
                        if st.include_usage {
                            let u = usage(st.finished.iter().flatten());
                            st.queue
                                .push_back(json!({"choices": [], "usage": u}).to_string());
                        }
                        st.queue.push_back("[DONE]".into());
                        st.done = true;
                    }
                }
                Some((_, Event::Failed(e))) => {
                    st.queue.push_back(
                        json!({"error": {"message": e.to_string(), "type": "server_error"}})
                            .to_string(),
                    );
                    st.queue.push_back("[DONE]".into());
                    st.done = true;
                }
                None => return None,
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// The router, for embedding in another server. The engine must be planned for
/// `opts.batch_size` sequences ([`crate::EngineBuilder::sequences`]).
pub fn router(engine: Engine, opts: ServerOptions) -> Result<Router, Error> {
    let app = Arc::new(App {
        batcher: Batcher::new(engine, opts.batch_size)?,
        next_id: AtomicU64::new(1),
        opts: opts.clone(),
    });
    Ok(Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .with_state(app))
}

/// Serves until interrupted (Ctrl-C). Prints the address once listening.
pub fn serve(engine: Engine, opts: ServerOptions) -> Result<(), Error> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::Io {
            path: "tokio runtime".into(),
            source: e,
        })?;
    let name = opts.model_name.clone();
    let batch = opts.batch_size;
    let app = router(engine, opts.clone())?;
    rt.block_on(async move {
        let addr = opts.addr;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Listen { addr, source })?;
        let local = listener.local_addr().map_err(|e| Error::Io {
            path: "socket".into(),
            source: e,
        })?;
        eprintln!("sluice serving `{name}` on http://{local} (batch {batch}); Ctrl-C stops");
        // hyper directly rather than axum::serve, for a header read timeout (which needs a
        // timer) and a shutdown that does not wait for connections that never finish a request.
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(opts.read_timeout);
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut conns = tokio::task::JoinSet::new();
        let ctrl_c = tokio::signal::ctrl_c();
        tokio::pin!(ctrl_c);
        loop {
            tokio::select! {
                _ = &mut ctrl_c => break,
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                accepted = listener.accept() => {
                    let Ok((tcp, _)) = accepted else {
                        // Out of descriptors, say: back off rather than spin.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    let svc = hyper_util::service::TowerToHyperService::new(app.clone());
                    let conn = http.serve_connection(hyper_util::rt::TokioIo::new(tcp), svc);
                    let mut stop = stop_rx.clone();
                    conns.spawn(async move {
                        tokio::pin!(conn);
                        tokio::select! {
                            _ = conn.as_mut() => return,
                            _ = stop.changed() => conn.as_mut().graceful_shutdown(),
                        }
                        let _ = conn.await;
                    });
                }
            }
        }
        drop(listener);
        // Idle connections close at once; a request being answered gets SHUTDOWN_GRACE to
        // finish; anything still open then (a client that sent half a request) is dropped.
        let _ = stop_tx.send(true);
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, async {
            while conns.join_next().await.is_some() {}
        })
        .await;
        conns.abort_all();
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_type(status: StatusCode) -> String {
        let r = ApiError(status, "x".into()).into_response();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let b = rt
            .block_on(axum::body::to_bytes(r.into_body(), 1 << 20))
            .unwrap();
        let v: Value = serde_json::from_slice(&b).unwrap();
        v["error"]["type"].as_str().unwrap().to_owned()
    }

    /// Issue 18 class 7: 500s said `invalid_request_error`; the server's own failures are
    /// `server_error`.
    #[test]
    fn server_failures_are_server_errors() {
        assert_eq!(
            error_type(StatusCode::INTERNAL_SERVER_ERROR),
            "server_error"
        );
        assert_eq!(error_type(StatusCode::BAD_REQUEST), "invalid_request_error");
        assert_eq!(
            error_type(StatusCode::PAYLOAD_TOO_LARGE),
            "invalid_request_error"
        );
    }

    fn finished(text: &str) -> Finished {
        Finished {
            prompt_ids: vec![1, 2, 3],
            ids: vec![5, 6],
            text: text.into(),
            finish: FinishReason::Eos,
            stats: Default::default(),
        }
    }

    /// Runs `tool_reply` on one finished choice with `text`; the JSON answer and the stream's
    /// `data:` payloads.
    fn reply(text: &str) -> (Value, Vec<String>) {
        let engine = Engine::builder()
            .model(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo"))
            .build()
            .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let run = |stream: bool| {
            let (tx, rx) = mpsc::unbounded_channel();
            tx.send((0, Event::Done(Box::new(finished(text))))).unwrap();
            let r = rt
                .block_on(tool_reply(
                    &engine,
                    rx,
                    1,
                    crate::toolcall::Calls::Syntax(crate::toolcall::Syntax::Hermes),
                    "chatcmpl-1".into(),
                    "demo".into(),
                    0,
                    stream,
                    true,
                ))
                .unwrap_or_else(|e| panic!("{}", e.1));
            rt.block_on(axum::body::to_bytes(r.into_body(), 1 << 20))
                .unwrap()
        };
        let full: Value = serde_json::from_slice(&run(false)).unwrap();
        let body = String::from_utf8(run(true).to_vec()).unwrap();
        let events = body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_owned)
            .collect();
        (full, events)
    }

    #[test]
    fn a_reply_with_a_call_is_tool_calls_streamed_or_not() {
        let (v, ev) = reply(
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        );
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls");
        assert!(c["message"]["content"].is_null(), "{c}");
        let call = &c["message"]["tool_calls"][0];
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "get_weather");
        assert_eq!(call["function"]["arguments"], r#"{"city":"Paris"}"#);
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(v["usage"]["completion_tokens"], 2);
        // The stream: role, the calls, the finish, usage, [DONE].
        assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
        let chunks: Vec<Value> = ev[..ev.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        let deltas: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
            .flatten()
            .collect();
        assert_eq!(deltas.len(), 1);
        assert_eq!(deltas[0]["index"], 0);
        assert_eq!(deltas[0]["function"], call["function"]);
        assert!(
            chunks
                .iter()
                .any(|c| c["choices"][0]["finish_reason"] == "tool_calls")
        );
        assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 2);
    }

    #[test]
    fn a_malformed_call_is_plain_content() {
        let text = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {</tool_call>";
        let (v, ev) = reply(text);
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "stop");
        assert_eq!(c["message"]["content"], text);
        assert!(c["message"].get("tool_calls").is_none());
        let streamed: String = ev[..ev.len() - 1]
            .iter()
            .filter_map(|e| {
                serde_json::from_str::<Value>(e).ok()?["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect();
        assert_eq!(streamed, text);
    }
}
