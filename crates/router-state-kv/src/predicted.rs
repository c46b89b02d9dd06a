//! Predicted entries: the blocks the router has just sent to an engine, before the engine's KV
//! events say it holds them.
//!
//! KV events arrive after prefill. Between a dispatch and its `BlockStored`, the index does not
//! know that the engine is about to hold the prompt, so a burst of requests sharing a new prefix
//! would be scattered over the fleet. [`Predictions`] closes that gap: each dispatch records the
//! request's local block hashes (see [`crate::hash`]) for its engine with a short expiry, and
//! lookups count them beside the index ([`Predictions::overlay`]).
//!
//! They are never engine truth: they live apart from the index, are not in its statistics, and
//! go away
//! - on expiry ([`PredictionConfig::ttl`]), so an engine whose events stop is back to load-only
//!   selection after it;
//! - when the engine's own events cover them (a lookup finds the index holding those blocks:
//!   their predictions are replaced and dropped; the ones beyond still count);
//! - on a contradicting event: the engine removed those blocks, cleared everything, or left the
//!   fleet ([`Predictions::forget`], [`Predictions::clear`], [`Predictions::remove_worker`]);
//! - beyond [`PredictionConfig::max_blocks_per_worker`], oldest first.
//!
//! An engine with no KV events (no endpoint configured, advertised or discovered) has no
//! truth to wait for: the router's own dispatches are its only picture of that engine's
//! cache, as in sglang-router's cache-aware mode over plain URLs. Its dispatches are recorded
//! as *approximate* entries ([`Predictions::record_approximate`]), which live
//! [`PredictionConfig::approximate_ttl`] and share [`PredictionConfig::approximate_max_blocks`]
//! evenly between the (model, engine) pairs that hold them. An engine that gains KV events
//! (a new incarnation with an endpoint) drops its approximate entries at its first record
//! ahead of events: from then on its events are the truth.
//!
//! Every method takes the current instant, so the rules are tested without a clock.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use router_workers::{ModelId, WorkerId};

use crate::{Medium, PrefixMatch, PrefixMatches};

/// Predicted-entry settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PredictionConfig {
    /// How long a recorded block counts without the engine confirming it.
    pub ttl: Duration,
    /// Most blocks remembered per (model, worker); older records are dropped first.
    pub max_blocks_per_worker: usize,
    /// How long a dispatch counts on an engine without KV events ([`Duration::ZERO`]: the
    /// router keeps no picture of such engines).
    pub approximate_ttl: Duration,
    /// Most approximate blocks remembered over every (model, worker), shared evenly between
    /// those holding any; older records are dropped first.
    pub approximate_max_blocks: usize,
}

impl Default for PredictionConfig {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(5),
            max_blocks_per_worker: 1 << 16,
            approximate_ttl: Duration::from_secs(120),
            approximate_max_blocks: 1_000_000,
        }
    }
}

impl PredictionConfig {
    /// Whether dispatches to engines with KV events are recorded.
    fn ahead_of_events(&self) -> bool {
        !self.ttl.is_zero() && self.max_blocks_per_worker > 0
    }

    /// Whether dispatches to engines without KV events are recorded.
    fn approximate(&self) -> bool {
        !self.approximate_ttl.is_zero() && self.approximate_max_blocks > 0
    }
}

/// Unexpired entries, as `/admin/state` and `/metrics` count them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PredictedBlocks {
    /// Blocks recorded ahead of an engine's KV events.
    pub predicted: u64,
    /// Blocks recorded on engines without KV events.
    pub approximate: u64,
}

/// The predicted blocks of one (model, worker).
#[derive(Debug, Default)]
struct Entries {
    /// Local block hash to its expiry and the data-parallel rank it was sent to, if the router
    /// chose one.
    expiry: HashMap<u64, (Instant, Option<u32>)>,
    /// Records in the order made (so in expiry order), with duplicates; an item whose expiry
    /// differs from the map's is a superseded record.
    order: VecDeque<(Instant, u64)>,
}

impl Entries {
    fn record(&mut self, hashes: &[u64], rank: Option<u32>, expiry: Instant, cap: usize) {
        for &hash in hashes {
            self.expiry.insert(hash, (expiry, rank));
            self.order.push_back((expiry, hash));
        }
        self.trim(cap);
    }

    /// Drops the oldest records beyond `cap`.
    fn trim(&mut self, cap: usize) {
        while self.order.len() > cap {
            self.pop_oldest();
        }
    }

    /// Drops records that expired by `now`.
    fn prune(&mut self, now: Instant) {
        while self.order.front().is_some_and(|(expiry, _)| *expiry <= now) {
            self.pop_oldest();
        }
    }

    fn pop_oldest(&mut self) {
        if let Some((expiry, hash)) = self.order.pop_front()
            && self.expiry.get(&hash).is_some_and(|(e, _)| *e == expiry)
        {
            self.expiry.remove(&hash);
        }
    }

