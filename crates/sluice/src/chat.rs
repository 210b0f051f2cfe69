//! Chat templates: the Jinja `chat_template` of `tokenizer_config.json` (or `chat_template.jinja`),
//! rendered with minijinja the way transformers' `apply_chat_template(tokenize=False)` renders it
//! with Jinja2.
//!
//! What transformers sets up, and sluice copies:
//! - `trim_blocks` and `lstrip_blocks` on, the final newline of the template dropped, `break` and
//!   `continue` in loops;
//! - the variables `messages`, `tools` and `documents` (none unless given),
//!   `add_generation_prompt`, and every named special token the config sets (`bos_token`,
//!   `eos_token`, `unk_token`, `sep_token`, `pad_token`, `cls_token`, `mask_token`; a token given
//!   as an `AddedToken` dict counts by its `content`); message keys whose value is null are
//!   dropped, as transformers drops them;
//! - the globals `raise_exception(msg)` (rendering fails with `msg`) and `strftime_now(format)`
//!   (the time now, in UTC: sluice does not read the local time zone);
//! - a `tojson` filter that is Python's `json.dumps(x, ensure_ascii=False, indent=None,
//!   separators=None, sort_keys=False)`, not Jinja's HTML-safe one;
//! - Python's string, list and dict methods (`strip`, `split`, `startswith`, `items`, `get`,
//!   ...; minijinja-contrib's `pycompat`, with `strip`/`lstrip`/`rstrip`/`split`/`trim` using
//!   Python's idea of whitespace);
//! - printing as Python's `str()`: `None`, `True`, `False`, `[1, 'a']`, `{'k': 'v'}`, `5.0`.
//!
//! Dict keys keep their insertion order. Known differences that no template seen so far relies
//! on: the `~` operator and the `join` filter print `none`/`true` the minijinja way, and a
//! namespace accepts attribute names starting with `_`.
//!
//! `tests/tokenizers.rs` compares renders of the DeepSeek-V3, Qwen2.5-style, Mixtral and a
//! feature-heavy template against transformers' output.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{ErrorKind, State};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::Error;

