//! `POST /v1/chat/completions`: prepare once, try buckets in order, dispatch the complete
//! selection, stream the answer back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body_util::BodyExt;
use router_buckets::{Bucket, BucketPick, BucketRequest};
use router_policies::{PickError, Rejection};
use router_state_load::InflightGuard;
use router_workers::{ModelId, Stage, Worker};
use tokio::sync::oneshot;
use tracing::{Instrument, info, warn};

use crate::app::AppContext;
use crate::error::ApiError;
use crate::forward::{
    FirstByte, GuardedBody, Outcome, OutcomeSink, SendError, bootstrap_room, passthrough_headers,
    with_bootstrap,
};
use crate::metrics;
use crate::prepare::{PreparedRequest, parse_chat_request, prepare};

/// The chat endpoint.
pub async fn chat_completions(
    State(ctx): State<Arc<AppContext>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let request_id = request_id(&headers);
    let span = tracing::info_span!("request", id = %request_id.to_str().unwrap_or_default());
    let started = Instant::now();
    let (result, model, bucket) = async {
        let mut model = String::new();
        let mut bucket = String::new();
        let result =
            handle(&ctx, &headers, body, &request_id, &mut model, &mut bucket, started).await;
        (result, model, bucket)
    }
    .instrument(span.clone())
    .await;
    let mut response = match result {
        Ok(response) => response,
        Err(err) => {
            let _enter = span.enter();
            if err.status().is_server_error() {
                warn!(status = err.status().as_u16(), error = %err, "request failed");
            } else {
                info!(status = err.status().as_u16(), error = %err, "request rejected");
            }
            err.into_response()
        }
    };
    metrics::request(&model, &bucket, response.status().as_u16(), started.elapsed());
    response.headers_mut().insert("x-request-id", request_id);
    response
}

/// The client's `x-request-id` when it is a sane token, else a fresh one.
fn request_id(headers: &HeaderMap) -> HeaderValue {
    headers
        .get("x-request-id")
        .filter(|v| {
            let bytes = v.as_bytes();
            !bytes.is_empty() && bytes.len() <= 128 && bytes.iter().all(|b| b.is_ascii_graphic())
        })
        .cloned()
        .unwrap_or_else(new_request_id)
}

/// Bodies up to this size are templated and tokenized on the event loop (tens of
/// microseconds); larger ones on the blocking pool.
const INLINE_PREPARE_BYTES: usize = 16 * 1024;

/// Slots for preparations on the blocking pool: one per core for the whole process.
fn blocking_slots() -> &'static Arc<tokio::sync::Semaphore> {
    static SLOTS: std::sync::OnceLock<Arc<tokio::sync::Semaphore>> = std::sync::OnceLock::new();
    SLOTS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        Arc::new(tokio::sync::Semaphore::new(cores))
    })
}

/// Reads the whole body: at most `max_body_bytes` (413 as soon as a declared length or the
/// bytes received exceed it) and within `body_read_timeout_secs` (408).
async fn read_body(
    ctx: &AppContext,
    headers: &HeaderMap,
    mut body: Body,
) -> Result<Bytes, ApiError> {
    let limit = ctx.max_body_bytes();
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        // A client waiting for `100 Continue` has not sent the body: dropping it unread means
        // it never will. Reading it would invite the upload.
        let waits_for_continue = headers
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        if !waits_for_continue {
            discard_in_background(body);
        }
        return Err(ApiError::BodyTooLarge { limit });
    }
    let secs = ctx.server().body_read_timeout_secs;
    let read = async {
        let mut chunks: Vec<Bytes> = Vec::new();
        let mut total = 0usize;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|err| ApiError::InvalidRequest {
                message: format!("reading the request body failed: {err}"),
                param: None,
            })?;
            if let Ok(data) = frame.into_data() {
                total += data.len();
                if total > limit {
                    return Err(ApiError::BodyTooLarge { limit });
                }
                chunks.push(data);
            }
        }
        Ok(match chunks.len() {
            // The usual case, one frame: no copy.
            1 => chunks.pop().unwrap_or_default(),
            _ => chunks.concat().into(),
        })
    };
    let read = tokio::time::timeout(Duration::from_secs(secs), read)
        .await
        .map_err(|_| ApiError::BodyTimeout { secs })?;
    if matches!(read, Err(ApiError::BodyTooLarge { .. })) {
        discard_in_background(body);
    }
    read
}

