//! The inference endpoints: `POST /v1/chat/completions`, `POST /v1/completions`, SGLang's
//! `POST /generate`, and the rest of the OpenAI surface passed through to one engine of the
//! body's model (`/v1/embeddings`, `/v1/rerank`, `/v1/score`, `/v1/tokenize`,
//! `/v1/detokenize`). Each reads and prepares its request once, then [`crate::serve`]s it on
//! the one request path; errors are answered in the OpenAI shape and every request is counted
//! by model, bucket and status.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::future::BoxFuture;
use router_affinity::{MAX_KEY_BYTES, ScopeError};
use router_buckets::{SloPreferences, SloTargets};
use tracing::{Instrument, info, warn};

use crate::app::AppContext;
use crate::error::{ApiError, Chain};
use crate::intake::{IncomingBody, REQUEST_ID_HEADER, read_body, request_id};
use crate::metrics;
use crate::rate_limit::TokenCharge;
use crate::serve::{Labels, serve};
use crate::telemetry::RequestTrace;
use router_config::ModelRuntime;
use router_engine_client::trace::{TRACEPARENT, TRACESTATE};
use router_prepare::{
    DP_RANK, Endpoint, PreparedRequest, client_rank, parse_request, prepare, text_tokens,
};

/// The handler of `endpoint`'s route (the path is [`Endpoint::path`]). It takes the request
/// whole: axum's `HeaderMap` extractor would copy the headers. Its tokens are charged where
/// `crate::limit::per_key` put a [`TokenCharge`], when its client key has a token limit.
pub(crate) fn handler(
    endpoint: Endpoint,
) -> impl Fn(State<Arc<AppContext>>, Request) -> BoxFuture<'static, Response> + Clone {
    move |State(ctx), request: Request| {
        let (mut parts, body) = request.into_parts();
        let charge = parts.extensions.remove::<TokenCharge>();
        let body = IncomingBody::framed_by(&parts.headers, body);
        Box::pin(endpoint_request(endpoint, ctx, charge, parts.headers, body))
    }
}

pub(crate) async fn endpoint_request(
    endpoint: Endpoint,
    ctx: Arc<AppContext>,
    charge: Option<TokenCharge>,
    headers: HeaderMap,
    body: IncomingBody,
) -> Response {
    let request_id = request_id(&headers, ctx.request_id_headers());
    let span = tracing::info_span!("request", id = %request_id.to_str().unwrap_or_default());
    let started = Instant::now();
    let mut labels = Labels::default();
    let trace = RequestTrace::start(&headers, endpoint.path(), &request_id);
    let handled = || {
        handle(endpoint, &ctx, charge, &headers, body, &request_id, started, &mut labels, &trace)
    };
    // Instrumented only when the span records: the wrapper would be one more copy of the
    // handler's future, and one more layer to poll, for nothing. The future (some 3 KB) is
    // made where it is awaited: made first and bound, it would be copied there.
    let result =
        if span.is_disabled() { handled().await } else { handled().instrument(span.clone()).await };
    let mut response = match result {
        Ok(response) => response,
        Err(err) => {
            let _enter = span.enter();
            let (status, error) = (err.status().as_u16(), Chain(&err));
            if err.status().is_server_error() {
                warn!(status, %error, "request failed");
            } else {
                info!(status, %error, "request rejected");
            }
            err.into_response()
        }
    };
    let status = response.status().as_u16();
    metrics::request(labels.model(), labels.bucket(), status, started.elapsed());
    response.headers_mut().insert(REQUEST_ID_HEADER, request_id);
    trace.finish(response)
}

#[expect(clippy::too_many_arguments, reason = "the request's parts, each used once")]
async fn handle(
    endpoint: Endpoint,
    ctx: &Arc<AppContext>,
    charge: Option<TokenCharge>,
    headers: &HeaderMap,
    body: IncomingBody,
    request_id: &HeaderValue,
    started: Instant,
    labels: &mut Labels,
    trace: &RequestTrace,
) -> Result<Response, ApiError> {
    if ctx.is_draining() {
        return Err(ApiError::ShuttingDown);
    }
    let span = trace.child("preparation");
    let body = read_body(body, ctx.max_body_bytes(), ctx.server().body_read_timeout_secs).await;
    let prepared = match body {
        Ok(body) => prepare_request(ctx, endpoint, headers, body, labels).await,
        Err(err) => Err(err),
    };
    let (model, prepared) = prepared.inspect_err(|err| span.fail(&Chain(err)))?;
    if let Some(charge) = charge {
        // Prompt plus requested output: what the engine may spend on it.
        let tokens = prepared.expected_peak_tokens.unwrap_or(prepared.input_tokens);
        charge.charge(tokens).inspect_err(|err| span.fail(&Chain(err)))?;
    }
    if span.is_recording() {
        span.set("router.model", labels.model().to_owned());
        span.set("router.input_tokens", prepared.input_tokens as i64);
    }
    drop(span);
    serve(ctx, model, &prepared, request_id, started, labels, trace).await
}

