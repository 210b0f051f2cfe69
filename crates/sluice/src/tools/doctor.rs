//! What this machine can do for sluice: its CPU's instruction sets, memory bandwidth, random-read
//! bandwidth of a disk at expert-sized reads, and the budget `--memory auto` would give.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;
use sluice_format::Checkpoint;
use sluice_kernels::Isa;
use sluice_store::probe::{ProbeFile, ReadEngine, ReadFigure, ReadProbe, measure_reads};

use crate::Error;
use crate::engine::{Memory, resolve_memory};

/// What to measure.
#[derive(Clone, Debug)]
pub struct DoctorOptions {
    /// Directory for the scratch file of the read tests (ignored with `model`).
    pub dir: PathBuf,
    /// Read the shards of this model instead of a scratch file.
    pub model: Option<PathBuf>,
    /// Size of the scratch file.
    pub file_bytes: u64,
    /// Read sizes.
    pub blocks: Vec<usize>,
    /// Queue depths.
    pub depths: Vec<usize>,
    /// Also measure buffered reads (pages dropped after each read).
    pub buffered: bool,
    /// Also measure direct reads issued through io_uring.
    pub uring: bool,
    /// Seconds per read measurement.
    pub seconds: f64,
    /// Bytes of the memory-bandwidth test.
    pub memory_test_bytes: usize,
}

impl Default for DoctorOptions {
    fn default() -> Self {
        DoctorOptions {
            dir: PathBuf::from("."),
            model: None,
            file_bytes: 2 << 30,
            blocks: vec![1 << 20, 4 << 20, 16 << 20],
            depths: vec![1, 4, 16],
            buffered: true,
            uring: true,
            seconds: 1.0,
            memory_test_bytes: 512 << 20,
        }
    }
}

/// The CPU.
#[derive(Clone, Debug, Serialize)]
pub struct CpuReport {
    /// `model name` from `/proc/cpuinfo`.
    pub model: String,
    /// Logical CPUs this process may use.
    pub threads: usize,
    /// Instruction-set flags that matter to sluice (and to other engines), as the CPU reports.
    pub flags: Vec<String>,
    /// sluice kernel paths this CPU can run.
    pub isas: Vec<String>,
    /// The one sluice picks.
    pub best_isa: String,
    /// f32 multiply-adds per second one thread sustains with the best ISA's widest FMA, in
    /// billions: the ceiling a compute-bound kernel (a long prefill) is held against.
    pub fma_gmacs_per_thread: f64,
}

/// Memory.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryReport {
    /// `MemTotal`.
    pub total_bytes: u64,
    /// `MemAvailable`.
    pub available_bytes: u64,
    /// Read bandwidth of one thread, GB/s.
    pub read_gbps_1_thread: f64,
    /// Read bandwidth of all threads, GB/s.
    pub read_gbps_all_threads: f64,
    /// The limit of the memory cgroup (a container's) that leaves this process the least
    /// room, when one is set.
    pub cgroup_limit_bytes: Option<u64>,
    /// What that cgroup holds (its usage less inactive page cache).
    pub cgroup_used_bytes: Option<u64>,
    /// The budget `--memory auto` gives: `MemAvailable` (or the cgroup's room, when smaller)
    /// less headroom ([`crate::sysmem::Available::auto_budget`]).
    pub auto_budget_bytes: u64,
}

/// One read figure.
#[derive(Clone, Debug, Serialize)]
pub struct ReadRow {
    /// Bytes per read.
    pub block: usize,
    /// Reads in flight.
    pub depth: usize,
    /// `direct` or `buffered`.
    pub mode: String,
    /// How the reads in flight were issued: `threads` (one thread per read, `pread`: the
    /// store's reader pool) or `io_uring` (one thread, every read queued on an io_uring).
    pub engine: String,
    /// GB/s.
    pub gbps: f64,
    /// Mean latency per read, ms.
    pub latency_ms: f64,
    /// Reads done.
    pub reads: u64,
    /// CPU seconds the reading took per GB read (user and system, every thread).
    pub cpu_seconds_per_gb: f64,
}

impl From<&ReadFigure> for ReadRow {
    fn from(f: &ReadFigure) -> ReadRow {
        ReadRow {
            block: f.block,
            depth: f.depth,
            mode: f.mode.name().to_owned(),
            engine: f.engine.name().to_owned(),
            gbps: f.gbps(),
            latency_ms: f.latency_ms(),
            reads: f.reads,
            cpu_seconds_per_gb: f.cpu_seconds_per_gb(),
        }
    }
}

