//! The example of docs/design/POLICY_DESIGN.md §7, as a test.

use router_buckets::{BucketPick, BucketResolver};
use router_workers::{Stage, WorkerRegistry};

use crate::support::*;

/// Two PD buckets, `short-context` (P1, P2 / D1, D2) and `long-context` (P3, P4 / D3, D4).
fn example() -> (WorkerRegistry, BucketResolver) {
    let registry = fleet(&[
        ("P1", Stage::Prefill),
        ("P2", Stage::Prefill),
        ("P3", Stage::Prefill),
        ("P4", Stage::Prefill),
        ("D1", Stage::Decode),
        ("D2", Stage::Decode),
        ("D3", Stage::Decode),
        ("D4", Stage::Decode),
    ]);
    let (prefill, decode) = (Scripted::nth(1), Scripted::first());
    let resolver = resolver(vec![
        bucket(
            "short-context",
            10,
            limits(0, Some(4096)),
            Some(8192),
            pd((Some(&["P1", "P2"]), &prefill), (Some(&["D1", "D2"]), &decode)),
        ),
        bucket(
            "long-context",
            20,
            limits(0, Some(131_072)),
            Some(131_072),
            pd((Some(&["P3", "P4"]), &prefill), (Some(&["D3", "D4"]), &decode)),
        ),
    ]);
    (registry, resolver)
}

fn selected(pick: &BucketPick) -> [String; 2] {
    let BucketPick::Pd { prefill, decode } = pick else { panic!("expected PD, got {pick:?}") };
    [prefill.worker.id().to_string(), decode.worker.id().to_string()]
}

#[tokio::test]
async fn a_16k_peak_selects_the_long_bucket_and_both_of_its_groups() {
    let (registry, resolver) = example();
    let model = model();
    assert_eq!(resolved_ids(&resolver, 4096, Some(16_384)), ["long-context"]);
    let selection =
        resolver.select(&registry, &request(&model, 4096, Some(16_384))).await.expect("select");
    assert_eq!(selection.bucket.id(), "long-context");
    assert_eq!(selected(&selection.pick), ["P4", "D3"]);
}

#[tokio::test]
async fn a_known_peak_of_8k_or_less_selects_the_short_bucket() {
    let (registry, resolver) = example();
    let model = model();
    for peak in [Some(4096), Some(6000), Some(8192), None] {
        assert_eq!(
            resolved_ids(&resolver, 4096, peak),
            ["short-context", "long-context"],
            "peak {peak:?}"
        );
        let selection =
            resolver.select(&registry, &request(&model, 4096, peak)).await.expect("select");
        assert_eq!(selection.bucket.id(), "short-context", "peak {peak:?}");
        assert_eq!(selected(&selection.pick), ["P2", "D1"], "peak {peak:?}");
    }
    assert_eq!(resolved_ids(&resolver, 4096, Some(8193)), ["long-context"]);
}
