//! One worker's polling of vLLM's Prometheus `GET /metrics`: configured
//! (`load_poll: {format: vllm_metrics}`), or found by probing a worker that has no load source
//! configured.
//!
//! Each scrape becomes a BASIC report (`vllm_metrics`): instance id from
//! `process_start_time_seconds` (0 without it), a sequence that rises by one per scrape for the
//! task's whole life (so it rises within every instance, and a restart is a new instance the
//! table takes as such), the worker's `dp_size`, the poll interval. A scrape that states no
//! usable load is refused with its reason and counted; a poll that gets no answer turns the
//! load missing (`poll_failed`) at once.
//!
//! Detection, for a worker with neither `load_poll` nor `load_reporter`: it stays
//! `not_configured` while probes of `/metrics` (at once, then with jittered backoff from
//! [`SubscriptionConfig::probe_backoff_min`] to [`SubscriptionConfig::probe_backoff_max`])
//! find no vLLM load series, logging nothing. The first probe that finds them is taken as a
//! report, logged once at info, and polling starts at the requested report interval. Polling
//! goes back to probing when the body no longer has vLLM's series (`not_configured` again) or
//! after [`FAILURES_BEFORE_PROBING`] polls in a row failed (the engine is down or restarting:
//! `poll_failed` until a probe finds the series again, or `not_configured` when `/metrics` is
//! answered without them or is a 404).
//!
//! [`SubscriptionConfig::probe_backoff_min`]: crate::SubscriptionConfig::probe_backoff_min
//! [`SubscriptionConfig::probe_backoff_max`]: crate::SubscriptionConfig::probe_backoff_max

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::TaskContext;
use super::backoff::Backoff;
use super::engine_http::{self, Get, HttpClient, PollError};
use super::vllm_metrics::{VllmMetrics, VllmMetricsError, parse_vllm_metrics};
use crate::{EngineStatus, MissingReason, RejectReason, Report, ReportKind};

/// The classic text format (no OpenMetrics), uncompressed.
const ACCEPT: &str = "text/plain; version=0.0.4";

/// Polls in a row without an answer after which a detected engine is probed again.
pub(crate) const FAILURES_BEFORE_PROBING: u32 = 3;

/// Polling of a worker configured with `load_poll: {format: vllm_metrics}`; returns when
/// `cancel` fires.
pub(crate) async fn run_configured(
    ctx: TaskContext,
    interval: Duration,
    cancel: CancellationToken,
) {
    let Some(mut poller) = Poller::new(ctx) else {
        cancel.cancelled().await;
        return;
    };
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let timeout = poller.poll_timeout(interval);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let fetched = tokio::select! {
            () = cancel.cancelled() => return,
            fetched = poller.get(timeout) => fetched,
        };
        match fetched {
            Ok(body) => {
                poller.failing = false;
                poller.deliver(parse_vllm_metrics(&body), interval);
            }
            Err(error) => poller.failed(&error),
        }
    }
}

/// Probing, then polling once found, of a worker with no load source configured; returns when
/// `cancel` fires.
pub(crate) async fn run_detecting(
    ctx: TaskContext,
    interval: watch::Receiver<Duration>,
    cancel: CancellationToken,
) {
    let Some(mut poller) = Poller::new(ctx) else {
        cancel.cancelled().await;
        return;
    };
    let config = &poller.ctx.config;
    let mut backoff = Backoff::new(config.probe_backoff_min, config.probe_backoff_max);
    let probe_timeout = config.poll_timeout.max(Duration::from_millis(1));
    let mut found = false;
    // What this task last marked; the subscriptions marked `not_configured` before it started.
    let mut marked = Some(MissingReason::NotConfigured);
    loop {
        let metrics = loop {
            let probed = tokio::select! {
                () = cancel.cancelled() => return,
                probed = poller.get(probe_timeout) => probed,
            };
            let reason = match probed {
                Ok(body) => match parse_vllm_metrics(&body) {
                    Err(VllmMetricsError::NotVllm | VllmMetricsError::Syntax(_)) => {
                        MissingReason::NotConfigured
                    }
                    metrics => break metrics,
                },
                Err(PollError::Status(http::StatusCode::NOT_FOUND)) => MissingReason::NotConfigured,
                Err(_) if found => MissingReason::PollFailed,
                Err(_) => MissingReason::NotConfigured,
            };
            if marked.replace(reason) != Some(reason) {
                poller.ctx.mark_missing(reason);
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(backoff.next_delay()) => {}
            }
        };
        backoff.reset();
        poller.failing = false;
        let (worker, url) = (poller.ctx.worker.id(), poller.ctx.worker.url());
        if found {
            tracing::debug!(worker = %worker, url, "engine serves vLLM metrics again");
        } else {
            found = true;
            tracing::info!(worker = %worker, url, "engine serves vLLM metrics; polling them for load");
        }
        let every = (*interval.borrow()).max(Duration::from_millis(1));
        poller.deliver(metrics, every);
        let timeout = poller.poll_timeout(every);
        let mut ticker = tokio::time::interval_at(Instant::now() + every, every);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut failures = 0u32;
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = ticker.tick() => {}
            }
            let fetched = tokio::select! {
                () = cancel.cancelled() => return,
                fetched = poller.get(timeout) => fetched,
            };
            match fetched {
                Ok(body) => {
                    failures = 0;
                    poller.failing = false;
                    match parse_vllm_metrics(&body) {
                        Err(VllmMetricsError::NotVllm) => {
                            let worker = poller.ctx.worker.id();
                            tracing::info!(worker = %worker, "engine no longer serves vLLM metrics; probing it again");
                            poller.ctx.mark_missing(MissingReason::NotConfigured);
                            marked = Some(MissingReason::NotConfigured);
                            break;
                        }
                        parsed => poller.deliver(parsed, every),
                    }
                }
                Err(error @ PollError::TooLarge(_)) => {
                    failures = 0;
                    poller.failed(&error);
                }
                Err(error) => {
                    poller.failed(&error);
                    failures += 1;
                    if failures >= FAILURES_BEFORE_PROBING {
                        marked = Some(MissingReason::PollFailed);
                        break;
                    }
                }
            }
        }
    }
}

