//! Plain dispatch end to end: real router-server and router-sim processes on loopback.

use router_e2e::{Engine, Http, Router, chat_body};

fn plain_config(engines: &[&Engine], policy: &str) -> String {
    let workers: String = engines
        .iter()
        .enumerate()
        .map(|(i, e)| format!("      - {{id: e{}, url: \"{}\"}}\n", i + 1, e.url))
        .collect();
    format!(
        "server: {{port: 0, admin_token: t0ken}}\nmodels:\n  - id: m\n    workers:\n{workers}    buckets:\n      \
         - id: all\n        groups: {{plain: {{policy: {{type: {policy}}}}}}}\n"
    )
}

#[tokio::test]
async fn round_robin_alternates_and_sets_router_headers() {
    let a = Engine::start("m", &[]);
    let b = Engine::start("m", &[]);
    let router = Router::with_config(&plain_config(&[&a, &b], "round_robin"));
    let http = Http::default();
    let mut engines = Vec::new();
    for _ in 0..4 {
        let reply = http
            .chat(&router.url, &chat_body("m", "hello", 4), &[("x-request-id", "req-42")])
            .await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(reply.header("x-router-bucket"), Some("all"));
        assert_eq!(reply.header("x-request-id"), Some("req-42"));
        assert_eq!(reply.json()["usage"]["completion_tokens"], 4);
        engines.push(reply.header("x-router-engine").expect("engine header").to_owned());
    }
    assert_eq!(engines, ["e1", "e2", "e1", "e2"]);
}

#[tokio::test]
async fn streaming_passes_sse_through() {
    let a = Engine::start("m", &[]);
    let router = Router::with_config(&plain_config(&[&a], "power_of_two"));
    let mut body = chat_body("m", "stream please", 5);
    body["stream"] = true.into();
    let reply = Http::default().chat(&router.url, &body, &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("content-type"), Some("text/event-stream"));
    let events: Vec<_> = reply.body.lines().filter(|l| l.starts_with("data: ")).collect();
    assert_eq!(events.last(), Some(&"data: [DONE]"), "{}", reply.body);
    assert!(events.len() >= 6, "one event per token plus the end: {events:?}");
}

#[tokio::test]
async fn client_errors_are_openai_shaped() {
    let a = Engine::start("m", &[]);
    let router = Router::with_config(&plain_config(&[&a], "random"));
    let http = Http::default();

    let reply = http.chat(&router.url, &chat_body("other", "x", 1), &[]).await;
    assert_eq!(reply.status, 404);
    assert_eq!(reply.json()["error"]["code"], "model_not_found");

    let reply =
        http.send("POST", &format!("{}/v1/chat/completions", router.url), &[], "{not json").await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.json()["error"]["type"], "invalid_request_error");

    let mut bad = chat_body("m", "x", 1);
    bad["temperature"] = 9.into();
    let reply = http.chat(&router.url, &bad, &[]).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.json()["error"]["param"], "temperature");

    let huge = "x".repeat(33 * 1024 * 1024);
    let reply = http.send("POST", &format!("{}/v1/chat/completions", router.url), &[], huge).await;
    assert_eq!(reply.status, 413);
    assert_eq!(reply.json()["error"]["code"], "body_too_large");
}

#[tokio::test]
async fn engine_failures_are_bad_gateway() {
    let failing = Engine::start("m", &["--fail-rate", "1"]);
    let router = Router::with_config(&plain_config(&[&failing], "round_robin"));
    let reply = Http::default().chat(&router.url, &chat_body("m", "x", 1), &[]).await;
    assert_eq!(reply.status, 502, "{}", reply.body);
    assert_eq!(reply.json()["error"]["code"], "engine_failed");

    let mut dead = Engine::start("m", &[]);
    let router = Router::with_config(&plain_config(&[&dead], "round_robin"));
    dead.process.kill();
    let reply = Http::default().chat(&router.url, &chat_body("m", "x", 1), &[]).await;
    assert_eq!(reply.status, 502, "{}", reply.body);
}

