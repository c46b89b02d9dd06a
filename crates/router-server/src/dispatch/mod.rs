//! Dispatch of a complete selection: the request goes to its plain engine ([`plain`]) or to its
//! prefill and decode pair ([`pd`]), each engine's data-parallel rank chosen and named
//! ([`rank`]), and the answer comes back, streamed or whole.
//!
//! What every exchange with an engine shares lives here: sending (transport failures go to the
//! circuit breaker and the failure counter), judging the response head (a 5xx or a refusal of
//! the router's credential is the engine's failure, anything else is the client's answer), and
//! the two ways back: a stream ([`GuardedBody`]) when the client asked for one and the engine
//! said yes, else the whole answer, read with the engine's silence bounded before the client
//! sees a status (so a stalled engine is a 504, not a cut connection).

mod pd;
mod plain;
mod rank;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use http::response::Parts;
use http_body_util::BodyExt;
use router_buckets::BucketPick;
use router_engine_client::EngineBody;
use router_state_load::InflightGuard;
use router_workers::{ModelId, Stage, Worker};
use smallvec::SmallVec;
use tokio::sync::oneshot;

use crate::app::AppContext;
use crate::error::{ApiError, EngineError, SendError};
use crate::forward::{AnswerMetrics, GuardedBody, Outcome, OutcomeSink as _, passthrough_headers};
use crate::metrics;
use crate::telemetry::RequestTrace;
use rank::EngineRequest;
use router_prepare::PreparedRequest;

/// The response headers naming what served the request: the bucket, and the engine (a pair's
/// two engines) with its data-parallel rank. Parsed once, here: an insert by string parses the
/// name on every request.
pub(crate) const ENGINE_HEADER: HeaderName = HeaderName::from_static("x-router-engine");
const RANK_HEADER: HeaderName = HeaderName::from_static("x-router-rank");
const BUCKET_HEADER: HeaderName = HeaderName::from_static("x-router-bucket");
const PREFILL_ENGINE_HEADER: HeaderName = HeaderName::from_static("x-router-prefill-engine");
const DECODE_ENGINE_HEADER: HeaderName = HeaderName::from_static("x-router-decode-engine");
const PREFILL_RANK_HEADER: HeaderName = HeaderName::from_static("x-router-prefill-rank");
const DECODE_RANK_HEADER: HeaderName = HeaderName::from_static("x-router-decode-rank");

/// Largest whole (non-streamed) answer the router buffers, in bytes.
const WHOLE_ANSWER_LIMIT: usize = 64 * 1024 * 1024;

/// One request on its way to the engines of a selection.
#[derive(Clone, Copy)]
pub(crate) struct Dispatch<'a> {
    /// How to talk to the engines.
    pub exchange: Exchange<'a>,
    /// The prepared request.
    pub prepared: &'a PreparedRequest,
    /// The served model.
    pub model: &'a ModelId,
    /// The bucket that chose the engines, as its header value
    /// ([`router_buckets::Bucket::id_header`]).
    pub bucket: &'a HeaderValue,
    /// When the router received the request.
    pub started: Instant,
}

/// What one exchange with an engine needs: the shared services, the request id, the engine's
/// path (the API the client used) and whether the client asked for a stream.
#[derive(Clone, Copy)]
pub(crate) struct Exchange<'a> {
    /// The engine's path, as [`router_prepare::Endpoint::path`].
    pub path: &'static str,
    /// The shared services.
    pub ctx: &'a Arc<AppContext>,
    /// Sent to the engines as `x-request-id`.
    pub request_id: &'a HeaderValue,
    /// The client asked for a stream.
    pub streamed: bool,
    /// The request's trace: each send is a dispatch span, its context sent to the engine.
    pub trace: &'a RequestTrace,
}

impl Dispatch<'_> {
    /// Sends the request to `pick`'s engines and returns the client's response, labelled with
    /// the engines and the bucket.
    pub(crate) async fn run(self, pick: BucketPick) -> Result<Response, ApiError> {
        let mut response = match pick {
            BucketPick::Plain(pick) => plain::dispatch(self, pick, Stage::Plain).await?,
            // Boxed: a pair's future holds both exchanges, and unboxed every request's
            // future would carry (and copy) it; a pair's request costs an allocation more.
            BucketPick::Pd { prefill, decode } if self.prepared.request.endpoint.generates() => {
                Box::pin(pd::dispatch(self, prefill, decode)).await?
            }
            // Embeddings, scores and tokenization are one engine's work: the decode engine
            // of the pair answers them.
            BucketPick::Pd { decode, .. } => plain::dispatch(self, decode, Stage::Decode).await?,
        };
        response.headers_mut().insert(BUCKET_HEADER, self.bucket.clone());
        Ok(response)
    }
}

