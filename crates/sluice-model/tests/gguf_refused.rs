//! GGUF models sluice cannot run are refused with one line naming the file and the key or
//! tensor, and never half-loaded: each case below is a small valid GGUF (written here) with one
//! thing changed. The models it does run are checked against transformers in
//! `tests/gguf_models.rs`.

use std::path::Path;

use sluice_model::Description;

/// A metadata value.
enum V {
    U32(u32),
    F32(f32),
    Str(&'static str),
}

/// A tiny Llama GGUF writer: metadata, then F32 tensors (dims innermost first) of zeros.
struct G {
    kv: Vec<(String, V)>,
    tensors: Vec<(String, Vec<u64>, u32)>,
}

impl G {
    /// A 2-layer dense Llama: hidden 32, 2 heads of 16, FFN 64, vocab 64, tied embeddings.
    fn llama() -> G {
        let kv = vec![
            ("general.architecture".into(), V::Str("llama")),
            ("llama.block_count".into(), V::U32(2)),
            ("llama.context_length".into(), V::U32(128)),
            ("llama.embedding_length".into(), V::U32(32)),
            ("llama.feed_forward_length".into(), V::U32(64)),
            ("llama.attention.head_count".into(), V::U32(2)),
            ("llama.attention.head_count_kv".into(), V::U32(2)),
            ("llama.rope.freq_base".into(), V::F32(10000.0)),
            (
                "llama.attention.layer_norm_rms_epsilon".into(),
                V::F32(1e-5),
            ),
        ];
        let mut tensors = vec![
            ("token_embd.weight".to_string(), vec![32, 64], 0),
            ("output_norm.weight".to_string(), vec![32], 0),
        ];
        for l in 0..2 {
            for (n, dims) in [
                ("attn_norm", vec![32]),
                ("attn_q", vec![32, 32]),
                ("attn_k", vec![32, 32]),
                ("attn_v", vec![32, 32]),
                ("attn_output", vec![32, 32]),
                ("ffn_norm", vec![32]),
                ("ffn_gate", vec![32, 64]),
                ("ffn_up", vec![32, 64]),
                ("ffn_down", vec![64, 32]),
            ] {
                tensors.push((format!("blk.{l}.{n}.weight"), dims, 0));
            }
        }
        G { kv, tensors }
    }

    fn set(mut self, key: &str, v: V) -> G {
        self.kv.retain(|(k, _)| k != key);
        self.kv.push((key.into(), v));
        self
    }

    fn without_key(mut self, key: &str) -> G {
        self.kv.retain(|(k, _)| k != key);
        self
    }

    fn tensor(mut self, name: &str, dims: &[u64], ty: u32) -> G {
        self.tensors.retain(|(n, _, _)| n != name);
        self.tensors.push((name.into(), dims.to_vec(), ty));
        self
    }

    fn without_tensor(mut self, name: &str) -> G {
        self.tensors.retain(|(n, _, _)| n != name);
        self
    }

