//! Subscriptions that follow the worker registry and feed the load table.
//!
//! For every worker, one source: a gRPC subscription to its `load_reporter` endpoint; or
//! polling when `load_poll` is configured (polling wins when both are set, as the
//! configuration reads "poll instead of a reporter"), of SGLang's `GET {url}/v1/loads`
//! (`format: sglang`, the default) or of vLLM's Prometheus `GET {url}/metrics`
//! (`format: vllm_metrics`); or, with neither, probing of `GET {url}/metrics` that starts
//! polling it once it serves vLLM's load series (the worker reads as missing,
//! `not_configured`, until then). One task per worker, so there is never more than one
//! stream per engine and a dead engine never delays the others. Removed workers are dropped
//! from the table and their task stopped; a replaced worker starts over with its new
//! incarnation, and whatever the old task still delivers is ignored by the table.
//!
//! The status an accepted report states is recorded on the worker in the registry
//! ([`WorkerRegistry::set_reported_status`]), where engine groups read it: a report the table
//! refuses (out of order, another engine's, rate-limited, rank-incomplete) changes no status.

mod backoff;
mod engine_http;
mod grpc;
mod poll;
mod prometheus;
mod vllm_metrics;
mod vllm_poll;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use router_workers::{LoadPollFormat, RegistryEvent, Worker, WorkerId, WorkerRegistry};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::{EngineReportedLoadTable, MissingReason, RejectReason, Report, ReportKind};

pub use poll::parse_v1_loads;
pub use prometheus::PrometheusError;
pub use vllm_metrics::{VllmMetrics, VllmMetricsError, parse_vllm_metrics};

/// Settings of the subscriptions.
#[derive(Clone, Debug)]
pub struct SubscriptionConfig {
    /// Interval requested from gRPC reporters; changeable at run time through
    /// [`ReportIntervalControl`].
    pub report_interval: Duration,
    /// Timeout of connecting and of opening the report stream.
    pub connect_timeout: Duration,
    /// A stream silent for `max(stall_timeout, 4 x report_interval)` is dropped and reopened.
    pub stall_timeout: Duration,
    /// First reconnection delay (jittered), doubling up to `backoff_max`.
    pub backoff_min: Duration,
    /// Longest reconnection delay.
    pub backoff_max: Duration,
    /// Largest report message or `/v1/loads` body accepted, in bytes.
    pub max_report_bytes: usize,
    /// Largest `/metrics` body accepted, in bytes: vLLM's is 50-150 KB, mostly histograms.
    pub max_metrics_bytes: usize,
    /// Timeout of one polling request (never longer than the poll interval), and of one
    /// probe of `/metrics`.
    pub poll_timeout: Duration,
    /// First wait (jittered) between probes of `/metrics` on a worker with no load source
    /// configured, doubling up to `probe_backoff_max`.
    pub probe_backoff_min: Duration,
    /// Longest wait between such probes.
    pub probe_backoff_max: Duration,
    /// Name sent to engines in `Register.subscriber`, for their logs.
    pub subscriber_name: String,
    /// TLS for polling `https://` engines; `None` = such polls fail (reported as missing).
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl Default for SubscriptionConfig {
    fn default() -> Self {
        Self {
            report_interval: Duration::from_millis(500),
            connect_timeout: Duration::from_secs(2),
            stall_timeout: Duration::from_secs(10),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            max_report_bytes: 256 * 1024,
            max_metrics_bytes: 4 * 1024 * 1024,
            poll_timeout: Duration::from_secs(2),
            probe_backoff_min: Duration::from_secs(5),
            probe_backoff_max: Duration::from_secs(30),
            subscriber_name: "router".to_owned(),
            tls: None,
        }
    }
}

/// Changes the interval requested from every gRPC reporter, live: each open subscription sends
/// `SetInterval`, and new ones register with the new value. vLLM engines found by probing are
/// polled at the interval requested when they are found.
#[derive(Clone, Debug)]
pub struct ReportIntervalControl(watch::Sender<Duration>);

impl ReportIntervalControl {
    /// Requests `interval` from now on.
    pub fn set(&self, interval: Duration) {
        self.0.send_replace(interval);
    }

    /// The interval currently requested.
    pub fn get(&self) -> Duration {
        *self.0.borrow()
    }
}

/// What one subscription task needs.
#[derive(Clone, Debug)]
pub(crate) struct TaskContext {
    pub(crate) table: Arc<EngineReportedLoadTable>,
    pub(crate) registry: Arc<WorkerRegistry>,
    pub(crate) worker: Arc<Worker>,
    pub(crate) config: Arc<SubscriptionConfig>,
}

impl TaskContext {
    fn mark_missing(&self, reason: MissingReason) {
        self.table.mark_missing(self.worker.id(), self.worker.incarnation(), reason);
    }