impl Dispatch<'_> {
    /// What this request's answer is measured with.
    /// The metrics of an answer whose request went to its engine at `dispatched`.
    fn answer_metrics(&self, dispatched: std::time::Instant) -> AnswerMetrics {
        let (model, started) = (self.model.clone(), self.started);
        AnswerMetrics { model, started, dispatched, prediction: None }
    }
}

impl Exchange<'_> {
    /// Sends `request` to `worker`, telling the circuit breaker and the failure counter about
    /// transport failures.
    async fn send(
        &self,
        worker: &Worker,
        request: EngineRequest,
    ) -> Result<hyper::Response<EngineBody>, EngineError> {
        let EngineRequest { body, rank_header, .. } = request;
        let forwarder = self.ctx.forwarder();
        let span = self.trace.child("dispatch");
        if span.is_recording() {
            span.set("router.engine", worker.id().as_str().to_owned());
            span.set("server.address", worker.url().to_owned());
            span.set("url.path", self.path);
        }
        let trace = self.trace.engine_headers(&span);
        let (path, id) = (self.path, self.request_id);
        let sent = forwarder.send(worker, path, body, id, rank_header, &trace).await;
        if let Ok(response) = &sent {
            span.set("http.response.status_code", i64::from(response.status().as_u16()));
        }
        sent.map_err(|err| {
            span.fail(&err);
            let outcome = match err {
                SendError::Unreachable { .. } => Outcome::Unreachable,
                _ => Outcome::Failure,
            };
            self.ctx.health().record(worker, outcome);
            counted(EngineError::Send(err))
        })
    }

    /// Judges an engine's response head: a status of `server.retry.on_status` declines the
    /// request (the engine is held off for its `Retry-After`, capped), a server error
    /// (recorded against the engine, with the start of its body) or a refusal of the router's
    /// credential is the engine's failure; anything else is the client's answer.
    async fn checked(
        &self,
        worker: &Worker,
        upstream: hyper::Response<EngineBody>,
    ) -> Result<(Parts, EngineBody), EngineError> {
        let (parts, body) = upstream.into_parts();
        let status = parts.status;
        let worker_id = || worker.id().clone();
        let retry = &self.ctx.server().retry;
        if retry.on_status.contains(&status.as_u16()) {
            if status.is_server_error() {
                self.ctx.health().record(worker, Outcome::Failure);
            }
            if let Some(secs) = retry_after_secs(&parts.headers) {
                let secs = secs.min(retry.max_retry_after_secs);
                self.ctx.health().hold_off(worker, Duration::from_secs(secs));
            }
            let text = read_snippet(body).await;
            return Err(counted(EngineError::Declined { worker: worker_id(), status, text }));
        }
        if status.is_server_error() {
            self.ctx.health().record(worker, Outcome::Failure);
            let text = read_snippet(body).await;
            return Err(counted(EngineError::Status { worker: worker_id(), status, text }));
        }
        if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
            return Err(counted(EngineError::RefusedCredentials { worker: worker_id(), status }));
        }
        Ok((parts, body))
    }

    /// Whether the answer streams back: the client asked for a stream and the engine agreed.
    fn streams(&self, parts: &Parts) -> bool {
        self.streamed && parts.status.is_success()
    }

    /// The client's response streaming the engine's body, holding `guards` until it ends; its
    /// first byte must come within `server.first_byte_timeout_secs` of its dispatch. A message
    /// on `partner_failure` ends the stream with that error. A stream that ends normally is
    /// measured for `metrics`.
    fn stream(
        &self,
        parts: Parts,
        body: EngineBody,
        guards: Vec<InflightGuard>,
        worker: &Arc<Worker>,
        partner_failure: Option<oneshot::Receiver<ApiError>>,
        metrics: AnswerMetrics,
    ) -> Response {
        let by_a_task = body.handed_over_by_a_task();
        let sse = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        let first_byte = Duration::from_secs(self.ctx.server().first_byte_timeout_secs);
        let first_frame_by = metrics.dispatched + first_byte;
        let body = GuardedBody::new(
            body,
            guards,
            Arc::clone(worker),
            self.ctx.health_sink(),
            self.idle_limit(),
            partner_failure,
            Some(metrics),
        );
        let body = if by_a_task { body.handed_over_by_a_task() } else { body };
        let body = if sse { body.sse_events() } else { body };
        let body =
            body.first_frame_by(first_frame_by).until_drain_ends(self.ctx.drain_ended().clone());
        response(parts, Body::new(body))
    }

    /// The client's response carrying the engine's whole answer, measured for `metrics`; the
    /// answer must end within `server.answer_timeout_secs` of its dispatch.
    async fn whole(
        &self,
        parts: Parts,
        body: EngineBody,
        worker: &Worker,
        metrics: &AnswerMetrics,
    ) -> Result<Response, EngineError> {
        let answer = self.read_answer(worker, body, metrics.dispatched).await?;
        metrics.whole(worker, &answer);
        Ok(response(parts, Body::from(answer)))
    }

    /// Reads an engine's whole body, at most [`WHOLE_ANSWER_LIMIT`] bytes with at most the
    /// idle limit between two frames, all of it within `server.answer_timeout_secs` of
    /// `dispatched`, and records the outcome.
    async fn read_answer(
        &self,
        worker: &Worker,
        mut body: EngineBody,
        dispatched: std::time::Instant,
    ) -> Result<Bytes, EngineError> {
        let limit = self.idle_limit();
        let answer_limit = self.answer_limit();
        let deadline = tokio::time::Instant::from_std(dispatched) + answer_limit;
        // The usual answer is one frame: kept inline, no vector allocated.
        let mut chunks: SmallVec<[Bytes; 1]> = SmallVec::new();
        let mut total = 0;
        let failed = loop {
            let idle_ends = tokio::time::Instant::now() + limit;
            let frame = match tokio::time::timeout_at(idle_ends.min(deadline), body.frame()).await {
                Err(_) if idle_ends >= deadline => {
                    break EngineError::Overdue {
                        worker: worker.id().clone(),
                        limit: answer_limit,
                    };
                }
                Err(_) => {
                    break EngineError::Stalled { worker: worker.id().clone(), silence: limit };
                }
                Ok(None) => {
                    self.ctx.health().record(worker, Outcome::Success);
                    return Ok(match chunks.len() {
                        // The usual case, one frame: no copy.
                        1 => chunks.pop().unwrap_or_default(),
                        _ => chunks.concat().into(),
                    });
                }
                Ok(Some(Err(err))) => {
                    let worker = worker.id().clone();
                    break EngineError::MidResponse { worker, source: err };
                }
                Ok(Some(Ok(frame))) => frame,
            };
            if let Ok(data) = frame.into_data() {
                total += data.len();
                if total > WHOLE_ANSWER_LIMIT {
                    let worker = worker.id().clone();
                    break EngineError::AnswerTooLarge { worker, limit: WHOLE_ANSWER_LIMIT };
                }
                chunks.push(data);
            }
        };
        self.ctx.health().record(worker, Outcome::Failure);
        Err(counted(failed))
    }

    fn idle_limit(&self) -> Duration {
        Duration::from_secs(self.ctx.server().engine_idle_timeout_secs)
    }

    /// `server.answer_timeout_secs`.
    fn answer_limit(&self) -> Duration {
        Duration::from_secs(self.ctx.server().answer_timeout_secs)
    }
}

