//! The one generation path behind `/v1/chat/completions`, `/v1/completions` and `/generate`:
//! an endpoint parses its body into a [`Request`] (prompts, choices per prompt, PD bootstrap
//! rooms) and [`start`] does the rest as chat always did: the stall and failure faults, the
//! prefill rooms, tokenization, the KV room check, the decode side's room fetch, the output
//! filler and the scheduler submission of every run. Progress comes back through
//! [`Generation`] (`progress.rs`), which the endpoint's adapter turns into its answer.

mod progress;

use std::future::Future;
use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt as _;
use http::{HeaderMap, StatusCode};
use router_workers::Stage;
use tokio::sync::mpsc;
use tokio::time::Instant;

pub(crate) use progress::{Framing, Generation, Release, Run, push_event};

use super::Engine;
use super::error::ApiError;
use crate::engine::bootstrap::{RoomGuard, RoomInfo};
use crate::engine::output;
use crate::engine::scheduler::{Kind, Scheduler, Submission};
use crate::tokens::ChatMessage;

/// The header vLLM reads a request's data-parallel rank from.
const DP_RANK_HEADER: &str = "x-data-parallel-rank";

/// Why an injected failure fails a request (and its prefill rooms).
const INJECTED: &str = "injected failure (--fail-rate)";

/// A prompt as the request gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Input {
    /// Chat messages, rendered with the chat template.
    Chat(Vec<ChatMessage>),
    /// Raw text, tokenized without a template.
    Text(String),
    /// Token ids, used as given.
    Ids(Vec<u32>),
}

/// One prompt of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Prompt {
    pub(crate) input: Input,
    /// The output limit the request set; `None` takes the engine's default, which stands for
    /// a natural end of the answer (finish reason `stop`).
    pub(crate) max_tokens: Option<u64>,
}

/// Where a PD request's prefill engine serves its bootstrap rooms, and each run's room.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Bootstrap {
    pub(crate) host: String,
    pub(crate) port: u16,
    /// One room per run, in run order.
    pub(crate) rooms: Vec<u64>,
}

/// What an endpoint asks to generate: `n` runs for each prompt, run `p * n + j` being choice
/// `j` of prompt `p` (the order of OpenAI's choice indices), all on one data-parallel rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) prompts: Vec<Prompt>,
    pub(crate) n: usize,
    pub(crate) bootstrap: Option<Bootstrap>,
    /// The rank the request named (`data_parallel_rank`, or the [`DP_RANK_HEADER`] header);
    /// `None`: the engine's turn.
    pub(crate) rank: Option<u32>,
}

impl Request {
    /// One run of each prompt, on the engine's choice of rank.
    pub(crate) fn new(prompts: Vec<Prompt>, bootstrap: Option<Bootstrap>) -> Self {
        Self { prompts, n: 1, bootstrap, rank: None }
    }

    /// The rank a body's `data_parallel_rank` (already read as a number) names.
    pub(crate) fn body_rank(rank: Option<u64>) -> Result<Option<u32>, ApiError> {
        rank.map(|rank| {
            u32::try_from(rank).map_err(|_| {
                ApiError::bad_request(format!("data_parallel_rank {rank} is too large"))
            })
        })
        .transpose()
    }

    /// This request with the rank of the [`DP_RANK_HEADER`] header too: the body's rank and
    /// the header's may both be given only if they agree.
    pub(crate) fn with_rank_header(mut self, headers: &HeaderMap) -> Result<Self, ApiError> {
        let bad = |message: String| ApiError::bad_request(message);
        let header = headers
            .get(DP_RANK_HEADER)
            .map(|value| {
                value.to_str().ok().and_then(|v| v.trim().parse::<u32>().ok()).ok_or_else(|| {
                    bad(format!("header {DP_RANK_HEADER} must be a non-negative integer"))
                })
            })
            .transpose()?;
        self.rank = match (self.rank, header) {
            (Some(body), Some(header)) if body != header => {
                return Err(bad(format!(
                    "data_parallel_rank {body} and header {DP_RANK_HEADER} {header} disagree"
                )));
            }
            (body, header) => body.or(header),
        };
        Ok(self)
    }

