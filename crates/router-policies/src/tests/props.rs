//! Properties: power-of-two samples distinct engines and always returns a candidate;
//! round-robin visits every candidate once per cycle; random is uniform; a missing report
//! never reads as an idle engine.

use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use router_workers::Stage;

use super::fixtures::{Engine, Fleet, Load, Numbers, engine};
use crate::{
    LeastLoadPolicy, PickReason, Policy, PowerOfTwoPolicy, RandomPolicy, RoundRobinPolicy,
    min_load_choices,
};

const IDS: [&str; 12] =
    ["e00", "e01", "e02", "e03", "e04", "e05", "e06", "e07", "e08", "e09", "e10", "e11"];

fn stage() -> impl Strategy<Value = Stage> {
    prop_oneof![Just(Stage::Plain), Just(Stage::Prefill), Just(Stage::Decode)]
}

fn numbers() -> impl Strategy<Value = Numbers> {
    (0u64..8, 0u64..8, 0u64..500, 0u64..1000, prop::option::of(0.0f64..100.0)).prop_map(
        |(running, waiting, uncached, used, queue_ms)| Numbers {
            running,
            waiting,
            uncached,
            used,
            capacity: 1000,
            queue_ms,
        },
    )
}

fn load() -> impl Strategy<Value = Load> {
    prop_oneof![
        Just(Load::Missing),
        numbers().prop_map(Load::Basic),
        numbers().prop_map(Load::Native),
        numbers().prop_map(Load::Native),
    ]
}

fn engines(max: usize) -> impl Strategy<Value = Vec<Engine>> {
    prop::collection::vec((load(), 0u64..4, 0u64..3), 1..=max).prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(|(i, (load, inflight, recent))| {
                engine(IDS[i], load).inflight(inflight).recent(recent)
            })
            .collect()
    })
}

/// The chi-square statistic of `counts` against a uniform expectation.
fn chi_square(counts: &[u64]) -> f64 {
    let total: u64 = counts.iter().sum();
    let expected = total as f64 / counts.len() as f64;
    counts.iter().map(|&c| (c as f64 - expected).powi(2) / expected).sum()
}

fn tally(fleet: &Fleet, policy: &dyn Policy, picks: usize) -> Vec<u64> {
    let mut counts: HashMap<String, u64> = HashMap::new();
    for _ in 0..picks {
        let pick = fleet.pick(policy, 1).expect("picked");
        *counts.entry(pick.worker.id().to_string()).or_default() += 1;
    }
    fleet.workers.iter().map(|w| counts.get(w.id().as_str()).copied().unwrap_or(0)).collect()
}

#[test]
fn random_is_uniform() {
    let engines: Vec<_> = IDS[..8].iter().map(|id| engine(id, Load::Missing)).collect();
    let fleet = Fleet::new(Stage::Plain, &engines);
    let policy = RandomPolicy::new().with_seed(0x5eed);
    let counts = tally(&fleet, &policy, 8_000);
    // 7 degrees of freedom: 24.32 is the p = 0.001 critical value.
    let chi2 = chi_square(&counts);
    assert!(chi2 < 24.32, "chi-square {chi2} for {counts:?}");
    assert!(counts.iter().all(|&c| c > 0));
}

