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
}

impl Default for PredictionConfig {
    fn default() -> Self {
        Self { ttl: Duration::from_secs(5), max_blocks_per_worker: 1 << 16 }
    }
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

/// Predicted entries of every (model, worker). Shared as `Arc<Predictions>` between the
/// dispatcher (which records), the prefix sources (which read) and the index (which
/// contradicts).
#[derive(Debug, Default)]
pub struct Predictions {
    config: PredictionConfig,
    workers: RwLock<HashMap<Key, Arc<Mutex<Entries>>>>,
}

impl Predictions {
    /// No predictions yet.
    pub fn new(config: PredictionConfig) -> Self {
        Self { config, workers: RwLock::new(HashMap::new()) }
    }

    fn entries(&self, model: &ModelId, worker: &WorkerId) -> Arc<Mutex<Entries>> {
        let key = (model.clone(), worker.clone());
        if let Some(found) = self.workers.read().get(&key) {
            return Arc::clone(found);
        }
        Arc::clone(self.workers.write().entry(key).or_default())
    }

    /// Records that `worker` is about to hold the blocks `hashes` (a prompt's local block
    /// hashes, in order) of `model`, until `now + ttl`.
    pub fn record(&self, model: &ModelId, worker: &WorkerId, hashes: &[u64], now: Instant) {
        self.record_inner(model, worker, None, hashes, now);
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
        self.record_inner(model, worker, Some(rank), hashes, now);
    }

    fn record_inner(
        &self,
        model: &ModelId,
        worker: &WorkerId,
        rank: Option<u32>,
        hashes: &[u64],
        now: Instant,
    ) {
        if hashes.is_empty() || self.config.max_blocks_per_worker == 0 {
            return;
        }
        let entries = self.entries(model, worker);
        let mut entries = entries.lock();
        entries.prune(now);
        entries.record(hashes, rank, now + self.config.ttl, self.config.max_blocks_per_worker);
    }

    /// Leading blocks of `hashes` that `worker` is predicted to hold at `now`.
    pub fn leading(&self, model: &ModelId, worker: &WorkerId, hashes: &[u64], now: Instant) -> u32 {
        let key = (model.clone(), worker.clone());
        let Some(entries) = self.workers.read().get(&key).map(Arc::clone) else { return 0 };
        let (blocks, _) = entries.lock().leading(hashes, now);
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
        let candidates: Vec<(WorkerId, Arc<Mutex<Entries>>)> = self
            .workers
            .read()
            .iter()
            .filter(|((m, _), _)| m == model)
            .map(|((_, w), entries)| (w.clone(), Arc::clone(entries)))
            .collect();
        let mut changed = false;
        for (worker, entries) in candidates {
            let mut entries = entries.lock();
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
        if let Some(entries) = self.workers.read().get(&key) {
            entries.lock().forget(hashes);
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

    /// Unexpired predicted blocks over every model and worker at `now` (for `/admin/state`;
    /// drops what expired on the way).
    pub fn blocks(&self, now: Instant) -> u64 {
        let mut workers = self.workers.write();
        let mut total = 0;
        workers.retain(|_, entries| {
            let mut entries = entries.lock();
            entries.prune(now);
            total += entries.expiry.len() as u64;
            !entries.is_empty()
        });
        total
    }
}

#[cfg(test)]
mod tests;
