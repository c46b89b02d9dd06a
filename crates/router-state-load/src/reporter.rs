//! The engine side of load reporting: a tonic `LoadReporter` service that an engine, a sidecar
//! beside it, or the simulator runs, fed by a [`EngineSnapshotSource`].
//!
//! The service answers each `Subscribe` call with a report at once and then one per interval
//! the router asked for (clamped to [`ReporterConfig`]'s bounds), reports again at once when the
//! router changes the interval, and ends the call when the router stops, closes its request
//! stream or disconnects, or when [`LoadReporterService::shutdown`] is called. Sequence numbers
//! are shared by all subscriptions of one service, so they increase across reconnects;
//! [`ReporterConfig::instance_id`] identifies the process.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use router_state_load::reporter::{self, EngineSnapshot, EngineSnapshotSource};
//! # use router_state_load::{EngineStatus, RankSample};
//! # async fn run() -> Result<(), reporter::ServeError> {
//! let source: Arc<dyn EngineSnapshotSource> = Arc::new(|| EngineSnapshot {
//!     status: EngineStatus::Serving,
//!     dp_size: 1,
//!     ranks: vec![RankSample::basic(0, 3, 1, 4096, 65536)],
//! });
//! let cancel = tokio_util::sync::CancellationToken::new();
//! reporter::serve("127.0.0.1:50051".parse().expect("addr"), source, cancel).await
//! # }
//! ```

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use router_proto::router::load::v1 as pb;
use router_proto::router::load::v1::load_reporter_server::{LoadReporter, LoadReporterServer};
use router_proto::router::load::v1::subscribe_request::Command;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::report::status_to_wire;
use crate::{EngineStatus, RankSample};

/// Largest request message the service decodes; routers only send small commands.
const MAX_REQUEST_BYTES: usize = 4096;

/// What an engine reports: its state and every rank's numbers, at the moment of the call.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineSnapshot {
    /// The engine's serving state.
    pub status: EngineStatus,
    /// The engine's number of data-parallel ranks. Give the real number even when a rank's
    /// numbers are missing from `ranks`: the router then treats the report as incomplete
    /// instead of summing a partial set.
    pub dp_size: u32,
    /// One entry per rank. The report is NATIVE when every rank carries the three native gauges
    /// (see [`RankSample::has_native_gauges`]), BASIC otherwise.
    pub ranks: Vec<RankSample>,
}

/// Where the service gets the engine's current numbers. Called once per report sent, on the
/// async runtime, so it must be cheap and must not block.
pub trait EngineSnapshotSource: Send + Sync + 'static {
    /// The engine's numbers now.
    fn snapshot(&self) -> EngineSnapshot;
}

impl<F> EngineSnapshotSource for F
where
    F: Fn() -> EngineSnapshot + Send + Sync + 'static,
{
    fn snapshot(&self) -> EngineSnapshot {
        self()
    }
}

/// Settings of the engine-side service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReporterConfig {
    /// The engine's own id. When set, subscriptions that register for another id are refused
    /// (FAILED_PRECONDITION) and reports carry this id; when unset, reports carry the id the
    /// router registered with.
    pub engine_id: Option<String>,
    /// Identifies this process in reports; must differ after a restart. Random by default.
    pub instance_id: u64,
    /// Interval used when the router asks for 0.
    pub default_interval: Duration,
    /// Shortest interval granted.
    pub min_interval: Duration,
    /// Longest interval granted.
    pub max_interval: Duration,
    /// Concurrent subscriptions served; more are refused (RESOURCE_EXHAUSTED).
    pub max_subscribers: usize,
    /// Time a new call has to send its `register` (DEADLINE_EXCEEDED after it).
    pub register_timeout: Duration,
}

