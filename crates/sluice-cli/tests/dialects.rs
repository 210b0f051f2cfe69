//! `sluice serve`'s other dialects — Anthropic's Messages, OpenAI's Responses and Ollama's API —
//! against the real process: the same request gives the same tokens in every dialect, greedy and
//! sampled; streams carry what whole replies carry; bad input gets a 4xx in the dialect's own
//! error shape; an API key guards every endpoint but /health; and the official clients work
//! unchanged (tests/clients/*.py).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

mod common;
use common::{Server, python_client, start, tool_model, url};
use serde_json::{Value, json};

/// An HTTP request with headers; (status, body).
fn send(
    s: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let u = url(s, path);
    let mut r = if method == "GET" {
        let mut req = agent.get(&u);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.call().unwrap()
    } else {
        let mut req = agent.post(&u);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.send(body).unwrap()
    };
    let status = r.status().as_u16();
    (status, r.body_mut().read_to_string().unwrap())
}

const JSON: (&str, &str) = ("content-type", "application/json");

fn post(s: &Server, path: &str, body: &Value) -> Value {
    let (st, b) = send(s, "POST", path, &[JSON], &body.to_string());
    assert_eq!(st, 200, "{path}: {b}");
    serde_json::from_str(&b).unwrap_or_else(|e| panic!("{path}: {e}: {b}"))
}

fn post_raw(s: &Server, path: &str, body: &Value) -> String {
    let (st, b) = send(s, "POST", path, &[JSON], &body.to_string());
    assert_eq!(st, 200, "{path}: {b}");
    b
}

/// The JSON payloads of a server-sent-event body.
fn sse(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

/// What a reply says: its text, its calls as (name, arguments as JSON), its prompt and reply
/// token counts.
#[derive(Debug, PartialEq)]
struct Said {
    text: String,
    calls: Vec<(String, Value)>,
    prompt: u64,
    completion: u64,
}

fn arguments(a: &Value) -> Value {
    match a {
        Value::String(s) => serde_json::from_str(s).unwrap(),
        other => other.clone(),
    }
}

fn chat_said(v: &Value) -> Said {
    let m = &v["choices"][0]["message"];
    Said {
        text: m["content"].as_str().unwrap_or_default().to_owned(),
        calls: m["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                (
                    c["function"]["name"].as_str().unwrap().to_owned(),
                    arguments(&c["function"]["arguments"]),
                )
            })
            .collect(),
        prompt: v["usage"]["prompt_tokens"].as_u64().unwrap(),
        completion: v["usage"]["completion_tokens"].as_u64().unwrap(),
    }
}

fn anthropic_said(v: &Value) -> Said {
    let blocks = v["content"].as_array().unwrap();
    let u = &v["usage"];
    Said {
        text: blocks
            .iter()
            .filter(|b| b["type"] == "text")
            .map(|b| b["text"].as_str().unwrap())
            .collect(),
        calls: blocks
            .iter()
            .filter(|b| b["type"] == "tool_use")
            .map(|b| (b["name"].as_str().unwrap().to_owned(), b["input"].clone()))
            .collect(),
        prompt: u["input_tokens"].as_u64().unwrap()
            + u["cache_read_input_tokens"].as_u64().unwrap(),
        completion: u["output_tokens"].as_u64().unwrap(),
    }
}

/// A Messages stream put together as the SDK does: blocks by index from their start and deltas.
fn anthropic_stream(body: &str) -> Value {
    let mut blocks: Vec<Value> = Vec::new();
    let mut partial: Vec<String> = Vec::new();
    let mut msg = Value::Null;
    let ev = sse(body);
    let names: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(names.first(), Some(&"message_start"), "{names:?}");
    assert_eq!(names.last(), Some(&"message_stop"), "{names:?}");
    for e in &ev {
        match e["type"].as_str().unwrap() {
            "message_start" => msg = e["message"].clone(),
            "content_block_start" => {
                assert_eq!(e["index"].as_u64().unwrap() as usize, blocks.len());
                blocks.push(e["content_block"].clone());
                partial.push(String::new());
            }
            "content_block_delta" => {
                let i = e["index"].as_u64().unwrap() as usize;
                let d = &e["delta"];
                match d["type"].as_str().unwrap() {
                    "text_delta" => {
                        let t = format!(
                            "{}{}",
                            blocks[i]["text"].as_str().unwrap(),
                            d["text"].as_str().unwrap()
                        );
                        blocks[i]["text"] = json!(t);
                    }
                    "input_json_delta" => partial[i].push_str(d["partial_json"].as_str().unwrap()),
                    "thinking_delta" => {}
                    other => panic!("delta {other}"),
                }
            }
            "content_block_stop" => {
                let i = e["index"].as_u64().unwrap() as usize;
                if blocks[i]["type"] == "tool_use" {
                    blocks[i]["input"] = serde_json::from_str(&partial[i]).unwrap();
                }
            }
            "message_delta" => {
                msg["stop_reason"] = e["delta"]["stop_reason"].clone();
                for (k, v) in e["usage"].as_object().unwrap() {
                    msg["usage"][k] = v.clone();
                }
            }
            _ => {}
        }
    }
    msg["content"] = json!(blocks);
    msg
}

