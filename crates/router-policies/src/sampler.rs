//! Randomness for the sampling policies: the thread-local generator in production, a seeded
//! generator for reproducible tests and simulations, or a generator seeded from the request
//! itself (`tie_break: request`), so that router replicas break one request's ties alike.

use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

use crate::rendezvous::{FNV_OFFSET, fnv1a};
use crate::{PickRequest, TieBreak};

/// Where a policy draws its random numbers from.
#[derive(Debug, Default)]
pub(crate) enum Sampler {
    /// `rand::rng()`: thread-local, no contention between picks.
    #[default]
    Thread,
    /// One seeded generator shared by every pick of the policy instance (a lock per pick).
    Seeded(Mutex<SmallRng>),
    /// A fresh generator per pick, seeded with [`request_seed`]: every replica running the
    /// same router build draws the same numbers for the same request. Only
    /// [`Sampler::with_request`] reads the request; [`Sampler::with`] draws from the thread.
    ByRequest,
}

impl Sampler {
    /// A reproducible sampler.
    pub(crate) fn seeded(seed: u64) -> Self {
        Sampler::Seeded(Mutex::new(SmallRng::seed_from_u64(seed)))
    }

    /// The sampler `tie_break` asks for.
    pub(crate) fn for_tie_break(tie_break: TieBreak) -> Self {
        match tie_break {
            TieBreak::Sampled => Sampler::Thread,
            TieBreak::Request => Sampler::ByRequest,
        }
    }

    /// Runs `f` with the generator.
    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut dyn RngCore) -> T) -> T {
        match self {
            Sampler::Thread | Sampler::ByRequest => f(&mut rand::rng()),
            Sampler::Seeded(rng) => f(&mut *rng.lock()),
        }
    }

    /// Runs `f` with the generator for a pick of `request`: seeded from the request with
    /// [`Sampler::ByRequest`], as [`Sampler::with`] otherwise.
    pub(crate) fn with_request<T>(
        &self,
        request: &PickRequest<'_>,
        f: impl FnOnce(&mut dyn RngCore) -> T,
    ) -> T {
        match self {
            Sampler::ByRequest => f(&mut SmallRng::seed_from_u64(request_seed(request))),
            _ => self.with(f),
        }
    }
}

/// How many leading prompt tokens seed a keyless request's draws (enough to tell prompts
/// apart, bounded so that seeding stays cheap for long prompts).
const SEED_TOKENS: usize = 512;

/// The seed of `request`'s draws under `tie_break: request`: 64-bit FNV-1a (the function of
/// [`crate::rendezvous_weight`], without its finalizer) over a tag byte and the session key;
/// without one the routing key; without one the first 512 prompt token ids (little-endian
/// `u32`s); without tokens the input length. Then one splitmix64 round. Stable across
/// processes: no seed and no process state.
pub(crate) fn request_seed(request: &PickRequest<'_>) -> u64 {
    let mut hash = FNV_OFFSET;
    if let Some(key) = request.session_key.filter(|k| !k.is_empty()) {
        hash = fnv1a(fnv1a(hash, b"s"), key.as_bytes());
    } else if let Some(key) = request.routing_key.filter(|k| !k.is_empty()) {
        hash = fnv1a(fnv1a(hash, b"r"), key.as_bytes());
    } else if let Some(tokens) = request.tokens {
        hash = fnv1a(hash, b"t");
        for token in tokens.ids().iter().take(SEED_TOKENS) {
            hash = fnv1a(hash, &token.to_le_bytes());
        }
    } else {
        hash = fnv1a(fnv1a(hash, b"n"), &request.input_tokens.to_le_bytes());
    }
    let mut z = hash.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
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
    fn request_samplers_repeat_per_request() {
        let model = router_workers::ModelId::new("m");
        let request = |session: Option<&'static str>, input_tokens: u64| PickRequest {
            model: &model,
            stage: router_workers::Stage::Plain,
            bucket: "b",
            input_tokens,
            expected_peak_tokens: None,
            tokens: None,
            session_key: session,
            routing_key: None,
        };
        let draw = |r: &PickRequest<'_>| Sampler::ByRequest.with_request(r, |rng| rng.next_u64());
        assert_eq!(draw(&request(Some("a"), 1)), draw(&request(Some("a"), 9)));
        assert_ne!(draw(&request(Some("a"), 1)), draw(&request(Some("b"), 1)));
        assert_eq!(draw(&request(None, 7)), draw(&request(None, 7)));
        assert_ne!(draw(&request(None, 7)), draw(&request(None, 8)));
        let tokens = crate::RequestTokens::new(vec![1, 2, 3]);
        let mut with_tokens = request(None, 3);
        with_tokens.tokens = Some(&tokens);
        let other = crate::RequestTokens::new(vec![1, 2, 4]);
        let mut with_other = request(None, 3);
        with_other.tokens = Some(&other);
        assert_ne!(request_seed(&with_tokens), request_seed(&with_other));
    }

    #[test]
    fn seeded_samplers_repeat() {
        let draw = |s: &Sampler| s.with(|rng| rng.next_u64());
        assert_eq!(draw(&Sampler::seeded(3)), draw(&Sampler::seeded(3)));
        assert_ne!(draw(&Sampler::seeded(3)), draw(&Sampler::seeded(4)));
    }
}
