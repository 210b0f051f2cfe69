//! Ollama's API (`/api/chat`, `/api/generate`, `/api/tags`, `/api/show`, `/api/version`,
//! `/api/ps`), what Open WebUI, Continue and many editors speak, translated onto the request
//! core: `messages` (with `tool_calls`, `tool` messages) or `prompt` and `system` become a chat
//! turn, `options` the sampling, `format` the response format, `think` the template's thinking
//! switch; replies are NDJSON lines by default (`stream: false` for one object), with the
//! counts and nanosecond durations Ollama's clients read.
//!
//! Every model name is the served model (clients pick one from `/api/tags`, or are configured
//! with a name of their own); sampling starts from the model's defaults, as in every other
//! dialect, not from Ollama's.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::core::{
    self, ApiError, Dialect, Part, PromptSpec, Readback, Reply, Sampling, ToolChoice, Turn, Unfold,
    bad, collect, field, flag, number, prepare, prepare_turn, submit,
};
use super::{App, parse, read_ollama_body as read_body};
use crate::batch::{Event, Finished, OwnedPrompt};
use crate::options::FinishReason;

/// The Ollama version this API follows, as `/api/version` reports it (clients check it for
/// features such as tools and thinking).
pub(super) const OLLAMA_VERSION: &str = "0.12.0";

/// An RFC 3339 time, as Ollama writes `created_at`.
fn rfc3339(t: std::time::SystemTime) -> String {
    time::OffsetDateTime::from(t)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

fn created_at() -> String {
    rfc3339(std::time::SystemTime::now())
}

/// `options` mapped to sampling. Ollama's options for its own runner (`num_ctx`, `num_gpu`,
/// `num_thread`, `mirostat`, …) are accepted and have no effect; the ones sluice samples with
/// are checked.
fn options(v: &Value) -> Result<Sampling, ApiError> {
    let Some(o) = field(v, "options") else {
        return Ok(Sampling {
            up_to: true,
            ..Default::default()
        });
    };
    if !o.is_object() {
        return Err(bad("`options` must be an object"));
    }
    let int = |name: &str| -> Result<Option<i64>, ApiError> {
        match field(o, name) {
            None => Ok(None),
            Some(x) => x
                .as_i64()
                .map(Some)
                .ok_or_else(|| bad(format!("`options.{name}` must be an integer"))),
        }
    };
    let num = |name: &str| -> Result<Option<f32>, ApiError> {
        number(o, name).map_err(|_| bad(format!("`options.{name}` must be a number")))
    };
    // None, -1 ("no limit") and -2 ("fill the context"): as long as the server allows.
    let max_tokens = int("num_predict")?.and_then(|n| usize::try_from(n).ok().filter(|&n| n > 0));
    let top_k = match int("top_k")? {
        None => None,
        Some(k) => {
            Some(usize::try_from(k).map_err(|_| bad("`options.top_k` must not be negative"))?)
        }
    };
    let mut s = Sampling {
        max_tokens,
        temperature: num("temperature")?,
        top_p: num("top_p")?,
        top_k,
        min_p: num("min_p")?,
        repetition_penalty: num("repeat_penalty")?,
        presence_penalty: num("presence_penalty")?,
        frequency_penalty: num("frequency_penalty")?,
        // A negative seed is Ollama's "random": sluice's default stream.
        seed: int("seed")?.and_then(|s| u64::try_from(s).ok()),
        stop: stop_list(field(o, "stop"), "options.stop")?,
        up_to: true,
        ..Default::default()
    };
    match int("repeat_last_n")? {
        // Ollama's -1: the whole context; sluice's 0 means the same.
        None => {}
        Some(-1) => s.penalty_last_n = Some(0),
        // 0: no penalties at all.
        Some(0) => {
            s.repetition_penalty = Some(1.0);
            s.presence_penalty = Some(0.0);
            s.frequency_penalty = Some(0.0);
        }
        Some(n) => {
            s.penalty_last_n = Some(
                usize::try_from(n)
                    .map_err(|_| bad("`options.repeat_last_n` must be -1 or more"))?,
            );
        }
    }
    Ok(s)
}

fn stop_list(v: Option<&Value>, name: &str) -> Result<Vec<String>, ApiError> {
    match v {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| {
                s.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| bad(format!("`{name}` must be a list of strings")))
            })
            .collect(),
        Some(_) => Err(bad(format!("`{name}` must be a list of strings"))),
    }
}

