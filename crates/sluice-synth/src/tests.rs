//! Unit tests of the parent module.

use super::*;

#[test]
fn writes_a_checkpoint_as_specified() {
    let d = tempfile::tempdir().unwrap();
    let spec = SynthSpec {
        hidden: 64,
        experts: 8,
        top_k: 2,
        moe_inter: 32,
        vocab: 128,
        dense_inter: 64,
        ..Default::default()
    };
    spec.write(d.path()).unwrap();
    let ck = sluice_format::Checkpoint::open(d.path()).unwrap();
    assert_eq!(ck.shards().len(), 4);
    let total: u64 = ck.tensors().iter().map(|t| t.len).sum();
    assert_eq!(total, spec.bytes());
    // The pieces written in parallel are the serial stream of each tensor: check one
    // expert's first projection against a plain generator.
    let name = "model.layers.1.mlp.experts.3.up_proj.weight";
    let info = ck.tensor(name).unwrap();
    let shard = &ck.shards()[info.shard];
    let bytes = std::fs::read(&shard.path).unwrap();
    let got = &bytes[info.offset as usize..(info.offset + info.len) as usize];
    let a = (3.0f32 / spec.hidden as f32).sqrt();
    let mut rng = Rng(name_seed(spec.seed, name));
    let mut want = Vec::new();
    while want.len() < got.len() {
        let r = rng.next();
        for k in 0..4 {
            let v = ((r >> (16 * k)) & 0xffff) as f32 * (2.0 / 65536.0) - 1.0;
            want.extend_from_slice(&f32_to_bf16(v * a).to_le_bytes());
        }
    }
    assert_eq!(got, &want[..got.len()]);
    // Packed experts load and run as released INT4 and MXFP4 checkpoints do.
    let d0 = d.path();
    for format in [ExpertFormat::Int4, ExpertFormat::Mxfp4] {
        let d = tempfile::tempdir().unwrap();
        let q = SynthSpec {
            experts_format: format,
            ..spec.clone()
        };
        q.write(d.path()).unwrap();
        let ck = sluice_format::Checkpoint::open(d.path()).unwrap();
        let total: u64 = ck.tensors().iter().map(|t| t.len).sum();
        assert_eq!(total, q.bytes());
        // The routed experts shrink to ~0.53-0.56 of their BF16 bytes; the rest stays.
        let experts = |ck: &sluice_format::Checkpoint| -> u64 {
            ck.tensors()
                .iter()
                .filter(|t| t.name.contains("mlp.experts."))
                .map(|t| t.len)
                .sum()
        };
        let bf16 = sluice_format::Checkpoint::open(d0).unwrap();
        assert!(experts(&ck) * 10 < experts(&bf16) * 6, "{format:?}");
        assert_eq!(
            spec.bytes() - experts(&bf16),
            q.bytes() - experts(&ck),
            "{format:?}"
        );
    }
    // Deterministic: the same spec writes the same bytes.
    let d2 = tempfile::tempdir().unwrap();
    spec.write(d2.path()).unwrap();
    for s in ck.shards() {
        assert_eq!(
            std::fs::read(&s.path).unwrap(),
            std::fs::read(d2.path().join(&s.name)).unwrap()
        );
    }
}

#[test]
fn writes_a_deepseek_v4_shaped_checkpoint() {
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
    let ck = sluice_format::Checkpoint::open(d.path()).unwrap();
    let total: u64 = ck.tensors().iter().map(|t| t.len).sum();
    assert_eq!(total, spec.bytes());
    // DeepSeek's names, as released.
    for name in [
        "embed.weight",
        "head.weight",
        "hc_head_fn",
        "layers.0.attn.compressor.ape",
        "layers.3.attn.indexer.compressor.wkv.weight",
        "layers.0.ffn.gate.tid2eid",
        "layers.3.ffn.gate.bias",
        "layers.4.ffn.experts.7.w2.weight",
    ] {
        assert!(ck.get(name).is_some(), "{name}");
    }
    // Every hash row names distinct experts below the count.
    let t = ck.get("layers.2.ffn.gate.tid2eid").unwrap();
    let bytes = std::fs::read(&ck.shards()[t.shard].path).unwrap();
    let ids: Vec<i64> = bytes[t.offset as usize..(t.offset + t.len) as usize]
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    for row in ids.chunks_exact(2) {
        assert!(
            row[0] != row[1] && row.iter().all(|&e| (0..8).contains(&e)),
            "{row:?}"
        );
    }
}
