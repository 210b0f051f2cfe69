//! `sluice doctor`: what this machine can do, as a table or JSON.

use sluice::tools::doctor::{DoctorOptions, doctor as measure};
use sluice::tools::fmt_bytes;

use crate::args::DoctorArgs;
use crate::{Failure, parse_size, usage};

/// Parses `a,b,c` with `f`.
pub(crate) fn list<T>(
    flag: &str,
    s: &str,
    f: impl Fn(&str) -> Option<T>,
) -> Result<Vec<T>, Failure> {
    s.split(',')
        .map(|x| f(x.trim()).ok_or_else(|| usage(format!("{flag}: `{x}` is not understood"))))
        .collect()
}

pub(crate) fn doctor(a: DoctorArgs) -> Result<(), Failure> {
    let opts = DoctorOptions {
        dir: a.dir.clone(),
        model: a.model.clone(),
        file_bytes: parse_size(&a.file_size)
            .filter(|&b| b >= 16 << 20)
            .ok_or_else(|| usage("--file-size: expected a size of at least 16MiB"))?,
        blocks: list("--blocks", &a.blocks, |x| {
            parse_size(x).filter(|&b| b > 0).map(|b| b as usize)
        })?,
        depths: list("--depths", &a.depths, |x| {
            x.parse::<usize>().ok().filter(|&d| (1..=256).contains(&d))
        })?,
        buffered: !a.no_buffered,
        uring: !a.no_uring,
        seconds: if a.seconds.is_finite() && (0.05..=60.0).contains(&a.seconds) {
            a.seconds
        } else {
            return Err(usage(format!(
                "--seconds {}: give a number of seconds from 0.05 to 60",
                a.seconds
            )));
        },
        ..Default::default()
    };
    let quiet = a.json;
    let r = measure(&opts, &mut |what| {
        if !quiet {
            eprintln!("measuring {what}...");
        }
    })?;
    if a.json {
        outln!("{}", serde_json::to_string(&r).unwrap_or_default());
        return Ok(());
    }
    let c = &r.cpu;
    outln!("CPU      {} ({} threads)", c.model, c.threads);
    outln!("         flags: {}", c.flags.join(" "));
    outln!(
        "         sluice kernels: {} (auto picks {})",
        c.isas.join(", "),
        c.best_isa
    );
    outln!(
        "         FMA ceiling {:.1} G multiply-adds/s per thread ({}), {:.1} G on {} threads",
        c.fma_gmacs_per_thread,
        c.best_isa,
        c.fma_gmacs_per_thread * c.threads as f64,
        c.threads
    );
    let m = &r.memory;
    outln!(
        "memory   {} total, {} available; read bandwidth {:.1} GB/s (1 thread), {:.1} GB/s ({} threads)",
        fmt_bytes(m.total_bytes),
        fmt_bytes(m.available_bytes),
        m.read_gbps_1_thread,
        m.read_gbps_all_threads,
        c.threads
    );
    outln!(
        "reads    random, {} ({}), pages dropped after each buffered read:",
        r.read_target,
        fmt_bytes(r.read_target_bytes)
    );
    outln!(
        "         {:>9} {:>9} {:>6} {:>6} {:>7} {:>11} {:>10}",
        "mode",
        "engine",
        "block",
        "depth",
        "GB/s",
        "latency ms",
        "CPU s/GB"
    );
    for row in &r.reads {
        outln!(
            "         {:>9} {:>9} {:>6} {:>6} {:>7.2} {:>11.2} {:>10.3}",
            row.mode,
            row.engine,
            short(row.block as u64),
            row.depth,
            row.gbps,
            row.latency_ms,
            row.cpu_seconds_per_gb
        );
    }
    if let Some(e) = &r.uring_error {
        outln!("         io_uring not measured: {e}");
    }
    outln!(
        "disk     best random-read bandwidth {:.2} GB/s (reader threads, as the store reads)",
        r.disk_gbps
    );
    match (m.cgroup_limit_bytes, m.cgroup_used_bytes) {
        (Some(limit), Some(used)) if limit.saturating_sub(used) < m.available_bytes => outln!(
            "budget   --memory auto = {} (the memory cgroup's limit {} less the {} it holds, minus 10%, at least 64 MiB of headroom)",
            fmt_bytes(m.auto_budget_bytes),
            fmt_bytes(limit),
            fmt_bytes(used)
        ),
        _ => outln!(
            "budget   --memory auto = {} (MemAvailable minus 10%, at least 512 MiB of headroom)",
            fmt_bytes(m.auto_budget_bytes)
        ),
    }
    if let Some(i) = &r.model_plan {
        let p = &i.plan;
        outln!(
            "         for {}: trunk {} of {} pinned, expert cache {} ({} experts, {:.0}% of all)",
            i.dir,
            fmt_bytes(p.trunk_pinned),
            fmt_bytes(i.trunk_bytes),
            fmt_bytes(p.expert_cache),
            p.expert_cache_experts,
            100.0 * p.expert_cache as f64 / i.expert_bytes.max(1) as f64
        );
    }
    Ok(())
}

/// `1M`, `16M`, `512K`.
pub(crate) fn short(b: u64) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{}M", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{}K", b >> 10)
    } else {
        fmt_bytes(b)
    }
}
