//! Helpers shared by the reference tests: reading reference outputs and comparing logits.
//! (Each test binary uses a subset.)
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;

use sluice_format::Dtype;

/// Tensors of a reference file, by name.
pub struct Reference {
    tensors: HashMap<String, (Dtype, Vec<u8>)>,
}

impl Reference {
    pub fn open(path: &Path) -> Reference {
        let (header, _) = sluice_format::safetensors::read_header(path).unwrap();
        let bytes = std::fs::read(path).unwrap();
        let tensors = header
            .tensors
            .into_iter()
            .map(|t| {
                let data = bytes[t.offset as usize..(t.offset + t.len) as usize].to_vec();
                (t.name, (t.dtype, data))
            })
            .collect();
        Reference { tensors }
    }

    fn get(&self, name: &str) -> &(Dtype, Vec<u8>) {
        self.tensors
            .get(name)
            .unwrap_or_else(|| panic!("reference has no `{name}`"))
    }

    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn f32(&self, name: &str) -> Vec<f32> {
        let (d, b) = self.get(name);
        assert_eq!(*d, Dtype::F32, "{name}");
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// Token or expert ids, stored as I64 (transformers) or I32 (Moonshot's K3 references).
    pub fn ids(&self, name: &str) -> Vec<u32> {
        match self.get(name) {
            (Dtype::I64, b) => b
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
                .collect(),
            (Dtype::I32, b) => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32)
                .collect(),
            (d, _) => panic!("{name}: ids stored as {d:?}"),
        }
    }
}

/// The first index of the largest value.
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// Worst |a − b| and the reference's max |b|.
pub fn compare(got: &[f32], want: &[f32]) -> (f32, f32) {
    assert_eq!(got.len(), want.len());
    let mut worst = 0f32;
    let mut scale = 0f32;
    for (&g, &w) in got.iter().zip(want) {
        assert!(g.is_finite(), "non-finite value");
        worst = worst.max((g - w).abs());
        scale = scale.max(w.abs());
    }
    (worst, scale)
}

/// The routed experts and their weights of every MoE layer of `routes` (one forward pass over
/// the `t` tokens of prompt `t`) against the reference's `prompt{t}.layer{l}.*`; a MoE layer
/// the reference lacks is an error. Returns how many (layer, token) routes were compared.
pub fn check_routes(
    name: &str,
    t: usize,
    r: &Reference,
    cfg: &sluice_model::ModelConfig,
    routes: &[sluice_model::Route],
) -> usize {
    let mut checked = 0;
    for l in 0..cfg.layers {
        let key = format!("prompt{t}.layer{l}.experts");
        if !r.has(&key) {
            assert!(
                !cfg.is_moe(l),
                "{name}: reference lacks routes of MoE layer {l}"
            );
            continue;
        }
        let want = r.ids(&key);
        let want_w = r.f32(&format!("prompt{t}.layer{l}.weights"));
        let k = want.len() / t;
        for (i, route) in routes.iter().filter(|x| x.layer == l).enumerate() {
            assert_eq!(
                route.experts,
                want[i * k..(i + 1) * k],
                "{name} prompt{t} layer {l} token {i}"
            );
            for (g, w) in route.weights.iter().zip(&want_w[i * k..(i + 1) * k]) {
                assert!(
                    (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "{name} layer {l} token {i}: weight {g} vs {w}"
                );
            }
            checked += 1;
        }
    }
    checked
}
