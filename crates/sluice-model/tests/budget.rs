//! Memory is a dial: every budget from the minimum to all-resident, every policy, prefetch on
//! and off, 1–3 threads and any prefill chunk size give bit-identical logits and ids — on the
//! release-layout fixtures, Kimi Linear, Kimi K3 (BF16 and MXFP4 experts) and a synthetic
//! model whose experts dwarf the cache.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

#[macro_use]
mod common;
mod scratch;

use proptest::prelude::*;
use sluice_model::{Logits, Model, ModelOptions, PolicyChoice};
use sluice_synth::SynthSpec;

/// A fixture directory: `name` under `testdata/models/`, or a path under `testdata/` when it
/// has a `/` (`kimi/kimi_linear-fp32`).
fn fixture(name: &str) -> PathBuf {
    let testdata = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata");
    if name.contains('/') {
        testdata.join(name)
    } else {
        testdata.join("models").join(name)
    }
}

/// A synthetic DeepSeek-V3-shaped model whose routed experts are far larger than the caches
/// the test gives them.
fn synthetic() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = scratch::shared_dir(Path::new(env!("CARGO_TARGET_TMPDIR")), "sluice-synth-");
        SynthSpec {
            skew: 0.3,
            ..Default::default()
        }
        .write(&d)
        .unwrap();
        d
    })
    .as_path()
}

struct Run {
    ids: Vec<u32>,
    logits: Vec<f32>,
}

const PROMPT: [u32; 7] = [3, 17, 92, 5, 64, 33, 8];

/// Prefill in chunks of 3, then 6 greedy steps; every row of logits kept.
fn generate(m: &Model) -> Run {
    generate_chunked(m, 3)
}

/// Prefill in chunks of `chunk`, then 6 greedy steps; every row of logits kept.
fn generate_chunked(m: &Model, chunk: usize) -> Run {
    let mut st = m.new_state();
    let mut logits = Vec::new();
    for c in PROMPT.chunks(chunk) {
        logits.extend(m.forward(&mut st, c, Logits::All).unwrap());
    }
    let v = m.config().vocab;
    let mut ids = Vec::new();
    for _ in 0..6 {
        let last = &logits[logits.len() - v..];
        let next = last
            .iter()
            .enumerate()
            .fold(0, |b, (i, &x)| if x > last[b] { i } else { b }) as u32;
        ids.push(next);
        logits.extend(m.forward(&mut st, &[next], Logits::Last).unwrap());
    }
    Run { ids, logits }
}

fn opts(memory: Option<u64>, policy: PolicyChoice, prefetch: bool, threads: usize) -> ModelOptions {
    ModelOptions {
        memory,
        policy,
        prefetch,
        // Read every prediction, so that prefetch reads happen in these runs.
        prefetch_precision: 0.0,
        threads,
        context: 64,
        chunk: 8,
        ..Default::default()
    }
}

struct Baseline {
    run: Run,
    minimum: u64,
    fixed: u64,
    all_experts: u64,
}

fn baseline(dir: &Path) -> Baseline {
    let m = Model::open(dir, opts(None, PolicyChoice::Lru, false, 1)).unwrap();
    let p = m.plan().clone();
    Baseline {
        run: generate(&m),
        minimum: p.minimum,
        fixed: p.trunk + p.kv_cache + p.recurrent + p.scratch,
        all_experts: p.all_expert_bytes,
    }
}

#[allow(clippy::too_many_arguments)]
fn check(
    dir: &Path,
    base: &Baseline,
    memory: u64,
    policy: PolicyChoice,
    prefetch: bool,
    threads: usize,
    chunk: usize,
) -> Result<(), TestCaseError> {
    let m = Model::open(dir, opts(Some(memory), policy.clone(), prefetch, threads)).unwrap();
    let r = generate_chunked(&m, chunk);
    let s = m.experts().stats();
    prop_assert_eq!(
        &r.ids,
        &base.run.ids,
        "ids differ at budget {}, {}, prefetch {}, {} threads, chunk {}",
        memory,
        policy,
        prefetch,
        threads,
        chunk
    );
    prop_assert!(
        r.logits
            .iter()
            .zip(&base.run.logits)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "logits differ at budget {}, {}, prefetch {}, {} threads, chunk {}",
        memory,
        policy,
        prefetch,
        threads,
        chunk
    );
    prop_assert_eq!(s.requests, s.hits + s.misses);
    prop_assert!(m.experts().used() <= m.experts().capacity());
    Ok(())
}

