//! A chat loop on one session: the conversation and its KV cache carry over between turns, so
//! each turn only processes what is new. Uses the model's chat template when it has one; the
//! bundled demo model is a base model, so there the turns continue as plain text.
//!
//! `cargo run --release -p sluice --example chat -- [MODEL_DIR]` then type lines; an empty line
//! ends.

use std::io::{BufRead, Write};

use sluice::{Engine, GenerateOptions, Message, Prompt};

fn main() -> Result<(), sluice::Error> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/demo").to_owned());
    let engine = Engine::builder().model(&dir).build()?;
    let opts = GenerateOptions {
        max_tokens: 64,
        sampling: engine.default_sampling().clone(),
        ..Default::default()
    };
    let mut session = engine.session()?;
    let mut messages: Vec<Message> = Vec::new();
    let mut transcript = String::new();
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| sluice::Error::Io {
            path: "stdin".into(),
            source: e,
        })?;
        if line.trim().is_empty() {
            break;
        }
        let mut g = if engine.chat_template().is_some() {
            messages.push(Message::new("user", line));
            session.generate_full(Prompt::Chat(&messages), &opts)?
        } else {
            transcript.push_str(&line);
            transcript.push('\n');
            session.generate_full(Prompt::Text(&transcript), &opts)?
        };
        for t in g.by_ref() {
            print!("{}", t?.text);
            let _ = std::io::stdout().flush();
        }
        println!();
        let reply = g.text().to_owned();
        drop(g);
        if engine.chat_template().is_some() {
            messages.push(Message::new("assistant", reply));
        } else {
            transcript.push_str(&reply);
            transcript.push('\n');
        }
    }
    Ok(())
}
