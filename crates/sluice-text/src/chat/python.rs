//! The Python semantics chat templates expect from Jinja2: Python's whitespace in the string
//! methods (`strip`, `split`, ...), the rest of Python's methods through minijinja-contrib's
//! `pycompat`, and printing as Python's `str()` and `repr()` print.

use std::fmt::Write as _;

use minijinja::value::ValueKind;
use minijinja::{ErrorKind, State};

use super::JValue;

/// Python's `str.isspace`.
pub(super) fn py_space(c: char) -> bool {
    crate::tiktoken::py_isspace(c)
}

/// String methods whose whitespace must be Python's, then minijinja-contrib's `pycompat`.
pub(super) fn python_method(
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
    super::limits::check_method(value, method, args)?;
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Jinja's `trim`: Python's `str.strip(chars)`.
pub(super) fn py_trim(s: String, chars: Option<String>) -> String {
    match chars {
        Some(c) => s.trim_matches(|x| c.contains(x)).to_owned(),
        None => s.trim_matches(py_space).to_owned(),
    }
}

/// Prints values as Python's `str()` would, counting what it writes against the render's
/// limit ([`super::limits`]).
pub(super) fn python_formatter(
    out: &mut minijinja::Output<'_>,
    state: &State<'_, '_>,
    value: &JValue,
) -> Result<(), minijinja::Error> {
    let written = match value.kind() {
        ValueKind::String => value.as_str().map_or(0, str::len),
        ValueKind::Undefined | ValueKind::None => 4,
        _ => py_str(value).len(),
    };
    super::limits::charge_written(written)?;
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
pub(super) fn py_str(v: &JValue) -> String {
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
pub(super) fn py_float(f: f64, json: bool) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
