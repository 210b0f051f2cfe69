//! Unit tests of the parent module.

use super::*;

/// A byte vocabulary: ids 0..=255 are single bytes, 256 is `<eos>` (special), 257 `"ab"`.
fn vocab() -> Vocab {
    let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    tokens.push(b"<eos>".to_vec());
    tokens.push(b"ab".to_vec());
    let mut special = vec![false; 258];
    special[256] = true;
    Vocab::new(&VocabBytes { tokens, special }, &[256], 260).unwrap()
}

fn constrain(v: &Vocab, g: &Grammar) -> Constraint {
    v.compile(g).unwrap().start()
}

/// The index of the largest logit (ties to the lowest id): greedy sampling.
fn argmax(logits: &[f32]) -> u32 {
    (0..logits.len())
        .max_by(|&a, &b| logits[a].total_cmp(&logits[b]).then(b.cmp(&a)))
        .unwrap() as u32
}

/// Greedy decoding under the constraint with logits that prefer `prefs` bytes in order.
fn greedy(c: &mut Constraint, prefs: &[u8], max: usize) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    for _ in 0..max {
        let mut logits = vec![0.0f32; 260];
        for (rank, &b) in prefs.iter().enumerate() {
            logits[b as usize] = 100.0 - rank as f32;
        }
        logits[256] = 50.0;
        if c.mask(&mut logits).unwrap() == Next::End {
            return (out, true);
        }
        let id = argmax(&logits);
        assert!(c.allows(id));
        c.commit(id).unwrap();
        if id == 256 {
            return (out, true);
        }
        out.push(id as u8);
    }
    (out, false)
}

/// Decoding as the engine does, `max` tokens at most, the logits preferring `prefs` bytes in
/// order (and the two-byte token `"ab"` nearly as much): the output, whether the grammar
/// ended it, and whether tokens were refused to finish in time.
fn within(g: &Grammar, prefs: &[u8], max: usize) -> (Vec<u8>, bool, bool) {
    let v = vocab();
    let mut c = constrain(&v, g);
    let mut out = Vec::new();
    for i in 0..max {
        let mut logits = vec![0.0f32; 260];
        for (rank, &b) in prefs.iter().enumerate() {
            logits[b as usize] = 100.0 - rank as f32;
        }
        logits[257] = 99.5; // "ab"
        if c.mask(&mut logits).unwrap() == Next::End {
            return (out, true, c.steered());
        }
        let id = loop {
            let id = argmax(&logits);
            if logits[id as usize] == f32::NEG_INFINITY {
                let id = c.planned_token().unwrap();
                c.commit(id).unwrap();
                break id;
            }
            assert!(c.allows(id));
            match c.commit_within(id, max - i).unwrap() {
                Commit::Taken => break id,
                Commit::Refused => logits[id as usize] = f32::NEG_INFINITY,
            }
        };
        if id == 256 {
            return (out, true, c.steered());
        }
        if id == 257 {
            out.extend_from_slice(b"ab");
        } else {
            out.push(id as u8);
        }
    }
    (out, false, c.steered())
}

#[test]
fn json_that_would_run_past_max_tokens_is_closed_in_time() {
    // Logits that open strings, objects and arrays, and never close anything.
    for prefs in [&b"x"[..], b"{[\\\"a", b"\"[{", b"1.e-", b"tn[", b"{\"a"] {
        for max in 2..48 {
            // (Ended by the grammar, or by running out of tokens: whole either way.)
            let (out, _, steered) = within(&Grammar::JsonObject, prefs, max);
            let s = String::from_utf8(out).unwrap();
            assert!(s.len() <= 2 * max, "{s:?}");
            let v: Value = serde_json::from_str(&s)
                .unwrap_or_else(|e| panic!("{prefs:?} max {max}: {s:?}: {e}"));
            assert!(v.is_object(), "{s:?}");
            // Past the smallest limits, something had to be kept out.
            assert!(
                steered || max < 8,
                "{prefs:?} max {max}: {s:?} was not steered"
            );
        }
    }
    // Far from the limit nothing is kept out: the same prefix as with no limit.
    let (long, _, _) = within(&Grammar::JsonObject, b"\"x", 400);
    let v = vocab();
    let mut c = constrain(&v, &Grammar::JsonObject);
    let (free, _) = greedy(&mut c, b"\"x", 100);
    assert_eq!(&long[..100], &free[..100]);
}

