//! Validation used by configuration: groups, buckets, resolvers and membership.

use std::collections::HashMap;
use std::sync::Arc;

use router_buckets::{
    Bucket, BucketError, BucketGroups, BucketResolver, BucketSpec, EngineGroup, GroupError,
    MembershipError, PairOn, ResolverBuildError, TokenLimits,
};
use router_policies::Policy;
use router_workers::{ModelId, Stage};

use crate::support::*;

fn first() -> Arc<dyn Policy> {
    Scripted::first() as Arc<dyn Policy>
}

#[test]
fn groups_reject_unsupported_stages_and_repeated_members() {
    let prefill_only = Scripted::first_for("cache_aware", &[Stage::Plain, Stage::Prefill]);
    let err = EngineGroup::new(Stage::Decode, None, prefill_only.clone() as Arc<dyn Policy>)
        .expect_err("decode unsupported");
    assert_eq!(err, GroupError::UnsupportedStage { policy: "cache_aware", stage: Stage::Decode });
    assert_eq!(err.to_string(), "policy cache_aware does not support the decode stage");
    for stage in [Stage::Plain, Stage::Prefill] {
        EngineGroup::new(stage, None, prefill_only.clone() as Arc<dyn Policy>).expect("supported");
    }

    let err = EngineGroup::new(Stage::Plain, Some(ids(&["a", "b", "a"])), first())
        .expect_err("repeated member");
    assert_eq!(err, GroupError::DuplicateMember { worker: id("a") });
    EngineGroup::new(Stage::Plain, Some(Vec::new()), first()).expect("empty set is valid");
}

#[test]
fn buckets_reject_bad_ids_ranges_and_slots() {
    let plain = || BucketGroups::Plain(EngineGroup::new(Stage::Plain, None, first()).expect("g"));
    let spec = |id: &str, limits: TokenLimits, context: Option<u64>, groups| BucketSpec {
        id: id.into(),
        rank: 0,
        limits,
        max_context_tokens: context,
        groups,
        slo: router_buckets::BucketSlo::NONE,
        live: None,
    };
    let group = |stage| EngineGroup::new(stage, None, first()).expect("group");
    let cases: Vec<(BucketSpec, BucketError)> = vec![
        (spec("", limits(0, None), None, plain()), BucketError::EmptyId),
        (spec("  ", limits(0, None), None, plain()), BucketError::EmptyId),
        (
            spec("b", limits(10, Some(9)), None, plain()),
            BucketError::InvertedRange { id: "b".into(), min: 10, max: 9 },
        ),
        (spec("b", limits(0, None), Some(0), plain()), BucketError::ZeroContext { id: "b".into() }),
        (
            spec("b", limits(100, None), Some(99), plain()),
            BucketError::ContextBelowMin { id: "b".into(), context: 99, min: 100 },
        ),
        (
            spec("b", limits(0, None), None, BucketGroups::Plain(group(Stage::Prefill))),
            BucketError::GroupInWrongSlot {
                id: "b".into(),
                slot: Stage::Plain,
                group: Stage::Prefill,
            },
        ),
        (
            spec(
                "b",
                limits(0, None),
                None,
                BucketGroups::Pd {
                    prefill: group(Stage::Decode),
                    decode: group(Stage::Decode),
                    pair_on: PairOn::none(),
                },
            ),
            BucketError::GroupInWrongSlot {
                id: "b".into(),
                slot: Stage::Prefill,
                group: Stage::Decode,
            },
        ),
        (
            spec(
                "b",
                limits(0, None),
                None,
                BucketGroups::Pd {
                    prefill: group(Stage::Prefill),
                    decode: group(Stage::Plain),
                    pair_on: PairOn::none(),
                },
            ),
            BucketError::GroupInWrongSlot {
                id: "b".into(),
                slot: Stage::Decode,
                group: Stage::Plain,
            },
        ),
    ];
    for (spec, expected) in cases {
        let err = Bucket::new(spec).expect_err(&expected.to_string());
        assert_eq!(err, expected);
    }
    // Boundaries that are valid: a one-value range, a context equal to min, max above context.
    for (limits, context) in [
        (limits(7, Some(7)), None),
        (limits(100, None), Some(100)),
        (limits(0, Some(9000)), Some(10)),
    ] {
        Bucket::new(spec("b", limits, context, plain())).expect("valid bucket");
    }
}

#[test]
fn resolvers_reject_no_buckets_duplicates_and_mixed_kinds() {
    let model = model();
    let err = BucketResolver::new(model.clone(), Vec::new()).expect_err("empty");
    assert_eq!(err, ResolverBuildError::NoBuckets { model: model.clone() });

    let err = BucketResolver::new(
        model.clone(),
        vec![
            plain_bucket("a", 0, limits(0, None), None),
            plain_bucket("b", 0, limits(0, None), None),
            plain_bucket("a", 1, limits(0, Some(5)), None),
        ],
    )
    .expect_err("duplicate");
    assert_eq!(err, ResolverBuildError::DuplicateId { model: model.clone(), id: "a".into() });
    assert_eq!(err.to_string(), "model llama: duplicate bucket id a");

    let first = Scripted::first();
    let err = BucketResolver::new(
        model.clone(),
        vec![
            bucket("pd", 0, limits(0, None), None, pd((None, &first), (None, &first))),
            plain_bucket("plain", 0, limits(0, None), None),
        ],
    )
    .expect_err("mixed");
    assert_eq!(
        err,
        ResolverBuildError::MixedKinds { model, plain: "plain".into(), pd: "pd".into() }
    );

    let resolver = BucketResolver::new(
        ModelId::new("qwen"),
        vec![
            plain_bucket("b", 0, limits(0, None), None),
            plain_bucket("a", 0, limits(0, None), None),
        ],
    )
    .expect("valid");
    assert_eq!(resolver.model().as_str(), "qwen");
    let configured: Vec<_> = resolver.buckets().iter().map(|b| b.id()).collect();
    assert_eq!(configured, ["b", "a"], "configuration order kept");
}

#[test]
fn membership_must_name_configured_workers_of_the_groups_role() {
    let workers: HashMap<_, _> =
        [(id("P1"), Stage::Prefill), (id("P2"), Stage::Prefill), (id("D1"), Stage::Decode)]
            .into_iter()
            .collect();
    let first = Scripted::first();
    let resolver = resolver(vec![
        bucket("good", 0, limits(0, None), None, pd((Some(&["P2", "P1"]), &first), (None, &first))),
        bucket(
            "bad",
            1,
            limits(0, None),
            None,
            pd((Some(&["P1", "D1", "ghost"]), &first), (Some(&["P2", "D1"]), &first)),
        ),
    ]);
    let errors = resolver.check_membership(&workers);
    assert_eq!(
        errors,
        [
            MembershipError::WrongRole {
                bucket: "bad".into(),
                stage: Stage::Prefill,
                position: 1,
                worker: id("D1"),
                role: Stage::Decode,
            },
            MembershipError::UnknownWorker {
                bucket: "bad".into(),
                stage: Stage::Prefill,
                position: 2,
                worker: id("ghost"),
            },
            MembershipError::WrongRole {
                bucket: "bad".into(),
                stage: Stage::Decode,
                position: 0,
                worker: id("P2"),
                role: Stage::Prefill,
            },
        ]
    );
    assert_eq!(
        errors[1].to_string(),
        "bucket bad: prefill worker_ids[2] names unknown worker ghost"
    );
    assert!(resolver.buckets()[0].check_membership(&workers).is_empty());
}
