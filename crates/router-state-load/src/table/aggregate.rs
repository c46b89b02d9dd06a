//! Pure steps of ingesting a report: value checks, rank completeness, prefill-rate and
//! per-request decode-speed derivation, and the sum over ranks.

use std::time::{Duration, Instant};

use crate::{
    EngineLoad, EngineStatus, NativeLoad, RankLoad, RankSample, RejectReason, Report, ReportKind,
};

/// More requests than any engine runs or queues: the report is rejected.
pub(crate) const MAX_REQUESTS: u64 = 1 << 24;
/// More tokens than any engine's KV cache or queue holds: the report is rejected.
pub(crate) const MAX_TOKENS: u64 = 1 << 40;
/// Queue-time estimates beyond a day are not estimates.
const MAX_QUEUE_MS: f64 = 86_400_000.0;
/// Prefill rates beyond this (tokens per second of busy time) are counter noise.
const MAX_PREFILL_RATE: f64 = 1e9;
/// Generation throughputs beyond this (tokens per second) are not measurements.
const MAX_DECODE_RATE: f64 = 1e9;
/// Busy time needed between two counter samples before a rate is derived from them.
const MIN_BUSY_WINDOW_US: u64 = 1_000;
/// Ages beyond this are treated as this (the report is stale on arrival either way).
const MAX_AGE: Duration = Duration::from_secs(3600);

/// Checks every value of the report; clamps what can be clamped. Returns whether anything was
/// clamped or dropped. Native fields of a report claimed BASIC are dropped, not checked.
pub(crate) fn sanitize(report: &mut Report) -> Result<bool, RejectReason> {
    let mut clamped = false;
    for rank in &mut report.ranks {
        if report.kind == ReportKind::Basic {
            *rank = RankSample {
                waiting_uncached_tokens: None,
                total_kv_tokens: None,
                max_running_requests: None,
                total_prefill_uncached_tokens: None,
                total_prefill_busy_us: None,
                estimated_prefill_queue_ms: None,
                decode_tokens_per_sec: None,
                ..*rank
            };
        }
        let requests = [Some(rank.running_requests), Some(rank.waiting_requests)]
            .into_iter()
            .chain([rank.max_running_requests]);
        if requests.flatten().any(|v| v > MAX_REQUESTS) {
            return Err(RejectReason::AbsurdValue);
        }
        let tokens = [Some(rank.kv_used_tokens), Some(rank.kv_capacity_tokens)]
            .into_iter()
            .chain([rank.waiting_uncached_tokens, rank.total_kv_tokens]);
        if tokens.flatten().any(|v| v > MAX_TOKENS) {
            return Err(RejectReason::AbsurdValue);
        }
        if rank.kv_capacity_tokens > 0 && rank.kv_used_tokens > rank.kv_capacity_tokens {
            rank.kv_used_tokens = rank.kv_capacity_tokens;
            clamped = true;
        }
        if let Some(ms) = rank.estimated_prefill_queue_ms
            && !(ms.is_finite() && (0.0..=MAX_QUEUE_MS).contains(&ms))
        {
            rank.estimated_prefill_queue_ms = None;
            clamped = true;
        }
        if let Some(rate) = rank.decode_tokens_per_sec
            && !(rate.is_finite() && (0.0..=MAX_DECODE_RATE).contains(&rate))
        {
            rank.decode_tokens_per_sec = None;
            clamped = true;
        }
        if rank.age > MAX_AGE {
            rank.age = MAX_AGE;
            clamped = true;
        }
    }
    Ok(clamped)
}

/// The ranks ordered by rank, when they cover exactly `0..dp_size`, each once.
pub(crate) fn complete_ranks(ranks: &[RankSample], dp_size: u32) -> Option<Vec<&RankSample>> {
    let n = usize::try_from(dp_size).ok()?;
    if n == 0 || ranks.len() != n {
        return None;
    }
    let mut ordered: Vec<Option<&RankSample>> = vec![None; n];
    for rank in ranks {
        let slot = ordered.get_mut(usize::try_from(rank.dp_rank).ok()?)?;
        if slot.replace(rank).is_some() {
            return None;
        }
    }
    ordered.into_iter().collect()
}

/// One rank's cumulative prefill counters from the last report, and the rate derived from them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct RankCounters {
    baseline: Option<(u64, u64)>,
    rate: Option<f64>,
}

