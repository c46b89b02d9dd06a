//! The remote indexer over real gRPC on loopback: a `KvIndexService` serving a real index, and
//! the client's hit, miss, timeout, in-flight limit, server down, failover and refusal paths.

use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use router_state_kv::hash::{Salt, block_hashes};
use router_state_kv::remote::{
    ClientConfig, KvIndexService, RemoteError, RemoteIndexClient, serve_with,
};
use router_state_kv::wire::{BlockStored, Event};
use router_state_kv::{KvIndex, Medium, PrefixMatch};
use router_workers::{ModelId, WorkerId};
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const BS: u32 = 4;

fn model() -> ModelId {
    ModelId::new("m")
}

fn wid(id: &str) -> WorkerId {
    WorkerId::new(id).expect("non-empty id")
}

/// An index where "a" holds the 3 blocks of `prompt()` and "b" its first block.
fn index() -> Arc<KvIndex> {
    let index = Arc::new(KvIndex::default());
    let prompt = prompt();
    for (worker, blocks) in [("a", 3usize), ("b", 1)] {
        let holder = index.holder(&model(), &wid(worker), 1, 0, BS).expect("register");
        let hashes = (0..blocks as u64).map(|h| h + 100).collect();
        let report = holder.apply(&[Event::Stored(BlockStored {
            block_hashes: hashes,
            token_ids: prompt[..blocks * BS as usize].to_vec(),
            block_size: Some(i64::from(BS)),
            ..BlockStored::default()
        })]);
        assert_eq!(report.stored, blocks as u64);
    }
    index
}

fn prompt() -> Vec<u32> {
    (1..=14).collect()
}

struct Indexer {
    addr: SocketAddr,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl Indexer {
    async fn start(index: Arc<KvIndex>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let cancel = CancellationToken::new();
        let service = KvIndexService::new(index);
        let task = tokio::spawn({
            let cancel = cancel.clone();
            async move { serve_with(listener, service, cancel).await.expect("serves") }
        });
        Self { addr, cancel, task }
    }

    async fn stop(self) {
        self.cancel.cancel();
        self.task.await.expect("server task ends cleanly");
    }

    /// Stops the server and keeps its port bound without listening, so that it refuses
    /// connections instead of being reused by another test's server.
    async fn stop_and_hold(self) -> TcpSocket {
        let addr = self.addr;
        self.stop().await;
        let socket = TcpSocket::new_v4().expect("socket");
        socket.set_reuseaddr(true).expect("reuseaddr");
        socket.bind(addr).expect("the stopped server's port is still free");
        socket
    }
}

fn client(endpoints: &[String], timeout: Duration, max_inflight: usize) -> RemoteIndexClient {
    let config =
        ClientConfig { endpoints: endpoints.to_vec(), query_timeout: timeout, max_inflight };
    RemoteIndexClient::new(config).expect("valid config")
}

/// A port that refuses connections: bound (so no other test can take it) but not listening.
fn refusing() -> (TcpSocket, String) {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let addr = socket.local_addr().expect("addr").to_string();
    (socket, addr)
}

const PATIENT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_hit_and_a_miss_read_exactly_as_the_local_index() {
    let index = index();
    let indexer = Indexer::start(Arc::clone(&index)).await;
    let remote = client(&[indexer.addr.to_string()], PATIENT, 4);

    let hashes = block_hashes(&prompt(), BS, None);
    let found = remote.lookup(&model(), &hashes).await.expect("answered");
    assert_eq!(found, index.lookup(&model(), &hashes));
    assert_eq!(found.query_blocks, 3);
    assert_eq!(
        found.matches,
        vec![
            PrefixMatch { worker: wid("a"), rank: 0, blocks: 3, tier: Medium::Gpu },
            PrefixMatch { worker: wid("b"), rank: 0, blocks: 1, tier: Medium::Gpu },
        ]
    );
    let by_tokens =
        remote.lookup_tokens(&model(), &prompt(), BS, Salt::default()).await.expect("answered");
    assert_eq!(by_tokens, found);

    // A prompt nobody holds, and a model nobody serves: answered, and empty (confirmed misses).
    let cold: Vec<u32> = (500..520).collect();
    let miss = remote.lookup(&model(), &block_hashes(&cold, BS, None)).await.expect("answered");
    assert!(miss.is_empty());
    assert_eq!(miss.query_blocks, 5);
    let other = remote.lookup(&ModelId::new("other"), &hashes).await.expect("answered");
    assert!(other.is_empty());
    assert_eq!(remote.inflight(), 0);
    indexer.stop().await;
}

#[tokio::test]
async fn a_server_that_is_down_is_unavailable_not_a_miss() {
    let (_held, down) = refusing();
    let remote = client(std::slice::from_ref(&down), PATIENT, 4);
    let err = remote.lookup(&model(), &[1, 2]).await.expect_err("nothing listens");
    assert!(
        matches!(&err, RemoteError::Unavailable { endpoint, .. } if *endpoint == down),
        "{err}"
    );
    assert!(err.is_unavailable());
    assert_eq!(remote.inflight(), 0, "the permit is released");
}

#[tokio::test]
async fn a_stopped_server_turns_unavailable() {
    let indexer = Indexer::start(index()).await;
    let remote = client(&[indexer.addr.to_string()], PATIENT, 4);
    let hashes = block_hashes(&prompt(), BS, None);
    assert!(remote.lookup(&model(), &hashes).await.is_ok());
    let _held = indexer.stop_and_hold().await;
    let err = remote.lookup(&model(), &hashes).await.expect_err("server gone");
    assert!(err.is_unavailable(), "{err}");
}

#[tokio::test]
async fn failover_reaches_a_live_replica_and_reports_the_last_failure() {
    let indexer = Indexer::start(index()).await;
    let (_held, down) = refusing();
    let remote = client(&[down, indexer.addr.to_string()], PATIENT, 4);
    let hashes = block_hashes(&prompt(), BS, None);
    for _ in 0..3 {
        let found = remote.lookup(&model(), &hashes).await.expect("the replica answers");
        assert_eq!(found.blocks(&wid("a")), 3);
    }
    let _held_too = indexer.stop_and_hold().await;
    let err = remote.lookup(&model(), &hashes).await.expect_err("both down");
    assert!(matches!(err, RemoteError::Unavailable { .. }), "{err}");
}

#[tokio::test]
async fn an_invalid_query_is_an_error_not_an_unavailable_backend() {
    let indexer = Indexer::start(index()).await;
    let remote = client(&[indexer.addr.to_string()], PATIENT, 4);
    let err = remote
        .lookup_tokens(&model(), &prompt(), 0, Salt::default())
        .await
        .expect_err("block size 0");
    assert!(matches!(err, RemoteError::InvalidQuery { .. }), "{err}");
    assert!(!err.is_unavailable());
    indexer.stop().await;
}

/// A listener that accepts connections into its backlog and never answers.
async fn black_hole() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    (listener, addr)
}

