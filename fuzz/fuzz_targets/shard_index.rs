//! The shard index parser (`model.safetensors.index.json`) on arbitrary bytes: an error, or an
//! index whose shard list is sorted, unique, non-empty, made of plain file names that stay
//! inside the model directory, and exactly the shards the weight map names — never a panic.
#![no_main]

use std::path::{Component, Path};

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(ix) = sluice_format::parse_index(data, Path::new("fuzz")) else {
        return;
    };
    assert!(!ix.shards.is_empty());
    assert!(
        ix.shards.windows(2).all(|w| w[0] < w[1]),
        "not sorted/unique"
    );
    for s in &ix.shards {
        let comps: Vec<Component<'_>> = Path::new(s).components().collect();
        assert_eq!(
            comps,
            [Component::Normal(s.as_ref())],
            "`{s}` is not a plain file name"
        );
        assert!(!s.contains('\0'));
        assert!(
            ix.weight_map.values().any(|v| v == s),
            "`{s}` names no tensor"
        );
    }
    for v in ix.weight_map.values() {
        assert!(
            ix.shards.binary_search(v).is_ok(),
            "`{v}` is not in the shard list"
        );
    }
});