    fn bytes(&self) -> Vec<u8> {
        fn s(o: &mut Vec<u8>, v: &str) {
            o.extend((v.len() as u64).to_le_bytes());
            o.extend(v.as_bytes());
        }
        let mut o = b"GGUF".to_vec();
        o.extend(3u32.to_le_bytes());
        o.extend((self.tensors.len() as u64).to_le_bytes());
        o.extend((self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            s(&mut o, k);
            match v {
                V::U32(x) => {
                    o.extend(4u32.to_le_bytes());
                    o.extend(x.to_le_bytes());
                }
                V::F32(x) => {
                    o.extend(6u32.to_le_bytes());
                    o.extend(x.to_le_bytes());
                }
                V::Str(x) => {
                    o.extend(8u32.to_le_bytes());
                    s(&mut o, x);
                }
            }
        }
        // ggml sizes: F32 4 bytes per element, Q8_0 34 per 32, Q8_1 40 per 32.
        let size = |dims: &[u64], ty: u32| {
            let n: u64 = dims.iter().product();
            match ty {
                8 => n / 32 * 34,
                9 => n / 32 * 40,
                _ => n * 4,
            }
        };
        let mut off = 0u64;
        for (n, dims, ty) in &self.tensors {
            s(&mut o, n);
            o.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                o.extend(d.to_le_bytes());
            }
            o.extend(ty.to_le_bytes());
            o.extend(off.to_le_bytes());
            off += size(dims, *ty).div_ceil(32) * 32;
        }
        while !o.len().is_multiple_of(32) {
            o.push(0);
        }
        o.resize(o.len() + off as usize, 0);
        o
    }
}

fn open(g: &G) -> Result<Description, String> {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.gguf");
    std::fs::write(&p, g.bytes()).unwrap();
    Description::open(&p).map_err(|e| e.to_string())
}

/// The error of `g`, checked to be one line naming the file.
fn refused(g: &G) -> String {
    let e = open(g).expect_err("the model was accepted");
    assert!(!e.contains('\n'), "not one line: {e}");
    assert!(e.contains("m.gguf"), "the file is not named: {e}");
    e
}

#[test]
fn the_writer_makes_a_model_sluice_opens() {
    // Without this, every refusal below could be the writer's fault.
    let d = open(&G::llama()).unwrap();
    assert_eq!(d.config.model_type, "llama");
    assert_eq!(
        (d.config.layers, d.config.hidden, d.config.vocab),
        (2, 32, 64)
    );
    assert!(d.config.tie_embeddings, "no output.weight: tied");
    // A directory holding the file opens too.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("x.gguf"), G::llama().bytes()).unwrap();
    assert!(Description::open(dir.path()).is_ok());
    // Two models in one directory are refused, naming both.
    std::fs::write(dir.path().join("y.gguf"), G::llama().bytes()).unwrap();
    let e = Description::open(dir.path()).unwrap_err().to_string();
    assert!(e.contains("x.gguf") && e.contains("y.gguf"), "{e}");
}

#[test]
fn the_sampling_keys_become_the_generation_config() {
    assert!(open(&G::llama()).unwrap().generation_config().is_none());
    let g = G::llama()
        .set("general.sampling.temp", V::F32(0.5))
        .set("general.sampling.top_k", V::U32(40))
        .set("general.sampling.penalty_repeat", V::F32(1.25));
    let d = open(&g).unwrap();
    let gc = d.generation_config().unwrap();
    assert_eq!(gc["do_sample"], true, "{gc}");
    assert_eq!(gc["temperature"], 0.5, "{gc}");
    assert_eq!(gc["top_k"], 40, "{gc}");
    assert_eq!(gc["repetition_penalty"], 1.25, "{gc}");
    // A temperature of 0 is greedy decoding.
    let d = open(&G::llama().set("general.sampling.temp", V::F32(0.0))).unwrap();
    assert_eq!(d.generation_config().unwrap()["do_sample"], false);
    let e = refused(&G::llama().set("general.sampling.top_p", V::F32(-1.0)));
    assert!(e.contains("general.sampling.top_p"), "{e}");
    let e = refused(&G::llama().set("general.sampling.top_k", V::Str("many")));
    assert!(e.contains("general.sampling.top_k"), "{e}");
}

#[test]
fn an_unknown_architecture_is_refused_naming_it() {
    let e = refused(&G::llama().set("general.architecture", V::Str("rwkv7")));
    assert!(
        e.contains("general.architecture") && e.contains("rwkv7"),
        "{e}"
    );
    assert!(e.contains("qwen3moe"), "the supported ones are listed: {e}");
}

#[test]
fn a_missing_or_mistyped_key_is_named() {
    let e = refused(&G::llama().without_key("llama.embedding_length"));
    assert!(
        e.contains("llama.embedding_length") && e.contains("missing"),
        "{e}"
    );
    let e = refused(&G::llama().set("llama.block_count", V::Str("two")));
    assert!(e.contains("llama.block_count"), "{e}");
    let e = refused(&G::llama().set("llama.attention.head_count", V::U32(0)));
    assert!(
        e.contains("llama.attention.head_count") && e.contains("positive"),
        "{e}"
    );
}

#[test]
fn a_tensor_nothing_reads_is_refused_naming_it() {
    let e = refused(&G::llama().tensor("blk.0.attn_rot_embd.weight", &[32], 0));
    assert!(e.contains("blk.0.attn_rot_embd.weight"), "{e}");
    // Frequency factors that are not Llama 3's rope scaling (here all zero), or of the wrong
    // length, are refused rather than guessed at.
    let e = refused(&G::llama().tensor("rope_freqs.weight", &[8], 0));
    assert!(
        e.contains("rope_freqs.weight") && e.contains("Llama 3"),
        "{e}"
    );
    let e = refused(&G::llama().tensor("rope_freqs.weight", &[4], 0));
    assert!(e.contains("rope_freqs.weight") && e.contains("[8]"), "{e}");
}

#[test]
fn a_missing_or_misshapen_weight_is_named_by_its_role() {
    let e = refused(&G::llama().without_tensor("blk.1.ffn_up.weight"));
    assert!(e.contains("model.layers.1.mlp.up_proj.weight"), "{e}");
    // A stored tensor is named as the file names it.
    let e = refused(&G::llama().tensor("blk.0.attn_v.weight", &[32, 16], 0));
    assert!(
        e.contains("`blk.0.attn_v.weight`") && e.contains("[32, 32]"),
        "{e}"
    );
}

#[test]
fn a_type_the_kernels_do_not_decode_is_refused() {
    // Q8_1 (id 9) is a valid ggml type that gguf-py does not dequantize.
    let e = refused(&G::llama().tensor("blk.0.attn_q.weight", &[32, 32], 9));
    assert!(e.contains("Q8_1") && e.contains("not supported"), "{e}");
    // A block type is accepted where the F32 was.
    assert!(open(&G::llama().tensor("blk.0.attn_q.weight", &[32, 32], 8)).is_ok());
}

#[test]
fn query_biases_are_read_and_checked() {
    // Biases are read in Hugging Face's order like their rows (`tests/gguf_models.rs`
    // checks the values); one of the wrong length is named.
    let mut g = G::llama();
    for l in 0..2 {
        for p in ["attn_q", "attn_k", "attn_v", "attn_output"] {
            g = g.tensor(&format!("blk.{l}.{p}.bias"), &[32], 0);
        }
    }
    let d = open(&g).unwrap();
    assert_eq!(d.config.layers, 2);
    let e = refused(&g.tensor("blk.0.attn_q.bias", &[24], 0));
    assert!(e.contains("blk.0.attn_q.bias"), "{e}");
}

#[test]
fn a_truncated_file_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("m.gguf");
    let b = G::llama().bytes();
    std::fs::write(&p, &b[..b.len() - 100]).unwrap();
    let e = Description::open(Path::new(&p)).unwrap_err().to_string();
    assert!(e.contains("m.gguf") && !e.contains('\n'), "{e}");
}
