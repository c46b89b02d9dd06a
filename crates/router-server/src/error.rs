//! Every error a client can see, typed with its source, and the one place that maps it to an
//! HTTP status and an OpenAI-shaped body: `{"error": {"message", "type", "code", "param"}}`.
//!
//! The message a client reads is the error and its causes, outermost first ([`Chain`]): the
//! one place a cause becomes text.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use router_buckets::SelectError;
use router_policies::PickError;
use router_workers::WorkerId;

use crate::rate_limit::Refusal;
use router_prepare::{InvalidRequest, PrepareError};

/// A body's or transport's error, as the HTTP crates box them.
pub(crate) use router_engine_client::BoxError;

/// An error answered to the client.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum ApiError {
    /// The request is malformed or names a bad parameter.
    #[error("{message}")]
    InvalidRequest {
        /// What is wrong.
        message: String,
        /// The offending parameter (a body field, or a header's name).
        param: Option<String>,
    },
    /// An SLO target header that cannot be used (docs/design/SLO.md, "Errors").
    #[error("header {header}")]
    InvalidSloTarget {
        /// The header.
        header: &'static str,
        /// What is wrong with its value.
        #[source]
        error: router_buckets::SloTargetError,
    },
    /// The model is not served here.
    #[error("model {0:?} is not served by this router")]
    UnknownModel(String),
    /// The body exceeds the configured limit.
    #[error("request body exceeds {limit} bytes")]
    BodyTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The client did not send the whole body in time.
    #[error("the request body did not arrive within {secs} s")]
    BodyTimeout {
        /// The limit in seconds.
        secs: u64,
    },
    /// The bucket loop found no complete selection.
    #[error(transparent)]
    Select(#[from] SelectError),
    /// Preparing a long request on the blocking pool failed (the task panicked or the pool
    /// shut down).
    #[error("request preparation failed")]
    Preparation(#[source] tokio::task::JoinError),
    /// The engine of a plain dispatch failed.
    #[error(transparent)]
    Engine(EngineError),
    /// The prefill engine of a PD pair failed.
    #[error("prefill engine {} failed", .0.worker())]
    Prefill(#[source] EngineError),
    /// The decode engine of a PD pair failed. Never retried: its prefill partner may already
    /// hold the request.
    #[error("decode engine {} failed", .0.worker())]
    Decode(#[source] EngineError),
    /// A missing or wrong credential (client API key or admin token); says which, never the
    /// key.
    #[error("{0}")]
    Unauthorized(&'static str),
    /// Every concurrency slot is taken and the admission queue is full.
    #[error("the router is at its concurrent request limit and its queue is full; retry shortly")]
    QueueFull,
    /// The router holds as many request bodies as it may (arriving, or bytes in memory).
    #[error("the router is receiving as many request bodies as it may; retry shortly")]
    BodiesFull,
    /// The request waited its longest in the admission queue without a slot freeing.
    #[error("no concurrency slot freed within {secs} s in the admission queue; retry shortly")]
    QueueTimeout {
        /// The longest wait, in seconds.
        secs: u64,
    },
    /// The client's key is over one of its rate limits.
    #[error(transparent)]
    RateLimited(#[from] Refusal),
    /// The router is shutting down.
    #[error("the router is shutting down")]
    ShuttingDown,
    /// The router shut down before the answer ended: its drain (`server.shutdown_drain_secs`)
    /// ran out.
    #[error("the router shut down before the answer ended (server.shutdown_drain_secs ran out)")]
    DrainEnded,
    /// Something named by the path does not exist (admin API), or no route serves the path.
    #[error("{0}")]
    NotFound(String),
    /// The path is served, but not with this method.
    #[error("{method} is not served at {path}")]
    MethodNotAllowed {
        /// The request's method.
        method: String,
        /// The request's path.
        path: String,
    },
    /// No healthy engine of the model answered an information request.
    #[error("no healthy engine of model {model} answered {path}")]
    NoEngineAnswered {
        /// The model.
        model: String,
        /// The engine path asked.
        path: String,
    },
    /// A worker with this id is already registered (admin API).
    #[error(transparent)]
    WorkerExists(router_workers::WorkerError),
    /// The endpoint picker chose an engine whose URL names no `host:port` Envoy could dial.
    #[error("engine {worker} has no host:port in its url {url}")]
    NoEndpoint {
        /// The engine.
        worker: WorkerId,
        /// Its URL.
        url: String,
    },
    /// The worker stands for a discovered pod, which alone decides when it leaves (admin API).
    #[error(
        "worker {id} was discovered from pod {namespace}/{pod} and leaves when the pod stops \
         being a Ready, selected pod: change the pod (its labels or readiness) instead"
    )]
    WorkerDiscovered {
        /// The worker.
        id: String,
        /// The pod's namespace.
        namespace: String,
        /// The pod.
        pod: String,
    },
}

impl ApiError {
    /// Whether the bucket loop may select again and resend: only a plain dispatch, whose
    /// engine received nothing or declined the request before any byte of its answer went to
    /// the client.
    pub(crate) fn is_retryable(&self) -> bool {
        matches!(
            self,
            ApiError::Engine(
                EngineError::Send(SendError::Unreachable { .. }) | EngineError::Declined { .. }
            )
        )
    }

    /// Why a retry happens, for metrics: `unreachable` or `status_<code>`.
    pub(crate) fn retry_reason(&self) -> String {
        match self {
            ApiError::Engine(EngineError::Declined { status, .. }) => {
                format!("status_{}", status.as_u16())
            }
            _ => "unreachable".to_owned(),
        }
    }

    /// The HTTP status of this error.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidRequest { .. }
            | ApiError::InvalidSloTarget { .. }
            | ApiError::RateLimited(Refusal::OverTokenBurst { .. }) => StatusCode::BAD_REQUEST,
            ApiError::UnknownModel(_) | ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::WorkerExists(_) | ApiError::WorkerDiscovered { .. } => StatusCode::CONFLICT,
            ApiError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::Select(err) => select_status(err),
            ApiError::QueueFull
            | ApiError::BodiesFull
            | ApiError::QueueTimeout { .. }
            | ApiError::RateLimited(Refusal::Limited { .. }) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::ShuttingDown | ApiError::DrainEnded | ApiError::NoEngineAnswered { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Preparation(_) | ApiError::NoEndpoint { .. } => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            ApiError::Engine(EngineError::Declined { status, .. })
            | ApiError::Decode(EngineError::Declined { status, .. }) => *status,
            ApiError::Engine(err) | ApiError::Prefill(err) | ApiError::Decode(err) => {
                if err.is_timeout() { StatusCode::GATEWAY_TIMEOUT } else { StatusCode::BAD_GATEWAY }
            }
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
        }
    }

    /// The status the endpoint picker answers with (`crate::epp`): [`ApiError::status`], but
    /// admission rejecting every engine is shedding, 429 as the Gateway API inference
    /// extension's pickers answer it, so that clients and gateways back off instead of
    /// reading the pool as down.
    pub(crate) fn picker_status(&self) -> StatusCode {
        match self {
            ApiError::Select(SelectError::NoAdmissibleEngine { .. }) => {
                StatusCode::TOO_MANY_REQUESTS
            }
            _ => self.status(),
        }
    }

    /// The OpenAI `type` and `code` fields.
    pub(crate) fn kind(&self) -> (&'static str, &'static str) {
        match self {
            ApiError::InvalidRequest { .. } => ("invalid_request_error", "invalid_request"),
            ApiError::InvalidSloTarget { .. } => ("invalid_request_error", "invalid_slo_target"),
            ApiError::UnknownModel(_) => ("invalid_request_error", "model_not_found"),
            ApiError::BodyTooLarge { .. } => ("invalid_request_error", "body_too_large"),
            ApiError::BodyTimeout { .. } => ("invalid_request_error", "body_timeout"),
            ApiError::Select(err) => select_kind(err),
            ApiError::ShuttingDown => ("service_unavailable", "shutting_down"),
            ApiError::DrainEnded => ("service_unavailable", "router_shutdown"),
            ApiError::QueueFull => ("rate_limit_exceeded", "queue_full"),
            ApiError::BodiesFull => ("rate_limit_exceeded", "bodies_full"),
            ApiError::QueueTimeout { .. } => ("rate_limit_exceeded", "queue_timeout"),
            ApiError::RateLimited(Refusal::Limited { .. }) => {
                ("rate_limit_exceeded", "rate_limited")
            }
            ApiError::RateLimited(Refusal::OverTokenBurst { .. }) => {
                ("invalid_request_error", "over_token_burst")
            }
            ApiError::NoEngineAnswered { .. } => ("service_unavailable", "no_engine_answered"),
            ApiError::Preparation(_) | ApiError::NoEndpoint { .. } => {
                ("internal_error", "internal_error")
            }
            ApiError::Engine(err) | ApiError::Prefill(err) | ApiError::Decode(err) => {
                ("upstream_error", err.code())
            }
            ApiError::Unauthorized(_) => ("authentication_error", "unauthorized"),
            ApiError::NotFound(_) => ("invalid_request_error", "not_found"),
            ApiError::MethodNotAllowed { .. } => ("invalid_request_error", "method_not_allowed"),
            ApiError::WorkerExists(_) => ("invalid_request_error", "invalid_request"),
            ApiError::WorkerDiscovered { .. } => ("invalid_request_error", "worker_discovered"),
        }
    }

    /// The JSON body.
    pub(crate) fn body(&self) -> serde_json::Value {
        let (kind, code) = self.kind();
        let param = match self {
            ApiError::InvalidRequest { param, .. } => param.clone(),
            ApiError::InvalidSloTarget { header, .. } => Some((*header).to_owned()),
            ApiError::WorkerExists(_) => Some("id".into()),
            _ => None,
        };
        let message = Chain(self).to_string();
        serde_json::json!({
            "error": {"message": message, "type": kind, "code": code, "param": param}
        })
    }
}

/// The policy's error behind a bucket that stopped routing.
fn stopped_by(err: &SelectError) -> Option<&PickError> {
    match err {
        SelectError::Stopped { error, .. } => Some(&error.error),
        _ => None,
    }
}

fn select_status(err: &SelectError) -> StatusCode {
    match err {
        SelectError::NoMatchingBucket { .. } => StatusCode::BAD_REQUEST,
        SelectError::NoAdmissibleEngine { .. } | SelectError::NoCandidates { .. } => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        _ if matches!(stopped_by(err), Some(PickError::InvalidKey { .. })) => {
            StatusCode::BAD_REQUEST
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn select_kind(err: &SelectError) -> (&'static str, &'static str) {
    match err {
        SelectError::NoMatchingBucket { .. } => ("invalid_request_error", "no_matching_bucket"),
        SelectError::NoAdmissibleEngine { .. } => ("service_unavailable", "no_admissible_engine"),
        SelectError::NoCandidates { .. } => ("service_unavailable", "no_candidates"),
        _ if matches!(stopped_by(err), Some(PickError::InvalidKey { .. })) => {
            ("invalid_request_error", "invalid_request")
        }
        _ => ("internal_error", "internal_error"),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut response = (status, axum::Json(self.body())).into_response();
        if let ApiError::RateLimited(Refusal::Limited { retry_after_secs, .. }) = self {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
        } else if matches!(status, StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS)
        {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<InvalidRequest> for ApiError {
    fn from(err: InvalidRequest) -> Self {
        ApiError::InvalidRequest { message: err.message, param: err.param }
    }
}

impl From<PrepareError> for ApiError {
    fn from(err: PrepareError) -> Self {
        match err {
            PrepareError::Invalid(invalid) => invalid.into(),
            PrepareError::Tokenize(err) => ApiError::InvalidRequest {
                message: Chain(&err).to_string(),
                param: Some("messages".into()),
            },
        }
    }
}

mod engine;

pub(crate) use crate::chain::Chain;

pub(crate) use engine::EngineError;
pub(crate) use router_engine_client::SendError;

#[cfg(test)]
mod tests;