    /// Takes a received report into the table and, when the table accepts it, records the
    /// status it states on the worker.
    fn apply(&self, report: Report) -> Result<ReportKind, RejectReason> {
        let status = report.status;
        let applied = self.table.apply(self.worker.id(), self.worker.incarnation(), report);
        if applied.is_ok() {
            self.registry.set_reported_status(&self.worker, status);
        }
        applied
    }
}

/// Follows the registry and keeps one load subscription per worker. Built by the server and
/// driven by [`LoadSubscriptions::run`]; constructing it starts nothing.
#[derive(Debug)]
pub struct LoadSubscriptions {
    table: Arc<EngineReportedLoadTable>,
    registry: Arc<WorkerRegistry>,
    config: Arc<SubscriptionConfig>,
    interval: watch::Sender<Duration>,
}

/// A worker being followed: its incarnation and the token stopping its task.
struct Followed {
    incarnation: u64,
    stop: CancellationToken,
}

impl LoadSubscriptions {
    /// Subscriptions for the workers of `registry`, feeding `table`.
    pub fn new(
        table: Arc<EngineReportedLoadTable>,
        registry: Arc<WorkerRegistry>,
        config: SubscriptionConfig,
    ) -> Self {
        let interval = watch::channel(config.report_interval).0;
        Self { table, registry, config: Arc::new(config), interval }
    }

    /// A handle to change the requested report interval while running.
    pub fn interval_control(&self) -> ReportIntervalControl {
        ReportIntervalControl(self.interval.clone())
    }

    /// Runs until `cancel` fires, then stops every subscription and returns once all have
    /// ended.
    pub async fn run(self, cancel: CancellationToken) {
        let (workers, mut feed) = self.registry.follow();
        let mut followed: HashMap<WorkerId, Followed> = HashMap::new();
        let mut tasks = JoinSet::new();
        for worker in workers {
            self.start(&mut followed, &mut tasks, worker, &cancel);
        }
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                Some(ended) = tasks.join_next(), if !tasks.is_empty() => {
                    if let Err(error) = ended {
                        tracing::error!(%error, "a load subscription task failed");
                    }
                }
                event = feed.recv() => match event {
                    Ok(RegistryEvent::Added(worker)) => {
                        self.start(&mut followed, &mut tasks, worker, &cancel);
                    }
                    Ok(RegistryEvent::Removed(worker)) => {
                        self.stop(&mut followed, worker.id(), worker.incarnation());
                    }
                    Ok(
                        RegistryEvent::HealthChanged { .. }
                        | RegistryEvent::DrainChanged { .. }
                        | RegistryEvent::StatusReported { .. },
                    ) => {}
                    Err(RecvError::Lagged(missed)) => {
                        tracing::warn!(missed, "load subscriptions lagged behind the registry; resynchronising");
                        self.resync(&mut followed, &mut tasks, &cancel);
                    }
                    Err(RecvError::Closed) => {
                        cancel.cancelled().await;
                        break;
                    }
                },
            }
        }
        for followed in followed.values() {
            followed.stop.cancel();
        }
        while tasks.join_next().await.is_some() {}
    }

    fn start(
        &self,
        followed: &mut HashMap<WorkerId, Followed>,
        tasks: &mut JoinSet<()>,
        worker: Arc<Worker>,
        cancel: &CancellationToken,
    ) {
        if let Some(old) = followed.get(worker.id()) {
            if old.incarnation == worker.incarnation() {
                return;
            }
            let old = old.incarnation;
            self.stop(followed, worker.id(), old);
        }
        self.table.register(&worker);
        let ctx = TaskContext {
            table: Arc::clone(&self.table),
            registry: Arc::clone(&self.registry),
            worker: Arc::clone(&worker),
            config: Arc::clone(&self.config),
        };
        let stop = cancel.child_token();
        if let Some(spec) = worker.load_poll() {
            let interval = Duration::from_millis(spec.interval_ms.max(1));
            match spec.format {
                LoadPollFormat::Sglang => tasks.spawn(poll::run(ctx, interval, stop.clone())),
                LoadPollFormat::VllmMetrics => {
                    tasks.spawn(vllm_poll::run_configured(ctx, interval, stop.clone()))
                }
            };
        } else if let Some(endpoint) = worker.load_reporter() {
            let endpoint = endpoint.to_owned();
            tasks.spawn(grpc::run(ctx, endpoint, self.interval.subscribe(), stop.clone()));
        } else {
            ctx.mark_missing(MissingReason::NotConfigured);
            tasks.spawn(vllm_poll::run_detecting(ctx, self.interval.subscribe(), stop.clone()));
        }
        followed.insert(worker.id().clone(), Followed { incarnation: worker.incarnation(), stop });
    }

    fn stop(&self, followed: &mut HashMap<WorkerId, Followed>, id: &WorkerId, incarnation: u64) {
        if followed.get(id).is_none_or(|f| f.incarnation != incarnation) {
            return;
        }
        if let Some(followed) = followed.remove(id) {
            followed.stop.cancel();
        }
        self.table.unregister(id, incarnation);
    }

    /// After missing registry events: stop what is gone or replaced, start what is new.
    fn resync(
        &self,
        followed: &mut HashMap<WorkerId, Followed>,
        tasks: &mut JoinSet<()>,
        cancel: &CancellationToken,
    ) {
        let current: HashMap<WorkerId, Arc<Worker>> =
            self.registry.workers().into_iter().map(|w| (w.id().clone(), w)).collect();
        let gone: Vec<(WorkerId, u64)> = followed
            .iter()
            .filter(|(id, f)| current.get(*id).is_none_or(|w| w.incarnation() != f.incarnation))
            .map(|(id, f)| (id.clone(), f.incarnation))
            .collect();
        for (id, incarnation) in gone {
            self.stop(followed, &id, incarnation);
        }
        for worker in current.into_values() {
            self.start(followed, tasks, worker, cancel);
        }
    }
}
