//! An OpenAI chat request rendered into the prompt text its engine tokenizes: what vLLM and
//! SGLang do to a `/v1/chat/completions` body before and after `apply_chat_template`.
//!
//! The router must compute the engine's token ids for a request, or its prefix lookups find
//! nothing. The template is only part of it; the engines also rewrite the messages first, and
//! not alike ([`EngineRules`]):
//!
//! | request | vLLM | SGLang |
//! |---|---|---|
//! | content as text parts | joined with `\n` (string-format templates) | joined with a space |
//! | `content: null` | `""` | `""` |
//! | message fields | rebuilt: role, content, `tool_calls`, `reasoning`, `tool_call_id`, `name` | the client's, `null`s dropped |
//! | `tool_calls[].function.arguments` | parsed to an object (`{}` when not an object) | parsed (an error when not an object) |
//! | `developer` role | becomes `system` when the template never names it | as sent |
//! | `tools` | `{type, function: {name, description, parameters}}` | as sent |
//! | `add_generation_prompt` | the request's (default true) | always true |
//! | `continue_final_message` | transformers' (cut after the final message) | final assistant text appended after rendering |
//! | final assistant message otherwise | as sent | turned into a user message |
//! | `chat_template_kwargs` | only the variables the template reads | all |
//! | `add_special_tokens` | the request's (default false) | false |
//!
//! Non-text parts (images, audio) cannot be rendered as a text-only engine would: such a
//! request is [`Unrenderable::NonTextPart`], and the router routes it without a prefix lookup.
//! A request the engine itself would refuse (a template's `raise_exception`, both
//! `continue_final_message` and `add_generation_prompt`) is [`Unrenderable::Refused`] or
//! [`Unrenderable::Template`]: the engine answers it.
//!
//! The vLLM column is checked against a real vLLM's `/tokenize` (`tests/vllm/goldens/`); the
//! SGLang column follows SGLang's source and has no engine to check it against here.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

use crate::facts::{ContentFormat, TemplateFacts};
use crate::{ChatTemplate, Conversation, TemplateError};

/// Whose rules turn a chat request into the template's input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineRules {
    /// vLLM's (`vllm/renderers/chat_utils.py`, `hf.py`).
    #[default]
    Vllm,
    /// SGLang's (`serving_chat.py`, `jinja_template_utils.py`).
    Sglang,
}

/// A chat request's prompt, ready to tokenize.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderedPrompt {
    /// The prompt text.
    pub text: String,
    /// Whether the tokenizer adds its special tokens (BOS) around it.
    pub add_special_tokens: bool,
}

/// Why a chat request has no prompt the router can compute exactly.
#[derive(Debug, thiserror::Error)]
pub enum Unrenderable {
    /// A message has a part a text-only prompt cannot hold (an image, audio, ...).
    #[error("messages[{message}] has a content part of type {kind:?}")]
    NonTextPart {
        /// The message's index.
        message: usize,
        /// The part's `type` (empty when it has none).
        kind: String,
    },
    /// The engine refuses such a request before its template runs.
    #[error("{0}")]
    Refused(String),
    /// The template failed or refused the conversation.
    #[error(transparent)]
    Template(#[from] TemplateError),
}

impl Unrenderable {
    /// The reason as a metric label: `non_text_part` or `template_error`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NonTextPart { .. } => "non_text_part",
            Self::Refused(_) | Self::Template(_) => "template_error",
        }
    }
}

/// Part types that carry text, and the field that holds it.
const TEXT_PARTS: [(&str, &str); 5] = [
    ("text", "text"),
    ("input_text", "text"),
    ("output_text", "text"),
    ("refusal", "refusal"),
    ("thinking", "thinking"),
];

/// What transformers appends to the final message to find where it ends after rendering.
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

/// The line Claude Code starts its system prompt with; vLLM drops it (it changes every request).
const BILLING_HEADER: &str = "x-anthropic-billing-header";

