//! The multi-token-prediction layers against their references (`testdata/mtp/*`, made by
//! `tools/reference/make_mtp_fixtures.py` from transformers' decoder layers, the way vLLM runs
//! Qwen3-Next's, DeepSeek-V3's and GLM-4.5's MTP layers and DeepSeek's `MTPBlock` runs
//! DeepSeek-V4's).

use std::path::{Path, PathBuf};

mod common;
use common::{Reference, compare};
use sluice_kernels::{Isa, Kernels};
use sluice_model::{Logits, Model, ModelError, ModelOptions};

/// The fixtures: Qwen3-Next's `mtp.*`, DeepSeek-V3's and GLM-4.5's layer after the last,
/// DeepSeek-V4's `mtp.0.*` over hyper-connection streams.
const FIXTURES: [&str; 4] = [
    "qwen3_next-fp32",
    "deepseek_v3-fp32",
    "glm4_moe-fp32",
    "deepseek_v4-fp32",
];

fn testdata(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(sub)
}

/// The fixture's checkpoint: its own under `testdata/mtp/`, or the model fixture when that
/// carries the MTP layer already (DeepSeek-V4's); its reference is always under `testdata/mtp/`.
fn dir(name: &str) -> PathBuf {
    let own = testdata("mtp").join(name);
    if own.join("config.json").exists() {
        own
    } else {
        testdata("models").join(name)
    }
}

fn reference(name: &str) -> PathBuf {
    testdata("mtp").join(name).join("mtp_reference.safetensors")
}

fn open_dir(path: PathBuf, isa: Isa, memory: Option<u64>, mtp: bool) -> Result<Model, ModelError> {
    let opts = ModelOptions {
        kernels: Kernels::new(isa).unwrap(),
        threads: 2,
        memory,
        mtp,
        ..Default::default()
    };
    Model::open(path, opts)
}

/// The model's final-normed hidden rows of the prompt (DeepSeek-V4: its streams), kept by its
/// state, and the MTP layer's
/// logits of every position — in one pass, and row by row as drafting runs it — against the
/// reference, on every ISA, resident and with the experts streamed; for DeepSeek-V3's kind
/// (and GLM-4.5's) also the rows a further step starts from (before the final norm).
#[test]
fn the_mtp_layers_match_their_references() {
    for name in FIXTURES {
        let r = Reference::open(&reference(name));
        let ids = r.ids("ids");
        let want_hidden = r.f32("hidden");
        let want = r.f32("logits");
        let want_out = r.has("out").then(|| r.f32("out"));
        let t = ids.len();
        // A budget that holds the trunk and the MTP layer but few experts.
        let small = {
            let m = open_dir(dir(name), Isa::Scalar, None, true).unwrap();
            m.plan().minimum + m.plan().expert_bytes * 2
        };
        for isa in Isa::available() {
            for memory in [None, Some(small)] {
                let model = open_dir(dir(name), isa, memory, true).unwrap();
                assert!(model.has_mtp(), "{name}");
                if memory.is_some() {
                    assert!(
                        !model.plan().all_experts_fit(),
                        "{name}: the experts stream"
                    );
                }
                check_against(&model, &ids, &want_hidden, &want, want_out.as_deref(), t)
                    .unwrap_or_else(|e| panic!("{name} {isa:?} {memory:?}: {e}"));
            }
        }
    }
}

