//! The gRPC load reporter (`--load-reporter`), dialled the way the router does: router-state-load's
//! `LoadSubscriptions` following a real `WorkerRegistry` into a real `EngineReportedLoadTable`.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use router_state_load::{
    EngineLoad, EngineReportedLoadTable, EngineStatus, LoadSubscriptions, ReportKind,
    SubscriptionConfig, SystemClock, TableConfig,
};
use router_test_support::{PATIENCE, on_change};
use router_workers::{ModelId, Stage, Worker, WorkerId, WorkerRegistry, WorkerSpec};
use tokio_util::sync::CancellationToken;

use crate::common::*;

const PREFILL_RATE: f64 = 100_000.0;

/// Waits until the engine's usable load satisfies `condition`, re-checking on every table change.
async fn wait_load(
    table: &EngineReportedLoadTable,
    worker: &WorkerId,
    what: &str,
    condition: impl Fn(&EngineLoad) -> bool,
) -> EngineLoad {
    let mut changes = table.changes();
    let found =
        on_change(&mut changes, || table.snapshot().get(worker).filter(|l| condition(l)).copied());
    found
        .await
        .unwrap_or_else(|| panic!("gave up waiting for {what}; status: {:?}", table.status()))
}

#[tokio::test]
async fn load_reporter_streams_native_reports_that_follow_the_engine() {
    let sim = Sim::start(&[
        "--load-reporter",
        "127.0.0.1:0",
        "--max-running",
        "1",
        "--kv-capacity-tokens",
        "32768",
        "--prefill-tokens-per-sec",
        "100000",
        // 40 output tokens take 0.8 s: long enough for reports to see the queue.
        "--decode-tokens-per-sec",
        "50",
    ])
    .await;
    let reporter = sim.endpoint("load reporter").to_owned();
    assert!(
        !reporter.contains("://") && reporter.ends_with(&format!(":{}", sim.port("load reporter")))
    );

    // The router side: a registry with the engine, a table on the system clock (its rate limit
    // refills with time; reports every 50 ms stay fresh for 3 s), and the subscriptions
    // dialling the reporter.
    let table =
        Arc::new(EngineReportedLoadTable::new(TableConfig::default(), SystemClock::shared()));
    let registry = Arc::new(WorkerRegistry::new());
    let spec = WorkerSpec {
        load_reporter: Some(reporter),
        ..WorkerSpec::new("sim-1", sim.url(), Stage::Plain)
    };
    registry.add(Worker::from_spec(&spec, vec![ModelId::new("m")]).expect("worker")).expect("add");
    let config =
        SubscriptionConfig { report_interval: Duration::from_millis(50), ..Default::default() };
    let subscriptions = LoadSubscriptions::new(Arc::clone(&table), Arc::clone(&registry), config);
    let cancel = CancellationToken::new();
    let task = tokio::spawn(subscriptions.run(cancel.clone()));
    let id = WorkerId::new("sim-1").expect("id");

    let idle = wait_load(&table, &id, "a first report", |_| true).await;
    assert_eq!(idle.kind, ReportKind::Native);
    assert_eq!(idle.status, EngineStatus::Serving);
    assert_eq!((idle.running_requests, idle.waiting_requests, idle.kv_used_tokens), (0, 0, 0));
    assert_eq!(idle.kv_capacity_tokens, 32_768);
    let native = idle.native.expect("native fields");
    assert_eq!(native.max_running_requests, 1);
    assert_eq!((native.waiting_uncached_tokens, native.total_kv_tokens), (0, 0));
    assert_eq!(native.prefill_tokens_per_sec, None, "no rate from a single sample");

    // Two requests: one runs, the other waits behind --max-running 1.
    let contents = ["a".repeat(1_000), "b".repeat(1_000)];
    let prompt_len = chatml_user(&contents[0]).len() as u64;
    let url = format!("{}/v1/chat/completions", sim.url());
    let requests: Vec<_> = contents
        .iter()
        .map(|content| {
            let (url, body) = (url.clone(), request(content, 40, false));
            tokio::spawn(async move { send(Method::POST, &url, Some(&body)).await })
        })
        .collect();
    // KV counts computed tokens: the running prompt holds its KV once prefilled.
    let busy = wait_load(&table, &id, "one decoding and one waiting", |l| {
        l.running_requests == 1 && l.waiting_requests == 1 && l.kv_used_tokens >= prompt_len
    })
    .await;
    let native = busy.native.expect("native fields");
    // The waiting prompt shares at most its first block (`<|im_start|>user`) with the other.
    assert!((prompt_len - 16..=prompt_len).contains(&native.waiting_uncached_tokens), "{native:?}");
    assert_eq!(native.total_kv_tokens, busy.kv_used_tokens + prompt_len, "KV in use plus queue");

    for request in requests {
        let reply = request.await.expect("task").expect("answered");
        assert_eq!(reply.status, StatusCode::OK);
    }
    // The cumulative prefill counters let the router derive the simulated prefill rate.
    let done = wait_load(&table, &id, "an idle engine with a prefill rate", |l| {
        l.total_requests() == 0 && l.native.is_some_and(|n| n.prefill_tokens_per_sec.is_some())
    })
    .await;
    let rate = done.native.and_then(|n| n.prefill_tokens_per_sec).expect("rate");
    assert!((rate / PREFILL_RATE - 1.0).abs() < 0.01, "derived {rate}, configured {PREFILL_RATE}");

    cancel.cancel();
    tokio::time::timeout(PATIENCE, task).await.expect("subscriptions stop").expect("task");
}

