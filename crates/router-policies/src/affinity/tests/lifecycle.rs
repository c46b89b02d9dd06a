//! Construction from configuration, separate stores, expiry with paused time, invalidation
//! through a real registry, and the invariants as a property.

use std::sync::Arc;
use std::time::Duration;

use futures::executor::block_on;
use proptest::prelude::*;
use router_affinity::{AffinityConfig, AffinityStore, Binding, follow_registry};
use router_test_support::settle;
use router_workers::{Stage, Worker, WorkerRegistry};
use tokio_util::sync::CancellationToken;

use super::fixture::{Flavor, Fleet, outcome, pick, store};
use crate::{
    AdmissionLimits, PickError, PickReason, PolicyConfig, SessionAwarePolicy, StickyFallback,
};

fn config(yaml: &str) -> PolicyConfig {
    serde_yaml_ng::from_str(yaml).expect(yaml)
}

#[test]
fn configuration_builds_both_policies_over_separate_stores() {
    let fleet = Fleet::new();
    let handles = fleet.handles();
    let session = config("type: session_aware").build(&handles).expect("session_aware");
    let sticky = config("type: sticky").build(&handles).expect("sticky");
    assert_eq!((session.name(), sticky.name()), ("session_aware", "sticky"));

    // The same value in both headers: each policy binds in its own store.
    let engines = fleet.group(&["a", "b", "c"]);
    let mut both = fleet.keyless();
    both.session_key = Some("k");
    both.routing_key = Some("k");
    let first = pick(session.as_ref(), &engines, &both).expect("picked");
    assert_eq!(first.reason, PickReason::AffinityBound);
    assert_eq!(outcome(&pick(sticky.as_ref(), &engines, &both)), "a affinity_bound");
    assert_eq!((handles.sessions.len(), handles.routing_keys.len()), (1, 1));
    assert_eq!(handles.sessions.get(&fleet.scope("k")), Some(Binding::of(&first.worker)));

    // The default sticky fallback is round-robin: its cursor moved once for the bind.
    let keyless = fleet.keyless();
    assert_eq!(outcome(&pick(sticky.as_ref(), &engines, &keyless)), "b affinity_keyless");
    assert_eq!(outcome(&pick(sticky.as_ref(), &engines, &keyless)), "c affinity_keyless");

    // A configured fallback is used: least-load always takes the idle `b` here.
    fleet.busy("a", 1);
    fleet.busy("c", 1);
    let least = config("{type: sticky, fallback: load_based}").build(&handles).expect("sticky");
    for _ in 0..2 {
        assert_eq!(outcome(&pick(least.as_ref(), &engines, &keyless)), "b affinity_keyless");
    }
    for fallback in ["random", "power_of_two"] {
        let built = config(&format!("{{type: sticky, fallback: {fallback}}}")).build(&handles);
        let picked = pick(built.expect(fallback).as_ref(), &engines, &keyless).expect(fallback);
        assert_eq!(picked.reason, PickReason::AffinityKeyless);
    }
}

#[test]
fn configured_admission_checks_bound_engines() {
    let fleet = Fleet::new();
    let handles = fleet.handles();
    let engines = fleet.group(&["a", "b"]);
    for store in [&handles.sessions, &handles.routing_keys] {
        store.bind(&fleet.scope("k"), Binding::of(fleet.get("a"))).expect("fresh store");
    }
    fleet.busy("a", 1);
    for (yaml, flavor) in [
        ("{type: session_aware, admission: {max_inflight_requests: 1}}", Flavor::Session),
        (
            "{type: sticky, admission: {max_inflight_requests: 1}}",
            Flavor::Sticky(StickyFallback::RoundRobin),
        ),
    ] {
        let policy = config(yaml).build(&handles).expect(yaml);
        let request = fleet.request(flavor, Some("k"));
        assert_eq!(outcome(&pick(policy.as_ref(), &engines, &request)), "rejected a", "{yaml}");
    }
    assert_eq!(handles.sessions.get(&fleet.scope("k")), Some(Binding::of(fleet.get("a"))));
    assert_eq!(handles.routing_keys.get(&fleet.scope("k")), Some(Binding::of(fleet.get("a"))));
}

