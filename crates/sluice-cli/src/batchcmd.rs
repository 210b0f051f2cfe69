//! `sluice batch`: a JSONL file of prompts through the batcher, resumable, in input order.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::mpsc;
use std::time::Instant;

use serde::Deserialize;
use serde_json::{Value, json};
use sluice::batch::{Batcher, Event, OwnedPrompt};
use sluice::{Engine, GenerateOptions, Message};

use crate::Failure;

/// One input line.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    id: Value,
    prompt: Option<String>,
    messages: Option<Vec<Message>>,
    max_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    seed: Option<u64>,
    #[serde(default)]
    stop: Vec<String>,
}

fn id_key(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> Failure + '_ {
    move |e| Failure {
        code: 1,
        msg: format!("{}: {e}", path.display()),
    }
}

/// Runs the job file.
pub fn run(a: crate::args::BatchArgs, engine: Engine) -> Result<(), Failure> {
    let input = std::fs::File::open(&a.input).map_err(|e| Failure {
        code: 2,
        msg: format!("{}: {e}", a.input.display()),
    })?;
    // Ids already finished in the output (a resumed run).
    let mut done: HashSet<String> = HashSet::new();
    if a.output.exists() {
        let f = std::fs::File::open(&a.output).map_err(io(&a.output))?;
        for line in std::io::BufReader::new(f).lines() {
            let line = line.map_err(io(&a.output))?;
            if let Ok(v) = serde_json::from_str::<Value>(&line)
                && let Some(k) = v.get("id").and_then(id_key)
            {
                done.insert(k);
            }
        }
    }
    // Parse every line first: bad lines are reported and skipped.
    let mut jobs: Vec<(usize, String, Value, OwnedPrompt, GenerateOptions)> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    let mut order: Vec<String> = Vec::new();
    let defaults = engine.default_sampling().clone();
    let mut bad_lines = 0usize;
    for (n, line) in std::io::BufReader::new(input).lines().enumerate() {
        let line = line.map_err(io(&a.input))?;
        if line.trim().is_empty() {
            continue;
        }
        let mut bad = |msg: String| {
            bad_lines += 1;
            eprintln!("{}: line {}: {msg}; skipped", a.input.display(), n + 1)
        };
        let l: Line = match serde_json::from_str(&line) {
            Ok(l) => l,
            Err(e) => {
                bad(e.to_string());
                continue;
            }
        };
        let Some(key) = id_key(&l.id) else {
            bad("`id` must be a string or a number".into());
            continue;
        };
        if !seen.insert(key.clone()) {
            bad(format!("duplicate id {key}"));
            continue;
        }
        let prompt = match (l.prompt, l.messages) {
            (Some(p), None) => OwnedPrompt::Text(p),
            (None, Some(m)) => OwnedPrompt::Chat(m),
            _ => {
                bad("give exactly one of `prompt` and `messages`".into());
                continue;
            }
        };
        order.push(key.clone());
        if done.contains(&key) {
            continue;
        }
        let mut s = defaults.clone();
        if let Some(t) = l.temperature {
            s.temperature = t;
        }
        if let Some(p) = l.top_p {
            s.top_p = p;
        }
        if let Some(k) = l.top_k {
            s.top_k = k;
        }
        if let Some(m) = l.min_p {
            s.min_p = m;
        }
        if let Some(r) = l.repetition_penalty {
            s.repetition_penalty = r;
        }
        s.seed = l.seed.unwrap_or(0);
        let opts = GenerateOptions {
            max_tokens: l.max_tokens.unwrap_or(a.max_tokens),
            sampling: s,
            stop: l.stop,
            prefill_chunk: a.engine.prefill_chunk,
            ..Default::default()
        };
        jobs.push((n + 1, key, l.id, prompt, opts));
    }
    let skipped = order.len() - jobs.len();
    if skipped > 0 {
        eprintln!(
            "{}: {skipped} ids already done; resuming",
            a.output.display()
        );
    }

    let batcher = Batcher::new(engine, a.batch_size)?;
    let (tx, rx) = mpsc::channel::<(String, Value, Result<sluice::batch::Finished, String>)>();
    let mut submitted = 0;
    for (n, key, id, prompt, opts) in jobs {
        let tx = tx.clone();
        let (k2, id2) = (key.clone(), id.clone());
        let r = batcher.submit(
            &prompt,
            opts,
            Box::new(move |e| {
                match e {
                    Event::Token(_) => {}
                    Event::Done(f) => {
                        let _ = tx.send((k2.clone(), id2.clone(), Ok(*f)));
                    }
                    Event::Failed(e) => {
                        let _ = tx.send((k2.clone(), id2.clone(), Err(e.to_string())));
                    }
                }
                true
            }),
        );
        match r {
            Ok(()) => submitted += 1,
            Err(e) => {
                bad_lines += 1;
                eprintln!("{}: line {n}: {e}; skipped", a.input.display())
            }
        }
    }
    drop(tx);

    let bar = indicatif::ProgressBar::new(submitted as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{pos}/{len} sequences [{bar:30}] {msg} ETA {eta}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&a.output)
        .map_err(io(&a.output))?;
    let t0 = Instant::now();
    let mut tokens = 0u64;
    let mut failed = 0;
    for (_key, id, r) in rx {
        match r {
            Ok(f) => {
                tokens += f.ids.len() as u64;
                let line = json!({
                    "id": id,
                    "text": f.text,
                    "finish_reason": f.finish,
                    "prompt_tokens": f.prompt_ids.len(),
                    "completion_tokens": f.ids.len(),
                    "prefill_seconds": f.stats.prefill_seconds,
                    "decode_seconds": f.stats.decode_seconds,
                });
                // Written (and flushed) as soon as it finishes: an interruption loses nothing.
                writeln!(out, "{line}")
                    .and_then(|_| out.flush())
                    .map_err(io(&a.output))?;
            }
            Err(e) => {
                failed += 1;
                bar.suspend(|| eprintln!("id {id}: {e}"));
            }
        }
        bar.inc(1);
        bar.set_message(format!(
            "{:.1} tokens/s",
            tokens as f64 / t0.elapsed().as_secs_f64().max(1e-9)
        ));
    }
    bar.finish_and_clear();
    drop(out);
    sort_output(&a.output, &order)?;
    eprintln!(
        "{} sequences, {tokens} tokens in {:.1}s ({:.1} tokens/s){}; results in {}",
        submitted,
        t0.elapsed().as_secs_f64(),
        tokens as f64 / t0.elapsed().as_secs_f64().max(1e-9),
        if failed > 0 {
            format!(", {failed} failed")
        } else {
            String::new()
        },
        a.output.display()
    );
    if failed > 0 {
        return Err(Failure {
            code: 1,
            msg: format!("{failed} sequences failed; run again to retry them"),
        });
    }
    if bad_lines > 0 {
        return Err(Failure {
            code: 2,
            msg: format!(
                "{}: {bad_lines} lines skipped (see above)",
                a.input.display()
            ),
        });
    }
    Ok(())
}

/// Rewrites the output in input order (atomically), keeping every finished line.
fn sort_output(path: &Path, order: &[String]) -> Result<(), Failure> {
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    let mut by_id: BTreeMap<String, String> = BTreeMap::new();
    let mut others = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match serde_json::from_str::<Value>(line)
            .ok()
            .and_then(|v| v.get("id").and_then(id_key))
        {
            Some(k) => {
                by_id.insert(k, line.to_owned());
            }
            None => others.push(line.to_owned()),
        }
    }
    let mut sorted: Vec<String> = order.iter().filter_map(|k| by_id.remove(k)).collect();
    sorted.extend(by_id.into_values());
    sorted.extend(others);
    let tmp = path.with_extension("sluice-sorting");
    std::fs::write(&tmp, sorted.join("\n") + "\n").map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}
