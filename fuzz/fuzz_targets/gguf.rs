//! The GGUF header parser on arbitrary bytes: it must return an error or a header that is
//! internally consistent — data section aligned and inside the file, every tensor range inside
//! the file, aligned, of the size its type and dims give, no two overlapping, names and keys
//! unique — never panic. The rows of every accepted tensor whose bytes are at hand are then
//! dequantized and dotted by the block-format kernels, which must not panic either.
#![no_main]

use std::collections::HashSet;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use sluice_format::gguf;
use sluice_kernels::gguf::{BlockFormat, dequantize_row, dot_row};

fuzz_target!(|data: &[u8]| {
    // The first byte, when odd, makes the parser believe the file is longer than the bytes
    // given (a header read from the front of a long file).
    let (len, bytes) = match data.split_first() {
        Some((&b, rest)) if b & 1 == 1 => (rest.len() as u64 + (b as u64) * 977, rest),
        Some((_, rest)) => (rest.len() as u64, rest),
        None => (0, data),
    };
    let Ok(h) = gguf::parse(bytes, len, Path::new("fuzz")) else {
        return;
    };
    assert!(h.version == 2 || h.version == 3);
    assert!(h.alignment.is_power_of_two());
    assert!(h.data_start <= len);
    // Aligned, except that a file without tensors may end before its padding.
    assert!(h.data_start % h.alignment == 0 || (h.tensors.is_empty() && h.data_start == len));
    assert_eq!(h.file_len, len);
    let mut keys = HashSet::new();
    for (k, _) in &h.metadata {
        assert!(keys.insert(k.as_str()), "key twice");
        assert!(h.value(k).is_some());
    }
    let mut names = HashSet::new();
    let mut ranges = Vec::new();
    for t in &h.tensors {
        assert!(names.insert(t.name.as_str()), "tensor twice");
        assert!(std::ptr::eq(h.tensor(&t.name).unwrap(), t));
        assert!(!t.dims.is_empty() && t.dims.len() <= gguf::MAX_DIMS as usize);
        let n = t.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).unwrap();
        assert_eq!(t.dims[0] % t.ty.block_size(), 0);
        assert_eq!(Some(t.len), t.ty.bytes_for(n));
        assert!(t.offset >= h.data_start);
        assert_eq!((t.offset - h.data_start) % h.alignment, 0);
        assert!(t.offset.checked_add(t.len).unwrap() <= len);
        if t.len > 0 {
            ranges.push((t.offset, t.offset + t.len));
        }
        // Decode the rows at hand (at most a few) with the kernels.
        let Some(f) = BlockFormat::from_ggml_id(t.ty.id()) else {
            continue;
        };
        let (cols, rb) = (t.row_len() as usize, t.row_bytes() as usize);
        if cols == 0 || cols > 1 << 16 {
            continue;
        }
        let mut out = vec![0f32; cols];
        let x = vec![1.0f32; cols];
        let start = t.offset as usize;
        for r in 0..4usize {
            let Some(row) = bytes.get(start + r * rb..start + (r + 1) * rb) else {
                break;
            };
            if (r as u64 + 1) * rb as u64 > t.len {
                break;
            }
            dequantize_row(f, row, &mut out).unwrap();
            let _ = dot_row(f, row, &x).unwrap();
        }
    }
    ranges.sort();
    for w in ranges.windows(2) {
        assert!(w[0].1 <= w[1].0, "overlap");
    }
});
