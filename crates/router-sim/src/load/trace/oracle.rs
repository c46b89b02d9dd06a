//! The oracles: the cache hit rates that ideal caches reach on the replayed prompts, counted
//! exactly the way the engines count `cached_tokens`.
//!
//! Each prompt is taken as the engine tokenizes it (chat template included), cut into full
//! blocks of the engine's block size and chained by hash like the engine's prefix cache. A
//! request hits the leading blocks a cache already holds, except that the last prompt token
//! is always computed, so at most `(prompt_tokens - 1) / block_size` blocks; its hit is that
//! many blocks times the block size. Then every full block of its prompt is in the cache.
//! Output blocks are not added: a trace prompt is one user message, and no later prompt can
//! contain an earlier prompt's whole rendering followed by its answer.
//!
//! - unlimited: one cache that never evicts;
//! - fleet: one cache of the fleet's total capacity, least recently used block evicted first
//!   (a request's blocks are touched deepest first, so a parent is always more recent than its
//!   children and only leaves are evicted, as in the engine);
//! - Belady: one cache of the same capacity that knows the future ([`super::belady`]).

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::engine::cache::chain_hashes;

/// One prompt as the oracles see it: its length and the chained hashes of its full blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Blocks {
    pub(crate) prompt_tokens: usize,
    pub(crate) hashes: Vec<u64>,
    /// The leading blocks a cache may serve: all but the one holding the last prompt token.
    pub(crate) matchable: usize,
}

impl Blocks {
    /// The blocks of `prompt` (the engine's token ids) in blocks of `block_size` tokens.
    pub(crate) fn new(prompt: &[u32], block_size: usize) -> Self {
        let block_size = block_size.max(1);
        let hashes = chain_hashes(None, prompt, block_size);
        let matchable = (prompt.len().saturating_sub(1) / block_size).min(hashes.len());
        Self { prompt_tokens: prompt.len(), hashes, matchable }
    }

    /// How many of the leading matchable blocks `contains` holds.
    pub(crate) fn leading_hits(&self, contains: impl Fn(u64) -> bool) -> usize {
        self.hashes[..self.matchable].iter().take_while(|h| contains(**h)).count()
    }
}

/// What one request contributed to the oracles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Step {
    pub(crate) prompt_tokens: u64,
    pub(crate) hit_tokens: u64,
    /// `None` without a fleet capacity.
    pub(crate) fleet_hit_tokens: Option<u64>,
    /// The Belady cache of the fleet's capacity; `None` without one.
    pub(crate) belady_hit_tokens: Option<u64>,
}

impl Step {
    /// The request's TTFT floor in ms: its tokens the unlimited cache misses, prefilled at
    /// `speed` tokens per second with nothing queued.
    pub(crate) fn floor_ms(&self, speed: f64) -> f64 {
        (self.prompt_tokens - self.hit_tokens) as f64 / speed * 1000.0
    }
}

/// One cache of a fixed number of blocks, least recently used evicted first.
#[derive(Debug)]
struct Lru {
    capacity_blocks: usize,
    last_used: HashMap<u64, u64>,
    order: BTreeSet<(u64, u64)>,
    tick: u64,
}

impl Lru {
    fn new(capacity_blocks: usize) -> Self {
        Self { capacity_blocks, last_used: HashMap::new(), order: BTreeSet::new(), tick: 0 }
    }

    fn contains(&self, hash: u64) -> bool {
        self.last_used.contains_key(&hash)
    }

    /// Marks `hashes` (one prompt's chain) used now, deepest first, inserting the missing ones,
    /// then evicts down to the capacity.
    fn touch_chain(&mut self, hashes: &[u64]) {
        for &hash in hashes.iter().rev() {
            self.tick += 1;
            if let Some(old) = self.last_used.insert(hash, self.tick) {
                self.order.remove(&(old, hash));
            }
            self.order.insert((self.tick, hash));
        }
        while self.last_used.len() > self.capacity_blocks {
            let Some((_, hash)) = self.order.pop_first() else { break };
            self.last_used.remove(&hash);
        }
    }
}

/// Feeds prompts in trace order to the unlimited cache and, with a capacity, the fleet cache.
#[derive(Debug)]
pub(crate) struct Oracle {
    block_size: usize,
    unlimited: HashSet<u64>,
    fleet: Option<Lru>,
}

