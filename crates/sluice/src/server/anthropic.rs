//! Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`), what Claude Code
//! and the `anthropic` SDKs speak, translated onto the request core: `system` and the
//! messages' blocks become a chat turn (`tool_use` an assistant's calls, `tool_result` tool
//! messages), `tools` OpenAI function tools, `tool_choice` the core's, `thinking` the
//! template's thinking switch; the reply's content, reasoning and calls become `text`,
//! `thinking` and `tool_use` blocks.

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::core::{
    self, ApiError, Dialect, Part, Readback, Reply, Sampling, ToolChoice, Turn, Unfold, bad,
    collect, field, flag, number, positive, prepare_turn, submit,
};
use super::{App, parse, read_body};
use crate::batch::Event;
use crate::options::FinishReason;

/// A Messages request translated: the turn, its sampling, and whether it streams.
pub(super) struct Parsed {
    pub turn: Turn,
    pub sampling: Sampling,
    pub stream: bool,
    /// Tools skipped (Anthropic's server tools), for the note on stderr.
    pub skipped: Vec<String>,
}

/// A field's text (a string, or text blocks joined), naming the field when it is neither.
fn text_of(v: &Value, what: &str) -> Result<String, ApiError> {
    core::text_parts(v, what, &["text"], &[], "block")
}

