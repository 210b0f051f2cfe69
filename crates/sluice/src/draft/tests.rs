//! Unit tests of the parent module.

use super::*;
use crate::options::MTP_WINDOW;

#[test]
fn lookup_takes_the_longest_recurring_suffix_at_its_latest_place() {
    // "a b c d x a b c d y a b c" → the suffix "a b c" (and longer "? a b c") recurs;
    // its latest earlier place is followed by "d y".
    let s = [1, 2, 3, 4, 9, 1, 2, 3, 4, 8, 1, 2, 3];
    assert_eq!(lookup(&s, 2), vec![4, 8]);
    assert_eq!(lookup(&s, 9), vec![4, 8, 1, 2, 3]);
    // The 4-gram "8 1 2 3" does not recur; "4 9 1 2"… the longest that does is 3 long.
    let t = [5, 1, 2, 3, 7, 1, 2, 3];
    assert_eq!(lookup(&t, 3), vec![7, 1, 2]);
    // A longer match wins over a later shorter one.
    let u = [1, 2, 6, 3, 2, 7, 1, 2];
    assert_eq!(lookup(&u, 1), vec![6]);
    assert!(lookup(&[1, 2, 3], 4).is_empty());
    assert!(lookup(&[1], 4).is_empty());
    assert!(lookup(&[1, 1], 0).is_empty());
    assert_eq!(lookup(&[1, 1], 3), vec![1]);
}

#[test]
fn the_adaptive_length_weighs_the_kept_chance_against_the_cost_of_rows() {
    // 0..10 twice, then 0 1 2: the suffix "9 0 1 2" recurs with ten tokens after it.
    let s: Vec<u32> = (0..10).chain(0..10).chain(0..3).collect();
    let mut d = Drafter::new(Draft::Ngram { tokens: None }).unwrap();
    // The first steps time a pass of one row; then p = 0.6 at half a pass per row: one
    // token (1.6 / 1.5 beats 1).
    for _ in 0..PLAIN_FIRST {
        assert_eq!(d.propose(&s, 99).len(), 0);
    }
    assert_eq!(d.propose(&s, 99).len(), 1);
    // Rows that cost almost nothing (a pass bound by reading weights) and drafts that are
    // kept: long drafts.
    d.timed(0, 0.100);
    d.timed(4, 0.104);
    for _ in 0..10 {
        d.outcome(8, 8);
    }
    let k = d.propose(&s, 99).len();
    assert!(k >= 8, "{k}");
    assert_eq!(d.propose(&s, 2).len(), 2, "never past the limit");
    // One step in RETIME_EVERY drafts nothing, to time a pass of one row again.
    let lens: Vec<usize> = (0..2 * RETIME_EVERY)
        .map(|_| d.propose(&s, 99).len())
        .collect();
    assert_eq!(lens.iter().filter(|&&n| n == 0).count(), 2, "{lens:?}");
    // Rows that cost as much as a pass each, at one and at two further rows (doubling
    // does not make them cheaper): no draft pays, whatever p; rare probes of one token.
    let mut e = Drafter::new(Draft::Ngram { tokens: None }).unwrap();
    e.timed(0, 0.100);
    for _ in 0..25 {
        e.timed(1, 0.200);
        e.timed(2, 0.310);
        e.outcome(1, 1);
    }
    assert_eq!(e.wider(), None);
    let probes = |d: &mut Drafter, steps: usize, len: usize| {
        let lens: Vec<usize> = (0..steps).map(|_| d.propose(&s, 99).len()).collect();
        assert!(lens.iter().all(|&n| n == 0 || n == len), "{lens:?}");
        lens.iter().filter(|&&n| n == len).count()
    };
    // (Its first steps time a pass of one row.) The wait doubles after each such probe:
    // after 64 steps, then 128, 256, 512, 512.
    let lens: Vec<usize> = (0..PLAIN_FIRST + 64 + 128 + 256 + 512 + 512)
        .map(|_| e.propose(&s, 99).len())
        .collect();
    let at: Vec<usize> = (0..lens.len()).filter(|&i| lens[i] > 0).collect();
    assert!(lens.iter().all(|&n| n <= 1), "{lens:?}");
    let gaps: Vec<usize> = at.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(gaps, [128, 256, RARE_PROBE_MAX, RARE_PROBE_MAX], "{at:?}");
    // The costs of one length from a single drafted pass are not sure enough: frequent
    // probes. Twice that length is untimed, but at these chances it could not pay even if
    // its second row were free: the probes draft one token.
    let mut y = Drafter::new(Draft::Ngram { tokens: None }).unwrap();
    y.timed(0, 0.100);
    y.timed(1, 0.200);
    y.outcome(1, 1);
    assert_eq!(y.best_length_at(HOPEFUL_P), 0);
    assert_eq!(y.wider(), Some(2));
    assert!(!y.worth_trying(2, y.p, MIN_GAIN));
    // (A quarter of the usual wait apart: the length waits to be timed.)
    assert_eq!(probes(&mut y, PLAIN_FIRST + 2 * PROBE_EVERY, 1), 8);
    // With drafts kept more often it could, and they time it.
    for _ in 0..4 {
        y.outcome(2, 2);
    }
    assert!(y.worth_trying(2, y.p, MIN_GAIN));
    // While such a length waits to be timed, the probes come a quarter of the usual wait
    // apart; the first of those outcomes was the latest probe's, kept whole, which halves
    // that: a probe every step (until one is timed, which moves the length on).
    assert_eq!(probes(&mut y, 2 * PROBE_EVERY, 2), 2 * PROBE_EVERY);
    // Drafts always rejected: none either, however cheap the rows; the probes come often,
    // as the text may turn predictable.
    let mut r = Drafter::new(Draft::Ngram { tokens: None }).unwrap();
    r.timed(0, 0.1);
    r.timed(2, 0.1);
    for _ in 0..20 {
        r.outcome(1, 0);
    }
    assert_eq!(r.best_length(), 0);
    assert_eq!(probes(&mut r, PLAIN_FIRST + 2 * PROBE_EVERY, 1), 2);
    // A pass of one row costs the least of the latest PLAIN_KEPT timed (a slow first pass
    // after the prompt's does not stay in the estimate).
    let mut q = Drafter::new(Draft::Ngram { tokens: None }).unwrap();
    assert_eq!(q.one_row(), None);
    q.timed(0, 0.3);
    q.timed(0, 0.1);
    assert_eq!(q.one_row(), Some(0.1));
    for _ in 0..PLAIN_KEPT {
        q.timed(0, 0.2);
    }
    assert_eq!(q.one_row(), Some(0.2));
    // A fixed length never changes.
    let mut f = Drafter::new(Draft::Ngram { tokens: Some(3) }).unwrap();
    f.outcome(3, 0);
    f.timed(3, 9.0);
    assert_eq!(f.propose(&s, 99).len(), 3);
    assert!(Drafter::new(Draft::Off).is_none());
}

