//! Batched decoding: every sequence's output is bit-identical to running it alone, for batches
//! of 1, 3 and 8 with different prompts, lengths and sampling options; sequences join and leave;
//! a cancelled sequence frees its slot.

mod common;

use std::path::{Path, PathBuf};
use std::sync::mpsc;

use sluice::{Batcher, Event, OwnedPrompt};
use sluice::{Engine, FinishReason, GenerateOptions, Memory, Prompt, SamplingOptions};

fn demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo")
}

fn job(i: usize) -> (OwnedPrompt, GenerateOptions) {
    let prompts = [
        "It is a truth universally acknowledged",
        "The weather",
        "Mr. Darcy said",
        "In the morning, she",
    ];
    let sampling = if i.is_multiple_of(3) {
        SamplingOptions::default()
    } else {
        SamplingOptions {
            temperature: 0.7 + 0.1 * (i % 3) as f32,
            top_p: 0.9,
            seed: i as u64,
            ..Default::default()
        }
    };
    let opts = GenerateOptions {
        max_tokens: 10 + 7 * (i % 4),
        sampling,
        stop_at_eos: false,
        ..Default::default()
    };
    (OwnedPrompt::Text(prompts[i % 4].into()), opts)
}

fn solo(engine: &Engine, i: usize) -> (Vec<u32>, String) {
    let (p, o) = job(i);
    let OwnedPrompt::Text(t) = &p else {
        unreachable!()
    };
    let mut s = engine.session().unwrap();
    let mut g = s.generate(Prompt::Text(t), &o).unwrap();
    let text = g.run().unwrap();
    (g.ids().to_vec(), text)
}

#[test]
fn batches_of_1_3_and_8_equal_solo_runs() {
    // A budget below the model, so that sequences share expert reads.
    let engine = Engine::builder()
        .model(demo())
        .memory(Memory::Bytes((14 << 20) + common::text(64, 8)))
        .threads(2)
        .context(64)
        .sequences(8)
        .build()
        .unwrap();
    let want: Vec<_> = (0..8).map(|i| solo(&engine, i)).collect();
    for n in [1, 3, 8] {
        let b = Batcher::new(engine.clone(), n).unwrap();
        let (tx, rx) = mpsc::channel();
        for i in 0..8 {
            let (p, o) = job(i);
            let tx = tx.clone();
            b.submit(
                &p,
                o,
                Box::new(move |e| {
                    let _ = tx.send((i, e));
                    true
                }),
            )
            .unwrap();
        }
        drop(tx);
        let mut got: Vec<Option<(Vec<u32>, String)>> = vec![None; 8];
        let mut streamed = vec![String::new(); 8];
        for (i, e) in rx {
            match e {
                Event::Token(t) => streamed[i].push_str(&t.text),
                Event::Done(f) => {
                    assert_eq!(f.finish, FinishReason::Length);
                    got[i] = Some((f.ids, f.text));
                }
                Event::Failed(e) => panic!("{e}"),
            }
        }
        for i in 0..8 {
            let g = got[i].clone().expect("every job finishes");
            assert_eq!(g, want[i], "batch {n}, sequence {i}");
            assert_eq!(streamed[i], want[i].1);
        }
    }
}

#[test]
fn a_cancelled_sequence_frees_its_slot() {
    let engine = Engine::builder().model(demo()).threads(1).build().unwrap();
    let b = Batcher::new(engine.clone(), 1).unwrap();
    let (p, mut o) = job(1);
    o.max_tokens = 400;
    let mut n = 0;
    b.submit(
        &p,
        o,
        Box::new(move |_| {
            n += 1;
            n < 3
        }),
    )
    .unwrap();
    // With one slot, this job only runs once the cancelled one has left.
    let (p2, o2) = job(2);
    let f = b.generate(&p2, o2).unwrap();
    assert_eq!((f.ids.clone(), f.text.clone()), solo(&engine, 2));
}

