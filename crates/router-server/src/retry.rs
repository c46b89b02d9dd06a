//! Retries of plain dispatches that failed before any byte reached the client, under a budget.
//!
//! Two failures qualify: the engine could not be reached (connection refused, connect timeout,
//! TLS handshake failure: the request provably never started there, and the engine is marked
//! unhealthy), or it answered a status of `on_status` (by default 429, 502, 503, 504: it is
//! busy or unavailable, and said so before doing the work). The retry is a fresh selection (the
//! whole bucket loop) that excludes every engine that failed the request; it is not a
//! substitution inside the earlier pick. An engine's `Retry-After` holds it off for every
//! request for that long (capped by `max_retry_after_secs`). Nothing is retried once an engine's
//! answer started, never after a byte went to the client, and never a PD pair (its prefill
//! engine may already hold the request).
//!
//! The budget is Linkerd's: retries may add `budget_ratio` of the requests of the last
//! `budget_window_secs` (a window sliding by the second), plus `budget_min_per_sec` so that a
//! quiet router can still retry. A fleet-wide outage therefore costs at most that much extra
//! load instead of multiplying it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use router_config::RetrySection;

/// The delay before retry number `retry` (1-based): `config`'s backoff multiplied by
/// `backoff_multiplier` per retry up to `max_backoff_ms`, then lengthened by up to
/// `jitter_factor` of itself so that clients failed together do not come back together.
pub(crate) fn backoff(config: &RetrySection, retry: u32) -> Duration {
    backoff_with(config, retry, rand::random::<f64>())
}

/// [`backoff`] with the random draw `unit` in `[0, 1)`.
fn backoff_with(config: &RetrySection, retry: u32, unit: f64) -> Duration {
    let exponent = i32::try_from(retry.saturating_sub(1).min(30)).unwrap_or(30);
    let grown = config.backoff_ms as f64 * config.backoff_multiplier.max(1.0).powi(exponent);
    let capped = grown.min(config.max_backoff_ms.max(config.backoff_ms) as f64);
    let jitter = unit.clamp(0.0, 1.0) * config.jitter_factor.clamp(0.0, 1.0);
    Duration::from_millis(capped as u64).mul_f64(1.0 + jitter)
}

/// The shared retry budget: requests and retries counted per second in a ring covering the
/// window. A deposit is a clock read and two atomic operations; a withdrawal sums the ring.
#[derive(Debug)]
pub struct RetryBudget {
    ratio: f64,
    reserve: f64,
    origin: Instant,
    requests: SecondRing,
    retries: SecondRing,
    /// Serializes withdrawals, so concurrent retries cannot both take the last unit.
    withdrawing: Mutex<()>,
}

impl RetryBudget {
    /// A budget as `config` sets it, starting now.
    pub fn new(config: &RetrySection) -> Self {
        Self::starting_at(config, Instant::now())
    }

    fn starting_at(config: &RetrySection, origin: Instant) -> Self {
        let seconds = config.budget_window_secs.max(1);
        Self {
            ratio: config.budget_ratio,
            reserve: config.budget_min_per_sec * seconds as f64,
            origin,
            requests: SecondRing::new(seconds),
            retries: SecondRing::new(seconds),
            withdrawing: Mutex::new(()),
        }
    }

    /// Counts one request (its first attempt), received at `now`.
    pub fn deposit_at(&self, now: Instant) {
        self.requests.add(self.second(now));
    }

    /// Takes one retry from the budget; false when it is spent.
    pub fn withdraw(&self) -> bool {
        self.withdraw_at(Instant::now())
    }

    fn withdraw_at(&self, now: Instant) -> bool {
        let second = self.second(now);
        let _one_at_a_time = self.withdrawing.lock();
        let requests = self.requests.sum(second) as f64;
        let retries = self.retries.sum(second) as f64;
        if retries + 1.0 <= self.ratio * requests + self.reserve {
            self.retries.add(second);
            true
        } else {
            false
        }
    }

    /// Whole seconds since the budget started (the ring's clock).
    fn second(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.origin).as_secs()
    }
}

/// Counts per second over the last `len` seconds: slot `s % len` holds second `s`'s count
/// and is reset when a later second claims it.
#[derive(Debug)]
struct SecondRing {
    counts: Box<[AtomicU64]>,
    seconds: Box<[AtomicU64]>,
}

