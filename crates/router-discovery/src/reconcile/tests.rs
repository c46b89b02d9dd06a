//! Reconciliation, fed watch events directly: a relist that keeps live workers and drops the
//! vanished, replacement on a changed worker or a new uid (and nothing on an unrelated change),
//! bad pods skipped and named in the status, a pod with two roles, an id taken by a
//! configured worker, and a model that would mix plain and PD engines.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use router_test_support::fake_kube::{PodBuilder, pod};
use router_workers::{ModelId, Stage, Worker, WorkerId, WorkerOrigin, WorkerRegistry};

use super::{Reconciler, SourceEvent};
use crate::LabelSelector;
use crate::config::{
    BackoffConfig, ClusterConfig, DiscoveryConfig, ModelSource, PodPort, PodSource, WorkerTemplate,
};
use crate::status::{DiscoveryState, DiscoveryStatus, SourceStatus};

fn config(stages: &[Stage]) -> DiscoveryConfig {
    DiscoveryConfig {
        cluster: ClusterConfig::default(),
        sources: stages
            .iter()
            .map(|&stage| PodSource {
                stage,
                selector: LabelSelector::parse(&format!("role={stage}")).expect("selector"),
            })
            .collect(),
        template: WorkerTemplate::new(PodPort::Name("http".into())),
        model: ModelSource::Fixed(ModelId::new("m")),
        backoff: BackoffConfig::default(),
    }
}

struct Fixture {
    registry: Arc<WorkerRegistry>,
    reconciler: Reconciler,
    state: DiscoveryState,
}

fn fixture(stages: &[Stage]) -> Fixture {
    fixture_with(stages, Arc::new(WorkerRegistry::new()))
}

fn fixture_with(stages: &[Stage], registry: Arc<WorkerRegistry>) -> Fixture {
    let config = config(stages);
    let status = DiscoveryStatus {
        sources: config
            .sources
            .iter()
            .map(|s| SourceStatus {
                role: s.stage,
                selector: s.selector.to_string(),
                listed: false,
                pods: 0,
                relists: 0,
                errors: 0,
                last_error: None,
            })
            .collect(),
        ..DiscoveryStatus::default()
    };
    let state = DiscoveryState::new(status);
    let reconciler =
        Reconciler::new(Arc::clone(&registry), Arc::new(config), "inference".into(), state.clone());
    Fixture { registry, reconciler, state }
}

fn engine(name: &str, port: u16) -> PodBuilder {
    pod(name).uid(&format!("uid-{name}")).port("http", port)
}

fn object(builder: PodBuilder) -> Box<Pod> {
    let mut value = builder.build();
    value["metadata"]["namespace"] = "inference".into();
    Box::new(serde_json::from_value(value).expect("a pod"))
}

impl Fixture {
    fn list(&mut self, source: usize, pods: Vec<PodBuilder>) {
        self.reconciler.apply(source, SourceEvent::Init);
        for pod in pods {
            self.reconciler.apply(source, SourceEvent::InitApply(object(pod)));
        }
        self.reconciler.apply(source, SourceEvent::InitDone);
        self.reconciler.publish();
    }

    fn apply(&mut self, source: usize, pod: PodBuilder) {
        self.reconciler.apply(source, SourceEvent::Apply(object(pod)));
        self.reconciler.publish();
    }

    fn delete(&mut self, source: usize, pod: PodBuilder) {
        self.reconciler.apply(source, SourceEvent::Delete(object(pod)));
        self.reconciler.publish();
    }

    /// The registry's workers: `id@url`.
    fn workers(&self) -> Vec<String> {
        self.registry.workers().iter().map(|w| format!("{}@{}", w.id(), w.url())).collect()
    }

    fn incarnation(&self, id: &str) -> u64 {
        self.registry.get(&WorkerId::new(id).expect("id")).expect("registered").incarnation()
    }

    fn skipped(&self) -> Vec<String> {
        let status = self.state.status();
        status.skipped.iter().map(|s| format!("{}: {}", s.pod, s.reason)).collect()
    }
}

#[test]
fn pods_come_and_go_with_their_readiness_and_a_relist_keeps_the_live_ones() {
    let mut f = fixture(&[Stage::Plain]);
    assert!(!f.state.is_synced());
    f.list(0, vec![engine("e1", 1), engine("e2", 2), engine("e3", 3).ready(false)]);
    assert!(f.state.is_synced(), "listed once");
    assert_eq!(f.workers(), ["e1@http://127.0.0.1:1", "e2@http://127.0.0.1:2"]);
    let e1 = f.incarnation("e1");
    let origin = f.registry.get(&WorkerId::new("e1").expect("id")).expect("e1").origin().clone();
    let pod = origin.pod().expect("discovered");
    assert_eq!(
        (pod.namespace.as_str(), pod.pod.as_str(), pod.uid.as_str()),
        ("inference", "e1", "uid-e1")
    );

    f.apply(0, engine("e3", 3));
    f.apply(0, engine("e2", 2).ready(false));
    assert_eq!(f.workers(), ["e1@http://127.0.0.1:1", "e3@http://127.0.0.1:3"]);
    f.apply(0, engine("e2", 2));
    f.delete(0, engine("e3", 3));
    assert_eq!(f.workers(), ["e1@http://127.0.0.1:1", "e2@http://127.0.0.1:2"]);

    // A relist (after 410 Gone): nothing is dropped until it is complete, then what it no
    // longer lists is gone and what it lists again is untouched.
    f.reconciler.apply(0, SourceEvent::Init);
    f.reconciler.apply(0, SourceEvent::InitApply(object(engine("e1", 1))));
    assert_eq!(f.workers().len(), 2, "a relist in progress drops nothing");
    f.reconciler.apply(0, SourceEvent::InitApply(object(engine("e4", 4))));
    f.reconciler.apply(0, SourceEvent::InitDone);
    f.reconciler.publish();
    assert_eq!(f.workers(), ["e1@http://127.0.0.1:1", "e4@http://127.0.0.1:4"]);
    assert_eq!(f.incarnation("e1"), e1, "listed again, not replaced");
    let status = f.state.status();
    assert_eq!((status.sources[0].relists, status.sources[0].pods, status.workers), (1, 2, 2));
}

