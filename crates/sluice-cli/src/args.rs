//! Command-line arguments.

use std::ffi::OsStr;
use std::path::PathBuf;

use clap::builder::{PossibleValue, TypedValueParser};
use clap::error::ErrorKind;
use clap::{Arg, Args, Command as ClapCommand, Parser, Subcommand, ValueEnum};
use sluice::PolicyChoice;

/// Run mixture-of-experts language models far larger than RAM on one CPU.
#[derive(Parser, Debug)]
#[command(
    name = "sluice",
    version,
    about = "Run mixture-of-experts language models far larger than RAM on one CPU: run, chat, batch, serve, inspect, pack, synth, doctor, bench.",
    long_about = None
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
#[allow(clippy::large_enum_variant)] // parsed once
pub enum Command {
    /// Generate text from a prompt, streaming it to stdout.
    Run(RunArgs),
    /// Chat interactively; the conversation and its KV cache carry over between turns.
    Chat(ChatArgs),
    /// Run a JSONL file of prompts with batched decoding; resumable.
    Batch(BatchArgs),
    /// Serve an OpenAI-compatible HTTP API.
    Serve(ServeArgs),
    /// Write a synthetic DeepSeek-V3-shaped checkpoint (for tests and benchmarks).
    Synth(SynthArgs),
    /// Show a model's sizes and how a memory budget would be spent on it.
    Inspect(InspectArgs),
    /// Pack a checkpoint's trunk into one file, layer by layer (experts stay in the shards).
    Pack(PackArgs),
    /// Measure this machine: CPU instruction sets, memory bandwidth, random-read bandwidth at
    /// expert-sized reads (O_DIRECT and buffered), and the budget `--memory auto` gives.
    Doctor(DoctorArgs),
    /// End-to-end benchmark over a ladder of memory budgets, policies and prefetch settings,
    /// each run in a fresh process.
    Bench(BenchArgs),
}

/// `sluice doctor`.
#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Directory for the scratch file the read tests use (removed afterwards).
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Read this model's shards instead of a scratch file (and plan `--memory auto` for it).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Size of the scratch file.
    #[arg(long, default_value = "2GiB")]
    pub file_size: String,
    /// Read sizes, comma-separated.
    #[arg(long, default_value = "1MiB,4MiB,16MiB")]
    pub blocks: String,
    /// Reads in flight, comma-separated.
    #[arg(long, default_value = "1,4,16")]
    pub depths: String,
    /// Seconds per read measurement.
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Skip the buffered-read measurements.
    #[arg(long)]
    pub no_buffered: bool,
    /// Skip the direct reads issued through io_uring (measured beside the reader threads).
    #[arg(long)]
    pub no_uring: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `sluice bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Model directory.
    #[arg(long)]
    pub model: PathBuf,
    /// Memory budgets: percentages of the checkpoint (`25%`), sizes (`512MiB`), `below-trunk`
    /// (half-way between the smallest workable budget and a resident trunk) or `unlimited`.
    #[arg(long, default_value = "below-trunk,5%,10%,25%,50%,100%")]
    pub ladder: String,
    /// Policies, comma-separated (default: every one that ships).
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = PolicyParser,
        default_values_t = PolicyChoice::ALL,
        hide_default_value = true
    )]
    pub policies: Vec<PolicyChoice>,
    /// Prefetch settings, comma-separated: on, all, off (as for `run`).
    #[arg(long, default_value = "on,off")]
    pub prefetch: String,
    /// I/O modes, comma-separated: direct, uring, buffered.
    #[arg(long, default_value = "direct")]
    pub io: String,
    /// Prompt tokens (pseudo-random ids).
    #[arg(long, default_value_t = 64)]
    pub prompt_tokens: usize,
    /// Tokens to generate.
    #[arg(long, default_value_t = 32)]
    pub max_tokens: usize,
    /// Prompt tokens per prefill chunk.
    #[arg(long, default_value_t = 64)]
    pub prefill_chunk: usize,
    /// Sampling temperature (0 = greedy; the output is the same on every rung either way).
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    /// Sampling seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Compute threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Products with quantized GGUF weights: exact or int8 (as for `run`).
    #[arg(long, default_value = "exact", value_parser = ["exact", "int8"])]
    pub numerics: String,
    /// Seconds of the disk-bandwidth measurement (random expert-sized reads of the shards).
    #[arg(long, default_value_t = 3.0)]
    pub disk_seconds: f64,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// `sluice pack`.
#[derive(Args, Debug)]
pub struct PackArgs {
    /// The Hugging Face checkpoint directory.
    pub src: PathBuf,
    /// The pack directory to write (outside the checkpoint directory).
    pub out: PathBuf,
    /// Replace an existing pack (only once the new one is complete).
    #[arg(long)]
    pub force: bool,
}

/// `sluice inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    /// Model directory.
    pub model: PathBuf,
    /// Memory budget to plan: a size (`8GiB`), `auto` or `unlimited`.
    #[arg(long, default_value = "unlimited", value_name = "SIZE|auto")]
    pub memory: String,
    /// Positions the KV cache is planned for.
    #[arg(long, default_value_t = 4096)]
    pub context: usize,
    /// Prompt tokens per prefill chunk.
    #[arg(long, default_value_t = 64)]
    pub prefill_chunk: usize,
    /// The prefix cache to plan: a size, or `off` (default: the default share).
    #[arg(long, value_name = "SIZE|off")]
    pub prefix_cache: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `sluice synth`.