/// Translates a Messages request (`count`: for `count_tokens`, where `max_tokens` is not
/// needed).
pub(super) fn parse_request(v: &Value, count: bool) -> Result<Parsed, ApiError> {
    if !v.is_object() {
        return Err(bad("the request body must be a JSON object"));
    }
    if let Some(m) = field(v, "model")
        && !m.is_string()
    {
        return Err(bad("`model` must be a string"));
    }
    let max_tokens = match positive(v, "max_tokens")? {
        None if !count => return Err(bad("`max_tokens` is missing")),
        m => m,
    };
    let mut messages = Vec::new();
    if let Some(s) = field(v, "system") {
        messages.push(json!({"role": "system", "content": text_of(s, "system")?}));
    }
    let list = field(v, "messages")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("`messages` must be a list"))?;
    if list.is_empty() {
        return Err(bad("`messages` is empty"));
    }
    // Ids of the calls made so far: a tool_result must answer one of them.
    let mut called: HashSet<String> = HashSet::new();
    for (i, m) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        let role = m
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("{at}.role must be a string")))?;
        if role != "user" && role != "assistant" {
            return Err(bad(format!(
                "{at}.role `{role}` is not user or assistant (the system prompt goes in `system`)"
            )));
        }
        let content = m
            .get("content")
            .ok_or_else(|| bad(format!("{at}.content is missing")))?;
        let blocks: Vec<Value> = match content {
            Value::String(s) => vec![json!({"type": "text", "text": s})],
            Value::Array(b) => b.clone(),
            _ => {
                return Err(bad(format!(
                    "{at}.content must be a string or a list of blocks"
                )));
            }
        };
        let mut text = String::new();
        let mut calls = Vec::new();
        for (j, b) in blocks.iter().enumerate() {
            let bat = format!("{at}.content[{j}]");
            let kind = b
                .get("type")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("{bat}.type is missing")))?;
            match (kind, role) {
                ("text", _) => text.push_str(
                    b.get("text")
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad(format!("{bat}.text must be a string")))?,
                ),
                ("tool_use", "assistant") => {
                    let id = b
                        .get("id")
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad(format!("{bat}.id must be a string")))?;
                    let name = b
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad(format!("{bat}.name must be a string")))?;
                    let input = b
                        .get("input")
                        .filter(|x| x.is_object())
                        .ok_or_else(|| bad(format!("{bat}.input must be an object")))?;
                    called.insert(id.to_owned());
                    calls.push(json!({"id": id, "type": "function",
                        "function": {"name": name, "arguments": input.to_string()}}));
                }
                ("tool_result", "user") => {
                    let id = b
                        .get("tool_use_id")
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad(format!("{bat}.tool_use_id must be a string")))?;
                    if !called.contains(id) {
                        return Err(bad(format!(
                            "{bat}: a tool_result for `{id}`, which no earlier tool_use made"
                        )));
                    }
                    let out = match b.get("content") {
                        None | Some(Value::Null) => String::new(),
                        Some(c) => text_of(c, &format!("{bat}.content"))?,
                    };
                    // A tool's answer is a tool message, in order, before the user's text.
                    messages.push(json!({"role": "tool", "tool_call_id": id, "content": out}));
                }
                ("thinking" | "redacted_thinking", "assistant") => {}
                ("image" | "document", _) => {
                    return Err(bad(format!(
                        "{bat}: `{kind}` blocks are not supported (sluice reads text only)"
                    )));
                }
                (k, r) => {
                    return Err(bad(format!(
                        "{bat}: a `{k}` block is not supported in a {r} message"
                    )));
                }
            }
        }
        if role == "assistant" {
            let mut a = json!({"role": "assistant", "content": text});
            if !calls.is_empty() {
                a["tool_calls"] = Value::Array(calls);
            }
            messages.push(a);
        } else if !text.is_empty() || !blocks.iter().any(|b| b["type"] == "tool_result") {
            messages.push(json!({"role": "user", "content": text}));
        }
    }
    let mut tools = Vec::new();
    let mut skipped = Vec::new();
    if let Some(t) = field(v, "tools") {
        let list = t.as_array().ok_or_else(|| bad("`tools` must be a list"))?;
        for (i, t) in list.iter().enumerate() {
            let name = t
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad(format!("tools[{i}].name must be a string")))?;
            // Anthropic's own tools (`web_search_…`, `bash_…`, `text_editor_…`) run on its
            // servers: skipped, with a note, as the Responses API skips OpenAI's.
            match t.get("type").and_then(Value::as_str) {
                None | Some("custom") => {}
                Some(kind) => {
                    skipped.push(format!("tool `{name}` of type `{kind}`"));
                    continue;
                }
            }
            let schema = t
                .get("input_schema")
                .filter(|s| s.is_object())
                .ok_or_else(|| bad(format!("tools[{i}].input_schema must be an object")))?;
            let mut f = json!({"name": name, "parameters": schema});
            if let Some(d) = t.get("description").and_then(Value::as_str) {
                f["description"] = json!(d);
            }
            tools.push(json!({"type": "function", "function": f}));
        }
    }
    let (choice, parallel) = match field(v, "tool_choice") {
        None => (ToolChoice::Auto, true),
        Some(c) => {
            let parallel = !c
                .get("disable_parallel_tool_use")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let choice = match c.get("type").and_then(Value::as_str) {
                Some("auto") => ToolChoice::Auto,
                Some("any") => ToolChoice::Required,
                Some("none") => ToolChoice::None,
                Some("tool") => {
                    let name = c
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad("`tool_choice.name` must be a string"))?;
                    if !tools.iter().any(|t| t["function"]["name"] == name) {
                        return Err(bad(format!(
                            "`tool_choice` names `{name}`, which is not in `tools`"
                        )));
                    }
                    ToolChoice::Named(name.to_owned())
                }
                _ => {
                    return Err(bad("`tool_choice.type` must be auto, any, tool or none"));
                }
            };
            (choice, parallel)
        }
    };
    // Every way of asking for thinking turns a thinking template's switch on.
    let thinking = match field(v, "thinking") {
        None => None,
        Some(t) => match t.get("type").and_then(Value::as_str) {
            Some("enabled" | "adaptive" | "between_tools") => Some(true),
            Some("disabled") => Some(false),
            _ => {
                return Err(bad(
                    "`thinking.type` must be enabled, adaptive, between_tools or disabled",
                ));
            }
        },
    };
    // Structured output: `output_config.format` is a JSON schema the text follows.
    let format = match field(v, "output_config") {
        None => None,
        Some(c) if !c.is_object() => return Err(bad("`output_config` must be an object")),
        Some(c) => match field(c, "format") {
            None => None,
            Some(f) => {
                if f.get("type").and_then(Value::as_str) != Some("json_schema") {
                    return Err(bad("`output_config.format.type` must be json_schema"));
                }
                let schema = f
                    .get("schema")
                    .filter(|s| s.is_object())
                    .ok_or_else(|| bad("`output_config.format.schema` must be an object"))?;
                Some(crate::Grammar::JsonSchema(schema.clone()))
            }
        },
    };
    let stop = match field(v, "stop_sequences") {
        None => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| {
                s.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| bad("`stop_sequences` must be a list of strings"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad("`stop_sequences` must be a list of strings")),
    };
    let top_k = match field(v, "top_k") {
        None => None,
        Some(k) => Some(
            k.as_u64()
                .ok_or_else(|| bad("`top_k` must be a non-negative integer"))? as usize,
        ),
    };
    if let Some(m) = field(v, "metadata")
        && !m.is_object()
    {
        return Err(bad("`metadata` must be an object"));
    }
    let stream = flag(v, "stream")?.unwrap_or(false);
    Ok(Parsed {
        turn: Turn {
            messages,
            tools,
            choice,
            parallel,
            format,
            thinking,
            continue_final: true,
        },
        sampling: Sampling {
            max_tokens,
            temperature: number(v, "temperature")?,
            top_p: number(v, "top_p")?,
            top_k,
            stop,
            up_to: true,
            ..Default::default()
        },
        stream,
        skipped,
    })
}