/// The members of a chat body [`ChatTemplate::render_request`] reads; the others make no
/// difference to what it renders, so a caller may leave them out of the map it passes.
pub const REQUEST_FIELDS: [&str; 9] = [
    "messages",
    "tools",
    "documents",
    "chat_template_kwargs",
    "reasoning_effort",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "tool_choice",
];

impl ChatTemplate {
    /// Renders a `/v1/chat/completions` body (an object whose `messages` is a list of objects)
    /// as an engine following `rules` would before tokenizing it. Only the members of
    /// [`REQUEST_FIELDS`] are read.
    pub fn render_request(
        &self,
        body: &Map<String, Json>,
        rules: EngineRules,
    ) -> Result<RenderedPrompt, Unrenderable> {
        let messages = body.get("messages").and_then(Json::as_array).map_or(&[][..], Vec::as_slice);
        match rules {
            EngineRules::Vllm => self.render_vllm(body, messages),
            EngineRules::Sglang => self.render_sglang(body, messages),
        }
    }

    fn render_vllm(
        &self,
        body: &Map<String, Json>,
        messages: &[Json],
    ) -> Result<RenderedPrompt, Unrenderable> {
        let tools = vllm_tools(body.get("tools"))?;
        let (_, facts) = self.choose(tools.is_some())?;
        let mut conversation = messages
            .iter()
            .enumerate()
            .map(|(i, message)| vllm_message(i, message, facts.vllm_format))
            .collect::<Result<Vec<_>, _>>()?;
        if !facts.developer_role && conversation.iter().any(|m| role(m) == "developer") {
            conversation = developer_as_system(conversation);
        }
        // `chat_template_kwargs` first, the request's own fields over them unless null.
        let mut kwargs =
            body.get("chat_template_kwargs").and_then(Json::as_object).cloned().unwrap_or_default();
        if kwargs.contains_key("tokenize") || kwargs.contains_key("chat_template") {
            return Err(Unrenderable::Refused(
                "chat_template_kwargs may not set tokenize or chat_template".to_owned(),
            ));
        }
        let reasoning_effort = body.get("reasoning_effort").filter(|v| !v.is_null());
        if let Some(effort) = reasoning_effort
            && !kwargs.contains_key("enable_thinking")
        {
            kwargs.insert("enable_thinking".into(), Json::Bool(effort.as_str() != Some("none")));
        }
        let overrides = [
            ("add_generation_prompt", Some(flag(body, "add_generation_prompt", true))),
            ("continue_final_message", Some(flag(body, "continue_final_message", false))),
            ("documents", body.get("documents").cloned()),
            ("reasoning_effort", reasoning_effort.cloned()),
        ];
        for (name, value) in overrides {
            if let Some(value) = value.filter(|v| !v.is_null() && v.as_str() != Some("auto")) {
                kwargs.insert(name.into(), value);
            }
        }
        let add_generation_prompt = kwargs.get("add_generation_prompt").is_some_and(truthy);
        let continue_final = kwargs.get("continue_final_message").is_some_and(truthy);
        let documents = kwargs.get("documents").cloned();
        let text = self.render_transformers(
            conversation,
            tools,
            documents,
            add_generation_prompt,
            continue_final,
            kwargs.iter().filter(|(name, _)| {
                facts.variables.contains(*name) && !NAMED_ARGUMENTS.contains(&name.as_str())
            }),
            facts,
        )?;
        Ok(RenderedPrompt {
            text,
            add_special_tokens: flag(body, "add_special_tokens", false).as_bool() == Some(true),
        })
    }