#[test]
fn handles_carry_the_stores_they_are_given() {
    let fleet = Fleet::new();
    let (sessions, routing_keys) = (store(), store());
    let handles = fleet.handles().with_affinity(Arc::clone(&sessions), Arc::clone(&routing_keys));
    let policy = config("type: session_aware").build(&handles).expect("built");
    let request = fleet.request(Flavor::Session, Some("k"));
    pick(policy.as_ref(), &fleet.group(&["a"]), &request).expect("picked");
    assert_eq!(sessions.get(&fleet.scope("k")), Some(Binding::of(fleet.get("a"))));
    assert!(routing_keys.is_empty());
}

#[tokio::test(start_paused = true)]
async fn idle_bindings_expire_and_the_key_binds_afresh() {
    let fleet = Fleet::new();
    let idle = Duration::from_secs(60);
    let store = Arc::new(
        AffinityStore::new(AffinityConfig { idle_timeout: idle, ..AffinityConfig::default() })
            .expect("valid config"),
    );
    let flavor = Flavor::Sticky(StickyFallback::RoundRobin);
    let policy = flavor.build(&fleet, &store, AdmissionLimits::default());
    let engines = fleet.group(&["a", "b"]);
    let request = fleet.request(flavor, Some("k"));
    let step = |expected: &'static str| {
        let policy = Arc::clone(&policy);
        let (engines, request) = (&engines, &request);
        async move { assert_eq!(outcome(&policy.pick(engines, request).await), expected) }
    };

    step("a affinity_bound").await;
    tokio::time::advance(idle - Duration::from_secs(1)).await;
    step("a affinity_reused").await;
    // Idle time counts from the last use, not from the bind.
    tokio::time::advance(idle - Duration::from_secs(1)).await;
    step("a affinity_reused").await;
    tokio::time::advance(idle).await;
    // Expired: round-robin's cursor has moved once, so the new binding is `b`.
    step("b affinity_bound").await;
    assert_eq!(store.get(&fleet.scope("k")), Some(Binding::of(fleet.get("b"))));

    tokio::time::advance(idle).await;
    assert_eq!(store.sweep(tokio::time::Instant::now()), 1);
    assert!(store.is_empty());
}

#[tokio::test]
async fn bindings_of_an_engine_leaving_the_registry_are_invalidated() {
    let fleet = Fleet::new();
    let registry = Arc::new(WorkerRegistry::new());
    let url = "http://127.0.0.1:9";
    for id in ["a", "b"] {
        registry.add(Worker::plain(id, url, &fleet.model).expect("valid")).expect("added");
    }
    let store = store();
    let cancel = CancellationToken::new();
    let follower = tokio::spawn(follow_registry(store.clone(), registry.clone(), cancel.clone()));
    let flavor = Flavor::Sticky(StickyFallback::RoundRobin);
    let policy = flavor.build(&fleet, &store, AdmissionLimits::default());
    let group = || registry.healthy(&fleet.model, Stage::Plain);
    let k = fleet.request(flavor, Some("k"));
    let k2 = fleet.request(flavor, Some("k2"));

    assert_eq!(outcome(&policy.pick(&group(), &k).await), "a affinity_bound");
    assert_eq!(outcome(&policy.pick(&group(), &k2).await), "b affinity_bound");

    let a = registry.get(fleet.get("a").id()).expect("registered");
    registry.remove(a.id()).expect("removed");
    settle("a's binding is dropped", || store.get(&fleet.scope("k")).is_none()).await;
    assert_eq!(store.len(), 1, "b's binding stays");
    assert_eq!(outcome(&policy.pick(&group(), &k).await), "b affinity_bound");

    // A replacement under the same id is a new engine: every binding to the old one goes.
    let new_b =
        registry.replace(Worker::plain("b", url, &fleet.model).expect("valid")).expect("replaced");
    settle("the old b's bindings are dropped", || store.is_empty()).await;
    let picked = policy.pick(&group(), &k).await.expect("picked");
    assert!(Arc::ptr_eq(&picked.worker, &new_b));
    assert_eq!(picked.reason, PickReason::AffinityBound);
    assert_eq!(store.get(&fleet.scope("k")), Some(Binding::of(&new_b)));

    cancel.cancel();
    follower.await.expect("follower stops on cancel");
}

