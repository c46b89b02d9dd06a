//! The inference endpoints: session and routing keys as the handlers read them from headers,
//! and whole chat requests through the routes to an in-process engine: what the engine
//! receives (its own credential, never the client's; the request id; no router-owned fields),
//! each refusal with its code and the client's request id, draining, the metrics' model label,
//! a long prompt prepared on the blocking pool, and SLO targets: read only when enabled,
//! refused when unusable, and answered with whether the serving bucket met them.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use parking_lot::Mutex;
use tower::ServiceExt as _;

use super::affinity_key;
use crate::app::AppContext;
use crate::error::ApiError;
use crate::tests::{context, metric, one_model, serve, text};

#[test]
fn affinity_keys_are_read_checked_and_named_in_errors() {
    let mut headers = HeaderMap::new();
    headers.insert("x-session-id", HeaderValue::from_static("abc"));
    headers.insert("x-long", HeaderValue::from_str(&"k".repeat(257)).expect("ascii"));
    headers.insert("x-limit", HeaderValue::from_str(&"k".repeat(256)).expect("ascii"));
    headers.insert("x-binary", HeaderValue::from_bytes(b"caf\xc3\xa9").expect("opaque"));

    let key = |name| affinity_key(&headers, &HeaderName::from_static(name));
    assert_eq!(key("x-session-id").expect("valid"), Some("abc"));
    assert_eq!(key("x-absent").expect("valid"), None);
    assert_eq!(key("x-limit").expect("valid").map(str::len), Some(256));
    for (name, says) in
        [("x-long", "257 bytes exceeds the limit of 256"), ("x-binary", "visible ASCII")]
    {
        let err = key(name).expect_err(name);
        assert_eq!(err.status().as_u16(), 400, "{name}");
        let ApiError::InvalidRequest { message, param } = &err else { panic!("{err:?}") };
        assert_eq!(param.as_deref(), Some(name));
        assert!(message.contains(name) && message.contains(says), "{message}");
    }
}

/// What an engine received: its headers and body.
type Received = Arc<Mutex<Vec<(HeaderMap, Bytes)>>>;