impl Oracle {
    /// Oracles counting in blocks of `block_size` (at least 1) tokens.
    pub(crate) fn new(block_size: usize, fleet_capacity_tokens: Option<usize>) -> Self {
        let block_size = block_size.max(1);
        Self {
            block_size,
            unlimited: HashSet::new(),
            fleet: fleet_capacity_tokens
                .map(|tokens| Lru::new(capacity_blocks(tokens, block_size))),
        }
    }

    /// The next request's prompt, cut in this oracle's block size. The step's Belady hits are
    /// left `None`: they need the whole trace ([`super::belady::hit_blocks`]).
    pub(crate) fn observe(&mut self, prompt: &Blocks) -> Step {
        let tokens = |blocks: usize| (blocks * self.block_size) as u64;
        let hit_tokens = tokens(prompt.leading_hits(|h| self.unlimited.contains(&h)));
        let fleet_hit_tokens =
            self.fleet.as_ref().map(|fleet| tokens(prompt.leading_hits(|h| fleet.contains(h))));
        self.unlimited.extend(prompt.hashes.iter().copied());
        if let Some(fleet) = &mut self.fleet {
            fleet.touch_chain(&prompt.hashes);
        }
        Step {
            prompt_tokens: prompt.prompt_tokens as u64,
            hit_tokens,
            fleet_hit_tokens,
            belady_hit_tokens: None,
        }
    }
}

/// The blocks of `block_size` tokens a cache of `capacity_tokens` holds.
pub(crate) fn capacity_blocks(capacity_tokens: usize, block_size: usize) -> usize {
    capacity_tokens / block_size.max(1)
}

/// The oracles over the requests a replay sent, beside the measured hit rate in the report.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OracleReport {
    /// Prompt tokens of the requests sent, as the engines tokenize them (with every request
    /// answered, equal to the measured `prompt_tokens`).
    pub prompt_tokens: u64,
    /// Tokens one unlimited cache would have served.
    pub hit_tokens: u64,
    /// The fleet-capacity cache, when `--fleet-capacity-tokens` was given.
    pub fleet: Option<FleetOracle>,
}

/// The oracles of one cache of the fleet's total capacity: LRU, and Belady's MIN.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FleetOracle {
    /// Its capacity in tokens (`--fleet-capacity-tokens`).
    pub capacity_tokens: u64,
    /// Tokens it would have served evicting the least recently used block.
    pub hit_tokens: u64,
    /// Tokens it would have served evicting the block needed farthest in the future (at
    /// least `hit_tokens`, at most the unlimited cache's).
    pub belady_hit_tokens: u64,
}

impl OracleReport {
    pub(crate) fn sum(steps: &[Step], fleet_capacity_tokens: Option<usize>) -> Self {
        let fleet = fleet_capacity_tokens.map(|capacity| FleetOracle {
            capacity_tokens: capacity as u64,
            hit_tokens: steps.iter().filter_map(|s| s.fleet_hit_tokens).sum(),
            belady_hit_tokens: steps.iter().filter_map(|s| s.belady_hit_tokens).sum(),
        });
        Self {
            prompt_tokens: steps.iter().map(|s| s.prompt_tokens).sum(),
            hit_tokens: steps.iter().map(|s| s.hit_tokens).sum(),
            fleet,
        }
    }

    /// `oracle_hit_rate`: unlimited-cache hit tokens over prompt tokens; `None` when nothing
    /// was sent.
    pub fn hit_rate(&self) -> Option<f64> {
        (self.prompt_tokens > 0).then(|| self.hit_tokens as f64 / self.prompt_tokens as f64)
    }

    /// `oracle_fleet_hit_rate`: the same for the fleet-capacity cache; `None` without one (or
    /// when nothing was sent).
    pub fn fleet_hit_rate(&self) -> Option<f64> {
        let fleet = self.fleet.as_ref()?;
        (self.prompt_tokens > 0).then(|| fleet.hit_tokens as f64 / self.prompt_tokens as f64)
    }

