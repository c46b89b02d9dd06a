//! Power-of-two choices, and the power-of-k helper ([`min_load_choices`]) it is built on.

use std::sync::Arc;

use rand::Rng;
use rand::seq::{SliceRandom as _, index};
use router_state_load::{EngineLoad, Inflight, LoadSnapshot};
use router_workers::{Stage, Worker};

use crate::admission::admit;
use crate::contract::sole_candidate;
use crate::pressure::{Basis, Comparison, NativePressure, PressureKey};
use crate::sampler::{Sampler, sample_two};
use crate::{
    AdmissionCheck, EngineAdmission, LoadHandles, Pick, PickError, PickReason, PickRequest,
    SyncPolicy,
};

/// The engine a load choice settled on, with the observation it was chosen on, so that
/// admission can reuse it instead of reading the state again.
#[derive(Clone, Copy, Debug)]
pub struct LoadChoice<'s> {
    /// Position of the winner in the candidate slice that was given.
    pub index: usize,
    /// Whether reported pressure or router-local in-flight counts decided.
    pub basis: Basis,
    /// The winner's snapshot entry (`None`: missing, stale or rank-incomplete).
    pub load: Option<&'s EngineLoad>,
    /// The winner's router-local in-flight count as read for the comparison.
    pub inflight: u64,
}

/// Power-of-k choices: samples `k` distinct candidates uniformly and returns the least
/// pressured by the stage's comparison (see [`crate::pressure`]); a complete tie keeps the
/// first sampled. With `k` at least the number of candidates it is the exact minimum, ties
/// going to the first candidate in slice order. `k` of 0 is read as 1. `None` only when
/// `engines` is empty.
///
/// Cache-aware selection runs this as its load fallback (`min_load_choices`, default 2) over
/// whichever candidate tier it prefers; power-of-two is `k = 2`.
pub fn min_load_choices<'s, W, R>(
    engines: &[W],
    stage: Stage,
    k: usize,
    snapshot: &'s LoadSnapshot,
    inflight: &Inflight,
    rng: &mut R,
) -> Option<LoadChoice<'s>>
where
    W: AsRef<Worker>,
    R: Rng + ?Sized,
{
    let n = engines.len();
    let observe = |index: usize| {
        let id = engines[index].as_ref().id();
        let load = snapshot.get(id);
        (index, load, NativePressure::of(load), inflight.count(id))
    };
    match (n, k.max(1)) {
        (0, _) => None,
        (_, k) if k >= n => {
            // Every engine, in a drawn order: equally loaded ones share the requests instead
            // of the first taking them all.
            let mut all: Vec<usize> = (0..n).collect();
            all.shuffle(rng);
            choose(stage, &all.into_iter().map(observe).collect::<Vec<_>>())
        }
        (_, 1) => choose(stage, &[observe(rng.random_range(0..n))]),
        (_, 2) => {
            let (first, second) = sample_two(rng, n);
            choose(stage, &[observe(first), observe(second)])
        }
        (_, k) => {
            let sampled = index::sample(rng, n, k);
            choose(stage, &sampled.into_iter().map(observe).collect::<Vec<_>>())
        }
    }
}

type Observed<'s> = (usize, Option<&'s EngineLoad>, Option<NativePressure>, u64);

/// The least key among `observed`, the first on ties (callers draw the order).
fn choose<'s>(stage: Stage, observed: &[Observed<'s>]) -> Option<LoadChoice<'s>> {
    let comparison = Comparison::for_set(stage, observed.iter().map(|o| o.2));
    let mut best: Option<(PressureKey, Observed<'s>)> = None;
    for &o in observed {
        let key = comparison.key(o.2, o.3);
        if best.as_ref().is_none_or(|(best_key, _)| key < *best_key) {
            best = Some((key, o));
        }
    }
    best.map(|(_, (index, load, _, inflight))| LoadChoice {
        index,
        basis: comparison.basis(),
        load,
        inflight,
    })
}

/// Samples two distinct candidates uniformly and keeps the less pressured by the stage's
/// comparison (reported pressure when both have a fresh, complete native report with a valid
/// capacity, router-local in-flight otherwise and on ties; a complete tie keeps the first
/// sampled).
///
/// Admission is checked exactly once, on the winner, against the very observation it won on;
/// a rejection is [`PickError::AdmissionRejected`] with no resampling, no second choice and
/// no fallback. A single candidate is taken directly, but its load is still read for
/// admission. No candidates is [`PickError::NoCandidates`], without admission.
#[derive(Debug)]
pub struct PowerOfTwoPolicy {
    load: LoadHandles,
    sampler: Sampler,
    admission: Option<Arc<dyn EngineAdmission>>,
}

impl PowerOfTwoPolicy {
    /// Power-of-two over the application's shared load state, admitting every engine.
    pub fn new(load: LoadHandles) -> Self {
        Self { load, sampler: Sampler::Thread, admission: None }
    }

    /// Samples from a generator seeded with `seed`, for reproducible runs.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.sampler = Sampler::seeded(seed);
        self
    }

    /// Checks the winner with `admission`.
    pub fn with_admission(mut self, admission: AdmissionCheck) -> Self {
        self.admission = Some(Arc::clone(admission.admission()));
        self
    }
}

impl SyncPolicy for PowerOfTwoPolicy {
    fn choose(
        &self,
        engines: &[Arc<Worker>],
        request: &PickRequest<'_>,
    ) -> Result<Pick, PickError> {
        let sole = sole_candidate(engines, request)?;
        let snapshot = self.load.table.snapshot();
        let (worker, reason, load, inflight) = if let Some(only) = sole {
            let load = snapshot.get(only.id());
            let inflight = self.load.inflight.count(only.id());
            (only, PickReason::OnlyCandidate, load, inflight)
        } else {
            let choice = self
                .sampler
                .with(|rng| {
                    min_load_choices(engines, request.stage, 2, &snapshot, &self.load.inflight, rng)
                })
                .ok_or(PickError::NoCandidates { stage: request.stage })?;
            let reason = match choice.basis {
                Basis::Reported => PickReason::ReportedPressure,
                Basis::Local => PickReason::LocalPressure,
            };
            (&engines[choice.index], reason, choice.load, choice.inflight)
        };
        if let Some(admission) = &self.admission {
            admit(admission.as_ref(), worker, load, inflight)?;
        }
        Ok(Pick::new(Arc::clone(worker), reason))
    }

    fn name(&self) -> &'static str {
        "power_of_two"
    }
}
