//! `sluice pack`: pack → run equals the direct run, corruption is caught at load naming the
//! layer, an interrupted pack leaves nothing half-valid, and the source directory is never
//! written to.

use std::path::{Path, PathBuf};

use sluice::tools::synth::SynthSpec;
use sluice_model::{Logits, Model, ModelOptions};

/// A fixture directory: `name` under `testdata/models/`, or a path under `testdata/` when it
/// has a `/`.
fn fixture(name: &str) -> PathBuf {
    let testdata = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata");
    if name.contains('/') {
        testdata.join(name)
    } else {
        testdata.join("models").join(name)
    }
}

fn logits(dir: &Path, memory: Option<u64>) -> Result<Vec<f32>, sluice_model::ModelError> {
    let m = Model::open(
        dir,
        ModelOptions {
            memory,
            context: 64,
            ..Default::default()
        },
    )?;
    let mut st = m.new_state();
    let mut out = m.forward(&mut st, &[3, 1, 4, 1, 5, 9, 2, 6], Logits::All)?;
    for t in [5u32, 3, 5] {
        out.extend(m.forward(&mut st, &[t], Logits::Last)?);
    }
    Ok(out)
}

fn snapshot(dir: &Path) -> Vec<(String, u64, std::time::SystemTime)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                m.len(),
                m.modified().unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn pack_then_run_equals_direct_run() {
    let tmp = tempfile::tempdir().unwrap();
    for name in [
        "deepseek_v3-fp32",
        "qwen3_moe-bf16",
        "mixtral-fp32",
        "kimi/k3/k3-tiny-mxfp4",
        // Tensors stored under Mistral's names, read under transformers'.
        "mistral_large4-bf16",
    ] {
        let src = fixture(name);
        let before = snapshot(&src);
        let out = tmp.path().join(name.replace('/', "-"));
        let mut calls = 0;
        let r = sluice::tools::pack::pack(&src, &out, false, &mut |done, total| {
            assert!(done <= total);
            calls += 1;
        })
        .unwrap();
        assert!(calls > 0);
        assert_eq!(snapshot(&src), before, "the source directory changed");
        let m = sluice_format::packed::Manifest::read(&out).unwrap();
        assert_eq!(m.parts.len(), r.parts);
        for p in &m.parts {
            assert_eq!(p.offset % 4096, 0);
        }
        assert_eq!(m.file_len % 4096, 0);
        let direct = logits(&src, None).unwrap();
        // All resident, and streamed at the smallest budget: the same bits.
        let packed = logits(&out, None).unwrap();
        assert!(
            packed
                .iter()
                .zip(&direct)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: pack changed logits"
        );
        let min = Model::open(
            &out,
            ModelOptions {
                context: 64,
                ..Default::default()
            },
        )
        .unwrap()
        .plan()
        .minimum;
        let streamed = logits(&out, Some(min)).unwrap();
        assert!(
            streamed
                .iter()
                .zip(&direct)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: streamed pack changed logits"
        );
    }
}

#[test]
fn a_corrupt_byte_is_caught_at_load_naming_the_layer() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("p");
    sluice::tools::pack::pack(&fixture("deepseek_v3-fp32"), &out, false, &mut |_, _| {}).unwrap();
    let m = sluice_format::packed::Manifest::read(&out).unwrap();
    let part = m.part("layer.2").unwrap();
    let trunk = out.join("trunk.bin");
    let mut bytes = std::fs::read(&trunk).unwrap();
    bytes[(part.offset + part.len / 2) as usize] ^= 0x10;
    std::fs::write(&trunk, &bytes).unwrap();
    for memory in [
        None,
        Some(
            Model::open(
                fixture("deepseek_v3-fp32"),
                ModelOptions {
                    context: 64,
                    ..Default::default()
                },
            )
            .unwrap()
            .plan()
            .minimum,
        ),
    ] {
        let e = logits(&out, memory).unwrap_err().to_string();
        assert!(e.contains("layer.2") && e.contains("checksum"), "{e}");
    }
    // Skipping verification loads (and says nothing is checked: that is the caller's choice).
    let m = Model::open(
        &out,
        ModelOptions {
            verify_pack: false,
            ..Default::default()
        },
    );
    assert!(m.is_ok());
}

#[test]
fn refusals() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture("deepseek_v3-fp32");
    let out = tmp.path().join("p");
    sluice::tools::pack::pack(&src, &out, false, &mut |_, _| {}).unwrap();
    // An existing pack is not overwritten without --force.
    let e = sluice::tools::pack::pack(&src, &out, false, &mut |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("--force"), "{e}");
    assert!(sluice::tools::pack::pack(&src, &out, true, &mut |_, _| {}).is_ok());
    // A pack of a pack, and a pack inside the source, are refused.
    assert!(sluice::tools::pack::pack(&out, &tmp.path().join("q"), false, &mut |_, _| {}).is_err());
    assert!(sluice::tools::pack::pack(&src, &src.join("pack"), false, &mut |_, _| {}).is_err());
    assert!(!src.join("pack").exists());
}

