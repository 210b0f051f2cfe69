//! Sessions on one engine in parallel threads, 1 to 8 of them, at the smallest budget their
//! plan accepts, a little above it and unlimited: none ever hangs (each run is under a
//! watchdog that fails the test rather than CI), each produces exactly what it produces alone,
//! and sessions beyond what the plan holds are refused at once with a typed error. The same
//! through the batcher with more requests than its width.

use std::sync::mpsc;
use std::time::Duration;

use sluice::{Batcher, Event, OwnedPrompt};
use sluice::{Engine, Error, GenerateOptions, Memory, Prompt, SamplingOptions};

mod common;
use common::demo;

/// How long one run of concurrent sessions may take before it counts as a hang (a run takes
/// well under a second).
const WATCHDOG: Duration = Duration::from_secs(120);

const PROMPTS: [&str; 4] = [
    "It is a truth universally acknowledged",
    "The weather",
    // Long enough that its prefill runs the experts as tasks across the threads, while other
    // sessions' passes run beside it.
    "Mr. Darcy said that the whole of the party had walked out into the garden that morning, \
     and that nobody had yet come back to the house",
    "In the morning",
];

fn opts(i: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens: 16,
        sampling: if i.is_multiple_of(2) {
            SamplingOptions::default()
        } else {
            SamplingOptions {
                temperature: 0.8,
                top_p: 0.95,
                seed: i as u64,
                ..Default::default()
            }
        },
        stop_at_eos: false,
        ..Default::default()
    }
}

fn generate(engine: &Engine, i: usize) -> Result<Vec<u32>, Error> {
    let mut s = engine.session()?;
    let mut g = s.generate(Prompt::Text(PROMPTS[i % 4]), &opts(i))?;
    g.run()?;
    Ok(g.ids().to_vec())
}

fn builder(sequences: usize) -> sluice::EngineBuilder {
    Engine::builder()
        .model(demo())
        .threads(2)
        .sequences(sequences)
}

/// The smallest budget the plan accepts for `sequences` sequences.
fn minimum(sequences: usize) -> u64 {
    common::minimum(builder(sequences))
}

/// `n` sessions in parallel threads; fails (naming the setting) instead of hanging.
fn parallel(engine: &Engine, n: usize, what: &str) -> Vec<Vec<u32>> {
    let (tx, rx) = mpsc::channel();
    for i in 0..n {
        let (e, tx) = (engine.clone(), tx.clone());
        std::thread::spawn(move || {
            let _ = tx.send((i, generate(&e, i)));
        });
    }
    drop(tx);
    let mut out = vec![Vec::new(); n];
    for _ in 0..n {
        let (i, r) = rx
            .recv_timeout(WATCHDOG)
            .unwrap_or_else(|_| panic!("{what}: {n} concurrent sessions hung"));
        out[i] = r.unwrap_or_else(|e| panic!("{what}: session {i}: {e}"));
    }
    out
}

#[test]
fn one_to_eight_concurrent_sessions_never_hang_and_match_solo_runs() {
    let reference = builder(1).memory(Memory::Unlimited).build().unwrap();
    let solo: Vec<Vec<u32>> = (0..8).map(|i| generate(&reference, i).unwrap()).collect();
    for n in [1, 2, 3, 4, 6, 8] {
        let min = minimum(n);
        for (label, memory) in [
            ("minimum", Memory::Bytes(min)),
            ("minimum + 1 MiB", Memory::Bytes(min + (1 << 20))),
            ("minimum + 4 MiB", Memory::Bytes(min + (4 << 20))),
            ("unlimited", Memory::Unlimited),
        ] {
            let engine = builder(n).memory(memory).build().unwrap();
            let what = format!("{n} sessions at {label}");
            let got = parallel(&engine, n, &what);
            assert_eq!(got, solo[..n], "{what}");
            let s = engine.expert_stats();
            assert_eq!(s.requests, s.hits + s.misses, "{what}");
            assert_eq!(
                engine.sequences_in_use().0,
                0,
                "{what}: every claim given back"
            );
        }
    }
}

