//! OpenAI answer shapes: the `chat.completion` object, and the `chat.completion.chunk` SSE
//! stream (a role chunk with the first token, one chunk per token, a final chunk with the
//! finish reason, a usage chunk when `stream_options.include_usage`, then `data: [DONE]`).

use std::sync::Arc;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::stream;
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::Engine;
use super::error::ApiError;
use crate::engine::bootstrap::RoomGuard;
use crate::engine::scheduler::Progress;

/// Identity of one answer.
#[derive(Debug)]
pub(crate) struct AnswerMeta {
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) model: String,
    pub(crate) prompt_tokens: usize,
}

/// A submitted request whose answer is yet to be written.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) meta: AnswerMeta,
    /// The text of each output token.
    pub(crate) pieces: Vec<String>,
    pub(crate) rx: mpsc::UnboundedReceiver<Progress>,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    /// A prefill engine's bootstrap room, marked ready at the first token.
    pub(crate) room: Option<RoomGuard>,
    pub(crate) finish_reason: &'static str,
}

fn usage(meta: &AnswerMeta, completion: usize, cached: usize) -> Value {
    json!({
        "prompt_tokens": meta.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": meta.prompt_tokens + completion,
        "prompt_tokens_details": { "cached_tokens": cached },
    })
}

impl Answer {
    pub(crate) async fn respond(self, engine: Arc<Engine>) -> Response {
        if self.stream {
            return self.stream_response(engine);
        }
        let mut answer = self;
        let mut cached = None;
        let mut generated = 0;
        let completed = loop {
            match answer.rx.recv().await {
                Some(Progress::First { cached_tokens }) => {
                    cached = Some(cached_tokens);
                    generated += 1;
                    if let Some(room) = &mut answer.room {
                        room.ready(cached_tokens);
                    }
                }
                Some(Progress::Token) => generated += 1,
                Some(Progress::Done) => break true,
                None => break false,
            }
        };
        engine.faults.answered();
        if !completed {
            return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "engine stopped")
                .into_response();
        }
        let meta = &answer.meta;
        let body = json!({
            "id": meta.id,
            "object": "chat.completion",
            "created": meta.created,
            "model": meta.model,
            "choices": [{
                "index": 0,
                "message": { "role": "assistant", "content": answer.pieces[..generated].concat() },
                "logprobs": null,
                "finish_reason": answer.finish_reason,
            }],
            "usage": usage(meta, generated, cached.unwrap_or(0)),
        });
        axum::Json(body).into_response()
    }

    fn stream_response(self, engine: Arc<Engine>) -> Response {
        let state = StreamState { answer: self, engine, generated: 0, cached: 0, finished: false };
        let body = Body::from_stream(stream::unfold(state, StreamState::next_frame));
        let mut response = (StatusCode::OK, body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        response
    }
}

struct StreamState {
    answer: Answer,
    engine: Arc<Engine>,
    generated: usize,
    cached: usize,
    finished: bool,
}

/// The engine stopped before the answer was complete: the stream breaks.
#[derive(Debug, thiserror::Error)]
#[error("engine stopped mid-stream")]
struct Interrupted;

impl StreamState {
    fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> Value {
        let meta = &self.answer.meta;
        let mut chunk = json!({
            "id": meta.id,
            "object": "chat.completion.chunk",
            "created": meta.created,
            "model": meta.model,
            "choices": [{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason }],
        });
        if self.answer.include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    fn push_event(out: &mut Vec<u8>, value: &Value) {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(value.to_string().as_bytes());
        out.extend_from_slice(b"\n\n");
    }

    /// Appends the SSE events for one progress message.
    fn render(&mut self, progress: Progress, out: &mut Vec<u8>) {
        match progress {
            Progress::First { cached_tokens } => {
                self.cached = cached_tokens;
                if let Some(room) = &mut self.answer.room {
                    room.ready(cached_tokens);
                }
                let piece = self.answer.pieces.first().cloned().unwrap_or_default();
                self.generated = 1;
                let chunk = self.chunk(json!({ "role": "assistant", "content": piece }), None);
                Self::push_event(out, &chunk);
            }
            Progress::Token => {
                let piece = self.answer.pieces.get(self.generated).cloned().unwrap_or_default();
                self.generated += 1;
                let chunk = self.chunk(json!({ "content": piece }), None);
                Self::push_event(out, &chunk);
            }
            Progress::Done => {
                let chunk = self.chunk(json!({}), Some(self.answer.finish_reason));
                Self::push_event(out, &chunk);
                if self.answer.include_usage {
                    let meta = &self.answer.meta;
                    let usage_chunk = json!({
                        "id": meta.id,
                        "object": "chat.completion.chunk",
                        "created": meta.created,
                        "model": meta.model,
                        "choices": [],
                        "usage": usage(meta, self.generated, self.cached),
                    });
                    Self::push_event(out, &usage_chunk);
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
                self.finished = true;
                self.engine.faults.answered();
            }
        }
    }

    async fn next_frame(mut self) -> Option<(Result<Bytes, Interrupted>, Self)> {
        if self.finished {
            return None;
        }
        let mut out = Vec::new();
        match self.answer.rx.recv().await {
            Some(progress) => self.render(progress, &mut out),
            None => {
                self.finished = true;
                return Some((Err(Interrupted), self));
            }
        }
        // With a stream interval, a chunk waits until it holds that many tokens (or the end).
        let chunk_start = self.generated.saturating_sub(1);
        while !self.finished && self.generated - chunk_start < self.engine.config.stream_interval {
            match self.answer.rx.recv().await {
                Some(progress) => self.render(progress, &mut out),
                // The engine stopped: send what is here; the next call reports the break.
                None => break,
            }
        }
        // Coalesce what is already there (several decode steps may end at once).
        while !self.finished {
            match self.answer.rx.try_recv() {
                Ok(progress) => self.render(progress, &mut out),
                Err(_) => break,
            }
        }
        Some((Ok(Bytes::from(out)), self))
    }
}
