//! [`ChatTemplate`]: compiled templates, the choice among named ones, and rendering.

use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use minijinja::{AutoEscape, Environment, Value};
use serde::Serialize;

use crate::env;
use crate::error::TemplateError;
use crate::facts::TemplateFacts;
use crate::{Conversation, DEFAULT, SpecialTokens, TOOL_USE, load};

/// A model's compiled chat template (or named templates) and the special tokens it sees.
/// Cheap to share behind an `Arc`; rendering takes `&self`.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The template names, in the order given.
    names: Vec<String>,
    /// What each template's source tells the engines, in the order of `names`.
    facts: Vec<TemplateFacts>,
    /// Several named templates: the choice follows `tools`.
    named: bool,
    special_tokens: SpecialTokens,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("names", &self.names)
            .field("named", &self.named)
            .field("special_tokens", &self.special_tokens)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles one template.
    pub fn new(source: &str, special_tokens: SpecialTokens) -> Result<Self, TemplateError> {
        Self::compile(vec![(DEFAULT.to_owned(), source.to_owned())], false, special_tokens)
    }

    /// Compiles named templates (`default`, `tool_use`, ...), chosen per render as
    /// transformers chooses: `tool_use` when tools are given and there is one, else `default`.
    pub fn named(
        templates: Vec<(String, String)>,
        special_tokens: SpecialTokens,
    ) -> Result<Self, TemplateError> {
        Self::compile(templates, true, special_tokens)
    }

    /// Loads what transformers' `from_pretrained` loads for the tokenizer whose configuration
    /// is `path`: its `chat_template` (a string or a list of named templates), replaced by
    /// `chat_template.jinja` and `additional_chat_templates/*.jinja` in the same directory when
    /// there are any; special tokens from the configuration. A missing configuration file is
    /// fine when a `chat_template.jinja` is beside it.
    pub fn from_tokenizer_config(path: &Path) -> Result<Self, TemplateError> {
        let (sources, special_tokens) = load::from_tokenizer_config(path)?;
        let Some(sources) = sources else {
            let dir = path.parent().unwrap_or(Path::new(".")).to_owned();
            return Err(TemplateError::NotFound { dir });
        };
        Self::compile(sources.templates, sources.named, special_tokens)
    }

    /// [`ChatTemplate::from_tokenizer_config`] for `dir/tokenizer_config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self, TemplateError> {
        Self::from_tokenizer_config(&dir.join("tokenizer_config.json"))
    }

    /// Loads a template file, with the special tokens of the `tokenizer_config.json` at
    /// `special_tokens_from` when given.
    pub fn from_file(
        path: &Path,
        special_tokens_from: Option<&Path>,
    ) -> Result<Self, TemplateError> {
        let source = load::read(path)?;
        let special_tokens = match special_tokens_from {
            Some(config) => load::read_config(config)?
                .as_ref()
                .map(SpecialTokens::from_config)
                .unwrap_or_default(),
            None => SpecialTokens::default(),
        };
        Self::new(&source, special_tokens)
    }

    /// Makes `strftime_now` read `clock` instead of the system clock (for reproducible
    /// renders of templates that print today's date).
    pub fn with_clock(mut self, clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        env::set_clock(&mut self.env, Arc::new(clock));
        self
    }

    /// The special tokens the template sees.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special_tokens
    }

    /// The template names: `["default"]` for a single template.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Renders a chat request as a serving engine does: `messages`, `tools` when given (`null`
    /// counts as absent) and the generation prompt.
    pub fn render<M: Serialize>(
        &self,
        messages: &[M],
        tools: Option<&serde_json::Value>,
    ) -> Result<String, TemplateError> {
        let mut conversation = Conversation::new(&messages).add_generation_prompt(true);
        if let Some(tools) = tools {
            conversation = conversation.tools(tools);
        }
        self.render_conversation(&conversation)
    }

    /// Renders `conversation` as transformers' `apply_chat_template(..., tokenize=False)`.
    pub fn render_conversation(
        &self,
        conversation: &Conversation,
    ) -> Result<String, TemplateError> {
        let name = self.choose(conversation.has_tools())?.0;
        let template = self
            .env
            .get_template(name)
            .map_err(|source| TemplateError::Render { name: name.to_owned(), source })?;
        let context = Value::from_iter(
            self.special_tokens
                .variables()
                .map(|(n, v)| (n.to_owned(), v))
                .chain(conversation.kwargs.iter().cloned())
                .chain([
                    ("messages".to_owned(), conversation.messages.clone()),
                    ("tools".to_owned(), conversation.tools.clone().unwrap_or(Value::from(()))),
                    (
                        "documents".to_owned(),
                        conversation.documents.clone().unwrap_or(Value::from(())),
                    ),
                    (
                        "add_generation_prompt".to_owned(),
                        Value::from(conversation.add_generation_prompt),
                    ),
                ]),
        );
        template.render(context).map_err(|source| match env::raised_message(&source) {
            Some(message) => TemplateError::Raised { message, source },
            None => TemplateError::Render { name: name.to_owned(), source },
        })
    }

    /// The template transformers' `get_chat_template` would pick, with its facts.
    pub(crate) fn choose(&self, has_tools: bool) -> Result<(&str, &TemplateFacts), TemplateError> {
        let at = |wanted: &str| self.names.iter().position(|n| n == wanted);
        let chosen = if !self.named {
            Some(0)
        } else if let Some(tool_use) = at(TOOL_USE).filter(|_| has_tools) {
            Some(tool_use)
        } else {
            at(DEFAULT)
        };
        if let Some(i) = chosen {
            Ok((&self.names[i], &self.facts[i]))
        } else {
            let mut names = self.names.clone();
            names.sort();
            Err(TemplateError::NoDefault { names })
        }
    }

    fn compile(
        templates: Vec<(String, String)>,
        named: bool,
        special_tokens: SpecialTokens,
    ) -> Result<Self, TemplateError> {
        let mut env = env::environment(env::system_clock());
        // Template names are model-chosen (`additional_chat_templates/x.json.jinja`): never
        // escape by file extension.
        env.set_auto_escape_callback(|_| AutoEscape::None);
        let mut names = Vec::with_capacity(templates.len());
        let mut facts = Vec::with_capacity(templates.len());
        for (name, source) in templates {
            let rewritten = env::rewrite_generation_tags(&source).into_owned();
            let compile_error = |source| TemplateError::Compile { name: name.clone(), source };
            env.add_template_owned(name.clone(), rewritten).map_err(compile_error)?;
            let variables =
                env.get_template(&name).map_err(compile_error)?.undeclared_variables(false);
            facts.push(TemplateFacts::of(&source, variables));
            names.push(name);
        }
        if names.is_empty() {
            return Err(TemplateError::NoDefault { names });
        }
        Ok(Self { env, names, facts, named, special_tokens })
    }
}

#[cfg(test)]
mod tests;
