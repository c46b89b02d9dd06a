//! A small fleet with real load state, and the policy flavors under test.

use std::sync::Arc;

use futures::executor::block_on;
use parking_lot::Mutex;
use router_affinity::{AffinityConfig, AffinityStore, Binding, Scope};
use router_state_load::{
    EngineReportedLoadTable, Inflight, InflightGuard, ManualClock, RankSample, Report, ReportKind,
    TableConfig,
};
use router_workers::{ModelId, Stage, Worker};

use crate::{
    AdmissionCheck, AdmissionLimits, BindingScope, EngineAdmission, LoadHandles, Pick, PickError,
    PickRequest, Policy, PolicyHandles, SessionAwarePolicy, StickyFallback, StickyPolicy,
};

pub(super) const BUCKET: &str = "short";

/// Engines `a`, `b`, `c`, `d` of model `m`, their load state, and in-flight requests held open.
pub(super) struct Fleet {
    pub(super) model: ModelId,
    pub(super) workers: Vec<Arc<Worker>>,
    pub(super) load: LoadHandles,
    table: Arc<EngineReportedLoadTable>,
    guards: Mutex<Vec<InflightGuard>>,
}

impl Fleet {
    pub(super) fn new() -> Self {
        let model = ModelId::new("m");
        let workers = ["a", "b", "c", "d"].map(|id| worker(&model, id)).to_vec();
        let clock = Arc::new(ManualClock::new());
        let table = Arc::new(EngineReportedLoadTable::new(TableConfig::default(), clock.clone()));
        let inflight = Arc::new(Inflight::new(clock));
        let load = LoadHandles::new(Arc::clone(&table), inflight);
        Self { model, workers, load, table, guards: Mutex::new(Vec::new()) }
    }

    /// The engine named `id`.
    pub(super) fn get(&self, id: &str) -> &Arc<Worker> {
        self.workers.iter().find(|w| w.id().as_str() == id).expect("a fleet engine")
    }

    /// The engines named by `ids`, in that order (the group's order is by id).
    pub(super) fn group(&self, ids: &[&str]) -> Vec<Arc<Worker>> {
        ids.iter().map(|id| Arc::clone(self.get(id))).collect()
    }

    /// Holds `n` more requests in flight to `id` until the fleet is dropped.
    pub(super) fn busy(&self, id: &str, n: u64) {
        let worker = self.get(id).id().clone();
        let mut guards = self.guards.lock();
        for _ in 0..n {
            guards.push(self.load.inflight.acquire(&worker, Stage::Plain));
        }
    }

    /// Makes `id` report `waiting` waiting requests (a fresh basic report).
    pub(super) fn report_waiting(&self, id: &str, waiting: u64) {
        let worker = Arc::clone(self.get(id));
        self.table.register(&worker);
        let report = Report::new(
            id,
            1,
            1,
            ReportKind::Basic,
            vec![RankSample::basic(0, 0, waiting, 0, 100_000)],
        );
        self.table.apply(worker.id(), worker.incarnation(), report).expect("report accepted");
    }

    pub(super) fn request<'a>(&'a self, flavor: Flavor, key: Option<&'a str>) -> PickRequest<'a> {
        let mut request = self.keyless();
        match flavor {
            Flavor::Session => request.session_key = key,
            Flavor::Sticky(_) => request.routing_key = key,
        }
        request
    }

    pub(super) fn keyless(&self) -> PickRequest<'_> {
        PickRequest {
            model: &self.model,
            stage: Stage::Plain,
            bucket: BUCKET,
            input_tokens: 100,
            expected_peak_tokens: None,
            tokens: None,
            session_key: None,
            routing_key: None,
        }
    }

    pub(super) fn scope(&self, key: &str) -> Scope {
        Scope::new(&self.model, BUCKET, Stage::Plain, key).expect("valid scope")
    }

    /// The model-wide scope of `key` on plain engines.
    pub(super) fn model_scope(&self, key: &str) -> Scope {
        Scope::model_wide(&self.model, Stage::Plain, key).expect("valid scope")
    }

    pub(super) fn admission(&self, limits: AdmissionLimits) -> AdmissionCheck {
        AdmissionCheck::new(Arc::new(limits), self.load.clone())
    }

    pub(super) fn handles(&self) -> PolicyHandles {
        PolicyHandles::new(self.load.clone())
    }
}

