//! Speculative decoding changes the speed, never the output: on every fixture family (softmax
//! attention of every kind, and the recurrent KDA and gated-DeltaNet states, which can step
//! back only to where their latest pass began), greedy and seeded sampling, with the model
//! resident and with it streaming at its minimum budget, drafting gives the ids decoding one
//! token at a time gives — and drafts were proposed, accepted and rejected along the way.

mod common;

use std::path::Path;

use sluice::{Draft, Engine, GenerateOptions, Memory, Prompt, SamplingOptions};

/// A prompt that repeats itself, so that prompt lookup has something to propose.
fn prompt(vocab: usize) -> Vec<u32> {
    let base: Vec<u32> = (0..9).map(|i| ((i * 37 + 11) % vocab) as u32).collect();
    base.iter().chain(&base).chain(&base).copied().collect()
}

fn generate(
    engine: &Engine,
    ids: &[u32],
    sampling: &SamplingOptions,
    draft: Draft,
) -> (Vec<u32>, usize, usize) {
    let opts = GenerateOptions {
        max_tokens: 24,
        sampling: sampling.clone(),
        stop_at_eos: false,
        draft,
        ..Default::default()
    };
    let mut s = engine.session().unwrap();
    let mut g = s.generate(Prompt::Ids(ids), &opts).unwrap();
    g.run().unwrap();
    let st = g.stats();
    (g.ids().to_vec(), st.draft_proposed, st.draft_accepted)
}

#[test]
fn drafting_gives_the_same_ids_on_every_family_resident_and_streamed() {
    let greedy = SamplingOptions::default();
    let sampled = SamplingOptions {
        temperature: 0.9,
        top_p: 0.95,
        seed: 5,
        ..Default::default()
    };
    let (mut proposed, mut accepted) = (0, 0);
    for dir in common::families() {
        let builder = || Engine::builder().model(&dir).threads(2).context(64);
        let min = common::minimum(builder());
        for memory in [Memory::Unlimited, Memory::Bytes(min + (256 << 10))] {
            let engine = builder().memory(memory).build().unwrap();
            let ids = prompt(engine.model().config().vocab);
            for sampling in [&greedy, &sampled] {
                let (want, _, _) = generate(&engine, &ids, sampling, Draft::Off);
                for draft in [
                    Draft::Ngram { tokens: None },
                    Draft::Ngram { tokens: Some(3) },
                ] {
                    let (got, p, a) = generate(&engine, &ids, sampling, draft);
                    assert_eq!(
                        got,
                        want,
                        "{}: {memory:?}, {sampling:?}, {draft:?}",
                        dir.display()
                    );
                    assert!(a <= p);
                    proposed += p;
                    accepted += a;
                }
            }
        }
    }
    // The checks above checked something: drafts were made, some kept, some not.
    assert!(
        accepted > 0 && accepted < proposed,
        "{accepted} of {proposed}"
    );
}

#[test]
fn a_chat_continues_the_same_after_a_drafted_turn() {
    // After a turn with drafts (some rejected), the session holds exactly the chosen tokens:
    // the next turn gives what it gives after an undrafted turn.
    for dir in [
        common::demo(),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models/qwen3_next-fp32"),
    ] {
        let engine = Engine::builder()
            .model(&dir)
            .threads(2)
            .context(64)
            .build()
            .unwrap();
        let ids = prompt(engine.model().config().vocab);
        let turn = |draft: Draft| {
            let mut s = engine.session().unwrap();
            let opts = GenerateOptions {
                max_tokens: 12,
                stop_at_eos: false,
                draft,
                ..Default::default()
            };
            let first = {
                let mut g = s.generate(Prompt::Ids(&ids[..18]), &opts).unwrap();
                g.run().unwrap();
                g.ids().to_vec()
            };
            // A generation dropped part-way, with drafts outstanding.
            {
                let mut g = s.generate(Prompt::Ids(&ids[18..21]), &opts).unwrap();
                g.next().unwrap().unwrap();
                g.next().unwrap().unwrap();
            }
            let mut g = s.generate(Prompt::Ids(&ids[21..]), &opts).unwrap();
            g.run().unwrap();
            (first, g.ids().to_vec(), s.history().to_vec())
        };
        assert_eq!(
            turn(Draft::Ngram { tokens: Some(4) }),
            turn(Draft::Off),
            "{}",
            dir.display()
        );
    }
}

