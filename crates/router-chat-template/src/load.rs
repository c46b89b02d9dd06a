//! Finding a model's chat templates and special tokens on disk, as transformers'
//! `from_pretrained` finds them: `tokenizer_config.json`'s `chat_template` (a string, or a list
//! of `{name, template}`), replaced by `chat_template.jinja` and `additional_chat_templates/*.jinja`
//! when the directory has them.

use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use crate::error::{ConfigProblem, TemplateError};
use crate::{DEFAULT, SpecialTokens};

/// Template sources by name; one unnamed-in-the-config template is called [`DEFAULT`].
pub(crate) struct Sources {
    pub(crate) templates: Vec<(String, String)>,
    /// Whether they came as several named templates (the choice then follows `tools`).
    pub(crate) named: bool,
}

/// What a directory holds: its templates (if any) and special tokens.
pub(crate) fn from_tokenizer_config(
    config_path: &Path,
) -> Result<(Option<Sources>, SpecialTokens), TemplateError> {
    let config = read_config(config_path)?;
    let mut sources = match &config {
        Some(config) => in_config(config, config_path)?,
        None => None,
    };
    let dir = config_path.parent().unwrap_or(Path::new("."));
    if let Some(files) = template_files(dir)? {
        sources = Some(files);
    }
    let special = config.as_ref().map(SpecialTokens::from_config).unwrap_or_default();
    Ok((sources, special))
}

/// The parsed `tokenizer_config.json`, `None` when there is none.
pub(crate) fn read_config(path: &Path) -> Result<Option<Json>, TemplateError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(TemplateError::Read { path: path.to_owned(), source }),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| TemplateError::ParseConfig { path: path.to_owned(), source })
}

/// `chat_template` of a configuration.
fn in_config(config: &Json, path: &Path) -> Result<Option<Sources>, TemplateError> {
    let invalid = |problem| TemplateError::InvalidConfig { path: path.to_owned(), problem };
    match config.get("chat_template") {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(source)) => Ok(Some(Sources {
            templates: vec![(DEFAULT.to_owned(), source.clone())],
            named: false,
        })),
        Some(Json::Array(entries)) => {
            let mut templates = Vec::with_capacity(entries.len());
            for entry in entries {
                let name = entry.get("name").and_then(Json::as_str);
                let source = entry.get("template").and_then(Json::as_str);
                let (Some(name), Some(source)) = (name, source) else {
                    return Err(invalid(ConfigProblem::UnnamedEntry));
                };
                // A later entry of the same name wins, as in the dict transformers builds.
                templates.retain(|(n, _): &(String, String)| n != name);
                templates.push((name.to_owned(), source.to_owned()));
            }
            Ok(Some(Sources { templates, named: true }))
        }
        Some(_) => Err(invalid(ConfigProblem::NotStringOrList)),
    }
}

/// `chat_template.jinja` (as `default`) and `additional_chat_templates/NAME.jinja`.
fn template_files(dir: &Path) -> Result<Option<Sources>, TemplateError> {
    let mut templates = Vec::new();
    if let Some(source) = read_optional(&dir.join("chat_template.jinja"))? {
        templates.push((DEFAULT.to_owned(), source));
    }
    let extra_dir = dir.join("additional_chat_templates");
    let entries = match std::fs::read_dir(&extra_dir) {
        Ok(entries) => Some(entries),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => return Err(TemplateError::Read { path: extra_dir, source }),
    };
    let mut extra: Vec<PathBuf> = Vec::new();
    for entry in entries.into_iter().flatten() {
        let entry =
            entry.map_err(|source| TemplateError::Read { path: extra_dir.clone(), source })?;
        let path = entry.path();
        if path.extension().is_some_and(|ext| ext == "jinja") {
            extra.push(path);
        }
    }
    extra.sort();
    for path in extra {
        let Some(name) = path.file_stem().and_then(|s| s.to_str()).map(str::to_owned) else {
            continue;
        };
        let source = read(&path)?;
        templates.retain(|(n, _)| *n != name);
        templates.push((name, source));
    }
    if templates.is_empty() {
        return Ok(None);
    }
    // A lone chat_template.jinja is a single template, as transformers keeps it.
    let named = !(templates.len() == 1 && templates[0].0 == DEFAULT);
    Ok(Some(Sources { templates, named }))
}

pub(crate) fn read(path: &Path) -> Result<String, TemplateError> {
    std::fs::read_to_string(path)
        .map_err(|source| TemplateError::Read { path: path.to_owned(), source })
}

fn read_optional(path: &Path) -> Result<Option<String>, TemplateError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TemplateError::Read { path: path.to_owned(), source }),
    }
}
