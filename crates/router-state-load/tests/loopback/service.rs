//! The engine-side service, driven by a raw gRPC client.

use std::time::Duration;

use router_proto::router::load::v1 as pb;
use router_proto::router::load::v1::load_reporter_client::LoadReporterClient;
use router_proto::router::load::v1::subscribe_request::Command;
use router_state_load::reporter::ReporterConfig;
use router_state_load::{Report, ReportKind};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::transport::Channel;

use crate::common::*;

type Commands = mpsc::Sender<pb::SubscribeRequest>;

fn cmd(command: Command) -> pb::SubscribeRequest {
    pb::SubscribeRequest { command: Some(command) }
}

fn register(engine_id: &str, interval_ms: u32) -> pb::SubscribeRequest {
    cmd(Command::Register(pb::Register {
        engine_id: engine_id.to_owned(),
        interval_ms,
        subscriber: "test".to_owned(),
    }))
}

async fn client(engine: &Engine) -> LoadReporterClient<Channel> {
    LoadReporterClient::connect(format!("http://{}", engine.addr)).await.expect("connect")
}

/// Opens a subscription whose first request is `first`.
async fn open(
    engine: &Engine,
    first: pb::SubscribeRequest,
) -> (Commands, Result<tonic::Streaming<pb::LoadReport>, tonic::Status>) {
    let (tx, rx) = mpsc::channel(4);
    tx.send(first).await.expect("queued");
    let opened = client(engine).await.subscribe(ReceiverStream::new(rx)).await;
    (tx, opened.map(tonic::Response::into_inner))
}

async fn next(stream: &mut tonic::Streaming<pb::LoadReport>) -> pb::LoadReport {
    tokio::time::timeout(PATIENCE, stream.message())
        .await
        .expect("a report in time")
        .expect("stream ok")
        .expect("stream open")
}

#[tokio::test]
async fn reports_at_once_then_at_the_interval_with_increasing_sequence() {
    let config = ReporterConfig { instance_id: 42, ..ReporterConfig::default() };
    let engine = Engine::start(numbers(2, 4), config).await;
    let (_tx, stream) = open(&engine, register("e1", 25)).await;
    let mut stream = stream.expect("subscribed");
    let first = next(&mut stream).await;
    let second = next(&mut stream).await;
    assert_eq!((first.engine_id.as_str(), first.instance_id), ("e1", 42));
    assert_eq!(first.kind, pb::ReportKind::Native as i32);
    assert_eq!((first.dp_size, first.ranks.len(), first.interval_ms), (2, 2, 25));
    assert!(second.sequence > first.sequence);
    assert!(first.ranks.iter().all(|r| r.total_prefill_busy_us == Some(0)));
    let decoded = Report::from_wire(&second).expect("decodes");
    assert_eq!(decoded.ranks[1].running_requests, 4);
    assert_eq!(engine.service.subscribers(), 1);
    engine.stop().await;
}

#[tokio::test]
async fn set_interval_reports_at_once_and_stop_ends_the_call() {
    let engine = Engine::start(numbers(1, 1), ReporterConfig::default()).await;
    let (tx, stream) = open(&engine, register("e1", 60_000)).await;
    let mut stream = stream.expect("subscribed");
    assert_eq!(next(&mut stream).await.interval_ms, 60_000);
    tx.send(cmd(Command::SetInterval(pb::SetInterval { interval_ms: 0 }))).await.expect("sent");
    assert_eq!(next(&mut stream).await.interval_ms, 500, "0 asks for the default");
    tx.send(cmd(Command::SetInterval(pb::SetInterval { interval_ms: 999_999_999 })))
        .await
        .expect("sent");
    assert_eq!(next(&mut stream).await.interval_ms, 60_000, "clamped to the maximum");
    tx.send(cmd(Command::Stop(pb::Stop {}))).await.expect("sent");
    let end = tokio::time::timeout(PATIENCE, async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("ends in time");
    assert!(matches!(end, Ok(None)), "stop completes the call with OK: {end:?}");
    engine.stop().await;
}

#[tokio::test]
async fn refuses_bad_subscriptions() {
    let config = ReporterConfig {
        engine_id: Some("e1".into()),
        max_subscribers: 1,
        ..ReporterConfig::default()
    };
    let engine = Engine::start(numbers(1, 1), config).await;

    let (_tx, wrong) = open(&engine, register("e2", 100)).await;
    assert_eq!(wrong.expect_err("refused").code(), Code::FailedPrecondition);

    let (_tx, not_register) =
        open(&engine, cmd(Command::SetInterval(pb::SetInterval { interval_ms: 5 }))).await;
    assert_eq!(not_register.expect_err("refused").code(), Code::InvalidArgument);

    // Empty engine id: the engine's own id is used.
    let (tx, first) = open(&engine, register("", 100)).await;
    let mut first = first.expect("subscribed");
    assert_eq!(next(&mut first).await.engine_id, "e1");
    let (_tx2, second) = open(&engine, register("e1", 100)).await;
    assert_eq!(second.expect_err("full").code(), Code::ResourceExhausted);

    tx.send(register("e1", 100)).await.expect("sent");
    let refused = tokio::time::timeout(PATIENCE, async {
        loop {
            match first.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("in time");
    assert_eq!(refused.expect_err("second register refused").code(), Code::InvalidArgument);
    eventually("slot freed", || async { engine.service.subscribers() == 0 }).await;
    engine.stop().await;
}

#[tokio::test]
async fn register_must_arrive_in_time() {
    let config =
        ReporterConfig { register_timeout: Duration::from_millis(50), ..ReporterConfig::default() };
    let engine = Engine::start(numbers(1, 1), config).await;
    let (_tx, rx) = mpsc::channel::<pb::SubscribeRequest>(1);
    let opened = client(&engine).await.subscribe(ReceiverStream::new(rx)).await;
    assert_eq!(opened.expect_err("timed out").code(), Code::DeadlineExceeded);
    engine.stop().await;
}

#[tokio::test]
async fn basic_when_a_rank_lacks_native_gauges_and_shutdown_ends_streams() {
    let numbers = numbers(2, 1);
    numbers.0.lock().ranks[1].total_kv_tokens = None;
    let engine = Engine::start(numbers, ReporterConfig::default()).await;
    let (_tx, stream) = open(&engine, register("e1", 50)).await;
    let mut stream = stream.expect("subscribed");
    let report = next(&mut stream).await;
    assert_eq!(report.kind, pb::ReportKind::Basic as i32);
    assert!(report.ranks.iter().all(|r| r.waiting_uncached_tokens.is_none()));
    assert_eq!(Report::from_wire(&report).expect("decodes").kind, ReportKind::Basic);

    engine.service.shutdown();
    let end = tokio::time::timeout(PATIENCE, async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("ends in time");
    assert!(matches!(end, Ok(None)), "{end:?}");
    let (_tx, refused) = open(&engine, register("e1", 50)).await;
    assert_eq!(refused.expect_err("shutting down").code(), Code::Unavailable);
    engine.stop().await;
}
