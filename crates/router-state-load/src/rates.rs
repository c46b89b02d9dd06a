//! [`PrefillRates`]: each engine's prefill rate, learned from what the router observes, for
//! engines that report none (no released engine does).
//!
//! A sample is one request: the prefill work the router predicted in front of its first token
//! on that engine (the work queued there plus its own uncached tokens) and the time from
//! dispatch to its first token. The time also holds a fixed part (the HTTP exchange, the
//! engine's scheduling, the first decode step), so the rate is the slope of time against
//! work, not their ratio: the Theil–Sen estimator over the engine's last [`WINDOW`] samples,
//! the median of the slopes of every pair of samples whose work differs by at least
//! [`MIN_SPREAD`] tokens. Medians make it indifferent to the odd sample that waited behind
//! something the router did not know of; the window makes it follow an engine that slows down
//! or speeds up, within half a window. A slope is trusted only when three quarters of the
//! pairs' slopes are positive: where timing noise swamps the spread of work, it is no rate. Until there are [`MIN_PAIRS`] such pairs (a workload of
//! same-sized prompts), the rate is the median ratio of work to time over samples of at least
//! [`MIN_RATIO_WORK`] tokens, where the fixed part matters least; until then, none.
//!
//! A rate that is not positive and finite is never given. An engine that restarted or left is
//! forgotten ([`PrefillRates::forget`]).

use std::collections::VecDeque;
use std::time::Duration;

use parking_lot::Mutex;
use router_workers::WorkerId;

/// Samples kept per engine.
pub(crate) const WINDOW: usize = 48;
/// Pairs of distinct work a slope needs before it is trusted.
pub(crate) const MIN_PAIRS: usize = 12;
/// Work two samples must differ by, in tokens, for their slope to count.
pub(crate) const MIN_SPREAD: u64 = 64;
/// Smallest work a ratio sample may have, in tokens.
pub(crate) const MIN_RATIO_WORK: u64 = 512;
/// Samples between two fits once the window is full.
const REFIT_EVERY: usize = 4;
/// Ratio samples needed before the ratio estimate is given.
const MIN_RATIO_SAMPLES: usize = 4;

/// One observed request.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Sample {
    work: u64,
    seconds: f64,
}

/// One engine's recent samples and the rate they give.
#[derive(Debug, Default)]
struct Learner {
    samples: VecDeque<Sample>,
    /// Samples since the rate was last computed.
    unread: usize,
    rate: Option<f64>,
}

impl Learner {
    /// Adds a sample; the rate is computed afresh while the window fills and then every
    /// [`REFIT_EVERY`] samples (a fit sorts about a thousand slopes).
    fn observe(&mut self, sample: Sample) {
        if self.samples.len() == WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
        self.unread += 1;
        if self.samples.len() < WINDOW || self.unread >= REFIT_EVERY {
            self.unread = 0;
            self.rate = self.slope_rate().or_else(|| self.ratio_rate());
        }
    }

    /// Tokens per second from the median slope of time against work.
    fn slope_rate(&self) -> Option<f64> {
        let samples: Vec<Sample> = self.samples.iter().copied().collect();
        let mut slopes = Vec::with_capacity(samples.len() * samples.len() / 2);
        for (i, a) in samples.iter().enumerate() {
            for b in &samples[i + 1..] {
                if a.work.abs_diff(b.work) >= MIN_SPREAD {
                    slopes.push((b.seconds - a.seconds) / (b.work as f64 - a.work as f64));
                }
            }
        }
        if slopes.len() < MIN_PAIRS {
            return None;
        }
        let rate = positive(1.0 / median(&mut slopes)?)?;
        // Sorted by `median`. The slopes must agree that time grows with work: when a quarter
        // or more fall at or below zero, timing noise is as large as what the spread of work
        // explains, and their median says nothing (on real engines it said up to 750k
        // tokens/s of requests that differed by a hundred tokens and a few ms of jitter).
        (slopes[slopes.len() / 4] > 0.0).then_some(rate)
    }

    /// Tokens per second from the median ratio of large samples.
    fn ratio_rate(&self) -> Option<f64> {
        let mut ratios: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| s.work >= MIN_RATIO_WORK)
            .map(|s| s.work as f64 / s.seconds)
            .collect();
        if ratios.len() < MIN_RATIO_SAMPLES {
            return None;
        }
        positive(median(&mut ratios)?)
    }
}

fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    Some(if values.len() % 2 == 1 {
        values[middle]
    } else {
        (values[middle - 1] + values[middle]) / 2.0
    })
}

fn positive(rate: f64) -> Option<f64> {
    (rate.is_finite() && rate > 0.0).then_some(rate)
}

/// Every engine's learned prefill rate.
#[derive(Debug, Default)]
pub struct PrefillRates {
    engines: Mutex<hashbrown::HashMap<WorkerId, Learner>>,
}

impl PrefillRates {
    /// An empty set: no engine has a rate.
    pub fn new() -> Self {
        Self::default()
    }

    /// One request on `worker`: `work` prefill tokens stood before its first token, which came
    /// `ttft` after dispatch. A sample without work or time says nothing and is dropped.
    pub fn observe(&self, worker: &WorkerId, work: u64, ttft: Duration) {
        let seconds = ttft.as_secs_f64();
        if work == 0 || seconds <= 0.0 {
            return;
        }
        let mut engines = self.engines.lock();
        let learner = match engines.get_mut(worker) {
            Some(learner) => learner,
            None => engines.entry(worker.clone()).or_default(),
        };
        learner.observe(Sample { work, seconds });
        tracing::trace!(worker = %worker, work, ttft_ms = seconds * 1e3, rate = ?learner.rate, "prefill rate sample");
    }

