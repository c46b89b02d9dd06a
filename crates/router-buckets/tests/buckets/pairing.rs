//! PD pairing constraints (`pair_on`) through `pick_engines`, `select`, `has_candidates` and the
//! startup warnings, and the engine-status filter every group applies: drained, starting and
//! draining engines are no candidates.

use std::sync::Arc;

use router_buckets::{BucketPick, PairingWarning};
use router_policies::PickError;
use router_workers::{EngineStatus, Stage, WorkerRegistry};

use crate::support::*;

/// Prefill P1 (rack a), P2 (rack b), P3 (no rack); decode D1 (rack a), D2 (rack b), D3 (rack a),
/// D4 (no rack).
fn racks() -> WorkerRegistry {
    let registry = WorkerRegistry::new();
    for (name, stage, rack) in [
        ("P1", Stage::Prefill, Some("a")),
        ("P2", Stage::Prefill, Some("b")),
        ("P3", Stage::Prefill, None),
        ("D1", Stage::Decode, Some("a")),
        ("D2", Stage::Decode, Some("b")),
        ("D3", Stage::Decode, Some("a")),
        ("D4", Stage::Decode, None),
    ] {
        let labels: Vec<(&str, &str)> = rack.map(|r| ("rack", r)).into_iter().collect();
        registry.add(labelled(name, stage, &labels)).expect("add");
    }
    registry
}

#[tokio::test]
async fn a_decode_engine_is_offered_only_when_its_labels_equal_the_chosen_prefills() {
    struct Case {
        name: &'static str,
        /// The prefill candidate the prefill policy takes (by position).
        prefill_nth: usize,
        pair_on: &'static [&'static str],
        /// Workers made unhealthy first.
        down: &'static [&'static str],
        /// Candidates offered to the prefill and decode policies; `None`: not invoked.
        prefill_offered: Option<&'static [&'static str]>,
        decode_offered: Option<&'static [&'static str]>,
        /// The pair, or the stage without candidates.
        outcome: Result<(&'static str, &'static str), Stage>,
    }
    #[rustfmt::skip]
    let cases = [
        Case { name: "no constraint: every decode engine", prefill_nth: 0, pair_on: &[], down: &[],
            prefill_offered: Some(&["P1", "P2", "P3"]), decode_offered: Some(&["D1", "D2", "D3", "D4"]),
            outcome: Ok(("P1", "D1")) },
        Case { name: "rack a pairs with rack a only", prefill_nth: 0, pair_on: &["rack"], down: &[],
            prefill_offered: Some(&["P1", "P2"]), decode_offered: Some(&["D1", "D3"]),
            outcome: Ok(("P1", "D1")) },
        Case { name: "rack b pairs with rack b only", prefill_nth: 1, pair_on: &["rack"], down: &[],
            prefill_offered: Some(&["P1", "P2"]), decode_offered: Some(&["D2"]),
            outcome: Ok(("P2", "D2")) },
        Case { name: "an unlabelled prefill is never offered, even with an unlabelled decode",
            prefill_nth: 0, pair_on: &["rack"], down: &["P1", "P2"],
            prefill_offered: None, decode_offered: None, outcome: Err(Stage::Decode) },
        Case { name: "a prefill whose partners are down is not offered", prefill_nth: 0,
            pair_on: &["rack"], down: &["D2"],
            prefill_offered: Some(&["P1"]), decode_offered: Some(&["D1", "D3"]),
            outcome: Ok(("P1", "D1")) },
        Case { name: "no prefill with a live partner: a decode miss", prefill_nth: 0,
            pair_on: &["rack"], down: &["D1", "D2", "D3"],
            prefill_offered: None, decode_offered: None, outcome: Err(Stage::Decode) },
        Case { name: "no prefill at all: a prefill miss", prefill_nth: 0, pair_on: &["rack"],
            down: &["P1", "P2", "P3"],
            prefill_offered: None, decode_offered: None, outcome: Err(Stage::Prefill) },
        Case { name: "a label nobody has pairs nothing", prefill_nth: 0, pair_on: &["zone"], down: &[],
            prefill_offered: None, decode_offered: None, outcome: Err(Stage::Decode) },
        Case { name: "two labels must both match", prefill_nth: 0, pair_on: &["rack", "zone"], down: &[],
            prefill_offered: None, decode_offered: None, outcome: Err(Stage::Decode) },
    ];
    let model = model();
    for case in cases {
        let registry = racks();
        for name in case.down {
            registry.set_health(&id(name), false).expect("known");
        }
        let (prefill, decode) = (Scripted::nth(case.prefill_nth), Scripted::first());
        let groups = pd_paired((None, &prefill), (None, &decode), case.pair_on);
        let bucket = bucket("b", 0, limits(0, None), None, groups);
        let outcome = bucket.pick_engines(&registry, &request(&model, 5, None)).await;
        let offered = |policy: &Arc<Scripted>| policy.calls().first().map(|c| c.candidates.clone());
        let strings =
            |ids: Option<&[&str]>| ids.map(|i| i.iter().map(|s| (*s).to_owned()).collect());
        assert_eq!(offered(&prefill), strings(case.prefill_offered), "{}: prefill", case.name);
        assert_eq!(offered(&decode), strings(case.decode_offered), "{}: decode", case.name);
        match (outcome, case.outcome) {
            (Ok(BucketPick::Pd { prefill, decode }), Ok((p, d))) => {
                assert_eq!(
                    (prefill.worker.id().as_str(), decode.worker.id().as_str()),
                    (p, d),
                    "{}",
                    case.name
                );
            }
            (Err(err), Err(stage)) => {
                assert_eq!(err.stage, stage, "{}", case.name);
                assert!(
                    matches!(err.error, PickError::NoCandidates { stage: s } if s == stage),
                    "{}: {:?}",
                    case.name,
                    err.error
                );
                assert!(err.advances_bucket(), "{}: a miss moves on to the next bucket", case.name);
            }
            (got, want) => panic!("{}: got {got:?}, want {want:?}", case.name),
        }
    }
}