type JValue = minijinja::Value;

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` (or any role the template knows).
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// The named special tokens transformers passes to every chat template, in its order.
const SPECIAL_TOKEN_NAMES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// A compiled chat template with the special tokens it refers to.
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    special_tokens: Vec<(String, String)>,
    path: PathBuf,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChatTemplate({})", self.path.display())
    }
}

/// A token field of tokenizer_config.json: a string or an `AddedToken` dict `{"content": ...}`.
fn token_str(v: Option<&Json>) -> Option<String> {
    match v {
        Some(Json::String(s)) => Some(s.clone()),
        Some(Json::Object(o)) => o.get("content").and_then(Json::as_str).map(str::to_owned),
        _ => None,
    }
}

impl ChatTemplate {
    /// Reads the template of a model directory (`chat_template.jinja`, else the
    /// `chat_template` of `tokenizer_config.json`) with the special tokens the config names.
    /// `Ok(None)` when there is no template.
    pub fn from_dir(dir: &Path) -> Result<Option<ChatTemplate>, Error> {
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg = if sluice_format::file::present(&cfg_path) {
            Some(sluice_format::read_json(
                &cfg_path,
                crate::tokenizer::MAX_SMALL_FILE_LEN,
            )?)
        } else {
            None
        };
        let jinja = dir.join("chat_template.jinja");
        let (source, path) = if sluice_format::file::present(&jinja) {
            let bytes =
                sluice_format::file::read_capped(&jinja, crate::tokenizer::MAX_SMALL_FILE_LEN)?;
            let s = String::from_utf8(bytes).map_err(|_| Error::Template {
                path: jinja.clone(),
                msg: "not valid UTF-8".into(),
            })?;
            (s, jinja)
        } else {
            let Some(t) = cfg.as_ref().and_then(|c| c.get("chat_template")) else {
                return Ok(None);
            };
            let s = match t {
                Json::String(s) => s.clone(),
                // A list of named templates: take "default".
                Json::Array(a) => a
                    .iter()
                    .find(|x| x.get("name").and_then(Json::as_str) == Some("default"))
                    .and_then(|x| x.get("template"))
                    .and_then(Json::as_str)
                    .ok_or_else(|| Error::Template {
                        path: cfg_path.clone(),
                        msg: "no template named `default`".into(),
                    })?
                    .to_owned(),
                _ => {
                    return Err(Error::Template {
                        path: cfg_path,
                        msg: "`chat_template` is not a string".into(),
                    });
                }
            };
            (s, cfg_path)
        };
        let special_tokens = SPECIAL_TOKEN_NAMES
            .iter()
            .filter_map(|name| {
                token_str(cfg.as_ref().and_then(|c| c.get(*name))).map(|v| (name.to_string(), v))
            })
            .collect();
        ChatTemplate::with_special_tokens(&source, special_tokens, path).map(Some)
    }

    /// Compiles a template that knows `bos_token` and `eos_token` (an empty string leaves the
    /// variable undefined, as transformers leaves a token the config does not set).
    pub fn new(
        source: &str,
        bos_token: String,
        eos_token: String,
        path: PathBuf,
    ) -> Result<ChatTemplate, Error> {
        let tokens = [("bos_token", bos_token), ("eos_token", eos_token)]
            .into_iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        ChatTemplate::with_special_tokens(source, tokens, path)
    }

    /// Compiles a template that knows the given special-token variables (`("bos_token",
    /// "<s>")`, ...).
    pub fn with_special_tokens(
        source: &str,
        special_tokens: Vec<(String, String)>,
        path: PathBuf,
    ) -> Result<ChatTemplate, Error> {
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(python_method);
        env.set_formatter(python_formatter);
        env.add_filter("tojson", tojson);
        env.add_filter("trim", py_trim);
        env.add_filter("string", |v: JValue| py_str(&v));
        env.add_function("raise_exception", |msg: String| -> Result<String, _> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |format: String| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            strftime(&format, now)
        });
        env.add_template_owned("chat", source.to_owned())
            .map_err(|e| Error::Template {
                path: path.clone(),
                msg: e.to_string(),
            })?;
        Ok(ChatTemplate {
            env,
            special_tokens,
            path,
        })
    }

    /// The special-token variables the template sees.
    pub fn special_tokens(&self) -> &[(String, String)] {
        &self.special_tokens
    }

    /// Renders messages; `add_generation_prompt` opens the assistant's turn.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        self.render_with(messages, add_generation_prompt, &())
    }

    /// Renders any serialisable list of messages (objects with `role`, `content` and whatever
    /// else the template reads, such as `tool_calls`) with extra template variables: `kwargs`
    /// serialises to a map (or to nothing, `()`), like the keyword arguments of
    /// `apply_chat_template`; `tools` and `documents` among them set those variables, and the
    /// rest override special tokens of the same name.
    pub fn render_with<M, K>(
        &self,
        messages: &M,
        add_generation_prompt: bool,
        kwargs: &K,
    ) -> Result<String, Error>
    where
        M: Serialize + ?Sized,
        K: Serialize + ?Sized,
    {
        let err = |e: minijinja::Error| Error::Template {
            path: self.path.clone(),
            msg: error_text(&e),
        };
        let mut ctx: Vec<(String, JValue)> = self
            .special_tokens
            .iter()
            .map(|(k, v)| (k.clone(), JValue::from(v.as_str())))
            .collect();
        ctx.push(("tools".into(), JValue::from(())));
        ctx.push(("documents".into(), JValue::from(())));
        let kwargs = JValue::from_serialize(kwargs);
        match kwargs.kind() {
            ValueKind::Map => {
                for k in kwargs.try_iter().map_err(err)? {
                    let v = kwargs.get_item(&k).map_err(err)?;
                    let k = k.as_str().unwrap_or_default().to_owned();
                    ctx.retain(|(name, _)| *name != k);
                    ctx.push((k, v));
                }
            }
            ValueKind::None | ValueKind::Undefined => {}
            _ => {
                return Err(Error::Template {
                    path: self.path.clone(),
                    msg: "template arguments must be a map".into(),
                });
            }
        }
        ctx.retain(|(name, _)| name != "messages" && name != "add_generation_prompt");
        ctx.push((
            "messages".into(),
            drop_null_keys(JValue::from_serialize(messages)),
        ));
        ctx.push((
            "add_generation_prompt".into(),
            JValue::from(add_generation_prompt),
        ));
        let t = self.env.get_template("chat").map_err(err)?;
        t.render(JValue::from_iter(ctx)).map_err(err)
    }
}

