//! `BlockRemoved`, `AllBlocksCleared` and holder purges.

use std::collections::HashMap;

use super::tree::{TierRemoval, Tree};
use crate::SkipReason;
use crate::wire::{BlockRemoved, Locality, MediumField};

/// What a removal did, for counters.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Removal {
    /// Blocks the holder no longer holds on any tier.
    pub(crate) removed: u64,
    /// Engine hashes the holder was not known to hold.
    pub(crate) unknown: u64,
}

impl Tree {
    /// Checks a removal event for holder `slot`; returns the tier bit to take away.
    pub(crate) fn plan_remove(&self, slot: u32, event: &BlockRemoved) -> Result<u8, SkipReason> {
        if event.locality == Some(Locality::Remote) {
            return Err(SkipReason::RemoteLocality);
        }
        if let Some(group) = event.group_idx
            && group != 0
            && !self.holders[slot as usize].groups.contains(&group)
        {
            return Err(SkipReason::OtherGroup);
        }
        MediumField::resolve(event.medium).map(|m| m.bit()).ok_or(SkipReason::UnknownMedium)
    }

    /// Takes `tier_bit` away from holder `slot` for each engine hash.
    pub(crate) fn remove_blocks(&mut self, slot: u32, hashes: &[u64], tier_bit: u8) -> Removal {
        let mut out = Removal::default();
        for engine_hash in hashes {
            let Some(local) = self.holders[slot as usize].engine.get(engine_hash).copied() else {
                out.unknown += 1;
                continue;
            };
            let Some(id) = self.find(local) else {
                // Evicted by the index already; forget the stale link.
                self.holders[slot as usize].engine.remove(engine_hash);
                continue;
            };
            match self.remove_tiers(id, slot, tier_bit) {
                TierRemoval::Holder => {
                    self.holders[slot as usize].engine.remove(engine_hash);
                    self.holders[slot as usize].blocks -= 1;
                    self.prune(id);
                    out.removed += 1;
                }
                TierRemoval::TierOnly | TierRemoval::TierNotHeld => {}
                TierRemoval::Absent => {
                    self.holders[slot as usize].engine.remove(engine_hash);
                }
            }
        }
        out
    }

    /// The local hashes of the engine hashes holder `slot` is known to hold.
    pub(crate) fn local_hashes(&self, slot: u32, engine_hashes: &[u64]) -> Vec<u64> {
        let links = &self.holders[slot as usize].engine;
        engine_hashes.iter().filter_map(|hash| links.get(hash).copied()).collect()
    }

    /// Detaches holder `slot` from its engine-hash map and returns the links to purge.
    pub(crate) fn take_links(&mut self, slot: u32) -> Vec<u64> {
        let build = self.engine_build;
        let holder = &mut self.holders[slot as usize];
        let links = std::mem::replace(&mut holder.engine, HashMap::with_hasher(build));
        links.into_values().collect()
    }

    /// Removes holder `slot` from every node in `links`; returns the blocks it lost.
    pub(crate) fn purge_links(&mut self, slot: u32, links: &[u64]) -> u64 {
        let mut removed = 0;
        for local in links {
            let Some(id) = self.find(*local) else { continue };
            if self.remove_tiers(id, slot, u8::MAX) == TierRemoval::Holder {
                self.holders[slot as usize].blocks -= 1;
                self.prune(id);
                removed += 1;
            }
        }
        removed
    }
}
