use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;

use crate::common::*;

async fn run_load(args: &[&str]) -> (Vec<String>, Value) {
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(BIN)
            .arg("load")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .output(),
    )
    .await
    .expect("load finishes in time")
    .expect("load runs");
    assert!(output.status.success(), "exit {:?}", output.status);
    let stdout = String::from_utf8(output.stdout).expect("utf-8");
    let lines: Vec<String> = stdout.lines().map(str::to_owned).collect();
    let json =
        serde_json::from_str(lines.last().expect("a last line")).expect("the last line is JSON");
    (lines, json)
}

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
    assert_eq!(json["requests"], 9);
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
    assert_eq!(json["requests"], 4);
    assert_eq!(json["errors"], 4);
    assert_eq!(json["error_kinds"]["status_500"], 4);
    assert_eq!(json["ttft_p50_ms"], Value::Null, "no successful request, no latency");
}

#[tokio::test]
async fn trace_replay_reports_the_oracle() {
    let path =
        std::env::temp_dir().join(format!("router-sim-e2e-trace-{}.jsonl", std::process::id()));
    let trace = [
        r#"{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}"#,
        r#"{"timestamp": 10, "input_length": 1100, "output_length": 3, "hash_ids": [0, 1, 2]}"#,
        r#"{"timestamp": 20, "input_length": 900, "output_length": 3, "hash_ids": [0, 3]}"#,
        r#"{"timestamp": 30, "input_length": 500, "output_length": 3, "hash_ids": [4]}"#,
    ];
    std::fs::write(&path, trace.join("\n")).expect("write trace");
    let sim = Sim::start(&[]).await;
    let (_, json) = run_load(&[
        "--target",
        sim.url(),
        "--model",
        "m",
        "--trace",
        path.to_str().expect("utf-8"),
        "--time-scale",
        "0.5",
        "--max-requests",
        "3",
        "--json",
    ])
    .await;
    std::fs::remove_file(&path).expect("cleanup");
    assert_eq!(json["requests"], 3);
    assert_eq!(json["errors"], 0);
    // Hash blocks: 2 new, then 2 of 3 seen, then 1 of 2 seen.
    assert_eq!(json["oracle_hit_rate"].as_f64(), Some(3.0 / 7.0));
    // What the engine reuses depends on arrival order versus prefill; only its range is fixed.
    assert!(json["cache_hit_rate"].as_f64().is_some_and(|r| (0.0..1.0).contains(&r)), "{json}");
    assert!(json["prompt_tokens"].as_u64().is_some_and(|p| p > 600 + 1100 + 900), "{json}");
}
