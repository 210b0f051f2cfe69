//! Quantized checkpoints as released — FP8 E4M3 with block scales, compressed-tensors INT4 and
//! MXFP4, GPT-OSS MXFP4 blocks — on the fixtures under `testdata/quant/` (made by
//! `tools/reference/make_quant_fixtures.py`; their logits and greedy ids against transformers
//! are checked with every other `REF` fixture, in `tests/reference.rs`); packed
//! experts read and cached at their size on disk; malformed quantization metadata refused at load
//! with the tensor named; and memory as a dial on a quantized model.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proptest::prelude::*;
mod common;
use common::argmax;
use sluice_format::{Checkpoint, Dtype};
use sluice_model::{Logits, Model, ModelError, ModelOptions, PolicyChoice};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/quant")
        .join(name)
}

fn open(name: &str, threads: usize) -> Model {
    common::open_fixture(&fixture(name), threads)
}

// ---- bytes per expert ----------------------------------------------------------------------

/// An expert's size on disk, computed from the config and the format alone.
fn packed_expert_bytes(name: &str, hidden: usize, inter: usize) -> u64 {
    let (h, i) = (hidden, inter);
    let b = match name {
        // gate, up [I, H] and down [H, I] in E4M3, F32 scales per 128x128 block (rounded up).
        "deepseek_v3-fp8" => {
            2 * (i * h + i.div_ceil(128) * h.div_ceil(128) * 4)
                + (h * i + h.div_ceil(128) * i.div_ceil(128) * 4)
        }
        // FP4: bytes of 2 E2M1 codes, one E8M0 byte per 32 columns (expert_dtype fp4).
        "deepseek_v3-fp8-ue8m0-fp4" => 2 * (i * h / 2 + i * (h / 32)) + (h * i / 2 + h * (i / 32)),
        // int32 words of 8 codes, BF16 scale per 32 columns.
        "deepseek_v3-int4" => 2 * (i * h / 2 + i * (h / 32) * 2) + (h * i / 2 + h * (i / 32) * 2),
        // bytes of 2 E2M1 codes, one E8M0 byte per 32 columns.
        "qwen3_moe-mxfp4" => 2 * (i * h / 2 + i * (h / 32)) + (h * i / 2 + h * (i / 32)),
        // gate_up [2I, H] and down [H, I] blocks and scales, BF16 biases.
        "gpt_oss-mxfp4" => {
            (2 * i * h / 2 + 2 * i * (h / 32) + 2 * i * 2) + (h * i / 2 + h * (i / 32) + h * 2)
        }
        // BF16 fused weights and biases.
        "gpt_oss-bf16" => (2 * i * h * 2 + 2 * i * 2) + (h * i * 2 + h * 2),
        _ => unreachable!(),
    };
    b as u64
}

/// Reads widened to `align`: contiguous pieces merged, each run rounded out to the alignment.
fn aligned_bytes(pieces: &[sluice_store::Piece], align: u64) -> (u64, usize) {
    let mut runs: Vec<(u32, u64, u64)> = Vec::new();
    for p in pieces {
        match runs.last_mut() {
            Some(r) if r.0 == p.shard && r.2 == p.offset => r.2 += p.len,
            _ => runs.push((p.shard, p.offset, p.offset + p.len)),
        }
    }
    let total = runs
        .iter()
        .map(|&(_, s, e)| e.div_ceil(align) * align - s / align * align)
        .sum();
    (total, runs.len())
}

