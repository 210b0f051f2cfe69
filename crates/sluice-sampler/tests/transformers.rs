//! The sampler against Hugging Face transformers' own logits processors
//! (`testdata/sampling/transformers.json`, made by `tools/reference/make_sampling_fixtures.py`):
//! the same candidates and the same probabilities for every combination of options, and seeded
//! draws whose frequencies pass a chi-square test against the reference probabilities.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use sluice_sampler::{Candidate, Sampler, SamplingOptions};

/// The options, in the order transformers applies them (and the fixture names them).
const OPTIONS: [&str; 5] = [
    "repetition_penalty",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
];

struct Case {
    name: String,
    opts: SamplingOptions,
    /// Which options are on, as a bit mask over `OPTIONS`.
    on: u32,
    logits: Vec<f32>,
    history: Vec<u32>,
    /// transformers' survivors and probabilities.
    keep: BTreeMap<u32, f64>,
    top_p_boundary: bool,
    min_p_boundary: bool,
    tie: Option<Tie>,
    has_neg_inf: bool,
}

/// Ties straddle the top-p cut: transformers keeps `n_keep` tokens, all of `sure` and some of
/// `tied` (which ones is up to `torch.sort`).
struct Tie {
    sure: BTreeSet<u32>,
    tied: Vec<u32>,
    tied_prob: f64,
    n_keep: usize,
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn load() -> (Value, Vec<Case>) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/sampling/transformers.json"
    );
    let text = std::fs::read_to_string(path).expect("testdata/sampling/transformers.json");
    let doc: Value = serde_json::from_str(&text).unwrap();
    let cases = doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let o = &c["options"];
            let f = |k: &str| o[k].as_f64().unwrap() as f32;
            let opts = SamplingOptions {
                temperature: f("temperature"),
                top_k: o["top_k"].as_u64().unwrap() as usize,
                top_p: f("top_p"),
                min_p: f("min_p"),
                repetition_penalty: f("repetition_penalty"),
                seed: 0,
                ..Default::default()
            };
            let off = [
                opts.repetition_penalty == 1.0,
                opts.temperature == 1.0,
                opts.top_k == 0,
                opts.top_p == 1.0,
                opts.min_p == 0.0,
            ];
            let on = off
                .iter()
                .enumerate()
                .map(|(i, &off)| if off { 0 } else { 1 << i })
                .sum();
            let logits = c["logits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| match x.as_str() {
                    Some("-inf") => f32::NEG_INFINITY,
                    Some(s) => panic!("logit {s}"),
                    // Every value is an f32 written exactly as an f64: the cast is exact.
                    None => x.as_f64().unwrap() as f32,
                })
                .collect::<Vec<_>>();
            let keep = c["keep"]
                .as_array()
                .unwrap()
                .iter()
                .map(|kp| (kp[0].as_u64().unwrap() as u32, kp[1].as_f64().unwrap()))
                .collect();
            let tie = match &c["tie_at_cut"] {
                Value::Null => None,
                t => Some(Tie {
                    sure: ids(&t["sure"]).into_iter().collect(),
                    tied: ids(&t["tied"]),
                    tied_prob: t["tied_prob"].as_f64().unwrap(),
                    n_keep: t["n_keep"].as_u64().unwrap() as usize,
                }),
            };
            Case {
                name: c["name"].as_str().unwrap().to_owned(),
                has_neg_inf: logits.contains(&f32::NEG_INFINITY),
                opts,
                on,
                logits,
                history: ids(&c["history"]),
                keep,
                top_p_boundary: c["top_p_boundary"].as_bool().unwrap(),
                min_p_boundary: c["min_p_boundary"].as_bool().unwrap(),
                tie,
            }
        })
        .collect();
    (doc, cases)
}

fn close(got: f64, want: f64) -> bool {
    (got - want).abs() <= 1e-6 * want
}

