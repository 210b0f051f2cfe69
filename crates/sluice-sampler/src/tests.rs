//! Unit tests of the parent module.

use super::*;

fn opts(temperature: f32) -> SamplingOptions {
    SamplingOptions {
        temperature,
        seed: 42,
        ..Default::default()
    }
}

/// A redraw after a refused token applies the penalties once, to the row as it was, and
/// counts one generated token, not two: the same as drawing from the row with the refused
/// token masked in the first place.
#[test]
fn a_redraw_counts_the_step_once() {
    let o = SamplingOptions {
        frequency_penalty: 1.5,
        ..Default::default()
    };
    // Token 0 was generated once: 4.0 − 1.5 = 2.5 beside token 2's 3.0.
    let row = [4.0f32, 2.9, 3.0, 0.0];
    let history = [3, 0];
    let mut a = Sampler::new(o.clone()).unwrap();
    a.drawn = 1;
    let mut l = row;
    assert_eq!(a.sample(&mut l, &history), 2);
    // 2 refused: the row as it was, 2 masked.
    let mut l = row;
    l[2] = f32::NEG_INFINITY;
    let got = a.redraw(&mut l, &history);
    let mut b = Sampler::new(o).unwrap();
    b.drawn = 1;
    let mut m = row;
    m[2] = f32::NEG_INFINITY;
    assert_eq!(got, b.sample(&mut m, &history));
    assert_eq!(
        got, 1,
        "2.9 beats 4.0 − 1.5 once (a second penalty would make it 1.0)"
    );
    // The next step counts the same generated tokens in both.
    let history = [3, 0, 1];
    let (mut la, mut lb) = (row, row);
    assert_eq!(a.sample(&mut la, &history), b.sample(&mut lb, &history));
    assert_eq!(la, lb);
}

#[test]
fn greedy_is_argmax_with_low_index_ties() {
    let mut s = Sampler::new(SamplingOptions::default()).unwrap();
    assert_eq!(s.sample(&mut [1.0, 3.0, 3.0, f32::NAN], &[]), 1);
    assert_eq!(argmax(&[f32::NAN, -1.0]), 1);
}

#[test]
fn validation_names_the_option() {
    for (o, name) in [
        (
            SamplingOptions {
                temperature: -1.0,
                ..Default::default()
            },
            "temperature",
        ),
        (
            SamplingOptions {
                top_p: 0.0,
                ..Default::default()
            },
            "top_p",
        ),
        (
            SamplingOptions {
                top_p: 1.5,
                ..Default::default()
            },
            "top_p",
        ),
        (
            SamplingOptions {
                min_p: 2.0,
                ..Default::default()
            },
            "min_p",
        ),
        (
            SamplingOptions {
                repetition_penalty: 0.0,
                ..Default::default()
            },
            "repetition_penalty",
        ),
        (
            SamplingOptions {
                presence_penalty: f32::NAN,
                ..Default::default()
            },
            "presence_penalty",
        ),
    ] {
        assert_eq!(Sampler::new(o).unwrap_err().option, name);
    }
}