#[test]
fn a_packed_expert_is_read_and_cached_at_its_size_on_disk() {
    for name in [
        "deepseek_v3-fp8",
        "deepseek_v3-fp8-ue8m0-fp4",
        "deepseek_v3-int4",
        "qwen3_moe-mxfp4",
        "gpt_oss-mxfp4",
        "gpt_oss-bf16",
    ] {
        let m = open(name, 1);
        let cfg = m.config();
        let layer = (0..cfg.layers).find(|&l| cfg.is_moe(l)).unwrap();
        let e = 3;
        let payload = m.layout().bytes_of_expert(layer, e);
        let want = packed_expert_bytes(name, cfg.hidden, cfg.moe.intermediate);
        assert_eq!(payload, want, "{name}: expert bytes on disk");
        assert_eq!(m.layout().bytes_per_expert(), want, "{name}");
        // What one token's routed experts need, in the plan.
        let pieces = &m.layout().experts[layer][e];
        let align = match m.io_mode() {
            sluice_store::IoMode::Direct => {
                // The store's alignment: recompute it from the shard it reads.
                let ck = Checkpoint::open(fixture(name)).unwrap();
                let paths: Vec<_> = ck.shards().iter().map(|s| s.path.clone()).collect();
                let set = sluice_store::ShardSet::open(&paths, true).unwrap();
                sluice_store::Reader::align(&set, pieces[0].shard) as u64
            }
            sluice_store::IoMode::Buffered => 1,
        };
        let (widened, runs) = aligned_bytes(pieces, align);
        let before = m.experts().stats();
        let blob = m.experts().fetch(layer, &[e as u32]).unwrap().remove(0);
        let after = m.experts().stats();
        let read = after.bytes_read - before.bytes_read;
        let moe_layers = (0..cfg.layers).filter(|&l| cfg.is_moe(l)).count() as u64;
        let per_token = m.layout().expert_bytes_per_token(cfg.moe.top_k);
        assert_eq!(
            per_token,
            want * cfg.moe.top_k as u64 * moe_layers,
            "{name}"
        );
        println!(
            "{name}: expert {layer}.{e}: {payload} B on disk in {} pieces, {runs} reads, \
             {read} B read ({} I/O, alignment {align}), {} B cached; one token, nothing \
             cached: {per_token} B on disk",
            pieces.len(),
            m.io_mode(),
            blob.footprint(),
        );
        assert_eq!(read, widened, "{name}: bytes read");
        assert!(
            read - payload < 2 * align * runs as u64 || align == 1 && read == payload,
            "{name}: more than alignment widening"
        );
        // Cached: the layer's one buffer size, the largest expert's read (experts differ by
        // where alignment falls, at most an alignment unit either end of each read).
        let cached = blob.footprint() as u64;
        assert!(
            cached >= read && cached - read <= 2 * align * runs as u64,
            "{name}: {cached} B cached for {read} B read"
        );
        assert_eq!(m.experts().used(), cached, "{name}: cache accounting");
    }
}

// ---- malformed metadata --------------------------------------------------------------------

type Tensors = Vec<(String, Dtype, Vec<usize>, Vec<u8>)>;

/// Every tensor of a checkpoint directory.
fn load_all(dir: &Path) -> Tensors {
    let ck = Checkpoint::open(dir).unwrap();
    ck.tensors()
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                t.dtype,
                t.shape.clone(),
                ck.read(t).unwrap(),
            )
        })
        .collect()
}

/// A copy of fixture `name` as one `model.safetensors`, after `edit`.
fn mutated(name: &str, edit: impl FnOnce(&mut Tensors)) -> tempfile::TempDir {
    let src = fixture(name);
    let mut ts = load_all(&src);
    edit(&mut ts);
    let d = tempfile::Builder::new()
        .prefix("sluice-quant-bad-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    std::fs::copy(src.join("config.json"), d.path().join("config.json")).unwrap();
    let refs: Vec<(&str, Dtype, &[usize], &[u8])> = ts
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), *d, s.as_slice(), b.as_slice()))
        .collect();
    std::fs::write(
        d.path().join("model.safetensors"),
        sluice_format::safetensors::serialize(&refs, None),
    )
    .unwrap();
    d
}

fn tensor<'a>(ts: &'a mut Tensors, name: &str) -> &'a mut (String, Dtype, Vec<usize>, Vec<u8>) {
    ts.iter_mut()
        .find(|t| t.0 == name)
        .unwrap_or_else(|| panic!("no {name}"))
}

/// Opening fails at load with a tensor error naming `tensor` (a format error naming it for a
/// tensor that is simply absent).
fn refused(dir: &Path, tensor: &str) -> String {
    let e = Model::open(dir, ModelOptions::default()).unwrap_err();
    let msg = e.to_string();
    match &e {
        ModelError::Tensor { tensor: t, .. } => assert_eq!(t, tensor, "{msg}"),
        _ => assert!(msg.contains(tensor), "{msg}"),
    }
    println!("refused: {msg}");
    msg
}

const INT4_EXPERT: &str = "model.layers.1.mlp.experts.5.gate_proj";
const FP8_EXPERT: &str = "model.layers.1.mlp.experts.2.down_proj";

