//! `BucketResolver::select`: the bucket loop.

use std::sync::Arc;

use router_buckets::{BucketPick, ResolveError, SelectError};
use router_workers::{ModelId, Stage};

use crate::support::*;

fn pd_fleet() -> router_workers::WorkerRegistry {
    fleet(&[
        ("P1", Stage::Prefill),
        ("P2", Stage::Prefill),
        ("D1", Stage::Decode),
        ("D2", Stage::Decode),
    ])
}

/// Two PD buckets: `short` (P1 + D1, capacity 4096) tried before `long` (P2 + D2).
struct TwoBuckets {
    short_prefill: Arc<Scripted>,
    short_decode: Arc<Scripted>,
    long_prefill: Arc<Scripted>,
    long_decode: Arc<Scripted>,
    short_decode_members: Option<&'static [&'static str]>,
}

impl TwoBuckets {
    fn new(short_decode: Arc<Scripted>) -> Self {
        Self {
            short_prefill: Scripted::first(),
            short_decode,
            long_prefill: Scripted::first(),
            long_decode: Scripted::first(),
            short_decode_members: Some(&["D1"]),
        }
    }

    fn resolver(&self) -> router_buckets::BucketResolver {
        resolver(vec![
            bucket(
                "long",
                20,
                limits(0, None),
                Some(131_072),
                pd((Some(&["P2"]), &self.long_prefill), (Some(&["D2"]), &self.long_decode)),
            ),
            bucket(
                "short",
                10,
                limits(0, Some(4096)),
                Some(8192),
                pd(
                    (Some(&["P1"]), &self.short_prefill),
                    (self.short_decode_members, &self.short_decode),
                ),
            ),
        ])
    }
}

fn pair(pick: &BucketPick) -> (String, String) {
    match pick {
        BucketPick::Pd { prefill, decode } => {
            (prefill.worker.id().to_string(), decode.worker.id().to_string())
        }
        BucketPick::Plain(_) => panic!("expected a PD pick, got {pick:?}"),
    }
}

#[tokio::test]
async fn first_bucket_with_a_complete_selection_wins() {
    let registry = pd_fleet();
    let model = model();
    let setup = TwoBuckets::new(Scripted::first());
    let resolver = setup.resolver();
    let selection = resolver.select(&registry, &request(&model, 100, None)).await.expect("select");
    assert_eq!(selection.bucket.id(), "short");
    assert_eq!(pair(&selection.pick), ("P1".into(), "D1".into()));
    assert!(selection.skipped.is_empty());
    assert!(setup.long_prefill.calls().is_empty(), "later bucket not asked");
    let picks: Vec<_> = selection
        .picks()
        .map(|(group, pick)| (group.stage(), pick.worker.id().to_string()))
        .collect();
    assert_eq!(picks, [(Stage::Prefill, "P1".into()), (Stage::Decode, "D1".into())]);
}

#[tokio::test]
async fn decode_failure_discards_the_tentative_prefill_pick() {
    for (name, short_decode, members) in [
        ("no decode candidates", Scripted::first(), Some(&[][..])),
        ("decode admission rejected", Scripted::reject(), Some(&["D1"][..])),
    ] {
        let registry = pd_fleet();
        let model = model();
        let mut setup = TwoBuckets::new(short_decode);
        setup.short_decode_members = members;
        let resolver = setup.resolver();
        let selection = resolver.select(&registry, &request(&model, 100, None)).await.expect(name);

        // The short bucket's prefill pick (P1) was made, then dropped with its bucket.
        assert_eq!(setup.short_prefill.calls().len(), 1, "{name}");
        assert_eq!(selection.bucket.id(), "long", "{name}");
        assert_eq!(pair(&selection.pick), ("P2".into(), "D2".into()), "{name}");
        // Both engines were selected again in the long bucket.
        assert_eq!(setup.long_prefill.calls().len(), 1, "{name}");
        assert_eq!(setup.long_prefill.calls()[0].bucket, "long", "{name}");
        assert_eq!(setup.long_decode.calls().len(), 1, "{name}");
        let skipped: Vec<_> =
            selection.skipped.iter().map(|s| (s.bucket.id(), s.error.stage)).collect();
        assert_eq!(skipped, [("short", Stage::Decode)], "{name}");
    }
}

