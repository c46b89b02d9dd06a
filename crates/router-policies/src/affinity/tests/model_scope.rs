//! Model-wide bindings (`scope: model`): one row per rule, run for every deterministic
//! fallback flavor, each next to what bucket scope does on the same fixture; and a key crossing
//! from one bucket to another.

use router_affinity::Binding;
use router_workers::Stage;

use super::fixture::{Flavor, Fleet, bound, outcome, pick, store};
use crate::{AdmissionLimits, BindingScope, PickRequest};

struct Row {
    rule: &'static str,
    /// The fleet engine the key is bound to, model-wide, before the pick.
    before: Option<&'static str>,
    candidates: &'static [&'static str],
    /// Requests held in flight per engine (the router-local pressure).
    busy: &'static [(&'static str, u64)],
    /// `max_inflight_requests` of the owning policy, if any.
    cap: Option<u64>,
    /// `"<id> <reason>"` or `"rejected <id>"`, with model scope.
    expect: &'static str,
    /// The model-wide binding after the pick.
    after: Option<&'static str>,
    /// What bucket scope answers with the same binding in its own bucket's scope.
    bucket_scope: &'static str,
}

/// In every row `b` is busier than `a` unless said otherwise, so every fallback picks `a`.
const ROWS: &[Row] = &[
    Row {
        rule: "a bound engine that is a candidate here and admitted is reused",
        before: Some("b"),
        candidates: &["a", "b"],
        busy: &[("b", 1)],
        cap: None,
        expect: "b affinity_reused",
        after: Some("b"),
        bucket_scope: "b affinity_reused",
    },
    Row {
        rule: "an engine outside this bucket's group is not used and the binding moves",
        before: Some("c"),
        candidates: &["a", "b"],
        busy: &[("b", 1)],
        cap: None,
        expect: "a affinity_bound",
        after: Some("a"),
        bucket_scope: "a affinity_bound",
    },
    Row {
        rule: "a bound engine this bucket does not admit is passed over like one outside it",
        before: Some("b"),
        candidates: &["a", "b"],
        busy: &[("b", 2)],
        cap: Some(2),
        expect: "a affinity_bound",
        after: Some("a"),
        bucket_scope: "rejected b",
    },
    Row {
        rule: "the binding moves only to an admitted engine",
        before: Some("c"),
        candidates: &["a"],
        busy: &[("a", 1)],
        cap: Some(1),
        expect: "rejected a",
        after: Some("c"),
        bucket_scope: "rejected a",
    },
    Row {
        rule: "when the new pick is the rejected bound engine the binding stays",
        before: Some("b"),
        candidates: &["b"],
        busy: &[("b", 2)],
        cap: Some(2),
        expect: "rejected b",
        after: Some("b"),
        bucket_scope: "rejected b",
    },
    Row {
        rule: "a new key binds model-wide",
        before: None,
        candidates: &["a", "b"],
        busy: &[("b", 1)],
        cap: None,
        expect: "a affinity_bound",
        after: Some("a"),
        bucket_scope: "a affinity_bound",
    },
];

#[test]
fn each_model_scope_rule_holds_for_every_flavor() {
    for row in ROWS {
        for flavor in Flavor::DETERMINISTIC {
            for scope in [BindingScope::Model, BindingScope::Bucket] {
                let fleet = Fleet::new();
                let store = store();
                let key_scope = match scope {
                    BindingScope::Model => fleet.model_scope("k"),
                    BindingScope::Bucket => fleet.scope("k"),
                };
                if let Some(id) = row.before {
                    store.bind(&key_scope, Binding::of(fleet.get(id))).expect("fresh store");
                }
                for &(id, n) in row.busy {
                    fleet.busy(id, n);
                }
                let limits = AdmissionLimits {
                    max_inflight_requests: row.cap,
                    ..AdmissionLimits::default()
                };
                let policy = flavor.build_scoped(&fleet, &store, limits, scope);
                let engines = fleet.group(row.candidates);
                let request = fleet.request(flavor, Some("k"));
                let result = pick(policy.as_ref(), &engines, &request);
                let context = format!("{} ({flavor:?}, {scope} scope)", row.rule);
                match scope {
                    BindingScope::Model => {
                        assert_eq!(outcome(&result), row.expect, "{context}");
                        assert_eq!(bound(&store, &key_scope).as_deref(), row.after, "{context}");
                        assert_eq!(store.len(), usize::from(row.after.is_some()), "{context}");
                    }
                    BindingScope::Bucket => {
                        assert_eq!(outcome(&result), row.bucket_scope, "{context}");
                    }
                }
            }
        }
    }
}