proptest! {
    /// Whatever the group, the prior binding and the load: a pick is an admitted candidate; an
    /// admitted candidate binding is always the pick; a rejection or a keyless pick leaves the
    /// binding as it was; a keyed pick leaves exactly the returned engine bound.
    #[test]
    fn picks_are_admitted_candidates_and_bindings_follow(
        members in proptest::sample::subsequence(vec![0usize, 1, 2, 3], 1..=4),
        // 0..4: a fleet engine; 4..8: an earlier incarnation of one; 8: nothing.
        before in 0usize..9,
        busy in proptest::collection::vec(0u64..3, 4),
        keyed in any::<bool>(),
        seed in any::<u64>(),
    ) {
        const CAP: u64 = 2;
        let fleet = Fleet::new();
        for (i, &n) in busy.iter().enumerate() {
            let id = fleet.workers[i].id().as_str().to_owned();
            fleet.busy(&id, n);
        }
        let engines: Vec<_> = members.iter().map(|&i| Arc::clone(&fleet.workers[i])).collect();
        let store = store();
        let scope = fleet.scope("k");
        let prior = match before {
            0..4 => Some(Binding::of(&fleet.workers[before])),
            4..8 => {
                let id = fleet.workers[before - 4].id().as_str().to_owned();
                Some(Binding::of(&super::fixture::worker(&fleet.model, &id)))
            }
            _ => None,
        };
        if let Some(binding) = &prior {
            store.bind(&scope, binding.clone()).expect("fresh store");
        }
        let limits = AdmissionLimits { max_inflight_requests: Some(CAP), ..Default::default() };
        let policy = SessionAwarePolicy::new(Arc::clone(&store), fleet.load.clone())
            .with_seed(seed)
            .with_admission(crate::AdmissionCheck::new(Arc::new(limits), fleet.load.clone()));
        let request = fleet.request(Flavor::Session, keyed.then_some("k"));
        let result = block_on(crate::Policy::pick(&policy, &engines, &request));

        let admitted = |id: &router_workers::WorkerId| {
            fleet.workers.iter().position(|w| w.id() == id).is_some_and(|i| busy[i] < CAP)
        };
        let bound_candidate = prior.as_ref().and_then(|b| b.find_in(&engines));
        match &result {
            Ok(pick) => {
                prop_assert!(Binding::of(&pick.worker).find_in(&engines).is_some());
                prop_assert!(admitted(pick.worker.id()));
            }
            Err(PickError::AdmissionRejected(rejection)) => {
                prop_assert!(!admitted(&rejection.worker));
            }
            Err(other) => prop_assert!(false, "unexpected {}", other),
        }
        if !keyed {
            prop_assert_eq!(result.as_ref().map(|p| p.reason).ok(), result.is_ok().then_some(PickReason::AffinityKeyless));
            prop_assert_eq!(store.get(&scope), prior);
            return Ok(());
        }
        if let Some(bound) = bound_candidate {
            match &result {
                Ok(pick) => {
                    prop_assert!(Arc::ptr_eq(&pick.worker, bound));
                    prop_assert_eq!(pick.reason, PickReason::AffinityReused);
                }
                Err(_) => prop_assert!(!admitted(bound.id()), "only a rejected binding fails"),
            }
        }
        match &result {
            Ok(pick) => prop_assert_eq!(store.get(&scope), Some(Binding::of(&pick.worker))),
            Err(_) => prop_assert_eq!(store.get(&scope), prior),
        }
    }
}
