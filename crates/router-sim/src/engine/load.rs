//! Load snapshots, as plain data: what the engine reports about its queue and KV use, per
//! data-parallel rank (the simulator has one rank), and the two shapes they are served in:
//! SGLang's JSON for `GET /v1/loads`, and the NATIVE samples the gRPC load reporter sends.
//! [`LoadSource`](super::LoadSource), beside the scheduler, takes them.

use std::time::SystemTime;

use router_state_load::reporter::EngineSnapshot;
use router_state_load::{EngineStatus, RankSample};
use serde::Serialize;

/// The load of one data-parallel rank.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RankLoad {
    /// The rank (always 0 in the simulator).
    pub dp_rank: u32,
    /// Requests admitted to the running batch.
    pub running: u64,
    /// Requests queued behind `max_running` or KV capacity.
    pub waiting: u64,
    /// Prompt tokens of queued requests not covered by the prefix cache when they arrived
    /// (0 on PD decode engines).
    pub waiting_uncached_tokens: u64,
    /// KV tokens held by running requests (shared cached blocks counted once); cached blocks
    /// that no request uses are free, as in SGLang.
    pub kv_used_tokens: u64,
    /// KV capacity in tokens (a whole number of blocks).
    pub kv_capacity_tokens: u64,
    /// `kv_used_tokens` plus the full prompt length of every queued request.
    pub total_kv_tokens: u64,
    /// The `--max-running` limit.
    pub max_running: u64,
    /// Cumulative uncached prompt tokens prefilled since start.
    pub total_prefill_uncached_tokens: u64,
    /// Cumulative simulated time spent in prefill passes, in microseconds.
    pub total_prefill_busy_us: u64,
    /// Blocks in the prefix cache, used or not.
    pub cached_blocks: u64,
    /// Output tokens per second over the last completed one-second window (0 when idle).
    pub gen_throughput: f64,
    /// Cached prompt tokens over prompt tokens, over every admitted request.
    pub cache_hit_rate: f64,
}

impl RankLoad {
    /// This rank as a NATIVE [`RankSample`] of age zero, its generation throughput as the
    /// decode rate.
    pub fn to_rank_sample(&self) -> RankSample {
        RankSample::basic(
            self.dp_rank,
            self.running,
            self.waiting,
            self.kv_used_tokens,
            self.kv_capacity_tokens,
        )
        .with_native(self.waiting_uncached_tokens, self.total_kv_tokens, self.max_running)
        .with_prefill_counters(self.total_prefill_uncached_tokens, self.total_prefill_busy_us)
        .with_decode_rate(self.gen_throughput)
    }
}

/// The whole engine's load at one instant.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadSnapshot {
    /// When it was taken (engine wall clock).
    pub captured_at: SystemTime,
    /// One entry per rank, ranks `0..dp_size`.
    pub ranks: Vec<RankLoad>,
}

impl LoadSnapshot {
    /// What the load reporter sends for this snapshot: every rank as a NATIVE sample.
    pub fn to_engine_snapshot(&self, status: EngineStatus) -> EngineSnapshot {
        EngineSnapshot {
            status,
            dp_size: u32::try_from(self.ranks.len()).unwrap_or(u32::MAX),
            ranks: self.ranks.iter().map(RankLoad::to_rank_sample).collect(),
        }
    }

