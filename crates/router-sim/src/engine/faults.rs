//! Fault injection: answer a fraction of requests with 500 (or another status, with a
//! `Retry-After`), stall before the first byte or
//! between the head and the body, die after N answered requests, stop publishing KV events
//! (handled by the publisher).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;

/// The fault flags.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Faults {
    /// Fraction of generation requests (chat, completions, `/generate`) answered with HTTP
    /// 500, in `[0, 1]`.
    pub fail_rate: f64,
    /// The status of those answers; `None`: 500.
    pub fail_status: Option<u16>,
    /// A `Retry-After` (seconds) on those answers.
    pub fail_retry_after: Option<u64>,
    /// Delay before anything is sent back for a generation request.
    pub stall: Duration,
    /// Delay between a generation answer's head and its body (a stalled engine, as the router
    /// sees it once the head has arrived).
    pub stall_body: Duration,
    /// Exit once this many generation requests have been answered.
    pub die_after: Option<u64>,
    /// Bind the KV-event sockets but never publish (nor retain for replay).
    pub no_kv_events: bool,
    /// Report no cumulative prefill counters (zeros), as no released engine does: the router
    /// then has no reported prefill rate and must learn one.
    pub no_prefill_counters: bool,
}

/// Live fault state of a running engine.
#[derive(Debug)]
pub(crate) struct FaultState {
    faults: Faults,
    rng: Mutex<StdRng>,
    answered: AtomicU64,
    /// Fired when the `die_after`-th request has been answered.
    dying: CancellationToken,
}

impl FaultState {
    pub(crate) fn new(faults: Faults, seed: u64) -> Self {
        Self {
            faults,
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            answered: AtomicU64::new(0),
            dying: CancellationToken::new(),
        }
    }

    /// Whether load reports leave the prefill counters out.
    pub(crate) fn hides_prefill_counters(&self) -> bool {
        self.faults.no_prefill_counters
    }

    /// Draws whether this request fails.
    pub(crate) fn roll_failure(&self) -> bool {
        self.faults.fail_rate > 0.0 && self.rng.lock().random::<f64>() < self.faults.fail_rate
    }

    /// The status of an injected failure, and its `Retry-After`.
    pub(crate) fn failure(&self) -> (u16, Option<u64>) {
        (self.faults.fail_status.unwrap_or(500), self.faults.fail_retry_after)
    }

    pub(crate) fn stall(&self) -> Duration {
        self.faults.stall
    }

    pub(crate) fn stall_body(&self) -> Duration {
        self.faults.stall_body
    }

    /// Counts an answered generation request (a batch is one); the `die_after`-th one starts
    /// the engine's death.
    pub(crate) fn answered(&self) {
        let answered = self.answered.fetch_add(1, Ordering::SeqCst) + 1;
        if self.faults.die_after.is_some_and(|limit| answered >= limit) {
            self.dying.cancel();
        }
    }

    /// Fired once the engine is about to die; new requests are not served any more.
    pub(crate) fn dying(&self) -> &CancellationToken {
        &self.dying
    }

    pub(crate) fn answered_count(&self) -> u64 {
        self.answered.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fail_rate_is_respected_and_seeded() {
        let never = FaultState::new(Faults::default(), 1);
        assert!((0..1000).all(|_| !never.roll_failure()));
        let always = FaultState::new(Faults { fail_rate: 1.0, ..Faults::default() }, 1);
        assert!((0..1000).all(|_| always.roll_failure()));
        let half = |seed| {
            let state = FaultState::new(Faults { fail_rate: 0.5, ..Faults::default() }, seed);
            (0..2000).filter(|_| state.roll_failure()).count()
        };
        assert_eq!(half(7), half(7), "same seed, same draws");
        assert!((800..1200).contains(&half(7)));
    }

    #[test]
    fn dying_fires_at_the_limit() {
        let state = FaultState::new(Faults { die_after: Some(2), ..Faults::default() }, 0);
        state.answered();
        assert!(!state.dying().is_cancelled());
        state.answered();
        assert!(state.dying().is_cancelled());
        assert_eq!(state.answered_count(), 2);
    }
}
