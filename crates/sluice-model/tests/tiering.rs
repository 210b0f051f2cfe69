//! A model whose trunk is several times the budget: layers stream through the ring, the
//! embedding table is read a row at a time, and the output is bit-identical to all-resident.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

mod scratch;

use sluice_model::{Logits, Model, ModelOptions};
use sluice_synth::SynthSpec;

/// ~190 MB of trunk in 16 layers of ~12 MB, 8 small experts per layer.
pub fn big_trunk() -> SynthSpec {
    SynthSpec {
        vocab: 2048,
        hidden: 1024,
        layers: 16,
        first_dense: 1,
        dense_inter: 1024,
        experts: 8,
        top_k: 2,
        moe_inter: 256,
        shared: 4,
        heads: 16,
        q_lora: 512,
        kv_lora: 256,
        nope: 64,
        rope: 32,
        v_head: 64,
        layers_per_shard: 1,
        skew: 0.3,
        seed: 7,
        ..Default::default()
    }
}

fn dir() -> &'static Path {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let d = scratch::shared_dir(Path::new(env!("CARGO_TARGET_TMPDIR")), "sluice-tier-");
        big_trunk().write(&d).unwrap();
        d
    })
    .as_path()
}

fn opts(memory: Option<u64>, threads: usize) -> ModelOptions {
    ModelOptions {
        memory,
        threads,
        context: 64,
        chunk: 4,
        ..Default::default()
    }
}

fn run(m: &Model) -> Vec<f32> {
    let mut st = m.new_state();
    let mut out = m
        .forward(&mut st, &[11, 500, 7, 1999, 42], Logits::All)
        .unwrap();
    for _ in 0..4 {
        let v = m.config().vocab;
        let last = &out[out.len() - v..];
        let next = last
            .iter()
            .enumerate()
            .fold(0, |b, (i, &x)| if x > last[b] { i } else { b }) as u32;
        out.extend(m.forward(&mut st, &[next], Logits::Last).unwrap());
    }
    out
}

#[test]
fn trunk_four_times_the_budget_streams_with_identical_output() {
    let full = Model::open(dir(), opts(None, 2)).unwrap();
    let base = run(&full);
    let p = full.plan().clone();
    assert!(p.trunk_resident());
    let minimum = p.minimum;
    assert!(
        p.trunk >= 4 * (minimum + (8 << 20)),
        "trunk {} vs minimum {}",
        p.trunk,
        minimum
    );
    for (extra, threads) in [(0u64, 1usize), (4 << 20, 2), (8 << 20, 3), (20 << 20, 2)] {
        let budget = minimum + extra;
        let m = Model::open(dir(), opts(Some(budget), threads)).unwrap();
        let plan = m.plan();
        assert!(
            plan.ring_slots >= 1,
            "expected streaming at budget {budget}"
        );
        assert!(
            !plan.embed.1,
            "the embedding table should be read per token"
        );
        assert!(p.trunk >= 4 * budget || extra > 0);
        let got = run(&m);
        assert!(
            got.iter()
                .zip(&base)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "logits differ at budget {budget}"
        );
        assert!(m.trunk_bytes_read() > 0);
        let pinned = plan.layers.iter().filter(|l| l.1).count();
        eprintln!(
            "budget {budget}: ring {} x {}, {pinned} of {} layers pinned, trunk read {}",
            plan.ring_slots,
            plan.ring_slot_bytes,
            plan.layers.len(),
            m.trunk_bytes_read()
        );
    }
}

#[test]
fn ring_prefetch_keeps_the_next_layer_ready() {
    let full = Model::open(dir(), opts(None, 1)).unwrap();
    let minimum = full.plan().minimum;
    // Room for two slots: the next layer streams while this one computes.
    let m = Model::open(dir(), opts(Some(minimum + (16 << 20)), 1)).unwrap();
    assert_eq!(m.plan().ring_slots, 2);
    run(&m);
    let s = m.trunk().stats();
    // Nearly every streamed layer was already in the ring (or on its way) when asked for.
    assert!(s.hits as f64 >= 0.9 * s.requests as f64, "{s:?}");
}
