//! Generate text from a prompt with the bundled demo model (or `--model`-like first argument),
//! under a memory budget, streaming tokens as they come.
//!
//! `cargo run --release -p sluice --example generate -- [MODEL_DIR] [PROMPT]`

use std::io::Write;

use sluice::{Engine, GenerateOptions, Memory, Prompt};

fn main() -> Result<(), sluice::Error> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/demo").to_owned());
    let prompt = args
        .next()
        .unwrap_or_else(|| "It is a truth universally acknowledged".to_owned());

    // Half of the demo model's 20 MB: experts and some layers are read from disk as needed.
    let engine = Engine::builder()
        .model(&dir)
        .memory(Memory::Bytes(10 << 20))
        .build()?;
    let opts = GenerateOptions {
        max_tokens: 64,
        sampling: engine.default_sampling().clone(),
        ..Default::default()
    };

    let mut session = engine.session()?;
    let mut generation = session.generate(Prompt::Text(&prompt), &opts)?;
    print!("{prompt}");
    for token in generation.by_ref() {
        print!("{}", token?.text);
        let _ = std::io::stdout().flush();
    }
    let s = generation.stats();
    println!();
    eprintln!(
        "{} tokens at {:.1} tokens/s; {} expert requests, {} hits; {} bytes of experts read",
        s.decode_tokens,
        s.decode_tokens as f64 / s.decode_seconds.max(1e-9),
        s.expert_requests,
        s.expert_hits,
        s.expert_bytes_read
    );
    Ok(())
}
