//! Test doubles of admission shared by every policy's tests.

use std::sync::Arc;

use parking_lot::Mutex;
use router_workers::{Worker, WorkerId};

use crate::{AdmissionLimits, EngineAdmission, EngineObservation, Rejection};

/// Admission limits that record every engine they were asked about, in order, with the
/// metrics they were given.
#[derive(Debug, Default)]
pub(crate) struct Recording {
    pub(crate) limits: AdmissionLimits,
    pub(crate) seen: Mutex<Vec<(WorkerId, EngineObservation)>>,
}

impl Recording {
    pub(crate) fn new(limits: AdmissionLimits) -> Arc<Self> {
        Arc::new(Self { limits, ..Self::default() })
    }

    /// How many checks were made.
    pub(crate) fn calls(&self) -> usize {
        self.seen.lock().len()
    }

    /// The engines checked, in order.
    pub(crate) fn order(&self) -> Vec<String> {
        self.seen.lock().iter().map(|(id, _)| id.to_string()).collect()
    }
}

impl EngineAdmission for Recording {
    fn check(&self, engine: &Worker, metrics: &EngineObservation) -> Result<(), Rejection> {
        self.seen.lock().push((engine.id().clone(), *metrics));
        self.limits.check(engine, metrics)
    }
}

/// Admission capping reported running requests at `cap`.
pub(crate) fn running_cap(cap: u64) -> AdmissionLimits {
    AdmissionLimits { max_running_requests: Some(cap), ..AdmissionLimits::default() }
}