impl Default for ReporterConfig {
    fn default() -> Self {
        Self {
            engine_id: None,
            instance_id: rand::random(),
            default_interval: Duration::from_millis(500),
            min_interval: Duration::from_millis(20),
            max_interval: Duration::from_secs(60),
            max_subscribers: 64,
            register_timeout: Duration::from_secs(5),
        }
    }
}

/// Why [`serve`] or [`serve_with`] stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The listening address could not be bound.
    #[error("cannot bind load reporter on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("load reporter server failed")]
    Transport(#[source] tonic::transport::Error),
}

struct Shared {
    source: Arc<dyn EngineSnapshotSource>,
    config: ReporterConfig,
    sequence: AtomicU64,
    subscribers: AtomicUsize,
    streams_end: CancellationToken,
}

/// The `LoadReporter` gRPC service. Cheap to clone; clones share sequence numbers, the
/// subscriber count and shutdown.
#[derive(Clone)]
pub struct LoadReporterService {
    shared: Arc<Shared>,
}

impl fmt::Debug for LoadReporterService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadReporterService")
            .field("config", &self.shared.config)
            .field("subscribers", &self.subscribers())
            .finish_non_exhaustive()
    }
}

impl LoadReporterService {
    /// A service reporting what `source` returns.
    pub fn new(source: Arc<dyn EngineSnapshotSource>, config: ReporterConfig) -> Self {
        Self {
            shared: Arc::new(Shared {
                source,
                config,
                sequence: AtomicU64::new(0),
                subscribers: AtomicUsize::new(0),
                streams_end: CancellationToken::new(),
            }),
        }
    }

    /// The instance id stamped on every report.
    pub fn instance_id(&self) -> u64 {
        self.shared.config.instance_id
    }

    /// Subscriptions being served now.
    pub fn subscribers(&self) -> usize {
        self.shared.subscribers.load(Ordering::Acquire)
    }

    /// Ends every subscription (with OK) and refuses new ones (UNAVAILABLE). Call it before a
    /// graceful server shutdown, which otherwise waits for the endless report streams.
    pub fn shutdown(&self) {
        self.shared.streams_end.cancel();
    }

    /// The service wrapped for `tonic::transport::Server::add_service`, with a small request
    /// size limit.
    pub fn into_server(self) -> LoadReporterServer<Self> {
        LoadReporterServer::new(self).max_decoding_message_size(MAX_REQUEST_BYTES)
    }
}

impl Shared {
    fn clamp_interval(&self, interval_ms: u32) -> Duration {
        if interval_ms == 0 {
            return self.config.default_interval;
        }
        Duration::from_millis(u64::from(interval_ms))
            .clamp(self.config.min_interval, self.config.max_interval)
    }

    fn build_report(&self, engine_id: &str, interval: Duration) -> pb::LoadReport {
        let snapshot = self.source.snapshot();
        let sent_at = unix_ms_now();
        let native =
            !snapshot.ranks.is_empty() && snapshot.ranks.iter().all(RankSample::has_native_gauges);
        let kind = if native { pb::ReportKind::Native } else { pb::ReportKind::Basic };
        pb::LoadReport {
            engine_id: engine_id.to_owned(),
            instance_id: self.config.instance_id,
            sequence: self.sequence.fetch_add(1, Ordering::Relaxed) + 1,
            kind: kind as i32,
            status: status_to_wire(snapshot.status) as i32,
            dp_size: snapshot.dp_size,
            ranks: snapshot.ranks.iter().map(|r| r.to_wire(sent_at, native)).collect(),
            sent_at_unix_ms: sent_at,
            interval_ms: u32::try_from(interval.as_millis()).unwrap_or(u32::MAX),
        }
    }
}

fn unix_ms_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Holds one subscriber slot; frees it when the subscription ends.
struct SubscriberSlot(Arc<Shared>);

impl SubscriberSlot {
    fn take(shared: &Arc<Shared>) -> Option<Self> {
        let max = shared.config.max_subscribers;
        shared
            .subscribers
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
            .ok()
            .map(|_| Self(Arc::clone(shared)))
    }
}