/// Reads and drops the rest of a refused body for a few seconds, so that a client still
/// sending it gets to read the 413 instead of a connection reset (NGINX's lingering close).
/// Nothing is kept: memory stays bounded whatever the client sends.
fn discard_in_background(mut body: Body) {
    const LINGER: Duration = Duration::from_secs(5);
    tokio::spawn(async move {
        let drain = async { while let Some(Ok(_)) = body.frame().await {} };
        let _ = tokio::time::timeout(LINGER, drain).await;
    });
}

/// A fresh request id: a random per-process prefix and a counter, as 32 hex digits. Unique
/// across restarts without a random-number syscall per request.
fn new_request_id() -> HeaderValue {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(rand::random::<u64>);
    let id = format!("{prefix:016x}{:016x}", COUNTER.fetch_add(1, Ordering::Relaxed));
    HeaderValue::from_str(&id).unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

async fn handle(
    ctx: &Arc<AppContext>,
    headers: &HeaderMap,
    body: Body,
    request_id: &HeaderValue,
    model_label: &mut String,
    bucket_label: &mut String,
    started: Instant,
) -> Result<Response, ApiError> {
    if ctx.is_draining() {
        return Err(ApiError::ShuttingDown);
    }
    let body = read_body(ctx, headers, body).await?;
    let chat = parse_chat_request(&body)?;
    let model = ctx.model(&chat.model).ok_or_else(|| ApiError::UnknownModel(chat.model.clone()))?;
    // The served model's id, not the client's string: a wildcard model (`*`) would otherwise
    // let clients mint metric series at will.
    model_label.push_str(model.id.as_str());
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let session = header(&model.affinity.session_id_header);
    let routing = header(&model.affinity.routing_key_header);
    let prepared = if model.tokenization.is_some() && body.len() > INLINE_PREPARE_BYTES {
        // Templating and tokenizing a long prompt takes milliseconds: off the event loop, so
        // the other connections it serves are not held up; at most one such preparation per
        // core at a time, the permit travelling with the work, so a client that leaves cannot
        // let it pile up.
        let permit = Arc::clone(blocking_slots())
            .acquire_owned()
            .await
            .map_err(|_| ApiError::Internal("preparation slots closed".into()))?;
        let tokenization = model.tokenization.clone();
        let (session, routing) = (session.map(str::to_owned), routing.map(str::to_owned));
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            prepare(body, chat, tokenization.as_deref(), session.as_deref(), routing.as_deref())
        })
        .await
        .map_err(|err| ApiError::Internal(format!("request preparation failed: {err}")))??
    } else {
        prepare(body, chat, model.tokenization.as_deref(), session, routing)?
    };

    let buckets = model
        .resolver
        .resolve(prepared.input_tokens, prepared.expected_peak_tokens)
        .map_err(|err| ApiError::Internal(err.to_string()))?;
    if buckets.is_empty() {
        return Err(ApiError::NoMatchingBucket {
            input_tokens: prepared.input_tokens,
            peak: prepared.expected_peak_tokens,
        });
    }
    let request = BucketRequest {
        model: model.resolver.model(),
        input_tokens: prepared.input_tokens,
        expected_peak_tokens: prepared.expected_peak_tokens,
        tokens: prepared.tokens.as_deref(),
        session_key: prepared.session_key.as_deref(),
        routing_key: prepared.routing_key.as_deref(),
    };

    ctx.retry_budget().deposit_at(started);
    let retry = &ctx.server().retry;
    let mut retries = 0;
    let mut failure: Option<ApiError> = None;
    loop {
        let (bucket, pick) = match select(&buckets, ctx, &request, model_label, started).await {
            Ok(selected) => selected,
            // A retry that finds nothing left to try reports the failure that caused it.
            Err(err) => return Err(failure.unwrap_or(err)),
        };
        bucket_label.clear();
        bucket_label.push_str(bucket.id());
        let target = Target { model: request.model, bucket: bucket.id() };
        match dispatch(ctx, &prepared, target, pick, request_id, model_label, started).await {
            Ok(mut response) => {
                if retries > 0 {
                    response.headers_mut().insert("x-router-retries", HeaderValue::from(retries));
                }
                return Ok(response);
            }
            Err(err @ ApiError::EngineUnreachable(_)) if retries < retry.max_retries => {
                if !ctx.retry_budget().withdraw() {
                    metrics::retry_budget_exhausted(model_label);
                    return Err(err);
                }
                retries += 1;
                metrics::retry(model_label);
                warn!(error = %err, retry = retries, "engine unreachable; selecting again");
                tokio::time::sleep(retry.backoff(retries)).await;
                failure = Some(err);
            }
            Err(err) => return Err(err),
        }
    }
}

