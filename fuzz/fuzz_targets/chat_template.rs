//! Chat templates from testdata (DeepSeek-V3's real one, a ChatML one with tools in Qwen2.5's
//! form, and Mixtral's, which raises on roles that do not alternate) rendered with hostile
//! messages: any roles, any content (strings with template syntax and control tokens, null,
//! numbers, lists, objects), tool calls of any shape, any `tools`. Errors are fine; a panic is
//! not. Content is data, never template: when a render succeeds, a user message's text appears
//! in the output as written (ChatML and DeepSeek-V3 copy it verbatim).
//!
//! Input: byte 0 picks the template, byte 1 holds flags (bit 0: add_generation_prompt; bit 1:
//! the rest is JSON — a message list, or an object with `messages` and template arguments — as
//! seeded from testdata/tokenizers/chat/conversations.json; otherwise the rest drives
//! `arbitrary`).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::arbitrary::{self, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use sluice::{ChatTemplate, Message};
use sluice_fuzz::{arb_json, testdata};

const TEMPLATES: [&str; 3] = ["deepseek_v3", "qwen2_5", "mixtral"];

fn template(i: usize) -> &'static ChatTemplate {
    static CELLS: [OnceLock<ChatTemplate>; 3] = [const { OnceLock::new() }; 3];
    CELLS[i].get_or_init(|| {
        let dir = testdata().join("tokenizers/chat").join(TEMPLATES[i]);
        ChatTemplate::from_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .expect("a template")
    })
}

fn role(u: &mut Unstructured<'_>) -> arbitrary::Result<String> {
    Ok(match u.int_in_range(0..=5)? {
        0 => "system".into(),
        1 => "user".into(),
        2 | 3 => "assistant".into(),
        4 => "tool".into(),
        _ => u.arbitrary()?,
    })
}

fn tool_call(u: &mut Unstructured<'_>) -> arbitrary::Result<Value> {
    if u.ratio(1, 4)? {
        return arb_json(u, 3);
    }
    let args = if u.arbitrary()? {
        Value::String(u.arbitrary()?)
    } else {
        arb_json(u, 2)?
    };
    let f = json!({"name": u.arbitrary::<String>()?, "arguments": args});
    Ok(if u.arbitrary()? {
        json!({"type": "function", "function": f})
    } else {
        f
    })
}

/// Messages as JSON, and the same as plain (role, text) messages where content is a string.
fn messages(u: &mut Unstructured<'_>) -> arbitrary::Result<(Vec<Value>, Vec<Message>)> {
    let n = u.int_in_range(0..=6)?;
    let (mut js, mut plain) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let role = role(u)?;
        let content = match u.int_in_range(0..=5)? {
            0 => Value::Null,
            1 => arb_json(u, 3)?,
            _ => Value::String(u.arbitrary()?),
        };
        if let Value::String(s) = &content {
            plain.push(Message::new(role.clone(), s.clone()));
        }
        let mut m = json!({"role": role, "content": content});
        if u.ratio(1, 3)? {
            let k = u.int_in_range(0..=3)?;
            let calls = (0..k)
                .map(|_| tool_call(u))
                .collect::<arbitrary::Result<Vec<_>>>()?;
            m["tool_calls"] = Value::Array(calls);
        }
        if u.ratio(1, 8)? {
            m[u.arbitrary::<String>()?] = arb_json(u, 2)?;
        }
        js.push(m);
    }
    Ok((js, plain))
}

/// A successful render of plain messages shows each user message's text as written.
fn check_plain(i: usize, msgs: &[Message], agp: bool) {
    let Ok(out) = template(i).render(msgs, agp) else {
        return;
    };
    if TEMPLATES[i] != "mixtral" {
        for m in msgs.iter().filter(|m| m.role == "user") {
            assert!(
                out.contains(&m.content),
                "{:?} missing from {out:?}",
                m.content
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let [which, flags, rest @ ..] = data else {
        return;
    };
    let i = *which as usize % TEMPLATES.len();
    let agp = flags & 1 == 1;
    if flags & 2 == 2 {
        let Ok(v) = serde_json::from_slice::<Value>(rest) else {
            return;
        };
        let (msgs, kwargs) = match v {
            Value::Object(mut o) => {
                let m = o.remove("messages").unwrap_or(Value::Null);
                (m, Value::Object(o))
            }
            v => (v, Value::Null),
        };
        let _ = template(i).render_with(&msgs, agp, &kwargs);
        if let Ok(plain) = serde_json::from_value::<Vec<Message>>(msgs) {
            check_plain(i, &plain, agp);
        }
        return;
    }
    let mut u = Unstructured::new(rest);
    let Ok((js, plain)) = messages(&mut u) else {
        return;
    };
    let kwargs = match u.int_in_range(0..=3u8) {
        Ok(0) => arb_json(&mut u, 3).map(|t| json!({ "tools": [t] })),
        Ok(1) => arb_json(&mut u, 3).map(|v| json!({ "tools": v, "bos_token": v })),
        _ => Ok(Value::Null),
    }
    .unwrap_or(Value::Null);
    let _ = template(i).render_with(&js, agp, &kwargs);
    check_plain(i, &plain, agp);
});
