//! The public API: sessions on one engine in parallel threads give exactly what they give run
//! one after another; a chat reuses its cache; stop strings and end-of-sequence end a generation.

mod common;

use std::path::{Path, PathBuf};

use sluice::{Engine, FinishReason, GenerateOptions, Memory, Message, Prompt, SamplingOptions};

fn demo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo")
}

fn opts(seed: u64, max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampling: SamplingOptions {
            temperature: 0.9,
            top_p: 0.95,
            seed,
            ..Default::default()
        },
        stop_at_eos: false,
        ..Default::default()
    }
}

const PROMPTS: [&str; 4] = [
    "It is a truth universally acknowledged",
    "The weather",
    "Mr. Darcy said",
    "In the morning",
];

#[test]
fn eight_concurrent_sessions_match_sequential_runs() {
    // A budget well below the model: the sessions share (and fight over) the expert cache,
    // and their KV caches (8 × 232 positions) take pages from it as they grow.
    let engine = Engine::builder()
        .model(demo())
        .memory(Memory::Bytes((16 << 20) + common::text(232, 8)))
        .threads(2)
        .sequences(8)
        .context(232)
        .build()
        .unwrap();
    let job = |i: usize| {
        let mut s = engine.session().unwrap();
        let mut g = s
            .generate(Prompt::Text(PROMPTS[i % 4]), &opts(i as u64, 200))
            .unwrap();
        let text = g.run().unwrap();
        (g.ids().to_vec(), text)
    };
    let sequential: Vec<_> = (0..8).map(job).collect();
    let before = engine.expert_stats();
    let parallel: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8).map(|i| s.spawn(move || job(i))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(sequential, parallel);
    for (ids, _) in &parallel {
        assert_eq!(ids.len(), 200);
    }
    // Requests are hits plus misses, across all sessions.
    let s = engine.expert_stats();
    assert_eq!(s.requests, s.hits + s.misses);
    assert!(s.requests > before.requests);
    assert_eq!(engine.stats().generations, 16);
}

#[test]
fn chat_turns_reuse_the_cache_and_match_a_fresh_session() {
    let engine = Engine::builder().model(demo()).threads(1).build().unwrap();
    let o = opts(3, 12);
    let mut s = engine.session().unwrap();
    let t1 = "Elizabeth walked to the window.\n".to_owned();
    let a1 = s
        .generate_full(Prompt::Text(&t1), &o)
        .unwrap()
        .run()
        .unwrap();
    let t2 = format!("{t1}{a1}\nShe said nothing.\n");
    let before = s.history().len();
    let mut g = s.generate_full(Prompt::Text(&t2), &o).unwrap();
    let a2 = g.run().unwrap();
    // Only what was new went through the model.
    assert!(g.stats().prefill_tokens < engine.encode(&Prompt::Text(&t2)).unwrap().len());
    assert!(before > 0);
    let fresh = engine
        .session()
        .unwrap()
        .generate_full(Prompt::Text(&t2), &o)
        .unwrap()
        .run()
        .unwrap();
    assert_eq!(a2, fresh);
}

#[test]
fn stop_strings_and_lengths() {
    let engine = Engine::builder().model(demo()).threads(1).build().unwrap();
    let greedy = GenerateOptions {
        max_tokens: 40,
        stop_at_eos: false,
        ..Default::default()
    };
    let mut s = engine.session().unwrap();
    let full = s
        .generate(
            Prompt::Text("It is a truth universally acknowledged"),
            &greedy,
        )
        .unwrap()
        .run()
        .unwrap();
    // The greedy text repeats ", and the most uniformous"; stop at its second occurrence.
    let stop = "most";
    let first = full.find(stop).unwrap();
    let with_stop = GenerateOptions {
        stop: vec![stop.into()],
        ..greedy.clone()
    };
    let mut s = engine.session().unwrap();
    let mut g = s
        .generate(
            Prompt::Text("It is a truth universally acknowledged"),
            &with_stop,
        )
        .unwrap();
    let mut streamed = String::new();
    for t in g.by_ref() {
        streamed.push_str(&t.unwrap().text);
    }
    assert_eq!(g.finish_reason(), Some(FinishReason::Stop));
    assert_eq!(g.text(), &full[..first]);
    assert_eq!(
        streamed,
        g.text(),
        "streamed deltas must add up to the text and never include the stop string"
    );
    let mut s = engine.session().unwrap();
    let mut g = s
        .generate(
            Prompt::Text("x"),
            &GenerateOptions {
                max_tokens: 3,
                ..greedy
            },
        )
        .unwrap();
    g.run().unwrap();
    assert_eq!(g.finish_reason(), Some(FinishReason::Length));
    assert_eq!(g.ids().len(), 3);
}

