//! `BucketResolver::resolve`: signal validation, length filtering and the total order.

use proptest::prelude::*;
use router_buckets::{Bucket, BucketResolver, ResolveError};

use crate::support::*;

/// Listed deliberately out of resolution order.
fn fixture() -> BucketResolver {
    resolver(vec![
        plain_bucket("all", 7, limits(0, None), None),
        plain_bucket("tie-y", 2, limits(100, Some(6000)), None),
        plain_bucket("mid-b", 5, limits(0, Some(4000)), Some(4000)),
        plain_bucket("open", 0, limits(500, None), None),
        plain_bucket("tie-x", 2, limits(100, Some(7000)), Some(6000)),
        plain_bucket("ctx3k", 9, limits(0, None), Some(3000)),
        plain_bucket("mid-a", 1, limits(0, Some(4000)), Some(8000)),
        plain_bucket("tiny", 0, limits(0, Some(1000)), Some(2000)),
    ])
}

#[test]
fn resolves_compatible_buckets_by_capacity_then_rank_then_id() {
    let cases: &[(u64, Option<u64>, &[&str])] = &[
        (0, None, &["tiny", "ctx3k", "mid-a", "mid-b", "all"]),
        (1000, None, &["tiny", "ctx3k", "mid-a", "mid-b", "tie-x", "tie-y", "open", "all"]),
        // Peak equal to the context capacity fits; one more does not.
        (1000, Some(2000), &["tiny", "ctx3k", "mid-a", "mid-b", "tie-x", "tie-y", "open", "all"]),
        (1000, Some(2001), &["ctx3k", "mid-a", "mid-b", "tie-x", "tie-y", "open", "all"]),
        // Input one past the inclusive upper bound.
        (1001, None, &["ctx3k", "mid-a", "mid-b", "tie-x", "tie-y", "open", "all"]),
        (2000, Some(4001), &["mid-a", "tie-x", "tie-y", "open", "all"]),
        (4001, None, &["tie-x", "tie-y", "open", "all"]),
        // Within tie-x's range but beyond its context capacity.
        (6500, None, &["open", "all"]),
        (50, Some(6000), &["mid-a", "all"]),
        // A peak equal to the input is valid.
        (10, Some(10), &["tiny", "ctx3k", "mid-a", "mid-b", "all"]),
    ];
    let resolver = fixture();
    for &(input, peak, expected) in cases {
        assert_eq!(resolved_ids(&resolver, input, peak), expected, "input {input}, peak {peak:?}");
    }
}

#[test]
fn a_peak_below_the_input_is_an_invalid_signal() {
    let err = fixture().resolve(10, Some(9)).expect_err("peak below input");
    assert_eq!(err, ResolveError::InvalidSignal { input_tokens: 10, expected_peak_tokens: 9 });
    assert!(err.to_string().contains("9") && err.to_string().contains("10"), "{err}");
}

#[test]
fn no_compatible_bucket_is_an_empty_list() {
    let resolver = resolver(vec![plain_bucket("tiny", 0, limits(10, Some(1000)), Some(2000))]);
    assert!(resolver.resolve(5000, None).expect("valid").is_empty());
    assert!(resolver.resolve(9, None).expect("valid").is_empty(), "below min");
    assert!(resolver.resolve(500, Some(2001)).expect("valid").is_empty(), "peak too large");
}

#[test]
fn input_capacity_is_the_lesser_bound() {
    let cases = [
        (Some(4000), Some(8000), Some(4000)),
        (Some(9000), Some(8000), Some(8000)),
        (None, Some(8000), Some(8000)),
        (Some(4000), None, Some(4000)),
        (None, None, None),
    ];
    for (max, context, capacity) in cases {
        let bucket = plain_bucket("b", 0, limits(0, max), context);
        assert_eq!(bucket.input_capacity(), capacity, "max {max:?}, context {context:?}");
    }
}

// ---- property tests ----------------------------------------------------------------------