/// The ordered bucket loop of POLICY_DESIGN.md §3: the first bucket where every stage has an
/// admissible engine wins; admission rejections and empty groups advance to the next bucket.
async fn select<'a>(
    buckets: &[&'a Bucket],
    ctx: &AppContext,
    request: &BucketRequest<'_>,
    model_label: &str,
    started: Instant,
) -> Result<(&'a Bucket, BucketPick), ApiError> {
    let mut rejections: Vec<Rejection> = Vec::new();
    let mut last_stage = None;
    for &bucket in buckets {
        match bucket.pick_engines(ctx.registry(), request).await {
            Ok(pick) => {
                for (stage, one) in pick.iter() {
                    let policy = bucket
                        .groups()
                        .iter()
                        .find(|g| g.stage() == stage)
                        .map_or("unknown", |g| g.policy().name());
                    metrics::pick(policy, stage.as_str(), one.reason.as_str());
                }
                metrics::selection(model_label, started.elapsed());
                return Ok((bucket, pick));
            }
            Err(failure) if failure.advances_bucket() => {
                let reason = match &failure.error {
                    PickError::NoCandidates { .. } => "no_candidates",
                    _ => "admission",
                };
                for rejection in failure.error.rejections() {
                    metrics::admission_rejection(rejection.limit.as_str());
                }
                metrics::bucket_fallback(model_label, bucket.id(), reason);
                rejections.extend_from_slice(failure.error.rejections());
                last_stage = Some(failure.stage);
            }
            Err(failure) => {
                return Err(ApiError::Internal(format!(
                    "bucket {} ({} stage): {}",
                    bucket.id(),
                    failure.stage,
                    failure.error
                )));
            }
        }
    }
    if rejections.is_empty() {
        Err(ApiError::NoCandidates { stage: last_stage.unwrap_or(Stage::Plain) })
    } else {
        Err(ApiError::NoAdmissibleEngine { rejections })
    }
}

/// Where a selection sends a request: the served model and the bucket that chose.
#[derive(Clone, Copy)]
struct Target<'a> {
    model: &'a ModelId,
    bucket: &'a str,
}

async fn dispatch(
    ctx: &Arc<AppContext>,
    prepared: &PreparedRequest,
    target: Target<'_>,
    pick: BucketPick,
    request_id: &HeaderValue,
    model: &str,
    started: Instant,
) -> Result<Response, ApiError> {
    let sse = prepared.chat.stream;
    let tokens = prepared.tokens.as_deref();
    let mut response = match pick {
        BucketPick::Plain(pick) => {
            let guard =
                ctx.dispatched(target.model, &pick, Stage::Plain, prepared.input_tokens, tokens);
            let worker = &pick.worker;
            let dispatched_at = Instant::now();
            let upstream = send(ctx, worker, prepared.body.clone(), request_id).await?;
            metrics::time_to_response_head(model, started.elapsed());
            let mut response = relay(ctx, upstream, vec![guard], worker, sse, None).await?;
            if let Some(predicted_ms) = pick.predicted_ttft_ms.filter(|_| sse) {
                let model = model.to_owned();
                response = response.map(|body| {
                    Body::new(FirstByte::new(body, move || {
                        metrics::ttft_prediction(&model, predicted_ms, dispatched_at.elapsed());
                    }))
                });
            }
            response.headers_mut().insert("x-router-engine", header_value(worker.id().as_str()));
            response
        }
        BucketPick::Pd { prefill, decode } => {
            let guards = [
                ctx.dispatched(
                    target.model,
                    &prefill,
                    Stage::Prefill,
                    prepared.input_tokens,
                    tokens,
                ),
                ctx.dispatched(target.model, &decode, Stage::Decode, prepared.input_tokens, tokens),
            ];
            let response = dispatch_pd(
                ctx,
                prepared,
                &prefill.worker,
                &decode.worker,
                guards,
                request_id,
                sse,
            )
            .await?;
            metrics::time_to_response_head(model, started.elapsed());
            let mut response = response;
            let headers = response.headers_mut();
            headers.insert("x-router-prefill-engine", header_value(prefill.worker.id().as_str()));
            headers.insert("x-router-decode-engine", header_value(decode.worker.id().as_str()));
            response
        }
    };
    response.headers_mut().insert("x-router-bucket", header_value(target.bucket));
    Ok(response)
}

