//! Pure pressure comparison: one totally ordered key per engine.
//!
//! The comparison of docs/design/POLICY_REFERENCE.md, stage by stage:
//! - plain and prefill: estimated prefill queue time (when every compared engine has one), then
//!   waiting uncached tokens, waiting requests, running requests;
//! - decode: waiting requests, running requests, KV usage fraction, used KV tokens;
//! - ties: router-local in-flight requests.
//!
//! The reported metrics count only when *every* compared engine has a fresh, complete native
//! report with a valid KV capacity; otherwise the whole set is compared by router-local in-flight
//! requests. That choice is made once per set ([`Comparison::for_loads`]), and each engine then
//! gets a [`PressureKey`] that is compared with plain `Ord`. Comparing pairs with a rule that
//! looks at both sides ("queue time when both have it") is not transitive over three engines, so
//! nothing here sorts with a pairwise comparator. For two engines the result is exactly the
//! pairwise rule of docs/design/POLICY_DESIGN.md §4.

use router_state_load::{EngineLoad, NativeLoad};
use router_workers::Stage;

/// What a set of engines is compared by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Basis {
    /// The engines' own native reports, with router-local in-flight as the tie-break.
    Reported,
    /// Router-local in-flight requests only: some engine lacked a usable native report.
    Local,
}

/// The reported numbers the comparison reads, present only for a fresh, complete native report
/// with a valid (non-zero) KV capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NativePressure {
    /// Waiting requests.
    pub waiting_requests: u64,
    /// Running requests.
    pub running_requests: u64,
    /// Waiting prompt tokens not covered by the prefix cache.
    pub waiting_uncached_tokens: u64,
    /// KV tokens in use.
    pub kv_used_tokens: u64,
    /// KV capacity in tokens; never zero.
    pub kv_capacity_tokens: u64,
    /// Estimated prefill queue time, when known, finite and non-negative.
    pub prefill_queue_ms: Option<f64>,
}

impl NativePressure {
    /// The comparable numbers of `load`, or `None` when the report is missing (stale and
    /// rank-incomplete reports already read as missing), basic, or has no KV capacity.
    pub fn of(load: Option<&EngineLoad>) -> Option<Self> {
        let load = load?;
        let native: &NativeLoad = load.native.as_ref()?;
        if load.kv_capacity_tokens == 0 {
            return None;
        }
        Some(Self {
            waiting_requests: load.waiting_requests,
            running_requests: load.running_requests,
            waiting_uncached_tokens: native.waiting_uncached_tokens,
            kv_used_tokens: load.kv_used_tokens,
            kv_capacity_tokens: load.kv_capacity_tokens,
            prefill_queue_ms: native.prefill_queue_ms.filter(|ms| ms.is_finite() && *ms >= 0.0),
        })
    }

    /// This engine as it would look with `requests` more waiting requests of about
    /// `tokens_each` uncached prompt tokens (the recent-dispatch correction). The queue-time
    /// estimate cannot be corrected without the engine's rate, so a correction drops it.
    pub fn with_unreported(mut self, requests: u64, tokens_each: u64) -> Self {
        if requests == 0 {
            return self;
        }
        self.waiting_requests = self.waiting_requests.saturating_add(requests);
        self.waiting_uncached_tokens =
            self.waiting_uncached_tokens.saturating_add(requests.saturating_mul(tokens_each));
        self.prefill_queue_ms = None;
        self
    }

    /// Used over capacity.
    pub fn kv_usage_fraction(&self) -> f64 {
        self.kv_used_tokens as f64 / self.kv_capacity_tokens as f64
    }
}

/// One engine's position in a [`Comparison`]: smaller is less pressured. Compare keys only
/// within the comparison that made them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PressureKey([u64; 5]);

impl PressureKey {
    /// The key components, most significant first (for traces and tests).
    pub fn components(&self) -> [u64; 5] {
        self.0
    }
}

/// How one set of engines of one stage is compared; decided once for the set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Comparison {
    stage: Stage,
    basis: Basis,
    queue_time: bool,
}

