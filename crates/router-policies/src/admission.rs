//! Admission: per-engine caps checked after selection. Observes load, never reserves it.

use std::fmt;
use std::sync::Arc;

use router_state_load::EngineLoad;
use router_workers::{Worker, WorkerId};
use serde::{Deserialize, Serialize};

use crate::{LoadHandles, PickError};

/// Optional per-engine caps. An unset cap is not checked; a set cap admits while the engine's
/// metric is below it. The default admits everything.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionLimits {
    /// Cap on reported running requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_running_requests: Option<u64>,
    /// Cap on reported waiting requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_waiting_requests: Option<u64>,
    /// Cap on reported total KV tokens (in use plus queued).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_kv_tokens: Option<u64>,
    /// Cap on reported waiting uncached prompt tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending_prefill_tokens: Option<u64>,
    /// Cap on router-local in-flight requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_inflight_requests: Option<u64>,
}

/// The name of a cap, as in the configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limit {
    /// `max_running_requests`
    RunningRequests,
    /// `max_waiting_requests`
    WaitingRequests,
    /// `max_kv_tokens`
    KvTokens,
    /// `max_pending_prefill_tokens`
    PendingPrefillTokens,
    /// `max_inflight_requests`
    InflightRequests,
}

impl Limit {
    /// The configuration key of this cap.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::RunningRequests => "max_running_requests",
            Limit::WaitingRequests => "max_waiting_requests",
            Limit::KvTokens => "max_kv_tokens",
            Limit::PendingPrefillTokens => "max_pending_prefill_tokens",
            Limit::InflightRequests => "max_inflight_requests",
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One engine refused by one cap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// The refused engine.
    pub worker: WorkerId,
    /// The cap it reached.
    pub limit: Limit,
    /// The engine's metric.
    pub value: u64,
    /// The configured cap.
    pub cap: u64,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at {} {} (cap {})", self.worker, self.limit, self.value, self.cap)
    }
}

/// What admission knows about one engine at selection time. Reported values are `None`
/// without a fresh, complete report (never zero); the router-local in-flight count is always
/// known.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineObservation {
    /// Reported running requests.
    pub running_requests: Option<u64>,
    /// Reported waiting requests.
    pub waiting_requests: Option<u64>,
    /// Reported total KV tokens.
    pub kv_tokens: Option<u64>,
    /// Reported waiting uncached prompt tokens.
    pub pending_prefill_tokens: Option<u64>,
    /// Router-local in-flight requests.
    pub inflight_requests: u64,
}

impl EngineObservation {
    /// What admission knows about an engine from its snapshot entry and its router-local
    /// in-flight count.
    ///
    /// `load` is `None` for a missing, stale or rank-incomplete report, and then every
    /// reported metric is `None` (never zero). A basic report supplies running and waiting
    /// requests only; total KV tokens and pending prefill tokens come from a native report.
    pub fn observe(load: Option<&EngineLoad>, inflight_requests: u64) -> Self {
        let native = load.and_then(|l| l.native.as_ref());
        Self {
            running_requests: load.map(|l| l.running_requests),
            waiting_requests: load.map(|l| l.waiting_requests),
            kv_tokens: native.map(|n| n.total_kv_tokens),
            pending_prefill_tokens: native.map(|n| n.waiting_uncached_tokens),
            inflight_requests,
        }
    }
}

/// A per-engine acceptance check. Policies hold one as `Arc<dyn EngineAdmission>` and call it
/// where their algorithm says; it does not rank engines, pick replacements or fetch telemetry.
pub trait EngineAdmission: Send + Sync + fmt::Debug {
    /// Checks `engine` against its observed `metrics`: `Err` names the cap it is at.
    fn check(&self, engine: &Worker, metrics: &EngineObservation) -> Result<(), Rejection>;
}

impl EngineAdmission for AdmissionLimits {
    fn check(&self, engine: &Worker, metrics: &EngineObservation) -> Result<(), Rejection> {
        let checks = [
            (Limit::RunningRequests, self.max_running_requests, metrics.running_requests),
            (Limit::WaitingRequests, self.max_waiting_requests, metrics.waiting_requests),
            (Limit::KvTokens, self.max_kv_tokens, metrics.kv_tokens),
            (
                Limit::PendingPrefillTokens,
                self.max_pending_prefill_tokens,
                metrics.pending_prefill_tokens,
            ),
            (Limit::InflightRequests, self.max_inflight_requests, Some(metrics.inflight_requests)),
        ];
        for (limit, cap, value) in checks {
            // An unset cap is not checked; an unknown metric fails open.
            if let (Some(cap), Some(value)) = (cap, value)
                && value >= cap
            {
                return Err(Rejection { worker: engine.id().clone(), limit, value, cap });
            }
        }
        Ok(())
    }
}

impl AdmissionLimits {
    /// Whether no cap is set (admits everything).
    pub fn is_unlimited(&self) -> bool {
        *self == Self::default()
    }
}

/// Checks `engine` with `admission` against one observation; a rejection becomes
/// [`PickError::AdmissionRejected`].
pub(crate) fn admit(
    admission: &dyn EngineAdmission,
    engine: &Worker,
    load: Option<&EngineLoad>,
    inflight: u64,
) -> Result<(), PickError> {
    admission
        .check(engine, &EngineObservation::observe(load, inflight))
        .map_err(PickError::AdmissionRejected)
}

/// `admission` (when set) on one observation of `engine`: the rejection, or `None` when
/// admitted. For policies that try several candidates and keep every rejection.
pub(crate) fn rejection(
    admission: Option<&dyn EngineAdmission>,
    engine: &Worker,
    load: Option<&EngineLoad>,
    inflight: u64,
) -> Option<Rejection> {
    admission?.check(engine, &EngineObservation::observe(load, inflight)).err()
}

/// An admission check together with the load state it observes, for policies that otherwise
/// read no load (round-robin, random) and for policies that check an engine they did not
/// select themselves (a binding, a fallback's choice).
#[derive(Clone, Debug)]
pub struct AdmissionCheck {
    admission: Arc<dyn EngineAdmission>,
    load: LoadHandles,
}

impl AdmissionCheck {
    /// `admission`, observing engines through `load`.
    pub fn new(admission: Arc<dyn EngineAdmission>, load: LoadHandles) -> Self {
        Self { admission, load }
    }

    /// The check itself.
    pub fn admission(&self) -> &Arc<dyn EngineAdmission> {
        &self.admission
    }

    /// Checks `engine` against a fresh observation (one snapshot and its live in-flight count).
    pub fn check(&self, engine: &Worker) -> Result<(), PickError> {
        let snapshot = self.load.table.snapshot();
        admit(
            self.admission.as_ref(),
            engine,
            snapshot.get(engine.id()),
            self.load.inflight.count(engine.id()),
        )
    }
}
