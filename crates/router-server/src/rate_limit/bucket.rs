//! The token bucket behind the per-key rate limits: it holds at most `capacity` tokens, refills
//! at `rate` tokens per second, and a request that costs more than it holds is told how long
//! until it would not. Time is passed in, so the arithmetic is tested without a clock.

use std::time::Instant;

/// A token bucket, full when made.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    /// Tokens added per second.
    rate: f64,
    /// Most tokens held.
    capacity: f64,
    /// Tokens held at `updated`.
    level: f64,
    updated: Instant,
}

/// Why a bucket did not give what was asked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Shortfall {
    /// Enough tokens will be back after this many whole seconds (at least 1).
    Wait {
        /// Seconds until the bucket holds the cost, rounded up.
        secs: u64,
    },
    /// The cost is more than the bucket ever holds: waiting never helps.
    Oversized {
        /// The bucket's capacity.
        capacity: f64,
    },
}

impl TokenBucket {
    /// A full bucket of `capacity` refilling at `rate` per second, as of `now`.
    pub(crate) fn full(rate: f64, capacity: f64, now: Instant) -> Self {
        Self { rate, capacity, level: capacity, updated: now }
    }

    /// The tokens held at `now`.
    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.level = (self.level + elapsed * self.rate).min(self.capacity);
        self.updated = self.updated.max(now);
    }

    /// Whether `cost` tokens are there at `now`, without taking them.
    pub(crate) fn check(&mut self, cost: f64, now: Instant) -> Result<(), Shortfall> {
        if cost > self.capacity {
            return Err(Shortfall::Oversized { capacity: self.capacity });
        }
        self.refill(now);
        if self.level >= cost {
            return Ok(());
        }
        let wait = (cost - self.level) / self.rate;
        // A float cast saturates; a wait of years is still a number a client can read.
        Err(Shortfall::Wait { secs: (wait.ceil() as u64).max(1) })
    }

    /// Takes `cost` tokens at `now`, or says why not (taking none).
    pub(crate) fn take(&mut self, cost: f64, now: Instant) -> Result<(), Shortfall> {
        self.check(cost, now)?;
        self.level -= cost;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// One step: at `at_ms` after the start, take `cost`.
    type Step = (u64, f64, Result<(), Shortfall>);

    #[test]
    fn a_bucket_gives_its_burst_then_refills_at_its_rate() {
        let wait = |secs| Err(Shortfall::Wait { secs });
        #[rustfmt::skip]
        let cases: &[(&str, f64, f64, &[Step])] = &[
            ("a burst of 1: the second request at once waits 1 s", 1.0, 1.0, &[
                (0, 1.0, Ok(())), (0, 1.0, wait(1)), (999, 1.0, wait(1)), (1000, 1.0, Ok(())),
            ]),
            ("a burst of 3 at 1/s: three at once, then one a second", 1.0, 3.0, &[
                (0, 1.0, Ok(())), (0, 1.0, Ok(())), (0, 1.0, Ok(())), (0, 1.0, wait(1)),
                (1000, 1.0, Ok(())), (1000, 1.0, wait(1)),
            ]),
            ("a refill never exceeds the capacity", 10.0, 2.0, &[
                (0, 2.0, Ok(())), (60_000, 2.0, Ok(())), (60_000, 1.0, wait(1)),
            ]),
            ("a slow rate rounds the wait up to whole seconds", 0.5, 1.0, &[
                (0, 1.0, Ok(())), (0, 1.0, wait(2)), (1500, 1.0, wait(1)), (2000, 1.0, Ok(())),
            ]),
            ("a partial refill counts: 250 of 1000 back after a quarter second", 1000.0, 1000.0, &[
                (0, 1000.0, Ok(())), (250, 300.0, wait(1)), (250, 250.0, Ok(())),
            ]),
            ("tokens: a large cost waits for the whole shortfall", 100.0, 1000.0, &[
                (0, 800.0, Ok(())), (0, 900.0, wait(7)), (7000, 900.0, Ok(())),
            ]),
            ("a refused request takes nothing", 1.0, 2.0, &[
                (0, 1.5, Ok(())), (0, 1.0, wait(1)), (0, 0.5, Ok(())),
            ]),
            ("a cost above the capacity is oversized, never a wait", 10.0, 100.0, &[
                (0, 101.0, Err(Shortfall::Oversized { capacity: 100.0 })),
                (0, 100.0, Ok(())),
                (0, 101.0, Err(Shortfall::Oversized { capacity: 100.0 })),
            ]),
        ];
        for (name, rate, capacity, steps) in cases {
            let start = Instant::now();
            let mut bucket = TokenBucket::full(*rate, *capacity, start);
            for (i, (at_ms, cost, expected)) in steps.iter().enumerate() {
                let now = start + Duration::from_millis(*at_ms);
                assert_eq!(bucket.take(*cost, now), *expected, "{name}, step {i}");
            }
        }
    }

    #[test]
    fn check_reports_without_taking() {
        let start = Instant::now();
        let mut bucket = TokenBucket::full(1.0, 1.0, start);
        assert_eq!(bucket.check(1.0, start), Ok(()));
        assert_eq!(bucket.check(1.0, start), Ok(()), "a check takes nothing");
        assert_eq!(bucket.take(1.0, start), Ok(()));
        assert_eq!(bucket.check(1.0, start), Err(Shortfall::Wait { secs: 1 }));
    }

    #[test]
    fn an_earlier_instant_than_the_last_does_not_drain_or_rewind_the_bucket() {
        let start = Instant::now();
        let later = start + Duration::from_secs(5);
        let mut bucket = TokenBucket::full(1.0, 2.0, start);
        assert_eq!(bucket.take(2.0, later), Ok(()));
        // Two threads may read the clock in one order and lock in the other.
        assert_eq!(bucket.take(1.0, start), Err(Shortfall::Wait { secs: 1 }));
        assert_eq!(bucket.take(1.0, later + Duration::from_secs(1)), Ok(()));
    }
}
