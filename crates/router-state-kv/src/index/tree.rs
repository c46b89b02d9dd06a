//! The per-model radix tree: a flat, chunked arena of 32-byte block nodes with `u32` ids,
//! found by local hash.
//!
//! A node is one block. Its key is the block's local chained hash (which already identifies
//! the whole prefix), its `parent` link makes the tree, and it records its holders as a sorted
//! list of `slot << 8 | tier bits` entries: one entry inline in the node, more in a shared
//! pool with power-of-two size classes. A node with no holders is kept only while it has
//! children; everything else is freed at once, so the arena holds live data only.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use router_workers::WorkerId;

/// "No node": the parent of a first block.
pub(crate) const NO_NODE: u32 = u32::MAX;

/// The parent of a free arena slot.
const FREE: u32 = u32::MAX - 1;

/// Holder slots are stored in the upper 24 bits of a holder entry.
pub(crate) const MAX_HOLDERS: u32 = 1 << 24;

/// Nodes per arena chunk (a power of two): growth never copies nodes, and the slack of a
/// growing arena is at most one chunk.
const CHUNK_BITS: u32 = 12;
const CHUNK: usize = 1 << CHUNK_BITS;

/// Identity hashing for keys that already are xxh3 outputs.
#[derive(Default)]
pub(crate) struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

pub(crate) type ByHash = HashMap<u64, u32, BuildHasherDefault<IdentityHasher>>;

/// splitmix64's finaliser: a cheap, well-distributed 64-bit mix.
pub(crate) fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Hashes engine hashes, which need not be well distributed (small integers are legal), with
/// a per-process random seed.
#[derive(Clone, Copy)]
pub(crate) struct MixBuild(u64);

impl MixBuild {
    pub(crate) fn random() -> Self {
        Self(rand::random())
    }
}

pub(crate) struct MixHasher {
    seed: u64,
    state: u64,
}

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        mix(self.state ^ self.seed)
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.state = mix(self.state ^ u64::from(*b));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.state ^= value;
    }
}

impl BuildHasher for MixBuild {
    type Hasher = MixHasher;

    fn build_hasher(&self) -> MixHasher {
        MixHasher { seed: self.0, state: 0 }
    }
}

/// One block: 32 bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node {
    pub(crate) hash: u64,
    /// XOR of `mix(entry ^ seed)` over the holder entries: equal fingerprints mean equal holder
    /// sets (up to a 2^-64 chance), which lets lookups skip unchanged runs in O(1).
    pub(crate) fingerprint: u64,
    /// `NO_NODE` for a first block, `FREE` for a free slot.
    pub(crate) parent: u32,
    pub(crate) children: u32,
    /// The only entry when `len == 1`, else the offset of the entries in the pool.
    word: u32,
    len: u32,
}

const FREE_NODE: Node =
    Node { hash: 0, fingerprint: 0, parent: FREE, children: 0, word: 0, len: 0 };

/// Pooled holder lists: blocks of `2^class` entries, recycled per class.
#[derive(Default)]
struct Pool {
    data: Vec<u32>,
    free: Vec<Vec<u32>>,
}

fn class_of(len: u32) -> usize {
    len.next_power_of_two().trailing_zeros() as usize
}

impl Pool {
    fn alloc(&mut self, class: usize) -> u32 {
        if let Some(offset) = self.free.get_mut(class).and_then(Vec::pop) {
            return offset;
        }
        let offset = u32::try_from(self.data.len()).expect("holder pool below 16 GiB");
        self.data.resize(self.data.len() + (1 << class), 0);
        offset
    }

    fn release(&mut self, offset: u32, class: usize) {
        if self.free.len() <= class {
            self.free.resize_with(class + 1, Vec::new);
        }
        self.free[class].push(offset);
    }

    fn slice(&self, offset: u32, len: u32) -> &[u32] {
        &self.data[offset as usize..(offset + len) as usize]
    }

    fn bytes(&self) -> usize {
        self.data.capacity() * 4 + self.free.iter().map(|f| f.capacity() * 4).sum::<usize>()
    }
}

/// Lock-free view of a holder's block count, for statistics.
#[derive(Debug, Default)]
pub(crate) struct HolderShared {
    pub(crate) blocks: AtomicU64,
}

