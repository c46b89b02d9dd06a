//! Per (worker, rank) subscription counters, readable without blocking the applier.
//!
//! Every counter is an atomic written by the subscription's own tasks; readers take a
//! snapshot. A `watch` channel ticks on every change so tests and exporters can wait for
//! progress instead of polling on a timer.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use router_workers::WorkerId;
use tokio::sync::watch;

use crate::index::HolderView;
use crate::{ApplyReport, SkipCounts, SkipReason};

const NO_SEQ: u64 = u64::MAX;

/// Live counters of one subscription.
#[derive(Debug)]
pub(crate) struct RankStats {
    pub(crate) worker: WorkerId,
    pub(crate) incarnation: u64,
    pub(crate) rank: u32,
    pub(crate) endpoint: String,
    subscribed: AtomicBool,
    connects: AtomicU64,
    last_seq: AtomicU64,
    batches: AtomicU64,
    events: AtomicU64,
    stored_blocks: AtomicU64,
    removed_blocks: AtomicU64,
    unknown_removals: AtomicU64,
    gaps: AtomicU64,
    lost_batches: AtomicU64,
    replays: AtomicU64,
    replayed_batches: AtomicU64,
    replay_failures: AtomicU64,
    clears: AtomicU64,
    restarts: AtomicU64,
    duplicates: AtomicU64,
    rank_mismatches: AtomicU64,
    /// Messages taken from the publisher, live or replayed, whatever became of them.
    heard: AtomicU64,
    skipped: [AtomicU64; SkipReason::ALL.len()],
    holders: Mutex<Vec<HolderView>>,
    tick: Arc<watch::Sender<u64>>,
}

