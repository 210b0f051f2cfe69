//! The prefix cache changes the speed, never the output: on every fixture family, greedy and
//! seeded sampling, resident and streaming at a small budget, a prompt that shares a prefix
//! with an earlier one, extends one or repeats one gives the ids and log-probabilities (the
//! logits' bits) of an engine without the cache — and took the tokens it says from it. A KV
//! cache is cut back to any shared prefix; a recurrent state (KDA, gated DeltaNet) serves only
//! prompts that extend it. Under a budget the entries are lent by the expert cache and stay
//! within the limit, the least recently used going first; sessions and the batcher share it.

mod common;

use std::path::Path;

use sluice::{
    Engine, Finished, GenerateOptions, Memory, OwnedPrompt, PrefixCacheStats, Prompt,
    SamplingOptions,
};

const KIB: u64 = 1 << 10;

/// Ids, each token's log-probability bits, and the prompt tokens taken from the cache.
fn run(engine: &Engine, ids: &[u32], sampling: &SamplingOptions) -> (Vec<u32>, Vec<u32>, usize) {
    let opts = GenerateOptions {
        max_tokens: 10,
        sampling: sampling.clone(),
        stop_at_eos: false,
        logprobs: Some(2),
        ..Default::default()
    };
    let mut s = engine.session().unwrap();
    let mut g = s.generate(Prompt::Ids(ids), &opts).unwrap();
    let mut lp = Vec::new();
    for t in g.by_ref() {
        let t = t.unwrap();
        if let Some(l) = t.logprobs {
            lp.push(l.logprob.to_bits());
            lp.extend(l.top.iter().map(|x| x.1.to_bits()));
        }
    }
    (g.ids().to_vec(), lp, g.stats().cached_tokens)
}

fn ids(vocab: usize, n: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 53 + salt * 29 + 7) % vocab) as u32)
        .collect()
}

fn recurrent(engine: &Engine) -> bool {
    engine
        .model()
        .config()
        .layer_plan
        .iter()
        .any(|l| l.attention.recurrent_floats() > 0)
}

/// Runs the five prompts of the test below on an engine with the cache and one without, and
/// returns the cache's figures at the end.
fn check(dir: &Path, memory: Memory, limit: u64, sampling: &SamplingOptions) -> PrefixCacheStats {
    let builder = || {
        Engine::builder()
            .model(dir)
            .threads(2)
            .context(96)
            .memory(memory)
    };
    let cold = builder().prefix_cache(0).build().unwrap();
    let warm = builder().prefix_cache(limit).build().unwrap();
    let v = cold.model().config().vocab;
    let rec = recurrent(&cold);
    let a = ids(v, 24, 0);
    let b: Vec<u32> = a[..16].iter().chain(&ids(v, 8, 1)).copied().collect();
    let c: Vec<u32> = a.iter().chain(&ids(v, 6, 2)).copied().collect();
    let cap0 = warm.model().experts().capacity();
    // (prompt, tokens it takes from the cache)
    let steps = [
        (&a, 0),
        // Cut back to the shared 16 tokens; a recurrent state cannot be.
        (&b, if rec { 0 } else { 16 }),
        // The whole prompt: its logits come with it.
        (&a, 24),
        (&c, 24),
        // `c` covers `a` now (a KV cache keeps only the longer); one token is run again for
        // its logits. A recurrent model keeps both.
        (&a, if rec { 24 } else { 23 }),
    ];
    for (k, (p, cached)) in steps.into_iter().enumerate() {
        let what = format!("{}: {memory:?} {sampling:?} step {k}", dir.display());
        let (want, want_lp, none) = run(&cold, p, sampling);
        assert_eq!(none, 0, "{what}: the cold engine has no cache");
        let (got, got_lp, took) = run(&warm, p, sampling);
        assert_eq!(got, want, "{what}");
        assert_eq!(got_lp, want_lp, "{what}: log-probability bits");
        assert_eq!(took, cached, "{what}: cached tokens");
    }
    // The next turn of a conversation sent whole — `a`, the reply, something new — starts
    // from the state `a`'s generation finished with (all but the reply's last token).
    let (reply, _, _) = run(&cold, &a, sampling);
    let turn: Vec<u32> = a
        .iter()
        .chain(&reply)
        .chain(&ids(v, 5, 6))
        .copied()
        .collect();
    let (want, want_lp, _) = run(&cold, &turn, sampling);
    let (got, got_lp, took) = run(&warm, &turn, sampling);
    let what = format!("{}: {memory:?} {sampling:?} next turn", dir.display());
    assert_eq!((got, got_lp), (want, want_lp), "{what}");
    assert_eq!(took, a.len() + reply.len() - 1, "{what}");
    let st = warm.prefix_cache_stats();
    let what = format!("{}: {memory:?}: {st:?}", dir.display());
    assert_eq!(st.lookups, 6, "{what}");
    assert_eq!(st.hits, if rec { 4 } else { 5 }, "{what}");
    // Each prompt's state and each finished generation's, but those a KV cache's longer
    // prompts cover (`c` covers `a`, the next turn `a`'s finished state).
    assert_eq!(st.entries, if rec { 8 } else { 6 }, "{what}");
    assert!(st.bytes > 0 && st.bytes <= st.limit_bytes, "{what}");
    if memory != Memory::Unlimited {
        // The entries' bytes are lent by the expert cache.
        let cap = warm.model().experts().capacity();
        assert_eq!(cap0 - cap, st.bytes, "{what}");
    }
    st
}

