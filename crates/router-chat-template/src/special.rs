//! [`SpecialTokens`]: the special-token variables transformers passes to a chat template
//! (its `special_tokens_map`).

use serde_json::Value as Json;

/// The attributes transformers' `special_tokens_map` reads, in its order.
const ATTRIBUTES: [&str; 7] =
    ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];

/// The special tokens a template sees as variables: `bos_token`, `eos_token`, `unk_token`,
/// `sep_token`, `pad_token`, `cls_token`, `mask_token`, a model's `extra_special_tokens`, and
/// the list `additional_special_tokens`.
///
/// Like transformers, a token that is not set (or empty) is not passed at all, so the template
/// sees it as undefined, not as an empty string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    named: Vec<(String, String)>,
    additional: Vec<String>,
}

impl SpecialTokens {
    /// No special tokens.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the token named `name` (`bos_token`, ...); an empty token unsets it.
    pub fn with(mut self, name: impl Into<String>, token: impl Into<String>) -> Self {
        let (name, token) = (name.into(), token.into());
        self.named.retain(|(n, _)| *n != name);
        if !token.is_empty() {
            self.named.push((name, token));
        }
        self
    }

    /// Sets `additional_special_tokens`.
    pub fn with_additional(mut self, tokens: Vec<String>) -> Self {
        self.additional = tokens;
        self
    }

    /// The token named `name`, when set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.named.iter().find(|(n, _)| n == name).map(|(_, token)| token.as_str())
    }

    /// `additional_special_tokens`.
    pub fn additional(&self) -> &[String] {
        &self.additional
    }

    /// The variables to render with: each set token, then `additional_special_tokens` when
    /// non-empty.
    pub(crate) fn variables(&self) -> impl Iterator<Item = (&str, minijinja::Value)> {
        let named =
            self.named.iter().map(|(n, t)| (n.as_str(), minijinja::Value::from(t.as_str())));
        let additional = (!self.additional.is_empty()).then(|| {
            ("additional_special_tokens", minijinja::Value::from_serialize(&self.additional))
        });
        named.chain(additional)
    }

    /// The tokens of a `tokenizer_config.json`: each attribute as a string or an added-token
    /// object's `content`, `extra_special_tokens`, `additional_special_tokens`.
    pub(crate) fn from_config(config: &Json) -> Self {
        let mut tokens = Self::new();
        for name in ATTRIBUTES {
            if let Some(token) = config.get(name).and_then(content) {
                tokens = tokens.with(name, token);
            }
        }
        if let Some(Json::Object(extra)) = config.get("extra_special_tokens") {
            for (name, token) in extra {
                if let Some(token) = content(token) {
                    tokens = tokens.with(name.clone(), token);
                }
            }
        }
        if let Some(Json::Array(additional)) = config.get("additional_special_tokens") {
            tokens.additional = additional.iter().filter_map(content).collect();
        }
        tokens
    }
}

/// A token written as a string or as an added-token object with `content`.
fn content(token: &Json) -> Option<String> {
    match token {
        Json::String(token) => Some(token.clone()),
        Json::Object(token) => token.get("content").and_then(Json::as_str).map(str::to_owned),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_strings_added_token_objects_and_extras() {
        let config = serde_json::json!({
            "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
            "eos_token": "</s>",
            "pad_token": null,
            "unk_token": "",
            "extra_special_tokens": {"image_token": "<image>"},
            "additional_special_tokens": ["<a>", {"content": "<b>"}],
        });
        let tokens = SpecialTokens::from_config(&config);
        assert_eq!(tokens.get("bos_token"), Some("<s>"));
        assert_eq!(tokens.get("eos_token"), Some("</s>"));
        assert_eq!(tokens.get("pad_token"), None);
        assert_eq!(tokens.get("unk_token"), None, "an empty token is unset, as in transformers");
        assert_eq!(tokens.get("image_token"), Some("<image>"));
        assert_eq!(tokens.additional(), ["<a>", "<b>"]);
        let names: Vec<&str> = tokens.variables().map(|(n, _)| n).collect();
        assert_eq!(names, ["bos_token", "eos_token", "image_token", "additional_special_tokens"]);
    }
}