#[tokio::test]
async fn sim_drain_and_resume_change_the_reported_status_and_state_counts_what_arrived() {
    let sim = Sim::start(&["--load-reporter", "127.0.0.1:0"]).await;
    let table =
        Arc::new(EngineReportedLoadTable::new(TableConfig::default(), SystemClock::shared()));
    let registry = Arc::new(WorkerRegistry::new());
    let spec = WorkerSpec {
        load_reporter: Some(sim.endpoint("load reporter").to_owned()),
        ..WorkerSpec::new("sim-1", sim.url(), Stage::Plain)
    };
    registry.add(Worker::from_spec(&spec, vec![ModelId::new("m")]).expect("worker")).expect("add");
    let config =
        SubscriptionConfig { report_interval: Duration::from_millis(50), ..Default::default() };
    let subscriptions = LoadSubscriptions::new(Arc::clone(&table), Arc::clone(&registry), config);
    let cancel = CancellationToken::new();
    let task = tokio::spawn(subscriptions.run(cancel.clone()));
    let id = WorkerId::new("sim-1").expect("id");
    // The status and the requests received (the state also names the last trace context seen).
    let state = |reply: Reply| {
        let state = reply.json();
        serde_json::json!({"status": state["status"], "received": state["received"]})
    };

    wait_load(&table, &id, "serving", |l| l.status == EngineStatus::Serving).await;
    assert_eq!(
        state(get(&format!("{}/sim/state", sim.url())).await),
        serde_json::json!({"status": "serving", "received": 0})
    );

    let drained = post(&sim, "/sim/drain", &serde_json::json!({})).await;
    assert_eq!(drained.status, StatusCode::OK);
    assert_eq!(drained.json()["status"], "draining");
    wait_load(&table, &id, "draining", |l| l.status == EngineStatus::Draining).await;
    let worker = registry.get(&id).expect("registered");
    assert_eq!(worker.reported_status(), EngineStatus::Draining, "recorded on the worker");
    // A draining simulator still serves what reaches it, and counts it.
    assert_eq!(chat(&sim, &request("still here", 2, false)).await.status, StatusCode::OK);
    assert_eq!(state(get(&format!("{}/sim/state", sim.url())).await)["received"], 1);

    let resumed = post(&sim, "/sim/resume", &serde_json::json!({})).await;
    assert_eq!(state(resumed), serde_json::json!({"status": "serving", "received": 1}));
    wait_load(&table, &id, "serving again", |l| l.status == EngineStatus::Serving).await;
    assert_eq!(worker.reported_status(), EngineStatus::Serving);

    cancel.cancel();
    tokio::time::timeout(PATIENCE, task).await.expect("subscriptions stop").expect("task");
}
