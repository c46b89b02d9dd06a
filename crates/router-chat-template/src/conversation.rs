//! [`Conversation`]: what one render receives, as the arguments of transformers'
//! `apply_chat_template(..., tokenize=False)`.

use minijinja::Value;
use serde::Serialize;

/// The input of one render: `messages`, `tools`, `documents`, `add_generation_prompt` and any
/// further template keyword arguments (`date_string`, `enable_thinking`, ...).
///
/// Values are converted once, keeping the order of object keys (which `tojson` prints).
#[derive(Debug, Clone)]
pub struct Conversation {
    pub(crate) messages: Value,
    pub(crate) tools: Option<Value>,
    pub(crate) documents: Option<Value>,
    pub(crate) add_generation_prompt: bool,
    pub(crate) kwargs: Vec<(String, Value)>,
}

impl Conversation {
    /// The messages (a list of `{role, content, ...}` objects), without tools and without a
    /// generation prompt, as transformers defaults.
    pub fn new(messages: &impl Serialize) -> Self {
        Self {
            messages: Value::from_serialize(messages),
            tools: None,
            documents: None,
            add_generation_prompt: false,
            kwargs: Vec::new(),
        }
    }

    /// The tool schemas. `null` means no tools; an empty list is still "tools given", which
    /// picks a `tool_use` template as in transformers.
    pub fn tools(mut self, tools: &impl Serialize) -> Self {
        self.tools = present(Value::from_serialize(tools));
        self
    }

    /// The documents of a retrieval-augmented request; `null` means none.
    pub fn documents(mut self, documents: &impl Serialize) -> Self {
        self.documents = present(Value::from_serialize(documents));
        self
    }

    /// Whether to end with the header of the assistant's turn.
    pub fn add_generation_prompt(mut self, yes: bool) -> Self {
        self.add_generation_prompt = yes;
        self
    }

    /// A further template variable. It overrides a special token of the same name, as
    /// transformers' keyword arguments do.
    pub fn kwarg(mut self, name: impl Into<String>, value: &impl Serialize) -> Self {
        let name = name.into();
        self.kwargs.retain(|(n, _)| *n != name);
        self.kwargs.push((name, Value::from_serialize(value)));
        self
    }

    /// Whether tools were given.
    pub fn has_tools(&self) -> bool {
        self.tools.is_some()
    }
}

fn present(value: Value) -> Option<Value> {
    (!value.is_none() && !value.is_undefined()).then_some(value)
}
