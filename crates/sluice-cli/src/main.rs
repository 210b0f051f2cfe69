//! The `sluice` command line. It parses arguments and calls the `sluice` library; nothing else.

#![forbid(unsafe_code)]

mod args;
mod npy;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use sluice::{Engine, Error, GenerateOptions, Isa, Prompt, SamplingOptions};

use args::{Cli, Command, RunArgs};

/// A failure and its exit code: 2 for the user's input, 1 for failures while running.
struct Failure {
    code: u8,
    msg: String,
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure {
            code: if e.is_input_error() { 2 } else { 1 },
            msg: e.to_string(),
        }
    }
}

fn usage(msg: impl Into<String>) -> Failure {
    Failure {
        code: 2,
        msg: msg.into(),
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            // One line: clap's first line already starts with "error: ".
            let text = e.render().to_string();
            eprintln!("{}", text.lines().next().unwrap_or("error: bad arguments"));
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Run(a) => run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("error: {}", f.msg);
            ExitCode::from(f.code)
        }
    }
}

/// The model directory: the one given, else the demo model bundled in the repository.
fn model_dir(given: Option<PathBuf>) -> Result<PathBuf, Failure> {
    if let Some(d) = given {
        return Ok(d);
    }
    let local = PathBuf::from("models/demo");
    if local.is_dir() {
        return Ok(local);
    }
    let bundled = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/demo");
    if bundled.is_dir() {
        return Ok(bundled);
    }
    Err(usage(
        "no --model given and the bundled demo model (models/demo) is not here",
    ))
}

fn engine(model: Option<PathBuf>, threads: Option<usize>, isa: &str) -> Result<Engine, Failure> {
    let dir = model_dir(model)?;
    let mut b = Engine::builder().model(&dir);
    if let Some(t) = threads {
        b = b.threads(t);
    }
    if isa != "auto" {
        let i = Isa::from_name(isa).ok_or_else(|| {
            usage(format!(
                "--isa `{isa}`: expected auto, scalar, avx2 or avx512"
            ))
        })?;
        b = b.isa(i);
    }
    Ok(b.build()?)
}

fn parse_ids(s: &str) -> Result<Vec<u32>, Failure> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<u32>()
                .map_err(|_| usage(format!("--prompt-ids: `{x}` is not a token id")))
        })
        .collect()
}

fn run(a: RunArgs) -> Result<(), Failure> {
    let engine = engine(a.model.clone(), a.threads, &a.isa)?;
    let sampling = SamplingOptions {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repetition_penalty: a.repetition_penalty,
        seed: a.seed,
        ..Default::default()
    };
    let opts = GenerateOptions {
        max_tokens: a.max_tokens,
        sampling,
        stop: a.stop.clone(),
        keep_logits: a.dump_logits.is_some(),
        prefill_chunk: a.prefill_chunk,
        ..Default::default()
    };
    let ids;
    let messages;
    let prompt = match (&a.prompt_ids, &a.prompt) {
        (Some(s), None) => {
            ids = parse_ids(s)?;
            Prompt::Ids(&ids)
        }
        (None, Some(p)) if a.raw || engine.chat_template().is_none() => Prompt::Text(p),
        (None, Some(p)) => {
            messages = vec![sluice::Message::new("user", p.clone())];
            Prompt::Chat(&messages)
        }
        (Some(_), Some(_)) => return Err(usage("give either a PROMPT or --prompt-ids, not both")),
        (None, None) => return Err(usage("no prompt: give a PROMPT or --prompt-ids")),
    };
    let prompt_echo = prompt.clone();
    let mut session = engine.session();
    let mut generation = session.generate(prompt, &opts)?;
    let mut out = std::io::stdout().lock();
    // A raw text prompt is echoed so the continuation reads on from it.
    if !a.json
        && let (Prompt::Text(p), false) = (&prompt_echo, a.prompt.is_none())
    {
        let _ = write!(out, "{p}");
        let _ = out.flush();
    }
    for t in generation.by_ref() {
        let t = t?;
        if !a.json {
            let _ = write!(out, "{}", t.text);
            let _ = out.flush();
        }
    }
    let stats = generation.stats().clone();
    if let Some(path) = &a.dump_logits {
        let logits = generation.logits();
        let vocab = engine.model().config().vocab;
        npy::write_f32(path, &logits, logits.len() / vocab, vocab).map_err(|e| Failure {
            code: 1,
            msg: format!("{}: {e}", path.display()),
        })?;
    }
    let decode_tps = if stats.decode_seconds > 0.0 {
        stats.decode_tokens as f64 / stats.decode_seconds
    } else {
        0.0
    };
    if a.json {
        let v = serde_json::json!({
            "prompt_ids": generation.prompt_ids(),
            "ids": generation.ids(),
            "text": generation.text(),
            "finish_reason": generation.finish_reason(),
            "stats": {
                "prefill_tokens": stats.prefill_tokens,
                "prefill_seconds": stats.prefill_seconds,
                "decode_tokens": stats.decode_tokens,
                "decode_seconds": stats.decode_seconds,
                "threads": engine.threads(),
                "isa": engine.isa().name(),
            }
        });
        let _ = writeln!(out, "{v}");
    } else {
        let _ = writeln!(out);
        eprintln!(
            "[{} prompt tokens in {:.2}s, {} generated in {:.2}s ({:.1} tokens/s), {} threads, {}]",
            stats.prefill_tokens,
            stats.prefill_seconds,
            stats.decode_tokens,
            stats.decode_seconds,
            decode_tps,
            engine.threads(),
            engine.isa()
        );
    }
    Ok(())
}