#[test]
fn a_missing_scale_tensor_is_named() {
    let s = format!("{INT4_EXPERT}.weight_scale");
    let d = mutated("deepseek_v3-int4", |ts| ts.retain(|t| t.0 != s));
    let msg = refused(d.path(), &s);
    assert!(msg.contains("group_0"), "{msg}");

    let s = format!("{FP8_EXPERT}.weight_scale_inv");
    let d = mutated("deepseek_v3-fp8", |ts| ts.retain(|t| t.0 != s));
    refused(d.path(), &s);

    let s = "model.layers.2.mlp.experts.gate_up_proj_scales";
    let d = mutated("gpt_oss-mxfp4", |ts| ts.retain(|t| t.0 != s));
    refused(d.path(), s);

    let s = "model.layers.0.mlp.experts.3.up_proj.weight_scale";
    let d = mutated("qwen3_moe-mxfp4", |ts| ts.retain(|t| t.0 != s));
    refused(d.path(), s);
}

#[test]
fn a_wrong_group_count_is_named() {
    // INT4: [64, 2] BF16 group scales cut to one group per row.
    let s = format!("{INT4_EXPERT}.weight_scale");
    let d = mutated("deepseek_v3-int4", |ts| {
        let t = tensor(ts, &s);
        t.2 = vec![t.2[0], 1];
        let rows = t.2[0];
        t.3 =
            t.3.chunks_exact(4)
                .take(rows)
                .flat_map(|c| c[..2].to_vec())
                .collect();
    });
    let msg = refused(d.path(), &s);
    assert!(msg.contains("one scale per 32 columns"), "{msg}");

    // FP8: the [2, 1] block grid of a [192, 64] weight given as one block (as if 192 rows fit
    // one 128-row block).
    let s = format!("{FP8_EXPERT}.weight_scale_inv");
    let d = mutated("deepseek_v3-fp8", |ts| {
        let t = tensor(ts, &s);
        assert_eq!(t.2, [2, 1]);
        t.2 = vec![1, 1];
        t.3.truncate(4);
    });
    let msg = refused(d.path(), &s);
    assert!(msg.contains("128x128"), "{msg}");

    // GPT-OSS: one scale short per row.
    let s = "model.layers.1.mlp.experts.gate_up_proj_scales";
    let d = mutated("gpt_oss-mxfp4", |ts| {
        let t = tensor(ts, s);
        let [e, r, g] = t.2[..] else { panic!() };
        t.2 = vec![e, r, g - 1];
        t.3.truncate(e * r * (g - 1));
    });
    refused(d.path(), s);
}

#[test]
fn a_packed_shape_that_contradicts_weight_shape_is_named() {
    // weight_packed of half the columns of what weight_shape says.
    let p = format!("{INT4_EXPERT}.weight_packed");
    let d = mutated("deepseek_v3-int4", |ts| {
        let t = tensor(ts, &p);
        let [r, w] = t.2[..] else { panic!() };
        t.2 = vec![r, w / 2];
        t.3 =
            t.3.chunks_exact(w * 4)
                .flat_map(|c| c[..w * 2].to_vec())
                .collect();
    });
    let msg = refused(d.path(), &p);
    assert!(msg.contains("weight_shape"), "{msg}");

    // weight_shape claiming another shape than the model's.
    let s = format!("{INT4_EXPERT}.weight_shape");
    let d = mutated("deepseek_v3-int4", |ts| {
        let t = tensor(ts, &s);
        assert_eq!(t.1, Dtype::I64);
        t.3 = [64i64, 128].iter().flat_map(|v| v.to_le_bytes()).collect();
    });
    refused(d.path(), &s);

    // A packed expert the config does not target (the ignore list leaves it BF16).
    let d = mutated("deepseek_v3-int4", |ts| {
        for t in ts.iter_mut() {
            if let Some(rest) = t.0.strip_prefix("model.layers.1.mlp.experts.0.") {
                t.0 = format!("model.layers.1.mlp.shared_experts.{rest}");
            }
        }
        ts.retain(|t| {
            !t.0.starts_with("model.layers.1.mlp.shared_experts.") || t.0.contains("weight_")
        });
    });
    refused(
        d.path(),
        "model.layers.1.mlp.shared_experts.gate_proj.weight",
    );
}

// ---- memory as a dial on a quantized model -------------------------------------------------

struct Run {
    ids: Vec<u32>,
    logits: Vec<f32>,
}