#[tokio::test]
async fn operations_endpoints_answer() {
    let a = Engine::start("m", &[]);
    let router = Router::with_config(&plain_config(&[&a], "load_based"));
    let http = Http::default();
    assert_eq!(http.get(&router.url, "/health", &[]).await.status, 200);
    assert_eq!(http.get(&router.url, "/readiness", &[]).await.status, 200);
    let models = http.get(&router.url, "/v1/models", &[]).await.json();
    assert_eq!(models["data"][0]["id"], "m");
    let reply = http.chat(&router.url, &chat_body("m", "x", 1), &[]).await;
    assert_eq!(reply.status, 200);
    let metrics = http.get(&router.url, "/metrics", &[]).await;
    for name in ["router_requests_total", "router_picks_total", "router_engine_inflight"] {
        assert!(metrics.body.contains(name), "{name} missing from /metrics:\n{}", metrics.body);
    }
}

#[tokio::test]
async fn admin_api_needs_the_token_and_manages_workers() {
    let a = Engine::start("m", &[]);
    let b = Engine::start("m", &[]);
    let router = Router::with_config(&plain_config(&[&a], "round_robin"));
    let http = Http::default();
    assert_eq!(http.get(&router.url, "/admin/workers", &[]).await.status, 401);
    let wrong = [("authorization", "Bearer nope")];
    assert_eq!(http.get(&router.url, "/admin/workers", &wrong).await.status, 401);
    let auth = [("authorization", "Bearer t0ken"), ("content-type", "application/json")];

    let worker = format!(r#"{{"id": "e2", "url": "{}", "model": "m"}}"#, b.url);
    let reply =
        http.send("POST", &format!("{}/admin/workers", router.url), &auth, worker.clone()).await;
    assert_eq!(reply.status, 201, "{}", reply.body);
    let reply = http.send("POST", &format!("{}/admin/workers", router.url), &auth, worker).await;
    assert_eq!(reply.status, 409, "duplicate id");
    let creds = r#"{"id": "e3", "url": "http://u:p@127.0.0.1:1", "model": "m"}"#;
    let reply = http.send("POST", &format!("{}/admin/workers", router.url), &auth, creds).await;
    assert_eq!(reply.status, 400, "credentials in URL: {}", reply.body);

    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let reply = http.chat(&router.url, &chat_body("m", "x", 1), &[]).await;
        seen.insert(reply.header("x-router-engine").expect("engine").to_owned());
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["e1", "e2"], "the added engine serves");

    let state = http.get(&router.url, "/admin/state", &auth).await.json();
    assert_eq!(state["workers"].as_array().map(Vec::len), Some(2));
    assert_eq!(state["workers"][0]["load"]["freshness"], "missing");
    assert_eq!(state["models"][0]["buckets"][0]["id"], "all");

    let reply = http.send("DELETE", &format!("{}/admin/workers/e1", router.url), &auth, "").await;
    assert_eq!(reply.status, 200);
    for _ in 0..3 {
        let reply = http.chat(&router.url, &chat_body("m", "x", 1), &[]).await;
        assert_eq!(reply.header("x-router-engine"), Some("e2"));
    }
}

