//! Schemas and grammars through compilation (issue 59): generated JSON schemas, nested and
//! wide — `$ref` chains and cycles, objects of many properties, required fields, long
//! literals, patterns with repetition counts, big item counts — and Lark grammars of chained
//! and branching rules, compiled against a byte vocabulary. Every case must finish: compile, or
//! be refused in one line (libFuzzer's `-timeout` and `-rss_limit_mb` catch a hang or a
//! blow-up; an abort is a crash). What compiles must then take its first steps, and a reply
//! cut at any `max_tokens` from the smallest sentence's length on must be a whole sentence
//! (while the constraint's searches for a way to finish stay within their budget).
//!
//! Input: byte 0 picks schema or Lark; the rest drives `arbitrary`.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::arbitrary::{self, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use sluice_grammar::{Commit, Grammar, Next, Vocab};
use sluice_text::VocabBytes;

/// Bytes 0..=255, `<eos>` (256, special), and a few longer tokens.
fn vocab() -> &'static Vocab {
    static V: OnceLock<Vocab> = OnceLock::new();
    V.get_or_init(|| {
        let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        tokens.push(b"<eos>".to_vec());
        for t in ["\"", "\": ", "{\"", "null", "true", "abc", "], "] {
            tokens.push(t.as_bytes().to_vec());
        }
        let mut special = vec![false; tokens.len()];
        special[256] = true;
        let n = tokens.len();
        Vocab::new(&VocabBytes { tokens, special }, &[256], n).unwrap()
    })
}

fn name(u: &mut Unstructured<'_>) -> arbitrary::Result<String> {
    Ok(format!("p{}", u.int_in_range(0..=50u32)?))
}

/// A schema of at most `depth` more levels; `defs` definitions exist to refer to.
fn schema(u: &mut Unstructured<'_>, depth: u32, defs: u32) -> arbitrary::Result<Value> {
    let leaf = depth == 0;
    Ok(match u.int_in_range(0..=if leaf { 5 } else { 11 })? {
        0 => json!({"type": "string"}),
        1 => json!({"type": "integer", "minimum": u.int_in_range(-5..=5i32)?}),
        2 => json!({"type": "boolean"}),
        3 => json!({"enum": ["a", "bb", u.arbitrary::<String>()?]}),
        4 => {
            let n = *u.choose(&[1usize, 10, 1000, 5000, 100_000])?;
            json!({"const": "z".repeat(n)})
        }
        5 => {
            let n = *u.choose(&[1u32, 3, 100, 1000])?;
            json!({"type": "string", "pattern": format!("^(a{{{n}}}){{{}}}$", u.int_in_range(1..=1000u32)?)})
        }
        6 if defs > 0 => json!({"$ref": format!("#/$defs/d{}", u.int_in_range(0..=defs - 1)?)}),
        7 => {
            // Wide: up to thousands of properties, some required.
            let n = *u.choose(&[1usize, 5, 50, 300, 7000])?;
            let mut props = serde_json::Map::new();
            let mut req = Vec::new();
            for i in 0..n {
                let p = if i < 4 {
                    schema(u, depth - 1, defs)?
                } else {
                    json!({"type": "integer"})
                };
                props.insert(format!("p{i}"), p);
                if u.ratio(1, 3)? {
                    req.push(format!("p{i}"));
                }
            }
            json!({"type": "object", "properties": props, "required": req,
                   "additionalProperties": u.arbitrary::<bool>()?})
        }
        8 => json!({"type": "array", "items": schema(u, depth - 1, defs)?,
                    "minItems": *u.choose(&[0u64, 1, 3, 10_000, 1_000_000_000])?}),
        9 => json!({"anyOf": [schema(u, depth - 1, defs)?, schema(u, depth - 1, defs)?]}),
        10 => json!({"type": "object", "properties": {name(u)?: schema(u, depth - 1, defs)?}}),
        _ => json!({"type": "string", "minLength": u.int_in_range(0..=3u32)?, "maxLength": 8}),
    })
}

