//! Request preparation on the engine side: chat-template rendering and tokenization (of chat
//! messages, and of raw text prompts without a template).
//!
//! Two modes that agree byte for byte on the shipped assets:
//! - built in ([`Preprocessor::builtin`]): ChatML rendering
//!   (`<|im_start|>role\ncontent<|im_end|>\n` per message, then `<|im_start|>assistant\n`) and one
//!   token per UTF-8 byte (token id = byte value);
//! - from a `tokenizer.json` ([`Preprocessor::from_tokenizer_file`]): the Hugging Face tokenizer
//!   in that file and the chat template transformers finds beside it (`tokenizer_config.json`'s
//!   `chat_template`, or `chat_template.jinja`), rendered by router-chat-template, the
//!   implementation the router renders with too.
//!
//! Message contents are normalised to plain strings first (text parts of an OpenAI content
//! array are concatenated, `null` becomes empty), so both modes see the same input.

mod bytelevel;

use std::path::{Path, PathBuf};

pub use bytelevel::byte_level_tokenizer_json;
use router_chat_template::{ChatTemplate, TemplateError};

/// One chat message after normalisation: a role and its text.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message with the given role and text.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into() }
    }
}

/// Why a prompt could not be prepared.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PrepareError {
    /// The tokenizer file could not be loaded.
    #[error("cannot load tokenizer {path}")]
    LoadTokenizer {
        /// The file given.
        path: PathBuf,
        /// What the tokenizers crate reported.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The chat template beside the tokenizer could not be loaded: none there, unreadable, or
    /// it does not compile.
    #[error("cannot load the chat template beside {path}")]
    Template {
        /// The tokenizer file.
        path: PathBuf,
        /// Why.
        #[source]
        source: TemplateError,
    },
    /// Rendering the chat template failed (for example `raise_exception` in the template).
    #[error("chat template rendering failed")]
    Render(#[source] TemplateError),
    /// Tokenizing the rendered prompt failed.
    #[error("tokenization failed")]
    Encode(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Turning token ids back into text failed.
    #[error("detokenization failed")]
    Decode(#[source] Box<dyn std::error::Error + Send + Sync>),
}

enum Template {
    ChatMl,
    Jinja(Box<ChatTemplate>),
}

enum Tokens {
    Bytes,
    HuggingFace(Box<tokenizers::Tokenizer>),
}

/// Renders chat messages into a prompt and tokenizes text. Cheap to share behind an `Arc`.
pub struct Preprocessor {
    template: Template,
    tokens: Tokens,
    source: Option<PathBuf>,
    vocab_size: usize,
}

impl std::fmt::Debug for Preprocessor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Preprocessor").field("source", &self.source).finish_non_exhaustive()
    }
}

impl Preprocessor {
    /// The built-in ChatML rendering with one token per UTF-8 byte; identical to loading the
    /// shipped assets ([`crate::assets::tokenizer_path`]).
    pub fn builtin() -> Self {
        Self { template: Template::ChatMl, tokens: Tokens::Bytes, source: None, vocab_size: 256 }
    }

    /// Loads `tokenizer.json` at `path` and the chat template beside it.
    pub fn from_tokenizer_file(path: &Path) -> Result<Self, PrepareError> {
        let tokenizer = tokenizers::Tokenizer::from_file(path)
            .map_err(|source| PrepareError::LoadTokenizer { path: path.to_owned(), source })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let template = ChatTemplate::from_dir(dir)
            .map_err(|source| PrepareError::Template { path: path.to_owned(), source })?;
        let vocab_size =
            tokenizer.get_vocab(true).into_values().max().map_or(0, |id| id as usize + 1);
        Ok(Self {
            vocab_size,
            template: Template::Jinja(Box::new(template)),
            tokens: Tokens::HuggingFace(Box::new(tokenizer)),
            source: Some(path.to_owned()),
        })
    }

    /// The tokenizer file this was loaded from; `None` for the built-in mode.
    pub fn source(&self) -> Option<&Path> {
        self.source.as_deref()
    }

    /// Renders `messages` with the chat template and a generation prompt.
    pub fn render(&self, messages: &[ChatMessage]) -> Result<String, PrepareError> {
        match &self.template {
            Template::ChatMl => Ok(render_chatml(messages)),
            Template::Jinja(template) => {
                template.render(messages, None).map_err(PrepareError::Render)
            }
        }
    }

    /// Tokenizes text without adding special tokens (the template already did).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, PrepareError> {
        match &self.tokens {
            Tokens::Bytes => Ok(text.bytes().map(u32::from).collect()),
            Tokens::HuggingFace(tokenizer) => tokenizer
                .encode(text, false)
                .map(|encoding| encoding.get_ids().to_vec())
                .map_err(PrepareError::Encode),
        }
    }

    /// Tokenizes a raw text prompt (completions, `/generate`): no chat template, and the
    /// special tokens the tokenizer's post-processor adds (a BOS, say) are added, as vLLM and
    /// SGLang do for a plain prompt. The built-in and shipped tokenizers add none.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, PrepareError> {
        match &self.tokens {
            Tokens::Bytes => self.encode(text),
            Tokens::HuggingFace(tokenizer) => tokenizer
                .encode(text, true)
                .map(|encoding| encoding.get_ids().to_vec())
                .map_err(PrepareError::Encode),
        }
    }

    /// Every token id is below this: 256 for the built-in tokenizer, one more than the largest
    /// id of the vocabulary and its added tokens for a `tokenizer.json`.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Renders and tokenizes: the token ids the engine computes and caches.
    pub fn prompt_ids(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, PrepareError> {
        self.encode(&self.render(messages)?)
    }

    /// The text of a run of tokens, special tokens kept. The built-in tokenizer turns bytes
    /// that are not valid UTF-8 into replacement characters.
    pub fn decode(&self, ids: &[u32]) -> Result<String, PrepareError> {
        match &self.tokens {
            Tokens::Bytes => {
                let bytes: Vec<u8> = ids.iter().filter_map(|id| u8::try_from(*id).ok()).collect();
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
            Tokens::HuggingFace(tokenizer) => {
                tokenizer.decode(ids, false).map_err(PrepareError::Decode)
            }
        }
    }

    /// The Hugging Face tokenizer, when loaded from a file.
    pub(crate) fn hugging_face(&self) -> Option<&tokenizers::Tokenizer> {
        match &self.tokens {
            Tokens::Bytes => None,
            Tokens::HuggingFace(tokenizer) => Some(tokenizer),
        }
    }

    /// The text of one token, for streaming. Token ids that do not decode to valid UTF-8 on
    /// their own are replaced lossily (the simulator only generates ASCII filler).
    pub fn decode_token(&self, id: u32) -> String {
        match &self.tokens {
            Tokens::Bytes => u8::try_from(id)
                .map(|byte| String::from_utf8_lossy(&[byte]).into_owned())
                .unwrap_or_default(),
            Tokens::HuggingFace(tokenizer) => tokenizer.decode(&[id], false).unwrap_or_default(),
        }
    }
}

/// The built-in ChatML rendering, equal to the shipped `chat_template`.
pub fn render_chatml(messages: &[ChatMessage]) -> String {
    let size: usize = messages.iter().map(|m| m.role.len() + m.content.len() + 24).sum();
    let mut out = String::with_capacity(size + 22);
    for message in messages {
        out.push_str("<|im_start|>");
        out.push_str(&message.role);
        out.push('\n');
        out.push_str(&message.content);
        out.push_str("<|im_end|>\n");
    }
    out.push_str("<|im_start|>assistant\n");
    out
}

#[cfg(test)]
mod tests;
