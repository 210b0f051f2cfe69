//! Drafting with the checkpoint's multi-token-prediction layer changes the speed, never the
//! output: on the fixtures with an MTP layer (`testdata/mtp/*`: Qwen3-Next's `mtp.*`, whose
//! gated-DeltaNet layers step back only to where their latest pass began, and DeepSeek-V3's
//! and GLM-4.5's layer after the last, over MLA and grouped-query attention; DeepSeek-V4's
//! `mtp.0.*` in its model fixtures, f32 and bf16, over hyper-connection streams, sliding-window
//! attention with compressed entries and hash-routed layers), greedy and
//! seeded sampling, resident and streaming at the minimum budget, for a session, a chat whose
//! turns continue one state, and the batcher.

mod common;

use std::path::{Path, PathBuf};

use sluice::OwnedPrompt;
use sluice::{Draft, Engine, EngineBuilder, GenerateOptions, Memory, Prompt, SamplingOptions};

const FIXTURES: [&str; 5] = [
    "qwen3_next-fp32",
    "deepseek_v3-fp32",
    "glm4_moe-fp32",
    "deepseek_v4-fp32",
    "deepseek_v4-bf16",
];

/// The fixture's checkpoint: its own under `testdata/mtp/`, or the model fixture when that
/// carries the MTP layer already (DeepSeek-V4's).
fn fixture(name: &str) -> PathBuf {
    let testdata = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata");
    let own = testdata.join("mtp").join(name);
    if own.join("config.json").exists() {
        own
    } else {
        testdata.join("models").join(name)
    }
}

fn builder(name: &str) -> EngineBuilder {
    Engine::builder()
        .model(fixture(name))
        .threads(2)
        .context(96)
        .mtp(true)
}

fn prompt(vocab: usize) -> Vec<u32> {
    (0..20).map(|i| ((i * 37 + 11) % vocab) as u32).collect()
}

fn opts(sampling: &SamplingOptions, draft: Draft, max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampling: sampling.clone(),
        stop_at_eos: false,
        draft,
        ..Default::default()
    }
}

fn samplings() -> [SamplingOptions; 2] {
    [
        SamplingOptions::default(),
        SamplingOptions {
            temperature: 0.9,
            top_p: 0.95,
            seed: 5,
            ..Default::default()
        },
    ]
}

#[test]
fn mtp_drafting_gives_the_same_ids_resident_and_streamed() {
    for name in FIXTURES {
        same_ids_resident_and_streamed(name);
    }
}

fn same_ids_resident_and_streamed(name: &str) {
    let min = common::minimum(builder(name).sequences(1));
    let mut proposed = 0;
    for memory in [Memory::Unlimited, Memory::Bytes(min + (256 << 10))] {
        let engine = builder(name).memory(memory).build().unwrap();
        let ids = prompt(engine.model().config().vocab);
        for sampling in &samplings() {
            let run = |draft: Draft| {
                let mut s = engine.session().unwrap();
                let mut g = s
                    .generate(Prompt::Ids(&ids), &opts(sampling, draft, 24))
                    .unwrap();
                g.run().unwrap();
                let st = g.stats();
                assert!(st.draft_accepted <= st.draft_proposed);
                (g.ids().to_vec(), st.draft_proposed)
            };
            let (want, none) = run(Draft::Off);
            assert_eq!(none, 0);
            for draft in [
                Draft::Mtp { tokens: Some(1) },
                Draft::Mtp { tokens: Some(3) },
                Draft::Mtp { tokens: None },
            ] {
                let (got, p) = run(draft);
                assert_eq!(got, want, "{name} {memory:?}, {sampling:?}, {draft:?}");
                proposed += p;
            }
        }
    }
    assert!(proposed > 0, "{name}: the MTP layer proposed nothing");
}

#[test]
fn a_chat_continues_the_same_after_mtp_drafted_turns() {
    for name in FIXTURES {
        chat_continues_the_same(name);
    }
}

fn chat_continues_the_same(name: &str) {
    let engine = builder(name).build().unwrap();
    let ids = prompt(engine.model().config().vocab);
    for sampling in &samplings() {
        let turn = |draft: Draft| {
            let mut s = engine.session().unwrap();
            let mut out = Vec::new();
            for part in [&ids[..8], &ids[8..11], &ids[11..]] {
                let mut g = s
                    .generate(Prompt::Ids(part), &opts(sampling, draft, 10))
                    .unwrap();
                g.run().unwrap();
                out.push(g.ids().to_vec());
            }
            // A generation dropped part-way, with a draft outstanding.
            {
                let mut g = s
                    .generate(Prompt::Ids(&ids[..2]), &opts(sampling, draft, 10))
                    .unwrap();
                g.next().unwrap().unwrap();
                g.next().unwrap().unwrap();
            }
            let mut g = s
                .generate(Prompt::Ids(&ids[2..5]), &opts(sampling, draft, 10))
                .unwrap();
            g.run().unwrap();
            out.push(g.ids().to_vec());
            (out, s.history().to_vec())
        };
        assert_eq!(
            turn(Draft::Mtp { tokens: Some(2) }),
            turn(Draft::Off),
            "{name} {sampling:?}"
        );
    }
}

