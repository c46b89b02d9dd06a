//! The engine's gRPC load reporter (`--load-reporter HOST:PORT`): router-state-load's
//! engine-side `LoadReporter` service, fed with NATIVE reports built from
//! [`LoadSource::snapshot`] on every report it sends.
//!
//! Each rank carries the basic numbers (running, waiting, KV used and capacity), the three
//! native gauges (waiting uncached tokens, total KV tokens, max running requests) and the two
//! cumulative prefill counters, so a router can derive the prefill rate and queue time. The
//! engine reports `Serving`, and `Draining` once a `--die-after` fault has started its end or
//! `POST /sim/drain` asked it to (until `POST /sim/resume`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use router_state_load::reporter::{
    EngineSnapshot, EngineSnapshotSource, LoadReporterService, ReporterConfig, serve_with,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::LoadSource;

/// The reporter's view of the engine: its load, whether it is dying, and whether it was told
/// to drain.
struct Source {
    loads: LoadSource,
    dying: CancellationToken,
    draining: Arc<AtomicBool>,
}

impl EngineSnapshotSource for Source {
    fn snapshot(&self) -> EngineSnapshot {
        let status =
            super::http::status(self.dying.is_cancelled(), self.draining.load(Ordering::SeqCst));
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
    draining: Arc<AtomicBool>,
    stop: CancellationToken,
    tracker: &TaskTracker,
) {
    let source: Arc<dyn EngineSnapshotSource> = Arc::new(Source { loads, dying, draining });
    let service = LoadReporterService::new(source, ReporterConfig::default());
    tracker.spawn(async move {
        if let Err(error) = serve_with(listener, service, stop).await {
            tracing::error!(%addr, error = &error as &dyn std::error::Error, "load reporter failed");
        }
    });
}
