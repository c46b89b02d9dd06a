//! Retries (docs/design/RELIABILITY.md, Engines failing): when the engine could not be reached
//! or declined the request with a status of `server.retry.on_status`, as a fresh selection that
//! excludes it, visible in `x-router-retries` and the metrics, and under a budget; an engine's
//! `Retry-After` holds it off.

use router_e2e::{Engine, Http, Router, chat_body};

/// A loopback URL where nothing listens.
fn dead_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

fn config(urls: &[&str], retry: &str) -> String {
    let workers: String = urls
        .iter()
        .enumerate()
        .map(|(i, url)| format!("      - {{id: e{}, url: \"{url}\"}}\n", i + 1))
        .collect();
    format!(
        "server: {{port: 0, retry: {{{retry}}}}}\nmodels:\n  - id: m\n    workers:\n{workers}    \
         buckets:\n      - id: all\n        groups: {{plain: {{policy: {{type: round_robin}}}}}}\n"
    )
}

fn metric(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find(|line| line.starts_with(name))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn an_unreachable_engine_is_retried_on_a_fresh_selection() {
    let alive = Engine::start("m", &[]);
    let dead = dead_url();
    let router = Router::with_config(&config(&[&dead, &alive.url], "backoff_ms: 1"));
    let http = Http::default();
    let mut retried = 0;
    for _ in 0..4 {
        let reply = http.chat(&router.url, &chat_body("m", "hello", 4), &[]).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        // Every answer comes from the live engine, whichever the round robin picked first.
        assert_eq!(reply.header("x-router-engine"), Some("e2"));
        if reply.header("x-router-retries") == Some("1") {
            retried += 1;
        }
    }
    // The refused connection marked e1 unhealthy: one retry, then e1 is no longer picked.
    assert_eq!(retried, 1);
    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    assert_eq!(
        metric(&metrics, "router_retries_total{model=\"m\",reason=\"unreachable\"}"),
        1.0,
        "{metrics}"
    );
}

#[tokio::test]
async fn with_nothing_left_to_try_the_client_gets_the_original_failure() {
    let router = Router::with_config(&config(&[&dead_url()], "backoff_ms: 1"));
    let http = Http::default();
    let reply = http.chat(&router.url, &chat_body("m", "hello", 4), &[]).await;
    assert_eq!(reply.status, 502, "{}", reply.body);
    assert_eq!(reply.json()["error"]["code"], "engine_unreachable");
    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    assert_eq!(
        metric(&metrics, "router_retries_total{model=\"m\",reason=\"unreachable\"}"),
        1.0,
        "{metrics}"
    );
}

#[tokio::test]
async fn a_spent_budget_or_no_retries_means_no_retry() {
    let http = Http::default();
    for retry in ["budget_ratio: 0, budget_min_per_sec: 0", "max_retries: 0"] {
        let router = Router::with_config(&config(&[&dead_url()], retry));
        let reply = http.chat(&router.url, &chat_body("m", "hello", 4), &[]).await;
        assert_eq!(reply.status, 502, "{retry}: {}", reply.body);
        assert_eq!(reply.header("x-router-retries"), None);
        let metrics = http.get(&router.url, "/metrics", &[]).await.body;
        assert_eq!(
            metric(&metrics, "router_retries_total{model=\"m\",reason=\"unreachable\"}"),
            0.0,
            "{metrics}"
        );
        let exhausted = metric(&metrics, "router_retry_budget_exhausted_total{model=\"m\"}");
        assert_eq!(exhausted, if retry.starts_with("budget") { 1.0 } else { 0.0 }, "{retry}");
    }
}

#[tokio::test]
async fn a_declining_engine_is_retried_elsewhere_and_held_off_for_its_retry_after() {
    let busy = Engine::start(
        "m",
        &["--fail-rate", "1", "--fail-status", "429", "--fail-retry-after", "30"],
    );
    let alive = Engine::start("m", &[]);
    let router = Router::with_config(&config(&[&busy.url, &alive.url], "backoff_ms: 1"));
    let http = Http::default();
    let mut retried = 0;
    for _ in 0..4 {
        let reply = http.chat(&router.url, &chat_body("m", "hello", 4), &[]).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(reply.header("x-router-engine"), Some("e2"), "never the busy engine's 429");
        if reply.header("x-router-retries") == Some("1") {
            retried += 1;
        }
    }
    // The 429 came with Retry-After: 30, so e1 is held off after declining once.
    assert_eq!(retried, 1);
    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    let series = "router_retries_total{model=\"m\",reason=\"status_429\"}";
    assert_eq!(metric(&metrics, series), 1.0, "{metrics}");
}

#[tokio::test]
async fn with_every_engine_declining_the_client_gets_the_engines_status() {
    let busy = Engine::start("m", &["--fail-rate", "1", "--fail-status", "503"]);
    let router = Router::with_config(&config(&[&busy.url], "backoff_ms: 1"));
    let http = Http::default();
    let reply = http.chat(&router.url, &chat_body("m", "hello", 4), &[]).await;
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert_eq!(reply.json()["error"]["code"], "engine_declined");
    assert_eq!(reply.header("retry-after"), Some("1"));
    // A status outside on_status is the engine's failure, not retried.
    let router = Router::with_config(&config(&[&busy.url], "backoff_ms: 1, on_status: [429]"));
    let reply = http.chat(&router.url, &chat_body("m", "hello", 4), &[]).await;
    assert_eq!(reply.status, 502, "{}", reply.body);
    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    assert!(!metrics.contains("router_retries_total{"), "{metrics}");
}
