//! Faults as the client sees them: a session key too long to bind is the client's 400 naming
//! the header, and an engine that sends its head and then stalls (plain, or the decode engine
//! of a PD pair) is cut off after `server.engine_idle_timeout_secs`: a stream ends with an
//! error event, a whole answer is a 504, the engine counts a failure and nothing stays in
//! flight.

use router_e2e::{Engine, Http, Router, chat_body, inflight, pd_router_yaml};

const ADMIN: &str = "admin-secret";

fn plain_router(engine: &Engine) -> Router {
    Router::with_config(&format!(
        "server: {{port: 0, admin_token: {ADMIN}, engine_idle_timeout_secs: 1}}\nmodels:\n  - id: m\n    \
         workers:\n      - {{id: e1, url: \"{}\"}}\n    buckets:\n      - id: all\n        \
         groups: {{plain: {{policy: {{type: session_aware}}}}}}\n",
        engine.url
    ))
}

fn streamed(mut body: serde_json::Value) -> serde_json::Value {
    body["stream"] = true.into();
    body
}

/// The last SSE event of a stream, parsed.
fn last_event(stream: &str) -> serde_json::Value {
    let event =
        stream.lines().rev().find_map(|line| line.strip_prefix("data: ")).expect("an event");
    serde_json::from_str(event).expect("a json event")
}

fn stalled_failures(metrics: &str, worker: &str) -> u64 {
    metrics
        .lines()
        .find(|l| {
            l.starts_with("router_engine_failures_total")
                && l.contains(&format!("worker=\"{worker}\""))
                && l.contains("kind=\"stalled\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_session_key_too_long_to_bind_is_a_400_naming_the_header() {
    let engine = Engine::start("m", &[]);
    let router = plain_router(&engine);
    let http = Http::default();
    let key = "k".repeat(300);
    let reply = http.chat(&router.url, &chat_body("m", "hi", 2), &[("x-session-id", &key)]).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    let error = &reply.json()["error"];
    assert_eq!(error["param"], "x-session-id", "{error}");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(message.contains("x-session-id") && message.contains("300 bytes"), "{message}");

    let fits = "k".repeat(256);
    let reply = http.chat(&router.url, &chat_body("m", "hi", 2), &[("x-session-id", &fits)]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
}

#[tokio::test]
async fn a_plain_engine_that_stalls_after_its_head_is_cut_off() {
    let engine = Engine::start("m", &["--stall-body-ms", "60000"]);
    let router = plain_router(&engine);
    let http = Http::default();

    let reply = http.chat(&router.url, &chat_body("m", "hi", 2), &[]).await;
    assert_eq!(reply.status, 504, "{}", reply.body);
    assert_eq!(reply.json()["error"]["code"], "engine_timeout", "{}", reply.body);

    let reply = http.chat(&router.url, &streamed(chat_body("m", "hi", 2)), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(!reply.body.contains("[DONE]"), "{}", reply.body);
    let event = last_event(&reply.body);
    assert_eq!(event["error"]["code"], "engine_timeout", "{event}");
    assert!(event["error"]["message"].as_str().unwrap_or_default().contains("e1"), "{event}");

    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    assert_eq!(stalled_failures(&metrics, "e1"), 2, "{metrics}");
    assert_eq!(inflight(&http, &router, ADMIN).await, 0, "every guard is released");
}

#[tokio::test]
async fn a_decode_engine_that_stalls_after_its_head_is_cut_off() {
    let p = Engine::start("m", &["--role", "prefill", "--bootstrap-port", "0"]);
    let d = Engine::start("m", &["--role", "decode", "--stall-body-ms", "60000"]);
    let router =
        Router::with_config(&pd_router_yaml(&p, &d, "engine_idle_timeout_secs: 1", "round_robin"));
    let http = Http::default();
    let reply = http.chat(&router.url, &chat_body("m", "hello pd", 2), &[]).await;
    assert_eq!(reply.status, 504, "{}", reply.body);
    let message = reply.json()["error"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.starts_with("decode engine D1 failed"), "{message}");

    let reply = http.chat(&router.url, &streamed(chat_body("m", "hello pd", 2)), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(last_event(&reply.body)["error"]["code"], "engine_timeout", "{}", reply.body);

    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    assert_eq!(stalled_failures(&metrics, "D1"), 2, "{metrics}");
    assert_eq!(stalled_failures(&metrics, "P1"), 0, "{metrics}");
}