#[derive(Args, Debug)]
pub struct SynthArgs {
    /// Output directory (must not exist, or be empty).
    pub out: PathBuf,
    /// Hidden size.
    #[arg(long, default_value_t = 1024)]
    pub hidden: usize,
    /// Layers (the first is dense).
    #[arg(long, default_value_t = 8)]
    pub layers: usize,
    /// Routed experts per MoE layer.
    #[arg(long, default_value_t = 64)]
    pub experts: usize,
    /// Experts per token.
    #[arg(long, default_value_t = 6)]
    pub top_k: usize,
    /// Expert intermediate size.
    #[arg(long, default_value_t = 512)]
    pub moe_inter: usize,
    /// Vocabulary size.
    #[arg(long, default_value_t = 8192)]
    pub vocab: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 8)]
    pub heads: usize,
    /// Router skew: 0 is flat, 1 strongly favours a few experts.
    #[arg(long, default_value_t = 0.5)]
    pub skew: f32,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Layers per shard file.
    #[arg(long, default_value_t = 1)]
    pub layers_per_shard: usize,
    /// How routed experts are stored: bf16, int4 (compressed-tensors pack-quantized, group 32)
    /// or mxfp4 (compressed-tensors mxfp4-pack-quantized).
    #[arg(long, default_value = "bf16")]
    pub experts_format: String,
    /// The architecture: deepseek_v3 (the first layer dense) or deepseek_v4 (compressed
    /// attention, hyper-connections, hash-routed first layers; BF16 experts).
    #[arg(long, default_value = "deepseek_v3")]
    pub arch: String,
}

