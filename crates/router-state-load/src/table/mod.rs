//! `EngineReportedLoadTable`: the latest usable report of every engine, with its freshness.
//!
//! Writers (the subscriptions) go through one mutex that holds each engine's ordering
//! baselines, rate limit and counters; every change publishes a new immutable map through an
//! `ArcSwap`, so readers ([`EngineReportedLoadTable::snapshot`]) never lock and never wait.
//!
//! Rules (docs/design/LOAD_REPORTS.md): freshness is judged on the receipt time; (instance,
//! sequence) must move forward; only reports covering exactly ranks `0..dp_size` are usable, and a
//! rank-incomplete report also clears the previous one (a silent rank must not look idle);
//! NATIVE needs every native gauge on every rank; ranks are summed and the aggregate is as old
//! as its oldest rank. Rejected reports change nothing but the counters.

mod aggregate;
mod engine;
mod snapshot;
mod status;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use router_workers::{Worker, WorkerId};
use tokio::sync::{broadcast, watch};

pub use snapshot::LoadSnapshot;
pub use status::{
    EngineLoadStatus, Freshness, MissingReason, RejectReason, RejectionCounts, ReportTotals,
};

use crate::{Clock, EngineLoad, RankLoad, Report, ReportKind};
use engine::EngineState;

/// How the table judges freshness and floods.
#[derive(Clone, Debug, PartialEq)]
pub struct TableConfig {
    /// A report is stale this long after receipt, unless the engine's interval asks for more.
    pub stale_after: Duration,
    /// A report also stays fresh for this many of the engine's stated report intervals: the
    /// window is `max(stale_after, stale_after_intervals x interval)`.
    pub stale_after_intervals: u32,
    /// Upper bound of the window however long the engine's interval, so that an engine stating
    /// a huge interval cannot keep itself fresh for hours.
    pub max_stale_after: Duration,
    /// Reports accepted per engine and second, sustained; more are rejected as rate-limited.
    pub max_reports_per_sec: f64,
    /// Reports accepted per engine in a burst.
    pub report_burst: u32,
}

impl Default for TableConfig {
    fn default() -> Self {
        Self {
            stale_after: Duration::from_secs(3),
            stale_after_intervals: 3,
            max_stale_after: Duration::from_secs(60),
            max_reports_per_sec: 100.0,
            report_burst: 20,
        }
    }
}

impl TableConfig {
    /// The freshness window for an engine reporting every `interval`.
    pub fn stale_after_for(&self, interval: Option<Duration>) -> Duration {
        let by_interval = interval
            .map(|i| i.saturating_mul(self.stale_after_intervals).min(self.max_stale_after))
            .unwrap_or_default();
        self.stale_after.max(by_interval)
    }
}

/// The usable reports, as readers see them.
pub(crate) type Published = HashMap<WorkerId, Entry>;

/// A usable report: the aggregate and the instant it stops being fresh.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub(crate) load: EngineLoad,
    /// Each rank's numbers, in rank order.
    pub(crate) ranks: Arc<[RankLoad]>,
    pub(crate) fresh_until: Instant,
}

#[derive(Debug, Default)]
struct Inner {
    engines: HashMap<WorkerId, EngineState>,
    totals: ReportTotals,
}

/// The latest usable load report of every registered engine. Shared as
/// `Arc<EngineReportedLoadTable>`; [`EngineReportedLoadTable::snapshot`] is cheap enough for
/// every pick.
#[derive(Debug)]
pub struct EngineReportedLoadTable {
    config: TableConfig,
    clock: Arc<dyn Clock>,
    published: ArcSwap<Published>,
    inner: Mutex<Inner>,
    changes: watch::Sender<u64>,
    restarts: broadcast::Sender<WorkerId>,
}

impl EngineReportedLoadTable {
    /// An empty table reading time from `clock`.
    pub fn new(config: TableConfig, clock: Arc<dyn Clock>) -> Self {
        Self {
            config,
            clock,
            published: ArcSwap::from_pointee(Published::default()),
            inner: Mutex::new(Inner::default()),
            changes: watch::channel(0).0,
            restarts: broadcast::channel(64).0,
        }
    }

    /// The engines whose reports came from a new instance (a restarted process: its caches
    /// are empty, its speed may differ), as they are accepted. A receiver that falls behind
    /// misses some ([`broadcast`]'s `Lagged`); the table holds no other record of them.
    pub fn restarts(&self) -> broadcast::Receiver<WorkerId> {
        self.restarts.subscribe()
    }

    /// The table's configuration.
    pub fn config(&self) -> &TableConfig {
        &self.config
    }

    /// The table's clock; share it with [`crate::Inflight`] so capture times and dispatch
    /// times are comparable.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The usable reports now. One atomic load and one clock read.
    pub fn snapshot(&self) -> LoadSnapshot {
        let entries = self.published.load_full();
        LoadSnapshot::new(entries, self.clock.now())
    }

