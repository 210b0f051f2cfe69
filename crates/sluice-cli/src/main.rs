//! The `sluice` command line. It parses arguments and calls the `sluice` library; nothing else.

#![forbid(unsafe_code)]

/// `println!` for a command's output on stdout: a reader that has gone away (`sluice inspect |
/// head -1`) ends the process quietly with exit 0, as a closed pipe ends `cat` or `rg`, instead of
/// a panic; any other write error is one line and exit 1.
macro_rules! outln {
    () => {
        $crate::write_stdout(format_args!(""))
    };
    ($($t:tt)*) => {
        $crate::write_stdout(format_args!($($t)*))
    };
}

mod args;
mod batchcmd;
mod bench;
mod doctor;
mod live;
mod npy;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use sluice::{Engine, Error, GenerateOptions, Isa, Memory, Prompt, SamplingOptions};

use args::{Cli, Command, RunArgs};

/// A failure and its exit code: 2 for the user's input, 1 for failures while running.
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) msg: String,
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure {
            code: if e.is_input_error() { 2 } else { 1 },
            msg: e.to_string(),
        }
    }
}

/// Writes one line to stdout (see [`outln!`]).
pub(crate) fn write_stdout(args: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.write_all(b"\n")) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: stdout: {e}");
        std::process::exit(1);
    }
}

pub(crate) fn usage(msg: impl Into<String>) -> Failure {
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
        Command::Chat(a) => chat(a),
        Command::Batch(a) => batchcmd::open(&a).and_then(|files| {
            engine(&a.engine, false, a.batch_size, &a.draft)
                .and_then(|e| batchcmd::run(a, files, e))
        }),
        Command::Serve(a) => serve(a),
        Command::Synth(a) => synth(a),
        Command::Inspect(a) => inspect(a),
        Command::Pack(a) => pack(a),
        Command::Doctor(a) => doctor::doctor(a),
        Command::Bench(a) => bench::bench(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("error: {}", f.msg);
            ExitCode::from(f.code)
        }
    }
}

fn pack(a: args::PackArgs) -> Result<(), Failure> {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_message("packing trunk");
    let r = sluice::tools::pack::pack(&a.src, &a.out, a.force, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    });
    bar.finish_and_clear();
    let r = r?;
    eprintln!(
        "packed {} of trunk in {} runs to {} in {:.1}s ({:.2} GB/s); experts stay in {}",
        sluice::tools::fmt_bytes(r.trunk_bytes),
        r.parts,
        r.out.display(),
        r.seconds,
        r.trunk_bytes as f64 / r.seconds.max(1e-9) / 1e9,
        a.src.display()
    );
    Ok(())
}