fn stop_reason(r: &Reply) -> &'static str {
    if !r.calls.is_empty() {
        return "tool_use";
    }
    match r.finish {
        FinishReason::Length => "max_tokens",
        FinishReason::Stop => "stop_sequence",
        FinishReason::Eos => "end_turn",
    }
}

/// The reply's content blocks: its thinking, its text, its calls (each `tool_use` with an id
/// of its own and its input as an object).
fn blocks(r: &Reply, id: &str) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(t) = &r.reasoning {
        out.push(json!({"type": "thinking", "thinking": t, "signature": ""}));
    }
    if !r.content.is_empty() || r.calls.is_empty() {
        out.push(json!({"type": "text", "text": r.content}));
    }
    for (k, c) in r.calls.iter().enumerate() {
        let input: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
        out.push(json!({"type": "tool_use", "id": format!("toolu_{id}_{k}"), "name": c.name, "input": input}));
    }
    out
}

pub(super) async fn messages(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match messages_inner(&app, &headers, body).await {
        Ok(r) => r,
        Err(e) => e.into_dialect(Dialect::Anthropic),
    }
}

async fn messages_inner(
    app: &Arc<App>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_body(app, headers, body).await?;
    let v: Value = parse(&body)?;
    let p = parse_request(&v, false)?;
    if !p.skipped.is_empty() {
        eprintln!(
            "note: /v1/messages: skipped {} (only custom tools are run)",
            p.skipped.join(", ")
        );
    }
    let opts = app.options(&p.sampling)?;
    let stops = opts.stop.clone();
    let (prepared, back) = prepare_turn(app, p.turn).await?;
    let prompt_len = prepared.ids.len();
    let rx = submit(app, prepared, opts, 1, true)?;
    let id = app.id("msg").replace('-', "_");
    let model = app.opts.model_name.clone();
    let engine = app.batcher.engine().clone();
    if p.stream {
        return Ok(stream(rx, back, stops, id, model, engine, prompt_len).into_response());
    }
    let done = collect(rx, 1).await?;
    let (f, _) = &done[0];
    let r = core::reply(&engine, f, &back, &stops);
    let cached = f.stats.cached_tokens;
    Ok(axum::Json(json!({
        "id": id, "type": "message", "role": "assistant", "model": model,
        "content": blocks(&r, &id),
        "stop_reason": stop_reason(&r),
        "stop_sequence": r.stop,
        "usage": {
            "input_tokens": f.prompt_ids.len().saturating_sub(cached),
            "output_tokens": f.ids.len(),
            "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0,
        },
    }))
    .into_response())
}

