//! `POST /v1/chat/completions`: the request's messages, limits and PD bootstrap fields, run by
//! the shared generation path and answered in OpenAI's chat shapes (`openai.rs`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use serde::Deserialize;

use super::Engine;
use super::error::ApiError;
use super::generation::{self, Bootstrap, Input, Prompt, Request};
use super::openai::{self, AnswerMeta, OpenAiFraming, Shape};
use crate::tokens::ChatMessage;

#[derive(Debug, Deserialize)]
struct ChatRequest {
    #[serde(default)]
    model: Option<String>,
    messages: Vec<RawMessage>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    bootstrap_host: Option<String>,
    #[serde(default)]
    bootstrap_port: Option<u16>,
    #[serde(default)]
    bootstrap_room: Option<u64>,
    #[serde(default)]
    data_parallel_rank: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct RawMessage {
    role: String,
    #[serde(default)]
    content: Option<Content>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

impl RawMessage {
    /// The message as vLLM hands it to a template that reads content as a string: text parts
    /// joined with newlines, no content as empty text.
    fn normalise(self) -> ChatMessage {
        let content = match self.content {
            None => String::new(),
            Some(Content::Text(text)) => text,
            Some(Content::Parts(parts)) => parts
                .into_iter()
                .filter(|p| p.kind == "text")
                .filter_map(|p| p.text)
                .collect::<Vec<_>>()
                .join("\n"),
        };
        ChatMessage { role: self.role, content }
    }
}

/// The handler.
pub(crate) async fn chat_completions(
    State(engine): State<Arc<Engine>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    generation::serve(engine, |engine| async move {
        let (request, answer) = parse(&body, &engine.config.model)?;
        let request = request.with_rank_header(&headers)?;
        let generation = generation::start(&engine, request).await?;
        let meta = AnswerMeta::new(&engine, "chatcmpl");
        let framing =
            OpenAiFraming { meta, shape: Shape::Chat, include_usage: answer.include_usage };
        openai::respond(engine, generation, framing, answer.stream).await
    })
    .await
}

/// How the answer is written.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    stream: bool,
    include_usage: bool,
}

fn parse(body: &[u8], served: &str) -> Result<(Request, Answer), ApiError> {
    let request: ChatRequest = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))?;
    generation::check_model(request.model.as_deref(), served)?;
    let bootstrap = match (request.bootstrap_host, request.bootstrap_port, request.bootstrap_room) {
        (Some(host), Some(port), Some(room)) => Some(Bootstrap { host, port, rooms: vec![room] }),
        (None, None, None) => None,
        _ => {
            return Err(ApiError::bad_request(
                "bootstrap_host, bootstrap_port and bootstrap_room go together",
            ));
        }
    };
    if request.messages.is_empty() {
        return Err(ApiError::bad_request("messages must not be empty"));
    }
    let max_tokens = request.max_completion_tokens.or(request.max_tokens);
    if max_tokens == Some(0) {
        return Err(ApiError::bad_request("max_tokens must be at least 1"));
    }
    let answer = Answer {
        stream: request.stream.unwrap_or(false),
        include_usage: request.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
    };
    let messages = request.messages.into_iter().map(RawMessage::normalise).collect();
    let prompt = Prompt { input: Input::Chat(messages), max_tokens };
    let rank = Request::body_rank(request.data_parallel_rank)?;
    Ok((Request { rank, ..Request::new(vec![prompt], bootstrap) }, answer))
}
