//! Discovery against the fake API server over HTTP: the watch through lost events and a 410
//! relist, a bookmark that spares a relist, an API server restarted and one down at start, a
//! forbidden namespace, a watch event of an unknown type, and a burst of a thousand pod changes applied while selection goes on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use router_test_support::fake_kube::{FakeKube, PodBuilder, pod};
use router_test_support::{eventually, on_change};
use router_workers::{ModelId, Stage, WorkerRegistry};
use tokio_util::sync::CancellationToken;

use super::*;

fn engine(name: &str, port: u16) -> PodBuilder {
    pod(name).label("app", "engine").port("http", port)
}

fn config(api_server: &str) -> DiscoveryConfig {
    DiscoveryConfig {
        cluster: ClusterConfig {
            api_server: Some(api_server.to_owned()),
            kubeconfig: None,
            namespace: Some("inference".into()),
        },
        sources: vec![PodSource {
            stage: Stage::Plain,
            selector: LabelSelector::parse("app=engine").expect("selector"),
        }],
        template: WorkerTemplate::new(PodPort::Name("http".into())),
        model: ModelSource::Fixed(ModelId::new("m")),
        backoff: BackoffConfig {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(200),
        },
    }
}

struct Running {
    registry: Arc<WorkerRegistry>,
    state: DiscoveryState,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn run(config: DiscoveryConfig) -> Running {
    let registry = Arc::new(WorkerRegistry::new());
    let discovery = Discovery::new(config, Arc::clone(&registry));
    let state = discovery.state();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(discovery.run(cancel.clone()));
    Running { registry, state, cancel, task }
}

impl Running {
    fn names(&self) -> Vec<String> {
        self.registry.workers().iter().map(|w| w.id().to_string()).collect()
    }

    /// Waits until the registry holds exactly `expected` (by id).
    async fn wait_for(&self, expected: &[&str]) {
        let mut changes = self.state.changes();
        let seen = on_change(&mut changes, || (self.names() == expected).then_some(())).await;
        assert!(seen.is_some(), "expected {expected:?}, have {:?}", self.names());
    }