    fn render_sglang(
        &self,
        body: &Map<String, Json>,
        messages: &[Json],
    ) -> Result<RenderedPrompt, Unrenderable> {
        let tools = sglang_tools(body);
        let (_, facts) = self.choose(tools.is_some())?;
        let mut conversation = messages
            .iter()
            .enumerate()
            .map(|(i, message)| sglang_message(i, message, facts.sglang_format))
            .collect::<Result<Vec<_>, _>>()?;
        let mut prefix = None;
        if let Some(last) = conversation.last_mut()
            && role(last) == "assistant"
            && let Some(Json::String(content)) = last.get("content")
        {
            if flag(body, "continue_final_message", false).as_bool() == Some(true) {
                prefix = Some(content.clone());
                conversation.pop();
            } else {
                let content = content.clone();
                *last = Map::from_iter([
                    ("role".to_owned(), Json::from("user")),
                    ("content".to_owned(), Json::String(content)),
                ]);
            }
        }
        let mut kwargs = Map::new();
        if let Some(effort) = body.get("reasoning_effort").filter(|v| !v.is_null()) {
            kwargs.insert("reasoning_effort".into(), effort.clone());
        }
        if let Some(Json::Object(extra)) = body.get("chat_template_kwargs") {
            kwargs.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        let mut text = self.render_transformers(
            conversation,
            tools,
            kwargs.get("documents").cloned(),
            true,
            false,
            kwargs.iter().filter(|(name, _)| !NAMED_ARGUMENTS.contains(&name.as_str())),
            facts,
        )?;
        text.push_str(prefix.as_deref().unwrap_or_default());
        Ok(RenderedPrompt { text, add_special_tokens: false })
    }

    /// transformers' `apply_chat_template(..., tokenize=False)` with these arguments.
    #[expect(clippy::too_many_arguments, reason = "transformers' own argument list")]
    fn render_transformers<'k>(
        &self,
        mut messages: Vec<Map<String, Json>>,
        tools: Option<Json>,
        documents: Option<Json>,
        add_generation_prompt: bool,
        continue_final: bool,
        kwargs: impl Iterator<Item = (&'k String, &'k Json)>,
        facts: &TemplateFacts,
    ) -> Result<String, Unrenderable> {
        let mut final_text = None;
        if continue_final {
            if add_generation_prompt {
                return Err(Unrenderable::Refused(
                    "continue_final_message and add_generation_prompt are not compatible"
                        .to_owned(),
                ));
            }
            final_text = Some(tag_final_message(&mut messages, facts)?);
        }
        let mut conversation =
            Conversation::new(&messages).add_generation_prompt(add_generation_prompt);
        if let Some(tools) = &tools {
            conversation = conversation.tools(tools);
        }
        if let Some(documents) = &documents {
            conversation = conversation.documents(documents);
        }
        for (name, value) in kwargs {
            conversation = conversation.kwarg(name.clone(), value);
        }
        let rendered = self.render_conversation(&conversation)?;
        match final_text {
            None => Ok(rendered),
            Some(text) => cut_after_final_message(rendered, &text),
        }
    }
}

/// `apply_chat_template`'s own parameters: never template variables from the request.
const NAMED_ARGUMENTS: [&str; 8] = [
    "messages",
    "conversation",
    "tools",
    "documents",
    "add_generation_prompt",
    "continue_final_message",
    "return_dict",
    "return_assistant_tokens_mask",
];

/// A boolean field of the body, `default` when absent or null.
fn flag(body: &Map<String, Json>, name: &str, default: bool) -> Json {
    body.get(name).filter(|v| !v.is_null()).cloned().unwrap_or(Json::Bool(default))
}

/// Python's truth of a JSON value.
fn truthy(value: &Json) -> bool {
    match value {
        Json::Null => false,
        Json::Bool(b) => *b,
        Json::Number(n) => n.as_f64() != Some(0.0),
        Json::String(s) => !s.is_empty(),
        Json::Array(a) => !a.is_empty(),
        Json::Object(o) => !o.is_empty(),
    }
}

fn role(message: &Map<String, Json>) -> &str {
    message.get("role").and_then(Json::as_str).unwrap_or_default()
}

