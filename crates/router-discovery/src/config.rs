//! What discovery is told: the cluster to ask, the pods to watch (a selector per role), and
//! how a pod becomes a worker (ports, model, engine settings), already validated by the
//! router's configuration.

use std::path::PathBuf;
use std::time::Duration;

use router_workers::{ApiKey, DpRoute, LoadPollSpec, ModelId, Stage};
use serde::{Deserialize, Serialize};

use crate::LabelSelector;

/// Everything discovery needs.
#[derive(Clone, Debug)]
pub struct DiscoveryConfig {
    /// The cluster and namespace.
    pub cluster: ClusterConfig,
    /// One watch per role: one plain selector, or a prefill and a decode selector (or all
    /// three when the model comes from a label).
    pub sources: Vec<PodSource>,
    /// How a selected pod becomes a worker.
    pub template: WorkerTemplate,
    /// Which model a discovered worker serves.
    pub model: ModelSource,
    /// Waits between attempts after a failure (API server down, 403, broken watch).
    pub backoff: BackoffConfig,
}

/// The cluster and namespace to watch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterConfig {
    /// The API server's URL, overriding the kubeconfig's (`http://` allowed: tests, or a
    /// `kubectl proxy` on localhost). Alone, without `kubeconfig`, it is used without
    /// credentials.
    pub api_server: Option<String>,
    /// A kubeconfig file; absent: `KUBECONFIG`, then `~/.kube/config`, then the in-cluster
    /// service account.
    pub kubeconfig: Option<PathBuf>,
    /// The namespace; absent: the kubeconfig context's, or the service account's, else
    /// `default`.
    pub namespace: Option<String>,
}

/// The pods of one role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSource {
    /// The role of every pod this selector selects.
    pub stage: Stage,
    /// The selector.
    pub selector: LabelSelector,
}

/// A port of a pod: a number, or the name of one of its container ports (as a Service's
/// `targetPort` may be).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PodPort {
    /// This port on the pod's IP.
    Number(u16),
    /// The `containerPort` of the container port with this `name`.
    Name(String),
}

impl std::fmt::Display for PodPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PodPort::Number(port) => write!(f, "{port}"),
            PodPort::Name(name) => write!(f, "{name:?}"),
        }
    }
}

/// The KV-event publisher of every discovered engine, on its pod's IP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEventsTemplate {
    /// The PUB port.
    pub port: PodPort,
    /// The replay ROUTER port, when the engines have one.
    pub replay_port: Option<PodPort>,
    /// Topic prefix subscribed to.
    pub topic: String,
    /// Tokens per KV block of the events.
    pub block_size: Option<u32>,
}

/// The worker settings every discovered pod gets, as a configured worker would have them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerTemplate {
    /// `https` instead of `http` to the engine.
    pub https: bool,
    /// The engine's HTTP port.
    pub port: PodPort,
    /// KV events, when the engines publish them.
    pub kv_events: Option<KvEventsTemplate>,
    /// The gRPC load reporter's port, when the engines have one.
    pub load_reporter_port: Option<PodPort>,
    /// Load polling instead (`format`: SGLang's `/v1/loads` or vLLM's `/metrics`).
    pub load_poll: Option<LoadPollSpec>,
    /// Data-parallel ranks per engine.
    pub dp_size: u32,
    /// How the chosen rank is named to the engine.
    pub dp_route: Option<DpRoute>,
    /// Tokens per KV block.
    pub block_size: Option<u32>,
    /// The engines' API key.
    pub api_key: Option<ApiKey>,
}

impl WorkerTemplate {
    /// Plain HTTP on `port`, one rank, no engine-side endpoints.
    pub fn new(port: PodPort) -> Self {
        Self {
            https: false,
            port,
            kv_events: None,
            load_reporter_port: None,
            load_poll: None,
            dp_size: 1,
            dp_route: None,
            block_size: None,
            api_key: None,
        }
    }
}

/// Which model a discovered worker serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    /// Every discovered pod serves this model.
    Fixed(ModelId),
    /// The value of this label names the model; it must be one of `served`.
    Label {
        /// The label key.
        key: String,
        /// The models the router serves.
        served: Vec<ModelId>,
    },
}

/// Exponential backoff between attempts: `initial`, doubling up to `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackoffConfig {
    /// The first wait.
    pub initial: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self { initial: Duration::from_millis(500), max: Duration::from_secs(30) }
    }
}

/// The waits of one retry loop: `initial`, then doubling up to `max`, until reset.
#[derive(Debug)]
pub(crate) struct Backoff {
    config: BackoffConfig,
    next: Duration,
}

impl Backoff {
    pub(crate) fn new(config: BackoffConfig) -> Self {
        Self { config, next: config.initial }
    }

    /// The wait before the next attempt.
    pub(crate) fn next_wait(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(self.config.max);
        wait
    }

    /// After a success: the next failure waits `initial` again.
    pub(crate) fn reset(&mut self) {
        self.next = self.config.initial;
    }
}

/// The annotation of a prefill pod naming its bootstrap port (SGLang's).
pub const BOOTSTRAP_PORT_ANNOTATION: &str = "sglang.ai/bootstrap-port";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_bound_and_starts_over_after_a_success() {
        let mut backoff = Backoff::new(BackoffConfig {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(500),
        });
        let waits: Vec<u128> = (0..5).map(|_| backoff.next_wait().as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 500, 500]);
        backoff.reset();
        assert_eq!(backoff.next_wait(), Duration::from_millis(100));
    }

    #[test]
    fn a_port_is_a_number_or_a_container_port_name() {
        let number: PodPort = serde_json::from_str("8000").expect("number");
        assert_eq!(number, PodPort::Number(8000));
        let name: PodPort = serde_json::from_str("\"http\"").expect("name");
        assert_eq!(name, PodPort::Name("http".into()));
        assert!(serde_json::from_str::<PodPort>("70000").is_err(), "beyond u16");
    }
}