    /// Leading blocks of `hashes` predicted and unexpired at `now`, on one rank: the first
    /// block's (a prefix split over two ranks is held whole by neither).
    fn leading(&self, hashes: &[u64], now: Instant) -> (usize, Option<u32>) {
        let live = |h: &u64| self.expiry.get(h).filter(|(e, _)| *e > now).map(|(_, rank)| *rank);
        let Some(rank) = hashes.first().and_then(live) else { return (0, None) };
        (hashes.iter().take_while(|h| live(h) == Some(rank)).count(), rank)
    }

    fn forget(&mut self, hashes: &[u64]) {
        for hash in hashes {
            self.expiry.remove(hash);
        }
        // Superseded records in `order` are skipped when they reach the front.
    }

    fn is_empty(&self) -> bool {
        self.expiry.is_empty()
    }
}

type Key = (ModelId, WorkerId);

/// The entries of one (model, worker) and what they stand for.
#[derive(Debug, Default)]
struct Slot {
    /// Recorded on an engine without KV events ([`Predictions::record_approximate`]).
    approximate: bool,
    entries: Mutex<Entries>,
}

/// Predicted entries of every (model, worker). Shared as `Arc<Predictions>` between the
/// dispatcher (which records), the prefix sources (which read) and the index (which
/// contradicts).
#[derive(Debug, Default)]
pub struct Predictions {
    config: PredictionConfig,
    workers: RwLock<HashMap<Key, Arc<Slot>>>,
}

impl Predictions {
    /// No predictions yet.
    pub fn new(config: PredictionConfig) -> Self {
        Self { config, workers: RwLock::new(HashMap::new()) }
    }

    /// The slot of (`model`, `worker`) for records of kind `approximate`, and the share of
    /// `approximate_max_blocks` each approximate slot may hold. A slot of the other kind is
    /// replaced (its records were of a picture that no longer holds); a new approximate slot
    /// trims every other to the smaller share, so that together they stay within the bound.
    fn slot(&self, model: &ModelId, worker: &WorkerId, approximate: bool) -> (Arc<Slot>, usize) {
        let key = (model.clone(), worker.clone());
        let share = |holders: usize| (self.config.approximate_max_blocks / holders.max(1)).max(1);
        {
            let workers = self.workers.read();
            if let Some(found) = workers.get(&key).filter(|s| s.approximate == approximate) {
                let holders = workers.values().filter(|s| s.approximate).count();
                return (Arc::clone(found), share(holders));
            }
        }
        let mut workers = self.workers.write();
        let fresh = Arc::new(Slot { approximate, ..Slot::default() });
        let slot = Arc::clone(workers.entry(key).or_insert_with(|| Arc::clone(&fresh)));
        let slot = match slot.approximate == approximate {
            true => slot,
            false => {
                workers.insert((model.clone(), worker.clone()), Arc::clone(&fresh));
                fresh
            }
        };
        let share = share(workers.values().filter(|s| s.approximate).count());
        if approximate {
            for other in workers.values().filter(|s| s.approximate) {
                other.entries.lock().trim(share);
            }
        }
        (slot, share)
    }

    /// Records that `worker` is about to hold the blocks `hashes` (a prompt's local block
    /// hashes, in order) of `model`, until `now + ttl`.
    pub fn record(&self, model: &ModelId, worker: &WorkerId, hashes: &[u64], now: Instant) {
        self.record_kind(false, model, worker, None, hashes, now);
    }

    /// [`Predictions::record`] for a request the router sent to data-parallel rank `rank`:
    /// lookups then report the prefix on that rank.
    pub fn record_on_rank(
        &self,
        model: &ModelId,
        worker: &WorkerId,
        rank: u32,
        hashes: &[u64],
        now: Instant,
    ) {
        self.record_kind(false, model, worker, Some(rank), hashes, now);
    }

    /// Records `hashes` as entries of kind `approximate`, for that kind's life and within its
    /// bound; nothing when that kind is off.
    fn record_kind(
        &self,
        approximate: bool,
        model: &ModelId,
        worker: &WorkerId,
        rank: Option<u32>,
        hashes: &[u64],
        now: Instant,
    ) {
        let config = &self.config;
        let on = if approximate { config.approximate() } else { config.ahead_of_events() };
        if hashes.is_empty() || !on {
            return;
        }
        let (slot, share) = self.slot(model, worker, approximate);
        let (ttl, cap) = match approximate {
            true => (config.approximate_ttl, share),
            false => (config.ttl, config.max_blocks_per_worker),
        };
        let mut entries = slot.entries.lock();
        entries.prune(now);
        entries.record(hashes, rank, now + ttl, cap);
    }

