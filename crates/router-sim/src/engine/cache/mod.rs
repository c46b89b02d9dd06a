//! The engine's prefix cache: full token blocks chained by hash, reference counts for blocks
//! used by running requests, and least-recently-used eviction of unreferenced leaves.
//!
//! A block's hash covers its parent's hash and its tokens, so equal hashes mean equal
//! prefixes. Only leaves (blocks without cached children) are evicted, as in SGLang's radix
//! cache, so every cached block's whole prefix stays cached. Capacity is counted in blocks by
//! the scheduler, which owns the slots reserved for tokens that are not (yet) in the cache.

use std::collections::{BTreeSet, HashMap};

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of the engine's block hash chain; any fixed value works (hashes are opaque).
const HASH_SEED: u64 = 0x5349_4d5f_4b56_0001;
/// The parent value hashed for a root block.
const ROOT: u64 = 0;

/// The engine hash of one block: its parent's hash and its tokens.
pub(crate) fn block_hash(parent: Option<u64>, tokens: &[u32]) -> u64 {
    let mut bytes = Vec::with_capacity(8 + tokens.len() * 4);
    bytes.extend_from_slice(&parent.unwrap_or(ROOT).to_le_bytes());
    for token in tokens {
        bytes.extend_from_slice(&token.to_le_bytes());
    }
    xxh3_64_with_seed(&bytes, HASH_SEED)
}

/// Hashes of the full blocks of `tokens`, continuing the chain after `parent`.
pub(crate) fn chain_hashes(parent: Option<u64>, tokens: &[u32], block_size: usize) -> Vec<u64> {
    let mut parent = parent;
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            let hash = block_hash(parent, block);
            parent = Some(hash);
            hash
        })
        .collect()
}

#[derive(Debug)]
struct Block {
    parent: Option<u64>,
    children: u32,
    refs: u32,
    last_used: u64,
}

/// The cached blocks of one engine.
#[derive(Debug, Default)]
pub(crate) struct PrefixCache {
    blocks: HashMap<u64, Block>,
    /// Unreferenced leaves by (last use, hash): the eviction order.
    evictable: BTreeSet<(u64, u64)>,
    referenced: usize,
    tick: u64,
}

impl PrefixCache {
    /// Number of cached blocks.
    pub(crate) fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Number of cached blocks used by at least one running request.
    pub(crate) fn referenced(&self) -> usize {
        self.referenced
    }

    /// Number of blocks that [`PrefixCache::evict`] could free right now, counting parents
    /// that become leaves as their children go.
    /// Requests reference whole chains from the root, so every unreferenced block is
    /// reclaimable.
    pub(crate) fn reclaimable(&self) -> usize {
        self.blocks.len() - self.referenced
    }

    pub(crate) fn contains(&self, hash: u64) -> bool {
        self.blocks.contains_key(&hash)
    }

    /// How many leading `hashes` are cached.
    pub(crate) fn matched(&self, hashes: &[u64]) -> usize {
        hashes.iter().take_while(|h| self.blocks.contains_key(h)).count()
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Takes a reference on a cached block.
    pub(crate) fn lock(&mut self, hash: u64) {
        let tick = self.next_tick();
        let Some(block) = self.blocks.get_mut(&hash) else { return };
        if block.refs == 0 {
            self.referenced += 1;
            if block.children == 0 {
                self.evictable.remove(&(block.last_used, hash));
            }
        }
        block.refs += 1;
        block.last_used = tick;
    }

    /// Drops a reference; an unreferenced leaf becomes evictable, most recent last.
    pub(crate) fn unlock(&mut self, hash: u64) {
        let tick = self.next_tick();
        let Some(block) = self.blocks.get_mut(&hash) else { return };
        debug_assert!(block.refs > 0, "unlock of an unreferenced block");
        block.refs = block.refs.saturating_sub(1);
        block.last_used = tick;
        if block.refs == 0 {
            self.referenced -= 1;
            if block.children == 0 {
                self.evictable.insert((tick, hash));
            }
        }
    }

    /// Adds a block under `parent` (which must be cached and referenced by the caller) and
    /// references it. Returns false, and only references it, when it was already cached.
    pub(crate) fn insert(&mut self, parent: Option<u64>, hash: u64) -> bool {
        if self.blocks.contains_key(&hash) {
            self.lock(hash);
            return false;
        }
        if let Some(parent_hash) = parent
            && let Some(parent_block) = self.blocks.get_mut(&parent_hash)
        {
            if parent_block.children == 0 && parent_block.refs == 0 {
                self.evictable.remove(&(parent_block.last_used, parent_hash));
            }
            parent_block.children += 1;
        }
        let tick = self.next_tick();
        self.blocks.insert(hash, Block { parent, children: 0, refs: 1, last_used: tick });
        self.referenced += 1;
        true
    }

    /// Evicts up to `count` unreferenced leaves, least recently used first, and returns
    /// their hashes in eviction order.
    pub(crate) fn evict(&mut self, count: usize) -> Vec<u64> {
        let mut removed = Vec::with_capacity(count.min(self.evictable.len()));
        while removed.len() < count {
            let Some((_, hash)) = self.evictable.pop_first() else { break };
            let Some(block) = self.blocks.remove(&hash) else { continue };
            removed.push(hash);
            if let Some(parent_hash) = block.parent
                && let Some(parent) = self.blocks.get_mut(&parent_hash)
            {
                parent.children -= 1;
                if parent.children == 0 && parent.refs == 0 {
                    self.evictable.insert((parent.last_used, parent_hash));
                }
            }
        }
        removed
    }

    /// Drops every block. Only valid while nothing is referenced; returns false otherwise.
    pub(crate) fn clear(&mut self) -> bool {
        if self.referenced > 0 {
            return false;
        }
        self.blocks.clear();
        self.evictable.clear();
        true
    }

    /// Checks the internal invariants (tests only).
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let mut children: HashMap<u64, u32> = HashMap::new();
        for block in self.blocks.values() {
            if let Some(parent) = block.parent {
                assert!(self.blocks.contains_key(&parent), "orphan block");
                *children.entry(parent).or_default() += 1;
            }
        }
        let mut referenced = 0;
        for (hash, block) in &self.blocks {
            assert_eq!(block.children, children.get(hash).copied().unwrap_or(0));
            if block.refs > 0 {
                referenced += 1;
            }
            let leaf_free = block.refs == 0 && block.children == 0;
            assert_eq!(self.evictable.contains(&(block.last_used, *hash)), leaf_free);
        }
        assert_eq!(referenced, self.referenced);
        assert!(self.evictable.len() <= self.blocks.len());
    }
}

#[cfg(test)]
mod tests;
