//! Paths of the files shipped in `crates/router-sim/assets/`, so a router configured for the
//! simulated fleet can load the very tokenizer and chat template the engines use.

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

/// The chat template text of [`tokenizer_config_path`], for routers that take a template
/// string or file rather than a `tokenizer_config.json`.
pub const CHAT_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] \
+ '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}\
{{ '<|im_start|>assistant\\n' }}{% endif %}";

#[cfg(test)]
mod tests {
    #[test]
    fn chat_template_constant_matches_the_config_file() {
        let text = std::fs::read_to_string(super::tokenizer_config_path()).expect("asset");
        let config: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(config["chat_template"].as_str(), Some(super::CHAT_TEMPLATE));
    }
}