    async fn stop(self) {
        self.cancel.cancel();
        self.task.await.expect("discovery stops when cancelled");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_survives_lost_events_a_relist_and_a_restart_without_dropping_live_workers() {
    let mut fake = FakeKube::start().await;
    fake.put_pod("inference", engine("e1", 1).build());
    fake.put_pod("inference", engine("e2", 2).build());
    fake.put_pod("inference", engine("e3", 3).ready(false).build());
    fake.put_pod("inference", pod("web").label("app", "web").port("http", 9).build());
    let running = run(config(&fake.url()));
    running.wait_for(&["e1", "e2"]).await;
    assert!(running.state.is_synced());
    eventually("a live watch", async || fake.live_watches() > 0).await;

    fake.put_pod("inference", engine("e3", 3).build());
    running.wait_for(&["e1", "e2", "e3"]).await;

    // Events lost while the watch is up; a 410 forces the relist that finds the truth.
    // (The silent fake sends nothing: there is nothing to wait for.)
    fake.set_silent(true);
    fake.delete_pod("inference", "e2");
    fake.put_pod("inference", engine("e4", 4).build());
    assert_eq!(running.names(), ["e1", "e2", "e3"], "nothing seen yet");
    let e1 = running.registry.workers()[0].incarnation();
    let lists = fake.lists();
    fake.set_silent(false);
    fake.expire_watches();
    running.wait_for(&["e1", "e3", "e4"]).await;
    assert_eq!(fake.lists(), lists + 1, "{:?}", fake.requests());
    assert_eq!(running.registry.workers()[0].incarnation(), e1, "e1 lived through the relist");
    assert_eq!(running.state.status().sources[0].relists, 1);

    // A bookmark moves the watch's resource version on: a change outside the selection (which
    // the watch is not sent) and a bookmark after it, then the history compacted, so that only
    // the bookmark's resource version can resume without a relist.
    eventually("the watch resumed", async || fake.live_watches() > 0).await;
    fake.put_pod("inference", pod("web").label("app", "web").port("http", 10).build());
    fake.bookmark();
    fake.compact();
    let bookmarked = fake.requests().len();

    // The API server shuts down (the workers stay; its watches end after the bookmark) and
    // comes back with a change made meanwhile.
    let errors = running.state.status().sources[0].errors;
    fake.stop_gracefully().await;
    eventually("discovery finding the API server gone", async || {
        running.state.status().sources[0].errors > errors
    })
    .await;
    assert_eq!(running.names(), ["e1", "e3", "e4"], "an unreachable API server drops nothing");
    fake.delete_pod("inference", "e3");
    fake.restart().await;
    running.wait_for(&["e1", "e4"]).await;
    let after: Vec<String> = fake.requests()[bookmarked..].to_vec();
    assert!(after.iter().all(|r| r.starts_with("WATCH")), "resumed, not relisted: {after:?}");
    assert!(running.state.is_synced());
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_down_at_start_is_retried_until_it_answers() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let running = run(config(&format!("http://127.0.0.1:{port}")));
    let mut changes = running.state.changes();
    let failing = on_change(&mut changes, || {
        let status = running.state.status();
        (status.sources[0].errors >= 2).then_some(status)
    })
    .await
    .expect("retried");
    let error = failing.sources[0].last_error.clone().unwrap_or_default();
    assert!(error.contains("cannot reach the Kubernetes API server"), "{error}");
    assert!(!running.state.is_synced(), "not synced before a list");

    let fake = FakeKube::start_on(port).await;
    fake.put_pod("inference", engine("e1", 1).build());
    running.wait_for(&["e1"]).await;
    let status = running.state.status();
    assert!(status.synced);
    assert_eq!(status.sources[0].last_error, None, "cleared by the list");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_namespace_is_reported_with_the_rbac_it_needs_and_retried() {
    let fake = FakeKube::start().await;
    fake.forbid("inference", true);
    fake.put_pod("inference", engine("e1", 1).build());
    let running = run(config(&fake.url()));
    let mut changes = running.state.changes();
    let error = on_change(&mut changes, || running.state.status().sources[0].last_error.clone())
        .await
        .expect("an error");
    assert!(error.contains("forbidden (403)"), "{error}");
    assert!(error.contains("get, list and watch on pods"), "{error}");
    assert!(error.contains("\"inference\""), "{error}");
    assert!(!running.state.is_synced());
    eventually("retried", async || fake.lists() >= 2).await;

    fake.forbid("inference", false);
    running.wait_for(&["e1"]).await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_event_of_an_unknown_type_is_reported_and_the_watch_goes_on() {
    let fake = FakeKube::start().await;
    fake.put_pod("inference", engine("e1", 1).build());
    let running = run(config(&fake.url()));
    running.wait_for(&["e1"]).await;
    eventually("a live watch", async || fake.live_watches() > 0).await;

    fake.inject_event(serde_json::json!({"type": "RESIZED", "object": {"kind": "Pod"}}));
    let mut changes = running.state.changes();
    let error = on_change(&mut changes, || running.state.status().sources[0].last_error.clone())
        .await
        .expect("reported");
    assert!(error.contains("cannot read"), "{error}");
    fake.put_pod("inference", engine("e2", 2).build());
    running.wait_for(&["e1", "e2"]).await;
    assert_eq!(running.state.status().sources[0].last_error, None, "cleared by the next event");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_a_thousand_pod_changes_is_applied_while_selection_goes_on() {
    const PODS: u16 = 1000;
    let fake = FakeKube::start().await;
    let running = run(config(&fake.url()));
    running.wait_for(&[]).await;
    eventually("synced", async || running.state.is_synced()).await;
    eventually("a live watch", async || fake.live_watches() > 0).await;

    // Selection reads the registry on its own thread throughout.
    let registry = Arc::clone(&running.registry);
    let done = Arc::new(AtomicBool::new(false));
    let reading = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let model = ModelId::new("m");
            let mut partial = 0usize;
            while !done.load(Ordering::Acquire) {
                let seen = registry.healthy(&model, Stage::Plain).len();
                if seen > 0 && seen < usize::from(PODS) {
                    partial += 1;
                }
                std::thread::yield_now();
            }
            partial
        })
    };
    for i in 0..PODS {
        fake.put_pod("inference", engine(&format!("e{i:04}"), 1000 + i).build());
    }
    let mut changes = running.state.changes();
    let all = on_change(&mut changes, || {
        (running.registry.workers().len() == usize::from(PODS)).then_some(())
    });
    assert!(all.await.is_some(), "all added; have {}", running.registry.workers().len());
    for i in 0..PODS {
        fake.delete_pod("inference", &format!("e{i:04}"));
    }
    running.wait_for(&[]).await;
    done.store(true, Ordering::Release);
    // Reads went on between the changes (a reader blocked for the burst would see only the
    // empty and the whole fleet, never a part of it).
    let partial = reading.join().expect("reader");
    assert!(partial > 0, "selection saw the fleet grow and shrink, never blocked until the end");
    assert_eq!(running.state.status().workers, 0);
    running.stop().await;
}