#[test]
fn bad_jobs_are_refused_at_submit() {
    let engine = Engine::builder()
        .model(demo())
        .context(64)
        .threads(1)
        .sequences(2)
        .build()
        .unwrap();
    // The memory plan covers two sequences, not three.
    let e = Batcher::new(engine.clone(), 3).unwrap_err();
    assert!(e.to_string().contains("planned for 2"), "{e}");
    assert!(Batcher::new(engine.clone(), 0).is_err());
    let b = Batcher::new(engine, 2).unwrap();
    let bad = GenerateOptions {
        sampling: SamplingOptions {
            top_p: 2.0,
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(
        b.submit(&OwnedPrompt::Text("x".into()), bad, Box::new(|_| true))
            .is_err()
    );
    let long = GenerateOptions {
        max_tokens: 100,
        ..Default::default()
    };
    assert!(
        b.submit(&OwnedPrompt::Text("x".into()), long, Box::new(|_| true))
            .is_err()
    );
    assert!(
        b.submit(
            &OwnedPrompt::Chat(vec![]),
            GenerateOptions::default(),
            Box::new(|_| true)
        )
        .is_err()
    );
}

/// The grammars of [`constrained_job`], each compiled once for all the jobs that use it
/// (each compiled grammar is lent memory by the expert cache while it is held).
fn grammars(engine: &Engine) -> Vec<Option<sluice::CompiledGrammar>> {
    (0..4)
        .map(|i| grammar(i).map(|g| engine.compile_grammar(&g).unwrap()))
        .collect()
}

/// Jobs under grammars (a schema, a Lark grammar, any object) and without, greedy and sampled.
fn constrained_job(
    grammars: &[Option<sluice::CompiledGrammar>],
    i: usize,
) -> (OwnedPrompt, GenerateOptions) {
    let (p, mut o) = job(i);
    o.max_tokens = 40;
    o.grammar = grammars[i % 4].clone();
    (p, o)
}

fn grammar(i: usize) -> Option<sluice::Grammar> {
    match i % 4 {
        0 => Some(sluice::Grammar::JsonSchema(serde_json::json!({
            "type": "object",
            "properties": {"mood": {"enum": ["calm", "cross"]},
                "n": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["mood", "n"], "additionalProperties": false
        }))),
        1 => Some(sluice::Grammar::Lark(
            "start: \"Answer: \" (\"yes\" | \"no\") \".\"".into(),
        )),
        2 => Some(sluice::Grammar::JsonObject),
        _ => None,
    }
}

#[test]
fn constrained_sequences_batched_equal_solo_under_a_budget() {
    let engine = Engine::builder()
        .model(demo())
        .memory(Memory::Bytes((22 << 20) + common::text(64, 8)))
        .threads(2)
        .context(64)
        .sequences(8)
        .build()
        .unwrap();
    let compiled = grammars(&engine);
    let run_solo = |i: usize| {
        let (p, o) = constrained_job(&compiled, i);
        let OwnedPrompt::Text(t) = &p else {
            unreachable!()
        };
        let mut s = engine.session().unwrap();
        let mut g = s.generate(Prompt::Text(t), &o).unwrap();
        let text = g.run().unwrap();
        (g.ids().to_vec(), text, g.finish_reason())
    };
    let want: Vec<_> = (0..8).map(run_solo).collect();
    // The budget (the grammar index lent out of it) streams the experts: they are evicted.
    assert!(engine.model().experts().stats().evictions > 0);
    // The grammars did their work: the schema's and the Lark grammar's outputs are complete.
    for i in [0, 4] {
        assert_eq!(want[i].2, Some(FinishReason::Eos), "{:?}", want[i].1);
        let v: serde_json::Value = serde_json::from_str(&want[i].1).unwrap();
        assert!(
            v["n"].as_u64().unwrap() < 100 && v["mood"].is_string(),
            "{v}"
        );
    }
    for i in [1, 5] {
        assert!(
            want[i].1 == "Answer: yes." || want[i].1 == "Answer: no.",
            "{}",
            want[i].1
        );
    }
    for i in [2, 6] {
        assert!(want[i].1.starts_with("{\""), "{}", want[i].1);
    }
    for n in [3, 8] {
        let got = common::batched(
            &engine,
            n,
            (0..8).map(|i| constrained_job(&compiled, i)).collect(),
        );
        for (i, f) in got.into_iter().enumerate() {
            assert_eq!(
                (f.ids, f.text, Some(f.finish)),
                want[i],
                "batch {n}, sequence {i}"
            );
        }
    }
}