    pub(crate) fn runs(&self) -> usize {
        self.prompts.len() * self.n
    }
}

/// Why a run's output ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Finish {
    /// An explicit limit, the KV room, or a prefill engine's single token.
    Length,
    /// The engine's default length, standing for the answer's natural end.
    Stop,
}

impl Finish {
    /// OpenAI's `finish_reason`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Finish::Length => "length",
            Finish::Stop => "stop",
        }
    }
}

/// `Ok(response)` with its body held back by `--stall-body-ms`; an error counts as an answer
/// (for `--die-after`) and is sent at once. Dying engines take no new requests. Every request
/// is counted as received (`GET /sim/state`), taken or not.
pub(crate) async fn serve<F, Fut>(engine: Arc<Engine>, handle: F) -> Response
where
    F: FnOnce(Arc<Engine>) -> Fut,
    Fut: Future<Output = Result<Response, ApiError>>,
{
    engine.received.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    engine.refuse_if_dying().await;
    let stall_body = engine.faults.stall_body();
    match handle(Arc::clone(&engine)).await {
        Ok(response) => held_back(response, stall_body),
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

/// 404 unless `model` is absent or the one this engine serves.
pub(crate) fn check_model(model: Option<&str>, served: &str) -> Result<(), ApiError> {
    match model {
        Some(model) if model != served => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("model {model:?} is not served here (this engine serves {served:?})"),
        )),
        _ => Ok(()),
    }
}

/// One prompt, tokenized, with the output it will get.
struct Prepared {
    ids: Vec<u32>,
    hash: u64,
    count: usize,
    finish: Finish,
}

/// Runs `request` on the engine: faults, prefill rooms, tokenization, KV room, the decode
/// side's rooms, then every run submitted to the scheduler (all or none: every check is done
/// before the first submission).
pub(crate) async fn start(engine: &Engine, request: Request) -> Result<Generation, ApiError> {
    let started = Instant::now();
    let config = &engine.config;
    let runs = request.runs();
    if let Some(bootstrap) = &request.bootstrap
        && bootstrap.rooms.len() != runs
    {
        return Err(ApiError::bad_request(format!(
            "bootstrap_room gives {} rooms for {runs} runs (one per prompt and choice)",
            bootstrap.rooms.len()
        )));
    }
    let scheduler =
        engine.ranks.pick(request.rank).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let stall = engine.faults.stall();
    if !stall.is_zero() {
        tokio::time::sleep(stall).await;
    }
    // A prefill engine's room fails unless its run gets as far as its first token.
    let mut guards: Vec<Option<RoomGuard>> = (0..runs)
        .map(|run| match (&engine.rooms, &request.bootstrap) {
            (Some(rooms), Some(bootstrap)) => {
                Some(RoomGuard::new(Arc::clone(rooms), bootstrap.rooms[run]))
            }
            _ => None,
        })
        .collect();
    if engine.faults.roll_failure() {
        for guard in guards.iter_mut().flatten() {
            guard.fail(INJECTED);
        }
        let (status, retry_after) = engine.faults.failure();
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return Err(ApiError { retry_after, ..ApiError::new(status, INJECTED) });
    }

    let mut prepared = Vec::with_capacity(request.prompts.len());
    for (index, prompt) in request.prompts.into_iter().enumerate() {
        prepared.push(prepare(engine, scheduler, index, prompt)?);
    }
    for (run, guard) in guards.iter_mut().enumerate() {
        if let Some(guard) = guard {
            let prompt = &prepared[run / request.n];
            guard.describe(prompt.ids.len(), format!("{:016x}", prompt.hash));
        }
    }
    let kinds = kinds(engine, &prepared, request.n, request.bootstrap.as_ref()).await?;

    let mut submissions = Vec::with_capacity(runs);
    let mut generation = Generation::new(started, config.stream_interval);
    for (run, (kind, room)) in kinds.into_iter().zip(guards).enumerate() {
        let prompt = &prepared[run / request.n];
        let choice = (run % request.n) as u64;
        // Choice 0 answers what chat answers for the same prompt ids; the others vary.
        let seed = prompt.hash ^ choice.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let (output_ids, pieces) = output::generate(&engine.preprocessor, seed, prompt.count)
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, error_chain(&e)))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let index = run / request.n;
        let ids = output_ids.clone();
        generation.add(Run::new(index, prompt.ids.len(), ids, pieces, prompt.finish, room), rx);
        submissions.push(Submission { prompt: prompt.ids.clone(), output: output_ids, kind, tx });
    }
    for submission in submissions {
        scheduler.submit(submission).map_err(|e| ApiError::bad_request(e.to_string()))?;
    }
    Ok(generation)
}

