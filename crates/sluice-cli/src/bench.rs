//! `sluice bench`: generation end to end over a ladder of memory budgets, for each policy and
//! prefetch setting. Every run is a fresh child process (`sluice run --json`), so its peak RSS is
//! its own and its cache starts cold. Ratios are computed against figures measured in the same
//! bench: decode time against the I/O floor (bytes read ÷ the disk bandwidth measured here with
//! `sluice doctor`'s method), prefill bytes read against the bytes of the experts the prompt
//! touched, and hit rate against Belady's optimum on the run's own trace.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;
use serde_json::Value;
use sluice::Memory;
use sluice::tools::fmt_bytes;

use crate::args::BenchArgs;
use crate::doctor::list;
use crate::{Failure, parse_size, usage};

/// One rung of the ladder.
#[derive(Clone, Debug, Serialize)]
struct Rung {
    label: String,
    /// None: unlimited.
    budget: Option<u64>,
    /// Experts the cache holds.
    cache_experts: u64,
    /// The expert cache holds every expert.
    all_fit: bool,
    /// The trunk streams through a ring.
    tiered: bool,
}

/// One run's figures.
#[derive(Clone, Debug, Serialize)]
struct Row {
    io: String,
    /// The rung's label, `(warm)` after it for a warmed-up run.
    rung: String,
    /// The generation ran once first, unmeasured, with the prefix cache off.
    warm: bool,
    budget_bytes: u64,
    trunk: &'static str,
    cache_experts: u64,
    policy: String,
    prefetch: String,
    prefill_tokens: u64,
    prefill_tokens_per_s: f64,
    decode_tokens: u64,
    decode_s_per_token: f64,
    /// Where a decode step's seconds went (the run's `decode_*_seconds` per step): attention,
    /// routed experts, the head, the rest of the pass, choosing the token.
    decode_phases_s_per_token: Phases,
    decode_tokens_per_s: f64,
    hit_rate: f64,
    resident_hit_rate: f64,
    belady_hit_rate: f64,
    prefetch_recall: f64,
    decode_bytes_per_token: f64,
    decode_expert_bytes_per_token: f64,
    decode_trunk_bytes_per_token: f64,
    /// Decode bytes ÷ decode seconds.
    achieved_gbps: f64,
    /// Decode bytes per token ÷ the measured disk bandwidth.
    io_floor_s_per_token: f64,
    /// Decode seconds per token ÷ the floor (None when nothing was read).
    decode_over_floor: Option<f64>,
    /// In a warm run with every weight in memory: the memory-bandwidth ceiling's seconds per
    /// token (`decode_touched_bytes_per_token` ÷ `memory_gbps`) ÷ decode seconds per token —
    /// the fraction of the ceiling reached (None in cold runs and where weights stream).
    ram_ceiling_fraction: Option<f64>,
    /// Prefill passes (spans) the prompt took.
    prefill_spans: usize,
    /// Expert bytes the prefill read ÷ bytes of the distinct experts the whole prompt routed to
    /// (1.0: each read once).
    prefill_read_over_touched: Option<f64>,
    peak_rss_bytes: u64,
    io_mode_ran: String,
    ids: Vec<u64>,
}

/// Seconds per decode step by phase (see `sluice run --json`'s `decode_*_seconds`).
#[derive(Clone, Debug, Serialize)]
struct Phases {
    attention: f64,
    experts: f64,
    head: f64,
    other: f64,
    sampling: f64,
}

/// The whole report.
#[derive(Clone, Debug, Serialize)]
struct Report {
    model: String,
    checkpoint_bytes: u64,
    trunk_bytes: u64,
    expert_bytes: u64,
    bytes_per_expert: u64,
    experts: u64,
    cpu: String,
    threads: usize,
    /// Per I/O mode: random expert-sized reads of the shards at 4 in flight, GB/s.
    disk_gbps: Vec<(String, f64)>,
    /// Read bandwidth of memory with `threads` threads (`sluice doctor`'s method), GB/s.
    memory_gbps: f64,
    /// Weight bytes a decode step reads with everything in memory (see `sluice inspect`).
    decode_touched_bytes_per_token: u64,
    /// `decode_touched_bytes_per_token` ÷ `memory_gbps`: the fastest decode in RAM, s/token.
    ram_ceiling_s_per_token: f64,
    prompt_tokens: usize,
    max_tokens: usize,
    rungs: Vec<Rung>,
    runs: Vec<Row>,
    /// Every run generated the same ids.
    identical_output: bool,
}

