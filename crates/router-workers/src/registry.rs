//! The live set of workers, indexed by id and by (model, stage), with a change feed.

use std::sync::Arc;

use parking_lot::RwLock;
use tokio::sync::broadcast;

use crate::{EngineStatus, ModelId, Stage, Worker, WorkerError, WorkerId};

/// Capacity of the change feed; a follower that falls further behind gets
/// [`broadcast::error::RecvError::Lagged`] and must resynchronise from [`WorkerRegistry::workers`].
const FEED_CAPACITY: usize = 1024;

/// A change to the registry, in the order it happened.
#[derive(Clone, Debug)]
pub enum RegistryEvent {
    /// A worker joined (also the second half of a replacement).
    Added(Arc<Worker>),
    /// A worker left (also the first half of a replacement).
    Removed(Arc<Worker>),
    /// A worker's health flipped.
    HealthChanged {
        /// The worker.
        worker: Arc<Worker>,
        /// Its new health.
        healthy: bool,
    },
    /// The operator drained or resumed a worker.
    DrainChanged {
        /// The worker.
        worker: Arc<Worker>,
        /// Whether it is now drained.
        drained: bool,
    },
    /// A worker's load reports stated a new status.
    StatusReported {
        /// The worker.
        worker: Arc<Worker>,
        /// The status now stated.
        status: EngineStatus,
    },
}

/// Whether a model is served by plain engines or by prefill/decode pairs; never both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// Only plain engines.
    Plain,
    /// Only prefill and decode engines.
    Pd,
}

impl ModelKind {
    fn of(stage: Stage) -> Self {
        if stage.is_pd() { ModelKind::Pd } else { ModelKind::Plain }
    }
}

/// Looked up on every request, by keys the configuration (or discovery) made: hashbrown's
/// foldhash, not SipHash.
#[derive(Default)]
struct Inner {
    by_id: hashbrown::HashMap<WorkerId, Arc<Worker>>,
    /// Workers of each (model, stage), sorted by id. Rebuilt on membership changes only, so
    /// lookups clone one `Arc`.
    by_model_stage: hashbrown::HashMap<(ModelId, Stage), Arc<[Arc<Worker>]>>,
}

impl Inner {
    fn kind_of(&self, model: &ModelId, ignoring: Option<&WorkerId>) -> Option<ModelKind> {
        [Stage::Plain, Stage::Prefill, Stage::Decode].into_iter().find_map(|stage| {
            let workers = self.by_model_stage.get(&(model.clone(), stage))?;
            workers.iter().any(|w| Some(w.id()) != ignoring).then(|| ModelKind::of(stage))
        })
    }

    fn check_kind(&self, worker: &Worker, ignoring: Option<&WorkerId>) -> Result<(), WorkerError> {
        let wanted = ModelKind::of(worker.stage());
        for model in worker.models() {
            if let Some(existing) = self.kind_of(model, ignoring)
                && existing != wanted
            {
                return Err(WorkerError::MixedModel {
                    id: worker.id().clone(),
                    model: model.clone(),
                    role: worker.stage(),
                });
            }
        }
        Ok(())
    }

    fn reindex(&mut self, worker: &Worker) {
        for model in worker.models() {
            let key = (model.clone(), worker.stage());
            let mut members: Vec<Arc<Worker>> = self
                .by_id
                .values()
                .filter(|w| w.stage() == worker.stage() && w.serves(model))
                .cloned()
                .collect();
            if members.is_empty() {
                self.by_model_stage.remove(&key);
            } else {
                members.sort_by(|a, b| a.id().cmp(b.id()));
                self.by_model_stage.insert(key, members.into());
            }
        }
    }
}

/// The live workers: concurrent add, replace and remove, health updates, lookups by model and
/// stage, and a change feed that state subscriptions follow.
///
/// Rules enforced on every change: ids are unique, a model is served either by plain engines
/// or by prefill/decode engines (never both), and worker URLs are http(s) without credentials
/// (checked when the [`Worker`] is built).
pub struct WorkerRegistry {
    inner: RwLock<Inner>,
    feed: broadcast::Sender<RegistryEvent>,
}

impl Default for WorkerRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for WorkerRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerRegistry").field("workers", &self.inner.read().by_id.len()).finish()
    }
}