pub(super) fn worker(model: &ModelId, id: &str) -> Arc<Worker> {
    Arc::new(Worker::plain(id, "http://127.0.0.1:9", model).expect("valid worker"))
}

pub(super) fn store() -> Arc<AffinityStore> {
    Arc::new(AffinityStore::new(AffinityConfig::default()).expect("valid config"))
}

/// A policy under test: session-aware (power-of-two fallback) or sticky with one fallback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Flavor {
    Session,
    Sticky(StickyFallback),
}

impl Flavor {
    /// The flavors whose fallback is deterministic on the fixtures used where the candidates'
    /// loads differ: with two candidates power-of-two samples both, so every one of these picks
    /// the less loaded engine (ties are drawn; round-robin takes the first turn).
    pub(super) const DETERMINISTIC: [Flavor; 4] = [
        Flavor::Session,
        Flavor::Sticky(StickyFallback::RoundRobin),
        Flavor::Sticky(StickyFallback::PowerOfTwo),
        Flavor::Sticky(StickyFallback::LoadBased),
    ];

    /// The request key this flavor binds on.
    pub(super) fn key_source(self) -> crate::KeySource {
        match self {
            Flavor::Session => crate::KeySource::Session,
            Flavor::Sticky(_) => crate::KeySource::RoutingKey,
        }
    }

    pub(super) fn build(
        self,
        fleet: &Fleet,
        store: &Arc<AffinityStore>,
        limits: AdmissionLimits,
    ) -> Arc<dyn Policy> {
        self.build_scoped(fleet, store, limits, BindingScope::Bucket)
    }

    /// [`Flavor::build`] binding with `scope`.
    pub(super) fn build_scoped(
        self,
        fleet: &Fleet,
        store: &Arc<AffinityStore>,
        limits: AdmissionLimits,
        scope: BindingScope,
    ) -> Arc<dyn Policy> {
        let admission: Option<Arc<dyn EngineAdmission>> =
            (!limits.is_unlimited()).then(|| Arc::new(limits) as Arc<dyn EngineAdmission>);
        match self {
            Flavor::Session => {
                let policy = SessionAwarePolicy::new(Arc::clone(store), fleet.load.clone())
                    .with_scope(scope);
                match admission {
                    None => Arc::new(policy),
                    Some(a) => {
                        Arc::new(policy.with_admission(AdmissionCheck::new(a, fleet.load.clone())))
                    }
                }
            }
            Flavor::Sticky(fallback) => {
                let policy = StickyPolicy::new(Arc::clone(store), fallback.build(&fleet.handles()))
                    .with_scope(scope);
                match admission {
                    None => Arc::new(policy),
                    Some(a) => {
                        Arc::new(policy.with_admission(AdmissionCheck::new(a, fleet.load.clone())))
                    }
                }
            }
        }
    }
}

/// Runs one pick to completion (every policy here is ready at once).
pub(super) fn pick(
    policy: &dyn Policy,
    engines: &[Arc<Worker>],
    request: &PickRequest<'_>,
) -> Result<Pick, PickError> {
    block_on(policy.pick(engines, request))
}

/// The id a pick chose, with its reason, or the engine admission rejected.
pub(super) fn outcome(result: &Result<Pick, PickError>) -> String {
    match result {
        Ok(pick) => format!("{} {}", pick.worker.id(), pick.reason),
        Err(PickError::AdmissionRejected(rejection)) => format!("rejected {}", rejection.worker),
        Err(other) => format!("error {other}"),
    }
}

/// The engine id a scope is bound to, if any.
pub(super) fn bound(store: &AffinityStore, scope: &Scope) -> Option<String> {
    store.get(scope).map(|b: Binding| b.worker().as_str().to_owned())
}