/// One (worker incarnation, data-parallel rank) that holds blocks in this model.
pub(crate) struct HolderEntry {
    pub(crate) generation: u32,
    pub(crate) live: bool,
    pub(crate) worker: WorkerId,
    pub(crate) worker_key: u32,
    pub(crate) incarnation: u64,
    pub(crate) rank: u32,
    /// Engine hash -> local hash of the block, for parent links and removals.
    pub(crate) engine: HashMap<u64, u64, MixBuild>,
    /// Nodes that list this holder.
    pub(crate) blocks: u64,
    /// KV-cache groups whose stores were accepted (besides group 0).
    pub(crate) groups: Vec<i64>,
    pub(crate) shared: Arc<HolderShared>,
}

/// Outcome of taking tiers away from a holder of a node.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum TierRemoval {
    /// The holder was not on the node.
    Absent,
    /// The holder is on the node, but not on those tiers.
    TierNotHeld,
    /// The holder keeps the block on another tier.
    TierOnly,
    /// The holder no longer holds the block.
    Holder,
}

/// The radix tree of one model.
pub(crate) struct Tree {
    chunks: Vec<Box<[Node]>>,
    /// CLOCK reference bits, one per node: clear when a node is created, set when a lookup
    /// hits it or a holder stores it again, cleared by the eviction hand. Atomic so readers
    /// holding the shared lock can set them.
    referenced: Vec<AtomicU64>,
    slots: usize,
    free: Vec<u32>,
    pool: Pool,
    pub(crate) by_hash: ByHash,
    pub(crate) holders: Vec<HolderEntry>,
    free_holders: Vec<u32>,
    worker_keys: HashMap<WorkerId, u32>,
    pub(crate) live_nodes: usize,
    pub(crate) max_nodes: usize,
    hand: usize,
    fp_seed: u64,
    pub(crate) engine_build: MixBuild,
    pub(crate) evicted: u64,
}

impl Tree {
    pub(crate) fn new(max_nodes: usize) -> Self {
        Self {
            chunks: Vec::new(),
            referenced: Vec::new(),
            slots: 0,
            free: Vec::new(),
            pool: Pool::default(),
            by_hash: ByHash::default(),
            holders: Vec::new(),
            free_holders: Vec::new(),
            worker_keys: HashMap::new(),
            live_nodes: 0,
            max_nodes: max_nodes.clamp(1, (u32::MAX - 2) as usize),
            hand: 0,
            fp_seed: rand::random(),
            engine_build: MixBuild::random(),
            evicted: 0,
        }
    }

    fn fp(&self, entry: u32) -> u64 {
        mix(u64::from(entry) ^ self.fp_seed)
    }

    pub(crate) fn node(&self, id: u32) -> &Node {
        &self.chunks[(id >> CHUNK_BITS) as usize][id as usize & (CHUNK - 1)]
    }

    fn node_mut(&mut self, id: u32) -> &mut Node {
        &mut self.chunks[(id >> CHUNK_BITS) as usize][id as usize & (CHUNK - 1)]
    }

    /// The holder entries of a node, sorted by slot.
    pub(crate) fn entries<'a>(&'a self, node: &'a Node) -> &'a [u32] {
        match node.len {
            0 => &[],
            1 => std::slice::from_ref(&node.word),
            len => self.pool.slice(node.word, len),
        }
    }

    fn entries_of(&self, id: u32) -> &[u32] {
        self.entries(self.node(id))
    }

    fn is_live(&self, id: u32) -> bool {
        (id as usize) < self.slots && self.node(id).parent != FREE
    }

