//! A slice of a real production trace (Mooncake FAST'25, conversation) replayed through
//! router-server onto router-sim engines by `router-sim load --trace`, with its accounting
//! checked: every request sent is answered or counted as an error, and the measured cache hit
//! rate never exceeds what one unlimited cache could reach.

use std::path::PathBuf;
use std::process::Command;

use router_e2e::{ADMIN_TOKEN, Engine, Http, Router, binary};

#[tokio::test]
async fn a_trace_slice_replays_through_the_router_with_consistent_accounting() {
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let trace = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../crates/router-sim/tests/data/conversation_trace_head200.jsonl");
    let engines: Vec<Engine> = (0..3)
        .map(|_| {
            Engine::start(
                "m",
                &[
                    "--tokenizer",
                    &tokenizer,
                    "--kv-events",
                    "tcp://127.0.0.1:0",
                    "--kv-capacity-tokens",
                    "32768",
                    "--decode-tokens-per-sec",
                    "20000",
                ],
            )
        })
        .collect();
    let workers: String = engines
        .iter()
        .enumerate()
        .map(|(i, e)| {
            format!(
                "      - {{id: e{}, url: \"{}\", kv_events: {{endpoint: \"{}\"}}}}\n",
                i + 1,
                e.url,
                e.kv_events()
            )
        })
        .collect();
    let router = Router::with_config(&format!(
        "server: {{port: 0, admin_token: {ADMIN_TOKEN}}}\nmodels:\n  - id: m\n    tokenizer: \"{tokenizer}\"\n    workers:\n{workers}    buckets:\n      \
         - id: all\n        groups: {{plain: {{policy: {{type: cache_aware, cache_affinity_min_matched_tokens: 64}}}}}}\n"
    ));
    router.wait_until_ready(&Http::default(), ADMIN_TOKEN).await;

    let output = tokio::task::spawn_blocking(move || {
        Command::new(binary("router-sim"))
            .args(["load", "--target", &router.url, "--model", "m", "--json"])
            .args(["--trace", &trace.display().to_string(), "--max-requests", "40"])
            .args([
                "--time-scale",
                "50",
                "--trace-length-scale",
                "0.0625",
                "--tokenizer",
                &tokenizer,
            ])
            .args(["--fleet-capacity-tokens", "98304"])
            .output()
            .expect("router-sim load runs")
    })
    .await
    .expect("join");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report: serde_json::Value =
        serde_json::from_str(stdout.lines().last().expect("a last line")).expect("JSON");
    let number = |key: &str| report[key].as_f64().unwrap_or_else(|| panic!("{key} in {report}"));
    assert_eq!(number("sent"), 40.0, "{report}");
    assert_eq!(number("requests"), number("ok") + number("errors"), "{report}");
    assert_eq!(number("sent"), number("requests"), "every request sent was accounted: {report}");
    assert_eq!(number("errors"), 0.0, "{report}");
    let hit = number("cache_hit_rate");
    assert!(hit > 0.0, "the trace reuses prefixes: {report}");
    assert!(hit <= number("oracle_hit_rate") + 1e-9, "never above the unlimited oracle: {report}");
    assert!(number("oracle_fleet_hit_rate") <= number("oracle_hit_rate") + 1e-9, "{report}");
    let shares = report["engine_share"].as_object().map(|m| m.len()).unwrap_or(0);
    assert!(shares >= 1, "{report}");
}