impl RankCounters {
    /// Takes a new sample of (uncached tokens, busy µs) and returns the current rate in tokens
    /// per second of busy time. No rate on the first sample, after a reset (a counter went
    /// down) or without counters; too little busy time since the baseline keeps the last rate.
    pub(crate) fn observe(&mut self, tokens: Option<u64>, busy_us: Option<u64>) -> Option<f64> {
        let (Some(tokens), Some(busy_us)) = (tokens, busy_us) else {
            *self = Self::default();
            return None;
        };
        match self.baseline {
            Some((t0, b0)) if tokens >= t0 && busy_us >= b0 => {
                let busy = busy_us - b0;
                if busy >= MIN_BUSY_WINDOW_US {
                    let rate = (tokens - t0) as f64 * 1e6 / busy as f64;
                    self.rate = (rate > 0.0 && rate <= MAX_PREFILL_RATE).then_some(rate);
                    self.baseline = Some((tokens, busy_us));
                }
            }
            _ => {
                self.baseline = Some((tokens, busy_us));
                self.rate = None;
            }
        }
        self.rate
    }
}

/// One sanitized rank's own numbers.
pub(crate) fn rank_load(rank: &RankSample) -> RankLoad {
    RankLoad {
        running_requests: rank.running_requests,
        waiting_requests: rank.waiting_requests,
        kv_used_tokens: rank.kv_used_tokens,
        waiting_uncached_tokens: rank.waiting_uncached_tokens,
    }
}

/// One rank's decode speed per request: the last one a report showed while the rank was
/// decoding.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct RankDecode {
    last: Option<f64>,
}

impl RankDecode {
    /// Takes a rank's running requests and generation throughput (output tokens per second
    /// over its requests) and returns the decode speed of one request there: throughput over
    /// running requests while both are positive, else the last such speed (a rank with nothing
    /// to decode is as fast as it last was). Without a throughput there is none, and the
    /// memory is dropped.
    pub(crate) fn observe(&mut self, running: u64, throughput: Option<f64>) -> Option<f64> {
        let Some(throughput) = throughput else {
            *self = Self::default();
            return None;
        };
        if running > 0 && throughput > 0.0 {
            self.last = Some(throughput / running as f64);
        }
        self.last
    }
}

/// Sums complete, sanitized ranks into an engine load received at `received_at`. `rates` are
/// the ranks' prefill rates and `decode` their per-request decode speeds, in rank order.
pub(crate) fn aggregate(
    ranks: &[&RankSample],
    rates: &[Option<f64>],
    decode: &[Option<f64>],
    claimed: ReportKind,
    status: EngineStatus,
    received_at: Instant,
) -> EngineLoad {
    let sum =
        |f: fn(&RankSample) -> u64| ranks.iter().fold(0u64, |acc, r| acc.saturating_add(f(r)));
    let oldest = ranks.iter().map(|r| r.age).max().unwrap_or_default();
    let capacity_known = ranks.iter().all(|r| r.kv_capacity_tokens > 0);
    let native = (claimed == ReportKind::Native && ranks.iter().all(|r| r.has_native_gauges()))
        .then(|| native(ranks, rates, decode));
    EngineLoad {
        kind: if native.is_some() { ReportKind::Native } else { ReportKind::Basic },
        status,
        captured_at: received_at.checked_sub(oldest).unwrap_or(received_at),
        received_at,
        dp_size: u32::try_from(ranks.len()).unwrap_or(u32::MAX),
        running_requests: sum(|r| r.running_requests),
        waiting_requests: sum(|r| r.waiting_requests),
        kv_used_tokens: sum(|r| r.kv_used_tokens),
        kv_capacity_tokens: if capacity_known { sum(|r| r.kv_capacity_tokens) } else { 0 },
        native,
    }
}

fn native(ranks: &[&RankSample], rates: &[Option<f64>], decode: &[Option<f64>]) -> NativeLoad {
    let sum = |f: fn(&RankSample) -> Option<u64>| {
        ranks.iter().fold(0u64, |acc, r| acc.saturating_add(f(r).unwrap_or(0)))
    };
    let n = ranks.len() as f64;
    let rates: Option<Vec<f64>> = rates.iter().copied().collect();
    let engine_estimate: Option<f64> = ranks
        .iter()
        .map(|r| r.estimated_prefill_queue_ms)
        .collect::<Option<Vec<f64>>>()
        .map(|all| all.iter().sum::<f64>() / n);
    let derived = rates.as_ref().map(|rates| {
        let total: f64 = ranks
            .iter()
            .zip(rates)
            .map(|(r, rate)| {
                let waiting = r.waiting_uncached_tokens.unwrap_or(0) as f64;
                waiting / rate * 1000.0
            })
            .sum();
        total / n
    });
    NativeLoad {
        waiting_uncached_tokens: sum(|r| r.waiting_uncached_tokens),
        total_kv_tokens: sum(|r| r.total_kv_tokens),
        max_running_requests: sum(|r| r.max_running_requests),
        prefill_tokens_per_sec: rates.map(|rates| rates.iter().sum()),
        prefill_queue_ms: engine_estimate.or(derived),
        request_decode_tokens_per_sec: mean(decode.iter().flatten().copied()),
    }
}

