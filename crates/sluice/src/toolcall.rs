//! Tool calls in a model's output: which syntax a model writes them in (read from its chat
//! template), and the parse of a finished generation into plain content and calls.
//!
//! The syntaxes of the families sluice runs:
//! - [`Syntax::Hermes`] (Qwen2.5/Qwen3, Hermes, MiniMax-M2's templates that use it):
//!   `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, any number.
//! - [`Syntax::Glm`] (GLM-4.5/4.6): `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…
//!   </tool_call>`, each value JSON when it parses as JSON, else a string.
//! - [`Syntax::Mistral`]: `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]`, or the newer
//!   `[TOOL_CALLS]NAME[ARGS]{…}` per call.
//! - [`Syntax::DeepSeek`] (DeepSeek-V3/R1 and V3.1):
//!   `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{…}\n```
//!   <｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`, or V3.1's `…<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}
//!   <｜tool▁call▁end｜>`.
//! - [`Syntax::Kimi`] (Kimi K2): `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
//!   <|tool_call_argument_begin|>{…}<|tool_call_end|>…<|tool_calls_section_end|>`.
//! - [`Syntax::Harmony`] (GPT-OSS): `<|channel|>commentary to=functions.NAME <|constrain|>json
//!   <|message|>{…}<|call|>`, the answer in `<|channel|>final<|message|>…`.
//!
//! A call whose arguments are not a JSON object, or a syntax left unclosed, is not a call: the
//! whole text comes back as content, so a malformed call is an answer, never a server error.
//! (One exception, as in vLLM: a last Hermes `<tool_call>` left open is a call when the JSON
//! after it is whole — a model may end right after its JSON.)

use serde_json::Value;

/// A tool-call syntax.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syntax {
    /// `<tool_call>{json}</tool_call>`.
    Hermes,
    /// GLM's `<tool_call>name<arg_key>…</arg_key><arg_value>…</arg_value></tool_call>`.
    Glm,
    /// `[TOOL_CALLS]…`.
    Mistral,
    /// DeepSeek's `<｜tool▁call▁begin｜>` tokens.
    DeepSeek,
    /// Kimi K2's `<|tool_call_begin|>` tokens.
    Kimi,
    /// GPT-OSS's harmony channels.
    Harmony,
}

/// One parsed call.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// The function's name.
    pub name: String,
    /// Its arguments, a JSON object written as a string (OpenAI's `function.arguments`).
    pub arguments: String,
}

/// A generation split into what is said and what is called.
#[derive(Clone, Debug, PartialEq)]
pub struct Parsed {
    /// The text outside the calls (trimmed), or the whole text when there are none.
    pub content: String,
    /// The calls, in order.
    pub calls: Vec<ToolCall>,
}

const DS_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const DS_CALLS_END: &str = "<｜tool▁calls▁end｜>";
const DS_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const DS_CALL_END: &str = "<｜tool▁call▁end｜>";
const DS_SEP: &str = "<｜tool▁sep｜>";
const KIMI_BEGIN: &str = "<|tool_calls_section_begin|>";
const KIMI_END: &str = "<|tool_calls_section_end|>";
const KIMI_CALL: &str = "<|tool_call_begin|>";
const KIMI_ARGS: &str = "<|tool_call_argument_begin|>";
const KIMI_CALL_END: &str = "<|tool_call_end|>";

impl Syntax {
    /// The syntax a chat template teaches, from the markers it writes (`None`: it renders no
    /// tool calls that sluice knows).
    pub fn of_template(source: &str) -> Option<Syntax> {
        if source.contains(DS_CALL_BEGIN) {
            Some(Syntax::DeepSeek)
        } else if source.contains(KIMI_CALL) {
            Some(Syntax::Kimi)
        } else if source.contains("[TOOL_CALLS]") {
            Some(Syntax::Mistral)
        } else if source.contains("<|call|>") || source.contains("<|channel|>") {
            Some(Syntax::Harmony)
        } else if source.contains("<tool_call>") && source.contains("<arg_key>") {
            Some(Syntax::Glm)
        } else if source.contains("<tool_call>") {
            Some(Syntax::Hermes)
        } else {
            None
        }
    }

