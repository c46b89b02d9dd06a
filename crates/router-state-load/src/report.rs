//! A load report as the table ingests it, whichever source it came from (the gRPC reporter or
//! SGLang's `/v1/loads`), and its conversion from the wire.
//!
//! The numbers are what the engine said, unchecked: [`crate::EngineReportedLoadTable::apply`]
//! validates, orders and aggregates them.

use std::fmt;
use std::time::Duration;

use router_proto::router::load::v1 as pb;
pub use router_workers::EngineStatus;
use serde::Serialize;

use crate::RejectReason;

/// Which fields a report carries, and so which an [`crate::EngineLoad`] has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReportKind {
    /// Running and waiting requests, KV used and capacity.
    Basic,
    /// Basic plus waiting uncached tokens, total KV tokens, max running requests and prefill
    /// queue information.
    Native,
}

impl ReportKind {
    /// `basic` or `native`, as shown in `/admin/state` and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ReportKind::Basic => "basic",
            ReportKind::Native => "native",
        }
    }
}

impl fmt::Display for ReportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The wire status of a report; an unset or unknown value is [`EngineStatus::Unknown`].
fn status_from_wire(value: i32) -> EngineStatus {
    match pb::EngineStatus::try_from(value) {
        Ok(pb::EngineStatus::Starting) => EngineStatus::Starting,
        Ok(pb::EngineStatus::Serving) => EngineStatus::Serving,
        Ok(pb::EngineStatus::Draining) => EngineStatus::Draining,
        Ok(pb::EngineStatus::Unspecified) | Err(_) => EngineStatus::Unknown,
    }
}

/// The wire value of a status.
pub(crate) fn status_to_wire(status: EngineStatus) -> pb::EngineStatus {
    match status {
        EngineStatus::Unknown => pb::EngineStatus::Unspecified,
        EngineStatus::Starting => pb::EngineStatus::Starting,
        EngineStatus::Serving => pb::EngineStatus::Serving,
        EngineStatus::Draining => pb::EngineStatus::Draining,
    }
}

/// The numbers of one data-parallel rank at one moment, as an engine states them.
///
/// Used both by engines (what a [`crate::reporter::EngineSnapshotSource`] returns) and by the
/// router (what a received [`Report`] carries). `None` means the engine did not say, never zero.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RankSample {
    /// Data-parallel rank, `0..dp_size`.
    pub dp_rank: u32,
    /// How old these numbers were when the report was sent (engine clock differences only).
    pub age: Duration,
    /// Requests running.
    pub running_requests: u64,
    /// Requests queued, not yet running.
    pub waiting_requests: u64,
    /// KV-cache tokens in use.
    pub kv_used_tokens: u64,
    /// KV-cache capacity in tokens; 0 when unknown.
    pub kv_capacity_tokens: u64,
    /// Native: waiting prompt tokens not covered by the prefix cache.
    pub waiting_uncached_tokens: Option<u64>,
    /// Native: KV tokens in use plus the full length of queued requests.
    pub total_kv_tokens: Option<u64>,
    /// Native: the engine's cap on running requests.
    pub max_running_requests: Option<u64>,
    /// Cumulative uncached prompt tokens prefilled since the engine process started.
    pub total_prefill_uncached_tokens: Option<u64>,
    /// Cumulative microseconds spent prefilling since the engine process started.
    pub total_prefill_busy_us: Option<u64>,
    /// The engine's own estimate of the prefill queue time, in milliseconds.
    pub estimated_prefill_queue_ms: Option<f64>,
    /// Output tokens generated per second over the engine's recent window, summed over the
    /// rank's requests (SGLang's `gen_throughput`).
    pub decode_tokens_per_sec: Option<f64>,
}

impl RankSample {
    /// A rank with only the basic fields.
    pub fn basic(
        dp_rank: u32,
        running_requests: u64,
        waiting_requests: u64,
        kv_used_tokens: u64,
        kv_capacity_tokens: u64,
    ) -> Self {
        Self {
            dp_rank,
            running_requests,
            waiting_requests,
            kv_used_tokens,
            kv_capacity_tokens,
            ..Self::default()
        }
    }

    /// Adds the three native gauges.
    pub fn with_native(
        mut self,
        waiting_uncached_tokens: u64,
        total_kv_tokens: u64,
        max_running_requests: u64,
    ) -> Self {
        self.waiting_uncached_tokens = Some(waiting_uncached_tokens);
        self.total_kv_tokens = Some(total_kv_tokens);
        self.max_running_requests = Some(max_running_requests);
        self
    }

