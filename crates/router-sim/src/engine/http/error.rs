//! OpenAI-shaped errors: `{"error": {"message", "type", "code"}}` with the HTTP status.

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::StatusCode;

/// An error answer.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    /// Seconds for a `Retry-After` header.
    pub(crate) retry_after: Option<u64>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), retry_after: None }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub(crate) fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }
}

fn error_type(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST => "BadRequestError",
        StatusCode::UNAUTHORIZED => "AuthenticationError",
        StatusCode::NOT_FOUND => "NotFoundError",
        StatusCode::CONFLICT => "ConflictError",
        StatusCode::TOO_MANY_REQUESTS => "RateLimitError",
        s if s.is_server_error() => "InternalServerError",
        _ => "Error",
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "object": "error",
            "error": {
                "message": self.message,
                "type": error_type(self.status),
                "code": self.status.as_u16(),
            }
        });
        let mut response = (self.status, Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            response.headers_mut().insert(http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}
