//! The prefix index: one radix tree per model of which (worker, rank) holds which block.
//!
//! Its node bound holds over all models together: [`IndexConfig::max_nodes`] is split evenly
//! between the [`IndexConfig::models`] trees it may hold, and a holder for one model more is
//! refused ([`IndexError::TooManyModels`]).
//!
//! [`KvIndex`] is shared as `Arc<KvIndex>`. Writers go through a [`Holder`] handle (one per
//! worker incarnation, data-parallel rank and model); readers call [`KvIndex::lookup`].
//! Each model's tree sits behind a fair `RwLock`: lookups share it, and a writer yields it to
//! waiting readers every [`WRITE_CHUNK`] block operations, so a reader waits at most for one
//! chunk however large the batch, clear or purge being applied.

mod lookup;
mod remove;
mod store;
mod tree;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{RwLock, RwLockWriteGuard};
use router_workers::{ModelId, WorkerId};

use self::lookup::Hit;
use self::tree::{HolderShared, MAX_HOLDERS, Tree};
use crate::hash::{Hasher, Salt};
use crate::wire::Event;
use crate::{IndexError, Medium, Predictions, SkipCounts, SkipReason};

/// Block operations a writer performs between offers to yield the lock to readers.
pub const WRITE_CHUNK: usize = 256;

/// Index settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexConfig {
    /// Most nodes (blocks) over all models' trees together.
    pub max_nodes: usize,
    /// Most models indexed. Each model's tree keeps at most `max_nodes / models` nodes
    /// (beyond it the CLOCK hand evicts leaves), so the total never exceeds `max_nodes`.
    pub models: usize,
}

impl Default for IndexConfig {
    fn default() -> Self {
        Self { max_nodes: 1 << 22, models: 1 }
    }
}

impl IndexConfig {
    /// `max_nodes` split evenly between `models` trees.
    pub fn new(max_nodes: usize, models: usize) -> Self {
        Self { max_nodes, models }
    }

    /// The share of one model's tree: `max_nodes / models`.
    pub fn max_nodes_per_model(&self) -> usize {
        self.max_nodes / self.models.max(1)
    }
}

/// How many leading blocks of a request one worker holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixMatch {
    /// The worker.
    pub worker: WorkerId,
    /// The data-parallel rank with the longest match (lowest rank on ties).
    pub rank: u32,
    /// Leading blocks held (contiguous from the first block).
    pub blocks: u32,
    /// The slowest tier among those blocks, each block counted at its fastest copy: `Gpu`
    /// means the whole match is in device memory.
    pub tier: Medium,
}

/// The result of a lookup: every worker holding at least the first block, longest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixMatches {
    /// Blocks in the query.
    pub query_blocks: usize,
    /// One entry per worker, ordered by `blocks` (longest first), then tier, then worker.
    pub matches: Vec<PrefixMatch>,
}

impl PrefixMatches {
    /// The match of one worker, if it holds the first block.
    pub fn get(&self, worker: &WorkerId) -> Option<&PrefixMatch> {
        self.matches.iter().find(|m| &m.worker == worker)
    }

    /// Leading blocks `worker` holds (0 when none).
    pub fn blocks(&self, worker: &WorkerId) -> u32 {
        self.get(worker).map_or(0, |m| m.blocks)
    }

    /// Whether no worker holds even the first block.
    pub fn is_empty(&self) -> bool {
        self.matches.is_empty()
    }
}

/// What applying a batch did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// Events applied (fully).
    pub events: u64,
    /// Blocks stored (new or re-stored).
    pub stored: u64,
    /// Blocks the holder no longer holds after removals.
    pub removed: u64,
    /// Removals of engine hashes this holder was not known to hold.
    pub unknown_removals: u64,
    /// `AllBlocksCleared` events applied.
    pub clears: u64,
    /// Events skipped, by reason.
    pub skipped: SkipCounts,
}

/// Sizes of one model's tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelStats {
    /// The model.
    pub model: ModelId,
    /// Live nodes (distinct blocks).
    pub nodes: u64,
    /// Approximate heap bytes.
    pub bytes: u64,
    /// Sum over holders of blocks held: the number of (block, holder) pairs.
    pub block_holders: u64,
    /// Registered holders (worker incarnation x rank), live or being purged.
    pub holders: u64,
    /// Nodes evicted by the node limit since start.
    pub evicted: u64,
}