/// Everything `sluice doctor` measured.
#[derive(Clone, Debug, Serialize)]
pub struct DoctorReport {
    /// CPU.
    pub cpu: CpuReport,
    /// Memory.
    pub memory: MemoryReport,
    /// What was read: the scratch file or the model's shards.
    pub read_target: String,
    /// Bytes of it.
    pub read_target_bytes: u64,
    /// Random-read figures.
    pub reads: Vec<ReadRow>,
    /// Why direct reads through io_uring were not measured, where they were asked for and the
    /// kernel refused them (absent, or disabled, or filtered by a container).
    pub uring_error: Option<String>,
    /// The best direct read bandwidth measured with reader threads, as the store reads, GB/s
    /// (buffered when direct never ran).
    pub disk_gbps: f64,
    /// With a model: the plan `--memory auto` gives it.
    pub model_plan: Option<crate::tools::inspect::Inspection>,
}

fn meminfo(key: &str) -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// The CPU's model name, logical CPUs and interesting flags.
pub fn cpu_report() -> CpuReport {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |k: &str| {
        info.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
            .unwrap_or_default()
    };
    let have: Vec<String> = field("flags")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    const WANT: [&str; 14] = [
        "avx2",
        "fma",
        "f16c",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512dq",
        "avx512_vnni",
        "avx512_bf16",
        "avx512_fp16",
        "avx_vnni",
        "amx_bf16",
        "amx_int8",
        "amx_tile",
    ];
    CpuReport {
        model: field("model name"),
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        flags: WANT
            .iter()
            .filter(|w| have.iter().any(|h| h == *w))
            .map(|w| (*w).to_owned())
            .collect(),
        isas: Isa::available()
            .into_iter()
            .map(|i| i.name().to_owned())
            .collect(),
        best_isa: Isa::best().name().to_owned(),
        fma_gmacs_per_thread: sluice_kernels::probe::fma_ceiling(
            Isa::best(),
            std::time::Duration::from_millis(300),
        )
        .unwrap_or(0.0)
            / 1e9,
    }
}

/// Read bandwidth of `threads` threads summing `bytes` of memory (best of five passes), GB/s.
/// Each thread walks its part with the widest loads this CPU has, in several streams side by
/// side ([`sluice_kernels::probe::read_sum`]), as the product kernels read weights: a loop the
/// compiler narrows to the baseline ISA reads 10–20% less on the machine of
/// docs/PERFORMANCE.md, which made decode look faster than its ceiling.
pub fn memory_bandwidth(threads: usize, bytes: usize) -> f64 {
    let threads = threads.max(1);
    let isa = Isa::best();
    let words = (bytes / 8).max(threads * 4096);
    // Page-aligned parts, so no load straddles two cache lines.
    let raw: Vec<u64> = (0..(words + 512) as u64).collect();
    let off = raw.as_ptr().align_offset(4096).min(512);
    let data = &raw[off..off + words];
    let per = words.div_ceil(threads).div_ceil(512) * 512;
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t0 = Instant::now();
        let total: u64 = std::thread::scope(|s| {
            let hs: Vec<_> = data
                .chunks(per)
                .map(|part| s.spawn(move || sluice_kernels::probe::read_sum(isa, part)))
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0, u64::wrapping_add)
        });
        std::hint::black_box(total);
        best = best.min(t0.elapsed().as_secs_f64());
    }
    (words * 8) as f64 / best / 1e9
}

/// The shard files of a model directory.
pub fn model_shards(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let ck = Checkpoint::open(dir)?;
    Ok(ck.shards().iter().map(|s| s.path.clone()).collect())
}

/// Drops the page-cache pages of `paths` (clean pages only; a no-op where the kernel keeps them),
/// so the next reads of them come from the device.
pub fn drop_page_cache(paths: &[PathBuf]) {
    for p in paths {
        if let Ok(f) = sluice_store::ShardFile::open(p, false) {
            f.drop_pages(0, f.len());
        }
    }
}

/// Random reads of one expert's size over a model's shards at `depth` reads in flight (O_DIRECT
/// when `direct`, queued on an io_uring when `uring`): the disk bandwidth an I/O floor is
/// computed from.
pub fn expert_read_bandwidth(
    dir: &Path,
    depth: usize,
    direct: bool,
    uring: bool,
    seconds: f64,
) -> Result<ReadFigure, Error> {
    let i = crate::tools::inspect::inspect(dir, Memory::Unlimited, 1, 1)?;
    let probe = ReadProbe {
        block: i.bytes_per_expert.max(4096) as usize,
        depth,
        direct,
        engine: if uring {
            ReadEngine::Uring
        } else {
            ReadEngine::Threads
        },
        seconds,
        max_bytes: u64::MAX,
        seed: 7,
    };
    Ok(measure_reads(&model_shards(dir)?, &probe)?)
}

