//! Kubernetes discovery: engine pods watched by label selector in one namespace, fed into the
//! [`WorkerRegistry`] as workers.
//!
//! Owns the pod → worker mapping ([`judge`]: a pod is a worker while Ready, not terminating and
//! with an IP; its name is the worker id, its uid the incarnation; ports are numbers or
//! container-port names; `sglang.ai/bootstrap-port` gives a prefill pod's bootstrap port), the
//! watches (kube's watcher: list, watch from the resource version, bookmarks, relist on 410
//! Gone, backoff on failures), the reconciliation into the registry (add, replace with a new
//! incarnation, remove), label-selector parsing and the status the router's readiness and
//! `/admin/state` read ([`DiscoveryState`]).
//!
//! Does not own what follows a worker's removal: the state crates follow the registry's feed
//! and drop the departed engine's KV entries, bindings and subscriptions. Nor the
//! configuration file (router-server builds a [`DiscoveryConfig`]).

mod client;
mod config;
mod pod;
mod reconcile;
mod selector;
mod status;
mod watch;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use router_workers::WorkerRegistry;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub use client::ConnectError;
pub use config::{
    BOOTSTRAP_PORT_ANNOTATION, BackoffConfig, ClusterConfig, DiscoveryConfig, KvEventsTemplate,
    ModelSource, PodPort, PodSource, WorkerTemplate,
};
pub use pod::{PodProblem, PodVerdict, PodWorker, WaitReason, judge};
pub use selector::{LabelSelector, SelectorError};
pub use status::{DiscoveryState, DiscoveryStatus, SkippedPod, SourceStatus};

use crate::config::Backoff;
use crate::reconcile::Reconciler;

/// Events a watch may hand over before it waits for the reconciler.
const QUEUE: usize = 1024;

/// Most events applied before the status is published again.
const BATCH: usize = 256;

/// Discovery of one configuration, not yet running.
#[derive(Debug)]
pub struct Discovery {
    config: Arc<DiscoveryConfig>,
    registry: Arc<WorkerRegistry>,
    state: DiscoveryState,
}

impl Discovery {
    /// Discovery feeding `registry`; [`Discovery::run`] starts it.
    pub fn new(config: DiscoveryConfig, registry: Arc<WorkerRegistry>) -> Self {
        let status = DiscoveryStatus {
            namespace: config.cluster.namespace.clone(),
            sources: config
                .sources
                .iter()
                .map(|source| SourceStatus {
                    role: source.stage,
                    selector: source.selector.to_string(),
                    listed: false,
                    pods: 0,
                    relists: 0,
                    errors: 0,
                    last_error: None,
                })
                .collect(),
            ..DiscoveryStatus::default()
        };
        Self { config: Arc::new(config), registry, state: DiscoveryState::new(status) }
    }

    /// The status, shared with the running discovery.
    pub fn state(&self) -> DiscoveryState {
        self.state.clone()
    }

    /// Connects (retrying with backoff while the credentials cannot be read), then watches
    /// every selector and applies what they see to the registry, until `cancel` fires.
    pub async fn run(self, cancel: CancellationToken) {
        let mut backoff = Backoff::new(self.config.backoff);
        let (client, namespace) = loop {
            match client::connect(&self.config.cluster).await {
                Ok(connected) => break connected,
                Err(error) => {
                    let message = watch::chain(&error);
                    let wait = backoff.next_wait();
                    tracing::error!(retry_in = ?wait, "kubernetes discovery: {message}");
                    self.state.update(|s| s.cluster_error = Some(message));
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        };
        tracing::info!(%namespace, sources = self.config.sources.len(), "kubernetes discovery started");
        self.state.update(|s| {
            s.cluster_error = None;
            s.namespace = Some(namespace.clone());
        });
        let (events, mut received) = mpsc::channel(QUEUE);
        let mut watches = JoinSet::new();
        for (index, source) in self.config.sources.iter().enumerate() {
            watches.spawn(watch::follow(
                Api::<Pod>::namespaced(client.clone(), &namespace),
                index,
                source.selector.to_string(),
                namespace.clone(),
                events.clone(),
                self.config.backoff,
                cancel.child_token(),
            ));
        }
        drop(events);
        let mut reconciler = Reconciler::new(
            Arc::clone(&self.registry),
            Arc::clone(&self.config),
            namespace,
            self.state.clone(),
        );
        loop {
            let first = tokio::select! {
                () = cancel.cancelled() => break,
                first = received.recv() => first,
            };
            let Some((index, event)) = first else { break };
            reconciler.apply(index, event);
            // Apply what else is queued, then publish the status once for the batch.
            for _ in 1..BATCH {
                let Ok((index, event)) = received.try_recv() else { break };
                reconciler.apply(index, event);
            }
            reconciler.publish();
        }
        watches.shutdown().await;
    }
}

#[cfg(test)]
mod tests;