#[tokio::test]
async fn a_decode_miss_moves_on_to_the_next_bucket_where_both_engines_are_picked_again() {
    let registry = racks();
    let model = model();
    let (p1, d1) = (Scripted::first(), Scripted::first());
    let (p2, d2) = (Scripted::first(), Scripted::first());
    // The small bucket's only decode member is in the other rack.
    let small = bucket(
        "small",
        0,
        limits(0, Some(100)),
        None,
        pd_paired((Some(&["P1"]), &p1), (Some(&["D2"]), &d1), &["rack"]),
    );
    let large =
        bucket("large", 0, limits(0, None), None, pd_paired((None, &p2), (None, &d2), &["rack"]));
    let resolver = resolver(vec![small, large]);
    let selection = resolver.select(&registry, &request(&model, 5, None)).await.expect("selection");
    assert_eq!(selection.bucket.id(), "large");
    assert_eq!(names(selection.pick.workers()), ["P1", "D1"]);
    assert_eq!(selection.skipped.len(), 1);
    assert_eq!(selection.skipped[0].bucket.id(), "small");
    assert_eq!(selection.skipped[0].error.stage, Stage::Decode);
    assert!(p1.calls().is_empty() && d1.calls().is_empty(), "nothing to offer in the small bucket");
}

#[tokio::test]
async fn a_paired_bucket_has_candidates_only_when_a_compatible_pair_is_up() {
    let registry = racks();
    let model = model();
    let first = Scripted::first();
    let bucket = bucket(
        "b",
        0,
        limits(0, None),
        None,
        pd_paired((Some(&["P1", "P3"]), &first), (Some(&["D2", "D3", "D4"]), &first), &["rack"]),
    );
    assert!(bucket.has_candidates(&registry, &model), "P1 with D3");
    registry.set_health(&id("D3"), false).expect("known");
    assert!(
        !bucket.has_candidates(&registry, &model),
        "P1 has no partner left and unlabelled P3 and D4 never pair"
    );
}

