//! Shared pieces of the loopback tests: engines (real reporter service, or a scripted hostile
//! one speaking the same gRPC API), a router side (registry, table, subscriptions), and waiting
//! on table changes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use router_proto::router::load::v1 as pb;
use router_proto::router::load::v1::load_reporter_server::{LoadReporter, LoadReporterServer};
use router_state_load::reporter::{
    EngineSnapshot, EngineSnapshotSource, LoadReporterService, ReporterConfig,
};
use router_state_load::{
    EngineLoadStatus, EngineReportedLoadTable, EngineStatus, LoadSubscriptions, ManualClock,
    RankSample, ReportIntervalControl, SubscriptionConfig, TableConfig,
};
use router_test_support::on_change;
use router_workers::{
    LoadPollFormat, LoadPollSpec, ModelId, Stage, Worker, WorkerRegistry, WorkerSpec,
};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

pub(crate) use router_test_support::{PATIENCE, eventually};

/// An engine's numbers, settable by the test.
#[derive(Debug)]
pub(crate) struct EngineNumbers(pub Mutex<EngineSnapshot>);

impl EngineSnapshotSource for EngineNumbers {
    fn snapshot(&self) -> EngineSnapshot {
        self.0.lock().clone()
    }
}

pub(crate) fn native_rank(rank: u32, running: u64) -> RankSample {
    RankSample::basic(rank, running, 2, 1_000, 10_000)
        .with_native(300, 1_500, 64)
        .with_prefill_counters(0, 0)
}

pub(crate) fn numbers(dp_size: u32, running: u64) -> Arc<EngineNumbers> {
    Arc::new(EngineNumbers(Mutex::new(EngineSnapshot {
        status: EngineStatus::Serving,
        dp_size,
        ranks: (0..dp_size).map(|r| native_rank(r, running)).collect(),
    })))
}

/// A real reporter service on loopback.
pub(crate) struct Engine {
    pub addr: SocketAddr,
    pub service: LoadReporterService,
    pub cancel: CancellationToken,
    pub task: JoinHandle<()>,
}

impl Engine {
    pub(crate) async fn start(source: Arc<EngineNumbers>, config: ReporterConfig) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        Self::start_on(listener, source, config)
    }

    pub(crate) fn start_on(
        listener: TcpListener,
        source: Arc<EngineNumbers>,
        config: ReporterConfig,
    ) -> Self {
        let addr = listener.local_addr().expect("addr");
        let service = LoadReporterService::new(source, config);
        let cancel = CancellationToken::new();
        let task = tokio::spawn({
            let (service, cancel) = (service.clone(), cancel.clone());
            async move {
                router_state_load::reporter::serve_with(listener, service, cancel)
                    .await
                    .expect("reporter serves");
            }
        });
        Self { addr, service, cancel, task }
    }

    pub(crate) async fn stop(self) {
        self.cancel.cancel();
        self.task.await.expect("reporter task");
    }
}

/// What a scripted engine does after a subscriber registers.
#[derive(Clone, Debug)]
pub(crate) struct Script {
    pub reports: Vec<pb::LoadReport>,
    /// End the stream after the reports instead of holding it open.
    pub close: bool,
}

/// A hostile engine: speaks the LoadReporter API but sends exactly the scripted reports.
#[derive(Clone)]
pub(crate) struct ScriptedEngine {
    script: Arc<Script>,
    pub registrations: Arc<Mutex<Vec<pb::Register>>>,
}

#[tonic::async_trait]
impl LoadReporter for ScriptedEngine {
    type SubscribeStream = ReceiverStream<Result<pb::LoadReport, Status>>;

