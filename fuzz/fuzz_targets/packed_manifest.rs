//! The packed-trunk manifest parser (`Manifest::parse`): an error, or a manifest whose every
//! run is aligned, inside the file and after the one before, and whose tensors lie back to back
//! inside their run with the size their dtype and shape say — checked here again in 128-bit
//! arithmetic — and which survives a serialise/parse round trip. Never a panic.
//!
//! Input: the first byte chooses the form. Even: the rest is the manifest's bytes as they are
//! (seeded with real manifests). Odd: the rest drives `arbitrary` to build a manifest whose
//! offsets and lengths are by default derived consistently from the shapes, each one
//! replaceable by an arbitrary value — so most inputs get past the JSON and into the checks.
#![no_main]

use std::path::Path;

use libfuzzer_sys::arbitrary::{self, Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::json;
use sluice_format::Dtype;
use sluice_format::packed::{ALIGN, Manifest};

const DTYPES: [&str; 8] = ["F32", "BF16", "F16", "F8_E4M3", "U8", "I32", "I64", "BOOL"];

/// A number: derived from what comes before, or given.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Num {
    Auto,
    Plus(u16),
    Given(u64),
}

impl Num {
    fn or(self, auto: u64) -> u64 {
        match self {
            Num::Auto => auto,
            Num::Plus(d) => auto.wrapping_add(u64::from(d)),
            Num::Given(v) => v,
        }
    }
}

#[derive(Arbitrary, Debug)]
struct T {
    name: String,
    dtype: u8,
    odd_dtype: Option<String>,
    shape: Vec<u64>,
    offset: Num,
    len: Num,
}

#[derive(Arbitrary, Debug)]
struct P {
    name: String,
    gap_pages: u8,
    offset: Num,
    len: Num,
    xxh3: Option<String>,
    tensors: Vec<T>,
}

#[derive(Arbitrary, Debug)]
struct M {
    format: Option<String>,
    version: Option<u32>,
    source_shards: Vec<(String, u64)>,
    file: Option<String>,
    file_len: Num,
    parts: Vec<P>,
}

fn build(m: &M) -> serde_json::Value {
    let mut end = 0u64;
    let mut parts = Vec::new();
    for p in &m.parts {
        let start = end
            .div_ceil(ALIGN)
            .wrapping_add(u64::from(p.gap_pages))
            .wrapping_mul(ALIGN);
        let offset = p.offset.or(start);
        let mut at = offset;
        let mut tensors = Vec::new();
        for t in &p.tensors {
            let dtype = t
                .odd_dtype
                .clone()
                .unwrap_or_else(|| DTYPES[t.dtype as usize % DTYPES.len()].to_owned());
            let size = Dtype::from_safetensors(&dtype).map_or(1, |d| d.size() as u64);
            let numel = t.shape.iter().fold(1u64, |a, &d| a.wrapping_mul(d));
            let len = t.len.or(numel.wrapping_mul(size));
            let off = t.offset.or(at);
            tensors.push(json!({
                "name": t.name, "dtype": dtype, "shape": t.shape, "offset": off, "len": len,
            }));
            at = off.wrapping_add(len);
        }
        let len = p.len.or(at.wrapping_sub(offset));
        parts.push(json!({
            "name": p.name, "offset": offset, "len": len,
            "xxh3": p.xxh3.clone().unwrap_or_else(|| "0123456789abcdef".into()),
            "tensors": tensors,
        }));
        end = offset.wrapping_add(len);
    }
    json!({
        "format": m.format.clone().unwrap_or_else(|| sluice_format::packed::FORMAT.into()),
        "version": m.version.unwrap_or(sluice_format::packed::VERSION),
        "source": "/models/src",
        "source_shards": m.source_shards.iter().map(|(n, l)| json!({"name": n, "len": l})).collect::<Vec<_>>(),
        "file": m.file.clone().unwrap_or_else(|| sluice_format::packed::TRUNK_FILE.into()),
        "file_len": m.file_len.or(end),
        "parts": parts,
    })
}

fn check(bytes: &[u8]) {
    let path = Path::new("sluice-trunk.json");
    let Ok(m) = Manifest::parse(bytes, path) else {
        return;
    };
    let mut end = 0u128;
    for p in &m.parts {
        let (off, len) = (u128::from(p.offset), u128::from(p.len));
        assert!(
            off % u128::from(ALIGN) == 0 && off >= end,
            "part `{}`",
            p.name
        );
        assert!(
            off + len <= u128::from(m.file_len),
            "part `{}` past the file",
            p.name
        );
        let mut at = off;
        for t in &p.tensors {
            let size = Dtype::from_safetensors(&t.dtype)
                .expect("known dtype")
                .size() as u128;
            let bytes = t
                .shape
                .iter()
                .try_fold(size, |a, &d| a.checked_mul(d as u128));
            assert_eq!(bytes, Some(u128::from(t.len)), "tensor `{}` size", t.name);
            assert_eq!(u128::from(t.offset), at, "tensor `{}` offset", t.name);
            at += u128::from(t.len);
            assert!(at <= off + len, "tensor `{}` past its run", t.name);
        }
        assert_eq!(at, off + len, "part `{}` not covered", p.name);
        end = off + len;
    }
    let again = Manifest::parse(&serde_json::to_vec(&m).expect("serialises"), path)
        .expect("a manifest parses again after a round trip");
    assert_eq!(again, m);
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        check(rest);
    } else if let Ok(m) = M::arbitrary_take_rest(Unstructured::new(rest)) {
        let v = build(&m);
        check(&serde_json::to_vec(&v).expect("serialises"));
    }
});
