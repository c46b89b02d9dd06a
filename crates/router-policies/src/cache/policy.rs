//! `CacheAwarePolicy`: send a request where its prefix is cached, within pressure and
//! admission rules; a load fallback on a miss.

use std::sync::Arc;

use futures::future::BoxFuture;
use router_state_load::{EngineLoad, Inflight, LoadSnapshot};
use router_workers::{Stage, Worker};

use super::prefixes::Prefixes;
use super::source::{BlockSize, CacheSource};
use crate::admission::{Rejection, rejection};
use crate::pressure::{Comparison, NativePressure, PressureKey};
use crate::sampler::Sampler;
use crate::{
    AdmissionCheck, CacheAwareSettings, ConfigError, EngineAdmission, LoadHandles, Pick, PickError,
    PickReason, PickRequest, Policy, TieBreak, min_load_choices,
};

/// Cache-aware selection (`cache_aware`), for plain and prefill groups. The algorithm of
/// docs/design/POLICY_REFERENCE.md, within the group's candidates only:
///
/// 1. **Lookup**, once per prepared request per source and block size ([`PrefixMemo`]): the
///    candidates' block size is their worker's ([`crate::BlockSize::of`]: its `block_size`, or
///    its KV events'; candidates with neither are pictured from the router's own dispatches,
///    approximate mode). No lookup happens when the input is shorter than the minimum hit
///    (nothing could hit: a miss). A request without token ids, or a backend that is busy, timed out,
///    unreachable or malformed, is *unavailable*: the fallback runs with
///    [`PickReason::CacheUnavailable`] instead of [`PickReason::CacheMiss`].
/// 2. **Hits**: matched tokens = leading blocks held x block size, capped at the input; a hit
///    needs at least `cache_affinity_min_matched_tokens` (and at least one block), and
///    matched / input of at least `cache_affinity_min_matched_ratio` when set.
///    uncached = input - matched.
/// 3. **Candidate bound**: hits ordered by uncached tokens, then prefill pressure (among
///    holders with equal uncached work, compared as one set with one [`PressureKey`] per
///    engine, never a pairwise comparator), then worker id; the first
///    `min(n, max_workers, max(min_workers, ceil(ratio x n)))` are kept (n = group size).
/// 4. **Soft queue gate**: an engine whose fresh report shows at least `worker_queue_limit`
///    waiting requests is *queued* (a missing report fails open: not queued). Unqueued holders
///    are tried first.
/// 5. **Admission** is checked as the algorithm reaches a candidate; every rejection is kept.
/// 6. **Winner** among unqueued holders: the first admitted (least uncached work) leads; the
///    first later holder within `cache_switch_margin_tokens` of it that the leader is *more
///    pressured* than, and that is admitted, wins instead. More pressured: with
///    `pressure_abs_threshold_ms` set and queue-time estimates on both,
///    `leader_ms - other_ms > abs_ms` and `leader_ms > other_ms x rel`; otherwise the same on
///    waiting uncached tokens with `pressure_abs_threshold_tokens` (native reports on both;
///    without them nobody is more pressured). Reason [`PickReason::CacheHit`], or
///    [`PickReason::CacheApproximate`] for an engine pictured from dispatches alone.
/// 7. **Saturation** (gated holders left, no winner): without `saturation_queue_floor`, when
///    every engine of the group is queued, the winner rule runs over the gated holders (keep
///    the prefix; the wait is the same anywhere). With a floor, when no engine has a fresh
///    queue below it (unknown queues are not proof of idleness), the least-pressured admitted
///    gated holder is pinned. Either way admission still applies. Reason
///    [`PickReason::SaturationPin`].
/// 8. **Fallback**: power-of-k (`min_load_choices`) over the unqueued candidates not yet
///    rejected, then over the queued ones; each winner is checked, a rejected one is recorded
///    and the choice repeats without it. Only rejections left:
///    [`PickError::NoAdmissibleEngine`] with every rejection in the order met.
///
/// [`PrefixMemo`]: crate::PrefixMemo
#[derive(Debug)]
pub struct CacheAwarePolicy {
    source: Arc<CacheSource>,
    load: LoadHandles,
    settings: CacheAwareSettings,
    admission: Option<Arc<dyn EngineAdmission>>,
    sampler: Sampler,
}

/// One candidate as observed for one pick (read when the algorithm first needs it).
#[derive(Clone, Copy)]
struct Seen<'s> {
    load: Option<&'s EngineLoad>,
    pressure: Option<NativePressure>,
    inflight: u64,
    queued: bool,
}

/// A candidate holding a usable prefix.
#[derive(Clone, Copy)]
struct Hit {
    index: usize,
    uncached: u64,
}