/// A budget with `need` bytes of prefix cache under which `dir` streams (its experts, or for
/// a dense model its trunk, do not all stay in memory).
fn streamed_budget(dir: &Path, need: u64) -> u64 {
    let builder = || Engine::builder().model(dir).threads(2).context(96);
    let budget = common::minimum(builder()) + 256 * KIB + need;
    let e = builder()
        .memory(Memory::Bytes(budget))
        .prefix_cache(need)
        .build()
        .unwrap();
    let p = e.plan();
    assert!(
        !p.all_experts_fit() || !p.trunk_resident(),
        "{}: {p:?}",
        dir.display()
    );
    budget
}

#[test]
fn shared_extended_and_repeated_prompts_give_the_cold_bits_on_every_family() {
    let greedy = SamplingOptions::default();
    let sampled = SamplingOptions {
        temperature: 0.9,
        top_p: 0.95,
        seed: 3,
        ..Default::default()
    };
    for dir in common::families() {
        for sampling in [&greedy, &sampled] {
            // Resident, then streaming with just the room the entries took.
            let need = check(&dir, Memory::Unlimited, 1 << 20, sampling).bytes;
            let budget = streamed_budget(&dir, need);
            check(&dir, Memory::Bytes(budget), need, sampling);
        }
    }
}

fn prompt_opts() -> GenerateOptions {
    GenerateOptions {
        max_tokens: 8,
        stop_at_eos: false,
        ..Default::default()
    }
}

#[test]
fn the_batcher_reuses_a_shared_prefix_across_jobs_with_the_cold_output() {
    let dir = common::demo();
    // A short context: the default share is what the pool holds beyond the full-context KV
    // cache of the planned sequences.
    let builder = || {
        Engine::builder()
            .model(&dir)
            .threads(2)
            .sequences(2)
            .context(256)
    };
    let min = common::minimum(builder());
    for memory in [Memory::Unlimited, Memory::Bytes(min + 8192 * KIB)] {
        let doc = "The river carried the boats down to the sea, past the mills and the old stone bridge. ".repeat(4);
        let jobs: Vec<(OwnedPrompt, GenerateOptions)> =
            ["Who waved?", "Where did they go?", "Who waved?"]
                .iter()
                .map(|q| (OwnedPrompt::Text(format!("{doc}{q}")), prompt_opts()))
                .collect();
        let cold: Vec<Finished> = common::batched(
            &builder().memory(memory).prefix_cache(0).build().unwrap(),
            2,
            jobs.clone(),
        );
        // On by default; under this budget the default share holds one entry, so room for
        // two is asked for.
        let warm_engine = match memory {
            Memory::Unlimited => builder().build().unwrap(),
            _ => builder()
                .memory(memory)
                .prefix_cache(1 << 20)
                .build()
                .unwrap(),
        };
        assert!(warm_engine.prefix_cache_stats().limit_bytes > 0);
        let warm = common::batched(&warm_engine, 2, jobs);
        for (i, (c, w)) in cold.iter().zip(&warm).enumerate() {
            assert_eq!(c.ids, w.ids, "{memory:?} job {i}");
            assert_eq!(c.stats.cached_tokens, 0);
        }
        // The first job computes the document; the second reuses it and the third repeats
        // the first whole.
        let n = warm[0].prompt_ids.len();
        assert_eq!(warm[0].stats.cached_tokens, 0);
        let shared = warm[0]
            .prompt_ids
            .iter()
            .zip(&warm[1].prompt_ids)
            .take_while(|(a, b)| a == b)
            .count();
        assert_eq!(
            warm[1].stats.cached_tokens,
            shared,
            "{memory:?} {:?} {:?}",
            warm_engine.prefix_cache_stats(),
            warm_engine.plan()
        );
        assert!(shared > n / 2, "{shared} of {n}");
        assert_eq!(
            warm[2].stats.cached_tokens,
            n,
            "{memory:?} {:?}",
            warm_engine.prefix_cache_stats()
        );
        assert_eq!(
            warm[1].stats.prefill_tokens,
            warm[1].prompt_ids.len() - shared
        );
        assert_eq!(warm[2].stats.prefill_tokens, 0);
    }
}

