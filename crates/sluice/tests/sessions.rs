//! Sessions continue where they left off — on a model with a recurrent state (Kimi K3's KDA
//! layers) too: after a generation stopped by `max_tokens` (its last token is in the history
//! but was never run), with new ids or with none, the tokens are those of one uninterrupted
//! generation.

use std::path::PathBuf;

use sluice::{Engine, GenerateOptions, Memory, Session};

fn k3() -> Engine {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/kimi/k3/k3-tiny-bf16");
    Engine::builder()
        .model(dir)
        .memory(Memory::Unlimited)
        .threads(1)
        .build()
        .unwrap()
}

fn greedy(s: &mut Session, ids: Vec<u32>, n: usize, chunk: usize) -> Vec<u32> {
    greedy_spans(s, ids, n, chunk, None)
}

/// Greedy generation with prefill calls of `chunk` rows in passes of at most `span` tokens.
fn greedy_spans(
    s: &mut Session,
    ids: Vec<u32>,
    n: usize,
    chunk: usize,
    span: Option<usize>,
) -> Vec<u32> {
    let opts = GenerateOptions {
        max_tokens: n,
        stop_at_eos: false,
        prefill_chunk: chunk,
        prefill_span: span,
        ..Default::default()
    };
    let mut g = s.generate_ids(ids, &opts).unwrap();
    g.run().unwrap();
    g.ids().to_vec()
}

const PROMPT: [u32; 7] = [383, 178, 452, 226, 380, 239, 384];

#[test]
fn continuing_with_no_ids_is_one_generation() {
    let e = k3();
    let whole = greedy(&mut e.session().unwrap(), PROMPT.to_vec(), 8, 64);
    // Calls of 1, 2, 3 or 64 rows inside a layer, in one pass or in passes of 3 or 5 tokens:
    // the recurrent state advances chunk by chunk within a pass and is saved once per pass.
    for (chunk, span) in [(1, None), (3, None), (2, Some(5)), (3, Some(3)), (64, None)] {
        let mut s = e.session().unwrap();
        let mut got = greedy_spans(&mut s, PROMPT.to_vec(), 3, chunk, span);
        got.extend(greedy_spans(&mut s, Vec::new(), 5, chunk, span));
        assert_eq!(got, whole, "chunk {chunk}, span {span:?}");
    }
}

#[test]
fn continuing_with_new_ids_runs_the_pending_token_first() {
    let e = k3();
    let mut s = e.session().unwrap();
    let first = greedy(&mut s, PROMPT.to_vec(), 2, 4);
    let next = greedy(&mut s, vec![7, 8], 4, 4);
    // The same history in one go.
    let mut ids = PROMPT.to_vec();
    ids.extend(&first);
    ids.extend([7, 8]);
    let fresh = greedy(&mut e.session().unwrap(), ids.clone(), 4, 4);
    assert_eq!(next, fresh);
    let mut want_history = ids;
    want_history.extend(&next);
    assert_eq!(s.history(), &want_history[..]);
}

#[test]
fn recomputing_the_last_position_after_a_prefill() {
    // A generation of no tokens leaves the state at the end of the history; continuing then
    // recomputes the last position: by stepping the recurrent state back one token (prefill in
    // chunks of 1) or by running the history again (prefill in one chunk).
    let e = k3();
    let whole = greedy(&mut e.session().unwrap(), PROMPT.to_vec(), 4, 64);
    for chunk in [1, 64] {
        let mut s = e.session().unwrap();
        assert!(greedy(&mut s, PROMPT.to_vec(), 0, chunk).is_empty());
        assert_eq!(greedy(&mut s, Vec::new(), 4, chunk), whole, "chunk {chunk}");
    }
}