/// `format`: `"json"`, a JSON schema, or nothing (`""`).
fn format(v: &Value) -> Result<Option<crate::Grammar>, ApiError> {
    match field(v, "format") {
        None => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(crate::Grammar::JsonObject)),
        Some(s @ Value::Object(_)) => Ok(Some(crate::Grammar::JsonSchema(s.clone()))),
        Some(_) => Err(bad("`format` must be \"json\" or a JSON schema object")),
    }
}

/// `think`: true or false, or an effort (`"low"`, `"medium"`, `"high"`), which means true.
fn think(v: &Value) -> Result<Option<bool>, ApiError> {
    match field(v, "think") {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(Value::String(s)) if matches!(s.as_str(), "low" | "medium" | "high") => Ok(Some(true)),
        Some(_) => Err(bad(
            "`think` must be true, false, \"low\", \"medium\" or \"high\"",
        )),
    }
}

/// What both endpoints check alike: `model` a string, no images, no log-probabilities (which
/// `/v1/chat/completions` gives), `keep_alive` anything (every model stays loaded).
fn common(v: &Value) -> Result<(), ApiError> {
    if !v.is_object() {
        return Err(bad("the request body must be a JSON object"));
    }
    if let Some(m) = field(v, "model")
        && !m.is_string()
    {
        return Err(bad("`model` must be a string"));
    }
    if field(v, "images")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
    {
        return Err(bad("`images`: sluice reads text only"));
    }
    if flag(v, "logprobs")? == Some(true) {
        return Err(bad(
            "`logprobs` is not served on the Ollama API; /v1/chat/completions gives them",
        ));
    }
    Ok(())
}

/// A `/api/chat` request translated: the turn (no turn: an empty `messages`, which only loads
/// the model), its sampling, and whether it streams.
pub(super) struct ChatParsed {
    pub turn: Option<Turn>,
    pub sampling: Sampling,
    pub stream: bool,
}

/// Translates a `/api/chat` request.
pub(super) fn parse_chat(v: &Value) -> Result<ChatParsed, ApiError> {
    common(v)?;
    let list = match field(v, "messages") {
        None => &Vec::new(),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(bad("`messages` must be a list")),
    };
    let mut messages = Vec::with_capacity(list.len());
    // Calls made and not yet answered, in order: a tool message answers the first of them
    // with its `tool_name` (or the first of all), and takes its id.
    let mut open: Vec<(String, String)> = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        if !m.is_object() {
            return Err(bad(format!("{at} must be an object")));
        }
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("{at}.role must be a string")))?;
        if !matches!(role, "system" | "user" | "assistant" | "tool") {
            return Err(bad(format!(
                "{at}.role `{role}` is not system, user, assistant or tool"
            )));
        }
        let content = match field(m, "content") {
            None => "",
            Some(c) => c
                .as_str()
                .ok_or_else(|| bad(format!("{at}.content must be a string")))?,
        };
        if field(m, "images")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
        {
            return Err(bad(format!("{at}.images: sluice reads text only")));
        }
        let mut out = json!({"role": role, "content": content});
        if let Some(calls) = field(m, "tool_calls") {
            if role != "assistant" {
                return Err(bad(format!(
                    "{at}.tool_calls: only an assistant makes calls"
                )));
            }
            let calls = calls
                .as_array()
                .ok_or_else(|| bad(format!("{at}.tool_calls must be a list")))?;
            let mut openai = Vec::with_capacity(calls.len());
            for (k, c) in calls.iter().enumerate() {
                let cat = format!("{at}.tool_calls[{k}].function");
                let f = c
                    .get("function")
                    .filter(|f| f.is_object())
                    .ok_or_else(|| bad(format!("{cat} must be an object")))?;
                let name = f
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{cat}.name must be a string")))?;
                // Ollama writes arguments as an object; a JSON text is taken too.
                let arguments = match f.get("arguments") {
                    None | Some(Value::Null) => "{}".to_owned(),
                    Some(a @ Value::Object(_)) => a.to_string(),
                    Some(Value::String(s)) => s.clone(),
                    Some(_) => return Err(bad(format!("{cat}.arguments must be an object"))),
                };
                let id = c
                    .get("id")
                    .and_then(Value::as_str)
                    .map_or_else(|| format!("call_{i}_{k}"), str::to_owned);
                open.push((id.clone(), name.to_owned()));
                openai.push(json!({"id": id, "type": "function",
                    "function": {"name": name, "arguments": arguments}}));
            }
            out["tool_calls"] = Value::Array(openai);
        }
        if role == "tool" {
            let name = m.get("tool_name").and_then(Value::as_str);
            let k = open
                .iter()
                .position(|(_, n)| name.is_none_or(|name| n == name))
                .ok_or_else(|| {
                    bad(match name {
                        Some(n) => format!(
                            "{at}: a tool message for `{n}`, which no earlier tool call made"
                        ),
                        None => format!("{at}: a tool message, but no earlier tool call"),
                    })
                })?;
            let (id, name) = open.remove(k);
            out["tool_call_id"] = json!(id);
            out["name"] = json!(name);
        }
        messages.push(out);
    }
    let tools = match field(v, "tools") {
        None => Vec::new(),
        Some(Value::Array(a)) => {
            for (i, t) in a.iter().enumerate() {
                if t.get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .is_none()
                {
                    return Err(bad(format!("tools[{i}].function.name must be a string")));
                }
            }
            a.clone()
        }
        Some(_) => return Err(bad("`tools` must be a list")),
    };
    let format = format(v)?;
    let thinking = think(v)?;
    let sampling = options(v)?;
    let stream = flag(v, "stream")?.unwrap_or(true);
    let turn = (!messages.is_empty()).then(|| Turn {
        messages,
        tools,
        choice: ToolChoice::Auto,
        parallel: true,
        format,
        thinking,
        continue_final: true,
    });
    Ok(ChatParsed {
        turn,
        sampling,
        stream,
    })
}