#[test]
fn a_changed_worker_or_a_new_uid_is_a_new_incarnation_and_nothing_else_is() {
    let mut f = fixture(&[Stage::Plain]);
    f.list(0, vec![engine("e1", 1)]);
    let first = f.incarnation("e1");
    f.apply(0, engine("e1", 1).label("team", "inference").annotation("note", "x"));
    assert_eq!(f.incarnation("e1"), first, "an unrelated label or annotation keeps the worker");
    f.apply(0, engine("e1", 2));
    let second = f.incarnation("e1");
    assert_ne!(second, first, "a new port is a new worker");
    assert_eq!(f.workers(), ["e1@http://127.0.0.1:2"]);
    f.apply(0, engine("e1", 2).ip(Some("127.0.0.2")));
    let third = f.incarnation("e1");
    assert_ne!(third, second, "a new IP is a new worker");
    f.apply(0, engine("e1", 2).ip(Some("127.0.0.2")).uid("uid-e1-again"));
    assert_ne!(f.incarnation("e1"), third, "the pod was recreated under its name");
}

#[test]
fn pods_that_cannot_be_workers_are_skipped_and_named_until_fixed() {
    let mut f = fixture(&[Stage::Prefill, Stage::Decode]);
    f.list(
        0,
        vec![
            engine("p1", 1).annotation("sglang.ai/bootstrap-port", "8998"),
            engine("p2", 2).annotation("sglang.ai/bootstrap-port", "nope"),
            pod("p3").uid("uid-p3"),
        ],
    );
    f.list(1, vec![engine("d1", 3)]);
    assert_eq!(f.workers(), ["d1@http://127.0.0.1:3", "p1@http://127.0.0.1:1"]);
    let p1 = f.registry.get(&WorkerId::new("p1").expect("id")).expect("p1");
    assert_eq!((p1.stage(), p1.bootstrap_port()), (Stage::Prefill, Some(8998)));
    assert_eq!(
        f.skipped(),
        [
            "p2: annotation sglang.ai/bootstrap-port=\"nope\": must be a port number from 1 to 65535",
            "p3: no container port named \"http\" (the engine's HTTP port)",
        ]
    );

    // A worker whose pod goes bad is removed, and back once fixed.
    f.apply(0, engine("p1", 1).annotation("sglang.ai/bootstrap-port", "0"));
    assert_eq!(f.workers(), ["d1@http://127.0.0.1:3"]);
    f.apply(0, engine("p2", 2).annotation("sglang.ai/bootstrap-port", "8999"));
    f.apply(0, engine("p1", 1));
    assert_eq!(f.workers().len(), 3);
    assert_eq!(f.skipped(), ["p3: no container port named \"http\" (the engine's HTTP port)"]);

    // Selected as both prefill and decode: neither.
    f.apply(1, engine("p2", 2));
    assert!(!f.workers().iter().any(|w| w.starts_with("p2@")), "{:?}", f.workers());
    assert!(f.skipped().iter().any(|s| s.starts_with("p2: selected as prefill and as decode")));
    f.delete(1, engine("p2", 2));
    assert!(f.workers().iter().any(|w| w.starts_with("p2@")), "back as prefill alone");
    f.delete(0, pod("p3"));
    assert!(f.skipped().is_empty(), "a deleted pod is no longer skipped: {:?}", f.skipped());
}

#[test]
fn the_registry_rules_hold_against_discovered_pods() {
    let registry = Arc::new(WorkerRegistry::new());
    let model = ModelId::new("m");
    registry.add(Worker::plain("static", "http://127.0.0.1:9", &model).expect("w")).expect("add");
    let mut f = fixture_with(&[Stage::Plain, Stage::Prefill], registry);
    f.list(0, vec![engine("static", 1), engine("e1", 2)]);
    f.list(1, vec![engine("p1", 3)]);
    assert_eq!(f.workers(), ["e1@http://127.0.0.1:2", "static@http://127.0.0.1:9"]);
    let kept = f.registry.get(&WorkerId::new("static").expect("id")).expect("static");
    assert_eq!(kept.origin(), &WorkerOrigin::Config, "the configured worker is untouched");
    assert_eq!(
        f.skipped(),
        [
            "p1: worker p1 (prefill) would mix plain and prefill/decode engines in model m",
            "static: worker id \"static\" is taken by a worker from the configuration",
        ]
    );
    // Deleting the clashing pod leaves the configured worker alone.
    f.delete(0, engine("static", 1));
    assert!(f.registry.get(&WorkerId::new("static").expect("id")).is_some());
}

#[test]
fn a_failed_attempt_shows_until_the_next_success() {
    let mut f = fixture(&[Stage::Plain]);
    f.reconciler.apply(0, SourceEvent::Init);
    f.reconciler.apply(0, SourceEvent::Failed("forbidden (403): no".into()));
    let status = f.state.status();
    assert_eq!(status.sources[0].last_error.as_deref(), Some("forbidden (403): no"));
    assert_eq!((status.sources[0].errors, status.synced), (1, false));
    f.list(0, vec![engine("e1", 1)]);
    let status = f.state.status();
    assert_eq!((status.sources[0].last_error.as_deref(), status.synced), (None, true));
}