#[test]
fn power_of_two_first_sample_is_uniform_on_complete_ties() {
    let engines: Vec<_> = IDS[..4].iter().map(|id| engine(id, Load::Missing)).collect();
    let fleet = Fleet::new(Stage::Decode, &engines);
    let policy = PowerOfTwoPolicy::new(fleet.load()).with_seed(11);
    let counts = tally(&fleet, &policy, 4_000);
    // 3 degrees of freedom: 16.27 is the p = 0.001 critical value.
    let chi2 = chi_square(&counts);
    assert!(chi2 < 16.27, "chi-square {chi2} for {counts:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Whatever the loads, power-of-two returns one of the candidates (the very `Arc`).
    #[test]
    fn power_of_two_returns_a_candidate(stage in stage(), engines in engines(12), seed: u64) {
        let fleet = Fleet::new(stage, &engines);
        let policy = PowerOfTwoPolicy::new(fleet.load()).with_seed(seed);
        for _ in 0..8 {
            let pick = fleet.pick(&policy, 64).expect("no admission, so always a pick");
            prop_assert!(fleet.workers.iter().any(|w| Arc::ptr_eq(w, &pick.worker)));
        }
    }

    /// Of two engines, the strictly less pressured one always wins: if one engine could be
    /// sampled twice, the worse one would sometimes be compared only with itself.
    #[test]
    fn power_of_two_never_samples_one_engine_twice(
        stage in stage(),
        worse in 1u64..5,
        seed: u64,
    ) {
        let fleet = Fleet::new(stage, &[
            engine("a", Load::Missing).inflight(worse),
            engine("b", Load::Missing),
        ]);
        let policy = PowerOfTwoPolicy::new(fleet.load()).with_seed(seed);
        for _ in 0..32 {
            let pick = fleet.pick(&policy, 1).expect("picked");
            prop_assert_eq!(pick.worker.id().as_str(), "b");
            prop_assert_eq!(pick.reason, PickReason::LocalPressure);
        }
    }

    /// Any `n` consecutive picks over `n` engines visit each once, wherever the cursor stands.
    #[test]
    fn round_robin_visits_every_candidate_once_per_cycle(n in 1usize..12, before in 0usize..40) {
        let engines: Vec<_> = IDS[..n].iter().map(|id| engine(id, Load::Missing)).collect();
        let fleet = Fleet::new(Stage::Prefill, &engines);
        let policy = RoundRobinPolicy::new();
        for _ in 0..before {
            fleet.pick(&policy, 1).expect("picked");
        }
        for _ in 0..2 {
            let mut cycle: Vec<String> =
                (0..n).map(|_| fleet.pick(&policy, 1).expect("picked").worker.id().to_string()).collect();
            cycle.sort();
            let all: Vec<String> = IDS[..n].iter().map(|s| (*s).to_owned()).collect();
            prop_assert_eq!(cycle, all);
        }
    }

    /// An engine without a usable report, with more requests in flight than any other, is
    /// never chosen by a load policy, however idle its (missing) report might look.
    #[test]
    fn a_missing_report_never_reads_as_idle(
        stage in stage(),
        others in engines(8),
        silent in prop_oneof![
            Just(Load::Missing),
            Just(Load::Stale(Numbers { capacity: 1000, ..Numbers::default() })),
            Just(Load::RankIncomplete(Numbers { capacity: 1000, ..Numbers::default() })),
        ],
        seed: u64,
    ) {
        let busiest = others.iter().map(|e| e.inflight + e.recent).max().unwrap_or(0);
        let mut engines = vec![engine("silent", silent).inflight(busiest + 1)];
        engines.extend(others.iter().copied());
        let fleet = Fleet::new(stage, &engines);
        let least = LeastLoadPolicy::new(fleet.load());
        let pick = fleet.pick(&least, 64).expect("picked");
        prop_assert_ne!(pick.worker.id().as_str(), "silent");
        prop_assert_eq!(pick.reason, PickReason::LeastLocalLoad);
        let two = PowerOfTwoPolicy::new(fleet.load()).with_seed(seed);
        for _ in 0..8 {
            let pick = fleet.pick(&two, 64).expect("picked");
            prop_assert_ne!(pick.worker.id().as_str(), "silent");
        }
    }

    /// Power-of-k: with `k >= n` the exact minimum; with `2 <= k < n` never the single
    /// strictly worst engine (the sample always holds a better one).
    #[test]
    fn power_of_k_bounds(n in 3usize..12, k in 2usize..14, seed: u64) {
        // Engine i has i requests in flight and no report: strictly ordered by load.
        let engines: Vec<_> = IDS[..n]
            .iter()
            .enumerate()
            .map(|(i, id)| engine(id, Load::Missing).inflight(i as u64))
            .collect();
        let fleet = Fleet::new(Stage::Plain, &engines);
        let snapshot = fleet.table.snapshot();
        let mut rng = SmallRng::seed_from_u64(seed);
        for _ in 0..8 {
            let choice = min_load_choices(&fleet.workers, Stage::Plain, k, &snapshot, &fleet.inflight, &mut rng)
                .expect("non-empty");
            prop_assert!(choice.index < n);
            prop_assert_eq!(choice.inflight, choice.index as u64);
            if k >= n {
                prop_assert_eq!(choice.index, 0);
            } else {
                prop_assert_ne!(choice.index, n - 1);
            }
        }
    }
}
