//! Lookup outcomes, the normalised prefix results, contract edges and the per-request memo.

use std::sync::Arc;

use futures::FutureExt;
use router_state_kv::{KvIndex, Medium, PrefixMatch, PrefixMatches};
use router_workers::Stage;

use super::fixture::{World, eng, prompt, wid};
use crate::tests::doubles::{Recording, running_cap};
use crate::{
    BlockSize, CacheAwareSettings, CacheSource, CachedPrefixes, MATCHED_TOKEN_BOUNDS, PickError,
    PickReason, Policy, PrefixOutcome, RequestTokens, SourceStats,
};

fn settings() -> CacheAwareSettings {
    CacheAwareSettings { min_load_choices: 64, ..CacheAwareSettings::default() }
}

#[test]
fn block_sizes_are_never_zero_and_convert_blocks_to_tokens() {
    assert_eq!(BlockSize::new(0), None);
    let size = BlockSize::new(16).expect("non-zero");
    assert_eq!((size.get(), size.tokens(3)), (16, 48));
    assert_eq!(size.tokens(u32::MAX), u64::from(u32::MAX) * 16, "no overflow");
    let world = World::new(Stage::Plain, &[eng("a", 0), eng("b", 0).no_kv()]);
    assert_eq!(BlockSize::of(&world.workers[0]), size);
    assert!(!BlockSize::is_approximate(&world.workers[0]));
    assert_eq!(BlockSize::of(&world.workers[1]), BlockSize::APPROXIMATE, "pictured, not known");
    assert!(BlockSize::is_approximate(&world.workers[1]));
}

#[test]
fn prefixes_are_normalised_per_worker_and_capped_at_the_query() {
    let matches = PrefixMatches {
        query_blocks: 3,
        matches: vec![
            PrefixMatch { worker: wid("z"), rank: 1, blocks: 3, tier: Medium::Cpu },
            PrefixMatch { worker: wid("a"), rank: 0, blocks: 1, tier: Medium::Gpu },
        ],
    };
    let size = BlockSize::new(16).expect("non-zero");
    // 40 tokens were looked up: 2 full blocks and a partial one... but a peer claims 3.
    let prefixes = CachedPrefixes::new(matches, size, 40);
    assert_eq!(prefixes.block_size(), size);
    assert_eq!(prefixes.query_blocks(), 3);
    let z = prefixes.get(&wid("z")).expect("z holds");
    assert_eq!((z.blocks, z.tokens, z.rank, z.tier), (3, 40, 1, Medium::Cpu));
    assert_eq!(prefixes.get(&wid("a")).map(|p| p.tokens), Some(16));
    assert_eq!(prefixes.get(&wid("m")), None);
    let order: Vec<_> = prefixes.iter().map(|p| p.worker.to_string()).collect();
    assert_eq!(order, ["z", "a"], "the backend's order");
    assert!(!prefixes.is_empty());
}

#[test]
fn the_local_source_counts_found_and_confirmed_misses_apart() {
    let world = World::new(Stage::Plain, &[eng("a", 2)]);
    let size = BlockSize::new(16).expect("non-zero");
    let lookup = |tokens: &[u32]| {
        world
            .source
            .lookup(&world.model, tokens, size)
            .now_or_never()
            .expect("local lookups are ready")
            .expect("no error")
    };
    let PrefixOutcome::Found(found) = lookup(&prompt(64)) else {
        panic!("local never unavailable")
    };
    assert_eq!(found.get(&wid("a")).map(|p| (p.blocks, p.tokens)), Some((2, 32)));
    let PrefixOutcome::Found(cold) = lookup(&[7; 64]) else { panic!("local never unavailable") };
    assert!(cold.is_empty());
    assert_eq!(
        world.source.stats(),
        SourceStats { lookups: 2, found: 1, empty: 1, ..SourceStats::default() }
    );
    // The hit matched 32 tokens (bucket "at most 64"), the miss none (bucket "0").
    let matched = world.source.matched_tokens();
    assert_eq!((matched.count(), matched.sum), (2, 32));
    assert_eq!((matched.counts[0], matched.counts[2]), (1, 1));
    assert_eq!(MATCHED_TOKEN_BOUNDS[2], 64);
    assert_eq!(world.source.kind(), "local");
    assert!(world.source.remote_client().is_none());
}

