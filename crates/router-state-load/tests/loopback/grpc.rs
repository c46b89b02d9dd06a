//! Subscriptions against real reporters and scripted hostile engines.

use std::time::Duration;

use router_proto::router::load::v1 as pb;
use router_state_load::reporter::ReporterConfig;
use router_state_load::{
    EngineStatus, Freshness, MissingReason, RejectReason, ReportKind, SubscriptionConfig,
    TableConfig,
};
use router_workers::{Worker, WorkerId};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::common::*;

fn id(s: &str) -> WorkerId {
    WorkerId::new(s).expect("id")
}

#[tokio::test]
async fn reports_stream_from_engine_to_table() {
    let numbers = numbers(2, 3);
    let engine = Engine::start(numbers.clone(), ReporterConfig::default()).await;
    let router = Router::start(
        vec![reporter_worker("e1", 2, engine.addr)],
        TableConfig::default(),
        fast_config(),
    );
    let status =
        router.wait_status("e1", "first report", |s| s.freshness == Freshness::Fresh).await;
    assert_eq!(status.kind, Some(ReportKind::Native));
    assert_eq!(status.report_interval, Some(Duration::from_millis(50)), "engine honours 50 ms");
    let load = *router.table.snapshot().get(&id("e1")).expect("fresh");
    assert_eq!((load.running_requests, load.waiting_requests), (6, 4));
    assert_eq!((load.kv_used_tokens, load.kv_capacity_tokens), (2_000, 20_000));
    assert_eq!(load.status, EngineStatus::Serving);
    let native = load.native.expect("native");
    assert_eq!((native.waiting_uncached_tokens, native.max_running_requests), (600, 128));

    // The engine's numbers change; the next reports carry them.
    {
        let mut snapshot = numbers.0.lock();
        for rank in &mut snapshot.ranks {
            rank.running_requests = 10;
        }
    }
    router
        .wait_until("new numbers", |t| {
            t.snapshot().get(&id("e1")).is_some_and(|l| l.running_requests == 20)
        })
        .await;
    assert_eq!(engine.service.subscribers(), 1, "one stream per engine");
    router.stop().await;
    eventually("stream closed after the router stopped", || async {
        engine.service.subscribers() == 0
    })
    .await;
    engine.stop().await;
}

#[tokio::test]
async fn interval_changes_reach_the_engine() {
    let engine = Engine::start(numbers(1, 1), ReporterConfig::default()).await;
    let config = SubscriptionConfig { report_interval: Duration::from_secs(30), ..fast_config() };
    let router =
        Router::start(vec![reporter_worker("e1", 1, engine.addr)], TableConfig::default(), config);
    router
        .wait_status("e1", "registered at 30 s", |s| {
            s.report_interval == Some(Duration::from_secs(30))
        })
        .await;
    router.interval.set(Duration::from_millis(40));
    assert_eq!(router.interval.get(), Duration::from_millis(40));
    // The engine answers a SetInterval with a report at once, stating the new interval.
    let status = router
        .wait_status("e1", "interval updated", |s| {
            s.report_interval == Some(Duration::from_millis(40))
        })
        .await;
    assert_eq!(status.freshness, Freshness::Fresh);
    router.interval.set(Duration::from_millis(1));
    router
        .wait_status("e1", "interval clamped by the engine", |s| {
            s.report_interval == Some(Duration::from_millis(20))
        })
        .await;
    router.stop().await;
    engine.stop().await;
}

