//! Router-local accounting: requests in flight to each engine, the prefill work they carry, and
//! when they were dispatched.
//!
//! One [`EngineCounters`] per engine holds every number, so the in-flight counts and the
//! recent-dispatch ledger can never disagree about what was dispatched: all are written by the
//! same [`Inflight::acquire_work`]. The count is split by stage only so that it can be read per
//! stage; [`Inflight::count`] is their sum, not another counter.
//!
//! The *work* of a dispatch is the prefill tokens the router expects it to cost the engine (its
//! uncached prompt tokens, as the policy estimated them; 0 when nothing is known). It is summed
//! twice: over the requests in flight whose prefill is not yet done
//! ([`Inflight::inflight_tokens`]: waiting at the engine or in its current prefill pass, until
//! [`InflightGuard::prefilled`] at the first token or the guard's drop), and cumulatively in the
//! ledger ([`Inflight::dispatched_tokens_since`], the recent-dispatch correction of a report, in
//! tokens).
//!
//! A dispatch to one data-parallel rank ([`Inflight::acquire_on_rank`]) is also counted for
//! that rank, in flight ([`Inflight::rank_inflight`]) and in the ledger
//! ([`Inflight::rank_dispatched_since`]), so a rank can be chosen inside an engine the way an engine
//! is chosen inside a group.
//!
//! Each engine also remembers when its current prefill pass began, as far as this router can
//! tell: at the last first token of one of its requests (a pass ended, the next one starts with
//! what waited), or at a dispatch that found none of its requests waiting (the engine starts on
//! it). [`Inflight::prefill_queue`] credits that pass with the work the engine can have done
//! since, so a pass nearly done no longer weighs like one just begun, and tells the requests in
//! that pass from those waiting for the next.
//!
//! The ledger is a fixed ring of the last [`LEDGER_LEN`] dispatches per engine (instant and
//! cumulative work before it), indexed by a dispatch sequence number, so memory is bounded
//! without pruning: what a report already reflects is excluded by asking from the report's
//! capture time, and older entries are overwritten as new dispatches arrive.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use dashmap::DashMap;
use hashbrown::DefaultHashBuilder;
use parking_lot::RwLock;
use router_workers::{Stage, WorkerId};

use crate::Clock;

/// Dispatch instants remembered per engine. [`Inflight::dispatched_since`] saturates here.
pub const LEDGER_LEN: usize = 1024;

/// In-flight and dispatch counters of one engine.
#[derive(Debug)]
struct EngineCounters {
    worker: WorkerId,
    /// The stamps' clock, shared with [`Inflight`] (a guard stamps the first token with it).
    time: Arc<Timebase>,
    /// In-flight requests by stage (plain, prefill, decode).
    by_stage: [AtomicU64; 3],
    /// Work (prefill tokens) of the requests in flight, over all stages.
    inflight_tokens: AtomicU64,
    /// Requests in flight without a first token yet, over all stages.
    unprefilled: AtomicU64,
    /// The stamp of the instant the engine's current prefill pass began, as this router sees
    /// it (0: none yet): the last first token, or the dispatch that found nothing unprefilled.
    pass_began: AtomicU64,
    /// The sequence number of the first dispatch not in that pass.
    pass_end_seq: AtomicU64,
    /// Dispatches so far; the next dispatch's sequence number.
    dispatched: AtomicU64,
    /// Work of every dispatch so far.
    dispatched_tokens: AtomicU64,
    /// Sequence `s` at `s % LEDGER_LEN`.
    ledger: Box<[Entry]>,
    /// Per data-parallel rank, grown to the highest rank dispatched to.
    ranks: RwLock<Vec<RankCounters>>,
}

/// In-flight requests and their work on one data-parallel rank.
#[derive(Debug, Default)]
struct RankCounters {
    requests: AtomicU64,
    tokens: AtomicU64,
}

/// Requests and their work (prefill tokens) on one data-parallel rank of an engine: in flight,
/// or dispatched since an instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RankWork {
    /// Requests in flight, over all stages.
    pub requests: u64,
    /// Their work (prefill tokens).
    pub tokens: u64,
}

/// The ledger's mark for a dispatch not bound to a rank.
const NO_RANK: u32 = u32::MAX;