impl Comparison {
    /// The comparison for a set of engines given their (already corrected, if need be)
    /// reported pressure: reported when every engine has one, queue time first (plain and
    /// prefill) when every engine has an estimate.
    pub fn for_set<I>(stage: Stage, pressures: I) -> Self
    where
        I: IntoIterator<Item = Option<NativePressure>>,
    {
        let mut basis = Basis::Reported;
        let mut queue_time = !matches!(stage, Stage::Decode);
        for pressure in pressures {
            match pressure {
                None => {
                    basis = Basis::Local;
                    queue_time = false;
                    break;
                }
                Some(p) => queue_time &= p.prefill_queue_ms.is_some(),
            }
        }
        Self { stage, basis, queue_time }
    }

    /// The comparison for a set of engines given their snapshot entries.
    pub fn for_loads<'a, I>(stage: Stage, loads: I) -> Self
    where
        I: IntoIterator<Item = Option<&'a EngineLoad>>,
    {
        Self::for_set(stage, loads.into_iter().map(NativePressure::of))
    }

    /// The local-only comparison.
    pub fn local(stage: Stage) -> Self {
        Self { stage, basis: Basis::Local, queue_time: false }
    }

    /// What the set is compared by.
    pub fn basis(&self) -> Basis {
        self.basis
    }

    /// Whether plain/prefill engines are compared by estimated queue time first.
    pub fn uses_queue_time(&self) -> bool {
        self.queue_time
    }

    /// The key of one engine of the set. Under [`Basis::Reported`] an engine without reported
    /// pressure (which [`Comparison::for_set`] would not have allowed) sorts after every engine
    /// that has it: a missing report never reads as idle.
    pub fn key(&self, pressure: Option<NativePressure>, inflight: u64) -> PressureKey {
        if self.basis == Basis::Local {
            return PressureKey([0, 0, 0, 0, inflight]);
        }
        let Some(p) = pressure else {
            return PressureKey([u64::MAX, u64::MAX, u64::MAX, u64::MAX, inflight]);
        };
        match self.stage {
            Stage::Plain | Stage::Prefill => {
                let queue = if self.queue_time {
                    p.prefill_queue_ms.map_or(u64::MAX, ordered_bits)
                } else {
                    0
                };
                PressureKey([
                    queue,
                    p.waiting_uncached_tokens,
                    p.waiting_requests,
                    p.running_requests,
                    inflight,
                ])
            }
            Stage::Decode => PressureKey([
                p.waiting_requests,
                p.running_requests,
                ordered_bits(p.kv_usage_fraction()),
                p.kv_used_tokens,
                inflight,
            ]),
        }
    }
}

/// Maps a finite, non-negative float to an integer with the same order (IEEE 754 bit patterns
/// of non-negative floats sort like the floats). Negative zero is read as zero.
fn ordered_bits(value: f64) -> u64 {
    if value <= 0.0 { 0 } else { value.to_bits() }
}

/// Compares two engines of `stage` by the pairwise rule: reported pressure when both have a
/// usable native report, router-local in-flight otherwise and on ties. Returns whether `b` is
/// strictly less pressured than `a`, and the basis used.
pub fn second_is_less_pressured(
    stage: Stage,
    a: (Option<&EngineLoad>, u64),
    b: (Option<&EngineLoad>, u64),
) -> (bool, Basis) {
    let (pa, pb) = (NativePressure::of(a.0), NativePressure::of(b.0));
    let comparison = Comparison::for_set(stage, [pa, pb]);
    (comparison.key(pb, b.1) < comparison.key(pa, a.1), comparison.basis())
}

#[cfg(test)]
mod tests {
    use router_state_load::{EngineStatus, ReportKind};

    use super::*;

    fn native(
        waiting: u64,
        running: u64,
        uncached: u64,
        used: u64,
        queue_ms: Option<f64>,
    ) -> NativePressure {
        NativePressure {
            waiting_requests: waiting,
            running_requests: running,
            waiting_uncached_tokens: uncached,
            kv_used_tokens: used,
            kv_capacity_tokens: 1000,
            prefill_queue_ms: queue_ms,
        }
    }

    #[test]
    fn ordered_bits_preserve_order() {
        let values = [0.0, f64::MIN_POSITIVE, 0.5, 1.0, 1.5, 1e9, f64::MAX];
        for pair in values.windows(2) {
            assert!(ordered_bits(pair[0]) < ordered_bits(pair[1]), "{pair:?}");
        }
        assert_eq!(ordered_bits(-0.0), ordered_bits(0.0));
    }

