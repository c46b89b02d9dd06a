//! The predicted-entry rules: expiry, replacement by engine truth, contradiction, bounds.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use router_workers::{ModelId, WorkerId};

use super::*;
use crate::KvIndex;
use crate::hash::Salt;
use crate::wire::{BlockRemoved, BlockStored, Event};

fn id(s: &str) -> WorkerId {
    WorkerId::new(s).expect("id")
}

fn model() -> ModelId {
    ModelId::new("m")
}

fn predictions(ttl_ms: u64, cap: usize) -> Predictions {
    Predictions::new(PredictionConfig {
        ttl: Duration::from_millis(ttl_ms),
        max_blocks_per_worker: cap,
        ..PredictionConfig::default()
    })
}

fn approximate(ttl_ms: u64, cap: usize) -> Predictions {
    Predictions::new(PredictionConfig {
        approximate_ttl: Duration::from_millis(ttl_ms),
        approximate_max_blocks: cap,
        ..PredictionConfig::default()
    })
}

fn predicted(blocks: u64) -> PredictedBlocks {
    PredictedBlocks { predicted: blocks, approximate: 0 }
}

#[test]
fn recorded_blocks_count_until_they_expire() {
    let p = predictions(100, 1024);
    let t0 = Instant::now();
    let (m, a) = (model(), id("a"));
    p.record(&m, &a, &[1, 2, 3], t0);
    assert_eq!(p.leading(&m, &a, &[1, 2, 3, 4], t0), 3);
    assert_eq!(p.leading(&m, &a, &[1, 9, 3], t0), 1, "only leading blocks count");
    assert_eq!(p.leading(&m, &id("b"), &[1], t0), 0, "workers never mix");
    assert_eq!(p.leading(&ModelId::new("other"), &a, &[1], t0), 0, "models never mix");
    assert_eq!(p.leading(&m, &a, &[1], t0 + Duration::from_millis(99)), 1);
    assert_eq!(p.leading(&m, &a, &[1], t0 + Duration::from_millis(100)), 0, "expired");
    // A new record renews the expiry of the blocks it names.
    p.record(&m, &a, &[1], t0 + Duration::from_millis(50));
    let later = t0 + Duration::from_millis(120);
    assert_eq!(p.leading(&m, &a, &[1, 2], later), 1);
    assert_eq!(p.blocks(later), predicted(1));
    assert_eq!(p.blocks(t0 + Duration::from_secs(1)), predicted(0));
}

#[test]
fn the_overlay_adds_predictions_and_drops_those_the_index_covers() {
    let p = predictions(1000, 1024);
    let t0 = Instant::now();
    let (m, a, b) = (model(), id("a"), id("b"));
    p.record(&m, &a, &[1, 2, 3], t0);
    p.record(&m, &b, &[1], t0);
    let indexed = PrefixMatches {
        query_blocks: 4,
        matches: vec![PrefixMatch { worker: b.clone(), rank: 1, blocks: 2, tier: Medium::Cpu }],
    };
    let merged = p.overlay(&m, &[1, 2, 3, 4], indexed.clone(), t0);
    assert_eq!(merged.blocks(&a), 3, "predicted beyond the index");
    assert_eq!(merged.blocks(&b), 2, "the index already says more");
    assert_eq!(merged.matches[0].worker, a, "longest first");
    assert_eq!(merged.get(&a).map(|m| (m.rank, m.tier)), Some((0, Medium::Gpu)));
    // b's prediction was covered by the engine's own events: replaced, so gone.
    assert_eq!(p.leading(&m, &b, &[1], t0), 0);
    // A worker the index knows at a shorter depth is raised, keeping its rank.
    let shorter = PrefixMatches {
        query_blocks: 4,
        matches: vec![PrefixMatch { worker: a.clone(), rank: 2, blocks: 1, tier: Medium::Cpu }],
    };
    let merged = p.overlay(&m, &[1, 2, 3, 4], shorter, t0);
    assert_eq!(merged.get(&a).map(|m| (m.blocks, m.rank)), Some((3, 2)));
    assert_eq!(p.overlay(&m, &[7], indexed.clone(), t0), indexed, "nothing predicted");
}