fn add(counter: &AtomicU64, n: u64) {
    if n > 0 {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

impl RankStats {
    pub(crate) fn new(
        worker: WorkerId,
        incarnation: u64,
        rank: u32,
        endpoint: String,
        tick: Arc<watch::Sender<u64>>,
    ) -> Self {
        Self {
            worker,
            incarnation,
            rank,
            endpoint,
            subscribed: AtomicBool::new(false),
            connects: AtomicU64::new(0),
            last_seq: AtomicU64::new(NO_SEQ),
            batches: AtomicU64::new(0),
            events: AtomicU64::new(0),
            stored_blocks: AtomicU64::new(0),
            removed_blocks: AtomicU64::new(0),
            unknown_removals: AtomicU64::new(0),
            gaps: AtomicU64::new(0),
            lost_batches: AtomicU64::new(0),
            replays: AtomicU64::new(0),
            replayed_batches: AtomicU64::new(0),
            replay_failures: AtomicU64::new(0),
            clears: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            rank_mismatches: AtomicU64::new(0),
            heard: AtomicU64::new(0),
            skipped: std::array::from_fn(|_| AtomicU64::new(0)),
            holders: Mutex::new(Vec::new()),
            tick,
        }
    }

    /// Signals readers that something changed.
    pub(crate) fn tick(&self) {
        self.tick.send_modify(|v| *v = v.wrapping_add(1));
    }

    pub(crate) fn set_holders(&self, holders: Vec<HolderView>) {
        *self.holders.lock() = holders;
    }

    pub(crate) fn set_subscribed(&self, subscribed: bool) {
        if subscribed {
            add(&self.connects, 1);
        }
        self.subscribed.store(subscribed, Ordering::Relaxed);
        self.tick();
    }

    pub(crate) fn set_last_seq(&self, seq: Option<u64>) {
        self.last_seq.store(seq.unwrap_or(NO_SEQ), Ordering::Relaxed);
    }

    pub(crate) fn skip(&self, reason: SkipReason) {
        add(&self.skipped[reason as usize], 1);
    }

    pub(crate) fn applied(&self, report: &ApplyReport) {
        add(&self.batches, 1);
        add(&self.events, report.events);
        add(&self.stored_blocks, report.stored);
        add(&self.removed_blocks, report.removed);
        add(&self.unknown_removals, report.unknown_removals);
        add(&self.clears, report.clears);
        for (reason, n) in report.skipped.iter() {
            add(&self.skipped[reason as usize], n);
        }
    }

    /// A message came from the publisher (live or replayed).
    pub(crate) fn heard(&self) {
        add(&self.heard, 1);
    }

    pub(crate) fn gap(&self) {
        add(&self.gaps, 1);
    }

    pub(crate) fn lost(&self, batches: u64) {
        add(&self.lost_batches, batches);
    }

    pub(crate) fn replay_started(&self) {
        add(&self.replays, 1);
    }

    pub(crate) fn replayed(&self) {
        add(&self.replayed_batches, 1);
    }

    pub(crate) fn replay_failed(&self) {
        add(&self.replay_failures, 1);
    }

    pub(crate) fn cleared(&self) {
        add(&self.clears, 1);
    }

    pub(crate) fn restarted(&self) {
        add(&self.restarts, 1);
    }

    pub(crate) fn duplicate(&self) {
        add(&self.duplicates, 1);
    }

    pub(crate) fn rank_mismatch(&self) {
        add(&self.rank_mismatches, 1);
    }

    fn snapshot(&self) -> RankSnapshot {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut skipped = SkipCounts::default();
        for reason in SkipReason::ALL {
            skipped.add(reason, load(&self.skipped[reason as usize]));
        }
        let last_seq = load(&self.last_seq);
        RankSnapshot {
            worker: self.worker.clone(),
            incarnation: self.incarnation,
            rank: self.rank,
            endpoint: self.endpoint.clone(),
            subscribed: self.subscribed.load(Ordering::Relaxed),
            connects: load(&self.connects),
            last_seq: (last_seq != NO_SEQ).then_some(last_seq),
            blocks: self.holders.lock().iter().map(HolderView::blocks).sum(),
            batches: load(&self.batches),
            events: load(&self.events),
            stored_blocks: load(&self.stored_blocks),
            removed_blocks: load(&self.removed_blocks),
            unknown_removals: load(&self.unknown_removals),
            gaps: load(&self.gaps),
            lost_batches: load(&self.lost_batches),
            replays: load(&self.replays),
            replayed_batches: load(&self.replayed_batches),
            replay_failures: load(&self.replay_failures),
            clears: load(&self.clears),
            restarts: load(&self.restarts),
            duplicates: load(&self.duplicates),
            rank_mismatches: load(&self.rank_mismatches),
            skipped,
        }
    }
}

/// A point-in-time copy of one (worker, rank) subscription's counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankSnapshot {
    /// The worker.
    pub worker: WorkerId,
    /// The worker incarnation subscribed to.
    pub incarnation: u64,
    /// Data-parallel rank.
    pub rank: u32,
    /// The PUB endpoint of this rank (or the bound endpoint in bind mode).
    pub endpoint: String,
    /// Whether the SUB socket is connected (or bound) right now.
    pub subscribed: bool,
    /// Successful connects (or binds) so far; more than one means reconnects.
    pub connects: u64,
    /// Sequence number of the last batch consumed; `None` before the first batch and right
    /// after a publisher restart.
    pub last_seq: Option<u64>,
    /// Blocks this worker-rank holds in the index, over all its models.
    pub blocks: u64,
    /// Batches applied (live or replayed).
    pub batches: u64,
    /// Events applied.
    pub events: u64,
    /// Blocks stored.
    pub stored_blocks: u64,
    /// Blocks removed.
    pub removed_blocks: u64,
    /// Removals of blocks the index did not know this worker-rank held.
    pub unknown_removals: u64,
    /// Sequence gaps detected (including a first batch after seq 0).
    pub gaps: u64,
    /// Batches known lost: gaps replay could not fill.
    pub lost_batches: u64,
    /// Replay requests made.
    pub replays: u64,
    /// Batches received through replay.
    pub replayed_batches: u64,
    /// Replay requests that failed (unreachable, timeout, too long).
    pub replay_failures: u64,
    /// Times this worker-rank's blocks were cleared (engine `AllBlocksCleared`, restart, or
    /// unrecoverable gap).
    pub clears: u64,
    /// Publisher restarts detected (sequence went back).
    pub restarts: u64,
    /// Batches received twice (live after replay) and skipped.
    pub duplicates: u64,
    /// Batches whose `dp_rank` differs from the subscription's rank (applied anyway: the
    /// endpoint decides the rank).
    pub rank_mismatches: u64,
    /// Messages and events skipped, by reason.
    pub skipped: SkipCounts,
}

/// One worker's subscriptions summarised for `/admin/state`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSummary {
    /// Every rank is subscribed.
    pub subscribed: bool,
    /// The highest last sequence number over the ranks.
    pub last_seq: Option<u64>,
    /// Blocks held, summed over ranks.
    pub blocks: u64,
    /// `BlockRemoved` blocks applied (evictions), summed over ranks.
    pub removed_blocks: u64,
    /// Gaps, summed over ranks.
    pub gaps: u64,
    /// Replays, summed over ranks.
    pub replays: u64,
    /// Clears, summed over ranks.
    pub clears: u64,
    /// Skipped messages and events, summed over ranks and reasons.
    pub skipped: u64,
}