    #[test]
    fn prefill_compares_queue_time_only_when_all_have_it() {
        // a: short queue time but many uncached tokens; b: the reverse.
        let a = native(0, 0, 900, 0, Some(5.0));
        let b = native(0, 0, 100, 0, Some(50.0));
        let both = Comparison::for_set(Stage::Prefill, [Some(a), Some(b)]);
        assert!(both.uses_queue_time());
        assert!(both.key(Some(a), 0) < both.key(Some(b), 0));

        let b_without = NativePressure { prefill_queue_ms: None, ..b };
        let one = Comparison::for_set(Stage::Prefill, [Some(a), Some(b_without)]);
        assert!(!one.uses_queue_time());
        assert!(one.key(Some(b_without), 0) < one.key(Some(a), 0));
    }

    #[test]
    fn decode_ignores_uncached_tokens_and_queue_time() {
        let a = native(1, 5, 0, 100, Some(0.0));
        let b = native(1, 4, 99_999, 900, Some(1e6));
        let c = Comparison::for_set(Stage::Decode, [Some(a), Some(b)]);
        assert!(!c.uses_queue_time());
        assert!(c.key(Some(b), 0) < c.key(Some(a), 0), "fewer running wins");
        let a2 = native(1, 4, 0, 100, None);
        assert!(c.key(Some(a2), 0) < c.key(Some(b), 0), "then lower kv usage");
    }

    #[test]
    fn inflight_breaks_reported_ties() {
        let a = native(2, 2, 2, 2, None);
        let c = Comparison::for_set(Stage::Plain, [Some(a), Some(a)]);
        assert!(c.key(Some(a), 1) < c.key(Some(a), 2));
        assert_eq!(c.key(Some(a), 3), c.key(Some(a), 3));
    }

    #[test]
    fn one_missing_report_makes_the_set_local() {
        let a = native(9, 9, 9, 9, None);
        let c = Comparison::for_set(Stage::Prefill, [Some(a), None]);
        assert_eq!(c.basis(), Basis::Local);
        // Under the local basis a heavily loaded report does not count, only in-flight does.
        assert!(c.key(Some(a), 1) < c.key(None, 2));
        assert!(c.key(None, 1) < c.key(Some(a), 2));
    }

    fn load(waiting: u64, native: Option<u64>) -> EngineLoad {
        let now = std::time::Instant::now();
        EngineLoad {
            kind: if native.is_some() { ReportKind::Native } else { ReportKind::Basic },
            status: EngineStatus::Serving,
            captured_at: now,
            received_at: now,
            dp_size: 1,
            running_requests: 0,
            waiting_requests: waiting,
            kv_used_tokens: 0,
            kv_capacity_tokens: 100,
            native: native.map(|uncached| NativeLoad {
                waiting_uncached_tokens: uncached,
                total_kv_tokens: uncached,
                max_running_requests: 8,
                prefill_tokens_per_sec: None,
                prefill_queue_ms: None,
                request_decode_tokens_per_sec: None,
            }),
        }
    }

    #[test]
    fn pairwise_rule_matches_the_pair_comparison() {
        let (light, busy) = (load(0, Some(10)), load(0, Some(20)));
        let basic = load(0, None);
        let decide = |a, b| second_is_less_pressured(Stage::Prefill, a, b);
        assert_eq!(decide((Some(&busy), 0), (Some(&light), 5)), (true, Basis::Reported));
        assert_eq!(decide((Some(&light), 5), (Some(&busy), 0)), (false, Basis::Reported));
        // A basic report on either side: in-flight decides, and ties keep the first.
        assert_eq!(decide((Some(&basic), 1), (Some(&busy), 0)), (true, Basis::Local));
        assert_eq!(decide((Some(&light), 0), (None, 0)), (false, Basis::Local));
    }

    #[test]
    fn correction_adds_requests_and_tokens_and_drops_queue_time() {
        let a = native(1, 1, 100, 0, Some(3.0));
        let corrected = a.with_unreported(2, 50);
        assert_eq!(corrected.waiting_requests, 3);
        assert_eq!(corrected.waiting_uncached_tokens, 200);
        assert_eq!(corrected.prefill_queue_ms, None);
        assert_eq!(a.with_unreported(0, 50), a);
        let huge = a.with_unreported(u64::MAX, u64::MAX);
        assert_eq!(huge.waiting_uncached_tokens, u64::MAX);
    }
}
