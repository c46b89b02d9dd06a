//! vLLM `/metrics` polling against a real HTTP server whose answer the test sets: configured
//! (`format: vllm_metrics`) and found by probing a worker with no load source.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router as HttpRouter;
use axum::http::StatusCode;
use axum::routing::get;
use parking_lot::Mutex;
use router_state_load::{
    Freshness, MissingReason, RejectReason, ReportKind, SubscriptionConfig, TableConfig,
};
use router_workers::{LoadPollFormat, LoadPollSpec, ModelId, Worker, WorkerId, WorkerSpec};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::common::*;

/// A real vLLM 0.32.0 scrape: one idle engine, 5120 KV tokens, started at 1796645376.18.
const REAL: &str = include_str!("../../testdata/vllm_metrics.txt");
const ENGINE0: &str = r#"{engine="0",model_name="tiny"}"#;
const START: &str = "process_start_time_seconds 1.79664537618e+09";

/// The real scrape with engine 0's gauges replaced.
fn real(running: u32, waiting: u32, usage: &str) -> String {
    REAL.replace(
        &format!("vllm:num_requests_running{ENGINE0} 0.0"),
        &format!("vllm:num_requests_running{ENGINE0} {running}.0"),
    )
    .replace(
        &format!("vllm:num_requests_waiting{ENGINE0} 0.0"),
        &format!("vllm:num_requests_waiting{ENGINE0} {waiting}.0"),
    )
    .replace(
        &format!("vllm:kv_cache_usage_perc{ENGINE0} 0.0"),
        &format!("vllm:kv_cache_usage_perc{ENGINE0} {usage}"),
    )
}