/// Where rows share what a pass reads (experts streaming), each further row costs less
/// than the one before: a single further row costing most of a pass rules out short drafts,
/// yet the drafter, probing longer lengths while its drafts are kept, comes to long ones.
/// Kept probes come sooner each. Where rows cost alike, the lengths stay where they pay.
#[test]
fn rows_that_share_their_reads_lead_to_long_drafts() {
    let s: Vec<u32> = (0..40).chain(0..40).collect();
    // A pass of one row: 0.1 s; r further rows add 0.3·(1 − 0.7^r) s (0.09 for one, at
    // most three passes' worth).
    let run = |cost: &dyn Fn(usize) -> f64| {
        let mut d = Drafter::new(Draft::Ngram { tokens: None }).unwrap();
        let mut lens = Vec::new();
        for _ in 0..80 {
            let n = d.propose(&s[..41], 99).len();
            d.timed(n, 0.1 + cost(n));
            d.outcome(n, n);
            lens.push(n);
        }
        lens
    };
    let lens = run(&|r| 0.3 * (1.0 - 0.7f64.powi(r as i32)));
    let first_long = lens.iter().position(|&n| n >= 16).expect("long drafts");
    assert!(first_long < 40, "{lens:?}");
    assert!(
        lens[60..].iter().filter(|&&n| n >= 16).count() >= 15,
        "{lens:?}"
    );
    // Rows at 0.95 of a pass each, kept or not: nothing longer than a probe.
    let lens = run(&|r| 0.095 * r as f64);
    assert!(lens[20..].iter().all(|&n| n <= 2), "{lens:?}");
}

/// A single slow pass (the host busy for a moment) does not stop the doubling: a length is
/// judged on two timings at least, and costs the least of its latest, so a four-row pass
/// timed once at three times its cost is tried again, and drafts still grow long.
#[test]
fn one_slow_pass_does_not_hold_drafts_short() {
    let s: Vec<u32> = (0..40).chain(0..40).collect();
    let cost = |r: usize| 0.3 * (1.0 - 0.7f64.powi(r as i32));
    let mut d = Drafter::new(Draft::Ngram { tokens: None }).unwrap();
    let (mut lens, mut slow) = (Vec::new(), true);
    for _ in 0..40 {
        let n = d.propose(&s[..41], 99).len();
        let t = if n == 4 && std::mem::take(&mut slow) {
            0.1 + 3.0 * cost(n)
        } else {
            0.1 + cost(n)
        };
        d.timed(n, t);
        d.outcome(n, n);
        lens.push(n);
    }
    assert!(!slow, "a four-row draft was timed: {lens:?}");
    assert!(lens[20..].iter().any(|&n| n >= 16), "{lens:?}");
    // Judged once, that length would have been held not cheaper per row than two.
    let mut e = Drafter::new(Draft::Ngram { tokens: None }).unwrap();
    e.timed(0, 0.1);
    e.timed(2, 0.1 + cost(2));
    e.timed(4, 0.1 + 3.0 * cost(4));
    assert_eq!(e.wider(), Some(4), "timed again");
    e.timed(4, 0.1 + 3.0 * cost(4));
    assert_eq!(e.wider(), None, "judged");
}

