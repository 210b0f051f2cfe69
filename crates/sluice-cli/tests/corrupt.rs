//! Hostile checkpoints: each corruption gives one `error:` line naming the file and (where there
//! is one) the tensor, exit code 2, no panic — and nothing is ever written into the model
//! directory.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models/deepseek_v3-fp32")
}

/// A private copy of the fixture to break.
fn copy() -> tempfile::TempDir {
    copy_of(&fixture())
}

/// A private copy of the fixture directory `src`.
fn copy_of(src: &Path) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, d.path().join(p.file_name().unwrap())).unwrap();
    }
    d
}

fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

/// Runs a short generation; asserts a one-line input error with exit 2 that mentions every
/// string in `names`, and that the directory is unchanged.
fn refused(dir: &Path, names: &[&str]) {
    let before = snapshot(dir);
    let o = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "run",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            "1,2,3,4,5,6,7,8",
            "--max-tokens",
            "4",
            "--memory",
            "3MiB",
            "--context",
            "64",
        ])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.starts_with("error: ") && e.trim_end().lines().count() == 1,
        "{e}"
    );
    assert!(!e.contains("panicked"), "{e}");
    for n in names {
        assert!(e.contains(n), "`{n}` not named in: {e}");
    }
    assert!(
        o.stdout.is_empty()
            || !String::from_utf8_lossy(&o.stdout)
                .chars()
                .any(|c| c.is_alphanumeric()),
        "tokens were printed: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(snapshot(dir) == before, "the model directory changed");
}

/// Rewrites a shard's header JSON with `edit`, keeping the data section.
fn edit_header(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let b = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let mut h: serde_json::Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    edit(&mut h);
    let mut hb = serde_json::to_vec(&h).unwrap();
    while !hb.len().is_multiple_of(8) {
        hb.push(b' ');
    }
    let mut out = (hb.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&hb);
    out.extend_from_slice(&b[8 + n..]);
    std::fs::write(path, out).unwrap();
}

/// The shard holding `tensor`, and the tensor's data range in it.
fn locate(dir: &Path, tensor: &str) -> (PathBuf, usize, usize) {
    let idx: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let shard = dir.join(idx["weight_map"][tensor].as_str().unwrap());
    let b = std::fs::read(&shard).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let h: serde_json::Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    let o = &h[tensor]["data_offsets"];
    (
        shard,
        8 + n + o[0].as_u64().unwrap() as usize,
        8 + n + o[1].as_u64().unwrap() as usize,
    )
}

const NORM: &str = "model.layers.2.post_attention_layernorm.weight";
const EXPERT: &str = "model.layers.2.mlp.experts.5.up_proj.weight";

#[test]
fn truncated_shard() {
    let d = copy();
    let (shard, _, _) = locate(d.path(), NORM);
    let b = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &b[..b.len() - 1000]).unwrap();
    refused(
        d.path(),
        &[shard.file_name().unwrap().to_str().unwrap(), "truncated"],
    );
}

#[test]
fn flipped_header_bytes() {
    let d = copy();
    let (shard, _, _) = locate(d.path(), NORM);
    let mut b = std::fs::read(&shard).unwrap();
    let at = b[8..200].iter().position(|&c| c == b'"').unwrap() + 8;
    b[at] = b'}';
    std::fs::write(&shard, &b).unwrap();
    refused(
        d.path(),
        &[shard.file_name().unwrap().to_str().unwrap(), "header"],
    );
}

#[test]
fn shard_missing_from_disk() {
    let d = copy();
    let (shard, _, _) = locate(d.path(), EXPERT);
    std::fs::remove_file(&shard).unwrap();
    refused(
        d.path(),
        &[
            shard.file_name().unwrap().to_str().unwrap(),
            "does not exist",
        ],
    );
}

#[test]
fn wrong_dtype_for_its_role() {
    let d = copy();
    let (shard, _, _) = locate(d.path(), NORM);
    edit_header(&shard, |h| h[NORM]["dtype"] = "I32".into());
    refused(d.path(), &[NORM, "dtype"]);
}

#[test]
fn wrong_shape_for_its_role() {
    let d = copy();
    let (shard, _, _) = locate(d.path(), NORM);
    edit_header(&shard, |h| h[NORM]["shape"] = serde_json::json!([8, 8]));
    refused(d.path(), &[NORM, "shape"]);
}

#[test]
fn nan_in_the_trunk_is_refused_at_load() {
    let d = copy();
    let (shard, start, _) = locate(d.path(), NORM);
    let mut b = std::fs::read(&shard).unwrap();
    b[start + 8..start + 12].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&shard, &b).unwrap();
    refused(
        d.path(),
        &[NORM, shard.file_name().unwrap().to_str().unwrap(), "NaN"],
    );
}