#[test]
fn engines_never_sent_a_prefix_miss_and_short_inputs_are_not_looked_up() {
    // No candidate publishes KV events, and the router sent them nothing: their pictured
    // caches are empty, a confirmed miss.
    let world = World::new(Stage::Plain, &[eng("a", 100).no_kv(), eng("b", 0).no_kv()]);
    let policy = world.policy(settings());
    let pick = world.pick(&policy, 4096).expect("fallback");
    assert_eq!(pick.reason, PickReason::CacheMiss);
    assert_eq!(world.source.stats().empty, 1);

    // An input shorter than the minimum hit.
    let world = World::new(Stage::Plain, &[eng("a", 63)]);
    let policy = world.policy(settings());
    let tokens = RequestTokens::new(prompt(1023));
    let request = world.request(1023, Some(&tokens));
    let pick = policy.pick(&world.workers, &request).now_or_never().expect("ready").expect("ok");
    assert_eq!(pick.reason, PickReason::CacheMiss);
    assert!(tokens.memo().is_empty());
    assert_eq!(world.source.stats().lookups, 0);
}

#[test]
fn a_request_without_token_ids_is_unavailable_not_a_miss() {
    let world = World::new(Stage::Prefill, &[eng("a", 100), eng("b", 0)]);
    let policy = world.policy(settings());
    let request = world.request(4096, None);
    let pick = policy.pick(&world.workers, &request).now_or_never().expect("ready").expect("ok");
    assert_eq!(pick.reason, PickReason::CacheUnavailable);
    assert_eq!(world.source.stats().lookups, 0);
}

#[test]
fn decode_groups_and_empty_groups_are_refused() {
    let world = World::new(Stage::Decode, &[eng("a", 100)]);
    let policy = world.policy(settings());
    assert_eq!(policy.name(), "cache_aware");
    assert!(!policy.supports_stage(Stage::Decode));
    assert!(policy.supports_stage(Stage::Plain) && policy.supports_stage(Stage::Prefill));
    let err = world.pick(&policy, 4096).expect_err("decode");
    assert!(
        matches!(err, PickError::UnsupportedStage { policy: "cache_aware", stage: Stage::Decode }),
        "{err}"
    );
    assert!(!err.advances_bucket());

    let world = World::new(Stage::Prefill, &[eng("a", 100)]);
    let policy = world.policy(settings());
    let err = world.pick_from(&policy, &[], 4096).expect_err("empty");
    assert!(matches!(err, PickError::NoCandidates { stage: Stage::Prefill }), "{err}");
}

#[test]
fn holders_outside_the_group_never_count() {
    let world = World::new(Stage::Plain, &[eng("z", 256), eng("a", 64), eng("b", 0)]);
    let policy = world.policy(settings());
    let pick = world.pick_from(&policy, &world.only(&["a", "b"]), 4096).expect("picked");
    assert_eq!((pick.worker.id().as_str(), pick.reason), ("a", PickReason::CacheHit));
    let pick = world.pick_from(&policy, &world.only(&["b"]), 4096).expect("picked");
    assert_eq!((pick.worker.id().as_str(), pick.reason), ("b", PickReason::CacheMiss));
}

#[test]
fn matched_tokens_are_capped_at_the_input() {
    // The request claims 1000 input tokens while carrying the whole prompt: a's 1600 cached
    // tokens and b's 1008 both count as 1000, so pressure decides between them.
    let world = World::new(Stage::Plain, &[eng("a", 100).uncached(500), eng("b", 63)]);
    let policy = world.policy(CacheAwareSettings {
        cache_affinity_min_matched_tokens: 1000,
        cache_affinity_min_matched_ratio: Some(1.0),
        ..settings()
    });
    let tokens = RequestTokens::new(prompt(4096));
    let request = world.request(1000, Some(&tokens));
    let pick = policy.pick(&world.workers, &request).now_or_never().expect("ready").expect("ok");
    assert_eq!((pick.worker.id().as_str(), pick.reason), ("b", PickReason::CacheHit));
}

