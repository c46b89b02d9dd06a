//! A small fleet over a real `EngineReportedLoadTable` and `Inflight`, fed through their public
//! ingestion API, with a manual clock.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use router_state_load::{
    EngineReportedLoadTable, Inflight, InflightGuard, ManualClock, RankSample, Report, ReportKind,
    TableConfig,
};
use router_workers::{ModelId, Stage, Worker, WorkerSpec};

use crate::{LoadHandles, Pick, PickError, PickRequest, Policy, PolicyHandles};

/// The numbers of a report (one rank, or split over two for a rank-incomplete one).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Numbers {
    pub running: u64,
    pub waiting: u64,
    pub uncached: u64,
    pub used: u64,
    pub capacity: u64,
    pub queue_ms: Option<f64>,
}

/// What the table holds for an engine at pick time.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Load {
    /// Never reported.
    Missing,
    /// Reported long enough ago to be stale.
    Stale(Numbers),
    /// A complete report followed by one missing a rank (the engine has two ranks).
    RankIncomplete(Numbers),
    /// A fresh basic report.
    Basic(Numbers),
    /// A fresh native report.
    Native(Numbers),
}

/// A native report with a capacity of 1000 tokens.
pub(crate) fn native(running: u64, waiting: u64, uncached: u64, used: u64) -> Load {
    Load::Native(Numbers { running, waiting, uncached, used, capacity: 1000, queue_ms: None })
}

/// A native report with an estimated queue time.
pub(crate) fn native_queued(uncached: u64, queue_ms: f64) -> Load {
    Load::Native(Numbers {
        uncached,
        capacity: 1000,
        queue_ms: Some(queue_ms),
        ..Numbers::default()
    })
}

/// A native report with a given capacity.
pub(crate) fn native_cap(running: u64, waiting: u64, used: u64, capacity: u64) -> Load {
    Load::Native(Numbers { running, waiting, used, capacity, ..Numbers::default() })
}

/// A basic report.
pub(crate) fn basic(running: u64, waiting: u64) -> Load {
    Load::Basic(Numbers { running, waiting, capacity: 1000, ..Numbers::default() })
}

/// One engine of a fixture.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Engine {
    pub id: &'static str,
    pub load: Load,
    /// Requests in flight since before the report was captured.
    pub inflight: u64,
    /// Requests dispatched (and still in flight) after the report was captured.
    pub recent: u64,
}

pub(crate) fn engine(id: &'static str, load: Load) -> Engine {
    Engine { id, load, inflight: 0, recent: 0 }
}

impl Engine {
    pub(crate) fn inflight(mut self, n: u64) -> Self {
        self.inflight = n;
        self
    }

    pub(crate) fn recent(mut self, n: u64) -> Self {
        self.recent = n;
        self
    }
}

/// Engines of one stage with their state in a real table.
pub(crate) struct Fleet {
    pub model: ModelId,
    pub stage: Stage,
    pub clock: Arc<ManualClock>,
    pub table: Arc<EngineReportedLoadTable>,
    pub inflight: Arc<Inflight>,
    pub workers: Vec<Arc<Worker>>,
    guards: Vec<InflightGuard>,
}

fn sample(rank: u32, n: Numbers, native: bool) -> RankSample {
    let mut sample = RankSample::basic(rank, n.running, n.waiting, n.used, n.capacity);
    if native {
        sample = sample.with_native(n.uncached, n.used + n.uncached, 256);
        sample.estimated_prefill_queue_ms = n.queue_ms;
    }
    sample
}

impl Fleet {
    /// An empty fleet of `stage` engines.
    pub(crate) fn empty(stage: Stage) -> Self {
        let clock = Arc::new(ManualClock::new());
        let table = Arc::new(EngineReportedLoadTable::new(TableConfig::default(), clock.clone()));
        let inflight = Arc::new(Inflight::new(clock.clone()));
        Self {
            model: ModelId::new("m"),
            stage,
            clock,
            table,
            inflight,
            workers: Vec::new(),
            guards: Vec::new(),
        }
    }