/// Sends to an engine, telling the circuit breaker about transport failures.
async fn send(
    ctx: &AppContext,
    worker: &Arc<Worker>,
    body: Bytes,
    request_id: &HeaderValue,
) -> Result<hyper::Response<hyper::body::Incoming>, ApiError> {
    ctx.forwarder().send(worker, body, request_id).await.map_err(|err| {
        let outcome = match err {
            SendError::Unreachable(_) => Outcome::Unreachable,
            _ => Outcome::Failure,
        };
        ctx.health().record(worker, outcome);
        metrics::engine_failure(worker.id().as_str(), err.kind());
        ApiError::from(err)
    })
}

/// Turns an engine's response into the client's: errors become 502 with the engine's words,
/// anything else streams through with the guards attached.
async fn relay(
    ctx: &Arc<AppContext>,
    upstream: hyper::Response<hyper::body::Incoming>,
    guards: Vec<router_state_load::InflightGuard>,
    worker: &Arc<Worker>,
    sse: bool,
    partner_failure: Option<oneshot::Receiver<String>>,
) -> Result<Response, ApiError> {
    let (parts, body) = upstream.into_parts();
    if parts.status.is_server_error() {
        return Err(ApiError::Upstream(engine_failed(ctx, worker, parts.status, body).await));
    }
    if let Some(refusal) = refused_credentials(worker, parts.status) {
        return Err(ApiError::Upstream(refusal));
    }
    let sink: Arc<dyn OutcomeSink> = ctx.health_sink();
    let stream_sse = sse && parts.status.is_success();
    let body =
        GuardedBody::new(body, guards, Arc::clone(worker), sink, stream_sse, partner_failure);
    let mut response = Response::new(Body::new(body));
    *response.status_mut() = parts.status;
    passthrough_headers(&parts.headers, response.headers_mut());
    Ok(response)
}

/// Whether an engine's status says it refused the router's credential.
fn refused(status: StatusCode) -> bool {
    matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
}

/// An engine refusing the router's credential, counted and described; `None` for any other
/// status. Passing its 401 on would tell the client its own key is wrong.
fn refused_credentials(worker: &Worker, status: StatusCode) -> Option<String> {
    if !refused(status) {
        return None;
    }
    metrics::engine_failure(worker.id().as_str(), "credentials");
    Some(format!(
        "engine {} refused the router's credentials ({}); check the worker's api_key",
        worker.id(),
        status.as_u16()
    ))
}

/// Records a 5xx answer against the engine (circuit breaker, metrics) and describes it with
/// the engine's own words.
async fn engine_failed(
    ctx: &AppContext,
    worker: &Worker,
    status: StatusCode,
    body: hyper::body::Incoming,
) -> String {
    ctx.health().record(worker, Outcome::Failure);
    metrics::engine_failure(worker.id().as_str(), "status");
    let text = read_snippet(body).await;
    format!("engine {} answered {}: {text}", worker.id(), status.as_u16())
}

/// At most 1 KiB of an engine's error body, as text.
async fn read_snippet(body: hyper::body::Incoming) -> String {
    let limited = http_body_util::Limited::new(body, 1024);
    match tokio::time::timeout(std::time::Duration::from_secs(5), limited.collect()).await {
        Ok(Ok(collected)) => String::from_utf8_lossy(&collected.to_bytes()).trim().to_owned(),
        _ => String::from("(no body)"),
    }
}

