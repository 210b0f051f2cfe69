//! Unit tests of the parent module.

use super::*;

#[test]
fn thinking_is_split_off_at_its_end() {
    assert_eq!(
        split_thinking("<think>\nweigh it\n</think>\n\nYes."),
        (Some("weigh it".into()), "Yes.".into())
    );
    assert_eq!(
        split_thinking("weigh it</think>Yes."),
        (Some("weigh it".into()), "Yes.".into())
    );
    assert_eq!(split_thinking("Yes."), (None, "Yes.".into()));
}

/// Streams `text` split at `cuts` through an [`Unfold`]; what was sent, and whether it is
/// what the whole reply reads back as (its reasoning; its content, with the rest).
fn unfold(text: &str, cuts: &[usize], back: &Readback) -> (Vec<Part>, bool) {
    let mut bounds: Vec<usize> = cuts
        .iter()
        .map(|&c| c % (text.len() + 1))
        .filter(|&c| text.is_char_boundary(c))
        .collect();
    bounds.extend([0, text.len()]);
    bounds.sort_unstable();
    bounds.dedup();
    let mut u = Unfold::new(back);
    let mut parts = Vec::new();
    for w in bounds.windows(2) {
        parts.extend(u.push(&text[w[0]..w[1]]));
    }
    let (reasoning, content, calls) = read_back(text, back);
    let r = Reply {
        content,
        reasoning,
        calls,
        finish: FinishReason::Eos,
        stop: None,
    };
    let sent: String = parts
        .iter()
        .filter_map(|p| match p {
            Part::Text(t) => Some(t.as_str()),
            Part::Reasoning(_) => None,
        })
        .collect();
    let reasoning: Vec<&Part> = parts
        .iter()
        .filter(|p| matches!(p, Part::Reasoning(_)))
        .collect();
    let same_reasoning = match (&r.reasoning, u.reasoning_sent()) {
        (Some(t), true) => reasoning == [&Part::Reasoning(t.clone())],
        (_, false) => reasoning.is_empty(),
        (None, true) => false,
    };
    let whole = format!("{sent}{}", u.rest(&r));
    (
        parts,
        same_reasoning && whole == r.content && r.content.starts_with(&sent),
    )
}

fn hermes() -> Readback {
    Readback {
        calls: Some(Calls::Syntax(crate::toolcall::Syntax::Hermes)),
        ..Default::default()
    }
}

#[test]
fn a_stream_sends_text_before_a_call_and_keeps_the_call() {
    let text = "  Let me look.\n<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
    let every: Vec<usize> = (0..text.len()).collect();
    let (parts, same) = unfold(text, &every, &hermes());
    assert!(same);
    let sent: String = parts
        .iter()
        .map(|p| match p {
            Part::Text(t) => t.as_str(),
            Part::Reasoning(_) => "",
        })
        .collect();
    assert_eq!(sent, "Let me look.");
    // A thinking model's reasoning goes out whole once closed, then its text.
    let back = Readback {
        think: true,
        ..hermes()
    };
    let (parts, same) = unfold("<think>hmm</think>\n\nYes, this.", &every, &back);
    assert!(same);
    assert_eq!(parts[0], Part::Reasoning("hmm".into()));
    // The text as it came, a part per character (the space held until a word follows).
    let texts: Vec<&Part> = parts[1..].iter().collect();
    assert_eq!(texts.len(), "Yes, this.".len() - 1, "{parts:?}");
    assert_eq!(texts[4], &Part::Text(" t".into()));
}

proptest::proptest! {
    /// Whatever the reply and however its tokens split it, a stream sends the start of
    /// what the whole reply reads back as, and never a call's text.
    #[test]
    fn a_stream_sends_only_the_start_of_the_whole_reply(
        pieces in proptest::collection::vec(proptest::sample::select(vec![
            "Hi", " there", "\n", "  ", "<tool_call>", "</tool_call>", "<tool", "_call>",
            "{\"name\": \"f\", \"arguments\": {\"x\": 1}}", "<think>", "</think>",
            "</th", "ink>", "é", "[TOOL_CALLS]", "<", ">",
        ]), 0..12),
        cuts in proptest::collection::vec(0usize..200, 0..12),
        think in proptest::bool::ANY,
        tools in proptest::bool::ANY,
    ) {
        let text: String = pieces.concat();
        let back = Readback {
            calls: tools.then_some(Calls::Syntax(crate::toolcall::Syntax::Hermes)),
            think,
            ..Default::default()
        };
        let (parts, same) = unfold(&text, &cuts, &back);
        proptest::prop_assert!(same, "{text:?} {parts:?}");
        for p in &parts {
            if let Part::Text(t) = p {
                proptest::prop_assert!(!(tools && t.contains("<tool_call>")), "{text:?} {parts:?}");
            }
        }
    }
}

#[test]
fn errors_take_each_dialects_shape() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let body = |d: Dialect, s: StatusCode| -> Value {
        let r = ApiError(s, "nope".into()).into_dialect(d);
        assert_eq!(r.status(), s);
        let b = rt
            .block_on(axum::body::to_bytes(r.into_body(), 1 << 20))
            .unwrap();
        serde_json::from_slice(&b).unwrap()
    };
    let a = body(Dialect::Anthropic, StatusCode::UNAUTHORIZED);
    assert_eq!(a["type"], "error");
    assert_eq!(a["error"]["type"], "authentication_error");
    assert_eq!(a["error"]["message"], "nope");
    assert_eq!(
        body(Dialect::Anthropic, StatusCode::PAYLOAD_TOO_LARGE)["error"]["type"],
        "request_too_large"
    );
    assert_eq!(
        body(Dialect::OpenAi, StatusCode::BAD_REQUEST)["error"]["type"],
        "invalid_request_error"
    );
    assert_eq!(
        body(Dialect::OpenAi, StatusCode::INTERNAL_SERVER_ERROR)["error"]["type"],
        "server_error"
    );
    assert_eq!(
        body(Dialect::Ollama, StatusCode::BAD_REQUEST),
        json!({"error": "nope"})
    );
    assert_eq!(
        Dialect::of_path("/v1/messages/count_tokens"),
        Dialect::Anthropic
    );
    assert_eq!(Dialect::of_path("/api/chat"), Dialect::Ollama);
    assert_eq!(Dialect::of_path("/v1/responses"), Dialect::OpenAi);
}