/// A schema with definitions: some chained (each referring to the next, up to hundreds
/// deep), some referring back to themselves.
fn top_schema(u: &mut Unstructured<'_>) -> arbitrary::Result<Value> {
    let n = *u.choose(&[0u32, 2, 8, 60, 400])?;
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        let d = match u.int_in_range(0..=3)? {
            0 if i + 1 < n => json!({"type": "object", "properties": {"x": {"$ref": format!("#/$defs/d{}", i + 1)}}}),
            1 => json!({"type": "object", "properties": {"self": {"$ref": format!("#/$defs/d{i}")}},
                        "required": if u.arbitrary()? { vec!["self"] } else { vec![] }}),
            2 => json!({"$ref": format!("#/$defs/d{i}")}),
            _ => schema(u, 2, n)?,
        };
        defs.insert(format!("d{i}"), d);
    }
    let mut root = schema(u, 3, n)?;
    if n > 0 {
        root["$defs"] = Value::Object(defs);
    }
    Ok(root)
}

/// A Lark grammar: chains of rules each using the next, alternatives, repetitions, regexes.
fn lark(u: &mut Unstructured<'_>) -> arbitrary::Result<String> {
    let n = *u.choose(&[1u32, 3, 20, 500, 5000])?;
    let mut g = String::from("start: r0\n");
    for i in 0..n {
        let next = if i + 1 < n { format!("r{}", i + 1) } else { "\"e\"".into() };
        let body = match u.int_in_range(0..=4)? {
            0 => format!("\"a\" {next}"),
            1 => format!("{next} | \"b\""),
            2 => format!("({next} \",\")* {next}"),
            3 => format!("/[a-z]{{1,{}}}/ {next}", u.int_in_range(1..=2000u32)?),
            _ => format!("{next} {next}"),
        };
        g.push_str(&format!("r{i}: {body}\n"));
    }
    Ok(g)
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let mut u = Unstructured::new(rest);
    let g = if pick % 3 == 0 {
        match lark(&mut u) {
            Ok(g) => Grammar::Lark(g),
            Err(_) => return,
        }
    } else {
        match top_schema(&mut u) {
            Ok(s) => Grammar::JsonSchema(s),
            Err(_) => return,
        }
    };
    let v = vocab();
    let compiled = match v.compile(&g) {
        Ok(c) => c,
        Err(e) => {
            let m = e.to_string();
            assert!(!m.contains('\n') && m.len() < 1000, "not one short line: {m}");
            return;
        }
    };
    // What compiled takes its first steps; cut at `max_tokens` from the smallest sentence on,
    // the reply is whole (the logits prefer bytes the input picks, never closing anything).
    let Some(smallest) = compiled.smallest() else {
        return;
    };
    let prefs: Vec<u8> = u.bytes(4).unwrap_or(b"x[{\"").to_vec();
    let max = smallest + u.int_in_range(0..=24usize).unwrap_or(0);
    let mut c = compiled.start();
    let width = 264;
    for i in 0..max {
        let mut logits = vec![0.0f32; width];
        for (rank, &b) in prefs.iter().enumerate() {
            logits[b as usize] = 100.0 - rank as f32;
        }
        match c.mask(&mut logits) {
            Ok(Next::End) => return,
            Ok(Next::Sample) => {}
            Err(_) => return, // llguidance's limits reached mid-way: an error, not a crash
        }
        let mut refused = Vec::new();
        let id = loop {
            let id = (0..width as u32)
                .filter(|t| c.allows(*t) && !refused.contains(t))
                .max_by(|&a, &b| logits[a as usize].total_cmp(&logits[b as usize]).then(b.cmp(&a)));
            let Some(id) = id else {
                let p = c.planned_token().expect("a plan when every token is refused");
                c.commit(p).unwrap();
                break p;
            };
            match c.commit_within(id, max - i) {
                Ok(Commit::Taken) => break id,
                Ok(Commit::Refused) => refused.push(id),
                Err(_) => return,
            }
        };
        if id == 256 {
            return;
        }
    }
    // The guarantee holds while the searches stayed within their budget.
    assert!(
        c.is_complete() || !c.is_checking(),
        "cut at max_tokens {max} (smallest {smallest}) the reply is not a whole sentence"
    );
});
