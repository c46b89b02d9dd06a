//! Admission of inference requests: a bound on those in flight (`server.max_concurrent_requests`)
//! with a bounded FIFO queue in front of it (`server.queue_size`, each waiting at most
//! `server.queue_timeout_secs`). A request beyond the bound waits in the queue for a slot; a full
//! queue or an expired wait is a 429 with `Retry-After`, as the routers this one replaces answer.
//! A client that goes away while queued leaves the queue (its wait is dropped). The queue holds
//! requests whose bodies have arrived, within the bounds of [`BodyBudget`] (`bodies`): a
//! request enters the queue, and its `queue_timeout_secs` starts, once its body is in memory;
//! a slow upload holds no slot. A request holds its slot until its response body ends or is
//! dropped.
//!
//! In front of the queue, each client key's rate limits ([`crate::rate_limit`]) refuse what is over them,
//! so a limited request never takes a queue place.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body::Frame;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::auth::{self, Credentials, KeyIndex};
use crate::error::ApiError;
use crate::metrics;
use crate::rate_limit;
use router_config::ServerSection;

mod bodies;

pub(crate) use bodies::{BodyBudget, HeldBody};

/// The concurrency bound and its queue, shared by every inference route.
#[derive(Debug)]
pub(crate) struct Admission {
    /// One permit per request allowed in flight. Tokio's semaphore is fair: a released permit
    /// goes to the longest waiter, never to a newcomer, so the queue is FIFO.
    slots: Arc<Semaphore>,
    /// Most requests waiting at once.
    queue_size: usize,
    /// Longest wait of one request.
    queue_timeout: Duration,
    /// Requests waiting now.
    queued: AtomicUsize,
}

impl Admission {
    /// `max_in_flight` slots with a queue of `queue_size` waiting at most `queue_timeout`.
    pub(crate) fn new(max_in_flight: usize, queue_size: usize, queue_timeout: Duration) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max_in_flight)),
            queue_size,
            queue_timeout,
            queued: AtomicUsize::new(0),
        }
    }

    /// Slots free now.
    pub(crate) fn available(&self) -> usize {
        self.slots.available_permits()
    }

    /// Requests waiting in the queue now.
    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// A slot: at once when one is free, else after waiting in the queue.
    async fn admit(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        if let Ok(permit) = Arc::clone(&self.slots).try_acquire_owned() {
            return Ok(permit);
        }
        let _place = self.enqueue().ok_or(ApiError::QueueFull)?;
        let started = Instant::now();
        let waited =
            tokio::time::timeout(self.queue_timeout, Arc::clone(&self.slots).acquire_owned());
        let outcome = match waited.await {
            Ok(Ok(permit)) => Ok(permit),
            // The semaphore is never closed; a timeout is the only way out without a slot.
            Ok(Err(_)) | Err(_) => {
                Err(ApiError::QueueTimeout { secs: self.queue_timeout.as_secs() })
            }
        };
        metrics::queue_wait(started.elapsed(), outcome.is_ok());
        outcome
    }

    /// A place in the queue, given back on drop; `None` when the queue is full.
    fn enqueue(&self) -> Option<QueuePlace<'_>> {
        self.queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.queue_size).then_some(n + 1)
            })
            .ok()?;
        metrics::queue_depth(self.queued());
        Some(QueuePlace(self))
    }
}

/// One request's place in the queue.
struct QueuePlace<'a>(&'a Admission);

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::AcqRel);
        metrics::queue_depth(self.0.queued());
    }
}

/// The rate limits `server` sets for the client keys of `credentials`: a key's own
/// `rate_limit`, else `server.rate_limit`; with no key, `server.rate_limit` shared by every
/// client. A key is named by its `name`, else `api_keys[i]` (`ROUTER_API_KEY` for the
/// environment's).
pub(crate) fn rate_limits(
    server: &ServerSection,
    credentials: &Credentials,
) -> rate_limit::RateLimits {
    let default = server.rate_limit.unwrap_or_default();
    if credentials.client_keys.is_empty() {
        return rate_limit::RateLimits::anonymous(&default);
    }
    if server.api_keys.is_empty() {
        return rate_limit::RateLimits::per_key([(auth::CLIENT_KEY_ENV.to_owned(), &default)]);
    }
    rate_limit::RateLimits::per_key(server.api_keys.iter().enumerate().map(|(i, entry)| {
        let name = entry.name.clone().unwrap_or_else(|| format!("api_keys[{i}]"));
        (name, entry.rate_limit.as_ref().unwrap_or(&default))
    }))
}