/// One dispatch in the ledger.
#[derive(Debug, Default)]
struct Entry {
    /// The dispatch instant as nanoseconds since the origin plus one (0: never written).
    stamp: AtomicU64,
    /// `dispatched_tokens` before this dispatch.
    tokens_before: AtomicU64,
    /// This dispatch's work.
    tokens: AtomicU64,
    /// The rank it went to, or [`NO_RANK`].
    rank: AtomicU32,
}

impl EngineCounters {
    fn new(worker: WorkerId, time: Arc<Timebase>) -> Self {
        Self {
            worker,
            time,
            by_stage: Default::default(),
            inflight_tokens: AtomicU64::new(0),
            unprefilled: AtomicU64::new(0),
            pass_began: AtomicU64::new(0),
            pass_end_seq: AtomicU64::new(0),
            dispatched: AtomicU64::new(0),
            dispatched_tokens: AtomicU64::new(0),
            ledger: (0..LEDGER_LEN).map(|_| Entry::default()).collect(),
            ranks: RwLock::default(),
        }
    }

    /// Adds one request and `tokens` of work to `rank`'s counters, or removes them.
    fn count_rank(&self, rank: u32, tokens: u64, add: bool) {
        self.with_rank(rank, |counters| {
            if add {
                counters.requests.fetch_add(1, Ordering::Relaxed);
                counters.tokens.fetch_add(tokens, Ordering::Relaxed);
            } else {
                counters.requests.fetch_sub(1, Ordering::Relaxed);
                counters.tokens.fetch_sub(tokens, Ordering::Relaxed);
            }
        });
    }

    /// Runs `f` on `rank`'s counters, grown to it first.
    fn with_rank(&self, rank: u32, f: impl FnOnce(&RankCounters)) {
        let Ok(at) = usize::try_from(rank) else { return };
        if self.ranks.read().len() <= at {
            let mut ranks = self.ranks.write();
            if ranks.len() <= at {
                ranks.resize_with(at + 1, RankCounters::default);
            }
        }
        f(&self.ranks.read()[at]);
    }

    /// Work of the remembered dispatches from sequence `first` up to `total` (the count of
    /// dispatches read with it): the cumulative work now less the work before `first`.
    fn work_from(&self, first: u64, total: u64) -> u64 {
        if first >= total {
            return 0;
        }
        let now = self.dispatched_tokens.load(Ordering::Acquire);
        now.saturating_sub(self.slot(first).tokens_before.load(Ordering::Relaxed))
    }

    fn slot(&self, seq: u64) -> &Entry {
        // LEDGER_LEN is a power of two far below u64::MAX, so the cast is lossless.
        &self.ledger[(seq % LEDGER_LEN as u64) as usize]
    }
}

fn stage_index(stage: Stage) -> usize {
    match stage {
        Stage::Plain => 0,
        Stage::Prefill => 1,
        Stage::Decode => 2,
    }
}

/// The clock every stamp is read from, and the instant stamps count from.
#[derive(Debug)]
struct Timebase {
    clock: Arc<dyn Clock>,
    origin: Instant,
}

impl Timebase {
    /// Nanoseconds from the origin to `at`, plus one, so that 0 means "never written".
    fn stamp(&self, at: Instant) -> u64 {
        let nanos = at.saturating_duration_since(self.origin).as_nanos();
        u64::try_from(nanos).unwrap_or(u64::MAX).saturating_add(1)
    }

    fn now(&self) -> u64 {
        self.stamp(self.clock.now())
    }
}

/// Router-local in-flight accounting for every engine. Shared as `Arc<Inflight>`.
#[derive(Debug)]
pub struct Inflight {
    time: Arc<Timebase>,
    /// Looked up on every dispatch: hashed with foldhash (hashbrown's), not SipHash; the keys
    /// are the router's own engine ids, not a client's.
    engines: DashMap<WorkerId, Arc<EngineCounters>, DefaultHashBuilder>,
}

