//! Snapshot capture and reads over a table of 256 engines, and the cost of applying a report.

use std::hint::black_box;
use std::time::Duration;

use criterion::Criterion;
use router_state_load::{
    EngineReportedLoadTable, RankSample, Report, ReportKind, SystemClock, TableConfig,
};
use router_workers::{ModelId, Worker, WorkerId};

const ENGINES: usize = 256;

fn table() -> (EngineReportedLoadTable, Vec<Worker>) {
    let config = TableConfig { report_burst: u32::MAX, ..TableConfig::default() };
    let table = EngineReportedLoadTable::new(config, SystemClock::shared());
    let model = ModelId::new("m");
    let workers: Vec<Worker> = (0..ENGINES)
        .map(|i| {
            Worker::plain(&format!("engine-{i}"), "http://127.0.0.1:1", &model).expect("worker")
        })
        .collect();
    for (i, w) in workers.iter().enumerate() {
        table.register(w);
        let rank = RankSample::basic(0, i as u64, 1, 100, 1000)
            .with_native(10, 200, 64)
            .with_prefill_counters(0, 0);
        let report = Report::new(w.id().as_str(), 1, 1, ReportKind::Native, vec![rank]);
        table.apply(w.id(), w.incarnation(), report).expect("accepted");
    }
    (table, workers)
}

fn bench(c: &mut Criterion) {
    let (table, workers) = table();
    let ids: Vec<WorkerId> = workers.iter().map(|w| w.id().clone()).collect();
    let mut group = c.benchmark_group("load_table_256");
    group.bench_function("snapshot", |b| b.iter(|| black_box(table.snapshot())));
    group.bench_function("snapshot_and_get_all", |b| {
        b.iter(|| {
            let snapshot = table.snapshot();
            let running: u64 =
                ids.iter().filter_map(|id| snapshot.get(id)).map(|l| l.running_requests).sum();
            black_box(running)
        })
    });
    let w = &workers[7];
    let mut seq = 1;
    group.bench_function("apply_report", |b| {
        b.iter(|| {
            seq += 1;
            let rank = RankSample::basic(0, 3, 1, 100, 1000).with_native(10, 200, 64);
            let report = Report::new(w.id().as_str(), 1, seq, ReportKind::Native, vec![rank]);
            black_box(table.apply(w.id(), w.incarnation(), report)).expect("accepted");
        })
    });
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(50)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

fn main() {
    let mut criterion = config().configure_from_args();
    bench(&mut criterion);
    criterion.final_summary();
}
