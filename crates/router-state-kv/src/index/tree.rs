//! The per-model radix tree: a flat arena of block nodes with `u32` ids, found by local hash.
//!
//! A node is one block. Its key is the block's local chained hash (which already identifies
//! the whole prefix), its `parent` link makes the tree, and it records its holders as a sorted
//! small vector of `slot << 8 | tier bits` entries. A node with no holders is kept only while it
//! has children; everything else is freed at once, so the arena holds live data only.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use router_workers::WorkerId;

/// "No node": the parent of a first block.
pub(crate) const NO_NODE: u32 = u32::MAX;

/// Holder slots are stored in the upper 24 bits of a holder entry.
pub(crate) const MAX_HOLDERS: u32 = 1 << 24;

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

/// A node id plus the generation it had, so references outlive eviction safely.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NodeRef {
    pub(crate) id: u32,
    pub(crate) generation: u32,
}

/// Sorted holder entries (`slot << 8 | tier bits`). One holder is stored inline; an empty
/// boxed slice does not allocate.
#[derive(Debug)]
pub(crate) enum Holders {
    One(u32),
    Many(Box<[u32]>),
}

impl Holders {
    fn empty() -> Self {
        Holders::Many(Box::new([]))
    }

    pub(crate) fn as_slice(&self) -> &[u32] {
        match self {
            Holders::One(entry) => std::slice::from_ref(entry),
            Holders::Many(entries) => entries,
        }
    }

    fn find(&self, slot: u32) -> Result<usize, usize> {
        self.as_slice().binary_search_by_key(&slot, |e| e >> 8)
    }

    /// Entries stored out of line (for memory accounting).
    fn heap_len(&self) -> usize {
        match self {
            Holders::One(_) => 0,
            Holders::Many(entries) => entries.len(),
        }
    }

    fn from_vec(mut entries: Vec<u32>) -> Self {
        if entries.len() == 1 {
            Holders::One(entries[0])
        } else {
            entries.shrink_to_fit();
            Holders::Many(entries.into_boxed_slice())
        }
    }
}

/// One block.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) hash: u64,
    /// XOR of `mix(entry ^ seed)` over the holder entries: equal fingerprints mean equal holder
    /// sets (up to a 2^-64 chance), which lets lookups skip unchanged runs in O(1).
    pub(crate) fingerprint: u64,
    pub(crate) parent: u32,
    pub(crate) children: u32,
    pub(crate) generation: u32,
    pub(crate) live: bool,
    /// CLOCK reference bit: clear when the node is created, set when a lookup hits it or a
    /// holder stores it again, cleared by the eviction hand.
    pub(crate) referenced: AtomicBool,
    pub(crate) holders: Holders,
}

impl Node {
    pub(crate) fn touch(&self) {
        if !self.referenced.load(Ordering::Relaxed) {
            self.referenced.store(true, Ordering::Relaxed);
        }
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
    /// Engine hash -> node, for parent links and removals.
    pub(crate) engine: HashMap<u64, NodeRef, MixBuild>,
    /// Nodes that list this holder.
    pub(crate) blocks: u64,
    /// KV-cache groups whose stores were accepted (besides group 0).
    pub(crate) groups: Vec<i64>,
    pub(crate) shared: Arc<HolderShared>,
}

/// Outcome of taking a tier away from a holder of a node.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum TierRemoval {
    /// The holder was not on the node.
    Absent,
    /// The holder is on the node, but not on that tier.
    TierNotHeld,
    /// The holder keeps the block on another tier.
    TierOnly,
    /// The holder no longer holds the block.
    Holder,
}

/// The radix tree of one model.
pub(crate) struct Tree {
    pub(crate) nodes: Vec<Node>,
    free: Vec<u32>,
    pub(crate) by_hash: ByHash,
    pub(crate) holders: Vec<HolderEntry>,
    free_holders: Vec<u32>,
    worker_keys: HashMap<WorkerId, u32>,
    pub(crate) live_nodes: usize,
    pub(crate) max_nodes: usize,
    pub(crate) hand: usize,
    heap_entries: usize,
    fp_seed: u64,
    pub(crate) engine_build: MixBuild,
    pub(crate) evicted: u64,
}

impl Tree {
    pub(crate) fn new(max_nodes: usize) -> Self {
        Self {
            nodes: Vec::new(),
            free: Vec::new(),
            by_hash: ByHash::default(),
            holders: Vec::new(),
            free_holders: Vec::new(),
            worker_keys: HashMap::new(),
            live_nodes: 0,
            max_nodes: max_nodes.max(1),
            hand: 0,
            heap_entries: 0,
            fp_seed: rand::random(),
            engine_build: MixBuild::random(),
            evicted: 0,
        }
    }

