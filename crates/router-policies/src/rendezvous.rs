//! Rendezvous (highest-random-weight) placement with bounded loads: how `session_aware` and
//! `sticky` place a new key with `new_binding: rendezvous`, so that router replicas sharing
//! nothing place a key on the same engine.
//!
//! Every candidate gets a weight for the key, [`rendezvous_weight`]: a pure function of the
//! key's bytes and the engine id's bytes, with no seed and no process state, so every replica
//! (and every restart) computes the same weights. The candidates are walked from the highest
//! weight down ([`rendezvous_order`]); the first one that is admitted and under the load bound
//! takes the key ([`rendezvous_choice`]).
//!
//! The load bound is that of consistent hashing with bounded loads (Mirrokni, Thorup and
//! Zadimoghaddam): with `n` candidates carrying `total` router-local in-flight requests, an
//! engine may take the key while `inflight + 1 <= max(ceil(factor * (total + 1) / n), floor)`.
//! A factor of at least 1 always leaves one candidate under the bound. The floor keeps the bound
//! from biting at the handful of requests where balance does not matter (at 2 requests in flight
//! over 4 engines the bare bound already turns a key away from an engine holding 1). The counts
//! are this replica's own, so replicas agree on a key exactly while the engine of highest weight
//! is under every replica's bound; a larger factor or floor trades balance for agreement.
//!
//! Removing an engine moves only the keys whose highest admitted, unbounded weight was on it
//! (every other key's order among the remaining engines is unchanged); adding one moves only
//! the keys it now outweighs.

use std::sync::Arc;

use router_workers::{Worker, WorkerId};

use crate::LoadHandles;

/// The default `rendezvous_load_factor`: an engine may carry up to 1.25 times the mean
/// in-flight count (plus the new request) before a new key walks past it.
pub const DEFAULT_RENDEZVOUS_LOAD_FACTOR: f64 = 1.25;

/// The default `rendezvous_load_floor`: below 4 router-local requests in flight an engine is
/// never over the bound.
pub const DEFAULT_RENDEZVOUS_LOAD_FLOOR: u64 = 4;

/// The load bound of rendezvous placement: `rendezvous_load_factor` and
/// `rendezvous_load_floor`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RendezvousLoad {
    /// Times the mean in-flight count (the new request included), at least 1.
    pub factor: f64,
    /// In-flight requests an engine may always carry, the new one included.
    pub floor: u64,
}

impl Default for RendezvousLoad {
    fn default() -> Self {
        Self { factor: DEFAULT_RENDEZVOUS_LOAD_FACTOR, floor: DEFAULT_RENDEZVOUS_LOAD_FLOOR }
    }
}

pub(crate) const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

pub(crate) fn fnv1a(mut hash: u64, bytes: &[u8]) -> u64 {
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

/// The weight of `engine` for `key`: 64-bit FNV-1a over the key's UTF-8 bytes, one `0xff`
/// separator byte (never part of UTF-8, so `("ab", "c")` and `("a", "bc")` differ) and the
/// engine id's bytes, then the splitmix64 finalizer so that ids differing in their last byte
/// get unrelated weights. Seedless and stable across processes, builds and platforms: this is
/// part of the routing contract between replicas, and changing it moves every key.
pub fn rendezvous_weight(key: &str, engine: &WorkerId) -> u64 {
    let hash = fnv1a(fnv1a(FNV_OFFSET, key.as_bytes()), &[0xff]);
    let mut z = fnv1a(hash, engine.as_str().as_bytes());
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Indices of `engines` from the highest weight for `key` down; equal weights are ordered by
/// engine id, so the order depends on the set of engines only, never on their slice order.
pub fn rendezvous_order<W: AsRef<Worker>>(key: &str, engines: &[W]) -> Vec<usize> {
    let mut order: Vec<(u64, &str, usize)> = engines
        .iter()
        .enumerate()
        .map(|(index, engine)| {
            let id = engine.as_ref().id();
            (rendezvous_weight(key, id), id.as_str(), index)
        })
        .collect();
    order.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    order.into_iter().map(|(_, _, index)| index).collect()
}

/// The most in-flight requests an engine may carry, the new one included, to take a new key:
/// `max(ceil(factor * (total + 1) / n), floor)`, at least 1. `n` of 0 is read as 1.
pub fn rendezvous_load_bound(total_inflight: u64, candidates: usize, load: RendezvousLoad) -> u64 {
    let n = candidates.max(1) as f64;
    let bound = (load.factor * (total_inflight as f64 + 1.0) / n).ceil();
    // The float is finite and positive for a validated factor; saturate otherwise.
    let bound = if bound.is_finite() && bound >= 1.0 { bound as u64 } else { 1 };
    bound.max(load.floor)
}

/// The index of the engine of `engines` that takes `key`: the highest weight that `admitted`
/// accepts and whose in-flight count (`inflight`) is under [`rendezvous_load_bound`]. When
/// every admitted engine is at the bound, the admitted engine of highest weight; `None` when
/// none is admitted (or `engines` is empty).
pub fn rendezvous_choice<W: AsRef<Worker>>(
    key: &str,
    engines: &[W],
    load: RendezvousLoad,
    inflight: impl Fn(&WorkerId) -> u64,
    admitted: impl Fn(&Worker) -> bool,
) -> Option<usize> {
    let counts: Vec<u64> = engines.iter().map(|e| inflight(e.as_ref().id())).collect();
    let bound = rendezvous_load_bound(counts.iter().sum(), engines.len(), load);
    let mut first_admitted = None;
    for index in rendezvous_order(key, engines) {
        if !admitted(engines[index].as_ref()) {
            continue;
        }
        if counts[index] < bound {
            return Some(index);
        }
        first_admitted.get_or_insert(index);
    }
    first_admitted
}

/// `new_binding: rendezvous` of an affinity policy: the load bound and the in-flight counts it
/// is computed from.
#[derive(Clone, Debug)]
pub(crate) struct RendezvousPlacement {
    pub(crate) bound: RendezvousLoad,
    pub(crate) load: LoadHandles,
}

impl RendezvousPlacement {
    /// The engine that takes `key`, admitted by `admitted`.
    pub(crate) fn choose<'e>(
        &self,
        key: &str,
        engines: &'e [Arc<Worker>],
        admitted: impl Fn(&Worker) -> bool,
    ) -> Option<&'e Arc<Worker>> {
        let inflight = |id: &WorkerId| self.load.inflight.count(id);
        rendezvous_choice(key, engines, self.bound, inflight, admitted).map(|i| &engines[i])
    }
}

#[cfg(test)]
mod tests;
