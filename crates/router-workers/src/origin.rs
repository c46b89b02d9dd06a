//! Where a worker came from: the configuration file, the admin API, or a discovered pod.

use serde::Serialize;

/// The source of a worker, shown in `/admin/state` and checked before the admin API removes
/// it: a discovered worker leaves when its pod does.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum WorkerOrigin {
    /// The configuration file or the quick-start flags.
    #[default]
    Config,
    /// `POST /admin/workers`.
    Admin,
    /// A pod found by Kubernetes discovery.
    Discovery(DiscoveredPod),
}

impl WorkerOrigin {
    /// The pod behind a discovered worker.
    pub fn pod(&self) -> Option<&DiscoveredPod> {
        match self {
            WorkerOrigin::Discovery(pod) => Some(pod),
            WorkerOrigin::Config | WorkerOrigin::Admin => None,
        }
    }
}

/// The pod a discovered worker stands for. Its `uid` tells incarnations apart: a pod deleted
/// and created again under the same name (a StatefulSet's) has a new one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DiscoveredPod {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// `metadata.uid`.
    pub uid: String,
}
