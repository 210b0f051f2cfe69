//! Unit tests of the parent module.

use super::*;

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
        let back = Readback {
            calls: Some(crate::toolcall::Calls::Syntax(
                crate::toolcall::Syntax::Hermes,
            )),
            ..Default::default()
        };
        let r = rt
            .block_on(tool_reply(
                &engine,
                rx,
                1,
                back,
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
