//! Random: one uniform draw over the candidates, in constant time.

use std::sync::Arc;

use futures::future::{self, BoxFuture};
use rand::Rng;
use router_workers::Worker;

use crate::sampler::Sampler;
use crate::{AdmissionCheck, Pick, PickError, PickReason, PickRequest, Policy};

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

    fn select(
        &self,
        engines: &[Arc<Worker>],
        request: &PickRequest<'_>,
    ) -> Result<Pick, PickError> {
        let (worker, reason) = match engines {
            [] => return Err(PickError::NoCandidates { stage: request.stage }),
            [only] => (only, PickReason::OnlyCandidate),
            _ => {
                let index = self.sampler.with(|rng| rng.random_range(0..engines.len()));
                (&engines[index], PickReason::Random)
            }
        };
        if let Some(admission) = &self.admission {
            admission.check(worker)?;
        }
        Ok(Pick::new(Arc::clone(worker), reason))
    }
}

impl Policy for RandomPolicy {
    fn pick<'a>(
        &'a self,
        engines: &'a [Arc<Worker>],
        request: &'a PickRequest<'a>,
    ) -> BoxFuture<'a, Result<Pick, PickError>> {
        Box::pin(future::ready(self.select(engines, request)))
    }

    fn name(&self) -> &'static str {
        "random"
    }
}