fn responses_said(v: &Value) -> Said {
    let out = v["output"].as_array().unwrap();
    Said {
        text: out
            .iter()
            .filter(|o| o["type"] == "message")
            .flat_map(|o| o["content"].as_array().unwrap())
            .map(|c| c["text"].as_str().unwrap())
            .collect(),
        calls: out
            .iter()
            .filter(|o| o["type"] == "function_call")
            .map(|o| {
                (
                    o["name"].as_str().unwrap().to_owned(),
                    arguments(&o["arguments"]),
                )
            })
            .collect(),
        prompt: v["usage"]["input_tokens"].as_u64().unwrap(),
        completion: v["usage"]["output_tokens"].as_u64().unwrap(),
    }
}

/// A Responses stream: its events numbered in order, its text and arguments deltas the same
/// as the final response's, which it returns.
fn responses_stream(body: &str) -> Value {
    let ev = sse(body);
    for (i, e) in ev.iter().enumerate() {
        assert_eq!(e["sequence_number"], i, "{e}");
    }
    assert_eq!(ev[0]["type"], "response.created");
    let last = ev.last().unwrap();
    assert!(
        last["type"] == "response.completed" || last["type"] == "response.incomplete",
        "{last}"
    );
    let resp = last["response"].clone();
    let text: String = ev
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, responses_said(&resp).text);
    let args: Vec<Value> = ev
        .iter()
        .filter(|e| e["type"] == "response.function_call_arguments.delta")
        .map(|e| arguments(&e["delta"]))
        .collect();
    let calls: Vec<Value> = responses_said(&resp)
        .calls
        .into_iter()
        .map(|c| c.1)
        .collect();
    assert_eq!(args, calls);
    resp
}

fn ollama_said(v: &Value) -> Said {
    let m = &v["message"];
    Said {
        text: m["content"].as_str().unwrap().to_owned(),
        calls: m["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                (
                    c["function"]["name"].as_str().unwrap().to_owned(),
                    c["function"]["arguments"].clone(),
                )
            })
            .collect(),
        prompt: v["prompt_eval_count"].as_u64().unwrap(),
        completion: v["eval_count"].as_u64().unwrap(),
    }
}