fn check_against(
    model: &Model,
    ids: &[u32],
    want_hidden: &[f32],
    want: &[f32],
    want_out: Option<&[f32]>,
    t: usize,
) -> Result<(), String> {
    // Floats per row the MTP layer takes: the hidden width, or DeepSeek-V4's streams.
    let (h, v) = (model.config().mtp_row_width(), model.config().vocab);
    let mut st = model.new_state();
    st.keep_hidden(t);
    model.forward(&mut st, ids, Logits::Last).unwrap();
    let (first, hidden) = st.hidden_rows();
    assert_eq!(first, 0);
    let (worst, scale) = compare(hidden, want_hidden);
    if worst > 1e-4 * scale {
        return Err(format!("hidden {worst} of {scale}"));
    }

    // All positions in one pass: the last row's logits.
    let mut mst = model.new_mtp_state().unwrap();
    let (logits, y) = model
        .mtp_forward(&mut mst, 0, &hidden[..(t - 1) * h], &ids[1..])
        .unwrap();
    assert_eq!((logits.len(), y.len()), (v, (t - 1) * h));
    assert_eq!(mst.pos(), t - 1);
    let (worst, scale) = compare(&logits, &want[(t - 2) * v..]);
    if worst > 1e-4 * scale {
        return Err(format!("one pass: {worst} of {scale}"));
    }
    if let Some(want_out) = want_out {
        let (worst, scale) = compare(&y, want_out);
        if worst > 1e-4 * scale {
            return Err(format!("output rows: {worst} of {scale}"));
        }
    }

    // Row by row, as catching up and drafting do: every row's logits, the same bits as the
    // last row of the one pass.
    let mut step = model.new_mtp_state().unwrap();
    let mut last = Vec::new();
    for i in 0..t - 1 {
        let (l, _) = model
            .mtp_forward(
                &mut step,
                0,
                &hidden[i * h..(i + 1) * h],
                &ids[i + 1..i + 2],
            )
            .unwrap();
        let (worst, scale) = compare(&l, &want[i * v..(i + 1) * v]);
        if worst > 1e-4 * scale {
            return Err(format!("row {i}: {worst} of {scale}"));
        }
        last = l;
    }
    if last
        .iter()
        .map(|x| x.to_bits())
        .ne(logits.iter().map(|x| x.to_bits()))
    {
        return Err("rows one at a time changed bits".into());
    }
    // Cut back, the same row again gives the same bits.
    step.truncate(t - 2).unwrap();
    let (again, _) = model
        .mtp_forward(
            &mut step,
            0,
            &hidden[(t - 2) * h..(t - 1) * h],
            &ids[t - 1..],
        )
        .unwrap();
    if again != last {
        return Err("the row again after a truncation changed bits".into());
    }
    Ok(())
}

/// The MTP layer is loaded only when asked for, and its bytes are in the plan; a model
/// without one is refused with a message that says so.
#[test]
fn the_mtp_layer_is_planned_and_refused_where_absent() {
    for name in FIXTURES {
        let with = open_dir(dir(name), Isa::Scalar, None, true).unwrap();
        let without = open_dir(dir(name), Isa::Scalar, None, false).unwrap();
        assert!(!without.has_mtp() && without.new_mtp_state().is_none());
        assert_eq!(without.plan().mtp, 0);
        assert!(with.plan().mtp > 0, "{name}");
        assert_eq!(
            with.plan().trunk_pinned,
            without.plan().trunk_pinned + with.plan().mtp
        );
        assert!(with.plan().all_expert_bytes > without.plan().all_expert_bytes);
        let mut st = without.new_state();
        let e = without
            .mtp_forward(&mut st, 0, &[0.0; 64], &[1])
            .unwrap_err();
        assert!(e.to_string().contains("not loaded"), "{e}");

        // The same model without its MTP layer (DeepSeek-V4's model fixture carries it;
        // `mtp_layers.rs` reads it without).
        let plain = testdata("models").join(name);
        if plain == dir(name) {
            continue;
        }
        let opts = ModelOptions {
            mtp: true,
            ..Default::default()
        };
        let e = Model::open(plain, opts).unwrap_err().to_string();
        assert!(
            e.starts_with("draft mtp: ") && e.contains("no multi-token-prediction"),
            "{name}: {e}"
        );
    }
}

/// DeepSeek-V3's MTP layer carries copies of the model's embedding and head, and runs with
/// the model's own: a copy that differs in one byte is refused by name, with `--draft mtp`
/// only (the model itself is unaffected).
#[test]
fn an_mtp_copy_that_differs_from_the_model_is_refused() {
    for copy in [
        "model.layers.4.shared_head.head.weight",
        "model.layers.4.embed_tokens.weight",
    ] {
        let tmp = tempfile::tempdir().unwrap();
        for f in std::fs::read_dir(dir("deepseek_v3-fp32")).unwrap() {
            let f = f.unwrap();
            std::fs::copy(f.path(), tmp.path().join(f.file_name())).unwrap();
        }
        let file = tmp.path().join("model.safetensors");
        let (header, _) = sluice_format::safetensors::read_header(&file).unwrap();
        let t = header.tensors.iter().find(|t| t.name == copy).unwrap();
        let mut bytes = std::fs::read(&file).unwrap();
        // The last element's lowest mantissa bit.
        bytes[(t.offset + t.len - 4) as usize] ^= 1;
        let at = format!("at byte {}", t.len - 4);
        std::fs::write(&file, bytes).unwrap();

        assert!(open_dir(tmp.path().to_owned(), Isa::Scalar, None, false).is_ok());
        let e = open_dir(tmp.path().to_owned(), Isa::Scalar, None, true)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("draft mtp: ") && e.contains(copy) && e.contains(&at),
            "{e}"
        );
    }
}
