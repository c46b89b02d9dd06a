//! A fleet over a real `KvIndex` (fed through holders, as the subscriptions do) and a real
//! `EngineReportedLoadTable` (fed through reports, with a manual clock that never moves).

use std::sync::Arc;

use futures::FutureExt;
use router_state_kv::wire::{BlockStored, Event, MediumField};
use router_state_kv::{KvIndex, Medium};
use router_state_load::{
    EngineReportedLoadTable, Inflight, InflightGuard, ManualClock, RankSample, Report, ReportKind,
    TableConfig,
};
use router_workers::{KvEventsSpec, ModelId, Stage, Worker, WorkerId, WorkerSpec};

use crate::{
    CacheAwarePolicy, CacheAwareSettings, CacheSource, LoadHandles, Pick, PickError, PickRequest,
    Policy, RequestTokens,
};

/// The block size of the fixture's engines unless set otherwise.
pub(crate) const BS: u32 = 16;

/// The prompt every request starts with: token ids that are distinct from each other.
pub(crate) fn prompt(len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| 1_000 + i).collect()
}

/// What an engine reports.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Load {
    /// Nothing (missing).
    Missing,
    /// A fresh basic report.
    Basic { running: u64, waiting: u64 },
    /// A fresh native report.
    Native { running: u64, waiting: u64, uncached: u64, queue_ms: Option<f64> },
}

/// One engine of a fixture.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Eng {
    pub id: &'static str,
    /// Leading blocks of the prompt it holds.
    pub blocks: u32,
    pub tier: Medium,
    /// Its KV events' block size; `None`: it publishes no KV events.
    pub block_size: Option<u32>,
    pub load: Load,
    /// The prefill rate its (native) reports' counters give, tokens per second; `None`: none yet.
    pub rate: Option<u64>,
    pub inflight: u64,
}

/// An idle engine (fresh native report, nothing waiting) holding `blocks` blocks of 16.
pub(crate) fn eng(id: &'static str, blocks: u32) -> Eng {
    Eng {
        id,
        blocks,
        tier: Medium::Gpu,
        block_size: Some(BS),
        load: Load::Native { running: 0, waiting: 0, uncached: 0, queue_ms: None },
        rate: None,
        inflight: 0,
    }
}

impl Eng {
    fn native(mut self, f: impl FnOnce(&mut u64, &mut u64, &mut u64, &mut Option<f64>)) -> Self {
        let (mut running, mut waiting, mut uncached, mut queue_ms) = match self.load {
            Load::Native { running, waiting, uncached, queue_ms } => {
                (running, waiting, uncached, queue_ms)
            }
            Load::Basic { running, waiting } => (running, waiting, 0, None),
            Load::Missing => (0, 0, 0, None),
        };
        f(&mut running, &mut waiting, &mut uncached, &mut queue_ms);
        self.load = Load::Native { running, waiting, uncached, queue_ms };
        self
    }

    /// Waiting requests in its (native) report.
    pub(crate) fn waiting(self, n: u64) -> Self {
        self.native(|_, w, _, _| *w = n)
    }

    /// Running requests in its (native) report.
    pub(crate) fn running(self, n: u64) -> Self {
        self.native(|r, _, _, _| *r = n)
    }

    /// Waiting uncached tokens in its (native) report.
    pub(crate) fn uncached(self, n: u64) -> Self {
        self.native(|_, _, u, _| *u = n)
    }

    /// The engine's estimated prefill queue time.
    pub(crate) fn queue_ms(self, ms: f64) -> Self {
        self.native(|_, _, _, q| *q = Some(ms))
    }

    /// Native reports whose prefill counters give `tokens_per_sec` (two reports, a second of
    /// busy time apart).
    pub(crate) fn rate(self, tokens_per_sec: u64) -> Self {
        let mut this = self.native(|_, _, _, _| {});
        this.rate = Some(tokens_per_sec);
        this
    }

    /// No report at all.
    pub(crate) fn missing(mut self) -> Self {
        self.load = Load::Missing;
        self
    }

    /// A basic report.
    pub(crate) fn basic(mut self, running: u64, waiting: u64) -> Self {
        self.load = Load::Basic { running, waiting };
        self
    }

    /// No KV events configured: its `blocks` are not in the index (nothing tells the router
    /// of them), and it is pictured from dispatches alone.
    pub(crate) fn no_kv(mut self) -> Self {
        self.block_size = None;
        self
    }

    /// Another block size.
    pub(crate) fn block_size(mut self, size: u32) -> Self {
        self.block_size = Some(size);
        self
    }

    /// The tier of its blocks.
    pub(crate) fn tier(mut self, tier: Medium) -> Self {
        self.tier = tier;
        self
    }

    /// Router-local in-flight requests.
    pub(crate) fn inflight(mut self, n: u64) -> Self {
        self.inflight = n;
        self
    }
}

/// Engines of one stage with their cache and load state.
pub(crate) struct World {
    /// The clock of the load table and the in-flight ledger.
    pub clock: Arc<ManualClock>,
    pub model: ModelId,
    pub stage: Stage,
    pub index: Arc<KvIndex>,
    pub table: Arc<EngineReportedLoadTable>,
    pub inflight: Arc<Inflight>,
    pub workers: Vec<Arc<Worker>>,
    pub source: Arc<CacheSource>,
    _guards: Vec<InflightGuard>,
}

