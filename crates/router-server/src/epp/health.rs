//! The picker's gRPC health (`grpc.health.v1`), for Envoy's health check of the picker cluster
//! and for Kubernetes probes:
//!
//! - `liveness` (and the empty service name): SERVING while the process runs;
//! - `readiness` and `envoy.service.ext_proc.v3.ExternalProcessor`: SERVING once the picker can
//!   route as the configuration intends, that is every model has a complete selection
//!   possible, and every healthy engine with a load reporter or a polled load endpoint has been
//!   heard from at least once (the first worker list and load reports are in). An engine that
//!   goes quiet later leaves readiness alone: the policies already read its load as missing,
//!   and one engine's outage must not take every picker replica out of Envoy's rotation.
//!   NOT_SERVING from the start of a stop.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use router_state_load::Freshness;
use router_workers::WorkerId;
use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::server::HealthReporter;

use crate::app::AppContext;

/// The service names whose status is readiness.
pub(crate) const READY_SERVICES: [&str; 2] =
    ["readiness", "envoy.service.ext_proc.v3.ExternalProcessor"];

/// How often readiness is re-evaluated.
const CHECK_EVERY: Duration = Duration::from_millis(200);

/// The health reporter and the task that keeps readiness current.
pub(crate) struct EppHealth {
    reporter: HealthReporter,
    cancel: CancellationToken,
}

impl EppHealth {
    /// Starts reporting; the returned service is added to the gRPC server.
    pub(crate) fn start(ctx: Arc<AppContext>) -> (Self, HealthServer<impl Health>) {
        let (reporter, service) = tonic_health::server::health_reporter();
        let cancel = CancellationToken::new();
        tokio::spawn(keep_current(ctx, reporter.clone(), cancel.clone()));
        (Self { reporter, cancel }, service)
    }

    /// Readiness off for good (a stop has begun).
    pub(crate) async fn not_serving(&self) {
        self.cancel.cancel();
        for service in READY_SERVICES {
            self.reporter.set_service_status(service, ServingStatus::NotServing).await;
        }
    }

    /// Stops the readiness task.
    pub(crate) fn stop(&self) {
        self.cancel.cancel();
    }
}

async fn keep_current(ctx: Arc<AppContext>, reporter: HealthReporter, cancel: CancellationToken) {
    reporter.set_service_status("liveness", ServingStatus::Serving).await;
    for service in READY_SERVICES {
        reporter.set_service_status(service, ServingStatus::NotServing).await;
    }
    let mut heard: HashSet<WorkerId> = HashSet::new();
    let mut ready = false;
    loop {
        let now_ready = is_ready(&ctx, &mut heard);
        if now_ready != ready {
            ready = now_ready;
            let status = if ready { ServingStatus::Serving } else { ServingStatus::NotServing };
            tracing::info!(ready, "endpoint picker readiness changed");
            for service in READY_SERVICES {
                reporter.set_service_status(service, status).await;
            }
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(CHECK_EVERY) => {}
        }
    }
}

/// Whether the picker can route as configured; `heard` remembers the engines that reported.
pub(super) fn is_ready(ctx: &AppContext, heard: &mut HashSet<WorkerId>) -> bool {
    if ctx.is_draining() {
        return false;
    }
    if !ctx.models().all(|model| model.resolver.has_candidates(ctx.registry())) {
        return false;
    }
    let mut all_heard = true;
    for worker in ctx.registry().workers() {
        if worker.load_reporter().is_none() && worker.load_poll().is_none() {
            continue;
        }
        if heard.contains(worker.id()) {
            continue;
        }
        let reported = ctx
            .load_table()
            .status_of(worker.id())
            .is_some_and(|status| status.freshness != Freshness::Missing);
        if reported {
            heard.insert(worker.id().clone());
        } else if worker.is_healthy() {
            all_heard = false;
        }
    }
    all_heard
}