/// One pick in progress: the candidates, their observations (from one snapshot, read lazily
/// so that a hit reads the load of the few candidates it considers, not of the whole group),
/// and the rejections so far.
struct Attempt<'a, 's> {
    engines: &'a [Arc<Worker>],
    stage: Stage,
    snapshot: &'s LoadSnapshot,
    inflight: &'a Inflight,
    queue_limit: Option<u64>,
    seen: Vec<Option<Seen<'s>>>,
    rejected: Vec<bool>,
    rejections: Vec<Rejection>,
}

impl<'s> Attempt<'_, 's> {
    fn seen(&mut self, index: usize) -> Seen<'s> {
        if let Some(seen) = self.seen[index] {
            return seen;
        }
        let id = self.engines[index].id();
        let load = self.snapshot.get(id);
        let seen = Seen {
            load,
            pressure: NativePressure::of(load),
            inflight: self.inflight.count(id),
            queued: matches!((self.queue_limit, load), (Some(l), Some(r)) if r.waiting_requests >= l),
        };
        self.seen[index] = Some(seen);
        seen
    }

    /// Whether the soft queue gate holds `index` back (never without a limit).
    fn queued(&mut self, index: usize) -> bool {
        self.queue_limit.is_some() && self.seen(index).queued
    }

    /// Pressure keys for `indices`, compared as one set.
    fn keys(&mut self, indices: impl Iterator<Item = usize> + Clone) -> Vec<PressureKey> {
        let seen: Vec<Seen<'s>> = indices.map(|i| self.seen(i)).collect();
        let comparison = Comparison::for_set(self.stage, seen.iter().map(|s| s.pressure));
        seen.iter().map(|s| comparison.key(s.pressure, s.inflight)).collect()
    }
}

impl CacheAwarePolicy {
    /// Cache-aware selection reading prefixes from `source` and load from `load`, admitting
    /// every engine. Fails when `settings` do not validate.
    pub fn new(
        source: Arc<CacheSource>,
        load: LoadHandles,
        settings: CacheAwareSettings,
    ) -> Result<Self, ConfigError> {
        settings.validate()?;
        let sampler = Sampler::for_tie_break(settings.tie_break);
        Ok(Self { source, load, settings, admission: None, sampler })
    }

    /// Checks candidates with `admission` as the algorithm reaches them.
    pub fn with_admission(mut self, admission: AdmissionCheck) -> Self {
        self.admission = Some(Arc::clone(admission.admission()));
        self
    }

