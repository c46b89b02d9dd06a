//! Per-key rate limits: which limits each client gets and under what name, the head check in
//! front of the queue (429 with `Retry-After`, counted by key name and limit), and the token
//! charge of a prepared request (a wait, or a 400 for a request no wait lets through).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, header};
use axum::middleware::from_fn_with_state;
use router_workers::ApiKey;
use tower::ServiceExt as _;

use super::*;
use crate::auth::{Credentials, KeySet, require_api_key};
use crate::limit::{per_key, rate_limits as limits_of};
use crate::tests::{metric, text};
use router_config::{ClientKeyConfig, ServerSection};

fn section(yaml: &str) -> RateLimitSection {
    serde_yaml_ng::from_str(yaml).expect("a rate_limit section")
}

fn entry(key: &str, name: Option<&str>, rate_limit: Option<&str>) -> ClientKeyConfig {
    ClientKeyConfig {
        key: ApiKey::new(key).expect("a key"),
        name: name.map(str::to_owned),
        rate_limit: rate_limit.map(section),
    }
}

/// The limits of `server` for its configured keys.
fn rate_limits(server: &ServerSection) -> (Credentials, RateLimits) {
    let credentials = Credentials {
        client_keys: KeySet::new(server.api_keys.iter().map(|entry| &entry.key)),
        ..Credentials::default()
    };
    let limits = limits_of(server, &credentials);
    (credentials, limits)
}

fn client_of(limits: &RateLimits, key: Option<usize>) -> Option<Client> {
    limits.of(key).map(|limiter| limiter.client.clone())
}

#[test]
fn each_key_gets_its_own_limits_or_the_default_under_its_name() {
    let server = ServerSection {
        rate_limit: Some(section("{requests_per_second: 5}")),
        api_keys: vec![
            entry("k0", None, None),
            entry("k1", Some("team-a"), Some("{tokens_per_second: 10}")),
            entry("k2", Some("internal"), Some("{}")),
        ],
        ..ServerSection::default()
    };
    let (_, limits) = rate_limits(&server);
    assert_eq!(client_of(&limits, Some(0)), Some(Client::Key("api_keys[0]".into())));
    assert_eq!(client_of(&limits, Some(1)), Some(Client::Key("team-a".into())));
    assert_eq!(client_of(&limits, Some(2)), None, "an empty rate_limit limits nothing");
    assert_eq!(client_of(&limits, None), None, "with keys, there is no anonymous client");
    let team = limits.of(Some(1)).expect("team-a is limited");
    assert!(team.limits_tokens);
    let now = Instant::now();
    for _ in 0..20 {
        assert!(team.admit(now).is_ok(), "team-a's own limit replaces the request limit");
    }
    let default = limits.of(Some(0)).expect("api_keys[0] is limited");
    assert!(!default.limits_tokens);
    assert!((0..5).all(|_| default.admit(now).is_ok()), "a burst of one second of 5/s");
    assert!(default.admit(now).is_err());

    // Without keys every client shares the default; without a section nothing is limited.
    let open = ServerSection {
        rate_limit: Some(section("{requests_per_second: 1}")),
        ..Default::default()
    };
    assert_eq!(client_of(&rate_limits(&open).1, None), Some(Client::Anonymous));
    let (_, off) = rate_limits(&ServerSection::default());
    assert_eq!(client_of(&off, None), None);
}