/// The text parts of a message's content, `Err` naming the first part that is not text.
/// `None` content is no parts; a string is one.
fn text_parts(index: usize, content: Option<&Json>) -> Result<Vec<String>, Unrenderable> {
    let parts = match content {
        None | Some(Json::Null) => return Ok(Vec::new()),
        Some(Json::String(text)) => return Ok(vec![text.clone()]),
        Some(Json::Array(parts)) => parts,
        Some(_) => {
            return Err(Unrenderable::Refused(format!(
                "messages[{index}].content must be a string, a list of parts or null"
            )));
        }
    };
    let mut texts = Vec::with_capacity(parts.len());
    for part in parts {
        let kind = part.get("type").and_then(Json::as_str);
        let field = match part {
            Json::String(text) => {
                texts.push(text.clone());
                continue;
            }
            _ => kind.and_then(|kind| TEXT_PARTS.iter().find(|(k, _)| *k == kind)),
        };
        match (field, kind) {
            (Some((_, field)), _) => match part.get(*field) {
                None | Some(Json::Null) => {}
                Some(Json::String(text)) => texts.push(text.clone()),
                Some(_) => {
                    return Err(Unrenderable::Refused(format!(
                        "messages[{index}].content: a {field} part's {field} must be a string"
                    )));
                }
            },
            (None, Some("tool_reference")) => {
                texts.push(part.get("name").and_then(Json::as_str).unwrap_or_default().to_owned());
            }
            (None, kind) => {
                return Err(Unrenderable::NonTextPart {
                    message: index,
                    kind: kind.unwrap_or_default().to_owned(),
                });
            }
        }
    }
    Ok(texts)
}

/// Content in `format`: the texts joined with `separator`, or as text parts.
fn content_of(texts: Vec<String>, format: ContentFormat, separator: &str) -> Json {
    match format {
        ContentFormat::String => Json::String(texts.join(separator)),
        ContentFormat::OpenAi => Json::Array(
            texts
                .into_iter()
                .map(|text| serde_json::json!({"type": "text", "text": text}))
                .collect(),
        ),
    }
}

/// One message as vLLM's `_parse_chat_message_content` and `_postprocess_messages` make it.
fn vllm_message(
    index: usize,
    message: &Json,
    format: ContentFormat,
) -> Result<Map<String, Json>, Unrenderable> {
    let role = message.get("role").and_then(Json::as_str).unwrap_or_default();
    let mut texts = text_parts(index, message.get("content"))?;
    if role == "system" {
        texts = texts
            .into_iter()
            .filter_map(|text| match text.strip_prefix(BILLING_HEADER) {
                None => Some(text),
                Some(line) => {
                    line.split_once('\n').map(|(_, rest)| rest.to_owned()).filter(|r| !r.is_empty())
                }
            })
            .collect();
    }
    let mut out = Map::new();
    out.insert("role".into(), Json::from(role));
    out.insert("content".into(), content_of(texts, format, "\n"));
    match role {
        "assistant" => {
            if let Some(calls) = message.get("tool_calls").filter(|c| !c.is_null())
                && let Some(calls) = vllm_tool_calls(calls)?
            {
                out.insert("tool_calls".into(), calls);
            }
            if let Some(reasoning) = message.get("reasoning").filter(|r| !r.is_null()) {
                out.insert("reasoning".into(), reasoning.clone());
                out.insert("reasoning_content".into(), reasoning.clone());
            }
        }
        "tool" => {
            if let Some(id) = message.get("tool_call_id") {
                out.insert("tool_call_id".into(), id.clone());
            }
        }
        _ => {}
    }
    for field in ["name", "task"] {
        if let Some(value) = message.get(field).filter(|v| v.is_string()) {
            out.insert(field.into(), value.clone());
        }
    }
    if role == "developer" {
        out.insert("tools".into(), message.get("tools").cloned().unwrap_or(Json::Null));
    }
    Ok(out)
}

/// An assistant's `tool_calls` with every `function.arguments` an object, as templates expect
/// them; `None` for an empty list (dropped, so the template takes its plain path).
fn vllm_tool_calls(calls: &Json) -> Result<Option<Json>, Unrenderable> {
    let Json::Array(calls) = calls else { return Ok(Some(calls.clone())) };
    if calls.is_empty() {
        return Ok(None);
    }
    let mut out = calls.clone();
    for call in &mut out {
        let refused = || {
            Unrenderable::Refused(
                "assistant tool_calls must be objects of type function with a function object"
                    .to_owned(),
            )
        };
        let Json::Object(call) = call else { return Err(refused()) };
        if call.get("type").is_some_and(|t| t.as_str() != Some("function")) {
            return Err(refused());
        }
        let Some(Json::Object(function)) = call.get_mut("function") else { return Err(refused()) };
        let arguments = match function.get("arguments") {
            Some(arguments) if truthy(arguments) => match arguments {
                Json::String(text) => serde_json::from_str::<Json>(text).ok(),
                other => Some(other.clone()),
            },
            _ => None,
        };
        let arguments =
            arguments.filter(Json::is_object).unwrap_or_else(|| Json::Object(Map::new()));
        function.insert("arguments".into(), arguments);
    }
    Ok(Some(Json::Array(out)))
}