fn fail(msg: String) -> Failure {
    Failure { code: 1, msg }
}

/// Deterministic prompt ids in `[2, vocab)`.
fn prompt_ids(n: usize, vocab: usize) -> Vec<u32> {
    let span = vocab.saturating_sub(2).max(1) as u64;
    (0..n as u64)
        .map(|i| ((i * 7919 + 13) % span + 2) as u32)
        .collect()
}

fn f(v: &Value, k: &str) -> f64 {
    v.get(k).and_then(Value::as_f64).unwrap_or(0.0)
}

fn u(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

pub(crate) fn bench(a: BenchArgs) -> Result<(), Failure> {
    let model = a.model.clone();
    if !sluice::is_model_path(&model) {
        return Err(usage(format!(
            "--model {}: not a model directory or a .gguf file",
            model.display()
        )));
    }
    const MAX_TOKENS: usize = 1 << 20;
    if !(1..=MAX_TOKENS).contains(&a.prompt_tokens)
        || !(2..=MAX_TOKENS).contains(&a.max_tokens)
        || !(1..=MAX_TOKENS).contains(&a.prefill_chunk)
    {
        return Err(usage(format!(
            "bench: need --prompt-tokens 1 to {MAX_TOKENS}, --max-tokens 2 to {MAX_TOKENS}, --prefill-chunk 1 to {MAX_TOKENS}"
        )));
    }
    // Every flag is checked here, before minutes of measuring, not by the first child run.
    if let Some(t) = a.threads {
        let (max, cores) = sluice::max_threads();
        if t == 0 || t > max {
            return Err(usage(format!(
                "--threads {t}: give 1 to {max} (8 × the {cores} available cores)"
            )));
        }
    }
    let sampling = sluice::SamplingOptions {
        temperature: a.temperature,
        ..Default::default()
    };
    sampling
        .validate()
        .map_err(|e| usage(format!("--temperature: {e}")))?;
    if !(a.disk_seconds.is_finite() && a.disk_seconds > 0.0 && a.disk_seconds <= 600.0) {
        return Err(usage(format!(
            "--disk-seconds {}: give a number of seconds in (0, 600]",
            a.disk_seconds
        )));
    }
    let policies = &a.policies;
    let prefetch = list("--prefetch", &a.prefetch, |x| {
        matches!(x, "on" | "all" | "off").then(|| x.to_owned())
    })?;
    let ios = list("--io", &a.io, |x| {
        matches!(x, "direct" | "uring" | "buffered").then(|| x.to_owned())
    })?;
    let context = a.prompt_tokens + a.max_tokens + 8;
    let info =
        sluice::tools::inspect::inspect(&model, Memory::Unlimited, context, a.prefill_chunk)?;
    let experts_all = info.expert_bytes / info.bytes_per_expert.max(1);
    let p = &info.plan;
    let minimum = p.minimum;
    let resident_trunk =
        p.kv_cache + p.scratch + info.trunk_bytes + info.bytes_per_expert * info.top_k as u64;
    let mut rungs = Vec::new();
    for item in a.ladder.split(',').map(str::trim) {
        let budget = match item {
            "unlimited" => None,
            "below-trunk" => Some((minimum + resident_trunk) / 2),
            x if x.ends_with('%') => {
                let pct: f64 = x[..x.len() - 1]
                    .parse()
                    .ok()
                    .filter(|p: &f64| p.is_finite() && *p > 0.0)
                    .ok_or_else(|| {
                        usage(format!("--ladder: `{x}` is not a positive percentage"))
                    })?;
                Some((info.checkpoint_bytes as f64 * pct / 100.0) as u64)
            }
            x => Some(
                parse_size(x).ok_or_else(|| usage(format!("--ladder: `{x}` is not understood")))?,
            ),
        };
        if budget.is_some_and(|b| b < minimum) {
            eprintln!(
                "note: rung {item} ({}) is below the smallest workable budget {}; skipped",
                fmt_bytes(budget.unwrap_or(0)),
                fmt_bytes(minimum)
            );
            continue;
        }
        let mem = budget.map_or(Memory::Unlimited, Memory::Bytes);
        let plan = sluice::tools::inspect::inspect(&model, mem, context, a.prefill_chunk)?.plan;
        rungs.push(Rung {
            label: item.to_owned(),
            budget,
            cache_experts: plan.expert_cache_experts.min(experts_all),
            all_fit: plan.expert_cache >= info.expert_bytes,
            tiered: plan.ring_slots > 0,
        });
    }
    if rungs.is_empty() {
        return Err(usage("--ladder: no workable rung"));
    }
    let cpu = sluice::tools::doctor::cpu_report();
    let threads = a.threads.unwrap_or(cpu.threads);
    let shards = sluice::tools::doctor::model_shards(&model)?;

    // The disk bandwidth the floor is computed from: doctor's method on the model's own shards.
    let mut disk = Vec::new();
    for io in &ios {
        let fig = sluice::tools::doctor::expert_read_bandwidth(
            &model,
            4,
            io != "buffered",
            io == "uring",
            a.disk_seconds.max(0.2),
        )?;
        if !a.json {
            eprintln!(
                "disk: random {} reads of {} over the shards, 4 in flight ({}): {:.2} GB/s",
                fig.mode,
                fmt_bytes(fig.block as u64),
                fig.engine.name(),
                fig.gbps()
            );
        }
        disk.push((io.clone(), fig.gbps()));
    }

    // The memory-bandwidth ceiling of a decode step with everything in memory.
    let memory_gbps = sluice::tools::doctor::memory_bandwidth(threads, 512 << 20);
    let touched = info.decode_touched_bytes_per_token;
    let ceiling = ratio(touched as f64, memory_gbps * 1e9);
    if !a.json {
        eprintln!(
            "memory: {memory_gbps:.1} GB/s with {threads} threads; a decode step reads {} of weights in RAM: ceiling {ceiling:.4} s/token",
            fmt_bytes(touched)
        );
    }

    let ids = prompt_ids(a.prompt_tokens, info.vocab);
    let ids_arg = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let exe = std::env::current_exe().map_err(|e| fail(format!("cannot find myself: {e}")))?;
    // A fresh private directory (mode 0700, a name no other process holds), removed with what
    // is in it when done: never a directory of the user's, nor one a symlink points elsewhere.
    let tmp_dir = tempfile::Builder::new()
        .prefix("sluice-bench-")
        .tempdir()
        .map_err(|e| {
            fail(format!(
                "cannot make a temporary directory in {}: {e}",
                std::env::temp_dir().display()
            ))
        })?;
    let tmp = tmp_dir.path().to_path_buf();
    let mut rows = Vec::new();
    let result = (|| -> Result<(), Failure> {
        for (io, gbps) in &disk {
            for r in &rungs {
                for (pi, policy) in policies.iter().enumerate() {
                    for (fi, pf) in prefetch.iter().enumerate() {
                        if r.all_fit && (pi > 0 || fi > 0) {
                            continue; // every expert fits: policy and prefetch change nothing
                        }
                        // Where every weight fits, a warm run too: the RAM ceiling is about
                        // decoding from memory, not the first reads of experts the prompt
                        // did not touch.
                        let warms: &[bool] = if r.all_fit && !r.tiered {
                            &[false, true]
                        } else {
                            &[false]
                        };
                        for &warm in warms {
                            let trace = tmp.join("trace.txt");
                            sluice::tools::doctor::drop_page_cache(&shards);
                            let row = run_one(&RunSpec {
                                warm,
                                exe: &exe,
                                model: &model,
                                ids: &ids_arg,
                                a: &a,
                                context,
                                io,
                                rung: r,
                                policy: policy.name(),
                                prefetch: pf,
                                trace: &trace,
                                threads,
                                disk_gbps: *gbps,
                                ram_ceiling: ceiling,
                            })?;
                            if !a.json {
                                eprintln!(
                                    "  {io} {} {policy} prefetch {}: decode {:.3} s/token, hits {:.1}% (Belady {:.1}%), peak RSS {}",
                                    r.label,
                                    pf,
                                    row.decode_s_per_token,
                                    100.0 * row.hit_rate,
                                    100.0 * row.belady_hit_rate,
                                    fmt_bytes(row.peak_rss_bytes)
                                );
                            }
                            rows.push(row);
                        }
                    }
                }
            }
        }
        Ok(())
    })();
    drop(tmp_dir);
    result?;
    let identical_output = rows.windows(2).all(|w| w[0].ids == w[1].ids);
    let report = Report {
        model: model.display().to_string(),
        checkpoint_bytes: info.checkpoint_bytes,
        trunk_bytes: info.trunk_bytes,
        expert_bytes: info.expert_bytes,
        bytes_per_expert: info.bytes_per_expert,
        experts: experts_all,
        cpu: cpu.model.clone(),
        threads,
        disk_gbps: disk,
        memory_gbps,
        decode_touched_bytes_per_token: touched,
        ram_ceiling_s_per_token: ceiling,
        prompt_tokens: a.prompt_tokens,
        max_tokens: a.max_tokens,
        rungs,
        runs: rows,
        identical_output,
    };
    if a.json {
        outln!("{}", serde_json::to_string(&report).unwrap_or_default());
    } else {
        print_tables(&report);
    }
    if !identical_output {
        return Err(fail(
            "the runs generated different ids: the output depends on the budget (a bug)".into(),
        ));
    }
    Ok(())
}

struct RunSpec<'a> {
    exe: &'a Path,
    model: &'a Path,
    ids: &'a str,
    a: &'a BenchArgs,
    context: usize,
    io: &'a str,
    rung: &'a Rung,
    policy: &'a str,
    prefetch: &'a str,
    trace: &'a PathBuf,
    threads: usize,
    disk_gbps: f64,
    /// Seconds per token at the memory-bandwidth ceiling.
    ram_ceiling: f64,
    /// The same generation runs first, unmeasured (`--warmup`; no prefix cache, so the
    /// measured prompt is computed again from warm weights).
    warm: bool,
}