/// The state of one worker's `/metrics` polling.
struct Poller {
    ctx: TaskContext,
    client: HttpClient,
    uri: http::Uri,
    authorization: Option<http::HeaderValue>,
    /// The sequence of the last report; never goes back.
    sequence: u64,
    /// The instance of the last scrape that stated one.
    instance: Option<u64>,
    /// A refusal was logged since the last accepted report.
    refusing: bool,
    /// A failed poll was logged since the last answer.
    failing: bool,
}

impl Poller {
    /// The poller of the task's worker; `None` (logged) when its URL is unusable.
    fn new(ctx: TaskContext) -> Option<Self> {
        let uri = match engine_http::uri(ctx.worker.url(), "/metrics") {
            Ok(uri) => uri,
            Err(error) => {
                tracing::error!(worker = %ctx.worker.id(), error = &error as &dyn std::error::Error, "vLLM metrics polling disabled");
                return None;
            }
        };
        let client = engine_http::http_client(ctx.config.tls.as_deref());
        let authorization = ctx.worker.api_key().map(|key| key.authorization().clone());
        Some(Self {
            ctx,
            client,
            uri,
            authorization,
            sequence: 0,
            instance: None,
            refusing: false,
            failing: false,
        })
    }

    /// The deadline of one poll every `interval`.
    fn poll_timeout(&self, interval: Duration) -> Duration {
        self.ctx.config.poll_timeout.min(interval).max(Duration::from_millis(1))
    }

    async fn get(&self, timeout: Duration) -> Result<bytes::Bytes, PollError> {
        let get = Get {
            accept: ACCEPT,
            authorization: self.authorization.as_ref(),
            max_bytes: self.ctx.config.max_metrics_bytes,
            timeout,
        };
        engine_http::fetch(&self.client, self.uri.clone(), get).await
    }

    /// Takes one scrape's reading into the table, or counts its refusal.
    fn deliver(&mut self, parsed: Result<VllmMetrics, VllmMetricsError>, interval: Duration) {
        let metrics = match parsed {
            Ok(metrics) => metrics,
            Err(error) => {
                let (worker, incarnation) = (self.ctx.worker.id(), self.ctx.worker.incarnation());
                self.ctx.table.reject(worker, incarnation, error.reject_reason());
                self.refused(&Chain(&error));
                return;
            }
        };
        let worker = self.ctx.worker.id();
        if let (Some(old), Some(new)) = (self.instance, metrics.instance_id)
            && old != new
        {
            tracing::info!(worker = %worker, instance = new, "vLLM engine restarted");
        }
        self.instance = metrics.instance_id.or(self.instance);
        self.sequence += 1;
        let engines = metrics.engines.len();
        let report = Report {
            engine_id: worker.to_string(),
            instance_id: metrics.instance_id.unwrap_or(0),
            sequence: self.sequence,
            kind: ReportKind::Basic,
            status: EngineStatus::Unknown,
            dp_size: self.ctx.worker.dp_size(),
            interval: Some(interval),
            ranks: metrics.ranks,
        };
        match self.ctx.apply(report) {
            Ok(_) => self.refusing = false,
            Err(RejectReason::RankIncomplete) => {
                let dp_size = self.ctx.worker.dp_size();
                self.refused(&format_args!(
                    "/metrics lists {engines} vLLM engines, the worker has dp_size {dp_size}"
                ));
            }
            Err(reason) => self.refused(&reason),
        }
    }

    /// A poll that got no (usable) answer.
    fn failed(&mut self, error: &PollError) {
        let worker = self.ctx.worker.id();
        if let PollError::TooLarge(_) = error {
            self.ctx.table.reject(worker, self.ctx.worker.incarnation(), RejectReason::TooLarge);
            self.refused(&Chain(error));
            return;
        }
        self.ctx.mark_missing(MissingReason::PollFailed);
        if !self.failing {
            self.failing = true;
            let uri = &self.uri;
            tracing::warn!(worker = %worker, %uri, error = error as &dyn std::error::Error, "vLLM metrics poll failed");
        }
    }

    /// Logs a refused scrape: the first since the last accepted one at warn, the others at
    /// debug.
    fn refused(&mut self, reason: &dyn std::fmt::Display) {
        let worker = self.ctx.worker.id();
        if self.refusing {
            tracing::debug!(worker = %worker, %reason, "vLLM metrics refused");
        } else {
            self.refusing = true;
            tracing::warn!(worker = %worker, %reason, "vLLM metrics refused; the engine's load reads as missing or stale");
        }
    }
}

/// An error and its sources, `: `-separated, for a log line.
struct Chain<'a>(&'a dyn std::error::Error);

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(error) = source {
            write!(f, ": {error}")?;
            source = error.source();
        }
        Ok(())
    }
}