/// vLLM's handling of a template that never names `developer`: developer messages become
/// system messages, and all system messages one at the start when there are several or one
/// later.
fn developer_as_system(conversation: Vec<Map<String, Json>>) -> Vec<Map<String, Json>> {
    let converted: Vec<Map<String, Json>> = conversation
        .into_iter()
        .map(|mut message| {
            if role(&message) == "developer" {
                message.insert("role".into(), Json::from("system"));
                message.remove("tools");
            }
            message
        })
        .collect();
    let mut system = Vec::new();
    let mut others = Vec::new();
    let mut consolidate = false;
    for (i, message) in converted.iter().enumerate() {
        if role(message) != "system" {
            others.push(message.clone());
            continue;
        }
        consolidate |= i > 0 || !system.is_empty();
        let text = match message.get("content") {
            Some(Json::String(text)) => text.clone(),
            Some(Json::Array(parts)) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Json::as_str).or(p.as_str()))
                .collect::<Vec<_>>()
                .join("\n"),
            _ => String::new(),
        };
        if !text.is_empty() {
            system.push(text);
        }
    }
    if !consolidate {
        return converted;
    }
    let merged = Map::from_iter([
        ("role".to_owned(), Json::from("system")),
        ("content".to_owned(), Json::String(system.join("\n\n"))),
    ]);
    std::iter::once(merged).chain(others).collect()
}

/// vLLM's tool dicts: `{type, function: {name, description, parameters, strict?}}` in that
/// order, absent description and parameters as `null`; `None` for no tools.
fn vllm_tools(tools: Option<&Json>) -> Result<Option<Json>, Unrenderable> {
    let Some(tools) = tools.filter(|t| !t.is_null()) else { return Ok(None) };
    let refused = || {
        Unrenderable::Refused("tools must be a list of {type: function, function: {name}}".into())
    };
    let Json::Array(tools) = tools else { return Err(refused()) };
    let mut out = Vec::with_capacity(tools.len());
    for tool in tools {
        let Some(function) = tool.get("function").and_then(Json::as_object) else {
            return Err(refused());
        };
        let Some(name) = function.get("name").filter(|n| n.is_string()) else {
            return Err(refused());
        };
        if tool.get("type").is_some_and(|t| t.as_str() != Some("function")) {
            return Err(refused());
        }
        let outer_defer = tool.get("defer_loading").filter(|v| !v.is_null());
        let mut dumped = Map::new();
        dumped.insert("name".into(), name.clone());
        for field in ["description", "parameters"] {
            dumped.insert(field.into(), function.get(field).cloned().unwrap_or(Json::Null));
        }
        if let Some(strict) = function.get("strict").filter(|v| !v.is_null()) {
            dumped.insert("strict".into(), strict.clone());
        }
        if let Some(defer) = function.get("defer_loading").filter(|v| !v.is_null()).or(outer_defer)
        {
            dumped.insert("defer_loading".into(), defer.clone());
        }
        let mut tool_out = Map::new();
        tool_out.insert("type".into(), Json::from("function"));
        tool_out.insert("function".into(), Json::Object(dumped));
        if let Some(defer) = outer_defer {
            tool_out.insert("defer_loading".into(), defer.clone());
        }
        out.push(Json::Object(tool_out));
    }
    Ok(Some(Json::Array(out)))
}

