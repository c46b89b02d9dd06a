//! Hugging Face chat templates rendered with minijinja, the way transformers renders them.
//!
//! transformers runs Jinja2 with `trim_blocks` and `lstrip_blocks`, and adds `raise_exception`,
//! `strftime_now` and a `tojson` that behaves like Python's `json.dumps` (`", "` and `": "`
//! separators, non-ASCII kept). minijinja-contrib's pycompat supplies the Python string and
//! dict methods templates call (`.strip()`, `.items()`, ...).

use std::path::Path;

use minijinja::{Environment, Error, ErrorKind, Value};

/// Why a chat template could not be loaded or rendered.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The template file or tokenizer configuration could not be read.
    #[error("reading {path}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `tokenizer_config.json` is not valid JSON or has no usable `chat_template`.
    #[error("{path}: {reason}")]
    Config {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The template does not compile or failed while rendering.
    #[error("chat template: {0}")]
    Jinja(#[from] Error),
}

const TEMPLATE_NAME: &str = "chat";

/// A compiled chat template with the special tokens it refers to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Compiles `source` with the given special tokens.
    pub fn new(
        source: String,
        bos_token: String,
        eos_token: String,
    ) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source)?;
        Ok(Self { env, bos_token, eos_token })
    }

    /// Loads the `chat_template` (and special tokens) of a `tokenizer_config.json`.
    pub fn from_tokenizer_config(path: &Path) -> Result<Self, TemplateError> {
        let text = read(path)?;
        let config: serde_json::Value = serde_json::from_str(&text).map_err(|err| {
            TemplateError::Config { path: path.display().to_string(), reason: err.to_string() }
        })?;
        let source = match config.get("chat_template") {
            Some(serde_json::Value::String(source)) => source.clone(),
            // A list of named templates: use the one named "default".
            Some(serde_json::Value::Array(named)) => named
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template")?.as_str().map(str::to_owned))
                .ok_or_else(|| TemplateError::Config {
                    path: path.display().to_string(),
                    reason: "chat_template list has no template named default".to_owned(),
                })?,
            _ => {
                return Err(TemplateError::Config {
                    path: path.display().to_string(),
                    reason: "no chat_template".to_owned(),
                });
            }
        };
        let token = |key: &str| match config.get(key) {
            Some(serde_json::Value::String(t)) => t.clone(),
            Some(serde_json::Value::Object(o)) => {
                o.get("content").and_then(|c| c.as_str()).unwrap_or_default().to_owned()
            }
            _ => String::new(),
        };
        Self::new(source, token("bos_token"), token("eos_token"))
    }

    /// Loads a template file, taking special tokens from the `tokenizer_config.json` beside
    /// `tokenizer_dir` when there is one.
    pub fn from_file(
        path: &Path,
        special_tokens_from: Option<&Path>,
    ) -> Result<Self, TemplateError> {
        let source = read(path)?;
        let (bos, eos) = special_tokens_from
            .and_then(|config| Self::from_tokenizer_config(config).ok())
            .map(|t| (t.bos_token, t.eos_token))
            .unwrap_or_default();
        Self::new(source, bos, eos)
    }

    /// Renders `messages` (and `tools`, when given) with the generation prompt appended.
    pub fn render(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&serde_json::Value>,
    ) -> Result<String, TemplateError> {
        let template = self.env.get_template(TEMPLATE_NAME)?;
        let rendered = template.render(minijinja::context! {
            messages => Value::from_serialize(messages),
            tools => tools.map(Value::from_serialize),
            add_generation_prompt => true,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        })?;
        Ok(rendered)
    }
}

fn read(path: &Path) -> Result<String, TemplateError> {
    std::fs::read_to_string(path)
        .map_err(|source| TemplateError::Read { path: path.display().to_string(), source })
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// Formats the current UTC time with a strftime pattern (`%d %b %Y` in Llama templates).
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(secs, &format)
}