/// Middleware of the inference routes, in front of the admission queue: lets a request
/// through its key's request limit (and past an empty token bucket), or answers 429; a
/// request of a key with a token limit carries its [`rate_limit::TokenCharge`].
pub(crate) async fn per_key(
    State(limits): State<Arc<rate_limit::RateLimits>>,
    mut request: Request,
    next: Next,
) -> Response {
    let key = request.extensions().get::<KeyIndex>().copied();
    match rate_limited(&limits, key) {
        Ok(Some(charge)) => {
            request.extensions_mut().insert(charge);
        }
        Ok(None) => {}
        Err(refusal) => return refusal.into_response(),
    }
    next.run(request).await
}

/// A request of client key `key` (none without client keys) through its key's request limit:
/// the refusal (429) when it is over, else where its tokens are charged when the key limits
/// tokens. What [`per_key`] and the inference front (`server/front.rs`) share.
pub(crate) fn rate_limited(
    limits: &rate_limit::RateLimits,
    key: Option<KeyIndex>,
) -> Result<Option<rate_limit::TokenCharge>, ApiError> {
    let Some(limiter) = limits.of(key.map(|KeyIndex(place)| place)) else { return Ok(None) };
    limiter.admit_now()?;
    Ok(limiter.limits_tokens().then(|| rate_limit::TokenCharge(Arc::clone(limiter))))
}

/// What [`concurrency`] reads: the body budget, the admission queue and the request-id headers.
pub(crate) type AdmissionState = (Arc<BodyBudget>, Arc<Admission>, Arc<[http::HeaderName]>);

/// Reads a request's body within the body budget, then admits it through the admission queue,
/// or answers why not: the inference routes' layer (the router's own front does the same in
/// `server/front.rs`).
pub(crate) async fn concurrency(
    State((bodies, admission, ids)): State<AdmissionState>,
    request: Request,
    next: Next,
) -> Response {
    let (mut parts, body) = request.into_parts();
    let incoming = crate::intake::IncomingBody::framed_by(&parts.headers, body);
    let (bytes, held) = match bodies.receive(incoming).await {
        Ok(received) => received,
        Err(refusal) => return refused_body(refusal, &parts.headers, &ids),
    };
    // The body is whole now: nobody waits for a `100 Continue`.
    parts.headers.remove(http::header::EXPECT);
    let request = Request::from_parts(parts, Body::from(bytes));
    match admit(&admission).await {
        Ok(permit) => holding(next.run(request).await, (permit, held)),
        Err(refusal) => refusal.into_response(),
    }
}

/// The answer to a body refused before its request reached its handler (too large, too slow,
/// no room), with the request id the handler would have given it (from `names`, else fresh),
/// counted with the requests.
pub(crate) fn refused_body(
    refusal: ApiError,
    headers: &http::HeaderMap,
    names: &[http::HeaderName],
) -> Response {
    tracing::info!(error = %refusal, "request body refused");
    let status = refusal.status().as_u16();
    let mut response = refusal.into_response();
    let id = crate::intake::request_id(headers, names);
    response.headers_mut().insert(crate::intake::REQUEST_ID_HEADER, id);
    metrics::request("", "", status, std::time::Duration::ZERO);
    response
}

/// A slot of `admission`, or the refusal (429, counted by reason). What
/// [`concurrency`] and the inference front (`server/front.rs`) share.
pub(crate) async fn admit(admission: &Admission) -> Result<OwnedSemaphorePermit, ApiError> {
    admission.admit().await.inspect_err(|refusal| {
        let reason = match refusal {
            ApiError::QueueFull => "queue_full",
            _ => "queue_timeout",
        };
        metrics::refused(reason);
    })
}

/// `response`, its body holding the request's slot and its body's bytes until it ends or is
/// dropped.
pub(crate) fn holding(response: Response, held: (OwnedSemaphorePermit, HeldBody)) -> Response {
    response.map(|body| Body::new(PermitBody { inner: body, _held: held }))
}

struct PermitBody {
    inner: Body,
    _held: (OwnedSemaphorePermit, HeldBody),
}

impl http_body::Body for PermitBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests;