fn cases() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(16),
        ..ProptestConfig::default()
    }
}

/// One property test per `BUDGET` row of the fixture table.
macro_rules! budget_tests {
    ($($name:ident $path:literal [$($flag:ident)*],)*) => {
        $(if_in!(BUDGET [$($flag)*] { budget_test!($name, $path); });)*
    };
}

macro_rules! budget_test {
    ($name:ident, $fixture:literal) => {
        proptest! {
            #![proptest_config(cases())]
            #[test]
            fn $name(
                frac in 0.0f64..=1.0,
                policy in 0..PolicyChoice::ALL.len(),
                prefetch: bool,
                threads in 1usize..=3,
                chunk in proptest::sample::select(vec![1usize, 3, 7]),
            ) {
                static BASE: OnceLock<Baseline> = OnceLock::new();
                let dir = fixture($fixture);
                let base = BASE.get_or_init(|| baseline(&dir));
                // From the minimum to all experts resident.
                let span = (base.fixed + base.all_experts).saturating_sub(base.minimum);
                let memory = base.minimum + (span as f64 * frac) as u64;
                check(&dir, base, memory, PolicyChoice::ALL[policy].clone(), prefetch, threads, chunk)?;
            }
        }
    };
}

fixture_table!(budget_tests);

proptest! {
    #![proptest_config(cases())]
    #[test]
    fn synthetic_experts_ten_times_the_cache(frac in 0.0f64..=1.0, policy in 0..PolicyChoice::ALL.len(), prefetch: bool, threads in 1usize..=3) {
        static BASE: OnceLock<Baseline> = OnceLock::new();
        let dir = synthetic();
        let base = BASE.get_or_init(|| baseline(dir));
        // Caches of at most a tenth of the experts.
        let top = base.fixed + base.all_experts / 10;
        prop_assume!(top > base.minimum);
        let memory = base.minimum + ((top - base.minimum) as f64 * frac) as u64;
        check(dir, base, memory, PolicyChoice::ALL[policy].clone(), prefetch, threads, 3)?;
    }
}

#[test]
fn the_budget_is_refused_below_the_minimum_with_the_figure() {
    let base = baseline(&fixture("deepseek_v3-fp32"));
    let e = Model::open(
        fixture("deepseek_v3-fp32"),
        opts(Some(base.minimum - 1), PolicyChoice::S3Fifo, true, 1),
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains(&base.minimum.to_string()), "{msg}");
    assert!(
        Model::open(
            fixture("deepseek_v3-fp32"),
            opts(Some(base.minimum), PolicyChoice::S3Fifo, true, 1)
        )
        .is_ok()
    );
}

#[test]
fn small_caches_stream_and_prefetch_predicts() {
    let dir = synthetic();
    let base = baseline(dir);
    let m = Model::open(
        dir,
        opts(
            Some(base.minimum + base.all_experts / 20),
            PolicyChoice::S3Fifo,
            true,
            2,
        ),
    )
    .unwrap();
    generate(&m);
    let s = m.experts().stats();
    assert!(s.misses > 0 && s.bytes_read > 0, "{s:?}");
    assert!(s.prefetch_reads > 0, "{s:?}");
    assert!(s.prefetch_checked > 0 && s.prefetch_recall() > 0.0, "{s:?}");
    // The early guess is one of the predictions a request is compared with.
    assert!(
        s.prefetch_checked_early > 0 && s.prefetch_checked_early <= s.prefetch_checked,
        "{s:?}"
    );
    // So is the mid guess, made in the layers before that waited for a read.
    assert!(
        s.prefetch_checked_mid > 0 && s.prefetch_checked_mid <= s.prefetch_checked,
        "{s:?}"
    );
    // Per layer: the totals split by layer; layer 0 has nothing before it to predict it, so
    // it is never checked, and each later MoE layer is.
    let by = &s.prefetch_by_layer;
    assert_eq!(by.iter().map(|p| p.0).sum::<u64>(), s.prefetch_checked);
    assert_eq!(by.iter().map(|p| p.1).sum::<u64>(), s.prefetch_predicted);
    assert_eq!(by.first().map_or(0, |p| p.0), 0, "{by:?}");
    for l in 1..m.config().layers {
        if m.config().is_moe(l) {
            assert!(
                by.get(l).is_some_and(|p| p.0 > 0 && p.1 <= p.0),
                "layer {l}: {by:?}"
            );
        }
    }
    assert!(m.experts().used() <= m.experts().capacity());
}