/// Sizes of the whole index.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Live nodes over all models.
    pub nodes: u64,
    /// Approximate heap bytes over all models.
    pub bytes: u64,
    /// (block, holder) pairs over all models.
    pub block_holders: u64,
    /// Nodes evicted since start over all models.
    pub evicted: u64,
    /// Per model, sorted by model id.
    pub models: Vec<ModelStats>,
}

/// One model's tree plus statistics readable without its lock.
struct ModelIndex {
    model: ModelId,
    tree: RwLock<Tree>,
    nodes: AtomicU64,
    bytes: AtomicU64,
    block_holders: AtomicU64,
    holders: AtomicU64,
    evicted: AtomicU64,
}

impl ModelIndex {
    fn publish(&self, tree: &Tree) {
        self.nodes.store(tree.live_nodes as u64, Ordering::Relaxed);
        self.bytes.store(tree.approx_bytes(), Ordering::Relaxed);
        self.block_holders.store(tree.holder_blocks(), Ordering::Relaxed);
        self.holders.store(tree.holders.len() as u64, Ordering::Relaxed);
        self.evicted.store(tree.evicted, Ordering::Relaxed);
    }

    fn stats(&self) -> ModelStats {
        ModelStats {
            model: self.model.clone(),
            nodes: self.nodes.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            block_holders: self.block_holders.load(Ordering::Relaxed),
            holders: self.holders.load(Ordering::Relaxed),
            evicted: self.evicted.load(Ordering::Relaxed),
        }
    }
}

/// Yields the write lock to waiting readers once `ops` reaches a chunk.
fn pace(tree: &mut RwLockWriteGuard<'_, Tree>, ops: &mut usize) {
    if *ops >= WRITE_CHUNK {
        RwLockWriteGuard::bump(tree);
        *ops = 0;
    }
}

/// Removes every block of holder `slot`, yielding the lock between chunks.
fn purge(tree: &mut RwLockWriteGuard<'_, Tree>, slot: u32) -> u64 {
    let links = tree.take_links(slot);
    let mut removed = 0;
    for chunk in links.chunks(WRITE_CHUNK) {
        removed += tree.purge_links(slot, chunk);
        RwLockWriteGuard::bump(tree);
    }
    tree.publish_holder(slot);
    removed
}

/// The prefix index of every model.
pub struct KvIndex {
    config: IndexConfig,
    models: RwLock<HashMap<ModelId, Arc<ModelIndex>>>,
    /// Told of every removal and clear, so that no prediction outlives a contradicting event.
    predictions: Option<Arc<Predictions>>,
}

impl std::fmt::Debug for KvIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stats = self.stats();
        f.debug_struct("KvIndex")
            .field("models", &stats.models.len())
            .field("nodes", &stats.nodes)
            .finish()
    }
}

impl Default for KvIndex {
    fn default() -> Self {
        Self::new(IndexConfig::default())
    }
}

impl KvIndex {
    /// An empty index.
    pub fn new(config: IndexConfig) -> Self {
        Self { config, models: RwLock::new(HashMap::new()), predictions: None }
    }

    /// This index telling `predictions` of every block an engine removes, every clear and
    /// every worker removal (the index itself never counts predictions).
    pub fn with_predictions(mut self, predictions: Arc<Predictions>) -> Self {
        self.predictions = Some(predictions);
        self
    }

    /// The predicted entries this index contradicts, when set.
    pub fn predictions(&self) -> Option<&Arc<Predictions>> {
        self.predictions.as_ref()
    }

    fn model(&self, model: &ModelId) -> Option<Arc<ModelIndex>> {
        self.models.read().get(model).cloned()
    }

    fn model_or_insert(&self, model: &ModelId) -> Result<Arc<ModelIndex>, IndexError> {
        if let Some(found) = self.model(model) {
            return Ok(found);
        }
        let mut models = self.models.write();
        if !models.contains_key(model) && models.len() >= self.config.models {
            return Err(IndexError::TooManyModels {
                model: model.clone(),
                limit: self.config.models,
            });
        }
        Ok(Arc::clone(models.entry(model.clone()).or_insert_with(|| {
            Arc::new(ModelIndex {
                model: model.clone(),
                tree: RwLock::new(Tree::new(self.config.max_nodes_per_model())),
                nodes: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
                block_holders: AtomicU64::new(0),
                holders: AtomicU64::new(0),
                evicted: AtomicU64::new(0),
            })
        })))
    }

