//! OpenAI's chat completions and completions (`/v1/chat/completions`, `/v1/completions`) and
//! `/v1/models`, translated onto the request core.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::core::{
    self, ApiError, MAX_CHOICES, PromptSpec, Readback, Sampling, ToolChoice, Turn, Unfold, Usage,
    bad, collect, now, prepare, prepare_turn, submit, token_text,
};
use super::{App, parse, read_body};
use crate::Engine;
use crate::batch::{Event, Finished, OwnedPrompt};
use crate::generate::Token;
use crate::options::FinishReason;

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
pub(super) struct Common {
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
pub(super) struct ChatRequest {
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

/// What an OpenAI request asks beside its sampling.
struct Asked {
    sampling: Sampling,
    n: usize,
    stream: bool,
    include_usage: bool,
}

impl App {
    /// Checks the fields both endpoints share: the model's name, `n`, log-probabilities as the
    /// endpoint spells them, at most 4 stop strings.
    fn openai_sampling(&self, c: &Common, endpoint: Endpoint) -> Result<Asked, ApiError> {
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
        let _ = &c.user;
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
        Ok(Asked {
            sampling: Sampling {
                max_tokens: c.max_completion_tokens.or(c.max_tokens),
                temperature: c.temperature,
                top_p: c.top_p,
                top_k: c.top_k,
                min_p: c.min_p,
                repetition_penalty: c.repetition_penalty,
                presence_penalty: c.presence_penalty,
                frequency_penalty: c.frequency_penalty,
                seed: c.seed,
                stop,
                logprobs,
                penalty_last_n: None,
                up_to: false,
            },
            n,
            stream: c.stream.unwrap_or(false),
            include_usage,
        })
    }

    pub(super) fn id(&self, prefix: &str) -> String {
        let n = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{prefix}-{n}")
    }
}

fn finish_str(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Length => "length",
        FinishReason::Eos | FinishReason::Stop => "stop",
    }
}

/// OpenAI's `usage`: `prompt_tokens_details.cached_tokens` the prompt tokens every choice took
/// from the prefix cache; with drafting (`sluice serve --draft ngram`), the drafts made and
/// kept, once there were any.
fn usage_json(u: Usage) -> Value {
    let mut v = json!({
        "prompt_tokens": u.prompt,
        "completion_tokens": u.completion,
        "total_tokens": u.prompt + u.completion,
        "prompt_tokens_details": {"cached_tokens": u.cached},
    });
    if u.proposed > 0 {
        v["draft_proposed"] = json!(u.proposed);
        v["draft_accepted"] = json!(u.accepted);
    }
    v
}

fn usage<'a>(done: impl Iterator<Item = &'a Finished>) -> Value {
    usage_json(core::usage(done))
}

pub(super) async fn models(State(app): State<Arc<App>>) -> impl IntoResponse {
    axum::Json(
        json!({"object": "list", "data": [{"id": app.opts.model_name, "object": "model", "created": 0, "owned_by": "sluice"}]}),
    )
}

