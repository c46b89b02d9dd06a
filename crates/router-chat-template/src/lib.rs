//! Hugging Face chat templates, loaded and rendered the way transformers does it, for the router
//! and the simulated engine alike.
//!
//! Owns [`ChatTemplate`]: the minijinja environment set up like transformers' Jinja2 one
//! (`trim_blocks`, `lstrip_blocks`, loop controls, `{% generation %}`, `raise_exception`,
//! `strftime_now`, a `tojson` printing like Python's `json.dumps`, Python's string and dict
//! methods, and Python's `str()` for printed values); loading from `tokenizer_config.json`
//! (a `chat_template` string or a list of named templates), `chat_template.jinja` and
//! `additional_chat_templates/`; choosing among named templates as transformers does
//! (`tool_use` when tools are given and there is one, else `default`); and rendering a
//! [`Conversation`] with the [`SpecialTokens`] transformers passes (`bos_token`, `eos_token`,
//! ...). Errors are [`TemplateError`]s.
//!
//! Does not own: tokenization, what a request's messages look like before rendering (router-server
//! passes the client's JSON messages, router-sim its normalised text messages), request
//! validation or HTTP status mapping.
//!
//! The router and an engine must turn the same request into the same token ids, or every
//! prefix-cache hit silently becomes a miss; both render with this crate, and
//! `tests/goldens.rs` checks it against renders produced by transformers itself
//! (`testdata/generate.py`).
//!
//! Deliberate differences from transformers: `strftime_now` formats UTC (transformers uses the
//! local time zone; servers usually run in UTC), `continue_final_message` and assistant masks
//! are not offered.
//!
//! ```
//! use router_chat_template::{ChatTemplate, Conversation, SpecialTokens};
//!
//! let template = ChatTemplate::new(
//!     "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content | trim }}\n{% endfor %}\
//!      {% if add_generation_prompt %}[assistant] {% endif %}",
//!     SpecialTokens::new().with("bos_token", "<s>"),
//! )?;
//! let messages = serde_json::json!([{"role": "user", "content": " hi "}]);
//! let text = template.render_conversation(&Conversation::new(&messages).add_generation_prompt(true))?;
//! assert_eq!(text, "<s>[user] hi\n[assistant] ");
//! # Ok::<(), router_chat_template::TemplateError>(())
//! ```

#![forbid(unsafe_code)]

mod conversation;
mod env;
mod error;
mod facts;
mod json;
mod load;
mod python;
mod request;
mod special;
mod strftime;
mod template;

pub use conversation::Conversation;
pub use error::{ConfigProblem, TemplateError};
pub use facts::ContentFormat;
pub use request::{EngineRules, REQUEST_FIELDS, RenderedPrompt, Unrenderable};
pub use special::SpecialTokens;
pub use strftime::strftime;
pub use template::ChatTemplate;

/// The name of a single template, and of the one chosen when no other fits.
pub const DEFAULT: &str = "default";
/// The name of the template chosen when tools are given.
pub const TOOL_USE: &str = "tool_use";
