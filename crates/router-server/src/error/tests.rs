//! The status table: every error a client can see, with its HTTP status, OpenAI `type` and
//! `code`, the headers it adds, and whether the bucket loop may retry it.

use std::time::Duration;

use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use router_buckets::{SelectError, StagePickError};
use router_policies::{KeySource, Limit, PickError, Rejection, ScopeError};
use router_workers::{Stage, WorkerId};

use super::{ApiError, Chain, EngineError, SendError};
use crate::rate_limit::{Client, Limit as RateLimit, Refusal};

fn worker(id: &str) -> WorkerId {
    WorkerId::new(id).expect("valid id")
}

fn stopped(error: PickError) -> ApiError {
    let error = StagePickError { stage: Stage::Plain, error };
    ApiError::Select(SelectError::Stopped { bucket: "all".into(), error })
}

fn status(code: u16) -> EngineError {
    let status = StatusCode::from_u16(code).expect("status");
    EngineError::Status { worker: worker("e1"), status, text: "boom".into() }
}

fn timeout() -> EngineError {
    EngineError::Send(SendError::Timeout { worker: worker("e1"), after: Duration::from_secs(9) })
}

/// A real connect failure: nothing listens on the port.
async fn unreachable() -> SendError {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let uri = format!("{}/", router_test_support::nothing_listens()).parse().expect("uri");
    let source = client.get(uri).await.expect_err("nothing listens");
    assert!(source.is_connect(), "{source}");
    SendError::Unreachable { worker: worker("e1"), source: source.into() }
}

#[tokio::test]
async fn every_error_has_one_status_type_and_code() {
    let rejection =
        Rejection { worker: worker("e1"), limit: Limit::RunningRequests, value: 8, cap: 8 };
    let too_long = ScopeError::KeyTooLong { len: 300, max: 256 };
    let join =
        tokio::spawn(async { panic!("the preparation panicked") }).await.expect_err("panics");
    let invalid = |param: Option<&str>| ApiError::InvalidRequest {
        message: "bad".into(),
        param: param.map(Into::into),
    };
    #[rustfmt::skip]
    let cases: Vec<(ApiError, u16, &str, &str)> = vec![
        (invalid(Some("messages")), 400, "invalid_request_error", "invalid_request"),
        (ApiError::UnknownModel("x".into()), 404, "invalid_request_error", "model_not_found"),
        (ApiError::BodyTooLarge { limit: 1 }, 413, "invalid_request_error", "body_too_large"),
        (ApiError::BodyTimeout { secs: 1 }, 408, "invalid_request_error", "body_timeout"),
        (
            ApiError::Select(SelectError::NoMatchingBucket { input_tokens: 9, expected_peak_tokens: None }),
            400, "invalid_request_error", "no_matching_bucket",
        ),
        (
            ApiError::Select(SelectError::NoAdmissibleEngine { rejections: vec![rejection] }),
            503, "service_unavailable", "no_admissible_engine",
        ),
        (ApiError::Select(SelectError::NoCandidates { stage: Stage::Decode }), 503, "service_unavailable", "no_candidates"),
        (
            stopped(PickError::InvalidKey { key: KeySource::Session, error: too_long }),
            400, "invalid_request_error", "invalid_request",
        ),
        (
            stopped(PickError::UnsupportedStage { policy: "cache_aware", stage: Stage::Decode }),
            500, "internal_error", "internal_error",
        ),
        (ApiError::Preparation(join), 500, "internal_error", "internal_error"),
        (ApiError::Engine(status(500)), 502, "upstream_error", "engine_failed"),
        (ApiError::Engine(EngineError::Send(unreachable().await)), 502, "upstream_error", "engine_unreachable"),
        (ApiError::Engine(timeout()), 504, "upstream_error", "engine_timeout"),
        (
            ApiError::Engine(EngineError::Stalled { worker: worker("e1"), silence: Duration::from_secs(300) }),
            504, "upstream_error", "engine_timeout",
        ),
        (
            ApiError::Engine(EngineError::RefusedCredentials { worker: worker("e1"), status: StatusCode::FORBIDDEN }),
            502, "upstream_error", "engine_failed",
        ),
        (ApiError::Prefill(status(503)), 502, "upstream_error", "engine_failed"),
        (ApiError::Decode(EngineError::Send(unreachable().await)), 502, "upstream_error", "engine_unreachable"),
        (ApiError::Decode(timeout()), 504, "upstream_error", "engine_timeout"),
        (ApiError::Unauthorized("missing key"), 401, "authentication_error", "unauthorized"),
        (ApiError::QueueFull, 429, "rate_limit_exceeded", "queue_full"),
        (ApiError::BodiesFull, 429, "rate_limit_exceeded", "bodies_full"),
        (ApiError::QueueTimeout { secs: 3 }, 429, "rate_limit_exceeded", "queue_timeout"),
        (
            ApiError::RateLimited(Refusal::Limited { client: Client::Anonymous, limit: RateLimit::Requests, retry_after_secs: 1 }),
            429, "rate_limit_exceeded", "rate_limited",
        ),
        (
            ApiError::RateLimited(Refusal::OverTokenBurst { client: Client::Key("team".into()), tokens: 9, burst: 8 }),
            400, "invalid_request_error", "over_token_burst",
        ),
        (ApiError::ShuttingDown, 503, "service_unavailable", "shutting_down"),
        (ApiError::DrainEnded, 503, "service_unavailable", "router_shutdown"),
        (
            ApiError::NoEngineAnswered { model: "m".into(), path: "/get_server_info".into() },
            503, "service_unavailable", "no_engine_answered",
        ),
        (ApiError::NotFound("worker x".into()), 404, "invalid_request_error", "not_found"),
        (
            ApiError::WorkerExists(router_workers::WorkerError::Duplicate { id: worker("e1") }),
            409, "invalid_request_error", "invalid_request",
        ),
    ];
    for (error, code, kind, label) in cases {
        let name = format!("{error:?}");
        assert_eq!(error.status().as_u16(), code, "{name}");
        assert_eq!(error.kind(), (kind, label), "{name}");
        let body = error.body();
        assert_eq!(body["error"]["type"], kind, "{name}");
        assert_eq!(body["error"]["code"], label, "{name}");
        let response = error.into_response();
        assert_eq!(response.status().as_u16(), code, "{name}");
        let headers = response.headers();
        assert_eq!(headers.contains_key(header::RETRY_AFTER), code == 503 || code == 429, "{name}");
        assert_eq!(headers.contains_key(header::WWW_AUTHENTICATE), code == 401, "{name}");
    }
}