pub(super) async fn completions(
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
    let asked = app.openai_sampling(&req.common, Endpoint::Completions)?;
    let opts = app.options(&asked.sampling)?;
    let (n, stream, include_usage) = (asked.n, asked.stream, asked.include_usage);
    let prepared = prepare(&app, PromptSpec::Owned(prompt), None).await?;
    let rx = submit(&app, prepared, opts, n, false)?;
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
pub(super) fn json_stream<I>(
    head: Value,
    list: &str,
    items: I,
    tail_name: &str,
    tail: Value,
) -> Response
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

/// `tool_choice` as OpenAI writes it.
pub(super) fn tool_choice(v: Option<&Value>) -> Result<ToolChoice, ApiError> {
    let named = |v: &Value| -> Option<String> {
        let f = v.get("function")?;
        (v.get("type")?.as_str()? == "function").then_some(())?;
        Some(f.get("name")?.as_str()?.to_owned())
    };
    match v {
        None => Ok(ToolChoice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            _ => Err(bad(format!(
                "`tool_choice` \"{s}\" is not auto, none or required"
            ))),
        },
        Some(v @ Value::Object(_)) => named(v).map(ToolChoice::Named).ok_or_else(|| {
            bad(
                "`tool_choice` must be auto, none, required or {\"type\": \"function\", \"function\": {\"name\": …}}",
            )
        }),
        Some(v) => Err(bad(format!(
            "`tool_choice` {v} is not auto, none or required"
        ))),
    }
}

/// A chat request's turn (its messages in the core's shape, tools, how they may be used, the
/// response format) and its sampling fields.
pub(super) fn chat_turn(req: ChatRequest) -> Result<(Turn, Common), ApiError> {
    if req.messages.is_empty() {
        return Err(bad("`messages` is empty"));
    }
    let choice = tool_choice(req.tool_choice.as_ref())?;
    let format = match &req.response_format {
        Some(v) => crate::Grammar::from_response_format(v).map_err(|e| bad(e.to_string()))?,
        None => None,
    };
    let mut messages = Vec::with_capacity(req.messages.len());
    // The ids of the calls made so far: a tool message answers one of them.
    let mut called = std::collections::HashSet::new();
    for (i, m) in req.messages.into_iter().enumerate() {
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
            called.extend(
                c.iter()
                    .filter_map(|c| c.get("id").and_then(Value::as_str))
                    .map(str::to_owned),
            );
            v["tool_calls"] = Value::Array(c);
        }
        if let Some(id) = m.tool_call_id {
            if !called.contains(&id) {
                return Err(bad(format!(
                    "messages[{i}].tool_call_id `{id}` answers no earlier tool call"
                )));
            }
            v["tool_call_id"] = json!(id);
        }
        messages.push(v);
    }
    let turn = Turn {
        messages,
        tools: req.tools.unwrap_or_default(),
        choice,
        parallel: req.parallel_tool_calls.unwrap_or(true),
        format,
        thinking: None,
        continue_final: false,
    };
    Ok((turn, req.common))
}

