//! The Belady (MIN) oracle: one cache of the fleet's total capacity that knows every later
//! prompt and, when over capacity, evicts the block needed farthest in the future.
//!
//! Blocks, chaining and hit counting are the other oracles' ([`super::oracle`]): a request
//! hits the leading blocks the cache holds before it, at most all but the one holding its
//! last token; then all its full blocks are inserted and the cache evicts down to its
//! capacity, possibly a block just inserted (MIN bypasses it). Offline, in two passes: a
//! backward pass gives every block occurrence the index of the next request that has the
//! block, and the forward pass plays the cache.
//!
//! A block's eviction key is that next request, or *never* when there is none or when that
//! request cannot hit it (it lies past the request's matchable blocks: the request inserts it
//! again for free, so keeping it until then gains nothing). Ties go to the deeper block. A
//! child is never needed before its parent (a prompt holding the child holds the parent), so
//! the cache never keeps a child a request could hit without its parent, and a request's
//! hits are exactly the blocks of its matchable prefix the cache holds. Every reference
//! reloading its block for free, keeping blocks is scheduling intervals (from one use to the
//! next) on `capacity` slots, where dropping the interval ending last is optimal: the hits
//! are at least those of the LRU cache and at most those of the unlimited one.

use std::collections::{BTreeSet, HashMap};

use super::oracle::Blocks;

/// Eviction key of a block that no later request can hit.
const NEVER: usize = usize::MAX;

/// The Belady hits of each prompt, in blocks, for one cache of `capacity_blocks` blocks
/// playing `prompts` in order.
pub(crate) fn hit_blocks(prompts: &[Blocks], capacity_blocks: usize) -> Vec<usize> {
    let next_use = next_uses(prompts);
    // Block hash -> its entry in `order`: (next use, depth, hash), evicted largest first.
    let mut cache: HashMap<u64, (usize, usize, u64)> = HashMap::new();
    let mut order: BTreeSet<(usize, usize, u64)> = BTreeSet::new();
    let mut hits = Vec::with_capacity(prompts.len());
    for (prompt, next_use) in prompts.iter().zip(next_use) {
        hits.push(prompt.leading_hits(|h| cache.contains_key(&h)));
        for (depth, (&hash, next)) in prompt.hashes.iter().zip(next_use).enumerate() {
            let entry = (next, depth, hash);
            if let Some(old) = cache.insert(hash, entry) {
                order.remove(&old);
            }
            order.insert(entry);
        }
        while cache.len() > capacity_blocks {
            let Some((_, _, hash)) = order.pop_last() else { break };
            cache.remove(&hash);
        }
    }
    hits
}

