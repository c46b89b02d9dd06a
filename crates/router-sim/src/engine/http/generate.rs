//! `POST /generate`, SGLang's native API (its `GenerateReqInput`): `text` (a string or a list)
//! or `input_ids` (a list of ids or a list of lists), exactly one, tokenized raw (no chat
//! template); `sampling_params` (one object, or one per prompt), `rid`, `stream`,
//! `return_logprob` (accepted; no logprob fields are returned), `data_parallel_rank` and the PD
//! bootstrap fields.
//! Answers `{"text", "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens",
//! "completion_tokens", "cached_tokens", "e2e_latency"}}`, a list of them for a batch; a stream
//! sends `data: {...}` events with the cumulative text and ids (batched ones with `index`), then
//! `data: [DONE]`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};

use super::Engine;
use super::error::ApiError;
use super::fields::{self, Fields, Forms};
use super::generation::{self, Finish, Framing, Prompt, Release, Request, Run, push_event};

/// How the answer is written.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    stream: bool,
    /// A list of prompts was given: the answer is a list (streamed events carry `index`).
    batch: bool,
    /// `meta_info.id` of each run.
    rids: Vec<String>,
}

/// The handler.
pub(crate) async fn generate(
    State(engine): State<Arc<Engine>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    generation::serve(engine, |engine| async move {
        let (request, answer) = parse(&body, engine.preprocessor.vocab_size(), random_rid)?;
        let request = request.with_rank_header(&headers)?;
        let generation = generation::start(&engine, request).await?;
        if answer.stream {
            return Ok(generation.stream(engine, answer));
        }
        let generation = generation.finish(&engine).await?;
        let mut outputs = generation
            .runs
            .iter()
            .zip(&answer.rids)
            .map(|(run, rid)| output(rid, run, run.generated));
        let body = if answer.batch {
            Value::Array(outputs.collect())
        } else {
            outputs.next().unwrap_or_default()
        };
        Ok(axum::Json(body).into_response())
    })
    .await
}

/// A fresh request id, 32 hex digits like SGLang's.
fn random_rid() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// SGLang's output object for the first `tokens` tokens of `run`; `finish_reason` and
/// `e2e_latency` once they are all of its output.
fn output(rid: &str, run: &Run, tokens: usize) -> Value {
    let finished = tokens == run.output_ids.len();
    let finish_reason = match (finished, run.finish) {
        (false, _) => Value::Null,
        (true, Finish::Length) => json!({ "type": "length", "length": tokens }),
        // No stop token or string matched: the filler's default length is its natural end.
        (true, Finish::Stop) => json!({ "type": "stop", "matched": null }),
    };
    let mut meta_info = json!({
        "id": rid,
        "finish_reason": finish_reason,
        "prompt_tokens": run.prompt_tokens,
        "completion_tokens": tokens,
        "cached_tokens": run.cached_tokens,
    });
    if let (true, Some(latency)) = (finished, run.latency) {
        meta_info["e2e_latency"] = json!(latency.as_secs_f64());
    }
    json!({
        "text": run.text(tokens),
        "output_ids": &run.output_ids[..tokens],
        "meta_info": meta_info,
    })
}

impl Framing for Answer {
    fn release(&mut self, runs: &[Run], release: Release, out: &mut Vec<u8>) {
        let mut event = output(&self.rids[release.run], &runs[release.run], release.to);
        if self.batch {
            event["index"] = json!(release.run);
        }
        push_event(out, &event);
    }

    fn end(&mut self, _runs: &[Run], out: &mut Vec<u8>) {
        out.extend_from_slice(b"data: [DONE]\n\n");
    }
}

fn parse(
    body: &[u8],
    vocab_size: usize,
    new_rid: fn() -> String,
) -> Result<(Request, Answer), ApiError> {
    let body = fields::body(body)?;
    let fields = Fields::top(&body);
    let (inputs, batch) = match (fields.get("text"), fields.get("input_ids")) {
        (Some(text), None) => fields::prompts(text, "text", Forms::Text, vocab_size)?,
        (None, Some(ids)) => fields::prompts(ids, "input_ids", Forms::Ids, vocab_size)?,
        _ => return Err(ApiError::bad_request("give exactly one of text and input_ids")),
    };
    let runs = fields::runs(inputs.len(), 1)?;
    let limits = sampling_params(fields, runs, batch)?;
    let rids = rids(fields, runs, batch, new_rid)?;
    if let Some(value) = fields.get("return_logprob") {
        let flags = match value {
            Value::Array(flags) if batch => flags.iter().all(Value::is_boolean),
            value => value.is_boolean(),
        };
        if !flags {
            return Err(ApiError::bad_request(
                "return_logprob must be a boolean (or one per prompt)",
            ));
        }
    }
    let bootstrap = fields::bootstrap(fields, runs)?;
    let answer = Answer { stream: fields.bool("stream")?.unwrap_or(false), batch, rids };
    let prompts = inputs
        .into_iter()
        .zip(limits)
        .map(|(input, max_tokens)| Prompt { input, max_tokens })
        .collect();
    let rank = Request::body_rank(fields.u64("data_parallel_rank")?)?;
    Ok((Request { rank, ..Request::new(prompts, bootstrap) }, answer))
}