#[test]
fn a_lookup_of_the_indexed_opening_alone_leaves_the_prediction_beyond_it() {
    // Every prompt opens with the same block (a chat template's), which the index holds on
    // every engine. A burst's first request goes to a; a lookup of any other prompt that
    // shares only that block must not drop what a is predicted to hold after it.
    let p = predictions(1000, 1024);
    let t0 = Instant::now();
    let (m, a) = (model(), id("a"));
    p.record(&m, &a, &[1, 2, 3], t0);
    let opening = PrefixMatches {
        query_blocks: 2,
        matches: vec![PrefixMatch { worker: a.clone(), rank: 0, blocks: 1, tier: Medium::Gpu }],
    };
    let merged = p.overlay(&m, &[1, 9], opening.clone(), t0);
    assert_eq!(merged.blocks(&a), 1, "only the opening is shared");
    // The sibling that follows still finds the prediction, on top of the indexed opening.
    let sibling = PrefixMatches { query_blocks: 4, ..opening };
    let merged = p.overlay(&m, &[1, 2, 3, 4], sibling, t0);
    assert_eq!(merged.blocks(&a), 3, "indexed opening plus the predicted blocks after it");
}

#[test]
fn a_prediction_sent_to_a_rank_is_reported_on_that_rank() {
    let p = predictions(1000, 1024);
    let t0 = Instant::now();
    let (m, a, b) = (model(), id("a"), id("b"));
    p.record_on_rank(&m, &a, 3, &[1, 2, 3], t0);
    // The index holds one block of a on rank 1: the longer prediction moves it to rank 3.
    let indexed = PrefixMatches {
        query_blocks: 3,
        matches: vec![PrefixMatch { worker: a.clone(), rank: 1, blocks: 1, tier: Medium::Cpu }],
    };
    let merged = p.overlay(&m, &[1, 2, 3], indexed, t0);
    assert_eq!(merged.get(&a).map(|m| (m.blocks, m.rank)), Some((3, 3)));
    // A prefix whose later blocks went to another rank is held whole by neither.
    p.record_on_rank(&m, &b, 0, &[1, 2], t0);
    p.record_on_rank(&m, &b, 1, &[3], t0);
    assert_eq!(p.leading(&m, &b, &[1, 2, 3], t0), 2);
    let merged = p.overlay(&m, &[1, 2, 3], PrefixMatches { query_blocks: 3, matches: vec![] }, t0);
    assert_eq!(merged.get(&b).map(|m| (m.blocks, m.rank)), Some((2, 0)));
}

#[test]
fn contradicting_events_and_removal_forget_predictions() {
    let predictions = Arc::new(predictions(10_000, 1024));
    let index = KvIndex::default().with_predictions(Arc::clone(&predictions));
    let (m, a) = (model(), id("a"));
    let t0 = Instant::now();
    let holder = index.holder(&m, &a, 1, 0, 2).expect("holder");
    // The engine stores blocks [1,2] and [3,4] with engine hashes 0xa1, 0xa2.
    holder.apply(&[Event::Stored(BlockStored {
        block_hashes: vec![0xa1, 0xa2],
        token_ids: vec![1, 2, 3, 4],
        block_size: Some(2),
        ..BlockStored::default()
    })]);
    let prompt = [1, 2, 3, 4, 5, 6];
    let hashes = crate::hash::salted_block_hashes(&prompt, 2, Salt::default());
    predictions.record(&m, &a, &hashes, t0);
    assert_eq!(predictions.leading(&m, &a, &hashes, t0), 3);
    // Removing the second block contradicts the prediction from there on.
    holder.apply(&[Event::Removed(BlockRemoved {
        block_hashes: vec![0xa2],
        ..BlockRemoved::default()
    })]);
    assert_eq!(predictions.leading(&m, &a, &hashes, t0), 1);
    holder.apply(&[Event::AllCleared]);
    assert_eq!(predictions.leading(&m, &a, &hashes, t0), 0, "a clear drops everything");
    predictions.record(&m, &a, &hashes, t0);
    holder.clear();
    assert_eq!(predictions.leading(&m, &a, &hashes, t0), 0, "so does a lost history");
    predictions.record(&m, &a, &hashes, t0);
    index.remove_worker(&a);
    assert_eq!(predictions.blocks(t0), predicted(0), "a removed worker keeps nothing");
}

#[test]
fn memory_is_bounded_per_worker_oldest_first() {
    let p = predictions(60_000, 4);
    let t0 = Instant::now();
    let (m, a) = (model(), id("a"));
    p.record(&m, &a, &[1, 2, 3], t0);
    p.record(&m, &a, &[4, 5, 6], t0 + Duration::from_millis(1));
    let now = t0 + Duration::from_millis(2);
    assert_eq!(p.blocks(now), predicted(4));
    assert_eq!(p.leading(&m, &a, &[1], now), 0, "the oldest went first");
    assert_eq!(p.leading(&m, &a, &[3, 4, 5, 6], now), 4);
    let disabled = predictions(60_000, 0);
    disabled.record(&m, &a, &[1], t0);
    assert_eq!(disabled.blocks(t0), predicted(0));
}