    /// Starts tracking `worker` (missing until its first usable report). Registering the same
    /// incarnation again does nothing; a new incarnation replaces all state of the old one.
    pub fn register(&self, worker: &Worker) {
        let mut inner = self.inner.lock();
        if inner.engines.get(worker.id()).is_some_and(|e| e.incarnation == worker.incarnation()) {
            return;
        }
        let state = EngineState::new(worker.incarnation(), worker.dp_size(), &self.config);
        let had =
            inner.engines.insert(worker.id().clone(), state).is_some_and(|s| s.current.is_some());
        if had {
            self.publish(worker.id(), None);
        }
        self.notify();
    }

    /// Stops tracking the worker, if it is still this incarnation. Returns whether it was
    /// removed.
    pub fn unregister(&self, worker: &WorkerId, incarnation: u64) -> bool {
        let mut inner = self.inner.lock();
        if inner.engines.get(worker).is_none_or(|e| e.incarnation != incarnation) {
            return false;
        }
        if inner.engines.remove(worker).is_some_and(|s| s.current.is_some()) {
            self.publish(worker, None);
        }
        self.notify();
        true
    }

    /// Takes in a report received now from the subscription of `worker` (of `incarnation`).
    /// Returns the kind of the usable load it produced, or why it was rejected; either way it
    /// is counted.
    pub fn apply(
        &self,
        worker: &WorkerId,
        incarnation: u64,
        report: Report,
    ) -> Result<ReportKind, RejectReason> {
        let now = self.clock.now();
        let mut inner = self.inner.lock();
        let Inner { engines, totals } = &mut *inner;
        let result = match engines.get_mut(worker) {
            None => Err(RejectReason::UnknownEngine),
            Some(state) if state.incarnation != incarnation => Err(RejectReason::StaleIncarnation),
            Some(state) => {
                let had = state.current.is_some();
                let result = state.ingest(worker, report, now, &self.config);
                match result {
                    Ok((kind, clamped)) => {
                        totals.accepted += 1;
                        totals.clamped += u64::from(clamped);
                        if std::mem::take(&mut state.restarted) {
                            // Nobody listening is fine: the restart only clears caches.
                            let _ = self.restarts.send(worker.clone());
                        }
                        self.publish(worker, state.current.clone());
                        Ok(kind)
                    }
                    Err(reason) => {
                        state.count_rejection(reason);
                        if had && state.current.is_none() {
                            self.publish(worker, None);
                        }
                        Err(reason)
                    }
                }
            }
        };
        if let Err(reason) = result {
            totals.rejected.add(reason);
        }
        self.notify();
        result
    }

    /// Counts a report that could not even be decoded (malformed, too large) for `worker`.
    /// Changes nothing else.
    pub fn reject(&self, worker: &WorkerId, incarnation: u64, reason: RejectReason) {
        let mut inner = self.inner.lock();
        let Inner { engines, totals } = &mut *inner;
        totals.rejected.add(reason);
        if let Some(state) = engines.get_mut(worker).filter(|s| s.incarnation == incarnation) {
            state.count_rejection(reason);
        }
        self.notify();
    }

    /// Makes the worker's load missing at once (broken stream, failed poll), if it is still
    /// this incarnation. Ordering baselines are kept.
    pub fn mark_missing(&self, worker: &WorkerId, incarnation: u64, reason: MissingReason) {
        let mut inner = self.inner.lock();
        if let Some(state) = inner.engines.get_mut(worker).filter(|s| s.incarnation == incarnation)
        {
            if state.clear(reason) {
                self.publish(worker, None);
            }
            self.notify();
        }
    }

    /// Every registered engine's status, sorted by worker id.
    pub fn status(&self) -> Vec<EngineLoadStatus> {
        let now = self.clock.now();
        let inner = self.inner.lock();
        let mut all: Vec<_> = inner.engines.iter().map(|(id, s)| s.status(id, now)).collect();
        all.sort_by(|a, b| a.worker.cmp(&b.worker));
        all
    }

    /// One engine's status.
    pub fn status_of(&self, worker: &WorkerId) -> Option<EngineLoadStatus> {
        let now = self.clock.now();
        self.inner.lock().engines.get(worker).map(|s| s.status(worker, now))
    }

    /// Counts over all engines, including reports for unknown engines.
    pub fn totals(&self) -> ReportTotals {
        self.inner.lock().totals
    }

    /// A receiver that changes whenever the table does (a report applied or rejected, an
    /// engine registered, removed or marked missing). For waiting on state in tests and for
    /// readiness; the value is a change counter.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Publishes `entry` as the usable report of `worker` (or removes it). Called with the
    /// writer lock held, so publications never race.
    fn publish(&self, worker: &WorkerId, entry: Option<Entry>) {
        let mut next = HashMap::clone(&self.published.load());
        match entry {
            Some(entry) => next.insert(worker.clone(), entry),
            None => next.remove(worker),
        };
        self.published.store(Arc::new(next));
    }

    fn notify(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }
}
