//! `BlockStored`: checking an event, then adding its blocks under a holder.

use super::tree::{NO_NODE, TierRemoval, Tree};
use crate::SkipReason;
use crate::hash::{self, Hasher, Salt};
use crate::wire::{BlockStored, ExtraKey, Locality, MediumField, SpecKind};

/// Where a store continues: the previous block (or the chain root) and the next block index.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StoreCursor {
    /// Whether the chain continues from a stored block (else from the salt root).
    has_parent: bool,
    parent_hash: u64,
    pub(crate) next: usize,
    /// Blocks usable from this event (a block with foreign extra keys ends it).
    pub(crate) end: usize,
    tier_bit: u8,
}

/// Whether a block's extra keys are only things the salt already covers.
fn extra_keys_covered(keys: Option<&Option<Vec<ExtraKey>>>, salt: Salt<'_>) -> bool {
    let Some(Some(keys)) = keys else { return true };
    keys.iter().all(|key| match key {
        ExtraKey::Str(s) => {
            Some(s.as_str()) == salt.lora_name || Some(s.as_str()) == salt.cache_salt
        }
        ExtraKey::Other => false,
    })
}

impl Tree {
    /// Checks a stored event for holder `slot` and resolves where it attaches.
    pub(crate) fn plan_store(
        &mut self,
        slot: u32,
        event: &BlockStored,
        block_size: u32,
    ) -> Result<StoreCursor, SkipReason> {
        if event.locality == Some(Locality::Remote) {
            return Err(SkipReason::RemoteLocality);
        }
        match (event.kv_cache_spec_kind, event.group_idx) {
            (Some(SpecKind::Other), _) => return Err(SkipReason::NotFullAttention),
            (None, Some(group)) if group != 0 => return Err(SkipReason::OtherGroup),
            _ => {}
        }
        if event.block_size.is_some_and(|size| size != i64::from(block_size)) {
            return Err(SkipReason::BlockSizeMismatch);
        }
        let medium = MediumField::resolve(event.medium).ok_or(SkipReason::UnknownMedium)?;
        let size = block_size as usize;
        if event.block_hashes.len().checked_mul(size) != Some(event.token_ids.len()) {
            return Err(SkipReason::TokenCountMismatch);
        }
        let lora_fallback = match (&event.lora_name, event.lora_id) {
            (None, Some(id)) => Some(format!("lora-id:{id}")),
            _ => None,
        };
        let salt = Salt {
            lora_name: event.lora_name.as_deref().or(lora_fallback.as_deref()),
            cache_salt: event.cache_salt.as_deref(),
        };
        let end = (0..event.block_hashes.len())
            .find(|&i| !extra_keys_covered(event.extra_keys.as_ref().and_then(|k| k.get(i)), salt))
            .unwrap_or(event.block_hashes.len());
        let (has_parent, parent_hash) = match event.parent_block_hash {
            None => (false, hash::root(salt)),
            Some(engine_hash) => {
                let holder = &mut self.holders[slot as usize];
                let Some(local) = holder.engine.get(&engine_hash).copied() else {
                    return Err(SkipReason::UnknownParent);
                };
                if self.find(local).is_none() {
                    // Evicted by the index already; forget the stale link.
                    self.holders[slot as usize].engine.remove(&engine_hash);
                    return Err(SkipReason::UnknownParent);
                }
                (true, local)
            }
        };
        if let (Some(SpecKind::Full), Some(group)) = (event.kv_cache_spec_kind, event.group_idx) {
            let groups = &mut self.holders[slot as usize].groups;
            if group != 0 && !groups.contains(&group) {
                groups.push(group);
            }
        }
        Ok(StoreCursor { has_parent, parent_hash, next: 0, end, tier_bit: medium.bit() })
    }

    /// Stores blocks `cursor.next .. min(to, cursor.end)` of `event` for holder `slot`.
    /// Returns the number of blocks stored, and why it stopped early if it did.
    pub(crate) fn store_blocks(
        &mut self,
        slot: u32,
        event: &BlockStored,
        block_size: u32,
        cursor: &mut StoreCursor,
        to: usize,
        hasher: &mut Hasher,
    ) -> (u64, Option<SkipReason>) {
        let start = cursor.next;
        let outcome = self.store_run(slot, event, block_size, cursor, to, hasher);
        ((cursor.next - start) as u64, outcome.err())
    }

    fn store_run(
        &mut self,
        slot: u32,
        event: &BlockStored,
        block_size: u32,
        cursor: &mut StoreCursor,
        to: usize,
        hasher: &mut Hasher,
    ) -> Result<(), SkipReason> {
        let size = block_size as usize;
        let batch = (self.max_nodes / 256).clamp(1, 1024);
        let mut parent_id = if cursor.has_parent {
            self.find(cursor.parent_hash).ok_or(SkipReason::UnknownParent)?
        } else {
            NO_NODE
        };
        while cursor.next < to.min(cursor.end) {
            let i = cursor.next;
            let tokens = &event.token_ids[i * size..(i + 1) * size];
            let hash = hasher.chain(cursor.parent_hash, tokens);
            let id = match self.find(hash) {
                Some(id) => {
                    if self.node(id).parent != parent_id {
                        return Err(SkipReason::HashConflict);
                    }
                    self.touch(id);
                    id
                }
                None => {
                    if self.live_nodes >= self.max_nodes {
                        self.evict(batch, parent_id);
                        if self.live_nodes >= self.max_nodes {
                            return Err(SkipReason::IndexFull);
                        }
                        if cursor.has_parent && self.find(cursor.parent_hash) != Some(parent_id) {
                            return Err(SkipReason::UnknownParent);
                        }
                    }
                    self.alloc(hash, parent_id)
                }
            };
            if self.add_holder(id, slot, cursor.tier_bit) {
                self.holders[slot as usize].blocks += 1;
            }
            let engine_hash = event.block_hashes[i];
            let previous = self.holders[slot as usize].engine.insert(engine_hash, hash);
            if let Some(old) = previous
                && old != hash
                && let Some(old_id) = self.find(old)
                && self.remove_tiers(old_id, slot, u8::MAX) == TierRemoval::Holder
            {
                // The engine reused this hash for other content: the old claim is gone.
                self.holders[slot as usize].blocks -= 1;
                self.prune(old_id);
            }
            cursor.has_parent = true;
            cursor.parent_hash = hash;
            parent_id = id;
            cursor.next = i + 1;
        }
        Ok(())
    }
}