#[derive(Debug)]
struct StatsInner {
    ranks: RwLock<BTreeMap<(WorkerId, u32), Arc<RankStats>>>,
    tick: Arc<watch::Sender<u64>>,
    silence: Mutex<HashMap<WorkerId, Silence>>,
}

/// Prefill-bearing requests sent to a worker while its subscriptions heard nothing.
#[derive(Debug, Default)]
struct Silence {
    /// Messages its subscriptions had heard at the last look.
    heard: u64,
    /// Requests sent since then that should have made it publish.
    unanswered: u32,
    /// When the first of them was sent.
    since: Option<Instant>,
    /// This silence was reported already.
    reported: bool,
}

/// Requests without a word from the publisher before its subscription counts as silent.
pub(crate) const SILENT_AFTER_REQUESTS: u32 = 8;
/// How long those requests must have had to make the engine publish.
pub(crate) const SILENT_AFTER: Duration = Duration::from_secs(10);

/// The subscription counters of every (worker, rank); cheap to clone and share.
#[derive(Clone, Debug)]
pub struct KvStats {
    inner: Arc<StatsInner>,
}

impl Default for KvStats {
    fn default() -> Self {
        Self {
            inner: Arc::new(StatsInner {
                ranks: RwLock::new(BTreeMap::new()),
                tick: Arc::new(watch::channel(0).0),
                silence: Mutex::new(HashMap::new()),
            }),
        }
    }
}

impl KvStats {
    pub(crate) fn register(
        &self,
        worker: &WorkerId,
        incarnation: u64,
        rank: u32,
        endpoint: String,
    ) -> Arc<RankStats> {
        let stats = Arc::new(RankStats::new(
            worker.clone(),
            incarnation,
            rank,
            endpoint,
            Arc::clone(&self.inner.tick),
        ));
        self.inner.ranks.write().insert((worker.clone(), rank), Arc::clone(&stats));
        stats.tick();
        stats
    }

