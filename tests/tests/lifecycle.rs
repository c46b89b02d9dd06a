//! Request lifetimes: a client that leaves cancels the engine request and releases in-flight
//! accounting; SIGTERM drains before exiting.

use std::time::Duration;

use http_body_util::{BodyExt, Full};
use router_e2e::{Engine, Http, Router, chat_body, engine_running, inflight};
use router_test_support::eventually;

fn config(engine: &Engine) -> String {
    format!(
        "server: {{port: 0, admin_token: t}}\nmodels:\n  - id: m\n    workers:\n      - {{id: e1, url: \"{}\"}}\n    \
         buckets:\n      - id: all\n        groups: {{plain: {{policy: {{type: round_robin}}}}}}\n",
        engine.url
    )
}

/// Starts a streamed request for 100 tokens and returns its response once the head is in.
async fn long_stream(http: &Http, router: &Router) -> http::Response<hyper::body::Incoming> {
    let mut body = chat_body("m", "a long answer please", 100);
    body["stream"] = true.into();
    let request = http::Request::post(format!("{}/v1/chat/completions", router.url))
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from(body.to_string())))
        .expect("request");
    http.client().request(request).await.expect("response")
}

#[tokio::test]
async fn a_client_that_disconnects_cancels_the_engine_request() {
    // 100 tokens at 20 tokens/s: five seconds of streaming unless cancelled.
    let engine = Engine::start("m", &["--decode-tokens-per-sec", "20"]);
    let router = Router::with_config(&config(&engine));
    let http = Http::default();
    let response = long_stream(&http, &router).await;
    assert_eq!(response.status(), 200);
    let mut stream = response.into_body();
    let first =
        tokio::time::timeout(Duration::from_secs(5), stream.frame()).await.expect("first event");
    assert!(first.is_some());
    assert_eq!(inflight(&http, &router, "t").await, 1);
    assert_eq!(engine_running(&http, &engine).await, 1);

    drop(stream);
    eventually("guard released", async || inflight(&http, &router, "t").await == 0).await;
    eventually("engine request cancelled", async || engine_running(&http, &engine).await == 0)
        .await;
}

#[tokio::test]
async fn sigterm_drains_in_flight_requests_then_exits() {
    // 30 tokens at 6 tokens/s: five seconds, so that the drain is still waiting for it when
    // the late request comes (with one second, the router had sometimes exited by then and
    // the late request met a closed socket).
    let engine = Engine::start("m", &["--decode-tokens-per-sec", "6"]);
    let mut router = Router::with_config(&config(&engine));
    let http = Http::default();
    let url = router.url.clone();
    let slow = tokio::spawn({
        let http = http.clone();
        async move { http.chat(&url, &chat_body("m", "slow", 30), &[]).await }
    });
    eventually("the streaming request in flight", async || {
        inflight(&http, &router, "t").await == 1
    })
    .await;
    router.process.terminate();
    eventually("readiness turns 503 while draining", async || {
        http.get(&router.url, "/readiness", &[]).await.status == 503
    })
    .await;
    let refused = http.chat(&router.url, &chat_body("m", "late", 1), &[]).await;
    assert_eq!(refused.status, 503, "new requests are refused while draining");
    let reply = slow.await.expect("task");
    assert_eq!(reply.status, 200, "the in-flight request finished: {}", reply.body);
    let code =
        tokio::task::spawn_blocking(move || router.process.wait_exit(Duration::from_secs(10)))
            .await
            .expect("join");
    assert_eq!(code, Some(0));
}

#[tokio::test]
async fn beyond_the_concurrency_limit_a_request_queues_and_a_full_queue_gets_429() {
    let engine = Engine::start("m", &["--decode-tokens-per-sec", "30"]);
    let yaml = config(&engine).replace(
        "server: {port: 0, admin_token: t}",
        "server: {port: 0, admin_token: t, max_concurrent_requests: 1, queue_size: 1}",
    );
    let router = Router::with_config(&yaml);
    let http = Http::default();
    let send = |text: &'static str, tokens: u64| {
        let (http, url) = (http.clone(), router.url.clone());
        tokio::spawn(async move { http.chat(&url, &chat_body("m", text, tokens), &[]).await })
    };
    let slow = send("slow", 30);
    eventually("the first request in flight", async || inflight(&http, &router, "t").await == 1)
        .await;
    let queued = send("queued", 1);
    eventually("the second request in the queue", async || {
        router.admin_state(&http, "t").await["admission"]["queued"] == 1
    })
    .await;
    let refused = http.chat(&router.url, &chat_body("m", "one too many", 1), &[]).await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    assert_eq!(refused.json()["error"]["code"], "queue_full");
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(slow.await.expect("task").status, 200);
    assert_eq!(queued.await.expect("task").status, 200, "the queued request got the slot");
    let after = http.chat(&router.url, &chat_body("m", "room again", 1), &[]).await;
    assert_eq!(after.status, 200, "the permit is released with the response body");
    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    let counted = "router_requests_refused_total{reason=\"queue_full\"} 1";
    assert!(metrics.lines().any(|line| line == counted), "{metrics}");
}

