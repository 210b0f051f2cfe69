//! Unit tests of the parent module.

use super::*;

#[test]
fn chat_messages_and_options_become_a_turn() {
    let v = json!({
        "model": "llama3.2", "stream": false, "think": "high", "format": "json",
        "keep_alive": "5m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "sunny", "tool_name": "get_weather"}
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
        "options": {"num_predict": 32, "temperature": 0.5, "top_k": 7, "seed": 3,
                    "repeat_penalty": 1.2, "repeat_last_n": 64, "stop": ["\n\n"],
                    "num_ctx": 8192, "num_thread": 4}
    });
    let p = parse_chat(&v).unwrap();
    let t = p.turn.unwrap();
    assert!(!p.stream);
    assert_eq!(t.thinking, Some(true));
    assert!(matches!(t.format, Some(crate::Grammar::JsonObject)));
    assert_eq!(
        t.messages[2]["tool_calls"][0]["function"]["arguments"],
        r#"{"city":"Paris"}"#
    );
    let id = t.messages[2]["tool_calls"][0]["id"].clone();
    assert_eq!(t.messages[3]["tool_call_id"], id);
    assert_eq!(t.messages[3]["name"], "get_weather");
    assert_eq!(p.sampling.max_tokens, Some(32));
    assert_eq!(p.sampling.top_k, Some(7));
    assert_eq!(p.sampling.seed, Some(3));
    assert_eq!(p.sampling.repetition_penalty, Some(1.2));
    assert_eq!(p.sampling.penalty_last_n, Some(64));
    assert_eq!(p.sampling.stop, vec!["\n\n".to_owned()]);
    // Streaming is the default; no messages only loads the model.
    let p = parse_chat(&json!({"model": "m"})).unwrap();
    assert!(p.stream && p.turn.is_none());
}

#[test]
fn generate_takes_a_system_a_raw_prompt_and_a_context() {
    let p = parse_generate(
        &json!({"prompt": "Hi", "system": "Be brief.", "context": [1, 2],
        "options": {"num_predict": -1}}),
    )
    .unwrap();
    let Some(GenPrompt::Turn(t)) = p.prompt else {
        panic!("a templated prompt")
    };
    assert_eq!(t.messages.len(), 2);
    assert_eq!(p.context, vec![1, 2]);
    assert_eq!(p.sampling.max_tokens, None);
    let p = parse_generate(&json!({"prompt": "Hi", "raw": true})).unwrap();
    assert!(matches!(p.prompt, Some(GenPrompt::Raw(ref s, None)) if s == "Hi"));
    let p = parse_generate(&json!({"prompt": "Hi", "raw": true, "format": "json"})).unwrap();
    assert!(matches!(
        p.prompt,
        Some(GenPrompt::Raw(_, Some(crate::Grammar::JsonObject)))
    ));
    assert!(
        parse_generate(&json!({"prompt": ""}))
            .unwrap()
            .prompt
            .is_none()
    );
}

#[test]
fn bad_requests_name_the_field() {
    for (v, says) in [
        (json!({"messages": "hi"}), "`messages`"),
        (
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            "wizard",
        ),
        (
            json!({"messages": [{"role": "user", "content": 5}]}),
            "content",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}),
            "images",
        ),
        (
            json!({"messages": [{"role": "tool", "content": "x"}]}),
            "no earlier tool call",
        ),
        (
            json!({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]},
                             {"role": "tool", "content": "x", "tool_name": "g"}]}),
            "`g`",
        ),
        (
            json!({"messages": [], "options": {"temperature": "hot"}}),
            "options.temperature",
        ),
        (
            json!({"messages": [], "options": {"top_k": -1}}),
            "options.top_k",
        ),
        (json!({"messages": [], "options": 3}), "`options`"),
        (json!({"messages": [], "format": 3}), "`format`"),
        (json!({"messages": [], "think": "very"}), "`think`"),
        (json!({"messages": [], "stream": "yes"}), "`stream`"),
        (
            json!({"messages": [], "tools": [{"type": "function"}]}),
            "tools[0]",
        ),
        (json!([1]), "object"),
    ] {
        let e = parse_chat(&v).err().unwrap_or_else(|| panic!("{v}"));
        assert_eq!(e.0, axum::http::StatusCode::BAD_REQUEST);
        assert!(e.1.contains(says), "{v}: {}", e.1);
    }
    for (v, says) in [
        (json!({"prompt": 5}), "`prompt`"),
        (
            json!({"prompt": "x", "template": "{{ .Prompt }}"}),
            "`template`",
        ),
        (json!({"prompt": "x", "suffix": "y"}), "`suffix`"),
        (json!({"prompt": "x", "context": [-1]}), "`context`"),
        (json!({"prompt": "x", "images": ["aGk="]}), "images"),
    ] {
        let e = parse_generate(&v).err().unwrap_or_else(|| panic!("{v}"));
        assert!(e.1.contains(says), "{v}: {}", e.1);
    }
}