#[test]
fn the_batcher_drafts_with_the_mtp_layer_and_changes_no_token() {
    for name in FIXTURES {
        batcher_changes_no_token(name);
    }
}

fn batcher_changes_no_token(name: &str) {
    let b = || builder(name).sequences(3);
    let min = common::minimum(b());
    let mut proposed = 0;
    for memory in [Memory::Unlimited, Memory::Bytes(min + (256 << 10))] {
        let engine = b().memory(memory).build().unwrap();
        let ids = prompt(engine.model().config().vocab);
        let [greedy, sampled] = samplings();
        let jobs = [
            (greedy.clone(), Draft::Mtp { tokens: Some(2) }),
            (sampled, Draft::Mtp { tokens: None }),
            (greedy, Draft::Off),
        ];
        let want: Vec<Vec<u32>> = jobs
            .iter()
            .enumerate()
            .map(|(i, (s, _))| {
                let mut sess = engine.session().unwrap();
                let mut g = sess
                    .generate(Prompt::Ids(&ids[i..]), &opts(s, Draft::Off, 12 + 4 * i))
                    .unwrap();
                g.run().unwrap();
                g.ids().to_vec()
            })
            .collect();
        let batch = jobs
            .iter()
            .enumerate()
            .map(|(i, (s, d))| (OwnedPrompt::Ids(ids[i..].to_vec()), opts(s, *d, 12 + 4 * i)))
            .collect();
        for (i, f) in common::batched(&engine, 3, batch).into_iter().enumerate() {
            assert_eq!(f.ids, want[i], "{name} {memory:?}, job {i}");
            proposed += f.stats.draft_proposed;
        }
    }
    assert!(proposed > 0, "{name}");
}

#[test]
fn mtp_drafting_needs_the_layer_loaded() {
    // Built without it: refused at the generation, naming the option.
    let engine = Engine::builder()
        .model(fixture(FIXTURES[0]))
        .build()
        .unwrap();
    let mut s = engine.session().unwrap();
    let e = s
        .generate(
            Prompt::Ids(&[1, 2, 3]),
            &opts(&SamplingOptions::default(), Draft::Mtp { tokens: None }, 4),
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("draft mtp") && e.contains("EngineBuilder::mtp"),
        "{e}"
    );
    // Checkpoints without one: refused when the engine is built.
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models");
    for (name, says) in [
        ("qwen3_next-fp32", "no multi-token-prediction"),
        ("deepseek_v3-fp32", "no multi-token-prediction"),
    ] {
        let e = Engine::builder()
            .model(models.join(name))
            .mtp(true)
            .build()
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "{name}: {e}");
    }
}

/// The MTP layer's KV cache is planned beside the sequence's: drafting to the end of the
/// context a tight budget allows never runs the sequence out of room, and gives the ids of
/// the same engine without drafts.
#[test]
fn mtp_drafting_to_the_end_of_a_tight_context_fails_nothing() {
    for name in FIXTURES {
        let min = common::minimum(builder(name).sequences(1));
        for extra in [0, 64 << 10] {
            let engine = builder(name)
                .memory(Memory::Bytes(min + extra))
                .build()
                .unwrap();
            let fit = engine.model().max_positions();
            let ids = prompt(engine.model().config().vocab);
            let run = |draft: Draft| {
                let mut s = engine.session().unwrap();
                let max = fit - ids.len();
                let mut g = s
                    .generate(
                        Prompt::Ids(&ids),
                        &opts(&SamplingOptions::default(), draft, max),
                    )
                    .unwrap();
                g.run()
                    .unwrap_or_else(|e| panic!("{name} +{extra} {draft:?}: {e}"));
                (g.ids().to_vec(), g.stats().draft_proposed)
            };
            let (want, _) = run(Draft::Off);
            assert_eq!(want.len(), fit - ids.len(), "{name}");
            for draft in [Draft::Mtp { tokens: Some(4) }, Draft::Mtp { tokens: None }] {
                let (got, proposed) = run(draft);
                assert_eq!(got, want, "{name} +{extra} {draft:?}");
                assert!(proposed > 0);
            }
        }
    }
}
