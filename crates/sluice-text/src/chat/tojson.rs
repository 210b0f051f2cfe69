//! The `tojson` filter as transformers defines it: Python's `json.dumps`, not Jinja's
//! HTML-safe one.

use std::fmt::Write as _;

use minijinja::ErrorKind;
use minijinja::value::{Kwargs, Rest, ValueKind};

use super::JValue;
use super::python::py_float;

/// transformers' `tojson`: Python's `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`; arguments by position or by name, in that order.
pub(super) fn tojson(
    value: JValue,
    args: Rest<JValue>,
    kwargs: Kwargs,
) -> Result<String, minijinja::Error> {
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
        ValueKind::String if opt[1].as_str().is_some_and(|s| s.len() > 64) => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                "tojson: an indent of more than 64 characters",
            ));
        }
        ValueKind::String => Some(opt[1].as_str().unwrap_or_default().to_owned()),
        ValueKind::Number => {
            // An indent is at most 64 spaces: each line of the output carries it per level.
            let n = opt[1].as_i64().unwrap_or(0).max(0);
            if n > 64 {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: an indent of more than 64 spaces",
                ));
            }
            Some(" ".repeat(n as usize))
        }
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