#[tokio::test]
async fn broken_stream_is_missing_at_once_and_a_restarted_engine_is_picked_up() {
    let engine = Engine::start(numbers(1, 1), ReporterConfig::default()).await;
    let addr = engine.addr;
    let first_instance = engine.service.instance_id();
    let router =
        Router::start(vec![reporter_worker("e1", 1, addr)], TableConfig::default(), fast_config());
    router.wait_status("e1", "fresh", |s| s.freshness == Freshness::Fresh).await;

    engine.stop().await;
    // The table's clock never moved: only the broken stream can make it missing.
    let status = router.wait_status("e1", "missing", |s| s.freshness == Freshness::Missing).await;
    assert_eq!(status.missing_reason, Some(MissingReason::Disconnected));
    assert!(router.table.snapshot().get(&id("e1")).is_none());

    let listener = TcpListener::bind(addr).await.expect("rebind the same port");
    let restarted = Engine::start_on(listener, numbers(1, 7), ReporterConfig::default());
    assert_ne!(restarted.service.instance_id(), first_instance);
    router
        .wait_until("reconnected to the restarted engine", |t| {
            t.snapshot().get(&id("e1")).is_some_and(|l| l.running_requests == 7)
        })
        .await;
    router.stop().await;
    restarted.stop().await;
}

#[tokio::test]
async fn removed_worker_leaves_the_table_and_closes_its_stream() {
    let engine = Engine::start(numbers(1, 1), ReporterConfig::default()).await;
    let router = Router::start(
        vec![reporter_worker("e1", 1, engine.addr)],
        TableConfig::default(),
        fast_config(),
    );
    router.wait_status("e1", "fresh", |s| s.freshness == Freshness::Fresh).await;
    router.registry.remove(&id("e1")).expect("remove");
    router.wait_until("dropped", |t| t.status_of(&id("e1")).is_none()).await;
    assert!(router.table.snapshot().get(&id("e1")).is_none());
    eventually("engine sees the subscription end", || async { engine.service.subscribers() == 0 })
        .await;
    router.stop().await;
    engine.stop().await;
}

#[tokio::test]
async fn replaced_worker_starts_over_and_old_subscription_stops() {
    let old_engine = Engine::start(numbers(1, 1), ReporterConfig::default()).await;
    let new_engine = Engine::start(numbers(1, 5), ReporterConfig::default()).await;
    let router = Router::start(
        vec![reporter_worker("e1", 1, old_engine.addr)],
        TableConfig::default(),
        fast_config(),
    );
    router.wait_status("e1", "fresh", |s| s.freshness == Freshness::Fresh).await;
    router.registry.replace(reporter_worker("e1", 1, new_engine.addr)).expect("replace");
    router
        .wait_until("new engine's numbers", |t| {
            t.snapshot().get(&id("e1")).is_some_and(|l| l.running_requests == 5)
        })
        .await;
    eventually("old engine unsubscribed", || async { old_engine.service.subscribers() == 0 }).await;
    router.stop().await;
    old_engine.stop().await;
    new_engine.stop().await;
}

#[tokio::test]
async fn worker_without_a_source_reads_not_configured() {
    let worker = Worker::from_spec(&spec("quiet", 1), vec![router_workers::ModelId::new("m")])
        .expect("worker");
    let router = Router::start(vec![worker], TableConfig::default(), fast_config());
    let status = router
        .wait_status("quiet", "not configured", |s| {
            s.missing_reason == Some(MissingReason::NotConfigured)
        })
        .await;
    assert_eq!(status.freshness, Freshness::Missing);
    router.stop().await;
}

/// Runs one scripted engine against a router following worker `e1` (dp `dp_size`).
async fn scripted(
    reports: Vec<pb::LoadReport>,
    dp_size: u32,
    table: TableConfig,
    config: SubscriptionConfig,
) -> (Router, ScriptedEngine, CancellationToken) {
    let cancel = CancellationToken::new();
    let (addr, engine) =
        ScriptedEngine::start(Script { reports, close: false }, cancel.clone()).await;
    let router = Router::start(vec![reporter_worker("e1", dp_size, addr)], table, config);
    (router, engine, cancel)
}

#[tokio::test]
async fn report_for_another_engine_is_rejected_and_creates_nothing() {
    let reports = vec![wire_report("intruder", 1, 1, 1, 4)];
    let (router, engine, cancel) =
        scripted(reports, 1, TableConfig::default(), fast_config()).await;
    let status = router
        .wait_status("e1", "rejected", |s| s.rejected.get(RejectReason::EngineMismatch) == 1)
        .await;
    assert_eq!(status.freshness, Freshness::Missing);
    assert!(router.table.status_of(&id("intruder")).is_none());
    assert!(router.registry.get(&id("intruder")).is_none());
    assert_eq!(router.table.status().len(), 1);
    assert_eq!(engine.registrations.lock()[0].engine_id, "e1", "router registers its own id");
    router.stop().await;
    cancel.cancel();
}

