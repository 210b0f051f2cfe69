//! Batched decoding under a budget where the experts stream: tokens/s and expert bytes read per
//! generated token at batch 1, 4 and 16 (the same 16 sequences each time, on a fresh engine).
//!
//! ```text
//! cargo bench -p sluice --bench batch                     # synthesises a ~1.3 GB model
//! SLUICE_BENCH_MODEL=/path/to/model cargo bench -p sluice --bench batch
//! ```
//!
//! Settings (environment): `SLUICE_BENCH_MODEL` (a model directory; default: a synthetic
//! DeepSeek-V3-shaped model written to a temporary directory), `SLUICE_BENCH_EXPERT_SHARE`
//! (share of the routed experts the cache may hold beyond the minimum plan, default 0.1),
//! `SLUICE_BENCH_PREFETCH` (0 turns lookahead prefetch off),
//! `SLUICE_BENCH_TOKENS` (tokens generated per sequence, default 48), `SLUICE_BENCH_THREADS`.

use std::path::PathBuf;
use std::time::Instant;

use sluice::tools::synth::SynthSpec;
use sluice::{Batcher, Event, OwnedPrompt};
use sluice::{Engine, GenerateOptions, Memory, SamplingOptions};

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is accepted and ignored.
    let _tmp;
    let dir: PathBuf = match std::env::var_os("SLUICE_BENCH_MODEL") {
        Some(d) => d.into(),
        None => {
            _tmp = tempfile::tempdir_in(
                std::env::var_os("TMPDIR").unwrap_or_else(|| "/var/tmp".into()),
            )
            .expect("temporary directory");
            // Every field is given, but SynthSpec may gain fields: keep their defaults.
            #[allow(clippy::needless_update)]
            let spec = SynthSpec {
                vocab: 4096,
                hidden: 1024,
                layers: 8,
                first_dense: 1,
                dense_inter: 1024,
                experts: 64,
                top_k: 6,
                moe_inter: 512,
                shared: 1,
                heads: 8,
                q_lora: 512,
                kv_lora: 256,
                nope: 128,
                rope: 64,
                v_head: 128,
                layers_per_shard: 1,
                skew: 0.5,
                seed: 1,
                ..Default::default()
            };
            let t0 = Instant::now();
            spec.write(_tmp.path()).expect("synth");
            eprintln!(
                "synthesised {:.2} GB in {:.1}s at {}",
                spec.bytes() as f64 / 1e9,
                t0.elapsed().as_secs_f64(),
                _tmp.path().display()
            );
            _tmp.path().to_owned()
        }
    };
    let share: f64 = env("SLUICE_BENCH_EXPERT_SHARE", 0.1);
    let prefetch = env("SLUICE_BENCH_PREFETCH", 1u8) != 0;
    let tokens: usize = env("SLUICE_BENCH_TOKENS", 48);
    let threads: usize = env(
        "SLUICE_BENCH_THREADS",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    );

    // Room for the prompt and the generated tokens; the plan reserves it per sequence.
    let context = 8 + tokens;
    let probe = Engine::builder()
        .model(&dir)
        .context(context)
        .sequences(16)
        .build()
        .expect("open model");
    let plan = probe.plan().clone();
    let vocab = probe.model().config().vocab as u32;
    drop(probe);
    let budget = plan.minimum + (plan.all_expert_bytes as f64 * share) as u64;
    println!(
        "model {}: experts {:.2} GB, minimum plan {:.0} MB, budget {:.0} MB ({:.0}% of the experts beyond the minimum), {threads} threads, prefetch {}, {tokens} tokens per sequence, 16 sequences",
        dir.display(),
        plan.all_expert_bytes as f64 / 1e9,
        plan.minimum as f64 / 1e6,
        budget as f64 / 1e6,
        share * 100.0,
        if prefetch { "on" } else { "off" }
    );
    println!(
        "| batch | tokens/s | expert bytes / token | vs batch 1 | hit rate | expert GB read | seconds |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut base = None;
    let mut texts: Option<Vec<Vec<u32>>> = None;
    for batch in [1usize, 4, 16] {
        let engine = Engine::builder()
            .model(&dir)
            .memory(Memory::Bytes(budget))
            .threads(threads)
            .sequences(batch)
            .prefetch(prefetch)
            .context(context)
            .build()
            .expect("engine");
        let batcher = Batcher::new(engine.clone(), batch).expect("batcher");
        let (tx, rx) = std::sync::mpsc::channel();
        let s0 = engine.expert_stats();
        let t0 = Instant::now();
        for i in 0..16u32 {
            // Eight-token prompts, different for every sequence.
            let prompt: Vec<u32> = (0..8).map(|j| (11 + 97 * i + 31 * j) % vocab).collect();
            let tx = tx.clone();
            batcher
                .submit(
                    &OwnedPrompt::Ids(prompt),
                    GenerateOptions {
                        max_tokens: tokens,
                        sampling: SamplingOptions::default(),
                        ..Default::default()
                    },
                    Box::new(move |e| {
                        if let Event::Done(f) = e {
                            let _ = tx.send((i, Ok(f.ids)));
                        } else if let Event::Failed(e) = e {
                            let _ = tx.send((i, Err(e.to_string())));
                        }
                        true
                    }),
                )
                .expect("submit");
        }
        drop(tx);
        let mut out = vec![Vec::new(); 16];
        for (i, r) in rx {
            out[i as usize] = r.expect("sequence");
        }
        let secs = t0.elapsed().as_secs_f64();
        let s = engine.expert_stats();
        let generated: usize = out.iter().map(Vec::len).sum();
        let bytes = s.bytes_read - s0.bytes_read;
        let per = bytes as f64 / generated as f64;
        let b1 = *base.get_or_insert(per);
        let hits = s.hits - s0.hits;
        let reqs = (s.requests - s0.requests).max(1);
        println!(
            "| {batch} | {:.2} | {:.2} MB | {:.3} | {:.1}% | {:.2} | {secs:.1} |",
            generated as f64 / secs,
            per / 1e6,
            per / b1,
            100.0 * hits as f64 / reqs as f64,
            bytes as f64 / 1e9,
        );
        // The numeric contract: every batch size produces the same tokens.
        match &texts {
            None => texts = Some(out),
            Some(t) => assert_eq!(t, &out, "batch {batch} changed the output"),
        }
    }
}