impl Drop for SubscriberSlot {
    fn drop(&mut self) {
        self.0.subscribers.fetch_sub(1, Ordering::AcqRel);
    }
}

#[tonic::async_trait]
impl LoadReporter for LoadReporterService {
    type SubscribeStream = ReceiverStream<Result<pb::LoadReport, Status>>;

    async fn subscribe(
        &self,
        request: Request<Streaming<pb::SubscribeRequest>>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let shared = &self.shared;
        if shared.streams_end.is_cancelled() {
            return Err(Status::unavailable("load reporter is shutting down"));
        }
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(shared.config.register_timeout, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no register message in time"))??;
        let Some(pb::SubscribeRequest { command: Some(Command::Register(register)) }) = first
        else {
            return Err(Status::invalid_argument("the first message must be register"));
        };
        let engine_id = match &shared.config.engine_id {
            Some(own) if !register.engine_id.is_empty() && register.engine_id != *own => {
                return Err(Status::failed_precondition(format!(
                    "this reporter is engine {own:?}, not {:?}",
                    register.engine_id
                )));
            }
            Some(own) => own.clone(),
            None => register.engine_id,
        };
        let slot = SubscriberSlot::take(shared)
            .ok_or_else(|| Status::resource_exhausted("too many load report subscribers"))?;
        let interval = shared.clamp_interval(register.interval_ms);
        tracing::debug!(engine = %engine_id, subscriber = %register.subscriber, ?interval, "load report subscription");
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(stream_reports(Arc::clone(shared), inbound, tx, engine_id, interval, slot));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Sends a report now and after every interval until the subscription ends.
async fn stream_reports(
    shared: Arc<Shared>,
    mut inbound: Streaming<pb::SubscribeRequest>,
    tx: mpsc::Sender<Result<pb::LoadReport, Status>>,
    engine_id: String,
    mut interval: Duration,
    _slot: SubscriberSlot,
) {
    loop {
        let report = shared.build_report(&engine_id, interval);
        tokio::select! {
            biased;
            () = shared.streams_end.cancelled() => return,
            sent = tx.send(Ok(report)) => if sent.is_err() { return },
        }
        tokio::select! {
            biased;
            () = shared.streams_end.cancelled() => return,
            () = tx.closed() => return,
            message = inbound.message() => match message {
                Ok(Some(pb::SubscribeRequest { command: Some(Command::SetInterval(set)) })) => {
                    interval = shared.clamp_interval(set.interval_ms);
                }
                Ok(Some(pb::SubscribeRequest { command: Some(Command::Stop(_)) }))
                | Ok(None)
                | Err(_) => return,
                Ok(Some(_)) => {
                    let refusal = Status::invalid_argument("register may only be sent first");
                    let _ = tx.send(Err(refusal)).await;
                    return;
                }
            },
            () = tokio::time::sleep(interval) => {}
        }
    }
}

/// Serves the reporter with default settings on `addr` until `cancel` fires.
pub async fn serve(
    addr: SocketAddr,
    source: Arc<dyn EngineSnapshotSource>,
    cancel: CancellationToken,
) -> Result<(), ServeError> {
    let listener =
        TcpListener::bind(addr).await.map_err(|source| ServeError::Bind { addr, source })?;
    serve_with(listener, LoadReporterService::new(source, ReporterConfig::default()), cancel).await
}

/// Serves `service` on an already bound listener until `cancel` fires; then ends every
/// subscription and shuts the server down gracefully.
pub async fn serve_with(
    listener: TcpListener,
    service: LoadReporterService,
    cancel: CancellationToken,
) -> Result<(), ServeError> {
    let on_shutdown = service.clone();
    tonic::transport::Server::builder()
        .add_service(service.into_server())
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async move {
            cancel.cancelled().await;
            on_shutdown.shutdown();
        })
        .await
        .map_err(ServeError::Transport)
}