/// An NDJSON chat stream put together: the contents joined, the calls gathered, the counts of
/// its last line (the only one that is `done`).
fn ollama_stream(body: &str) -> Value {
    let lines: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let (last, parts) = lines.split_last().unwrap();
    assert_eq!(last["done"], true, "{last}");
    assert!(parts.iter().all(|p| p["done"] == false));
    let mut v = last.clone();
    v["message"]["content"] = json!(
        lines
            .iter()
            .map(|p| p["message"]["content"].as_str().unwrap())
            .collect::<String>()
    );
    let calls: Vec<Value> = lines
        .iter()
        .flat_map(|p| {
            p["message"]["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    if !calls.is_empty() {
        v["message"]["tool_calls"] = json!(calls);
    }
    v
}

#[test]
fn the_same_request_gives_the_same_tokens_in_every_dialect_greedy_and_sampled() {
    let d = tool_model();
    let s = start(d.path(), &[]);
    let system = "You answer briefly.";
    let user = "Tell me of Elizabeth.";
    // Greedy; sampled with each dialect's default seed (0); sampled with seed 7 where the
    // dialect has a seed (chat completions and Ollama).
    for (temperature, seed) in [(0.0, None), (0.9, None), (0.9, Some(7))] {
        let mut chat = json!({"messages": [{"role": "system", "content": system},
            {"role": "user", "content": user}], "max_tokens": 12, "temperature": temperature});
        let mut ollama = json!({"model": "any", "stream": false,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "options": {"num_predict": 12, "temperature": temperature}});
        if let Some(seed) = seed {
            chat["seed"] = json!(seed);
            ollama["options"]["seed"] = json!(seed);
        }
        let want = chat_said(&post(&s, "/v1/chat/completions", &chat));
        assert_eq!(want.completion, 12);
        assert_eq!(
            ollama_said(&post(&s, "/api/chat", &ollama)),
            want,
            "ollama, {temperature}"
        );
        let mut streamed = ollama.clone();
        streamed["stream"] = json!(true);
        assert_eq!(
            ollama_said(&ollama_stream(&post_raw(&s, "/api/chat", &streamed))),
            want,
            "ollama stream, {temperature}"
        );
        if seed.is_some() {
            continue;
        }
        let anthropic = json!({"model": "claude-sonnet-4-5", "max_tokens": 12, "system": system,
            "messages": [{"role": "user", "content": user}], "temperature": temperature});
        assert_eq!(
            anthropic_said(&post(&s, "/v1/messages", &anthropic)),
            want,
            "messages, {temperature}"
        );
        let mut streamed = anthropic.clone();
        streamed["stream"] = json!(true);
        let whole = anthropic_stream(&post_raw(&s, "/v1/messages", &streamed));
        assert_eq!(
            anthropic_said(&whole),
            want,
            "messages stream, {temperature}"
        );
        let responses = json!({"model": "gpt-5-codex", "instructions": system, "input": user,
            "max_output_tokens": 12, "temperature": temperature});
        assert_eq!(
            responses_said(&post(&s, "/v1/responses", &responses)),
            want,
            "responses, {temperature}"
        );
        let mut streamed = responses.clone();
        streamed["stream"] = json!(true);
        let whole = responses_stream(&post_raw(&s, "/v1/responses", &streamed));
        assert_eq!(
            responses_said(&whole),
            want,
            "responses stream, {temperature}"
        );
    }
    // A sampled reply is not the greedy one: the comparison above can tell them apart.
    let ask = |t: f64| {
        chat_said(&post(
            &s,
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user",
            "content": user}], "max_tokens": 12, "temperature": t, "seed": 7}),
        ))
        .text
    };
    assert_ne!(ask(0.0), ask(1.5));
}