/// What `/api/generate` generates from.
pub(super) enum GenPrompt {
    /// `raw`: the prompt as it is, no template (and a response format).
    Raw(String, Option<crate::Grammar>),
    /// The prompt (and `system`) through the chat template.
    Turn(Turn),
}

/// A `/api/generate` request translated. `prompt: None` is an empty prompt: it only loads
/// the model.
pub(super) struct GenParsed {
    pub prompt: Option<GenPrompt>,
    /// Token ids a previous reply returned as its `context`, to continue from.
    pub context: Vec<u32>,
    pub sampling: Sampling,
    pub stream: bool,
}

/// Translates a `/api/generate` request.
pub(super) fn parse_generate(v: &Value) -> Result<GenParsed, ApiError> {
    common(v)?;
    let text = |name: &str| -> Result<Option<&str>, ApiError> {
        match field(v, name) {
            None => Ok(None),
            Some(x) => x
                .as_str()
                .map(Some)
                .ok_or_else(|| bad(format!("`{name}` must be a string"))),
        }
    };
    let prompt = text("prompt")?.unwrap_or_default();
    let system = text("system")?;
    if text("template")?.is_some_and(|t| !t.is_empty()) {
        return Err(bad(
            "`template`: sluice renders with the model's own chat template",
        ));
    }
    if text("suffix")?.is_some_and(|t| !t.is_empty()) {
        return Err(bad("`suffix` (fill in the middle) is not supported"));
    }
    let context = match field(v, "context") {
        None => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| bad("`context` must be a list of token ids"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad("`context` must be a list of token ids")),
    };
    let raw = flag(v, "raw")?.unwrap_or(false);
    let format = format(v)?;
    let thinking = think(v)?;
    let sampling = options(v)?;
    let stream = flag(v, "stream")?.unwrap_or(true);
    let prompt = if prompt.is_empty() {
        None
    } else if raw {
        Some(GenPrompt::Raw(prompt.to_owned(), format))
    } else {
        let mut messages = Vec::new();
        if let Some(s) = system.filter(|s| !s.is_empty()) {
            messages.push(json!({"role": "system", "content": s}));
        }
        messages.push(json!({"role": "user", "content": prompt}));
        Some(GenPrompt::Turn(Turn {
            messages,
            tools: Vec::new(),
            choice: ToolChoice::Auto,
            parallel: true,
            format,
            thinking,
            continue_final: false,
        }))
    };
    Ok(GenParsed {
        prompt,
        context,
        sampling,
        stream,
    })
}

