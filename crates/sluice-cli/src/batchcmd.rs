//! `sluice batch`: a JSONL file of prompts through the batcher, resumable, in input order.
//!
//! The files are checked before the engine loads ([`open`]): the output must not be the input
//! (by path, symlink or hard link) and must be writable, and a torn last line left by an
//! interrupted run (killed, disk full) is dropped so its id is redone. Each result is then
//! written as one line in one `write`, and the job fails rather than report success with an id
//! missing from the output.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Instant;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use sluice::{Batcher, Event, OwnedPrompt};
use sluice::{Engine, GenerateOptions, Message};

use crate::Failure;

/// The longest input line read (16 MiB): a longer one is a bad line, skipped unread.
pub const MAX_LINE: usize = 16 << 20;

/// One input line.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    /// Kept as written: a number past what a float holds exactly (`1180591620717411303424`)
    /// comes back unchanged.
    id: Box<RawValue>,
    prompt: Option<String>,
    messages: Option<Vec<Message>>,
    max_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    seed: Option<u64>,
    #[serde(default)]
    stop: Vec<String>,
    /// OpenAI's `response_format`: the output follows a JSON schema or is a JSON object.
    response_format: Option<Value>,
}

/// What identifies a job: a string id's text, a number id's JSON text as written.
fn id_key(raw: &RawValue) -> Option<String> {
    match serde_json::from_str::<Value>(raw.get()) {
        Ok(Value::String(s)) => Some(s),
        Ok(Value::Number(_)) => Some(raw.get().trim().to_owned()),
        _ => None,
    }
}

/// The id of a finished result line, if it is one.
fn result_id(line: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Result {
        id: Box<RawValue>,
    }
    serde_json::from_slice::<Result>(line)
        .ok()
        .and_then(|r| id_key(&r.id))
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> Failure + '_ {
    move |e| Failure {
        code: 1,
        msg: format!("{}: {e}", path.display()),
    }
}

/// A job's files, checked before the engine loads.
pub struct Files {
    input: std::io::BufReader<std::fs::File>,
    /// Ids already finished in the output (a resumed run).
    done: HashSet<String>,
}

/// Opens the input, checks the output (not the input, writable) and repairs a torn last line
/// of an existing output. Nothing is created yet.
pub fn open(a: &crate::args::BatchArgs) -> Result<Files, Failure> {
    let input = std::fs::File::open(&a.input).map_err(|e| Failure {
        code: 2,
        msg: format!("{}: {e}", a.input.display()),
    })?;
    let in_meta = input.metadata().map_err(io(&a.input))?;
    let mut done = HashSet::new();
    if let Ok(m) = std::fs::metadata(&a.output) {
        if m.dev() == in_meta.dev() && m.ino() == in_meta.ino() {
            return Err(crate::usage(format!(
                "--output {} is the same file as --input {}; results would overwrite the jobs",
                a.output.display(),
                a.input.display()
            )));
        }
        if !m.is_file() {
            return Err(crate::usage(format!(
                "--output {}: not a regular file",
                a.output.display()
            )));
        }
        done = repair_and_read_done(&a.output)?;
    }
    // The output is rewritten in input order at the end, through a file beside it: the
    // directory must be writable too, which is found now rather than after the whole job.
    check_dir_writable(&a.output)?;
    Ok(Files {
        input: std::io::BufReader::new(input),
        done,
    })
}

fn out_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn check_dir_writable(output: &Path) -> Result<(), Failure> {
    let dir = out_dir(output);
    tempfile::Builder::new()
        .prefix(".sluice-batch-")
        .tempfile_in(&dir)
        .map(drop)
        .map_err(|e| {
            crate::usage(format!(
                "--output {}: cannot write in {}: {e}",
                output.display(),
                dir.display()
            ))
        })
}

/// Reads the finished ids of an existing output. A last line without its newline is what an
/// interruption leaves (a result cut part way, perhaps inside a UTF-8 sequence): it is cut off
/// the file so the id is redone and the next result does not glue onto it — unless it is a
/// whole result, which then gets its newline.
fn repair_and_read_done(output: &Path) -> Result<HashSet<String>, Failure> {
    let writable = |e: std::io::Error| {
        crate::usage(format!("--output {}: cannot write: {e}", output.display()))
    };
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .open(output)
        .map_err(writable)?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes).map_err(io(output))?;
    if let Some(&last) = bytes.last()
        && last != b'\n'
    {
        let start = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        if result_id(&bytes[start..]).is_some() {
            f.write_all(b"\n").map_err(io(output))?;
            bytes.push(b'\n');
        } else {
            f.set_len(start as u64).map_err(io(output))?;
            eprintln!(
                "{}: dropped a torn last line ({} bytes, from an interrupted run); its id is redone",
                output.display(),
                bytes.len() - start
            );
            bytes.truncate(start);
        }
    }
    Ok(bytes.split(|&b| b == b'\n').filter_map(result_id).collect())
}

