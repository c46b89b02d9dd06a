//! What policies read: one engine's reported load, aggregated over its data-parallel ranks,
//! and each rank's own numbers for choosing a rank inside the engine.

use std::time::{Duration, Instant};

use crate::{EngineStatus, ReportKind};

/// An engine's reported load, summed over every rank of one complete, fresh report.
///
/// Only ever handed out for a usable report: a missing, stale or rank-incomplete engine has no
/// `EngineLoad` at all (never one full of zeros).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineLoad {
    /// BASIC or NATIVE; NATIVE exactly when [`EngineLoad::native`] is `Some`.
    pub kind: ReportKind,
    /// The engine's own serving state.
    pub status: EngineStatus,
    /// When the numbers were sampled, on the router's clock: the receipt time minus the age the
    /// engine states for its oldest rank. Requests dispatched since this instant are not in the
    /// numbers (see [`crate::Inflight::dispatched_since`]).
    pub captured_at: Instant,
    /// When the router received the report; freshness is judged from this.
    pub received_at: Instant,
    /// Data-parallel ranks summed.
    pub dp_size: u32,
    /// Requests running, over all ranks.
    pub running_requests: u64,
    /// Requests waiting, over all ranks.
    pub waiting_requests: u64,
    /// KV-cache tokens in use, over all ranks.
    pub kv_used_tokens: u64,
    /// KV-cache capacity in tokens, over all ranks; 0 when any rank did not know it.
    pub kv_capacity_tokens: u64,
    /// Native fields, present only for a NATIVE report with every native gauge on every rank.
    pub native: Option<NativeLoad>,
}

/// The native part of an [`EngineLoad`], summed over ranks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NativeLoad {
    /// Waiting prompt tokens not covered by the prefix cache.
    pub waiting_uncached_tokens: u64,
    /// KV tokens in use plus the full length of queued requests.
    pub total_kv_tokens: u64,
    /// The engine's caps on running requests, summed over ranks.
    pub max_running_requests: u64,
    /// Prefill throughput in uncached tokens per second of prefill busy time, summed over ranks,
    /// derived from the cumulative counters of two consecutive reports of the same instance.
    /// `None` on the first report, after a counter reset, or when a rank lacks the counters.
    pub prefill_tokens_per_sec: Option<f64>,
    /// Estimated time a newly queued request waits before its prefill starts, in milliseconds:
    /// the engine's own estimate when every rank gives a valid one, else waiting uncached tokens
    /// divided by the derived prefill rate; the mean over ranks either way. `None` when neither
    /// is available. Never derived from decode throughput.
    pub prefill_queue_ms: Option<f64>,
    /// The decode speed of one request on this engine, in output tokens per second: each
    /// rank's reported generation throughput over its running requests (while it runs some;
    /// an idle rank keeps the last such speed of its instance), averaged over the ranks that
    /// have one. `None` when no rank reports a throughput or none has decoded yet.
    pub request_decode_tokens_per_sec: Option<f64>,
}

/// One data-parallel rank's share of an [`EngineLoad`], as its report stated it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RankLoad {
    /// Requests running on the rank.
    pub running_requests: u64,
    /// Requests queued on the rank.
    pub waiting_requests: u64,
    /// KV-cache tokens in use on the rank.
    pub kv_used_tokens: u64,
    /// Waiting prompt tokens not covered by the rank's prefix cache, when the engine says
    /// (NATIVE reports).
    pub waiting_uncached_tokens: Option<u64>,
}

impl RankLoad {
    /// Running plus waiting requests.
    pub fn total_requests(&self) -> u64 {
        self.running_requests.saturating_add(self.waiting_requests)
    }
}

impl EngineLoad {
    /// Used over capacity KV tokens, in `0.0..=1.0`; `None` without a known capacity.
    pub fn kv_usage_fraction(&self) -> Option<f64> {
        self.has_valid_capacity().then(|| {
            let fraction = self.kv_used_tokens as f64 / self.kv_capacity_tokens as f64;
            fraction.min(1.0)
        })
    }

    /// Whether the KV capacity is known (non-zero).
    pub fn has_valid_capacity(&self) -> bool {
        self.kv_capacity_tokens > 0
    }

    /// The native fields, when the report had them.
    pub fn native(&self) -> Option<&NativeLoad> {
        self.native.as_ref()
    }

    /// Running plus waiting requests.
    pub fn total_requests(&self) -> u64 {
        self.running_requests.saturating_add(self.waiting_requests)
    }

    /// How old the numbers are at `now`.
    pub fn age_at(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.captured_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(used: u64, capacity: u64) -> EngineLoad {
        let now = Instant::now();
        EngineLoad {
            kind: ReportKind::Basic,
            status: EngineStatus::Unknown,
            captured_at: now,
            received_at: now,
            dp_size: 1,
            running_requests: 3,
            waiting_requests: 4,
            kv_used_tokens: used,
            kv_capacity_tokens: capacity,
            native: None,
        }
    }

    #[test]
    fn usage_fraction_needs_a_capacity() {
        assert_eq!(load(10, 0).kv_usage_fraction(), None);
        assert_eq!(load(25, 100).kv_usage_fraction(), Some(0.25));
        assert_eq!(load(25, 100).total_requests(), 7);
    }
}