    /// Samples the fallback from a generator seeded with `seed`, for reproducible runs.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.sampler = Sampler::seeded(seed);
        self
    }

    /// The prefix source.
    pub fn source(&self) -> &Arc<CacheSource> {
        &self.source
    }

    /// The tuning.
    pub fn settings(&self) -> &CacheAwareSettings {
        &self.settings
    }

    async fn select(
        &self,
        engines: &[Arc<Worker>],
        request: &PickRequest<'_>,
    ) -> Result<Pick, PickError> {
        if request.stage == Stage::Decode {
            return Err(PickError::UnsupportedStage {
                policy: "cache_aware",
                stage: request.stage,
            });
        }
        if engines.is_empty() {
            return Err(PickError::NoCandidates { stage: request.stage });
        }
        let min_hit = self.settings.cache_affinity_min_matched_tokens;
        let prefixes = Prefixes::look_up(&self.source, engines, request, min_hit).await?;
        let snapshot = self.load.table.snapshot();
        let pick = self.decide(engines, request, &prefixes, &snapshot)?;
        let held = prefixes.held(&pick.worker);
        let matched = held.map_or(0, |h| h.tokens);
        let uncached = request.input_tokens - matched.min(request.input_tokens);
        Ok(pick.with_uncached_tokens(uncached).with_cached_prefix(held))
    }

    /// Steps 2 to 8 over one load snapshot.
    fn decide(
        &self,
        engines: &[Arc<Worker>],
        request: &PickRequest<'_>,
        prefixes: &Prefixes,
        snapshot: &LoadSnapshot,
    ) -> Result<Pick, PickError> {
        let n = engines.len();
        let mut attempt = Attempt {
            engines,
            stage: request.stage,
            snapshot,
            inflight: &self.load.inflight,
            queue_limit: self.settings.worker_queue_limit,
            seen: vec![None; n],
            rejected: vec![false; n],
            rejections: Vec::new(),
        };
        let hits = self.hits(&mut attempt, request.input_tokens, prefixes);
        let (queued, unqueued): (Vec<Hit>, Vec<Hit>) =
            hits.into_iter().partition(|h| attempt.queued(h.index));
        if let Some(index) = self.winner(&mut attempt, &unqueued)? {
            let reason = match BlockSize::is_approximate(&engines[index]) {
                true => PickReason::CacheApproximate,
                false => PickReason::CacheHit,
            };
            return Ok(Pick::new(Arc::clone(&engines[index]), reason));
        }
        if !queued.is_empty() {
            let pinned = match self.settings.saturation_queue_floor {
                None if (0..n).all(|i| attempt.queued(i)) => self.winner(&mut attempt, &queued)?,
                None => None,
                Some(floor) => {
                    let below = (0..n)
                        .any(|i| attempt.seen(i).load.is_some_and(|l| l.waiting_requests < floor));
                    if below { None } else { self.least_pressured(&mut attempt, &queued)? }
                }
            };
            if let Some(index) = pinned {
                return Ok(Pick::new(Arc::clone(&engines[index]), PickReason::SaturationPin));
            }
        }
        let reason = match prefixes.unavailable {
            Some(_) => PickReason::CacheUnavailable,
            None => PickReason::CacheMiss,
        };
        self.fallback(attempt, request, reason)
    }

    /// Steps 2 and 3: the usable holders, ordered and bounded. Pressure only orders holders
    /// with equal uncached work, so only those are observed, each tie compared as one set.
    fn hits(&self, attempt: &mut Attempt<'_, '_>, input: u64, prefixes: &Prefixes) -> Vec<Hit> {
        let s = &self.settings;
        let min_hit = s.cache_affinity_min_matched_tokens.max(1);
        let mut hits: Vec<Hit> = Vec::new();
        for (index, engine) in attempt.engines.iter().enumerate() {
            let matched = prefixes.matched(engine).min(input);
            let ratio_ok = s
                .cache_affinity_min_matched_ratio
                .is_none_or(|ratio| matched as f64 / input as f64 >= ratio);
            if matched >= min_hit && ratio_ok {
                hits.push(Hit { index, uncached: input - matched });
            }
        }
        let bound = self.candidate_bound(attempt.engines.len());
        hits.sort_unstable_by_key(|h| h.uncached);
        // Everything tied with the last kept holder can still make the cut.
        if let Some(last) = bound.checked_sub(1).and_then(|at| hits.get(at)).map(|h| h.uncached) {
            let end = hits.partition_point(|h| h.uncached <= last);
            hits.truncate(end);
        }
        let mut start = 0;
        while start < hits.len() {
            let uncached = hits[start].uncached;
            let end = start + hits[start..].partition_point(|h| h.uncached == uncached);
            if end - start > 1 {
                let tie = &mut hits[start..end];
                let keys = attempt.keys(tie.iter().map(|h| h.index));
                let engines = attempt.engines;
                let mut keyed: Vec<(PressureKey, Hit)> =
                    keys.into_iter().zip(tie.iter().copied()).collect();
                keyed.sort_unstable_by(|(ka, a), (kb, b)| {
                    ka.cmp(kb).then_with(|| engines[a.index].id().cmp(engines[b.index].id()))
                });
                for (slot, (_, hit)) in tie.iter_mut().zip(keyed) {
                    *slot = hit;
                }
            }
            start = end;
        }
        hits.truncate(bound);
        hits
    }

    /// `min(n, max_workers, max(min_workers, ceil(ratio x n)))`.
    pub(super) fn candidate_bound(&self, n: usize) -> usize {
        let s = &self.settings;
        let proportional = (s.cache_candidate_ratio * n as f64).ceil() as usize;
        n.min(s.cache_candidate_max_workers).min(s.cache_candidate_min_workers.max(proportional))
    }

    /// Step 6 over `hits` (in candidate order): the first admitted leads, unless a later
    /// holder within the switch margin is less pressured by the guard and admitted.
    fn winner(
        &self,
        attempt: &mut Attempt<'_, '_>,
        hits: &[Hit],
    ) -> Result<Option<usize>, PickError> {
        let mut rest = hits.iter();
        let leader = loop {
            let Some(hit) = rest.next() else { return Ok(None) };
            if self.admit(attempt, hit.index) {
                break hit;
            }
        };
        let ceiling = leader.uncached.saturating_add(self.settings.cache_switch_margin_tokens);
        for other in rest.take_while(|h| h.uncached <= ceiling) {
            if self.more_pressured(attempt, leader.index, other.index)
                && self.admit(attempt, other.index)
            {
                return Ok(Some(other.index));
            }
        }
        Ok(Some(leader.index))
    }

    /// The pressure guard: whether `leader` is more pressured than `other`.
    fn more_pressured(&self, attempt: &mut Attempt<'_, '_>, leader: usize, other: usize) -> bool {
        let s = &self.settings;
        let (Some(l), Some(o)) = (attempt.seen(leader).pressure, attempt.seen(other).pressure)
        else {
            return false;
        };
        if let (Some(abs_ms), Some(l_ms), Some(o_ms)) =
            (s.pressure_abs_threshold_ms, l.prefill_queue_ms, o.prefill_queue_ms)
        {
            return l_ms - o_ms > abs_ms && l_ms > o_ms * s.pressure_rel_threshold;
        }
        let (l_tokens, o_tokens) = (l.waiting_uncached_tokens, o.waiting_uncached_tokens);
        l_tokens.saturating_sub(o_tokens) > s.pressure_abs_threshold_tokens
            && l_tokens as f64 > o_tokens as f64 * s.pressure_rel_threshold
    }

    /// Step 7 with a floor: the least-pressured admitted holder of `hits`.
    fn least_pressured(
        &self,
        attempt: &mut Attempt<'_, '_>,
        hits: &[Hit],
    ) -> Result<Option<usize>, PickError> {
        let keys = attempt.keys(hits.iter().map(|h| h.index));
        let engines = attempt.engines;
        let mut order: Vec<(PressureKey, Hit)> =
            keys.into_iter().zip(hits.iter().copied()).collect();
        order.sort_unstable_by(|(ka, a), (kb, b)| {
            (ka, a.uncached)
                .cmp(&(kb, b.uncached))
                .then_with(|| engines[a.index].id().cmp(engines[b.index].id()))
        });
        for (_, hit) in order {
            if self.admit(attempt, hit.index) {
                return Ok(Some(hit.index));
            }
        }
        Ok(None)
    }

    /// Step 8: power-of-k over the unqueued candidates, then the queued ones, each winner
    /// checked, rejected ones dropped, until one is admitted or none is left.
    fn fallback(
        &self,
        mut attempt: Attempt<'_, '_>,
        request: &PickRequest<'_>,
        reason: PickReason,
    ) -> Result<Pick, PickError> {
        let k = self.settings.min_load_choices;
        let engines = attempt.engines;
        for queued in [false, true] {
            let mut pool: Vec<usize> = (0..engines.len())
                .filter(|&i| !attempt.rejected[i] && attempt.queued(i) == queued)
                .collect();
            if self.settings.tie_break == TieBreak::Request {
                // A request-seeded draw must see the candidates in an order every replica
                // shares.
                pool.sort_by(|&a, &b| engines[a].id().cmp(engines[b].id()));
            }
            while !pool.is_empty() {
                let workers: Vec<&Arc<Worker>> = pool.iter().map(|&i| &engines[i]).collect();
                let (snapshot, inflight, stage) =
                    (attempt.snapshot, attempt.inflight, attempt.stage);
                let Some(choice) = self.sampler.with_request(request, |rng| {
                    min_load_choices(&workers, stage, k, snapshot, inflight, rng)
                }) else {
                    break;
                };
                let index = pool[choice.index];
                match self.check(&engines[index], choice.load, choice.inflight) {
                    None => return Ok(Pick::new(Arc::clone(&engines[index]), reason)),
                    Some(rejection) => {
                        attempt.rejections.push(rejection);
                        pool.remove(choice.index);
                    }
                }
            }
        }
        Err(PickError::NoAdmissibleEngine { rejections: attempt.rejections })
    }

    /// Checks candidate `index` on its observation; a rejection is recorded.
    fn admit(&self, attempt: &mut Attempt<'_, '_>, index: usize) -> bool {
        let seen = attempt.seen(index);
        match self.check(&attempt.engines[index], seen.load, seen.inflight) {
            None => true,
            Some(rejection) => {
                attempt.rejections.push(rejection);
                attempt.rejected[index] = true;
                false
            }
        }
    }

    /// Admission on one observation: `None` when admitted.
    fn check(
        &self,
        engine: &Worker,
        load: Option<&EngineLoad>,
        inflight: u64,
    ) -> Option<Rejection> {
        rejection(self.admission.as_deref(), engine, load, inflight)
    }
}

impl Policy for CacheAwarePolicy {
    fn pick<'a>(
        &'a self,
        engines: &'a [Arc<Worker>],
        request: &'a PickRequest<'a>,
    ) -> BoxFuture<'a, Result<Pick, PickError>> {
        Box::pin(self.select(engines, request))
    }

    fn name(&self) -> &'static str {
        "cache_aware"
    }

    fn supports_stage(&self, stage: Stage) -> bool {
        stage != Stage::Decode
    }
}