#[test]
fn an_engine_without_events_is_pictured_by_its_dispatches_for_their_longer_life() {
    let p = approximate(120_000, 1_000);
    let t0 = Instant::now();
    let (m, a) = (model(), id("a"));
    p.record_approximate(&m, &a, Some(1), &[1, 2, 3], t0);
    assert!(p.is_approximate(&m, &a));
    let later = t0 + Duration::from_secs(60);
    assert_eq!(p.leading(&m, &a, &[1, 2, 3, 4], later), 3, "still held a minute on");
    let merged =
        p.overlay(&m, &[1, 2, 3], PrefixMatches { query_blocks: 3, matches: vec![] }, later);
    assert_eq!(merged.matches[0].rank, 1, "on the rank it was sent to");
    assert_eq!(p.blocks(later), PredictedBlocks { predicted: 0, approximate: 3 });
    assert_eq!(p.leading(&m, &a, &[1], t0 + Duration::from_secs(120)), 0, "expired");
}

#[test]
fn approximate_blocks_share_one_bound_between_engines() {
    let p = approximate(60_000, 8);
    let t0 = Instant::now();
    let m = model();
    let (a, b) = (id("a"), id("b"));
    p.record_approximate(&m, &a, None, &[1, 2, 3, 4, 5, 6, 7, 8], t0);
    assert_eq!(p.blocks(t0).approximate, 8, "alone, an engine has the whole bound");
    p.record_approximate(&m, &b, None, &[11, 12, 13, 14], t0);
    assert_eq!(p.blocks(t0).approximate, 8, "a second engine halves the first's share");
    assert_eq!(p.leading(&m, &a, &[5, 6, 7, 8], t0), 4, "the oldest went first");
    p.record_approximate(&m, &a, None, &[9], t0);
    assert_eq!(p.blocks(t0).approximate, 8);
    assert_eq!(p.leading(&m, &a, &[6, 7, 8, 9], t0), 4);
    let off = approximate(0, 8);
    off.record_approximate(&m, &a, None, &[1], t0);
    assert_eq!(off.blocks(t0), PredictedBlocks::default(), "a zero life turns it off");
}

#[test]
fn an_engine_that_gains_events_drops_its_approximate_picture() {
    let p = Predictions::new(PredictionConfig::default());
    let t0 = Instant::now();
    let (m, a) = (model(), id("a"));
    p.record_approximate(&m, &a, None, &[1, 2, 3], t0);
    p.record(&m, &a, &[7], t0);
    assert!(!p.is_approximate(&m, &a));
    assert_eq!(p.leading(&m, &a, &[1], t0), 0, "its approximate entries are gone");
    assert_eq!(p.blocks(t0), predicted(1));
}

#[derive(Clone, Debug)]
enum Op {
    Record { worker: usize, first: u64, len: u64 },
    Advance { ms: u64 },
    Clear { worker: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..3, 0u64..6, 1u64..6).prop_map(|(worker, first, len)| Op::Record {
            worker,
            first,
            len
        }),
        (1u64..80).prop_map(|ms| Op::Advance { ms }),
        (0usize..3).prop_map(|worker| Op::Clear { worker }),
    ]
}

proptest! {
    /// A block counts only if it was recorded for that worker within the ttl and after the
    /// worker's last clear; and every recorded, unexpired, uncleared block within the bound
    /// counts.
    #[test]
    fn predictions_never_outlive_their_expiry_or_a_clear(ops in prop::collection::vec(op(), 1..60)) {
        let ttl = Duration::from_millis(100);
        let p = predictions(100, 1 << 20);
        let m = model();
        let workers = [id("a"), id("b"), id("c")];
        let t0 = Instant::now();
        let mut now = t0;
        // Model: (worker, block) -> last record instant.
        let mut last: HashMap<(usize, u64), Instant> = HashMap::new();
        for op in ops {
            match op {
                Op::Record { worker, first, len } => {
                    let hashes: Vec<u64> = (first..first + len).collect();
                    p.record(&m, &workers[worker], &hashes, now);
                    for h in hashes {
                        last.insert((worker, h), now);
                    }
                }
                Op::Advance { ms } => now += Duration::from_millis(ms),
                Op::Clear { worker } => {
                    p.clear(&m, &workers[worker]);
                    last.retain(|(w, _), _| *w != worker);
                }
            }
            for (w, worker) in workers.iter().enumerate() {
                for h in 0..12u64 {
                    let live = last.get(&(w, h)).is_some_and(|at| *at + ttl > now);
                    prop_assert_eq!(p.leading(&m, worker, &[h], now) == 1, live);
                }
            }
        }
    }
}