    fn fp(&self, entry: u32) -> u64 {
        mix(u64::from(entry) ^ self.fp_seed)
    }

    pub(crate) fn node(&self, id: u32) -> &Node {
        &self.nodes[id as usize]
    }

    pub(crate) fn node_ref(&self, id: u32) -> NodeRef {
        NodeRef { id, generation: self.nodes[id as usize].generation }
    }

    /// The node a reference points to, if it is still the same node.
    pub(crate) fn resolve(&self, r: NodeRef) -> Option<u32> {
        let node = self.nodes.get(r.id as usize)?;
        (node.live && node.generation == r.generation).then_some(r.id)
    }

    pub(crate) fn find(&self, hash: u64) -> Option<u32> {
        self.by_hash.get(&hash).copied()
    }

    /// Creates a node; the caller has made room (see `evict`).
    pub(crate) fn alloc(&mut self, hash: u64, parent: u32) -> u32 {
        let id = if let Some(id) = self.free.pop() {
            let node = &mut self.nodes[id as usize];
            node.hash = hash;
            node.fingerprint = 0;
            node.parent = parent;
            node.children = 0;
            node.live = true;
            node.referenced = AtomicBool::new(false);
            node.holders = Holders::empty();
            id
        } else {
            let id = u32::try_from(self.nodes.len()).expect("node ids are capped by max_nodes");
            self.nodes.push(Node {
                hash,
                fingerprint: 0,
                parent,
                children: 0,
                generation: 0,
                live: true,
                referenced: AtomicBool::new(false),
                holders: Holders::empty(),
            });
            id
        };
        self.by_hash.insert(hash, id);
        if parent != NO_NODE {
            self.nodes[parent as usize].children += 1;
        }
        self.live_nodes += 1;
        id
    }

    /// Frees a node with no holders and no children; returns its parent.
    fn free_node(&mut self, id: u32) -> u32 {
        let node = &mut self.nodes[id as usize];
        debug_assert!(node.live && node.children == 0 && node.holders.as_slice().is_empty());
        node.live = false;
        node.generation = node.generation.wrapping_add(1);
        let parent = node.parent;
        let hash = node.hash;
        node.parent = NO_NODE;
        if self.by_hash.get(&hash) == Some(&id) {
            self.by_hash.remove(&hash);
        }
        if parent != NO_NODE {
            self.nodes[parent as usize].children -= 1;
        }
        self.free.push(id);
        self.live_nodes -= 1;
        parent
    }

    /// Frees `id` and then its ancestors while they have neither holders nor children.
    pub(crate) fn prune(&mut self, mut id: u32) {
        while id != NO_NODE {
            let node = &self.nodes[id as usize];
            if !node.live || node.children > 0 || !node.holders.as_slice().is_empty() {
                return;
            }
            id = self.free_node(id);
        }
    }

    fn set_holders(&mut self, id: u32, entries: Vec<u32>) {
        let node = &mut self.nodes[id as usize];
        self.heap_entries -= node.holders.heap_len();
        node.holders = Holders::from_vec(entries);
        self.heap_entries += node.holders.heap_len();
    }

    /// Adds `tier_bit` for holder `slot` on node `id`; returns whether the holder is new there.
    pub(crate) fn add_holder(&mut self, id: u32, slot: u32, tier_bit: u8) -> bool {
        let node = &self.nodes[id as usize];
        match node.holders.find(slot) {
            Ok(index) => {
                let old = node.holders.as_slice()[index];
                let new = old | u32::from(tier_bit);
                if new != old {
                    let delta = self.fp(old) ^ self.fp(new);
                    let node = &mut self.nodes[id as usize];
                    node.fingerprint ^= delta;
                    match &mut node.holders {
                        Holders::One(entry) => *entry = new,
                        Holders::Many(entries) => entries[index] = new,
                    }
                }
                false
            }
            Err(index) => {
                let entry = (slot << 8) | u32::from(tier_bit);
                let mut entries = Vec::with_capacity(node.holders.as_slice().len() + 1);
                entries.extend_from_slice(&node.holders.as_slice()[..index]);
                entries.push(entry);
                entries.extend_from_slice(&node.holders.as_slice()[index..]);
                let delta = self.fp(entry);
                self.nodes[id as usize].fingerprint ^= delta;
                self.set_holders(id, entries);
                true
            }
        }
    }

