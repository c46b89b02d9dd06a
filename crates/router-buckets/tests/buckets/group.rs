//! `EngineGroup::pick`: candidate filtering, policy invocation, exact-candidate validation.

use std::sync::Arc;

use router_buckets::EngineGroup;
use router_policies::{PickError, Policy};
use router_workers::{ModelId, Stage};

use crate::support::*;

/// llama: prefill P1, P2 (unhealthy), P3; decode D1, D2. qwen: prefill Q1.
fn registry() -> router_workers::WorkerRegistry {
    let registry = fleet(&[
        ("P3", Stage::Prefill),
        ("P1", Stage::Prefill),
        ("P2", Stage::Prefill),
        ("D2", Stage::Decode),
        ("D1", Stage::Decode),
    ]);
    registry.add(worker("Q1", Stage::Prefill, &ModelId::new("qwen"))).expect("qwen worker");
    registry.set_health(&id("P2"), false).expect("known worker");
    registry
}

#[tokio::test]
async fn candidates_are_healthy_members_of_model_and_stage_sorted_by_id() {
    struct Case {
        name: &'static str,
        stage: Stage,
        members: Option<&'static [&'static str]>,
        /// `None`: no candidates, so the policy must not be invoked.
        expected: Option<&'static [&'static str]>,
    }
    let cases = [
        Case {
            name: "catch-all prefill",
            stage: Stage::Prefill,
            members: None,
            expected: Some(&["P1", "P3"]),
        },
        Case {
            name: "catch-all decode",
            stage: Stage::Decode,
            members: None,
            expected: Some(&["D1", "D2"]),
        },
        Case {
            name: "listed out of order",
            stage: Stage::Prefill,
            members: Some(&["P3", "P1"]),
            expected: Some(&["P1", "P3"]),
        },
        Case {
            name: "unhealthy member dropped",
            stage: Stage::Prefill,
            members: Some(&["P2", "P3"]),
            expected: Some(&["P3"]),
        },
        Case {
            name: "member of another role dropped",
            stage: Stage::Prefill,
            members: Some(&["D1", "P1"]),
            expected: Some(&["P1"]),
        },
        Case {
            name: "member of another model dropped",
            stage: Stage::Prefill,
            members: Some(&["Q1", "P1"]),
            expected: Some(&["P1"]),
        },
        Case {
            name: "unknown member ignored",
            stage: Stage::Prefill,
            members: Some(&["nope", "P3"]),
            expected: Some(&["P3"]),
        },
        Case {
            name: "non-member excluded",
            stage: Stage::Decode,
            members: Some(&["D2"]),
            expected: Some(&["D2"]),
        },
        Case {
            name: "explicit empty set is no engine",
            stage: Stage::Prefill,
            members: Some(&[]),
            expected: None,
        },
        Case {
            name: "only member unhealthy",
            stage: Stage::Prefill,
            members: Some(&["P2"]),
            expected: None,
        },
        Case {
            name: "stage absent from model",
            stage: Stage::Plain,
            members: None,
            expected: None,
        },
    ];
    let registry = registry();
    let model = model();
    for case in cases {
        let policy = Scripted::first();
        let group = group(case.stage, case.members, &policy);
        let result = group.pick(&registry, "b", &request(&model, 10, None)).await;
        match case.expected {
            Some(expected) => {
                let pick = result.unwrap_or_else(|e| panic!("{}: {e}", case.name));
                assert_eq!(pick.worker.id().as_str(), expected[0], "{}", case.name);
                let calls = policy.calls();
                assert_eq!(calls.len(), 1, "{}", case.name);
                assert_eq!(calls[0].candidates, expected, "{}", case.name);
                assert_eq!(names(&group.candidates(&registry, &model)), expected, "{}", case.name);
            }
            None => {
                let err = result.expect_err(case.name);
                assert!(
                    matches!(err, PickError::NoCandidates { stage } if stage == case.stage),
                    "{}: {err}",
                    case.name
                );
                assert!(
                    policy.calls().is_empty(),
                    "{}: policy invoked with no candidates",
                    case.name
                );
            }
        }
    }
}