#[tokio::test]
async fn failures_that_do_not_advance_stop_routing() {
    let registry = pd_fleet();
    let model = model();
    let cases = [
        ("invalid key", Scripted::fail(too_long_key())),
        ("unsupported stage", Scripted::fail(unsupported_stage())),
        ("foreign pick", Scripted::returning(Arc::new(worker("D1", Stage::Decode, &model)))),
    ];
    for (name, short_decode) in cases {
        let setup = TwoBuckets::new(short_decode);
        let resolver = setup.resolver();
        let failure =
            resolver.select(&registry, &request(&model, 100, None)).await.expect_err(name);
        assert!(failure.skipped.is_empty(), "{name}: the first bucket stopped routing");
        let SelectError::Stopped { bucket, error } = &failure.error else {
            panic!("{name}: {failure:?}")
        };
        assert_eq!((bucket.as_str(), error.stage), ("short", Stage::Decode), "{name}");
        assert!(setup.long_prefill.calls().is_empty(), "{name}: routing went on");
    }
}

#[tokio::test]
async fn exhaustion_reports_rejections_or_the_last_unavailable_stage() {
    let registry = pd_fleet();
    let model = model();

    // Rejections from every bucket accumulate in order.
    let mut setup = TwoBuckets::new(Scripted::reject());
    setup.long_prefill = Scripted::reject();
    let err = setup
        .resolver()
        .select(&registry, &request(&model, 100, None))
        .await
        .expect_err("all")
        .error;
    let SelectError::NoAdmissibleEngine { rejections } = &err else { panic!("{err}") };
    assert_eq!(*rejections, [rejection("D1"), rejection("P2")]);
    let resolver = setup.resolver();
    let failure = resolver.select(&registry, &request(&model, 100, None)).await.expect_err("all");
    let skipped: Vec<_> = failure.skipped.iter().map(|s| (s.bucket.id(), s.error.stage)).collect();
    assert_eq!(skipped, [("short", Stage::Decode), ("long", Stage::Prefill)], "both passed over");
    assert!(err.to_string().contains("D1") && err.to_string().contains("P2"), "{err}");

    // One rejection among missing candidates is still an admission failure.
    let mut setup = TwoBuckets::new(Scripted::reject());
    setup.long_prefill = Scripted::first();
    let resolver = setup.resolver();
    registry.set_health(&id("D2"), false).expect("known");
    let err = resolver.select(&registry, &request(&model, 100, None)).await.expect_err("all").error;
    let SelectError::NoAdmissibleEngine { rejections } = &err else { panic!("{err}") };
    assert_eq!(*rejections, [rejection("D1")]);

    // No rejections: the last stage without candidates (long's prefill, short's was decode).
    registry.set_health(&id("D2"), true).expect("known");
    registry.set_health(&id("P2"), false).expect("known");
    let mut setup = TwoBuckets::new(Scripted::first());
    setup.short_decode_members = Some(&[]);
    let err = setup
        .resolver()
        .select(&registry, &request(&model, 100, None))
        .await
        .expect_err("all")
        .error;
    assert!(matches!(err, SelectError::NoCandidates { stage: Stage::Prefill }), "{err}");
}

#[tokio::test]
async fn signals_and_lengths_are_checked_before_any_pick() {
    let registry = pd_fleet();
    let model = model();
    let setup = TwoBuckets::new(Scripted::first());
    let resolver = setup.resolver();

    let err =
        resolver.select(&registry, &request(&model, 100, Some(99))).await.expect_err("peak").error;
    assert!(
        matches!(err, SelectError::Resolve(ResolveError::InvalidSignal { input_tokens: 100, .. })),
        "{err}"
    );
    let err = resolver
        .select(&registry, &request(&model, 100, Some(200_000)))
        .await
        .expect_err("long")
        .error;
    assert!(
        matches!(
            err,
            SelectError::NoMatchingBucket {
                input_tokens: 100,
                expected_peak_tokens: Some(200_000)
            }
        ),
        "{err}"
    );
    let other = ModelId::new("qwen");
    let err =
        resolver.select(&registry, &request(&other, 100, None)).await.expect_err("model").error;
    assert!(matches!(err, SelectError::WrongModel { .. }), "{err}");
    assert!(setup.short_prefill.calls().is_empty() && setup.long_prefill.calls().is_empty());
}

#[tokio::test]
async fn readiness_needs_one_bucket_with_candidates_in_every_group() {
    let registry = pd_fleet();
    let setup = TwoBuckets::new(Scripted::first());
    let resolver = setup.resolver();
    assert!(resolver.has_candidates(&registry));
    registry.set_health(&id("D1"), false).expect("known");
    assert!(resolver.has_candidates(&registry), "long still complete");
    registry.set_health(&id("P2"), false).expect("known");
    assert!(!resolver.has_candidates(&registry), "short lacks decode, long lacks prefill");
}
