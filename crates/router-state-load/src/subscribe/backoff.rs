//! Jittered exponential backoff between reconnection attempts.

use std::time::Duration;

use rand::Rng;

/// Doubles from `min` to `max` on each failure; each delay is drawn uniformly from the upper
/// half of the current step, so engines that fail together do not retry in lockstep.
#[derive(Debug)]
pub(crate) struct Backoff {
    min: Duration,
    max: Duration,
    step: Duration,
}

impl Backoff {
    pub(crate) fn new(min: Duration, max: Duration) -> Self {
        let min = min.max(Duration::from_millis(1));
        Self { min, max: max.max(min), step: min }
    }

    /// The delay before the next attempt.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let step = self.step;
        self.step = step.saturating_mul(2).min(self.max);
        let half = step / 2;
        half + rand::rng().random_range(Duration::ZERO..=step - half)
    }

    /// Back to the shortest delay, after a connection that worked.
    pub(crate) fn reset(&mut self) {
        self.step = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_with_jitter_and_resets() {
        let (min, max) = (Duration::from_millis(100), Duration::from_millis(800));
        let mut backoff = Backoff::new(min, max);
        let steps = [100, 200, 400, 800, 800];
        for step in steps {
            let delay = backoff.next_delay();
            let step = Duration::from_millis(step);
            assert!(
                delay >= step / 2 && delay <= step,
                "{delay:?} outside [{:?}, {step:?}]",
                step / 2
            );
        }
        backoff.reset();
        assert!(backoff.next_delay() <= min);
    }
}
