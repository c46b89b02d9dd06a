//! One row per binding rule; each row would fail without its rule. Every row runs for each
//! flavor whose fallback is deterministic on it.

use router_affinity::Binding;

use super::fixture::{Flavor, Fleet, bound, outcome, pick, store, worker};
use crate::{AdmissionLimits, PickError, PickReason, StickyFallback};

/// What the scope is bound to before the pick.
#[derive(Clone, Copy, Debug)]
enum Before {
    Nothing,
    /// The fleet engine with this id.
    To(&'static str),
    /// An earlier incarnation of the fleet engine with this id (a replaced engine).
    ToEarlier(&'static str),
}

struct Row {
    rule: &'static str,
    before: Before,
    candidates: &'static [&'static str],
    /// Requests held in flight per engine (the router-local pressure).
    busy: &'static [(&'static str, u64)],
    /// Reported waiting requests per engine.
    waiting: &'static [(&'static str, u64)],
    limits: AdmissionLimits,
    key: Option<&'static str>,
    /// `"<id> <reason>"` or `"rejected <id>"`.
    expect: &'static str,
    /// The binding of the key after the pick.
    after: Option<&'static str>,
}

const UNLIMITED: AdmissionLimits = AdmissionLimits {
    max_running_requests: None,
    max_waiting_requests: None,
    max_kv_tokens: None,
    max_pending_prefill_tokens: None,
    max_inflight_requests: None,
};

const fn inflight_cap(cap: u64) -> AdmissionLimits {
    AdmissionLimits { max_inflight_requests: Some(cap), ..UNLIMITED }
}

const fn waiting_cap(cap: u64) -> AdmissionLimits {
    AdmissionLimits { max_waiting_requests: Some(cap), ..UNLIMITED }
}

/// In every row with two candidates, `b` is busier than `a`, so every fallback picks `a`.
const ROWS: &[Row] = &[
    Row {
        rule: "a new key binds the fallback's engine",
        before: Before::Nothing,
        candidates: &["a", "b"],
        busy: &[("b", 1)],
        waiting: &[],
        limits: UNLIMITED,
        key: Some("k"),
        expect: "a affinity_bound",
        after: Some("a"),
    },
    Row {
        rule: "an admitted binding is reused regardless of pressure",
        before: Before::To("b"),
        candidates: &["a", "b"],
        busy: &[("b", 3)],
        waiting: &[],
        limits: inflight_cap(4),
        key: Some("k"),
        expect: "b affinity_reused",
        after: Some("b"),
    },
    Row {
        rule: "a rejected binding is kept and no other engine is tried",
        before: Before::To("b"),
        candidates: &["a", "b"],
        busy: &[("b", 2)],
        waiting: &[],
        limits: inflight_cap(2),
        key: Some("k"),
        expect: "rejected b",
        after: Some("b"),
    },
    Row {
        rule: "a binding rejected on a reported metric is kept too",
        before: Before::To("b"),
        candidates: &["a", "b"],
        busy: &[("b", 1)],
        waiting: &[("b", 7)],
        limits: waiting_cap(7),
        key: Some("k"),
        expect: "rejected b",
        after: Some("b"),
    },
    Row {
        rule: "a binding outside the candidates never wins and is replaced",
        before: Before::To("c"),
        candidates: &["a", "b"],
        busy: &[("b", 1)],
        waiting: &[],
        limits: UNLIMITED,
        key: Some("k"),
        expect: "a affinity_bound",
        after: Some("a"),
    },
    Row {
        rule: "a binding outside the candidates is not reused even when the group is busy",
        before: Before::To("c"),
        candidates: &["a"],
        busy: &[("a", 1)],
        waiting: &[],
        limits: inflight_cap(1),
        key: Some("k"),
        expect: "rejected a",
        after: Some("c"),
    },
    Row {
        rule: "a binding to an earlier incarnation of a candidate's id is replaced",
        before: Before::ToEarlier("a"),
        candidates: &["a", "b"],
        busy: &[("b", 1)],
        waiting: &[],
        limits: UNLIMITED,
        key: Some("k"),
        expect: "a affinity_bound",
        after: Some("a"),
    },
    Row {
        rule: "the owning policy checks the fallback's engine before binding it",
        before: Before::Nothing,
        candidates: &["a"],
        busy: &[("a", 1)],
        waiting: &[],
        limits: inflight_cap(1),
        key: Some("k"),
        expect: "rejected a",
        after: None,
    },
    Row {
        // Least-load with the owning admission would skip `a` and return `b`.
        rule: "the fallback runs with default admission",
        before: Before::Nothing,
        candidates: &["a", "b"],
        busy: &[("b", 1)],
        waiting: &[("a", 9)],
        limits: waiting_cap(5),
        key: Some("k"),
        expect: "rejected a",
        after: None,
    },
    Row {
        rule: "a keyless request gets the fallback's engine and no binding",
        before: Before::Nothing,
        candidates: &["a", "b"],
        busy: &[("b", 1)],
        waiting: &[],
        limits: UNLIMITED,
        key: None,
        expect: "a affinity_keyless",
        after: None,
    },
    Row {
        rule: "an empty key creates no binding",
        before: Before::Nothing,
        candidates: &["a", "b"],
        busy: &[("b", 1)],
        waiting: &[],
        limits: UNLIMITED,
        key: Some(""),
        expect: "a affinity_keyless",
        after: None,
    },
    Row {
        rule: "a blank key creates no binding",
        before: Before::Nothing,
        candidates: &["a", "b"],
        busy: &[("b", 1)],
        waiting: &[],
        limits: UNLIMITED,
        key: Some(" \t"),
        expect: "a affinity_keyless",
        after: None,
    },
    Row {
        rule: "the owning policy checks a keyless request's engine",
        before: Before::Nothing,
        candidates: &["a"],
        busy: &[("a", 1)],
        waiting: &[],
        limits: inflight_cap(1),
        key: None,
        expect: "rejected a",
        after: None,
    },
];

