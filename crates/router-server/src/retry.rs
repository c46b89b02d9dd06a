//! Retries of dispatches that failed before the engine received anything, under a budget.
//!
//! Only one failure qualifies: the engine could not be reached (connection refused, connect
//! timeout, TLS handshake failure). The request provably never started there, and the failure
//! marks the engine unhealthy, so the retry is a fresh selection (the whole bucket loop) that no
//! longer sees that engine; it is not a substitution inside the earlier pick. Nothing is
//! retried once an engine has answered, and never after a byte went to the client.
//!
//! The budget is Linkerd's: retries may add `budget_ratio` of the requests of the last
//! `budget_window_secs`, plus `budget_min_per_sec` so that a quiet router can still retry. A
//! fleet-wide outage therefore costs at most that much extra load instead of multiplying it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// `server.retry`: how dispatches to unreachable engines are retried.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Retries per request after the first attempt; 0 turns retries off.
    pub max_retries: u32,
    /// Delay before the first retry, doubled for each further one (with jitter).
    pub backoff_ms: u64,
    /// Retries may add this fraction of the recent requests.
    pub budget_ratio: f64,
    /// Retries allowed per second on top of the ratio.
    pub budget_min_per_sec: f64,
    /// What "recent" means for the budget, in seconds.
    pub budget_window_secs: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_retries: 2,
            backoff_ms: 10,
            budget_ratio: 0.2,
            budget_min_per_sec: 10.0,
            budget_window_secs: 10,
        }
    }
}

impl RetryConfig {
    /// Problems with these settings, as (field, message).
    pub fn problems(&self) -> Vec<(&'static str, &'static str)> {
        let mut problems = Vec::new();
        if !(0.0..=1.0).contains(&self.budget_ratio) {
            problems.push(("budget_ratio", "must be within [0, 1]"));
        }
        if !self.budget_min_per_sec.is_finite() || self.budget_min_per_sec < 0.0 {
            problems.push(("budget_min_per_sec", "must be a non-negative number"));
        }
        if self.budget_window_secs == 0 {
            problems.push(("budget_window_secs", "must be at least 1"));
        }
        if self.max_retries > 10 {
            problems.push(("max_retries", "must be at most 10"));
        }
        problems
    }

    /// The delay before retry number `retry` (1-based): the backoff doubled per retry, with
    /// up to 50 % jitter so that clients failed together do not come back together.
    pub fn backoff(&self, retry: u32) -> Duration {
        let base = self.backoff_ms.saturating_mul(1 << retry.saturating_sub(1).min(10));
        let jitter = rand::random::<f64>() * 0.5;
        Duration::from_millis(base).mul_f64(1.0 + jitter)
    }
}

/// The shared retry budget: deposits on every request (one atomic add), withdrawals under a
/// lock only when a retry is wanted.
#[derive(Debug)]
pub struct RetryBudget {
    ratio: f64,
    reserve: f64,
    window: Duration,
    requests: AtomicU64,
    state: Mutex<Windows>,
}

/// The current window and the one before it, whose counts fade out linearly.
#[derive(Debug)]
struct Windows {
    started: Instant,
    requests_at_start: u64,
    retries: u64,
    previous_requests: u64,
    previous_retries: u64,
}

impl RetryBudget {
    /// A budget as `config` sets it, starting now.
    pub fn new(config: &RetryConfig) -> Self {
        Self::starting_at(config, Instant::now())
    }

    fn starting_at(config: &RetryConfig, now: Instant) -> Self {
        let window = Duration::from_secs(config.budget_window_secs.max(1));
        Self {
            ratio: config.budget_ratio,
            reserve: config.budget_min_per_sec * window.as_secs_f64(),
            window,
            requests: AtomicU64::new(0),
            state: Mutex::new(Windows {
                started: now,
                requests_at_start: 0,
                retries: 0,
                previous_requests: 0,
                previous_retries: 0,
            }),
        }
    }

