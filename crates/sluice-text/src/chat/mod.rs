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
//! The pieces: this module compiles and renders; `python` holds the Python semantics
//! (methods, `str()`, `repr()`), `tojson` the filter, `strftime` the clock's formatting.
//!
//! `tests/tokenizers.rs` compares renders of the DeepSeek-V3, Qwen2.5-style, Mixtral and a
//! feature-heavy template against transformers' output.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use minijinja::ErrorKind;
use minijinja::value::ValueKind;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::Error;

mod limits;
mod python;
mod strftime;
mod tojson;

pub use limits::RenderLimits;

use python::{py_str, py_trim, python_formatter, python_method};
use strftime::strftime;
use tojson::tojson;

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
    source: String,
    limits: RenderLimits,
}

/// How deep macros and recursive loops may nest while rendering (minijinja allows 500, more
/// than a thread's stack holds).
const RECURSION_LIMIT: usize = 200;

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
                crate::MAX_SMALL_FILE_LEN,
            )?)
        } else {
            None
        };
        let jinja = dir.join("chat_template.jinja");
        let (source, path) = if sluice_format::file::present(&jinja) {
            let bytes = sluice_format::file::read_capped(&jinja, crate::MAX_SMALL_FILE_LEN)?;
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

    /// Reads the chat template of a GGUF file, `tokenizer.chat_template`, with the special
    /// tokens transformers gives it for such a file: `bos_token`, `eos_token`, `unk_token` and
    /// `pad_token`, each the token string at the id `tokenizer.ggml.{bos,eos,unknown,padding}_token_id`
    /// names (a name without an id stays undefined). Named templates
    /// (`tokenizer.chat_template.<name>`, such as Command-R's `tool_use` and `rag`) are not
    /// read, as transformers does not read them: `Ok(None)` when the file has no template at
    /// all, an error naming the key when it has only named ones (as a `tokenizer_config.json`
    /// with a list of templates but no `default` is refused). A special-token id past the token
    /// list is refused, naming its key.
    pub fn from_gguf(
        meta: &sluice_format::gguf::Gguf,
        path: &Path,
    ) -> Result<Option<ChatTemplate>, Error> {
        use sluice_format::gguf::Value;
        const KEY: &str = "tokenizer.chat_template";
        let err = |msg: String| Error::Template {
            path: path.to_path_buf(),
            msg,
        };
        let source = match meta.value(KEY) {
            Some(Value::String(s)) => s,
            Some(v) => {
                return Err(err(format!(
                    "GGUF key `{KEY}` is {:?}, not a string",
                    v.value_type()
                )));
            }
            None => {
                let named: Vec<&str> = meta
                    .metadata
                    .iter()
                    .filter_map(|(k, _)| k.strip_prefix("tokenizer.chat_template."))
                    .collect();
                if named.is_empty() {
                    return Ok(None);
                }
                return Err(err(format!(
                    "GGUF key `{KEY}`: missing, and only named templates are given ({}); sluice reads the default one only",
                    named.join(", ")
                )));
            }
        };
        let special_tokens = crate::gguf::named_tokens(meta, path).map_err(|e| match e {
            Error::Tokenizer { path, msg } => Error::Template { path, msg },
            e => e,
        })?;
        ChatTemplate::with_special_tokens(source, special_tokens, path.to_path_buf()).map(Some)
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
        let limits = RenderLimits::default();
        env.set_fuel(Some(limits.fuel));
        env.set_recursion_limit(RECURSION_LIMIT);
        // The counting the rendered instructions call (see `limits`), and the filters whose
        // result can be far larger than their inputs, checked first.
        env.add_function(limits::BUILT, limits::built);
        env.add_function(limits::CALLED, limits::called);
        env.add_function(limits::WRITTEN, limits::written);
        env.add_function(limits::MUL, limits::mul);
        type Check = fn(&[JValue]) -> Result<(), minijinja::Error>;
        for (name, check, orig) in [
            (
                "replace",
                limits::filter_replace as Check,
                JValue::from_function(minijinja::filters::replace),
            ),
            (
                "join",
                limits::filter_join,
                JValue::from_function(minijinja::filters::join),
            ),
            (
                "indent",
                limits::filter_indent,
                JValue::from_function(minijinja::filters::indent),
            ),
            (
                "format",
                limits::filter_format,
                JValue::from_function(minijinja::filters::format),
            ),
            (
                "slice",
                limits::filter_slice,
                JValue::from_function(minijinja::filters::slice),
            ),
        ] {
            env.add_filter(
                name,
                move |state: &minijinja::State<'_, '_>,
                      args: minijinja::value::Rest<JValue>|
                      -> Result<JValue, minijinja::Error> {
                    check(&args)?;
                    orig.call(state, &args)
                },
            );
        }
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
        limits::check_source(source).map_err(|msg| Error::Template {
            path: path.clone(),
            msg,
        })?;
        env.add_template_owned("chat", source.to_owned())
            .map_err(|e| Error::Template {
                path: path.clone(),
                msg: e.to_string(),
            })?;
        Ok(ChatTemplate {
            env,
            special_tokens,
            path,
            source: source.to_owned(),
            limits,
        })
    }

    /// The same template under other limits (the engine sets the text written to the longest
    /// prompt its context can take).
    pub fn with_limits(mut self, limits: RenderLimits) -> ChatTemplate {
        self.env.set_fuel(Some(limits.fuel));
        self.limits = limits;
        self
    }

    /// The limits each render runs under.
    pub fn limits(&self) -> RenderLimits {
        self.limits
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
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
        let input = json_len(messages).saturating_add(json_len(kwargs));
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
        // An honest template writes about what it is given: its limits grow with the input,
        // so that a long conversation meets the context's limit, not the template's.
        let mut limits = self.limits;
        limits.output_bytes = limits
            .output_bytes
            .max(input.saturating_mul(2).saturating_add(64 << 10));
        limits.built_bytes = limits
            .built_bytes
            .max(limits.output_bytes.saturating_mul(8));
        let t = self.env.get_template("chat").map_err(err)?;
        let compiled = minijinja::machinery::get_compiled_template(&t);
        let instructions = limits::counted(&compiled.instructions);
        let blocks: std::collections::BTreeMap<_, _> = compiled
            .blocks
            .iter()
            .map(|(k, v)| (*k, limits::counted(v)))
            .collect();
        let mut out = String::new();
        limits::with_budget(limits, || {
            let mut o = minijinja::machinery::make_string_output(&mut out);
            minijinja::machinery::Vm::new(&self.env)
                .eval(
                    &instructions,
                    JValue::from_iter(ctx),
                    &blocks,
                    &mut o,
                    compiled.initial_auto_escape,
                )
                .map(drop)
        })
        .map_err(|e| match e.kind() {
            ErrorKind::OutOfFuel => Error::Template {
                path: self.path.clone(),
                msg: format!(
                    "rendering ran past its fuel of {} instructions (a loop that does not end?)",
                    limits.fuel
                ),
            },
            _ => err(e),
        })?;
        Ok(out)
    }
}

