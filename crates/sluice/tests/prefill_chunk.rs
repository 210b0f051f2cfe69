//! `GenerateOptions::prefill_chunk` (rows per call inside a layer) under a memory budget never
//! exceeds the chunk the plan's scratch was made for: a larger one is clamped (the output is the
//! same whatever the chunk), in sessions and in the batcher alike. Without a budget it is used as
//! given. `GenerateOptions::prefill_span` caps the tokens of each layer-major pass.

mod common;

use common::demo;
use sluice::{Batcher, OwnedPrompt};
use sluice::{Engine, GenerateOptions, Memory, Prompt};

const PROMPT: &str = "It is a truth universally acknowledged, that a single man in possession";

fn opts() -> GenerateOptions {
    GenerateOptions {
        max_tokens: 8,
        stop_at_eos: false,
        // Far more than the engine below planned its scratch for.
        prefill_chunk: 64,
        ..Default::default()
    }
}

#[test]
fn a_larger_prefill_chunk_is_clamped_to_the_planned_one_under_a_budget() {
    let planned = 4;
    let builder = || {
        Engine::builder()
            .model(demo())
            .threads(1)
            .prefill_chunk(planned)
            // Every run below computes the prompt: none starts from an earlier one's state.
            .prefix_cache(0)
    };
    let budget = 2 * common::minimum(builder());
    let engine = builder().memory(Memory::Bytes(budget)).build().unwrap();
    assert_eq!(engine.prefill_chunk(), planned);
    let n = engine.encode(&Prompt::Text(PROMPT)).unwrap().len();
    assert!(
        n > planned,
        "the prompt must need more than one planned chunk"
    );

    let unlimited = builder().build().unwrap();
    let (want, chunks) = {
        let mut s = unlimited.session().unwrap();
        let mut g = s.generate(Prompt::Text(PROMPT), &opts()).unwrap();
        g.run().unwrap();
        (g.ids().to_vec(), g.stats())
    };
    // Unlimited memory: the chunk asked for, one pass over the whole prompt.
    assert_eq!(chunks.prefill_chunk, 64);
    assert_eq!(chunks.prefill_spans.len(), 1);
    assert_eq!(chunks.prefill_spans[0].tokens, n);

    let check = |what: &str, ids: &[u32], st: &sluice::GenerationStats| {
        assert_eq!(ids, &want[..], "{what}: the clamp changes no token");
        assert_eq!(st.prefill_chunk, planned, "{what}");
        assert_eq!(
            st.prefill_spans.iter().map(|s| s.tokens).sum::<usize>(),
            n,
            "{what}"
        );
    };
    {
        let mut s = engine.session().unwrap();
        let mut g = s.generate(Prompt::Text(PROMPT), &opts()).unwrap();
        g.run().unwrap();
        check("session", g.ids(), &g.stats());
        // Spans capped at 3 tokens: more passes, the same tokens; the progress hook hears of
        // every layer of every pass, the tokens done never going back, up to the whole prompt.
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = std::sync::Arc::clone(&seen);
        let capped = GenerateOptions {
            prefill_span: Some(3),
            on_prefill: Some(sluice::PrefillHook(std::sync::Arc::new(
                move |p: &sluice::PrefillProgress| log.lock().unwrap().push((p.done, p.total)),
            ))),
            ..opts()
        };
        drop(g);
        drop(s);
        let mut s = engine.session().unwrap();
        let mut g = s.generate(Prompt::Text(PROMPT), &capped).unwrap();
        g.run().unwrap();
        check("session, spans of 3", g.ids(), &g.stats());
        let spans: Vec<usize> = g.stats().prefill_spans.iter().map(|s| s.tokens).collect();
        assert_eq!(spans.len(), n.div_ceil(3), "{spans:?}");
        assert!(spans.iter().all(|&s| s <= 3), "{spans:?}");
        let seen = seen.lock().unwrap();
        let layers = engine.model().config().layers;
        assert_eq!(seen.len(), spans.len() * layers, "{seen:?}");
        assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0), "{seen:?}");
        assert!(seen.iter().all(|&(_, total)| total == n));
        assert_eq!(seen.last().map(|p| p.0), Some(n));
    }
    let batcher = Batcher::new(engine, 1).unwrap();
    let f = batcher
        .generate(&OwnedPrompt::Text(PROMPT.into()), opts())
        .unwrap();
    check("batcher", &f.ids, &f.stats);
}