    /// Adds the two cumulative prefill counters.
    pub fn with_prefill_counters(mut self, uncached_tokens: u64, busy_us: u64) -> Self {
        self.total_prefill_uncached_tokens = Some(uncached_tokens);
        self.total_prefill_busy_us = Some(busy_us);
        self
    }

    /// Adds the generation throughput (output tokens per second over the rank's requests).
    pub fn with_decode_rate(mut self, tokens_per_sec: f64) -> Self {
        self.decode_tokens_per_sec = Some(tokens_per_sec);
        self
    }

    /// Whether the rank carries every native gauge a NATIVE report needs.
    pub fn has_native_gauges(&self) -> bool {
        self.waiting_uncached_tokens.is_some()
            && self.total_kv_tokens.is_some()
            && self.max_running_requests.is_some()
    }

    fn from_wire(rank: &pb::RankLoad, sent_at_unix_ms: i64, kind: ReportKind) -> Self {
        // Both timestamps come from the engine's clock; only their difference is used.
        let age = if sent_at_unix_ms > 0 && rank.snapshot_time_unix_ms > 0 {
            let ms = sent_at_unix_ms.saturating_sub(rank.snapshot_time_unix_ms);
            Duration::from_millis(u64::try_from(ms).unwrap_or(0))
        } else {
            Duration::ZERO
        };
        let native = kind == ReportKind::Native;
        let pick = |v: Option<u64>| if native { v } else { None };
        Self {
            dp_rank: rank.dp_rank,
            age,
            running_requests: rank.running_requests,
            waiting_requests: rank.waiting_requests,
            kv_used_tokens: rank.kv_used_tokens,
            kv_capacity_tokens: rank.kv_capacity_tokens,
            waiting_uncached_tokens: pick(rank.waiting_uncached_tokens),
            total_kv_tokens: pick(rank.total_kv_tokens),
            max_running_requests: pick(rank.max_running_requests),
            total_prefill_uncached_tokens: pick(rank.total_prefill_uncached_tokens),
            total_prefill_busy_us: pick(rank.total_prefill_busy_us),
            estimated_prefill_queue_ms: if native { rank.estimated_prefill_queue_ms } else { None },
            decode_tokens_per_sec: if native { rank.decode_tokens_per_sec } else { None },
        }
    }

    pub(crate) fn to_wire(self, sent_at_unix_ms: i64, native: bool) -> pb::RankLoad {
        let age_ms = i64::try_from(self.age.as_millis()).unwrap_or(i64::MAX);
        let keep = |v: Option<u64>| if native { v } else { None };
        pb::RankLoad {
            dp_rank: self.dp_rank,
            snapshot_time_unix_ms: sent_at_unix_ms.saturating_sub(age_ms),
            running_requests: self.running_requests,
            waiting_requests: self.waiting_requests,
            kv_used_tokens: self.kv_used_tokens,
            kv_capacity_tokens: self.kv_capacity_tokens,
            waiting_uncached_tokens: keep(self.waiting_uncached_tokens),
            total_kv_tokens: keep(self.total_kv_tokens),
            max_running_requests: keep(self.max_running_requests),
            total_prefill_uncached_tokens: keep(self.total_prefill_uncached_tokens),
            total_prefill_busy_us: keep(self.total_prefill_busy_us),
            estimated_prefill_queue_ms: if native { self.estimated_prefill_queue_ms } else { None },
            decode_tokens_per_sec: if native { self.decode_tokens_per_sec } else { None },
        }
    }
}

/// One report of one engine: every rank, with the ordering information the table checks.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The engine the report says it is about.
    pub engine_id: String,
    /// The engine process; a different value means a restart.
    pub instance_id: u64,
    /// Strictly increasing within one instance.
    pub sequence: u64,
    /// The kind the engine claims; the table downgrades NATIVE to BASIC when a rank lacks a
    /// native gauge.
    pub kind: ReportKind,
    /// The engine's serving state.
    pub status: EngineStatus,
    /// Data-parallel ranks the engine says it has.
    pub dp_size: u32,
    /// The interval the engine reports at, when known; widens the freshness window.
    pub interval: Option<Duration>,
    /// One entry per rank.
    pub ranks: Vec<RankSample>,
}