#[test]
fn startup_warnings_name_each_prefill_engine_without_a_partner_and_unknown_labels() {
    let registry = racks();
    // Health does not matter to a configuration check.
    registry.set_health(&id("D2"), false).expect("known");
    let workers = registry.workers();
    let first = Scripted::first();
    let only_a = bucket(
        "only-a",
        0,
        limits(0, None),
        None,
        pd_paired((None, &first), (Some(&["D1", "D3"]), &first), &["rack", "zone"]),
    );
    let warnings: Vec<String> =
        only_a.pairing_warnings(&workers, None).iter().map(ToString::to_string).collect();
    assert_eq!(
        warnings,
        [
            "bucket only-a: no worker has the pair_on label \"zone\", so no prefill engine can be paired there",
            "bucket only-a: prefill engine P1 lacks the pair_on label(s) zone, so it pairs with no decode engine and is never selected there",
            "bucket only-a: prefill engine P2 lacks the pair_on label(s) zone, so it pairs with no decode engine and is never selected there",
            "bucket only-a: prefill engine P3 lacks the pair_on label(s) rack, zone, so it pairs with no decode engine and is never selected there",
        ]
    );

    let by_rack = bucket(
        "racks",
        0,
        limits(0, None),
        None,
        pd_paired((None, &first), (Some(&["D1", "D3"]), &first), &["rack"]),
    );
    let warnings = by_rack.pairing_warnings(&workers, None);
    assert_eq!(
        warnings,
        [
            PairingWarning::UnpairedPrefill {
                bucket: "racks".into(),
                prefill: id("P2"),
                missing: vec![]
            },
            PairingWarning::UnpairedPrefill {
                bucket: "racks".into(),
                prefill: id("P3"),
                missing: vec!["rack".into()]
            },
        ]
    );
    assert_eq!(
        warnings[0].to_string(),
        "bucket racks: prefill engine P2 has no decode engine with the same pair_on labels, so it is never selected there"
    );
    assert_eq!(by_rack.pairing_warnings(&workers, Some(&id("P2"))), warnings[..1], "one engine");
    assert!(by_rack.pairing_warnings(&workers, Some(&id("P1"))).is_empty(), "P1 has D1");

    let unconstrained =
        bucket("any", 0, limits(0, None), None, pd((None, &first), (Some(&["D4"]), &first)));
    assert!(unconstrained.pairing_warnings(&workers, None).is_empty());
}

#[tokio::test]
async fn drained_starting_and_draining_engines_are_no_candidates() {
    /// What happens to A.
    type Change = fn(&WorkerRegistry);
    // (what happens to A, whether A is still offered)
    #[rustfmt::skip]
    let cases: [(&str, Change, bool); 7] = [
        ("nothing", |_| {}, true),
        ("reports serving", |r| { r.set_reported_status(&r.get(&id("A")).expect("A"), EngineStatus::Serving); }, true),
        ("reports starting", |r| { r.set_reported_status(&r.get(&id("A")).expect("A"), EngineStatus::Starting); }, false),
        ("reports draining", |r| { r.set_reported_status(&r.get(&id("A")).expect("A"), EngineStatus::Draining); }, false),
        ("drained by the operator", |r| { r.set_drained(&id("A"), true).expect("known"); }, false),
        ("drained then resumed", |r| { r.set_drained(&id("A"), true).expect("known"); r.set_drained(&id("A"), false).expect("known"); }, true),
        ("resumed while reporting draining", |r| {
            r.set_reported_status(&r.get(&id("A")).expect("A"), EngineStatus::Draining);
            r.set_drained(&id("A"), false).expect("known");
        }, false),
    ];
    let model = model();
    for (name, change, offered) in cases {
        let registry = fleet(&[("A", Stage::Plain), ("B", Stage::Plain)]);
        change(&registry);
        let policy = Scripted::first();
        let plain = router_buckets::BucketGroups::Plain(group(Stage::Plain, None, &policy));
        let bucket = bucket("b", 0, limits(0, None), None, plain);
        let pick = bucket.pick_engines(&registry, &request(&model, 5, None)).await.expect(name);
        let want = if offered { vec!["A", "B"] } else { vec!["B"] };
        assert_eq!(policy.calls()[0].candidates, want, "{name}");
        assert_eq!(names(pick.workers()), [want[0]], "{name}");
        registry.set_health(&id("B"), false).expect("known");
        assert_eq!(bucket.has_candidates(&registry, &model), offered, "{name}: readiness");
    }
}
