//! Randomness for the sampling policies: the thread-local generator in production, or a seeded
//! generator for reproducible tests and simulations.

use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

/// Where a policy draws its random numbers from.
#[derive(Debug, Default)]
pub(crate) enum Sampler {
    /// `rand::rng()`: thread-local, no contention between picks.
    #[default]
    Thread,
    /// One seeded generator shared by every pick of the policy instance (a lock per pick).
    Seeded(Mutex<SmallRng>),
}

impl Sampler {
    /// A reproducible sampler.
    pub(crate) fn seeded(seed: u64) -> Self {
        Sampler::Seeded(Mutex::new(SmallRng::seed_from_u64(seed)))
    }

    /// Runs `f` with the generator.
    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut dyn RngCore) -> T) -> T {
        match self {
            Sampler::Thread => f(&mut rand::rng()),
            Sampler::Seeded(rng) => f(&mut *rng.lock()),
        }
    }
}

/// Two distinct indices below `n` (at least 2), drawn uniformly: every ordered pair of distinct
/// indices is equally likely, so the first is uniform too.
pub(crate) fn sample_two<R: Rng + ?Sized>(rng: &mut R, n: usize) -> (usize, usize) {
    debug_assert!(n >= 2, "sampling two of {n}");
    let first = rng.random_range(0..n);
    let mut second = rng.random_range(0..n - 1);
    if second >= first {
        second += 1;
    }
    (first, second)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn sample_two_is_distinct_and_in_range(n in 2usize..300, seed: u64) {
            let mut rng = SmallRng::seed_from_u64(seed);
            for _ in 0..16 {
                let (a, b) = sample_two(&mut rng, n);
                prop_assert!(a < n && b < n);
                prop_assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn sample_two_covers_every_ordered_pair_evenly() {
        // 3 engines: 6 ordered pairs, each expected 1/6 of the time.
        let mut rng = SmallRng::seed_from_u64(7);
        let mut counts = [[0u32; 3]; 3];
        let draws = 6_000;
        for _ in 0..draws {
            let (a, b) = sample_two(&mut rng, 3);
            counts[a][b] += 1;
        }
        let expected = f64::from(draws) / 6.0;
        let mut chi2 = 0.0;
        for (a, row) in counts.iter().enumerate() {
            for (b, &count) in row.iter().enumerate() {
                if a == b {
                    assert_eq!(count, 0);
                } else {
                    chi2 += (f64::from(count) - expected).powi(2) / expected;
                }
            }
        }
        // 5 degrees of freedom, p = 0.001.
        assert!(chi2 < 20.52, "chi-square {chi2} for {counts:?}");
    }

    #[test]
    fn seeded_samplers_repeat() {
        let draw = |s: &Sampler| s.with(|rng| rng.next_u64());
        assert_eq!(draw(&Sampler::seeded(3)), draw(&Sampler::seeded(3)));
        assert_ne!(draw(&Sampler::seeded(3)), draw(&Sampler::seeded(4)));
    }
}
