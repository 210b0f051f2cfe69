//! Synthetic checkpoints (`sluice-synth`) load and run: BF16, INT4 and MXFP4 experts, and the
//! DeepSeek-V4 shape with its layer kinds and hash-routed layers.

use sluice_model::{Logits, Model, ModelOptions};
use sluice_synth::{ExpertFormat, SynthArch, SynthSpec};

fn runs(dir: &std::path::Path, prompt: &[u32]) -> Model {
    let m = Model::open(dir, ModelOptions::default()).unwrap();
    let mut st = m.new_state();
    let l = m.forward(&mut st, prompt, Logits::Last).unwrap();
    assert!(!l.is_empty() && l.iter().all(|x| x.is_finite()), "{dir:?}");
    m
}

#[test]
fn deepseek_v3_shaped_checkpoints_load_and_run_in_every_expert_format() {
    for format in [ExpertFormat::Bf16, ExpertFormat::Int4, ExpertFormat::Mxfp4] {
        let d = tempfile::tempdir().unwrap();
        let spec = SynthSpec {
            hidden: 64,
            experts: 8,
            top_k: 2,
            moe_inter: 32,
            vocab: 128,
            dense_inter: 64,
            experts_format: format,
            ..Default::default()
        };
        spec.write(d.path()).unwrap();
        let m = runs(d.path(), &[1, 2, 3]);
        assert_eq!(m.config().family, "deepseek_v3", "{format:?}");
    }
}

#[test]
fn a_deepseek_v4_shaped_checkpoint_loads_with_its_layer_kinds_and_runs() {
    let d = tempfile::tempdir().unwrap();
    let spec = SynthSpec {
        hidden: 64,
        layers: 5,
        experts: 8,
        top_k: 2,
        moe_inter: 32,
        vocab: 300,
        heads: 4,
        q_lora: 32,
        kv_lora: 16,
        nope: 24,
        rope: 8,
        arch: SynthArch::DeepseekV4,
        ..Default::default()
    };
    spec.write(d.path()).unwrap();
    let prompt: Vec<u32> = (0..40).map(|i| (i * 7 % 300) as u32).collect();
    let m = runs(d.path(), &prompt);
    let cfg = m.config();
    assert_eq!(cfg.family, "deepseek_v4");
    let kinds: Vec<&str> = cfg.layer_plan.iter().map(|p| p.attention.kind()).collect();
    assert_eq!(kinds, ["hca", "hca", "hca", "csa", "hca"]);
    assert_eq!(
        cfg.layer_plan
            .iter()
            .map(|p| p.hash_routed)
            .collect::<Vec<_>>(),
        [true, true, true, false, false]
    );
}