#[test]
fn a_key_keeps_its_engine_across_buckets_only_with_model_scope() {
    // Two buckets' groups, each with its own policy instance over the model's one store: the
    // key is placed in `short` on `a`, then asked for in `long`, where `a` is busier than `b`
    // (so a fresh placement goes to `b`).
    for flavor in [Flavor::Session, Flavor::Sticky(crate::StickyFallback::LoadBased)] {
        for (scope, in_long) in
            [(BindingScope::Model, "a affinity_reused"), (BindingScope::Bucket, "b affinity_bound")]
        {
            let fleet = Fleet::new();
            let store = store();
            let unlimited = AdmissionLimits::default();
            let short = flavor.build_scoped(&fleet, &store, unlimited, scope);
            let long = flavor.build_scoped(&fleet, &store, unlimited, scope);
            let in_short = fleet.request(flavor, Some("k"));
            let first = pick(short.as_ref(), &fleet.group(&["a"]), &in_short);
            assert_eq!(outcome(&first), "a affinity_bound", "{flavor:?} {scope}");
            fleet.busy("a", 3);
            let in_long_request = PickRequest { bucket: "long", ..in_short };
            let later = pick(long.as_ref(), &fleet.group(&["a", "b"]), &in_long_request);
            assert_eq!(outcome(&later), in_long, "{flavor:?} {scope}");
            let bindings = match scope {
                BindingScope::Model => 1,
                BindingScope::Bucket => 2,
            };
            assert_eq!(store.len(), bindings, "{flavor:?} {scope}: one binding per scope");
        }
    }
}

#[test]
fn a_key_alternating_between_disjoint_buckets_moves_its_one_model_wide_binding() {
    // The trade-off of model scope: `short` has only `a`, `long` only `b`. Bucket scope keeps
    // a binding in each; model scope has one, which moves at every crossing.
    for (scope, turns) in [
        (BindingScope::Model, ["a affinity_bound", "b affinity_bound", "a affinity_bound"]),
        (BindingScope::Bucket, ["a affinity_bound", "b affinity_bound", "a affinity_reused"]),
    ] {
        let fleet = Fleet::new();
        let store = store();
        let flavor = Flavor::Session;
        let short = flavor.build_scoped(&fleet, &store, AdmissionLimits::default(), scope);
        let long = flavor.build_scoped(&fleet, &store, AdmissionLimits::default(), scope);
        let in_short = fleet.request(flavor, Some("k"));
        let in_long = PickRequest { bucket: "long", ..in_short };
        let seen = [
            outcome(&pick(short.as_ref(), &fleet.group(&["a"]), &in_short)),
            outcome(&pick(long.as_ref(), &fleet.group(&["b"]), &in_long)),
            outcome(&pick(short.as_ref(), &fleet.group(&["a"]), &in_short)),
        ];
        assert_eq!(seen, turns, "{scope} scope");
    }
}

#[test]
fn model_wide_bindings_keep_stages_and_models_apart_and_ignore_bucket_ones() {
    let fleet = Fleet::new();
    let store = store();
    let policy = Flavor::Session.build_scoped(
        &fleet,
        &store,
        AdmissionLimits::default(),
        BindingScope::Model,
    );
    let engines = fleet.group(&["a", "b"]);
    // A bucket-scoped binding of the same key is not the model's.
    store.bind(&fleet.scope("k"), Binding::of(fleet.get("b"))).expect("fresh store");
    fleet.busy("b", 1);
    let base = fleet.request(Flavor::Session, Some("k"));
    assert_eq!(outcome(&pick(policy.as_ref(), &engines, &base)), "a affinity_bound");
    assert_eq!(bound(&store, &fleet.model_scope("k")).as_deref(), Some("a"));
    let other_model = router_workers::ModelId::new("m2");
    for request in
        [PickRequest { stage: Stage::Prefill, ..base }, PickRequest { model: &other_model, ..base }]
    {
        let result = pick(policy.as_ref(), &engines, &request);
        assert_eq!(outcome(&result), "a affinity_bound", "{request:?}: placed afresh");
    }
    // Whatever the bucket, the model-wide binding answers.
    let elsewhere = PickRequest { bucket: "long", ..base };
    assert_eq!(outcome(&pick(policy.as_ref(), &engines, &elsewhere)), "a affinity_reused");
    assert_eq!(store.len(), 4, "bucket k, model k, prefill k, model m2 k");
}