/// The counts and nanosecond durations of a finished reply.
fn figures(f: &Finished, started: Instant) -> Value {
    let ns = |s: f64| (s * 1e9) as u64;
    json!({
        "total_duration": started.elapsed().as_nanos() as u64,
        "load_duration": 0,
        "prompt_eval_count": f.prompt_ids.len(),
        "prompt_eval_duration": ns(f.stats.prefill_seconds),
        "eval_count": f.ids.len(),
        "eval_duration": ns(f.stats.decode_seconds),
    })
}

fn done_reason(f: &Finished) -> &'static str {
    match f.finish {
        FinishReason::Length => "length",
        FinishReason::Eos | FinishReason::Stop => "stop",
    }
}

/// Ollama's calls: arguments as an object.
fn calls_json(r: &Reply) -> Vec<Value> {
    r.calls
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let arguments: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
            json!({"function": {"index": k, "name": c.name, "arguments": arguments}})
        })
        .collect()
}

/// Which endpoint a reply is for: chat writes `message`, generate `response`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Generate,
}

/// The part of a reply object that carries its text (and thinking, and calls).
fn payload(kind: Kind, content: &str, reasoning: Option<&str>, calls: Vec<Value>) -> Value {
    match kind {
        Kind::Chat => {
            let mut m = json!({"role": "assistant", "content": content});
            if let Some(t) = reasoning {
                m["thinking"] = json!(t);
            }
            if !calls.is_empty() {
                m["tool_calls"] = Value::Array(calls);
            }
            json!({"message": m})
        }
        Kind::Generate => {
            let mut g = json!({"response": content});
            if let Some(t) = reasoning {
                g["thinking"] = json!(t);
            }
            g
        }
    }
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(a), Value::Object(b)) = (into.as_object_mut(), from) {
        a.extend(b);
    }
}

/// A reply's last object: `done`, why, the counts and durations (and for generate, the
/// `context` to continue from).
fn last(kind: Kind, model: &str, f: &Finished, started: Instant) -> Value {
    let mut v = json!({"model": model, "created_at": created_at(), "done": true,
        "done_reason": done_reason(f)});
    merge(&mut v, figures(f, started));
    if kind == Kind::Generate {
        // The prompt's ids (a given `context` is their start) and the reply's.
        let mut ids = f.prompt_ids.clone();
        ids.extend_from_slice(&f.ids);
        v["context"] = json!(ids);
    }
    v
}

/// The reply to an empty request, which Ollama answers by loading the model.
fn loaded(kind: Kind, model: &str) -> Response {
    let mut v = json!({"model": model, "created_at": created_at(), "done": true,
        "done_reason": "load"});
    merge(&mut v, payload(kind, "", None, Vec::new()));
    axum::Json(v).into_response()
}

/// Lines of NDJSON as a response body.
fn ndjson(
    lines: impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
) -> Response {
    let mut r = Response::new(Body::from_stream(lines));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/x-ndjson"),
    );
    r
}

