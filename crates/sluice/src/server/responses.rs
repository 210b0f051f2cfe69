//! OpenAI's Responses API (`/v1/responses`), stateless — what Codex speaks — translated onto
//! the request core: `instructions` and the input items become a chat turn (`function_call`
//! items an assistant's calls, `function_call_output` tool messages), function tools OpenAI
//! function tools (other tool types, which Codex sends, are skipped with a note on stderr),
//! `text.format` the response format; the reply becomes `message` and `function_call` output
//! items.

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
    self, ApiError, Part, Readback, Reply, Sampling, ToolChoice, Turn, Unfold, bad, collect, field,
    flag, now, number, positive, prepare_turn, submit,
};
use super::{App, parse, read_body};
use crate::batch::{Event, Finished};
use crate::options::FinishReason;

/// A Responses request translated: the turn, its sampling, whether it streams, and what the
/// reply echoes of it.
pub(super) struct Parsed {
    pub turn: Turn,
    pub sampling: Sampling,
    pub stream: bool,
    pub echo: Value,
    /// Tool types skipped (not functions), for the note on stderr.
    pub skipped: Vec<String>,
}

/// An item's text: a string, or a list of text parts (`input_text`, `output_text`, `text`).
fn content_text(v: &Value, what: &str) -> Result<String, ApiError> {
    core::text_parts(
        v,
        what,
        &["input_text", "output_text", "text"],
        &["input_image", "input_file", "input_audio"],
        "part",
    )
}

