//! The workload generator against one engine: session mode reports cache hits, rate mode
//! counts its errors.

use serde_json::Value;

use crate::common::*;

#[tokio::test]
async fn sessions_against_one_engine_report_hits_and_no_share() {
    let sim = Sim::start(&[]).await;
    let (lines, json) = run_load(&[
        "--target",
        sim.url(),
        "--model",
        "m",
        "--sessions",
        "3",
        "--turns",
        "3",
        "--system-prompt-tokens",
        "256",
        "--turn-tokens",
        "32",
        "--output-tokens",
        "8",
        "--concurrency",
        "2",
        "--session-header",
        "x-session-id",
        "--json",
    ])
    .await;
    assert!(lines.iter().any(|l| l.starts_with("requests 9")), "{lines:?}");
    assert_eq!((json["sent"].as_u64(), json["requests"].as_u64()), (Some(9), Some(9)));
    assert_eq!(json["errors"], 0);
    assert!(json["throughput_rps"].as_f64().is_some_and(|r| r > 0.0));
    let (p50, p99) =
        (json["ttft_p50_ms"].as_f64().expect("p50"), json["ttft_p99_ms"].as_f64().expect("p99"));
    assert!(p50 > 0.0 && p99 >= p50);
    // Later turns reuse their history and sessions share system prompts.
    let rate = json["cache_hit_rate"].as_f64().expect("rate");
    assert!(rate > 0.3 && rate < 1.0, "{rate}");
    assert_eq!(
        json["cached_tokens"].as_f64().expect("cached")
            / json["prompt_tokens"].as_f64().expect("prompt"),
        rate
    );
    assert_eq!(json["engine_share"], serde_json::json!({}), "an engine sets no x-router-engine");
}

#[tokio::test]
async fn rate_mode_and_errors_are_counted() {
    let sim = Sim::start(&["--fail-rate", "1"]).await;
    let (_, json) = run_load(&[
        "--target",
        sim.url(),
        "--model",
        "m",
        "--sessions",
        "2",
        "--turns",
        "2",
        "--rate",
        "50",
        "--json",
    ])
    .await;
    assert_eq!(json["sent"], 4);
    assert_eq!(json["requests"], 4);
    assert_eq!(json["errors"], 4);
    assert_eq!(json["error_kinds"]["status_500"], 4);
    assert_eq!(json["ttft_p50_ms"], Value::Null, "no successful request, no latency");
}