#[test]
fn infinity_in_an_expert_ends_the_request_naming_the_layer() {
    let d = copy();
    let (shard, start, end) = locate(d.path(), EXPERT);
    let mut b = std::fs::read(&shard).unwrap();
    for at in (start..end).step_by(4) {
        b[at..at + 4].copy_from_slice(&f32::INFINITY.to_le_bytes());
    }
    std::fs::write(&shard, &b).unwrap();
    // Expert 5 of layer 2 is routed to by some token of this prompt (checked: the error names
    // layer 2; another expert would leave the output finite).
    refused(d.path(), &["layer 2", "NaN or infinite"]);
}

#[test]
fn config_inconsistent_with_the_tensors() {
    let d = copy();
    let p = d.path().join("config.json");
    let mut c: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    c["moe_intermediate_size"] = 48.into();
    std::fs::write(&p, serde_json::to_vec(&c).unwrap()).unwrap();
    refused(d.path(), &["mlp.", "shape", "expected"]);
}

#[test]
fn config_with_an_unknown_architecture() {
    let d = copy();
    let p = d.path().join("config.json");
    let mut c: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    c["model_type"] = "jamba".into();
    std::fs::write(&p, serde_json::to_vec(&c).unwrap()).unwrap();
    refused(d.path(), &["config.json", "model_type", "jamba"]);
}

#[test]
fn a_packed_trunk_with_a_bad_checksum() {
    let d = copy();
    let tmp = tempfile::tempdir().unwrap();
    let pack = tmp.path().join("pack");
    let o = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["pack", d.path().to_str().unwrap(), pack.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success());
    let t = pack.join("trunk.bin");
    let mut b = std::fs::read(&t).unwrap();
    let n = b.len();
    b[n / 2] ^= 1;
    std::fs::write(&t, &b).unwrap();
    refused(&pack, &["trunk.bin", "checksum"]);
}

/// Issue 18 class 2: sizes in config.json used to be allocated before they were checked
/// (`num_hidden_layers: 1000000000` aborted with a backtrace, 10^18 panicked with "capacity
/// overflow"), `n_shared_experts: 10^18` wrapped, `rms_norm_eps: 1e308` became ∞ as an f32
/// and a config with fewer layers than the checkpoint silently ran a truncated model. Each is
/// now a one-line error naming the field.
#[test]
fn hostile_sizes_in_config_are_refused_naming_the_field() {
    let cases: [(&str, serde_json::Value, &[&str]); 9] = [
        (
            "num_hidden_layers",
            1_000_000_000u64.into(),
            &["num_hidden_layers", "4096"],
        ),
        (
            "num_hidden_layers",
            1_000_000_000_000_000_000u64.into(),
            &["num_hidden_layers"],
        ),
        (
            "n_shared_experts",
            1_000_000_000_000_000_000u64.into(),
            &["n_shared_experts"],
        ),
        (
            "n_shared_experts",
            65_537u64.into(),
            &["n_shared_experts", "65536"],
        ),
        ("vocab_size", u64::MAX.into(), &["vocab_size"]),
        ("rms_norm_eps", 1e308.into(), &["rms_norm_eps", "32-bit"]),
        (
            "rms_norm_eps",
            (-1e-6).into(),
            &["rms_norm_eps", "positive"],
        ),
        (
            "routed_scaling_factor",
            (-2.5).into(),
            &["routed_scaling_factor", "positive"],
        ),
        (
            "num_hidden_layers",
            2u64.into(),
            &["num_hidden_layers", "model.layers.2.", "unused"],
        ),
    ];
    for (field, value, names) in cases {
        let d = copy();
        let p = d.path().join("config.json");
        let mut c: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        c[field] = value;
        std::fs::write(&p, serde_json::to_vec(&c).unwrap()).unwrap();
        let mut want = vec!["config.json"];
        want.extend_from_slice(names);
        refused(d.path(), &want);
    }
}

/// A layer count below the checkpoint's names the field the family reads it from (LongCat's
/// `num_layers`, not `num_hidden_layers`).
#[test]
fn too_few_layers_name_the_family_s_own_field() {
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models");
    let d = copy_of(&models.join("longcat_flash-fp32"));
    let p = d.path().join("config.json");
    let mut c: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    c["num_layers"] = 1u64.into();
    std::fs::write(&p, serde_json::to_vec(&c).unwrap()).unwrap();
    refused(d.path(), &["config.json", "`num_layers`", "unused"]);
}

#[test]
fn an_expert_id_out_of_range_in_a_hash_table_is_refused_naming_it() {
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models");
    let d = copy_of(&models.join("deepseek_v4-bf16"));
    // DeepSeek-V4's layer 0 takes its experts from the token: row 3 now names expert 99 of 8.
    let table = "model.layers.0.ffn.gate.tid2eid";
    let (shard, start, _) = locate(d.path(), table);
    let mut b = std::fs::read(&shard).unwrap();
    let row3 = start + 3 * 2 * 8;
    b[row3..row3 + 8].copy_from_slice(&99i64.to_le_bytes());
    std::fs::write(&shard, &b).unwrap();
    refused(d.path(), &[table, "99", "below 8"]);
}
