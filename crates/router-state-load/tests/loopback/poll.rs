//! `/v1/loads` polling against a real HTTP server whose answer the test sets.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router as HttpRouter;
use axum::http::StatusCode;
use axum::routing::get;
use parking_lot::Mutex;
use router_state_load::{
    Freshness, MissingReason, RejectReason, ReportKind, SubscriptionConfig, TableConfig,
};
use router_workers::WorkerId;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::common::*;

type Answer = Arc<Mutex<(StatusCode, String)>>;

/// An HTTP server answering `GET /v1/loads` with whatever `answer` holds.
async fn sglang(answer: Answer, cancel: CancellationToken) -> SocketAddr {
    let app = HttpRouter::new().route(
        "/v1/loads",
        get(move || {
            let answer = Arc::clone(&answer);
            async move { answer.lock().clone() }
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
    addr
}

fn rank(dp_rank: u32, running: i64) -> String {
    format!(
        r#"{{"dp_rank": {dp_rank}, "num_running_reqs": {running}, "num_waiting_reqs": 2,
            "num_waiting_uncached_tokens": 100, "num_used_tokens": 500, "num_total_tokens": 900,
            "max_total_num_tokens": 1000, "max_running_requests": 32, "token_usage": 0.5,
            "gen_throughput": 10.5, "cache_hit_rate": 0.25, "utilization": 0.0}}"#
    )
}

fn loads(ranks: &[String]) -> String {
    format!(
        r#"{{"timestamp": "2026-01-01T00:00:00+00:00", "version": "0.5.4", "loads": [{}]}}"#,
        ranks.join(",")
    )
}

fn id() -> WorkerId {
    WorkerId::new("s1").expect("id")
}

async fn setup(
    dp_size: u32,
    body: String,
    config: SubscriptionConfig,
) -> (Router, Answer, CancellationToken) {
    let answer: Answer = Arc::new(Mutex::new((StatusCode::OK, body)));
    let cancel = CancellationToken::new();
    let addr = sglang(Arc::clone(&answer), cancel.clone()).await;
    let router =
        Router::start(vec![polled_worker("s1", dp_size, addr, 10)], TableConfig::default(), config);
    (router, answer, cancel)
}

#[tokio::test]
async fn polls_sglang_loads_and_sums_ranks() {
    let (router, answer, cancel) = setup(2, loads(&[rank(1, 3), rank(0, 4)]), fast_config()).await;
    let status = router.wait_status("s1", "fresh", |s| s.freshness == Freshness::Fresh).await;
    assert_eq!(status.kind, Some(ReportKind::Native));
    let load = router.table.snapshot().get(&id()).copied().expect("fresh");
    assert_eq!((load.running_requests, load.waiting_requests, load.dp_size), (7, 4, 2));
    assert_eq!((load.kv_used_tokens, load.kv_capacity_tokens), (1000, 2000));
    let native = load.native.expect("native");
    assert_eq!((native.waiting_uncached_tokens, native.total_kv_tokens), (200, 1800));
    assert_eq!(native.prefill_queue_ms, None, "no counters, no queue time");

    answer.lock().1 = loads(&[rank(0, 10), rank(1, 10)]);
    router
        .wait_until("next poll", |t| {
            t.snapshot().get(&id()).is_some_and(|l| l.running_requests == 20)
        })
        .await;
    router.stop().await;
    cancel.cancel();
}

#[tokio::test]
async fn missing_rank_in_the_answer_reads_as_none() {
    let (router, answer, cancel) = setup(2, loads(&[rank(0, 1), rank(1, 1)]), fast_config()).await;
    router.wait_status("s1", "fresh", |s| s.freshness == Freshness::Fresh).await;
    answer.lock().1 = loads(&[rank(0, 1)]);
    let status = router
        .wait_status("s1", "incomplete", |s| {
            s.missing_reason == Some(MissingReason::RankIncomplete)
        })
        .await;
    assert!(status.rejected.get(RejectReason::RankIncomplete) >= 1);
    assert!(router.table.snapshot().get(&id()).is_none());
    router.stop().await;
    cancel.cancel();
}

#[tokio::test]
async fn negative_and_malformed_answers_are_rejected_and_change_nothing() {
    let (router, answer, cancel) = setup(1, loads(&[rank(0, 5)]), fast_config()).await;
    router.wait_status("s1", "fresh", |s| s.freshness == Freshness::Fresh).await;
    answer.lock().1 = loads(&[rank(0, -3)]);
    router
        .wait_status("s1", "negative rejected", |s| s.rejected.get(RejectReason::AbsurdValue) >= 1)
        .await;
    answer.lock().1 = r#"{"loads": [{"dp_rank": 0, "num_running_reqs": NaN}]}"#.to_owned();
    let status = router
        .wait_status("s1", "NaN rejected", |s| s.rejected.get(RejectReason::Malformed) >= 1)
        .await;
    assert_eq!(status.freshness, Freshness::Fresh);
    let load = router.table.snapshot().get(&id()).copied().expect("still the last good report");
    assert_eq!(load.running_requests, 5);
    router.stop().await;
    cancel.cancel();
}

#[tokio::test]
async fn failing_poll_is_missing_at_once() {
    let (router, answer, cancel) = setup(1, loads(&[rank(0, 5)]), fast_config()).await;
    router.wait_status("s1", "fresh", |s| s.freshness == Freshness::Fresh).await;
    *answer.lock() = (StatusCode::INTERNAL_SERVER_ERROR, "boom".to_owned());
    let status = router
        .wait_status("s1", "missing", |s| s.missing_reason == Some(MissingReason::PollFailed))
        .await;
    assert_eq!(status.freshness, Freshness::Missing);
    *answer.lock() = (StatusCode::OK, loads(&[rank(0, 6)]));
    router
        .wait_until("recovered", |t| {
            t.snapshot().get(&id()).is_some_and(|l| l.running_requests == 6)
        })
        .await;
    router.stop().await;
    cancel.cancel();
}

#[tokio::test]
async fn oversized_answer_is_rejected() {
    let config = SubscriptionConfig { max_report_bytes: 1024, ..fast_config() };
    let padded =
        format!(r#"{}, "pad": "{}"}}"#, rank(0, 1).trim_end_matches('}'), "x".repeat(4096));
    let big = loads(&[padded]);
    let (router, _answer, cancel) = setup(1, big, config).await;
    let status = router
        .wait_status("s1", "too large", |s| s.rejected.get(RejectReason::TooLarge) >= 1)
        .await;
    assert_eq!(status.accepted, 0);
    router.stop().await;
    cancel.cancel();
}