    /// Counts one request (its first attempt).
    pub fn deposit(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes one retry from the budget; false when it is spent.
    pub fn withdraw(&self) -> bool {
        self.withdraw_at(Instant::now())
    }

    fn withdraw_at(&self, now: Instant) -> bool {
        let mut state = self.state.lock();
        let total = self.requests.load(Ordering::Relaxed);
        let elapsed = now.saturating_duration_since(state.started);
        if elapsed >= self.window {
            let one_window_ago = elapsed < self.window * 2;
            state.previous_requests =
                if one_window_ago { total - state.requests_at_start } else { 0 };
            state.previous_retries = if one_window_ago { state.retries } else { 0 };
            state.started +=
                self.window * (elapsed.as_secs_f64() / self.window.as_secs_f64()) as u32;
            state.requests_at_start = total;
            state.retries = 0;
        }
        let into_window = now.saturating_duration_since(state.started).as_secs_f64();
        let fading = 1.0 - (into_window / self.window.as_secs_f64()).min(1.0);
        let requests =
            (total - state.requests_at_start) as f64 + state.previous_requests as f64 * fading;
        let retries = state.retries as f64 + state.previous_retries as f64 * fading;
        if retries + 1.0 <= self.ratio * requests + self.reserve {
            state.retries += 1;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(ratio: f64, min_per_sec: f64) -> RetryConfig {
        RetryConfig {
            budget_ratio: ratio,
            budget_min_per_sec: min_per_sec,
            budget_window_secs: 10,
            ..RetryConfig::default()
        }
    }

    #[test]
    fn retries_are_a_fraction_of_requests_plus_the_reserve() {
        let start = Instant::now();
        let budget = RetryBudget::starting_at(&config(0.2, 0.0), start);
        for _ in 0..100 {
            budget.deposit();
        }
        let granted = (0..100).filter(|_| budget.withdraw_at(start)).count();
        assert_eq!(granted, 20);

        let budget = RetryBudget::starting_at(&config(0.2, 1.0), start);
        for _ in 0..100 {
            budget.deposit();
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
    fn the_budget_recovers_as_old_windows_fade() {
        let start = Instant::now();
        let budget = RetryBudget::starting_at(&config(0.5, 0.0), start);
        for _ in 0..10 {
            budget.deposit();
        }
        assert_eq!((0..10).filter(|_| budget.withdraw_at(start)).count(), 5);
        // Half a window later: the same window, still spent.
        assert!(!budget.withdraw_at(start + Duration::from_secs(5)));
        // One and a half windows later the old counts weigh half: 5 x 0.5 requests, 2.5
        // retries: spent. New requests refill it.
        let later = start + Duration::from_secs(15);
        assert!(!budget.withdraw_at(later));
        for _ in 0..10 {
            budget.deposit();
        }
        assert!(budget.withdraw_at(later));
        // Long after, everything old is forgotten: only new requests count.
        let much_later = start + Duration::from_secs(100);
        assert!(!budget.withdraw_at(much_later));
        budget.deposit();
        budget.deposit();
        assert!(budget.withdraw_at(much_later));
    }

    #[test]
    fn backoff_doubles_with_jitter() {
        let config = RetryConfig { backoff_ms: 100, ..RetryConfig::default() };
        for retry in 1..=3 {
            let base = Duration::from_millis(100 << (retry - 1));
            let delay = config.backoff(retry);
            assert!(delay >= base && delay <= base.mul_f64(1.5), "{retry}: {delay:?}");
        }
    }

    #[test]
    fn settings_out_of_range_are_named() {
        let bad = RetryConfig {
            budget_ratio: 2.0,
            budget_min_per_sec: -1.0,
            budget_window_secs: 0,
            max_retries: 11,
            ..RetryConfig::default()
        };
        let fields: Vec<_> = bad.problems().into_iter().map(|(field, _)| field).collect();
        assert_eq!(
            fields,
            ["budget_ratio", "budget_min_per_sec", "budget_window_secs", "max_retries"]
        );
        assert!(RetryConfig::default().problems().is_empty());
    }
}
