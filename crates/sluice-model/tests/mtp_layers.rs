//! Multi-token-prediction layers shipped beside the model (Qwen3-Next's `mtp.*`, DeepSeek-V4's
//! `mtp.{i}.*`): checked like every other weight when present, never run by the model itself
//! (only `--draft mtp` runs them, `tests/mtp.rs`), and a checkpoint without them reads the same.

use std::path::{Path, PathBuf};

use sluice_format::Dtype;
use sluice_model::weights::MtpHeadSpec;
use sluice_model::{Description, Logits, Model, ModelOptions};

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/models")
        .join(name)
}

fn fixture() -> PathBuf {
    fixture_dir("qwen3_next-fp32")
}

type Tensors = Vec<(String, Dtype, Vec<usize>, Vec<u8>)>;

fn read(dir: &Path) -> Tensors {
    let path = dir.join("model.safetensors");
    let (header, _) = sluice_format::safetensors::read_header(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let mut out: Tensors = header
        .tensors
        .iter()
        .map(|t| {
            let data = bytes[t.offset as usize..(t.offset + t.len) as usize].to_vec();
            (t.name.clone(), t.dtype, t.shape.clone(), data)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The fixture with `extra` tensors beside its own, in a new directory.
fn with(extra: Tensors) -> tempfile::TempDir {
    let mut all = read(&fixture());
    all.extend(extra);
    rewrite(&fixture(), all)
}

/// A single-file checkpoint of `src`'s config holding `all`, in a new directory.
fn rewrite(src: &Path, all: Tensors) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for f in ["config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), d.path().join(f)).unwrap();
    }
    let entries: Vec<(&str, Dtype, &[usize], &[u8])> = all
        .iter()
        .map(|(n, t, s, b)| (n.as_str(), *t, s.as_slice(), b.as_slice()))
        .collect();
    std::fs::write(
        d.path().join("model.safetensors"),
        sluice_format::safetensors::serialize(&entries, None),
    )
    .unwrap();
    d
}

fn f32s(n: usize, seed: u32) -> Vec<u8> {
    (0..n)
        .flat_map(|i| {
            let r = (i as u32).wrapping_mul(2654435761) ^ seed;
            ((r % 1000) as f32 / 1000.0 - 0.5).to_le_bytes()
        })
        .collect()
}

/// An MTP layer as the hub's Qwen3-Next checkpoints hold it: a full-attention layer with the
/// MoE (here the model's own layer 1, renamed), `fc` and three norms.
fn mtp() -> Tensors {
    let h = 64;
    let mut out: Tensors = read(&fixture())
        .into_iter()
        .filter_map(|(n, t, s, b)| {
            n.strip_prefix("model.layers.1.")
                .map(|rest| (format!("mtp.layers.0.{rest}"), t, s, b))
        })
        .collect();
    assert!(
        out.iter().any(|t| t.0.contains("experts")),
        "layer 1 has no experts"
    );
    out.push((
        "mtp.fc.weight".into(),
        Dtype::F32,
        vec![h, 2 * h],
        f32s(2 * h * h, 1),
    ));
    for (i, n) in ["pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"]
        .iter()
        .enumerate()
    {
        out.push((
            format!("mtp.{n}.weight"),
            Dtype::F32,
            vec![h],
            f32s(h, i as u32),
        ));
    }
    out
}

fn logits(dir: &Path) -> Vec<f32> {
    let m = Model::open(dir, ModelOptions::default()).unwrap();
    let mut st = m.new_state();
    m.forward(&mut st, &[1, 2, 3, 4, 5], Logits::All).unwrap()
}

fn refused(extra: Tensors, names: &str) {
    refused_dir(with(extra), names);
}

/// A damaged MTP layer is loaded only to draft with: the model opens and runs as without it
/// (issue 59: it used to refuse the whole model), and only `--draft mtp` is refused, naming
/// the tensor.
fn refused_dir(d: tempfile::TempDir, names: &str) {
    let desc = Description::open(d.path()).unwrap();
    assert!(desc.layout.mtp.is_none());
    let e = desc
        .layout
        .mtp_error
        .as_ref()
        .expect("no error kept")
        .to_string();
    assert!(e.contains(names), "`{names}` not named in: {e}");
    Model::open(d.path(), ModelOptions::default()).unwrap();
    let opts = ModelOptions {
        mtp: true,
        ..ModelOptions::default()
    };
    let e = Model::open(d.path(), opts).unwrap_err().to_string();
    assert!(e.contains(names), "`{names}` not named in: {e}");
}

#[test]
fn present_mtp_layers_are_checked_and_change_nothing() {
    let d = with(mtp());
    let desc = Description::open(d.path()).unwrap();
    let m = desc
        .layout
        .mtp
        .as_ref()
        .expect("the MTP layer was not found");
    assert_eq!(m.layers.len(), 1);
    assert_eq!(m.expert_specs[0].len(), 8);
    let plain = Description::open(fixture()).unwrap();
    assert!(plain.layout.mtp.is_none());
    assert_eq!(desc.layout.trunk_bytes(), plain.layout.trunk_bytes());
    let (a, b) = (logits(d.path()), logits(&fixture()));
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
}

#[test]
fn a_damaged_mtp_layer_is_refused_only_for_drafting_naming_the_tensor() {
    // fc of the wrong shape.
    let mut bad = mtp();
    let fc = bad.iter_mut().find(|t| t.0 == "mtp.fc.weight").unwrap();
    (fc.2, fc.3) = (vec![64, 64], f32s(64 * 64, 1));
    refused(bad, "mtp.fc.weight");
    // A projection of the layer missing.
    let bad: Tensors = mtp()
        .into_iter()
        .filter(|t| t.0 != "mtp.layers.0.self_attn.q_proj.weight")
        .collect();
    refused(bad, "mtp.layers.0.self_attn.q_proj.weight");
    // An expert missing.
    let bad: Tensors = mtp()
        .into_iter()
        .filter(|t| !t.0.starts_with("mtp.layers.0.mlp.experts.3."))
        .collect();
    refused(bad, "mtp.layers.0.mlp.experts.3.");
    // The norms missing.
    let bad: Tensors = mtp()
        .into_iter()
        .filter(|t| t.0 != "mtp.pre_fc_norm_hidden.weight")
        .collect();
    refused(bad, "mtp.pre_fc_norm_hidden.weight");
}

/// DeepSeek-V4's fixtures carry an MTP layer as the released V4-Flash names it (`mtp.0.*`, in
/// the sharded one a shard of its own); transformers skips it, so the reference is the model's.
#[test]
fn deepseek_v4_mtp_layer_is_found_in_both_fixtures() {
    for name in ["deepseek_v4-fp32", "deepseek_v4-bf16"] {
        let desc = Description::open(fixture_dir(name)).unwrap();
        let m = desc
            .layout
            .mtp
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: the MTP layer was not found"));
        assert_eq!(m.layers.len(), 1, "{name}");
        assert_eq!(m.expert_specs[0].len(), 8, "{name}");
        assert_eq!(m.head_specs.len(), 1, "{name}: one head per layer");
        let MtpHeadSpec::PerLayer { mix, .. } = &m.head_specs[0] else {
            panic!("{name}: not DeepSeek's per-layer head");
        };
        assert!(mix.is_some(), "{name}: the hyper head was not found");
        // Its own block: a sliding window only (no compressor), learned routing.
        let plan = &desc.config.mtp.as_ref().unwrap().plans[0];
        assert_eq!(plan.attention.kind(), "swa", "{name}");
        assert!(m.bytes() > 0);
    }
}

#[test]
fn deepseek_v4_without_its_mtp_layer_gives_the_same_bits() {
    let src = fixture_dir("deepseek_v4-fp32");
    let all = read(&src);
    let n = all.len();
    let plain: Tensors = all
        .into_iter()
        .filter(|t| !t.0.starts_with("mtp."))
        .collect();
    assert!(
        plain.len() + 40 < n,
        "the fixture has no MTP layer to strip"
    );
    let d = rewrite(&src, plain);
    let desc = Description::open(d.path()).unwrap();
    assert!(desc.layout.mtp.is_none());
    let with_mtp = Description::open(&src).unwrap();
    assert_eq!(desc.layout.trunk_bytes(), with_mtp.layout.trunk_bytes());
    assert_eq!(desc.layout.expert_bytes(), with_mtp.layout.expert_bytes());
    let (a, b) = (logits(d.path()), logits(&src));
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
}

#[test]
fn a_damaged_deepseek_v4_mtp_layer_is_refused_only_for_drafting_naming_the_tensor() {
    let src = fixture_dir("deepseek_v4-fp32");
    let without = |stored: &str| -> tempfile::TempDir {
        rewrite(
            &src,
            read(&src).into_iter().filter(|t| t.0 != stored).collect(),
        )
    };
    // Missing: named as it is looked up (transformers' names, `mtp.{i}.` as `mtp.layers.{i}.`).
    for (stored, looked_up) in [
        ("mtp.0.e_proj.weight", "model.mtp.layers.0.e_proj.weight"),
        ("mtp.0.hnorm.weight", "model.mtp.layers.0.hnorm.weight"),
        ("mtp.0.hc_head_fn", "model.mtp.layers.0.hc_head.hc_fn"),
        (
            "mtp.0.attn.wq_a.weight",
            "model.mtp.layers.0.self_attn.q_a_proj.weight",
        ),
        (
            "mtp.0.ffn.gate.bias",
            "model.mtp.layers.0.mlp.gate.e_score_correction_bias",
        ),
        (
            "mtp.0.ffn.experts.5.w3.weight",
            "model.mtp.layers.0.mlp.experts.5.w3.weight",
        ),
    ] {
        refused_dir(without(stored), looked_up);
    }
    // Of the wrong shape.
    let mut bad = read(&src);
    let t = bad
        .iter_mut()
        .find(|t| t.0 == "mtp.0.h_proj.weight")
        .unwrap();
    (t.2, t.3) = (vec![64, 32], f32s(64 * 32, 1));
    refused_dir(rewrite(&src, bad), "h_proj");
}