/// Issue 59: with required fields the JSON-only closing left `…"novel"], "` unparseable.
/// The completion is searched through the grammar, so what the schema requires is written.
#[test]
fn a_reply_cut_by_max_tokens_is_valid_against_its_schema() {
    let schema = json!({
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "genres": {"type": "array", "items": {"type": "string"}},
            "year": {"type": "integer"},
            "rating": {"enum": ["good", "bad"]},
            "author": {"type": "object", "properties": {"name": {"type": "string"}},
                       "required": ["name"]}
        },
        "required": ["title", "genres", "year", "rating", "author"],
        "additionalProperties": false
    });
    let g = Grammar::JsonSchema(schema.clone());
    let v = vocab();
    let smallest = v.compile(&g).unwrap().smallest().unwrap();
    let doc = r#"{"title": "", "genres": [], "year": 0, "rating": "bad", "author": {"name": ""}}"#;
    assert_eq!(smallest, doc.len());
    for prefs in [&b"x"[..], b"\"[{", b"a1", b"9", b"\"a"] {
        for max in smallest..smallest + 40 {
            let (out, _, _) = within(&g, prefs, max);
            let s = String::from_utf8(out).unwrap();
            let v: Value = serde_json::from_str(&s)
                .unwrap_or_else(|e| panic!("{prefs:?} max {max}: {s:?}: {e}"));
            for k in ["title", "genres", "year", "rating", "author"] {
                assert!(v.get(k).is_some(), "{s} lacks {k}");
            }
            assert!(v["author"]["name"].is_string(), "{s}");
        }
    }
}

/// A Lark grammar is finished in time too: the search is the grammar's, not JSON's.
#[test]
fn a_lark_reply_cut_by_max_tokens_is_a_sentence() {
    let g = Grammar::Lark("start: \"(\" item (\",\" item)* \")\"\nitem: /[a-z]+/".into());
    for max in 3..30 {
        let (out, ended, _) = within(&g, b"xy,", max);
        let s = String::from_utf8(out).unwrap();
        assert!(s.starts_with('(') && s.ends_with(')'), "max {max}: {s:?}");
        assert!(ended || s.len() <= max, "{s:?}");
    }
}

/// Found by the `grammar_compile` fuzz target: a Lark chain of 500 rules after a long
/// regex has a smallest sentence of 736 bytes, and each step searched that far anew (about
/// 300 parser operations a byte without JSON to guide it): one generation took minutes.
/// Searches now spend at most `SEARCH_OPS`; past that the generation is no longer checked.
#[test]
fn a_costly_lark_completion_is_bounded() {
    let mut g = String::from("start: r0\nr0: /[a-z]{1,236}/ r1\n");
    for i in 1..500 {
        g.push_str(&format!("r{i}: \"a\" r{}\n", i + 1));
    }
    g.push_str("r500: \"e\"\n");
    let g = Grammar::Lark(g);
    let smallest = vocab().compile(&g).unwrap().smallest().unwrap();
    let (out, ended, _) = within(&g, b"x[{\"", smallest);
    assert!(out.len() <= smallest + 1, "{}", out.len());
    let mut c = constrain(&vocab(), &g);
    for &b in &out {
        c.commit(b as u32).unwrap();
    }
    assert!(ended || c.is_complete() || out.len() == smallest, "{out:?}");
}

/// A plan is reused only when it still finishes the grammar: checked with an end of
/// sequence after it, so an unfinished or an invalid one is not taken.
#[test]
fn finishes_checks_the_end_too() {
    let g = Grammar::JsonSchema(json!({"type": "object",
        "properties": {"a": {"type": "integer"}}, "required": ["a"]}));
    let mut c = constrain(&vocab(), &g);
    assert!(c.finishes(b"{\"a\": 1}"));
    assert!(!c.finishes(b"{\"a\": 1"), "not closed");
    assert!(!c.finishes(b"{}"), "a required");
    assert!(!c.finishes(b"{\"a\": \"x\"}"), "not an integer");
}