/// Where the model is and how it runs (shared by `run` and `chat`).
#[derive(Args, Debug, Clone)]
pub struct EngineOpts {
    /// Model directory (a Hugging Face checkpoint or a pack); default: the bundled demo model.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Compute threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Memory budget for everything sluice allocates: bytes (`123`, `512MiB`, `8GiB`, `1.5G`),
    /// `auto` (available memory minus headroom) or `unlimited`.
    #[arg(long, default_value = "unlimited", value_name = "SIZE|auto")]
    pub memory: String,
    /// Expert-cache eviction policy.
    #[arg(long, value_parser = PolicyParser, default_value_t = PolicyChoice::default())]
    pub policy: PolicyChoice,
    /// Lookahead prefetch of the next layer's experts: on (read the predictions that have
    /// proved right often enough), all (read every prediction) or off.
    #[arg(long, default_value = "on")]
    pub prefetch: String,
    /// How shards are read: direct (O_DIRECT where the file system allows it, from reader
    /// threads), uring (O_DIRECT, expert reads queued on one io_uring) or buffered (pages
    /// dropped after each read).
    #[arg(long, default_value = "direct")]
    pub io: String,
    /// Instruction set: auto, scalar, avx2 or avx512.
    #[arg(long, default_value = "auto")]
    pub isa: String,
    /// Products with quantized GGUF weights: exact (decoded to f32, transformers' numerics)
    /// or int8 (8-bit activations and exact integer dot products, llama.cpp's numerics; for
    /// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS and MXFP4 weights so
    /// far).
    #[arg(long, default_value = "exact", value_parser = ["exact", "int8"])]
    pub numerics: String,
    /// Positions the KV cache is planned for.
    #[arg(long, default_value_t = 4096)]
    pub context: usize,
    /// Prompt rows each call inside a layer takes at most during a prefill (attention queries,
    /// product rows); the scratch memory is planned for it.
    #[arg(long, default_value_t = 64)]
    pub prefill_chunk: usize,
    /// Most prompt tokens one prefill pass runs each layer over (default: as many as the memory
    /// budget holds; each pass reads the experts its tokens route to once).
    #[arg(long, value_name = "TOKENS")]
    pub prefill_span: Option<usize>,
    /// For a pack directory: skip verifying the packed trunk's checksums (faster loading).
    #[arg(long)]
    pub no_verify: bool,
    /// Memory for the state of recent prompts, so that a prompt starting like one of them (a
    /// system prompt, a document asked several questions) computes only the rest: a size, or
    /// `off`. Planned inside --memory before the trunk; default: a sixteenth of the budget, as
    /// far as it exceeds the minimum (1 GiB with unlimited memory). Never changes the output.
    #[arg(long, value_name = "SIZE|off")]
    pub prefix_cache: Option<String>,
}

/// Drafters for speculative decoding.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraftKind {
    /// Prompt lookup: the tokens that followed the latest earlier match of the text's end.
    Ngram,
    /// The checkpoint's multi-token-prediction layer (Qwen3-Next, Qwen3.5), loaded beside
    /// the model.
    Mtp,
    /// No drafting.
    Off,
}

/// Speculative decoding: drafts checked in one forward pass with the token before them. It
/// changes the speed, never the output.
#[derive(Args, Debug, Clone)]
pub struct DraftArgs {
    /// Drafter: `ngram` (prompt lookup), `mtp` (the checkpoint's multi-token-prediction
    /// layer) or `off`.
    #[arg(long, value_enum, default_value = "off")]
    pub draft: DraftKind,
    /// Draft tokens per check (1-32); without it the length adapts to how drafts fare.
    #[arg(long, value_name = "N")]
    pub draft_tokens: Option<usize>,
}

/// Sampling; unset options take the model's `generation_config.json` defaults (greedy when it
/// has none).
#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Sampling temperature (0 = greedy).
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Keep only the k most likely tokens (0 = off).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Nucleus sampling mass (1 = off).
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Drop tokens below this fraction of the best one's probability (0 = off).
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Repetition penalty (1 = off).
    #[arg(long)]
    pub repetition_penalty: Option<f32>,
    /// OpenAI's presence penalty: subtracted once from every token already generated (0 = off).
    #[arg(long, allow_negative_numbers = true)]
    pub presence_penalty: Option<f32>,
    /// OpenAI's frequency penalty: subtracted once per time a token was generated (0 = off).
    #[arg(long, allow_negative_numbers = true)]
    pub frequency_penalty: Option<f32>,
    /// Random seed for sampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// `sluice run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The prompt text.
    pub prompt: Option<String>,
    #[command(flatten)]
    /// Engine options.
    pub engine: EngineOpts,
    #[command(flatten)]
    /// Sampling options.
    pub sampling: SamplingArgs,
    #[command(flatten)]
    /// Speculative decoding.
    pub draft: DraftArgs,
    /// The prompt as comma-separated token ids instead of text.
    #[arg(long, value_name = "IDS")]
    pub prompt_ids: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Stop when this string is generated (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens (for benchmarks).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Use the prompt as is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// Print one JSON object with ids, text and stats instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Run the same generation once first, unmeasured, in another session (warms the expert
    /// cache as far as the budget allows, like other engines' warm-up runs).
    #[arg(long)]
    pub warmup: bool,
    /// Write every row of logits (prompt positions, then each step) to a float32 .npy file.
    #[arg(long, value_name = "FILE.npy")]
    pub dump_logits: Option<PathBuf>,
    /// Write every expert request (step layer expert) to this file.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// With --json: each generated token's log-probability under the model and its N most
    /// likely alternatives (0-20), as `logprobs` in the object.
    #[arg(long, value_name = "N", requires = "json")]
    pub logprobs: Option<usize>,
    /// Resume from the session in FILE when it exists (the prompt is then the whole context:
    /// what the saved tokens start is not computed again) and save the session there after
    /// generating.
    #[arg(long, value_name = "FILE")]
    pub session: Option<PathBuf>,
    /// Constrain the output to JSON valid against the JSON schema in FILE.
    #[arg(long, value_name = "FILE", conflicts_with = "grammar")]
    pub json_schema: Option<PathBuf>,
    /// Constrain the output to the grammar in FILE (llguidance's Lark syntax; `%json {…}`
    /// embeds a JSON schema).
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
}