#[test]
fn a_rate_limit_says_whose_and_when_to_retry() {
    let client = Client::Key("team-a".into());
    let limited =
        ApiError::from(Refusal::Limited { client, limit: RateLimit::Tokens, retry_after_secs: 7 });
    assert_eq!(
        limited.to_string(),
        "API key team-a is over its tokens-per-second rate limit; retry after 7 s"
    );
    let response = limited.into_response();
    assert_eq!(response.headers().get(header::RETRY_AFTER).map(|v| v.as_bytes()), Some(&b"7"[..]));
    let oversized = Refusal::OverTokenBurst { client: Client::Anonymous, tokens: 900, burst: 100 };
    let message = oversized.to_string();
    assert!(message.starts_with("the request needs 900 tokens"), "{message}");
    assert!(message.contains("the anonymous clients may spend at most 100 at once"), "{message}");
}

#[tokio::test]
async fn only_an_unreachable_plain_engine_is_retried() {
    assert!(ApiError::Engine(EngineError::Send(unreachable().await)).is_retryable());
    // A decode engine's prefill partner may already hold the request.
    assert!(!ApiError::Decode(EngineError::Send(unreachable().await)).is_retryable());
    assert!(!ApiError::Prefill(EngineError::Send(unreachable().await)).is_retryable());
    assert!(!ApiError::Engine(timeout()).is_retryable());
    assert!(!ApiError::Engine(status(500)).is_retryable());
}

#[tokio::test]
async fn the_message_is_the_error_and_its_causes() {
    let error = stopped(PickError::InvalidKey {
        key: KeySource::RoutingKey,
        error: ScopeError::KeyTooLong { len: 300, max: 256 },
    });
    let message = error.body()["error"]["message"].as_str().unwrap_or_default().to_owned();
    assert_eq!(
        message,
        "bucket all: routing stopped: plain selection failed: invalid routing key: \
         affinity key of 300 bytes exceeds the limit of 256 bytes"
    );
    let error = ApiError::Engine(EngineError::Send(unreachable().await));
    let message = Chain(&error).to_string();
    assert!(message.starts_with("engine e1 unreachable: client error (Connect)"), "{message}");
    assert_eq!(
        ApiError::Prefill(status(500)).body()["error"]["message"],
        "prefill engine e1 failed: engine e1 answered 500: boom"
    );
    let param =
        ApiError::InvalidRequest { message: "bad".into(), param: Some("x-session-id".into()) };
    assert_eq!(param.body()["error"]["param"], "x-session-id");
}