#[tokio::test(start_paused = true)]
async fn no_answer_within_the_query_timeout_is_a_timeout() {
    let (_listener, silent) = black_hole().await;
    let timeout = Duration::from_millis(100);
    let remote = client(&[silent], timeout, 4);
    let started = tokio::time::Instant::now();
    let err = remote.lookup(&model(), &[1, 2, 3]).await.expect_err("never answered");
    assert!(matches!(err, RemoteError::Timeout { after } if after == timeout), "{err}");
    assert!(err.is_unavailable());
    // Paused time only moves when the runtime is idle: exactly to the deadline.
    assert_eq!(started.elapsed(), timeout);
    assert_eq!(remote.inflight(), 0);
}

#[tokio::test]
async fn lookups_beyond_the_inflight_limit_fail_at_once_and_permits_return() {
    let (_listener, silent) = black_hole().await;
    let indexer = Indexer::start(index()).await;
    // The silent endpoint first: held lookups wait there (failover only follows a failure).
    let remote = client(&[silent, indexer.addr.to_string()], PATIENT, 2);
    let hashes = block_hashes(&prompt(), BS, None);
    let m = model();
    {
        let mut first = pin!(remote.lookup(&m, &hashes));
        let mut second = pin!(remote.lookup(&m, &hashes));
        assert!(futures::poll!(first.as_mut()).is_pending());
        assert!(futures::poll!(second.as_mut()).is_pending());
        assert_eq!(remote.inflight(), 2);
        let err = remote.lookup(&model(), &hashes).await.expect_err("over the limit");
        assert!(matches!(err, RemoteError::Busy { limit: 2 }), "{err}");
        assert!(err.is_unavailable());
    }
    // Dropping the held lookups gives their permits back.
    assert_eq!(remote.inflight(), 0);
    let live = client(&[indexer.addr.to_string()], PATIENT, 1);
    assert!(live.lookup(&model(), &hashes).await.is_ok());
    assert!(live.lookup(&model(), &hashes).await.is_ok(), "one at a time fits a limit of 1");
    indexer.stop().await;
}