/// The SGLang bootstrap protocol: both engines get the request with the same room, sent
/// concurrently; the decode engine's answer is returned. A prefill failure before the decode
/// head arrives fails the request; after it, it ends the stream with an error event. A decode
/// failure cancels the prefill request.
async fn dispatch_pd(
    ctx: &Arc<AppContext>,
    prepared: &PreparedRequest,
    prefill: &Arc<Worker>,
    decode: &Arc<Worker>,
    [prefill_guard, decode_guard]: [InflightGuard; 2],
    request_id: &HeaderValue,
    sse: bool,
) -> Result<Response, ApiError> {
    let room = bootstrap_room();
    let body = with_bootstrap(&prepared.chat.body, prefill, room);

    let (failed_tx, mut failed_rx) = oneshot::channel::<String>();
    let prefill_task = {
        let ctx = Arc::clone(ctx);
        let prefill = Arc::clone(prefill);
        let body = body.clone();
        let request_id = request_id.clone();
        tokio::spawn(
            async move {
                let _guard = prefill_guard;
                let failure = match send(&ctx, &prefill, body, &request_id).await {
                    Err(err) => Some(format!("prefill engine {} failed: {err}", prefill.id())),
                    Ok(response) if response.status().is_server_error() => {
                        let (parts, body) = response.into_parts();
                        Some(format!(
                            "prefill {}",
                            engine_failed(&ctx, &prefill, parts.status, body).await
                        ))
                    }
                    Ok(response) if refused(response.status()) => {
                        refused_credentials(&prefill, response.status())
                            .map(|refusal| format!("prefill {refusal}"))
                    }
                    Ok(response) if !response.status().is_success() => {
                        let status = response.status().as_u16();
                        let text = read_snippet(response.into_body()).await;
                        Some(format!(
                            "prefill engine {} refused the request ({status}): {text}",
                            prefill.id()
                        ))
                    }
                    Ok(response) => match response.into_body().collect().await {
                        Ok(_) => {
                            ctx.health().record(&prefill, Outcome::Success);
                            None
                        }
                        Err(err) => {
                            ctx.health().record(&prefill, Outcome::Failure);
                            Some(format!(
                                "prefill engine {} failed mid-response: {err}",
                                prefill.id()
                            ))
                        }
                    },
                };
                if let Some(message) = failure {
                    warn!(%message, "prefill failed");
                    let _ = failed_tx.send(message);
                }
            }
            .in_current_span(),
        )
    };
    let abort_prefill = AbortOnDrop(Some(prefill_task));

    let decode_send = send(ctx, decode, body, request_id);
    tokio::pin!(decode_send);
    let mut prefill_succeeded = false;
    let upstream = loop {
        tokio::select! {
            // The prefill engine may already hold this request: an unreachable decode engine
            // is final here, never retried (a retry could prefill it twice).
            result = &mut decode_send => break result.map_err(|err| match err {
                ApiError::EngineUnreachable(message) => ApiError::Upstream(message),
                other => other,
            })?,
            failed = &mut failed_rx, if !prefill_succeeded => match failed {
                Ok(message) => return Err(ApiError::Upstream(message)),
                // The sender is dropped without a message when the prefill succeeded.
                Err(_) => prefill_succeeded = true,
            },
        }
    };
    // A decode engine told by the bootstrap server that its prefill failed answers 5xx too,
    // possibly before the prefill answer reaches us: report the prefill engine as the cause,
    // and do not count the decode engine as failing.
    if upstream.status().is_server_error() && !prefill_succeeded {
        let wait = std::time::Duration::from_secs(2);
        if let Ok(Ok(message)) = tokio::time::timeout(wait, &mut failed_rx).await {
            return Err(ApiError::Upstream(message));
        }
        prefill_succeeded = true;
    }
    let partner = (!prefill_succeeded).then_some(failed_rx);
    let response = relay(ctx, upstream, vec![decode_guard], decode, sse, partner).await?;
    // The decode stream is under way: the prefill request runs to its end on its own.
    abort_prefill.disarm();
    Ok(response)
}

/// Aborts the prefill request when the PD dispatch is abandoned before the decode stream
/// starts (decode failure, or the client leaving).
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl AbortOnDrop {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

fn header_value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}
