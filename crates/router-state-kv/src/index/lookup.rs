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

fn best_tier(entry: u32) -> u8 {
    // Entries always carry at least one tier bit; the lowest one is the fastest tier.
    u8::try_from((entry & 0xff).trailing_zeros()).unwrap_or(u8::MAX)
}

/// Length of the common prefix of two slices, compared eight elements at a time.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n && a[i..i + 8] == b[i..i + 8] {
        i += 8;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

/// The holders still matching after a node whose holder set differs from its parent's.
///
/// `entries` (holder entries as last seen) and `worst` (slowest tier so far) describe the
/// active holders, sorted by slot. Holders absent from `node` drop out with `depth` blocks.
/// Runs of identical entries are skipped with slice compares, so a change that drops or
/// re-tiers a few holders costs little more than a memcmp of the set.
fn narrow(
    entries: &mut Vec<u32>,
    worst: &mut Vec<u8>,
    node: &[u32],
    depth: u32,
    out: &mut Vec<Hit>,
) {
    let (mut i, mut j, mut k) = (0, 0, 0);
    while i < entries.len() {
        let run = common_prefix(&entries[i..], node.get(j..).unwrap_or_default());
        if run > 0 {
            if k != i {
                entries.copy_within(i..i + run, k);
                worst.copy_within(i..i + run, k);
            }
            i += run;
            j += run;
            k += run;
            continue;
        }
        let slot = entries[i] >> 8;
        while j < node.len() && (node[j] >> 8) < slot {
            j += 1;
        }
        if j < node.len() && (node[j] >> 8) == slot {
            worst[k] = worst[i].max(best_tier(node[j]));
            entries[k] = node[j];
            k += 1;
            j += 1;
        } else {
            out.push(Hit { slot, blocks: depth, tier: worst[i] });
        }
        i += 1;
    }
    entries.truncate(k);
    worst.truncate(k);
}

impl Tree {
    /// Walks the block hashes of a request (computed lazily, so hashing stops where the match
    /// does) and reports every holder of the first block with the number of leading blocks it
    /// holds.
    pub(crate) fn lookup(&self, hashes: impl IntoIterator<Item = u64>, out: &mut Vec<Hit>) {
        let mut entries: Vec<u32> = Vec::new();
        let mut worst: Vec<u8> = Vec::new();
        let mut prev = NO_NODE;
        let mut prev_fingerprint = 0;
        let mut depth: u32 = 0;
        for hash in hashes {
            // Blocks stored together get consecutive ids: try the next slot before probing.
            let next = prev.wrapping_add(1);
            let id = if prev != NO_NODE && self.holds_hash(next, hash) {
                next
            } else {
                let Some(id) = self.find(hash) else { break };
                id
            };
            let node = self.node(id);
            if node.parent != prev {
                break;
            }
            self.touch(id);
            if depth == 0 {
                entries.extend_from_slice(self.entries(node));
                worst.extend(entries.iter().map(|e| best_tier(*e)));
            } else if node.fingerprint != prev_fingerprint {
                narrow(&mut entries, &mut worst, self.entries(node), depth, out);
            }
            if entries.is_empty() {
                break;
            }
            prev = id;
            prev_fingerprint = node.fingerprint;
            depth += 1;
        }
        out.extend(entries.iter().zip(&worst).map(|(e, w)| Hit {
            slot: e >> 8,
            blocks: depth,
            tier: *w,
        }));
    }
}
