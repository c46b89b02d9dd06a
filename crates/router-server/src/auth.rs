//! The router's three credentials (docs/design/RELIABILITY.md, Security), kept apart:
//! - client to router: `server.api_keys` (or `ROUTER_API_KEY`), required on `/v1/` when set;
//! - router to engine: each worker's `api_key`, else `server.engine_api_key` (or
//!   `ROUTER_ENGINE_API_KEY`), sent as `Authorization: Bearer` and never the client's header;
//! - admin: `server.admin_token` (or `ROUTER_ADMIN_TOKEN`), for `/admin/` only.
//!
//! Keys are checked by digest in constant time ([`KeySet`]); they never reach logs, metrics or
//! listings ([`ApiKey`]'s `Debug` is redacted and it cannot be serialized).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use router_workers::ApiKey;
use subtle::{Choice, ConditionallySelectable, ConstantTimeEq};

use crate::error::ApiError;
use router_config::ServerSection;

/// Environment variable holding the client key when `server.api_keys` is empty.
pub(crate) const CLIENT_KEY_ENV: &str = "ROUTER_API_KEY";
/// Environment variable holding the engine key when `server.engine_api_key` is unset.
pub(crate) const ENGINE_KEY_ENV: &str = "ROUTER_ENGINE_API_KEY";
/// Environment variable holding the admin token when `server.admin_token` is unset.
pub(crate) const ADMIN_TOKEN_ENV: &str = "ROUTER_ADMIN_TOKEN";

/// The credentials in force, resolved once from the configuration and the environment.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    /// Keys accepted from clients on `/v1/`; empty = the API is open.
    pub client_keys: KeySet,
    /// Key for engines configured without one.
    pub engine_default: Option<ApiKey>,
    /// The admin API's token; none = the admin API is off.
    pub admin_token: Option<KeySet>,
}

/// Keys as the router checks them: their SHA-256 digests, made once. A candidate is hashed and
/// compared with every digest in constant time, so neither which key matched nor any key's
/// length shows in the timing.
#[derive(Clone, Default)]
pub struct KeySet(Vec<[u8; 32]>);

impl KeySet {
    /// The set of `keys`.
    pub fn new<'a>(keys: impl IntoIterator<Item = &'a ApiKey>) -> Self {
        Self(keys.into_iter().map(|key| digest(key.expose())).collect())
    }

    /// Whether no key is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `given` is one of the keys.
    pub fn accepts(&self, given: &str) -> bool {
        self.find(given).is_some()
    }

    /// Which of the keys `given` is, by its place in the set; every key is compared, and the
    /// place chosen without branching on any comparison.
    pub fn find(&self, given: &str) -> Option<usize> {
        let given = digest(given);
        let (mut found, mut place) = (Choice::from(0), 0u64);
        for (i, key) in self.0.iter().enumerate() {
            let matches = given.ct_eq(key);
            place.conditional_assign(&(i as u64), matches);
            found |= matches;
        }
        bool::from(found).then_some(place as usize)
    }
}

impl std::fmt::Debug for KeySet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeySet({} keys)", self.0.len())
    }
}

fn digest(text: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, text.as_bytes()).as_ref());
    out
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
    pub fn resolve(server: &ServerSection) -> Result<Self, CredentialError> {
        let from_env = |variable: &'static str| match std::env::var(variable) {
            Ok(value) if !value.is_empty() => {
                ApiKey::new(value).map(Some).map_err(|reason| CredentialError { variable, reason })
            }
            _ => Ok(None),
        };
        let client_keys = if server.api_keys.is_empty() {
            KeySet::new(&from_env(CLIENT_KEY_ENV)?)
        } else {
            KeySet::new(server.api_keys.iter().map(|entry| &entry.key))
        };
        let engine_default = match &server.engine_api_key {
            Some(key) => Some(key.clone()),
            None => from_env(ENGINE_KEY_ENV)?,
        };
        let admin_token = match &server.admin_token {
            Some(token) => Some(KeySet::new([token])),
            None => from_env(ADMIN_TOKEN_ENV)?.map(|token| KeySet::new([&token])),
        };
        Ok(Self { client_keys, engine_default, admin_token })
    }
}

