//! The byte-level `tokenizer.json` shipped in `assets/`: one token per UTF-8 byte, token id =
//! byte value, loadable by the Hugging Face `tokenizers` crate (0.23) and Python package.
//!
//! It is a BPE model without merges behind a `ByteLevel` pre-tokenizer, so every byte maps to
//! its GPT-2 byte-level character and then to one token. No added tokens: ChatML markers are
//! plain bytes, exactly as the built-in tokenizer treats them.

/// The GPT-2 byte-to-character table used by byte-level tokenizers.
fn byte_char(byte: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(byte) {
        return char::from(byte);
    }
    let offset = (0..byte).filter(|b| !printable(*b)).count();
    char::from_u32(256 + offset as u32).unwrap_or('\u{FFFD}')
}

/// The JSON text of the shipped byte-level tokenizer (what `assets/tokenizer.json` holds).
pub fn byte_level_tokenizer_json() -> String {
    let vocab: serde_json::Map<String, serde_json::Value> =
        (0..=255u8).map(|b| (byte_char(b).to_string(), serde_json::Value::from(b))).collect();
    let byte_level = serde_json::json!({
        "type": "ByteLevel",
        "add_prefix_space": false,
        "trim_offsets": false,
        "use_regex": false
    });
    let tokenizer = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": null,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": []
        }
    });
    let mut text = serde_json::to_string_pretty(&tokenizer).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::byte_char;

    #[test]
    fn byte_chars_are_distinct_and_match_gpt2() {
        let chars: std::collections::HashSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(chars.len(), 256);
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(byte_char(b'\n'), 'Ċ');
        assert_eq!(byte_char(b'a'), 'a');
    }
}