/// (rank, min, max, context) drawn from small sets so equal capacities and ranks are common.
fn bucket_params() -> impl Strategy<Value = (u32, u64, Option<u64>, Option<u64>)> {
    (
        0u32..3,
        prop_oneof![Just(0u64), Just(10), Just(50)],
        prop_oneof![Just(None), Just(Some(50u64)), Just(Some(100)), Just(Some(200))],
        prop_oneof![Just(None), Just(Some(60u64)), Just(Some(100)), Just(Some(300))],
    )
        .prop_filter("valid bucket", |&(_, min, max, context)| {
            max.is_none_or(|max| min <= max) && context.is_none_or(|c| min <= c)
        })
}

type Params = Vec<(String, u32, u64, Option<u64>, Option<u64>)>;

fn buckets_and_shuffle() -> impl Strategy<Value = (Params, Params)> {
    prop::collection::vec(bucket_params(), 1..9).prop_flat_map(|params| {
        let named: Params = params
            .into_iter()
            .enumerate()
            .map(|(i, (rank, min, max, context))| (format!("b{i}"), rank, min, max, context))
            .collect();
        (Just(named.clone()), Just(named).prop_shuffle())
    })
}

fn build(params: &Params) -> BucketResolver {
    resolver(
        params
            .iter()
            .map(|(id, rank, min, max, context)| {
                plain_bucket(id, *rank, limits(*min, *max), *context)
            })
            .collect(),
    )
}

/// The order key, computed independently of the crate: unbounded is `u128::MAX`.
fn key(bucket: &Bucket) -> (u128, u32, String) {
    let bound = |v: Option<u64>| v.map_or(u128::MAX, u128::from);
    let capacity = bound(bucket.limits().max).min(bound(bucket.max_context_tokens()));
    (capacity, bucket.rank(), bucket.id().to_owned())
}

fn compatible(bucket: &Bucket, input: u64, peak: Option<u64>) -> bool {
    let limits = bucket.limits();
    let in_range = limits.min <= input && limits.max.is_none_or(|max| input <= max);
    let fits = bucket.max_context_tokens().is_none_or(|c| peak.unwrap_or(input) <= c);
    in_range && fits
}

fn request_lengths() -> impl Strategy<Value = (u64, Option<u64>)> {
    (0u64..320).prop_flat_map(|input| (Just(input), prop::option::of(input..input + 250)))
}

proptest! {
    /// Exactly the compatible buckets are returned, each once, in strictly increasing
    /// (capacity, rank, id) order.
    #[test]
    fn resolves_exactly_the_compatible_buckets_in_strict_order(
        (params, _) in buckets_and_shuffle(),
        (input, peak) in request_lengths(),
    ) {
        let resolver = build(&params);
        let resolved = resolver.resolve(input, peak).expect("peak >= input");
        let mut expected: Vec<&Bucket> =
            resolver.buckets().iter().filter(|b| compatible(b, input, peak)).collect();
        expected.sort_by_key(|b| key(b));
        let ids = |list: &[&Bucket]| list.iter().map(|b| b.id().to_owned()).collect::<Vec<_>>();
        prop_assert_eq!(ids(&resolved), ids(&expected));
        for pair in resolved.windows(2) {
            prop_assert!(key(pair[0]) < key(pair[1]), "not strictly ordered: {:?}", ids(pair));
        }
    }

    /// The order depends on the buckets, not on their configuration order or on repetition.
    #[test]
    fn order_is_stable_under_configuration_order(
        (params, shuffled) in buckets_and_shuffle(),
        (input, peak) in request_lengths(),
    ) {
        let original = build(&params);
        let reordered = build(&shuffled);
        let first = resolved_ids(&original, input, peak);
        prop_assert_eq!(&first, &resolved_ids(&reordered, input, peak));
        prop_assert_eq!(&first, &resolved_ids(&original, input, peak));
    }

    /// A known peak below the input is always rejected, whatever the buckets.
    #[test]
    fn peaks_below_input_are_always_rejected(
        (params, _) in buckets_and_shuffle(),
        input in 1u64..10_000,
        shortfall in 1u64..10_000,
    ) {
        let peak = input.saturating_sub(shortfall);
        let is_invalid = matches!(
            build(&params).resolve(input, Some(peak)),
            Err(ResolveError::InvalidSignal { .. })
        );
        prop_assert!(is_invalid);
    }
}