#[test]
fn one_lookup_serves_three_bucket_attempts_each_with_its_own_candidates_and_admission() {
    let world = World::new(
        Stage::Prefill,
        &[
            eng("a", 200).running(9),
            eng("b", 0).running(9),
            eng("c", 100),
            eng("d", 0),
            eng("e", 150),
            eng("f", 0),
        ],
    );
    let tokens = RequestTokens::new(prompt(4096));
    let request = world.request(4096, Some(&tokens));
    // Three buckets, each group with its own policy instance over the shared source.
    let admission = Recording::new(running_cap(9));
    let check = crate::AdmissionCheck::new(admission.clone(), world.load());
    let policy = || world.policy(settings()).with_admission(check.clone());
    let (first, second, third) = (policy(), policy(), policy());

    let attempt = |policy: &dyn Policy, ids: &[&str]| {
        let group = world.only(ids);
        policy.pick(&group, &request).now_or_never().expect("ready")
    };
    let err = attempt(&first, &["a", "b"]).expect_err("both at the cap");
    assert_eq!(err.rejections().len(), 2);
    assert!(err.advances_bucket());
    let pick = attempt(&second, &["c", "d"]).expect("c holds");
    assert_eq!((pick.worker.id().as_str(), pick.reason), ("c", PickReason::CacheHit));
    let pick = attempt(&third, &["e", "f"]).expect("e holds");
    assert_eq!((pick.worker.id().as_str(), pick.reason), ("e", PickReason::CacheHit));

    assert_eq!(world.source.stats().lookups, 1, "one lookup for three attempts");
    assert_eq!(tokens.memo().len(), 1);
    // Admission ran in every attempt, on that attempt's candidates only.
    assert_eq!(admission.order(), ["a", "b", "c", "e"]);

    // A different source over the same index is a different memo entry (sources are keyed
    // by identity), and so is another block size.
    let other = Arc::new(CacheSource::local(Arc::clone(&world.index)));
    let policy =
        crate::CacheAwarePolicy::new(other.clone(), world.load(), settings()).expect("valid");
    let pick = attempt(&policy, &["c", "d"]).expect("c holds");
    assert_eq!(pick.reason, PickReason::CacheHit);
    assert_eq!((other.stats().lookups, world.source.stats().lookups), (1, 1));
    assert_eq!(tokens.memo().len(), 2);
}

#[test]
fn each_block_size_is_looked_up_once() {
    let world = World::new(
        Stage::Plain,
        &[eng("a", 64), eng("b", 40).block_size(32), eng("c", 0).block_size(32)],
    );
    let policy = world.policy(settings());
    let tokens = RequestTokens::new(prompt(4096));
    let request = world.request(4096, Some(&tokens));
    for _ in 0..3 {
        let pick =
            policy.pick(&world.workers, &request).now_or_never().expect("ready").expect("ok");
        assert_eq!((pick.worker.id().as_str(), pick.reason), ("b", PickReason::CacheHit));
    }
    assert_eq!(tokens.memo().len(), 2);
    assert_eq!(world.source.stats().lookups, 2);
}

#[test]
fn a_source_serves_many_models_apart() {
    let index = Arc::new(KvIndex::default());
    let source = CacheSource::local(index);
    let size = BlockSize::new(16).expect("non-zero");
    let outcome = source
        .lookup(&router_workers::ModelId::new("unknown"), &prompt(64), size)
        .now_or_never()
        .expect("ready")
        .expect("no error");
    let PrefixOutcome::Found(found) = outcome else { panic!("local is never unavailable") };
    assert!(found.is_empty());
    assert_eq!(found.query_blocks(), 4);
}
