//! Sessions on disk: a saved and reloaded session continues exactly as one that was never
//! interrupted (KV caches of GQA and MLA, and the recurrent KDA and gated-DeltaNet states), and
//! a file of another model, a truncated one or a flipped bit is refused with one line naming it,
//! leaving the session as it was.

mod common;

use std::path::{Path, PathBuf};

use sluice::{Engine, GenerateOptions, Prompt, SamplingOptions};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../")
        .join(rel)
}

fn engine(dir: &Path) -> Engine {
    Engine::builder()
        .model(dir)
        .threads(2)
        .context(64)
        .build()
        .unwrap()
}

fn opts(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampling: SamplingOptions {
            temperature: 0.8,
            seed: 9,
            ..Default::default()
        },
        stop_at_eos: false,
        ..Default::default()
    }
}

fn run(s: &mut sluice::Session, ids: &[u32], n: usize) -> Vec<u32> {
    let mut g = s.generate_ids(ids.to_vec(), &opts(n)).unwrap();
    g.run().unwrap();
    g.ids().to_vec()
}

#[test]
fn a_reloaded_session_continues_bit_for_bit() {
    let d = tempfile::tempdir().unwrap();
    for rel in [
        "models/demo",
        "testdata/models/deepseek_v3-fp32",
        "testdata/models/qwen3_next-fp32",
        "testdata/models/llama-fp32",
        "testdata/models/deepseek_v4-fp32",
        "testdata/kimi/kimi_linear-fp32",
        "testdata/kimi/k3/k3-tiny-bf16",
    ] {
        let dir = fixture(rel);
        let (p1, p2) = ([5u32, 9, 2, 7, 3, 8], [4u32, 1, 6]);
        // Uninterrupted: two turns on one session.
        let e = engine(&dir);
        let mut s = e.session().unwrap();
        let first = run(&mut s, &p1, 7);
        let second = run(&mut s, &p2, 9);
        let history = s.history().to_vec();
        // Interrupted: the first turn saved, then another engine (as another process would)
        // loads it and runs the second.
        let file = d.path().join("s.sluice");
        let mut a = e.session().unwrap();
        assert_eq!(run(&mut a, &p1, 7), first);
        a.save(&file, b"extra").unwrap();
        drop(a);
        let e2 = engine(&dir);
        let mut b = e2.session().unwrap();
        assert_eq!(b.load(&file).unwrap(), b"extra");
        assert_eq!(run(&mut b, &p2, 9), second, "{rel}");
        assert_eq!(b.history(), &history[..], "{rel}");
        // Resumed through the whole context: only what is new is computed.
        let mut c = e2.session().unwrap();
        c.load(&file).unwrap();
        let mut whole = p1.to_vec();
        whole.extend_from_slice(&first);
        whole.extend_from_slice(&p2);
        let mut g = c.generate_full(Prompt::Ids(&whole), &opts(9)).unwrap();
        g.run().unwrap();
        assert_eq!(g.ids(), &second[..], "{rel}");
        // The last generated token was not fed before saving: it and the new prompt — which
        // `b` ran on this engine already, so its state comes from the prefix cache.
        let st = g.stats();
        assert_eq!(
            (st.prefill_tokens, st.cached_tokens),
            (0, p2.len() + 1),
            "{rel}"
        );
    }
}

#[test]
fn other_models_truncated_and_flipped_files_are_refused_and_change_nothing() {
    let d = tempfile::tempdir().unwrap();
    let demo = engine(&common::demo());
    let mut s = demo.session().unwrap();
    run(&mut s, &[5, 9, 2, 7], 5);
    let file = d.path().join("demo.sluice");
    s.save(&file, &[]).unwrap();
    let good = std::fs::read(&file).unwrap();

    let other = engine(&fixture("testdata/models/qwen3_next-fp32"));
    let mut o = other.session().unwrap();
    run(&mut o, &[1, 2], 2);
    let before = o.history().to_vec();
    let check = |s: &mut sluice::Session, path: &Path, says: &str| {
        let e = s.load(path).unwrap_err();
        assert!(e.is_input_error(), "{e}");
        let m = e.to_string();
        assert!(
            m.contains(path.to_str().unwrap()) && m.contains(says),
            "{m}"
        );
        assert!(!m.contains('\n'), "{m}");
    };
    check(&mut o, &file, "another model");
    assert_eq!(o.history(), &before[..]);

    let cut = d.path().join("cut.sluice");
    std::fs::write(&cut, &good[..good.len() - 100]).unwrap();
    check(&mut s, &cut, "corrupt or cut short");
    let mut flipped = good.clone();
    let at = flipped.len() / 2;
    flipped[at] ^= 0x10;
    let bad = d.path().join("flip.sluice");
    std::fs::write(&bad, &flipped).unwrap();
    check(&mut s, &bad, "corrupt");
    let text = d.path().join("notes.txt");
    std::fs::write(&text, "my notes").unwrap();
    check(&mut s, &text, "not a sluice session file");
    // The session still holds what it had, and the good file still loads.
    s.load(&file).unwrap();
}

/// A session records the numeric mode its state was computed in: another mode's engine
/// refuses it with one line, and the same mode's loads it.
#[test]
fn a_session_of_the_other_numeric_mode_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let dir = common::demo();
    let exact = engine(&dir);
    let mut s = exact.session().unwrap();
    run(&mut s, &[5, 9, 2, 7], 3);
    let file = d.path().join("exact.sluice");
    s.save(&file, &[]).unwrap();
    let int8 = Engine::builder()
        .model(&dir)
        .threads(2)
        .context(64)
        .numerics(sluice::Numerics::Int8)
        .build()
        .unwrap();
    let mut i = int8.session().unwrap();
    let e = i.load(&file).unwrap_err();
    let m = e.to_string();
    assert!(e.is_input_error(), "{m}");
    assert!(
        m.contains("--numerics exact") && m.contains("int8") && !m.contains('\n'),
        "{m}"
    );
    assert!(i.history().is_empty());
    // Saved in int8, it loads in int8.
    run(&mut i, &[5, 9, 2, 7], 3);
    let file8 = d.path().join("int8.sluice");
    i.save(&file8, &[]).unwrap();
    let mut j = int8.session().unwrap();
    j.load(&file8).unwrap();
    assert_eq!(j.history(), i.history());
    assert!(
        s.load(&file8)
            .unwrap_err()
            .to_string()
            .contains("--numerics int8")
    );
}