fn inspect(a: args::InspectArgs) -> Result<(), Failure> {
    let i = sluice::tools::inspect::inspect_with(
        &a.model,
        memory(&a.memory)?,
        a.context,
        a.prefill_chunk,
        a.prefix_cache.as_deref().map(prefix_cache).transpose()?,
    )?;
    if a.json {
        outln!("{}", serde_json::to_string(&i).unwrap_or_default());
        return Ok(());
    }
    let b = sluice::tools::fmt_bytes;
    let p = &i.plan;
    outln!(
        "{} ({}, {} shards, {} I/O)",
        i.dir,
        i.model_type,
        i.shards,
        i.io_mode
    );
    if i.moe_layers == 0 {
        outln!(
            "  {} layers, dense (no experts), hidden {}, vocab {}, {} attention",
            i.layers,
            i.hidden,
            i.vocab,
            i.attention
        );
    } else {
        let zero = match i.zero_experts {
            0 => String::new(),
            n => format!(" (+{n} zero-compute, nothing to read)"),
        };
        outln!(
            "  {} layers ({} with experts), hidden {}, vocab {}, {} experts{zero} top-{}, {} attention",
            i.layers,
            i.moe_layers,
            i.hidden,
            i.vocab,
            i.experts,
            i.top_k,
            i.attention
        );
    }
    outln!("  checkpoint        {}", b(i.checkpoint_bytes));
    if i.int8_bytes + i.block_bytes_exact > 0 {
        outln!(
            "  --numerics int8   integer products for {} of the {} of GGUF block weights",
            b(i.int8_bytes),
            b(i.int8_bytes + i.block_bytes_exact)
        );
    }
    if i.mtp_layers > 0 {
        outln!(
            "  MTP layers        {} ({}; {})",
            i.mtp_layers,
            b(i.mtp_bytes),
            if i.mtp_drafts {
                "checked; --draft mtp runs the first, pinned, its experts cached"
            } else {
                "checked, not run: neither read nor planned"
            }
        );
    }
    outln!("  trunk             {}", b(i.trunk_bytes));
    if i.moe_layers > 0 {
        outln!(
            "  routed experts    {} ({} each; {} per token at top-{} when nothing is cached)",
            b(i.expert_bytes),
            b(i.bytes_per_expert),
            b(i.expert_bytes_per_token),
            i.top_k
        );
    }
    if i.recurrent_layers > 0 {
        outln!(
            "  layer plan        {} softmax-attention layers (KV cache), {} {} layers (recurrent state)",
            i.full_attention_layers,
            i.recurrent_layers,
            i.attention.rsplit('+').next().unwrap_or("").to_uppercase()
        );
    }
    if let Some(bs) = i.attn_res_block_size {
        outln!("  attention residuals over blocks of {bs} layers");
    }
    if let Some(n) = i.hyper_streams {
        outln!(
            "  hyper-connections {n} residual streams per token (in each prefill span's activations)"
        );
    }
    if let Some(c) = &i.compressed_attention {
        outln!(
            "  compressed attn   a window of {} positions; {} layers window only, {} also every \
             entry of {} positions, {} an indexer's best {} entries of {} (the window's keys and \
             the open windows' projections are a fixed state; the entries grow with the context)",
            c.window,
            c.sliding_layers,
            c.heavy_layers,
            c.heavy_rate,
            c.sparse_layers,
            c.sparse_top_k,
            c.sparse_rate
        );
    }
    if i.hash_routed_layers > 0 {
        outln!(
            "  hash routing      {} layers take their experts from the token (prefetched exactly)",
            i.hash_routed_layers
        );
    }
    outln!(
        "  KV cache          {} per position{}",
        b(i.kv_bytes_per_position),
        match i.shared_kv_layers {
            0 => String::new(),
            n => format!(" ({n} layers attend to an earlier layer's cache and keep none)"),
        }
    );
    if i.recurrent_bytes > 0 {
        outln!(
            "  recurrent state   {} per sequence (fixed; with its one-step snapshot)",
            b(i.recurrent_bytes)
        );
    }
    outln!(
        "plan for {}:",
        if p.budget == 0 {
            "an unlimited budget".to_owned()
        } else {
            format!("a budget of {}", b(p.budget))
        }
    );
    // The exact bytes too: the rounded figure can be just below what a budget must hold.
    outln!(
        "  minimum budget    {} (--memory {} or more)",
        b(p.minimum),
        p.minimum
    );
    outln!(
        "  trunk pinned      {} ({} of {} layers, embeddings {})",
        b(p.trunk_pinned),
        p.layers_pinned,
        i.layers,
        if p.embed_pinned {
            "pinned"
        } else {
            "read per token"
        }
    );
    if p.ring_slots > 0 {
        outln!(
            "  layer ring        {} slot(s) of {}",
            p.ring_slots,
            b(p.ring_slot_bytes)
        );
    }
    if p.recurrent > 0 {
        outln!("  recurrent state   {}", b(p.recurrent));
    }
    outln!(
        "  scratch           {} (calls of {} rows)",
        b(p.scratch),
        p.chunk
    );
    outln!(
        "  prefill span      {} tokens per pass ({} per token, lent by the expert cache)",
        p.prefill_span,
        b(p.span_bytes_per_token)
    );
    if p.tokenizer > 0 {
        outln!("  tokenizer         {}", b(p.tokenizer));
    }
    let share = |x: u64| 100.0 * x as f64 / i.expert_bytes.max(1) as f64;
    outln!(
        "  at the start      expert cache {} ({} experts, {:.1}% of all), KV cache 0",
        b(p.expert_cache),
        p.expert_cache_experts,
        share(p.expert_cache)
    );
    if p.context_fit < p.context {
        outln!(
            "  at full context   the KV cache fits {} of {} positions ({} per position) beside the expert cache's floor of {}",
            p.context_fit,
            p.context,
            b(i.kv_bytes_per_position),
            b(p.expert_floor)
        );
    } else {
        outln!(
            "  at full context   expert cache {} ({} experts, {:.1}% of all), KV cache {} for {} positions",
            b(p.expert_cache_full_context),
            p.expert_cache_full_context_experts,
            share(p.expert_cache_full_context),
            b(p.kv_cache),
            p.context
        );
    }
    if p.prefix_cache > 0 {
        outln!(
            "  prefix cache      up to {} of recent prompts' state (--prefix-cache; the expert cache uses what it does not)",
            b(p.prefix_cache)
        );
    }
    Ok(())
}