#[test]
fn each_binding_rule_holds_for_every_flavor() {
    for row in ROWS {
        for flavor in Flavor::DETERMINISTIC {
            let fleet = Fleet::new();
            let store = store();
            let key = row.key.filter(|k| !k.trim().is_empty()).unwrap_or("k");
            let scope = fleet.scope(key);
            match row.before {
                Before::Nothing => {}
                Before::To(id) => {
                    store.bind(&scope, Binding::of(fleet.get(id))).expect("fresh store");
                }
                Before::ToEarlier(id) => {
                    let earlier = worker(&fleet.model, id);
                    assert_ne!(earlier.incarnation(), fleet.get(id).incarnation());
                    store.bind(&scope, Binding::of(&earlier)).expect("fresh store");
                }
            }
            for &(id, n) in row.busy {
                fleet.busy(id, n);
            }
            for &(id, waiting) in row.waiting {
                fleet.report_waiting(id, waiting);
            }
            let policy = flavor.build(&fleet, &store, row.limits);
            let engines = fleet.group(row.candidates);
            let request = fleet.request(flavor, row.key);

            let result = pick(policy.as_ref(), &engines, &request);
            let context = format!("{} ({flavor:?})", row.rule);
            assert_eq!(outcome(&result), row.expect, "{context}");
            assert_eq!(bound(&store, &scope).as_deref(), row.after, "{context}: binding after");
            if let (Ok(pick), Some(_)) = (&result, row.after) {
                assert_eq!(
                    store.get(&scope),
                    Some(Binding::of(&pick.worker)),
                    "{context}: bound to exactly the engine returned (same incarnation)"
                );
            }
            if row.key.is_none_or(|k| k.trim().is_empty()) {
                assert!(store.is_empty(), "{context}: a keyless pick never binds");
            }
        }
    }
}

#[test]
fn random_fallback_binds_an_admitted_candidate() {
    let fleet = Fleet::new();
    fleet.busy("a", 1);
    let flavor = Flavor::Sticky(StickyFallback::Random);
    let engines = fleet.group(&["a", "b", "c"]);
    let mut seen_rejections = 0;
    for i in 0..64 {
        let store = store();
        let policy = flavor.build(&fleet, &store, inflight_cap(1));
        let key = format!("k{i}");
        let request = fleet.request(flavor, Some(&key));
        match pick(policy.as_ref(), &engines, &request) {
            Ok(pick) => {
                assert_ne!(pick.worker.id().as_str(), "a");
                assert_eq!(pick.reason, PickReason::AffinityBound);
                assert_eq!(store.get(&fleet.scope(&key)), Some(Binding::of(&pick.worker)));
            }
            Err(PickError::AdmissionRejected(rejection)) => {
                assert_eq!(rejection.worker.as_str(), "a");
                assert!(store.is_empty(), "a rejected fallback choice is not bound");
                seen_rejections += 1;
            }
            Err(other) => panic!("unexpected {other}"),
        }
    }
    assert!(seen_rejections > 0, "uniform draws over three engines hit `a` in 64 tries");
}