impl SecondRing {
    fn new(len: u64) -> Self {
        let slots = || (0..len).map(|_| AtomicU64::new(0)).collect();
        Self { counts: slots(), seconds: slots() }
    }

    fn slot(&self, second: u64) -> usize {
        (second % self.counts.len() as u64) as usize
    }

    fn add(&self, second: u64) {
        let slot = self.slot(second);
        let held = self.seconds[slot].load(Ordering::Acquire);
        if held != second
            && self.seconds[slot]
                .compare_exchange(held, second, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            // This thread claimed the slot for the new second. An add racing with the reset
            // may be lost; a budget can afford that.
            self.counts[slot].store(0, Ordering::Release);
        }
        self.counts[slot].fetch_add(1, Ordering::AcqRel);
    }

    /// The total of the seconds within the window ending at `second`.
    fn sum(&self, second: u64) -> u64 {
        let window = self.counts.len() as u64;
        (0..self.counts.len())
            .filter(|&slot| {
                let held = self.seconds[slot].load(Ordering::Acquire);
                held <= second && second - held < window
            })
            .map(|slot| self.counts[slot].load(Ordering::Acquire))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(ratio: f64, min_per_sec: f64) -> RetrySection {
        RetrySection {
            budget_ratio: ratio,
            budget_min_per_sec: min_per_sec,
            budget_window_secs: 10,
            ..RetrySection::default()
        }
    }

    #[test]
    fn retries_are_a_fraction_of_requests_plus_the_reserve() {
        let start = Instant::now();
        let budget = RetryBudget::starting_at(&config(0.2, 0.0), start);
        for _ in 0..100 {
            budget.deposit_at(start);
        }
        let granted = (0..100).filter(|_| budget.withdraw_at(start)).count();
        assert_eq!(granted, 20);

        let budget = RetryBudget::starting_at(&config(0.2, 1.0), start);
        for _ in 0..100 {
            budget.deposit_at(start);
        }
        // 20 from the ratio and 10 from one retry a second over a ten-second window.
        let granted = (0..100).filter(|_| budget.withdraw_at(start)).count();
        assert_eq!(granted, 30);
    }

    #[test]
    fn a_quiet_router_still_gets_its_reserve_and_no_more() {
        let start = Instant::now();
        let budget = RetryBudget::starting_at(&config(0.2, 0.5), start);
        let granted = (0..20).filter(|_| budget.withdraw_at(start)).count();
        assert_eq!(granted, 5);
    }

    #[test]
    fn the_window_slides_by_the_second_and_remembers_quiet_traffic() {
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let budget = RetryBudget::starting_at(&config(0.5, 0.0), start);
        // Ten requests a second for nine seconds, no failure at all.
        for second in 0..9 {
            for _ in 0..10 {
                budget.deposit_at(at(second));
            }
        }
        // The first withdrawal after a quiet stretch sees all of that traffic: 45 retries.
        assert_eq!((0..100).filter(|_| budget.withdraw_at(at(9))).count(), 45);
        assert!(!budget.withdraw_at(at(9)));
        // Seconds leave the window one by one (window of 10 s): at 10 s second 0 is gone
        // (10 requests, 5 retries' worth), so nothing is granted yet; the spent retries are
        // still inside the window.
        assert!(!budget.withdraw_at(at(10)));
        // Once the retries of second 9 leave the window, the budget is back.
        for _ in 0..10 {
            budget.deposit_at(at(19));
        }
        assert_eq!((0..100).filter(|_| budget.withdraw_at(at(19))).count(), 5);
        // Long after, everything old is forgotten: only new requests count.
        assert!(!budget.withdraw_at(at(100)));
        budget.deposit_at(at(100));
        budget.deposit_at(at(100));
        assert!(budget.withdraw_at(at(100)));
    }

    #[test]
    fn backoff_doubles_with_jitter() {
        let config = RetrySection { backoff_ms: 100, ..RetrySection::default() };
        for retry in 1..=3 {
            let base = Duration::from_millis(100 << (retry - 1));
            let delay = backoff(&config, retry);
            assert!(delay >= base && delay <= base.mul_f64(1.5), "{retry}: {delay:?}");
        }
    }

    #[test]
    fn settings_out_of_range_are_named() {
        let bad = RetrySection {
            budget_ratio: 2.0,
            budget_min_per_sec: -1.0,
            budget_window_secs: 0,
            max_retries: 11,
            backoff_ms: 60_001,
            backoff_multiplier: 0.5,
            max_backoff_ms: 60_001,
            jitter_factor: 1.5,
            on_status: vec![429, 401, 200],
            max_retry_after_secs: 3601,
        };
        let fields: Vec<_> = bad.problems().into_iter().map(|(field, _)| field).collect();
        assert_eq!(
            fields,
            [
                "budget_ratio",
                "budget_min_per_sec",
                "budget_window_secs",
                "max_retries",
                "backoff_ms",
                "backoff_multiplier",
                "max_backoff_ms",
                "jitter_factor",
                "on_status",
                "max_retry_after_secs"
            ]
        );
        assert!(RetrySection::default().problems().is_empty());
    }

    #[test]
    fn backoff_starts_at_its_base_grows_by_its_multiplier_and_stops_at_its_cap() {
        let config = RetrySection { backoff_ms: 10, ..RetrySection::default() };
        let within = |retry: u32, base_ms: u64| {
            let (base, delay) = (Duration::from_millis(base_ms), backoff(&config, retry));
            assert!(delay >= base && delay <= base.mul_f64(1.5), "{retry}: {delay:?}");
        };
        within(0, 10);
        within(1, 10);
        within(3, 40);
        within(11, 10_000);
        within(40, 10_000);
        let off = RetrySection { backoff_ms: 0, ..RetrySection::default() };
        assert_eq!(backoff(&off, 3), Duration::ZERO);
        // (multiplier, cap, jitter factor, retry, draw, expected ms)
        for (multiplier, cap, jitter, retry, unit, expected) in [
            (1.0, 10_000, 0.0, 5, 0.9, 100),
            (3.0, 10_000, 0.0, 3, 0.9, 900),
            (3.0, 500, 0.0, 3, 0.9, 500),
            (2.0, 10_000, 0.2, 2, 0.5, 220),
            (2.0, 10_000, 1.0, 1, 0.5, 150),
        ] {
            let config = RetrySection {
                backoff_ms: 100,
                backoff_multiplier: multiplier,
                max_backoff_ms: cap,
                jitter_factor: jitter,
                ..RetrySection::default()
            };
            let delay = backoff_with(&config, retry, unit);
            assert_eq!(delay, Duration::from_millis(expected), "{multiplier} {cap} {jitter}");
        }
    }

    #[test]
    fn numbers_that_are_not_numbers_are_named_too() {
        let fields = |section: RetrySection| -> Vec<&str> {
            section.problems().into_iter().map(|(field, _)| field).collect()
        };
        let nan = RetrySection { budget_ratio: f64::NAN, ..RetrySection::default() };
        assert_eq!(fields(nan), ["budget_ratio"]);
        let infinite =
            RetrySection { budget_min_per_sec: f64::INFINITY, ..RetrySection::default() };
        assert_eq!(fields(infinite), ["budget_min_per_sec"]);
        let long = RetrySection { budget_window_secs: 3601, ..RetrySection::default() };
        assert_eq!(fields(long), ["budget_window_secs"]);
        let shrinking = RetrySection { backoff_multiplier: 0.5, ..RetrySection::default() };
        assert_eq!(fields(shrinking), ["backoff_multiplier"]);
        let wild = RetrySection { jitter_factor: f64::NAN, ..RetrySection::default() };
        assert_eq!(fields(wild), ["jitter_factor"]);
        let far = RetrySection { max_backoff_ms: 60_001, ..RetrySection::default() };
        assert_eq!(fields(far), ["max_backoff_ms"]);
        let edges = RetrySection {
            budget_ratio: 1.0,
            budget_min_per_sec: 0.0,
            budget_window_secs: 3600,
            max_retries: 10,
            backoff_ms: 60_000,
            backoff_multiplier: 10.0,
            max_backoff_ms: 60_000,
            jitter_factor: 1.0,
            on_status: vec![408, 429, 500, 599],
            max_retry_after_secs: 3600,
        };
        assert!(edges.problems().is_empty(), "{:?}", edges.problems());
    }

    #[test]
    fn concurrent_withdrawals_never_take_more_than_the_budget() {
        // No requests and a reserve of one a second over ten seconds: ten retries in all.
        let start = Instant::now();
        let budget = RetryBudget::starting_at(&config(0.2, 1.0), start);
        let granted = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..8 {
                scope.spawn(|| {
                    for _ in 0..50 {
                        if budget.withdraw_at(start) {
                            granted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(granted.into_inner(), 10);
    }
}