#[test]
fn the_setting_of_the_report_completes() {
    // The report: 12 MiB, two to four threads, 16 tokens each; now planned for four.
    let engine = builder(4)
        .memory(Memory::Bytes((12 << 20) + common::text(64, 4)))
        .context(64)
        .build();
    let engine = match engine {
        Ok(e) => e,
        Err(e) => panic!("12 MiB for four sessions of 64 positions: {e}"),
    };
    let reference = builder(1).memory(Memory::Unlimited).build().unwrap();
    for n in 2..=4 {
        let solo: Vec<Vec<u32>> = (0..n).map(|i| generate(&reference, i).unwrap()).collect();
        assert_eq!(parallel(&engine, n, &format!("{n} at 12 MiB")), solo);
    }
}

#[test]
fn sessions_beyond_the_plan_are_refused_at_once() {
    let engine = builder(2)
        .memory(Memory::Bytes(minimum(2)))
        .build()
        .unwrap();
    assert_eq!(engine.sequences_in_use(), (0, Some(2)));
    let a = engine.session().unwrap();
    let b = engine.session().unwrap();
    match engine.session() {
        Err(Error::Sequences {
            wanted: 1,
            open: 2,
            planned: 2,
        }) => {}
        other => panic!("a third session on a plan for two: {other:?}"),
    }
    let msg = engine.session().unwrap_err().to_string();
    assert!(msg.contains("EngineBuilder::sequences"), "{msg}");
    // A batcher needs its whole width free.
    drop(a);
    assert!(matches!(
        Batcher::new(engine.clone(), 2),
        Err(Error::Sequences {
            wanted: 2,
            open: 1,
            planned: 2
        })
    ));
    drop(b);
    let batcher = Batcher::new(engine.clone(), 2).unwrap();
    assert!(matches!(engine.session(), Err(Error::Sequences { .. })));
    drop(batcher);
    // Given back: the session opens, and generates.
    assert!(generate(&engine, 0).is_ok());
    // Without a budget there is nothing to exceed.
    let unlimited = builder(1).memory(Memory::Unlimited).build().unwrap();
    let many: Vec<_> = (0..10).map(|_| unlimited.session().unwrap()).collect();
    assert_eq!(unlimited.sequences_in_use(), (10, None));
    drop(many);
}

#[test]
fn a_batcher_with_more_requests_than_its_width_never_hangs() {
    let reference = builder(1).memory(Memory::Unlimited).build().unwrap();
    let solo: Vec<Vec<u32>> = (0..9).map(|i| generate(&reference, i).unwrap()).collect();
    for width in [1, 2, 3] {
        for memory in [Memory::Bytes(minimum(width)), Memory::Unlimited] {
            let engine = builder(width).memory(memory).build().unwrap();
            let batcher = Batcher::new(engine, width).unwrap();
            let (tx, rx) = mpsc::channel();
            for i in 0..9 {
                let tx = tx.clone();
                let prompt = OwnedPrompt::Text(PROMPTS[i % 4].into());
                batcher
                    .submit(
                        &prompt,
                        opts(i),
                        Box::new(move |e| {
                            match e {
                                Event::Done(f) => {
                                    let _ = tx.send((i, Ok(f.ids)));
                                }
                                Event::Failed(e) => {
                                    let _ = tx.send((i, Err(e.to_string())));
                                }
                                Event::Token(_) => {}
                            }
                            true
                        }),
                    )
                    .unwrap();
            }
            drop(tx);
            let mut got = vec![Vec::new(); 9];
            for _ in 0..9 {
                let (i, ids) = rx
                    .recv_timeout(WATCHDOG)
                    .unwrap_or_else(|_| panic!("a batcher {width} wide hung at {memory:?}"));
                got[i] = ids.unwrap_or_else(|e| panic!("job {i}, width {width}: {e}"));
            }
            assert_eq!(got, solo, "batcher {width} wide at {memory:?}");
        }
    }
}