    /// The write handle of one worker incarnation's rank in one model, created on first use
    /// (the same identity gets the same handle back). Refused for a model beyond
    /// [`IndexConfig::models`] and beyond the holder limit of a tree.
    pub fn holder(
        &self,
        model: &ModelId,
        worker: &WorkerId,
        incarnation: u64,
        rank: u32,
        block_size: u32,
    ) -> Result<Holder, IndexError> {
        let index = self.model_or_insert(model)?;
        let mut tree = index.tree.write();
        let (slot, generation, shared) =
            tree.register(worker, incarnation, rank).ok_or_else(|| IndexError::TooManyHolders {
                model: model.clone(),
                limit: MAX_HOLDERS,
            })?;
        index.publish(&tree);
        drop(tree);
        Ok(Holder {
            model: index,
            slot,
            generation,
            block_size,
            shared,
            worker: worker.clone(),
            rank,
            predictions: self.predictions.clone(),
        })
    }

    /// Which workers hold how many leading blocks of a request, given its local block hashes
    /// (see [`crate::hash`]). Time is proportional to the matched depth, not to the fleet.
    pub fn lookup(&self, model: &ModelId, hashes: &[u64]) -> PrefixMatches {
        self.lookup_with(model, hashes.len(), hashes.iter().copied())
    }

    /// Hashes a request's tokens (see [`crate::hash`]) and looks them up.
    pub fn lookup_tokens(
        &self,
        model: &ModelId,
        tokens: &[u32],
        block_size: u32,
        salt: Salt<'_>,
    ) -> PrefixMatches {
        let size = usize::try_from(block_size).unwrap_or(0);
        if size == 0 {
            return PrefixMatches::default();
        }
        let mut hashes = Vec::with_capacity(tokens.len() / size);
        Hasher::new().extend(crate::hash::root(salt), tokens, block_size, &mut hashes);
        self.lookup(model, &hashes)
    }