#[tokio::test]
async fn dp_size_mismatch_is_rejected() {
    let reports = vec![wire_report("e1", 1, 1, 2, 4)];
    let (router, _engine, cancel) =
        scripted(reports, 4, TableConfig::default(), fast_config()).await;
    let status = router
        .wait_status("e1", "rejected", |s| s.rejected.get(RejectReason::DpSizeMismatch) == 1)
        .await;
    assert_eq!((status.accepted, status.freshness), (0, Freshness::Missing));
    router.stop().await;
    cancel.cancel();
}

#[tokio::test]
async fn sequences_going_back_are_rejected() {
    let reports = vec![
        wire_report("e1", 9, 5, 1, 1),
        wire_report("e1", 9, 3, 1, 30),
        wire_report("e1", 9, 5, 1, 50),
        wire_report("e1", 9, 6, 1, 2),
        wire_report("e1", 9, 4, 1, 40),
    ];
    let (router, _engine, cancel) =
        scripted(reports, 1, TableConfig::default(), fast_config()).await;
    let status =
        router.wait_status("e1", "all five seen", |s| s.accepted + s.rejected.total() == 5).await;
    assert_eq!(status.accepted, 2);
    assert_eq!(status.rejected.get(RejectReason::SequenceWentBack), 3);
    let load = router.table.snapshot().get(&id("e1")).copied().expect("fresh");
    assert_eq!(load.running_requests, 2, "seq 6 is the newest accepted");
    router.stop().await;
    cancel.cancel();
}

#[tokio::test]
async fn missing_ranks_make_the_engine_unusable() {
    let mut partial = wire_report("e1", 1, 2, 3, 9);
    partial.ranks.remove(1);
    let reports = vec![wire_report("e1", 1, 1, 3, 1), partial];
    let (router, _engine, cancel) =
        scripted(reports, 3, TableConfig::default(), fast_config()).await;
    let status = router
        .wait_status("e1", "incomplete", |s| s.rejected.get(RejectReason::RankIncomplete) == 1)
        .await;
    assert_eq!(status.missing_reason, Some(MissingReason::RankIncomplete));
    assert!(router.table.snapshot().get(&id("e1")).is_none(), "never a partial sum");
    router.stop().await;
    cancel.cancel();
}

#[tokio::test]
async fn absurd_values_are_rejected_and_invalid_estimates_dropped() {
    let mut absurd = wire_report("e1", 1, 2, 1, 1);
    absurd.ranks[0].running_requests = u64::MAX;
    let mut nan = wire_report("e1", 1, 3, 1, 7);
    nan.ranks[0].estimated_prefill_queue_ms = Some(f64::NAN);
    let mut unspecified = wire_report("e1", 1, 4, 1, 1);
    unspecified.kind = pb::ReportKind::Unspecified as i32;
    let reports = vec![wire_report("e1", 1, 1, 1, 1), absurd, nan, unspecified];
    let (router, _engine, cancel) =
        scripted(reports, 1, TableConfig::default(), fast_config()).await;
    let status =
        router.wait_status("e1", "all seen", |s| s.accepted + s.rejected.total() == 4).await;
    assert_eq!(status.rejected.get(RejectReason::AbsurdValue), 1);
    assert_eq!(status.rejected.get(RejectReason::Malformed), 1);
    assert_eq!((status.accepted, status.clamped), (2, 1));
    let load = router.table.snapshot().get(&id("e1")).copied().expect("fresh");
    assert_eq!(load.running_requests, 7);
    assert_eq!(load.native.expect("native").prefill_queue_ms, None, "NaN is not an estimate");
    router.stop().await;
    cancel.cancel();
}

