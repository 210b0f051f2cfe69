//! The safetensors header parser on arbitrary bytes: it must return an error or a header whose
//! every range lies inside the file and no two ranges overlap — never panic.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first 8 bytes, when present, choose the file length the parser is told about, so that
    // headers are tested against files both longer and shorter than the bytes given.
    let (len, bytes) = match data.split_first() {
        Some((&b, rest)) if b & 1 == 1 => (rest.len() as u64 + (b as u64) * 977, rest),
        Some((_, rest)) => (rest.len() as u64, rest),
        None => (0, data),
    };
    if let Ok(h) = sluice_format::safetensors::parse_header(bytes, len, Path::new("fuzz")) {
        let mut prev_end = 0u64;
        for t in &h.tensors {
            assert!(t.offset >= h.data_start);
            assert!(t.offset + t.len <= len);
            if t.len > 0 {
                assert!(t.offset >= prev_end, "overlap");
                prev_end = t.offset + t.len;
            }
        }
    }
});
