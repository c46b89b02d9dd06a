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

/// The byte-level `tokenizer.json`, inside the binary.
pub const TOKENIZER_JSON: &str = include_str!("../assets/tokenizer.json");

/// The `tokenizer_config.json` beside it, inside the binary.
pub const TOKENIZER_CONFIG_JSON: &str = include_str!("../assets/tokenizer_config.json");

/// Writes [`TOKENIZER_JSON`] and [`TOKENIZER_CONFIG_JSON`] into `dir` (created if missing),
/// each through a file of its own renamed into place, so that a reader never sees half of one;
/// the path of the `tokenizer.json` written. A binary that left its source tree still has them.
pub fn write_to(dir: &std::path::Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    for (name, text) in
        [("tokenizer.json", TOKENIZER_JSON), ("tokenizer_config.json", TOKENIZER_CONFIG_JSON)]
    {
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
    fn chat_template_constant_matches_the_config_file() {
        let text = std::fs::read_to_string(super::tokenizer_config_path()).expect("asset");
        let config: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(config["chat_template"].as_str(), Some(super::CHAT_TEMPLATE));
    }
}
