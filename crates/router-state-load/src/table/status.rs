//! Counters and per-engine status of the load table, for `/metrics` and `/admin/state`.

use std::fmt;
use std::time::Duration;

use router_workers::WorkerId;
use serde::Serialize;
use serde::ser::SerializeMap;

use crate::ReportKind;

/// Whether an engine's reported load can be used right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Freshness {
    /// A usable report arrived within the freshness window.
    Fresh,
    /// The last usable report is older than the freshness window (or was already too old when
    /// it arrived).
    Stale,
    /// No usable report: none yet, the stream broke, the poll failed, or the newest report was
    /// rank-incomplete.
    Missing,
}

impl Freshness {
    /// `fresh`, `stale` or `missing`.
    pub fn as_str(self) -> &'static str {
        match self {
            Freshness::Fresh => "fresh",
            Freshness::Stale => "stale",
            Freshness::Missing => "missing",
        }
    }
}

/// Why an engine has no usable report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MissingReason {
    /// Registered, nothing usable received yet.
    NoReport,
    /// The worker has neither a load reporter nor `/v1/loads` polling configured.
    NotConfigured,
    /// The report stream broke, ended or stalled, or could not be opened.
    Disconnected,
    /// The last `/v1/loads` poll failed (connection, HTTP status or timeout).
    PollFailed,
    /// The newest report did not cover exactly ranks `0..dp_size`.
    RankIncomplete,
}

impl MissingReason {
    /// The snake-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            MissingReason::NoReport => "no_report",
            MissingReason::NotConfigured => "not_configured",
            MissingReason::Disconnected => "disconnected",
            MissingReason::PollFailed => "poll_failed",
            MissingReason::RankIncomplete => "rank_incomplete",
        }
    }
}

/// Why a report was not taken into the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RejectReason {
    /// The report is for a worker the table does not know (never creates one).
    UnknownEngine,
    /// The report names another engine than the one whose stream or poll it came from.
    EngineMismatch,
    /// The report came from a subscription of a replaced worker (older incarnation).
    StaleIncarnation,
    /// The report's `dp_size` differs from the worker's configured one.
    DpSizeMismatch,
    /// The sequence did not increase within the same engine instance (duplicate or going back).
    SequenceWentBack,
    /// The report came from an engine instance that has already been superseded.
    StaleInstance,
    /// The ranks did not cover exactly `0..dp_size` (missing, duplicated or out-of-range ranks).
    RankIncomplete,
    /// A count or token value beyond any real engine, or negative.
    AbsurdValue,
    /// Undecodable: bad JSON, missing required fields, unset kind.
    Malformed,
    /// More reports than the per-engine rate limit allows.
    RateLimited,
    /// The message or response body exceeded the size limit.
    TooLarge,
}

impl RejectReason {
    /// Every reason, in a fixed order.
    pub const ALL: [RejectReason; 11] = [
        RejectReason::UnknownEngine,
        RejectReason::EngineMismatch,
        RejectReason::StaleIncarnation,
        RejectReason::DpSizeMismatch,
        RejectReason::SequenceWentBack,
        RejectReason::StaleInstance,
        RejectReason::RankIncomplete,
        RejectReason::AbsurdValue,
        RejectReason::Malformed,
        RejectReason::RateLimited,
        RejectReason::TooLarge,
    ];

    /// The snake-case name, used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::UnknownEngine => "unknown_engine",
            RejectReason::EngineMismatch => "engine_mismatch",
            RejectReason::StaleIncarnation => "stale_incarnation",
            RejectReason::DpSizeMismatch => "dp_size_mismatch",
            RejectReason::SequenceWentBack => "sequence_went_back",
            RejectReason::StaleInstance => "stale_instance",
            RejectReason::RankIncomplete => "rank_incomplete",
            RejectReason::AbsurdValue => "absurd_value",
            RejectReason::Malformed => "malformed",
            RejectReason::RateLimited => "rate_limited",
            RejectReason::TooLarge => "too_large",
        }
    }

    fn index(self) -> usize {
        Self::ALL.iter().position(|r| *r == self).unwrap_or(0)
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A count per [`RejectReason`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RejectionCounts([u64; RejectReason::ALL.len()]);

impl RejectionCounts {
    /// Rejections for `reason`.
    pub fn get(&self, reason: RejectReason) -> u64 {
        self.0[reason.index()]
    }

    /// All rejections.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Every reason with its count, zeros included.
    pub fn iter(&self) -> impl Iterator<Item = (RejectReason, u64)> + '_ {
        RejectReason::ALL.iter().map(|r| (*r, self.get(*r)))
    }

    pub(crate) fn add(&mut self, reason: RejectReason) {
        let slot = &mut self.0[reason.index()];
        *slot = slot.saturating_add(1);
    }
}

impl Serialize for RejectionCounts {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (reason, count) in self.iter() {
            map.serialize_entry(reason.as_str(), &count)?;
        }
        map.end()
    }
}

/// One engine's load-report state, for `/admin/state` and `/metrics`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EngineLoadStatus {
    /// The worker.
    pub worker: WorkerId,
    /// Fresh, stale or missing.
    pub freshness: Freshness,
    /// Milliseconds since the usable report was received; `None` when missing.
    pub age_ms: Option<u64>,
    /// Kind of the usable report; `None` when missing.
    pub kind: Option<ReportKind>,
    /// Why there is no usable report, when missing.
    pub missing_reason: Option<MissingReason>,
    /// The window after which a report turns stale for this engine.
    #[serde(serialize_with = "millis")]
    pub stale_after: Duration,
    /// The report interval the engine last stated (or the poll interval).
    #[serde(serialize_with = "opt_millis")]
    pub report_interval: Option<Duration>,
    /// Reports accepted.
    pub accepted: u64,
    /// Accepted reports in which a value had to be clamped or an invalid estimate dropped.
    pub clamped: u64,
    /// Reports rejected, by reason.
    pub rejected: RejectionCounts,
}

/// Counts over every engine, including reports for engines the table does not know.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReportTotals {
    /// Reports accepted.
    pub accepted: u64,
    /// Accepted reports with a clamped value.
    pub clamped: u64,
    /// Reports rejected, by reason.
    pub rejected: RejectionCounts,
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn opt_millis<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => millis(d, s),
        None => s.serialize_none(),
    }
}
