//! The multi-token-prediction layer against its reference (`testdata/mtp/qwen3_next-fp32`,
//! made by `tools/reference/make_mtp_fixtures.py` from transformers' decoder layer, the way
//! vLLM runs Qwen3-Next's MTP layer).

use std::path::{Path, PathBuf};

mod common;
use common::{Reference, compare};
use sluice_kernels::{Isa, Kernels};
use sluice_model::{Logits, Model, ModelError, ModelOptions};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/mtp/qwen3_next-fp32")
}

fn open(isa: Isa, memory: Option<u64>, mtp: bool) -> Result<Model, ModelError> {
    let opts = ModelOptions {
        kernels: Kernels::new(isa).unwrap(),
        threads: 2,
        memory,
        mtp,
        ..Default::default()
    };
    Model::open(fixture(), opts)
}

/// The model's final-normed hidden rows of the prompt, kept by its state, and the MTP layer's
/// logits of every position — in one pass, and row by row as drafting runs it — against the
/// reference, on every ISA, resident and with the experts streamed.
#[test]
fn the_mtp_layer_matches_its_reference() {
    let r = Reference::open(&fixture().join("mtp_reference.safetensors"));
    let ids = r.ids("ids");
    let want_hidden = r.f32("hidden");
    let want = r.f32("logits");
    let t = ids.len();
    for isa in Isa::available() {
        // Resident, and a budget that holds the trunk but few experts.
        for memory in [None, Some(3 << 20)] {
            let model = open(isa, memory, true).unwrap();
            assert!(model.has_mtp());
            let (h, v) = (model.config().hidden, model.config().vocab);
            let mut st = model.new_state();
            st.keep_hidden(t);
            model.forward(&mut st, &ids, Logits::Last).unwrap();
            let (first, hidden) = st.hidden_rows();
            assert_eq!(first, 0);
            let (worst, scale) = compare(hidden, &want_hidden);
            assert!(worst <= 1e-4 * scale, "{isa:?}: hidden {worst} of {scale}");

            // All positions in one pass: the last row's logits.
            let mut mst = model.new_mtp_state().unwrap();
            let (logits, y) = model
                .mtp_forward(&mut mst, 0, &hidden[..(t - 1) * h], &ids[1..])
                .unwrap();
            assert_eq!((logits.len(), y.len()), (v, (t - 1) * h));
            assert_eq!(mst.pos(), t - 1);
            let (worst, scale) = compare(&logits, &want[(t - 2) * v..]);
            assert!(
                worst <= 1e-4 * scale,
                "{isa:?} {memory:?}: {worst} of {scale}"
            );

            // Row by row, as catching up and drafting do: every row's logits, the same bits
            // as the last row of the one pass.
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
                assert!(worst <= 1e-4 * scale, "{isa:?} row {i}: {worst} of {scale}");
                last = l;
            }
            assert_eq!(
                last.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                logits.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{isa:?}: rows one at a time change no bit"
            );
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
            assert_eq!(again, last);
        }
    }
}

/// The MTP layer is loaded only when asked for, and its bytes are in the plan; a model
/// without one is refused with a message that says so.
#[test]
fn the_mtp_layer_is_planned_and_refused_where_absent() {
    let with = open(Isa::Scalar, None, true).unwrap();
    let without = open(Isa::Scalar, None, false).unwrap();
    assert!(!without.has_mtp() && without.new_mtp_state().is_none());
    assert_eq!(without.plan().mtp, 0);
    assert!(with.plan().mtp > 0);
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

    let plain = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models/qwen3_next-fp32");
    let opts = ModelOptions {
        mtp: true,
        ..Default::default()
    };
    let e = Model::open(plain, opts).unwrap_err().to_string();
    assert!(
        e.starts_with("draft mtp: ") && e.contains("no multi-token-prediction"),
        "{e}"
    );
}
