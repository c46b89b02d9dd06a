//! Round-robin: rotate over the candidates with a cursor owned by the policy instance.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use router_workers::Worker;

use crate::contract::sole_candidate;
use crate::{AdmissionCheck, Pick, PickError, PickReason, PickRequest, SyncPolicy};

/// Rotates over the candidates. Each instance (one per attached group) owns one cursor, so two
/// groups never disturb each other's rotation. With a stable candidate set, every `n`
/// consecutive picks visit each of the `n` candidates once.
///
/// Admission, when attached, is checked once on the engine the cursor chose; a rejection is
/// [`PickError::AdmissionRejected`] (the cursor still moves on).
#[derive(Debug, Default)]
pub struct RoundRobinPolicy {
    cursor: AtomicUsize,
    admission: Option<AdmissionCheck>,
}

impl RoundRobinPolicy {
    /// A rotation that admits every engine.
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks the chosen engine with `admission`.
    pub fn with_admission(mut self, admission: AdmissionCheck) -> Self {
        self.admission = Some(admission);
        self
    }

    /// The engine whose turn it is; the cursor moves on only when `advance`.
    fn select(
        &self,
        engines: &[Arc<Worker>],
        request: &PickRequest<'_>,
        advance: bool,
    ) -> Result<Pick, PickError> {
        let (worker, reason) = match sole_candidate(engines, request)? {
            Some(only) => (only, PickReason::OnlyCandidate),
            None => {
                let turn = if advance {
                    self.cursor.fetch_add(1, Ordering::Relaxed)
                } else {
                    self.cursor.load(Ordering::Relaxed)
                };
                (&engines[turn % engines.len()], PickReason::RoundRobin)
            }
        };
        if let Some(admission) = &self.admission {
            admission.check(worker)?;
        }
        Ok(Pick::new(Arc::clone(worker), reason))
    }
}

impl SyncPolicy for RoundRobinPolicy {
    fn choose(
        &self,
        engines: &[Arc<Worker>],
        request: &PickRequest<'_>,
    ) -> Result<Pick, PickError> {
        self.select(engines, request, true)
    }

    /// The engine whose turn comes next, without taking the turn.
    fn choose_fallback(
        &self,
        engines: &[Arc<Worker>],
        request: &PickRequest<'_>,
    ) -> Result<Pick, PickError> {
        self.select(engines, request, false)
    }

    fn name(&self) -> &'static str {
        "round_robin"
    }
}