    /// SGLang's `GET /v1/loads` body: `{"timestamp", "version", "loads": [...]}` with the
    /// twelve core fields per rank, plus the rank's `timestamp` and the cumulative prefill
    /// counters (`total_prefill_uncached_tokens`, `total_prefill_busy_us`).
    pub fn to_sglang_json(&self) -> serde_json::Value {
        let timestamp = iso8601(self.captured_at);
        let loads: Vec<serde_json::Value> = self
            .ranks
            .iter()
            .map(|r| {
                let usage = if r.kv_capacity_tokens == 0 {
                    0.0
                } else {
                    r.kv_used_tokens as f64 / r.kv_capacity_tokens as f64
                };
                serde_json::json!({
                    "dp_rank": r.dp_rank,
                    "timestamp": timestamp,
                    "num_running_reqs": r.running,
                    "num_waiting_reqs": r.waiting,
                    "num_waiting_uncached_tokens": r.waiting_uncached_tokens,
                    "num_used_tokens": r.kv_used_tokens,
                    "num_total_tokens": r.total_kv_tokens,
                    "max_total_num_tokens": r.kv_capacity_tokens,
                    "max_running_requests": r.max_running,
                    "token_usage": round(usage, 4),
                    "gen_throughput": round(r.gen_throughput, 2),
                    "cache_hit_rate": round(r.cache_hit_rate, 4),
                    "utilization": 0.0,
                    "total_prefill_uncached_tokens": r.total_prefill_uncached_tokens,
                    "total_prefill_busy_us": r.total_prefill_busy_us,
                })
            })
            .collect();
        serde_json::json!({
            "timestamp": timestamp,
            "version": concat!("router-sim ", env!("CARGO_PKG_VERSION")),
            "loads": loads,
        })
    }
}

fn round(value: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (value * scale).round() / scale
}

/// `YYYY-MM-DDTHH:MM:SS.ffffff+00:00`, the shape SGLang prints.
fn iso8601(time: std::time::SystemTime) -> String {
    let since = time.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = i64::try_from(since.as_secs()).unwrap_or(i64::MAX);
    let date = router_chat_template::strftime(secs, "%Y-%m-%dT%H:%M:%S");
    format!("{date}.{:06}+00:00", since.subsec_micros())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn iso8601_has_micros_and_utc_offset() {
        let t = UNIX_EPOCH + Duration::from_micros(1_721_952_000_123_456);
        assert_eq!(iso8601(t), "2024-07-26T00:00:00.123456+00:00");
    }

    /// One rank with every field set, captured one second after the epoch.
    fn snapshot() -> LoadSnapshot {
        let rank = RankLoad {
            dp_rank: 0,
            running: 2,
            waiting: 1,
            waiting_uncached_tokens: 30,
            kv_used_tokens: 1000,
            kv_capacity_tokens: 3000,
            total_kv_tokens: 1040,
            max_running: 8,
            total_prefill_uncached_tokens: 5,
            total_prefill_busy_us: 6,
            cached_blocks: 70,
            gen_throughput: 12.3456,
            cache_hit_rate: 0.123456,
        };
        LoadSnapshot { captured_at: UNIX_EPOCH + Duration::from_secs(1), ranks: vec![rank] }
    }

    #[test]
    fn sglang_json_has_the_core_fields_per_rank() {
        let snapshot = snapshot();
        let json = snapshot.to_sglang_json();
        assert_eq!(json["timestamp"], "1970-01-01T00:00:01.000000+00:00");
        let load = &json["loads"][0];
        for (key, value) in [
            ("dp_rank", 0.0),
            ("num_running_reqs", 2.0),
            ("num_waiting_reqs", 1.0),
            ("num_waiting_uncached_tokens", 30.0),
            ("num_used_tokens", 1000.0),
            ("num_total_tokens", 1040.0),
            ("max_total_num_tokens", 3000.0),
            ("max_running_requests", 8.0),
            ("token_usage", 0.3333),
            ("gen_throughput", 12.35),
            ("cache_hit_rate", 0.1235),
            ("utilization", 0.0),
            ("total_prefill_uncached_tokens", 5.0),
            ("total_prefill_busy_us", 6.0),
        ] {
            assert_eq!(load[key].as_f64(), Some(value), "{key}");
        }
    }

    #[test]
    fn every_rank_becomes_a_native_sample_with_the_prefill_counters_and_decode_rate() {
        let snapshot = snapshot();
        let engine = snapshot.to_engine_snapshot(EngineStatus::Serving);
        assert_eq!(engine.status, EngineStatus::Serving);
        assert_eq!(engine.dp_size, 1);
        let sample = engine.ranks[0];
        assert!(sample.has_native_gauges(), "a NATIVE report needs every native gauge");
        assert_eq!(
            sample,
            RankSample::basic(0, 2, 1, 1000, 3000)
                .with_native(30, 1040, 8)
                .with_prefill_counters(5, 6)
                .with_decode_rate(12.3456)
        );
        assert_eq!(sample.age, Duration::ZERO);
    }
}