fn synth(a: args::SynthArgs) -> Result<(), Failure> {
    if a.out.exists() && std::fs::read_dir(&a.out).map_or(true, |mut d| d.next().is_some()) {
        return Err(usage(format!(
            "{}: exists and is not empty; nothing was written",
            a.out.display()
        )));
    }
    if a.layers < 2
        || a.experts == 0
        || a.top_k == 0
        || a.top_k > a.experts
        || a.heads == 0
        || !a.hidden.is_multiple_of(a.heads)
    {
        return Err(usage(
            "synth: need --layers ≥ 2, 0 < --top-k ≤ --experts, and --hidden divisible by --heads",
        ));
    }
    let experts_format = sluice::tools::synth::ExpertFormat::from_name(&a.experts_format)
        .ok_or_else(|| {
            usage(format!(
                "--experts-format `{}`: expected bf16, int4 or mxfp4",
                a.experts_format
            ))
        })?;
    if experts_format != sluice::tools::synth::ExpertFormat::Bf16
        && !(a.hidden.is_multiple_of(32) && a.moe_inter.is_multiple_of(32))
    {
        return Err(usage(
            "synth: packed experts need --hidden and --moe-inter divisible by 32",
        ));
    }
    let arch = sluice::tools::synth::SynthArch::from_name(&a.arch).ok_or_else(|| {
        usage(format!(
            "--arch `{}`: expected deepseek_v3 or deepseek_v4",
            a.arch
        ))
    })?;
    let v4 = arch == sluice::tools::synth::SynthArch::DeepseekV4;
    if v4 && experts_format != sluice::tools::synth::ExpertFormat::Bf16 {
        return Err(usage(
            "synth: --arch deepseek_v4 writes BF16 experts only (--experts-format bf16)",
        ));
    }
    let head = a.hidden / a.heads;
    // DeepSeek-V4 rotates a quarter of each head (an exact `partial_rotary_factor`).
    let (nope, rope) = if v4 {
        let r = (head / 4).max(8) & !1;
        (3 * r, r)
    } else {
        (head, (head / 2).max(2) & !1)
    };
    let spec = sluice::tools::synth::SynthSpec {
        vocab: a.vocab,
        hidden: a.hidden,
        layers: a.layers,
        first_dense: 1,
        dense_inter: a.moe_inter * 2,
        experts: a.experts,
        top_k: a.top_k,
        moe_inter: a.moe_inter,
        shared: 1,
        heads: a.heads,
        q_lora: a.hidden / 2,
        kv_lora: a.hidden / 4,
        nope,
        rope,
        v_head: head,
        layers_per_shard: a.layers_per_shard,
        skew: a.skew,
        seed: a.seed,
        experts_format,
        arch,
    };
    let t0 = std::time::Instant::now();
    spec.write(&a.out).map_err(|e| Failure {
        code: 1,
        msg: format!("{}: {e}", a.out.display()),
    })?;
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "wrote {} in {:.1}s ({:.2} GB/s) to {}",
        sluice::tools::fmt_bytes(spec.bytes()),
        secs,
        spec.bytes() as f64 / secs / 1e9,
        a.out.display()
    );
    Ok(())
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