#[test]
fn chat_needs_a_template_and_says_so() {
    let engine = Engine::builder().model(demo()).threads(1).build().unwrap();
    let e = engine
        .session()
        .unwrap()
        .generate(
            Prompt::Chat(&[Message::new("user", "hi")]),
            &GenerateOptions::default(),
        )
        .unwrap_err();
    assert!(e.to_string().contains("chat template"), "{e}");
    assert!(e.is_input_error());
}

#[test]
fn a_shard_truncated_while_running_ends_that_request_and_the_engine_recovers() {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for e in std::fs::read_dir(demo()).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, tmp.path().join(p.file_name().unwrap())).unwrap();
    }
    // A budget of half the model: experts are read during generation.
    let engine = Engine::builder()
        .model(tmp.path())
        .memory(Memory::Bytes((10 << 20) + common::text(512, 1)))
        .threads(2)
        .build()
        .unwrap();
    let o = opts(11, 24);
    let first = engine
        .session()
        .unwrap()
        .generate(Prompt::Text("The weather"), &o)
        .unwrap()
        .run()
        .unwrap();

    let shard = tmp.path().join("model.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_len(bytes.len() as u64 / 3)
        .unwrap();
    let mut s = engine.session().unwrap();
    // The prompt itself may already need a missing expert; otherwise a later step does.
    let e = match s.generate(Prompt::Text("The weather"), &o) {
        Err(e) => e,
        Ok(mut g) => {
            let mut tokens = 0;
            let mut failed = None;
            for t in g.by_ref() {
                match t {
                    Ok(_) => tokens += 1,
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            assert!(tokens < 24);
            assert!(g.next().is_none(), "nothing after the error");
            failed.expect("a truncated shard must end the request with an error")
        }
    };
    assert!(e.to_string().contains("model.safetensors"), "{e}");
    assert!(
        !e.is_input_error(),
        "a read failure is a runtime error (exit 1)"
    );

    drop(s);
    std::fs::write(&shard, &bytes).unwrap();
    let again = engine
        .session()
        .unwrap()
        .generate(Prompt::Text("The weather"), &o)
        .unwrap()
        .run()
        .unwrap();
    assert_eq!(again, first);
}

#[test]
fn a_prompt_beyond_the_planned_context_is_a_clear_error() {
    let engine = Engine::builder()
        .model(demo())
        .context(16)
        .threads(1)
        .build()
        .unwrap();
    let long: Vec<u32> = (0..40).collect();
    let e = engine
        .session()
        .unwrap()
        .generate(Prompt::Ids(&long), &GenerateOptions::default())
        .unwrap_err();
    assert!(e.to_string().contains("context full"), "{e}");
    assert!(e.is_input_error());
}

#[test]
fn the_grammar_index_is_paid_for_out_of_the_expert_cache_under_a_budget() {
    let build = |m: Memory| {
        Engine::builder()
            .model(demo())
            .memory(m)
            .threads(2)
            .context(64)
            .build()
            .unwrap()
    };
    // A budget whose cache cannot spare the index says so.
    let tight = build(Memory::Bytes((16 << 20) + common::text(64, 1)));
    let err = tight
        .compile_grammar(&sluice::Grammar::JsonObject)
        .unwrap_err()
        .to_string();
    assert!(err.contains("raise --memory"), "{err}");
    let e = build(Memory::Bytes((24 << 20) + common::text(64, 1)));
    let before = e.model().experts().capacity();
    let g = sluice::Grammar::JsonObject;
    e.compile_grammar(&g).unwrap();
    let want = sluice_grammar_index_bytes(e.tokenizer().unwrap().vocab_size());
    assert_eq!(before - e.model().experts().capacity(), want);
    // Indexed once: a second grammar takes nothing more.
    e.compile_grammar(&sluice::Grammar::Lark("start: \"x\"".into()))
        .unwrap();
    assert_eq!(before - e.model().experts().capacity(), want);
    // Unlimited memory lends nothing.
    let u = build(Memory::Unlimited);
    let c = u.model().experts().capacity();
    u.compile_grammar(&g).unwrap();
    assert_eq!(u.model().experts().capacity(), c);
}

/// 2 MiB plus 320 bytes per token (sluice-grammar's `index_bytes`, restated so that a change of
/// the estimate is a change of this test too).
fn sluice_grammar_index_bytes(tokens: usize) -> u64 {
    (2 << 20) + 320 * tokens as u64
}