/// An engine answering every chat request with a JSON answer, keeping what it received.
async fn recording_engine() -> (String, Received) {
    let received = Received::default();
    let kept = Arc::clone(&received);
    let chat = move |headers: HeaderMap, body: Bytes| {
        kept.lock().push((headers, body));
        async { ([("content-type", "application/json")], r#"{"choices":[]}"#) }
    };
    let app = axum::Router::new().route("/v1/chat/completions", axum::routing::post(chat));
    (serve(app).await, received)
}

fn chat_body(model: &str, extra: &str) -> String {
    format!(r#"{{"model": "{model}", "messages": [{{"role": "user", "content": "hi"}}]{extra}}}"#)
}

/// A chat request through the routes, with `headers`.
async fn chat(ctx: &Arc<AppContext>, headers: &[(&str, &str)], body: String) -> Response {
    let mut request =
        Request::post("/v1/chat/completions").header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Body::from(body)).expect("request");
    crate::server::routes(Arc::clone(ctx)).oneshot(request).await.expect("answered")
}

#[tokio::test]
async fn a_chat_request_reaches_the_engine_with_the_engines_credential_only() {
    let (url, received) = recording_engine().await;
    let top = "server: {api_keys: [client-key], engine_api_key: engine-key}";
    let ctx = context(&one_model(
        top,
        "chat-ok",
        &format!("[{{id: chat-e1, url: \"{url}\"}}]"),
        "{type: round_robin}",
    ));
    let headers = [("authorization", "Bearer client-key"), ("x-request-id", "client-7")];
    let response = chat(&ctx, &headers, chat_body("chat-ok", r#", "bootstrap_room": 7"#)).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-request-id"], "client-7");
    assert_eq!(response.headers()["x-router-engine"], "chat-e1");
    assert_eq!(response.headers()["x-router-bucket"], "all");
    assert_eq!(text(response).await, r#"{"choices":[]}"#);

    let received = received.lock();
    let [(engine_headers, engine_body)] = received.as_slice() else { panic!("{received:?}") };
    assert_eq!(engine_headers["authorization"], "Bearer engine-key", "never the client's key");
    assert_eq!(engine_headers["x-request-id"], "client-7");
    let forwarded: serde_json::Value = serde_json::from_slice(engine_body).expect("json");
    assert_eq!(forwarded["model"], "chat-ok");
    assert!(forwarded.get("bootstrap_room").is_none(), "router-owned fields are stripped");

    let labels = [("model", "chat-ok"), ("bucket", "all"), ("status", "200")];
    assert_eq!(metric("router_requests_total", &labels), Some(1.0));
    let labels = [("model", "chat-ok"), ("bucket", "all")];
    assert_eq!(metric("router_request_duration_seconds_count", &labels), Some(1.0));
}

/// One refusal: its headers and body, then the status, error code and parameter answered.
type Refusal<'h> =
    (&'static str, Vec<(&'h str, &'h str)>, String, u16, &'static str, Option<&'static str>);

#[tokio::test]
async fn a_refused_chat_request_says_why_and_keeps_its_id() {
    let workers = r#"[{id: chat-r1, url: "http://127.0.0.1:1"}]"#;
    let ctx = context(&one_model(
        "server: {max_body_bytes: 256}",
        "chat-refused",
        workers,
        "{type: round_robin}",
    ));
    let big = chat_body("chat-refused", &format!(r#", "user": "{}""#, "x".repeat(300)));
    let long_key = "k".repeat(257);
    #[rustfmt::skip]
    let cases: Vec<Refusal<'_>> = vec![
        ("not JSON", vec![], "{".into(), 400, "invalid_request", None),
        ("a bad field", vec![], chat_body("chat-refused", r#", "temperature": 9"#), 400, "invalid_request", Some("temperature")),
        ("a model not served here", vec![], chat_body("other", ""), 404, "model_not_found", None),
        ("a body over max_body_bytes", vec![], big, 413, "body_too_large", None),
        ("a session key too long", vec![("x-session-id", long_key.as_str())], chat_body("chat-refused", ""),
            400, "invalid_request", Some("x-session-id")),
    ];
    for (name, headers, body, status, code, param) in cases {
        let mut headers = headers;
        headers.push(("x-request-id", "refused-1"));
        let response = chat(&ctx, &headers, body).await;
        assert_eq!(response.status().as_u16(), status, "{name}");
        assert_eq!(response.headers()["x-request-id"], "refused-1", "{name}");
        let answer: serde_json::Value = serde_json::from_str(&text(response).await).expect("json");
        assert_eq!(answer["error"]["code"], code, "{name}: {answer}");
        assert_eq!(answer["error"]["param"].as_str(), param, "{name}: {answer}");
    }

    ctx.start_draining();
    let response = chat(&ctx, &[], chat_body("chat-refused", "")).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "1");
    assert!(response.headers().contains_key("x-request-id"), "a fresh id");
    let answer: serde_json::Value = serde_json::from_str(&text(response).await).expect("json");
    assert_eq!(answer["error"]["code"], "shutting_down");
}

#[tokio::test]
async fn a_wildcard_model_counts_under_its_own_id_not_the_clients_name() {
    let (url, received) = recording_engine().await;
    let ctx = context(&one_model(
        "",
        "\"*\"",
        &format!("[{{id: chat-w1, url: \"{url}\"}}]"),
        "{type: round_robin}",
    ));
    let response = chat(&ctx, &[], chat_body("minted-by-a-client", "")).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(received.lock().len(), 1);
    let labels = [("model", "*"), ("bucket", "all"), ("status", "200")];
    assert_eq!(metric("router_requests_total", &labels), Some(1.0));
    assert_eq!(metric("router_requests_total", &[("model", "minted-by-a-client")]), None);
}

#[tokio::test]
async fn a_long_tokenized_prompt_is_served_byte_for_byte() {
    let (url, received) = recording_engine().await;
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let ctx = context(&format!(
        "models:\n  - id: chat-long\n    tokenizer: \"{tokenizer}\"\n    \
         workers: [{{id: chat-l1, url: \"{url}\", block_size: 16}}]\n    \
         buckets: [{{id: all, max_context_tokens: 1000000, groups: {{plain: {{}}}}}}]\n"
    ));
    // (The context bound reads the exact count: the request is tokenized.)
    let prompt = "lorem ipsum ".repeat(2000);
    let body = format!(
        r#"{{"model": "chat-long", "messages": [{{"role": "user", "content": "{prompt}"}}]}}"#
    );
    // Long enough to be templated and tokenized on the blocking pool.
    assert!(body.len() > super::INLINE_PREPARE_BYTES);
    let response = chat(&ctx, &[], body.clone()).await;
    assert_eq!(response.status(), StatusCode::OK);
    let received = received.lock();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].1, body.as_bytes(), "forwarded byte for byte");
    // Its token ids were there: its blocks are predicted entries on the engine.
    let predictions = ctx.predictions().expect("predictions are on by default");
    assert!(predictions.blocks(std::time::Instant::now()).predicted > 100);
}

/// A model `model` of one engine at `url` in two buckets: `fast` (up to 1000 input tokens,
/// `fast_slo` its declared estimates) and `slow` (unbounded, 2 s to the first token, 10 tokens
/// per second), with the model keys `prefs` (`ttft_slo: slo_first`, say).
fn slo_model(model: &str, url: &str, prefs: &str, fast_slo: &str) -> String {
    format!(
        "models:\n  - id: {model}\n    {prefs}\n    workers: [{{id: {model}-e, url: \"{url}\"}}]\n    \
         buckets:\n      \
         - {{id: fast, limits: {{max: 1000}}, {fast_slo}groups: {{plain: {{}}}}}}\n      \
         - {{id: slow, ttft_ms: 2000, tokens_per_second: 10, groups: {{plain: {{}}}}}}\n"
    )
}

/// The request's headers, the bucket that serves it, and its `x-router-slo-ttft` and
/// `x-router-slo-tps`.
type SloCase<'a> = (&'a [(&'a str, &'a str)], &'a str, Option<&'a str>, Option<&'a str>);

#[tokio::test]
async fn slo_headers_order_the_buckets_and_the_answer_says_whether_they_were_met() {
    let (url, received) = recording_engine().await;
    let prefs = "ttft_slo: slo_first\n    tps_slo: best_effort";
    let ctx = context(&slo_model("slo-m", &url, prefs, "ttft_ms: 100, tokens_per_second: 50, "));
    let counted = |target: &str, met: &str| {
        metric("router_slo_requests_total", &[("model", "slo-m"), ("target", target), ("met", met)])
    };
    #[rustfmt::skip]
    let cases: [SloCase<'_>; 5] = [
        // No target: the length order, and nothing said about SLOs.
        (&[], "fast", None, None),
        // fast meets a tight TTFT target, slow does not.
        (&[("x-sgl-ttft-slo-ms", "150")], "fast", Some("met"), None),
        // Nobody meets 50 ms: the length order, and the answer says it was missed.
        (&[("x-sgl-ttft-slo-ms", "50")], "fast", Some("missed"), None),
        // A best-effort throughput target that fast meets and slow does not: slow serves it.
        (&[("x-sgl-tps-slo", "20")], "slow", None, Some("missed")),
        // Both: fast meets both (a tier for the best-effort one), slow neither (a tier for
        // the slo_first one); equal tiers keep the length order.
        (&[("x-sgl-ttft-slo-ms", "150"), ("x-sgl-tps-slo", "20")], "fast", Some("met"), Some("met")),
    ];
    for (headers, bucket, ttft, tps) in cases {
        let response = chat(&ctx, headers, chat_body("slo-m", "")).await;
        assert_eq!(response.status(), StatusCode::OK, "{headers:?}");
        let header = |name: &str| response.headers().get(name).map(|v| v.to_str().expect("ascii"));
        assert_eq!(header("x-router-bucket"), Some(bucket), "{headers:?}");
        assert_eq!(header("x-router-slo-ttft"), ttft, "{headers:?}");
        assert_eq!(header("x-router-slo-tps"), tps, "{headers:?}");
    }
    assert_eq!(received.lock().len(), cases.len());
    assert_eq!(counted("ttft", "true"), Some(2.0));
    assert_eq!(counted("ttft", "false"), Some(1.0));
    assert_eq!(counted("tps", "true"), Some(1.0));
    assert_eq!(counted("tps", "false"), Some(1.0));
}

#[tokio::test]
async fn a_bad_enabled_slo_header_is_a_400_before_any_dispatch_and_a_disabled_one_is_ignored() {
    let (url, received) = recording_engine().await;
    let both = "ttft_slo: slo_first\n    tps_slo: slo_first";
    let ctx = context(&slo_model("slo-bad", &url, both, "ttft_ms: 100, "));
    #[rustfmt::skip]
    let cases: [(&str, &str, &str); 10] = [
        ("x-sgl-ttft-slo-ms", "fast", "not a positive integer of milliseconds"),
        ("x-sgl-ttft-slo-ms", "0", "at least 1 ms"),
        ("x-sgl-ttft-slo-ms", "-5", "not a positive integer"),
        ("x-sgl-ttft-slo-ms", "2.5", "not a positive integer"),
        ("x-sgl-tps-slo", "0", "finite number above 0, got 0"),
        ("x-sgl-tps-slo", "-3", "finite number above 0, got -3"),
        ("x-sgl-tps-slo", "NaN", "got NaN"),
        ("x-sgl-tps-slo", "inf", "got inf"),
        ("x-sgl-tps-slo", "lots", "not a number of tokens per second"),
        ("x-sgl-tps-slo", "", "not a number"),
    ];
    for (header, value, says) in cases {
        let response = chat(&ctx, &[(header, value)], chat_body("slo-bad", "")).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{header}: {value}");
        let answer: serde_json::Value = serde_json::from_str(&text(response).await).expect("json");
        assert_eq!(answer["error"]["code"], "invalid_slo_target", "{answer}");
        assert_eq!(answer["error"]["param"], header, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.starts_with(&format!("header {header}: ")), "{message}");
        assert!(message.contains(says), "{header}: {value}: {message}");
    }
    assert!(received.lock().is_empty(), "nothing was dispatched");

    // With the preferences disabled (the default) the headers are not read at all.
    let ctx = context(&slo_model("slo-off", &url, "", "ttft_ms: 100, "));
    let headers = [("x-sgl-ttft-slo-ms", "0"), ("x-sgl-tps-slo", "NaN")];
    let response = chat(&ctx, &headers, chat_body("slo-off", "")).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-router-bucket"], "fast");
    assert!(!response.headers().contains_key("x-router-slo-ttft"));
    assert!(!response.headers().contains_key("x-router-slo-tps"));
    assert_eq!(received.lock().len(), 1);
}