/// Parses and prepares a whole request body of `endpoint` with its `headers`: the model (named
/// in `labels` as soon as it is known), the affinity keys, the SLO targets, the client's
/// data-parallel rank, the tokens. What the HTTP front and the endpoint picker (`crate::epp`) share.
pub(crate) async fn prepare_request<'c>(
    ctx: &'c AppContext,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: Bytes,
    labels: &mut Labels,
) -> Result<(&'c ModelRuntime, PreparedRequest), ApiError> {
    let request = parse_request(endpoint, &body, ctx.server().max_batch_size)?;
    let client_rank = client_rank(request.client_rank, headers.get(&DP_RANK))?;
    let model = ctx.requested_model(request.model.as_deref())?;
    labels.set_model(&model.id);
    let session = affinity_key(headers, &model.session_header)?;
    let routing = affinity_key(headers, &model.routing_header)?;
    let slo = slo_targets(headers, model.resolver.slo())?;
    // Tokenized only when something reads the ids or the exact count (`needs_tokens`): the
    // size estimate stands otherwise, and the answer says so.
    let tokenization = model.tokenization.as_ref().filter(|_| model.needs_tokens);
    let prepared = if tokenization.is_some() && body.len() > INLINE_PREPARE_BYTES {
        // Templating and tokenizing a long prompt takes milliseconds: off the event loop, so
        // the other connections it serves are not held up; at most one such preparation per
        // core at a time, the permit travelling with the work, so a client that leaves cannot
        // let it pile up.
        let permit = Arc::clone(blocking_slots())
            .acquire_owned()
            .await
            .expect("the preparation slots are never closed");
        let tokenization = tokenization.cloned();
        let (session, routing) = (session.map(str::to_owned), routing.map(str::to_owned));
        tokio::task::spawn_blocking(move || -> Result<PreparedRequest, ApiError> {
            let _permit = permit;
            let tokenization = tokenization.as_deref();
            Ok(prepare(body, request, tokenization, session.as_deref(), routing.as_deref())?)
        })
        .await
        .map_err(ApiError::Preparation)??
    } else {
        prepare(body, request, tokenization.map(|t| &**t), session, routing)?
    };
    if let Some(reason) = prepared.unmatchable {
        metrics::prefix_unmatchable(reason);
    }
    let mut prepared = PreparedRequest { slo, client_rank, ..prepared };
    if prepared.tokens.is_none() && model.reads_prefixes && model.tokenization.is_none() {
        prepared.tokens = text_tokens(&prepared);
    }
    Ok((model, prepared))
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

/// The session or routing key in header `name`: absent is `None`; a value that is not
/// visible ASCII, or longer than an affinity key may be, is the client's mistake (400 naming
/// the header).
fn affinity_key<'h>(
    headers: &'h HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'h str>, ApiError> {
    let Some(value) = headers.get(name) else { return Ok(None) };
    let invalid =
        |message: String| ApiError::InvalidRequest { message, param: Some(name.as_str().into()) };
    let key =
        value.to_str().map_err(|_| invalid(format!("header {name} must be visible ASCII")))?;
    if key.len() > MAX_KEY_BYTES {
        let error = ScopeError::KeyTooLong { len: key.len(), max: MAX_KEY_BYTES };
        return Err(invalid(format!("header {name}: {error}")));
    }
    Ok(Some(key))
}

/// The request's time-to-first-token target (milliseconds).
pub(crate) const TTFT_SLO_HEADER: &str = "x-sgl-ttft-slo-ms";
/// The request's decode-throughput target (tokens per second).
pub(crate) const TPS_SLO_HEADER: &str = "x-sgl-tps-slo";
/// The two SLO headers as names, parsed once.
const SLO_FIELDS: [HeaderName; 2] =
    [HeaderName::from_static(TTFT_SLO_HEADER), HeaderName::from_static(TPS_SLO_HEADER)];

/// Every request header field an inference request is read for under `ctx`'s configuration:
/// its client key, request id, trace context, data-parallel rank, each model's affinity
/// headers and the SLO targets (its body's framing comes apart, as [`IncomingBody`]: the
/// front that parsed the head knows it). The router's own HTTP/1.1 loop keeps these of a
/// request head and reads past the rest, so a field read on an inference request's way must
/// be named here (the end-to-end tests send each through that loop).
pub(crate) fn request_fields(ctx: &AppContext) -> Arc<[HeaderName]> {
    let fixed = [AUTHORIZATION, DP_RANK, TRACEPARENT, TRACESTATE];
    let configured = ctx.request_id_headers().iter().cloned();
    let affinity = ctx.models().flat_map(|m| [m.session_header.clone(), m.routing_header.clone()]);
    let mut fields: Vec<HeaderName> = Vec::new();
    for name in fixed.into_iter().chain(SLO_FIELDS).chain(configured).chain(affinity) {
        if !fields.contains(&name) {
            fields.push(name);
        }
    }
    fields.into()
}

/// The SLO targets of the request's headers that the model reads: a header whose preference is
/// disabled is ignored whatever it holds; an enabled one that does not parse, a TTFT target of
/// 0 or a throughput target that is not a finite number above 0 is a 400 naming the header.
fn slo_targets(headers: &HeaderMap, preferences: SloPreferences) -> Result<SloTargets, ApiError> {
    let text = |name: &HeaderName| -> Option<String> {
        headers.get(name).map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
    };
    let [ttft_field, tps_field] = &SLO_FIELDS;
    let invalid = |header| move |error| ApiError::InvalidSloTarget { header, error };
    let mut targets = SloTargets::NONE;
    if preferences.ttft.is_enabled()
        && let Some(value) = text(ttft_field)
    {
        targets.ttft_ms =
            Some(SloTargets::parse_ttft_ms(&value).map_err(invalid(TTFT_SLO_HEADER))?);
    }
    if preferences.tps.is_enabled()
        && let Some(value) = text(tps_field)
    {
        let tps = SloTargets::parse_tokens_per_second(&value).map_err(invalid(TPS_SLO_HEADER))?;
        targets.tokens_per_second = Some(tps);
    }
    Ok(targets)
}

#[cfg(test)]
mod tests;
