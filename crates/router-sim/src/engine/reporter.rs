//! The engine's gRPC load reporter (`--load-reporter HOST:PORT`): router-state-load's
//! engine-side `LoadReporter` service, fed with NATIVE reports built from
//! [`LoadSource::snapshot`] on every report it sends.
//!
//! Each rank carries the basic numbers (running, waiting, KV used and capacity), the three
//! native gauges (waiting uncached tokens, total KV tokens, max running requests) and the two
//! cumulative prefill counters, so a router can derive the prefill rate and queue time. The
//! engine reports `Serving`, and `Draining` once a `--die-after` fault has started its end.

use std::net::SocketAddr;
use std::sync::Arc;

use router_state_load::reporter::{
    EngineSnapshot, LoadReporterService, LoadSnapshotSource, ReporterConfig, serve_with,
};
use router_state_load::{EngineStatus, RankSample};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::load::{LoadSnapshot, LoadSource, RankLoad};

impl RankLoad {
    /// This rank as a NATIVE [`RankSample`] of age zero.
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
    }
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
}

/// The reporter's view of the engine: its load, and whether it is dying.
struct Source {
    loads: LoadSource,
    dying: CancellationToken,
}

impl LoadSnapshotSource for Source {
    fn snapshot(&self) -> EngineSnapshot {
        let status =
            if self.dying.is_cancelled() { EngineStatus::Draining } else { EngineStatus::Serving };
        self.loads.snapshot().to_engine_snapshot(status)
    }
}

/// Serves the reporter on the bound `listener` (at `addr`) until `stop` fires, as a task of
/// `tracker`.
pub(super) fn start(
    listener: TcpListener,
    addr: SocketAddr,
    loads: LoadSource,
    dying: CancellationToken,
    stop: CancellationToken,
    tracker: &TaskTracker,
) {
    let source: Arc<dyn LoadSnapshotSource> = Arc::new(Source { loads, dying });
    let service = LoadReporterService::new(source, ReporterConfig::default());
    tracker.spawn(async move {
        if let Err(error) = serve_with(listener, service, stop).await {
            tracing::error!(%addr, error = &error as &dyn std::error::Error, "load reporter failed");
        }
    });
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn every_rank_becomes_a_native_sample_with_the_prefill_counters() {
        let rank = RankLoad {
            dp_rank: 0,
            running: 2,
            waiting: 3,
            waiting_uncached_tokens: 400,
            kv_used_tokens: 1_000,
            kv_capacity_tokens: 8_192,
            total_kv_tokens: 1_900,
            max_running: 7,
            total_prefill_uncached_tokens: 12_345,
            total_prefill_busy_us: 6_789,
            cached_blocks: 99,
            gen_throughput: 10.0,
            cache_hit_rate: 0.5,
        };
        let snapshot =
            LoadSnapshot { captured_at: UNIX_EPOCH + Duration::from_secs(1), ranks: vec![rank] };
        let engine = snapshot.to_engine_snapshot(EngineStatus::Serving);
        assert_eq!(engine.status, EngineStatus::Serving);
        assert_eq!(engine.dp_size, 1);
        let sample = engine.ranks[0];
        assert!(sample.has_native_gauges(), "a NATIVE report needs every native gauge");
        assert_eq!(
            sample,
            RankSample::basic(0, 2, 3, 1_000, 8_192)
                .with_native(400, 1_900, 7)
                .with_prefill_counters(12_345, 6_789)
        );
        assert_eq!(sample.age, Duration::ZERO);
    }
}