/// Translates a Responses request.
pub(super) fn parse_request(v: &Value) -> Result<Parsed, ApiError> {
    if !v.is_object() {
        return Err(bad("the request body must be a JSON object"));
    }
    if field(v, "previous_response_id").is_some() {
        return Err(bad(
            "`previous_response_id`: this server keeps no responses (it is stateless); send the whole input",
        ));
    }
    let mut messages = Vec::new();
    if let Some(i) = field(v, "instructions") {
        let s = i
            .as_str()
            .ok_or_else(|| bad("`instructions` must be a string"))?;
        messages.push(json!({"role": "system", "content": s}));
    }
    let input = field(v, "input").ok_or_else(|| bad("`input` is missing"))?;
    let items: Vec<Value> = match input {
        Value::String(s) => vec![json!({"type": "message", "role": "user", "content": s})],
        Value::Array(a) => a.clone(),
        _ => return Err(bad("`input` must be a string or a list of items")),
    };
    let mut called: HashSet<String> = HashSet::new();
    let mut skipped = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let kind =
            item.get("type")
                .and_then(Value::as_str)
                .unwrap_or(if item.get("role").is_some() {
                    "message"
                } else {
                    ""
                });
        match kind {
            "message" => {
                let role = item
                    .get("role")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{at}.role must be a string")))?;
                let role = match role {
                    "developer" | "system" => "system",
                    "user" | "assistant" => role,
                    r => {
                        return Err(bad(format!(
                            "{at}.role `{r}` is not user, assistant, system or developer"
                        )));
                    }
                };
                let content = item
                    .get("content")
                    .ok_or_else(|| bad(format!("{at}.content is missing")))?;
                messages.push(json!({"role": role, "content": content_text(content, &format!("{at}.content"))?}));
            }
            "function_call" => {
                let call_id = item
                    .get("call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{at}.call_id must be a string")))?;
                let name = item
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{at}.name must be a string")))?;
                let args = item
                    .get("arguments")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{at}.arguments must be a string")))?;
                called.insert(call_id.to_owned());
                let call = json!({"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": args}});
                // Calls join the assistant message before them, or start one.
                match messages.last_mut() {
                    Some(m) if m["role"] == "assistant" => {
                        match m.get_mut("tool_calls").and_then(Value::as_array_mut) {
                            Some(c) => c.push(call),
                            None => m["tool_calls"] = json!([call]),
                        }
                    }
                    _ => messages
                        .push(json!({"role": "assistant", "content": "", "tool_calls": [call]})),
                }
            }
            "function_call_output" => {
                let call_id = item
                    .get("call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{at}.call_id must be a string")))?;
                if !called.contains(call_id) {
                    return Err(bad(format!(
                        "{at}: an output for `{call_id}`, which no earlier function_call made"
                    )));
                }
                let out = match item.get("output") {
                    None | Some(Value::Null) => String::new(),
                    Some(o) => content_text(o, &format!("{at}.output"))?,
                };
                messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": out}));
            }
            // Reasoning items (Codex sends its earlier ones back) carry nothing to render.
            "reasoning" => {}
            "" => return Err(bad(format!("{at}.type is missing"))),
            other => skipped.push(format!("input item `{other}`")),
        }
    }
    if messages.iter().all(|m| m["role"] == "system") {
        return Err(bad("`input` has no message to answer"));
    }
    let mut tools = Vec::new();
    if let Some(t) = field(v, "tools") {
        let list = t.as_array().ok_or_else(|| bad("`tools` must be a list"))?;
        for (i, t) in list.iter().enumerate() {
            match t.get("type").and_then(Value::as_str) {
                Some("function") => {
                    let name = t
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad(format!("tools[{i}].name must be a string")))?;
                    let mut f = json!({"name": name});
                    if let Some(p) = t.get("parameters").filter(|p| p.is_object()) {
                        f["parameters"] = p.clone();
                    }
                    if let Some(d) = t.get("description").and_then(Value::as_str) {
                        f["description"] = json!(d);
                    }
                    tools.push(json!({"type": "function", "function": f}));
                }
                Some(other) => skipped.push(format!("tool `{other}`")),
                None => return Err(bad(format!("tools[{i}].type is missing"))),
            }
        }
    }
    let choice = match field(v, "tool_choice") {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            _ => {
                return Err(bad(format!(
                    "`tool_choice` \"{s}\" is not auto, none or required"
                )));
            }
        },
        Some(c) => match (
            c.get("type").and_then(Value::as_str),
            c.get("name").and_then(Value::as_str),
        ) {
            (Some("function"), Some(name)) => {
                if !tools.iter().any(|t| t["function"]["name"] == name) {
                    return Err(bad(format!(
                        "`tool_choice` names `{name}`, which is not in `tools`"
                    )));
                }
                ToolChoice::Named(name.to_owned())
            }
            _ => {
                return Err(bad(
                    "`tool_choice` must be auto, none, required or {\"type\": \"function\", \"name\": …}",
                ));
            }
        },
    };
    let format = match field(v, "text").and_then(|t| field(t, "format")) {
        None => None,
        Some(f) => match f.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(crate::Grammar::JsonObject),
            Some("json_schema") => Some(crate::Grammar::JsonSchema(
                f.get("schema")
                    .filter(|s| s.is_object())
                    .cloned()
                    .ok_or_else(|| bad("`text.format.schema` must be a JSON schema object"))?,
            )),
            _ => {
                return Err(bad(
                    "`text.format.type` must be text, json_object or json_schema",
                ));
            }
        },
    };
    let max_tokens = positive(v, "max_output_tokens")?;
    let stream = flag(v, "stream")?.unwrap_or(false);
    let parallel = field(v, "parallel_tool_calls")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let thinking = field(v, "reasoning")
        .and_then(|r| field(r, "effort"))
        .and_then(Value::as_str)
        .map(|e| !matches!(e, "none" | "minimal"));
    let echo = json!({
        "instructions": field(v, "instructions"),
        "tools": field(v, "tools").cloned().unwrap_or(json!([])),
        "tool_choice": field(v, "tool_choice").cloned().unwrap_or(json!("auto")),
        "parallel_tool_calls": parallel,
        "temperature": field(v, "temperature"),
        "top_p": field(v, "top_p"),
        "max_output_tokens": field(v, "max_output_tokens"),
        "text": field(v, "text").cloned().unwrap_or(json!({"format": {"type": "text"}})),
        "metadata": field(v, "metadata").cloned().unwrap_or(json!({})),
    });
    Ok(Parsed {
        turn: Turn {
            messages,
            tools,
            choice,
            parallel,
            format,
            thinking,
            continue_final: false,
        },
        sampling: Sampling {
            max_tokens,
            temperature: number(v, "temperature")?,
            top_p: number(v, "top_p")?,
            up_to: true,
            ..Default::default()
        },
        stream,
        echo,
        skipped,
    })
}

