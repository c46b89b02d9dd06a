//! Pick latency of the load policies at 8, 64 and 256 candidates, snapshot included.
//!
//! Every engine has a fresh native report and a few requests in flight, so power-of-two and
//! least-load take their reported-pressure paths. `+admission` variants attach a running-request
//! cap that admits everything, so the admission observation is part of the measured pick.

#![expect(missing_docs, reason = "criterion_group! generates an undocumented function")]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use futures::FutureExt;
use router_policies::{
    AdmissionLimits, LoadHandles, PickRequest, Policy, PolicyConfig, PolicyHandles, PolicySettings,
};
use router_state_load::{
    EngineReportedLoadTable, Inflight, InflightGuard, ManualClock, RankSample, Report, ReportKind,
    TableConfig,
};
use router_workers::{ModelId, Stage, Worker};

struct Fleet {
    workers: Vec<Arc<Worker>>,
    handles: PolicyHandles,
    _guards: Vec<InflightGuard>,
}

fn fleet(n: usize, model: &ModelId) -> Fleet {
    let clock = Arc::new(ManualClock::new());
    let table = Arc::new(EngineReportedLoadTable::new(TableConfig::default(), clock.clone()));
    let inflight = Arc::new(Inflight::new(clock));
    let mut workers = Vec::with_capacity(n);
    let mut guards = Vec::new();
    for i in 0..n {
        let id = format!("engine-{i:03}");
        let worker = Arc::new(
            Worker::with_stage(&id, &format!("http://{id}.bench:8000"), model, Stage::Prefill)
                .expect("valid worker"),
        );
        table.register(&worker);
        let i = i as u64;
        let rank = RankSample::basic(0, i % 7, i % 5, 1000 + i * 13 % 900, 100_000).with_native(
            i * 37 % 4096,
            2000,
            256,
        );
        let report = Report::new(id.as_str(), 1, 1, ReportKind::Native, vec![rank]);
        table.apply(worker.id(), worker.incarnation(), report).expect("accepted");
        for _ in 0..(i % 3) {
            guards.push(inflight.acquire(worker.id(), Stage::Prefill));
        }
        workers.push(worker);
    }
    Fleet {
        workers,
        handles: PolicyHandles::new(LoadHandles::new(table, inflight)),
        _guards: guards,
    }
}

fn bench_picks(c: &mut Criterion) {
    let model = ModelId::new("bench");
    let request = PickRequest {
        model: &model,
        stage: Stage::Prefill,
        bucket: "bench",
        input_tokens: 512,
        expected_peak_tokens: None,
        tokens: None,
        session_key: None,
        routing_key: None,
    };
    let admits_all = AdmissionLimits { max_running_requests: Some(1 << 20), ..Default::default() };
    let variants = [
        ("round_robin", PolicySettings::RoundRobin, AdmissionLimits::default()),
        ("random", PolicySettings::Random, AdmissionLimits::default()),
        ("power_of_two", PolicySettings::PowerOfTwo, AdmissionLimits::default()),
        ("load_based", PolicySettings::LoadBased, AdmissionLimits::default()),
        ("round_robin+admission", PolicySettings::RoundRobin, admits_all),
        ("power_of_two+admission", PolicySettings::PowerOfTwo, admits_all),
    ];
    let mut group = c.benchmark_group("pick");
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    for n in [8, 64, 256] {
        let fleet = fleet(n, &model);
        for (name, kind, admission) in &variants {
            let config = PolicyConfig { kind: kind.clone(), admission: *admission };
            let policy: Arc<dyn Policy> = config.build(&fleet.handles).expect("buildable");
            group.bench_with_input(BenchmarkId::new(*name, n), &fleet.workers, |b, engines| {
                b.iter(|| {
                    let pick = policy.pick(black_box(engines), black_box(&request)).now_or_never();
                    black_box(pick.expect("ready").expect("picked"))
                });
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_picks);
criterion_main!(benches);