/// `sluice batch`.
#[derive(Args, Debug)]
pub struct BatchArgs {
    #[command(flatten)]
    /// Engine options.
    pub engine: EngineOpts,
    #[command(flatten)]
    /// Speculative decoding, for every sequence.
    pub draft: DraftArgs,
    /// Input: one JSON object per line with `id`, `prompt` (or `messages`), and optionally
    /// `max_tokens`, `temperature`, `top_p`, `top_k`, `min_p`, `repetition_penalty`,
    /// `presence_penalty`, `frequency_penalty`, `seed`, `stop`, `response_format`.
    #[arg(long)]
    pub input: PathBuf,
    /// Output: one JSON object per line, in input order; existing finished ids are skipped.
    #[arg(long)]
    pub output: PathBuf,
    /// Sequences decoded together.
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    /// Default most tokens per sequence.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
}

/// `sluice serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    /// Engine options.
    pub engine: EngineOpts,
    #[command(flatten)]
    /// Speculative decoding, for every sequence.
    pub draft: DraftArgs,
    /// Port (0 picks a free one).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Requests decoded together.
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    /// The largest `max_tokens` a request may ask for.
    #[arg(long, default_value_t = 4096)]
    pub max_tokens_limit: usize,
    /// The largest request body in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body: usize,
    /// Seconds a client has to send a request's headers, and then its body; a connection that
    /// sends half a request is closed after it.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub read_timeout: u64,
    /// Every endpoint but /health and / asks for this key (`Authorization: Bearer KEY` or
    /// `x-api-key: KEY`). The environment variable keeps it out of the process list.
    #[arg(
        long,
        value_name = "KEY",
        env = "SLUICE_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
}

/// `sluice chat`.
#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    /// Engine options.
    pub engine: EngineOpts,
    #[command(flatten)]
    /// Sampling options.
    pub sampling: SamplingArgs,
    #[command(flatten)]
    /// Speculative decoding.
    pub draft: DraftArgs,
    /// A system message.
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens per reply.
    #[arg(long, default_value_t = 512)]
    pub max_tokens: usize,
    /// Resume the conversation saved in FILE when it exists, and save it there after every
    /// reply.
    #[arg(long, value_name = "FILE")]
    pub session: Option<PathBuf>,
}

/// Parses a shipped policy by name (`PolicyChoice`'s `FromStr`), and lists them all in the
/// help. A bad name is a one-line error naming the flag and the known policies.
#[derive(Clone, Debug)]
pub struct PolicyParser;

impl TypedValueParser for PolicyParser {
    type Value = PolicyChoice;

    fn parse_ref(
        &self,
        cmd: &ClapCommand,
        arg: Option<&Arg>,
        value: &OsStr,
    ) -> Result<PolicyChoice, clap::Error> {
        let flag = arg
            .and_then(Arg::get_long)
            .map_or_else(|| "policy".to_owned(), |l| format!("--{l}"));
        let text = value.to_string_lossy();
        text.trim().parse().map_err(|e| {
            cmd.clone()
                .error(ErrorKind::InvalidValue, format!("{flag}: {e}"))
        })
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(
            PolicyChoice::all().map(|p| PossibleValue::new(p.name())),
        ))
    }
}