impl World {
    pub(crate) fn new(stage: Stage, engines: &[Eng]) -> Self {
        let clock = Arc::new(ManualClock::new());
        let table = Arc::new(EngineReportedLoadTable::new(TableConfig::default(), clock.clone()));
        let inflight = Arc::new(Inflight::new(clock.clone()));
        let index = Arc::new(KvIndex::default());
        let model = ModelId::new("m");
        let mut workers = Vec::new();
        let mut guards = Vec::new();
        for (n, e) in engines.iter().enumerate() {
            let spec = WorkerSpec {
                model: Some("m".to_owned()),
                kv_events: e.block_size.map(|block_size| KvEventsSpec {
                    block_size: Some(block_size),
                    ..KvEventsSpec::new(format!("tcp://{}.test:5557", e.id))
                }),
                ..WorkerSpec::new(e.id, format!("http://{}.test:8000", e.id), stage)
            };
            let worker = Arc::new(Worker::from_spec(&spec, vec![model.clone()]).expect("valid"));
            table.register(&worker);
            // An engine without KV events has nothing in the index: only the router's own
            // dispatches could picture its cache (approximate mode).
            if let (true, Some(size)) = (e.blocks > 0, e.block_size) {
                let holder = index
                    .holder(&model, worker.id(), worker.incarnation(), 0, size)
                    .expect("register holder");
                let tokens = prompt(e.blocks as usize * size as usize);
                let report = holder.apply(&[Event::Stored(BlockStored {
                    block_hashes: (0..u64::from(e.blocks))
                        .map(|b| ((n as u64) << 32) | b)
                        .collect(),
                    token_ids: tokens,
                    block_size: Some(i64::from(size)),
                    medium: Some(MediumField::Known(e.tier)),
                    ..BlockStored::default()
                })]);
                assert_eq!(report.stored, u64::from(e.blocks), "{}", e.id);
            }
            let ranks = match e.load {
                Load::Missing => None,
                Load::Basic { running, waiting } => {
                    Some((ReportKind::Basic, RankSample::basic(0, running, waiting, 0, 100_000)))
                }
                Load::Native { running, waiting, uncached, queue_ms } => {
                    let mut rank = RankSample::basic(0, running, waiting, 0, 100_000)
                        .with_native(uncached, uncached, 256);
                    rank.estimated_prefill_queue_ms = queue_ms;
                    Some((ReportKind::Native, rank))
                }
            };
            if let Some((kind, rank)) = ranks {
                let samples = match e.rate {
                    Some(rate) => vec![
                        rank.with_prefill_counters(0, 0),
                        rank.with_prefill_counters(rate, 1_000_000),
                    ],
                    None => vec![rank],
                };
                for (seq, rank) in (1..).zip(samples) {
                    let report = Report::new(e.id, 1, seq, kind, vec![rank]);
                    let applied = table.apply(worker.id(), worker.incarnation(), report);
                    applied.expect("report accepted");
                }
            }
            for _ in 0..e.inflight {
                guards.push(inflight.acquire(worker.id(), stage));
            }
            workers.push(worker);
        }
        let source = Arc::new(CacheSource::local(Arc::clone(&index)));
        Self { clock, model, stage, index, table, inflight, workers, source, _guards: guards }
    }

    pub(crate) fn load(&self) -> LoadHandles {
        LoadHandles::new(Arc::clone(&self.table), Arc::clone(&self.inflight))
    }

    /// A seeded policy over the world's local source.
    pub(crate) fn policy(&self, settings: CacheAwareSettings) -> CacheAwarePolicy {
        CacheAwarePolicy::new(Arc::clone(&self.source), self.load(), settings)
            .expect("valid settings")
            .with_seed(7)
    }

    /// The workers with these ids, in this order.
    pub(crate) fn only(&self, ids: &[&str]) -> Vec<Arc<Worker>> {
        ids.iter()
            .map(|id| {
                let found = self.workers.iter().find(|w| w.id().as_str() == *id);
                Arc::clone(found.expect("a fixture worker"))
            })
            .collect()
    }

    /// A request for the first `input` tokens of the prompt, as the policy sees it.
    pub(crate) fn request<'a>(
        &'a self,
        input: u64,
        tokens: Option<&'a RequestTokens>,
    ) -> PickRequest<'a> {
        PickRequest {
            model: &self.model,
            stage: self.stage,
            bucket: "b",
            input_tokens: input,
            expected_peak_tokens: None,
            tokens,
            session_key: None,
            routing_key: None,
        }
    }

    /// One pick over `engines` of a fresh request of `input` prompt tokens; local lookups are
    /// ready at once.
    pub(crate) fn pick_from(
        &self,
        policy: &dyn Policy,
        engines: &[Arc<Worker>],
        input: usize,
    ) -> Result<Pick, PickError> {
        let tokens = RequestTokens::new(prompt(input));
        let request = self.request(input as u64, Some(&tokens));
        policy.pick(engines, &request).now_or_never().expect("local picks are ready at once")
    }

    /// One pick over every engine.
    pub(crate) fn pick(&self, policy: &dyn Policy, input: usize) -> Result<Pick, PickError> {
        self.pick_from(policy, &self.workers, input)
    }
}

pub(crate) fn wid(id: &str) -> WorkerId {
    WorkerId::new(id).expect("non-empty id")
}
