//! The remote source against a real `KvIndexService` on 127.0.0.1: hit, miss, timeout, over
//! the in-flight limit, server down, a refused query, and construction from configuration.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use router_state_kv::KvIndex;
use router_state_kv::remote::{ClientConfig, KvIndexService, serve_with};
use router_workers::{ModelId, Stage};
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::fixture::{World, eng, prompt};
use crate::{
    BlockSize, CacheAwarePolicy, CacheAwareSettings, CacheSource, CacheSources, Pick, PickError,
    PickReason, Policy, PolicyConfig, PolicyHandles, RequestTokens, SourceStats,
};

struct Indexer {
    addr: String,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl Indexer {
    async fn start(index: Arc<KvIndex>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let cancel = CancellationToken::new();
        let task = tokio::spawn({
            let cancel = cancel.clone();
            let service = KvIndexService::new(index);
            async move { serve_with(listener, service, cancel).await.expect("serves") }
        });
        Self { addr, cancel, task }
    }

    async fn stop(self) {
        self.cancel.cancel();
        self.task.await.expect("server stops cleanly");
    }
}

fn remote(addr: &str, timeout: Duration, max_inflight: usize) -> Arc<CacheSource> {
    let config =
        ClientConfig { endpoints: vec![addr.to_owned()], query_timeout: timeout, max_inflight };
    CacheSources::new().remote(&config).expect("valid config")
}

fn policy(world: &World, source: &Arc<CacheSource>) -> CacheAwarePolicy {
    let settings = CacheAwareSettings { min_load_choices: 64, ..CacheAwareSettings::default() };
    CacheAwarePolicy::new(Arc::clone(source), world.load(), settings).expect("valid")
}

async fn pick(
    world: &World,
    policy: &dyn Policy,
    tokens: &RequestTokens,
) -> Result<Pick, PickError> {
    let request = world.request(tokens.ids().len() as u64, Some(tokens));
    policy.pick(&world.workers, &request).await
}

const PATIENT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_remote_hit_and_a_confirmed_miss() {
    let world = World::new(Stage::Prefill, &[eng("a", 100), eng("b", 200), eng("c", 0)]);
    let indexer = Indexer::start(Arc::clone(&world.index)).await;
    let source = remote(&indexer.addr, PATIENT, 4);
    let policy = policy(&world, &source);

    let hit = pick(&world, &policy, &RequestTokens::new(prompt(4096))).await.expect("picked");
    assert_eq!((hit.worker.id().as_str(), hit.reason), ("b", PickReason::CacheHit));
    let cold = RequestTokens::new((0..4096).collect());
    let miss = pick(&world, &policy, &cold).await.expect("picked");
    assert_eq!(miss.reason, PickReason::CacheMiss);
    assert_eq!(
        source.stats(),
        SourceStats { lookups: 2, found: 1, empty: 1, ..SourceStats::default() }
    );
    assert_eq!(source.kind(), "remote");
    indexer.stop().await;
}

#[tokio::test]
async fn a_server_that_is_down_is_unavailable_and_counted_apart() {
    // Bound, so no other test can take the port, but not listening: connections are refused.
    let held = TcpSocket::new_v4().expect("socket");
    held.bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let addr = held.local_addr().expect("addr").to_string();
    let world = World::new(Stage::Prefill, &[eng("a", 100), eng("b", 0)]);
    let source = remote(&addr, PATIENT, 4);
    let pick = pick(&world, &policy(&world, &source), &RequestTokens::new(prompt(4096)))
        .await
        .expect("falls back");
    assert_eq!(pick.reason, PickReason::CacheUnavailable);
    assert_eq!(
        source.stats(),
        SourceStats { lookups: 1, unreachable: 1, ..SourceStats::default() }
    );
    assert_eq!(source.matched_tokens().count(), 0, "an unavailable lookup matched nothing");
    let outcomes = source.stats().outcomes();
    assert_eq!(outcomes.iter().map(|(_, n)| n).sum::<u64>(), source.stats().lookups);
    assert!(outcomes.contains(&("unreachable", 1)), "{outcomes:?}");
}

#[tokio::test(start_paused = true)]
async fn a_timeout_is_unavailable_and_remembered_across_bucket_attempts() {
    // Accepts connections into its backlog and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = silent.local_addr().expect("addr").to_string();
    let world = World::new(Stage::Prefill, &[eng("a", 100), eng("b", 0)]);
    let timeout = Duration::from_millis(100);
    let source = remote(&addr, timeout, 4);
    let policy = policy(&world, &source);
    let tokens = RequestTokens::new(prompt(4096));
    let started = tokio::time::Instant::now();
    for _ in 0..3 {
        let pick = pick(&world, &policy, &tokens).await.expect("falls back");
        assert_eq!(pick.reason, PickReason::CacheUnavailable);
    }
    // Paused time moves only while the runtime is idle: one timeout, not three.
    assert_eq!(started.elapsed(), timeout);
    assert_eq!(source.stats(), SourceStats { lookups: 1, timeouts: 1, ..SourceStats::default() });
}

#[tokio::test]
async fn over_the_inflight_limit_is_unavailable_at_once() {
    let silent = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = silent.local_addr().expect("addr").to_string();
    let world = World::new(Stage::Prefill, &[eng("a", 100), eng("b", 0)]);
    let source = remote(&addr, PATIENT, 1);
    let size = BlockSize::new(16).expect("non-zero");
    let held_tokens = prompt(64);
    let mut held = pin!(source.lookup(&world.model, &held_tokens, size));
    assert!(futures::poll!(held.as_mut()).is_pending(), "waits on the silent indexer");

    let pick = pick(&world, &policy(&world, &source), &RequestTokens::new(prompt(4096)))
        .await
        .expect("falls back");
    assert_eq!(pick.reason, PickReason::CacheUnavailable);
    let stats = source.stats();
    assert_eq!((stats.lookups, stats.busy, stats.unavailable()), (2, 1, 1));
}

#[tokio::test]
async fn a_refused_query_is_an_error_not_a_fallback() {
    let world = World::new(Stage::Prefill, &[eng("a", 100)]);
    let indexer = Indexer::start(Arc::clone(&world.index)).await;
    let source = remote(&indexer.addr, PATIENT, 4);
    let policy = policy(&world, &source);
    let tokens = RequestTokens::new(prompt(4096));
    let nameless = ModelId::new("");
    let mut request = world.request(4096, Some(&tokens));
    request.model = &nameless;
    let err = policy.pick(&world.workers, &request).await.expect_err("refused");
    assert!(matches!(&err, PickError::Lookup(_)), "{err}");
    let chain: Vec<String> =
        std::iter::successors(Some(&err as &dyn std::error::Error), |e| e.source())
            .map(ToString::to_string)
            .collect();
    assert!(chain.iter().any(|cause| cause.contains("model is empty")), "{chain:?}");
    assert!(!err.advances_bucket());
    assert_eq!(source.stats().refused, 1);
    assert!(tokens.memo().len() == 1, "the entry exists, its outcome is not remembered");
    indexer.stop().await;
}

#[tokio::test]
async fn configured_policies_share_one_client_per_indexer() {
    let world = World::new(Stage::Prefill, &[eng("a", 100), eng("b", 0)]);
    let indexer = Indexer::start(Arc::clone(&world.index)).await;
    let handles = PolicyHandles::new(world.load());
    let yaml = format!(
        "{{type: cache_aware, cache_prefix_provider: indexer, kv_indexer_endpoint: \"{}\", \
         kv_indexer_query_timeout_ms: 10000}}",
        indexer.addr
    );
    let config: PolicyConfig = serde_yaml_ng::from_str(&yaml).expect("valid");
    let (first, second) =
        (config.build(&handles).expect("built"), config.build(&handles).expect("built"));
    let crate::PolicySettings::CacheAware(settings) = &config.kind else { panic!("{config:?}") };
    let shared = handles.cache.remote(&settings.indexer_client()).expect("valid");

    let tokens = RequestTokens::new(prompt(4096));
    for policy in [&first, &second] {
        let pick = pick(&world, policy.as_ref(), &tokens).await.expect("picked");
        assert_eq!((pick.worker.id().as_str(), pick.reason), ("a", PickReason::CacheHit));
    }
    assert_eq!(shared.stats().lookups, 1, "one client, one memo entry, one lookup");
    indexer.stop().await;
}