    /// The marker a call (or the calls' section) opens with, before which a reply is plain
    /// content — what a stream may send before the reply is whole. `None` for harmony, whose
    /// answer is itself in a channel.
    pub fn opener(self) -> Option<&'static str> {
        match self {
            Syntax::Hermes | Syntax::Glm => Some("<tool_call>"),
            Syntax::Mistral => Some("[TOOL_CALLS]"),
            Syntax::DeepSeek => Some(DS_CALLS_BEGIN),
            Syntax::Kimi => Some(KIMI_BEGIN),
            Syntax::Harmony => None,
        }
    }

    /// Splits a finished generation into content and calls (see the module doc).
    pub fn parse(self, text: &str) -> Parsed {
        let calls = match self {
            Syntax::Hermes => hermes(text),
            Syntax::Glm => glm(text),
            Syntax::Mistral => mistral(text),
            Syntax::DeepSeek => deepseek(text),
            Syntax::Kimi => kimi(text),
            Syntax::Harmony => return harmony(text),
        };
        match calls {
            Some((content, calls)) if !calls.is_empty() => Parsed {
                content: content.trim().to_owned(),
                calls,
            },
            _ => Parsed {
                content: text.to_owned(),
                calls: Vec::new(),
            },
        }
    }
}

/// How a reply's calls are read back.
#[derive(Clone, Debug, PartialEq)]
pub enum Calls {
    /// In the model's own syntax (`tool_choice: auto`).
    Syntax(Syntax),
    /// A grammar forced a call of this function: the output is its arguments object
    /// ([`forced_schema`]).
    Named(String),
    /// A grammar forced one or more calls (`tool_choice: required`): the output is a JSON array
    /// of `{"name": …, "arguments": {…}}` ([`forced_schema`]).
    Required,
}

impl Calls {
    /// Splits a finished generation into content and calls. A forced output that does not
    /// parse (cut short by `max_tokens`) comes back as content.
    pub fn parse(&self, text: &str) -> Parsed {
        let plain = || Parsed {
            content: text.to_owned(),
            calls: Vec::new(),
        };
        match self {
            Calls::Syntax(s) => s.parse(text),
            Calls::Named(name) => match serde_json::from_str::<Value>(text)
                .ok()
                .as_ref()
                .and_then(args)
            {
                Some(arguments) => Parsed {
                    content: String::new(),
                    calls: vec![ToolCall {
                        name: name.clone(),
                        arguments,
                    }],
                },
                None => plain(),
            },
            Calls::Required => {
                let calls = match serde_json::from_str::<Value>(text) {
                    Ok(Value::Array(v)) if !v.is_empty() => {
                        v.iter().map(call_of).collect::<Option<Vec<_>>>()
                    }
                    _ => None,
                };
                match calls {
                    Some(calls) => Parsed {
                        content: String::new(),
                        calls,
                    },
                    None => plain(),
                }
            }
        }
    }
}

/// A function tool's name and parameter schema (an object without properties when it gives
/// none), from OpenAI's `{"type": "function", "function": {"name", "parameters", …}}`.
fn function_of(tool: &Value) -> Result<(&str, Value), String> {
    let f = tool
        .get("function")
        .filter(|_| tool.get("type").and_then(Value::as_str) == Some("function"))
        .ok_or("`tools`: each tool must be {\"type\": \"function\", \"function\": {…}}")?;
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .ok_or("`tools`: a function has no `name`")?;
    let params = f.get("parameters").cloned().unwrap_or_else(
        || serde_json::json!({"type": "object", "properties": {}, "additionalProperties": false}),
    );
    Ok((name, params))
}