#[test]
fn a_draft_length_out_of_range_is_refused() {
    let engine = Engine::builder().model(common::demo()).build().unwrap();
    let mut s = engine.session().unwrap();
    for n in [0, sluice::MAX_DRAFT + 1] {
        let opts = GenerateOptions {
            draft: Draft::Ngram { tokens: Some(n) },
            ..Default::default()
        };
        let e = s
            .generate(Prompt::Ids(&[1, 2]), &opts)
            .unwrap_err()
            .to_string();
        assert!(e.contains("draft tokens"), "{e}");
    }
}

#[test]
fn the_batcher_drafts_per_sequence_and_changes_no_token() {
    use sluice::OwnedPrompt;
    let (mut proposed, mut accepted) = (0, 0);
    for dir in [
        common::demo(),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models/qwen3_next-fp32"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models/deepseek_v3-fp32"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models/deepseek_v4-fp32"),
    ] {
        let builder = || {
            Engine::builder()
                .model(&dir)
                .threads(2)
                .context(64)
                .sequences(4)
        };
        let min = common::minimum(builder());
        for memory in [Memory::Unlimited, Memory::Bytes(min + (256 << 10))] {
            let engine = builder().memory(memory).build().unwrap();
            let ids = prompt(engine.model().config().vocab);
            // Four jobs: greedy and sampled, drafting at a fixed length and adaptively, and one
            // not drafting at all, of different lengths, decoded together.
            let job = |i: usize, draft: Draft| {
                let opts = GenerateOptions {
                    max_tokens: 10 + 5 * i,
                    sampling: SamplingOptions {
                        temperature: if i.is_multiple_of(2) { 0.0 } else { 0.8 },
                        seed: i as u64,
                        ..Default::default()
                    },
                    stop_at_eos: false,
                    draft,
                    ..Default::default()
                };
                (OwnedPrompt::Ids(ids[i..].to_vec()), opts)
            };
            let drafts = [
                Draft::Ngram { tokens: Some(3) },
                Draft::Ngram { tokens: Some(2) },
                Draft::Ngram { tokens: None },
                Draft::Off,
            ];
            let want: Vec<Vec<u32>> = (0..4)
                .map(|i| {
                    let (p, o) = job(i, Draft::Off);
                    let OwnedPrompt::Ids(p) = p else {
                        unreachable!()
                    };
                    let mut s = engine.session().unwrap();
                    let mut g = s.generate(Prompt::Ids(&p), &o).unwrap();
                    g.run().unwrap();
                    g.ids().to_vec()
                })
                .collect();
            let jobs = drafts.iter().enumerate().map(|(i, d)| job(i, *d)).collect();
            let got: Vec<_> = common::batched(&engine, 4, jobs)
                .into_iter()
                .map(|f| (f.ids, f.stats.draft_proposed, f.stats.draft_accepted))
                .collect();
            for i in 0..4 {
                let (ids, p, a) = got[i].clone();
                assert_eq!(ids, want[i], "{}: {memory:?}, job {i}", dir.display());
                assert!(a <= p);
                if i == 3 {
                    assert_eq!(p, 0, "job 3 does not draft");
                }
                proposed += p;
                accepted += a;
            }
        }
    }
    // Drafts were made, some kept and some not, inside the batch.
    assert!(
        accepted > 0 && accepted < proposed,
        "{accepted} of {proposed}"
    );
}
