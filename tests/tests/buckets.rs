//! Bucket selection end to end: length-first order, fallback on admission rejection, and the
//! 4xx/5xx outcomes of an exhausted bucket list.

use router_e2e::{Engine, Http, Router, chat_body};

/// Two buckets over the same engines: `short` (up to 64 input tokens) and `long`.
fn config(short_policy: &str, long_policy: &str, long_max: &str) -> (Engine, Engine, String) {
    let a = Engine::start("m", &[]);
    let b = Engine::start("m", &[]);
    let yaml = format!(
        r#"server: {{port: 0}}
models:
  - id: m
    workers:
      - {{id: a, url: "{a}"}}
      - {{id: b, url: "{b}"}}
    buckets:
      - id: long
        rank: 20
        limits: {{min: 0, max: {long_max}}}
        groups: {{plain: {{worker_ids: [b], policy: {long_policy}}}}}
      - id: short
        rank: 10
        limits: {{min: 0, max: 64}}
        max_context_tokens: 128
        groups: {{plain: {{worker_ids: [a], policy: {short_policy}}}}}
"#,
        a = a.url,
        b = b.url,
    );
    (a, b, yaml)
}

#[tokio::test]
async fn short_requests_use_the_short_bucket_and_large_peaks_the_long_one() {
    let (_a, _b, yaml) = config("{type: round_robin}", "{type: round_robin}", "100000");
    let router = Router::with_config(&yaml);
    let http = Http::default();
    let reply = http.chat(&router.url, &chat_body("m", "hi", 8), &[]).await;
    assert_eq!(reply.header("x-router-bucket"), Some("short"), "{}", reply.body);
    assert_eq!(reply.header("x-router-engine"), Some("a"));
    // Small input, but input plus max_tokens exceeds the short bucket's context.
    let reply = http.chat(&router.url, &chat_body("m", "hi", 1000), &[]).await;
    assert_eq!(reply.header("x-router-bucket"), Some("long"), "{}", reply.body);
    assert_eq!(reply.header("x-router-engine"), Some("b"));
}

#[tokio::test]
async fn admission_rejection_falls_back_to_the_next_bucket() {
    let (_a, _b, yaml) = config(
        "{type: power_of_two, admission: {max_inflight_requests: 0}}",
        "{type: round_robin}",
        "100000",
    );
    let router = Router::with_config(&yaml);
    let reply = Http::default().chat(&router.url, &chat_body("m", "hi", 8), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("x-router-bucket"), Some("long"));
}

#[tokio::test]
async fn exhausted_buckets_report_rejections_or_the_empty_stage() {
    let (_a, _b, yaml) = config(
        "{type: power_of_two, admission: {max_inflight_requests: 0}}",
        "{type: round_robin, admission: {max_inflight_requests: 0}}",
        "100000",
    );
    let router = Router::with_config(&yaml);
    let reply = Http::default().chat(&router.url, &chat_body("m", "hi", 8), &[]).await;
    assert_eq!(reply.status, 503, "{}", reply.body);
    let error = reply.json()["error"].clone();
    assert_eq!(error["code"], "no_admissible_engine");
    let message = error["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains("max_inflight_requests"), "{message}");
    assert!(message.contains('a') && message.contains('b'), "both engines named: {message}");

    let (_a, _b, yaml) = config("{type: random}", "{type: random}", "100000");
    let yaml = yaml
        .replace("worker_ids: [b]", "worker_ids: []")
        .replace("worker_ids: [a]", "worker_ids: []");
    let router = Router::with_config(&yaml);
    let reply = Http::default().chat(&router.url, &chat_body("m", "hi", 8), &[]).await;
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert_eq!(reply.json()["error"]["code"], "no_candidates");
}

#[tokio::test]
async fn a_request_no_bucket_fits_is_a_bad_request() {
    let (_a, _b, yaml) = config("{type: random}", "{type: random}", "100");
    let router = Router::with_config(&yaml);
    let long_prompt = "word ".repeat(2000);
    let reply = Http::default().chat(&router.url, &chat_body("m", &long_prompt, 8), &[]).await;
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_eq!(reply.json()["error"]["code"], "no_matching_bucket");
}