/// Parses a size: `123`, `512MiB`, `8GiB`, `1.5G`, `64K` (binary multiples).
pub(crate) fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().ok()?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    let bytes = v * mult as f64;
    (v.is_finite() && v >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

fn memory(s: &str) -> Result<Memory, Failure> {
    match s {
        "auto" => Ok(Memory::Auto),
        "unlimited" | "none" => Ok(Memory::Unlimited),
        _ => parse_size(s).map(Memory::Bytes).ok_or_else(|| {
            usage(format!(
                "--memory `{s}`: expected a size like 512MiB, 8GiB, 1.5G, or auto"
            ))
        }),
    }
}

/// A `--prefix-cache` value in bytes.
fn prefix_cache(s: &str) -> Result<u64, Failure> {
    match s {
        "off" | "none" | "0" => Ok(0),
        s => parse_size(s).ok_or_else(|| {
            usage(format!(
                "--prefix-cache `{s}`: expected a size like 256MiB, 2GiB, or off"
            ))
        }),
    }
}

/// The engine `a` asks for, planned for `sequences` sequences, recording expert requests
/// with `trace`, with the MTP layer loaded for `--draft mtp`.
fn engine(
    a: &args::EngineOpts,
    trace: bool,
    sequences: usize,
    draft: &args::DraftArgs,
) -> Result<Engine, Failure> {
    let dir = model_dir(a.model.clone())?;
    if sequences == 0 {
        return Err(usage("--batch-size must be at least 1"));
    }
    let (prefetch, precision) = match a.prefetch.as_str() {
        "on" | "true" | "yes" => (true, sluice::PREFETCH_PRECISION),
        "all" => (true, 0.0),
        "off" | "false" | "no" => (false, sluice::PREFETCH_PRECISION),
        other => {
            return Err(usage(format!(
                "--prefetch `{other}`: expected on, all or off"
            )));
        }
    };
    let mut b = Engine::builder()
        .model(&dir)
        .memory(memory(&a.memory)?)
        .policy(a.policy.clone())
        .prefetch(prefetch)
        .prefetch_precision(precision)
        .direct_io(match a.io.as_str() {
            "direct" | "uring" => true,
            "buffered" => false,
            other => {
                return Err(usage(format!(
                    "--io `{other}`: expected direct, uring or buffered"
                )));
            }
        })
        .io_uring(a.io == "uring")
        .context(a.context)
        .prefill_chunk(a.prefill_chunk)
        .sequences(sequences)
        .trace(trace)
        .mtp(draft.draft == args::DraftKind::Mtp)
        .verify_pack(!a.no_verify);
    if a.no_verify && dir.join("sluice-trunk.json").exists() {
        eprintln!("note: --no-verify: the packed trunk's checksums are not checked");
    }
    if let Some(t) = a.threads {
        b = b.threads(t);
    }
    if let Some(p) = &a.prefix_cache {
        b = b.prefix_cache(prefix_cache(p)?);
    }
    if a.isa != "auto" {
        let i = Isa::from_name(&a.isa).ok_or_else(|| {
            usage(format!(
                "--isa `{}`: expected auto, scalar, avx2 or avx512",
                a.isa
            ))
        })?;
        b = b.isa(i);
    }
    if let Some(n) = sluice::Numerics::from_name(&a.numerics) {
        b = b.numerics(n);
    }
    let engine = b.build()?;
    if let Some(e) = &engine.model().layout().mtp_error {
        // Loaded only to draft with: the model runs without it.
        eprintln!(
            "warning: {}: the multi-token-prediction layer is damaged and not loaded ({e}); --draft mtp is unavailable",
            engine.dir().display()
        );
    }
    Ok(engine)
}

/// The model's sampling defaults with the flags given on top.
fn sampling(engine: &Engine, a: &args::SamplingArgs) -> SamplingOptions {
    let mut s = engine.default_sampling().clone();
    if let Some(t) = a.temperature {
        s.temperature = t;
    }
    if let Some(k) = a.top_k {
        s.top_k = k;
    }
    if let Some(p) = a.top_p {
        s.top_p = p;
    }
    if let Some(m) = a.min_p {
        s.min_p = m;
    }
    if let Some(r) = a.repetition_penalty {
        s.repetition_penalty = r;
    }
    if let Some(p) = a.presence_penalty {
        s.presence_penalty = p;
    }
    if let Some(f) = a.frequency_penalty {
        s.frequency_penalty = f;
    }
    s.seed = a.seed;
    s
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

/// Checks, before any work, that the file `path` given to `flag` can be written: an existing
/// one must be a regular file that opens for writing (it is not truncated here); a new one
/// must be creatable in its directory (probed with a temporary file, removed again).
pub(crate) fn check_writable(flag: &str, path: &std::path::Path) -> Result<(), Failure> {
    let refuse = |why: String| usage(format!("{flag} {}: {why}", path.display()));
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => Err(refuse("not a regular file".into())),
        Ok(_) => std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map(drop)
            .map_err(|e| refuse(format!("cannot write: {e}"))),
        Err(_) => {
            let dir = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => std::path::Path::new("."),
            };
            tempfile::Builder::new()
                .prefix(".sluice-probe-")
                .tempfile_in(dir)
                .map(drop)
                .map_err(|e| refuse(format!("cannot write in {}: {e}", dir.display())))
        }
    }
}

