//! SLO-aware bucket ordering end to end on router-sim engines (docs/design/SLO.md): a tight
//! time-to-first-token target goes to the fast bucket and a best-effort one to the slow
//! bucket, each answer says whether its bucket met the target, and a live estimate moves
//! tight targets away from a bucket whose engine is overloaded until it drains. Assertions are
//! on which bucket served and on counts, never on times.

use http_body_util::Full;
use router_e2e::{Engine, Http, Reply, Router, chat_body, worker_state};
use router_test_support::eventually;

const ADMIN: &str = "slo-admin";

/// A router serving model `m` from a fast and a slow engine, each alone in a bucket that
/// declares its time to first token: `first` is tried first by length (the smaller input
/// capacity), the other one after it; `ttft_slo` is the model's preference.
fn declared(fast: &Engine, slow: &Engine, ttft_slo: &str, first: &str) -> String {
    let bucket = |id: &str| {
        let (max, ttft) =
            (if id == first { 4096 } else { 100_000 }, if id == "fast" { 200 } else { 3000 });
        format!(
            "      - {{id: {id}, limits: {{max: {max}}}, ttft_ms: {ttft}, groups: {{plain: {{worker_ids: [{id}]}}}}}}\n"
        )
    };
    format!(
        "server: {{port: 0, admin_token: {ADMIN}}}\nmodels:\n  - id: m\n    ttft_slo: {ttft_slo}\n    \
         workers:\n      - {{id: fast, url: \"{}\"}}\n      - {{id: slow, url: \"{}\"}}\n    buckets:\n{}{}",
        fast.url,
        slow.url,
        bucket("fast"),
        bucket("slow"),
    )
}

async fn ask(http: &Http, router: &Router, target_ms: Option<&str>) -> Reply {
    let headers: Vec<(&str, &str)> =
        target_ms.map(|ms| ("x-sgl-ttft-slo-ms", ms)).into_iter().collect();
    let reply = http.chat(&router.url, &chat_body("m", "hello there", 1), &headers).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply
}

