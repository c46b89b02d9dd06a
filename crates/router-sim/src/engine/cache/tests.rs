//! The engine's prefix cache: block chaining, matches, reference counts, LRU eviction of leaves,
//! clears, and the KV events that replay to the cached set.

use std::collections::HashSet;

use proptest::prelude::*;

use super::*;

/// Locks the cached prefix of `hashes` and inserts the rest, as a request does.
fn take(cache: &mut PrefixCache, hashes: &[u64]) -> Vec<u64> {
    let mut new = Vec::new();
    let mut parent = None;
    for &hash in hashes {
        if cache.insert(parent, hash) {
            new.push(hash);
        }
        parent = Some(hash);
    }
    new
}

fn release(cache: &mut PrefixCache, hashes: &[u64]) {
    for &hash in hashes {
        cache.unlock(hash);
    }
}

#[test]
fn hashes_chain_over_parents() {
    let tokens: Vec<u32> = (0..40).collect();
    let hashes = chain_hashes(None, &tokens, 16);
    assert_eq!(hashes.len(), 2, "only full blocks are hashed");
    assert_eq!(hashes[0], block_hash(None, &tokens[..16]));
    assert_eq!(hashes[1], block_hash(Some(hashes[0]), &tokens[16..32]));
    assert_ne!(block_hash(None, &tokens[16..32]), hashes[1], "the parent is part of the hash");
    assert_eq!(chain_hashes(Some(hashes[0]), &tokens[16..32], 16), vec![hashes[1]]);
}

#[test]
fn match_stops_at_the_first_missing_block() {
    let mut cache = PrefixCache::default();
    let a = chain_hashes(None, &(0..64).collect::<Vec<u32>>(), 16);
    take(&mut cache, &a[..2]);
    assert_eq!(cache.matched(&a), 2);
    let mut other = a.clone();
    other[0] = 12345;
    assert_eq!(cache.matched(&other), 0);
    cache.check();
}

#[test]
fn referenced_blocks_are_never_evicted() {
    let mut cache = PrefixCache::default();
    let a = [1, 2, 3];
    take(&mut cache, &a);
    assert!(cache.evict(10).is_empty());
    assert_eq!(cache.reclaimable(), 0);
    release(&mut cache, &a);
    assert_eq!(cache.reclaimable(), 3);
    // Leaves go first: 3, then its parent 2, then 1.
    assert_eq!(cache.evict(10), vec![3, 2, 1]);
    assert_eq!(cache.len(), 0);
    cache.check();
}

#[test]
fn eviction_is_least_recently_used_among_leaves() {
    let mut cache = PrefixCache::default();
    // Two chains sharing root 1: [1, 2] and [1, 3].
    take(&mut cache, &[1, 2]);
    take(&mut cache, &[1, 3]);
    release(&mut cache, &[1, 2]);
    release(&mut cache, &[1, 3]);
    // Touch [1, 2] again: 3 becomes the least recently used leaf.
    take(&mut cache, &[1, 2]);
    release(&mut cache, &[1, 2]);
    assert_eq!(cache.evict(1), vec![3]);
    // The shared root stays while 2 is cached.
    assert_eq!(cache.evict(1), vec![2]);
    assert_eq!(cache.evict(1), vec![1]);
    cache.check();
}

#[test]
fn shared_prefix_is_inserted_once_and_counted_per_user() {
    let mut cache = PrefixCache::default();
    assert_eq!(take(&mut cache, &[1, 2]), vec![1, 2]);
    assert_eq!(take(&mut cache, &[1, 2, 4]), vec![4]);
    release(&mut cache, &[1, 2]);
    assert_eq!(cache.referenced(), 3, "the second user still holds 1, 2, 4");
    assert!(cache.evict(5).is_empty());
    release(&mut cache, &[1, 2, 4]);
    assert_eq!(cache.evict(5), vec![4, 2, 1]);
    cache.check();
}

#[test]
fn clear_refuses_while_referenced() {
    let mut cache = PrefixCache::default();
    take(&mut cache, &[7]);
    assert!(!cache.clear());
    release(&mut cache, &[7]);
    assert!(cache.clear());
    assert_eq!(cache.len(), 0);
    cache.check();
}

#[derive(Clone, Debug)]
enum Op {
    /// Start a request whose prompt is this path in a small tree of prefixes.
    Take(Vec<u8>),
    /// Finish the i-th live request (modulo the count).
    Release(usize),
    Evict(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        prop::collection::vec(0u8..3, 1..5).prop_map(Op::Take),
        (0usize..8).prop_map(Op::Release),
        (0usize..6).prop_map(Op::Evict),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// The cache's invariants hold after any sequence of operations; the stream of inserted
    /// and evicted hashes replays to exactly the cached set (what KV events tell a router);
    /// referenced blocks are never evicted; releasing everything lets eviction empty it.
    #[test]
    fn events_replay_to_the_cached_set(ops in prop::collection::vec(op(), 1..60)) {
        let mut cache = PrefixCache::default();
        let mut live: Vec<Vec<u64>> = Vec::new();
        let mut shadow: HashSet<u64> = HashSet::new();
        for op in ops {
            match op {
                Op::Take(path) => {
                    let tokens: Vec<u32> = path.iter().map(|t| u32::from(*t)).collect();
                    let hashes = chain_hashes(None, &tokens, 1);
                    for hash in take(&mut cache, &hashes) {
                        prop_assert!(shadow.insert(hash), "stored twice");
                    }
                    live.push(hashes);
                }
                Op::Release(i) if !live.is_empty() => {
                    let hashes = live.remove(i % live.len());
                    release(&mut cache, &hashes);
                }
                Op::Release(_) => {}
                Op::Evict(n) => {
                    for hash in cache.evict(n) {
                        prop_assert!(shadow.remove(&hash), "removed a block never stored");
                        prop_assert!(live.iter().all(|l| !l.contains(&hash)), "evicted a used block");
                    }
                }
            }
            cache.check();
            prop_assert_eq!(shadow.len(), cache.len());
            prop_assert!(shadow.iter().all(|h| cache.contains(*h)));
        }
        for hashes in live.drain(..) {
            release(&mut cache, &hashes);
        }
        let all = cache.len();
        prop_assert_eq!(cache.evict(usize::MAX).len(), all);
        prop_assert_eq!(cache.len(), 0);
    }
}