#[test]
fn reuse_skips_the_fallback_entirely() {
    // Round-robin's cursor moves only when the fallback runs: after a bind and two reuses,
    // a keyless pick is the cursor's second turn.
    let fleet = Fleet::new();
    let flavor = Flavor::Sticky(StickyFallback::RoundRobin);
    let store = store();
    let policy = flavor.build(&fleet, &store, UNLIMITED);
    let engines = fleet.group(&["a", "b", "c"]);
    let keyed = fleet.request(flavor, Some("k"));
    let outcomes: Vec<String> =
        (0..3).map(|_| outcome(&pick(policy.as_ref(), &engines, &keyed))).collect();
    assert_eq!(outcomes, ["a affinity_bound", "a affinity_reused", "a affinity_reused"]);
    let keyless = fleet.request(flavor, None);
    assert_eq!(outcome(&pick(policy.as_ref(), &engines, &keyless)), "b affinity_keyless");
}

#[test]
fn no_candidates_and_oversized_keys_are_errors_without_bindings() {
    let fleet = Fleet::new();
    for flavor in Flavor::DETERMINISTIC {
        let store = store();
        let policy = flavor.build(&fleet, &store, UNLIMITED);
        let request = fleet.request(flavor, Some("k"));
        let result = pick(policy.as_ref(), &[], &request);
        assert!(matches!(result, Err(PickError::NoCandidates { .. })), "{flavor:?}: {result:?}");

        let long = "x".repeat(router_affinity::MAX_KEY_BYTES + 1);
        let request = fleet.request(flavor, Some(&long));
        let result = pick(policy.as_ref(), &fleet.group(&["a", "b"]), &request);
        let Err(PickError::InvalidKey { key, error }) = &result else {
            panic!("{flavor:?}: {result:?}")
        };
        assert_eq!(*key, flavor.key_source(), "{flavor:?}");
        assert_eq!(*error, router_affinity::ScopeError::KeyTooLong { len: 257, max: 256 });
        assert!(!result.as_ref().expect_err("refused").advances_bucket());
        assert!(store.is_empty());
    }
}

#[test]
fn each_policy_reads_only_its_own_header() {
    let fleet = Fleet::new();
    let engines = fleet.group(&["a", "b"]);
    // The bound engine is the busier one: a fallback never ties its way there.
    fleet.busy("b", 1);
    for flavor in [Flavor::Session, Flavor::Sticky(StickyFallback::RoundRobin)] {
        let store = store();
        store.bind(&fleet.scope("k"), Binding::of(fleet.get("b"))).expect("fresh store");
        let policy = flavor.build(&fleet, &store, UNLIMITED);
        // The other policy's header carries the bound key; this one's carries nothing.
        let mut request = fleet.keyless();
        match flavor {
            Flavor::Session => request.routing_key = Some("k"),
            Flavor::Sticky(_) => request.session_key = Some("k"),
        }
        let result = pick(policy.as_ref(), &engines, &request);
        assert_eq!(outcome(&result), "a affinity_keyless", "{flavor:?}");
    }
}

#[test]
fn scopes_keep_buckets_stages_and_models_apart() {
    let fleet = Fleet::new();
    let store = store();
    let policy = Flavor::Session.build(&fleet, &store, UNLIMITED);
    let engines = fleet.group(&["a", "b"]);
    let other_model = router_workers::ModelId::new("m2");
    let base = fleet.request(Flavor::Session, Some("k"));
    store.bind(&fleet.scope("k"), Binding::of(fleet.get("b"))).expect("fresh store");
    let neighbours = [
        crate::PickRequest { bucket: "long", ..base },
        crate::PickRequest { stage: router_workers::Stage::Prefill, ..base },
        crate::PickRequest { model: &other_model, ..base },
    ];
    for request in &neighbours {
        // `a` and `b` are equally idle: power-of-two may pick either, but must bind afresh.
        let result = pick(policy.as_ref(), &engines, request);
        assert_eq!(result.expect("picked").reason, PickReason::AffinityBound, "{request:?}");
    }
    assert_eq!(store.len(), 4);
    assert_eq!(outcome(&pick(policy.as_ref(), &engines, &base)), "b affinity_reused");
}