#[tokio::test]
async fn an_engine_dying_mid_stream_ends_the_stream_with_an_error_event() {
    let engine = Engine::start("m", &["--decode-tokens-per-sec", "20", "--die-after", "1"]);
    let router = Router::with_config(&config(&engine));
    let http = Http::default();
    let url = router.url.clone();
    let mut body = chat_body("m", "a long answer", 100);
    body["stream"] = true.into();
    let long = tokio::spawn({
        let http = http.clone();
        async move { http.chat(&url, &body, &[]).await }
    });
    // Its head has reached the router (the answer is committed to a 200 stream), not only its
    // dispatch: until then an engine that dies is an unreachable 502.
    eventually("the long stream's head at the router", async || {
        let metrics = http.get(&router.url, "/metrics", &[]).await.body;
        metrics.lines().any(|l| l.starts_with("router_upstream_head_seconds_count{model=\"m\"} 1"))
    })
    .await;
    // The engine answers this one, then exits and cuts the stream above.
    let short = http.chat(&router.url, &chat_body("m", "quick", 1), &[]).await;
    assert_eq!(short.status, 200);
    let reply = long.await.expect("task");
    assert_eq!(reply.status, 200, "the stream had started");
    let last = reply.body.lines().rfind(|l| l.starts_with("data: ")).unwrap_or_default().to_owned();
    assert!(last.contains("\"error\""), "the stream ends with an error event: {}", reply.body);
    assert!(!reply.body.contains("[DONE]"), "{}", reply.body);
    eventually("the cut stream released", async || inflight(&http, &router, "t").await == 0).await;
}

#[tokio::test]
async fn a_drain_that_times_out_closes_the_remaining_streams_and_exits() {
    // 100 tokens at 20 tokens/s: five seconds, longer than the one-second drain.
    let engine = Engine::start("m", &["--decode-tokens-per-sec", "20"]);
    let yaml = config(&engine).replace(
        "server: {port: 0, admin_token: t}",
        "server: {port: 0, admin_token: t, shutdown_drain_secs: 1}",
    );
    let mut router = Router::with_config(&yaml);
    let http = Http::default();
    let response = long_stream(&http, &router).await;
    assert_eq!(response.status(), 200);
    router.process.terminate();
    // The stream is cut when the drain gives up, well before its five seconds, and says why
    // in an error event of its own.
    let collected = tokio::time::timeout(Duration::from_secs(4), response.into_body().collect())
        .await
        .expect("the stream ended with the drain")
        .expect("the stream ended cleanly");
    let text = String::from_utf8_lossy(&collected.to_bytes()).into_owned();
    assert!(!text.contains("[DONE]"), "the stream was not cut: {text}");
    let last = text.trim_end().rsplit("\n\n").next().unwrap_or_default();
    let event: serde_json::Value =
        serde_json::from_str(last.strip_prefix("data: ").unwrap_or(last)).expect("a JSON event");
    assert_eq!(event["error"]["code"], "router_shutdown", "{text}");
    let code =
        tokio::task::spawn_blocking(move || router.process.wait_exit(Duration::from_secs(10)))
            .await
            .expect("join");
    assert_eq!(code, Some(0));
}

#[tokio::test]
async fn a_second_signal_exits_without_waiting_for_the_drain() {
    // 100 tokens at 2 tokens/s: fifty seconds, within a drain of a minute.
    let engine = Engine::start("m", &["--decode-tokens-per-sec", "2"]);
    let yaml = config(&engine).replace(
        "server: {port: 0, admin_token: t}",
        "server: {port: 0, admin_token: t, shutdown_drain_secs: 60}",
    );
    let mut router = Router::with_config(&yaml);
    let http = Http::default();
    let response = long_stream(&http, &router).await;
    assert_eq!(response.status(), 200);
    router.process.terminate();
    let http_probe = Http::default();
    eventually("the first signal started the drain", async || {
        http_probe.get(&router.url, "/readiness", &[]).await.status == 503
    })
    .await;
    router.process.terminate();
    // Well inside the minute the drain would wait.
    let code =
        tokio::task::spawn_blocking(move || router.process.wait_exit(Duration::from_secs(20)))
            .await
            .expect("join");
    assert_eq!(code, Some(130), "the second signal's exit status");
    drop(response);
}