    /// Builds `engines` in order: registration, in-flight requests from before the reports,
    /// stale reports, then (well within the freshness window) the fresh reports, then the
    /// requests dispatched since them.
    pub(crate) fn new(stage: Stage, engines: &[Engine]) -> Self {
        let mut fleet = Self::empty(stage);
        for e in engines {
            let dp_size = if matches!(e.load, Load::RankIncomplete(_)) { 2 } else { 1 };
            let spec = WorkerSpec {
                model: Some("m".to_owned()),
                dp_size,
                ..WorkerSpec::new(e.id, format!("http://{}.test:8000", e.id), stage)
            };
            let worker =
                Arc::new(Worker::from_spec(&spec, vec![fleet.model.clone()]).expect("valid spec"));
            fleet.table.register(&worker);
            fleet.workers.push(worker);
        }
        for (e, w) in engines.iter().zip(&fleet.workers) {
            for _ in 0..e.inflight {
                fleet.guards.push(fleet.inflight.acquire(w.id(), stage));
            }
        }
        fleet.clock.advance(Duration::from_millis(1));
        for (e, w) in engines.iter().zip(&fleet.workers) {
            if let Load::Stale(n) = e.load {
                fleet.report(w, 1, ReportKind::Native, vec![sample(0, n, true)]);
            }
        }
        fleet.clock.advance(Duration::from_secs(4));
        for (e, w) in engines.iter().zip(&fleet.workers) {
            match e.load {
                Load::Missing | Load::Stale(_) => {}
                Load::Basic(n) => fleet.report(w, 1, ReportKind::Basic, vec![sample(0, n, false)]),
                Load::Native(n) => fleet.report(w, 1, ReportKind::Native, vec![sample(0, n, true)]),
                Load::RankIncomplete(n) => {
                    let ranks = vec![sample(0, n, true), sample(1, n, true)];
                    fleet.report(w, 1, ReportKind::Native, ranks);
                    let mut partial = Report::new(
                        w.id().as_str(),
                        1,
                        2,
                        ReportKind::Native,
                        vec![sample(0, n, true)],
                    );
                    partial.dp_size = 2;
                    let applied = fleet.table.apply(w.id(), w.incarnation(), partial);
                    assert!(applied.is_err(), "a rank-incomplete report is not usable");
                }
            }
        }
        fleet.clock.advance(Duration::from_millis(1));
        for (e, w) in engines.iter().zip(&fleet.workers) {
            for _ in 0..e.recent {
                fleet.guards.push(fleet.inflight.acquire(w.id(), stage));
            }
        }
        let snapshot = fleet.table.snapshot();
        for (e, w) in engines.iter().zip(&fleet.workers) {
            let usable = matches!(e.load, Load::Basic(_) | Load::Native(_));
            assert_eq!(snapshot.get(w.id()).is_some(), usable, "{}: {:?}", e.id, e.load);
        }
        fleet
    }

    fn report(&self, worker: &Worker, sequence: u64, kind: ReportKind, ranks: Vec<RankSample>) {
        let report = Report::new(worker.id().as_str(), 1, sequence, kind, ranks);
        self.table.apply(worker.id(), worker.incarnation(), report).expect("report accepted");
    }

    pub(crate) fn handles(&self) -> PolicyHandles {
        PolicyHandles::new(self.load())
    }

    pub(crate) fn load(&self) -> LoadHandles {
        LoadHandles::new(self.table.clone(), self.inflight.clone())
    }

    /// Runs one pick (every policy here is ready at once).
    pub(crate) fn pick(&self, policy: &dyn Policy, input_tokens: u64) -> Result<Pick, PickError> {
        self.pick_from(policy, &self.workers, input_tokens)
    }

    pub(crate) fn pick_from(
        &self,
        policy: &dyn Policy,
        engines: &[Arc<Worker>],
        input_tokens: u64,
    ) -> Result<Pick, PickError> {
        let request = PickRequest {
            model: &self.model,
            stage: self.stage,
            bucket: "b",
            input_tokens,
            expected_peak_tokens: None,
            tokens: None,
            session_key: None,
            routing_key: None,
        };
        policy.pick(engines, &request).now_or_never().expect("local policies are ready at once")
    }
}