#[test]
fn the_least_recently_used_entry_makes_room_and_the_limit_holds() {
    let engine = |limit| {
        Engine::builder()
            .model(common::demo())
            .threads(2)
            .prefix_cache(limit)
            .build()
            .unwrap()
    };
    // One generated token: its finished state is its prompt's, which the prompt's entry
    // covers, so each run keeps one entry.
    let g = SamplingOptions::default();
    let go = |e: &Engine, p: &[u32]| {
        let opts = GenerateOptions {
            max_tokens: 1,
            ..Default::default()
        };
        let mut s = e.session().unwrap();
        let mut gn = s.generate(Prompt::Ids(p), &opts).unwrap();
        gn.run().unwrap();
        gn.stats().cached_tokens
    };
    let probe = engine(1 << 30);
    let v = probe.model().config().vocab;
    let (a, b, c) = (ids(v, 40, 0), ids(v, 40, 1), ids(v, 40, 2));
    go(&probe, &a);
    assert_eq!(probe.prefix_cache_stats().entries, 1);
    let one = probe.prefix_cache_stats().bytes;
    // Room for two entries.
    let e = engine(2 * one + one / 2);
    go(&e, &a);
    go(&e, &b);
    assert_eq!(go(&e, &a), 40, "a is still held");
    go(&e, &c); // b, the least recently used, goes
    let st = e.prefix_cache_stats();
    assert_eq!((st.entries, st.evicted), (2, 1), "{st:?}");
    assert!(st.bytes <= st.limit_bytes, "{st:?}");
    assert_eq!(go(&e, &b), 0, "b was evicted");
    assert_eq!(go(&e, &c), 40, "c is held");
    // A finished generation's state is kept only where there is room: it evicts nothing.
    let full = e.prefix_cache_stats();
    run(&e, &c, &g);
    let after = e.prefix_cache_stats();
    assert_eq!(
        (after.entries, after.evicted),
        (full.entries, full.evicted),
        "{after:?}"
    );
    // A state larger than the whole limit is never kept; 0 turns the cache off.
    let small = engine(one / 4);
    run(&small, &a, &g);
    assert_eq!(small.prefix_cache_stats().entries, 0);
    let off = engine(0);
    run(&off, &a, &g);
    assert_eq!(run(&off, &a, &g).2, 0);
    assert_eq!(off.prefix_cache_stats().lookups, 0);
}