#[test]
fn the_head_check_takes_a_request_and_refuses_an_empty_token_bucket() {
    let limiter = KeyLimiter::new(
        Client::Key("k".into()),
        &section("{requests_per_second: 10, burst: 2, tokens_per_second: 100}"),
        Instant::now(),
    )
    .expect("limited");
    let now = Instant::now();
    let limited = |result: Result<(), Refusal>| match result {
        Err(Refusal::Limited { limit, retry_after_secs, .. }) => Some((limit, retry_after_secs)),
        Err(other) => panic!("{other}"),
        Ok(()) => None,
    };
    assert_eq!(limited(limiter.admit(now)), None);
    assert_eq!(limited(limiter.charge(100, now)), None, "the whole token burst");
    assert_eq!(limited(limiter.admit(now)), Some((Limit::Tokens, 1)), "no token left");
    let later = now + Duration::from_millis(100);
    assert_eq!(limited(limiter.admit(later)), None, "10 tokens and a request back");
    assert_eq!(limited(limiter.admit(later)), None, "a burst of 2 requests");
    assert_eq!(limited(limiter.admit(later)), Some((Limit::Requests, 1)), "none left");
    assert_eq!(limited(limiter.charge(60, later)), Some((Limit::Tokens, 1)), "50 short: 0.5 s");
    assert_eq!(limited(limiter.charge(10, later)), None, "a refused charge took nothing");
    match limiter.charge(101, later) {
        Err(Refusal::OverTokenBurst { tokens: 101, burst: 100, .. }) => {}
        other => panic!("{other:?}"),
    }
}

/// The client API's layers over a route answering whether its tokens would be charged.
fn app(server: &ServerSection) -> axum::Router {
    let (credentials, limits) = rate_limits(server);
    let handler = |charge: Option<axum::Extension<TokenCharge>>| async move {
        if charge.is_some() { "charged" } else { "free" }
    };
    axum::Router::new()
        .route("/", axum::routing::post(handler))
        .layer(from_fn_with_state(Arc::new(limits), per_key))
        .route_layer(from_fn_with_state(Arc::new(credentials), require_api_key))
}

/// Status, `Retry-After`, error code (or body) of a request with `key`.
async fn send(app: &axum::Router, key: &str) -> (u16, Option<String>, String) {
    let request = Request::post("/")
        .header(header::AUTHORIZATION, format!("Bearer {key}"))
        .body(Body::empty())
        .expect("request");
    let response = app.clone().oneshot(request).await.expect("answered");
    let status = response.status().as_u16();
    let retry = response
        .headers()
        .get(header::RETRY_AFTER)
        .map(|v| v.to_str().unwrap_or_default().to_owned());
    let body = text(response).await;
    let said = match serde_json::from_str::<serde_json::Value>(&body) {
        Ok(json) => json["error"]["code"].as_str().unwrap_or_default().to_owned(),
        Err(_) => body,
    };
    (status, retry, said)
}

#[tokio::test]
async fn a_key_over_its_request_limit_gets_429_while_another_key_is_served() {
    crate::metrics::install();
    let counted = |key| {
        metric("router_rate_limited_total", &[("key", key), ("limit", "requests")]).unwrap_or(0.0)
    };
    let server = ServerSection {
        api_keys: vec![
            entry("slow-key", Some("slow-team"), Some("{requests_per_second: 0.1, burst: 1}")),
            entry("token-key", Some("token-team"), Some("{tokens_per_second: 1000}")),
            entry("free-key", None, None),
        ],
        ..ServerSection::default()
    };
    let app = app(&server);
    let before = counted("slow-team");
    assert_eq!(send(&app, "slow-key").await, (200, None, "free".into()));
    let refused = send(&app, "slow-key").await;
    // 0.1 per second: the bucket is full again in 10 s (the clock may have moved a little).
    assert_eq!((refused.0, refused.2.as_str()), (429, "rate_limited"), "{refused:?}");
    let retry: u64 = refused.1.as_deref().and_then(|v| v.parse().ok()).expect("Retry-After");
    assert!((9..=10).contains(&retry), "{retry}");
    assert_eq!(counted("slow-team") - before, 1.0);
    assert_eq!(send(&app, "token-key").await, (200, None, "charged".into()));
    for _ in 0..3 {
        assert_eq!(send(&app, "free-key").await, (200, None, "free".into()));
    }
    assert_eq!(send(&app, "wrong-key").await.0, 401, "authentication comes first");
}