/// The bearer token of `headers`, if any (the scheme is case-insensitive, RFC 9110 §11.1).
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(&header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The client key a request presented, by its place in [`Credentials::client_keys`] (the
/// order of `server.api_keys`): put in the request's extensions by [`require_api_key`], for
/// the key's rate limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeyIndex(pub(crate) usize);

/// Middleware of the client API: with client keys configured, a request without one of them
/// gets 401 before anything else happens; with one, it carries the key's [`KeyIndex`].
pub(crate) async fn require_api_key(
    State(credentials): State<Arc<Credentials>>,
    mut request: Request,
    next: Next,
) -> Response {
    match client_key(&credentials, request.headers()) {
        Ok(Some(key)) => {
            request.extensions_mut().insert(key);
        }
        Ok(None) => {}
        Err(refusal) => return refusal.into_response(),
    }
    next.run(request).await
}

/// The client key `headers` present: none when no client keys are configured, a refusal (401,
/// counted) when they are and the request has none of them. What [`require_api_key`] and the
/// inference front (`server/front.rs`) share.
pub(crate) fn client_key(
    credentials: &Credentials,
    headers: &http::HeaderMap,
) -> Result<Option<KeyIndex>, ApiError> {
    let keys = &credentials.client_keys;
    if keys.is_empty() {
        return Ok(None);
    }
    let refusal = match bearer(headers).map(|given| keys.find(given)) {
        Some(Some(place)) => return Ok(Some(KeyIndex(place))),
        Some(None) => "invalid API key",
        None => "missing API key: send it as `Authorization: Bearer <key>`",
    };
    crate::metrics::refused("unauthorized");
    Err(ApiError::Unauthorized(refusal))
}

/// Middleware of the admin API: off (404) without a token, 401 without the right one.
pub(crate) async fn require_admin_token(
    State(credentials): State<Arc<Credentials>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = &credentials.admin_token else {
        return ApiError::NotFound("the admin API is off (no admin token configured)".into())
            .into_response();
    };
    match bearer(request.headers()) {
        Some(given) if token.accepts(given) => next.run(request).await,
        _ => ApiError::Unauthorized("missing or invalid admin bearer token").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

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
    fn only_an_exact_key_matches_and_is_found_at_its_place() {
        let keys = KeySet::new(&[key("first-key"), key("second-key")]);
        assert!(keys.accepts("first-key"));
        assert!(keys.accepts("second-key"));
        assert!(!keys.accepts("first"));
        assert!(!keys.accepts("first-key-and-more"));
        assert!(!keys.accepts(""));
        assert_eq!(keys.find("first-key"), Some(0));
        assert_eq!(keys.find("second-key"), Some(1));
        assert_eq!(keys.find("third-key"), None);
    }

    #[test]
    fn the_engine_header_is_sensitive_and_debug_hides_keys() {
        let engine_key = key("s3cret");
        let value = engine_key.authorization();
        assert!(value.is_sensitive());
        assert_eq!(value.to_str().ok(), Some("Bearer s3cret"));
        let credentials = Credentials {
            client_keys: KeySet::new(&[key("client-s3cret")]),
            engine_default: Some(key("engine-s3cret")),
            admin_token: Some(KeySet::new(&[key("admin-s3cret")])),
        };
        let debug = format!("{credentials:?} {value:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
    }

    /// A route behind `middleware` over `credentials`; the status, `WWW-Authenticate` and
    /// error message of a GET with `authorization`.
    async fn answer(
        credentials: Credentials,
        admin: bool,
        authorization: Option<&'static str>,
    ) -> (u16, Option<String>, String) {
        use axum::middleware::from_fn_with_state;
        use tower::ServiceExt as _;
        let credentials = Arc::new(credentials);
        let route = axum::Router::new().route("/", axum::routing::get(|| async { "through" }));
        let app = if admin {
            route.route_layer(from_fn_with_state(credentials, require_admin_token))
        } else {
            route.route_layer(from_fn_with_state(credentials, require_api_key))
        };
        let mut request = axum::http::Request::get("/");
        if let Some(value) = authorization {
            request = request.header(header::AUTHORIZATION, value);
        }
        let request = request.body(axum::body::Body::empty()).expect("request");
        let response = app.oneshot(request).await.expect("answered");
        let status = response.status().as_u16();
        let challenge = response
            .headers()
            .get(header::WWW_AUTHENTICATE)
            .map(|v| v.to_str().unwrap_or_default().to_owned());
        let text = crate::tests::text(response).await;
        let message = match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(body) => body["error"]["message"].as_str().unwrap_or_default().to_owned(),
            Err(_) => text,
        };
        (status, challenge, message)
    }

    fn client_keys(keys: &[&str]) -> Credentials {
        let keys: Vec<ApiKey> = keys.iter().map(|k| key(k)).collect();
        Credentials { client_keys: KeySet::new(&keys), ..Credentials::default() }
    }

    #[tokio::test]
    async fn the_client_api_wants_one_of_its_keys_when_it_has_any() {
        crate::metrics::install();
        let refused = || {
            let reason = [("reason", "unauthorized")];
            crate::tests::metric("router_requests_refused_total", &reason).unwrap_or(0.0)
        };
        let bearer = Some("Bearer");
        #[rustfmt::skip]
        let cases = [
            ("open without keys", client_keys(&[]), None, (200, None, "through")),
            ("one of the keys", client_keys(&["k1", "k2"]), Some("Bearer k2"), (200, None, "through")),
            ("the scheme in any case", client_keys(&["k1"]), Some("BEARER k1"), (200, None, "through")),
            ("no key", client_keys(&["k1"]), None, (401, bearer, "missing API key: send it as `Authorization: Bearer <key>`")),
            ("a wrong key", client_keys(&["k1"]), Some("Bearer k3"), (401, bearer, "invalid API key")),
            ("another scheme", client_keys(&["k1"]), Some("Basic k1"), (401, bearer, "missing API key")),
        ];
        for (name, credentials, authorization, (status, challenge, says)) in cases {
            let before = refused();
            let (got, got_challenge, message) = answer(credentials, false, authorization).await;
            assert_eq!(got, status, "{name}: {message}");
            assert_eq!(got_challenge.as_deref(), challenge, "{name}");
            assert!(message.starts_with(says), "{name}: {message}");
            assert_eq!(refused() - before, if status == 401 { 1.0 } else { 0.0 }, "{name}");
        }
    }

    #[tokio::test]
    async fn the_admin_api_is_off_without_a_token_and_wants_it_otherwise() {
        let admin = |token: Option<&str>| Credentials {
            admin_token: token.map(|t| KeySet::new([&key(t)])),
            // The client keys open nothing here.
            client_keys: KeySet::new(&[key("client")]),
            ..Credentials::default()
        };
        let cases = [
            (
                "no token configured",
                admin(None),
                Some("Bearer anything"),
                404,
                "the admin API is off",
            ),
            ("the token", admin(Some("t0k")), Some("Bearer t0k"), 200, "through"),
            (
                "no token sent",
                admin(Some("t0k")),
                None,
                401,
                "missing or invalid admin bearer token",
            ),
            ("a client key", admin(Some("t0k")), Some("Bearer client"), 401, "missing or invalid"),
        ];
        for (name, credentials, authorization, status, says) in cases {
            let (got, _, message) = answer(credentials, true, authorization).await;
            assert_eq!(got, status, "{name}: {message}");
            assert!(message.starts_with(says), "{name}: {message}");
        }
    }

    #[test]
    fn configured_credentials_are_resolved_and_kept_apart() {
        let server = router_config::ServerSection {
            api_keys: vec![key("client-1").into(), key("client-2").into()],
            engine_api_key: Some(key("engine")),
            admin_token: Some(key("admin")),
            ..router_config::ServerSection::default()
        };
        let credentials = Credentials::resolve(&server).expect("resolved");
        assert!(credentials.client_keys.accepts("client-1"));
        assert!(credentials.client_keys.accepts("client-2"));
        assert!(!credentials.client_keys.accepts("admin"));
        assert_eq!(credentials.engine_default.as_ref().map(ApiKey::expose), Some("engine"));
        let admin = credentials.admin_token.expect("an admin token");
        assert!(admin.accepts("admin") && !admin.accepts("client-1"));
    }
}