    async fn subscribe(
        &self,
        request: Request<Streaming<pb::SubscribeRequest>>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let mut inbound = request.into_inner();
        let Some(pb::SubscribeRequest {
            command: Some(pb::subscribe_request::Command::Register(register)),
        }) = inbound.message().await?
        else {
            return Err(Status::invalid_argument("register first"));
        };
        self.registrations.lock().push(register);
        let (tx, rx) = mpsc::channel(16);
        let script = Arc::clone(&self.script);
        tokio::spawn(async move {
            for report in &script.reports {
                if tx.send(Ok(report.clone())).await.is_err() {
                    return;
                }
            }
            if !script.close {
                // Hold the stream open until the router goes away.
                tx.closed().await;
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

impl ScriptedEngine {
    /// Serves the script on loopback; returns the address and the engine (for its
    /// registrations).
    pub(crate) async fn start(script: Script, cancel: CancellationToken) -> (SocketAddr, Self) {
        let engine = Self { script: Arc::new(script), registrations: Arc::default() };
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = LoadReporterServer::new(engine.clone());
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(server)
                .serve_with_incoming_shutdown(
                    TcpListenerStream::new(listener),
                    cancel.cancelled_owned(),
                )
                .await;
        });
        (addr, engine)
    }
}

/// A wire report with `ranks` native ranks of `running` requests each.
pub(crate) fn wire_report(
    engine_id: &str,
    instance: u64,
    sequence: u64,
    dp_size: u32,
    running: u64,
) -> pb::LoadReport {
    pb::LoadReport {
        engine_id: engine_id.to_owned(),
        instance_id: instance,
        sequence,
        kind: pb::ReportKind::Native as i32,
        status: pb::EngineStatus::Serving as i32,
        dp_size,
        ranks: (0..dp_size)
            .map(|r| pb::RankLoad {
                dp_rank: r,
                snapshot_time_unix_ms: 0,
                running_requests: running,
                waiting_requests: 1,
                kv_used_tokens: 100,
                kv_capacity_tokens: 1_000,
                waiting_uncached_tokens: Some(10),
                total_kv_tokens: Some(200),
                max_running_requests: Some(32),
                total_prefill_uncached_tokens: Some(0),
                total_prefill_busy_us: Some(0),
                estimated_prefill_queue_ms: None,
                decode_tokens_per_sec: None,
            })
            .collect(),
        sent_at_unix_ms: 0,
        interval_ms: 100,
    }
}

pub(crate) fn spec(id: &str, dp_size: u32) -> WorkerSpec {
    WorkerSpec { dp_size, ..WorkerSpec::new(id, "http://127.0.0.1:9", Stage::Plain) }
}

pub(crate) fn reporter_worker(id: &str, dp_size: u32, addr: SocketAddr) -> Worker {
    let spec = WorkerSpec { load_reporter: Some(addr.to_string()), ..spec(id, dp_size) };
    Worker::from_spec(&spec, vec![ModelId::new("m")]).expect("worker")
}

pub(crate) fn polled_worker(id: &str, dp_size: u32, addr: SocketAddr, interval_ms: u64) -> Worker {
    let spec = WorkerSpec {
        url: format!("http://{addr}"),
        load_poll: Some(LoadPollSpec::new(interval_ms, LoadPollFormat::Sglang)),
        ..spec(id, dp_size)
    };
    Worker::from_spec(&spec, vec![ModelId::new("m")]).expect("worker")
}

/// The router side: registry, table on a manual clock (so nothing turns stale by itself), and
/// running subscriptions.
pub(crate) struct Router {
    pub clock: Arc<ManualClock>,
    pub table: Arc<EngineReportedLoadTable>,
    pub registry: Arc<WorkerRegistry>,
    pub interval: ReportIntervalControl,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

pub(crate) fn fast_config() -> SubscriptionConfig {
    SubscriptionConfig {
        report_interval: Duration::from_millis(50),
        backoff_min: Duration::from_millis(10),
        backoff_max: Duration::from_millis(50),
        ..SubscriptionConfig::default()
    }
}

impl Router {
    pub(crate) fn start(
        workers: Vec<Worker>,
        table_config: TableConfig,
        config: SubscriptionConfig,
    ) -> Self {
        let clock = Arc::new(ManualClock::new());
        let table = Arc::new(EngineReportedLoadTable::new(table_config, clock.clone()));
        let registry = Arc::new(WorkerRegistry::new());
        for worker in workers {
            registry.add(worker).expect("add worker");
        }
        let subscriptions =
            LoadSubscriptions::new(Arc::clone(&table), Arc::clone(&registry), config);
        let interval = subscriptions.interval_control();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(subscriptions.run(cancel.clone()));
        Self { clock, table, registry, interval, cancel, task }
    }

    /// Waits until `condition` holds on the table, re-checking on every table change.
    pub(crate) async fn wait_until(
        &self,
        what: &str,
        condition: impl Fn(&EngineReportedLoadTable) -> bool,
    ) {
        wait_for_table(&self.table, what, condition).await;
    }

    /// Waits until the worker's status satisfies `condition`.
    pub(crate) async fn wait_status(
        &self,
        worker: &str,
        what: &str,
        condition: impl Fn(&EngineLoadStatus) -> bool,
    ) -> EngineLoadStatus {
        let id = router_workers::WorkerId::new(worker).expect("id");
        self.wait_until(what, |t| t.status_of(&id).is_some_and(|s| condition(&s))).await;
        self.table.status_of(&id).expect("registered")
    }

    pub(crate) async fn stop(self) {
        self.cancel.cancel();
        tokio::time::timeout(PATIENCE, self.task).await.expect("subscriptions stop").expect("task");
    }
}

pub(crate) async fn wait_for_table(
    table: &EngineReportedLoadTable,
    what: &str,
    condition: impl Fn(&EngineReportedLoadTable) -> bool,
) {
    let waited = on_change(&mut table.changes(), || condition(table).then_some(())).await;
    assert!(waited.is_some(), "gave up waiting for: {what}; status: {:?}", table.status());
}