#[tokio::test]
async fn engine_clock_skew_does_not_matter() {
    // An engine whose clock reads 1970: only the difference of its own timestamps is used.
    let mut skewed = wire_report("e1", 1, 1, 1, 3);
    skewed.sent_at_unix_ms = 5_000;
    skewed.ranks[0].snapshot_time_unix_ms = 4_900;
    let (router, _engine, cancel) =
        scripted(vec![skewed], 1, TableConfig::default(), fast_config()).await;
    router.wait_status("e1", "fresh", |s| s.freshness == Freshness::Fresh).await;
    let load = router.table.snapshot().get(&id("e1")).copied().expect("fresh");
    assert_eq!(load.received_at - load.captured_at, Duration::from_millis(100));
    router.stop().await;
    cancel.cancel();
}

#[tokio::test]
async fn a_flood_is_rate_limited_without_corrupting_the_table() {
    let reports: Vec<_> = (1..=300).map(|seq| wire_report("e1", 1, seq, 1, seq)).collect();
    let table = TableConfig { report_burst: 20, ..TableConfig::default() };
    let (router, _engine, cancel) = scripted(reports, 1, table, fast_config()).await;
    // The table's clock stands still, so the bucket never refills: exactly the burst passes.
    let status =
        router.wait_status("e1", "all seen", |s| s.accepted + s.rejected.total() == 300).await;
    assert_eq!(status.accepted, 20);
    assert_eq!(status.rejected.get(RejectReason::RateLimited), 280);
    let load = router.table.snapshot().get(&id("e1")).copied().expect("fresh");
    assert_eq!(load.running_requests, 20, "the last accepted report, intact");
    router.stop().await;
    cancel.cancel();
}

#[tokio::test]
async fn oversized_message_breaks_the_stream_and_is_counted() {
    let mut huge = wire_report("e1", 1, 2, 1, 1);
    huge.engine_id = "x".repeat(64 * 1024);
    let reports = vec![wire_report("e1", 1, 1, 1, 1), huge];
    let config = SubscriptionConfig { max_report_bytes: 16 * 1024, ..fast_config() };
    let (router, engine, cancel) = scripted(reports, 1, TableConfig::default(), config).await;
    let status = router
        .wait_status("e1", "too large", |s| s.rejected.get(RejectReason::TooLarge) >= 1)
        .await;
    assert!(status.accepted >= 1);
    // The stream broke; the subscription reconnects (and the engine replays its script).
    eventually("reconnected", || async { engine.registrations.lock().len() >= 2 }).await;
    router.stop().await;
    cancel.cancel();
}

#[tokio::test]
async fn engine_ending_the_stream_is_missing_at_once_then_resubscribed() {
    let cancel = CancellationToken::new();
    let script = Script { reports: vec![wire_report("e1", 1, 1, 1, 1)], close: true };
    let (addr, engine) = ScriptedEngine::start(script, cancel.clone()).await;
    let router =
        Router::start(vec![reporter_worker("e1", 1, addr)], TableConfig::default(), fast_config());
    let status = router
        .wait_status("e1", "replayed report rejected", |s| {
            s.rejected.get(RejectReason::SequenceWentBack) >= 1
        })
        .await;
    assert!(engine.registrations.lock().len() >= 2, "resubscribed after the end");
    assert_eq!(status.accepted, 1, "the replay repeats sequence 1 of the same instance");
    assert_eq!(status.freshness, Freshness::Missing);
    assert_eq!(status.missing_reason, Some(MissingReason::Disconnected));
    router.stop().await;
    cancel.cancel();
}

#[tokio::test]
async fn an_engine_refusing_the_registration_reads_as_missing() {
    let config =
        ReporterConfig { engine_id: Some("someone-else".into()), ..ReporterConfig::default() };
    let engine = Engine::start(numbers(1, 1), config).await;
    let router = Router::start(
        vec![reporter_worker("e1", 1, engine.addr)],
        TableConfig::default(),
        fast_config(),
    );
    let status = router
        .wait_status("e1", "refused", |s| s.missing_reason == Some(MissingReason::Disconnected))
        .await;
    assert_eq!(status.accepted, 0);
    assert_eq!(engine.service.subscribers(), 0);
    router.stop().await;
    engine.stop().await;
}

