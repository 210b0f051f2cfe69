//! Kimi K3 against Moonshot's own modeling code, on the tiny reference checkpoints in
//! `testdata/kimi/k3/` (copied from the K3 reference fixtures by
//! `tools/reference/make_kimi_fixtures.py`; see their README).
//!
//! Everything is teacher-forced: prompt logits, and each `greedy_step_logits` row after feeding
//! the reference's own greedy tokens one at a time (the recurrent and convolution state and the
//! MLA cache carried). Routed experts are compared per layer and token, and the per-layer debug
//! tensors (the running block sum each layer leaves, the completed block sums, the final mix)
//! localise any error to the first layer where it appears.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

mod scratch;

mod common;
use common::{Reference, argmax, compare};
use sluice_format::Dtype;
use sluice_kernels::{Isa, Kernels};
use sluice_model::{Logits, Model, ModelOptions, State};

const REL_TOL: f32 = 1e-4;

fn k3_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/kimi/k3")
}

/// The fp32 checkpoint, written from the bf16 one: the K3 fixtures' fp32 and bf16 files hold
/// the same values (all bf16-representable), so widening every BF16 tensor to F32 gives the
/// fp32 checkpoint without committing it twice.
fn fp32_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = scratch::shared_dir(Path::new(env!("CARGO_TARGET_TMPDIR")), "sluice-k3-fp32-");
        let src = k3_dir().join("k3-tiny-bf16");
        let config = std::fs::read_to_string(src.join("config.json")).unwrap();
        std::fs::write(
            d.join("config.json"),
            config.replace("\"bfloat16\"", "\"float32\""),
        )
        .unwrap();
        let path = src.join("model.safetensors");
        let (header, _) = sluice_format::safetensors::read_header(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let mut tensors = header.tensors;
        tensors.sort_by_key(|t| t.offset);
        let data: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
            .iter()
            .map(|t| {
                let raw = &bytes[t.offset as usize..(t.offset + t.len) as usize];
                let f32s = match t.dtype {
                    Dtype::BF16 => raw
                        .chunks_exact(2)
                        .flat_map(|c| {
                            f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16)
                                .to_le_bytes()
                        })
                        .collect(),
                    Dtype::F32 => raw.to_vec(),
                    d => panic!("{}: unexpected dtype {d}", t.name),
                };
                (t.name.clone(), t.shape.clone(), f32s)
            })
            .collect();
        let entries: Vec<(&str, Dtype, &[usize], &[u8])> = data
            .iter()
            .map(|(n, s, b)| (n.as_str(), Dtype::F32, s.as_slice(), b.as_slice()))
            .collect();
        std::fs::write(
            d.join("model.safetensors"),
            sluice_format::safetensors::serialize(&entries, None),
        )
        .unwrap();
        d
    })
    .as_path()
}

fn dir(variant: &str) -> PathBuf {
    match variant {
        "fp32" => fp32_dir().to_path_buf(),
        v => k3_dir().join(format!("k3-tiny-{v}")),
    }
}

fn reference(variant: &str) -> Reference {
    let f = if variant == "mxfp4" {
        "ref_mxfp4.safetensors"
    } else {
        "ref_bf16.safetensors"
    };
    Reference::open(&k3_dir().join(f))
}

fn open(variant: &str, threads: usize, isa: Isa) -> Model {
    let opts = ModelOptions {
        kernels: Kernels::new(isa).unwrap(),
        threads,
        ..Default::default()
    };
    Model::open(dir(variant), opts).unwrap_or_else(|e| panic!("k3-tiny-{variant}: {e}"))
}