    fn lookup_with(
        &self,
        model: &ModelId,
        query_blocks: usize,
        hashes: impl IntoIterator<Item = u64>,
    ) -> PrefixMatches {
        let mut result = PrefixMatches { query_blocks, matches: Vec::new() };
        let Some(index) = self.model(model) else { return result };
        let tree = index.tree.read();
        let mut hits: Vec<Hit> = Vec::new();
        tree.lookup(hashes, &mut hits);
        // (worker key, blocks, tier, rank, slot), best first within each worker.
        let mut keyed: Vec<(u32, u32, u8, u32, u32)> = hits
            .iter()
            .filter_map(|hit| {
                let holder = tree.holders.get(hit.slot as usize)?;
                holder.live.then_some((
                    holder.worker_key,
                    hit.blocks,
                    hit.tier,
                    holder.rank,
                    hit.slot,
                ))
            })
            .collect();
        keyed.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)).then(a.3.cmp(&b.3))
        });
        keyed.dedup_by_key(|k| k.0);
        keyed.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.2.cmp(&b.2)).then(a.0.cmp(&b.0)));
        result.matches = keyed
            .into_iter()
            .map(|(_, blocks, tier, rank, slot)| PrefixMatch {
                worker: tree.holders[slot as usize].worker.clone(),
                rank,
                blocks,
                tier: Medium::ALL.get(usize::from(tier)).copied().unwrap_or(Medium::External),
            })
            .collect();
        result
    }

    fn purge_where(&self, mut matches: impl FnMut(&WorkerId, u64) -> bool) -> u64 {
        let models: Vec<Arc<ModelIndex>> = self.models.read().values().cloned().collect();
        let mut removed = 0;
        for index in models {
            let mut tree = index.tree.write();
            let slots: Vec<u32> = (0..tree.holders.len())
                .filter(|&slot| {
                    let h = &tree.holders[slot];
                    h.live && matches(&h.worker, h.incarnation)
                })
                .filter_map(|slot| u32::try_from(slot).ok())
                .collect();
            for &slot in &slots {
                tree.retire(slot);
            }
            for &slot in &slots {
                removed += purge(&mut tree, slot);
                tree.release(slot);
            }
            index.publish(&tree);
        }
        removed
    }

    /// Forgets every block of every incarnation and rank of `worker`; its handles are refused
    /// from now on. Returns the (block, holder) pairs removed.
    pub fn remove_worker(&self, worker: &WorkerId) -> u64 {
        if let Some(predictions) = &self.predictions {
            predictions.remove_worker(worker);
        }
        self.purge_where(|w, _| w == worker)
    }

    /// Forgets every block `worker` holds, in every model and rank, keeping its handles: the
    /// engine flushed its cache and goes on publishing. Returns the (block, holder) pairs
    /// removed.
    pub fn clear_worker(&self, worker: &WorkerId) -> u64 {
        if let Some(predictions) = &self.predictions {
            predictions.remove_worker(worker);
        }
        let models: Vec<Arc<ModelIndex>> = self.models.read().values().cloned().collect();
        let mut removed = 0;
        for index in models {
            let mut tree = index.tree.write();
            let slots: Vec<u32> = (0..tree.holders.len())
                .filter(|&slot| tree.holders[slot].live && tree.holders[slot].worker == *worker)
                .filter_map(|slot| u32::try_from(slot).ok())
                .collect();
            for slot in slots {
                removed += purge(&mut tree, slot);
            }
            index.publish(&tree);
        }
        removed
    }

    /// Like [`KvIndex::remove_worker`], but only for one incarnation, so a replacement with
    /// the same id keeps its state.
    pub fn remove_incarnation(&self, worker: &WorkerId, incarnation: u64) -> u64 {
        // Predictions are not kept per incarnation; the old one's are stale either way.
        if let Some(predictions) = &self.predictions {
            predictions.remove_worker(worker);
        }
        self.purge_where(|w, i| w == worker && i == incarnation)
    }

    /// Node counts and memory, read without taking any tree lock.
    pub fn stats(&self) -> IndexStats {
        let mut models: Vec<ModelStats> =
            self.models.read().values().map(|index| index.stats()).collect();
        models.sort_by(|a, b| a.model.cmp(&b.model));
        IndexStats {
            nodes: models.iter().map(|m| m.nodes).sum(),
            bytes: models.iter().map(|m| m.bytes).sum(),
            block_holders: models.iter().map(|m| m.block_holders).sum(),
            evicted: models.iter().map(|m| m.evicted).sum(),
            models,
        }
    }

    /// Runs `f` on a model's tree; for tests of structural invariants.
    #[cfg(test)]
    fn with_tree<R>(&self, model: &ModelId, f: impl FnOnce(&Tree) -> R) -> Option<R> {
        self.model(model).map(|index| f(&index.tree.read()))
    }
}

/// Applies one worker-rank's events to one model's tree.
///
/// Obtained from [`KvIndex::holder`]. Once the worker incarnation is removed from the index,
/// every call is refused (counted as [`SkipReason::StaleHolder`]).
pub struct Holder {
    model: Arc<ModelIndex>,
    slot: u32,
    generation: u32,
    block_size: u32,
    shared: Arc<HolderShared>,
    worker: WorkerId,
    rank: u32,
    predictions: Option<Arc<Predictions>>,
}

impl std::fmt::Debug for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Holder")
            .field("model", &self.model.model)
            .field("worker", &self.worker)
            .field("rank", &self.rank)
            .field("slot", &self.slot)
            .finish()
    }
}

/// A lock-free view of one holder's block count.
#[derive(Clone, Debug)]
pub(crate) struct HolderView(Arc<HolderShared>);

impl HolderView {
    pub(crate) fn blocks(&self) -> u64 {
        self.0.blocks.load(Ordering::Relaxed)
    }
}

impl Holder {
    pub(crate) fn view(&self) -> HolderView {
        HolderView(Arc::clone(&self.shared))
    }

    /// The model this handle writes to.
    pub fn model(&self) -> &ModelId {
        &self.model.model
    }

    /// Blocks this worker-rank holds in this model, read without locking.
    pub fn blocks(&self) -> u64 {
        self.shared.blocks.load(Ordering::Relaxed)
    }