/// Tokenizes prompt `index` and sizes its output for the KV room of `scheduler`'s rank.
fn prepare(
    engine: &Engine,
    scheduler: &Scheduler,
    index: usize,
    prompt: Prompt,
) -> Result<Prepared, ApiError> {
    let config = &engine.config;
    let preprocessor = &engine.preprocessor;
    let ids = match prompt.input {
        Input::Chat(messages) => preprocessor.prompt_ids(&messages),
        Input::Text(text) => preprocessor.encode_prompt(&text),
        Input::Ids(ids) => Ok(ids),
    }
    .map_err(|e| {
        ApiError::bad_request(format!("cannot prepare the prompt: {}", error_chain(&e)))
    })?;
    if ids.is_empty() {
        return Err(ApiError::bad_request(format!("prompt {index} has no tokens")));
    }
    let room = scheduler.output_room(ids.len()).ok_or_else(|| {
        ApiError::bad_request(format!(
            "prompt of {} tokens does not fit the kv capacity of {} tokens",
            ids.len(),
            config.kv_capacity_tokens / config.block_size * config.block_size
        ))
    })?;
    let wanted = match config.role {
        Stage::Prefill => 1,
        _ => prompt
            .max_tokens
            .map_or(config.default_max_tokens, |n| usize::try_from(n).unwrap_or(usize::MAX)),
    };
    let count = wanted.min(room);
    // Filler never ends by itself: an explicit limit (or the KV room) ends it as "length";
    // the default length stands for a natural end of the answer.
    let finish = if prompt.max_tokens.is_some() || config.role == Stage::Prefill || count < wanted {
        Finish::Length
    } else {
        Finish::Stop
    };
    let hash = output::prompt_hash(&ids);
    Ok(Prepared { ids, hash, count, finish })
}

/// What each run needs from the scheduler: a decode engine first fetches every run's room.
async fn kinds(
    engine: &Engine,
    prepared: &[Prepared],
    n: usize,
    bootstrap: Option<&Bootstrap>,
) -> Result<Vec<Kind>, ApiError> {
    let runs = prepared.len() * n;
    if engine.config.role != Stage::Decode {
        return Ok(vec![Kind::Full; runs]);
    }
    let Some(bootstrap) = bootstrap else {
        return Err(ApiError::bad_request(
            "a decode engine needs bootstrap_host, bootstrap_port and bootstrap_room",
        ));
    };
    let client = engine.bootstrap.as_ref().ok_or_else(|| {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "decode engine without bootstrap client")
    })?;
    let mut kinds = Vec::with_capacity(runs);
    for (run, room) in bootstrap.rooms.iter().enumerate() {
        let prompt = &prepared[run / n];
        let hash = format!("{:016x}", prompt.hash);
        let RoomInfo { cached_tokens, .. } = client
            .fetch(&bootstrap.host, bootstrap.port, *room, prompt.ids.len(), &hash)
            .await
            .map_err(|e| ApiError::new(e.status(), error_chain(&e)))?;
        kinds.push(Kind::Decode { cached_tokens });
    }
    Ok(kinds)
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
