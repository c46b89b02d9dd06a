//! A point-in-time view of the table that one pick reads from.

use std::sync::Arc;
use std::time::Instant;

use router_workers::WorkerId;

use super::Published;
use crate::{EngineLoad, RankLoad};

/// The usable reports at one instant. Capturing one is an atomic pointer load and a clock read;
/// freshness is evaluated against the capture instant on every read, so a snapshot never
/// changes its answers.
#[derive(Clone, Debug)]
pub struct LoadSnapshot {
    entries: Arc<Published>,
    now: Instant,
}

impl LoadSnapshot {
    pub(crate) fn new(entries: Arc<Published>, now: Instant) -> Self {
        Self { entries, now }
    }

    /// The engine's load, or `None` when its report is missing, stale or rank-incomplete (or
    /// the engine is unknown). Never a zero-filled load.
    pub fn get(&self, worker: &WorkerId) -> Option<&EngineLoad> {
        self.entries.get(worker).filter(|e| self.now < e.fresh_until).map(|e| &e.load)
    }

    /// Each data-parallel rank's numbers of the same report as [`Self::get`], in rank order;
    /// `None` exactly when `get` is.
    pub fn ranks(&self, worker: &WorkerId) -> Option<&[RankLoad]> {
        self.entries.get(worker).filter(|e| self.now < e.fresh_until).map(|e| &*e.ranks)
    }

    /// The instant the snapshot was captured, on the table's clock.
    pub fn captured_at(&self) -> Instant {
        self.now
    }

    /// Every engine with a usable load, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&WorkerId, &EngineLoad)> + '_ {
        self.entries.iter().filter(|(_, e)| self.now < e.fresh_until).map(|(id, e)| (id, &e.load))
    }
}
