//! [`TemplateError`]: why a chat template could not be loaded, chosen or rendered.

use std::path::PathBuf;

/// Why a chat template could not be loaded, chosen or rendered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TemplateError {
    /// A template file or tokenizer configuration could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// `tokenizer_config.json` is not valid JSON.
    #[error("invalid json in {path}")]
    ParseConfig {
        /// The file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// `tokenizer_config.json` has a `chat_template` of the wrong shape.
    #[error("{path}: {problem}")]
    InvalidConfig {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: ConfigProblem,
    },
    /// Neither `tokenizer_config.json` nor `chat_template.jinja` in the directory has a chat
    /// template.
    #[error(
        "no chat template in {dir} (tokenizer_config.json chat_template or chat_template.jinja)"
    )]
    NotFound {
        /// The directory searched.
        dir: PathBuf,
    },
    /// A template does not compile.
    #[error("chat template {name:?} does not compile")]
    Compile {
        /// The template's name (`default` for a single template).
        name: String,
        /// The template error.
        #[source]
        source: minijinja::Error,
    },
    /// Several named templates, none of them fits the request and none is named `default`.
    #[error(
        "chat templates {names:?} have none named default (nor tool_use for a request with tools)"
    )]
    NoDefault {
        /// The names there are, sorted.
        names: Vec<String>,
    },
    /// The template called `raise_exception`: it rejects the conversation.
    #[error("the chat template rejects the conversation: {message}")]
    Raised {
        /// The template's message.
        message: String,
        /// The render error that carried it, with the template location.
        #[source]
        source: minijinja::Error,
    },
    /// Rendering failed otherwise (an undefined value used, a type error, ...).
    #[error("rendering chat template {name:?} failed")]
    Render {
        /// The template's name.
        name: String,
        /// The template error.
        #[source]
        source: minijinja::Error,
    },
}

/// What is wrong with a `chat_template` entry of `tokenizer_config.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigProblem {
    /// `chat_template` is neither a string nor a list of `{name, template}` objects.
    #[error("chat_template is neither a string nor a list of named templates")]
    NotStringOrList,
    /// An entry of the list lacks a string `name` or `template`.
    #[error("a chat_template list entry lacks a string name or template")]
    UnnamedEntry,
}
