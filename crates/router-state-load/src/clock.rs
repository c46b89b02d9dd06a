//! The time source of the load table and the in-flight ledger, injected so tests control it.
//!
//! Freshness is judged on the router's receipt time and dispatches are stamped with the same
//! clock, so the table and [`crate::Inflight`] must share one [`Clock`]. Engine clocks are never
//! read through it: engine timestamps are only compared with each other.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A monotonic time source.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current instant.
    fn now(&self) -> Instant;
}

/// The process's monotonic clock ([`Instant::now`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

impl SystemClock {
    /// The system clock as a shareable handle.
    pub fn shared() -> Arc<dyn Clock> {
        Arc::new(SystemClock)
    }
}

/// A clock that moves only when told to; for tests and simulations.
#[derive(Debug)]
pub struct ManualClock {
    base: Instant,
    offset_nanos: AtomicU64,
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl ManualClock {
    /// A clock standing at the current real instant.
    pub fn new() -> Self {
        Self { base: Instant::now(), offset_nanos: AtomicU64::new(0) }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let nanos = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.offset_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.base + Duration::from_nanos(self.offset_nanos.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_advanced() {
        let clock = ManualClock::new();
        let t0 = clock.now();
        assert_eq!(clock.now(), t0);
        clock.advance(Duration::from_millis(1500));
        assert_eq!(clock.now() - t0, Duration::from_millis(1500));
    }
}