/// The next line of `r` without its newline, at most `max` bytes: `Ok(None)` at the end,
/// `Ok(Some(Err(len)))` for a longer line (skipped to its end unread).
fn next_line(
    r: &mut impl BufRead,
    max: usize,
    buf: &mut Vec<u8>,
) -> std::io::Result<Option<Result<(), usize>>> {
    buf.clear();
    let n = r.by_ref().take(max as u64 + 1).read_until(b'\n', buf)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        return Ok(Some(Ok(())));
    }
    if buf.len() <= max {
        return Ok(Some(Ok(()))); // the last line, without a newline
    }
    // Too long: skip the rest of the line.
    let mut len = buf.len();
    loop {
        let chunk = r.fill_buf()?;
        if chunk.is_empty() {
            break;
        }
        match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => {
                len += i;
                r.consume(i + 1);
                break;
            }
            None => {
                let k = chunk.len();
                len += k;
                r.consume(k);
            }
        }
    }
    buf.clear();
    Ok(Some(Err(len)))
}

/// Runs the job file (checked by [`open`]).
pub fn run(a: crate::args::BatchArgs, files: Files, engine: Engine) -> Result<(), Failure> {
    let Files { mut input, done } = files;
    // Parse every line first: bad lines are reported and skipped.
    let mut jobs: Vec<(usize, String, Box<RawValue>, OwnedPrompt, GenerateOptions)> = Vec::new();
    let mut compiled: std::collections::HashMap<String, sluice::CompiledGrammar> =
        std::collections::HashMap::new();
    let mut seen: HashSet<String> = HashSet::new();
    let mut order: Vec<String> = Vec::new();
    let defaults = engine.default_sampling().clone();
    let draft = crate::draft(&a.draft)?;
    let drafting = draft != sluice::Draft::Off;
    let mut bad_lines = 0usize;
    let mut buf = Vec::new();
    let mut n = 0usize;
    while let Some(read) = next_line(&mut input, MAX_LINE, &mut buf).map_err(io(&a.input))? {
        n += 1;
        let mut bad = |msg: String| {
            bad_lines += 1;
            eprintln!("{}: line {n}: {msg}; skipped", a.input.display())
        };
        if let Err(len) = read {
            bad(format!(
                "{len} bytes is longer than the {MAX_LINE} accepted"
            ));
            continue;
        }
        let Ok(line) = std::str::from_utf8(&buf) else {
            bad("not valid UTF-8".into());
            continue;
        };
        if line.trim().is_empty() {
            continue;
        }
        let l: Line = match serde_json::from_str(line) {
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
        // A grammar that does not compile is a bad line, not a failed sequence.
        let grammar = match l
            .response_format
            .as_ref()
            .map(sluice::Grammar::from_response_format)
            .transpose()
        {
            Ok(g) => g.flatten(),
            Err(e) => {
                bad(e.to_string());
                continue;
            }
        };
        // Compiled once per distinct grammar in the file, shared by every line that gives it.
        let grammar = match grammar {
            None => None,
            Some(g) => {
                let key = format!("{g:?}");
                match compiled.get(&key) {
                    Some(c) => Some(c.clone()),
                    None => match engine.compile_grammar(&g) {
                        Ok(c) => {
                            compiled.insert(key, c.clone());
                            Some(c)
                        }
                        Err(e) => {
                            bad(e.to_string());
                            continue;
                        }
                    },
                }
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
        if let Some(p) = l.presence_penalty {
            s.presence_penalty = p;
        }
        if let Some(f) = l.frequency_penalty {
            s.frequency_penalty = f;
        }
        s.seed = l.seed.unwrap_or(0);
        let opts = GenerateOptions {
            max_tokens: l.max_tokens.unwrap_or(a.max_tokens),
            sampling: s,
            stop: l.stop,
            prefill_chunk: a.engine.prefill_chunk,
            prefill_span: a.engine.prefill_span,
            grammar,
            draft,
            ..Default::default()
        };
        jobs.push((n, key, l.id, prompt, opts));
    }
    let skipped = order.len() - jobs.len();
    if skipped > 0 {
        eprintln!(
            "{}: {skipped} ids already done; resuming",
            a.output.display()
        );
    }

    let batcher = Batcher::new(engine, a.batch_size)?;
    /// A job's result, or why it failed and whether the line was at fault (a grammar that
    /// fails part-way is the line's, and would fail again: a bad line, not one to retry).
    type Outcome = (
        String,
        Box<RawValue>,
        Result<sluice::Finished, (String, bool)>,
    );
    let (tx, rx) = mpsc::channel::<Outcome>();
    let mut submitted = 0;
    let mut rejected = HashSet::new();
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
                        let input = e.is_input_error();
                        let _ = tx.send((k2.clone(), id2.clone(), Err((e.to_string(), input))));
                    }
                }
                true
            }),
        );
        match r {
            Ok(()) => submitted += 1,
            // A failure of the batcher itself (it stopped) is no fault of the line: stop, exit 1.
            Err(e) if !e.is_input_error() => return Err(e.into()),
            Err(e) => {
                bad_lines += 1;
                rejected.insert(key);
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
    let mut failed_ids = HashSet::new();
    for (key, id, r) in rx {
        match r {
            Ok(f) => {
                tokens += f.ids.len() as u64;
                let line = json!({
                    "text": f.text,
                    "finish_reason": f.finish,
                    "prompt_tokens": f.prompt_ids.len(),
                    "completion_tokens": f.ids.len(),
                    "prefill_seconds": f.stats.prefill_seconds,
                    "decode_seconds": f.stats.decode_seconds,
                });
                let mut line = line;
                if f.stats.cached_tokens > 0 {
                    line["cached_tokens"] = json!(f.stats.cached_tokens);
                }
                if drafting {
                    line["draft_proposed"] = json!(f.stats.draft_proposed);
                    line["draft_accepted"] = json!(f.stats.draft_accepted);
                }
                // Written as soon as it finishes, the whole line in one write: an interruption
                // leaves at most a torn last line, which the next run drops and redoes.
                // The id first, as it was written in the input.
                let rest = line.to_string();
                let mut text = format!("{{\"id\":{},{}", id.get().trim(), &rest[1..]);
                text.push('\n');
                out.write_all(text.as_bytes()).map_err(io(&a.output))?;
            }
            Err((e, true)) => {
                bad_lines += 1;
                rejected.insert(key);
                bar.suspend(|| eprintln!("id {id}: {e}; skipped"));
            }
            Err((e, false)) => {
                failed += 1;
                failed_ids.insert(key);
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
    let present = sort_output(&a.output, &order)?;
    // Never report success with a result missing: every id submitted or already done must be
    // in the output, unless it failed (reported below).
    let missing: Vec<&String> = order
        .iter()
        .filter(|k| !present.contains(*k) && !failed_ids.contains(*k) && !rejected.contains(*k))
        .collect();
    if !missing.is_empty() {
        return Err(Failure {
            code: 1,
            msg: format!(
                "{}: {} ids have no result ({}); run again to redo them",
                a.output.display(),
                missing.len(),
                missing
                    .iter()
                    .take(5)
                    .map(|k| k.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
    }
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

/// Rewrites the output in input order (atomically, through a temporary file beside it with
/// the output's permissions), keeping every finished line. Returns the ids it holds.
fn sort_output(path: &Path, order: &[String]) -> Result<HashSet<String>, Failure> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    let mut by_id: BTreeMap<String, &[u8]> = BTreeMap::new();
    let mut others = Vec::new();
    for line in bytes
        .split(|&b| b == b'\n')
        .filter(|l| !l.trim_ascii().is_empty())
    {
        match result_id(line) {
            Some(k) => {
                by_id.insert(k, line);
            }
            None => others.push(line),
        }
    }
    let present: HashSet<String> = by_id.keys().cloned().collect();
    let mut sorted: Vec<&[u8]> = order.iter().filter_map(|k| by_id.remove(k)).collect();
    sorted.extend(by_id.into_values());
    sorted.extend(others);
    let mut text = sorted.join(&b'\n');
    text.push(b'\n');
    let dir = out_dir(path);
    let mut tmp = tempfile::Builder::new()
        .prefix(".sluice-batch-")
        .tempfile_in(&dir)
        .map_err(io(&dir))?;
    tmp.write_all(&text).map_err(io(tmp.path()))?;
    if let Ok(m) = std::fs::metadata(path) {
        tmp.as_file()
            .set_permissions(m.permissions())
            .map_err(io(path))?;
    }
    tmp.persist(path).map_err(|e| io(path)(e.error))?;
    Ok(present)
}