/// The JSON schema a forced call's output follows, and how to read it back: for a named
/// function its parameters (the output is the arguments object); for `required`, an array of
/// `{"name": const, "arguments": parameters}` objects, one of each tool's (at most one item
/// when `parallel` is false). The same output shape vLLM's forced calls use: it needs nothing
/// from the model's own call syntax, so it works for every model.
pub fn forced_schema(
    tools: &[Value],
    named: Option<&str>,
    parallel: bool,
) -> Result<(Value, Calls), String> {
    let fns = tools
        .iter()
        .map(function_of)
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(want) = named {
        let (name, params) = fns
            .into_iter()
            .find(|(n, _)| *n == want)
            .ok_or_else(|| format!("`tool_choice` names `{want}`, which is not in `tools`"))?;
        return Ok((params, Calls::Named(name.to_owned())));
    }
    if fns.is_empty() {
        return Err("`tool_choice: required` needs `tools`".into());
    }
    // Each tool's parameters move under `$defs/tool{i}` of the combined schema, their local
    // references (`#/$defs/Loc`, pydantic's nested models, or `#` itself) rewritten to point
    // there: nested under `anyOf` as they are, they would point at the combined root.
    let mut defs = serde_json::Map::new();
    let items: Vec<Value> = fns
        .into_iter()
        .enumerate()
        .map(|(i, (name, mut params))| {
            let at = format!("#/$defs/tool{i}");
            rebase_refs(&mut params, &at);
            defs.insert(format!("tool{i}"), params);
            serde_json::json!({
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": {"$ref": at}},
                "required": ["name", "arguments"],
                "additionalProperties": false
            })
        })
        .collect();
    let mut schema = serde_json::json!({"$defs": defs, "type": "array", "items": {"anyOf": items}, "minItems": 1});
    if !parallel {
        schema["maxItems"] = serde_json::json!(1);
    }
    Ok((schema, Calls::Required))
}

/// Rewrites every local `$ref` in `schema` (`#`, `#/…`) to the same place under `at`.
fn rebase_refs(schema: &mut Value, at: &str) {
    match schema {
        Value::Object(m) => {
            for (k, v) in m.iter_mut() {
                match v {
                    Value::String(r) if k == "$ref" && r.starts_with('#') => {
                        *r = format!("{at}{}", &r[1..]);
                    }
                    v => rebase_refs(v, at),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|v| rebase_refs(v, at)),
        _ => {}
    }
}

/// `arguments` as OpenAI writes it: an object, compact.
fn args(v: &Value) -> Option<String> {
    v.is_object().then(|| v.to_string())
}

/// A call from `{"name": …, "arguments": {…}}` (`parameters` accepted for `arguments`).
fn call_of(v: &Value) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.to_owned();
    let a = v
        .get("arguments")
        .or_else(|| v.get("parameters"))
        .cloned()
        .unwrap_or_else(|| Value::Object(Default::default()));
    // Some models write the arguments as a JSON string.
    let a = match a {
        Value::String(s) => serde_json::from_str(&s).ok()?,
        a => a,
    };
    Some(ToolCall {
        name,
        arguments: args(&a)?,
    })
}

/// The pieces between `open` and `close`, and the text outside them; `None` if one is unclosed.
fn blocks<'t>(text: &'t str, open: &str, close: &str) -> Option<(String, Vec<&'t str>)> {
    let (mut outside, mut inside) = (String::new(), Vec::new());
    let mut rest = text;
    while let Some(i) = rest.find(open) {
        outside.push_str(&rest[..i]);
        let after = &rest[i + open.len()..];
        let j = after.find(close)?;
        inside.push(&after[..j]);
        rest = &after[j + close.len()..];
    }
    outside.push_str(rest);
    Some((outside, inside))
}

fn hermes(text: &str) -> Option<(String, Vec<ToolCall>)> {
    const OPEN: &str = "<tool_call>";
    const CLOSE: &str = "</tool_call>";
    // A last call left open counts when its JSON is whole (a model may end right after it, as
    // vLLM's parser allows): everything before it must parse as closed calls and text.
    let ((outside, mut inside), last) = match blocks(text, OPEN, CLOSE) {
        Some(b) => (b, None),
        None => {
            let i = text.rfind(OPEN)?;
            (
                blocks(&text[..i], OPEN, CLOSE)?,
                Some(&text[i + OPEN.len()..]),
            )
        }
    };
    inside.extend(last);
    let calls = inside
        .iter()
        .map(|b| call_of(&serde_json::from_str(b.trim()).ok()?))
        .collect::<Option<Vec<_>>>()?;
    Some((outside, calls))
}

