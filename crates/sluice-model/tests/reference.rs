//! The forward pass against Hugging Face transformers on the committed fixtures: every `REF`
//! row of the fixture table (`common::fixture_table!`) — `testdata/models/*`, produced by
//! `tools/reference/make_fixtures.py`, `testdata/kimi/kimi_linear-*`, produced by
//! `tools/reference/make_kimi_fixtures.py`, and the quantized checkpoints under
//! `testdata/quant/`, produced by `tools/reference/make_quant_fixtures.py`.

use std::path::{Path, PathBuf};

#[macro_use]
mod common;
use common::{check_greedy, check_invariance, check_prompts};

/// A fixture directory, by its path under `testdata/`.
fn fixture(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(path)
}

/// One module of three tests per `REF` row of the fixture table.
macro_rules! arch_tests {
    ($($name:ident $path:literal [$($flag:ident)*],)*) => {
        $(
            if_in!(REF [$($flag)*] {
                mod $name {
                    #[test]
                    fn prompts() { super::check_prompts(&super::fixture($path), $path) }
                    #[test]
                    fn greedy() { super::check_greedy(&super::fixture($path), $path) }
                    #[test]
                    fn invariance() { super::check_invariance(&super::fixture($path), $path) }
                }
            });
        )*
    };
}

fixture_table!(arch_tests);