impl WorkerRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self { inner: RwLock::new(Inner::default()), feed: broadcast::channel(FEED_CAPACITY).0 }
    }

    /// Adds a new worker. Fails on a duplicate id or a model that would mix plain and PD
    /// engines.
    pub fn add(&self, worker: Worker) -> Result<Arc<Worker>, WorkerError> {
        let worker = Arc::new(worker);
        let mut inner = self.inner.write();
        if inner.by_id.contains_key(worker.id()) {
            return Err(WorkerError::Duplicate { id: worker.id().clone() });
        }
        inner.check_kind(&worker, None)?;
        inner.by_id.insert(worker.id().clone(), Arc::clone(&worker));
        inner.reindex(&worker);
        // Sent under the lock so every follower sees changes in the order they were made.
        let _ = self.feed.send(RegistryEvent::Added(Arc::clone(&worker)));
        Ok(worker)
    }

    /// Replaces the worker with the same id. Followers see it removed, then added. The
    /// operator's drain carries over (it is a decision about the engine id, not its
    /// settings); health and the reported status start afresh with the new incarnation.
    pub fn replace(&self, worker: Worker) -> Result<Arc<Worker>, WorkerError> {
        let worker = Arc::new(worker);
        let mut inner = self.inner.write();
        let Some(old) = inner.by_id.get(worker.id()).cloned() else {
            return Err(WorkerError::NotFound { id: worker.id().clone() });
        };
        inner.check_kind(&worker, Some(worker.id()))?;
        worker.store_drained(old.is_drained());
        inner.by_id.insert(worker.id().clone(), Arc::clone(&worker));
        inner.reindex(&old);
        inner.reindex(&worker);
        let _ = self.feed.send(RegistryEvent::Removed(old));
        let _ = self.feed.send(RegistryEvent::Added(Arc::clone(&worker)));
        Ok(worker)
    }

    /// Removes a worker and returns it.
    pub fn remove(&self, id: &WorkerId) -> Result<Arc<Worker>, WorkerError> {
        let mut inner = self.inner.write();
        let Some(old) = inner.by_id.remove(id) else {
            return Err(WorkerError::NotFound { id: id.clone() });
        };
        inner.reindex(&old);
        let _ = self.feed.send(RegistryEvent::Removed(Arc::clone(&old)));
        Ok(old)
    }

    /// Sets a worker's health; the feed hears only of actual changes. Returns whether it
    /// changed.
    pub fn set_health(&self, id: &WorkerId, healthy: bool) -> Result<bool, WorkerError> {
        let inner = self.inner.read();
        let Some(worker) = inner.by_id.get(id) else {
            return Err(WorkerError::NotFound { id: id.clone() });
        };
        let changed = worker.store_health(healthy) != healthy;
        if changed {
            let _ = self
                .feed
                .send(RegistryEvent::HealthChanged { worker: Arc::clone(worker), healthy });
        }
        Ok(changed)
    }

    /// Drains (`true`) or resumes (`false`) a worker: a drained worker is not a candidate for
    /// new requests until resumed, whatever its health or reports say; requests already
    /// dispatched to it are not affected. The feed hears only of actual changes. Returns the
    /// worker and whether it changed.
    pub fn set_drained(
        &self,
        id: &WorkerId,
        drained: bool,
    ) -> Result<(Arc<Worker>, bool), WorkerError> {
        let inner = self.inner.read();
        let Some(worker) = inner.by_id.get(id) else {
            return Err(WorkerError::NotFound { id: id.clone() });
        };
        let changed = worker.store_drained(drained) != drained;
        if changed {
            let _ =
                self.feed.send(RegistryEvent::DrainChanged { worker: Arc::clone(worker), drained });
        }
        Ok((Arc::clone(worker), changed))
    }

    /// Records the status `worker`'s load reports now state, if `worker` is still the
    /// registered incarnation of its id (a replaced or removed engine's late reports change
    /// nothing). The feed hears only of actual changes. Returns whether it changed.
    pub fn set_reported_status(&self, worker: &Worker, status: EngineStatus) -> bool {
        let inner = self.inner.read();
        let Some(current) =
            inner.by_id.get(worker.id()).filter(|w| w.incarnation() == worker.incarnation())
        else {
            return false;
        };
        let changed = current.store_reported_status(status) != status;
        if changed {
            let _ = self
                .feed
                .send(RegistryEvent::StatusReported { worker: Arc::clone(current), status });
        }
        changed
    }

    /// The worker with this id.
    pub fn get(&self, id: &WorkerId) -> Option<Arc<Worker>> {
        self.inner.read().by_id.get(id).cloned()
    }

    /// Every worker of `model` and `stage`, healthy or not, sorted by id.
    pub fn workers_for(&self, model: &ModelId, stage: Stage) -> Arc<[Arc<Worker>]> {
        self.inner
            .read()
            .by_model_stage
            .get(&(model.clone(), stage))
            .cloned()
            .unwrap_or_else(|| Arc::from([]))
    }

    /// Healthy workers of `model` and `stage`, sorted by id.
    pub fn healthy(&self, model: &ModelId, stage: Stage) -> Vec<Arc<Worker>> {
        self.workers_for(model, stage).iter().filter(|w| w.is_healthy()).cloned().collect()
    }

    /// Workers of `model` and `stage` that accept new requests (healthy, not drained, not
    /// reporting starting or draining: [`Worker::accepts_new_requests`]), sorted by id. What
    /// engine groups select from.
    pub fn accepting(&self, model: &ModelId, stage: Stage) -> Vec<Arc<Worker>> {
        self.workers_for(model, stage)
            .iter()
            .filter(|w| w.accepts_new_requests())
            .cloned()
            .collect()
    }

    /// Whether `model` is served by plain or PD engines, if by any.
    pub fn model_kind(&self, model: &ModelId) -> Option<ModelKind> {
        self.inner.read().kind_of(model, None)
    }

    /// Every worker, sorted by id.
    pub fn workers(&self) -> Vec<Arc<Worker>> {
        let mut all: Vec<_> = self.inner.read().by_id.values().cloned().collect();
        all.sort_by(|a, b| a.id().cmp(b.id()));
        all
    }

    /// Every worker now, and a feed of every change after that moment, taken atomically so a
    /// follower neither misses nor double-counts a change.
    pub fn follow(&self) -> (Vec<Arc<Worker>>, broadcast::Receiver<RegistryEvent>) {
        let inner = self.inner.read();
        let receiver = self.feed.subscribe();
        let mut all: Vec<_> = inner.by_id.values().cloned().collect();
        all.sort_by(|a, b| a.id().cmp(b.id()));
        (all, receiver)
    }
}