    /// Takes `tier_bits` away from holder `slot` on node `id` (all bits: the holder entirely).
    pub(crate) fn remove_tiers(&mut self, id: u32, slot: u32, tier_bits: u8) -> TierRemoval {
        let node = &self.nodes[id as usize];
        let Ok(index) = node.holders.find(slot) else { return TierRemoval::Absent };
        let old = node.holders.as_slice()[index];
        let remaining = (old & 0xff) & !u32::from(tier_bits);
        if (old & 0xff) == remaining {
            return TierRemoval::TierNotHeld;
        }
        if remaining != 0 {
            let new = (old & !0xff) | remaining;
            let delta = self.fp(old) ^ self.fp(new);
            let node = &mut self.nodes[id as usize];
            node.fingerprint ^= delta;
            match &mut node.holders {
                Holders::One(entry) => *entry = new,
                Holders::Many(entries) => entries[index] = new,
            }
            return TierRemoval::TierOnly;
        }
        let mut entries = node.holders.as_slice().to_vec();
        entries.remove(index);
        let delta = self.fp(old);
        self.nodes[id as usize].fingerprint ^= delta;
        self.set_holders(id, entries);
        TierRemoval::Holder
    }

    /// Removes every holder of a node (eviction); returns their slots.
    fn strip_holders(&mut self, id: u32) -> Vec<u32> {
        let slots = self.nodes[id as usize].holders.as_slice().iter().map(|e| e >> 8).collect();
        self.set_holders(id, Vec::new());
        self.nodes[id as usize].fingerprint = 0;
        slots
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
        let limit = self.nodes.len().saturating_mul(2);
        while self.live_nodes > target && scanned < limit && !self.nodes.is_empty() {
            if self.hand >= self.nodes.len() {
                self.hand = 0;
            }
            let id = u32::try_from(self.hand).expect("node ids fit in u32");
            self.hand += 1;
            scanned += 1;
            let node = &self.nodes[id as usize];
            if !node.live || id == pinned {
                continue;
            }
            if node.referenced.swap(false, Ordering::Relaxed) || node.children > 0 {
                continue;
            }
            for slot in self.strip_holders(id) {
                if let Some(holder) = self.holders.get_mut(slot as usize) {
                    holder.blocks = holder.blocks.saturating_sub(1);
                }
            }
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
        let engine_entry = std::mem::size_of::<(u64, NodeRef)>() + 1;
        let nodes = self.nodes.capacity() * std::mem::size_of::<Node>();
        let table = self.by_hash.capacity() * entry;
        let holders = self.heap_entries * 4;
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
        (nodes + table + holders + free + engine) as u64
    }

    /// Sum over holders of the nodes they hold.
    pub(crate) fn holder_blocks(&self) -> u64 {
        self.holders.iter().map(|h| h.blocks).sum()
    }

    /// Publishes each holder's block count to its lock-free view.
    pub(crate) fn publish_holder(&self, slot: u32) {
        if let Some(h) = self.holders.get(slot as usize) {
            h.shared.blocks.store(h.blocks, Ordering::Relaxed);
        }
    }

    /// Checks every structural invariant; used by tests.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let mut children = vec![0u32; self.nodes.len()];
        let mut held = vec![0u64; self.holders.len()];
        let mut live = 0;
        for (id, node) in self.nodes.iter().enumerate() {
            if !node.live {
                continue;
            }
            live += 1;
            let id32 = u32::try_from(id).expect("fits");
            assert_eq!(self.by_hash.get(&node.hash), Some(&id32), "node {id} not indexed");
            let entries = node.holders.as_slice();
            assert!(entries.windows(2).all(|w| (w[0] >> 8) < (w[1] >> 8)), "holders unsorted");
            assert!(entries.iter().all(|e| e & 0xff != 0), "holder without tier");
            let fp = entries.iter().fold(0, |acc, e| acc ^ self.fp(*e));
            assert_eq!(fp, node.fingerprint, "fingerprint of node {id}");
            assert!(!entries.is_empty() || node.children > 0, "empty leaf {id} kept");
            if node.parent != NO_NODE {
                assert!(self.nodes[node.parent as usize].live, "dead parent of {id}");
                children[node.parent as usize] += 1;
            }
            for e in entries {
                held[(e >> 8) as usize] += 1;
            }
        }
        for (id, node) in self.nodes.iter().enumerate() {
            if node.live {
                assert_eq!(node.children, children[id], "child count of {id}");
            }
        }
        assert_eq!(live, self.live_nodes);
        assert_eq!(self.by_hash.len(), live);
        for (slot, holder) in self.holders.iter().enumerate() {
            assert_eq!(holder.blocks, held[slot], "block count of holder {slot}");
        }
    }
}