fn glm(text: &str) -> Option<(String, Vec<ToolCall>)> {
    let (outside, inside) = blocks(text, "<tool_call>", "</tool_call>")?;
    let mut calls = Vec::new();
    for b in inside {
        let (name, mut rest) = match b.find("<arg_key>") {
            Some(i) => (b[..i].trim(), &b[i..]),
            None => (b.trim(), ""),
        };
        if name.is_empty() {
            return None;
        }
        let mut obj = serde_json::Map::new();
        while let Some(i) = rest.find("<arg_key>") {
            let r = &rest[i + "<arg_key>".len()..];
            let j = r.find("</arg_key>")?;
            let key = r[..j].trim().to_owned();
            let r = &r[j + "</arg_key>".len()..];
            let k = r.find("<arg_value>")?;
            let r = &r[k + "<arg_value>".len()..];
            let m = r.find("</arg_value>")?;
            let raw = &r[..m];
            let value =
                serde_json::from_str(raw.trim()).unwrap_or_else(|_| Value::String(raw.to_owned()));
            obj.insert(key, value);
            rest = &r[m + "</arg_value>".len()..];
        }
        calls.push(ToolCall {
            name: name.to_owned(),
            arguments: Value::Object(obj).to_string(),
        });
    }
    Some((outside, calls))
}

fn mistral(text: &str) -> Option<(String, Vec<ToolCall>)> {
    let i = text.find("[TOOL_CALLS]")?;
    let content = text[..i].to_owned();
    let rest = &text[i + "[TOOL_CALLS]".len()..];
    let trimmed = rest.trim_start();
    if trimmed.starts_with('[') {
        // v3: one JSON list of calls.
        let mut de = serde_json::Deserializer::from_str(trimmed).into_iter::<Value>();
        let list = de.next()?.ok()?;
        let calls = list
            .as_array()?
            .iter()
            .map(call_of)
            .collect::<Option<Vec<_>>>()?;
        return Some((content, calls));
    }
    // Newer: NAME[ARGS]{…}, repeated after further [TOOL_CALLS].
    let mut calls = Vec::new();
    for part in rest.split("[TOOL_CALLS]") {
        let (name, a) = part.split_once("[ARGS]")?;
        let mut de = serde_json::Deserializer::from_str(a.trim()).into_iter::<Value>();
        let v = de.next()?.ok()?;
        calls.push(ToolCall {
            name: name.trim().to_owned(),
            arguments: args(&v)?,
        });
    }
    Some((content, calls))
}

fn deepseek(text: &str) -> Option<(String, Vec<ToolCall>)> {
    let i = text.find(DS_CALLS_BEGIN)?;
    let content = text[..i].to_owned();
    let section = &text[i + DS_CALLS_BEGIN.len()..];
    let section = &section[..section.find(DS_CALLS_END)?];
    let (_, inside) = blocks(section, DS_CALL_BEGIN, DS_CALL_END)?;
    let mut calls = Vec::new();
    for b in inside {
        let (head, tail) = b.split_once(DS_SEP)?;
        let (name, body) = if head.trim() == "function" {
            // V3: function<sep>NAME\n```json\n{…}\n```
            let (name, body) = tail.split_once('\n')?;
            let body = body.trim();
            let body = body.strip_prefix("```json").unwrap_or(body);
            let body = body.strip_suffix("```").unwrap_or(body);
            (name.trim(), body.trim())
        } else {
            // V3.1: NAME<sep>{…}
            (head.trim(), tail.trim())
        };
        let v: Value = serde_json::from_str(body).ok()?;
        calls.push(ToolCall {
            name: name.to_owned(),
            arguments: args(&v)?,
        });
    }
    Some((content, calls))
}