fn run_one(s: &RunSpec<'_>) -> Result<Row, Failure> {
    let a = s.a;
    let mut cmd = Command::new(s.exe);
    cmd.arg("run")
        .arg("--model")
        .arg(s.model)
        .args(["--prompt-ids", s.ids])
        .args(["--max-tokens", &a.max_tokens.to_string()])
        .args([
            "--memory",
            &s.rung
                .budget
                .map_or_else(|| "unlimited".to_owned(), |b| b.to_string()),
        ])
        .args(["--policy", s.policy])
        .args(["--numerics", &a.numerics])
        .args(["--prefetch", s.prefetch])
        .args(["--io", s.io])
        .args(["--context", &s.context.to_string()])
        .args(["--prefill-chunk", &a.prefill_chunk.to_string()])
        .args(["--temperature", &a.temperature.to_string()])
        .args(["--seed", &a.seed.to_string()])
        .args(["--threads", &s.threads.to_string()])
        .arg("--trace")
        .arg(s.trace)
        .arg("--json");
    if s.warm {
        cmd.args(["--warmup", "--prefix-cache", "off"]);
    }
    let out = cmd
        .output()
        .map_err(|e| fail(format!("cannot run {}: {e}", s.exe.display())))?;
    if !out.status.success() {
        return Err(fail(format!(
            "rung {} ({} {}): {}",
            s.rung.label,
            s.policy,
            s.io,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let v: Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        fail(format!(
            "rung {}: bad JSON from the child: {e}",
            s.rung.label
        ))
    })?;
    let st = &v["stats"];
    let trace = sluice::tools::trace::read_trace(s.trace).map_err(|e| fail(e.to_string()))?;
    let cap = s.rung.cache_experts.max(1) as usize;
    let belady = sluice::tools::trace::belady(&trace, cap).hit_rate();
    let dtok = u(st, "decode_tokens");
    // The first decode token's forward pass is part of the prompt's timing; each later token is
    // one forward pass: count passes, not tokens, for bytes per token.
    let passes = dtok.saturating_sub(1).max(1) as f64;
    let dexp = u(st, "expert_bytes_read").saturating_sub(u(st, "prefill_expert_bytes_read"));
    let dtrunk = u(st, "trunk_bytes_read").saturating_sub(u(st, "prefill_trunk_bytes_read"));
    let dsec = f(st, "decode_seconds");
    let spt = dsec / passes;
    let bpt = (dexp + dtrunk) as f64 / passes;
    let floor = ratio(bpt, s.disk_gbps * 1e9);
    let spans = st["prefill_spans"].as_array().map_or(0, Vec::len);
    let touched = f(st, "prefill_expert_touched_bytes");
    let pread = f(st, "prefill_expert_bytes_read");
    let req = u(st, "expert_requests") as f64;
    Ok(Row {
        io: s.io.to_owned(),
        rung: if s.warm {
            format!("{} (warm)", s.rung.label)
        } else {
            s.rung.label.clone()
        },
        warm: s.warm,
        budget_bytes: s.rung.budget.unwrap_or(0),
        trunk: if s.rung.tiered { "tiered" } else { "resident" },
        cache_experts: s.rung.cache_experts,
        policy: s.policy.to_owned(),
        prefetch: s.prefetch.to_owned(),
        prefill_tokens: u(st, "prefill_tokens"),
        prefill_tokens_per_s: ratio(f(st, "prefill_tokens"), f(st, "prefill_seconds")),
        decode_tokens: dtok,
        decode_s_per_token: spt,
        decode_phases_s_per_token: Phases {
            attention: f(st, "decode_attention_seconds") / passes,
            experts: f(st, "decode_expert_seconds") / passes,
            head: f(st, "decode_head_seconds") / passes,
            other: f(st, "decode_other_seconds") / passes,
            sampling: f(st, "decode_sampling_seconds") / passes,
        },
        decode_tokens_per_s: ratio(1.0, spt),
        hit_rate: ratio(f(st, "expert_hits"), req),
        resident_hit_rate: ratio(f(st, "expert_resident_hits"), req),
        belady_hit_rate: belady,
        prefetch_recall: f(st, "prefetch_recall"),
        decode_bytes_per_token: bpt,
        decode_expert_bytes_per_token: dexp as f64 / passes,
        decode_trunk_bytes_per_token: dtrunk as f64 / passes,
        achieved_gbps: ratio((dexp + dtrunk) as f64, dsec) / 1e9,
        io_floor_s_per_token: floor,
        decode_over_floor: (bpt > 0.0).then(|| ratio(spt, floor)),
        // Only decoding from memory: every weight fits and the run was warmed up (a cold run
        // still reads the experts the prompt did not touch).
        ram_ceiling_fraction: s.warm.then(|| ratio(s.ram_ceiling, spt)),
        prefill_spans: spans,
        prefill_read_over_touched: (pread > 0.0).then(|| ratio(pread, touched)),
        peak_rss_bytes: u(st, "peak_rss_bytes"),
        io_mode_ran: st["io_mode"].as_str().unwrap_or("?").to_owned(),
        ids: v["ids"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).collect())
            .unwrap_or_default(),
    })
}

fn opt(x: Option<f64>, prec: usize) -> String {
    x.map_or_else(|| "-".to_owned(), |v| format!("{v:.prec$}"))
}

fn print_tables(r: &Report) {
    outln!(
        "model {}: {} ({} trunk, {} experts of {}); {} threads, {}",
        r.model,
        fmt_bytes(r.checkpoint_bytes),
        fmt_bytes(r.trunk_bytes),
        r.experts,
        fmt_bytes(r.bytes_per_expert),
        r.threads,
        r.cpu
    );
    for (io, g) in &r.disk_gbps {
        outln!("disk ({io}): {g:.2} GB/s, random expert-sized reads, 4 in flight");
    }
    outln!(
        "memory: {:.1} GB/s ({} threads); a decode step in RAM reads {} of weights: ceiling {:.4} s/token",
        r.memory_gbps,
        r.threads,
        fmt_bytes(r.decode_touched_bytes_per_token),
        r.ram_ceiling_s_per_token
    );
    outln!(
        "prompt {} tokens, {} generated; output identical across all {} runs: {}",
        r.prompt_tokens,
        r.max_tokens,
        r.runs.len(),
        if r.identical_output { "yes" } else { "NO" }
    );
    outln!();
    outln!(
        "| io | rung | budget | trunk | cache | policy | prefetch | prefill tok/s | decode s/tok | tok/s | hits | resident hits | Belady | MB/token | GB/s | ÷ floor | of RAM ceiling | prefill read ÷ touched | peak RSS |"
    );
    outln!(
        "|---|---|---:|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for x in &r.runs {
        outln!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.3} | {:.2} | {:.1}% | {:.1}% | {:.1}% | {:.1} | {:.2} | {} | {} | {} | {} |",
            x.io,
            x.rung,
            if x.budget_bytes == 0 {
                "unlimited".to_owned()
            } else {
                fmt_bytes(x.budget_bytes)
            },
            x.trunk,
            x.cache_experts,
            x.policy,
            x.prefetch,
            x.prefill_tokens_per_s,
            x.decode_s_per_token,
            x.decode_tokens_per_s,
            100.0 * x.hit_rate,
            100.0 * x.resident_hit_rate,
            100.0 * x.belady_hit_rate,
            x.decode_bytes_per_token / 1e6,
            x.achieved_gbps,
            opt(x.decode_over_floor, 2),
            x.ram_ceiling_fraction
                .map_or_else(|| "-".to_owned(), |f| format!("{:.0}%", 100.0 * f)),
            opt(x.prefill_read_over_touched, 3),
            fmt_bytes(x.peak_rss_bytes),
        );
    }
}