/// The length of a value as JSON (0 if it does not serialize).
fn json_len<T: Serialize + ?Sized>(v: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    match serde_json::to_writer(&mut c, v) {
        Ok(()) => c.0,
        Err(_) => 0,
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

    /// Renders `src` (one user message "hi") under `limits`; the error text when it fails.
    fn hostile(src: &str, limits: RenderLimits) -> Result<String, String> {
        let t = ChatTemplate::new(src, String::new(), String::new(), "t".into())
            .map_err(|e| e.to_string())?
            .with_limits(limits);
        t.render(&[Message::new("user", "hi")], true)
            .map_err(|e| e.to_string())
    }

    /// Issue 59: templates ran without limits. Each of these looped for ever, allocated until
    /// the process aborted, or wrote tens of megabytes; each is now refused in one line, and
    /// quickly.
    #[test]
    fn hostile_templates_are_refused_in_one_line() {
        let small = RenderLimits::for_prompt_bytes(8 << 10);
        for (src, says) in [
            // Nested loops: 10^10 iterations.
            (
                "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
                "fuel",
            ),
            // Doubling a string: 2^64 bytes.
            (
                "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
                "built more than",
            ),
            (
                "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
                "built more than",
            ),
            // Doubling through captures and lists.
            (
                "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set t %}{{ ns.s }}{{ ns.s }}{% endset %}{% set ns.s = t %}{% endfor %}",
                "wrote more than",
            ),
            (
                "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}",
                "built more than",
            ),
            // A macro calling itself twice: 2^25 calls.
            (
                "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(25) }}",
                "fuel",
            ),
            // Single operations far larger than their inputs.
            ("{{ 'x' * 100000000 }}", "constant expression"),
            ("{{ ('x' * 60000) ~ ('x' * 60000) }}", "constant expression"),
            ("{% set n = 100000000 %}{{ 'x' * n }}", "`*`"),
            ("{% set n = 1000000000 %}{{ ([1] * n) | join }}", "`*`"),
            (
                "{% set x = 'x' * 10000 %}{{ x | replace('', x) }}",
                "`replace`",
            ),
            (
                "{% set x = 'x' * 10000 %}{{ x.replace('', x) }}",
                "`replace`",
            ),
            ("{{ 'x' | indent(100000000) }}", "`indent`"),
            ("{{ '%100000000s' | format('a') }}", "`format`"),
            ("{{ '{:>100000000}'.format(1) }}", "`format`"),
            (
                "{% set s = 'ab' * 1000 %}{{ s.join(range(100000) | map('string')) }}",
                "`join`",
            ),
            ("{{ [1, 2] | slice(100000000) }}", "`slice`"),
            ("{{ messages | tojson(indent=100000000) }}", "indent"),
            // 56 MB of output from a tiny input, for a context holding 8 KiB.
            (
                "{% for i in range(100000) %}{{ 'x' * 560 }}{% endfor %}",
                "wrote more than",
            ),
            // A template too large to be one.
            (
                &*Box::leak(format!("{{# {} #}}", "x".repeat(2 << 20)).into_boxed_str()),
                "bytes; at most",
            ),
            (
                "{% for i in range(100000) %}xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx{% endfor %}",
                "wrote more than",
            ),
            // Recursion deeper than a thread's stack holds.
            (
                "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
                "recursion",
            ),
        ] {
            let t0 = std::time::Instant::now();
            // On a thread with the default 2 MiB stack of spawned threads.
            let e = std::thread::spawn(move || hostile(src, small))
                .join()
                .unwrap()
                .unwrap_err();
            assert!(e.contains(says), "{src}: {e}");
            assert!(!e.contains('\n'), "{e}");
            assert!(t0.elapsed().as_secs() < 30, "{src} took {:?}", t0.elapsed());
        }
    }

    /// The limits leave real templates alone, and grow with what a template is given.
    #[test]
    fn limits_leave_honest_templates_alone() {
        let small = RenderLimits::for_prompt_bytes(1 << 10);
        let echo = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}";
        let t = ChatTemplate::new(echo, String::new(), String::new(), "t".into())
            .unwrap()
            .with_limits(small);
        // Far more than the limit, but it is what the template was given.
        let long = "y".repeat(100_000);
        let out = t
            .render(&[Message::new("user", long.clone())], false)
            .unwrap();
        assert_eq!(out, format!("<|user|>{long}"));
        // Counting text built out of the input: the same template with a string built.
        let ok = "{% set ns = namespace(s='') %}{% for m in messages %}{% set ns.s = ns.s ~ m.content ~ '|' %}{% endfor %}{{ ns.s }}";
        let msgs: Vec<Message> = (0..200)
            .map(|i| Message::new("user", format!("m{i}")))
            .collect();
        let t = ChatTemplate::new(ok, String::new(), String::new(), "t".into())
            .unwrap()
            .with_limits(small);
        assert!(t.render(&msgs, false).unwrap().ends_with("m199|"));
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
}
