//! Predicted-TTFT selection end to end on router-sim fleets: a burst of siblings sharing a new
//! prefix stays on the engine the first one went to (predicted entries, before any KV event)
//! until the queue it builds there makes another engine faster; and under an open-loop load of
//! a real trace it beats round robin's tail, compared inside one run.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use router_e2e::{Engine, Http, Router, binary, chat_body, kv_engines, kv_workers_yaml};

fn router_yaml(engines: &[Engine], tokenizer: &str, policy: &str) -> String {
    let workers = kv_workers_yaml(engines);
    format!(
        "server: {{port: 0}}\nload: {{report_interval_ms: 50}}\nmodels:\n  - id: m\n    tokenizer: \"{tokenizer}\"\n    workers:\n{workers}    buckets:\n      \
         - id: all\n        groups: {{plain: {{policy: {policy}}}}}\n"
    )
}

#[tokio::test]
async fn a_burst_of_siblings_stays_on_one_engine_until_its_queue_makes_another_faster() {
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    // Slow prefill: the first sibling's prefill outlasts the whole burst, so no KV event can
    // tell the router where the prefix is going before the burst is placed.
    let fleet = kv_engines(4, &tokenizer, &["--prefill-tokens-per-sec", "4000"]);
    let policy = "{type: predicted_ttft, default_prefill_tokens_per_sec: 4000}";
    let router = Router::with_config(&router_yaml(&fleet, &tokenizer, policy));
    tokio::time::sleep(Duration::from_millis(400)).await;

    let http = Http::default();
    let prefix = "You are a careful assistant. Here is a long shared document to read. ".repeat(24);
    let send = |i: usize| {
        let (http, url, body) = (
            http.clone(),
            router.url.clone(),
            chat_body("m", &format!("{prefix} Question {i}: what does part {i} say?"), 1),
        );
        tokio::spawn(async move {
            let reply = http.chat(&url, &body, &[]).await;
            assert_eq!(reply.status, 200, "{}", reply.body);
            let prompt = reply.json()["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
            (reply.header("x-router-engine").expect("engine").to_owned(), prompt)
        })
    };
    let first = send(0);
    // Let a load report show the first sibling in its prefill (no longer waiting).
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut rest = Vec::new();
    for i in 1..=14 {
        rest.push(send(i));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (home, prompt) = first.await.expect("first");
    assert!(prompt > 400, "a long shared prefix: {prompt} prompt tokens");
    let mut served = Vec::new();
    for task in rest {
        served.push(task.await.expect("sibling").0);
    }
    assert!(
        served[..3].iter().all(|e| *e == home),
        "the first siblings follow the prefix to {home} before any KV event: {served:?}"
    );
    assert!(
        served.iter().any(|e| *e != home),
        "once its queue is longer than a recompute elsewhere, the prefix spreads: {served:?}"
    );
    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    assert!(
        metrics.lines().any(|l| l.starts_with("router_picks_total")
            && l.contains("policy=\"predicted_ttft\"")
            && l.contains("reason=\"predicted_ttft\"")),
        "picks counted with their reason: {metrics}"
    );
}

#[tokio::test]
async fn a_streamed_pick_reports_predicted_against_observed_ttft() {
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let fleet = kv_engines(2, &tokenizer, &[]);
    let router = Router::with_config(&router_yaml(&fleet, &tokenizer, "{type: predicted_ttft}"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let http = Http::default();
    let mut body = chat_body("m", "Tell me a story about a lighthouse keeper.", 4);
    body["stream"] = true.into();
    let reply = http.chat(&router.url, &body, &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply.body.contains("data: [DONE]"), "{}", reply.body);
    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    for name in [
        "router_predicted_ttft_seconds_count",
        "router_observed_ttft_seconds_count",
        "router_ttft_observed_over_predicted_ratio_count",
    ] {
        assert!(
            metrics.lines().any(|l| l.starts_with(name) && l.ends_with(" 1")),
            "{name} once: {metrics}"
        );
    }
}

/// `router-sim load --json` on a slice of the conversation trace at offered load 0.85 on a
/// fresh fleet of 4 engines running `policy`.
fn loaded_replay(policy: &str) -> serde_json::Value {
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let trace = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../crates/router-sim/tests/data/conversation_trace_head200.jsonl");
    let fleet = kv_engines(
        4,
        &tokenizer,
        &["--kv-capacity-tokens", "16384", "--prefill-tokens-per-sec", "20000"],
    );
    let router = Router::with_config(&router_yaml(&fleet, &tokenizer, policy));
    std::thread::sleep(Duration::from_millis(400));
    let output = Command::new(binary("router-sim"))
        .args(["load", "--target", &router.url, "--model", "m", "--json"])
        .args(["--trace", &trace.display().to_string(), "--trace-length-scale", "0.0625"])
        .args(["--tokenizer", &tokenizer, "--fleet-capacity-tokens", "65536"])
        .args(["--offered-load", "0.85", "--engines", "4", "--prefill-tokens-per-sec", "20000"])
        .output()
        .expect("router-sim load runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().expect("a report");
    serde_json::from_str(last).expect("json report")
}

#[tokio::test]
async fn under_load_predicted_ttft_beats_round_robins_tail() {
    let runs = tokio::task::spawn_blocking(|| {
        // Alternated, so that a noisy moment on the machine is shared.
        let mut runs = Vec::new();
        for _ in 0..2 {
            for policy in ["{type: round_robin}", "{type: predicted_ttft}"] {
                runs.push((policy, loaded_replay(policy)));
            }
        }
        runs
    })
    .await
    .expect("replays");
    let p99 = |wanted: &str| -> Vec<f64> {
        runs.iter()
            .filter(|(policy, _)| *policy == wanted)
            .map(|(_, report)| {
                assert_eq!(report["errors"], 0, "{report}");
                report["ttft_p99_ms"].as_f64().expect("p99")
            })
            .collect()
    };
    let (rr, pt) = (p99("{type: round_robin}"), p99("{type: predicted_ttft}"));
    let best = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    assert!(best(&pt) < best(&rr), "predicted_ttft p99 {pt:?} below round_robin's {rr:?}");
}