#[tokio::test]
async fn picks_outside_the_exact_candidate_set_are_foreign() {
    let registry = registry();
    let model = model();
    let stale_p1 = registry.get(&id("P1")).expect("P1");
    let current_p1 = registry.replace(worker("P1", Stage::Prefill, &model)).expect("replace P1");
    assert_eq!(stale_p1.id(), current_p1.id());

    type Case = (&'static str, Option<&'static [&'static str]>, Arc<router_workers::Worker>);
    let cases: [Case; 5] = [
        ("same id, never registered", None, Arc::new(worker("P3", Stage::Prefill, &model))),
        ("same id, replaced incarnation", None, stale_p1),
        ("registered, another role", None, registry.get(&id("D1")).expect("D1")),
        ("registered member, unhealthy", None, registry.get(&id("P2")).expect("P2")),
        ("registered, not a member", Some(&["P3"]), Arc::clone(&current_p1)),
    ];
    for (name, members, returned) in cases {
        let expected = returned.id().clone();
        let group = group(Stage::Prefill, members, &Scripted::returning(returned));
        let err = group.pick(&registry, "b", &request(&model, 10, None)).await.expect_err(name);
        assert!(
            matches!(err, PickError::OutsideCandidates { ref worker } if *worker == expected),
            "{name}: {err}"
        );
        assert!(!err.advances_bucket(), "{name}: a foreign pick stops routing");
    }

    // The current incarnation is a candidate.
    let group = group(Stage::Prefill, None, &Scripted::returning(Arc::clone(&current_p1)));
    let pick = group.pick(&registry, "b", &request(&model, 10, None)).await.expect("current P1");
    assert!(Arc::ptr_eq(&pick.worker, &current_p1));
}

#[tokio::test]
async fn policy_errors_pass_through_unchanged() {
    let registry = registry();
    let model = model();
    let cases = [
        too_long_key(),
        unsupported_stage(),
        PickError::AdmissionRejected(rejection("P1")),
        PickError::NoAdmissibleEngine { rejections: vec![rejection("P1"), rejection("P3")] },
    ];
    for error in cases {
        let group = group(Stage::Prefill, None, &Scripted::fail(error.clone()));
        let got = group.pick(&registry, "b", &request(&model, 10, None)).await.expect_err("fails");
        assert_eq!(got.to_string(), error.to_string());
        assert_eq!(got.advances_bucket(), error.advances_bucket());
    }
}

#[tokio::test]
async fn policy_sees_the_groups_stage_and_the_request_facts() {
    let registry = registry();
    let model = model();
    let policy = Scripted::first();
    let group = group(Stage::Decode, None, &policy);
    let prompt = tokens(&[1, 2, 3]);
    let req = router_buckets::BucketRequest {
        model: &model,
        input_tokens: 3,
        expected_peak_tokens: Some(40),
        tokens: Some(&prompt),
        session_key: Some("s-1"),
        routing_key: Some("r-1"),
        slo: router_buckets::SloTargets::NONE,
        excluded: &[],
        subset: None,
    };
    group.pick(&registry, "long-context", &req).await.expect("pick");
    assert_eq!(
        policy.calls(),
        [Seen {
            bucket: "long-context".into(),
            stage: Stage::Decode,
            candidates: vec!["D1".into(), "D2".into()],
            input_tokens: 3,
            expected_peak_tokens: Some(40),
            tokens: Some(vec![1, 2, 3]),
            session_key: Some("s-1".into()),
            routing_key: Some("r-1".into()),
        }]
    );
}

#[test]
fn the_policy_instance_is_the_one_attached() {
    let policy = Scripted::first();
    let attached: Arc<dyn Policy> = Arc::clone(&policy) as Arc<dyn Policy>;
    let group = EngineGroup::catch_all(Stage::Plain, Arc::clone(&attached)).expect("group");
    assert!(Arc::ptr_eq(group.policy(), &attached));
    assert_eq!(group.stage(), Stage::Plain);
    assert_eq!(group.members(), None);
    assert!(group.admits(&id("anything")));
    let listed = EngineGroup::new(Stage::Plain, Some(ids(&["b", "a"])), attached).expect("group");
    assert_eq!(listed.members(), Some(&ids(&["b", "a"])[..]), "configuration order kept");
    assert!(listed.admits(&id("a")) && !listed.admits(&id("c")));
}