    /// Records that `worker`, an engine without KV events, was sent the blocks `hashes` of
    /// `model` (on data-parallel rank `rank` when the router chose one): it is taken to hold
    /// them until `now + approximate_ttl`, within its share of `approximate_max_blocks`.
    pub fn record_approximate(
        &self,
        model: &ModelId,
        worker: &WorkerId,
        rank: Option<u32>,
        hashes: &[u64],
        now: Instant,
    ) {
        self.record_kind(true, model, worker, rank, hashes, now);
    }

    /// Leading blocks of `hashes` that `worker` is predicted to hold at `now`.
    pub fn leading(&self, model: &ModelId, worker: &WorkerId, hashes: &[u64], now: Instant) -> u32 {
        let key = (model.clone(), worker.clone());
        let Some(slot) = self.workers.read().get(&key).map(Arc::clone) else { return 0 };
        let (blocks, _) = slot.entries.lock().leading(hashes, now);
        u32::try_from(blocks).unwrap_or(u32::MAX)
    }

    /// `matches` (the index's answer for `hashes` in `model`) with the predicted entries laid
    /// over it: a worker predicted to hold the blocks that follow the ones the index says it
    /// holds is reported with both (on the rank the prediction was sent to, else the rank
    /// indexed, else 0; tier GPU, where prefill leaves it).
    /// The predictions of blocks the index already holds are replaced by it and dropped.
    pub fn overlay(
        &self,
        model: &ModelId,
        hashes: &[u64],
        mut matches: PrefixMatches,
        now: Instant,
    ) -> PrefixMatches {
        if hashes.is_empty() {
            return matches;
        }
        let candidates: Vec<(WorkerId, Arc<Slot>)> = self
            .workers
            .read()
            .iter()
            .filter(|((m, _), _)| m == model)
            .map(|((_, w), slot)| (w.clone(), Arc::clone(slot)))
            .collect();
        let mut changed = false;
        for (worker, slot) in candidates {
            let mut entries = slot.entries.lock();
            // What the index holds is engine truth: predictions of it are replaced. The
            // prediction goes on from there (the blocks a burst's first request will store
            // after the ones every prompt shares, such as its chat template's opening).
            let indexed = (matches.blocks(&worker) as usize).min(hashes.len());
            entries.forget(&hashes[..indexed]);
            let (beyond, rank) = entries.leading(&hashes[indexed..], now);
            if beyond == 0 {
                continue;
            }
            let blocks = u32::try_from(indexed + beyond).unwrap_or(u32::MAX);
            match matches.matches.iter_mut().find(|m| m.worker == worker) {
                Some(found) => {
                    let rank = rank.unwrap_or(found.rank);
                    *found = PrefixMatch { blocks, rank, tier: Medium::Gpu, ..found.clone() };
                }
                None => {
                    let rank = rank.unwrap_or(0);
                    matches.matches.push(PrefixMatch { worker, rank, blocks, tier: Medium::Gpu })
                }
            }
            changed = true;
        }
        if changed {
            matches.matches.sort_by(|a, b| {
                b.blocks.cmp(&a.blocks).then(a.tier.cmp(&b.tier)).then(a.worker.cmp(&b.worker))
            });
        }
        matches
    }

    /// The engine removed these blocks (local hashes): they are no longer predicted.
    pub fn forget(&self, model: &ModelId, worker: &WorkerId, hashes: &[u64]) {
        let key = (model.clone(), worker.clone());
        if let Some(slot) = self.workers.read().get(&key) {
            slot.entries.lock().forget(hashes);
        }
    }

    /// The engine cleared its cache: nothing of `model` is predicted on it any more.
    pub fn clear(&self, model: &ModelId, worker: &WorkerId) {
        self.workers.write().remove(&(model.clone(), worker.clone()));
    }

    /// The worker left: nothing is predicted on it in any model.
    pub fn remove_worker(&self, worker: &WorkerId) {
        self.workers.write().retain(|(_, w), _| w != worker);
    }

    /// Whether `worker`'s picture in `model` is approximate: it holds entries recorded
    /// without KV events.
    pub fn is_approximate(&self, model: &ModelId, worker: &WorkerId) -> bool {
        let key = (model.clone(), worker.clone());
        self.workers.read().get(&key).is_some_and(|slot| slot.approximate)
    }

    /// Unexpired blocks over every model and worker at `now`, by kind (for `/admin/state`
    /// and `/metrics`; drops what expired on the way).
    pub fn blocks(&self, now: Instant) -> PredictedBlocks {
        let mut workers = self.workers.write();
        let mut total = PredictedBlocks::default();
        workers.retain(|_, slot| {
            let mut entries = slot.entries.lock();
            entries.prune(now);
            let held = entries.expiry.len() as u64;
            match slot.approximate {
                true => total.approximate += held,
                false => total.predicted += held,
            }
            !entries.is_empty()
        });
        total
    }
}

#[cfg(test)]
mod tests;