#[test]
fn a_json_that_closes_by_itself_is_not_steered() {
    // The logits write `{}` at once.
    let (out, ended, steered) = within(&Grammar::JsonObject, b"{}", 10);
    assert_eq!((out.as_slice(), ended, steered), (&b"{}"[..], true, false));
}

#[test]
fn a_schema_forces_valid_json_whatever_the_logits_prefer() {
    let v = vocab();
    let schema = json!({
        "type": "object",
        "properties": {"k": {"enum": ["yes", "no"]}},
        "required": ["k"],
        "additionalProperties": false
    });
    let mut c = constrain(&v, &Grammar::JsonSchema(schema));
    // The logits want "zzz" forever; the grammar allows only the one object.
    let (out, ended) = greedy(&mut c, b"zyn", 64);
    assert!(ended);
    let s = String::from_utf8(out).unwrap();
    let parsed: Value = serde_json::from_str(&s).unwrap();
    assert!(
        parsed == json!({"k": "no"}) || parsed == json!({"k": "yes"}),
        "{s}"
    );
    // Python's separators, no free whitespace.
    assert!(s.starts_with("{\"k\": \""), "{s}");
}

#[test]
fn ids_past_the_vocabulary_and_special_tokens_are_masked() {
    let v = vocab();
    let mut c = constrain(&v, &Grammar::JsonObject);
    let mut logits = vec![1.0f32; 260];
    assert_eq!(c.mask(&mut logits).unwrap(), Next::Sample);
    assert_eq!(logits[b'{' as usize], 1.0);
    assert_eq!(logits[b'x' as usize], f32::NEG_INFINITY);
    assert_eq!(logits[256], f32::NEG_INFINITY, "eos before the object");
    assert_eq!(
        logits[258],
        f32::NEG_INFINITY,
        "padding past the vocabulary"
    );
    assert_eq!(c.first_allowed(), Some(b'{' as u32));
}

#[test]
fn a_lark_grammar_ends_when_nothing_more_may_follow() {
    let v = vocab();
    let mut c = constrain(&v, &Grammar::Lark("start: \"ab\" | \"ac\"".into()));
    let (out, ended) = greedy(&mut c, b"ac", 8);
    assert_eq!(out, b"ac");
    assert!(ended);
}

#[test]
fn bad_grammars_are_errors_that_name_what_was_given() {
    let v = vocab();
    let e = v
        .compile(&Grammar::Lark("start: undefined_rule".into()))
        .unwrap_err();
    assert!(e.to_string().starts_with("grammar: "), "{e}");
    let e = v
        .compile(&Grammar::JsonSchema(json!({"type": "no-such-type"})))
        .unwrap_err();
    assert!(e.to_string().starts_with("json_schema: "), "{e}");
    assert!(!e.to_string().contains('\n'));
}

#[test]
fn response_formats_are_read_as_openai_writes_them() {
    let rf = |v: Value| Grammar::from_response_format(&v);
    assert_eq!(rf(json!({"type": "text"})).unwrap(), None);
    assert_eq!(
        rf(json!({"type": "json_object"})).unwrap(),
        Some(Grammar::JsonObject)
    );
    let s = json!({"type": "object"});
    assert_eq!(
        rf(json!({"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": s}}))
            .unwrap(),
        Some(Grammar::JsonSchema(s))
    );
    for (v, says) in [
        (json!({"type": "yaml"}), "`yaml`"),
        (json!({}), "`type` is missing"),
        (json!({"type": "json_schema"}), "`json_schema`"),
        (
            json!({"type": "json_schema", "json_schema": {"name": "x"}}),
            "schema` is missing",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"schema": {}, "strikt": true}}),
            "`json_schema.strikt`",
        ),
        (json!({"type": "text", "extra": 1}), "`extra`"),
    ] {
        let e = rf(v).unwrap_err().to_string();
        assert!(
            e.starts_with("response_format: ") && e.contains(says),
            "{e}"
        );
    }
}

#[test]
fn no_eos_id_still_ends_the_grammar() {
    let tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    let v = Vocab::new(
        &VocabBytes {
            special: vec![false; 256],
            tokens,
        },
        &[],
        256,
    )
    .unwrap();
    let mut c = constrain(&v, &Grammar::Lark("start: \"x\"".into()));
    let (out, ended) = greedy(&mut c, b"x", 4);
    assert_eq!(out, b"x");
    assert!(ended);
}