/// A reply: one object (`stream: false`), or NDJSON lines as [`Unfold`] lets them go (the
/// thinking once closed, the text as it comes, the calls in one line at the end), then the
/// last object.
async fn reply(
    app: &App,
    kind: Kind,
    rx: mpsc::UnboundedReceiver<(usize, Event)>,
    back: Readback,
    stops: Vec<String>,
    stream: bool,
    started: Instant,
) -> Result<Response, ApiError> {
    let model = app.opts.model_name.clone();
    let engine = app.batcher.engine().clone();
    if !stream {
        let done = collect(rx, 1).await?;
        let f = &done[0].0;
        let r = core::reply(&engine, f, &back, &stops);
        let mut v = last(kind, &model, f, started);
        merge(
            &mut v,
            payload(kind, &r.content, r.reasoning.as_deref(), calls_json(&r)),
        );
        return Ok(axum::Json(v).into_response());
    }
    struct St {
        rx: mpsc::UnboundedReceiver<(usize, Event)>,
        queue: std::collections::VecDeque<Value>,
        unfold: Unfold,
        done: bool,
    }
    let st = St {
        rx,
        queue: Default::default(),
        unfold: Unfold::new(&back),
        done: false,
    };
    let lines = futures_util::stream::unfold(st, move |mut st| {
        let (back, stops, model, engine) =
            (back.clone(), stops.clone(), model.clone(), engine.clone());
        async move {
            loop {
                if let Some(v) = st.queue.pop_front() {
                    let mut line = v.to_string();
                    line.push('\n');
                    return Some((Ok(Bytes::from(line)), st));
                }
                if st.done {
                    return None;
                }
                let part = |content: &str, reasoning: Option<&str>, calls: Vec<Value>| {
                    let mut v = json!({"model": model, "created_at": created_at(), "done": false});
                    merge(&mut v, payload(kind, content, reasoning, calls));
                    v
                };
                match st.rx.recv().await {
                    Some((_, Event::Token(t))) => {
                        for p in st.unfold.push(&t.text) {
                            let line = match &p {
                                Part::Reasoning(r) => part("", Some(r), Vec::new()),
                                Part::Text(t) => part(t, None, Vec::new()),
                            };
                            st.queue.push_back(line);
                        }
                    }
                    Some((_, Event::Done(f))) => {
                        let r = core::reply(&engine, &f, &back, &stops);
                        let reasoning = r
                            .reasoning
                            .as_deref()
                            .filter(|_| !st.unfold.reasoning_sent());
                        let rest = st.unfold.rest(&r);
                        if !rest.is_empty() || reasoning.is_some() || !r.calls.is_empty() {
                            st.queue.push_back(part(rest, reasoning, calls_json(&r)));
                        }
                        let mut end = last(kind, &model, &f, started);
                        merge(&mut end, payload(kind, "", None, Vec::new()));
                        st.queue.push_back(end);
                        st.done = true;
                    }
                    Some((_, Event::Failed(e))) => {
                        st.queue.push_back(json!({"error": e.to_string()}));
                        st.done = true;
                    }
                    None => return None,
                }
            }
        }
    });
    Ok(ndjson(lines))
}

pub(super) async fn chat(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let started = Instant::now();
    let r = async {
        let body = read_body(&app, &headers, body).await?;
        let v: Value = parse(&body)?;
        let p = parse_chat(&v)?;
        let opts = app.options(&p.sampling)?;
        let Some(turn) = p.turn else {
            return Ok(loaded(Kind::Chat, &app.opts.model_name));
        };
        let stops = opts.stop.clone();
        let (prepared, back) = prepare_turn(&app, turn).await?;
        let rx = submit(&app, prepared, opts, 1, true)?;
        reply(&app, Kind::Chat, rx, back, stops, p.stream, started).await
    }
    .await;
    r.unwrap_or_else(|e| e.into_dialect(Dialect::Ollama))
}

pub(super) async fn generate(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let r = async {
        let body = read_body(&app, &headers, body).await?;
        let v: Value = parse(&body)?;
        let p = parse_generate(&v)?;
        let opts = app.options(&p.sampling)?;
        let stops = opts.stop.clone();
        let (mut prepared, back) = match p.prompt {
            None => return Ok(loaded(Kind::Generate, &app.opts.model_name)),
            Some(GenPrompt::Raw(text, format)) => {
                let back = Readback::default();
                let prompt = PromptSpec::Owned(OwnedPrompt::Text(text));
                (prepare(&app, prompt, format).await?, back)
            }
            Some(GenPrompt::Turn(turn)) => prepare_turn(&app, turn).await?,
        };
        if !p.context.is_empty() {
            // The new turn goes on after the earlier reply: its ids, without the
            // beginning-of-sequence token a fresh prompt starts with.
            let engine = app.batcher.engine();
            let bos = engine.model().config().bos_token_id;
            let skip = usize::from(bos.is_some() && prepared.ids.first().copied() == bos);
            let mut ids = p.context.clone();
            ids.extend_from_slice(&prepared.ids[skip..]);
            let vocab = engine.model().config().vocab;
            if let Some(bad_id) = p.context.iter().find(|&&id| id as usize >= vocab) {
                return Err(bad(format!(
                    "`context` has token id {bad_id}, beyond this model's vocabulary of {vocab}"
                )));
            }
            prepared.ids = ids;
            prepared.cache_prefix = None;
        }
        let rx = submit(&app, prepared, opts, 1, true)?;
        reply(&app, Kind::Generate, rx, back, stops, p.stream, started).await
    }
    .await;
    r.unwrap_or_else(|e| e.into_dialect(Dialect::Ollama))
}