#[test]
fn seeded_streams_repeat() {
    let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
    let run = |seed| {
        let mut s = Sampler::new(SamplingOptions { seed, ..opts(1.0) }).unwrap();
        (0..64)
            .map(|_| s.sample(&mut logits.clone(), &[]))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
}

#[test]
fn top_k_never_leaves_the_k_best() {
    let logits: Vec<f32> = (0..20).map(|i| i as f32 * 0.1).collect();
    let mut s = Sampler::new(SamplingOptions {
        top_k: 3,
        ..opts(5.0)
    })
    .unwrap();
    for _ in 0..500 {
        assert!(s.sample(&mut logits.clone(), &[]) >= 17);
    }
}

#[test]
fn top_p_never_samples_outside_the_nucleus() {
    // Probabilities 0.5, 0.25, 0.125, ... : the 0.8 nucleus is the first three tokens.
    let logits: Vec<f32> = (0..12)
        .map(|i| -(i as f32) * std::f32::consts::LN_2)
        .collect();
    let mut s = Sampler::new(SamplingOptions {
        top_p: 0.8,
        ..opts(1.0)
    })
    .unwrap();
    let mut seen = [0usize; 12];
    for _ in 0..4000 {
        seen[s.sample(&mut logits.clone(), &[]) as usize] += 1;
    }
    assert!(seen[3..].iter().all(|&n| n == 0), "{seen:?}");
    assert!(seen[..3].iter().all(|&n| n > 0), "{seen:?}");
    // Frequencies follow the renormalised nucleus: 4/7, 2/7, 1/7.
    let f0 = seen[0] as f64 / 4000.0;
    assert!((f0 - 4.0 / 7.0).abs() < 0.04, "{f0}");
}

#[test]
fn min_p_drops_unlikely_tokens() {
    let logits = [0.0f32, -0.5, -5.0, -6.0];
    let mut s = Sampler::new(SamplingOptions {
        min_p: 0.1,
        ..opts(1.0)
    })
    .unwrap();
    for _ in 0..500 {
        assert!(s.sample(&mut logits.clone(), &[]) < 2);
    }
}

#[test]
fn sampling_follows_the_distribution() {
    let logits = [0.0f32, (2.0f32).ln(), (3.0f32).ln()];
    let mut s = Sampler::new(opts(1.0)).unwrap();
    let mut seen = [0f64; 3];
    let n = 12000;
    for _ in 0..n {
        seen[s.sample(&mut logits.clone(), &[]) as usize] += 1.0;
    }
    for (i, want) in [1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0].iter().enumerate() {
        assert!(
            (seen[i] / n as f64 - want).abs() < 0.02,
            "{i}: {}",
            seen[i] / n as f64
        );
    }
}

#[test]
fn repetition_penalty_counts_the_whole_history() {
    let s = Sampler::new(SamplingOptions {
        repetition_penalty: 2.0,
        ..opts(1.0)
    })
    .unwrap();
    let mut l = [4.0f32, -4.0, 1.0, 0.0];
    // 7 is outside the vocabulary; duplicates count once; prompt tokens count.
    s.apply_penalties(&mut l, &[0, 1, 1, 7, 3], 0);
    assert_eq!(l, [2.0, -8.0, 1.0, 0.0]);
    let s = Sampler::new(SamplingOptions {
        repetition_penalty: 2.0,
        penalty_last_n: 1,
        ..opts(1.0)
    })
    .unwrap();
    let mut l = [4.0f32, 4.0];
    s.apply_penalties(&mut l, &[0, 1], 0);
    assert_eq!(l, [4.0, 2.0]);
    // Greedy with a repetition penalty changes the choice.
    let mut g = Sampler::new(SamplingOptions {
        repetition_penalty: 4.0,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(g.sample(&mut [2.0, 1.0], &[0]), 1);
}

/// OpenAI: `l_j − presence·[c_j > 0] − frequency·c_j`, `c_j` counted over generated tokens.
#[test]
fn presence_and_frequency_count_generated_tokens_only() {
    let s = Sampler::new(SamplingOptions {
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        ..opts(1.0)
    })
    .unwrap();
    // Prompt [2, 2, 0], then generated [1, 1, 3].
    let history = [2, 2, 0, 1, 1, 3];
    let l = s.penalised(&[1.0, 2.0, 3.0, 0.5], &history, 3);
    assert_eq!(l, [1.0, 2.0 - 0.5 - 2.0 * 0.25, 3.0, 0.5 - 0.5 - 0.25]);
    // Nothing generated: nothing changes, however often the prompt repeats a token.
    assert_eq!(
        s.penalised(&[1.0, 2.0, 3.0, 0.5], &history, 0),
        [1.0, 2.0, 3.0, 0.5]
    );
    // `generated` larger than the history: all of it.
    assert_eq!(
        s.penalised(&[1.0, 2.0, 3.0, 0.5], &[3], 9),
        [1.0, 2.0, 3.0, -0.25]
    );
    // Negative penalties (OpenAI allows −2..2) encourage repeats.
    let s = Sampler::new(SamplingOptions {
        presence_penalty: -1.0,
        frequency_penalty: -0.5,
        ..opts(1.0)
    })
    .unwrap();
    assert_eq!(
        s.penalised(&[0.0, 0.0], &[0, 1, 1], 2),
        [0.0, 0.0 + 1.0 + 2.0 * 0.5]
    );
}

#[test]
fn all_penalties_together_and_the_window() {
    let s = Sampler::new(SamplingOptions {
        repetition_penalty: 2.0,
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        ..opts(1.0)
    })
    .unwrap();
    // Repetition over prompt + generated {0, 1, 2, 3} first, then presence/frequency over
    // the generated [1, 1, 3].
    let history = [2, 2, 0, 1, 1, 3];
    let l = s.penalised(&[1.0, 2.0, 3.0, 0.5], &history, 3);
    assert_eq!(l, [0.5, 1.0 - 1.0, 1.5, 0.25 - 0.75]);
    // penalty_last_n = 2: only [1, 3] count, once each, for every penalty.
    let s = Sampler::new(SamplingOptions {
        penalty_last_n: 2,
        ..s.options().clone()
    })
    .unwrap();
    let l = s.penalised(&[1.0, 2.0, 3.0, 0.5], &history, 3);
    assert_eq!(l, [1.0, 1.0 - 0.75, 3.0, 0.25 - 0.75]);
    // The window holds 4 tokens, of which the 3 generated count for presence/frequency.
    let s = Sampler::new(SamplingOptions {
        penalty_last_n: 4,
        ..s.options().clone()
    })
    .unwrap();
    let l = s.penalised(&[1.0, 2.0, 3.0, 0.5], &history, 3);
    assert_eq!(l, [0.5, 1.0 - 1.0, 3.0, 0.25 - 0.75]);
}

/// `sample` takes the tokens it returned (appended to the history) as the generated ones.
#[test]
fn sample_tracks_what_it_generated() {
    let mut g = Sampler::new(SamplingOptions {
        frequency_penalty: 1.5,
        ..Default::default()
    })
    .unwrap();
    let logits = [5.0f32, 4.0, 3.0];
    // Token 0 is in the prompt twice: not penalised.
    let mut history = vec![0, 0];
    let mut out = Vec::new();
    for _ in 0..4 {
        let t = g.sample(&mut logits.to_vec(), &history);
        history.push(t);
        out.push(t);
    }
    // Generated so far → penalised logits → pick: [] → 5,4,3 → 0; [0] → 3.5,4,3 → 1;
    // [0,1] → 3.5,2.5,3 → 0; [0,1,0] → 2,2.5,3 → 2.
    assert_eq!(out, [0, 1, 0, 2]);
}

#[test]
fn top_k_keeps_ties_with_the_kth() {
    let s = Sampler::new(SamplingOptions {
        top_k: 2,
        ..opts(1.0)
    })
    .unwrap();
    let c = s.candidates(&[1.0, 3.0, 2.0, 2.0, 0.0, 2.0], &[], 0);
    let ids: Vec<u32> = c.iter().map(|c| c.id).collect();
    assert_eq!(ids, [1, 2, 3, 5]);
    let s = Sampler::new(SamplingOptions {
        top_k: 1,
        ..opts(1.0)
    })
    .unwrap();
    assert_eq!(s.candidates(&[1.0, 3.0, 2.0], &[], 0).len(), 1);
}

#[test]
fn top_p_stops_where_the_mass_reaches_it_exactly() {
    // Four tokens of 1/4 each: top_p = 1/2 is reached exactly by two; ties go to lower ids.
    let s = Sampler::new(SamplingOptions {
        top_p: 0.5,
        ..opts(1.0)
    })
    .unwrap();
    let c = s.candidates(&[0.0, 0.0, f32::NEG_INFINITY, 0.0, 0.0], &[], 0);
    assert_eq!(
        c,
        [
            Candidate { id: 0, prob: 0.5 },
            Candidate { id: 1, prob: 0.5 }
        ]
    );
}

#[test]
fn min_p_is_relative_to_the_tempered_top_token() {
    // exp(-1) = 0.37 ≥ 0.3 at T = 1, but exp(-2) = 0.14 < 0.3 at T = 0.5.
    let c = |t| {
        Sampler::new(SamplingOptions {
            min_p: 0.3,
            ..opts(t)
        })
        .unwrap()
        .candidates(&[0.0, -1.0, -9.0], &[], 0)
        .len()
    };
    assert_eq!(c(1.0), 2);
    assert_eq!(c(0.5), 1);
    // Relative to the penalised top token: token 0 (5 → 2.5) loses the top to token 1 (3);
    // exp(2.5 − 3) = 0.61 ≥ 0.5 keeps token 0, where against the unpenalised 5 it would go.
    let s = Sampler::new(SamplingOptions {
        min_p: 0.5,
        repetition_penalty: 2.0,
        ..opts(1.0)
    })
    .unwrap();
    let ids: Vec<u32> = s
        .candidates(&[5.0, 3.0, -9.0], &[0], 0)
        .iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(ids, [1, 0]);
}

/// Issue 18, class 8: `logits / T` used to overflow f32 for T ≤ ~1e-38 (every positive logit
/// became +inf and the lowest id won). Now the division is in f64: the T → 0 limit, greedy.
#[test]
fn tiny_temperatures_are_greedy() {
    let logits = [10.0f32, 20.0, 5.0, -3.0, f32::NEG_INFINITY];
    for t in [1e-38f32, 1e-39, f32::MIN_POSITIVE, 1e-45, 1e-30] {
        for seed in 0..20 {
            let mut s = Sampler::new(SamplingOptions { seed, ..opts(t) }).unwrap();
            assert_eq!(s.sample(&mut logits.clone(), &[]), 1, "T = {t:e}");
        }
        let s = Sampler::new(opts(t)).unwrap();
        assert_eq!(
            s.candidates(&logits, &[], 0),
            [Candidate { id: 1, prob: 1.0 }]
        );
        // All negative, and the largest f32 logits: still the argmax.
        let mut s = Sampler::new(opts(t)).unwrap();
        assert_eq!(s.sample(&mut [-5.0, -1.0, -2.0], &[]), 1);
        assert_eq!(s.sample(&mut [f32::MAX, -f32::MAX, 3e38], &[]), 0);
    }
}

#[test]
fn no_finite_logit_is_not_a_panic() {
    let mut s = Sampler::new(SamplingOptions {
        top_p: 0.5,
        min_p: 0.2,
        top_k: 3,
        ..opts(1.0)
    })
    .unwrap();
    assert_eq!(s.sample(&mut [f32::NAN, f32::NEG_INFINITY], &[]), 0);
    assert_eq!(
        s.sample(&mut [f32::NAN, f32::NEG_INFINITY, f32::INFINITY], &[]),
        2
    );
    assert_eq!(
        s.sample(&mut [f32::NEG_INFINITY, f32::NAN, 0.5], &[9, 9]),
        2
    );
    assert_eq!(s.sample(&mut [], &[]), 0);
}

/// The cuts, the plain way: everything sorted, every step over the whole vocabulary.
fn naive(o: &SamplingOptions, logits: &[f32]) -> Vec<(u32, f64)> {
    let t = o.temperature as f64;
    let mut c: Vec<(u32, f64)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, l as f64 / t))
        .collect();
    c.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if o.top_k > 0 && o.top_k < c.len() {
        let kth = c[o.top_k - 1].1;
        c.retain(|x| x.1 >= kth);
    }
    let max = c[0].1;
    let total: f64 = c.iter().map(|x| (x.1 - max).exp()).sum();
    let mut p: Vec<(u32, f64)> = c.iter().map(|x| (x.0, (x.1 - max).exp() / total)).collect();
    let mut acc = 0.0;
    let mut keep = p.len();
    for (i, x) in p.iter().enumerate() {
        acc += x.1;
        if o.top_p < 1.0 && acc >= o.top_p as f64 {
            keep = i + 1;
            break;
        }
    }
    p.truncate(keep);
    let top = p[0].1;
    p.retain(|x| x.1 >= o.min_p as f64 * top);
    let mass: f64 = p.iter().map(|x| x.1).sum();
    p.iter().map(|x| (x.0, x.1 / mass)).collect()
}

/// `n` logits spread over [0, 5) in a scrambled order, with repeats.
fn spread(n: u64) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 2_654_435_761) % 10_007) as f32 / 2000.0)
        .collect()
}

