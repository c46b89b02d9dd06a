//! Real production traces: a slice of each Mooncake FAST'25 trace replayed through every
//! policy on a fresh fleet, with the hit rate compared to the trace's own oracles (one
//! unlimited cache, and one cache of the fleet's total capacity).

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde_json::Value;

use super::policies::{Fleet, Workload, load_json};
use super::procs::Bins;

/// Replay sizes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Replay {
    pub(crate) max_requests: usize,
    pub(crate) time_scale: f64,
    pub(crate) length_scale: f64,
}

impl Replay {
    pub(crate) fn full() -> Self {
        Self { max_requests: 1000, time_scale: 10.0, length_scale: 0.0625 }
    }

    pub(crate) fn quick() -> Self {
        Self { max_requests: 60, time_scale: 40.0, length_scale: 0.0625 }
    }
}

/// The fleet the traces are replayed on: smaller caches than the chat workload's, so that
/// where a prefix lives matters.
pub(crate) fn fleet() -> Workload {
    Workload {
        kv_capacity_tokens: 16_384,
        prefill_tokens_per_sec: 20_000,
        decode_tokens_per_sec: 400,
        ..Workload::full()
    }
}

/// One policy on one trace.
#[derive(Debug)]
pub(crate) struct TraceRun {
    pub(crate) trace: String,
    pub(crate) policy: String,
    pub(crate) report: Value,
}

impl TraceRun {
    pub(crate) fn number(&self, key: &str) -> f64 {
        self.report[key].as_f64().unwrap_or(f64::NAN)
    }
}

/// The traces: the full files from the shared data folder beside the checkout when present,
/// else the 200-request slices router-sim's tests carry.
pub(crate) fn traces(root: &Path) -> Vec<(String, PathBuf)> {
    let shared = root.join("../shared/data/mooncake");
    let local = root.join("crates/router-sim/tests/data");
    ["conversation", "synthetic"]
        .iter()
        .map(|name| {
            let full = shared.join(format!("{name}_trace.jsonl"));
            let path = if full.exists() {
                full
            } else {
                local.join(format!("{name}_trace_head200.jsonl"))
            };
            ((*name).to_owned(), path)
        })
        .collect()
}

/// Replays `trace` through `policy` on a fresh fleet.
pub(crate) fn run(
    bins: &Bins,
    trace: &(String, PathBuf),
    policy: &str,
    replay: &Replay,
    tokenizer: &str,
) -> Result<TraceRun> {
    let workload = fleet();
    let fleet_handle = Fleet::start(bins, policy, &workload, tokenizer)?;
    let capacity = workload.kv_capacity_tokens * workload.engines;
    let args: Vec<String> = [
        "load",
        "--target",
        &fleet_handle.url,
        "--model",
        "m",
        "--trace",
        &trace.1.display().to_string(),
        "--time-scale",
        &replay.time_scale.to_string(),
        "--max-requests",
        &replay.max_requests.to_string(),
        "--trace-length-scale",
        &replay.length_scale.to_string(),
        "--tokenizer",
        tokenizer,
        "--fleet-capacity-tokens",
        &capacity.to_string(),
        "--session-header",
        "x-session-id",
        "--json",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let report = load_json(bins, &args)?;
    drop(fleet_handle);
    Ok(TraceRun { trace: trace.0.clone(), policy: policy.to_owned(), report })
}
