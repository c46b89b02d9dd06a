//! The writer-side state of one engine: ordering baselines, rate limit, prefill counters, the
//! last decode speeds and the current usable report.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use router_workers::WorkerId;

use super::aggregate::{self, RankCounters, RankDecode};
use super::{Entry, TableConfig};
use crate::{
    EngineLoadStatus, Freshness, MissingReason, RejectReason, RejectionCounts, Report, ReportKind,
};

/// Superseded instance ids remembered per engine, so a late report of an old process is not
/// mistaken for a restart.
const RETIRED_INSTANCES: usize = 8;

/// A token bucket: `burst` reports at once, `rate` per second sustained.
#[derive(Debug, Default)]
struct TokenBucket {
    tokens: f64,
    last: Option<Instant>,
}

impl TokenBucket {
    fn take(&mut self, now: Instant, rate: f64, burst: f64) -> bool {
        self.tokens = match self.last {
            None => burst,
            Some(last) => {
                (self.tokens + now.saturating_duration_since(last).as_secs_f64() * rate).min(burst)
            }
        };
        self.last = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[derive(Debug)]
pub(crate) struct EngineState {
    pub(crate) incarnation: u64,
    dp_size: u32,
    order: Option<(u64, u64)>,
    retired: VecDeque<u64>,
    counters: Vec<RankCounters>,
    decode: Vec<RankDecode>,
    bucket: TokenBucket,
    interval: Option<Duration>,
    stale_after: Duration,
    pub(crate) current: Option<Entry>,
    missing: MissingReason,
    accepted: u64,
    clamped: u64,
    rejected: RejectionCounts,
    /// A report of a new instance superseded the current one since the table last looked.
    pub(crate) restarted: bool,
}

impl EngineState {
    pub(crate) fn new(incarnation: u64, dp_size: u32, config: &TableConfig) -> Self {
        Self {
            incarnation,
            dp_size,
            order: None,
            retired: VecDeque::new(),
            counters: vec![RankCounters::default(); usize::try_from(dp_size).unwrap_or(0)],
            decode: vec![RankDecode::default(); usize::try_from(dp_size).unwrap_or(0)],
            bucket: TokenBucket::default(),
            interval: None,
            stale_after: config.stale_after_for(None),
            current: None,
            missing: MissingReason::NoReport,
            accepted: 0,
            clamped: 0,
            rejected: RejectionCounts::default(),
            restarted: false,
        }
    }

    pub(crate) fn count_rejection(&mut self, reason: RejectReason) {
        self.rejected.add(reason);
    }

    /// Drops the usable report; returns whether there was one.
    pub(crate) fn clear(&mut self, reason: MissingReason) -> bool {
        self.missing = reason;
        self.current.take().is_some()
    }

    /// Takes a report in. On success the usable report is replaced; a rank-incomplete report
    /// clears it. Every other rejection changes nothing but the counters (which the caller
    /// updates). Returns the accepted kind and whether clamping happened.
    pub(crate) fn ingest(
        &mut self,
        worker: &WorkerId,
        mut report: Report,
        now: Instant,
        config: &TableConfig,
    ) -> Result<(ReportKind, bool), RejectReason> {
        if report.engine_id != worker.as_str() {
            return Err(RejectReason::EngineMismatch);
        }
        if !self.bucket.take(now, config.max_reports_per_sec, f64::from(config.report_burst)) {
            return Err(RejectReason::RateLimited);
        }
        if report.dp_size != self.dp_size {
            return Err(RejectReason::DpSizeMismatch);
        }
        let clamped = aggregate::sanitize(&mut report)?;
        self.advance_order(report.instance_id, report.sequence)?;
        self.interval = report.interval;
        self.stale_after = config.stale_after_for(report.interval);

        let Some(ranks) = aggregate::complete_ranks(&report.ranks, self.dp_size) else {
            self.clear(MissingReason::RankIncomplete);
            return Err(RejectReason::RankIncomplete);
        };
        let rates: Vec<Option<f64>> = ranks
            .iter()
            .zip(&mut self.counters)
            .map(|(rank, counters)| {
                counters.observe(rank.total_prefill_uncached_tokens, rank.total_prefill_busy_us)
            })
            .collect();
        let decode: Vec<Option<f64>> = ranks
            .iter()
            .zip(&mut self.decode)
            .map(|(rank, decode)| decode.observe(rank.running_requests, rank.decode_tokens_per_sec))
            .collect();
        let load = aggregate::aggregate(&ranks, &rates, &decode, report.kind, report.status, now);
        let too_old = now.saturating_duration_since(load.captured_at) >= self.stale_after;
        let fresh_until = if too_old { now } else { now + self.stale_after };
        let ranks = ranks.iter().map(|r| aggregate::rank_load(r)).collect();
        self.current = Some(Entry { load, ranks, fresh_until });
        self.accepted += 1;
        self.clamped += u64::from(clamped);
        Ok((load.kind, clamped))
    }

    /// Accepts (instance, sequence) when it moves forward: a higher sequence of the current
    /// instance, or a not-yet-seen instance (a restart, which resets the counter baselines).
    fn advance_order(&mut self, instance: u64, sequence: u64) -> Result<(), RejectReason> {
        match self.order {
            Some((current, last)) if current == instance && sequence <= last => {
                return Err(RejectReason::SequenceWentBack);
            }
            Some((current, _)) if current == instance => {}
            Some((current, _)) => {
                if self.retired.contains(&instance) {
                    return Err(RejectReason::StaleInstance);
                }
                self.retired.push_back(current);
                if self.retired.len() > RETIRED_INSTANCES {
                    self.retired.pop_front();
                }
                self.counters.iter_mut().for_each(|c| *c = RankCounters::default());
                self.decode.iter_mut().for_each(|d| *d = RankDecode::default());
                self.restarted = true;
            }
            None => {}
        }
        self.order = Some((instance, sequence));
        Ok(())
    }

    pub(crate) fn status(&self, worker: &WorkerId, now: Instant) -> EngineLoadStatus {
        let (freshness, age_ms, kind) = match &self.current {
            Some(entry) => {
                let age = now.saturating_duration_since(entry.load.received_at);
                let fresh =
                    if now < entry.fresh_until { Freshness::Fresh } else { Freshness::Stale };
                (
                    fresh,
                    Some(u64::try_from(age.as_millis()).unwrap_or(u64::MAX)),
                    Some(entry.load.kind),
                )
            }
            None => (Freshness::Missing, None, None),
        };
        EngineLoadStatus {
            worker: worker.clone(),
            freshness,
            age_ms,
            kind,
            missing_reason: self.current.is_none().then_some(self.missing),
            stale_after: self.stale_after,
            report_interval: self.interval,
            accepted: self.accepted,
            clamped: self.clamped,
            rejected: self.rejected,
        }
    }
}
