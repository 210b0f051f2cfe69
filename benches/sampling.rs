//! The sampler's cost per token over a large vocabulary.
//!
//! Run: `cargo bench -p sluice-sampler --bench sampling`. It draws from rows of 129,280 logits
//! (DeepSeek-V3's vocabulary) — a flat one (uniform in [−4, 4), as a random-weight model gives)
//! and a peaked one (a few hundred tokens 12 above the rest, as a trained model gives) — under
//! greedy decoding, temperature 1 alone (the OpenAI API's default, every token a candidate),
//! temperature 0.7 with top-p 0.95, and with top-k 40. Each iteration copies the row (the
//! sampler applies penalties in place) and draws one token, as a decode step does.

use std::hint::black_box;
use std::time::Duration;

use criterion::Criterion;
use sluice_sampler::{Sampler, SamplingOptions};

const VOCAB: usize = 129_280;

/// A reproducible row: uniform in [−4, 4) from an xorshift stream.
fn flat() -> Vec<f32> {
    let mut x = 12345u64;
    (0..VOCAB)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0
        })
        .collect()
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(20)
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500))
        .configure_from_args();
    let flat = flat();
    let peaked: Vec<f32> = flat
        .iter()
        .enumerate()
        .map(|(i, &l)| if i % 997 == 0 { l + 12.0 } else { l * 0.5 })
        .collect();
    let settings: [(&str, SamplingOptions); 4] = [
        ("greedy", SamplingOptions::default()),
        (
            "t1",
            SamplingOptions {
                temperature: 1.0,
                ..Default::default()
            },
        ),
        (
            "t0.7-top_p0.95",
            SamplingOptions {
                temperature: 0.7,
                top_p: 0.95,
                ..Default::default()
            },
        ),
        (
            "t0.7-top_k40",
            SamplingOptions {
                temperature: 0.7,
                top_k: 40,
                ..Default::default()
            },
        ),
    ];
    for (row_name, row) in [("flat", &flat), ("peaked", &peaked)] {
        for (name, o) in &settings {
            let mut s = Sampler::new(o.clone()).expect("valid options");
            c.bench_function(&format!("sample/{row_name}/{name}"), |b| {
                b.iter(|| {
                    let mut l = row.clone();
                    black_box(s.sample(&mut l, &[]))
                })
            });
        }
    }
    c.final_summary();
}