/// What differs between sluice's candidates and transformers' for one case, if anything.
fn mismatch(c: &Case) -> Option<String> {
    let s = Sampler::new(c.opts.clone()).unwrap();
    let got: Vec<Candidate> = s.candidates(&c.logits, &c.history, 0);
    let total: f64 = got.iter().map(|c| c.prob).sum();
    if (total - 1.0).abs() > 1e-12 {
        return Some(format!("probabilities sum to {total}"));
    }
    let got_ids: BTreeSet<u32> = got.iter().map(|c| c.id).collect();
    let want: BTreeMap<u32, f64> = match &c.tie {
        None => c.keep.clone(),
        Some(t) => {
            // The documented rule: of the tokens tied at the cut, the lower ids are kept.
            let n_tied = t.n_keep - t.sure.len();
            let mut want: BTreeMap<u32, f64> = t.sure.iter().map(|&i| (i, c.keep[&i])).collect();
            for &i in &t.tied[..n_tied] {
                want.insert(i, t.tied_prob);
            }
            want
        }
    };
    let want_ids: BTreeSet<u32> = want.keys().copied().collect();
    if got_ids != want_ids {
        return Some(format!(
            "candidates {:?}, transformers {:?} ({} vs {})",
            got_ids,
            want_ids,
            got_ids.len(),
            want_ids.len()
        ));
    }
    for g in &got {
        if !close(g.prob, want[&g.id]) {
            return Some(format!(
                "p[{}] = {:e}, transformers {:e}",
                g.id, g.prob, want[&g.id]
            ));
        }
    }
    // Most likely first, ties to the lower id.
    for w in got.windows(2) {
        if w[0].prob < w[1].prob * (1.0 - 1e-12) {
            return Some(format!("not in order: {w:?}"));
        }
    }
    None
}

#[test]
fn fixture_covers_every_combination_and_edge() {
    let (doc, cases) = load();
    assert!(cases.len() >= 300, "{} cases", cases.len());
    let order: Vec<&str> = doc["order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        order,
        [
            "RepetitionPenaltyLogitsProcessor",
            "TemperatureLogitsWarper",
            "TopKLogitsWarper",
            "TopPLogitsWarper",
            "MinPLogitsWarper"
        ]
    );
    for mask in 0..1u32 << OPTIONS.len() {
        let n = cases.iter().filter(|c| c.on == mask).count();
        assert!(n >= 6, "only {n} cases with options {mask:05b}");
    }
    let count = |f: &dyn Fn(&Case) -> bool| cases.iter().filter(|c| f(c)).count();
    assert!(count(&|c| c.top_p_boundary) >= 20);
    assert!(count(&|c| c.min_p_boundary) >= 5);
    assert!(count(&|c| c.tie.is_some()) >= 20);
    assert!(count(&|c| c.has_neg_inf) >= 50);
    // Ties at the top-k cut that survive together.
    assert!(count(&|c| c.opts.top_k > 0 && c.tie.is_none() && c.keep.len() > c.opts.top_k) >= 5);
    assert!(
        count(&|c| {
            let mut h = c.history.clone();
            h.sort_unstable();
            h.windows(2).any(|w| w[0] == w[1])
        }) >= 200
    );
}

#[test]
fn candidates_and_probabilities_match_transformers() {
    let (_, cases) = load();
    let bad: Vec<String> = cases
        .iter()
        .filter_map(|c| mismatch(c).map(|m| format!("{}: {m}", c.name)))
        .collect();
    assert!(
        bad.is_empty(),
        "{} of {} cases differ:\n{}",
        bad.len(),
        cases.len(),
        bad.join("\n")
    );
}

/// Wilson–Hilferty: the chi-square quantile with `df` degrees of freedom at standard-normal `z`.
fn chi2_quantile(df: f64, z: f64) -> f64 {
    let a = 2.0 / (9.0 * df);
    df * (1.0 - a + z * a.sqrt()).powi(3)
}