/// `router_slo_requests_total{model="m",target,met}`, 0 when absent.
async fn slo_count(http: &Http, router: &Router, target: &str, met: &str) -> f64 {
    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    metrics
        .lines()
        .filter(|l| l.starts_with("router_slo_requests_total{"))
        .filter(|l| l.contains("model=\"m\""))
        .filter(|l| {
            l.contains(&format!("target=\"{target}\"")) && l.contains(&format!("met=\"{met}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn a_tight_target_goes_to_the_fast_bucket_and_a_best_effort_one_to_the_slow_bucket() {
    let fast = Engine::start("m", &[]);
    let slow = Engine::start("m", &["--prefill-tokens-per-sec", "2000"]);
    let http = Http::default();

    // slo_first, with the slow bucket first by length.
    let router = Router::with_config(&declared(&fast, &slow, "slo_first", "slow"));
    // (target, bucket, x-router-slo-ttft)
    let cases = [
        (None, "slow", None),
        // Only fast promises 200 ms: the tight request leaves the length order for it.
        (Some("500"), "fast", Some("met")),
        // Both promise it: the length order.
        (Some("5000"), "slow", Some("met")),
        // Nobody promises 50 ms: the length order, and the answer says it was missed.
        (Some("50"), "slow", Some("missed")),
    ];
    for (target, bucket, verdict) in cases {
        let reply = ask(&http, &router, target).await;
        assert_eq!(reply.header("x-router-bucket"), Some(bucket), "target {target:?}");
        assert_eq!(reply.header("x-router-engine"), Some(bucket), "target {target:?}");
        assert_eq!(reply.header("x-router-slo-ttft"), verdict, "target {target:?}");
        assert_eq!(reply.header("x-router-slo-tps"), None, "no throughput target");
    }
    assert_eq!(slo_count(&http, &router, "ttft", "true").await, 2.0);
    assert_eq!(slo_count(&http, &router, "ttft", "false").await, 1.0);

    // best_effort, with the fast bucket first by length: a relaxed request that the slow
    // bucket can serve in time leaves the fast one to those that need it.
    let router = Router::with_config(&declared(&fast, &slow, "best_effort", "fast"));
    let cases = [
        (None, "fast", None),
        // Only fast meets 500 ms: a best-effort request goes where it is not needed.
        (Some("500"), "slow", Some("missed")),
        // Both meet 5 s: the length order, among the buckets that meet it.
        (Some("5000"), "fast", Some("met")),
    ];
    for (target, bucket, verdict) in cases {
        let reply = ask(&http, &router, target).await;
        assert_eq!(reply.header("x-router-bucket"), Some(bucket), "target {target:?}");
        assert_eq!(reply.header("x-router-slo-ttft"), verdict, "target {target:?}");
    }
    assert_eq!(slo_count(&http, &router, "ttft", "true").await, 1.0);
    assert_eq!(slo_count(&http, &router, "ttft", "false").await, 1.0);

    // An unusable target is refused before anything is dispatched.
    let refused =
        http.chat(&router.url, &chat_body("m", "hi", 4), &[("x-sgl-ttft-slo-ms", "0")]).await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert_eq!(refused.json()["error"]["param"], "x-sgl-ttft-slo-ms");
}

/// A router serving model `m` from engine `busy` in bucket `busy` (tried first by length, a
/// live time to first token) and engine `spare` in bucket `spare` (a live one too), preferring
/// buckets that meet time-to-first-token targets.
fn live(busy: &Engine, spare: &Engine) -> String {
    let reporter = |e: &Engine| e.process.url_after("load reporter on ");
    format!(
        "server: {{port: 0, admin_token: {ADMIN}}}\nload: {{report_interval_ms: 50}}\nmodels:\n  - id: m\n    \
         ttft_slo: slo_first\n    workers:\n      \
         - {{id: busy, url: \"{}\", load_reporter: \"{}\"}}\n      \
         - {{id: spare, url: \"{}\", load_reporter: \"{}\"}}\n    buckets:\n      \
         - {{id: busy, limits: {{max: 8192}}, ttft_ms: live, groups: {{plain: {{worker_ids: [busy]}}}}}}\n      \
         - {{id: spare, ttft_ms: live, groups: {{plain: {{worker_ids: [spare]}}}}}}\n",
        busy.url,
        reporter(busy),
        spare.url,
        reporter(spare),
    )
}

/// Starts a streamed request with a prompt of about `tokens` tokens (as the router estimates
/// them, four bytes each) and a long answer, and returns its response once the head is in;
/// dropping it cancels the request.
async fn held(
    http: &Http,
    router: &Router,
    tokens: usize,
    headers: &[(&str, &str)],
) -> http::Response<hyper::body::Incoming> {
    let mut body = chat_body("m", &"word ".repeat(tokens * 4 / 5), 1000);
    body["stream"] = true.into();
    let mut request = http::Request::post(format!("{}/v1/chat/completions", router.url))
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Full::new(bytes::Bytes::from(body.to_string()))).expect("request");
    let response = http.client().request(request).await.expect("response");
    assert_eq!(response.status(), 200);
    response
}

async fn inflight_on(http: &Http, router: &Router, worker: &str) -> u64 {
    let state = router.admin_state(http, ADMIN).await;
    worker_state(&state, worker)["inflight"].as_u64().unwrap_or(0)
}

#[tokio::test]
async fn a_live_estimate_moves_tight_targets_off_an_overloaded_bucket_until_it_drains() {
    // One request at a time, a slow prefill and a slower decode: whatever is sent to `busy`
    // beyond its first request waits, and its prompt is prefill work queued ahead of anything
    // new.
    let slow =
        ["--max-running", "1", "--prefill-tokens-per-sec", "4000", "--decode-tokens-per-sec", "5"];
    let reporting = ["--load-reporter", "127.0.0.1:0"];
    let busy = Engine::start("m", &[&slow[..], &reporting[..]].concat());
    let spare = Engine::start("m", &reporting);
    let router = Router::with_config(&live(&busy, &spare));
    let http = Http::default();
    router.wait_until_ready(&http, ADMIN).await;

    // Idle: the short request's few tokens are far within 1 s on either bucket, so the length
    // order stands.
    for _ in 0..3 {
        let reply = ask(&http, &router, Some("1000")).await;
        assert_eq!(reply.header("x-router-bucket"), Some("busy"), "{}", reply.body);
        assert_eq!(reply.header("x-router-slo-ttft"), Some("met"));
    }

    // Overload `busy`: four long prompts (about 3000 tokens each), one running, three waiting
    // (streams whose heads are in; their bodies are held, unread).
    let mut long = Vec::new();
    for _ in 0..4 {
        let response = held(&http, &router, 3000, &[]).await;
        assert_eq!(response.headers()["x-router-bucket"], "busy");
        long.push(response.into_body());
    }
    assert_eq!(inflight_on(&http, &router, "busy").await, 4, "the long prompts are on busy");

    // Tight targets now go to `spare`, and say they were met; requests without a target keep
    // the length order (the live estimate orders only targets).
    for _ in 0..3 {
        let reply = ask(&http, &router, Some("1000")).await;
        assert_eq!(reply.header("x-router-bucket"), Some("spare"), "{}", reply.body);
        assert_eq!(reply.header("x-router-engine"), Some("spare"));
        assert_eq!(reply.header("x-router-slo-ttft"), Some("met"));
    }
    // (A stream, whose head is all we wait for: its answer would queue behind the long ones.)
    let untargeted = held(&http, &router, 1, &[]).await;
    assert_eq!(untargeted.headers()["x-router-bucket"], "busy");
    assert!(!untargeted.headers().contains_key("x-router-slo-ttft"));
    drop(untargeted);
    // Even a long prompt with a target goes to `spare` now.
    let targeted = held(&http, &router, 3000, &[("x-sgl-ttft-slo-ms", "1000")]).await;
    assert_eq!(targeted.headers()["x-router-bucket"], "spare");
    drop(targeted);

    // The clients of the long prompts leave: `busy` drains, and tight targets come back to it.
    drop(long);
    eventually("busy drained", async || inflight_on(&http, &router, "busy").await == 0).await;
    eventually("tight targets back on the drained bucket", async || {
        ask(&http, &router, Some("1000")).await.header("x-router-bucket") == Some("busy")
    })
    .await;
    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    let met: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("router_slo_requests_total{") && l.contains("met=\"true\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(met >= 7.0, "every targeted request was met: {metrics}");
}