#[test]
fn a_changed_source_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    SynthSpec {
        hidden: 64,
        experts: 8,
        top_k: 2,
        moe_inter: 32,
        vocab: 128,
        dense_inter: 64,
        ..Default::default()
    }
    .write(&src)
    .unwrap();
    let out = tmp.path().join("p");
    sluice::tools::pack::pack(&src, &out, false, &mut |_, _| {}).unwrap();
    assert!(logits(&out, None).is_ok());
    let shard = src.join("model-00002-of-00004.safetensors");
    let mut b = std::fs::read(&shard).unwrap();
    b.extend_from_slice(&[0; 16]);
    std::fs::write(&shard, b).unwrap();
    let e = logits(&out, None).unwrap_err().to_string();
    assert!(e.contains("changed since it was packed"), "{e}");
}

/// A private copy of a fixture directory at `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// Issue 18 class 1: `pack dir/model dir --force` used to delete the whole checkpoint and exit
/// 0, and `--force` over any existing directory deleted the user's files. The source inside
/// the output is refused however it is spelt (`..`, a symlink), `--force` replaces only a pack
/// sluice wrote, and nothing is removed in either case.
#[test]
fn force_never_deletes_what_pack_did_not_write() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("dir");
    let src = dir.join("model");
    copy_dir(&fixture("deepseek_v3-fp32"), &src);
    let before = snapshot(&src);
    std::os::unix::fs::symlink(&dir, tmp.path().join("link")).unwrap();
    for (out, force) in [
        (dir.clone(), true),
        (dir.clone(), false),
        (src.join(".."), true),
        (tmp.path().join("link"), true),
        (tmp.path().to_path_buf(), true),
    ] {
        let e = sluice::tools::pack::pack(&src, &out, force, &mut |_, _| {}).unwrap_err();
        assert!(
            matches!(e, sluice::Error::Usage(_)),
            "{}: {e}",
            out.display()
        );
        assert_eq!(
            snapshot(&src),
            before,
            "{}: the source changed",
            out.display()
        );
    }
    let e = sluice::tools::pack::pack(&src, &dir, true, &mut |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("lies inside the output"), "{e}");

    // An existing directory of the user's (not a pack) is refused with --force, untouched.
    let user = tmp.path().join("notes");
    std::fs::create_dir(&user).unwrap();
    std::fs::write(user.join("thesis.txt"), b"years of work").unwrap();
    let e = sluice::tools::pack::pack(&src, &user, true, &mut |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("thesis.txt") && e.contains("--force"), "{e}");
    assert_eq!(
        std::fs::read(user.join("thesis.txt")).unwrap(),
        b"years of work"
    );
    // Nor is a user's file at OUT replaced, nor a directory with a fake manifest.
    let file = tmp.path().join("file");
    std::fs::write(&file, b"mine").unwrap();
    assert!(sluice::tools::pack::pack(&src, &file, true, &mut |_, _| {}).is_err());
    assert_eq!(std::fs::read(&file).unwrap(), b"mine");
    let fake = tmp.path().join("fake");
    std::fs::create_dir(&fake).unwrap();
    std::fs::write(fake.join("sluice-trunk.json"), b"{}").unwrap();
    let e = sluice::tools::pack::pack(&src, &fake, true, &mut |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("manifest"), "{e}");
    assert!(fake.join("sluice-trunk.json").exists());

    // A pack sluice wrote is replaced with --force; a file added to it makes it the user's.
    let out = tmp.path().join("p");
    sluice::tools::pack::pack(&src, &out, false, &mut |_, _| {}).unwrap();
    sluice::tools::pack::pack(&src, &out, true, &mut |_, _| {}).unwrap();
    std::fs::write(out.join("my-notes.txt"), b"keep").unwrap();
    assert!(sluice::tools::pack::pack(&src, &out, true, &mut |_, _| {}).is_err());
    assert_eq!(std::fs::read(out.join("my-notes.txt")).unwrap(), b"keep");

    // A directory that happens to have the partial pack's name but is not one stays.
    let stray = tmp.path().join(".q.sluice-partial");
    std::fs::create_dir(&stray).unwrap();
    std::fs::write(stray.join("data"), b"x").unwrap();
    let e = sluice::tools::pack::pack(&src, &tmp.path().join("q"), false, &mut |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("not removed"), "{e}");
    assert!(stray.join("data").exists());
    assert_eq!(snapshot(&src), before);
}
