//! The shared store: scoped bindings behind one lock, with compare-and-set updates.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use router_workers::{Worker, WorkerId};
use tokio::time::Instant;

use crate::table::Table;
use crate::{AffinityConfig, Binding, ConfigError, Scope};

/// Most expired entries one sweep step frees under the lock before letting requests in.
const SWEEP_BATCH: usize = 1024;

/// Scoped bindings from session or routing keys to engines. Share it as `Arc<AffinityStore>`.
///
/// Every operation is atomic: the store is one table behind one short-held lock. Lookups,
/// binds and replaces count as use: they refresh the binding's idle timer and move it to the
/// most recently used end. See the crate documentation for scopes, compare-and-set semantics,
/// expiry and eviction order.
pub struct AffinityStore {
    config: AffinityConfig,
    table: Mutex<Table>,
}

/// Counts describing a store, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Bindings held now (live or expired but not yet swept).
    pub entries: usize,
    /// Bindings created by [`AffinityStore::bind`].
    pub bound: u64,
    /// Bindings changed by [`AffinityStore::replace`].
    pub replaced: u64,
    /// Bindings dropped after going idle for the idle timeout.
    pub expired: u64,
    /// Live bindings evicted to make room at the entry cap.
    pub evicted: u64,
    /// Bindings removed because their engine left the registry.
    pub invalidated: u64,
}

impl std::fmt::Debug for AffinityStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AffinityStore")
            .field("config", &self.config)
            .field("entries", &self.len())
            .finish()
    }
}

impl AffinityStore {
    /// An empty store. Spawns nothing: the owner drives [`crate::run_sweeper`] and
    /// [`crate::follow_registry`].
    pub fn new(config: AffinityConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self { config, table: Mutex::new(Table::new(config.max_entries, config.idle_timeout)) })
    }

    /// The configuration the store was built with.
    pub fn config(&self) -> &AffinityConfig {
        &self.config
    }

    /// The live binding of `scope`, refreshing its last use. An expired binding is dropped
    /// and reads as absent even before a sweep frees it.
    pub fn get(&self, scope: &Scope) -> Option<Binding> {
        let mut table = self.table.lock();
        table.get(scope, Instant::now())
    }

    /// Binds `scope` to `binding` if it has no live binding (bind-if-absent).
    ///
    /// When another caller bound it first, returns `Err` with that existing binding, which is
    /// refreshed: it is the one concurrent first assignments converge on, and the caller
    /// must check it (candidate, admission) before using it.
    pub fn bind(&self, scope: &Scope, binding: Binding) -> Result<(), Binding> {
        let mut table = self.table.lock();
        table.bind(scope, binding, Instant::now())
    }

    /// Replaces the binding of `scope` with `new` if the current live binding equals
    /// `expected` (same engine id and incarnation).
    ///
    /// Otherwise returns `Err` with the current binding (refreshed), or `Err(None)` when the
    /// scope has no live binding any more (expired, evicted or invalidated); the caller then
    /// decides again, typically checking the current binding or calling [`Self::bind`].
    pub fn replace(
        &self,
        scope: &Scope,
        expected: &Binding,
        new: Binding,
    ) -> Result<(), Option<Binding>> {
        let mut table = self.table.lock();
        table.replace(scope, expected, new, Instant::now())
    }

    /// Removes every binding to engine `id`, whatever its incarnation. Returns how many.
    pub fn invalidate_worker(&self, id: &WorkerId) -> usize {
        self.table.lock().retain(|binding| binding.worker() != id)
    }

    /// Removes every binding to exactly this worker value (its id and incarnation), keeping
    /// bindings already made to a newer engine with the same id. Returns how many.
    pub fn invalidate_incarnation(&self, worker: &Worker) -> usize {
        self.table.lock().retain(|binding| !binding.is_for(worker))
    }

    /// Keeps only bindings to one of `workers` (by id and incarnation). Used to resynchronise
    /// with the registry. Returns how many bindings it removed.
    pub fn retain_live(&self, workers: &[Arc<Worker>]) -> usize {
        let live: HashMap<&WorkerId, u64> =
            workers.iter().map(|worker| (worker.id(), worker.incarnation())).collect();
        self.table
            .lock()
            .retain(|binding| live.get(binding.worker()) == Some(&binding.incarnation()))
    }

    /// Frees every binding idle for at least the idle timeout as of `now`. Returns how many.
    ///
    /// This is the explicit expiry entry point that [`crate::run_sweeper`] drives. It works
    /// from the least recently used end and stops at the first live binding, releasing the
    /// lock after every thousand or so entries so requests are not held up by a large sweep.
    pub fn sweep(&self, now: Instant) -> usize {
        let mut total = 0;
        loop {
            let freed = self.table.lock().sweep(now, SWEEP_BATCH);
            total += freed;
            if freed < SWEEP_BATCH {
                return total;
            }
        }
    }

    /// Bindings held now, including expired ones a sweep has not freed yet.
    pub fn len(&self) -> usize {
        self.table.lock().len()
    }

    /// Whether the store holds no binding.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Current counts, for metrics.
    pub fn stats(&self) -> Stats {
        let table = self.table.lock();
        let counters = table.counters();
        Stats {
            entries: table.len(),
            bound: counters.bound,
            replaced: counters.replaced,
            expired: counters.expired,
            evicted: counters.evicted,
            invalidated: counters.invalidated,
        }
    }
}
