//! Least-load (`load_based`): the exact minimum of the stage's pressure, corrected for requests
//! dispatched since each engine's report.

use std::sync::Arc;

use router_state_load::EngineLoad;
use router_workers::Worker;

use crate::admission::rejection;
use crate::pressure::{Basis, Comparison, NativePressure, PressureKey};
use crate::{
    AdmissionCheck, EngineAdmission, LoadHandles, Pick, PickError, PickReason, PickRequest,
    SyncPolicy,
};

/// Chooses the least loaded candidate by the stage's pressure comparison over *all* candidates.
///
/// - **Recent-dispatch correction**: a report describes the engine at its capture time, so each
///   request the router dispatched to it since then (`Inflight::dispatched_since`) counts as one
///   more waiting request of the current request's input length in uncached tokens (requests
///   in one bucket have similar lengths). An engine with such requests loses its queue-time
///   estimate for the comparison, which cannot be corrected without the engine's rate. Without
///   the correction a burst between two reports would all land on one engine.
/// - **Telemetry fallback**: when any candidate lacks a fresh, complete native report with a
///   valid capacity, all are compared by router-local in-flight requests (which already count
///   every dispatch), reason [`PickReason::LeastLocalLoad`].
/// - **Tie-breaking**: reported ties go to fewer router-local in-flight requests, then to the
///   first candidate in the group's order (sorted by id), so equal engines are chosen stably.
/// - **Admission**: checked on the minimum first, then on the next least loaded and so on,
///   each against the observation it was ranked on; when every candidate is rejected the
///   result is [`PickError::NoAdmissibleEngine`] with every rejection in the order met.
#[derive(Debug)]
pub struct LeastLoadPolicy {
    load: LoadHandles,
    admission: Option<Arc<dyn EngineAdmission>>,
}

struct Ranked<'s> {
    key: PressureKey,
    index: usize,
    load: Option<&'s EngineLoad>,
    inflight: u64,
}

impl LeastLoadPolicy {
    /// Least-load over the application's shared load state, admitting every engine.
    pub fn new(load: LoadHandles) -> Self {
        Self { load, admission: None }
    }

    /// Checks candidates with `admission`, least loaded first.
    pub fn with_admission(mut self, admission: AdmissionCheck) -> Self {
        self.admission = Some(Arc::clone(admission.admission()));
        self
    }
}

impl SyncPolicy for LeastLoadPolicy {
    fn choose(
        &self,
        engines: &[Arc<Worker>],
        request: &PickRequest<'_>,
    ) -> Result<Pick, PickError> {
        if engines.is_empty() {
            return Err(PickError::NoCandidates { stage: request.stage });
        }
        let snapshot = self.load.table.snapshot();
        let inflight = &self.load.inflight;
        let mut observed: Vec<_> = engines
            .iter()
            .map(|engine| {
                let load = snapshot.get(engine.id());
                (load, NativePressure::of(load), inflight.count(engine.id()))
            })
            .collect();
        // The correction matters only when reported pressure decides, i.e. every engine has it.
        if observed.iter().all(|o| o.1.is_some()) {
            for (engine, (load, pressure, _)) in engines.iter().zip(&mut observed) {
                if let (Some(load), Some(p)) = (load, pressure.as_mut()) {
                    let unreported = inflight.dispatched_since(engine.id(), load.captured_at);
                    *p = p.with_unreported(unreported, request.input_tokens);
                }
            }
        }
        let comparison = Comparison::for_set(request.stage, observed.iter().map(|o| o.1));
        let mut ranked: Vec<Ranked<'_>> = observed
            .into_iter()
            .enumerate()
            .map(|(index, (load, pressure, inflight))| Ranked {
                key: comparison.key(pressure, inflight),
                index,
                load,
                inflight,
            })
            .collect();
        let reason = match (engines.len(), comparison.basis()) {
            (1, _) => PickReason::OnlyCandidate,
            (_, Basis::Reported) => PickReason::LeastReportedLoad,
            (_, Basis::Local) => PickReason::LeastLocalLoad,
        };
        let best = ranked
            .iter()
            .enumerate()
            .min_by_key(|(_, r)| (r.key, r.index))
            .map_or(0, |(position, _)| position);
        let Some(admission) = &self.admission else {
            return Ok(Pick::new(Arc::clone(&engines[ranked[best].index]), reason));
        };
        // The minimum is admitted in the common case; only a rejection ranks the rest.
        let mut rejections = Vec::new();
        let mut attempt = |r: &Ranked<'_>| -> Option<Pick> {
            let engine = &engines[r.index];
            match rejection(Some(admission.as_ref()), engine, r.load, r.inflight) {
                None => Some(Pick::new(Arc::clone(engine), reason)),
                Some(rejection) => {
                    rejections.push(rejection);
                    None
                }
            }
        };
        let first = ranked.swap_remove(best);
        if let Some(pick) = attempt(&first) {
            return Ok(pick);
        }
        ranked.sort_unstable_by_key(|r| (r.key, r.index));
        for r in &ranked {
            if let Some(pick) = attempt(r) {
                return Ok(pick);
            }
        }
        Err(PickError::NoAdmissibleEngine { rejections })
    }

    fn name(&self) -> &'static str {
        "load_based"
    }
}