/// An event of a Messages stream: its type as the SSE event name, and the data.
fn event(data: Value) -> SseEvent {
    let name = data["type"].as_str().unwrap_or("message").to_owned();
    SseEvent::default().event(name).data(data.to_string())
}

/// The Messages stream: `message_start`, `ping`, the content blocks as [`Unfold`] lets them
/// go (thinking whole once closed, text as it comes, calls whole at the end), `message_delta`
/// with the stop reason and usage, `message_stop`.
fn stream(
    rx: mpsc::UnboundedReceiver<(usize, Event)>,
    back: Readback,
    stops: Vec<String>,
    id: String,
    model: String,
    engine: crate::Engine,
    prompt_len: usize,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    struct St {
        rx: mpsc::UnboundedReceiver<(usize, Event)>,
        queue: std::collections::VecDeque<SseEvent>,
        unfold: Unfold,
        /// The next block's index.
        next: usize,
        /// The text block's index, while it is open.
        text: Option<usize>,
        done: bool,
    }
    impl St {
        /// A whole block: its start, one delta, its stop.
        fn block(&mut self, start: Value, delta: Value) {
            let i = self.next;
            self.next += 1;
            self.queue.push_back(event(
                json!({"type": "content_block_start", "index": i, "content_block": start}),
            ));
            self.queue.push_back(event(
                json!({"type": "content_block_delta", "index": i, "delta": delta}),
            ));
            self.queue
                .push_back(event(json!({"type": "content_block_stop", "index": i})));
        }
        fn thinking(&mut self, t: &str) {
            self.block(
                json!({"type": "thinking", "thinking": "", "signature": ""}),
                json!({"type": "thinking_delta", "thinking": t}),
            );
        }
        fn text(&mut self, t: &str) {
            let i = match self.text {
                Some(i) => i,
                None => {
                    let i = self.next;
                    self.next += 1;
                    self.text = Some(i);
                    self.queue
                        .push_back(event(json!({"type": "content_block_start",
                        "index": i, "content_block": {"type": "text", "text": ""}})));
                    i
                }
            };
            if !t.is_empty() {
                self.queue
                    .push_back(event(json!({"type": "content_block_delta",
                    "index": i, "delta": {"type": "text_delta", "text": t}})));
            }
        }
        fn close_text(&mut self) {
            if let Some(i) = self.text.take() {
                self.queue
                    .push_back(event(json!({"type": "content_block_stop", "index": i})));
            }
        }
    }
    let mut queue = std::collections::VecDeque::new();
    queue.push_back(event(json!({"type": "message_start", "message": {
        "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": prompt_len, "output_tokens": 0}}})));
    queue.push_back(event(json!({"type": "ping"})));
    let st = St {
        rx,
        queue,
        unfold: Unfold::new(&back),
        next: 0,
        text: None,
        done: false,
    };
    let stream = futures_util::stream::unfold(st, move |mut st| {
        let (back, stops, id, engine) = (back.clone(), stops.clone(), id.clone(), engine.clone());
        async move {
            loop {
                if let Some(e) = st.queue.pop_front() {
                    return Some((Ok(e), st));
                }
                if st.done {
                    return None;
                }
                match st.rx.recv().await {
                    Some((_, Event::Token(t))) => {
                        for part in st.unfold.push(&t.text) {
                            match part {
                                Part::Reasoning(r) => st.thinking(&r),
                                Part::Text(t) => st.text(&t),
                            }
                        }
                    }
                    Some((_, Event::Done(f))) => {
                        let r = core::reply(&engine, &f, &back, &stops);
                        if let (Some(t), false) = (&r.reasoning, st.unfold.reasoning_sent()) {
                            st.thinking(t);
                        }
                        let rest = st.unfold.rest(&r).to_owned();
                        // A text block when the reply has text, or nothing else.
                        if !rest.is_empty() || (r.calls.is_empty() && st.text.is_none()) {
                            st.text(&rest);
                        }
                        st.close_text();
                        for b in blocks(&r, &id)
                            .into_iter()
                            .filter(|b| b["type"] == "tool_use")
                        {
                            st.block(
                                json!({"type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}),
                                json!({"type": "input_json_delta", "partial_json": b["input"].to_string()}),
                            );
                        }
                        // The prompt's split between the prefix cache and the rest is known
                        // now; the SDKs take it from here over `message_start`'s.
                        let cached = f.stats.cached_tokens;
                        st.queue.push_back(event(json!({"type": "message_delta",
                            "delta": {"stop_reason": stop_reason(&r), "stop_sequence": r.stop},
                            "usage": {"output_tokens": f.ids.len(),
                                "input_tokens": f.prompt_ids.len().saturating_sub(cached),
                                "cache_read_input_tokens": cached}})));
                        st.queue.push_back(event(json!({"type": "message_stop"})));
                        st.done = true;
                    }
                    Some((_, Event::Failed(e))) => {
                        st.queue.push_back(event(json!({"type": "error",
                            "error": {"type": "api_error", "message": e.to_string()}})));
                        st.done = true;
                    }
                    None => return None,
                }
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

pub(super) async fn count_tokens(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r = async {
        let body = read_body(&app, &headers, body).await?;
        let v: Value = parse(&body)?;
        let p = parse_request(&v, true)?;
        let (prepared, _) = prepare_turn(&app, p.turn).await?;
        Ok::<_, ApiError>(axum::Json(json!({"input_tokens": prepared.ids.len()})).into_response())
    }
    .await;
    r.unwrap_or_else(|e| e.into_dialect(Dialect::Anthropic))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_become_a_turn() {
        let v = json!({
            "model": "claude-whatever", "max_tokens": 64,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "text", "text": "And tomorrow?"}]}
            ],
            "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}},
                      {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "stop_sequences": ["\n\n"], "temperature": 0.5, "top_k": 5,
            "thinking": {"type": "enabled", "budget_tokens": 1000}
        });
        let p = parse_request(&v, false).unwrap();
        let m = &p.turn.messages;
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(
            m[1],
            json!({"role": "user", "content": "Weather in Paris?"})
        );
        assert_eq!(
            m[2]["tool_calls"][0]["function"]["arguments"],
            r#"{"city":"Paris"}"#
        );
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"})
        );
        assert_eq!(m[4], json!({"role": "user", "content": "And tomorrow?"}));
        assert_eq!(p.turn.choice, ToolChoice::Required);
        assert!(!p.turn.parallel);
        assert_eq!(p.turn.thinking, Some(true));
        assert_eq!(p.turn.tools.len(), 1);
        assert_eq!(p.turn.tools[0]["function"]["name"], "get_weather");
        assert_eq!(
            p.skipped,
            vec!["tool `web_search` of type `web_search_20250305`"]
        );
        assert_eq!(p.sampling.max_tokens, Some(64));
        assert_eq!(p.sampling.top_k, Some(5));
        assert_eq!(p.sampling.stop, vec!["\n\n".to_owned()]);
    }

    #[test]
    fn bad_requests_name_the_field() {
        for (v, says) in [
            (
                json!({"messages": [{"role": "user", "content": "x"}]}),
                "max_tokens",
            ),
            (json!({"max_tokens": 8, "messages": []}), "empty"),
            (
                json!({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}),
                "`system`",
            ),
            (
                json!({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
                "image",
            ),
            (
                json!({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope"}]}]}),
                "no earlier tool_use",
            ),
            (
                json!({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "tool", "name": "f"}}),
                "not in `tools`",
            ),
            (
                json!({"max_tokens": 8, "messages": [{"role": "user", "content": 5}]}),
                "content",
            ),
            (
                json!({"max_tokens": "8", "messages": [{"role": "user", "content": "x"}]}),
                "max_tokens",
            ),
            (json!([1, 2]), "object"),
        ] {
            let e = parse_request(&v, false)
                .err()
                .unwrap_or_else(|| panic!("{v}"));
            assert_eq!(e.0, axum::http::StatusCode::BAD_REQUEST);
            assert!(e.1.contains(says), "{v}: {}", e.1);
        }
    }
}
