//! Every error a client can see, and the one place that maps it to an HTTP status.
//!
//! Bodies are OpenAI-shaped: `{"error": {"message", "type", "code", "param"}}`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use router_policies::Rejection;
use router_workers::Stage;

/// An error answered to the client.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// The request is malformed or names a bad parameter.
    #[error("{message}")]
    InvalidRequest {
        /// What is wrong.
        message: String,
        /// The offending parameter.
        param: Option<String>,
    },
    /// No bucket supports the request's length.
    #[error("no bucket accepts {input_tokens} input tokens{}", peak.map(|p| format!(" with a peak of {p}")).unwrap_or_default())]
    NoMatchingBucket {
        /// Prompt tokens.
        input_tokens: u64,
        /// Expected peak, when known.
        peak: Option<u64>,
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
    /// Every compatible bucket was tried and admission rejected every engine it could use.
    #[error("no admissible engine: {}", rejections.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    NoAdmissibleEngine {
        /// Every rejection met, in order.
        rejections: Vec<Rejection>,
    },
    /// Every compatible bucket was tried and the last one had no candidate for a stage.
    #[error("no candidates for the {stage} stage in any compatible bucket")]
    NoCandidates {
        /// The stage that had none.
        stage: Stage,
    },
    /// The router or its configuration is at fault (invalid signal, configuration, foreign pick).
    #[error("{0}")]
    Internal(String),
    /// The engine failed.
    #[error("{0}")]
    Upstream(String),
    /// The engine could not be reached: it received nothing (the one retryable failure).
    #[error("{0}")]
    EngineUnreachable(String),
    /// The engine did not answer in time.
    #[error("{0}")]
    UpstreamTimeout(String),
    /// A missing or wrong credential (client API key or admin token); says which, never the
    /// key.
    #[error("{0}")]
    Unauthorized(&'static str),
    /// Too many requests are in flight at the router.
    #[error("the router is at its concurrent request limit; retry shortly")]
    Overloaded,
    /// The router is shutting down.
    #[error("the router is shutting down")]
    ShuttingDown,
    /// Something named by the path does not exist (admin API).
    #[error("{0}")]
    NotFound(String),
}

impl ApiError {
    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidRequest { .. } | ApiError::NoMatchingBucket { .. } => {
                StatusCode::BAD_REQUEST
            }
            ApiError::UnknownModel(_) | ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::NoAdmissibleEngine { .. }
            | ApiError::NoCandidates { .. }
            | ApiError::Overloaded
            | ApiError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Upstream(_) | ApiError::EngineUnreachable(_) => StatusCode::BAD_GATEWAY,
            ApiError::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
        }
    }

    /// The OpenAI `type` and `code` fields.
    pub fn kind(&self) -> (&'static str, &'static str) {
        match self {
            ApiError::InvalidRequest { .. } => ("invalid_request_error", "invalid_request"),
            ApiError::NoMatchingBucket { .. } => ("invalid_request_error", "no_matching_bucket"),
            ApiError::UnknownModel(_) => ("invalid_request_error", "model_not_found"),
            ApiError::BodyTooLarge { .. } => ("invalid_request_error", "body_too_large"),
            ApiError::BodyTimeout { .. } => ("invalid_request_error", "body_timeout"),
            ApiError::NoAdmissibleEngine { .. } => ("service_unavailable", "no_admissible_engine"),
            ApiError::NoCandidates { .. } => ("service_unavailable", "no_candidates"),
            ApiError::ShuttingDown => ("service_unavailable", "shutting_down"),
            ApiError::Overloaded => ("service_unavailable", "overloaded"),
            ApiError::Internal(_) => ("internal_error", "internal_error"),
            ApiError::Upstream(_) => ("upstream_error", "engine_failed"),
            ApiError::EngineUnreachable(_) => ("upstream_error", "engine_unreachable"),
            ApiError::UpstreamTimeout(_) => ("upstream_error", "engine_timeout"),
            ApiError::Unauthorized(_) => ("authentication_error", "unauthorized"),
            ApiError::NotFound(_) => ("invalid_request_error", "not_found"),
        }
    }

    /// A short label for metrics.
    pub fn code(&self) -> &'static str {
        self.kind().1
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        let (kind, code) = self.kind();
        let param = match self {
            ApiError::InvalidRequest { param, .. } => param.clone(),
            _ => None,
        };
        serde_json::json!({
            "error": {"message": self.to_string(), "type": kind, "code": code, "param": param}
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut response = (status, axum::Json(self.body())).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
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

impl From<crate::prepare::InvalidRequest> for ApiError {
    fn from(err: crate::prepare::InvalidRequest) -> Self {
        ApiError::InvalidRequest { message: err.message, param: err.param }
    }
}

impl From<crate::prepare::PrepareError> for ApiError {
    fn from(err: crate::prepare::PrepareError) -> Self {
        match err {
            crate::prepare::PrepareError::Invalid(invalid) => invalid.into(),
            crate::prepare::PrepareError::Tokenize(err) => ApiError::InvalidRequest {
                message: err.to_string(),
                param: Some("messages".into()),
            },
        }
    }
}
