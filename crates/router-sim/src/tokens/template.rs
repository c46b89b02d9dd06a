//! Chat templates from `tokenizer_config.json`, rendered with minijinja as `transformers`
//! configures Jinja (`trim_blocks`, `lstrip_blocks`, Python string methods, `raise_exception`,
//! `strftime_now`, and a `tojson` that prints like Python's `json.dumps`).

use std::path::{Path, PathBuf};

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, ErrorKind};

use super::{ChatMessage, PrepareError};

const TEMPLATE_NAME: &str = "chat";

/// A compiled chat template with the special tokens of its configuration.
pub(super) struct JinjaTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl JinjaTemplate {
    /// Finds the template beside `tokenizer`: `tokenizer_config.json`'s `chat_template`, else
    /// `chat_template.jinja`.
    pub(super) fn beside(tokenizer: &Path) -> Result<Self, PrepareError> {
        let dir = tokenizer.parent().unwrap_or(Path::new("."));
        let config_path = dir.join("tokenizer_config.json");
        let config = match std::fs::read_to_string(&config_path) {
            Ok(text) => serde_json::from_str::<serde_json::Value>(&text).map_err(|source| {
                PrepareError::ParseConfig { path: config_path.clone(), source }
            })?,
            Err(source) if source.kind() == std::io::ErrorKind::NotFound => serde_json::Value::Null,
            Err(source) => return Err(PrepareError::ReadConfig { path: config_path, source }),
        };
        let (source, origin) = match template_in_config(&config) {
            Some(source) => (source, config_path),
            None => {
                let jinja = dir.join("chat_template.jinja");
                match std::fs::read_to_string(&jinja) {
                    Ok(source) => (source, jinja),
                    Err(source) if source.kind() == std::io::ErrorKind::NotFound => {
                        return Err(PrepareError::NoChatTemplate { path: tokenizer.to_owned() });
                    }
                    Err(source) => return Err(PrepareError::ReadConfig { path: jinja, source }),
                }
            }
        };
        Self::compile(
            source,
            origin,
            special_token(&config, "bos_token"),
            special_token(&config, "eos_token"),
        )
    }

    fn compile(
        source: String,
        origin: PathBuf,
        bos_token: String,
        eos_token: String,
    ) -> Result<Self, PrepareError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(|source| PrepareError::CompileTemplate { path: origin, source })?;
        Ok(Self { env, bos_token, eos_token })
    }

    pub(super) fn render(&self, messages: &[ChatMessage]) -> Result<String, PrepareError> {
        let template = self.env.get_template(TEMPLATE_NAME).map_err(PrepareError::Render)?;
        template
            .render(minijinja::context! {
                messages => Value::from_serialize(messages),
                add_generation_prompt => true,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            })
            .map_err(PrepareError::Render)
    }
}

/// `chat_template` as a string, or the `default` entry of a list of named templates.
fn template_in_config(config: &serde_json::Value) -> Option<String> {
    match config.get("chat_template")? {
        serde_json::Value::String(source) => Some(source.clone()),
        serde_json::Value::Array(named) => named
            .iter()
            .find(|entry| entry.get("name").and_then(|n| n.as_str()) == Some("default"))
            .or_else(|| named.first())
            .and_then(|entry| entry.get("template"))
            .and_then(|t| t.as_str())
            .map(str::to_owned),
        _ => None,
    }
}

/// A special token written as a string or as an added-token object with `content`.
fn special_token(config: &serde_json::Value, key: &str) -> String {
    match config.get(key) {
        Some(serde_json::Value::String(token)) => token.clone(),
        Some(serde_json::Value::Object(token)) => {
            token.get("content").and_then(|c| c.as_str()).unwrap_or_default().to_owned()
        }
        _ => String::new(),
    }
}

fn raise_exception(message: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

fn strftime_now(format: String) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    crate::time_fmt::strftime(now, &format)
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent)`: `", "` and `": "`
/// separators without indent, and no HTML escaping.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = Vec::new();
    let written = match indent {
        Some(width) => {
            let indent = vec![b' '; width];
            let formatter = serde_json::ser::PrettyFormatter::with_indent(&indent);
            let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
            serde::Serialize::serialize(&json, &mut ser)
        }
        None => {
            let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonFormatter);
            serde::Serialize::serialize(&json, &mut ser)
        }
    };
    written.map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let text = String::from_utf8(out)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(Value::from_safe_string(text))
}

/// Compact JSON with Python's default separators.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { writer.write_all(b", ") }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { writer.write_all(b", ") }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

#[cfg(test)]
pub(super) fn compile_for_test(source: &str) -> Result<JinjaTemplate, PrepareError> {
    JinjaTemplate::compile(source.to_owned(), PathBuf::from("test"), String::new(), String::new())
}
