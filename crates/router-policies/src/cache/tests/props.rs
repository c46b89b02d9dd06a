//! Properties over random fleets: whatever the caches, loads and settings, a pick is a
//! candidate that passed admission, a cache pick holds a usable prefix, and only exhaustion
//! yields `NoAdmissibleEngine`, naming every candidate once.

use std::collections::BTreeSet;

use proptest::prelude::*;
use router_workers::Stage;

use super::fixture::{BS, Eng, World, eng};
use crate::tests::doubles::running_cap;
use crate::{CacheAwareSettings, EngineAdmission, EngineObservation, PickError, PickReason};

const IDS: [&str; 8] = ["e0", "e1", "e2", "e3", "e4", "e5", "e6", "e7"];
const INPUT: usize = 8 * BS as usize;

fn fleet() -> impl Strategy<Value = Vec<Eng>> {
    prop::collection::vec((0u32..=8, 0u64..8, 0u64..3000, 0u64..12, 0u8..6), 1..=IDS.len())
        .prop_map(|engines| {
            engines
                .into_iter()
                .enumerate()
                .map(|(i, (blocks, waiting, uncached, running, kind))| {
                    let e = eng(IDS[i], blocks);
                    match kind {
                        0 => e.missing().inflight(u64::from(blocks % 3)),
                        1 => e.basic(running, waiting),
                        _ => e.waiting(waiting).uncached(uncached).running(running),
                    }
                })
                .collect()
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn picks_follow_the_rules(
        engines in fleet(),
        min_tokens in 0u64..(INPUT as u64 + 16),
        limit in prop::option::of(1u64..8),
        floor in prop::option::of(0u64..8),
        cap in prop::option::of(1u64..12),
        margin in 0u64..64,
        k in 1usize..5,
        seed: u64,
    ) {
        let world = World::new(Stage::Prefill, &engines);
        let settings = CacheAwareSettings {
            cache_affinity_min_matched_tokens: min_tokens,
            cache_switch_margin_tokens: margin,
            worker_queue_limit: limit,
            saturation_queue_floor: limit.and(floor).map(|f| f.min(limit.unwrap_or(0))),
            min_load_choices: k,
            ..CacheAwareSettings::default()
        };
        let mut policy = world.policy(settings).with_seed(seed);
        let limits = cap.map(running_cap).unwrap_or_default();
        if cap.is_some() {
            let check = crate::AdmissionCheck::new(std::sync::Arc::new(limits), world.load());
            policy = policy.with_admission(check);
        }
        let matched = |e: &Eng| u64::from(e.blocks) * u64::from(BS);
        let is_hit = |e: &Eng| matched(e) >= min_tokens.max(1);
        let snapshot = world.table.snapshot();
        let admitted = |i: usize| {
            let worker = &world.workers[i];
            let metrics = EngineObservation::observe(
                snapshot.get(worker.id()),
                world.inflight.count(worker.id()),
            );
            limits.check(worker, &metrics).is_ok()
        };

        match world.pick(&policy, INPUT) {
            Ok(pick) => {
                let i = world
                    .workers
                    .iter()
                    .position(|w| std::sync::Arc::ptr_eq(w, &pick.worker))
                    .expect("a candidate");
                prop_assert!(admitted(i), "{} was not admissible", IDS[i]);
                match pick.reason {
                    PickReason::CacheHit | PickReason::SaturationPin => {
                        prop_assert!(is_hit(&engines[i]), "{:?} without a usable prefix", pick.reason);
                    }
                    PickReason::CacheMiss => {}
                    other => prop_assert!(false, "unexpected reason {other:?}"),
                }
                if pick.reason == PickReason::CacheHit && cap.is_none() && limit.is_none() {
                    let best = engines.iter().filter(|e| is_hit(e)).map(matched).max();
                    let best = best.expect("a hit implies a holder");
                    prop_assert!(
                        best - matched(&engines[i]) <= margin,
                        "{} is more than the margin behind the best holder", IDS[i]
                    );
                }
                if !engines.iter().any(is_hit) {
                    prop_assert_eq!(pick.reason, PickReason::CacheMiss);
                }
            }
            Err(PickError::NoAdmissibleEngine { rejections }) => {
                prop_assert!(cap.is_some(), "rejections without admission");
                let named: Vec<&str> = rejections.iter().map(|r| r.worker.as_str()).collect();
                let distinct: BTreeSet<&str> = named.iter().copied().collect();
                prop_assert_eq!(distinct.len(), named.len(), "a candidate rejected twice");
                prop_assert_eq!(named.len(), engines.len(), "every candidate tried");
                for (i, id) in IDS.iter().enumerate().take(engines.len()) {
                    prop_assert!(!admitted(i), "{id} was admissible");
                }
            }
            Err(other) => prop_assert!(false, "unexpected error {other}"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// With `tie_break: request` two replicas (independent policy instances, the candidates in
    /// different slice orders) pick the same engine for one request, on hits and misses alike.
    #[test]
    fn request_tie_breaks_agree_across_replicas(
        engines in fleet(),
        k in 1usize..5,
        input in 1usize..INPUT,
        rotation in 0usize..8,
    ) {
        let world = World::new(Stage::Prefill, &engines);
        let settings = CacheAwareSettings {
            min_load_choices: k,
            tie_break: crate::TieBreak::Request,
            ..CacheAwareSettings::default()
        };
        let first = crate::CacheAwarePolicy::new(world.source.clone(), world.load(), settings.clone())
            .expect("valid");
        let second =
            crate::CacheAwarePolicy::new(world.source.clone(), world.load(), settings).expect("valid");
        let mut shuffled = world.workers.clone();
        let n = shuffled.len();
        shuffled.rotate_left(rotation % n);
        shuffled.reverse();
        let a = world.pick_from(&first, &world.workers, input).expect("picked");
        let b = world.pick_from(&second, &shuffled, input).expect("picked");
        prop_assert_eq!(a.worker.id(), b.worker.id());
        prop_assert_eq!(a.reason, b.reason);
    }
}
