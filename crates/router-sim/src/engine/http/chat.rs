//! `POST /v1/chat/completions`: parse, fault injection, PD bootstrap, submission to the
//! scheduler, and the answer (streamed or not).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt as _;
use http::StatusCode;
use router_workers::Stage;
use serde::Deserialize;
use tokio::sync::mpsc;

use super::Engine;
use super::error::ApiError;
use super::openai::{Answer, AnswerMeta};
use crate::engine::bootstrap::{RoomGuard, RoomInfo};
use crate::engine::output;
use crate::engine::scheduler::{Kind, Submission};
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
    fn normalise(self) -> ChatMessage {
        let content = match self.content {
            None => String::new(),
            Some(Content::Text(text)) => text,
            Some(Content::Parts(parts)) => parts
                .into_iter()
                .filter(|p| p.kind == "text")
                .filter_map(|p| p.text)
                .collect::<Vec<_>>()
                .concat(),
        };
        ChatMessage { role: self.role, content }
    }
}

/// The handler. Every answer, error or not, counts towards `die_after`.
pub(crate) async fn chat_completions(State(engine): State<Arc<Engine>>, body: Bytes) -> Response {
    engine.refuse_if_dying().await;
    match handle(&engine, &body).await {
        Ok(answer) => {
            let stall_body = engine.faults.stall_body();
            held_back(answer.respond(engine).await, stall_body)
        }
        Err(error) => {
            engine.faults.answered();
            error.into_response()
        }
    }
}

/// `response` with its body held back for `delay` after the head (`--stall-body-ms`).
fn held_back(response: Response, delay: std::time::Duration) -> Response {
    if delay.is_zero() {
        return response;
    }
    response.map(|body| {
        let late = futures::stream::once(tokio::time::sleep(delay))
            .filter_map(|()| std::future::ready(None::<Result<Bytes, axum::Error>>));
        axum::body::Body::from_stream(late.chain(body.into_data_stream()))
    })
}

fn parse(body: &[u8]) -> Result<ChatRequest, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

async fn handle(engine: &Arc<Engine>, body: &[u8]) -> Result<Answer, ApiError> {
    let request = parse(body)?;
    let config = &engine.config;
    if let Some(model) = &request.model
        && model != &config.model
    {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("model {model:?} is not served here (this engine serves {:?})", config.model),
        ));
    }
    let room = match (&request.bootstrap_host, request.bootstrap_port, request.bootstrap_room) {
        (Some(host), Some(port), Some(room)) => Some((host.clone(), port, room)),
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
    let requested = request.max_completion_tokens.or(request.max_tokens);
    if requested == Some(0) {
        return Err(ApiError::bad_request("max_tokens must be at least 1"));
    }
    let stream = request.stream.unwrap_or(false);
    let include_usage = request.stream_options.and_then(|o| o.include_usage).unwrap_or(false);
    let messages: Vec<ChatMessage> =
        request.messages.into_iter().map(RawMessage::normalise).collect();

    let stall = engine.faults.stall();
    if !stall.is_zero() {
        tokio::time::sleep(stall).await;
    }
    // A prefill engine's room fails unless this request gets as far as its first token.
    let mut room_guard = match (&engine.rooms, &room) {
        (Some(rooms), Some((_, _, room))) => Some(RoomGuard::new(Arc::clone(rooms), *room)),
        _ => None,
    };
    if engine.faults.roll_failure() {
        if let Some(guard) = &mut room_guard {
            guard.fail("injected failure (--fail-rate)");
        }
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "injected failure (--fail-rate)",
        ));
    }

    let prompt = engine.preprocessor.prompt_ids(&messages).map_err(|e| {
        ApiError::bad_request(format!("cannot prepare the prompt: {}", error_chain(&e)))
    })?;
    let prompt_hash = format!("{:016x}", output::prompt_hash(&prompt));
    if let Some(guard) = &mut room_guard {
        guard.describe(prompt.len(), prompt_hash.clone());
    }
    let room_capacity = engine.scheduler.output_room(prompt.len()).ok_or_else(|| {
        ApiError::bad_request(format!(
            "prompt of {} tokens does not fit the kv capacity of {} tokens",
            prompt.len(),
            config.kv_capacity_tokens / config.block_size * config.block_size
        ))
    })?;
    let wanted = match config.role {
        Stage::Prefill => 1,
        _ => requested
            .map_or(config.default_max_tokens, |n| usize::try_from(n).unwrap_or(usize::MAX)),
    };
    let count = wanted.min(room_capacity);
    // Filler never ends by itself: an explicit limit (or the KV room) ends it as "length";
    // the default length stands for a natural end of the answer.
    let finish_reason = if requested.is_some() || config.role == Stage::Prefill || count < wanted {
        "length"
    } else {
        "stop"
    };

    let kind = match config.role {
        Stage::Plain | Stage::Prefill => Kind::Full,
        Stage::Decode => {
            let Some((host, port, room)) = &room else {
                return Err(ApiError::bad_request(
                    "a decode engine needs bootstrap_host, bootstrap_port and bootstrap_room",
                ));
            };
            let client = engine.bootstrap.as_ref().ok_or_else(|| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "decode engine without bootstrap client",
                )
            })?;
            let RoomInfo { cached_tokens, .. } = client
                .fetch(host, *port, *room, prompt.len(), &prompt_hash)
                .await
                .map_err(|e| ApiError::new(e.status(), error_chain(&e)))?;
            Kind::Decode { cached_tokens }
        }
    };

    let seed = output::prompt_hash(&prompt);
    let (output_ids, pieces) = output::generate(&engine.preprocessor, seed, count)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, error_chain(&e)))?;
    let (tx, rx) = mpsc::unbounded_channel();
    let prompt_tokens = prompt.len();
    engine
        .scheduler
        .submit(Submission { prompt, output: output_ids, kind, tx })
        .map_err(|e| ApiError::bad_request(e.to_string()))?;

    let id = engine.next_id.fetch_add(1, Ordering::Relaxed);
    Ok(Answer {
        meta: AnswerMeta {
            id: format!("chatcmpl-sim-{id}"),
            created: super::unix_now(),
            model: config.model.clone(),
            prompt_tokens,
        },
        pieces,
        rx,
        stream,
        include_usage,
        room: room_guard,
        finish_reason,
    })
}

/// An error and its sources, `: `-separated, for messages that name the root cause.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