/// What Ollama's clients read of a model: its format, family and size.
fn details(app: &App) -> Value {
    let engine = app.batcher.engine();
    let cfg = engine.model().config();
    let gguf = engine
        .dir()
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    json!({
        "parent_model": "",
        "format": if gguf { "gguf" } else { "safetensors" },
        "family": cfg.model_type,
        "families": [cfg.model_type],
        "parameter_size": "",
        "quantization_level": "",
    })
}

/// The model's bytes on disk (its weights).
fn size(app: &App) -> u64 {
    let layout = app.batcher.engine().model().layout();
    layout.trunk_bytes() + layout.expert_bytes()
}

/// A stand-in digest: the model's name and size hashed (clients show it; sluice keeps none).
fn digest(app: &App) -> String {
    let h =
        xxhash_rust::xxh3::xxh3_128(format!("{}:{}", app.opts.model_name, size(app)).as_bytes());
    format!("{h:032x}")
}

fn modified_at(app: &App) -> String {
    std::fs::metadata(app.batcher.engine().dir())
        .and_then(|m| m.modified())
        .map(rfc3339)
        .unwrap_or_else(|_| rfc3339(std::time::UNIX_EPOCH))
}

pub(super) async fn tags(State(app): State<Arc<App>>) -> Response {
    let name = &app.opts.model_name;
    axum::Json(json!({"models": [{
        "name": name, "model": name, "modified_at": modified_at(&app), "size": size(&app),
        "digest": digest(&app), "details": details(&app),
    }]}))
    .into_response()
}

pub(super) async fn ps(State(app): State<Arc<App>>) -> Response {
    let name = &app.opts.model_name;
    let engine = app.batcher.engine();
    axum::Json(json!({"models": [{
        "name": name, "model": name, "size": size(&app), "digest": digest(&app),
        "details": details(&app), "expires_at": "9999-12-31T23:59:59Z", "size_vram": 0,
        "context_length": engine.model().max_positions(),
    }]}))
    .into_response()
}

pub(super) async fn version() -> Response {
    axum::Json(json!({"version": OLLAMA_VERSION})).into_response()
}

pub(super) async fn show(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let r = async {
        let body = read_body(&app, &headers, body).await?;
        let v: Value = parse(&body)?;
        if !v.is_object() {
            return Err(bad("the request body must be a JSON object"));
        }
        match field(&v, "model").or_else(|| field(&v, "name")) {
            Some(Value::String(_)) => {}
            Some(_) => return Err(bad("`model` must be a string")),
            None => return Err(bad("`model` is missing")),
        }
        let engine = app.batcher.engine();
        let cfg = engine.model().config();
        let template = engine
            .chat_template()
            .map(|t| t.source().to_owned())
            .unwrap_or_default();
        let mut capabilities = vec!["completion"];
        if crate::toolcall::Syntax::of_template(&template).is_some() {
            capabilities.push("tools");
        }
        if template.contains("</think>") {
            capabilities.push("thinking");
        }
        let arch = &cfg.model_type;
        let mut info = serde_json::Map::new();
        info.insert("general.architecture".into(), json!(arch));
        info.insert(
            format!("{arch}.context_length"),
            json!(engine.model().max_positions()),
        );
        info.insert(format!("{arch}.embedding_length"), json!(cfg.hidden));
        info.insert(format!("{arch}.block_count"), json!(cfg.layers));
        info.insert(format!("{arch}.vocab_size"), json!(cfg.vocab));
        if cfg.moe.experts > 0 {
            info.insert(format!("{arch}.expert_count"), json!(cfg.moe.experts));
            info.insert(format!("{arch}.expert_used_count"), json!(cfg.moe.top_k));
        }
        let s = engine.default_sampling();
        let parameters = format!(
            "temperature {}\ntop_k {}\ntop_p {}",
            s.temperature, s.top_k, s.top_p
        );
        Ok(axum::Json(json!({
            "modelfile": format!("# served by sluice\nFROM {}\n", engine.dir().display()),
            "parameters": parameters,
            "template": template,
            "details": details(&app),
            "model_info": info,
            "capabilities": capabilities,
            "modified_at": modified_at(&app),
        }))
        .into_response())
    }
    .await;
    r.unwrap_or_else(|e: ApiError| e.into_dialect(Dialect::Ollama))
}

#[cfg(test)]
mod tests;
