//! The store's background work, as futures the server spawns and cancels: following the
//! registry to invalidate departed engines, and the periodic expiry sweep.

use std::sync::Arc;

use router_workers::{RegistryEvent, WorkerRegistry};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::AffinityStore;

/// Follows `registry` and drops the bindings of every engine that leaves it, until `cancel`
/// fires or the registry is dropped.
///
/// On start it keeps only bindings to engines currently registered. A removed engine loses the
/// bindings made to that incarnation; on a replacement (removed, then added with the same id)
/// bindings a policy already made to the new engine are kept. If the follower falls behind
/// the registry's feed, it resynchronises from the registry's current workers.
pub async fn follow_registry(
    store: Arc<AffinityStore>,
    registry: Arc<WorkerRegistry>,
    cancel: CancellationToken,
) {
    let (current, mut feed) = registry.follow();
    store.retain_live(&current);
    loop {
        let event = tokio::select! {
            biased;
            () = cancel.cancelled() => return,
            event = feed.recv() => event,
        };
        match event {
            Ok(RegistryEvent::Removed(worker)) => {
                store.invalidate_incarnation(&worker);
            }
            // A drained or draining engine's bindings stay: it is no candidate meanwhile, so
            // its keys are rebound as they come, and the binding of a key that does not come
            // back before the engine is resumed still points at a good engine.
            Ok(
                RegistryEvent::Added(_)
                | RegistryEvent::HealthChanged { .. }
                | RegistryEvent::DrainChanged { .. }
                | RegistryEvent::StatusReported { .. },
            ) => {}
            Err(RecvError::Lagged(_)) => {
                let (current, resumed) = registry.follow();
                feed = resumed;
                store.retain_live(&current);
            }
            Err(RecvError::Closed) => return,
        }
    }
}

/// Calls [`AffinityStore::sweep`] every `sweep_interval` of the store's configuration, until
/// `cancel` fires. The first sweep runs one interval after the start.
///
/// Time is tokio's, so `tokio::time::pause` and `advance` drive it in tests.
pub async fn run_sweeper(store: Arc<AffinityStore>, cancel: CancellationToken) {
    let interval = store.config().sweep_interval;
    loop {
        tokio::select! {
            biased;
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        store.sweep(Instant::now());
    }
}
