//! The shortest way to finish a JSON text, from any prefix of one, ignoring any schema.
//!
//! [`JsonPrefix`] follows the bytes written so far; [`JsonPrefix::suffix`] gives the fewest
//! bytes that complete them as JSON, written with the grammar's separators: close the string
//! (`"`), give a key its value (`: null`), complete a number (`0`) or a literal (`rue`), then
//! close every open object and array. It guides the constraint's search for a completion
//! through the grammar itself (which adds what a schema requires): the byte it would write is
//! tried first.

/// An open container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Frame {
    Object,
    Array,
}

/// Inside a string: the escape being read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Escape {
    None,
    /// After `\`.
    Backslash,
    /// After `\u` and this many hex digits.
    Unicode(u8),
}

/// Where in a number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Number {
    /// After `-`: a digit must follow.
    Minus,
    /// After a leading `0`.
    Zero,
    /// In the integer digits.
    Int,
    /// After `.`: a digit must follow.
    Dot,
    /// In the fraction digits.
    Frac,
    /// After `e`: a sign or digit must follow.
    Exp,
    /// After the exponent's sign: a digit must follow.
    ExpSign,
    /// In the exponent digits.
    ExpDigits,
}

impl Number {
    /// Whether the number may end here.
    fn complete(self) -> bool {
        matches!(
            self,
            Number::Zero | Number::Int | Number::Frac | Number::ExpDigits
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Before the top-level value.
    Start,
    /// A value must come (after `:`, or `,` in an array).
    Value,
    /// After `{`: a key or `}`.
    ObjectOpen,
    /// After `,` in an object: a key must come.
    Key,
    /// Inside a string (a key's, or a value's).
    Str { key: bool, escape: Escape },
    /// After a key: `:` must come.
    AfterKey,
    /// After `[`: a value or `]`.
    ArrayOpen,
    /// Inside a number.
    Num(Number),
    /// Inside `true`, `false` or `null`: the bytes still to come.
    Literal(&'static [u8]),
    /// After a value inside a container: `,` or the close.
    AfterValue,
    /// The top-level value is whole.
    Done,
}

/// A prefix of a JSON text, followed byte by byte.
#[derive(Clone, Debug)]
pub(crate) struct JsonPrefix {
    stack: Vec<Frame>,
    state: State,
    /// The bytes were not a JSON prefix (no suffix can be given).
    broken: bool,
}

impl JsonPrefix {
    /// The empty prefix.
    pub(crate) fn new() -> JsonPrefix {
        JsonPrefix {
            stack: Vec::new(),
            state: State::Start,
            broken: false,
        }
    }

    /// Follows `bytes`.
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.broken {
                return;
            }
            self.byte(b);
        }
    }

    /// The state after a value ends.
    fn value_done(&mut self) {
        self.state = if self.stack.is_empty() {
            State::Done
        } else {
            State::AfterValue
        };
    }

    /// Starts a value at `b`.
    fn start_value(&mut self, b: u8) {
        self.state = match b {
            b'{' => {
                self.stack.push(Frame::Object);
                State::ObjectOpen
            }
            b'[' => {
                self.stack.push(Frame::Array);
                State::ArrayOpen
            }
            b'"' => State::Str {
                key: false,
                escape: Escape::None,
            },
            b'-' => State::Num(Number::Minus),
            b'0' => State::Num(Number::Zero),
            b'1'..=b'9' => State::Num(Number::Int),
            b't' => State::Literal(b"rue"),
            b'f' => State::Literal(b"alse"),
            b'n' => State::Literal(b"ull"),
            _ => {
                self.broken = true;
                self.state
            }
        };
    }

    /// Closes the innermost container with `b` (`}` or `]`), if it is that kind.
    fn close(&mut self, b: u8) {
        let want = if b == b'}' {
            Frame::Object
        } else {
            Frame::Array
        };
        if self.stack.pop() == Some(want) {
            self.value_done();
        } else {
            self.broken = true;
        }
    }

    fn byte(&mut self, b: u8) {
        let ws = matches!(b, b' ' | b'\t' | b'\n' | b'\r');
        match self.state {
            State::Str { key, escape } => {
                self.state = match (escape, b) {
                    (Escape::None, b'"') if key => State::AfterKey,
                    (Escape::None, b'"') => {
                        self.value_done();
                        return;
                    }
                    (Escape::None, b'\\') => State::Str {
                        key,
                        escape: Escape::Backslash,
                    },
                    (Escape::None, c) if c < 0x20 => {
                        self.broken = true;
                        return;
                    }
                    (Escape::None, _) => return,
                    (Escape::Backslash, b'u') => State::Str {
                        key,
                        escape: Escape::Unicode(0),
                    },
                    (Escape::Backslash, b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                        State::Str {
                            key,
                            escape: Escape::None,
                        }
                    }
                    (Escape::Unicode(n), c) if c.is_ascii_hexdigit() => State::Str {
                        key,
                        escape: if n == 3 {
                            Escape::None
                        } else {
                            Escape::Unicode(n + 1)
                        },
                    },
                    _ => {
                        self.broken = true;
                        return;
                    }
                };
            }
            State::Num(n) => {
                let next = match (n, b) {
                    (Number::Minus, b'0') => Some(Number::Zero),
                    (Number::Minus, b'1'..=b'9') => Some(Number::Int),
                    (Number::Int, b'0'..=b'9') => Some(Number::Int),
                    (Number::Zero | Number::Int, b'.') => Some(Number::Dot),
                    (Number::Dot | Number::Frac, b'0'..=b'9') => Some(Number::Frac),
                    (Number::Zero | Number::Int | Number::Frac, b'e' | b'E') => Some(Number::Exp),
                    (Number::Exp, b'+' | b'-') => Some(Number::ExpSign),
                    (Number::Exp | Number::ExpSign | Number::ExpDigits, b'0'..=b'9') => {
                        Some(Number::ExpDigits)
                    }
                    _ => None,
                };
                match next {
                    Some(n) => self.state = State::Num(n),
                    None if n.complete() => {
                        // The number ended: the byte belongs to what follows it.
                        self.value_done();
                        self.byte(b);
                    }
                    None => self.broken = true,
                }
            }
            State::Literal(rest) => match rest.split_first() {
                Some((&c, tail)) if c == b => {
                    if tail.is_empty() {
                        self.value_done();
                    } else {
                        self.state = State::Literal(tail);
                    }
                }
                _ => self.broken = true,
            },
            _ if ws => {}
            State::Start | State::Value => self.start_value(b),
            State::ArrayOpen if b == b']' => self.close(b),
            State::ArrayOpen => self.start_value(b),
            State::ObjectOpen if b == b'}' => self.close(b),
            State::ObjectOpen | State::Key if b == b'"' => {
                self.state = State::Str {
                    key: true,
                    escape: Escape::None,
                }
            }
            State::AfterKey if b == b':' => self.state = State::Value,
            State::AfterValue => match (b, self.stack.last()) {
                (b',', Some(Frame::Object)) => self.state = State::Key,
                (b',', Some(Frame::Array)) => self.state = State::Value,
                (b'}' | b']', _) => self.close(b),
                _ => self.broken = true,
            },
            _ => self.broken = true,
        }
    }

    /// The fewest bytes that make the prefix a whole JSON text (`None` if it is not a prefix of
    /// one). Separators are `": "` after keys; a missing value is `null`; a missing top-level
    /// value is `{}`.
    pub(crate) fn suffix(&self) -> Option<Vec<u8>> {
        if self.broken {
            return None;
        }
        let mut s: Vec<u8> = Vec::new();
        match self.state {
            State::Start => s.extend_from_slice(b"{}"),
            State::Value => s.extend_from_slice(b"null"),
            State::Key => s.extend_from_slice(b"\"\": null"),
            State::Str { key, escape } => {
                match escape {
                    Escape::None => {}
                    Escape::Backslash => s.push(b'n'),
                    Escape::Unicode(n) => s.extend(std::iter::repeat_n(b'0', 4 - n as usize)),
                }
                s.push(b'"');
                if key {
                    s.extend_from_slice(b": null");
                }
            }
            State::AfterKey => s.extend_from_slice(b": null"),
            State::Num(n) if !n.complete() => s.push(b'0'),
            State::Literal(rest) => s.extend_from_slice(rest),
            State::ObjectOpen
            | State::ArrayOpen
            | State::Num(_)
            | State::AfterValue
            | State::Done => {}
        }
        for f in self.stack.iter().rev() {
            s.push(match f {
                Frame::Object => b'}',
                Frame::Array => b']',
            });
        }
        Some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn suffix(prefix: &str) -> Option<String> {
        let mut p = JsonPrefix::new();
        p.push(prefix.as_bytes());
        p.suffix().map(|s| String::from_utf8(s).unwrap())
    }

    #[test]
    fn every_prefix_of_a_json_text_completes_to_json() {
        let texts = [
            r#"{"a": [1, -2.5e+3, true, {"b": "x\"y\\z\u00e9"}], "c": null, "d": false}"#,
            r#"{"k": {"l": [[], {}, [0, 0.0, -0]], "m": "esc\tapes\n"}}"#,
            r#"{}"#,
            r#"[{"a": 1e5}, "s", 12]"#,
        ];
        for t in texts {
            for cut in 0..=t.len() {
                let s = suffix(&t[..cut]).unwrap_or_else(|| panic!("{:?} broke", &t[..cut]));
                let whole = format!("{}{s}", &t[..cut]);
                assert!(
                    serde_json::from_str::<serde_json::Value>(&whole).is_ok(),
                    "{:?} + {s:?} does not parse",
                    &t[..cut]
                );
            }
        }
    }

    #[test]
    fn the_suffix_is_the_shortest_completion() {
        assert_eq!(suffix("").as_deref(), Some("{}"));
        assert_eq!(suffix("{").as_deref(), Some("}"));
        assert_eq!(suffix("{\"ke").as_deref(), Some("\": null}"));
        assert_eq!(suffix("{\"k\"").as_deref(), Some(": null}"));
        assert_eq!(suffix("{\"k\": ").as_deref(), Some("null}"));
        assert_eq!(suffix("{\"k\": [\"v").as_deref(), Some("\"]}"));
        assert_eq!(suffix("{\"k\": \"\\u00").as_deref(), Some("00\"}"));
        assert_eq!(suffix("{\"k\": 1.").as_deref(), Some("0}"));
        assert_eq!(suffix("{\"k\": 12").as_deref(), Some("}"));
        assert_eq!(suffix("{\"k\": tr").as_deref(), Some("ue}"));
        assert_eq!(suffix("{\"k\": 1, ").as_deref(), Some("\"\": null}"));
        assert_eq!(suffix("[1, ").as_deref(), Some("null]"));
        assert_eq!(suffix("{\"k\": {}}").as_deref(), Some(""));
        assert_eq!(suffix("{}}"), None);
        assert_eq!(suffix("{\"k\" 1"), None);
        assert_eq!(suffix("[1}"), None);
    }
}
