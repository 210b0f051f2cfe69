//! An expert-cache eviction policy of your own, through the public `Policy` trait: here
//! "most recently used" — a poor general choice, but one that shows the whole interface. The
//! policy only orders expert keys; the store owns the bytes, the pins and the budget, so the
//! output is the same as with any shipped policy.
//!
//! `cargo run --release -p sluice --example custom_policy`

use std::collections::BTreeMap;

use sluice::{Engine, ExpertKey, GenerateOptions, Memory, Policy, Prompt};

/// Evicts the most recently used expert that is not pinned.
#[derive(Default)]
struct Mru {
    tick: u64,
    last_use: BTreeMap<ExpertKey, u64>,
}

impl Policy for Mru {
    fn name(&self) -> &str {
        "mru"
    }
    fn insert(&mut self, key: ExpertKey) {
        self.hit(key);
    }
    fn hit(&mut self, key: ExpertKey) {
        self.tick += 1;
        self.last_use.insert(key, self.tick);
    }
    fn remove(&mut self, key: ExpertKey) {
        self.last_use.remove(&key);
    }
    fn victim(&mut self, evictable: &mut dyn FnMut(ExpertKey) -> bool) -> Option<ExpertKey> {
        let mut order: Vec<(u64, ExpertKey)> =
            self.last_use.iter().map(|(k, t)| (*t, *k)).collect();
        order.sort_unstable_by(|a, b| b.cmp(a));
        order.into_iter().map(|(_, k)| k).find(|&k| evictable(k))
    }
}

fn main() -> Result<(), sluice::Error> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/demo");
    let prompt = Prompt::Text("It is a truth universally acknowledged");
    let mut texts = Vec::new();
    for custom in [false, true] {
        let mut b = Engine::builder().model(dir).memory(Memory::Bytes(12 << 20));
        if custom {
            b = b.custom_policy(|_capacity| Box::new(Mru::default()));
        }
        let engine = b.build()?;
        let opts = GenerateOptions {
            max_tokens: 48,
            sampling: engine.default_sampling().clone(),
            ..Default::default()
        };
        let mut session = engine.session()?;
        let mut g = session.generate(prompt.clone(), &opts)?;
        let text = g.run()?;
        let s = g.stats();
        println!(
            "{:>6}: {:5.1}% hits, {} bytes of experts read",
            s.policy,
            100.0 * s.expert_hits as f64 / s.expert_requests.max(1) as f64,
            s.expert_bytes_read
        );
        texts.push(text);
    }
    assert_eq!(texts[0], texts[1], "a policy must never change the output");
    println!("same text with both policies: {}", texts[0]);
    Ok(())
}