impl Report {
    /// A report of `kind` whose `dp_size` is the number of ranks given, with unknown status and
    /// interval. Convenient for tests and fixtures.
    pub fn new(
        engine_id: impl Into<String>,
        instance_id: u64,
        sequence: u64,
        kind: ReportKind,
        ranks: Vec<RankSample>,
    ) -> Self {
        Self {
            engine_id: engine_id.into(),
            instance_id,
            sequence,
            kind,
            status: EngineStatus::Unknown,
            dp_size: u32::try_from(ranks.len()).unwrap_or(u32::MAX),
            interval: None,
            ranks,
        }
    }

    /// Decodes a wire report. Fails only on what cannot be interpreted at all (an unset or
    /// unknown kind); every other check is the table's.
    pub fn from_wire(report: &pb::LoadReport) -> Result<Self, RejectReason> {
        let kind = match pb::ReportKind::try_from(report.kind) {
            Ok(pb::ReportKind::Basic) => ReportKind::Basic,
            Ok(pb::ReportKind::Native) => ReportKind::Native,
            Ok(pb::ReportKind::Unspecified) | Err(_) => return Err(RejectReason::Malformed),
        };
        Ok(Self {
            engine_id: report.engine_id.clone(),
            instance_id: report.instance_id,
            sequence: report.sequence,
            kind,
            status: status_from_wire(report.status),
            dp_size: report.dp_size,
            interval: (report.interval_ms > 0)
                .then(|| Duration::from_millis(u64::from(report.interval_ms))),
            ranks: report
                .ranks
                .iter()
                .map(|rank| RankSample::from_wire(rank, report.sent_at_unix_ms, kind))
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_round_trip_keeps_native_fields_and_age() {
        let rank = RankSample {
            age: Duration::from_millis(40),
            estimated_prefill_queue_ms: Some(12.5),
            ..RankSample::basic(1, 2, 3, 4, 5)
                .with_native(6, 7, 8)
                .with_prefill_counters(9, 10)
                .with_decode_rate(321.5)
        };
        let wire = pb::LoadReport {
            engine_id: "e".into(),
            instance_id: 7,
            sequence: 3,
            kind: pb::ReportKind::Native as i32,
            status: pb::EngineStatus::Draining as i32,
            dp_size: 2,
            ranks: vec![rank.to_wire(1_000_000, true)],
            sent_at_unix_ms: 1_000_000,
            interval_ms: 250,
        };
        let report = Report::from_wire(&wire).expect("valid");
        assert_eq!(report.ranks, vec![rank]);
        assert_eq!(report.status, EngineStatus::Draining);
        assert_eq!(report.interval, Some(Duration::from_millis(250)));
        assert_eq!(report.dp_size, 2);
    }

    #[test]
    fn basic_wire_report_drops_native_fields() {
        let rank = RankSample::basic(0, 1, 1, 1, 1).with_native(5, 5, 5).with_decode_rate(9.0);
        let wire = pb::LoadReport {
            kind: pb::ReportKind::Basic as i32,
            ranks: vec![rank.to_wire(0, true)],
            ..pb::LoadReport::default()
        };
        let report = Report::from_wire(&wire).expect("valid");
        assert_eq!(report.ranks[0].waiting_uncached_tokens, None);
        assert_eq!(report.ranks[0].decode_tokens_per_sec, None);
        assert_eq!(report.ranks[0].age, Duration::ZERO, "unknown timestamps mean no age");
    }

    #[test]
    fn unset_or_unknown_kind_is_malformed() {
        for kind in [0, 99] {
            let wire = pb::LoadReport { kind, ..pb::LoadReport::default() };
            assert_eq!(Report::from_wire(&wire), Err(RejectReason::Malformed));
        }
    }

    #[test]
    fn rank_sampled_after_sending_has_no_negative_age() {
        let wire = pb::LoadReport {
            kind: pb::ReportKind::Basic as i32,
            sent_at_unix_ms: 1_000,
            ranks: vec![pb::RankLoad { snapshot_time_unix_ms: 5_000, ..pb::RankLoad::default() }],
            ..pb::LoadReport::default()
        };
        let report = Report::from_wire(&wire).expect("valid");
        assert_eq!(report.ranks[0].age, Duration::ZERO);
    }
}