/// One message as SGLang's `_apply_jinja_template` makes it: the client's fields without
/// nulls, content a string or text parts, tool call arguments parsed.
fn sglang_message(
    index: usize,
    message: &Json,
    format: ContentFormat,
) -> Result<Map<String, Json>, Unrenderable> {
    let mut out: Map<String, Json> = message
        .as_object()
        .map(|m| {
            m.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), v.clone())).collect()
        })
        .unwrap_or_default();
    let content = match out.get("content") {
        None => Json::from(""),
        Some(Json::Array(_)) => {
            let texts = text_parts(index, out.get("content"))?;
            let separator = " ";
            match (role(&out), format) {
                ("tool", _) | (_, ContentFormat::String) => Json::String(texts.join(separator)),
                (_, ContentFormat::OpenAi) => content_of(texts, format, separator),
            }
        }
        Some(other) => other.clone(),
    };
    out.insert("content".into(), content);
    if role(&out) == "assistant"
        && let Some(Json::Array(calls)) = out.get_mut("tool_calls")
    {
        for call in calls {
            if let Some(Json::Object(function)) = call.get_mut("function")
                && let Some(Json::String(arguments)) = function.get("arguments")
            {
                let parsed: Json = serde_json::from_str(arguments)
                    .ok()
                    .filter(Json::is_object)
                    .ok_or_else(|| {
                        Unrenderable::Refused(
                            "assistant tool call function.arguments must be a JSON object".into(),
                        )
                    })?;
                function.insert("arguments".into(), parsed);
            }
        }
    }
    Ok(out)
}

/// SGLang's tools: the client's, unless `tool_choice` is `none` (or names one function).
fn sglang_tools(body: &Map<String, Json>) -> Option<Json> {
    let tools = body.get("tools")?.as_array().filter(|t| !t.is_empty())?;
    match body.get("tool_choice") {
        Some(Json::String(choice)) if choice == "none" => None,
        Some(Json::Object(choice)) => {
            let name = choice.get("function").and_then(|f| f.get("name"));
            let chosen = tools
                .iter()
                .filter(|t| t.get("function").and_then(|f| f.get("name")) == name)
                .cloned()
                .collect();
            Some(Json::Array(chosen))
        }
        _ => Some(Json::Array(tools.clone())),
    }
}

/// Appends transformers' tag to the final message's text and returns that text.
fn tag_final_message(
    messages: &mut [Map<String, Json>],
    facts: &TemplateFacts,
) -> Result<String, Unrenderable> {
    let refused = |why: &str| Unrenderable::Refused(format!("continue_final_message: {why}"));
    if !facts.mentions_content {
        return Err(refused("the chat template does not read content"));
    }
    let last = messages.last_mut().ok_or_else(|| refused("there is no final message"))?;
    match last.get_mut("content") {
        Some(Json::String(text)) => {
            let original = text.clone();
            text.push_str(CONTINUE_TAG);
            Ok(original)
        }
        Some(Json::Array(parts)) => {
            let part = parts
                .iter_mut()
                .rev()
                .find_map(|p| {
                    p.get_mut("text")
                        .and_then(|t| if let Json::String(t) = t { Some(t) } else { None })
                })
                .ok_or_else(|| refused("the final message has no text to continue"))?;
            let original = part.clone();
            part.push_str(CONTINUE_TAG);
            Ok(original)
        }
        _ => Err(refused("the final message has no content")),
    }
}

/// transformers' cut of a render at the end of the final message.
fn cut_after_final_message(rendered: String, final_text: &str) -> Result<String, Unrenderable> {
    let tag = CONTINUE_TAG.trim();
    if !rendered.contains(final_text.trim()) || !rendered.contains(tag) {
        return Err(Unrenderable::Refused(
            "continue_final_message: the final message does not appear in the rendered chat"
                .to_owned(),
        ));
    }
    let at = rendered.rfind(tag).unwrap_or_default();
    let mut text = rendered;
    if text[at..].starts_with(CONTINUE_TAG) {
        text.truncate(at);
    } else {
        text.truncate(at);
        text.truncate(text.trim_end().len());
    }
    Ok(text)
}

#[cfg(test)]
mod tests;