/// A data-parallel scrape: engine `e` runs `running[e]` requests, half its 1000-token cache used.
fn data_parallel(running: &[u32]) -> String {
    let mut body = String::from("process_start_time_seconds 1.7e9\n");
    for (engine, running) in running.iter().enumerate() {
        let labels = format!(r#"{{engine="{engine}",model_name="m"}}"#);
        body.push_str(&format!(
            "vllm:num_requests_running{labels} {running}.0\n\
             vllm:num_requests_waiting{labels} 1.0\n\
             vllm:kv_cache_usage_perc{labels} 0.5\n\
             vllm:cache_config_info{{block_size=\"16\",engine=\"{engine}\",kv_cache_size_tokens=\"1000\"}} 1.0\n"
        ));
    }
    body
}

/// What the fake engine answers at `/metrics`, and how often it was asked.
#[derive(Clone)]
struct Metrics {
    answer: Arc<Mutex<(StatusCode, String)>>,
    hits: Arc<AtomicUsize>,
}

impl Metrics {
    fn set(&self, status: StatusCode, body: impl Into<String>) {
        *self.answer.lock() = (status, body.into());
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// An HTTP server answering `GET /metrics` with whatever the returned handle holds.
async fn engine(
    status: StatusCode,
    body: String,
    cancel: CancellationToken,
) -> (SocketAddr, Metrics) {
    let metrics = Metrics {
        answer: Arc::new(Mutex::new((status, body))),
        hits: Arc::new(AtomicUsize::new(0)),
    };
    let app = HttpRouter::new().route(
        "/metrics",
        get({
            let metrics = metrics.clone();
            move || {
                let metrics = metrics.clone();
                async move {
                    metrics.hits.fetch_add(1, Ordering::SeqCst);
                    metrics.answer.lock().clone()
                }
            }
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(cancel.cancelled_owned())
            .await
            .expect("serve");
    });
    (addr, metrics)
}

fn id() -> WorkerId {
    WorkerId::new("v1").expect("id")
}

/// A worker at `addr`: polled as vLLM when `poll` is given, else with no load source.
fn worker(addr: SocketAddr, dp_size: u32, poll: Option<u64>) -> Worker {
    let spec = WorkerSpec {
        url: format!("http://{addr}"),
        load_poll: poll.map(|ms| LoadPollSpec::new(ms, LoadPollFormat::VllmMetrics)),
        ..spec("v1", dp_size)
    };
    Worker::from_spec(&spec, vec![ModelId::new("m")]).expect("worker")
}

/// Quick probes, so that detection tests need no real 5 s.
fn probing_config() -> SubscriptionConfig {
    SubscriptionConfig {
        probe_backoff_min: Duration::from_millis(20),
        probe_backoff_max: Duration::from_millis(40),
        ..fast_config()
    }
}

async fn configured(dp_size: u32, body: String) -> (Router, Metrics, CancellationToken) {
    let cancel = CancellationToken::new();
    let (addr, metrics) = engine(StatusCode::OK, body, cancel.clone()).await;
    let router =
        Router::start(vec![worker(addr, dp_size, Some(10))], TableConfig::default(), fast_config());
    (router, metrics, cancel)
}

fn load(router: &Router) -> Option<router_state_load::EngineLoad> {
    router.table.snapshot().get(&id()).copied()
}

#[tokio::test]
async fn polls_a_real_scrape_as_a_basic_report_of_used_tokens() {
    let (router, metrics, cancel) = configured(1, REAL.to_owned()).await;
    let status = router.wait_status("v1", "fresh", |s| s.freshness == Freshness::Fresh).await;
    assert_eq!(status.kind, Some(ReportKind::Basic));
    let idle = load(&router).expect("fresh");
    assert_eq!((idle.running_requests, idle.waiting_requests), (0, 0));
    assert_eq!((idle.kv_used_tokens, idle.kv_capacity_tokens), (0, 5_120));
    assert!(idle.native.is_none(), "vLLM states no native gauges");

    metrics.set(StatusCode::OK, real(3, 7, "0.25"));
    router
        .wait_until("busy numbers", |_| {
            load(&router).is_some_and(|l| (l.running_requests, l.waiting_requests) == (3, 7))
        })
        .await;
    assert_eq!(load(&router).map(|l| l.kv_used_tokens), Some(1_280));
    let status = router.table.status_of(&id()).expect("registered");
    assert_eq!(status.rejected.total(), 0, "one instance, rising sequence: {status:?}");
    router.stop().await;
    cancel.cancel();
}

#[tokio::test]
async fn data_parallel_engines_are_ranks_and_must_cover_dp_size() {
    let (router, metrics, cancel) = configured(2, data_parallel(&[4, 6])).await;
    router.wait_status("v1", "fresh", |s| s.freshness == Freshness::Fresh).await;
    let both = load(&router).expect("fresh");
    assert_eq!((both.running_requests, both.waiting_requests, both.dp_size), (10, 2, 2));
    assert_eq!((both.kv_used_tokens, both.kv_capacity_tokens), (1000, 2000));
    let ranks = router.table.snapshot().ranks(&id()).map(<[_]>::to_vec).expect("ranks");
    assert_eq!(ranks.iter().map(|r| r.running_requests).collect::<Vec<_>>(), vec![4, 6]);

    metrics.set(StatusCode::OK, data_parallel(&[4]));
    let status = router
        .wait_status("v1", "rank incomplete", |s| {
            s.missing_reason == Some(MissingReason::RankIncomplete)
        })
        .await;
    assert!(status.rejected.get(RejectReason::RankIncomplete) >= 1);
    assert!(load(&router).is_none(), "one engine of two is no load");
    router.stop().await;
    cancel.cancel();
}

#[tokio::test]
async fn nonsense_and_foreign_scrapes_are_refused_and_keep_the_last_load() {
    let (router, metrics, cancel) = configured(1, real(5, 0, "0.5")).await;
    router.wait_status("v1", "fresh", |s| s.freshness == Freshness::Fresh).await;
    let cases = [
        (real(5, 0, "NaN"), RejectReason::AbsurdValue),
        (
            REAL.replace(
                &format!("vllm:num_requests_running{ENGINE0} 0.0"),
                "vllm:num_requests_running{engine=\"0\"} -2",
            ),
            RejectReason::AbsurdValue,
        ),
        (
            REAL.replace(&format!("vllm:num_requests_waiting{ENGINE0} 0.0\n"), ""),
            RejectReason::Malformed,
        ),
        ("# sglang\nsglang:num_running_reqs 3\n".to_owned(), RejectReason::Malformed),
    ];
    for (body, reason) in cases {
        let before = router.table.status_of(&id()).map_or(0, |s| s.rejected.get(reason));
        metrics.set(StatusCode::OK, body);
        let status =
            router.wait_status("v1", reason.as_str(), |s| s.rejected.get(reason) > before).await;
        assert_eq!(status.freshness, Freshness::Fresh, "{reason}: the last good load stays");
        assert_eq!(load(&router).map(|l| l.running_requests), Some(5), "{reason}");
    }
    router.stop().await;
    cancel.cancel();
}

#[tokio::test]
async fn failing_and_oversized_polls_are_no_load() {
    let (router, metrics, cancel) = configured(1, real(2, 0, "0.0")).await;
    router.wait_status("v1", "fresh", |s| s.freshness == Freshness::Fresh).await;
    metrics.set(StatusCode::SERVICE_UNAVAILABLE, "starting");
    router
        .wait_status("v1", "poll failed", |s| s.missing_reason == Some(MissingReason::PollFailed))
        .await;
    metrics.set(StatusCode::OK, real(9, 0, "0.0"));
    router
        .wait_until("recovered", |_| load(&router).is_some_and(|l| l.running_requests == 9))
        .await;
    router.stop().await;
    cancel.cancel();

    let cancel = CancellationToken::new();
    let (addr, _metrics) = engine(StatusCode::OK, REAL.to_owned(), cancel.clone()).await;
    let config = SubscriptionConfig { max_metrics_bytes: 4096, ..fast_config() };
    let router = Router::start(vec![worker(addr, 1, Some(10))], TableConfig::default(), config);
    let status = router
        .wait_status("v1", "too large", |s| s.rejected.get(RejectReason::TooLarge) >= 1)
        .await;
    assert_eq!(status.accepted, 0);
    router.stop().await;
    cancel.cancel();
}

#[tokio::test]
async fn a_restarted_engine_is_a_new_instance_and_its_scrapes_are_taken() {
    let (router, metrics, cancel) = configured(1, real(1, 0, "0.0")).await;
    router.wait_status("v1", "fresh", |s| s.freshness == Freshness::Fresh).await;
    // The restarted process started later; its numbers start over.
    metrics.set(
        StatusCode::OK,
        real(0, 2, "0.0").replace(START, "process_start_time_seconds 1.79664500001e+09"),
    );
    router
        .wait_until("restarted numbers", |_| load(&router).is_some_and(|l| l.waiting_requests == 2))
        .await;
    let status = router.table.status_of(&id()).expect("registered");
    assert_eq!(status.rejected.total(), 0, "{status:?}");
    router.stop().await;
    cancel.cancel();
}

#[tokio::test]
async fn a_worker_without_a_source_is_found_serving_vllm_metrics() {
    let cancel = CancellationToken::new();
    let (addr, metrics) = engine(StatusCode::OK, real(4, 1, "0.5"), cancel.clone()).await;
    let router =
        Router::start(vec![worker(addr, 1, None)], TableConfig::default(), probing_config());
    let status = router.wait_status("v1", "found", |s| s.freshness == Freshness::Fresh).await;
    assert_eq!(status.kind, Some(ReportKind::Basic));
    let found = load(&router).expect("fresh");
    assert_eq!((found.running_requests, found.waiting_requests), (4, 1));
    assert_eq!((found.kv_used_tokens, found.kv_capacity_tokens), (2_560, 5_120));
    assert_eq!(status.report_interval, Some(Duration::from_millis(50)), "the report interval");

    // Polled at the report interval from then on.
    metrics.set(StatusCode::OK, real(8, 1, "0.5"));
    router.wait_until("polled", |_| load(&router).is_some_and(|l| l.running_requests == 8)).await;
    router.stop().await;
    cancel.cancel();
}

#[tokio::test]
async fn other_engines_stay_not_configured_and_are_probed_with_backoff() {
    let cancel = CancellationToken::new();
    let sglang = "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{engine_type=\"unified\"} 3.0\n";
    let (addr, metrics) = engine(StatusCode::OK, sglang.to_owned(), cancel.clone()).await;
    // Probes back off well past the poll interval: a non-vLLM engine is asked far less often.
    let config = SubscriptionConfig {
        report_interval: Duration::from_millis(10),
        probe_backoff_min: Duration::from_millis(40),
        probe_backoff_max: Duration::from_millis(80),
        ..fast_config()
    };
    let router = Router::start(vec![worker(addr, 1, None)], TableConfig::default(), config);
    eventually("probed a few times", || async { metrics.hits() >= 3 }).await;
    let status = router.table.status_of(&id()).expect("registered");
    assert_eq!(status.missing_reason, Some(MissingReason::NotConfigured));
    assert_eq!((status.accepted, status.rejected.total()), (0, 0), "not a refusal either");
    let hits = metrics.hits();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(metrics.hits() - hits <= 6, "probed {} times in 200 ms", metrics.hits() - hits);

    metrics.set(StatusCode::NOT_FOUND, "");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let status = router.table.status_of(&id()).expect("registered");
    assert_eq!(status.missing_reason, Some(MissingReason::NotConfigured));

    // The engine is replaced by a vLLM one: found at the next probe.
    metrics.set(StatusCode::OK, real(2, 0, "0.0"));
    router.wait_status("v1", "found", |s| s.freshness == Freshness::Fresh).await;
    router.stop().await;
    cancel.cancel();
}

#[tokio::test]
async fn a_found_engine_going_down_and_coming_back_is_probed_and_found_again() {
    let cancel = CancellationToken::new();
    let (addr, metrics) = engine(StatusCode::OK, real(1, 0, "0.0"), cancel.clone()).await;
    // Polling faster than the probes back off, so a lost engine is seen to be probed, not polled.
    let config = SubscriptionConfig {
        report_interval: Duration::from_millis(20),
        probe_backoff_min: Duration::from_millis(150),
        probe_backoff_max: Duration::from_millis(300),
        ..fast_config()
    };
    let router = Router::start(vec![worker(addr, 1, None)], TableConfig::default(), config);
    router.wait_status("v1", "found", |s| s.freshness == Freshness::Fresh).await;

    // Down (restarting): missing at once, and it stays `poll_failed` while probed.
    metrics.set(StatusCode::SERVICE_UNAVAILABLE, "");
    router
        .wait_status("v1", "poll failed", |s| s.missing_reason == Some(MissingReason::PollFailed))
        .await;
    let hits = metrics.hits();
    tokio::time::sleep(Duration::from_millis(450)).await;
    let asked = metrics.hits() - hits;
    assert!(asked <= 8, "asked {asked} times in 450 ms: probing, not polling every 20 ms");
    let status = router.table.status_of(&id()).expect("registered");
    assert_eq!(status.missing_reason, Some(MissingReason::PollFailed));

    // Back, as a new process.
    metrics
        .set(StatusCode::OK, real(6, 0, "0.0").replace(START, "process_start_time_seconds 1.8e9"));
    router
        .wait_until("found again", |_| load(&router).is_some_and(|l| l.running_requests == 6))
        .await;

    // No longer vLLM: not configured again.
    metrics.set(StatusCode::OK, "# nothing here\n");
    router
        .wait_status("v1", "not vLLM", |s| s.missing_reason == Some(MissingReason::NotConfigured))
        .await;
    let status = router.table.status_of(&id()).expect("registered");
    assert_eq!(status.rejected.total(), 0, "{status:?}");
    router.stop().await;
    cancel.cancel();
}
