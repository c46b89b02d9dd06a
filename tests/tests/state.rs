//! Live state end to end: the router subscribes to a real engine's KV events over ZeroMQ and
//! polls its load, and both show in `/admin/state` and `/metrics`.

use router_e2e::{Engine, Http, Router, chat_body, kv_blocks};
use router_test_support::eventually;

#[tokio::test]
async fn kv_events_and_load_reports_reach_the_router() {
    let engine = Engine::start(
        "m",
        &["--kv-events", "tcp://127.0.0.1:0", "--kv-replay", "tcp://127.0.0.1:0"],
    );
    let yaml = format!(
        r#"server: {{port: 0, admin_token: t}}
models:
  - id: m
    workers:
      - id: e1
        url: "{url}"
        load_poll: {{interval_ms: 50}}
        kv_events: {{endpoint: "{events}", replay_endpoint: "{replay}", block_size: 16}}
    buckets:
      - id: all
        groups: {{plain: {{policy: {{type: power_of_two}}}}}}
"#,
        url = engine.url,
        events = engine.kv_events(),
        replay = engine.kv_replay(),
    );
    let router = Router::with_config(&yaml);
    let http = Http::default();

    let ready =
        |w: &serde_json::Value| w["kv"]["subscribed"] == true && w["load"]["freshness"] == "fresh";
    router.wait_for_workers(&http, "t", "a KV subscription and a fresh polled load", ready).await;

    let long_prompt = "the same long system prompt ".repeat(40);
    let reply = http.chat(&router.url, &chat_body("m", &long_prompt, 2), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    eventually("the prompt's blocks in the index", async || {
        kv_blocks(&http, &router, "t", "e1").await > 0
    })
    .await;
    let state = router.admin_state(&http, "t").await;
    let blocks = state["workers"][0]["kv"]["blocks"].as_u64().unwrap_or(0);
    assert!(blocks >= 60, "the prompt's blocks are indexed: {state}");
    assert!(state["index"]["nodes"].as_u64().unwrap_or(0) >= blocks, "{state}");
    assert_eq!(state["index"]["local"], true, "{state}");
    assert_eq!(state["workers"][0]["kv"]["gaps"], 0);

    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    assert!(metrics.contains("router_kv_index_nodes"), "{metrics}");
    assert!(
        metrics.contains(r#"router_load_report_state{worker="e1",state="fresh"} 1"#),
        "{metrics}"
    );
}