fn reasoning_item(id: &str, t: &str) -> Value {
    json!({"type": "reasoning", "id": format!("rs_{id}"), "summary": [],
        "content": [{"type": "reasoning_text", "text": t}]})
}

/// The output items of a reply: its reasoning, its message (unless it only calls), its calls.
fn output(r: &Reply, id: &str, done: bool) -> Vec<Value> {
    let status = if done { "completed" } else { "in_progress" };
    let mut out = Vec::new();
    if let Some(t) = &r.reasoning {
        out.push(reasoning_item(id, t));
    }
    if !r.content.is_empty() || r.calls.is_empty() {
        out.push(
            json!({"type": "message", "id": format!("msg_{id}"), "status": status,
            "role": "assistant",
            "content": [{"type": "output_text", "text": r.content, "annotations": []}]}),
        );
    }
    for (k, c) in r.calls.iter().enumerate() {
        out.push(
            json!({"type": "function_call", "id": format!("fc_{id}_{k}"),
            "call_id": format!("call_{id}_{k}"), "name": c.name, "arguments": c.arguments,
            "status": status}),
        );
    }
    out
}

/// The response object: what the request asked echoed, the output, status and usage.
fn response(id: &str, model: &str, echo: &Value, done: Option<(&Reply, &Finished)>) -> Value {
    let mut v = echo.clone();
    v["id"] = json!(format!("resp_{id}"));
    v["object"] = json!("response");
    v["created_at"] = json!(now());
    v["model"] = json!(model);
    v["error"] = Value::Null;
    v["store"] = json!(false);
    match done {
        None => {
            v["status"] = json!("in_progress");
            v["incomplete_details"] = Value::Null;
            v["output"] = json!([]);
            v["usage"] = Value::Null;
        }
        Some((r, f)) => {
            let cut = r.finish == FinishReason::Length && r.calls.is_empty();
            v["status"] = json!(if cut { "incomplete" } else { "completed" });
            v["incomplete_details"] = if cut {
                json!({"reason": "max_output_tokens"})
            } else {
                Value::Null
            };
            v["output"] = Value::Array(output(r, id, true));
            let cached = f.stats.cached_tokens;
            v["usage"] = json!({
                "input_tokens": f.prompt_ids.len(),
                "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": f.ids.len(),
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": f.prompt_ids.len() + f.ids.len(),
            });
        }
    }
    v
}

pub(super) async fn responses(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_body(&app, &headers, body).await?;
    let v: Value = parse(&body)?;
    let p = parse_request(&v)?;
    if !p.skipped.is_empty() {
        eprintln!(
            "note: /v1/responses: skipped {} (only function tools are run)",
            p.skipped.join(", ")
        );
    }
    let opts = app.options(&p.sampling)?;
    let (prepared, back) = prepare_turn(&app, p.turn).await?;
    let rx = submit(&app, prepared, opts, 1, true)?;
    let id = app.id("r").replace('-', "");
    let model = app.opts.model_name.clone();
    let engine = app.batcher.engine().clone();
    if p.stream {
        return Ok(stream(rx, back, id, model, engine, p.echo).into_response());
    }
    let done = collect(rx, 1).await?;
    let (f, _) = &done[0];
    let r = core::reply(&engine, f, &back, &[]);
    Ok(axum::Json(response(&id, &model, &p.echo, Some((&r, f)))).into_response())
}

