//! The tokenizer written beside a synthetic model.

use serde_json::{Value, json};

/// A byte-level BPE tokenizer for synthetic models: `<s>` (0), `</s>` (1), the 256 bytes, and a
/// few merges. Enough for text prompts and for converters that insist on a tokenizer.
pub(crate) fn tokenizer_json() -> Value {
    // GPT-2's byte-to-character map.
    let mut printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut extra = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + extra);
            extra += 1;
        }
    }
    let mut byte_char = vec![' '; 256];
    for (&b, &c) in printable.iter().zip(&chars) {
        byte_char[b as usize] = char::from_u32(c).unwrap_or('?');
    }
    let mut vocab = serde_json::Map::new();
    vocab.insert("<s>".into(), json!(0));
    vocab.insert("</s>".into(), json!(1));
    for (b, c) in byte_char.iter().enumerate() {
        vocab.insert(c.to_string(), json!(b + 2));
    }
    let mut merges = Vec::new();
    let mut next = 258;
    for pair in ["Ġ t", "h e", "Ġ a", "i n", "t h", "e r", "o n", "r e"] {
        let merged: String = pair.split(' ').collect();
        if !vocab.contains_key(&merged) {
            vocab.insert(merged, json!(next));
            next += 1;
        }
        merges.push(json!(pair));
    }
    let special = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(0, "<s>"), special(1, "</s>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": merges}
    })
}
