//! Engine load state: reports streamed by engines and router-local accounting.
//!
//! Owns the load-report subscriptions ([`LoadSubscriptions`]: gRPC to each engine's reporter,
//! SGLang `/v1/loads` polling, or polling of vLLM's Prometheus `/metrics`, configured or found
//! by probing), the [`EngineReportedLoadTable`] (freshness, ordering, rank
//! aggregation, basic versus native reports, derived prefill queue time) read through cheap
//! [`LoadSnapshot`]s, router-local in-flight accounting ([`Inflight`], RAII
//! [`InflightGuard`]s and the recent-dispatch ledger), prefill rates learned from observed
//! first tokens ([`PrefillRates`]), and the engine side of the protocol
//! ([`reporter`]) that engines, sidecars and the simulator serve.
//!
//! Rules everyone can rely on: a missing, stale or rank-incomplete report reads as `None`,
//! never as zero; engine clocks are never compared with the router's; bad reports are
//! rejected or clamped, counted, and never corrupt the table; constructors never spawn.
//!
//! Does not own: selection or admission decisions (router-policies), health (router-workers).

#![forbid(unsafe_code)]

mod clock;
mod inflight;
mod load;
mod rates;
mod report;
pub mod reporter;
mod subscribe;
mod table;

pub use clock::{Clock, ManualClock, SystemClock};
pub use inflight::{Inflight, InflightGuard, LEDGER_LEN, PrefillQueue, RankWork};
pub use load::{EngineLoad, NativeLoad, RankLoad};
pub use rates::PrefillRates;
pub use report::{EngineStatus, RankSample, Report, ReportKind};
pub use subscribe::{
    LoadSubscriptions, PrometheusError, ReportIntervalControl, SubscriptionConfig, VllmMetrics,
    VllmMetricsError, parse_v1_loads, parse_vllm_metrics,
};
pub use table::{
    EngineLoadStatus, EngineReportedLoadTable, Freshness, LoadSnapshot, MissingReason,
    RejectReason, RejectionCounts, ReportTotals, TableConfig,
};