    /// `worker`'s learned rate in tokens per second, once its samples give one.
    pub fn rate(&self, worker: &WorkerId) -> Option<f64> {
        self.engines.lock().get(worker).and_then(|learner| learner.rate)
    }

    /// Forgets what `worker` taught (it restarted, or left).
    pub fn forget(&self, worker: &WorkerId) {
        self.engines.lock().remove(worker);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn worker() -> WorkerId {
        WorkerId::new("e1").expect("id")
    }

    /// A request of `work` tokens on an engine prefilling `rate` tokens a second, with
    /// `overhead` seconds of everything else.
    fn ttft(work: u64, rate: f64, overhead: f64) -> Duration {
        Duration::from_secs_f64(overhead + work as f64 / rate)
    }

    fn close(rate: Option<f64>, want: f64) -> bool {
        rate.is_some_and(|r| (r - want).abs() / want < 0.02)
    }

    #[test]
    fn converges_on_the_slope_whatever_the_fixed_overhead() {
        let rates = PrefillRates::new();
        assert_eq!(rates.rate(&worker()), None, "nothing learned yet");
        for i in 0..WINDOW as u64 {
            let work = 100 + (i * 397) % 3000;
            rates.observe(&worker(), work, ttft(work, 15_000.0, 0.040));
        }
        assert!(close(rates.rate(&worker()), 15_000.0), "{:?}", rates.rate(&worker()));
    }

    #[test]
    fn ignores_outliers() {
        let rates = PrefillRates::new();
        for i in 0..WINDOW as u64 {
            let work = 200 + (i * 211) % 2500;
            // One request in six waited behind work nobody told the router of.
            let extra = if i % 6 == 0 { 0.8 } else { 0.0 };
            rates.observe(&worker(), work, ttft(work, 8_000.0, 0.020 + extra));
        }
        assert!(close(rates.rate(&worker()), 8_000.0), "{:?}", rates.rate(&worker()));
    }

    #[test]
    fn follows_an_engine_that_slows_down() {
        let rates = PrefillRates::new();
        let mut i = 0u64;
        let mut feed = |rate: f64, n: usize| {
            for _ in 0..n {
                let work = 128 + (i * 331) % 2000;
                rates.observe(&worker(), work, ttft(work, rate, 0.030));
                i += 1;
            }
        };
        feed(20_000.0, WINDOW);
        assert!(close(rates.rate(&worker()), 20_000.0));
        feed(5_000.0, WINDOW * 2 / 3);
        assert!(close(rates.rate(&worker()), 5_000.0), "{:?}", rates.rate(&worker()));
    }

    #[test]
    fn same_sized_prompts_are_read_as_a_ratio_of_large_work_only() {
        let rates = PrefillRates::new();
        for _ in 0..10 {
            rates.observe(&worker(), 64, ttft(64, 10_000.0, 0.030));
        }
        assert_eq!(rates.rate(&worker()), None, "small equal prompts teach nothing");
        let other = WorkerId::new("e2").expect("id");
        for _ in 0..4 {
            rates.observe(&other, 4000, ttft(4000, 10_000.0, 0.030));
        }
        // 4000 tokens in 0.43 s: the fixed part makes the ratio a little low.
        let rate = rates.rate(&other).expect("a ratio");
        assert!((9_000.0..10_000.0).contains(&rate), "{rate}");
        // Both sizes: the slope, exact.
        for _ in 0..4 {
            rates.observe(&worker(), 4000, ttft(4000, 10_000.0, 0.030));
        }
        assert!(close(rates.rate(&worker()), 10_000.0), "{:?}", rates.rate(&worker()));
        rates.forget(&worker());
        assert_eq!(rates.rate(&worker()), None);
    }

    /// Uniform jitter in [-6, 6) ms from a fixed sequence (xorshift).
    fn jitter(state: &mut u64) -> f64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        (*state % 12_000) as f64 / 1e6 - 0.006
    }

    #[test]
    fn work_too_alike_for_the_timing_noise_gives_no_rate() {
        let rates = PrefillRates::new();
        let mut state = 0x9e37_79b9_7f4a_7c15;
        // Prompts of 60 to 140 uncached tokens on a 30k tokens/s engine with a few ms of
        // jitter: the spread of work explains less of the times than the jitter does.
        for i in 0..WINDOW as u64 {
            let work = 60 + (i * 37) % 80;
            rates.observe(&worker(), work, ttft(work, 30_000.0, 0.015 + jitter(&mut state)));
        }
        assert_eq!(rates.rate(&worker()), None, "a rate out of noise");
        // Spread enough, the same jitter no longer hides the slope.
        for i in 0..WINDOW as u64 {
            let work = 60 + (i * 397) % 3000;
            rates.observe(&worker(), work, ttft(work, 30_000.0, 0.015 + jitter(&mut state)));
        }
        let rate = rates.rate(&worker()).expect("a rate");
        assert!((24_000.0..36_000.0).contains(&rate), "{rate}");
    }

    proptest! {
        /// Whatever it is fed, a rate is positive and finite, or absent.
        #[test]
        fn a_rate_is_positive_and_finite_or_absent(
            samples in proptest::collection::vec((0u64..100_000, 0u64..10_000_000), 0..100)
        ) {
            let rates = PrefillRates::new();
            for (work, micros) in samples {
                rates.observe(&worker(), work, Duration::from_micros(micros));
                if let Some(rate) = rates.rate(&worker()) {
                    prop_assert!(rate.is_finite() && rate > 0.0);
                }
            }
        }
    }
}
