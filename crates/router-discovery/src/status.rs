//! What discovery reports about itself: whether every selector has been listed once (the
//! router's readiness waits for it), each watch's last error, and the pods it skipped and why.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use router_workers::Stage;
use serde::Serialize;
use tokio::sync::watch;

/// A snapshot, as `/admin/state` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DiscoveryStatus {
    /// The namespace watched, once known (it may come from the kubeconfig).
    pub namespace: Option<String>,
    /// Every selector has been listed at least once.
    pub synced: bool,
    /// Why the cluster could not be reached with credentials, while it cannot.
    pub cluster_error: Option<String>,
    /// One entry per selector.
    pub sources: Vec<SourceStatus>,
    /// Workers registered from pods.
    pub workers: usize,
    /// Pods that cannot be workers, with why, by pod name.
    pub skipped: Vec<SkippedPod>,
}

/// One selector's watch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SourceStatus {
    /// The role of the pods it selects.
    pub role: Stage,
    /// The selector.
    pub selector: String,
    /// Listed at least once.
    pub listed: bool,
    /// Pods it currently selects (serving or not).
    pub pods: usize,
    /// Lists after the first: a watch that could not resume (410 Gone) or restarted.
    pub relists: u64,
    /// Failed attempts so far (API server unreachable, 403, broken watch).
    pub errors: u64,
    /// The last failure, cleared by the next success.
    pub last_error: Option<String>,
}

/// A pod that is not a worker although selected and serving.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SkippedPod {
    /// The pod's name.
    pub pod: String,
    /// Why.
    pub reason: String,
}

/// The shared status: written by the discovery task, read by the server.
#[derive(Clone, Debug)]
pub struct DiscoveryState {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    status: Mutex<DiscoveryStatus>,
    synced: AtomicBool,
    changes: watch::Sender<u64>,
}

impl DiscoveryState {
    pub(crate) fn new(status: DiscoveryStatus) -> Self {
        Self {
            inner: Arc::new(Inner {
                status: Mutex::new(status),
                synced: AtomicBool::new(false),
                changes: watch::channel(0).0,
            }),
        }
    }

    /// The current status.
    pub fn status(&self) -> DiscoveryStatus {
        self.inner.status.lock().clone()
    }

    /// Whether every selector has been listed at least once: until then the workers known
    /// are not the fleet.
    pub fn is_synced(&self) -> bool {
        self.inner.synced.load(Ordering::Acquire)
    }

    /// A signal on every status change (for waiting on one instead of polling).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    /// Changes the status and signals it.
    pub(crate) fn update(&self, change: impl FnOnce(&mut DiscoveryStatus)) {
        let mut status = self.inner.status.lock();
        change(&mut status);
        status.synced = !status.sources.is_empty() && status.sources.iter().all(|s| s.listed);
        self.inner.synced.store(status.synced, Ordering::Release);
        drop(status);
        self.inner.changes.send_modify(|n| *n += 1);
    }
}