#[test]
fn a_chat_session_and_a_new_session_share_the_cache() {
    let e = Engine::builder()
        .model(common::demo())
        .threads(2)
        .build()
        .unwrap();
    let cold = Engine::builder()
        .model(common::demo())
        .threads(2)
        .prefix_cache(0)
        .build()
        .unwrap();
    let text = "Once upon a time there was a lighthouse keeper who counted ships.";
    let first = |engine: &Engine| {
        let mut s = engine.session().unwrap();
        let mut g = s.generate(Prompt::Text(text), &prompt_opts()).unwrap();
        g.run().unwrap()
    };
    assert_eq!(first(&e), first(&cold));
    // A second session asking the same thing and more starts from the first's prompt.
    let longer = format!("{text} One night");
    let mut s = e.session().unwrap();
    let mut g = s.generate(Prompt::Text(&longer), &prompt_opts()).unwrap();
    let got = g.run().unwrap();
    assert!(g.stats().cached_tokens > 0, "{:?}", g.stats().cached_tokens);
    let mut s = cold.session().unwrap();
    let want = s
        .generate(Prompt::Text(&longer), &prompt_opts())
        .unwrap()
        .run()
        .unwrap();
    assert_eq!(got, want);
}

#[test]
fn the_plan_sets_the_share_aside_before_the_trunk_and_refuses_what_does_not_fit() {
    let builder = || Engine::builder().model(common::demo()).threads(2);
    let min = common::minimum(builder());
    let plan = |budget: u64, share: Option<u64>| {
        let b = builder().memory(Memory::Bytes(budget));
        let b = match share {
            Some(s) => b.prefix_cache(s),
            None => b,
        };
        b.build().map(|e| e.plan().clone())
    };
    // Asked for, the share is on top of what the same budget without it would give.
    let base = plan(min + 2048 * KIB, Some(0)).unwrap();
    let with = plan(min + 2048 * KIB + 512 * KIB, Some(512 * KIB)).unwrap();
    assert_eq!(with.prefix_cache, 512 * KIB);
    assert_eq!(with.pool, base.pool + 512 * KIB);
    assert_eq!(with.trunk_pinned, base.trunk_pinned);
    assert_eq!(with.context_fit, base.context_fit);
    assert_eq!(
        with.expert_cache_full_context,
        base.expert_cache_full_context
    );
    assert_eq!(with.minimum, base.minimum + 512 * KIB);
    // By default a sixteenth of the budget, out of what the pool holds beyond the full-context
    // KV cache and the expert floor: nothing taken from the trunk, no sequence in the way.
    let mut nonzero = 0;
    for extra in [0, 2048 * KIB, 4096 * KIB, 64 << 20] {
        let p = plan(min + extra, None).unwrap();
        let beyond = p.pool.saturating_sub(p.kv_cache + p.expert_floor);
        assert_eq!(p.prefix_cache, ((min + extra) / 16).min(beyond), "{p:?}");
        let without = plan(min + extra, Some(0)).unwrap();
        assert_eq!(p.trunk_pinned, without.trunk_pinned);
        assert_eq!((p.pool, p.context_fit), (without.pool, without.context_fit));
        nonzero += usize::from(p.prefix_cache > 0);
    }
    assert!(nonzero >= 2, "the default share is not always 0");
    // More than the budget holds beside the rest is refused, naming it.
    match plan(min + 1024 * KIB, Some(1 << 30)) {
        Err(e) => assert!(e.to_string().contains("prefix cache"), "{e}"),
        Ok(p) => panic!("expected a refusal, got {p:?}"),
    }
    // With unlimited memory: 1 GiB unless asked.
    let e = builder().build().unwrap();
    assert_eq!(e.prefix_cache_stats().limit_bytes, 1 << 30);
}

/// A recurrent fixture with a byte-level tokenizer and a chat template.
fn recurrent_chat_model(name: &str) -> tempfile::TempDir {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/models")
        .join(name);
    let d = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, d.path().join(p.file_name().unwrap())).unwrap();
    }
    // Each byte its own token (`testdata/byte-tokenizer`), inside the fixture's vocabulary.
    std::fs::copy(
        src.join("../../byte-tokenizer/tokenizer.json"),
        d.path().join("tokenizer.json"),
    )
    .unwrap();
    let tpl = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";
    std::fs::write(
        d.path().join("tokenizer_config.json"),
        serde_json::to_vec(&serde_json::json!({"chat_template": tpl})).unwrap(),
    )
    .unwrap();
    d
}

