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

use router_state_load::EngineStatus;
use router_state_load::reporter::{
    EngineSnapshot, EngineSnapshotSource, LoadReporterService, ReporterConfig, serve_with,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::LoadSource;

/// The reporter's view of the engine: its load, and whether it is dying.
struct Source {
    loads: LoadSource,
    dying: CancellationToken,
}

impl EngineSnapshotSource for Source {
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
    let source: Arc<dyn EngineSnapshotSource> = Arc::new(Source { loads, dying });
    let service = LoadReporterService::new(source, ReporterConfig::default());
    tracker.spawn(async move {
        if let Err(error) = serve_with(listener, service, stop).await {
            tracing::error!(%addr, error = &error as &dyn std::error::Error, "load reporter failed");
        }
    });
}