/// For every block of every prompt, the index of the next prompt that can hit it, or
/// [`NEVER`].
fn next_uses(prompts: &[Blocks]) -> Vec<Vec<usize>> {
    // Block hash -> the earliest later prompt holding it.
    let mut seen: HashMap<u64, usize> = HashMap::new();
    let mut next_use = vec![Vec::new(); prompts.len()];
    for (index, prompt) in prompts.iter().enumerate().rev() {
        next_use[index] = prompt
            .hashes
            .iter()
            .enumerate()
            .map(|(depth, hash)| match seen.get(hash) {
                // The chained hash fixes the depth, so the block is at `depth` there too.
                Some(&later) if depth < prompts[later].matchable => later,
                _ => NEVER,
            })
            .collect();
        for &hash in &prompt.hashes {
            seen.insert(hash, index);
        }
    }
    next_use
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::load::trace::oracle::Oracle;
    use crate::load::trace::oracle::tests::tokens;

    /// Prompts of blocks of 4 tokens from `(family, blocks)`: the first `blocks` blocks of
    /// family `family`, plus one token so that every block is matchable.
    fn prompts(shapes: &[(u32, usize)]) -> Vec<Blocks> {
        shapes
            .iter()
            .map(|&(family, blocks)| {
                let mut prompt = tokens(family, blocks * 4);
                prompt.push(999);
                Blocks::new(&prompt, 4)
            })
            .collect()
    }

    fn lru_hit_blocks(prompts: &[Blocks], capacity_blocks: usize) -> Vec<usize> {
        let mut oracle = Oracle::new(4, Some(capacity_blocks * 4));
        let hits = prompts.iter().map(|p| oracle.observe(p).fleet_hit_tokens.expect("fleet"));
        hits.map(|tokens| tokens as usize / 4).collect()
    }

    #[test]
    fn belady_keeps_what_comes_back_where_lru_keeps_what_was_recent() {
        // Room for 2 blocks. A, B, C, A: LRU has evicted A by the time it comes back;
        // Belady bypasses B and C (never used again) and keeps A.
        let trace = prompts(&[(1, 2), (2, 1), (3, 1), (1, 2)]);
        assert_eq!(lru_hit_blocks(&trace, 2), [0, 0, 0, 0]);
        assert_eq!(hit_blocks(&trace, 2), [0, 0, 0, 2]);
        // A B A B A of two blocks each, with room for three blocks: LRU keeps the root of
        // the prompt before last; Belady keeps all of the prompt coming back next.
        let trace = prompts(&[(1, 2), (2, 2), (1, 2), (2, 2), (1, 2)]);
        assert_eq!(lru_hit_blocks(&trace, 3), [0, 0, 1, 1, 1]);
        assert_eq!(hit_blocks(&trace, 3), [0, 0, 2, 1, 2]);
    }

    #[test]
    fn a_block_no_request_can_hit_is_never_needed() {
        // The second prompt is exactly two blocks: it cannot hit its second block, so the
        // first prompt's second block is worth nothing until the third prompt, which comes
        // after the second inserted it again.
        let exact = tokens(1, 8);
        let uses = next_uses(&[
            Blocks::new(&tokens(1, 9), 4),
            Blocks::new(&exact, 4),
            Blocks::new(&tokens(1, 9), 4),
        ]);
        assert_eq!(uses, [vec![1, NEVER], vec![2, 2], vec![NEVER, NEVER]]);
    }

    proptest! {
        /// On random prompt families: LRU <= Belady <= unlimited, per run, and Belady with
        /// room for everything is the unlimited cache.
        #[test]
        fn belady_lies_between_lru_and_unlimited(
            shapes in prop::collection::vec((0u32..5, 0usize..6, 0usize..6, 0usize..3), 1..40),
            capacity_blocks in 1usize..16,
        ) {
            // Prompts: a shared prefix of `shared` blocks of one family, then `own` blocks
            // of one of a few tails, then 0 to 2 more tokens (0: the last block is not
            // matchable).
            let trace: Vec<Blocks> = shapes
                .iter()
                .map(|&(family, shared, own, extra)| {
                    let mut prompt = tokens(family, shared * 4);
                    prompt.extend(tokens(10 + (own % 3) as u32, own * 4));
                    prompt.extend(tokens(99, extra));
                    Blocks::new(&prompt, 4)
                })
                .collect();
            let mut oracle = Oracle::new(4, Some(capacity_blocks * 4));
            let steps: Vec<_> = trace.iter().map(|p| oracle.observe(p)).collect();
            let lru: u64 = steps.iter().filter_map(|s| s.fleet_hit_tokens).sum();
            let unlimited: u64 = steps.iter().map(|s| s.hit_tokens).sum();
            let belady: u64 =
                hit_blocks(&trace, capacity_blocks).iter().map(|&b| b as u64 * 4).sum();
            prop_assert!(lru <= belady, "lru {lru} > belady {belady}");
            prop_assert!(belady <= unlimited, "belady {belady} > unlimited {unlimited}");
            let everything: usize = trace.iter().map(|p| p.hashes.len()).sum();
            let full: Vec<u64> = hit_blocks(&trace, everything)
                .iter()
                .map(|&b| b as u64 * 4)
                .collect();
            prop_assert_eq!(full, steps.iter().map(|s| s.hit_tokens).collect::<Vec<_>>());
        }
    }
}