/// Pearson's statistic of `counts` against `probs` (cells expected below 5 merged) and its
/// degrees of freedom; a draw outside the reference set is infinite.
fn chi2(counts: &BTreeMap<u32, u64>, probs: &BTreeMap<u32, f64>, n: u64) -> (f64, usize) {
    if counts.keys().any(|id| !probs.contains_key(id)) {
        return (f64::INFINITY, 1);
    }
    let (mut stat, mut cells) = (0.0, 0);
    let (mut rest_e, mut rest_o) = (0.0, 0.0);
    for (id, &p) in probs {
        let e = p * n as f64;
        let o = *counts.get(id).unwrap_or(&0) as f64;
        if e < 5.0 {
            rest_e += e;
            rest_o += o;
        } else {
            stat += (o - e) * (o - e) / e;
            cells += 1;
        }
    }
    if rest_e > 0.0 {
        if rest_e < 5.0 && cells > 0 {
            // Too small for a cell of its own: judge it by a Poisson bound instead.
            if rest_o > rest_e + 6.0 * rest_e.sqrt() + 6.0 {
                return (f64::INFINITY, 1);
            }
        } else {
            stat += (rest_o - rest_e) * (rest_o - rest_e) / rest_e;
            cells += 1;
        }
    }
    (stat, cells.max(2) - 1)
}

/// Many seeded draws per case; their frequencies must pass Pearson's chi-square test against
/// transformers' probabilities at p = 1e-4 (z = 3.719). Deterministic: fixed seeds, fixed
/// threshold. Cases with a tie at the top-p cut use the documented tie rule.
#[test]
fn seeded_draws_follow_the_reference_probabilities() {
    let (_, cases) = load();
    let n = 20_000u64;
    let mut tested = 0;
    for (k, c) in cases.iter().enumerate() {
        let probs: BTreeMap<u32, f64> = match &c.tie {
            Some(_) => continue,
            None => c.keep.clone(),
        };
        if probs.len() < 2 || probs.len() > 64 || k % 3 != 0 {
            continue;
        }
        let mut s = Sampler::new(SamplingOptions {
            seed: 1000 + k as u64,
            ..c.opts.clone()
        })
        .unwrap();
        let mut counts = BTreeMap::new();
        for _ in 0..n {
            let id = s.sample_with(&mut c.logits.clone(), &c.history, 0);
            *counts.entry(id).or_insert(0u64) += 1;
        }
        let (stat, df) = chi2(&counts, &probs, n);
        let limit = chi2_quantile(df as f64, 3.719);
        assert!(
            stat <= limit,
            "{}: chi-square {stat:.1} > {limit:.1} ({df} df)",
            c.name
        );
        tested += 1;
    }
    assert!(tested >= 40, "only {tested} cases drawn from");
}

/// The chi-square test has teeth: the same draws fail against a distribution that moves 2% of
/// the mass between two tokens, or that misses one candidate.
#[test]
fn the_chi_square_test_rejects_a_wrong_distribution() {
    let probs: BTreeMap<u32, f64> = [(0, 0.5), (1, 0.3), (2, 0.2)].into_iter().collect();
    let logits: Vec<f32> = probs.values().map(|p| p.ln() as f32).collect();
    let n = 20_000u64;
    let mut s = Sampler::new(SamplingOptions {
        temperature: 1.0,
        seed: 5,
        ..Default::default()
    })
    .unwrap();
    let mut counts = BTreeMap::new();
    for _ in 0..n {
        *counts
            .entry(s.sample_with(&mut logits.clone(), &[], 0))
            .or_insert(0u64) += 1;
    }
    let limit = |df: usize| chi2_quantile(df as f64, 3.719);
    let (stat, df) = chi2(&counts, &probs, n);
    assert!(stat <= limit(df), "{stat} > {}", limit(df));
    let shifted: BTreeMap<u32, f64> = [(0, 0.48), (1, 0.32), (2, 0.2)].into_iter().collect();
    let (stat, df) = chi2(&counts, &shifted, n);
    assert!(stat > limit(df), "{stat} ≤ {}", limit(df));
    let missing: BTreeMap<u32, f64> = [(0, 0.625), (1, 0.375)].into_iter().collect();
    assert_eq!(chi2(&counts, &missing, n).0, f64::INFINITY);
}
