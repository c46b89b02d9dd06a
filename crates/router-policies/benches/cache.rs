//! Cache-aware pick latency for an 8,192-token request over 64 engines, and the remote lookup
//! round trip on loopback.
//!
//! `cargo bench -p router-policies --bench cache`. The 64 engines hold the request's first
//! 8, 16, ..., 512 blocks of 16 tokens (64 different match depths, so the lookup narrows its
//! holder set 63 times), each with a fresh native report.
//!
//! - `pick/hit`: a fresh request per iteration: hashing 512 blocks, the index lookup, hit
//!   thresholds, candidate bound, admission and the pressure guard.
//! - `pick/memoised`: the same request again (a later bucket attempt): the decision only.
//! - `pick/miss`: a prompt nobody holds: hashing, an empty lookup, the power-of-two fallback.
//! - `remote/lookup`: a remote source's lookup (hashing plus one gRPC round trip to a
//!   `KvIndexService` on 127.0.0.1); `remote/pick` the whole pick over it.
//!
//! Wall time: on a shared machine, run it while the machine is otherwise idle.

#![expect(missing_docs, reason = "criterion_group! generates an undocumented function")]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use futures::FutureExt;
use router_policies::{
    AdmissionCheck, AdmissionLimits, BlockSize, CacheAwarePolicy, CacheAwareSettings, CacheSource,
    CacheSources, LoadHandles, PickReason, PickRequest, Policy, RequestTokens,
};
use router_state_kv::KvIndex;
use router_state_kv::remote::{ClientConfig, KvIndexService, serve_with};
use router_state_kv::wire::{BlockStored, Event};
use router_state_load::{
    EngineReportedLoadTable, Inflight, ManualClock, RankSample, Report, ReportKind, TableConfig,
};
use router_workers::{KvEventsSpec, ModelId, Stage, Worker, WorkerSpec};
use tokio_util::sync::CancellationToken;

const BS: u32 = 16;
const ENGINES: usize = 64;
const TOKENS: usize = 8192;

fn prompt() -> Vec<u32> {
    (0..TOKENS as u32).map(|i| i.wrapping_mul(2_654_435_761) >> 15).collect()
}

struct Fleet {
    model: ModelId,
    index: Arc<KvIndex>,
    load: LoadHandles,
    workers: Vec<Arc<Worker>>,
}

fn fleet() -> Fleet {
    let model = ModelId::new("bench");
    let clock = Arc::new(ManualClock::new());
    let table = Arc::new(EngineReportedLoadTable::new(TableConfig::default(), clock.clone()));
    let inflight = Arc::new(Inflight::new(clock));
    let index = Arc::new(KvIndex::default());
    let prompt = prompt();
    let mut workers = Vec::with_capacity(ENGINES);
    for i in 0..ENGINES {
        let id = format!("engine-{i:02}");
        let spec = WorkerSpec {
            model: Some("bench".to_owned()),
            kv_events: Some(KvEventsSpec {
                block_size: Some(BS),
                ..KvEventsSpec::new(format!("tcp://{id}.bench:5557"))
            }),
            ..WorkerSpec::new(id.clone(), format!("http://{id}.bench:8000"), Stage::Prefill)
        };
        let worker = Arc::new(Worker::from_spec(&spec, vec![model.clone()]).expect("valid"));
        table.register(&worker);
        let n = i as u64;
        let rank =
            RankSample::basic(0, n % 7, n % 5, 1000, 100_000).with_native(n * 37 % 4096, 2000, 256);
        let report = Report::new(id.as_str(), 1, 1, ReportKind::Native, vec![rank]);
        table.apply(worker.id(), worker.incarnation(), report).expect("accepted");
        let blocks = (i + 1) * 8;
        let holder =
            index.holder(&model, worker.id(), worker.incarnation(), 0, BS).expect("register");
        holder.apply(&[Event::Stored(BlockStored {
            block_hashes: (0..blocks as u64).map(|b| (n << 32) | b).collect(),
            token_ids: prompt[..blocks * BS as usize].to_vec(),
            block_size: Some(i64::from(BS)),
            ..BlockStored::default()
        })]);
        workers.push(worker);
    }
    Fleet { model, index, load: LoadHandles::new(table, inflight), workers }
}