fn kimi(text: &str) -> Option<(String, Vec<ToolCall>)> {
    let i = text.find(KIMI_BEGIN)?;
    let content = text[..i].to_owned();
    let section = &text[i + KIMI_BEGIN.len()..];
    let section = &section[..section.find(KIMI_END)?];
    let (_, inside) = blocks(section, KIMI_CALL, KIMI_CALL_END)?;
    let mut calls = Vec::new();
    for b in inside {
        let (id, a) = b.split_once(KIMI_ARGS)?;
        // `functions.NAME:IDX`
        let id = id.trim();
        let name = id.strip_prefix("functions.").unwrap_or(id);
        let name = name.rsplit_once(':').map_or(name, |(n, _)| n);
        let v: Value = serde_json::from_str(a.trim()).ok()?;
        calls.push(ToolCall {
            name: name.to_owned(),
            arguments: args(&v)?,
        });
    }
    Some((content, calls))
}

/// Harmony: each message is `<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>json]<|message|>BODY`
/// ending at `<|end|>`, `<|call|>`, `<|return|>` or the next `<|start|>`; calls are the
/// messages to `functions.NAME`, the content the `final` channel's (else everything outside
/// the calls).
fn harmony(text: &str) -> Parsed {
    let whole = || Parsed {
        content: text.to_owned(),
        calls: Vec::new(),
    };
    let mut calls = Vec::new();
    let mut finals = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("<|channel|>") {
        let after = &rest[i + "<|channel|>".len()..];
        let Some(m) = after.find("<|message|>") else {
            return whole();
        };
        let header = &after[..m];
        let body_start = &after[m + "<|message|>".len()..];
        let end = ["<|end|>", "<|call|>", "<|return|>", "<|start|>"]
            .iter()
            .filter_map(|e| body_start.find(e))
            .min()
            .unwrap_or(body_start.len());
        let body = &body_start[..end];
        rest = &body_start[end..];
        let channel = header.split_whitespace().next().unwrap_or("");
        if let Some(to) = header
            .split_whitespace()
            .find_map(|w| w.strip_prefix("to=functions."))
        {
            match serde_json::from_str::<Value>(body.trim())
                .ok()
                .and_then(|v| args(&v))
            {
                Some(a) => calls.push(ToolCall {
                    name: to.to_owned(),
                    arguments: a,
                }),
                None => return whole(),
            }
        } else if channel == "final" {
            finals.push_str(body);
        }
    }
    if calls.is_empty() && finals.is_empty() {
        return whole();
    }
    Parsed {
        content: finals.trim().to_owned(),
        calls,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    /// Issue 59: `tool_choice: "required"` nested each tool's parameters under `anyOf`, so
    /// pydantic's `#/$defs/Loc` pointed at the combined root: "Pointer '/$defs/Loc' does not
    /// exist". Two tools with different models of the same name each keep their own.
    #[test]
    fn required_keeps_each_tools_defs_apart() {
        let tool = |name: &str, loc: Value| {
            serde_json::json!({"type": "function", "function": {"name": name, "parameters": {
                "$defs": {"Loc": loc},
                "type": "object",
                "properties": {"at": {"$ref": "#/$defs/Loc"}, "again": {"$ref": "#"}},
                "required": ["at"]
            }}})
        };
        let tools = [
            tool(
                "a",
                serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
            ),
            tool("b", serde_json::json!({"type": "integer"})),
        ];
        let (schema, _) = forced_schema(&tools, None, true).unwrap();
        let at = |p: &str| schema.pointer(p).cloned().unwrap_or(Value::Null);
        assert_eq!(
            at("/$defs/tool0/properties/at/$ref"),
            "#/$defs/tool0/$defs/Loc"
        );
        assert_eq!(at("/$defs/tool0/properties/again/$ref"), "#/$defs/tool0");
        assert_eq!(
            at("/$defs/tool1/properties/at/$ref"),
            "#/$defs/tool1/$defs/Loc"
        );
        assert_eq!(at("/$defs/tool1/$defs/Loc/type"), "integer");
        // It compiles, and the search finishes it with tool `a`'s call, its city required.
        let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        tokens.push(b"<eos>".to_vec());
        let mut special = vec![false; 257];
        special[256] = true;
        let v =
            sluice_grammar::Vocab::new(&sluice_text::VocabBytes { tokens, special }, &[256], 257)
                .unwrap();
        let c = v.compile(&crate::Grammar::JsonSchema(schema)).unwrap();
        let smallest = r#"[{"name": "a", "arguments": {"at": {"city": ""}}}]"#;
        assert_eq!(c.smallest(), Some(smallest.len()));
    }

    #[test]
    fn each_template_is_recognised_by_its_markers() {
        for (src, want) in [
            (
                "{{'<tool_call>\\n'}}{{ tool | tojson }}",
                Some(Syntax::Hermes),
            ),
            (
                "<tool_call>{{ name }}<arg_key>{{ k }}</arg_key>",
                Some(Syntax::Glm),
            ),
            ("[TOOL_CALLS]{{ calls }}", Some(Syntax::Mistral)),
            (
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>",
                Some(Syntax::DeepSeek),
            ),
            (
                "<|tool_calls_section_begin|><|tool_call_begin|>",
                Some(Syntax::Kimi),
            ),
            (
                "<|start|>assistant<|channel|>final<|message|>",
                Some(Syntax::Harmony),
            ),
            ("{% for m in messages %}{{ m.content }}{% endfor %}", None),
        ] {
            assert_eq!(Syntax::of_template(src), want, "{src}");
        }
    }

    #[test]
    fn hermes_calls_and_the_text_around_them() {
        let out = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let p = Syntax::Hermes.parse(out);
        assert_eq!(p.content, "Let me check.");
        assert_eq!(
            p.calls,
            vec![
                one("get_weather", r#"{"city":"Paris","days":2}"#),
                one("now", "{}")
            ]
        );
        // Arguments written as a JSON string are accepted.
        let p = Syntax::Hermes
            .parse(r#"<tool_call>{"name": "f", "arguments": "{\"x\": 1}"}</tool_call>"#);
        assert_eq!(p.calls, vec![one("f", r#"{"x":1}"#)]);
        // A last call left open counts when its JSON is whole; a half-written one does not.
        let p = Syntax::Hermes.parse(
            "Sure.<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"y\": 2}}\n",
        );
        assert_eq!(p.content, "Sure.");
        assert_eq!(p.calls, vec![one("a", "{}"), one("b", r#"{"y":2}"#)]);
        let half = "<tool_call>{\"name\": \"b\", \"arguments\": {\"y\"";
        assert_eq!(Syntax::Hermes.parse(half).calls, vec![]);
        assert_eq!(Syntax::Hermes.parse(half).content, half);
    }

    #[test]
    fn glm_calls_with_typed_and_string_values() {
        let out = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>";
        let p = Syntax::Glm.parse(out);
        assert_eq!(p.content, "");
        assert_eq!(
            p.calls,
            vec![one("get_weather", r#"{"city":"Beijing","days":3}"#)]
        );
    }

    #[test]
    fn mistral_both_forms() {
        let v3 = r#"[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "neg", "arguments": {"x": 5}}]"#;
        assert_eq!(
            Syntax::Mistral.parse(v3).calls,
            vec![one("add", r#"{"a":1,"b":2}"#), one("neg", r#"{"x":5}"#)]
        );
        let v11 = r#"[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}[TOOL_CALLS]neg[ARGS]{"x": 5}"#;
        assert_eq!(
            Syntax::Mistral.parse(v11).calls,
            vec![one("add", r#"{"a":1,"b":2}"#), one("neg", r#"{"x":5}"#)]
        );
    }

    #[test]
    fn deepseek_v3_and_v3_1() {
        let v3 = "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Hangzhou\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        let p = Syntax::DeepSeek.parse(v3);
        assert_eq!(p.content, "Sure.");
        assert_eq!(p.calls, vec![one("get_weather", r#"{"city":"Hangzhou"}"#)]);
        let v31 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Hangzhou\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>now<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        assert_eq!(
            Syntax::DeepSeek.parse(v31).calls,
            vec![
                one("get_weather", r#"{"city":"Hangzhou"}"#),
                one("now", "{}")
            ]
        );
    }

    #[test]
    fn kimi_k2() {
        let out = "I'll look.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Beijing\"}<|tool_call_end|><|tool_calls_section_end|>";
        let p = Syntax::Kimi.parse(out);
        assert_eq!(p.content, "I'll look.");
        assert_eq!(p.calls, vec![one("get_weather", r#"{"city":"Beijing"}"#)]);
    }

    #[test]
    fn harmony_calls_and_the_final_channel() {
        let call = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\": \"Tokyo\"}<|call|>";
        let p = Syntax::Harmony.parse(call);
        assert_eq!(p.calls, vec![one("get_weather", r#"{"location":"Tokyo"}"#)]);
        assert_eq!(p.content, "");
        let answer = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is 20 °C.<|return|>";
        let p = Syntax::Harmony.parse(answer);
        assert!(p.calls.is_empty());
        assert_eq!(p.content, "It is 20 °C.");
    }

    #[test]
    fn malformed_calls_are_plain_content() {
        for (s, out) in [
            (
                Syntax::Hermes,
                "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}",
            ),
            (Syntax::Hermes, "<tool_call>not json</tool_call>"),
            (Syntax::Hermes, "<tool_call>{\"arguments\": {}}</tool_call>"),
            (
                Syntax::Hermes,
                "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
            ),
            (
                Syntax::Glm,
                "<tool_call>f<arg_key>x</arg_key><arg_value>1</tool_call>",
            ),
            (Syntax::Mistral, "[TOOL_CALLS][{\"name\": \"f\""),
            (Syntax::Mistral, "[TOOL_CALLS]f{\"x\": 1}"),
            (
                Syntax::DeepSeek,
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{",
            ),
            (
                Syntax::Kimi,
                "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0{}",
            ),
            (
                Syntax::Harmony,
                "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{oops<|call|>",
            ),
            (Syntax::Hermes, "no call at all"),
        ] {
            let p = s.parse(out);
            assert!(p.calls.is_empty(), "{s:?} {out}");
            assert_eq!(p.content, out, "{s:?}");
        }
    }

    #[test]
    fn forced_outputs_read_back_as_calls_and_cut_ones_as_content() {
        let named = Calls::Named("get_weather".into());
        let p = named.parse(r#"{"city": "Paris", "days": 2}"#);
        assert_eq!(
            p.calls,
            vec![one("get_weather", r#"{"city":"Paris","days":2}"#)]
        );
        assert!(p.content.is_empty());
        // Cut short by max_tokens: not a call.
        let cut = r#"{"city": "Par"#;
        assert_eq!(named.parse(cut).calls, vec![]);
        assert_eq!(named.parse(cut).content, cut);
        let req = Calls::Required;
        let p =
            req.parse(r#"[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]"#);
        assert_eq!(p.calls, vec![one("a", "{}"), one("b", r#"{"x":1}"#)]);
        assert_eq!(req.parse("[]").calls, vec![]);
        assert_eq!(req.parse("{}").content, "{}");
    }

    #[test]
    fn forced_schemas_follow_the_tools() {
        let tools = vec![
            serde_json::json!({"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}),
            serde_json::json!({"type": "function", "function": {"name": "b"}}),
        ];
        let (s, c) = forced_schema(&tools, Some("a"), true).unwrap();
        assert_eq!(c, Calls::Named("a".into()));
        assert_eq!(s["properties"]["x"]["type"], "integer");
        let (s, c) = forced_schema(&tools, Some("b"), true).unwrap();
        assert_eq!(c, Calls::Named("b".into()));
        assert_eq!(
            s["additionalProperties"], false,
            "no parameters: an empty object"
        );
        let (s, c) = forced_schema(&tools, None, false).unwrap();
        assert_eq!(c, Calls::Required);
        assert_eq!(s["maxItems"], 1);
        assert_eq!(s["items"]["anyOf"][1]["properties"]["name"]["const"], "b");
        assert!(
            forced_schema(&tools, None, true)
                .unwrap()
                .0
                .get("maxItems")
                .is_none()
        );
        let e = forced_schema(&tools, Some("c"), true).unwrap_err();
        assert!(e.contains("`c`"), "{e}");
        assert!(forced_schema(&[], None, true).is_err());
        assert!(forced_schema(&[serde_json::json!({"type": "x"})], None, true).is_err());
    }
}