#[tokio::test]
async fn the_admin_api_takes_the_configuration_files_worker_object() {
    let a = Engine::start("m", &[]);
    let b = Engine::start("m", &[]);
    let http = Http::default();
    let auth = [("authorization", "Bearer t0ken"), ("content-type", "application/json")];
    // A worker entry exactly as under models[].workers, without `model`.
    let entry = |id: &str, url: &str| {
        format!(
            r#"{{"id": "{id}", "url": "{url}", "role": "plain", "dp_size": 1, "block_size": 16}}"#
        )
    };

    // One model: the worker joins it.
    let router = Router::with_config(&plain_config(&[&a], "round_robin"));
    let reply = http
        .send("POST", &format!("{}/admin/workers", router.url), &auth, entry("e2", &b.url))
        .await;
    assert_eq!(reply.status, 201, "{}", reply.body);
    assert_eq!(reply.json()["model"], "m");
    assert_eq!(reply.json()["block_size"], 16);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let reply = http.chat(&router.url, &chat_body("m", "x", 1), &[]).await;
        seen.insert(reply.header("x-router-engine").expect("engine").to_owned());
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), ["e1", "e2"], "the added engine serves");

    // Two models: which one is for the caller to say.
    let two = format!(
        "{}  - {{id: n, workers: [], buckets: [{{id: all, groups: {{plain: {{}}}}}}]}}\n",
        plain_config(&[&a], "round_robin")
    );
    let router = Router::with_config(&two);
    let url = format!("{}/admin/workers", router.url);
    let reply = http.send("POST", &url, &auth, entry("e2", &b.url)).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    let error = &reply.json()["error"];
    assert_eq!(error["param"], "model", "{error}");
    assert!(
        error["message"].as_str().is_some_and(|m| m.contains("'model' is required")),
        "{error}"
    );
    let named = entry("e2", &b.url).replace(r#""role""#, r#""model": "n", "role""#);
    let reply = http.send("POST", &url, &auth, named).await;
    assert_eq!(reply.status, 201, "{}", reply.body);
    let reply = http.chat(&router.url, &chat_body("n", "x", 1), &[]).await;
    assert_eq!(reply.header("x-router-engine"), Some("e2"), "{}", reply.body);
}

#[tokio::test]
async fn h2c_to_engines_works_streamed_and_not() {
    let a = Engine::start("m", &[]);
    let yaml = plain_config(&[&a], "round_robin").replace(
        "server: {port: 0, admin_token: t0ken}",
        "server: {port: 0, upstream_http2: true}",
    );
    let router = Router::with_config(&yaml);
    let http = Http::default();
    let reply = http.chat(&router.url, &chat_body("m", "over h2c", 3), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.json()["usage"]["completion_tokens"], 3);
    let mut body = chat_body("m", "over h2c, streamed", 3);
    body["stream"] = true.into();
    let reply = http.chat(&router.url, &body, &[]).await;
    assert!(reply.body.trim_end().ends_with("data: [DONE]"), "{}", reply.body);
}

#[tokio::test]
async fn several_event_loops_share_the_port_and_the_state() {
    let a = Engine::start("m", &[]);
    let b = Engine::start("m", &[]);
    let config = plain_config(&[&a, &b], "round_robin")
        .replace("server: {port: 0,", "server: {port: 0, worker_threads: 4,");
    let router = Router::with_config(&config);
    // Many connections at once: the kernel spreads them over the four listeners, and every
    // loop reaches the same engines through the same selection state.
    let replies = futures::future::join_all((0..64).map(|i| {
        let url = router.url.clone();
        async move {
            // A client per request: a connection per request.
            Http::default().chat(&url, &chat_body("m", &format!("hello {i}"), 2), &[]).await
        }
    }))
    .await;
    let mut per_engine = std::collections::BTreeMap::new();
    for reply in &replies {
        assert_eq!(reply.status, 200, "{}", reply.body);
        *per_engine
            .entry(reply.header("x-router-engine").unwrap_or_default().to_owned())
            .or_insert(0) += 1;
    }
    // One round-robin cursor for all loops: an even split.
    assert_eq!(
        per_engine.into_iter().collect::<Vec<_>>(),
        [("e1".to_owned(), 32), ("e2".to_owned(), 32)]
    );
    let state = Http::default()
        .get(&router.url, "/admin/state", &[("authorization", "Bearer t0ken")])
        .await;
    assert_eq!(state.status, 200);
    for worker in state.json()["workers"].as_array().expect("workers") {
        assert_eq!(worker["inflight"], 0, "{worker}");
    }
    // Every loop counts into the same series.
    let metrics = Http::default().get(&router.url, "/metrics", &[]).await.body;
    for series in [
        "router_requests_total{model=\"m\",bucket=\"all\",status=\"200\"} 64",
        "router_request_duration_seconds_count{model=\"m\",bucket=\"all\"} 64",
        "router_upstream_head_seconds_count{model=\"m\"} 64",
        "router_selection_seconds_count{model=\"m\"} 64",
    ] {
        assert!(metrics.lines().any(|line| line == series), "{series} not in:\n{metrics}");
    }
}