const PROMPT: [u32; 7] = [3, 17, 92, 5, 64, 33, 8];

fn generate(m: &Model) -> Run {
    let mut st = m.new_state();
    let mut logits = Vec::new();
    for c in PROMPT.chunks(3) {
        logits.extend(m.forward(&mut st, c, Logits::All).unwrap());
    }
    let v = m.config().vocab;
    let mut ids = Vec::new();
    for _ in 0..6 {
        let last = &logits[logits.len() - v..];
        let next = argmax(last);
        ids.push(next);
        logits.extend(m.forward(&mut st, &[next], Logits::Last).unwrap());
    }
    Run { ids, logits }
}

fn budget_opts(
    memory: Option<u64>,
    policy: PolicyChoice,
    prefetch: bool,
    threads: usize,
) -> ModelOptions {
    ModelOptions {
        memory,
        policy,
        prefetch,
        // Read every prediction, so that prefetch reads happen in these runs.
        prefetch_precision: 0.0,
        threads,
        context: 64,
        chunk: 8,
        ..Default::default()
    }
}

struct Baseline {
    run: Run,
    minimum: u64,
    fixed: u64,
    all_experts: u64,
}

fn baseline(dir: &Path) -> Baseline {
    let m = Model::open(dir, budget_opts(None, PolicyChoice::Lru, false, 1)).unwrap();
    let p = m.plan().clone();
    Baseline {
        run: generate(&m),
        minimum: p.minimum,
        fixed: p.trunk + p.kv_cache + p.scratch,
        all_experts: p.all_expert_bytes,
    }
}

fn cases() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(16),
        ..ProptestConfig::default()
    }
}

macro_rules! budget_test {
    ($name:ident, $fixture:literal) => {
        proptest! {
            #![proptest_config(cases())]
            #[test]
            fn $name(frac in 0.0f64..=1.0, policy in 0..PolicyChoice::ALL.len(), prefetch: bool, threads in 1usize..=3) {
                static BASE: OnceLock<Baseline> = OnceLock::new();
                let dir = fixture($fixture);
                let base = BASE.get_or_init(|| baseline(&dir));
                let span = (base.fixed + base.all_experts).saturating_sub(base.minimum);
                let memory = base.minimum + (span as f64 * frac) as u64;
                let m = Model::open(&dir, budget_opts(Some(memory), PolicyChoice::ALL[policy].clone(), prefetch, threads)).unwrap();
                let r = generate(&m);
                let s = m.experts().stats();
                prop_assert_eq!(&r.ids, &base.run.ids, "ids differ at budget {}", memory);
                prop_assert!(
                    r.logits.iter().zip(&base.run.logits).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "logits differ at budget {}, {}, prefetch {}, {} threads",
                    memory, PolicyChoice::ALL[policy], prefetch, threads
                );
                prop_assert_eq!(s.requests, s.hits + s.misses);
                prop_assert!(m.experts().used() <= m.experts().capacity());
            }
        }
    };
}

budget_test!(budget_int4_experts, "deepseek_v3-int4");
budget_test!(budget_gpt_oss_mxfp4, "gpt_oss-mxfp4");
budget_test!(budget_minimax_m2_fp8, "minimax_m2-fp8");
budget_test!(budget_qwen3_5_moe_fp8, "qwen3_5_moe-fp8");

/// A NaN in a resident FP8 trunk weight (E4M3 `0x7f`) is refused at load naming the tensor, as a
/// NaN in a BF16 or F32 one is; the largest finite value (`0x7e`, 448) is not.
#[test]
fn an_fp8_nan_in_the_trunk_is_refused_at_load() {
    let ts = load_all(&fixture("deepseek_v3-fp8"));
    let name = ts
        .iter()
        .find(|t| t.1 == Dtype::F8E4M3 && t.0.starts_with("model.layers.0.self_attn"))
        .map(|t| t.0.clone())
        .expect("an FP8 attention weight in layer 0");
    let d = mutated("deepseek_v3-fp8", |ts| tensor(ts, &name).3[3] = 0x7e);
    assert!(Model::open(d.path(), ModelOptions::default()).is_ok());
    let d = mutated("deepseek_v3-fp8", |ts| tensor(ts, &name).3[3] = 0x7f);
    let msg = refused(d.path(), &name);
    assert!(msg.contains("element 3 is NaN or infinite"), "{msg}");
}