/// The message of an error with its causes.
fn error_text(e: &minijinja::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(c) = src {
        let _ = write!(s, ": {c}");
        src = c.source();
    }
    s
}

/// Messages with their null-valued keys removed, as transformers removes them.
fn drop_null_keys(messages: JValue) -> JValue {
    let Ok(items) = messages.try_iter() else {
        return messages;
    };
    if messages.kind() != ValueKind::Seq {
        return messages;
    }
    JValue::from(
        items
            .map(|m| {
                if m.kind() != ValueKind::Map {
                    return m;
                }
                let Ok(keys) = m.try_iter() else {
                    return m;
                };
                JValue::from_iter(keys.filter_map(|k| {
                    let v = m.get_item(&k).ok()?;
                    (!v.is_none()).then_some((k, v))
                }))
            })
            .collect::<Vec<_>>(),
    )
}

// ---------------------------------------------------------------------------------------------
// Python semantics

/// Python's `str.isspace`.
fn py_space(c: char) -> bool {
    crate::tiktoken::py_isspace(c)
}

/// String methods whose whitespace must be Python's, then minijinja-contrib's `pycompat`.
fn python_method(
    state: &State<'_, '_>,
    value: &JValue,
    method: &str,
    args: &[JValue],
) -> Result<JValue, minijinja::Error> {
    if let Some(s) = value.as_str()
        && args.is_empty()
    {
        match method {
            "strip" => return Ok(JValue::from(s.trim_matches(py_space))),
            "lstrip" => return Ok(JValue::from(s.trim_start_matches(py_space))),
            "rstrip" => return Ok(JValue::from(s.trim_end_matches(py_space))),
            "split" => {
                return Ok(JValue::from(
                    s.split(py_space)
                        .filter(|p| !p.is_empty())
                        .map(JValue::from)
                        .collect::<Vec<_>>(),
                ));
            }
            "isspace" => {
                return Ok(JValue::from(!s.is_empty() && s.chars().all(py_space)));
            }
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Jinja's `trim`: Python's `str.strip(chars)`.
fn py_trim(s: String, chars: Option<String>) -> String {
    match chars {
        Some(c) => s.trim_matches(|x| c.contains(x)).to_owned(),
        None => s.trim_matches(py_space).to_owned(),
    }
}

/// Prints values as Python's `str()` would.
fn python_formatter(
    out: &mut minijinja::Output<'_>,
    state: &State<'_, '_>,
    value: &JValue,
) -> Result<(), minijinja::Error> {
    match value.kind() {
        ValueKind::None | ValueKind::Bool | ValueKind::Seq | ValueKind::Map => out
            .write_str(&py_str(value))
            .map_err(|e| minijinja::Error::new(ErrorKind::WriteFailure, e.to_string())),
        ValueKind::Number if !value.is_integer() => out
            .write_str(&py_str(value))
            .map_err(|e| minijinja::Error::new(ErrorKind::WriteFailure, e.to_string())),
        _ => minijinja::escape_formatter(out, state, value),
    }
}

/// Python's `str(x)`.
fn py_str(v: &JValue) -> String {
    match v.kind() {
        ValueKind::String => v.as_str().unwrap_or_default().to_owned(),
        ValueKind::Undefined => String::new(),
        _ => {
            let mut s = String::new();
            py_repr(v, &mut s);
            s
        }
    }
}

/// Python's `repr(x)` for the JSON-like values templates see.
fn py_repr(v: &JValue, out: &mut String) {
    match v.kind() {
        ValueKind::None | ValueKind::Undefined => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                out.push_str(&py_float(
                    f64::try_from(v.clone()).unwrap_or(f64::NAN),
                    false,
                ));
            }
        }
        ValueKind::String => py_str_repr(v.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            if let Ok(it) = v.try_iter() {
                for (i, x) in it.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(&x, out);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(it) = v.try_iter() {
                for (i, k) in it.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(&k, out);
                    out.push_str(": ");
                    py_repr(&v.get_item(&k).unwrap_or_default(), out);
                }
            }
            out.push('}');
        }
        _ => out.push_str(&v.to_string()),
    }
}

/// Python's `repr(str)`: single quotes unless the text has `'` and no `"`.
fn py_str_repr(s: &str, out: &mut String) {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if !py_printable(c) => {
                let n = c as u32;
                let _ = if n < 0x100 {
                    write!(out, "\\x{n:02x}")
                } else if n < 0x10000 {
                    write!(out, "\\u{n:04x}")
                } else {
                    write!(out, "\\U{n:08x}")
                };
            }
            c => out.push(c),
        }
    }
    out.push(q);
}