/// Measures this machine. `progress` hears what is being measured.
pub fn doctor(opts: &DoctorOptions, progress: &mut dyn FnMut(&str)) -> Result<DoctorReport, Error> {
    let shards = opts.model.as_deref().map(model_shards).transpose()?;
    if shards.is_none() && !opts.dir.is_dir() {
        return Err(Error::Usage(format!(
            "{}: not a directory",
            opts.dir.display()
        )));
    }
    // Every read size must fit the file read, checked before the scratch file is written.
    let largest = match &shards {
        Some(s) => s
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .max()
            .unwrap_or(0),
        None => opts.file_bytes,
    };
    if let Some(&b) = opts.blocks.iter().find(|&&b| b == 0 || b as u64 > largest) {
        return Err(Error::Usage(format!(
            "--blocks: a read of {b} bytes does not fit the {} file read (give 1 to {largest} bytes)",
            crate::tools::fmt_bytes(largest)
        )));
    }
    if let Some(&d) = opts.depths.iter().find(|&&d| !(1..=256).contains(&d)) {
        return Err(Error::Usage(format!("--depths: {d} is not 1 to 256")));
    }
    if !(opts.seconds.is_finite() && opts.seconds > 0.0 && opts.seconds <= 600.0) {
        return Err(Error::Usage(format!(
            "--seconds: {} is not a number of seconds in (0, 600]",
            opts.seconds
        )));
    }
    let cpu = cpu_report();
    progress("memory bandwidth");
    let one = memory_bandwidth(1, opts.memory_test_bytes);
    let all = memory_bandwidth(cpu.threads, opts.memory_test_bytes);
    let avail = crate::sysmem::available().map_err(Error::Usage)?;
    let memory = MemoryReport {
        total_bytes: meminfo("MemTotal:"),
        available_bytes: meminfo("MemAvailable:"),
        read_gbps_1_thread: one,
        read_gbps_all_threads: all,
        cgroup_limit_bytes: avail.cgroup.as_ref().map(|c| c.limit_bytes),
        cgroup_used_bytes: avail.cgroup.as_ref().map(|c| c.used_bytes),
        auto_budget_bytes: resolve_memory(Memory::Auto)?.unwrap_or(0),
    };
    let scratch;
    let (paths, target) = match (&opts.model, shards) {
        (Some(m), Some(s)) => (s, format!("shards of {}", m.display())),
        _ => {
            progress("writing the scratch file");
            scratch = ProbeFile::create(&opts.dir, opts.file_bytes)?;
            (
                vec![scratch.path().to_path_buf()],
                format!("scratch file in {}", opts.dir.display()),
            )
        }
    };
    let target_bytes = paths
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    let mut reads = Vec::new();
    let modes: &[bool] = if opts.buffered {
        &[true, false]
    } else {
        &[true]
    };
    let mut uring_error = None;
    for &direct in modes {
        for &block in &opts.blocks {
            for &depth in &opts.depths {
                // io_uring beside the threads for direct reads, the store's mode: whether a
                // deeper queue from one thread reads faster, or for less CPU, than a pool.
                let engines: &[ReadEngine] = if direct && opts.uring {
                    &[ReadEngine::Threads, ReadEngine::Uring]
                } else {
                    &[ReadEngine::Threads]
                };
                for &engine in engines {
                    if engine == ReadEngine::Uring && uring_error.is_some() {
                        continue;
                    }
                    progress(&format!(
                        "{} reads of {} at depth {depth} ({})",
                        if direct { "direct" } else { "buffered" },
                        crate::tools::fmt_bytes(block as u64),
                        engine.name()
                    ));
                    let probe = ReadProbe {
                        block,
                        depth,
                        direct,
                        engine,
                        seconds: opts.seconds,
                        max_bytes: u64::MAX,
                        seed: 1,
                    };
                    match measure_reads(&paths, &probe) {
                        Ok(f) => reads.push(ReadRow::from(&f)),
                        // A kernel without io_uring, or one that refuses it (a container's
                        // seccomp filter, io_uring_disabled): reported, not fatal.
                        Err(e) if engine == ReadEngine::Uring => uring_error = Some(e.to_string()),
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
    }
    let best = |mode: &str| {
        reads
            .iter()
            .filter(|r| r.mode == mode && r.engine == ReadEngine::Threads.name())
            .map(|r| r.gbps)
            .fold(0.0, f64::max)
    };
    let disk_gbps = if best("direct") > 0.0 {
        best("direct")
    } else {
        best("buffered")
    };
    let model_plan = match &opts.model {
        Some(m) => Some(crate::tools::inspect::inspect(m, Memory::Auto, 4096, 64)?),
        None => None,
    };
    Ok(DoctorReport {
        cpu,
        memory,
        read_target: target,
        read_target_bytes: target_bytes,
        reads,
        uring_error,
        disk_gbps,
        model_plan,
    })
}
