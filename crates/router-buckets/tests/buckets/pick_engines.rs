//! `Bucket::pick_engines`: plain and PD orchestration, stage-specific requests, failures with
//! their stage.

use std::sync::Arc;

use router_buckets::{BucketGroups, BucketPick};
use router_workers::Stage;

use crate::support::*;

fn pd_fleet() -> router_workers::WorkerRegistry {
    fleet(&[
        ("P1", Stage::Prefill),
        ("P2", Stage::Prefill),
        ("D1", Stage::Decode),
        ("D2", Stage::Decode),
    ])
}

#[tokio::test]
async fn plain_bucket_picks_one_plain_engine() {
    let registry = fleet(&[("A", Stage::Plain), ("B", Stage::Plain)]);
    let model = model();
    let policy = Scripted::nth(1);
    let bucket = bucket(
        "only",
        0,
        limits(0, None),
        None,
        BucketGroups::Plain(group(Stage::Plain, None, &policy)),
    );
    let pick = bucket.pick_engines(&registry, &request(&model, 5, None)).await.expect("pick");
    let BucketPick::Plain(plain) = &pick else { panic!("expected a plain pick, got {pick:?}") };
    assert_eq!(plain.worker.id().as_str(), "B");
    assert_eq!(pick.iter().map(|(s, _)| s).collect::<Vec<_>>(), [Stage::Plain]);
    assert_eq!(names(pick.workers()), ["B"]);
    let calls = policy.calls();
    assert_eq!((calls[0].bucket.as_str(), calls[0].stage), ("only", Stage::Plain));
}

#[tokio::test]
async fn pd_bucket_picks_prefill_then_decode_with_their_own_stage() {
    let registry = pd_fleet();
    let model = model();
    let (prefill, decode) = (Scripted::nth(1), Scripted::first());
    let bucket = bucket("pd", 3, limits(0, None), None, pd((None, &prefill), (None, &decode)));
    let pick = bucket.pick_engines(&registry, &request(&model, 5, Some(9))).await.expect("pick");
    let BucketPick::Pd { prefill: p, decode: d } = &pick else {
        panic!("expected PD, got {pick:?}")
    };
    assert_eq!((p.worker.id().as_str(), d.worker.id().as_str()), ("P2", "D1"));
    assert_eq!(
        pick.iter().map(|(s, p)| (s, p.worker.id().to_string())).collect::<Vec<_>>(),
        [(Stage::Prefill, "P2".to_owned()), (Stage::Decode, "D1".to_owned())]
    );
    let (prefill_calls, decode_calls) = (prefill.calls(), decode.calls());
    assert_eq!(prefill_calls.len(), 1);
    assert_eq!(decode_calls.len(), 1);
    assert_eq!((prefill_calls[0].bucket.as_str(), prefill_calls[0].stage), ("pd", Stage::Prefill));
    assert_eq!((decode_calls[0].bucket.as_str(), decode_calls[0].stage), ("pd", Stage::Decode));
    assert_eq!(prefill_calls[0].candidates, ["P1", "P2"]);
    assert_eq!(decode_calls[0].candidates, ["D1", "D2"]);
    assert_eq!(decode_calls[0].expected_peak_tokens, Some(9));
}

#[tokio::test]
async fn failures_keep_their_stage() {
    struct Case {
        name: &'static str,
        prefill: (Option<&'static [&'static str]>, Arc<Scripted>),
        decode: (Option<&'static [&'static str]>, Arc<Scripted>),
        stage: Stage,
        advances: bool,
        prefill_calls: usize,
        decode_called: bool,
    }
    let cases = [
        Case {
            name: "prefill empty group",
            prefill: (Some(&[]), Scripted::first()),
            decode: (None, Scripted::first()),
            stage: Stage::Prefill,
            advances: true,
            prefill_calls: 0,
            decode_called: false,
        },
        Case {
            name: "prefill unsupported stage",
            prefill: (None, Scripted::fail(unsupported_stage())),
            decode: (None, Scripted::first()),
            stage: Stage::Prefill,
            advances: false,
            prefill_calls: 1,
            decode_called: false,
        },
        Case {
            name: "decode empty group",
            prefill: (None, Scripted::first()),
            decode: (Some(&[]), Scripted::first()),
            stage: Stage::Decode,
            advances: true,
            prefill_calls: 1,
            decode_called: false,
        },
        Case {
            name: "decode admission rejection",
            prefill: (None, Scripted::first()),
            decode: (None, Scripted::reject()),
            stage: Stage::Decode,
            advances: true,
            prefill_calls: 1,
            decode_called: true,
        },
        Case {
            name: "decode foreign pick",
            prefill: (None, Scripted::first()),
            decode: (None, Scripted::returning(Arc::new(worker("D1", Stage::Decode, &model())))),
            stage: Stage::Decode,
            advances: false,
            prefill_calls: 1,
            decode_called: true,
        },
    ];
    let registry = pd_fleet();
    let model = model();
    for case in cases {
        let bucket = bucket(
            "b",
            0,
            limits(0, None),
            None,
            pd((case.prefill.0, &case.prefill.1), (case.decode.0, &case.decode.1)),
        );
        let err =
            bucket.pick_engines(&registry, &request(&model, 5, None)).await.expect_err(case.name);
        assert_eq!(err.stage, case.stage, "{}", case.name);
        assert_eq!(err.advances_bucket(), case.advances, "{}: {:?}", case.name, err.error);
        assert_eq!(!case.decode.1.calls().is_empty(), case.decode_called, "{}", case.name);
        assert_eq!(case.prefill.1.calls().len(), case.prefill_calls, "{}", case.name);
    }
}

#[tokio::test]
async fn a_pd_bucket_has_candidates_only_when_both_groups_do() {
    let registry = pd_fleet();
    let model = model();
    let first = Scripted::first();
    let bucket =
        bucket("b", 0, limits(0, None), None, pd((Some(&["P1"]), &first), (Some(&["D2"]), &first)));
    assert!(bucket.has_candidates(&registry, &model));
    registry.set_health(&id("D2"), false).expect("known");
    assert!(!bucket.has_candidates(&registry, &model), "decode group now empty");
    registry.set_health(&id("D2"), true).expect("known");
    registry.set_health(&id("P1"), false).expect("known");
    assert!(!bucket.has_candidates(&registry, &model), "prefill group now empty");
}

#[test]
fn selection_futures_are_send() {
    fn assert_send<T: Send>(_: &T) {}
    let registry = pd_fleet();
    let model = model();
    let first = Scripted::first();
    let resolver =
        resolver(vec![bucket("b", 0, limits(0, None), None, pd((None, &first), (None, &first)))]);
    let req = request(&model, 1, None);
    let bucket = &resolver.buckets()[0];
    assert_send(&bucket.pick_engines(&registry, &req));
    assert_send(&resolver.select(&registry, &req));
}