    /// Drops the entries of one worker incarnation (a newer incarnation's stay).
    pub(crate) fn unregister(&self, worker: &WorkerId, incarnation: u64) {
        self.inner
            .ranks
            .write()
            .retain(|(w, _), stats| w != worker || stats.incarnation != incarnation);
        self.inner.silence.lock().remove(worker);
        self.inner.tick.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Every subscription, ordered by worker and rank.
    pub fn ranks(&self) -> Vec<RankSnapshot> {
        self.inner.ranks.read().values().map(|s| s.snapshot()).collect()
    }

    /// The subscriptions of one worker, ordered by rank.
    pub fn worker(&self, worker: &WorkerId) -> Vec<RankSnapshot> {
        self.inner
            .ranks
            .read()
            .iter()
            .filter(|((w, _), _)| w == worker)
            .map(|(_, s)| s.snapshot())
            .collect()
    }

    /// One worker's ranks folded into the fields of `/admin/state`; `None` when the worker
    /// has no KV-event subscription.
    pub fn summary(&self, worker: &WorkerId) -> Option<WorkerSummary> {
        let ranks = self.worker(worker);
        if ranks.is_empty() {
            return None;
        }
        Some(WorkerSummary {
            subscribed: ranks.iter().all(|r| r.subscribed),
            last_seq: ranks.iter().filter_map(|r| r.last_seq).max(),
            blocks: ranks.iter().map(|r| r.blocks).sum(),
            removed_blocks: ranks.iter().map(|r| r.removed_blocks).sum(),
            gaps: ranks.iter().map(|r| r.gaps).sum(),
            replays: ranks.iter().map(|r| r.replays).sum(),
            clears: ranks.iter().map(|r| r.clears).sum(),
            skipped: ranks.iter().map(|r| r.skipped.total()).sum(),
        })
    }

    /// A request that makes an engine cache at least one full block was sent to `worker`
    /// at `now`. Returns true exactly when this makes its subscription silent: it has heard
    /// nothing from the publisher over the last 8 such requests and 10 s (an engine that binds its socket where the router connects, or the
    /// other way round, publishes into the void). The next message heard ends the silence.
    /// A worker without a subscription is never silent.
    pub fn expect_events(&self, worker: &WorkerId, now: Instant) -> bool {
        let heard: u64 = {
            let ranks = self.inner.ranks.read();
            let mut heard = None;
            for ((_, _), stats) in ranks.range((worker.clone(), 0)..=(worker.clone(), u32::MAX)) {
                *heard.get_or_insert(0) += stats.heard.load(Ordering::Relaxed);
            }
            match heard {
                Some(heard) => heard,
                None => return false,
            }
        };
        let mut silences = self.inner.silence.lock();
        let silence = silences.entry(worker.clone()).or_default();
        if heard != silence.heard {
            *silence = Silence { heard, ..Silence::default() };
        }
        silence.unanswered = silence.unanswered.saturating_add(1);
        let since = *silence.since.get_or_insert(now);
        let silent = silence.unanswered >= SILENT_AFTER_REQUESTS
            && now.saturating_duration_since(since) >= SILENT_AFTER;
        if silent && !silence.reported {
            silence.reported = true;
            return true;
        }
        false
    }

    /// A receiver that changes whenever any counter may have changed.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.tick.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subscription_that_hears_nothing_while_its_engine_prefills_is_silent_once() {
        let stats = KvStats::default();
        let worker = WorkerId::new("e1").expect("id");
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        assert!(!stats.expect_events(&worker, t0), "no subscription: never silent");
        let rank = stats.register(&worker, 1, 0, "tcp://127.0.0.1:1".into());
        let silent: Vec<bool> = (0..10).map(|i| stats.expect_events(&worker, at(i * 2))).collect();
        // Eight requests, and the ten seconds reached by the sixth after the first.
        assert_eq!(silent.iter().filter(|s| **s).count(), 1, "{silent:?}");
        assert!(silent[7], "{silent:?}");
        // A message ends the silence; a later one is reported again.
        rank.heard();
        assert!(!stats.expect_events(&worker, at(30)));
        let again = (0..9).any(|i| stats.expect_events(&worker, at(40 + i * 2)));
        assert!(again);
        // Many requests in a short time are not yet a silence: the engine had no time.
        let other = WorkerId::new("e2").expect("id");
        let _ = stats.register(&other, 1, 0, "tcp://127.0.0.1:2".into());
        assert!(!(0..50).any(|_| stats.expect_events(&other, t0)));
    }
}
