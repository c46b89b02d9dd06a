//! Under an open-loop load of a real trace, predicted_ttft has a shorter tail than round robin:
//! both replay the same conversation slice at offered load 0.85 on fresh router-sim fleets,
//! alternated inside one run, and the order of their median p99 is asserted, never a time. A
//! binary of its own, so that no other test shares the machine with the replays.

use std::path::PathBuf;
use std::process::Command;

use router_e2e::{ADMIN_TOKEN, Http, Router, binary, kv_engines, kv_router_yaml};

/// The engines' prefill rate. Slow enough that simulated queueing, not the debug build's own
/// overhead on a busy machine, decides the tail.
const PREFILL_TOKENS_PER_SEC: &str = "8000";

/// `router-sim load --json` on a slice of the conversation trace at offered load 0.85 on a
/// fresh fleet of 4 engines running `policy`.
fn loaded_replay(policy: &str) -> serde_json::Value {
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let trace = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../crates/router-sim/tests/data/conversation_trace_head200.jsonl");
    let fleet = kv_engines(
        4,
        &tokenizer,
        &["--kv-capacity-tokens", "16384", "--prefill-tokens-per-sec", PREFILL_TOKENS_PER_SEC],
    );
    let router = Router::with_config(&kv_router_yaml(&fleet, &tokenizer, policy));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(router.wait_until_ready(&Http::default(), ADMIN_TOKEN));
    let output = Command::new(binary("router-sim"))
        .args(["load", "--target", &router.url, "--model", "m", "--json"])
        .args(["--trace", &trace.display().to_string(), "--trace-length-scale", "0.0625"])
        .args(["--tokenizer", &tokenizer, "--fleet-capacity-tokens", "65536"])
        .args(["--offered-load", "0.85", "--engines", "4"])
        .args(["--prefill-tokens-per-sec", PREFILL_TOKENS_PER_SEC])
        .output()
        .expect("router-sim load runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().expect("a report");
    serde_json::from_str(last).expect("json report")
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[test]
fn under_load_predicted_ttft_beats_round_robins_tail() {
    const POLICIES: [&str; 2] = ["{type: round_robin}", "{type: predicted_ttft}"];
    // Alternated, so that a noisy moment on the machine is shared.
    let mut runs = Vec::new();
    for _ in 0..3 {
        for policy in POLICIES {
            runs.push((policy, loaded_replay(policy)));
        }
    }
    let p99 = |wanted: &str| -> Vec<f64> {
        runs.iter()
            .filter(|(policy, _)| *policy == wanted)
            .map(|(_, report)| {
                assert_eq!(report["errors"], 0, "{report}");
                report["ttft_p99_ms"].as_f64().expect("p99")
            })
            .collect()
    };
    let (rr, pt) = (p99(POLICIES[0]), p99(POLICIES[1]));
    assert!(
        median(pt.clone()) < median(rr.clone()),
        "predicted_ttft's median p99 {pt:?} below round_robin's {rr:?}"
    );
}
