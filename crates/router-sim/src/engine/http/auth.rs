//! `--api-key`: every request under `/v1/` must carry `Authorization: Bearer KEY`, as in vLLM,
//! and so must SGLang's `/generate` (SGLang guards it too: no generation endpoint is open);
//! other paths (`/health`, the SGLang probes) stay open.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::HeaderValue;
use http::header::{AUTHORIZATION, WWW_AUTHENTICATE};

use super::error::ApiError;
use crate::engine::api_key::ApiKey;

/// Answers 401 to a guarded request without the right bearer token; passes everything else on.
pub(crate) async fn require_api_key(
    State(key): State<ApiKey>,
    request: Request,
    next: Next,
) -> Response {
    if !guarded(request.uri().path()) {
        return next.run(request).await;
    }
    match check(&key, request.headers().get(AUTHORIZATION)) {
        Ok(()) => next.run(request).await,
        Err(error) => {
            let mut response = error.into_response();
            response.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            response
        }
    }
}

/// Whether `path` is under `/v1` or is `/generate`.
fn guarded(path: &str) -> bool {
    path == "/v1" || path.starts_with("/v1/") || path == "/generate"
}

/// Checks an `Authorization` header against `key`. The answers never quote what was sent.
fn check(key: &ApiKey, authorization: Option<&HeaderValue>) -> Result<(), ApiError> {
    let token =
        authorization.and_then(|value| bearer_token(value.as_bytes())).ok_or_else(|| {
            ApiError::unauthorized("missing API key: send it as `Authorization: Bearer <key>`")
        })?;
    if key.matches(token) { Ok(()) } else { Err(ApiError::unauthorized("invalid API key")) }
}

/// The token of a `Bearer <token>` header value (the scheme in any case).
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let space = value.iter().position(|&b| b == b' ')?;
    let (scheme, token) = value.split_at(space);
    scheme.eq_ignore_ascii_case(b"bearer").then(|| token.trim_ascii())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_v1_paths_and_generate_are_guarded() {
        let guarded_paths =
            ["/v1", "/v1/", "/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/x"];
        for path in guarded_paths.into_iter().chain(["/v1/loads", "/generate"]) {
            assert!(guarded(path), "{path}");
        }
        let open = ["/health", "/health_generate", "/get_load", "/v10", "/v1x/models", "/"];
        for path in open.into_iter().chain(["/generate/x", "/generated"]) {
            assert!(!guarded(path), "{path}");
        }
    }

    #[test]
    fn bearer_tokens_are_read_in_any_scheme_case() {
        assert_eq!(bearer_token(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"Basic abc"), None);
        assert_eq!(bearer_token(b"Bearer"), None);
        assert_eq!(bearer_token(b"abc"), None);
    }

    #[test]
    fn check_tells_missing_from_wrong_without_quoting_the_token() {
        let key = ApiKey::new("right");
        let header = |s: &'static str| HeaderValue::from_static(s);
        assert!(check(&key, Some(&header("Bearer right"))).is_ok());
        let missing = check(&key, None).expect_err("no header");
        assert!(missing.message.starts_with("missing API key"), "{}", missing.message);
        let basic = check(&key, Some(&header("Basic right"))).expect_err("not bearer");
        assert!(basic.message.starts_with("missing API key"), "{}", basic.message);
        let wrong = check(&key, Some(&header("Bearer wrong"))).expect_err("wrong key");
        assert_eq!(wrong.message, "invalid API key");
        assert_eq!(wrong.status, http::StatusCode::UNAUTHORIZED);
    }
}