fn policy(fleet: &Fleet, source: Arc<CacheSource>) -> CacheAwarePolicy {
    let admits_all = AdmissionLimits { max_running_requests: Some(1 << 20), ..Default::default() };
    CacheAwarePolicy::new(source, fleet.load.clone(), CacheAwareSettings::default())
        .expect("valid settings")
        .with_admission(AdmissionCheck::new(Arc::new(admits_all), fleet.load.clone()))
}

fn request<'a>(fleet: &'a Fleet, tokens: &'a RequestTokens) -> PickRequest<'a> {
    PickRequest {
        model: &fleet.model,
        stage: Stage::Prefill,
        bucket: "bench",
        input_tokens: tokens.ids().len() as u64,
        expected_peak_tokens: None,
        tokens: Some(tokens),
        session_key: None,
        routing_key: None,
    }
}

fn bench_local(c: &mut Criterion) {
    let fleet = fleet();
    let policy = policy(&fleet, Arc::new(CacheSource::local(Arc::clone(&fleet.index))));
    let mut group = c.benchmark_group("cache_aware");
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));

    let pick = |tokens: &RequestTokens| {
        let request = request(&fleet, tokens);
        let pick = policy.pick(black_box(&fleet.workers), black_box(&request)).now_or_never();
        pick.expect("local picks are ready at once").expect("picked").reason
    };
    let hot = prompt();
    assert_eq!(pick(&RequestTokens::new(hot.clone())), PickReason::CacheHit);
    group.bench_function("pick/hit", |b| {
        b.iter_batched(
            || RequestTokens::new(hot.clone()),
            |tokens| black_box(pick(&tokens)),
            BatchSize::SmallInput,
        );
    });
    let memoised = RequestTokens::new(hot.clone());
    pick(&memoised);
    group.bench_function("pick/memoised", |b| b.iter(|| black_box(pick(&memoised))));
    let cold: Vec<u32> = hot.iter().map(|t| t + 1).collect();
    assert_eq!(pick(&RequestTokens::new(cold.clone())), PickReason::CacheMiss);
    group.bench_function("pick/miss", |b| {
        b.iter_batched(
            || RequestTokens::new(cold.clone()),
            |tokens| black_box(pick(&tokens)),
            BatchSize::SmallInput,
        );
    });
    group.finish();
}

fn bench_remote(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let fleet = fleet();
    let cancel = CancellationToken::new();
    let listener =
        runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind loopback");
    let addr = listener.local_addr().expect("addr").to_string();
    let service = KvIndexService::new(Arc::clone(&fleet.index));
    runtime.spawn(serve_with(listener, service, cancel.clone()));
    let config =
        ClientConfig { query_timeout: Duration::from_secs(5), ..ClientConfig::new(vec![addr]) };
    let source = CacheSources::new().remote(&config).expect("valid");
    let policy = policy(&fleet, Arc::clone(&source));
    let hot = prompt();
    let size = BlockSize::new(BS).expect("non-zero");

    let mut group = c.benchmark_group("cache_aware");
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    group.bench_function("remote/lookup", |b| {
        b.iter(|| {
            let outcome = runtime.block_on(source.lookup(&fleet.model, black_box(&hot), size));
            black_box(outcome.expect("answered"))
        });
    });
    group.bench_function("remote/pick", |b| {
        b.iter_batched(
            || RequestTokens::new(hot.clone()),
            |tokens| {
                let request = request(&fleet, &tokens);
                let pick = runtime.block_on(policy.pick(&fleet.workers, &request));
                black_box(pick.expect("picked").reason)
            },
            BatchSize::SmallInput,
        );
    });
    group.finish();
    assert_eq!(source.stats().unavailable(), 0, "every remote lookup was answered");
    cancel.cancel();
}

criterion_group!(benches, bench_local, bench_remote);
criterion_main!(benches);
