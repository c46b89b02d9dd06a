//! Paths of the files shipped in `crates/router-sim/assets/`, so a router configured for the
//! simulated fleet can load the very tokenizer and chat template the engines use: the byte-level
//! tokenizer of tests and benchmarks (one token per byte, so lengths are exact by
//! construction), and in [`gpt2`] GPT-2's byte-level BPE, a realistic vocabulary for the demo
//! and the benchmark clients pointed at it.

use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets")
}

/// The byte-level `tokenizer.json` (one token per UTF-8 byte, id = byte value).
pub fn tokenizer_path() -> PathBuf {
    dir().join("tokenizer.json")
}

/// The `tokenizer_config.json` beside it, holding the ChatML `chat_template`.
pub fn tokenizer_config_path() -> PathBuf {
    dir().join("tokenizer_config.json")
}

/// The byte-level `tokenizer.json`, inside the binary.
pub const TOKENIZER_JSON: &str = include_str!("../assets/tokenizer.json");

/// The `tokenizer_config.json` beside it, inside the binary.
pub const TOKENIZER_CONFIG_JSON: &str = include_str!("../assets/tokenizer_config.json");

/// Writes [`TOKENIZER_JSON`] and [`TOKENIZER_CONFIG_JSON`] into `dir` (created if missing),
/// each through a file of its own renamed into place, so that a reader never sees half of one;
/// the path of the `tokenizer.json` written. A binary that left its source tree still has them.
pub fn write_to(dir: &std::path::Path) -> std::io::Result<PathBuf> {
    write_pair(dir, TOKENIZER_JSON, TOKENIZER_CONFIG_JSON)
}

fn write_pair(dir: &std::path::Path, tokenizer: &str, config: &str) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    for (name, text) in [("tokenizer.json", tokenizer), ("tokenizer_config.json", config)] {
        let partial = dir.join(format!(".{name}.{}", std::process::id()));
        std::fs::write(&partial, text)?;
        std::fs::rename(&partial, dir.join(name))?;
    }
    Ok(dir.join("tokenizer.json"))
}

/// The chat template text of [`tokenizer_config_path`], for routers that take a template
/// string or file rather than a `tokenizer_config.json`.
pub const CHAT_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] \
+ '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}\
{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// GPT-2's byte-level BPE (its 50256 ranks from `openai-whisper`'s `gpt2.tiktoken`, built as
/// transformers converts tiktoken vocabularies by `tests/vllm/convert_tiktoken.py`, which
/// builds the vLLM test models' tokenizers from the same ranks) with `<|endoftext|>` and the
/// ChatML markers of [`CHAT_TEMPLATE`] as special tokens 50256 to 50258, and the same template.
pub mod gpt2 {
    use std::path::PathBuf;

    /// Its `tokenizer.json`.
    pub fn tokenizer_path() -> PathBuf {
        super::dir().join("gpt2").join("tokenizer.json")
    }

    /// Its `tokenizer.json`, inside the binary.
    pub const TOKENIZER_JSON: &str = include_str!("../assets/gpt2/tokenizer.json");

    /// Its `tokenizer_config.json` (the ChatML template), inside the binary.
    pub const TOKENIZER_CONFIG_JSON: &str = include_str!("../assets/gpt2/tokenizer_config.json");

    /// Writes both into `dir` as [`super::write_to`] does; the path of the `tokenizer.json`.
    pub fn write_to(dir: &std::path::Path) -> std::io::Result<PathBuf> {
        super::write_pair(dir, TOKENIZER_JSON, TOKENIZER_CONFIG_JSON)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_embedded_files_are_the_assets_and_write_out_whole() {
        let tokenizer = std::fs::read_to_string(super::tokenizer_path()).expect("asset");
        assert_eq!(tokenizer, super::TOKENIZER_JSON);
        let dir = std::env::temp_dir().join(format!("router-sim-assets-{}", std::process::id()));
        let written = super::write_to(&dir).expect("written");
        assert_eq!(std::fs::read_to_string(&written).expect("read"), super::TOKENIZER_JSON);
        let config = std::fs::read_to_string(dir.join("tokenizer_config.json")).expect("read");
        assert_eq!(config, super::TOKENIZER_CONFIG_JSON);
        std::fs::remove_dir_all(dir).expect("cleaned");
    }

    #[test]
    fn the_gpt2_tokenizer_encodes_as_gpt2_does() {
        let tokenizer =
            <tokenizers::Tokenizer as std::str::FromStr>::from_str(super::gpt2::TOKENIZER_JSON)
                .expect("loads");
        let ids = |text: &str| tokenizer.encode(text, false).expect("encodes").get_ids().to_vec();
        // GPT-2's own ids (tiktoken's `gpt2` encoding).
        assert_eq!(
            ids("The quick brown fox jumps over the lazy dog"),
            [464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290]
        );
        assert_eq!(ids("<|im_start|>user\nIt's<|im_end|>"), [50257, 7220, 198, 1026, 338, 50258]);
        assert_eq!(tokenizer.get_vocab_size(true), 50259);
    }

    #[test]
    fn chat_template_constant_matches_the_config_file() {
        let text = std::fs::read_to_string(super::tokenizer_config_path()).expect("asset");
        let config: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(config["chat_template"].as_str(), Some(super::CHAT_TEMPLATE));
    }
}
