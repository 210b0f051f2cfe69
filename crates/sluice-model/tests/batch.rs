//! Batched decoding: one step for several sequences at once gives each sequence exactly the
//! logits it gets alone, on every architecture, with experts resident or streamed, and shares
//! the expert reads.

use std::path::{Path, PathBuf};

use sluice_model::{Logits, Model, ModelOptions, State};

mod common;
use common::argmax;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(rel)
}

/// Planned for five sequences of up to 64 positions.
fn opts5() -> ModelOptions {
    ModelOptions {
        sequences: 5,
        context: 64,
        ..ModelOptions::default()
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Prompts of different lengths so the sequences sit at different positions.
fn prompts(vocab: u32) -> Vec<Vec<u32>> {
    (0..5u32)
        .map(|i| {
            (0..2 + 3 * i)
                .map(|j| (7 + 31 * i + 13 * j) % vocab)
                .collect()
        })
        .collect()
}

/// Decodes 6 steps for every prompt, batched (with sequences joining late and leaving early)
/// and alone; every logit must match bit for bit.
fn check(dir: &Path, opts: ModelOptions) {
    let m = Model::open(dir, opts).unwrap();
    let vocab = m.config().vocab as u32;
    let ps = prompts(vocab);
    let v = m.config().vocab;

    // Alone: 6 greedy steps each.
    let mut want: Vec<Vec<Vec<u32>>> = Vec::new();
    for p in &ps {
        let mut st = m.new_state();
        let mut l = m.forward(&mut st, p, Logits::Last).unwrap();
        let mut steps = vec![bits(&l)];
        for _ in 0..6 {
            let id = argmax(&l);
            l = m.forward(&mut st, &[id], Logits::Last).unwrap();
            steps.push(bits(&l));
        }
        want.push(steps);
    }

    // Batched: sequence i joins at step i / 2 and stops after 6 steps of its own.
    let mut states: Vec<Option<(State, Vec<f32>, usize)>> = vec![None; ps.len()];
    let mut got: Vec<Vec<Vec<u32>>> = vec![Vec::new(); ps.len()];
    for step in 0..12 {
        for (i, p) in ps.iter().enumerate() {
            if step == i / 2 && states[i].is_none() {
                let mut st = m.new_state();
                let l = m.forward(&mut st, p, Logits::Last).unwrap();
                got[i].push(bits(&l));
                states[i] = Some((st, l, 0));
            }
        }
        let live: Vec<usize> = (0..ps.len())
            .filter(|&i| states[i].as_ref().is_some_and(|s| s.2 < 6))
            .collect();
        if live.is_empty() {
            continue;
        }
        let ids: Vec<u32> = live
            .iter()
            .map(|&i| argmax(&states[i].as_ref().unwrap().1))
            .collect();
        let mut slots: Vec<&mut State> = Vec::new();
        let mut rest: &mut [Option<(State, Vec<f32>, usize)>] = &mut states;
        let mut base = 0;
        for &i in &live {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(i - base);
            let (this, tail) = tail.split_first_mut().unwrap();
            slots.push(&mut this.as_mut().unwrap().0);
            rest = tail;
            base = i + 1;
        }
        let l = m.forward_batch(&mut slots, &ids).unwrap();
        assert_eq!(l.len(), live.len() * v);
        for (r, &i) in live.iter().enumerate() {
            let s = states[i].as_mut().unwrap();
            s.1 = l[r * v..(r + 1) * v].to_vec();
            s.2 += 1;
            got[i].push(bits(&s.1));
        }
    }
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.len(), w.len(), "{}: sequence {i}", dir.display());
        for (s, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(a == b, "{}: sequence {i} step {s} differs", dir.display());
        }
    }
}

#[test]
fn a_batched_step_gives_each_sequence_its_solo_logits() {
    for f in common::fixtures(common::BATCH) {
        check(&fixture(f), opts5());
    }
}