/// An approximation of Python's `str.isprintable` for one character: controls, separators
/// other than the space, and the common format characters are not printable.
fn py_printable(c: char) -> bool {
    !(c.is_control()
        || (c != ' ' && py_space(c))
        || matches!(c, '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{2060}'..='\u{2064}' | '\u{feff}'))
}

/// Python's `repr(float)` (`json` spells the non-finite ones `NaN`, `Infinity`).
fn py_float(f: f64, json: bool) -> String {
    if f.is_nan() {
        return if json { "NaN" } else { "nan" }.into();
    }
    if f.is_infinite() {
        let s = if json { "Infinity" } else { "inf" };
        return if f < 0.0 { format!("-{s}") } else { s.into() };
    }
    // Shortest round-trip digits, as Python's repr uses.
    let sci = format!("{:e}", f.abs());
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    let sign = if f.is_sign_negative() { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let point = exp + 1;
        let body = if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point as usize >= digits.len() {
            format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
        } else {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        };
        format!("{sign}{body}")
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        let es = if exp < 0 { '-' } else { '+' };
        format!("{sign}{m}e{es}{:02}", exp.abs())
    }
}

/// transformers' `tojson`: Python's `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`; arguments by position or by name, in that order.
fn tojson(value: JValue, args: Rest<JValue>, kwargs: Kwargs) -> Result<String, minijinja::Error> {
    let names = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > names.len() {
        return Err(minijinja::Error::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most 4 arguments",
        ));
    }
    let mut opt: [JValue; 4] = Default::default();
    for (i, a) in args.iter().enumerate() {
        opt[i] = a.clone();
    }
    for (i, n) in names.iter().enumerate() {
        if let Some(v) = kwargs.get::<Option<JValue>>(n)? {
            opt[i] = v;
        }
    }
    kwargs.assert_all_used()?;
    let ensure_ascii = opt[0].is_true();
    let indent: Option<String> = match opt[1].kind() {
        ValueKind::None | ValueKind::Undefined => None,
        ValueKind::String => Some(opt[1].as_str().unwrap_or_default().to_owned()),
        ValueKind::Number => Some(" ".repeat(opt[1].as_i64().unwrap_or(0).max(0) as usize)),
        _ => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                "tojson: indent must be an integer or a string",
            ));
        }
    };
    let (item_sep, key_sep) = match opt[2].kind() {
        ValueKind::None | ValueKind::Undefined => (
            if indent.is_some() { "," } else { ", " }.to_owned(),
            ": ".to_owned(),
        ),
        _ => {
            let items: Vec<JValue> = opt[2].try_iter()?.collect();
            match (
                items.first().and_then(JValue::as_str),
                items.get(1).and_then(JValue::as_str),
            ) {
                (Some(a), Some(b)) if items.len() == 2 => (a.to_owned(), b.to_owned()),
                _ => {
                    return Err(minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ));
                }
            }
        }
    };
    let j = JsonWriter {
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys: opt[3].is_true(),
    };
    let mut out = String::new();
    j.write(&value, 0, &mut out)?;
    Ok(out)
}