/// Each prompt's `max_new_tokens`, from one `sampling_params` object or one per prompt.
fn sampling_params(
    fields: Fields<'_>,
    runs: usize,
    batch: bool,
) -> Result<Vec<Option<u64>>, ApiError> {
    match fields.get("sampling_params") {
        None => Ok(vec![None; runs]),
        Some(Value::Array(list)) if batch => {
            if list.len() != runs {
                return Err(ApiError::bad_request(format!(
                    "sampling_params lists {} objects for {runs} prompts",
                    list.len()
                )));
            }
            let paths: Vec<String> = (0..runs).map(|i| format!("sampling_params[{i}]")).collect();
            list.iter().zip(&paths).map(|(params, path)| max_new_tokens(params, path)).collect()
        }
        Some(params) => Ok(vec![max_new_tokens(params, "sampling_params")?; runs]),
    }
}

/// Checks one sampling-parameters object (unknown keys are accepted) and reads its
/// `max_new_tokens`.
fn max_new_tokens(params: &Value, path: &str) -> Result<Option<u64>, ApiError> {
    let params = Fields::of(params, path)?;
    let out_of_range = |name: &str, range: &str| {
        ApiError::bad_request(format!("{} must be {range}", params.name(name)))
    };
    if params.f64("temperature")?.is_some_and(|t| t < 0.0) {
        return Err(out_of_range("temperature", "at least 0"));
    }
    if params.f64("top_p")?.is_some_and(|p| p <= 0.0 || p > 1.0) {
        return Err(out_of_range("top_p", "in (0, 1]"));
    }
    if params.f64("min_p")?.is_some_and(|p| !(0.0..=1.0).contains(&p)) {
        return Err(out_of_range("min_p", "in [0, 1]"));
    }
    if let Some(top_k) = params.get("top_k")
        && !top_k.as_i64().is_some_and(|k| k == -1 || k >= 1)
    {
        return Err(out_of_range("top_k", "-1 (no limit) or an integer of at least 1"));
    }
    if params.limit("n")?.is_some_and(|n| n > 1) {
        return Err(ApiError::bad_request(format!(
            "{} > 1 (parallel sampling) is not supported by router-sim",
            params.name("n")
        )));
    }
    params.limit("max_new_tokens")
}

/// Each run's `meta_info.id`: `rid` for a single prompt, `{rid}_{i}` or the listed ids for a
/// batch (SGLang's normalisation), fresh ids without one.
fn rids(
    fields: Fields<'_>,
    runs: usize,
    batch: bool,
    new_rid: fn() -> String,
) -> Result<Vec<String>, ApiError> {
    let bad = |message: String| ApiError::bad_request(message);
    match fields.get("rid") {
        None => Ok((0..runs).map(|_| new_rid()).collect()),
        Some(Value::String(rid)) if batch => Ok((0..runs).map(|i| format!("{rid}_{i}")).collect()),
        Some(Value::String(rid)) => Ok(vec![rid.clone()]),
        Some(Value::Array(list)) if batch => {
            let rids: Vec<String> = list
                .iter()
                .map(|rid| rid.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| bad("rid must be a string or a list of strings".to_owned()))?;
            if rids.len() != runs {
                return Err(bad(format!("rid lists {} ids for {runs} prompts", rids.len())));
            }
            let mut sorted: Vec<&String> = rids.iter().collect();
            sorted.sort();
            if let Some(pair) = sorted.windows(2).find(|pair| pair[0] == pair[1]) {
                return Err(bad(format!("rid {:?} is given twice", pair[0])));
            }
            Ok(rids)
        }
        Some(_) if batch => Err(bad("rid must be a string or a list of strings".to_owned())),
        Some(_) => Err(bad("rid must be a string for a single prompt".to_owned())),
    }
}

#[cfg(test)]
mod tests;
