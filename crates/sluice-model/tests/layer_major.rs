//! Issue 20: a prefill runs each layer over a whole span of the prompt. The logits of a
//! whole-prompt layer-major prefill equal, bit for bit, those of passes over shorter spans and
//! of feeding the prompt one token at a time — with every weight resident and with the trunk
//! and experts streamed under a budget, in calls of any number of rows. Under a budget that
//! holds the span's activations, every expert the prompt routes to is read once.

use std::path::{Path, PathBuf};

use sluice_model::{Logits, Model, ModelOptions, PrefillOptions};

mod common;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(name)
}

/// A prompt of `n` ids in `[2, vocab)`.
fn prompt(n: usize, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 2 + ((i * 2_654_435_761u32) >> 7) % (vocab as u32 - 2))
        .collect()
}

fn base() -> ModelOptions {
    ModelOptions {
        context: 128,
        chunk: 8,
        threads: 2,
        ..Default::default()
    }
}

/// Every row of logits from passes over consecutive spans of `spans` tokens each.
fn by_spans(m: &Model, ids: &[u32], span: usize) -> Vec<f32> {
    let mut st = m.new_state();
    ids.chunks(span)
        .flat_map(|c| m.forward(&mut st, c, Logits::All).unwrap())
        .collect()
}

fn same(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let bad = got
        .iter()
        .zip(want)
        .position(|(a, b)| a.to_bits() != b.to_bits());
    assert_eq!(bad, None, "{what}: first differing logit");
}

#[test]
fn whole_prompt_layer_major_prefill_equals_spans_and_token_by_token() {
    for name in common::fixtures(common::LAYER_MAJOR) {
        let dir = fixture(name);
        let m = Model::open(&dir, base()).unwrap();
        let v = m.config().vocab;
        let ids = prompt(40, v);
        let token_by_token = by_spans(&m, &ids, 1);
        same(
            &format!("{name}: spans of 5"),
            &by_spans(&m, &ids, 5),
            &token_by_token,
        );
        same(
            &format!("{name}: one pass"),
            &by_spans(&m, &ids, 40),
            &token_by_token,
        );
        let last = &token_by_token[token_by_token.len() - v..];
        for chunk in [1, 3, 8] {
            let mut st = m.new_state();
            let got = m
                .prefill(
                    &mut st,
                    &ids,
                    Logits::Last,
                    PrefillOptions {
                        chunk,
                        ..Default::default()
                    },
                    &mut |_| {},
                )
                .unwrap();
            assert_eq!(got.spans, vec![40], "{name}: unlimited memory, one span");
            same(
                &format!("{name}: prefill, calls of {chunk}"),
                &got.logits,
                last,
            );
            assert_eq!(st.pos(), 40);
        }

        // Streamed: the smallest budget (one trunk layer streaming, one token's experts), and
        // the smallest that holds the whole prompt's activations beside them.
        let p = m.plan().clone();
        let desc = sluice_model::Description::open(&dir).unwrap();
        let shards = desc.shards(base().direct_io).unwrap();
        let plan_at = |memory: u64| {
            desc.plan(
                &shards,
                &ModelOptions {
                    memory: Some(memory),
                    ..base()
                },
            )
            .unwrap()
        };
        let step = p.span_bytes_per_token + p.kv_per_position;
        let fits = (0..)
            .map(|i| p.minimum + i * step)
            .find(|&b| plan_at(b).prefill_span >= 40)
            .unwrap();
        for memory in [p.minimum, fits] {
            let sm = Model::open(
                &dir,
                ModelOptions {
                    memory: Some(memory),
                    ..base()
                },
            )
            .unwrap();
            let moe = sm.config().moe_layers() > 0;
            if moe {
                assert!(!sm.plan().all_experts_fit(), "{name}: experts must stream");
            } else if memory == p.minimum {
                assert!(
                    sm.plan().trunk_pinned < sm.plan().trunk,
                    "{name}: the trunk must stream"
                );
            }
            let e0 = sm.experts().stats();
            let mut st = sm.new_state();
            let mut layers = 0;
            let got = sm
                .prefill(
                    &mut st,
                    &ids,
                    Logits::Last,
                    PrefillOptions::default(),
                    &mut |ev| {
                        if let sluice_model::PrefillEvent::Layer { .. } = ev {
                            layers += 1;
                        }
                    },
                )
                .unwrap();
            same(&format!("{name}: prefill at {memory} B"), &got.logits, last);
            assert_eq!(got.spans.iter().sum::<usize>(), 40);
            assert_eq!(layers, got.spans.len() * sm.config().layers);
            let e1 = sm.experts().stats();
            if memory > p.minimum {
                assert_eq!(got.spans, vec![40], "{name}: the span fits at {memory} B");
                // One pass: each expert the prompt routed to is read once.
                assert_eq!(e1.touched_bytes > e0.touched_bytes, moe, "{name}");
                assert!(
                    e1.bytes_read - e0.bytes_read <= e1.touched_bytes - e0.touched_bytes,
                    "{name}: read {} B for {} B of distinct experts",
                    e1.bytes_read - e0.bytes_read,
                    e1.touched_bytes - e0.touched_bytes
                );
            } else {
                assert!(got.spans.len() > 1, "{name}: {:?}", got.spans);
            }
            // Decoding on from the prefilled state agrees with the resident model.
            let next = [3u32];
            let a = sm.forward(&mut st, &next, Logits::Last).unwrap();
            let mut rs = m.new_state();
            m.forward(&mut rs, &ids, Logits::None).unwrap();
            let b = m.forward(&mut rs, &next, Logits::Last).unwrap();
            same(
                &format!("{name}: decode after prefill at {memory} B"),
                &a,
                &b,
            );
            // The span's lease went back to the expert cache.
            assert_eq!(sm.experts().capacity() + st.kv_bytes(), sm.plan().pool);
        }
    }
}

/// `Logits::All` from a prefill gives every prompt row, in spans the plan's scratch holds.
#[test]
fn prefill_with_every_row_of_logits_equals_token_by_token() {
    let dir = fixture("models/deepseek_v3-fp32");
    let m = Model::open(&dir, base()).unwrap();
    let ids = prompt(20, m.config().vocab);
    let mut st = m.new_state();
    let got = m
        .prefill(
            &mut st,
            &ids,
            Logits::All,
            PrefillOptions::default(),
            &mut |_| {},
        )
        .unwrap();
    same("all rows", &got.logits, &by_spans(&m, &ids, 1));
}
