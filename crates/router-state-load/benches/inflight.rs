//! In-flight guard acquire and release, and the recent-dispatch ledger read.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use router_state_load::{Inflight, SystemClock};
use router_workers::{Stage, WorkerId};

fn bench(c: &mut Criterion) {
    let inflight = Inflight::new(SystemClock::shared());
    let ids: Vec<WorkerId> =
        (0..256).map(|i| WorkerId::new(format!("engine-{i}")).expect("id")).collect();
    for id in &ids {
        drop(inflight.acquire(id, Stage::Plain));
    }
    let id = &ids[42];
    let mut group = c.benchmark_group("inflight");
    group.bench_function("acquire_release", |b| {
        b.iter(|| drop(black_box(inflight.acquire(black_box(id), Stage::Plain))))
    });
    let since = Instant::now();
    for _ in 0..100 {
        drop(inflight.acquire(id, Stage::Plain));
    }
    group.bench_function("dispatched_since", |b| {
        b.iter(|| black_box(inflight.dispatched_since(black_box(id), since)))
    });
    group.bench_function("count", |b| b.iter(|| black_box(inflight.count(black_box(id)))));
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