/// The drafter `--draft` / `--draft-tokens` ask for.
pub(crate) fn draft(a: &crate::args::DraftArgs) -> Result<sluice::Draft, Failure> {
    use crate::args::DraftKind;
    match a.draft {
        DraftKind::Off if a.draft_tokens.is_some() => {
            Err(usage("--draft-tokens needs --draft ngram or mtp"))
        }
        DraftKind::Off => Ok(sluice::Draft::Off),
        kind => match a.draft_tokens {
            Some(n) if !(1..=sluice::MAX_DRAFT).contains(&n) => Err(usage(format!(
                "--draft-tokens {n}: give 1 to {}",
                sluice::MAX_DRAFT
            ))),
            tokens if kind == DraftKind::Mtp => Ok(sluice::Draft::Mtp { tokens }),
            tokens => Ok(sluice::Draft::Ngram { tokens }),
        },
    }
}

/// The largest `--json-schema` or `--grammar` file read (16 MiB).
const MAX_GRAMMAR_FILE: u64 = 16 << 20;

/// The grammar `--json-schema FILE` or `--grammar FILE` gives, read and (for a schema) parsed.
fn grammar_file(a: &RunArgs) -> Result<Option<sluice::Grammar>, Failure> {
    let read = |flag: &str, p: &std::path::Path| {
        let bytes =
            read_small_file(p).map_err(|e| usage(format!("{flag} {}: {e}", p.display())))?;
        String::from_utf8(bytes)
            .map_err(|_| usage(format!("{flag} {}: not UTF-8 text", p.display())))
    };
    if let Some(p) = &a.json_schema {
        let text = read("--json-schema", p)?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| usage(format!("--json-schema {}: not JSON: {e}", p.display())))?;
        if !v.is_object() {
            return Err(usage(format!(
                "--json-schema {}: a JSON schema must be an object",
                p.display()
            )));
        }
        return Ok(Some(sluice::Grammar::JsonSchema(v)));
    }
    if let Some(p) = &a.grammar {
        return Ok(Some(sluice::Grammar::Lark(read("--grammar", p)?)));
    }
    Ok(None)
}

/// A regular file of at most [`MAX_GRAMMAR_FILE`] bytes.
fn read_small_file(p: &std::path::Path) -> Result<Vec<u8>, String> {
    let m = std::fs::metadata(p).map_err(|e| e.to_string())?;
    if !m.is_file() {
        return Err("not a regular file".into());
    }
    if m.len() > MAX_GRAMMAR_FILE {
        return Err(format!(
            "{} bytes is over the {MAX_GRAMMAR_FILE} accepted",
            m.len()
        ));
    }
    std::fs::read(p).map_err(|e| e.to_string())
}

