//! Trace replay (`router-sim load --trace`) against one real engine: the accounting (sent =
//! answered + errors), the oracle counting what the engine counts, and the measured hit rate
//! never above the oracle's; an offered-load replay, its bounds and its per-request lines.

use std::path::PathBuf;

use serde_json::Value;

use crate::common::*;

fn data(file: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(file)
        .to_str()
        .expect("utf-8 path")
        .to_owned()
}

fn shipped_tokenizer() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("assets/tokenizer.json")
        .to_str()
        .expect("utf-8 path")
        .to_owned()
}

fn u64_of(json: &Value, key: &str) -> u64 {
    json[key].as_u64().unwrap_or_else(|| panic!("{key} in {json}"))
}

fn f64_of(json: &Value, key: &str) -> f64 {
    json[key].as_f64().unwrap_or_else(|| panic!("{key} in {json}"))
}

/// Checks a replay whose every request was answered, against one engine that never evicts.
fn check_replay(json: &Value, requests: u64) {
    assert_eq!(u64_of(json, "sent"), requests, "{json}");
    assert_eq!(u64_of(json, "requests"), requests, "every request sent finished: {json}");
    assert_eq!(u64_of(json, "ok") + u64_of(json, "errors"), u64_of(json, "sent"));
    assert_eq!(u64_of(json, "errors"), 0, "{json}");
    // The oracle tokenizes each prompt exactly as the engine did.
    assert_eq!(u64_of(json, "prompt_tokens"), u64_of(json, "oracle_prompt_tokens"), "{json}");
    // So the rates share their denominator and compare as token counts.
    let (cached, oracle) = (u64_of(json, "cached_tokens"), u64_of(json, "oracle_cached_tokens"));
    assert!(cached <= oracle, "measured {cached} cached tokens above the oracle's {oracle}");
    assert!(f64_of(json, "cache_hit_rate") <= f64_of(json, "oracle_hit_rate"), "{json}");
    assert!(cached > 0, "the engine reused shared prefixes: {json}");
}

#[tokio::test]
async fn replays_of_mooncake_slices_never_beat_the_oracle() {
    for (file, requests) in
        [("conversation_trace_head200.jsonl", 150), ("synthetic_trace_head200.jsonl", 120)]
    {
        // A KV capacity far above the slice's tokens: the engine never evicts.
        let sim = Sim::start(&["--kv-capacity-tokens", "100000000", "--max-running", "256"]).await;
        let max_requests = requests.to_string();
        let (lines, json) = run_load(&[
            "--target",
            sim.url(),
            "--model",
            "m",
            "--trace",
            &data(file),
            "--trace-length-scale",
            "0.125",
            "--time-scale",
            "25",
            "--max-requests",
            &max_requests,
            "--fleet-capacity-tokens",
            "16384",
            "--duration",
            "50",
            "--json",
        ])
        .await;
        check_replay(&json, requests);
        let fleet = f64_of(&json, "oracle_fleet_hit_rate");
        assert!(fleet <= f64_of(&json, "oracle_hit_rate"), "{json}");
        assert_eq!(u64_of(&json, "fleet_capacity_tokens"), 16384);
        assert!(
            lines.iter().any(|l| l.starts_with("oracle hit rate ")
                && l.contains("fleet oracle")
                && l.contains("one LRU cache of 16384 tokens")),
            "{lines:?}"
        );
    }
}

#[tokio::test]
async fn replays_with_a_tokenizer_file_count_its_tokens() {
    let tokenizer = shipped_tokenizer();
    let sim = Sim::start(&["--kv-capacity-tokens", "100000000", "--tokenizer", &tokenizer]).await;
    let (_, json) = run_load(&[
        "--target",
        sim.url(),
        "--model",
        "m",
        "--trace",
        &data("conversation_trace_head200.jsonl"),
        "--trace-length-scale",
        "0.0625",
        "--time-scale",
        "25",
        "--max-requests",
        "40",
        "--tokenizer",
        &tokenizer,
        "--json",
    ])
    .await;
    check_replay(&json, 40);
    assert_eq!(json["oracle_fleet_hit_rate"], Value::Null, "no fleet capacity given");
}

