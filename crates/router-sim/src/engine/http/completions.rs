//! `POST /v1/completions`, OpenAI's legacy completions: `prompt` as a string, a list of
//! strings, a list of token ids or a list of lists of them (raw text, no chat template), `n`
//! choices per prompt, `max_tokens`, `echo`, `stream` with `stream_options.include_usage`, and
//! the PD bootstrap fields; run by the shared generation path and answered in the
//! `text_completion` shapes (`openai.rs`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;

use super::Engine;
use super::error::ApiError;
use super::fields::{self, Fields, Forms};
use super::generation::{self, Input, Prompt, Request};
use super::openai::{self, AnswerMeta, OpenAiFraming, Shape};
use crate::tokens::Preprocessor;

/// How the answer is written.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    stream: bool,
    include_usage: bool,
    echo: bool,
}

/// The handler.
pub(crate) async fn completions(
    State(engine): State<Arc<Engine>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    generation::serve(engine, |engine| async move {
        let vocab_size = engine.preprocessor.vocab_size();
        let (request, answer) = parse(&body, &engine.config.model, vocab_size)?;
        let request = request.with_rank_header(&headers)?;
        let echo = answer.echo.then(|| echoes(&engine.preprocessor, &request)).transpose()?;
        let generation = generation::start(&engine, request).await?;
        let meta = AnswerMeta::new(&engine, "cmpl");
        let framing = OpenAiFraming {
            meta,
            shape: Shape::Text { echo },
            include_usage: answer.include_usage,
        };
        openai::respond(engine, generation, framing, answer.stream).await
    })
    .await
}

/// The text `echo` puts before each prompt's choices.
fn echoes(preprocessor: &Preprocessor, request: &Request) -> Result<Vec<String>, ApiError> {
    let echo = |prompt: &Prompt| match &prompt.input {
        Input::Text(text) => Ok(text.clone()),
        Input::Ids(ids) => preprocessor.decode(ids).map_err(|e| {
            ApiError::bad_request(format!(
                "cannot echo the prompt: {}",
                generation::error_chain(&e)
            ))
        }),
        Input::Chat(_) => Ok(String::new()),
    };
    request.prompts.iter().map(echo).collect()
}

fn parse(body: &[u8], served: &str, vocab_size: usize) -> Result<(Request, Answer), ApiError> {
    let body = fields::body(body)?;
    let fields = Fields::top(&body);
    generation::check_model(fields.str("model")?, served)?;
    let prompt = fields.get("prompt").ok_or_else(|| ApiError::bad_request("prompt is required"))?;
    let (inputs, _) = fields::prompts(prompt, "prompt", Forms::Any, vocab_size)?;
    let max_tokens = fields.limit("max_tokens")?;
    let n = fields.limit("n")?.unwrap_or(1);
    let runs = fields::runs(inputs.len(), n)?;
    let bootstrap = fields::bootstrap(fields, runs)?;
    let stream = fields.bool("stream")?.unwrap_or(false);
    let include_usage = match fields.get("stream_options") {
        Some(options) => Fields::of(options, "stream_options")?.bool("include_usage")?,
        None => None,
    };
    let answer = Answer {
        stream,
        include_usage: include_usage.unwrap_or(false),
        echo: fields.bool("echo")?.unwrap_or(false),
    };
    let prompts = inputs.into_iter().map(|input| Prompt { input, max_tokens }).collect();
    let n = n as usize;
    let rank = Request::body_rank(fields.u64("data_parallel_rank")?)?;
    Ok((Request { prompts, n, bootstrap, rank }, answer))
}

#[cfg(test)]
mod tests;
