//! Unit tests of the parent module.

use super::*;

#[test]
fn byte_table_is_gpt2s() {
    let c = byte_chars();
    assert_eq!(c[b' ' as usize], 'Ġ');
    assert_eq!(c[b'\n' as usize], 'Ċ');
    assert_eq!(c[b'a' as usize], 'a');
    assert_eq!(c.iter().collect::<HashSet<_>>().len(), 256);
}

#[test]
fn every_pre_tokenizer_compiles() {
    for name in PRE_TOKENIZERS {
        let pre = pre_tokenizer(name).unwrap_or_else(|| panic!("{name}"));
        byte_level_pre(Path::new("t"), pre).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    assert!(pre_tokenizer("no-such-pre").is_none());
}