/// The seconds of a `Retry-After: N` header (the HTTP-date form is not used by engines).
fn retry_after_secs(headers: &http::HeaderMap) -> Option<u64> {
    headers.get(http::header::RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()
}

/// `err`, counted in `router_engine_failures_total`.
fn counted(err: EngineError) -> EngineError {
    metrics::engine_failure(err.worker().as_str(), err.kind());
    err
}

/// The client's response: the engine's status and end-to-end headers over `body`.
fn response(parts: Parts, body: Body) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = parts.status;
    *response.headers_mut() = passthrough_headers(parts.headers);
    response
}

/// At most 1 KiB of an engine's error body, as text: the start of a longer one.
async fn read_snippet(mut body: EngineBody) -> String {
    const LIMIT: usize = 1024;
    let read = async {
        let mut snippet = Vec::new();
        while snippet.len() < LIMIT {
            match body.frame().await {
                None => break,
                Some(Ok(frame)) => snippet.extend(frame.into_data().unwrap_or_default()),
                Some(Err(_)) => return None,
            }
        }
        snippet.truncate(LIMIT);
        Some(snippet)
    };
    match tokio::time::timeout(Duration::from_secs(5), read).await {
        Ok(Some(snippet)) => String::from_utf8_lossy(&snippet).trim().to_owned(),
        _ => String::from("(no body)"),
    }
}

#[cfg(test)]
mod tests;