    /// Marks a node referenced (for CLOCK); callable under the shared lock.
    pub(crate) fn touch(&self, id: u32) {
        let word = &self.referenced[(id / 64) as usize];
        let bit = 1u64 << (id % 64);
        if word.load(Ordering::Relaxed) & bit == 0 {
            word.fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// Clears a node's reference bit; returns whether it was set.
    fn take_reference(&self, id: u32) -> bool {
        let bit = 1u64 << (id % 64);
        self.referenced[(id / 64) as usize].fetch_and(!bit, Ordering::Relaxed) & bit != 0
    }

    /// Whether slot `id` exists and is the live node of `hash`.
    pub(crate) fn holds_hash(&self, id: u32, hash: u64) -> bool {
        (id as usize) < self.slots && {
            let node = self.node(id);
            node.hash == hash && node.parent != FREE
        }
    }

    pub(crate) fn find(&self, hash: u64) -> Option<u32> {
        self.by_hash.get(&hash).copied()
    }

    /// Creates a node; the caller has made room (see `evict`).
    pub(crate) fn alloc(&mut self, hash: u64, parent: u32) -> u32 {
        let id = if let Some(id) = self.free.pop() {
            id
        } else {
            let id = u32::try_from(self.slots).expect("node ids are capped by max_nodes");
            if self.slots == self.chunks.len() * CHUNK {
                self.chunks.push(vec![FREE_NODE; CHUNK].into_boxed_slice());
                self.referenced.extend((0..CHUNK / 64).map(|_| AtomicU64::new(0)));
            }
            self.slots += 1;
            id
        };
        *self.node_mut(id) = Node { hash, fingerprint: 0, parent, children: 0, word: 0, len: 0 };
        self.take_reference(id);
        self.by_hash.insert(hash, id);
        if parent != NO_NODE {
            self.node_mut(parent).children += 1;
        }
        self.live_nodes += 1;
        id
    }

    /// Frees a node with no holders and no children; returns its parent.
    fn free_node(&mut self, id: u32) -> u32 {
        let node = *self.node(id);
        debug_assert!(node.parent != FREE && node.children == 0 && node.len == 0);
        *self.node_mut(id) = FREE_NODE;
        if self.by_hash.get(&node.hash) == Some(&id) {
            self.by_hash.remove(&node.hash);
        }
        if node.parent != NO_NODE {
            self.node_mut(node.parent).children -= 1;
        }
        self.free.push(id);
        self.live_nodes -= 1;
        node.parent
    }

    /// Frees `id` and then its ancestors while they have neither holders nor children.
    pub(crate) fn prune(&mut self, mut id: u32) {
        while id != NO_NODE {
            let node = self.node(id);
            if node.parent == FREE || node.children > 0 || node.len > 0 {
                return;
            }
            id = self.free_node(id);
        }
    }

    /// Replaces a node's entries with `entries` (sorted), moving pool storage as needed.
    fn store_entries(&mut self, id: u32, entries: &[u32]) {
        let node = *self.node(id);
        let new_len = u32::try_from(entries.len()).expect("holders are capped");
        let old_class = (node.len >= 2).then(|| class_of(node.len));
        let new_class = (new_len >= 2).then(|| class_of(new_len));
        let word = match (old_class, new_class) {
            (_, None) => {
                if let Some(class) = old_class {
                    self.pool.release(node.word, class);
                }
                entries.first().copied().unwrap_or(0)
            }
            (Some(old), Some(new)) if old == new => node.word,
            (old, Some(new)) => {
                if let Some(class) = old {
                    self.pool.release(node.word, class);
                }
                self.pool.alloc(new)
            }
        };
        if new_len >= 2 {
            let start = word as usize;
            self.pool.data[start..start + entries.len()].copy_from_slice(entries);
        }
        let node = self.node_mut(id);
        node.word = word;
        node.len = new_len;
    }

    /// Adds `tier_bit` for holder `slot` on node `id`; returns whether the holder is new there.
    pub(crate) fn add_holder(&mut self, id: u32, slot: u32, tier_bit: u8) -> bool {
        let new_entry = (slot << 8) | u32::from(tier_bit);
        let node = *self.node(id);
        if node.len == 0 {
            let delta = self.fp(new_entry);
            let node = self.node_mut(id);
            node.word = new_entry;
            node.len = 1;
            node.fingerprint ^= delta;
            return true;
        }
        let entries = self.entries_of(id);
        match entries.binary_search_by_key(&slot, |e| e >> 8) {
            Ok(index) => {
                let old = entries[index];
                let new = old | u32::from(tier_bit);
                if new != old {
                    self.replace_entry(id, index, old, new);
                }
                false
            }
            Err(index) => {
                let mut grown = Vec::with_capacity(entries.len() + 1);
                grown.extend_from_slice(&entries[..index]);
                grown.push(new_entry);
                grown.extend_from_slice(&entries[index..]);
                let delta = self.fp(new_entry);
                self.store_entries(id, &grown);
                self.node_mut(id).fingerprint ^= delta;
                true
            }
        }
    }

    fn replace_entry(&mut self, id: u32, index: usize, old: u32, new: u32) {
        let delta = self.fp(old) ^ self.fp(new);
        let node = self.node_mut(id);
        node.fingerprint ^= delta;
        if node.len == 1 {
            node.word = new;
        } else {
            let at = node.word as usize + index;
            self.pool.data[at] = new;
        }
    }

    /// Takes `tier_bits` away from holder `slot` on node `id` (all bits: the holder entirely).
    pub(crate) fn remove_tiers(&mut self, id: u32, slot: u32, tier_bits: u8) -> TierRemoval {
        if !self.is_live(id) {
            return TierRemoval::Absent;
        }
        let entries = self.entries_of(id);
        let Ok(index) = entries.binary_search_by_key(&slot, |e| e >> 8) else {
            return TierRemoval::Absent;
        };
        let old = entries[index];
        let remaining = (old & 0xff) & !u32::from(tier_bits);
        if (old & 0xff) == remaining {
            return TierRemoval::TierNotHeld;
        }
        if remaining != 0 {
            self.replace_entry(id, index, old, (old & !0xff) | remaining);
            return TierRemoval::TierOnly;
        }
        let mut shrunk = entries.to_vec();
        shrunk.remove(index);
        let delta = self.fp(old);
        self.store_entries(id, &shrunk);
        self.node_mut(id).fingerprint ^= delta;
        TierRemoval::Holder
    }

    /// Registers a holder, or returns the live one with the same identity.
    pub(crate) fn register(
        &mut self,
        worker: &WorkerId,
        incarnation: u64,
        rank: u32,
    ) -> Option<(u32, u32, Arc<HolderShared>)> {
        if let Some((slot, entry)) = self.holders.iter().enumerate().find(|(_, h)| {
            h.live && h.incarnation == incarnation && h.rank == rank && &h.worker == worker
        }) {
            let slot = u32::try_from(slot).expect("slots are capped");
            return Some((slot, entry.generation, Arc::clone(&entry.shared)));
        }
        let next_key = u32::try_from(self.worker_keys.len()).unwrap_or(u32::MAX);
        let worker_key = *self.worker_keys.entry(worker.clone()).or_insert(next_key);
        let shared = Arc::new(HolderShared::default());
        let entry = HolderEntry {
            generation: 0,
            live: true,
            worker: worker.clone(),
            worker_key,
            incarnation,
            rank,
            engine: HashMap::with_hasher(self.engine_build),
            blocks: 0,
            groups: Vec::new(),
            shared: Arc::clone(&shared),
        };
        let slot = if let Some(slot) = self.free_holders.pop() {
            let generation = self.holders[slot as usize].generation;
            self.holders[slot as usize] = HolderEntry { generation, ..entry };
            slot
        } else {
            let slot = u32::try_from(self.holders.len()).ok().filter(|s| *s < MAX_HOLDERS)?;
            self.holders.push(entry);
            slot
        };
        Some((slot, self.holders[slot as usize].generation, shared))
    }

    pub(crate) fn holder_live(&self, slot: u32, generation: u32) -> bool {
        self.holders.get(slot as usize).is_some_and(|h| h.live && h.generation == generation)
    }

    /// Marks a holder dead: its handle is refused from now on. Its blocks stay until purged.
    pub(crate) fn retire(&mut self, slot: u32) {
        if let Some(h) = self.holders.get_mut(slot as usize) {
            h.live = false;
            h.generation = h.generation.wrapping_add(1);
        }
    }

    /// Returns a retired, purged holder slot to the free list.
    pub(crate) fn release(&mut self, slot: u32) {
        if let Some(h) = self.holders.get_mut(slot as usize)
            && !h.live
        {
            h.engine = HashMap::with_hasher(self.engine_build);
            h.groups.clear();
            self.free_holders.push(slot);
        }
    }

    /// CLOCK eviction until the tree is `batch` nodes under its limit (or nothing is
    /// evictable). Only leaves are evicted; `pinned` never is. Returns the nodes freed.
    pub(crate) fn evict(&mut self, batch: usize, pinned: u32) -> usize {
        let target = self.max_nodes.saturating_sub(batch);
        let mut freed = 0;
        let mut scanned = 0;
        let limit = self.slots.saturating_mul(2);
        while self.live_nodes > target && scanned < limit {
            if self.hand >= self.slots {
                self.hand = 0;
            }
            let id = u32::try_from(self.hand).expect("node ids fit in u32");
            self.hand += 1;
            scanned += 1;
            if !self.is_live(id) || id == pinned {
                continue;
            }
            if self.take_reference(id) || self.node(id).children > 0 {
                continue;
            }
            let slots: Vec<u32> = self.entries_of(id).iter().map(|e| e >> 8).collect();
            for slot in slots {
                if let Some(holder) = self.holders.get_mut(slot as usize) {
                    holder.blocks = holder.blocks.saturating_sub(1);
                }
            }
            self.store_entries(id, &[]);
            self.node_mut(id).fingerprint = 0;
            let before = self.live_nodes;
            let parent = self.free_node(id);
            self.prune(parent);
            freed += before - self.live_nodes;
        }
        self.evicted += freed as u64;
        freed
    }

    /// Approximate heap bytes held by this tree.
    pub(crate) fn approx_bytes(&self) -> u64 {
        let entry = std::mem::size_of::<(u64, u32)>() + 1;
        let engine_entry = std::mem::size_of::<(u64, u64)>() + 1;
        let nodes = self.chunks.len() * CHUNK * std::mem::size_of::<Node>();
        let bits = self.referenced.capacity() * 8;
        let table = self.by_hash.capacity() * entry;
        let free = self.free.capacity() * 4;
        let engine: usize = self
            .holders
            .iter()
            .map(|h| {
                h.engine.capacity() * engine_entry
                    + std::mem::size_of::<HolderEntry>()
                    + h.groups.capacity() * 8
            })
            .sum();
        (nodes + bits + table + free + self.pool.bytes() + engine) as u64
    }

    /// Sum over holders of the nodes they hold.
    pub(crate) fn holder_blocks(&self) -> u64 {
        self.holders.iter().map(|h| h.blocks).sum()
    }

    /// Publishes a holder's block count to its lock-free view.
    pub(crate) fn publish_holder(&self, slot: u32) {
        if let Some(h) = self.holders.get(slot as usize) {
            h.shared.blocks.store(h.blocks, Ordering::Relaxed);
        }
    }

    /// Checks every structural invariant; used by tests.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let mut children = vec![0u32; self.slots];
        let mut held = vec![0u64; self.holders.len()];
        let mut live = 0;
        for id in 0..u32::try_from(self.slots).expect("fits") {
            let node = self.node(id);
            if node.parent == FREE {
                continue;
            }
            live += 1;
            assert_eq!(self.by_hash.get(&node.hash), Some(&id), "node {id} not indexed");
            let entries = self.entries(node);
            assert!(entries.windows(2).all(|w| (w[0] >> 8) < (w[1] >> 8)), "holders unsorted");
            assert!(entries.iter().all(|e| e & 0xff != 0), "holder without tier");
            let fp = entries.iter().fold(0, |acc, e| acc ^ self.fp(*e));
            assert_eq!(fp, node.fingerprint, "fingerprint of node {id}");
            assert!(!entries.is_empty() || node.children > 0, "empty leaf {id} kept");
            if node.parent != NO_NODE {
                assert!(self.is_live(node.parent), "dead parent of {id}");
                children[node.parent as usize] += 1;
            }
            for e in entries {
                held[(e >> 8) as usize] += 1;
            }
        }
        for id in 0..u32::try_from(self.slots).expect("fits") {
            if self.is_live(id) {
                assert_eq!(self.node(id).children, children[id as usize], "children of {id}");
            }
        }
        assert_eq!(live, self.live_nodes);
        assert_eq!(self.by_hash.len(), live);
        for (slot, holder) in self.holders.iter().enumerate() {
            assert_eq!(holder.blocks, held[slot], "block count of holder {slot}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_32_bytes() {
        assert_eq!(std::mem::size_of::<Node>(), 32);
    }

    #[test]
    fn holder_lists_move_between_pool_classes_and_back_inline() {
        let mut tree = Tree::new(16);
        let id = tree.alloc(7, NO_NODE);
        for slot in [5, 1, 9, 3, 7] {
            assert!(tree.add_holder(id, slot, 1));
        }
        assert!(!tree.add_holder(id, 3, 2), "a second tier of a known holder");
        let slots: Vec<u32> = tree.entries_of(id).iter().map(|e| e >> 8).collect();
        assert_eq!(slots, vec![1, 3, 5, 7, 9]);
        assert_eq!(tree.entries_of(id)[1] & 0xff, 3);
        for slot in [1, 9, 5, 7] {
            assert_eq!(tree.remove_tiers(id, slot, u8::MAX), TierRemoval::Holder);
        }
        assert_eq!(tree.entries_of(id), &[(3 << 8) | 3]);
        assert_eq!(tree.remove_tiers(id, 3, 1), TierRemoval::TierOnly);
        assert_eq!(tree.remove_tiers(id, 3, 1), TierRemoval::TierNotHeld);
        assert_eq!(tree.remove_tiers(id, 4, 1), TierRemoval::Absent);
        // Pool blocks freed above are reused.
        let other = tree.alloc(8, NO_NODE);
        let before = tree.pool.data.len();
        tree.add_holder(other, 1, 1);
        tree.add_holder(other, 2, 1);
        assert_eq!(tree.pool.data.len(), before, "a freed two-entry block is reused");
        assert_eq!(tree.live_nodes, 2);
    }
}