#[tokio::test]
async fn the_oracle_counts_the_chat_template_framing_and_times_are_divided() {
    let path =
        std::env::temp_dir().join(format!("router-sim-e2e-trace-{}.jsonl", std::process::id()));
    let trace = [
        r#"{"timestamp": 0, "input_length": 100, "output_length": 3, "hash_ids": [0, 1]}"#,
        r#"{"timestamp": 1000, "input_length": 150, "output_length": 3, "hash_ids": [0, 1, 2]}"#,
        r#"{"timestamp": 2000, "input_length": 10, "output_length": 3, "hash_ids": [5]}"#,
        r#"{"timestamp": 3000, "input_length": 10, "output_length": 3, "hash_ids": [6]}"#,
    ];
    std::fs::write(&path, trace.join("\n")).expect("write trace");
    let sim = Sim::start(&[]).await;
    // Divided by 10, the last request goes at 200 ms; multiplied, it would miss the 10 s limit.
    let (lines, json) = run_load(&[
        "--target",
        sim.url(),
        "--model",
        "m",
        "--trace",
        path.to_str().expect("utf-8"),
        "--trace-block-tokens",
        "64",
        "--time-scale",
        "10",
        "--max-requests",
        "3",
        "--duration",
        "10",
        "--json",
    ])
    .await;
    std::fs::remove_file(&path).expect("cleanup");
    assert_eq!((u64_of(&json, "sent"), u64_of(&json, "ok")), (3, 3), "{json}");
    assert!(f64_of(&json, "duration_s") >= 0.2, "the last request waited for its time");
    // Prompts of 150, 200 and 60 tokens. The second reuses the first's framing and whole
    // text (7 blocks of 16); the third shares only `<|im_start|>user`, the first block of
    // every prompt, which an id-based count would miss.
    assert_eq!(u64_of(&json, "oracle_prompt_tokens"), 410);
    assert_eq!(u64_of(&json, "prompt_tokens"), 410);
    assert_eq!(u64_of(&json, "oracle_cached_tokens"), 128);
    assert!(u64_of(&json, "cached_tokens") <= 128, "{json}");
    assert!(
        lines.iter().any(
            |l| l == "oracle hit rate 0.312 (one unlimited cache), over 410 prompt tokens sent"
        ),
        "{lines:?}"
    );
}

/// The engine's prefill speed in the offered-load replay, and the fleet speed it is told.
const PREFILL_TOKENS_PER_SEC: &str = "200000";

#[tokio::test]
async fn an_offered_load_replay_reports_its_bounds() {
    let sim = Sim::start(&[
        "--kv-capacity-tokens",
        "100000000",
        "--max-running",
        "256",
        "--prefill-tokens-per-sec",
        PREFILL_TOKENS_PER_SEC,
    ])
    .await;
    let records_path =
        std::env::temp_dir().join(format!("router-sim-e2e-requests-{}.jsonl", std::process::id()));
    let (lines, json) = run_load(&[
        "--target",
        sim.url(),
        "--model",
        "m",
        "--trace",
        &data("conversation_trace_head200.jsonl"),
        "--trace-length-scale",
        "0.125",
        "--max-requests",
        "150",
        "--fleet-capacity-tokens",
        "16384",
        "--offered-load",
        "0.5",
        "--engines",
        "1",
        "--prefill-tokens-per-sec",
        PREFILL_TOKENS_PER_SEC,
        "--duration",
        "50",
        "--requests-out",
        records_path.to_str().expect("utf-8 path"),
        "--json",
    ])
    .await;
    check_replay(&json, 150);
    let records = std::fs::read_to_string(&records_path).expect("the requests were written");
    std::fs::remove_file(&records_path).expect("removed");
    check_records(&records, &json, 150);
    let bounds = &json["bounds"];
    let (lru, belady, unlimited) = (
        f64_of(bounds, "hit_rate_fleet_lru"),
        f64_of(bounds, "hit_rate_belady"),
        f64_of(bounds, "hit_rate_unlimited"),
    );
    assert!(lru <= belady && belady <= unlimited, "{bounds}");
    assert_eq!(lru, f64_of(&json, "oracle_fleet_hit_rate"));
    assert_eq!(unlimited, f64_of(&json, "oracle_hit_rate"));
    // No engine answers sooner than its uncached prompt at the engine's prefill speed.
    let floor = &bounds["ttft_floor_ms"];
    let (p50, p90, p99) = (f64_of(floor, "p50"), f64_of(floor, "p90"), f64_of(floor, "p99"));
    assert!(p50 <= p90 && p90 <= p99, "{floor}");
    assert!(p99 <= f64_of(&json, "ttft_p99_ms"), "{json}");
    assert!(f64_of(&json, "ttft_p90_ms") <= f64_of(&json, "ttft_p99_ms"), "{json}");
    // Every request was sent, so the load as replayed is the load asked for.
    let offered = f64_of(bounds, "offered_load");
    assert!((offered - 0.5).abs() < 0.01, "{bounds}");
    assert!(f64_of(&json, "time_scale") > 0.0, "{json}");
    assert!(
        lines.iter().any(|l| l.starts_with("offered load 0.50: time scale ")
            && l.ends_with(" s of trace)")),
        "{lines:?}"
    );
    assert!(lines.iter().any(|l| l.starts_with("bounds: hit rate unlimited ")), "{lines:?}");
    assert_eq!(json["uncached_share_max_over_mean"], Value::Null, "no router, no engine header");
}