/// The draw finds the rank order only as far as it walks; it picks what a walk over every
/// candidate, fully ranked, picks with the same random number — on flat rows (where the
/// walk goes deep and the order is found in several steps), peaked ones, rows with ties,
/// and under every cut.
#[test]
fn the_lazy_draw_picks_what_a_walk_over_all_candidates_picks() {
    let n = 5000u64;
    let flat = spread(n);
    let peaked: Vec<f32> = flat
        .iter()
        .enumerate()
        .map(|(i, &l)| if i % 97 == 0 { l + 9.0 } else { l * 0.3 })
        .collect();
    let ties: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.25).collect();
    let mut deep = 0;
    for row in [&flat, &peaked, &ties] {
        for (t, k, p, m) in [
            (1.0, 0, 1.0, 0.0),
            (2.0, 0, 1.0, 0.0),
            (0.7, 0, 0.9, 0.0),
            (1.0, 50, 1.0, 0.0),
            (1.0, 0, 1.0, 0.05),
        ] {
            for seed in 0..40 {
                let o = SamplingOptions {
                    temperature: t,
                    top_k: k,
                    top_p: p,
                    min_p: m,
                    seed,
                    ..Default::default()
                };
                let mut s = Sampler::new(o.clone()).unwrap();
                let cand = s.candidates(row, &[], 0);
                let mut rng = s.rng.clone();
                let mass: f64 = cand.iter().map(|c| c.prob).sum();
                let u = (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64) * mass;
                let mut acc = 0.0;
                let at = cand
                    .iter()
                    .position(|c| {
                        acc += c.prob;
                        u < acc
                    })
                    .unwrap_or(cand.len() - 1);
                deep += usize::from(at >= 64);
                let got = s.sample(&mut row.clone(), &[]);
                assert_eq!(got, cand[at].id, "{o:?}");
            }
        }
    }
    // Some walks went past the first ranking step.
    assert!(deep > 100, "{deep}");
}

/// Large vocabularies, where top-p's prefix is found 256, 1024, 4096 … tokens at a time.
#[test]
fn large_vocabularies_agree_with_a_plain_full_sort() {
    let n = 20_000u64;
    let logits = spread(n);
    for (t, k, p, m) in [
        (1.0, 0, 0.999, 0.0),
        (2.0, 0, 0.5, 0.0),
        (0.5, 0, 0.9, 0.0),
        (1.0, 5000, 0.97, 0.0),
        (1.0, 0, 0.99, 0.3),
        (0.1, 0, 0.9, 0.0),
        (1.0, 300, 1.0, 0.0),
    ] {
        let o = SamplingOptions {
            temperature: t,
            top_k: k,
            top_p: p,
            min_p: m,
            ..opts(t)
        };
        let got = Sampler::new(o.clone()).unwrap().candidates(&logits, &[], 0);
        let want = naive(&o, &logits);
        assert!(want.len() > 50, "{o:?}: {}", want.len());
        assert_eq!(got.len(), want.len(), "{o:?}");
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.id, w.0, "{o:?}");
            assert!((g.prob - w.1).abs() <= 1e-12 * w.1, "{o:?}: {g:?} {w:?}");
        }
    }
}
