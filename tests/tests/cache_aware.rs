//! Cache-aware selection end to end: engines publish the blocks they cache over ZeroMQ, the
//! router (or a separate kv-indexer process) indexes them, and requests sharing a prefix go
//! where it is cached.

use std::time::Duration;

use router_e2e::tempfile_path::TempPath;
use router_e2e::{Engine, Http, Process, Router, chat_body, kv_engines, kv_workers_yaml};

fn router_yaml(engines: &[Engine], tokenizer: &str, policy_extra: &str) -> String {
    router_yaml_with(&kv_workers_yaml(engines), tokenizer, policy_extra)
}

fn router_yaml_with(workers: &str, tokenizer: &str, policy_extra: &str) -> String {
    format!(
        "server: {{port: 0, admin_token: t}}\nmodels:\n  - id: m\n    tokenizer: \"{tokenizer}\"\n    workers:\n{workers}    buckets:\n      \
         - id: all\n        groups: {{plain: {{policy: {{type: cache_aware, cache_affinity_min_matched_tokens: 64{policy_extra}}}}}}}\n"
    )
}

/// The value of the `/metrics` sample whose line starts with `series` (name and labels).
fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
}

/// Sends one request with a long shared prefix, then more with the same prefix, and returns
/// the engines that served them.
/// A first request with a shared prefix of `repeats` sentences, then six follow-ups.
async fn follow_ups(router: &str, repeats: usize) -> (String, Vec<String>) {
    let http = Http::default();
    let prefix = "You are a careful assistant. Here is a long shared document. ".repeat(repeats);
    let first =
        http.chat(router, &chat_body("m", &format!("{prefix} Question zero?"), 1), &[]).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let home = first.header("x-router-engine").expect("engine").to_owned();
    // Give the engine's BlockStored events time to reach the index.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut served = Vec::new();
    for i in 1..=6 {
        let reply =
            http.chat(router, &chat_body("m", &format!("{prefix} Question {i}?"), 1), &[]).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let cached =
            reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
        assert!(cached > 500, "the prefix was served from cache: {}", reply.body);
        served.push(reply.header("x-router-engine").expect("engine").to_owned());
    }
    (home, served)
}

#[tokio::test]
async fn requests_sharing_a_prefix_go_where_it_is_cached() {
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let fleet = kv_engines(4, &tokenizer, &[]);
    let router = Router::with_config(&router_yaml(&fleet, &tokenizer, ""));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (home, served) = follow_ups(&router.url, 20).await;
    assert!(served.iter().all(|e| *e == home), "all follow-ups on {home}: {served:?}");
    let metrics = Http::default().get(&router.url, "/metrics", &[]).await.body;
    let hits = metrics
        .lines()
        .find(|l| l.starts_with("router_picks_total") && l.contains("reason=\"cache_hit\""))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(hits >= 6.0, "cache hits counted: {metrics}");
    // The local source's lookups: the first request missed, the follow-ups found the prefix.
    let found = r#"router_cache_lookups_total{source="local",outcome="found"}"#;
    assert!(sample(&metrics, found) >= 6.0, "{metrics}");
    assert!(
        sample(&metrics, r#"router_cache_lookups_total{source="local",outcome="empty"}"#) >= 1.0
    );
    let matched = r#"router_cache_matched_tokens_count{source="local"}"#;
    assert!(sample(&metrics, matched) >= 7.0, "{metrics}");
    assert!(sample(&metrics, r#"router_cache_matched_tokens_sum{source="local"}"#) > 3000.0);
}

#[tokio::test]
async fn long_prompts_prepared_off_the_event_loop_route_the_same() {
    // About 18 KB of prompt: templated and tokenized on the blocking pool.
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let fleet = kv_engines(2, &tokenizer, &[]);
    let router = Router::with_config(&router_yaml(&fleet, &tokenizer, ""));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (home, served) = follow_ups(&router.url, 300).await;
    assert!(served.iter().all(|e| *e == home), "all follow-ups on {home}: {served:?}");
}

#[tokio::test]
async fn a_remote_indexer_process_serves_the_same_decisions() {
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let fleet = kv_engines(4, &tokenizer, &[]);
    let indexer_config = TempPath::write(
        "indexer.yaml",
        &format!(
            "models:\n  - id: m\n    workers:\n{}    buckets:\n      - id: all\n        groups: {{plain: {{}}}}\n",
            kv_workers_yaml(&fleet)
        ),
    );
    let indexer = Process::spawn(
        "router-server",
        &[
            "kv-indexer".into(),
            "--config".into(),
            indexer_config.display(),
            "--listen".into(),
            "127.0.0.1:0".into(),
        ],
        "kv indexer listening on ",
    );
    let addr = indexer.url_after("kv indexer listening on ");
    let extra = format!(
        ", cache_prefix_provider: indexer, kv_indexer_endpoint: \"{addr}\", kv_indexer_query_timeout_ms: 1000"
    );
    // The router's workers carry no KV events, only their block size: the indexer has the
    // events, the router neither subscribes nor keeps a tree.
    let workers: String = fleet
        .iter()
        .enumerate()
        .map(|(i, e)| {
            format!(
                "      - {{id: e{}, url: \"{}\", load_reporter: \"{}\", block_size: 16}}\n",
                i + 1,
                e.url,
                e.process.url_after("load reporter on ")
            )
        })
        .collect();
    let router = Router::with_config(&router_yaml_with(&workers, &tokenizer, &extra));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (home, served) = follow_ups(&router.url, 20).await;
    assert!(served.iter().all(|e| *e == home), "all follow-ups on {home}: {served:?}");

    let http = Http::default();
    let state = http.get(&router.url, "/admin/state", &[("authorization", "Bearer t")]).await;
    let state = state.json();
    assert_eq!(state["index"]["local"], false, "no local tree: {state}");
    assert_eq!(state["index"]["nodes"], 0, "{state}");
    for worker in state["workers"].as_array().expect("workers") {
        assert_eq!(worker["kv"]["subscribed"], false, "no subscription: {worker}");
        assert_eq!(worker["block_size"], 16, "{worker}");
    }
    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    let found = r#"router_cache_lookups_total{source="remote",outcome="found"}"#;
    assert!(sample(&metrics, found) >= 6.0, "{metrics}");
    for outcome in ["timeout", "busy", "unreachable"] {
        let series =
            format!(r#"router_cache_lookups_total{{source="remote",outcome="{outcome}"}}"#);
        assert_eq!(sample(&metrics, &series), 0.0, "{metrics}");
    }
    assert!(!metrics.contains(r#"source="local""#), "no local source: {metrics}");
    assert!(!metrics.contains("router_kv_index_nodes"), "no local index: {metrics}");
}
