//! Random: one uniform draw over the candidates, in constant time.

use std::sync::Arc;

use rand::Rng;
use router_workers::Worker;

use crate::contract::sole_candidate;
use crate::sampler::Sampler;
use crate::{AdmissionCheck, Pick, PickError, PickReason, PickRequest, SyncPolicy};

/// Chooses uniformly among the candidates with one draw (no shuffling, no scan).
///
/// Admission, when attached, is checked once on the drawn engine; a rejection is
/// [`PickError::AdmissionRejected`], with no redraw.
#[derive(Debug, Default)]
pub struct RandomPolicy {
    sampler: Sampler,
    admission: Option<AdmissionCheck>,
}

impl RandomPolicy {
    /// Uniform choice from the thread-local generator, admitting every engine.
    pub fn new() -> Self {
        Self::default()
    }

    /// Draws from a generator seeded with `seed`, for reproducible runs.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.sampler = Sampler::seeded(seed);
        self
    }

    /// Checks the drawn engine with `admission`.
    pub fn with_admission(mut self, admission: AdmissionCheck) -> Self {
        self.admission = Some(admission);
        self
    }
}

impl SyncPolicy for RandomPolicy {
    fn choose(
        &self,
        engines: &[Arc<Worker>],
        request: &PickRequest<'_>,
    ) -> Result<Pick, PickError> {
        let (worker, reason) = match sole_candidate(engines, request)? {
            Some(only) => (only, PickReason::OnlyCandidate),
            None => {
                let index = self.sampler.with(|rng| rng.random_range(0..engines.len()));
                (&engines[index], PickReason::Random)
            }
        };
        if let Some(admission) = &self.admission {
            admission.check(worker)?;
        }
        Ok(Pick::new(Arc::clone(worker), reason))
    }

    fn name(&self) -> &'static str {
        "random"
    }
}