    /// `bounds.hit_rate_belady`: the same for the Belady cache of the fleet's capacity.
    pub fn belady_hit_rate(&self) -> Option<f64> {
        let fleet = self.fleet.as_ref()?;
        (self.prompt_tokens > 0).then(|| fleet.belady_hit_tokens as f64 / self.prompt_tokens as f64)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use proptest::prelude::*;

    use super::*;

    pub(crate) fn tokens(prefix: u32, len: usize) -> Vec<u32> {
        (0..len as u32).map(|i| prefix * 1000 + i).collect()
    }

    fn see(oracle: &mut Oracle, prompt: &[u32]) -> Step {
        let blocks = Blocks::new(prompt, oracle.block_size);
        oracle.observe(&blocks)
    }

    #[test]
    fn hits_are_whole_leading_blocks_and_the_last_token_is_computed() {
        let mut oracle = Oracle::new(4, None);
        let first = tokens(1, 10);
        assert_eq!(see(&mut oracle, &first).hit_tokens, 0);
        // The same prompt again: its last token lies in the partial third block, so both
        // full blocks count.
        assert_eq!(see(&mut oracle, &first).hit_tokens, 8);
        // A prompt of exactly 2 blocks: only 1 block may be reused.
        assert_eq!(see(&mut oracle, &first[..8]).hit_tokens, 4);
        // A longer prompt sharing 9 tokens reuses the 2 full blocks inside them.
        let mut longer = first[..9].to_vec();
        longer.extend(tokens(2, 7));
        let step = see(&mut oracle, &longer);
        assert_eq!((step.prompt_tokens, step.hit_tokens), (16, 8));
        // Equal blocks after a different prefix are not a prefix hit.
        let mut shifted = tokens(3, 4);
        shifted.extend(&first[4..8]);
        shifted.push(0);
        assert_eq!(see(&mut oracle, &shifted).hit_tokens, 0);
    }

    #[test]
    fn the_fleet_cache_evicts_least_recently_used_leaves_first() {
        // Room for 3 blocks of 4 tokens.
        let mut oracle = Oracle::new(4, Some(12));
        let a = tokens(1, 9); // blocks a1 a2
        let b = tokens(2, 9); // blocks b1 b2
        see(&mut oracle, &a);
        see(&mut oracle, &b); // a2 (the oldest, a leaf) goes
        let step = see(&mut oracle, &a);
        assert_eq!(step.hit_tokens, 8, "the unlimited cache keeps everything");
        assert_eq!(step.fleet_hit_tokens, Some(4), "a1 stayed: parents outlive their leaves");
        // Touching a again made room by evicting b's leaf; b's root stays.
        assert_eq!(see(&mut oracle, &b).fleet_hit_tokens, Some(4));
        let report = OracleReport::sum(
            &[
                Step {
                    prompt_tokens: 10,
                    hit_tokens: 4,
                    fleet_hit_tokens: Some(2),
                    belady_hit_tokens: Some(3),
                },
                Step {
                    prompt_tokens: 10,
                    hit_tokens: 6,
                    fleet_hit_tokens: Some(3),
                    belady_hit_tokens: Some(4),
                },
            ],
            Some(12),
        );
        assert_eq!(report.hit_rate(), Some(0.5));
        assert_eq!(report.fleet_hit_rate(), Some(0.25));
        assert_eq!(report.belady_hit_rate(), Some(0.35));
        assert_eq!(OracleReport::sum(&[], None).hit_rate(), None);
    }

    proptest! {
        /// The fleet cache never beats the unlimited one, and a fleet cache holding every
        /// block equals it.
        #[test]
        fn fleet_hits_are_bounded_by_the_unlimited_ones(
            prompts in prop::collection::vec((0u32..4, 0usize..3, 1usize..40), 1..30),
            capacity in 4usize..64,
        ) {
            let mut small = Oracle::new(4, Some(capacity));
            let mut huge = Oracle::new(4, Some(1 << 20));
            for (prefix, shared, len) in prompts {
                // Prompts share a prefix of `shared` blocks from one of four families.
                let mut prompt = tokens(prefix, shared * 4);
                prompt.extend(tokens(10 + len as u32, len));
                let step = see(&mut small, &prompt);
                let fleet = step.fleet_hit_tokens.expect("fleet");
                prop_assert!(fleet <= step.hit_tokens);
                prop_assert!(step.hit_tokens < step.prompt_tokens);
                let full = see(&mut huge, &prompt);
                prop_assert_eq!(full.fleet_hit_tokens, Some(full.hit_tokens));
            }
        }
    }
}