#[tokio::test]
async fn an_engine_gone_quiet_turns_stale_after_the_window() {
    // One report, then silence on an open stream.
    let (router, _engine, cancel) =
        scripted(vec![wire_report("e1", 1, 1, 1, 2)], 1, TableConfig::default(), fast_config())
            .await;
    let status = router.wait_status("e1", "fresh", |s| s.freshness == Freshness::Fresh).await;
    // The report said it comes every 100 ms: the window is max(3 s, 3 x 100 ms).
    assert_eq!(status.stale_after, Duration::from_secs(3));
    router.clock.advance(Duration::from_millis(2_999));
    assert!(router.table.snapshot().get(&id("e1")).is_some());
    router.clock.advance(Duration::from_millis(1));
    assert!(router.table.snapshot().get(&id("e1")).is_none(), "stale reads as None");
    let status = router.table.status_of(&id("e1")).expect("registered");
    assert_eq!((status.freshness, status.age_ms), (Freshness::Stale, Some(3_000)));
    router.stop().await;
    cancel.cancel();
}

#[tokio::test]
async fn a_stalled_stream_is_dropped_and_reopened() {
    // One report, then an open but silent stream: the subscription gives up on it after the
    // stall timeout and reconnects.
    let config = SubscriptionConfig {
        stall_timeout: Duration::from_millis(100),
        report_interval: Duration::from_millis(10),
        ..fast_config()
    };
    let (router, engine, cancel) =
        scripted(vec![wire_report("e1", 1, 1, 1, 2)], 1, TableConfig::default(), config).await;
    router.wait_status("e1", "fresh", |s| s.freshness == Freshness::Fresh).await;
    let status = router
        .wait_status("e1", "dropped as stalled", |s| {
            s.missing_reason == Some(MissingReason::Disconnected)
        })
        .await;
    assert_eq!(status.freshness, Freshness::Missing, "well before the 3 s freshness window");
    eventually("reconnected", || async { engine.registrations.lock().len() >= 2 }).await;
    router.stop().await;
    cancel.cancel();
}

#[tokio::test]
async fn the_status_of_accepted_reports_reaches_the_worker_and_outlives_the_stream() {
    let with_status = |mut report: pb::LoadReport, status: pb::EngineStatus| {
        report.status = status as i32;
        report
    };
    let reports = vec![
        with_status(wire_report("e1", 9, 2, 1, 1), pb::EngineStatus::Draining),
        // Refused by the table, so they change no status: out of order, another engine's.
        with_status(wire_report("e1", 9, 1, 1, 1), pb::EngineStatus::Serving),
        with_status(wire_report("intruder", 9, 3, 1, 1), pb::EngineStatus::Serving),
    ];
    let cancel = CancellationToken::new();
    // The engine ends its stream after the reports, as a process shutting down would.
    let (addr, _engine) =
        ScriptedEngine::start(Script { reports, close: true }, cancel.clone()).await;
    let router =
        Router::start(vec![reporter_worker("e1", 1, addr)], TableConfig::default(), fast_config());
    let worker = router.registry.get(&id("e1")).expect("registered");
    assert_eq!(worker.reported_status(), EngineStatus::Unknown, "nothing stated yet");
    let status = router
        .wait_status("e1", "all three seen and the stream gone", |s| {
            s.accepted == 1
                && s.rejected.get(RejectReason::SequenceWentBack) >= 1
                && s.rejected.get(RejectReason::EngineMismatch) >= 1
                && s.missing_reason == Some(MissingReason::Disconnected)
        })
        .await;
    assert_eq!(status.freshness, Freshness::Missing);
    assert_eq!(
        worker.reported_status(),
        EngineStatus::Draining,
        "the last stated status stays after refused reports and a lost stream"
    );
    assert!(!worker.accepts_new_requests());
    router.stop().await;
    cancel.cancel();
}
