//! `--api-key`: every request under /v1/ and to /generate needs `Authorization: Bearer KEY`; the
//! probes do not, and the key never shows in answers or logs.

use std::process::Stdio;

use http::{Method, StatusCode};
use serde_json::json;

use crate::common::*;

const KEY: &str = "sim-test-key-4f9a";
const WRONG: &str = "sim-wrong-key-77c1";

async fn call(method: Method, url: &str, authorization: Option<&str>) -> Reply {
    let body = (method == Method::POST).then(|| request("Hello, key!", 3, false));
    let headers: Vec<(&str, &str)> =
        authorization.map(|value| ("authorization", value)).into_iter().collect();
    send_with_headers(method, url, body.as_ref(), &headers).await.expect("answered")
}

/// Asserts an OpenAI-shaped 401 whose message starts with `message`, quoting no key.
fn assert_unauthorized(reply: &Reply, message: &str) {
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_eq!(reply.headers["www-authenticate"], "Bearer");
    let body = reply.json();
    let error = &body["error"];
    assert_eq!(error["type"], "AuthenticationError");
    assert_eq!(error["code"], 401);
    let text = error["message"].as_str().expect("a message");
    assert!(text.starts_with(message), "{text}");
    let raw = String::from_utf8_lossy(&reply.body);
    assert!(!raw.contains(KEY) && !raw.contains(WRONG), "a key is quoted: {raw}");
}

#[tokio::test]
async fn v1_requests_need_the_bearer_key() {
    let sim = Sim::start(&["--api-key", KEY]).await;
    let chat_url = format!("{}/v1/chat/completions", sim.url());
    let right = format!("Bearer {KEY}");
    let wrong = format!("Bearer {WRONG}");

    let missing = call(Method::POST, &chat_url, None).await;
    assert_unauthorized(&missing, "missing API key");
    let not_bearer = call(Method::POST, &chat_url, Some(&format!("Basic {KEY}"))).await;
    assert_unauthorized(&not_bearer, "missing API key");
    let wrong_key = call(Method::POST, &chat_url, Some(&wrong)).await;
    assert_unauthorized(&wrong_key, "invalid API key");
    let prefix_only = call(Method::POST, &chat_url, Some(&right[..right.len() - 1])).await;
    assert_unauthorized(&prefix_only, "invalid API key");

    let answered = call(Method::POST, &chat_url, Some(&right)).await;
    assert_eq!(answered.status, StatusCode::OK);
    assert_eq!(answered.json()["object"], "chat.completion");
    assert_eq!(answered.json()["usage"]["completion_tokens"], 3);

    // Every /v1/ path is guarded, unknown ones included; the rest stays open.
    for path in ["/v1/models", "/v1/loads", "/v1/no-such-route"] {
        let url = format!("{}{path}", sim.url());
        assert_unauthorized(&call(Method::GET, &url, None).await, "missing API key");
    }
    let url = |path: &str| format!("{}{path}", sim.url());
    assert_eq!(call(Method::GET, &url("/v1/models"), Some(&right)).await.status, StatusCode::OK);
    assert_eq!(call(Method::GET, &url("/v1/loads"), Some(&right)).await.status, StatusCode::OK);
    let unknown = call(Method::GET, &url("/v1/no-such-route"), Some(&right)).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    // So is SGLang's /generate, the one generation endpoint outside /v1/.
    let generate = json!({"text": "Hello, key!", "sampling_params": {"max_new_tokens": 2}});
    let headers = [("authorization", right.as_str())];
    let missing = send(Method::POST, &url("/generate"), Some(&generate)).await.expect("answered");
    assert_unauthorized(&missing, "missing API key");
    let answered = send_with_headers(Method::POST, &url("/generate"), Some(&generate), &headers)
        .await
        .expect("answered");
    assert_eq!(answered.json()["meta_info"]["completion_tokens"], 2);
    for path in ["/health", "/health_generate", "/get_server_info", "/get_load"] {
        assert_eq!(call(Method::GET, &url(path), None).await.status, StatusCode::OK, "{path}");
    }
}

#[tokio::test]
async fn without_a_key_the_engine_stays_open() {
    let sim = Sim::start(&[]).await;
    let chat_url = format!("{}/v1/chat/completions", sim.url());
    let anything = call(Method::POST, &chat_url, Some("Bearer whatever")).await;
    assert_eq!(anything.status, StatusCode::OK);
    assert_eq!(call(Method::POST, &chat_url, None).await.status, StatusCode::OK);
}

#[tokio::test]
async fn the_key_never_reaches_the_logs() {
    let log = std::env::temp_dir().join(format!("router-sim-api-key-{}.log", std::process::id()));
    let file = std::fs::File::create(&log).expect("log file");
    let mut command = Sim::command(&["--api-key", KEY]);
    command.env("RUST_LOG", "trace").stderr(Stdio::from(file));
    let mut sim = Sim::spawn(command).await;
    let chat_url = format!("{}/v1/chat/completions", sim.url());
    let right = format!("Bearer {KEY}");
    assert_eq!(call(Method::POST, &chat_url, Some(&right)).await.status, StatusCode::OK);
    assert_unauthorized(&call(Method::POST, &chat_url, Some("Bearer nope")).await, "invalid");
    sim.child.kill().await.expect("killed");

    let logged = std::fs::read_to_string(&log).expect("log readable");
    let _ = std::fs::remove_file(&log);
    assert!(logged.contains("api_key: Some(<redacted>)"), "the config is logged: {logged}");
    assert!(!logged.contains(KEY), "the key is in the logs");
}