/// Prompt logits, routed experts and the per-layer debug tensors for prompts of 1, 7 and 33
/// tokens.
fn check_prompts(variant: &str) {
    let model = open(variant, 1, Isa::best());
    let r = reference(variant);
    let cfg = model.config();
    for t in [1usize, 7, 33] {
        let p = format!("len{t}.");
        let ids = r.ids(&format!("{p}prompt_ids"));
        assert_eq!(ids.len(), t);
        let mut st = model.new_state();
        st.routes = Some(Vec::new());
        st.debug = Some(Vec::new());
        let logits = model.forward(&mut st, &ids, Logits::All).unwrap();

        // The debug tensors first: where an error starts is where to look.
        let debug: HashMap<String, Vec<f32>> = st.debug.take().unwrap().into_iter().collect();
        let mut names = vec![("embeddings".to_owned(), "embeddings".to_owned())];
        for l in 0..cfg.layers {
            names.push((format!("layer{l}.output"), format!("layer{l}.prefix_sum")));
            names.push((
                format!("layer{l}.block_residual"),
                format!("layer{l}.block_residual"),
            ));
        }
        names.push(("final_norm_input".into(), "final_norm_input".into()));
        names.push(("final_hidden".into(), "final_hidden".into()));
        let mut worst_debug = (0f32, String::new());
        for (ours, theirs) in names {
            let got = debug
                .get(&ours)
                .unwrap_or_else(|| panic!("no debug tensor `{ours}`"));
            let (worst, scale) = compare(got, &r.f32(&format!("{p}{theirs}")));
            assert!(
                worst <= REL_TOL * scale,
                "k3-tiny-{variant} len{t}: `{theirs}` is off by {worst:e} (max |value| {scale}): \
                 the first tensor past tolerance"
            );
            if worst / scale > worst_debug.0 {
                worst_debug = (worst / scale, theirs);
            }
        }

        let (worst, scale) = compare(&logits, &r.f32(&format!("{p}logits")));
        println!(
            "k3-tiny-{variant} len{t}: worst |Δlogit| {worst:.3e} (max|logit| {scale:.2}, ratio \
             {:.2e}); worst debug tensor {} at {:.2e}",
            worst / scale,
            worst_debug.1,
            worst_debug.0
        );
        assert!(
            worst <= REL_TOL * scale,
            "k3-tiny-{variant} len{t}: logits off by {worst} > {REL_TOL} × {scale}"
        );

        // Routed experts: ids equal, weights close.
        let routes = st.routes.take().unwrap();
        let mut checked = 0;
        for l in 0..cfg.layers {
            let key = format!("{p}layer{l}.router_topk_idx");
            if !r.has(&key) {
                assert!(!cfg.is_moe(l), "reference lacks routes of MoE layer {l}");
                continue;
            }
            let want = r.ids(&key);
            let want_w = r.f32(&format!("{p}layer{l}.router_topk_weight"));
            let k = cfg.moe.top_k;
            let got: Vec<_> = routes.iter().filter(|x| x.layer == l).collect();
            assert_eq!(got.len(), t, "layer {l}");
            for (i, route) in got.iter().enumerate() {
                assert_eq!(
                    route.experts,
                    want[i * k..(i + 1) * k],
                    "k3-tiny-{variant} len{t} layer {l} token {i}"
                );
                for (g, w) in route.weights.iter().zip(&want_w[i * k..(i + 1) * k]) {
                    assert!(
                        (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                        "layer {l} token {i}: weight {g} vs {w}"
                    );
                }
                checked += 1;
            }
        }
        assert_eq!(checked, t * (cfg.layers - 1));
    }
}

/// Teacher-forced greedy decoding: after the prompt, each reference greedy token is fed alone
/// and the next row of `greedy_step_logits` compared.
fn check_greedy(variant: &str) {
    let model = open(variant, 1, Isa::best());
    let r = reference(variant);
    let vocab = model.config().vocab;
    for t in [1usize, 7, 33] {
        let p = format!("len{t}.");
        let prompt = r.ids(&format!("{p}prompt_ids"));
        let tokens = r.ids(&format!("{p}greedy_tokens"));
        let want = r.f32(&format!("{p}greedy_step_logits"));
        let mut st = model.new_state();
        let mut logits = model.forward(&mut st, &prompt, Logits::Last).unwrap();
        let mut worst_ratio = 0f32;
        for (step, &tok) in tokens.iter().enumerate() {
            let (worst, scale) = compare(&logits, &want[step * vocab..(step + 1) * vocab]);
            worst_ratio = worst_ratio.max(worst / scale);
            assert!(
                worst <= REL_TOL * scale,
                "k3-tiny-{variant} len{t} step {step}: off by {worst} > {REL_TOL} × {scale}"
            );
            assert_eq!(argmax(&logits), tok, "len{t} step {step}: greedy token");
            logits = model.forward(&mut st, &[tok], Logits::Last).unwrap();
        }
        println!("k3-tiny-{variant} len{t} greedy: worst step ratio {worst_ratio:.2e}");
    }
}

/// Thread counts, prefill chunk sizes and ISAs change no bit.
fn check_invariance(variant: &str) {
    let r = reference(variant);
    let ids = r.ids("len33.prompt_ids");
    let run = |m: &Model, chunk: usize| {
        let mut st = m.new_state();
        let mut all = Vec::new();
        for c in ids.chunks(chunk) {
            all.extend(m.forward(&mut st, c, Logits::All).unwrap());
        }
        // A few decode steps on top, through the carried state.
        for &tok in &[5u32, 77, 300] {
            all.extend(m.forward(&mut st, &[tok], Logits::Last).unwrap());
        }
        all
    };
    let base = run(&open(variant, 1, Isa::Scalar), ids.len());
    for threads in [1, 2, 3] {
        let m = open(variant, threads, Isa::best());
        for chunk in [1, 5, 7, ids.len()] {
            let got = run(&m, chunk);
            assert!(
                got.iter()
                    .zip(&base)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "k3-tiny-{variant}: threads {threads}, chunk {chunk} changed logits"
            );
        }
    }
    for isa in Isa::available() {
        let got = run(&open(variant, 2, isa), 7);
        assert!(
            got.iter()
                .zip(&base)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "k3-tiny-{variant}: ISA {isa} changed logits"
        );
    }
}

macro_rules! k3_tests {
    ($($modname:ident => $variant:literal),* $(,)?) => {$(
        mod $modname {
            #[test]
            fn prompts() { super::check_prompts($variant) }
            #[test]
            fn greedy() { super::check_greedy($variant) }
            #[test]
            fn invariance() { super::check_invariance($variant) }
        }
    )*};
}

k3_tests! {
    fp32 => "fp32",
    bf16 => "bf16",
    mxfp4 => "mxfp4",
}

/// The fp32 checkpoint written from the bf16 one gives the bf16 checkpoint's bits.
#[test]
fn fp32_and_bf16_agree_bit_for_bit() {
    let ids = reference("bf16").ids("len7.prompt_ids");
    let run = |v: &str| {
        let m = open(v, 1, Isa::best());
        m.forward(&mut m.new_state(), &ids, Logits::All).unwrap()
    };
    let (a, b) = (run("fp32"), run("bf16"));
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
}

/// A recurrent state steps back to where the latest pass began (and to the start), and refuses
/// anything else without changing.
#[test]
fn truncation_of_the_recurrent_state() {
    let m = open("bf16", 1, Isa::best());
    let ids = reference("bf16").ids("len7.prompt_ids");
    let mut st: State = m.new_state();
    m.forward(&mut st, &ids, Logits::None).unwrap();
    let first = m.forward(&mut st, &[42], Logits::Last).unwrap();
    // Back one step, and the same token gives the same bits.
    st.truncate(7).unwrap();
    assert_eq!(st.pos(), 7);
    let again = m.forward(&mut st, &[42], Logits::Last).unwrap();
    assert!(
        first
            .iter()
            .zip(&again)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
    // Further back than the latest pass: refused, nothing changed.
    let e = st.truncate(3).unwrap_err();
    assert!(e.to_string().contains("cannot truncate"), "{e}");
    assert_eq!(st.pos(), 8);
    let next = m.forward(&mut st, &[9], Logits::Last).unwrap();
    // To the start: the whole sequence again gives the same bits.
    st.truncate(0).unwrap();
    m.forward(&mut st, &ids, Logits::None).unwrap();
    m.forward(&mut st, &[42], Logits::None).unwrap();
    let redo = m.forward(&mut st, &[9], Logits::Last).unwrap();
    assert!(
        next.iter()
            .zip(&redo)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
}

/// From the minimum budget (layers streamed through the ring, embeddings read per token,
/// experts read on demand) up, the output is the all-resident output, bit for bit.
#[test]
fn the_minimum_budget_streams_and_changes_no_bit() {
    let ids = reference("mxfp4").ids("len7.prompt_ids");
    let run = |m: &Model| {
        let mut st = m.new_state();
        let mut out = m.forward(&mut st, &ids, Logits::All).unwrap();
        for &t in &[3u32, 99, 250] {
            out.extend(m.forward(&mut st, &[t], Logits::Last).unwrap());
        }
        out
    };
    let opts = |memory| ModelOptions {
        memory,
        context: 64,
        chunk: 8,
        threads: 2,
        ..Default::default()
    };
    let full = Model::open(dir("mxfp4"), opts(None)).unwrap();
    let want = run(&full);
    let minimum = full.plan().minimum;
    let m = Model::open(dir("mxfp4"), opts(Some(minimum))).unwrap();
    assert!(m.plan().ring_slots > 0, "{:?}", m.plan());
    assert!(!m.plan().embed.1);
    assert!(m.plan().recurrent > 0);
    let got = run(&m);
    assert!(
        got.iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
    let s = m.experts().stats();
    assert!(s.misses > 0 && s.bytes_read > 0, "{s:?}");
    assert!(m.trunk_bytes_read() > 0);
}
