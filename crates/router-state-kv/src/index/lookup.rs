//! Prefix lookup: per holder, how many leading blocks of a request it holds.
//!
//! The walk follows the request's block hashes down the tree and keeps the set of holders
//! that hold every block so far. When a node's holder fingerprint equals its parent's, the
//! set cannot change, so long shared runs cost one hash probe and one compare per block;
//! holder work happens only where the holder set changes. The cost is proportional to the
//! matched depth plus the holders that drop out, never to the size of the fleet.

use super::tree::{NO_NODE, Tree};

/// A holder's match: leading blocks held and the slowest tier among them (each block at its
/// fastest copy), as a `Medium` discriminant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hit {
    pub(crate) slot: u32,
    pub(crate) blocks: u32,
    pub(crate) tier: u8,
}

#[derive(Clone, Copy)]
struct Active {
    slot: u32,
    tier: u8,
}

fn best_tier(entry: u32) -> u8 {
    // Entries always carry at least one tier bit; the lowest one is the fastest tier.
    u8::try_from((entry & 0xff).trailing_zeros()).unwrap_or(u8::MAX)
}

impl Tree {
    /// Walks `hashes` and reports every holder of the first block with the number of leading
    /// blocks it holds.
    pub(crate) fn lookup(&self, hashes: &[u64], out: &mut Vec<Hit>) {
        let mut active: Vec<Active> = Vec::new();
        let mut prev = NO_NODE;
        let mut prev_fingerprint = 0;
        let mut depth: u32 = 0;
        for hash in hashes {
            let Some(id) = self.find(*hash) else { break };
            let node = self.node(id);
            if node.parent != prev {
                break;
            }
            node.touch();
            let entries = node.holders.as_slice();
            if depth == 0 {
                active.extend(entries.iter().map(|e| Active { slot: e >> 8, tier: best_tier(*e) }));
            } else if node.fingerprint != prev_fingerprint {
                let mut j = 0;
                active.retain_mut(|a| {
                    while j < entries.len() && (entries[j] >> 8) < a.slot {
                        j += 1;
                    }
                    if j < entries.len() && (entries[j] >> 8) == a.slot {
                        a.tier = a.tier.max(best_tier(entries[j]));
                        true
                    } else {
                        out.push(Hit { slot: a.slot, blocks: depth, tier: a.tier });
                        false
                    }
                });
            }
            if active.is_empty() {
                break;
            }
            prev = id;
            prev_fingerprint = node.fingerprint;
            depth += 1;
        }
        out.extend(active.into_iter().map(|a| Hit { slot: a.slot, blocks: depth, tier: a.tier }));
    }
}