/// The Responses stream: `response.created` and `response.in_progress`; the output items as
/// [`Unfold`] lets them go — reasoning whole once closed, the message's text as it comes
/// (`response.output_item.added`, `response.content_part.added`, `response.output_text.delta`
/// … `.done`), each call whole at the end (its arguments in one
/// `response.function_call_arguments.delta`); then `response.completed` (or
/// `response.incomplete`) with the whole response. Every event has its `sequence_number`.
fn stream(
    rx: mpsc::UnboundedReceiver<(usize, Event)>,
    back: Readback,
    id: String,
    model: String,
    engine: crate::Engine,
    echo: Value,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    struct St {
        rx: mpsc::UnboundedReceiver<(usize, Event)>,
        queue: std::collections::VecDeque<Value>,
        seq: u64,
        unfold: Unfold,
        msg_id: String,
        /// The next item's index.
        next: usize,
        /// The message's index, while it is open.
        msg: Option<usize>,
        done: bool,
    }
    impl St {
        fn whole(&mut self, item: &Value) {
            let i = self.next;
            self.next += 1;
            let mut added = item.clone();
            if item["type"] == "function_call" {
                added["arguments"] = json!("");
                added["status"] = json!("in_progress");
            }
            self.queue.push_back(
                json!({"type": "response.output_item.added", "output_index": i, "item": added}),
            );
            if item["type"] == "function_call" {
                self.queue
                    .push_back(json!({"type": "response.function_call_arguments.delta",
                    "item_id": item["id"], "output_index": i, "delta": item["arguments"]}));
                self.queue
                    .push_back(json!({"type": "response.function_call_arguments.done",
                    "item_id": item["id"], "output_index": i, "arguments": item["arguments"]}));
            }
            self.queue.push_back(
                json!({"type": "response.output_item.done", "output_index": i, "item": item}),
            );
        }
        fn text(&mut self, t: &str) {
            let i = match self.msg {
                Some(i) => i,
                None => {
                    let i = self.next;
                    self.next += 1;
                    self.msg = Some(i);
                    self.queue
                        .push_back(json!({"type": "response.output_item.added",
                        "output_index": i, "item": {"type": "message", "id": self.msg_id,
                        "status": "in_progress", "role": "assistant", "content": []}}));
                    self.queue
                        .push_back(json!({"type": "response.content_part.added",
                        "item_id": self.msg_id, "output_index": i, "content_index": 0,
                        "part": {"type": "output_text", "text": "", "annotations": []}}));
                    i
                }
            };
            if !t.is_empty() {
                self.queue
                    .push_back(json!({"type": "response.output_text.delta",
                    "item_id": self.msg_id, "output_index": i, "content_index": 0,
                    "delta": t, "logprobs": []}));
            }
        }
        fn close_message(&mut self, item: &Value) {
            if let Some(i) = self.msg.take() {
                let part = &item["content"][0];
                self.queue
                    .push_back(json!({"type": "response.output_text.done",
                    "item_id": self.msg_id, "output_index": i, "content_index": 0,
                    "text": part["text"], "logprobs": []}));
                self.queue
                    .push_back(json!({"type": "response.content_part.done",
                    "item_id": self.msg_id, "output_index": i, "content_index": 0, "part": part}));
                self.queue.push_back(
                    json!({"type": "response.output_item.done", "output_index": i, "item": item}),
                );
            }
        }
    }
    let created = response(&id, &model, &echo, None);
    let st = St {
        rx,
        queue: [
            json!({"type": "response.created", "response": created}),
            json!({"type": "response.in_progress", "response": created}),
        ]
        .into(),
        seq: 0,
        unfold: Unfold::new(&back),
        msg_id: format!("msg_{id}"),
        next: 0,
        msg: None,
        done: false,
    };
    let stream = futures_util::stream::unfold(st, move |mut st| {
        let (back, id, model, engine, echo) = (
            back.clone(),
            id.clone(),
            model.clone(),
            engine.clone(),
            echo.clone(),
        );
        async move {
            loop {
                if let Some(mut e) = st.queue.pop_front() {
                    e["sequence_number"] = json!(st.seq);
                    st.seq += 1;
                    let name = e["type"].as_str().unwrap_or("message").to_owned();
                    return Some((Ok(SseEvent::default().event(name).data(e.to_string())), st));
                }
                if st.done {
                    return None;
                }
                match st.rx.recv().await {
                    Some((_, Event::Token(t))) => {
                        for part in st.unfold.push(&t.text) {
                            match part {
                                Part::Reasoning(t) => st.whole(&reasoning_item(&id, &t)),
                                Part::Text(t) => st.text(&t),
                            }
                        }
                    }
                    Some((_, Event::Done(f))) => {
                        let r = core::reply(&engine, &f, &back, &[]);
                        let items = output(&r, &id, true);
                        let mut items = items.iter();
                        if r.reasoning.is_some() {
                            let item = items.next();
                            if let (Some(item), false) = (item, st.unfold.reasoning_sent()) {
                                st.whole(item);
                            }
                        }
                        let rest = st.unfold.rest(&r).to_owned();
                        if !rest.is_empty() || (r.calls.is_empty() && st.msg.is_none()) {
                            st.text(&rest);
                        }
                        if st.msg.is_some()
                            && let Some(item) = items.next()
                        {
                            st.close_message(item);
                        }
                        for item in items {
                            st.whole(item);
                        }
                        let whole = response(&id, &model, &echo, Some((&r, &f)));
                        let kind = if whole["status"] == "incomplete" {
                            "response.incomplete"
                        } else {
                            "response.completed"
                        };
                        st.queue.push_back(json!({"type": kind, "response": whole}));
                        st.done = true;
                    }
                    Some((_, Event::Failed(e))) => {
                        st.queue
                            .push_back(json!({"type": "error", "code": "server_error",
                            "message": e.to_string(), "param": null}));
                        st.done = true;
                    }
                    None => return None,
                }
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_become_a_turn() {
        let v = json!({
            "model": "gpt-5-codex", "instructions": "You are terse.",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "List files."}]},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{\"cmd\":\"ls\"}"},
                {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
                {"type": "message", "role": "developer", "content": "Be brief."}
            ],
            "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}},
                      {"type": "web_search"}, {"type": "local_shell"}],
            "tool_choice": {"type": "function", "name": "shell"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
            "max_output_tokens": 50, "store": false, "reasoning": {"effort": "low"},
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k"
        });
        let p = parse_request(&v).unwrap();
        let m = &p.turn.messages;
        assert_eq!(m[0], json!({"role": "system", "content": "You are terse."}));
        assert_eq!(m[1], json!({"role": "user", "content": "List files."}));
        assert_eq!(m[2]["role"], "assistant");
        assert_eq!(m[2]["tool_calls"][0]["function"]["name"], "shell");
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "c1", "content": "a.txt"})
        );
        assert_eq!(m[4], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(p.turn.tools.len(), 1);
        assert_eq!(p.skipped, vec!["tool `web_search`", "tool `local_shell`"]);
        assert_eq!(p.turn.choice, ToolChoice::Named("shell".into()));
        assert!(matches!(p.turn.format, Some(crate::Grammar::JsonSchema(_))));
        assert_eq!(p.sampling.max_tokens, Some(50));
        assert_eq!(p.turn.thinking, Some(true));
    }

    #[test]
    fn bad_requests_name_the_field() {
        for (v, says) in [
            (
                json!({"input": "x", "previous_response_id": "resp_1"}),
                "stateless",
            ),
            (json!({}), "`input`"),
            (json!({"input": 5}), "`input`"),
            (
                json!({"input": [{"type": "function_call_output", "call_id": "zz", "output": "x"}]}),
                "no earlier function_call",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
                "input_image",
            ),
            (
                json!({"input": "x", "tool_choice": {"type": "function", "name": "nope"}}),
                "not in `tools`",
            ),
            (
                json!({"input": "x", "text": {"format": {"type": "yaml"}}}),
                "text.format.type",
            ),
            (
                json!({"input": "x", "max_output_tokens": 0}),
                "max_output_tokens",
            ),
            (
                json!({"input": [{"role": "system", "content": "x"}]}),
                "no message",
            ),
        ] {
            let e = parse_request(&v).err().unwrap_or_else(|| panic!("{v}"));
            assert!(e.1.contains(says), "{v}: {}", e.1);
        }
    }
}