/// Checks the `--requests-out` lines of a replay of `requests` whose report is `json`, against
/// one engine that never evicts.
fn check_records(records: &str, json: &Value, requests: usize) {
    let records: Vec<Value> = records
        .lines()
        .map(|line| serde_json::from_str(line).expect("each line is JSON"))
        .collect();
    assert_eq!(records.len(), requests, "one line per request sent");
    let speed: f64 = PREFILL_TOKENS_PER_SEC.parse().expect("a prefill speed");
    let (mut cached, mut prompt, mut unlimited) = (0, 0, 0);
    for (index, record) in records.iter().enumerate() {
        assert_eq!(u64_of(record, "index"), index as u64, "in trace order: {record}");
        assert_eq!(record["error"], Value::Null, "{record}");
        // The oracle's prompt is the engine's.
        assert_eq!(u64_of(record, "prompt_tokens"), u64_of(record, "usage_prompt_tokens"));
        let hit = u64_of(record, "cached_tokens");
        unlimited += u64_of(record, "unlimited_hit_tokens");
        let (lru, belady) =
            (u64_of(record, "fleet_lru_hit_tokens"), u64_of(record, "belady_hit_tokens"));
        assert!(lru <= u64_of(record, "unlimited_hit_tokens"), "{record}");
        assert!(belady <= u64_of(record, "unlimited_hit_tokens"), "{record}");
        // The floor is the prompt the unlimited cache misses at the engine's prefill speed (the
        // measured TTFT is compared with it by percentile, in the report: a request can reach
        // the engine after a later one sent at the same instant and hit what that one cached).
        let missed = u64_of(record, "prompt_tokens") - u64_of(record, "unlimited_hit_tokens");
        let floor = missed as f64 * 1000.0 / speed;
        assert!((f64_of(record, "floor_ms") - floor).abs() < 1e-6, "{record}");
        assert!(f64_of(record, "latency_ms") >= f64_of(record, "ttft_ms"), "{record}");
        if index > 0 {
            assert!(f64_of(record, "sent_ms") >= f64_of(&records[index - 1], "sent_ms"));
        }
        cached += hit;
        prompt += u64_of(record, "prompt_tokens");
    }
    // The engine hits no more than the unlimited cache allows, over the whole replay: requests
    // sent at one instant may reach it in either order, so a later one's prefix can be cached
    // when an earlier one arrives, but a cache that never evicts holds the same blocks at the
    // end whatever the order, so its hits add up alike.
    assert!(cached <= unlimited, "{cached} cached, {unlimited} for the unlimited cache");
    // The lines add up to the report.
    assert_eq!(cached, u64_of(json, "cached_tokens"), "{json}");
    assert_eq!(prompt, u64_of(json, "prompt_tokens"), "{json}");
}

#[tokio::test]
async fn a_requests_file_that_cannot_be_written_is_refused_before_the_replay() {
    let output = tokio::process::Command::new(BIN)
        .args(["load", "--target", "http://127.0.0.1:9", "--model", "m", "--trace"])
        .arg(data("conversation_trace_head200.jsonl"))
        .args(["--requests-out", "/nonexistent-dir/requests.jsonl"])
        .output()
        .await
        .expect("load runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("cannot write the requests to /nonexistent-dir/requests.jsonl"),
        "{stderr}"
    );
    // Refused before the replay: no report.
    assert!(output.stdout.is_empty(), "{}", String::from_utf8_lossy(&output.stdout));
}

#[tokio::test]
async fn an_offered_load_without_the_fleet_oracle_is_refused_naming_the_flag() {
    let output = tokio::process::Command::new(BIN)
        .args(["load", "--target", "http://127.0.0.1:9", "--model", "m", "--trace"])
        .arg(data("conversation_trace_head200.jsonl"))
        .args(["--offered-load", "0.5", "--engines", "1", "--prefill-tokens-per-sec", "1000"])
        .output()
        .await
        .expect("load runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--offered-load needs --fleet-capacity-tokens"), "{stderr}");
}
