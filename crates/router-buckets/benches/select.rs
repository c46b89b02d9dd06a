//! Resolution and selection costs on a modest fleet: 16 buckets, 64 engines.
//!
//! Run with `cargo bench -p router-buckets --bench select`.

#![expect(missing_docs, reason = "criterion_group! generates an undocumented public function")]

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use futures::executor::block_on;
use futures::future::BoxFuture;
use router_buckets::{
    Bucket, BucketGroups, BucketRequest, BucketResolver, BucketSlo, BucketSpec, EngineGroup,
    PairOn, SloTargets, TokenLimits,
};
use router_policies::{Pick, PickError, PickReason, PickRequest, Policy};
use router_workers::{ModelId, Stage, Worker, WorkerId, WorkerRegistry};

/// Picks the last candidate; immediately ready, so the bench measures the bucket machinery.
#[derive(Debug)]
struct Last;

impl Policy for Last {
    fn pick<'a>(
        &'a self,
        engines: &'a [Arc<Worker>],
        request: &'a PickRequest<'a>,
    ) -> BoxFuture<'a, Result<Pick, PickError>> {
        let pick = engines
            .last()
            .map(|w| Pick::new(Arc::clone(w), PickReason::RoundRobin))
            .ok_or(PickError::NoCandidates { stage: request.stage });
        Box::pin(async move { pick })
    }

    fn name(&self) -> &'static str {
        "last"
    }
}

fn fleet(model: &ModelId) -> WorkerRegistry {
    let registry = WorkerRegistry::new();
    for i in 0..32 {
        for (prefix, stage) in [("P", Stage::Prefill), ("D", Stage::Decode)] {
            let worker = Worker::with_stage(
                &format!("{prefix}{i:02}"),
                &format!("http://10.0.{}.{i}:30000", u8::from(stage == Stage::Decode)),
                model,
                stage,
            )
            .expect("valid worker");
            registry.add(worker).expect("unique");
        }
    }
    registry
}

/// 16 PD buckets of growing capacity; bucket `k` owns engines `2k` and `2k+1` of each stage.
fn resolver(model: &ModelId) -> BucketResolver {
    let policy: Arc<dyn Policy> = Arc::new(Last);
    let members = |prefix: &str, k: usize| {
        Some(vec![
            WorkerId::new(format!("{prefix}{:02}", 2 * k)).expect("id"),
            WorkerId::new(format!("{prefix}{:02}", 2 * k + 1)).expect("id"),
        ])
    };
    let buckets = (0..16)
        .map(|k| {
            let group = |stage, prefix| {
                EngineGroup::new(stage, members(prefix, k), Arc::clone(&policy)).expect("group")
            };
            Bucket::new(BucketSpec {
                id: format!("bucket-{k:02}"),
                rank: u32::try_from(k % 3).expect("small"),
                limits: TokenLimits { min: 0, max: Some(1024 << k) },
                max_context_tokens: Some(2048 << k),
                groups: BucketGroups::Pd {
                    prefill: group(Stage::Prefill, "P"),
                    decode: group(Stage::Decode, "D"),
                    pair_on: PairOn::none(),
                },
                slo: BucketSlo::NONE,
                live: None,
            })
            .expect("bucket")
        })
        .collect();
    BucketResolver::new(model.clone(), buckets).expect("resolver")
}

fn bench(c: &mut Criterion) {
    let model = ModelId::new("llama");
    let registry = fleet(&model);
    let resolver = resolver(&model);
    let request = BucketRequest {
        model: &model,
        input_tokens: 100_000,
        expected_peak_tokens: Some(120_000),
        tokens: None,
        session_key: None,
        routing_key: None,
        slo: SloTargets::NONE,
        excluded: &[],
        subset: None,
    };

    c.bench_function("resolve 16 buckets", |b| {
        b.iter(|| resolver.resolve(black_box(100_000), black_box(Some(120_000))).map(|v| v.len()))
    });
    let first = resolver.resolve(100_000, Some(120_000)).expect("valid")[0];
    c.bench_function("pick_engines pd, 64 engines", |b| {
        b.iter(|| block_on(first.pick_engines(&registry, black_box(&request))).is_ok())
    });
    c.bench_function("select pd, 16 buckets, 64 engines", |b| {
        b.iter(|| block_on(resolver.select(&registry, black_box(&request))).is_ok())
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