#[test]
fn batched_steps_match_with_experts_streamed_at_the_minimum_budget() {
    for f in ["models/deepseek_v3-fp32", "kimi/k3/k3-tiny-mxfp4"] {
        let dir = fixture(f);
        let probe = Model::open(&dir, opts5()).unwrap();
        let min = probe.plan().minimum;
        for threads in [1, 2] {
            check(
                &dir,
                ModelOptions {
                    memory: Some(min),
                    threads,
                    ..opts5()
                },
            );
        }
    }
}

/// A batch reads each chosen expert once: the bytes read for one batched step over N sequences
/// are those of the union of their experts, never N sequences' worth.
#[test]
fn a_batched_step_reads_each_expert_once() {
    let dir = fixture("models/deepseek_v3-fp32");
    let probe = Model::open(&dir, opts5()).unwrap();
    let min = probe.plan().minimum;
    let m = Model::open(
        &dir,
        ModelOptions {
            memory: Some(min),
            ..opts5()
        },
    )
    .unwrap();
    let ps = prompts(m.config().vocab as u32);
    let prefilled = || -> Vec<State> {
        ps.iter()
            .map(|p| {
                let mut s = m.new_state();
                m.forward(&mut s, p, Logits::Last).unwrap();
                s
            })
            .collect()
    };
    let ids: Vec<u32> = (0..ps.len() as u32).map(|i| 3 + i).collect();

    let mut states = prefilled();
    let s0 = m.experts().stats();
    let mut refs: Vec<&mut State> = states.iter_mut().collect();
    m.forward_batch(&mut refs, &ids).unwrap();
    let batched = m.experts().stats().bytes_read - s0.bytes_read;
    // The plan holds the KV caches of five sequences: these go before the solo five come.
    drop(states);

    let mut solo_states = prefilled();
    let s1 = m.experts().stats();
    for (s, &id) in solo_states.iter_mut().zip(&ids) {
        m.forward(s, &[id], Logits::Last).unwrap();
    }
    let solo = m.experts().stats().bytes_read - s1.bytes_read;
    assert!(batched > 0, "the minimum budget should stream experts");
    assert!(
        batched < solo,
        "batched step read {batched} bytes, {} solo steps {solo}",
        ids.len()
    );
}

#[test]
fn a_failed_batched_step_leaves_every_state_as_it_was() {
    let dir = fixture("kimi/k3/k3-tiny-mxfp4");
    let m = Model::open(&dir, opts5()).unwrap();
    let vocab = m.config().vocab as u32;
    let ps = prompts(vocab);
    let mut states: Vec<State> = ps
        .iter()
        .map(|p| {
            let mut s = m.new_state();
            m.forward(&mut s, p, Logits::Last).unwrap();
            s
        })
        .collect();
    let ids: Vec<u32> = (0..ps.len() as u32).collect();
    // A bad id in the last row fails the whole step.
    let mut bad = ids.clone();
    *bad.last_mut().unwrap() = vocab;
    {
        let mut refs: Vec<&mut State> = states.iter_mut().collect();
        assert!(m.forward_batch(&mut refs, &bad).is_err());
        assert!(m.forward_batch(&mut refs, &ids[..2]).is_err());
    }
    // More sequences than the memory plan covers are refused.
    {
        let mut extra = m.new_state();
        let mut refs: Vec<&mut State> = states.iter_mut().collect();
        refs.push(&mut extra);
        let e = m.forward_batch(&mut refs, &[1; 6]).unwrap_err();
        assert!(e.to_string().contains("plan is for 5"), "{e}");
    }
    // The states still give their solo results.
    let mut solo = states.clone();
    let mut refs: Vec<&mut State> = states.iter_mut().collect();
    let l = m.forward_batch(&mut refs, &ids).unwrap();
    let v = m.config().vocab;
    for (i, (s, &id)) in solo.iter_mut().zip(&ids).enumerate() {
        let w = m.forward(s, &[id], Logits::Last).unwrap();
        assert_eq!(bits(&l[i * v..(i + 1) * v]), bits(&w), "sequence {i}");
    }
}