#[test]
fn a_recurrent_state_is_kept_where_the_system_prompt_ends() {
    let g = SamplingOptions::default();
    // Ids with an explicit boundary, on every family: a KV cache needs none (it is cut back),
    // a recurrent state is kept there by a first pass.
    for dir in common::families() {
        for memory in [
            Memory::Unlimited,
            Memory::Bytes(streamed_budget(&dir, 256 * KIB)),
        ] {
            let builder = || {
                Engine::builder()
                    .model(&dir)
                    .threads(2)
                    .context(96)
                    .memory(memory)
            };
            let cold = builder().prefix_cache(0).build().unwrap();
            let warm = builder().prefix_cache(256 * KIB).build().unwrap();
            let v = cold.model().config().vocab;
            let sys = ids(v, 20, 3);
            for (k, q) in [ids(v, 7, 4), ids(v, 9, 5)].iter().enumerate() {
                let p: Vec<u32> = sys.iter().chain(q).copied().collect();
                let opts = GenerateOptions {
                    max_tokens: 6,
                    stop_at_eos: false,
                    logprobs: Some(1),
                    cache_prefix: Some(sys.len()),
                    ..Default::default()
                };
                let go = |e: &Engine| {
                    let mut s = e.session().unwrap();
                    let mut gn = s.generate(Prompt::Ids(&p), &opts).unwrap();
                    let lp: Vec<u32> = gn
                        .by_ref()
                        .map(|t| t.unwrap().logprobs.unwrap().logprob.to_bits())
                        .collect();
                    (gn.ids().to_vec(), lp, gn.stats().cached_tokens)
                };
                let (want, want_lp, _) = go(&cold);
                let (got, got_lp, took) = go(&warm);
                let what = format!("{}: {memory:?} prompt {k}", dir.display());
                assert_eq!((got, got_lp), (want, want_lp), "{what}");
                assert_eq!(took, if k == 0 { 0 } else { sys.len() }, "{what}");
            }
        }
    }
    // Chat prompts mark the end of their system messages themselves, in sessions and in the
    // batcher.
    for name in ["qwen3_next-fp32", "qwen3_5_moe-fp32"] {
        let d = recurrent_chat_model(name);
        let builder = || Engine::builder().model(d.path()).threads(2).context(256);
        let system = sluice::Message::new("system", "You answer in one word, always politely.");
        let chat = |q: &str| vec![system.clone(), sluice::Message::new("user", q)];
        let opts = GenerateOptions {
            max_tokens: 5,
            stop_at_eos: false,
            sampling: g.clone(),
            ..Default::default()
        };
        let warm = builder().build().unwrap();
        let cold = builder().prefix_cache(0).build().unwrap();
        // The system message on its own, as the template renders it without a reply.
        let t = warm
            .chat_template()
            .unwrap()
            .render(&chat("x")[..1], false)
            .unwrap();
        let head = warm.tokenizer().unwrap().encode(&t, false).unwrap().len();
        assert!(head > 20, "{head}");
        let mut took = Vec::new();
        for q in ["Who are you?", "Where is it?"] {
            let mut s = warm.session().unwrap();
            let mut gn = s.generate(Prompt::Chat(&chat(q)), &opts).unwrap();
            gn.run().unwrap();
            took.push(gn.stats().cached_tokens);
            let mut c = cold.session().unwrap();
            let want = c
                .generate(Prompt::Chat(&chat(q)), &opts)
                .unwrap()
                .run()
                .unwrap();
            assert_eq!(gn.text(), want, "{name}: {q}");
        }
        assert_eq!(took, vec![0, head], "{name}: sessions");
        let jobs: Vec<(OwnedPrompt, GenerateOptions)> = ["Why so?", "How so?"]
            .iter()
            .map(|q| (OwnedPrompt::Chat(chat(q)), opts.clone()))
            .collect();
        let fresh = builder().build().unwrap();
        let got = common::batched(&fresh, 1, jobs.clone());
        let want = common::batched(&cold, 1, jobs);
        for (a, b) in got.iter().zip(&want) {
            assert_eq!(a.ids, b.ids, "{name}");
        }
        assert_eq!(
            got.iter()
                .map(|f| f.stats.cached_tokens)
                .collect::<Vec<_>>(),
            vec![0, head],
            "{name}: the batcher"
        );
    }
}