/// An agent's request always has tools; a reply that calls none streams its text as it comes
/// (what could begin a call held back), and carries what the whole reply does.
#[test]
fn with_tools_a_reply_streams_its_text_as_it_comes() {
    let d = tool_model();
    let s = start(d.path(), &[]);
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}});
    let user = "Tell me of Elizabeth.";
    let anthropic = json!({"model": "m", "max_tokens": 24, "temperature": 0,
        "messages": [{"role": "user", "content": user}],
        "tools": [{"name": "get_weather", "input_schema": schema}]});
    let whole = anthropic_said(&post(&s, "/v1/messages", &anthropic));
    assert!(
        whole.calls.is_empty() && !whole.text.is_empty(),
        "{whole:?}"
    );
    let mut streamed = anthropic.clone();
    streamed["stream"] = json!(true);
    let body = post_raw(&s, "/v1/messages", &streamed);
    let deltas = sse(&body)
        .iter()
        .filter(|e| e["delta"]["type"] == "text_delta")
        .count();
    assert!(deltas > 5, "{body}");
    assert_eq!(anthropic_said(&anthropic_stream(&body)).text, whole.text);

    let responses = json!({"model": "m", "input": user, "max_output_tokens": 24, "temperature": 0,
        "tools": [{"type": "function", "name": "get_weather", "parameters": schema}]});
    let whole_r = responses_said(&post(&s, "/v1/responses", &responses));
    assert_eq!(whole_r.text, whole.text);
    let mut streamed = responses.clone();
    streamed["stream"] = json!(true);
    let body = post_raw(&s, "/v1/responses", &streamed);
    let deltas = sse(&body)
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .count();
    assert!(deltas > 5, "{body}");
    assert_eq!(responses_said(&responses_stream(&body)), whole_r);

    let ollama = json!({"model": "m", "messages": [{"role": "user", "content": user}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": schema}}],
        "options": {"num_predict": 24, "temperature": 0}});
    let body = post_raw(&s, "/api/chat", &ollama);
    assert!(body.lines().count() > 5, "{body}");
    assert_eq!(ollama_said(&ollama_stream(&body)).text, whole.text);

    let chat = json!({"messages": [{"role": "user", "content": user}], "max_tokens": 24,
        "temperature": 0, "stream": true,
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": schema}}]});
    let body = post_raw(&s, "/v1/chat/completions", &chat);
    let chunks = sse(&body);
    let content: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .filter(|t| !t.is_empty())
        .collect();
    assert!(content.len() > 5, "{body}");
    assert_eq!(content.concat(), whole.text);
    assert!(
        chunks
            .iter()
            .any(|c| c["choices"][0]["finish_reason"] == "length"),
        "{body}"
    );
}

#[test]
fn forced_calls_are_the_same_call_in_every_dialect_streamed_or_not() {
    let d = tool_model();
    let s = start(d.path(), &[]);
    let schema = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"],
        "additionalProperties": false});
    let user = "What is the weather in Bath?";
    let chat = json!({"messages": [{"role": "user", "content": user}], "max_tokens": 100,
        "temperature": 0, "parallel_tool_calls": false,
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": schema}}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    let want = chat_said(&post(&s, "/v1/chat/completions", &chat));
    assert_eq!(want.calls.len(), 1, "{want:?}");
    assert_eq!(want.calls[0].0, "get_weather");

    let anthropic = json!({"model": "m", "max_tokens": 100, "temperature": 0,
        "messages": [{"role": "user", "content": user}],
        "tools": [{"name": "get_weather", "input_schema": schema}],
        "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true}});
    let whole = post(&s, "/v1/messages", &anthropic);
    assert_eq!(whole["stop_reason"], "tool_use");
    let got = anthropic_said(&whole);
    assert_eq!(
        (got.calls.clone(), got.completion),
        (want.calls.clone(), want.completion)
    );
    let mut streamed = anthropic.clone();
    streamed["stream"] = json!(true);
    let st = anthropic_stream(&post_raw(&s, "/v1/messages", &streamed));
    assert_eq!(st["stop_reason"], "tool_use");
    assert_eq!(anthropic_said(&st).calls, want.calls);

    let responses = json!({"model": "m", "input": user, "max_output_tokens": 100,
        "temperature": 0, "parallel_tool_calls": false,
        "tools": [{"type": "function", "name": "get_weather", "parameters": schema},
                  {"type": "local_shell"}],
        "tool_choice": {"type": "function", "name": "get_weather"}});
    let got = responses_said(&post(&s, "/v1/responses", &responses));
    assert_eq!(
        (got.calls.clone(), got.completion),
        (want.calls.clone(), want.completion)
    );
    let mut streamed = responses.clone();
    streamed["stream"] = json!(true);
    assert_eq!(
        responses_said(&responses_stream(&post_raw(&s, "/v1/responses", &streamed))).calls,
        want.calls
    );

    // Ollama has no forced call: a reply begun with the call's opening tag, `format` holding
    // the rest to a call, is one — with its arguments as an object, streamed or not.
    let call = json!({"type": "object", "properties": {"name": {"const": "get_weather"},
        "arguments": schema}, "required": ["name", "arguments"], "additionalProperties": false});
    let ollama = json!({"model": "m", "stream": false, "format": call,
        "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": "<tool_call>\n"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": schema}}],
        "options": {"num_predict": 100, "temperature": 0}});
    let whole = post(&s, "/api/chat", &ollama);
    let got = ollama_said(&whole);
    assert_eq!(got.calls.len(), 1, "{whole}");
    assert!(got.calls[0].1.is_object() && got.text.is_empty(), "{whole}");
    let mut streamed = ollama.clone();
    streamed["stream"] = json!(true);
    assert_eq!(
        ollama_said(&ollama_stream(&post_raw(&s, "/api/chat", &streamed))).calls,
        got.calls
    );
}

#[test]
fn a_continued_assistant_message_is_continued_not_answered() {
    let d = tool_model();
    let s = start(d.path(), &[]);
    let user = json!({"role": "user", "content": "Tell me of Elizabeth."});
    // What the raw prompt that ends inside the assistant's text gives.
    let raw = post(
        &s,
        "/v1/completions",
        &json!({"prompt": "<|user|>\nTell me of Elizabeth.\n<|assistant|>\nElizabeth was",
        "max_tokens": 8, "temperature": 0}),
    );
    let want = raw["choices"][0]["text"].as_str().unwrap();
    let a = post(
        &s,
        "/v1/messages",
        &json!({"model": "m", "max_tokens": 8, "temperature": 0,
        "messages": [user, {"role": "assistant", "content": "Elizabeth was"}]}),
    );
    assert_eq!(a["content"][0]["text"], want, "{a}");
    let o = post(
        &s,
        "/api/chat",
        &json!({"model": "m", "stream": false,
        "messages": [user, {"role": "assistant", "content": "Elizabeth was"}],
        "options": {"num_predict": 8, "temperature": 0}}),
    );
    assert_eq!(o["message"]["content"], want, "{o}");
    // Answered instead, it would be another reply.
    let answered = post(
        &s,
        "/v1/messages",
        &json!({"model": "m", "max_tokens": 8, "temperature": 0,
        "messages": [user]}),
    );
    assert_ne!(answered["content"][0]["text"], want);
}

/// Checks a reply is a 4xx in `dialect`'s error shape, and returns its message.
fn refused(dialect: &str, st: u16, body: &str, want: u16) -> String {
    assert_eq!(st, want, "{dialect}: {body}");
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{dialect}: {e}: {body}"));
    let msg = match dialect {
        "anthropic" => {
            assert_eq!(v["type"], "error", "{body}");
            assert!(v["error"]["type"].is_string(), "{body}");
            v["error"]["message"].as_str()
        }
        "openai" => {
            assert!(v["error"]["type"].is_string(), "{body}");
            v["error"]["message"].as_str()
        }
        "ollama" => v["error"].as_str(),
        _ => unreachable!(),
    };
    let msg = msg
        .unwrap_or_else(|| panic!("{dialect}: no message in {body}"))
        .to_owned();
    assert!(!msg.is_empty());
    msg
}

#[test]
fn bad_input_gets_a_4xx_in_each_dialects_own_shape() {
    let d = tool_model();
    let s = start(d.path(), &["--api-key", "sekrit", "--max-body", "4096"]);
    let key = ("authorization", "Bearer sekrit");
    let x_key = ("x-api-key", "sekrit");
    let ask = |path: &str, body: &str| send(&s, "POST", path, &[JSON, key], body);
    let user = json!({"role": "user", "content": "Hi"});
    let tool = json!({"type": "object", "properties": {"city": {"type": "string"}}});
    let big = format!("\"{}\"", "x".repeat(5000));
    let cases: Vec<(&str, &str, String, u16, &str)> = vec![
        // Anthropic's Messages.
        ("anthropic", "/v1/messages", "{\"max_tokens\": ".into(), 400, "bad request body"),
        ("anthropic", "/v1/messages", json!({"max_tokens": "8", "messages": [user]}).to_string(), 400, "max_tokens"),
        ("anthropic", "/v1/messages", json!({"max_tokens": 8, "messages": [user],
            "tools": [{"name": "f", "input_schema": tool}], "tool_choice": {"type": "tool", "name": "g"}}).to_string(), 400, "`g`"),
        ("anthropic", "/v1/messages", json!({"max_tokens": 8, "messages": [{"role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"}]}]}).to_string(), 400, "no earlier tool_use"),
        ("anthropic", "/v1/messages", json!({"max_tokens": 8, "messages": [{"role": "user",
            "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}}]}]}).to_string(), 400, "image"),
        ("anthropic", "/v1/messages", json!({"max_tokens": 8, "messages": [user], "x": big}).to_string(), 413, "4096"),
        ("anthropic", "/v1/messages", json!({"max_tokens": 8, "messages": [user], "temperature": "hot"}).to_string(), 400, "temperature"),
        ("anthropic", "/v1/messages/count_tokens", json!({"messages": 3}).to_string(), 400, "messages"),
        // OpenAI's Responses.
        ("openai", "/v1/responses", "[".into(), 400, "bad request body"),
        ("openai", "/v1/responses", json!({"input": 5}).to_string(), 400, "`input`"),
        ("openai", "/v1/responses", json!({"input": "Hi", "tools": [{"type": "function", "name": "f"}],
            "tool_choice": {"type": "function", "name": "g"}}).to_string(), 400, "`g`"),
        ("openai", "/v1/responses", json!({"input": [{"type": "function_call_output", "call_id": "c9",
            "output": "x"}]}).to_string(), 400, "no earlier function_call"),
        ("openai", "/v1/responses", json!({"input": "Hi", "previous_response_id": "resp_1"}).to_string(), 400, "stateless"),
        ("openai", "/v1/responses", json!({"input": big}).to_string(), 413, "4096"),
        // OpenAI's chat completions.
        ("openai", "/v1/chat/completions", json!({"messages": [user,
            {"role": "tool", "tool_call_id": "call_9", "content": "x"}]}).to_string(), 400, "call_9"),
        ("openai", "/v1/chat/completions", json!({"messages": [user], "tools": [{"type": "function",
            "function": {"name": "f", "parameters": tool}}], "tool_choice": {"type": "function",
            "function": {"name": "g"}}}).to_string(), 400, "g"),
        // Ollama's.
        ("ollama", "/api/chat", "{\"messages\": [".into(), 400, "bad request body"),
        ("ollama", "/api/chat", json!({"model": "m", "messages": [user], "options": {"num_predict": "8"}}).to_string(), 400, "options.num_predict"),
        ("ollama", "/api/chat", json!({"model": "m", "messages": [user, {"role": "tool", "content": "x",
            "tool_name": "f"}]}).to_string(), 400, "no earlier tool call"),
        ("ollama", "/api/chat", json!({"model": "m", "messages": [{"role": "user", "content": "Hi",
            "images": ["aGk="]}]}).to_string(), 400, "images"),
        ("ollama", "/api/generate", json!({"model": "m", "prompt": ["Hi"]}).to_string(), 400, "`prompt`"),
        ("ollama", "/api/generate", json!({"model": "m", "prompt": "Hi", "context": [99999999]}).to_string(), 400, "context"),
        ("ollama", "/api/generate", json!({"model": "m", "prompt": big}).to_string(), 413, "4096"),
        ("ollama", "/api/show", json!({}).to_string(), 400, "`model`"),
    ];
    for (dialect, path, body, status, says) in &cases {
        let (st, b) = ask(path, body);
        let msg = refused(dialect, st, &b, *status);
        assert!(msg.contains(says), "{path} {body}: {msg}");
    }
    // No key, or a wrong one: 401 in the dialect's shape, on every endpoint but /health.
    for (dialect, method, path) in [
        ("anthropic", "POST", "/v1/messages"),
        ("anthropic", "POST", "/v1/messages/count_tokens"),
        ("openai", "POST", "/v1/responses"),
        ("openai", "POST", "/v1/chat/completions"),
        ("openai", "POST", "/v1/completions"),
        ("openai", "GET", "/v1/models"),
        ("ollama", "POST", "/api/chat"),
        ("ollama", "POST", "/api/generate"),
        ("ollama", "GET", "/api/tags"),
        ("ollama", "POST", "/api/show"),
        ("ollama", "GET", "/api/version"),
        ("ollama", "GET", "/api/ps"),
    ] {
        for headers in [
            vec![JSON],
            vec![JSON, ("authorization", "Bearer sekriT")],
            vec![JSON, ("x-api-key", "sekri")],
        ] {
            let (st, b) = send(&s, method, path, &headers, "{}");
            refused(dialect, st, &b, 401);
        }
        // With the key (either header) the request reaches the endpoint.
        for k in [key, x_key] {
            let (st, _) = send(&s, method, path, &[JSON, k], "{}");
            assert_ne!(st, 401, "{path}");
        }
    }
    assert_eq!(send(&s, "GET", "/health", &[], "").0, 200);
    assert_eq!(
        send(&s, "GET", "/", &[], ""),
        (200, "sluice is running\n".into())
    );
    // Unknown paths: 404 in the shape of the API their prefix names.
    refused(
        "ollama",
        send(&s, "GET", "/api/pull", &[key], "").0,
        &send(&s, "GET", "/api/pull", &[key], "").1,
        404,
    );
    let (st, b) = send(&s, "GET", "/v1/nothing", &[key], "");
    refused("openai", st, &b, 404);
    // After all that, the server answers in every dialect.
    let (st, b) = ask(
        "/v1/messages",
        &json!({"max_tokens": 2, "messages": [user]}).to_string(),
    );
    assert_eq!(st, 200, "{b}");
    let (st, b) = ask(
        "/api/chat",
        &json!({"model": "m", "stream": false, "messages": [user],
        "options": {"num_predict": 2}})
        .to_string(),
    );
    assert_eq!(st, 200, "{b}");
    let (st, b) = ask(
        "/v1/responses",
        &json!({"input": "Hi", "max_output_tokens": 2}).to_string(),
    );
    assert_eq!(st, 200, "{b}");
}

/// Agents ask for lengths as upper bounds (Claude Code's `max_tokens` is 32,000; Codex and
/// Ollama's clients give none): each is held to the server's limit and to what the context
/// leaves, where chat completions would refuse one over the limit.
#[test]
fn an_agents_length_is_an_upper_bound() {
    let d = tool_model();
    let s = start(d.path(), &["--max-tokens-limit", "20"]);
    let user = json!({"role": "user", "content": "Tell me of Elizabeth."});
    let a = post(
        &s,
        "/v1/messages",
        &json!({"max_tokens": 32000, "messages": [user], "temperature": 0}),
    );
    let n = a["usage"]["output_tokens"].as_u64().unwrap();
    assert!(
        n <= 20 && (n == 20) == (a["stop_reason"] == "max_tokens"),
        "{a}"
    );
    let r = post(
        &s,
        "/v1/responses",
        &json!({"input": "Tell me of Elizabeth.", "temperature": 0}),
    );
    assert!(r["usage"]["output_tokens"].as_u64().unwrap() <= 20, "{r}");
    let o = post(
        &s,
        "/api/chat",
        &json!({"model": "m", "stream": false, "messages": [user],
        "options": {"temperature": 0}}),
    );
    assert!(o["eval_count"].as_u64().unwrap() <= 20, "{o}");
    // The same request, greedy, through chat completions at the limit: the same reply.
    let c = post(
        &s,
        "/v1/chat/completions",
        &json!({"max_tokens": 20, "messages": [user], "temperature": 0}),
    );
    assert_eq!(chat_said(&c).text, anthropic_said(&a).text);
    let (st, b) = send(
        &s,
        "POST",
        "/v1/chat/completions",
        &[JSON],
        &json!({"max_tokens": 32000, "messages": [user]}).to_string(),
    );
    assert!(refused("openai", st, &b, 400).contains("limit"));
    // A prompt that leaves less room than the limit gets what it leaves (the demo's context is
    // 512 tokens).
    let d2 = tool_model();
    let s2 = start(d2.path(), &["--max-tokens-limit", "512"]);
    let long = "Tell me of Elizabeth and of Darcy. ".repeat(50);
    let a = post(
        &s2,
        "/v1/messages",
        &json!({"max_tokens": 32000, "temperature": 0,
        "messages": [{"role": "user", "content": long}]}),
    );
    let (i, o) = (
        a["usage"]["input_tokens"].as_u64().unwrap(),
        a["usage"]["output_tokens"].as_u64().unwrap(),
    );
    assert!(i > 100 && i + o <= 512, "{a}");
}

/// Ollama's users post with `curl -d`, a form's content type: taken when no browser sent it.
#[test]
fn ollamas_api_takes_curls_form_type_but_not_a_browsers() {
    let d = tool_model();
    let s = start(d.path(), &[]);
    let body =
        json!({"model": "m", "stream": false, "prompt": "Hi", "options": {"num_predict": 2}})
            .to_string();
    let form = ("content-type", "application/x-www-form-urlencoded");
    let (st, b) = send(&s, "POST", "/api/generate", &[form], &body);
    assert_eq!(st, 200, "{b}");
    let (st, b) = send(
        &s,
        "POST",
        "/api/generate",
        &[form, ("origin", "http://evil.example")],
        &body,
    );
    refused("ollama", st, &b, 415);
    // The other dialects take JSON alone, as before.
    let (st, b) = send(
        &s,
        "POST",
        "/v1/messages",
        &[form],
        &json!({"max_tokens": 2,
        "messages": [{"role": "user", "content": "Hi"}]})
        .to_string(),
    );
    refused("anthropic", st, &b, 415);
}

#[test]
fn ollamas_catalogue_and_generate_read_as_its_clients_expect() {
    let d = tool_model();
    let s = start(d.path(), &[]);
    let (st, b) = send(&s, "GET", "/api/tags", &[], "");
    assert_eq!(st, 200);
    let tags: Value = serde_json::from_str(&b).unwrap();
    let m = &tags["models"][0];
    let name = m["name"].as_str().unwrap();
    assert!(
        m["size"].as_u64().unwrap() > 0 && m["details"]["family"].is_string(),
        "{m}"
    );
    let show = post(&s, "/api/show", &json!({"model": name}));
    assert!(show["template"].as_str().unwrap().contains("<tool_call>"));
    assert_eq!(show["capabilities"], json!(["completion", "tools"]));
    let v: Value = serde_json::from_str(&send(&s, "GET", "/api/version", &[], "").1).unwrap();
    assert!(v["version"].is_string());
    // An empty prompt loads the model and generates nothing.
    let g = post(&s, "/api/generate", &json!({"model": name, "prompt": ""}));
    assert_eq!(
        (g["done"].clone(), g["done_reason"].clone()),
        (json!(true), json!("load"))
    );
    // A raw prompt is what /v1/completions gives for it.
    let g = post(
        &s,
        "/api/generate",
        &json!({"model": name, "prompt": "Once upon", "raw": true,
        "stream": false, "options": {"num_predict": 6, "temperature": 0}}),
    );
    let c = post(
        &s,
        "/v1/completions",
        &json!({"prompt": "Once upon", "max_tokens": 6, "temperature": 0}),
    );
    assert_eq!(g["response"], c["choices"][0]["text"]);
    assert_eq!(g["eval_count"], 6);
    for k in ["total_duration", "prompt_eval_duration", "eval_duration"] {
        assert!(g[k].as_u64().unwrap() > 0, "{k}: {g}");
    }
    // Its context, given back, continues the text: the same as the raw prompt of both.
    let ctx = g["context"].as_array().unwrap().clone();
    let more = post(
        &s,
        "/api/generate",
        &json!({"model": name, "prompt": " there", "raw": true,
        "stream": false, "context": ctx, "options": {"num_predict": 4, "temperature": 0}}),
    );
    let both = post(
        &s,
        "/v1/completions",
        &json!({"prompt": format!("Once upon{} there",
        g["response"].as_str().unwrap()), "max_tokens": 4, "temperature": 0}),
    );
    assert_eq!(more["response"], both["choices"][0]["text"], "{more}");
}

#[test]
fn a_public_host_without_a_key_warns_and_an_empty_key_is_refused() {
    let d = tool_model();
    let serve_says = |env_key: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
        c.args([
            "serve",
            "--model",
            d.path().to_str().unwrap(),
            "--port",
            "0",
            "--host",
            "0.0.0.0",
        ])
        .env_remove("SLUICE_API_KEY")
        .stderr(Stdio::piped())
        .stdout(Stdio::null());
        if let Some(k) = env_key {
            c.env("SLUICE_API_KEY", k);
        }
        let mut child = c.spawn().unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut said = String::new();
        loop {
            let mut line = String::new();
            if err.read_line(&mut line).unwrap() == 0 || line.contains("serving") {
                said.push_str(&line);
                break;
            }
            said.push_str(&line);
        }
        let _ = child.kill();
        let _ = child.wait();
        said
    };
    let open = serve_says(None);
    assert!(
        open.contains("warning") && open.contains("--api-key"),
        "{open}"
    );
    let keyed = serve_says(Some("sekrit"));
    assert!(
        !keyed.contains("warning") && keyed.contains("serving"),
        "{keyed}"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "serve",
            "--model",
            d.path().to_str().unwrap(),
            "--port",
            "0",
            "--api-key",
            " ",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("--api-key") && e.lines().count() == 1, "{e}");
}

/// The official `anthropic` Python client (tests/clients/anthropic_client.py).
#[test]
fn the_official_anthropic_client_works_unchanged() {
    python_client(
        "the_official_anthropic_client_works_unchanged",
        "anthropic_client.py",
        "anthropic, pydantic",
        &["--api-key", "sekrit"],
        |s| vec![url(s, ""), "sekrit".into()],
    );
}

/// The official `openai` client's Responses API (tests/clients/responses_client.py).
#[test]
fn the_openai_clients_responses_api_works_unchanged() {
    python_client(
        "the_openai_clients_responses_api_works_unchanged",
        "responses_client.py",
        "openai, pydantic",
        &["--api-key", "sekrit"],
        |s| vec![url(s, "/v1"), "sekrit".into()],
    );
}

/// The official `ollama` Python client (tests/clients/ollama_client.py).
#[test]
fn the_official_ollama_client_works_unchanged() {
    python_client(
        "the_official_ollama_client_works_unchanged",
        "ollama_client.py",
        "ollama, pydantic",
        &["--api-key", "sekrit"],
        |s| vec![url(s, ""), "sekrit".into()],
    );
}