/// The mean of `values`; `None` for none.
fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0u32), |(sum, n), v| (sum + v, n + 1));
    (n > 0).then(|| sum / f64::from(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complete_ranks_orders_and_rejects_gaps_duplicates_and_extras() {
        let r = |i| RankSample::basic(i, 0, 0, 0, 0);
        let given = [r(1), r(0)];
        let ordered = complete_ranks(&given, 2).expect("complete");
        assert_eq!(ordered.iter().map(|r| r.dp_rank).collect::<Vec<_>>(), vec![0, 1]);
        assert!(complete_ranks(&[r(0)], 2).is_none(), "missing rank");
        assert!(complete_ranks(&[r(0), r(0)], 2).is_none(), "duplicate rank");
        assert!(complete_ranks(&[r(0), r(2)], 2).is_none(), "out of range");
        assert!(complete_ranks(&[r(0), r(1), r(2)], 2).is_none(), "extra rank");
        assert!(complete_ranks(&[], 0).is_none(), "no ranks at all");
    }

    #[test]
    fn rate_needs_two_samples_and_resets_when_counters_go_back() {
        let mut c = RankCounters::default();
        assert_eq!(c.observe(Some(1_000), Some(1_000_000)), None, "first sample");
        assert_eq!(c.observe(Some(3_000), Some(2_000_000)), Some(2_000.0));
        assert_eq!(c.observe(Some(3_000), Some(2_000_500)), Some(2_000.0), "too little busy time");
        assert_eq!(c.observe(Some(10), Some(10)), None, "counter reset");
        assert_eq!(c.observe(Some(1_010), Some(1_000_010)), Some(1_000.0));
        assert_eq!(c.observe(None, Some(2_000_010)), None, "counters gone");
    }

    #[test]
    fn decode_speed_is_throughput_per_running_request_and_kept_while_idle() {
        let mut d = RankDecode::default();
        assert_eq!(d.observe(0, Some(0.0)), None, "never decoded");
        assert_eq!(d.observe(4, Some(400.0)), Some(100.0), "400 tokens/s over 4 requests");
        assert_eq!(d.observe(0, Some(0.0)), Some(100.0), "idle: as fast as it last was");
        assert_eq!(d.observe(2, Some(0.0)), Some(100.0), "running but no output yet");
        assert_eq!(d.observe(8, Some(200.0)), Some(25.0), "a larger batch is slower");
        assert_eq!(d.observe(8, None), None, "no throughput reported");
        assert_eq!(d.observe(0, Some(0.0)), None, "the memory went with it");
    }

    #[test]
    fn sanitize_drops_invalid_decode_throughput() {
        for rate in [-1.0, f64::NAN, f64::INFINITY, 1e12] {
            let rank = RankSample::basic(0, 1, 1, 1, 1).with_native(0, 0, 1).with_decode_rate(rate);
            let mut report = Report::new("e", 1, 1, ReportKind::Native, vec![rank]);
            assert_eq!(sanitize(&mut report), Ok(true), "{rate}");
            assert_eq!(report.ranks[0].decode_tokens_per_sec, None, "{rate}");
        }
        let rank = RankSample::basic(0, 1, 1, 1, 1).with_native(0, 0, 1).with_decode_rate(0.0);
        let mut report = Report::new("e", 1, 1, ReportKind::Native, vec![rank]);
        assert_eq!(sanitize(&mut report), Ok(false), "zero is a throughput");
        let mut basic = Report::new("e", 1, 1, ReportKind::Basic, vec![rank]);
        assert_eq!(sanitize(&mut basic), Ok(false));
        assert_eq!(basic.ranks[0].decode_tokens_per_sec, None, "a basic report has none");
    }

    #[test]
    fn sanitize_clamps_used_kv_and_drops_invalid_estimates() {
        let mut bad = RankSample::basic(0, 1, 1, 500, 100).with_native(0, 0, 1);
        bad.estimated_prefill_queue_ms = Some(f64::NAN);
        let mut report = Report::new("e", 1, 1, ReportKind::Native, vec![bad]);
        assert_eq!(sanitize(&mut report), Ok(true));
        assert_eq!(report.ranks[0].kv_used_tokens, 100);
        assert_eq!(report.ranks[0].estimated_prefill_queue_ms, None);

        for ms in [-1.0, f64::INFINITY, 1e12] {
            let mut rank = RankSample::basic(0, 1, 1, 1, 1).with_native(0, 0, 1);
            rank.estimated_prefill_queue_ms = Some(ms);
            let mut report = Report::new("e", 1, 1, ReportKind::Native, vec![rank]);
            assert_eq!(sanitize(&mut report), Ok(true), "{ms}");
            assert_eq!(report.ranks[0].estimated_prefill_queue_ms, None, "{ms}");
        }
    }

    #[test]
    fn sanitize_rejects_absurd_counts_and_tokens() {
        let cases = [
            RankSample::basic(0, MAX_REQUESTS + 1, 0, 0, 0),
            RankSample::basic(0, 0, u64::MAX, 0, 0),
            RankSample::basic(0, 0, 0, 0, MAX_TOKENS + 1),
            RankSample::basic(0, 0, 0, 0, 10).with_native(u64::MAX, 0, 1),
            RankSample::basic(0, 0, 0, 0, 10).with_native(0, 0, MAX_REQUESTS + 1),
        ];
        for rank in cases {
            let mut report = Report::new("e", 1, 1, ReportKind::Native, vec![rank]);
            assert_eq!(sanitize(&mut report), Err(RejectReason::AbsurdValue), "{rank:?}");
        }
    }

    #[test]
    fn aggregate_sums_and_takes_the_oldest_capture() {
        let now = Instant::now() + Duration::from_secs(10);
        let a = RankSample { age: Duration::from_millis(5), ..RankSample::basic(0, 1, 2, 30, 100) };
        let b =
            RankSample { age: Duration::from_millis(50), ..RankSample::basic(1, 3, 4, 70, 100) };
        let load = aggregate(
            &[&a, &b],
            &[None, None],
            &[None, None],
            ReportKind::Basic,
            EngineStatus::Serving,
            now,
        );
        assert_eq!((load.running_requests, load.waiting_requests), (4, 6));
        assert_eq!((load.kv_used_tokens, load.kv_capacity_tokens), (100, 200));
        assert_eq!(load.captured_at, now - Duration::from_millis(50));
        assert_eq!(load.native, None);
        let unknown = RankSample::basic(1, 0, 0, 5, 0);
        let load = aggregate(
            &[&a, &unknown],
            &[None, None],
            &[None, None],
            ReportKind::Basic,
            EngineStatus::Serving,
            now,
        );
        assert_eq!(load.kv_capacity_tokens, 0, "a partial capacity is no capacity");
    }

    #[test]
    fn native_prefers_engine_estimate_then_derived_rate() {
        let now = Instant::now();
        let a = RankSample::basic(0, 0, 0, 0, 1).with_native(1_000, 0, 8);
        let b = RankSample::basic(1, 0, 0, 0, 1).with_native(3_000, 0, 8);
        let load = aggregate(
            &[&a, &b],
            &[Some(1_000.0), Some(1_000.0)],
            &[Some(40.0), None],
            ReportKind::Native,
            EngineStatus::Serving,
            now,
        );
        let native = load.native.expect("native");
        assert_eq!(native.prefill_tokens_per_sec, Some(2_000.0));
        assert_eq!(native.prefill_queue_ms, Some(2_000.0), "mean of 1 s and 3 s");
        assert_eq!(native.max_running_requests, 16);
        assert_eq!(native.request_decode_tokens_per_sec, Some(40.0), "the ranks that have one");

        let rate_missing = aggregate(
            &[&a, &b],
            &[Some(1_000.0), None],
            &[None, None],
            ReportKind::Native,
            EngineStatus::Serving,
            now,
        );
        assert_eq!(rate_missing.native.expect("native").prefill_queue_ms, None);
        assert_eq!(rate_missing.native.expect("native").request_decode_tokens_per_sec, None);

        let a = RankSample { estimated_prefill_queue_ms: Some(10.0), ..a };
        let b = RankSample { estimated_prefill_queue_ms: Some(30.0), ..b };
        let load = aggregate(
            &[&a, &b],
            &[None, None],
            &[None, None],
            ReportKind::Native,
            EngineStatus::Serving,
            now,
        );
        assert_eq!(load.native.expect("native").prefill_queue_ms, Some(20.0));
    }

    #[test]
    fn native_needs_every_gauge_on_every_rank() {
        let now = Instant::now();
        let a = RankSample::basic(0, 0, 0, 0, 1).with_native(1, 1, 1);
        let mut b = RankSample::basic(1, 0, 0, 0, 1).with_native(1, 1, 1);
        b.total_kv_tokens = None;
        let load = aggregate(
            &[&a, &b],
            &[None, None],
            &[None, None],
            ReportKind::Native,
            EngineStatus::Serving,
            now,
        );
        assert_eq!(load.kind, ReportKind::Basic);
        assert_eq!(load.native, None);
    }
}
