//! The checkpoint reader on the committed transformers fixtures, both shard layouts.

use std::path::{Path, PathBuf};

use sluice_format::{Checkpoint, Dtype};

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("config.json").exists())
        .collect();
    v.sort();
    assert!(v.len() >= 12, "fixtures missing under {}", root.display());
    v
}

#[test]
fn every_fixture_opens_and_reads() {
    for dir in fixtures() {
        let ck = Checkpoint::open(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        assert!(ck.config().get("model_type").is_some());
        // Qwen3.5's multimodal checkpoint keeps its text model under `model.language_model.`,
        // Llama 4's under `language_model.model.`; Mistral Large 4 uses Mistral's own names.
        let embed = ck
            .get("model.embed_tokens.weight")
            .or_else(|| ck.get("model.language_model.embed_tokens.weight"))
            .or_else(|| ck.get("language_model.model.embed_tokens.weight"))
            .or_else(|| ck.get("tok_embeddings.weight"))
            .unwrap_or_else(|| panic!("{}: no embeddings", dir.display()));
        assert_eq!(embed.shape.len(), 2);
        let bytes = ck.read(embed).unwrap();
        assert_eq!(bytes.len() as u64, embed.len);
        // Every tensor lies inside its shard and the header's dtype size matches its length.
        for t in ck.tensors() {
            let shard = &ck.shards()[t.shard];
            assert!(t.offset + t.len <= shard.len);
            assert_eq!(t.numel() as u64 * t.dtype.size() as u64, t.len);
        }
        let want = if dir.to_string_lossy().ends_with("bf16") {
            Dtype::BF16
        } else {
            Dtype::F32
        };
        assert_eq!(embed.dtype, want, "{}", dir.display());
    }
}

#[test]
fn release_layout_keeps_each_expert_adjacent() {
    let ck = Checkpoint::open(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models/deepseek_v3-fp32"),
    )
    .unwrap();
    assert!(ck.shards().len() > 1);
    let t = |n: &str| ck.tensor(n).unwrap().clone();
    let mut parts = [
        t("model.layers.1.mlp.experts.3.down_proj.weight"),
        t("model.layers.1.mlp.experts.3.gate_proj.weight"),
        t("model.layers.1.mlp.experts.3.up_proj.weight"),
    ];
    parts.sort_by_key(|p| p.offset);
    assert!(parts.iter().all(|p| p.shard == parts[0].shard));
    assert_eq!(parts[0].offset + parts[0].len, parts[1].offset);
    assert_eq!(parts[1].offset + parts[1].len, parts[2].offset);
}

#[test]
fn save_pretrained_layout_scatters_experts() {
    let ck = Checkpoint::open(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/models/qwen3_moe-bf16"),
    )
    .unwrap();
    let shards: std::collections::BTreeSet<usize> = ["down_proj", "gate_proj", "up_proj"]
        .iter()
        .map(|p| {
            ck.tensor(&format!("model.layers.0.mlp.experts.0.{p}.weight"))
                .unwrap()
                .shard
        })
        .collect();
    assert!(
        shards.len() > 1,
        "expected one expert's tensors in several shards"
    );
}