struct JsonWriter {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl JsonWriter {
    fn newline(&self, level: usize, out: &mut String) {
        if let Some(ind) = &self.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    }

    fn write(&self, v: &JValue, level: usize, out: &mut String) -> Result<(), minijinja::Error> {
        match v.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => {
                if v.is_integer() {
                    out.push_str(&v.to_string());
                } else {
                    out.push_str(&py_float(f64::try_from(v.clone())?, true));
                }
            }
            ValueKind::String => self.string(v.as_str().unwrap_or_default(), out),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<JValue> = v.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, x) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(level + 1, out);
                    self.write(x, level + 1, out)?;
                }
                self.newline(level, out);
                out.push(']');
            }
            ValueKind::Map => {
                let mut items: Vec<(String, JValue)> = Vec::new();
                for k in v.try_iter()? {
                    let val = v.get_item(&k)?;
                    items.push((self.key(&k)?, val));
                }
                if self.sort_keys {
                    items.sort_by(|a, b| a.0.cmp(&b.0));
                }
                if items.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                out.push('{');
                for (i, (k, x)) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(level + 1, out);
                    self.string(k, out);
                    out.push_str(&self.key_sep);
                    self.write(x, level + 1, out)?;
                }
                self.newline(level, out);
                out.push('}');
            }
            k => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("Object of type {k} is not JSON serializable"),
                ));
            }
        }
        Ok(())
    }

    /// A dict key as `json.dumps` turns it into a string.
    fn key(&self, k: &JValue) -> Result<String, minijinja::Error> {
        Ok(match k.kind() {
            ValueKind::String => k.as_str().unwrap_or_default().to_owned(),
            ValueKind::None => "null".into(),
            ValueKind::Bool => if k.is_true() { "true" } else { "false" }.into(),
            ValueKind::Number if k.is_integer() => k.to_string(),
            ValueKind::Number => py_float(f64::try_from(k.clone())?, true),
            other => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("keys must be str, int, float, bool or None, not {other}"),
                ));
            }
        })
    }

    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut buf = [0u16; 2];
                    for u in c.encode_utf16(&mut buf) {
                        let _ = write!(out, "\\u{u:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// C `strftime` over a UTC instant (seconds since the epoch), for the directives chat
/// templates use: `%a %A %b %B %h %d %e %j %m %y %Y %H %I %M %S %p %u %w %F %D %T %R %Z %z
/// %n %t %%`, and glibc's `%-d`-style flag that drops padding. Others are copied through.
fn strftime(format: &str, unix: i64) -> String {
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let (h, mi, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let d = doy_mar - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(m - 1) as usize] + d + i64::from(leap && m > 2);
    let wday = (days + 3).rem_euclid(7); // 0 = Monday
    let mut out = String::new();
    let mut it = format.chars().peekable();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let nopad = it.peek() == Some(&'-');
        if nopad {
            it.next();
        }
        let Some(dir) = it.next() else {
            out.push('%');
            break;
        };
        let num = |out: &mut String, v: i64, width: usize, pad: char| {
            if nopad {
                let _ = write!(out, "{v}");
            } else if pad == ' ' {
                let _ = write!(out, "{v:>width$}");
            } else {
                let _ = write!(out, "{v:0width$}");
            }
        };
        match dir {
            'a' => out.push_str(&DAYS[wday as usize][..3]),
            'A' => out.push_str(DAYS[wday as usize]),
            'b' | 'h' => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            'B' => out.push_str(MONTHS[(m - 1) as usize]),
            'd' => num(&mut out, d, 2, '0'),
            'e' => num(&mut out, d, 2, ' '),
            'j' => num(&mut out, yday, 3, '0'),
            'm' => num(&mut out, m, 2, '0'),
            'y' => num(&mut out, y.rem_euclid(100), 2, '0'),
            'Y' => {
                let _ = write!(out, "{y}");
            }
            'H' => num(&mut out, h, 2, '0'),
            'I' => num(&mut out, (h + 11) % 12 + 1, 2, '0'),
            'M' => num(&mut out, mi, 2, '0'),
            'S' => num(&mut out, s, 2, '0'),
            'p' => out.push_str(if h < 12 { "AM" } else { "PM" }),
            'u' => num(&mut out, wday + 1, 1, '0'),
            'w' => num(&mut out, (wday + 1) % 7, 1, '0'),
            'F' => {
                let _ = write!(out, "{y}-{m:02}-{d:02}");
            }
            'D' => {
                let _ = write!(out, "{m:02}/{d:02}/{:02}", y.rem_euclid(100));
            }
            'T' => {
                let _ = write!(out, "{h:02}:{mi:02}:{s:02}");
            }
            'R' => {
                let _ = write!(out, "{h:02}:{mi:02}");
            }
            'Z' => out.push_str("UTC"),
            'z' => out.push_str("+0000"),
            'n' => out.push('\n'),
            't' => out.push('\t'),
            '%' => out.push('%'),
            other => {
                out.push('%');
                if nopad {
                    out.push('-');
                }
                out.push(other);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_chatml_template() {
        let src = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let t = ChatTemplate::new(src, "<s>".into(), "</s>".into(), "t".into()).unwrap();
        let out = t
            .render(
                &[
                    Message::new("system", "Be brief."),
                    Message::new("user", " Hi "),
                ],
                true,
            )
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn raise_exception_is_an_error() {
        let src = "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok";
        let t = ChatTemplate::new(src, String::new(), String::new(), "t".into()).unwrap();
        let e = t
            .render(&[Message::new("assistant", "x")], false)
            .unwrap_err();
        assert!(e.to_string().contains("first must be user"), "{e}");
        assert_eq!(t.render(&[Message::new("user", "x")], false).unwrap(), "ok");
    }

    #[test]
    fn python_methods_work() {
        let src = "{{ messages[0].content.strip().startswith('a') }}";
        let t = ChatTemplate::new(src, String::new(), String::new(), "t".into()).unwrap();
        assert_eq!(
            t.render(&[Message::new("user", "  abc ")], false).unwrap(),
            "True"
        );
    }

    #[test]
    fn kwargs_reach_the_template_and_nulls_are_dropped() {
        let src = "{{ date_string }}|{{ bos_token }}|{{ tools | tojson }}|{{ messages[0].tool_calls is defined }}|{{ messages[0].name }}";
        let t = ChatTemplate::new(src, "<s>".into(), String::new(), "t".into()).unwrap();
        let msgs =
            serde_json::json!([{"role": "user", "content": "x", "tool_calls": null, "name": "n"}]);
        let kw = serde_json::json!({"date_string": "26 Jul 2024", "bos_token": "<B>", "tools": [{"a": 1}]});
        assert_eq!(
            t.render_with(&msgs, false, &kw).unwrap(),
            "26 Jul 2024|<B>|[{\"a\": 1}]|False|n"
        );
    }

    #[test]
    fn float_repr_matches_python() {
        for (f, s) in [
            (0.1, "0.1"),
            (3.0, "3.0"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1e-7, "1e-07"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5, "-2.5"),
            (-0.0, "-0.0"),
            (1.5e300, "1.5e+300"),
            (123456789.125, "123456789.125"),
        ] {
            assert_eq!(py_float(f, false), s, "{f}");
        }
    }

    #[test]
    fn strftime_matches_python() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../testdata/tokenizers/strftime.json"
        );
        let cases: Vec<serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert!(!cases.is_empty());
        for c in cases {
            let unix = c["unix"].as_i64().unwrap();
            let fmt = c["format"].as_str().unwrap();
            assert_eq!(
                strftime(fmt, unix),
                c["text"].as_str().unwrap(),
                "{fmt} at {unix}"
            );
        }
    }
}
