//! DeepSeek-V4's compressed attention keeps a bounded state: only its compressed entries grow
//! with the context, and, like a recurrent state, it goes back only to the start or to where
//! the latest pass began.

use std::path::Path;

use sluice_model::{Logits, Model, ModelOptions};

fn model() -> Model {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models/deepseek_v4-fp32");
    Model::open(
        &dir,
        ModelOptions {
            context: 256,
            ..Default::default()
        },
    )
    .unwrap()
}

fn ids(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + salt * 11 + 5) % 512)
        .collect()
}

/// Feeds `n` tokens one pass at a time of `step` and returns the cache bytes.
fn grow(m: &Model, st: &mut sluice_model::State, n: usize, step: usize) -> usize {
    let toks = ids(n, 1);
    for c in toks.chunks(step) {
        m.forward(st, c, Logits::Last).unwrap();
    }
    st.cache_bytes()
}

#[test]
fn only_the_compressed_entries_grow_with_the_context() {
    let m = model();
    // After the same last pass (one token), 200 and 216 positions differ by the entries of
    // the 16 positions between them: the heavily compressed layers 0 and 4 (entries of 8,
    // 32 floats), the compressed-sparse layers 1 and 3 (entries of 4, 32 floats, and the
    // indexer's of 16); the sliding layer 2 grows not at all.
    let (mut a, mut b) = (m.new_state(), m.new_state());
    let at_200 = grow(&m, &mut a, 200, 1);
    let at_216 = grow(&m, &mut b, 216, 1);
    let entries = 2 * (16 / 8) * 32 + 2 * (16 / 4) * (32 + 16);
    assert_eq!(at_216 - at_200, 4 * entries);
    // A full cache of keys alone would hold 200 × 5 layers × 32 floats.
    assert!(at_200 < 200 * 5 * 32 * 4, "{at_200} bytes at 200 positions");
}

#[test]
fn it_goes_back_only_to_the_start_or_the_latest_pass_and_then_continues_the_same() {
    let m = model();
    let (first, second) = (ids(30, 2), ids(13, 3));
    let mut st = m.new_state();
    m.forward(&mut st, &first, Logits::Last).unwrap();
    let want = m.forward(&mut st, &second, Logits::All).unwrap();
    // Into the middle of the latest pass, or of an earlier one: refused, nothing changed.
    for pos in [35, 20] {
        assert!(!st.can_truncate(pos), "{pos}");
        assert!(st.truncate(pos).is_err(), "{pos}");
        assert_eq!(st.pos(), 43);
    }
    // Where the latest pass began: the same logits again.
    st.truncate(30).unwrap();
    assert_eq!(m.forward(&mut st, &second, Logits::All).unwrap(), want);
    // To the start: a fresh run.
    st.truncate(0).unwrap();
    m.forward(&mut st, &first, Logits::Last).unwrap();
    assert_eq!(m.forward(&mut st, &second, Logits::All).unwrap(), want);
}
