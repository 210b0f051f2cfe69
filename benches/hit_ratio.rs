//! Expert-cache hit ratios: every shipped policy beside Belady's optimum, on traces recorded
//! from the fixture models, from a skewed synthetic DeepSeek-V3-shaped model, and on a Zipf
//! stream, at several cache sizes.
//!
//! `cargo bench -p sluice-model --bench hit_ratio`

use std::path::Path;

use sluice_model::{Logits, Model, ModelOptions};
use sluice_store::{PolicyChoice, TraceEvent, belady, simulate};
use sluice_synth::SynthSpec;

/// Records the expert requests of a greedy generation of up to 128 tokens after a 16-token
/// prompt (fewer where the model's context is shorter).
fn record(dir: &Path) -> (Vec<TraceEvent>, usize) {
    let m = Model::open(
        dir,
        ModelOptions {
            record_trace: true,
            context: 256,
            ..Default::default()
        },
    )
    .expect("model");
    let vocab = m.config().vocab as u32;
    let mut st = m.new_state();
    let prompt: Vec<u32> = (0..16).map(|i| (i * 37 + 11) % vocab).collect();
    let mut l = m.forward(&mut st, &prompt, Logits::Last).expect("prefill");
    let steps = 128.min(m.plan().context - prompt.len());
    for _ in 0..steps {
        let next = l
            .iter()
            .enumerate()
            .fold(0, |b, (i, &x)| if x > l[b] { i } else { b }) as u32;
        l = m.forward(&mut st, &[next], Logits::Last).expect("decode");
    }
    let experts: usize = m.layout().experts.iter().map(Vec::len).sum();
    (m.experts().take_trace(), experts)
}

/// A Zipf(s = 1) stream over `n` experts in 8 layers, top-4 per layer per step.
fn zipf(n: u32, steps: u64) -> Vec<TraceEvent> {
    let mut x: u64 = 0x5eed;
    let h: f64 = (1..=n).map(|i| 1.0 / i as f64).sum();
    let mut out = Vec::new();
    for step in 0..steps {
        for layer in 0..8 {
            let mut chosen = std::collections::BTreeSet::new();
            while chosen.len() < 4 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (x >> 11) as f64 / (1u64 << 53) as f64 * h;
                let (mut acc, mut e) = (0.0, n - 1);
                for i in 0..n {
                    acc += 1.0 / (i + 1) as f64;
                    if u < acc {
                        e = i;
                        break;
                    }
                }
                // A different popularity order per layer.
                chosen.insert((e * 7 + layer * 13) % n);
            }
            out.extend(chosen.into_iter().map(|expert| TraceEvent {
                step,
                layer,
                expert,
                rows: 1,
            }));
        }
    }
    out
}

fn table(name: &str, trace: &[TraceEvent], experts: usize) {
    println!("\n{name}: {} requests over {experts} experts", trace.len());
    print!("{:>8} {:>8}", "cache", "belady");
    for p in PolicyChoice::ALL {
        print!(" {p:>8}");
    }
    println!();
    for pct in [5, 10, 25, 50] {
        let cap = (experts * pct / 100).max(8);
        print!(
            "{:>7}% {:>7.1}%",
            pct,
            100.0 * belady(trace, cap).hit_rate()
        );
        for p in PolicyChoice::ALL {
            let r = simulate(p.make(cap).as_mut(), trace, cap);
            print!(" {:>7.1}%", 100.0 * r.hit_rate());
        }
        println!();
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a plain `cargo test --benches` run passes nothing and
    // should stay quick.
    if !std::env::args().any(|a| a == "--bench") {
        println!("hit_ratio: run with `cargo bench` for figures");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models");
    for f in [
        "deepseek_v3-fp32",
        "qwen3_moe-fp32",
        "mixtral-fp32",
        "olmoe-fp32",
    ] {
        let (t, n) = record(&root.join(f));
        table(&format!("fixture {f} (random weights)"), &t, n);
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    for skew in [0.0f32, 0.5, 1.0] {
        let dir = tmp.path().join(format!("skew{skew}"));
        SynthSpec {
            skew,
            layers: 6,
            experts: 64,
            top_k: 6,
            ..Default::default()
        }
        .write(&dir)
        .expect("synth");
        let (t, n) = record(&dir);
        table(
            &format!("synthetic DeepSeek-V3 shape, 64 experts top-6, skew {skew}"),
            &t,
            n,
        );
    }
    table(
        "Zipf(1) stream, 8 layers x 256 experts, top-4",
        &zipf(256, 2000),
        8 * 256,
    );
}
