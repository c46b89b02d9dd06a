//! OpenAI answer shapes, chat and legacy completions alike: the `chat.completion` and
//! `text_completion` objects, and their SSE streams (`chat.completion.chunk`: a role chunk with
//! the first token, one chunk per token, a finish chunk; `text_completion`: one chunk per token,
//! the prompt before the first with `echo`, a finish chunk; then a usage chunk when
//! `stream_options.include_usage`, and `data: [DONE]`). Choice `index` is the run's index
//! (prompt × `n` + choice); usage counts each prompt once, as OpenAI does.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::Engine;
use super::generation::{Framing, Generation, Release, Run, push_event};

/// Identity of one answer.
#[derive(Debug)]
pub(crate) struct AnswerMeta {
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) model: String,
}

impl AnswerMeta {
    /// A new answer id `{prefix}-sim-N`.
    pub(crate) fn new(engine: &Engine, prefix: &str) -> Self {
        let id = engine.next_id.fetch_add(1, Ordering::Relaxed);
        Self {
            id: format!("{prefix}-sim-{id}"),
            created: super::unix_now(),
            model: engine.config.model.clone(),
        }
    }
}

/// Which OpenAI API the answer belongs to.
#[derive(Debug)]
pub(crate) enum Shape {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`; with `echo`, the text of each prompt, by prompt index.
    Text { echo: Option<Vec<String>> },
}

impl Shape {
    fn object(&self, stream: bool) -> &'static str {
        match (self, stream) {
            (Shape::Chat, false) => "chat.completion",
            (Shape::Chat, true) => "chat.completion.chunk",
            (Shape::Text { .. }, _) => "text_completion",
        }
    }

    /// The echoed prompt before a run's output.
    fn echo(&self, run: &Run) -> &str {
        match self {
            Shape::Text { echo: Some(texts) } => &texts[run.prompt],
            _ => "",
        }
    }

    /// A choice of a whole answer.
    fn choice(&self, index: usize, run: &Run) -> Value {
        let text = run.text(run.generated);
        let mut choice = match self {
            Shape::Chat => json!({ "message": { "role": "assistant", "content": text } }),
            Shape::Text { .. } => json!({ "text": format!("{}{text}", self.echo(run)) }),
        };
        choice["index"] = json!(index);
        choice["logprobs"] = Value::Null;
        choice["finish_reason"] = json!(run.finish.as_str());
        choice
    }

    /// A streamed choice: token `token` of `run`, or (`None`) its finish.
    fn delta(&self, index: usize, run: &Run, token: Option<usize>) -> Value {
        let piece = token.map(|t| run.pieces[t].as_str());
        let mut choice = match (self, token) {
            (Shape::Chat, Some(0)) => {
                json!({ "delta": { "role": "assistant", "content": piece } })
            }
            (Shape::Chat, Some(_)) => json!({ "delta": { "content": piece } }),
            (Shape::Chat, None) => json!({ "delta": {} }),
            (Shape::Text { .. }, Some(0)) => {
                json!({ "text": format!("{}{}", self.echo(run), piece.unwrap_or_default()) })
            }
            (Shape::Text { .. }, _) => json!({ "text": piece.unwrap_or_default() }),
        };
        choice["index"] = json!(index);
        choice["logprobs"] = Value::Null;
        choice["finish_reason"] = token.map_or_else(|| json!(run.finish.as_str()), |_| Value::Null);
        choice
    }
}

/// Usage over `runs`: every prompt's tokens (and cached tokens) once, from its first choice,
/// and every choice's output.
fn usage(runs: &[Run]) -> Value {
    let firsts =
        runs.iter().enumerate().filter(|(k, run)| *k == 0 || runs[k - 1].prompt != run.prompt);
    let (prompt, cached) =
        firsts.fold((0, 0), |(p, c), (_, run)| (p + run.prompt_tokens, c + run.cached_tokens));
    let completion: usize = runs.iter().map(|run| run.generated).sum();
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": { "cached_tokens": cached },
    })
}

/// The whole answer of a finished generation.
pub(crate) fn completion(meta: &AnswerMeta, shape: &Shape, generation: &Generation) -> Response {
    let runs = &generation.runs;
    let choices: Vec<Value> =
        runs.iter().enumerate().map(|(k, run)| shape.choice(k, run)).collect();
    axum::Json(json!({
        "id": meta.id,
        "object": shape.object(false),
        "created": meta.created,
        "model": meta.model,
        "choices": choices,
        "usage": usage(runs),
    }))
    .into_response()
}

/// The SSE stream of either API.
#[derive(Debug)]
pub(crate) struct OpenAiFraming {
    pub(crate) meta: AnswerMeta,
    pub(crate) shape: Shape,
    pub(crate) include_usage: bool,
}

impl OpenAiFraming {
    fn chunk(&self, choices: Value) -> Value {
        let meta = &self.meta;
        let mut chunk = json!({
            "id": meta.id,
            "object": self.shape.object(true),
            "created": meta.created,
            "model": meta.model,
            "choices": choices,
        });
        if self.include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }
}

impl Framing for OpenAiFraming {
    fn release(&mut self, runs: &[Run], release: Release, out: &mut Vec<u8>) {
        let run = &runs[release.run];
        for token in release.from..release.to {
            let choice = self.shape.delta(release.run, run, Some(token));
            push_event(out, &self.chunk(json!([choice])));
        }
        if release.to == run.output_ids.len() {
            let finish = self.shape.delta(release.run, run, None);
            push_event(out, &self.chunk(json!([finish])));
        }
    }

    fn end(&mut self, runs: &[Run], out: &mut Vec<u8>) {
        if self.include_usage {
            let mut chunk = self.chunk(json!([]));
            chunk["usage"] = usage(runs);
            push_event(out, &chunk);
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
    }
}

/// Writes a started generation's answer, streamed or whole.
pub(crate) async fn respond(
    engine: Arc<Engine>,
    generation: Generation,
    framing: OpenAiFraming,
    stream: bool,
) -> Result<Response, super::error::ApiError> {
    if stream {
        return Ok(generation.stream(engine, framing));
    }
    let generation = generation.finish(&engine).await?;
    Ok(completion(&framing.meta, &framing.shape, &generation))
}
