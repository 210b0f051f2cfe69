//! The KV cache takes its pages from the expert cache as positions are written, and gives them
//! back when its sequence ends: the expert cache shrinks mid-generation (evicting by its
//! policy), yet every output bit is what an unlimited run gives, at every budget, policy and
//! thread count; a prompt that cannot fit even with every expert given up is refused up front.

use sluice::{Engine, Error, GenerateOptions, Memory, PolicyChoice, Prompt};

mod common;
use common::demo;

const PROMPT: &str = "It is a truth universally acknowledged";

fn opts(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        stop_at_eos: false,
        ..Default::default()
    }
}

fn minimum() -> u64 {
    common::minimum(Engine::builder().model(demo()))
}

#[test]
fn kv_growth_shrinks_the_expert_cache_mid_generation_and_changes_no_bit() {
    let reference = Engine::builder()
        .model(demo())
        .memory(Memory::Unlimited)
        .threads(1)
        .build()
        .unwrap();
    let want = {
        let mut s = reference.session().unwrap();
        let mut g = s.generate(Prompt::Text(PROMPT), &opts(300)).unwrap();
        g.run().unwrap();
        g.ids().to_vec()
    };
    assert_eq!(want.len(), 300);
    let mut shrunk = 0;
    // Budgets where the trunk is resident and the expert cache starts with 11 to 25 of the
    // 80 experts; 300 tokens' KV pages then take 4 of them back.
    for kib in [12u64 << 10, (12 << 10) + 512, 14 << 10] {
        for policy in [PolicyChoice::Lfu, PolicyChoice::S3Fifo] {
            for threads in [1, 2] {
                let what = format!("{kib} KiB, {policy}, {threads} threads");
                let engine = Engine::builder()
                    .model(demo())
                    .memory(Memory::Bytes((kib << 10) + common::text(512, 1)))
                    .policy(policy.clone())
                    .threads(threads)
                    .build()
                    .unwrap();
                let start = engine.model().experts().capacity();
                let mut s = engine.session().unwrap();
                let mut g = s.generate(Prompt::Text(PROMPT), &opts(300)).unwrap();
                g.run().unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(g.ids(), &want[..], "{what}");
                let st = g.stats();
                drop(g);
                // Whole pages of the positions written, taken from the expert cache.
                let per = engine.plan().kv_per_position;
                let pages = s.history().len().div_ceil(sluice_model::plan::KV_PAGE);
                assert_eq!(st.kv_cache_bytes, pages as u64 * 64 * per, "{what}");
                assert_eq!(st.expert_cache_start_bytes, start, "{what}");
                // The prompt's state kept by the prefix cache is lent by the expert cache too.
                let kept = engine.prefix_cache_stats().bytes;
                assert!(kept > 0, "{what}");
                assert_eq!(
                    st.expert_cache_end_bytes,
                    start - st.kv_cache_bytes - kept,
                    "{what}"
                );
                if engine.plan().expert_cache_full_context < engine.plan().all_expert_bytes
                    && st.expert_cache_end_bytes < engine.plan().all_expert_bytes
                    && st.expert_evictions > 0
                {
                    shrunk += 1;
                }
                // The session's pages go back when it ends.
                drop(s);
                assert_eq!(engine.model().experts().capacity(), start - kept, "{what}");
            }
        }
    }
    // The small budgets evict experts while the KV cache grows.
    assert_eq!(shrunk, 12, "runs that shrank a full expert cache");
}

#[test]
fn a_prompt_that_cannot_fit_beside_the_floor_is_refused_up_front() {
    let engine = Engine::builder()
        .model(demo())
        .memory(Memory::Bytes(minimum() + (100 << 10)))
        .threads(1)
        .build()
        .unwrap();
    let fit = engine.model().max_positions();
    assert!(fit < engine.plan().context, "{fit} positions fit");
    let long: Vec<u32> = (0..fit as u32 + 1).map(|i| 10 + i % 300).collect();
    let e = engine
        .session()
        .unwrap()
        .generate(Prompt::Ids(&long), &opts(1))
        .unwrap_err();
    assert!(e.to_string().contains("context full"), "{e}");
    assert!(e.is_input_error(), "{e}");
    // Exactly what fits runs.
    let ok: Vec<u32> = long[..fit].to_vec();
    let mut s = engine.session().unwrap();
    assert!(s.generate(Prompt::Ids(&ok), &opts(0)).is_ok());
}

#[test]
fn sessions_share_the_pool_and_return_their_pages() {
    let engine = Engine::builder()
        .model(demo())
        // Too little for two full-context KV caches even with the whole trunk streaming, so
        // that the sequences outgrow the pool.
        .memory(Memory::Bytes(
            minimum() + (512 << 10) + common::text(512, 2) - common::text(512, 1),
        ))
        .sequences(2)
        .threads(1)
        .build()
        .unwrap();
    let plan = engine.plan();
    let page = sluice_model::plan::KV_PAGE;
    let page_bytes = page as u64 * plan.kv_per_position;
    let start = engine.model().experts().capacity();
    let pages = ((start - plan.expert_floor) / page_bytes) as usize;
    assert!(pages >= 3, "{pages} pages");
    // The first session takes all pages but one; the second then needs two (more than the
    // page and the crumbs left).
    let mut a = engine.session().unwrap();
    let prompt_a: Vec<u32> = (0..((pages - 1) * page) as u32)
        .map(|i| 10 + i % 300)
        .collect();
    a.generate(Prompt::Ids(&prompt_a), &opts(0)).unwrap();
    assert_eq!(
        engine.model().experts().capacity(),
        start - (pages - 1) as u64 * page_bytes
    );
    let mut b = engine.session().unwrap();
    let prompt_b: Vec<u32> = (0..(2 * page) as u32).map(|i| 20 + i).collect();
    match b.generate(Prompt::Ids(&prompt_b), &opts(0)) {
        Err(Error::Model(sluice_model::ModelError::KvFull { positions, held })) => {
            // The first prefill chunk took the last page; the second found none.
            assert_eq!((positions, held), (2 * page, page));
        }
        other => panic!("expected the KV cache to be full, got {other:?}"),
    }
    drop(b);
    // When a ends its pages come back, and the prompt runs as on a fresh engine.
    drop(a);
    let want = {
        let mut s = engine.session().unwrap();
        let mut g = s.generate(Prompt::Ids(&prompt_b), &opts(5)).unwrap();
        g.run().unwrap();
        g.ids().to_vec()
    };
    let unlimited = Engine::builder()
        .model(demo())
        .memory(Memory::Unlimited)
        .threads(1)
        .build()
        .unwrap();
    let mut s = unlimited.session().unwrap();
    let mut g = s.generate(Prompt::Ids(&prompt_b), &opts(5)).unwrap();
    g.run().unwrap();
    assert_eq!(g.ids(), &want[..]);
    assert_eq!(engine.model().experts().capacity(), start);
}