impl Inflight {
    /// Empty accounting, stamping dispatches with `clock` (use the load table's clock).
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        let origin = clock.now();
        Self { time: Arc::new(Timebase { clock, origin }), engines: DashMap::default() }
    }

    /// Counts a request dispatched to `worker` for `stage` until the returned guard is dropped,
    /// and records the dispatch in the ledger, with no work. Dropping the guard releases it,
    /// whether the request completed, failed, was cancelled (its future dropped) or panicked.
    pub fn acquire(&self, worker: &WorkerId, stage: Stage) -> InflightGuard {
        self.acquire_work(worker, stage, 0)
    }

    /// [`Inflight::acquire`] for a request expected to cost the engine `tokens` of prefill
    /// work (its uncached prompt tokens), counted in flight until the guard drops and in the
    /// ledger for good.
    pub fn acquire_work(&self, worker: &WorkerId, stage: Stage, tokens: u64) -> InflightGuard {
        self.acquire_inner(worker, stage, None, tokens)
    }

    /// [`Inflight::acquire_work`] for a request sent to data-parallel rank `rank` of `worker`:
    /// counted for the engine as always, and for the rank too.
    pub fn acquire_on_rank(
        &self,
        worker: &WorkerId,
        stage: Stage,
        rank: u32,
        tokens: u64,
    ) -> InflightGuard {
        self.acquire_inner(worker, stage, Some(rank), tokens)
    }

    fn acquire_inner(
        &self,
        worker: &WorkerId,
        stage: Stage,
        rank: Option<u32>,
        tokens: u64,
    ) -> InflightGuard {
        let counters = self.counters(worker);
        let stamp = self.time.now();
        counters.by_stage[stage_index(stage)].fetch_add(1, Ordering::Relaxed);
        counters.inflight_tokens.fetch_add(tokens, Ordering::Relaxed);
        let idle = counters.unprefilled.fetch_add(1, Ordering::Relaxed) == 0;
        if let Some(rank) = rank {
            counters.count_rank(rank, tokens, true);
        }
        let seq = counters.dispatched.fetch_add(1, Ordering::Relaxed);
        if idle {
            // Nothing of this router's was waiting there: the engine starts on this one now.
            counters.pass_began.store(stamp, Ordering::Relaxed);
            counters.pass_end_seq.store(seq + 1, Ordering::Relaxed);
        }
        let before = counters.dispatched_tokens.fetch_add(tokens, Ordering::AcqRel);
        let entry = counters.slot(seq);
        entry.tokens_before.store(before, Ordering::Relaxed);
        entry.tokens.store(tokens, Ordering::Relaxed);
        entry.rank.store(rank.unwrap_or(NO_RANK), Ordering::Relaxed);
        entry.stamp.store(stamp, Ordering::Release);
        InflightGuard { counters, stage, rank, tokens, prefilled: false }
    }

    /// What is in flight to data-parallel rank `rank` of `worker` (dispatches made with
    /// [`Inflight::acquire_on_rank`]).
    pub fn rank_inflight(&self, worker: &WorkerId, rank: u32) -> RankWork {
        let Some(counters) = self.engines.get(worker).map(|c| Arc::clone(&c)) else {
            return RankWork::default();
        };
        let ranks = counters.ranks.read();
        usize::try_from(rank).ok().and_then(|at| ranks.get(at)).map_or_else(
            RankWork::default,
            |r| RankWork {
                requests: r.requests.load(Ordering::Relaxed),
                tokens: r.tokens.load(Ordering::Relaxed),
            },
        )
    }

    /// Requests and work (prefill tokens) dispatched to rank `rank` of `worker` at or after
    /// `since`: the recent-dispatch correction of one rank's report. Over the same dispatches
    /// as [`Inflight::dispatched_since`] (at most the last [`LEDGER_LEN`]).
    pub fn rank_dispatched_since(&self, worker: &WorkerId, rank: u32, since: Instant) -> RankWork {
        let Some(counters) = self.engines.get(worker).map(|c| Arc::clone(&c)) else {
            return RankWork::default();
        };
        let total = counters.dispatched.load(Ordering::Acquire);
        let first = Self::first_since(&counters, self.time.stamp(since), total);
        (first..total)
            .map(|seq| counters.slot(seq))
            .filter(|entry| entry.rank.load(Ordering::Relaxed) == rank)
            .fold(RankWork::default(), |sum, entry| RankWork {
                requests: sum.requests + 1,
                tokens: sum.tokens.saturating_add(entry.tokens.load(Ordering::Relaxed)),
            })
    }

    /// Work (prefill tokens) of the requests in flight to `worker` whose prefill is not done
    /// yet, over all stages.
    pub fn inflight_tokens(&self, worker: &WorkerId) -> u64 {
        self.engines.get(worker).map_or(0, |c| c.inflight_tokens.load(Ordering::Relaxed))
    }

    /// This router's requests on `worker` without a first token, as the engine works through
    /// them if it prefills `rate` tokens per second in passes: those dispatched before its
    /// current pass began (see the module) are in that pass, less the `rate x elapsed` tokens
    /// it can have done of them since; those dispatched after wait for the next pass, whole.
    /// With a rate that is not positive and finite nothing is credited.
    pub fn prefill_queue(&self, worker: &WorkerId, rate: f64) -> PrefillQueue {
        let Some(counters) = self.engines.get(worker).map(|c| Arc::clone(&c)) else {
            return PrefillQueue::default();
        };
        let pending = counters.inflight_tokens.load(Ordering::Relaxed);
        let unprefilled = counters.unprefilled.load(Ordering::Relaxed);
        let began = counters.pass_began.load(Ordering::Relaxed);
        let total = counters.dispatched.load(Ordering::Acquire);
        // The ledger remembers the last LEDGER_LEN dispatches; more waiting read as that many.
        let first = counters
            .pass_end_seq
            .load(Ordering::Relaxed)
            .clamp(total.saturating_sub(LEDGER_LEN as u64), total);
        // Requests that ended without a first token are in the ledger but no longer here.
        let after = counters.work_from(first, total).min(pending);
        let waiting = (total - first).min(unprefilled);
        let done = if rate.is_finite() && rate > 0.0 {
            let elapsed = self.time.now().saturating_sub(began) as f64 / 1e9;
            // Saturating float-to-int cast: a huge credit is a pass long done.
            (rate * elapsed) as u64
        } else {
            0
        };
        PrefillQueue { tokens: (pending - after).saturating_sub(done) + after, waiting }
    }

    /// Requests in flight to `worker` without a first token yet (waiting at the engine or in
    /// its current prefill pass), over all stages: the requests a new one queued there may
    /// share a prefill pass with, or wait behind.
    pub fn unprefilled(&self, worker: &WorkerId) -> u64 {
        self.engines.get(worker).map_or(0, |c| c.unprefilled.load(Ordering::Relaxed))
    }

    /// Requests in flight to `worker`, over all stages.
    pub fn count(&self, worker: &WorkerId) -> u64 {
        self.engines
            .get(worker)
            .map_or(0, |c| c.by_stage.iter().map(|n| n.load(Ordering::Relaxed)).sum())
    }

    /// Requests in flight to `worker` for one stage.
    pub fn count_stage(&self, worker: &WorkerId, stage: Stage) -> u64 {
        self.engines
            .get(worker)
            .map_or(0, |c| c.by_stage[stage_index(stage)].load(Ordering::Relaxed))
    }

    /// Every engine ever acquired for, with its in-flight count, sorted by id.
    pub fn counts(&self) -> Vec<(WorkerId, u64)> {
        let mut all: Vec<_> = self
            .engines
            .iter()
            .map(|e| (e.key().clone(), e.by_stage.iter().map(|n| n.load(Ordering::Relaxed)).sum()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Requests dispatched to `worker` since the total count began.
    pub fn dispatched_total(&self, worker: &WorkerId) -> u64 {
        self.engines.get(worker).map_or(0, |c| c.dispatched.load(Ordering::Acquire))
    }

    /// Requests dispatched to `worker` at or after `since` (a report's capture time), for
    /// least-load's correction. At most [`LEDGER_LEN`]: more dispatches than that since one
    /// report read as exactly that many. Acquires racing with this call may or may not count.
    pub fn dispatched_since(&self, worker: &WorkerId, since: Instant) -> u64 {
        self.since(worker, since).map_or(0, |s| s.requests)
    }

    /// Work (prefill tokens) dispatched to `worker` at or after `since`, for the token form of
    /// the recent-dispatch correction. Counts over the same dispatches as
    /// [`Inflight::dispatched_since`] (at most the last [`LEDGER_LEN`]).
    pub fn dispatched_tokens_since(&self, worker: &WorkerId, since: Instant) -> u64 {
        self.since(worker, since).map_or(0, |s| s.tokens)
    }

    fn since(&self, worker: &WorkerId, since: Instant) -> Option<Since> {
        let counters = self.engines.get(worker).map(|c| Arc::clone(&c))?;
        let total = counters.dispatched.load(Ordering::Acquire);
        let lo = Self::first_since(&counters, self.time.stamp(since), total);
        Some(Since { requests: total - lo, tokens: counters.work_from(lo, total) })
    }

    /// The first remembered sequence below `total` stamped at or after `since` (`total` when
    /// none is). Dispatch stamps grow with the sequence number (up to racing acquires), so it
    /// is found by bisection.
    fn first_since(counters: &EngineCounters, since: u64, total: u64) -> u64 {
        let (mut lo, mut hi) = (total.saturating_sub(LEDGER_LEN as u64), total);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if counters.slot(mid).stamp.load(Ordering::Acquire) >= since {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    }

    /// Forgets a removed engine. Guards still held keep counting into the forgotten counters,
    /// so a later engine with the same id starts from zero.
    pub fn remove(&self, worker: &WorkerId) {
        self.engines.remove(worker);
    }

    fn counters(&self, worker: &WorkerId) -> Arc<EngineCounters> {
        if let Some(counters) = self.engines.get(worker) {
            return Arc::clone(&counters);
        }
        Arc::clone(&self.engines.entry(worker.clone()).or_insert_with(|| {
            Arc::new(EngineCounters::new(worker.clone(), Arc::clone(&self.time)))
        }))
    }
}

/// This router's prefill work still to do on one engine, by [`Inflight::prefill_queue`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefillQueue {
    /// Tokens: what is left of the running pass, plus everything waiting for the next one. At
    /// most [`Inflight::inflight_tokens`].
    pub tokens: u64,
    /// Requests dispatched after the running pass began and without a first token: the ones
    /// that share the next pass with a request sent there now. At most
    /// [`Inflight::unprefilled`].
    pub waiting: u64,
}

/// What was dispatched to one engine since an instant.
struct Since {
    requests: u64,
    tokens: u64,
}

/// One request in flight to one engine. Dropping it releases the count and its work.
#[must_use = "the request counts as in flight only while the guard lives"]
#[derive(Debug)]
pub struct InflightGuard {
    counters: Arc<EngineCounters>,
    stage: Stage,
    rank: Option<u32>,
    tokens: u64,
    /// Whether [`InflightGuard::prefilled`] was called.
    prefilled: bool,
}

impl InflightGuard {
    /// The engine.
    pub fn worker(&self) -> &WorkerId {
        &self.counters.worker
    }

    /// The stage the request was dispatched for.
    pub fn stage(&self) -> Stage {
        self.stage
    }

    /// The data-parallel rank the request was sent to, when the router chose one.
    pub fn rank(&self) -> Option<u32> {
        self.rank
    }

    /// The request's prefill is done (its first token arrived): its work no longer counts in
    /// flight, on the engine or its rank, while the request itself does until the guard drops.
    /// Later calls do nothing. The ledger keeps the dispatch's work: it says what was sent.
    pub fn prefilled(&mut self) {
        if std::mem::replace(&mut self.prefilled, true) {
            return;
        }
        self.counters.unprefilled.fetch_sub(1, Ordering::Relaxed);
        // A pass ended with this first token; the next begins with whatever was dispatched.
        self.counters.pass_began.store(self.counters.time.now(), Ordering::Relaxed);
        let next = self.counters.dispatched.load(Ordering::Acquire);
        self.counters.pass_end_seq.store(next, Ordering::Relaxed);
        let tokens = std::mem::take(&mut self.tokens);
        self.counters.inflight_tokens.fetch_sub(tokens, Ordering::Relaxed);
        if let Some(rank) = self.rank {
            self.counters.with_rank(rank, |counters| {
                counters.tokens.fetch_sub(tokens, Ordering::Relaxed);
            });
        }
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.counters.by_stage[stage_index(self.stage)].fetch_sub(1, Ordering::Relaxed);
        self.counters.inflight_tokens.fetch_sub(self.tokens, Ordering::Relaxed);
        if !self.prefilled {
            self.counters.unprefilled.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(rank) = self.rank {
            self.counters.count_rank(rank, self.tokens, false);
        }
    }
}

#[cfg(test)]
mod tests;