fn strftime(unix_secs: u64, format: &str) -> String {
    const MONTHS: [&str; 12] =
        ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    const FULL_MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = unix_secs / 86_400;
    let secs_of_day = unix_secs % 86_400;
    // Civil-from-days (Howard Hinnant's algorithm), valid for every date after 1970.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    let month_index = usize::try_from(month - 1).unwrap_or(0);

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('-') if chars.clone().next() == Some('d') => {
                chars.next();
                out.push_str(&day.to_string());
            }
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('b') => out.push_str(MONTHS[month_index]),
            Some('B') => out.push_str(FULL_MONTHS[month_index]),
            Some('H') => out.push_str(&format!("{:02}", secs_of_day / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs_of_day / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs_of_day % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Python's `json.dumps(value, ensure_ascii=False)`, with optional `indent`.
fn tojson(value: Value, kwargs: minijinja::value::Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|err| Error::new(ErrorKind::InvalidOperation, err.to_string()))?;
    let mut out = String::new();
    write_python_json(&mut out, &json, indent, 0);
    Ok(Value::from_safe_string(out))
}

fn write_python_json(
    out: &mut String,
    value: &serde_json::Value,
    indent: Option<usize>,
    depth: usize,
) {
    use serde_json::Value as J;
    let newline = |out: &mut String, depth: usize| {
        if let Some(width) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(width * depth));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match value {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_python_json(out, item, indent, depth + 1);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                out.push_str(&serde_json::Value::String(key.clone()).to_string());
                out.push_str(": ");
                write_python_json(out, item, indent, depth + 1);
            }
            newline(out, depth);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}<|im_start|>{{ message['role'] }}\n\
        {{ message['content'] | trim }}<|im_end|>\n{% endfor %}\
        {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

    fn messages() -> Vec<serde_json::Value> {
        vec![
            serde_json::json!({"role": "system", "content": " be brief "}),
            serde_json::json!({"role": "user", "content": "héllo"}),
        ]
    }

    #[test]
    fn renders_chatml_with_generation_prompt() {
        let template =
            ChatTemplate::new(CHATML.to_owned(), String::new(), String::new()).expect("compiles");
        let text = template.render(&messages(), None).expect("renders");
        assert_eq!(
            text,
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhéllo<|im_end|>\n\
             <|im_start|>assistant\n"
        );
    }

    #[test]
    fn python_methods_tojson_and_exceptions_work() {
        let source = "{{ bos_token }}{% for m in messages %}{{ m.content.strip() }}|{% endfor %}\
            {{ tools | tojson }}{% if messages | length > 5 %}{{ raise_exception('too many') }}{% endif %}";
        let template =
            ChatTemplate::new(source.to_owned(), "<s>".into(), "</s>".into()).expect("compiles");
        let tools = serde_json::json!([{"name": "f", "params": {"a": [1, 2], "ü": null}}]);
        let text = template.render(&messages(), Some(&tools)).expect("renders");
        assert_eq!(
            text,
            r#"<s>be brief|héllo|[{"name": "f", "params": {"a": [1, 2], "ü": null}}]"#
        );

        let many: Vec<_> = std::iter::repeat_n(messages()[1].clone(), 6).collect();
        let err = template.render(&many, None).expect_err("raises");
        assert!(format!("{err:#}").contains("chat template"), "{err}");
    }

    #[test]
    fn tojson_indent_matches_python() {
        let source = "{{ tools | tojson(indent=2) }}";
        let template =
            ChatTemplate::new(source.into(), String::new(), String::new()).expect("compiles");
        let tools = serde_json::json!({"a": [1], "b": {}});
        let text = template.render(&messages(), Some(&tools)).expect("renders");
        assert_eq!(text, "{\n  \"a\": [\n    1\n  ],\n  \"b\": {}\n}");
    }

    #[test]
    fn strftime_formats_known_dates() {
        // 2024-02-29 13:05:09 UTC
        assert_eq!(strftime(1_709_211_909, "%d %b %Y %H:%M:%S"), "29 Feb 2024 13:05:09");
        assert_eq!(strftime(0, "%Y-%m-%d %B %%"), "1970-01-01 January %");
    }

    #[test]
    fn loads_chat_template_from_tokenizer_config() {
        let dir = std::env::temp_dir().join(format!("router-tmpl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("tokenizer_config.json");
        let config = serde_json::json!({
            "chat_template": [{"name": "default", "template": CHATML}],
            "bos_token": {"content": "<s>"},
        });
        std::fs::write(&path, config.to_string()).expect("write");
        let template = ChatTemplate::from_tokenizer_config(&path).expect("loads");
        assert_eq!(template.bos_token, "<s>");
        assert!(template.render(&messages(), None).expect("renders").ends_with("assistant\n"));
        std::fs::write(&path, "{}").expect("write");
        let err = ChatTemplate::from_tokenizer_config(&path).expect_err("no template");
        assert!(err.to_string().contains("no chat_template"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