fn run(a: RunArgs) -> Result<(), Failure> {
    // Output files are checked before the model loads, not found unwritable after generating.
    if let Some(p) = &a.dump_logits {
        check_writable("--dump-logits", p)?;
    }
    if let Some(p) = &a.trace {
        check_writable("--trace", p)?;
    }
    if let Some(p) = &a.session {
        check_writable("--session", p)?;
    }
    // A grammar file is read and parsed before the model loads, and compiled once it has.
    let grammar = grammar_file(&a)?;
    let draft = draft(&a.draft)?;
    let engine = engine(&a.engine, a.trace.is_some(), 1, &a.draft)?;
    let grammar = grammar.map(|g| {
        engine.compile_grammar(&g).map_err(|e| {
            let flag = if a.grammar.is_some() {
                "--grammar"
            } else {
                "--json-schema"
            };
            let path = a
                .grammar
                .as_ref()
                .or(a.json_schema.as_ref())
                .map(|p| p.display().to_string());
            usage(format!("{flag} {}: {e}", path.unwrap_or_default()))
        })
    });
    let grammar = grammar.transpose()?;
    let opts = GenerateOptions {
        max_tokens: a.max_tokens,
        sampling: sampling(&engine, &a.sampling),
        stop: a.stop.clone(),
        stop_at_eos: !a.ignore_eos,
        keep_logits: a.dump_logits.is_some(),
        prefill_chunk: a.engine.prefill_chunk,
        prefill_span: a.engine.prefill_span,
        on_prefill: if a.json { None } else { live::prefill_hook() },
        logprobs: a.logprobs,
        grammar,
        draft,
        cache_prefix: None,
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
    let echo = match &prompt {
        // A raw text prompt is echoed so the continuation reads on from it.
        Prompt::Text(p) => Some(p.to_string()),
        _ => None,
    };
    if a.warmup {
        let mut s = engine.session()?;
        let warm = GenerateOptions {
            keep_logits: false,
            ..opts.clone()
        };
        s.generate(prompt.clone(), &warm)?.run()?;
        let _ = engine.take_trace();
    }
    let mut session = engine.session()?;
    if let Some(p) = &a.session
        && p.exists()
    {
        session.load(p)?;
    }
    let mut generation = if a.session.is_some() {
        // The prompt is the whole context; a resumed session computes only what is new.
        session.generate_full(prompt, &opts)?
    } else {
        session.generate(prompt, &opts)?
    };
    let mut live = (!a.json).then(|| live::Live::new(&engine));
    if let (Some(l), Some(p)) = (live.as_mut(), echo) {
        l.text(&p);
    }
    // With --logprobs: per token, its id, text, log-probability and alternatives.
    let mut logprobs = Vec::new();
    let text_of = |id: u32| {
        engine
            .tokenizer()
            .and_then(|t| t.decode(&[id]).ok())
            .unwrap_or_default()
    };
    while let Some(t) = generation.next() {
        let t = t?;
        if let Some(l) = live.as_mut() {
            l.text(&t.text);
            l.tick(&generation.stats());
        }
        if let (Some(id), Some(lp)) = (t.id, &t.logprobs) {
            let top: Vec<_> = lp
                .top
                .iter()
                .map(|&(i, p)| serde_json::json!({"id": i, "token": text_of(i), "logprob": p}))
                .collect();
            logprobs.push(serde_json::json!({"id": id, "token": text_of(id), "logprob": lp.logprob, "top": top}));
        }
    }
    let stats = generation.stats();
    if let Some(path) = &a.dump_logits {
        let logits = generation.logits();
        let vocab = engine.model().config().vocab;
        npy::write_f32(path, &logits, logits.len() / vocab, vocab).map_err(|e| Failure {
            code: 1,
            msg: format!("{}: write: {e}", path.display()),
        })?;
    }
    if let Some(path) = &a.trace {
        sluice::tools::trace::write_trace(path, &engine.take_trace()).map_err(|e| Failure {
            code: 1,
            msg: e.to_string(),
        })?;
    }
    match live {
        Some(l) => l.finish(&stats),
        None => {
            let mut v = serde_json::json!({
                "prompt_ids": generation.prompt_ids(),
                "ids": generation.ids(),
                "text": generation.text(),
                "finish_reason": generation.finish_reason(),
                "stats": stats,
            });
            if a.logprobs.is_some() {
                v["logprobs"] = serde_json::Value::Array(logprobs);
            }
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{v}");
        }
    }
    drop(generation);
    if let Some(p) = &a.session {
        session.save(p, &[])?;
    }
    Ok(())
}

fn serve(a: args::ServeArgs) -> Result<(), Failure> {
    let draft = draft(&a.draft)?;
    let engine = engine(&a.engine, false, a.batch_size, &a.draft)?;
    let ip: std::net::IpAddr = a
        .host
        .parse()
        .map_err(|_| usage(format!("--host `{}`: not an IP address", a.host)))?;
    let name = engine
        .dir()
        .file_name()
        .map_or_else(|| "model".to_owned(), |n| n.to_string_lossy().into_owned());
    let max_tokens_limit = a.max_tokens_limit.min(engine.model().max_positions());
    let api_key = match a.api_key {
        Some(k) if k.trim().is_empty() => {
            return Err(usage("--api-key (or SLUICE_API_KEY) is empty"));
        }
        Some(k) if k.trim() != k || k.chars().any(char::is_control) => {
            return Err(usage(
                "--api-key (or SLUICE_API_KEY): a key with control characters or spaces at its ends cannot be sent in a header",
            ));
        }
        k => k,
    };
    if api_key.is_none() && !ip.is_loopback() {
        eprintln!(
            "warning: --host {ip} serves beyond this machine with no --api-key: anyone who can \
             reach the port can use the model"
        );
    }
    let opts = sluice::server::ServerOptions {
        addr: std::net::SocketAddr::new(ip, a.port),
        batch_size: a.batch_size,
        max_tokens_limit,
        default_max_tokens: 256.min(max_tokens_limit),
        max_body_bytes: a.max_body,
        model_name: name,
        read_timeout: std::time::Duration::from_secs(a.read_timeout),
        draft,
        api_key,
    };
    Ok(sluice::server::serve(engine, opts)?)
}

/// What `chat --session` keeps beside the session's tokens and state.
#[derive(serde::Serialize, serde::Deserialize, Default)]
struct ChatSaved {
    messages: Vec<sluice::Message>,
    transcript: String,
}

fn chat(a: args::ChatArgs) -> Result<(), Failure> {
    use std::io::BufRead;
    let draft = draft(&a.draft)?;
    if let Some(p) = &a.session {
        check_writable("--session", p)?;
    }
    let engine = engine(&a.engine, false, 1, &a.draft)?;
    if engine.tokenizer().is_none() {
        return Err(usage(format!(
            "{} has no tokenizer; chat needs text",
            engine.dir().display()
        )));
    }
    let opts = GenerateOptions {
        max_tokens: a.max_tokens,
        sampling: sampling(&engine, &a.sampling),
        prefill_chunk: a.engine.prefill_chunk,
        prefill_span: a.engine.prefill_span,
        on_prefill: live::prefill_hook(),
        draft,
        ..Default::default()
    };
    let templated = engine.chat_template().is_some();
    let mut messages: Vec<sluice::Message> = a
        .system
        .iter()
        .map(|s| sluice::Message::new("system", s.clone()))
        .collect();
    let mut session = engine.session()?;
    let mut transcript = String::new();
    if let Some(p) = &a.session
        && p.exists()
    {
        let extra = session.load(p)?;
        let saved: ChatSaved = serde_json::from_slice(&extra).map_err(|_| {
            usage(format!(
                "{}: a session file, but not one `sluice chat` wrote",
                p.display()
            ))
        })?;
        if a.system.is_some() && !saved.messages.is_empty() {
            return Err(usage(
                "--system: the resumed conversation has its own; give no --system with --session of an existing chat",
            ));
        }
        eprintln!("{}: resumed {} messages", p.display(), saved.messages.len());
        if !saved.messages.is_empty() {
            messages = saved.messages;
        }
        transcript = saved.transcript;
    }
    eprintln!(
        "{}: type a message and press Enter; an empty line or end of input quits.{}",
        engine.dir().display(),
        if templated {
            ""
        } else {
            " (no chat template: the conversation continues as plain text)"
        }
    );
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        let Some(line) = lines.next() else { break };
        let line = line.map_err(|e| Failure {
            code: 1,
            msg: format!("stdin: {e}"),
        })?;
        if line.trim().is_empty() {
            break;
        }
        let mut live = live::Live::new(&engine);
        let text = {
            let mut g = if templated {
                messages.push(sluice::Message::new("user", line));
                session.generate_full(Prompt::Chat(&messages), &opts)?
            } else {
                transcript.push_str(&line);
                transcript.push('\n');
                session.generate_full(Prompt::Text(&transcript), &opts)?
            };
            while let Some(t) = g.next() {
                let t = t?;
                live.text(&t.text);
                live.tick(&g.stats());
            }
            live.finish(&g.stats());
            g.text().to_owned()
        };
        if templated {
            messages.push(sluice::Message::new("assistant", text));
        } else {
            transcript.push_str(&text);
            transcript.push('\n');
        }
        if let Some(p) = &a.session {
            let saved = ChatSaved {
                messages: messages.clone(),
                transcript: transcript.clone(),
            };
            let extra = serde_json::to_vec(&saved).map_err(|e| Failure {
                code: 1,
                msg: format!("{}: {e}", p.display()),
            })?;
            session.save(p, &extra)?;
        }
    }
    Ok(())
}