pub(super) async fn chat_completions(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_body(&app, &headers, body).await?;
    let req: ChatRequest = parse(&body)?;
    let (turn, common) = chat_turn(req)?;
    let asked = app.openai_sampling(&common, Endpoint::Chat)?;
    let opts = app.options(&asked.sampling)?;
    let (n, stream, include_usage) = (asked.n, asked.stream, asked.include_usage);
    let (prepared, back) = prepare_turn(&app, turn).await?;
    let rx = submit(&app, prepared, opts, n, false)?;
    let id = app.id("chatcmpl");
    let name = app.opts.model_name.clone();
    let created = now();
    if back.calls.is_some() && stream && asked.sampling.logprobs.is_none() {
        let engine = app.batcher.engine().clone();
        return Ok(
            tool_stream(engine, rx, n, back, id, name, created, include_usage).into_response(),
        );
    }
    if back.calls.is_some() {
        return tool_reply(
            app.batcher.engine(),
            rx,
            n,
            back,
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

/// A chat choice of a request with tools, read back: the choice (its message — `content`,
/// `reasoning_content` when a thinking template's reasoning was split off, `tool_calls` with
/// ids `call_…` and `function.arguments` a JSON string — and `finish_reason`, `"tool_calls"`
/// when it made any), and the stream's deltas that end it, after what `sent` (a live stream's
/// [`Unfold`]) sent already; with no `sent`, the deltas from the role on.
fn tool_choice_reply(
    engine: &Engine,
    i: usize,
    f: &Finished,
    lp: &[(Token, usize)],
    back: &Readback,
    id: &str,
    sent: Option<&Unfold>,
) -> (Value, Vec<Value>) {
    let r = core::reply(engine, f, back, &[]);
    let calls: Vec<Value> = r
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
    let content = if calls.is_empty() || !r.content.is_empty() {
        json!(r.content)
    } else {
        Value::Null
    };
    let mut message = json!({"role": "assistant", "content": content});
    if let Some(t) = &r.reasoning {
        message["reasoning_content"] = json!(t);
    }
    if !calls.is_empty() {
        message["tool_calls"] = json!(calls);
    }
    let mut choice = json!({"index": i, "message": message, "finish_reason": finish});
    let logprobs = chat_logprobs(engine, lp);
    if let Some(l) = &logprobs {
        choice["logprobs"] = l.clone();
    }
    // The same as a stream's deltas.
    let mut deltas = Vec::new();
    if sent.is_none() {
        deltas.push(json!({"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}));
    }
    if let (Some(t), false) = (&r.reasoning, sent.is_some_and(Unfold::reasoning_sent)) {
        deltas.push(json!({"index": i, "delta": {"reasoning_content": t}, "finish_reason": null}));
    }
    let rest = sent.map_or(r.content.as_str(), |u| u.rest(&r));
    if !rest.is_empty() {
        let mut c = json!({"index": i, "delta": {"content": rest}, "finish_reason": null});
        if let Some(l) = logprobs {
            c["logprobs"] = l;
        }
        deltas.push(c);
    }
    if !calls.is_empty() {
        let calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(k, c)| {
                let mut c = c.clone();
                c["index"] = json!(k);
                c
            })
            .collect();
        deltas.push(json!({"index": i, "delta": {"tool_calls": calls}, "finish_reason": null}));
    }
    deltas.push(json!({"index": i, "delta": {}, "finish_reason": finish}));
    (choice, deltas)
}

/// A chat reply when the request gave tools, whole or as a stream sent when each choice is
/// complete (log-probabilities asked for, which go with the content whole): see
/// [`tool_choice_reply`]; a call is never streamed half-written.
#[allow(clippy::too_many_arguments)]
async fn tool_reply(
    engine: &Engine,
    rx: mpsc::UnboundedReceiver<(usize, Event)>,
    n: usize,
    back: Readback,
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
        let (choice, deltas) = tool_choice_reply(&engine, i, &f, &lp, &back, &id, None);
        let chunks: Vec<String> = deltas
            .into_iter()
            .map(|d| {
                json!({"id": id, "object": "chat.completion.chunk", "created": created,
                    "model": name, "choices": [d]})
                .to_string()
            })
            .collect();
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

/// A chat stream when the request gave tools (and no log-probabilities): each choice's text as
/// [`Unfold`] lets it go — reasoning (`delta.reasoning_content`) once closed, content as it
/// comes, what could begin a call held back — and its calls and finish when it ends.
#[allow(clippy::too_many_arguments)]
fn tool_stream(
    engine: Engine,
    rx: mpsc::UnboundedReceiver<(usize, Event)>,
    n: usize,
    back: Readback,
    id: String,
    name: String,
    created: u64,
    include_usage: bool,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    struct St {
        rx: mpsc::UnboundedReceiver<(usize, Event)>,
        queue: std::collections::VecDeque<Value>,
        unfold: Vec<Unfold>,
        finished: Vec<Option<Finished>>,
        done: bool,
    }
    let st = St {
        rx,
        queue: (0..n)
            .map(|i| json!({"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}))
            .collect(),
        unfold: (0..n).map(|_| Unfold::new(&back)).collect(),
        finished: (0..n).map(|_| None).collect(),
        done: false,
    };
    let stream = futures_util::stream::unfold(st, move |mut st| {
        let (engine, back, id, name) = (engine.clone(), back.clone(), id.clone(), name.clone());
        async move {
            loop {
                if let Some(d) = st.queue.pop_front() {
                    // A choice's delta is wrapped as a chunk; a usage chunk or [DONE] is as is.
                    let data = match d {
                        Value::String(s) => s,
                        d if d.get("usage").is_some() => d.to_string(),
                        d => {
                            json!({"id": id, "object": "chat.completion.chunk", "created": created,
                            "model": name, "choices": [d]})
                            .to_string()
                        }
                    };
                    return Some((Ok(SseEvent::default().data(data)), st));
                }
                if st.done {
                    return None;
                }
                match st.rx.recv().await {
                    Some((i, Event::Token(t))) => {
                        for part in st.unfold[i].push(&t.text) {
                            let delta = match part {
                                core::Part::Reasoning(r) => json!({"reasoning_content": r}),
                                core::Part::Text(t) => json!({"content": t}),
                            };
                            st.queue.push_back(
                                json!({"index": i, "delta": delta, "finish_reason": null}),
                            );
                        }
                    }
                    Some((i, Event::Done(f))) => {
                        let (_, deltas) =
                            tool_choice_reply(&engine, i, &f, &[], &back, &id, Some(&st.unfold[i]));
                        st.queue.extend(deltas);
                        st.finished[i] = Some(*f);
                        if st.finished.iter().all(Option::is_some) {
                            if include_usage {
                                let u = usage(st.finished.iter().flatten());
                                st.queue.push_back(json!({"choices": [], "usage": u}));
                            }
                            st.queue.push_back(json!("[DONE]"));
                            st.done = true;
                        }
                    }
                    Some((_, Event::Failed(e))) => {
                        st.queue.push_back(json!(
                            json!({"error": {"message": e.to_string(), "type": "server_error"}})
                                .to_string()
                        ));
                        st.queue.push_back(json!("[DONE]"));
                        st.done = true;
                    }
                    None => return None,
                }
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
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

#[cfg(test)]
mod tests;