/// The MTP drafter's bookkeeping: what it proposes, catching up over the rows passes left
/// since its last draft (one, or several after kept drafts), is what the MTP layer gives
/// run from scratch over every row.
#[test]
fn mtp_drafts_are_the_mtp_layers_prediction_after_any_catch_up() {
    for name in [
        "qwen3_next-fp32",
        "deepseek_v3-fp32",
        "glm4_moe-fp32",
        "deepseek_v4-fp32",
    ] {
        drafts_after_catch_ups(name);
    }
}

fn drafts_after_catch_ups(name: &str) {
    // DeepSeek-V4's model fixture carries its MTP layer; the others have a copy of their
    // own under testdata/mtp.
    let testdata = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata");
    let mut dir = testdata.join("mtp").join(name);
    if !dir.join("config.json").exists() {
        dir = testdata.join("models").join(name);
    }
    let opts = sluice_model::ModelOptions {
        mtp: true,
        threads: 2,
        ..Default::default()
    };
    let model = Model::open(dir, opts).unwrap();
    let (h, v) = (model.config().mtp_row_width(), model.config().vocab);
    let greedy = |l: &[f32]| argmax(&l[l.len() - v..]);
    // From scratch from position `o`: the MTP layer over rows o..=n-2, then `k - 1` steps.
    let scratch_from = |o: usize, hidden: &[f32], seq: &[u32], k: usize| {
        let n = seq.len();
        let mut st = model.new_mtp_state().unwrap();
        let (mut l, mut y) = model
            .mtp_forward(&mut st, o, &hidden[o * h..(n - 1) * h], &seq[o + 1..])
            .unwrap();
        let mut d = vec![argmax(&l)];
        while d.len() < k {
            let row = y[y.len() - h..].to_vec();
            (l, y) = model
                .mtp_forward(&mut st, o, &row, &d[d.len() - 1..])
                .unwrap();
            d.push(argmax(&l));
        }
        d
    };
    let scratch = |hidden: &[f32], seq: &[u32], k: usize| scratch_from(0, hidden, seq, k);
    let mut main = model.new_state();
    main.keep_hidden(MTP_WINDOW);
    let mut seq: Vec<u32> = (0..20).map(|i| (i * 37 + 11) % v as u32).collect();
    let l = model.forward(&mut main, &seq, Logits::Last).unwrap();
    seq.push(greedy(&l));
    let mut md = MtpDraft::default();
    let mut made = 0;
    // Catch-ups over 1, 3, 1 and 2 new rows (the rows of chosen tokens fed one by one).
    for fed in [1, 3, 1, 2] {
        let (d, fresh) = md.propose(&model, &main, &seq, 3);
        assert_eq!(fresh, made == 0, "only the first draft starts the cache");
        assert_eq!(
            d,
            scratch(main.hidden_rows().1, &seq, 3),
            "{name}: after {} tokens",
            seq.len()
        );
        made += d.len();
        for _ in 0..fed {
            let l = model
                .forward(&mut main, &seq[seq.len() - 1..], Logits::Last)
                .unwrap();
            seq.push(greedy(&l));
        }
    }
    assert_eq!(made, 12);
    // A pause longer than MTP_GAP rows (a new generation: the fixtures hold 64
    // positions): the cache restarts over the latest MTP_REWARM rows.
    let mut main = model.new_state();
    main.keep_hidden(MTP_WINDOW);
    seq.truncate(3);
    let l = model.forward(&mut main, &seq, Logits::Last).unwrap();
    seq.push(greedy(&l));
    let mut md = MtpDraft::default();
    assert_eq!(md.propose(&model, &main, &seq, 1).0.len(), 1);
    for _ in 0..MTP_GAP + 5 {
        let l = model
            .forward(&mut main, &seq[seq.len() - 1..], Logits::Last)
            .unwrap();
        seq.push(greedy(&l));
    }
    let (d, fresh) = md.propose(&model, &main, &seq, 2);
    assert!(fresh);
    let o = seq.len() - 1 - MTP_REWARM;
    assert_eq!(d, scratch_from(o, main.hidden_rows().1, &seq, 2), "{name}");
    assert_eq!((md.origin, md.valid), (o, MTP_REWARM));
    // A hidden row missing (the state kept none): no draft, and no error.
    let mut bare = model.new_state();
    model.forward(&mut bare, &seq[..5], Logits::Last).unwrap();
    assert!(
        MtpDraft::default()
            .propose(&model, &bare, &seq[..6], 3)
            .0
            .is_empty()
    );
}