    /// Whether the index still accepts this handle.
    pub fn is_live(&self) -> bool {
        self.model.tree.read().holder_live(self.slot, self.generation)
    }

    /// Applies a batch of events in order.
    pub fn apply(&self, events: &[Event]) -> ApplyReport {
        let mut report = ApplyReport::default();
        let mut hasher = Hasher::new();
        let mut tree = self.model.tree.write();
        let mut ops = 0;
        // What contradicts predicted entries, told to them once the tree lock is released.
        let mut removed_locals: Vec<u64> = Vec::new();
        let mut cleared = false;
        for (index, event) in events.iter().enumerate() {
            if !tree.holder_live(self.slot, self.generation) {
                report.skipped.add(SkipReason::StaleHolder, (events.len() - index) as u64);
                break;
            }
            match event {
                Event::Stored(stored) => {
                    self.store(&mut tree, stored, &mut hasher, &mut ops, &mut report)
                }
                Event::Removed(removed) => match tree.plan_remove(self.slot, removed) {
                    Err(reason) => report.skipped.add(reason, 1),
                    Ok(tier_bit) => {
                        if self.predictions.is_some() {
                            removed_locals
                                .extend(tree.local_hashes(self.slot, &removed.block_hashes));
                        }
                        for chunk in removed.block_hashes.chunks(WRITE_CHUNK) {
                            if !tree.holder_live(self.slot, self.generation) {
                                break;
                            }
                            let removal = tree.remove_blocks(self.slot, chunk, tier_bit);
                            report.removed += removal.removed;
                            report.unknown_removals += removal.unknown;
                            ops += chunk.len();
                            pace(&mut tree, &mut ops);
                        }
                        report.events += 1;
                    }
                },
                Event::AllCleared => {
                    purge(&mut tree, self.slot);
                    cleared = true;
                    report.clears += 1;
                    report.events += 1;
                }
                Event::Unknown => report.skipped.add(SkipReason::UnknownEventType, 1),
                Event::Invalid { .. } => report.skipped.add(SkipReason::InvalidEvent, 1),
            }
            ops += 1;
            pace(&mut tree, &mut ops);
        }
        tree.publish_holder(self.slot);
        self.model.publish(&tree);
        drop(tree);
        if let Some(predictions) = &self.predictions {
            if cleared {
                predictions.clear(&self.model.model, &self.worker);
            } else if !removed_locals.is_empty() {
                predictions.forget(&self.model.model, &self.worker, &removed_locals);
            }
        }
        report
    }

    fn store(
        &self,
        tree: &mut RwLockWriteGuard<'_, Tree>,
        stored: &crate::wire::BlockStored,
        hasher: &mut Hasher,
        ops: &mut usize,
        report: &mut ApplyReport,
    ) {
        let mut cursor = match tree.plan_store(self.slot, stored, self.block_size) {
            Ok(cursor) => cursor,
            Err(reason) => return report.skipped.add(reason, 1),
        };
        while cursor.next < cursor.end {
            let to = cursor.next + WRITE_CHUNK;
            let (n, stop) =
                tree.store_blocks(self.slot, stored, self.block_size, &mut cursor, to, hasher);
            report.stored += n;
            if let Some(reason) = stop {
                return report.skipped.add(reason, 1);
            }
            *ops += usize::try_from(n).unwrap_or(WRITE_CHUNK);
            pace(tree, ops);
            if !tree.holder_live(self.slot, self.generation) {
                return report.skipped.add(SkipReason::StaleHolder, 1);
            }
        }
        if cursor.end < stored.block_hashes.len() {
            report.skipped.add(SkipReason::ExtraKeys, 1);
        } else {
            report.events += 1;
        }
    }

    /// Forgets every block of this worker-rank (an engine restart, or history lost without
    /// replay). Returns the blocks removed.
    pub fn clear(&self) -> u64 {
        let mut tree = self.model.tree.write();
        if !tree.holder_live(self.slot, self.generation) {
            return 0;
        }
        let removed = purge(&mut tree, self.slot);
        self.model.publish(&tree);
        drop(tree);
        if let Some(predictions) = &self.predictions {
            predictions.clear(&self.model.model, &self.worker);
        }
        removed
    }
}

#[cfg(test)]
mod tests;
