//! The router's three credentials (RELIABILITY.md, Security), kept apart:
//! - client to router: `server.api_keys` (or `ROUTER_API_KEY`), required on `/v1/` when set;
//! - router to engine: each worker's `api_key`, else `server.engine_api_key` (or
//!   `ROUTER_ENGINE_API_KEY`), sent as `Authorization: Bearer` and never the client's header;
//! - admin: `server.admin_token` (or `ROUTER_ADMIN_TOKEN`), for `/admin/` only.
//!
//! Comparisons are constant-time; keys never reach logs, metrics or listings ([`ApiKey`]'s
//! `Debug` is redacted and it cannot be serialized).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use router_workers::ApiKey;
use subtle::ConstantTimeEq;

use crate::app::AppContext;
use crate::config::ServerConfig;
use crate::error::ApiError;

/// Environment variable holding the client key when `server.api_keys` is empty.
pub const CLIENT_KEY_ENV: &str = "ROUTER_API_KEY";
/// Environment variable holding the engine key when `server.engine_api_key` is unset.
pub const ENGINE_KEY_ENV: &str = "ROUTER_ENGINE_API_KEY";
/// Environment variable holding the admin token when `server.admin_token` is unset.
pub const ADMIN_TOKEN_ENV: &str = "ROUTER_ADMIN_TOKEN";

/// The credentials in force, resolved once from the configuration and the environment.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    /// Keys accepted from clients on `/v1/`; empty = the API is open.
    pub client_keys: Vec<ApiKey>,
    /// Key for engines configured without one.
    pub engine_default: Option<ApiKey>,
    /// The admin API's token; none = the admin API is off.
    pub admin_token: Option<ApiKey>,
}

/// An unusable credential from the environment.
#[derive(Debug, thiserror::Error)]
#[error("{variable}: {reason}")]
pub struct CredentialError {
    /// The environment variable.
    pub variable: &'static str,
    /// What is wrong with its value (never the value).
    pub reason: &'static str,
}

impl Credentials {
    /// Reads `server` and, for what it leaves unset, the environment.
    pub fn resolve(server: &ServerConfig) -> Result<Self, CredentialError> {
        let from_env = |variable: &'static str| match std::env::var(variable) {
            Ok(value) if !value.is_empty() => {
                ApiKey::new(value).map(Some).map_err(|reason| CredentialError { variable, reason })
            }
            _ => Ok(None),
        };
        let client_keys = if server.api_keys.is_empty() {
            from_env(CLIENT_KEY_ENV)?.into_iter().collect()
        } else {
            server.api_keys.clone()
        };
        let engine_default = match &server.engine_api_key {
            Some(key) => Some(key.clone()),
            None => from_env(ENGINE_KEY_ENV)?,
        };
        let admin_token = match &server.admin_token {
            Some(token) => Some(token.clone()),
            None => from_env(ADMIN_TOKEN_ENV)?,
        };
        Ok(Self { client_keys, engine_default, admin_token })
    }
}

/// The bearer token of `headers`, if any (the scheme is case-insensitive, RFC 9110 §11.1).
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Whether `given` equals one of `keys`, in time independent of where they differ and of their
/// lengths: the SHA-256 digests are compared, in constant time, and every key is compared.
pub fn matches_any(given: &str, keys: &[ApiKey]) -> bool {
    let digest = |bytes: &[u8]| ring::digest::digest(&ring::digest::SHA256, bytes);
    let given = digest(given.as_bytes());
    keys.iter().fold(false, |found, key| {
        found | bool::from(given.as_ref().ct_eq(digest(key.expose().as_bytes()).as_ref()))
    })
}

/// The `Authorization` header the router sends to an engine with this key; marked sensitive
/// so HTTP/2 never indexes it and `Debug` hides it.
pub fn engine_authorization(key: &ApiKey) -> Option<HeaderValue> {
    let mut value = HeaderValue::try_from(format!("Bearer {}", key.expose())).ok()?;
    value.set_sensitive(true);
    Some(value)
}

/// Middleware of the client API: with client keys configured, a request without one of them
/// gets 401 before anything else happens.
pub async fn require_api_key(
    State(ctx): State<Arc<AppContext>>,
    request: Request,
    next: Next,
) -> Response {
    let keys = &ctx.credentials().client_keys;
    if keys.is_empty() {
        return next.run(request).await;
    }
    let refusal = match bearer(request.headers()) {
        Some(given) if matches_any(given, keys) => return next.run(request).await,
        Some(_) => "invalid API key",
        None => "missing API key: send it as `Authorization: Bearer <key>`",
    };
    crate::metrics::refused("unauthorized");
    ApiError::Unauthorized(refusal).into_response()
}

/// Middleware of the admin API: off (404) without a token, 401 without the right one.
pub async fn require_admin_token(
    State(ctx): State<Arc<AppContext>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = &ctx.credentials().admin_token else {
        return ApiError::NotFound("the admin API is off (no admin token configured)".into())
            .into_response();
    };
    match bearer(request.headers()) {
        Some(given) if matches_any(given, std::slice::from_ref(token)) => next.run(request).await,
        _ => ApiError::Unauthorized("missing or invalid admin bearer token").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(text: &str) -> ApiKey {
        ApiKey::new(text).expect("key")
    }

    #[test]
    fn bearer_reads_the_token_whatever_the_scheme_case() {
        let mut headers = HeaderMap::new();
        assert_eq!(bearer(&headers), None);
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer abc"));
        assert_eq!(bearer(&headers), Some("abc"));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("bearer abc"));
        assert_eq!(bearer(&headers), Some("abc"));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(bearer(&headers), None);
    }

    #[test]
    fn only_an_exact_key_matches() {
        let keys = [key("first-key"), key("second-key")];
        assert!(matches_any("first-key", &keys));
        assert!(matches_any("second-key", &keys));
        assert!(!matches_any("first", &keys));
        assert!(!matches_any("first-key-and-more", &keys));
        assert!(!matches_any("", &keys));
    }

    #[test]
    fn the_engine_header_is_sensitive_and_debug_hides_keys() {
        let value = engine_authorization(&key("s3cret")).expect("header");
        assert!(value.is_sensitive());
        assert_eq!(value.to_str().ok(), Some("Bearer s3cret"));
        let credentials = Credentials {
            client_keys: vec![key("client-s3cret")],
            engine_default: Some(key("engine-s3cret")),
            admin_token: Some(key("admin-s3cret")),
        };
        let debug = format!("{credentials:?} {value:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
    }
}
