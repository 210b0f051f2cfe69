//! What a schema or grammar may be, checked before llguidance compiles it.
//!
//! llguidance's compiler recurses once per nesting step (a `$ref` followed, a nested object, a
//! Lark rule using the next) and takes time that grows faster than the number of optional
//! properties of an object; a 37 KB schema could overflow a thread's stack and abort the
//! process, and a 10,000-property one took 20 s. These checks bound both before anything is
//! compiled: each is a walk over the input, linear in its size. What passes them is compiled on
//! a thread of its own with a large stack, under llguidance's own limits and a time bound
//! (see [`crate::Vocab::compile`]).

use std::collections::{HashMap, HashSet};

use serde_json::Value;

/// The largest schema, as JSON text, or Lark grammar accepted (256 KiB; the largest tool
/// schemas in use are tens of kB).
pub const MAX_SOURCE_BYTES: usize = 256 << 10;

/// The deepest nesting accepted: schema objects inside one another, counting each `$ref`
/// followed as one more level (a chain of definitions each referring to the next is as deep
/// as it is long). Recursion through a `$ref` back to a schema being expanded does not count
/// again: it is a loop, which llguidance compiles as one.
pub const MAX_DEPTH: usize = 512;

/// The most properties one object schema may list (llguidance's compile time and its first
/// step grow faster than linearly with optional properties: 10,000 took 20 s to compile and
/// objects over about 500 could not take a first step).
pub const MAX_PROPERTIES: usize = 256;

/// The longest `const`, `enum` (all its members) or `pattern` string accepted, in bytes: a
/// literal takes about one lexer state per byte (a 300 kB `const` built a lexer of gigabytes),
/// and [`crate::MAX_LEXER_STATES`] bounds those.
pub const MAX_LITERAL_BYTES: usize = 4 << 10;

/// The largest count a schema may ask for (`minItems`, `maxItems`, `minLength`, `maxLength`,
/// `minProperties`, `maxProperties`): larger ones unroll into grammars nothing could finish.
pub const MAX_COUNT: u64 = 10_000;

/// The most schema objects a walk visits, `$ref`s followed included.
pub const MAX_NODES: usize = 200_000;

/// The most rules a Lark grammar may define.
pub const MAX_RULES: usize = 2_000;

/// Checks a JSON schema against the limits above; the error says which and where.
pub fn check_schema(schema: &Value) -> Result<(), String> {
    let bytes = serde_json::to_vec(schema).map_or(usize::MAX, |v| v.len());
    if bytes > MAX_SOURCE_BYTES {
        return Err(format!(
            "the schema is {bytes} bytes of JSON; at most {MAX_SOURCE_BYTES} are accepted"
        ));
    }
    let mut w = Walk {
        root: schema,
        visiting: HashSet::new(),
        memo: HashMap::new(),
        nodes: 0,
    };
    let depth = w.depth(schema, "#")?;
    if depth > MAX_DEPTH {
        return Err(format!(
            "the schema nests {depth} levels deep ($refs followed); at most {MAX_DEPTH} are accepted"
        ));
    }
    Ok(())
}

struct Walk<'a> {
    root: &'a Value,
    /// `$ref` targets being expanded (a reference back to one is recursion, not depth).
    visiting: HashSet<&'a str>,
    /// The depth below each `$ref` target already walked.
    memo: HashMap<&'a str, usize>,
    nodes: usize,
}

impl<'a> Walk<'a> {
    /// How deep `v` nests, `$ref`s followed; `at` names where it is, for errors.
    fn depth(&mut self, v: &'a Value, at: &str) -> Result<usize, String> {
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            return Err(format!(
                "the schema has more than {MAX_NODES} parts ($refs followed)"
            ));
        }
        let mut deepest = 0;
        match v {
            Value::Object(m) => {
                self.check_object(m, at)?;
                if let Some(Value::String(r)) = m.get("$ref")
                    && let Some(pointer) = r.strip_prefix('#')
                    && !self.visiting.contains(r.as_str())
                {
                    let d = match self.memo.get(r.as_str()) {
                        Some(&d) => d,
                        None => match self.root.pointer(pointer) {
                            Some(target) => {
                                self.visiting.insert(r);
                                let d = self.depth(target, r);
                                self.visiting.remove(r.as_str());
                                let d = d?;
                                self.memo.insert(r, d);
                                d
                            }
                            None => 0,
                        },
                    };
                    deepest = deepest.max(d);
                }
                for (k, c) in m {
                    if matches!(c, Value::Object(_) | Value::Array(_)) {
                        deepest = deepest.max(self.depth(c, &format!("{at}/{k}"))?);
                    }
                }
            }
            Value::Array(a) => {
                for (i, c) in a.iter().enumerate() {
                    if matches!(c, Value::Object(_) | Value::Array(_)) {
                        deepest = deepest.max(self.depth(c, &format!("{at}/{i}"))?);
                    }
                }
            }
            _ => return Ok(0),
        }
        let d = deepest + 1;
        if d > MAX_DEPTH {
            return Err(format!(
                "the schema nests more than {MAX_DEPTH} levels deep at {at} ($refs followed)"
            ));
        }
        Ok(d)
    }

    fn check_object(&self, m: &serde_json::Map<String, Value>, at: &str) -> Result<(), String> {
        if let Some(Value::Object(p)) = m.get("properties")
            && p.len() > MAX_PROPERTIES
        {
            return Err(format!(
                "{at}: an object of {} properties; at most {MAX_PROPERTIES} are accepted",
                p.len()
            ));
        }
        let long = |s: &str| s.len() > MAX_LITERAL_BYTES;
        let literal_too_long = |what: &str, len: usize| {
            Err(format!(
                "{at}: a `{what}` of {len} bytes; at most {MAX_LITERAL_BYTES} are accepted"
            ))
        };
        match m.get("const") {
            Some(Value::String(s)) if long(s) => return literal_too_long("const", s.len()),
            Some(c @ (Value::Object(_) | Value::Array(_))) => {
                let n = serde_json::to_vec(c).map_or(usize::MAX, |v| v.len());
                if n > MAX_LITERAL_BYTES {
                    return literal_too_long("const", n);
                }
            }
            _ => {}
        }
        if let Some(Value::Array(e)) = m.get("enum") {
            let n: usize = e
                .iter()
                .map(|x| serde_json::to_vec(x).map_or(usize::MAX, |v| v.len()))
                .fold(0, usize::saturating_add);
            if n > MAX_LITERAL_BYTES {
                return literal_too_long("enum", n);
            }
        }
        if let Some(Value::String(p)) = m.get("pattern")
            && long(p)
        {
            return literal_too_long("pattern", p.len());
        }
        for key in [
            "minItems",
            "maxItems",
            "minLength",
            "maxLength",
            "minProperties",
            "maxProperties",
        ] {
            if let Some(n) = m.get(key).and_then(Value::as_f64)
                && n > MAX_COUNT as f64
            {
                return Err(format!(
                    "{at}: `{key}` {n} is over the {MAX_COUNT} accepted"
                ));
            }
        }
        Ok(())
    }
}

