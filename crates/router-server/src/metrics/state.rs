//! The state gauges, set when `/metrics` is scraped: each engine's in-flight count, health,
//! reported status, drain and admission, its load reports' freshness and its KV-event
//! counters, the prefix index's size, and each model's segment cache.

use metrics::{counter, gauge};
use router_workers::EngineStatus;

/// Router-local in-flight requests of an engine (set at scrape time).
pub(crate) fn inflight(worker: &str, count: u64) {
    gauge!("router_engine_inflight", "worker" => worker.to_owned()).set(count as f64);
}

/// Engine health as the router sees it (set at scrape time).
pub(crate) fn engine_healthy(worker: &str, healthy: bool) {
    gauge!("router_engine_healthy", "worker" => worker.to_owned()).set(if healthy {
        1.0
    } else {
        0.0
    });
}

/// The status an engine's load reports last stated: 1 for that status, 0 for the others
/// (set at scrape time).
pub(crate) fn engine_status(worker: &str, status: EngineStatus) {
    for candidate in EngineStatus::ALL {
        gauge!("router_engine_status", "worker" => worker.to_owned(), "status" => candidate.as_str())
            .set(if candidate == status { 1.0 } else { 0.0 });
    }
}

/// Whether the operator has drained an engine (set at scrape time).
pub(crate) fn engine_drained(worker: &str, drained: bool) {
    gauge!("router_engine_drained", "worker" => worker.to_owned()).set(if drained {
        1.0
    } else {
        0.0
    });
}

/// Whether an engine is a candidate for new requests (set at scrape time).
pub(crate) fn engine_accepting(worker: &str, accepting: bool) {
    gauge!("router_engine_accepting", "worker" => worker.to_owned()).set(if accepting {
        1.0
    } else {
        0.0
    });
}

/// Load-report freshness of an engine: 1 for the state it is in, 0 for the others.
pub(crate) fn load_freshness(worker: &str, state: &'static str, age_ms: Option<u64>) {
    for candidate in ["fresh", "stale", "missing"] {
        gauge!("router_load_report_state", "worker" => worker.to_owned(), "state" => candidate)
            .set(if candidate == state { 1.0 } else { 0.0 });
    }
    if let Some(age) = age_ms {
        gauge!("router_load_report_age_seconds", "worker" => worker.to_owned())
            .set(age as f64 / 1000.0);
    }
}

/// KV-event counters of one engine rank (absolute values, set at scrape time).
pub(crate) fn kv_worker(worker: &str, counters: &[(&'static str, u64)]) {
    for (name, value) in counters {
        gauge!("router_kv_events", "worker" => worker.to_owned(), "counter" => *name)
            .set(*value as f64);
    }
}

/// A worker's KV-event subscription heard nothing while the engine prefilled.
pub(crate) fn kv_events_silent(worker: &str) {
    counter!("router_kv_events_silent_total", "worker" => worker.to_owned()).increment(1);
}

/// A model's segment cache of prompt pieces' token ids (set at scrape time).
pub(crate) fn segment_cache(model: &str, stats: router_prepare::SegmentCacheStats) {
    let model = || model.to_owned();
    gauge!("router_segment_cache_entries", "model" => model()).set(stats.entries as f64);
    gauge!("router_segment_cache_bytes", "model" => model()).set(stats.bytes as f64);
    for (result, count) in [("hit", stats.hits), ("miss", stats.misses)] {
        counter!("router_segment_cache_lookups_total", "model" => model(), "result" => result)
            .absolute(count);
    }
}

/// Size of the prefix index (set at scrape time).
pub(crate) fn kv_index(nodes: u64, bytes: u64) {
    gauge!("router_kv_index_nodes").set(nodes as f64);
    gauge!("router_kv_index_bytes").set(bytes as f64);
}
