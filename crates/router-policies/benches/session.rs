//! Session-aware pick cost at 8 and 64 candidates: reusing an existing binding (scope
//! encoding, one store lookup, the candidate scan and an admission check) and creating a new
//! one (additionally power-of-two over the load state and a bind).
//!
//! Admission (`max_inflight_requests`) is attached, so every pick also reads a load snapshot
//! and an in-flight count. Run with `cargo bench -p router-policies --bench session`.

#![expect(missing_docs, reason = "criterion_group! generates an undocumented public function")]

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use futures::FutureExt;
use router_affinity::{AffinityConfig, AffinityStore};
use router_policies::{
    AdmissionCheck, AdmissionLimits, LoadHandles, PickReason, PickRequest, Policy,
    SessionAwarePolicy,
};
use router_state_load::{EngineReportedLoadTable, Inflight, SystemClock, TableConfig};
use router_workers::{ModelId, Stage, Worker};

/// New-binding picks run in chunks of this many keys, each chunk on a fresh store, so every
/// timed pick creates a binding and the store never reaches its entry cap.
const CHUNK: usize = 4096;

struct Setup {
    model: ModelId,
    engines: Vec<Arc<Worker>>,
    load: LoadHandles,
}

fn setup(n: usize) -> Setup {
    let model = ModelId::new("bench-model");
    let engines = (0..n)
        .map(|i| {
            let url = format!("http://10.0.{}.{}:8000", i / 250, i % 250 + 1);
            Arc::new(Worker::plain(&format!("engine-{i:03}"), &url, &model).expect("valid worker"))
        })
        .collect();
    let clock = SystemClock::shared();
    let table = Arc::new(EngineReportedLoadTable::new(TableConfig::default(), clock.clone()));
    let load = LoadHandles::new(table, Arc::new(Inflight::new(clock)));
    Setup { model, engines, load }
}

fn policy(setup: &Setup) -> SessionAwarePolicy {
    let store = AffinityStore::new(AffinityConfig::default()).expect("valid config");
    let limits = AdmissionLimits { max_inflight_requests: Some(1_000), ..Default::default() };
    SessionAwarePolicy::new(Arc::new(store), setup.load.clone())
        .with_seed(7)
        .with_admission(AdmissionCheck::new(Arc::new(limits), setup.load.clone()))
}

fn request<'a>(model: &'a ModelId, key: &'a str) -> PickRequest<'a> {
    PickRequest {
        model,
        stage: Stage::Plain,
        bucket: "short-context",
        input_tokens: 1_000,
        expected_peak_tokens: None,
        tokens: None,
        session_key: Some(key),
        routing_key: None,
    }
}

fn pick(
    policy: &SessionAwarePolicy,
    engines: &[Arc<Worker>],
    request: &PickRequest<'_>,
) -> PickReason {
    let pick =
        policy.pick(engines, request).now_or_never().expect("local policies are ready at once");
    pick.expect("admitted").reason
}

fn session_pick(c: &mut Criterion) {
    let mut group = c.benchmark_group("session_pick");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    let keys: Vec<String> =
        (0..CHUNK).map(|i| format!("session-{i:08x}-0000-4000-8000-000000000000")).collect();
    for n in [8, 64] {
        let setup = setup(n);

        let reused = policy(&setup);
        let key = &keys[0];
        assert_eq!(
            pick(&reused, &setup.engines, &request(&setup.model, key)),
            PickReason::AffinityBound
        );
        group.bench_function(BenchmarkId::new("existing_binding", n), |b| {
            b.iter(|| {
                let request = request(&setup.model, black_box(key));
                pick(&reused, &setup.engines, &request)
            });
        });

        group.bench_function(BenchmarkId::new("new_binding", n), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let fresh = policy(&setup);
                    let count = left.min(CHUNK as u64);
                    let start = Instant::now();
                    for key in &keys[..count as usize] {
                        let request = request(&setup.model, key);
                        black_box(pick(&fresh, &setup.engines, &request));
                    }
                    total += start.elapsed();
                    left -= count;
                }
                total
            });
        });
    }
    group.finish();
}

criterion_group!(benches, session_pick);
criterion_main!(benches);