/// Checks a Lark grammar against the limits above.
pub fn check_lark(text: &str) -> Result<(), String> {
    if text.len() > MAX_SOURCE_BYTES {
        return Err(format!(
            "the grammar is {} bytes; at most {MAX_SOURCE_BYTES} are accepted",
            text.len()
        ));
    }
    // A rule starts a line: `name:`, `?name:`, `!name:` or `name{params}:` (terminals, in
    // capitals, are counted too: each is compiled the same way).
    let rules = text
        .lines()
        .filter(|l| {
            let l = l.trim_start_matches(['?', '!']);
            let name_end = l
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(l.len());
            name_end > 0
                && l.as_bytes()[0].is_ascii_alphabetic()
                && l[name_end..].trim_start().starts_with([':', '{', '.'])
        })
        .count();
    if rules > MAX_RULES {
        return Err(format!(
            "the grammar defines {rules} rules; at most {MAX_RULES} are accepted"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A chain of `n` definitions, each referring to the next.
    fn chain(n: usize) -> Value {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            let next = if i + 1 < n {
                json!({"type": "object", "properties": {"x": {"$ref": format!("#/$defs/d{}", i + 1)}}})
            } else {
                json!({"type": "string"})
            };
            defs.insert(format!("d{i}"), next);
        }
        json!({"$defs": defs, "$ref": "#/$defs/d0"})
    }

    #[test]
    fn ref_chains_count_their_length_and_cycles_do_not() {
        check_schema(&chain(20)).unwrap();
        let e = check_schema(&chain(400)).unwrap_err();
        assert!(e.contains("levels deep"), "{e}");
        // A recursive schema (a tree) is a loop, not a chain.
        let tree = json!({
            "$defs": {"node": {"type": "object", "properties": {
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
            "$ref": "#/$defs/node"
        });
        check_schema(&tree).unwrap();
    }

    #[test]
    fn wide_objects_long_literals_and_big_counts_are_refused() {
        let mut props = serde_json::Map::new();
        for i in 0..=MAX_PROPERTIES {
            props.insert(format!("p{i}"), json!({"type": "integer"}));
        }
        let e = check_schema(&json!({"type": "object", "properties": props})).unwrap_err();
        assert!(e.contains("257 properties"), "{e}");
        let e = check_schema(&json!({"const": "z".repeat(100_000)})).unwrap_err();
        assert!(e.contains("`const`"), "{e}");
        let e = check_schema(&json!({"enum": vec!["y".repeat(1000); 10]})).unwrap_err();
        assert!(e.contains("`enum`"), "{e}");
        let e = check_schema(&json!({"type": "array", "minItems": 1e9})).unwrap_err();
        assert!(e.contains("minItems"), "{e}");
        let e = check_schema(&json!({"description": "x".repeat(MAX_SOURCE_BYTES)})).unwrap_err();
        assert!(e.contains("bytes of JSON"), "{e}");
        check_schema(&json!({"type": "object", "properties": {"a": {"const": "ok"}}})).unwrap();
    }

    #[test]
    fn lark_rule_counts_are_bounded() {
        let chained: String = (0..5000)
            .map(|i| format!("r{i}: r{} \"a\"\n", i + 1))
            .collect::<String>()
            + "r5000: \"b\"\n";
        let e = check_lark(&format!("start: r0\n{chained}")).unwrap_err();
        assert!(e.contains("5002 rules"), "{e}");
        check_lark("start: a b\na: \"x\"\n?b: A\nA: /[0-9]+/\n").unwrap();
    }
}
