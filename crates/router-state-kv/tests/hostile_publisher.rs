//! Hostile KV-event peers on loopback: a raw TCP "publisher" written here (the ZMTP 3.0
//! greeting and READY handshake of RFC 23, then whatever bytes it likes) against the router's
//! real subscriptions, in connect and bind modes and as a replay ROUTER.
//!
//! Each peer announces or sends what used to kill or bloat the router: one frame header of
//! 2^60 bytes (the process aborted allocating it), a multipart message that never ends (every
//! frame flagged MORE: buffered without bound), one frame of 200 MiB (buffered whole before it
//! was skipped). Each time the router must refuse the message at a frame header, drop that
//! connection and count it ([`SkipReason::TooLarge`], [`SkipReason::TooManyFrames`]), keep
//! its subscription task alive (a well-behaved publisher's events still reach the index,
//! and the hostile worker's own, once it behaves), and keep the process's resident memory
//! within [`RSS_MARGIN_MB`] of what it was before: read from /proc/self/status, with a wide
//! margin; nothing here measures time.

use std::sync::Arc;

use bytes::Bytes;
use rmpv::Value;
use router_state_kv::SubscriptionConfig;
use router_state_kv::hash::Salt;
use router_state_kv::{KvIndex, KvStats, KvSubscriptions, RankSnapshot, SkipReason};
use router_test_support::{PATIENCE, eventually, on_change};
use router_workers::{KvEventsSpec, ModelId, Worker, WorkerId, WorkerRegistry, WorkerSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use zeromq::{PubSocket, Socket, SocketSend, ZmqMessage};

const BS: u32 = 4;
const TOPIC: &str = "kv";
/// How much the process may grow while a test runs. Without the limits, (b) and (c) grow it
/// by 256 MiB and 200 MiB, and (a) aborts it.
const RSS_MARGIN_MB: u64 = 200;
/// `kv.max_message_bytes` and `kv.max_frames_per_message` as configured by default.
const MAX_MESSAGE_BYTES: usize = 64 << 20;
const MAX_FRAMES: usize = 16;

/// One test at a time: each reads the resident memory of the whole process.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// ---- ZMTP 3.0, by hand -------------------------------------------------------------------

/// The 64-byte greeting: signature, version 3.0, mechanism NULL, not as server.
fn greeting() -> [u8; 64] {
    let mut greeting = [0u8; 64];
    greeting[0] = 0xff;
    greeting[9] = 0x7f;
    greeting[10] = 3;
    greeting[12..16].copy_from_slice(b"NULL");
    greeting
}

/// A frame header: flags (MORE, LONG, COMMAND) and the size.
fn header(more: bool, command: bool, size: u64) -> Vec<u8> {
    let mut flags = u8::from(more) | if command { 0b100 } else { 0 };
    match u8::try_from(size) {
        Ok(short) => vec![flags, short],
        Err(_) => {
            flags |= 0b10;
            let mut out = vec![flags];
            out.extend_from_slice(&size.to_be_bytes());
            out
        }
    }
}

fn frame(more: bool, body: &[u8]) -> Vec<u8> {
    let mut out = header(more, false, body.len() as u64);
    out.extend_from_slice(body);
    out
}

/// The READY command of a `socket_type` socket.
fn ready(socket_type: &str) -> Vec<u8> {
    let mut body = vec![5];
    body.extend_from_slice(b"READY");
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    body.extend_from_slice(socket_type.as_bytes());
    let mut out = header(false, true, body.len() as u64);
    out.extend_from_slice(&body);
    out
}

/// Greets and exchanges READY as a `socket_type` socket; the peer's READY is read and checked.
async fn handshake(stream: &mut TcpStream, socket_type: &str) -> std::io::Result<()> {
    stream.write_all(&greeting()).await?;
    let mut theirs = [0u8; 64];
    stream.read_exact(&mut theirs).await?;
    assert!(theirs[0] == 0xff && theirs[9] == 0x7f, "not a ZMTP greeting: {theirs:?}");
    stream.write_all(&ready(socket_type)).await?;
    let mut flags = [0u8; 1];
    stream.read_exact(&mut flags).await?;
    assert_ne!(flags[0] & 0b100, 0, "expected the peer's READY command");
    let size = if flags[0] & 0b10 != 0 {
        let mut size = [0u8; 8];
        stream.read_exact(&mut size).await?;
        u64::from_be_bytes(size)
    } else {
        let mut size = [0u8; 1];
        stream.read_exact(&mut size).await?;
        u64::from(size[0])
    };
    let mut body = vec![0u8; usize::try_from(size).expect("a small command")];
    stream.read_exact(&mut body).await?;
    assert_eq!(&body[..6], b"\x05READY", "expected READY");
    Ok(())
}

/// Reads (and drops) whatever the router sends until it closes the connection; panics when
/// it has not after [`PATIENCE`].
async fn closed_by_router(stream: &mut TcpStream) {
    let mut sink = vec![0u8; 4096];
    let closed = tokio::time::timeout(PATIENCE, async {
        while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
    assert!(closed.is_ok(), "the router kept the connection of a hostile peer open");
}

/// Writes `chunk` until the router drops the connection or `cap` bytes went out; returns
/// whether it dropped it.
async fn flood(stream: &mut TcpStream, chunk: &[u8], cap: usize) -> bool {
    let mut sent = 0;
    while sent < cap {
        if stream.write_all(chunk).await.is_err() {
            return true;
        }
        sent += chunk.len();
    }
    false
}

// ---- well-formed KV events ---------------------------------------------------------------

/// A msgpack batch storing one block of `tokens`, hashed `hash`.
fn payload(hash: u64, tokens: std::ops::Range<u32>) -> Vec<u8> {
    let event = Value::Map(vec![
        ("type".into(), "BlockStored".into()),
        ("block_hashes".into(), Value::Array(vec![hash.into()])),
        ("parent_block_hash".into(), Value::Nil),
        ("token_ids".into(), Value::Array(tokens.map(Value::from).collect())),
        ("block_size".into(), BS.into()),
    ]);
    let batch = Value::Array(vec![1.0.into(), Value::Array(vec![event]), 0.into()]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &batch).expect("encode");
    out
}

/// A live message `[topic, seq, payload]` on the wire.
fn live(seq: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = frame(true, TOPIC.as_bytes());
    out.extend(frame(true, &seq.to_be_bytes()));
    out.extend(frame(false, payload));
    out
}

/// Serves every connection to `listener` from now on as a PUB that publishes one valid batch
/// (storing `tokens`) and then stays connected.
fn behave(listener: TcpListener, hash: u64, tokens: std::ops::Range<u32>) -> JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let tokens = tokens.clone();
            tokio::spawn(async move {
                if handshake(&mut stream, "PUB").await.is_ok()
                    && stream.write_all(&live(0, &payload(hash, tokens))).await.is_ok()
                {
                    closed_by_router(&mut stream).await;
                }
            });
        }
    })
}

/// A well-behaved publisher on another implementation (the zeromq crate's PUB).
struct GoodPublisher {
    socket: PubSocket,
    seq: u64,
}

impl GoodPublisher {
    async fn bound() -> (Self, String) {
        let mut socket = PubSocket::new();
        let endpoint = socket.bind("tcp://127.0.0.1:0").await.expect("bind").to_string();
        (Self { socket, seq: 0 }, endpoint)
    }

    async fn connected(endpoint: &str) -> Self {
        let mut socket = PubSocket::new();
        eventually("the good publisher connects", async || socket.connect(endpoint).await.is_ok())
            .await;
        Self { socket, seq: 0 }
    }

    /// Publishes the batch storing `tokens` until `index` holds it (a PUB drops what it
    /// sends before the SUB's subscription arrives).
    async fn publish_until_held(
        &mut self,
        index: &KvIndex,
        worker: &str,
        tokens: std::ops::Range<u32>,
    ) {
        let body = payload(7, tokens.clone());
        eventually(&format!("{worker}'s valid batch applied"), async || {
            let frames = vec![
                Bytes::from_static(TOPIC.as_bytes()),
                Bytes::copy_from_slice(&self.seq.to_be_bytes()),
                Bytes::copy_from_slice(&body),
            ];
            self.seq += 1;
            let message = ZmqMessage::try_from(frames).expect("three frames");
            let _ = self.socket.send(message).await;
            held(index, worker, tokens.clone()) == 1
        })
        .await;
    }
}

// ---- the router side -----------------------------------------------------------------------

fn model() -> ModelId {
    ModelId::new("llama")
}

fn worker(id: &str, endpoint: &str, replay: Option<&str>, bind: bool) -> Worker {
    let spec = WorkerSpec {
        model: Some("llama".into()),
        kv_events: Some(KvEventsSpec {
            replay_endpoint: replay.map(str::to_owned),
            topic: TOPIC.into(),
            block_size: Some(BS),
            bind,
            ..KvEventsSpec::new(endpoint)
        }),
        ..WorkerSpec::new(id, "http://127.0.0.1:1", router_workers::Stage::Plain)
    };
    Worker::from_spec(&spec, vec![model()]).expect("valid worker")
}

fn held(index: &KvIndex, id: &str, tokens: std::ops::Range<u32>) -> u32 {
    let tokens: Vec<u32> = tokens.collect();
    let id = WorkerId::new(id).expect("id");
    index.lookup_tokens(&model(), &tokens, BS, Salt::default()).blocks(&id)
}

/// The router's KV-event subscriptions, running in this process.
struct Router {
    index: Arc<KvIndex>,
    stats: KvStats,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl Router {
    fn start(workers: Vec<Worker>) -> Self {
        let registry = Arc::new(WorkerRegistry::new());
        for worker in workers {
            registry.add(worker).expect("add worker");
        }
        let index = Arc::new(KvIndex::default());
        let config = SubscriptionConfig::with_message_limits(MAX_MESSAGE_BYTES, MAX_FRAMES);
        let subscriptions = KvSubscriptions::new(Arc::clone(&index), registry, config);
        let stats = subscriptions.stats();
        let cancel = CancellationToken::new();
        let task = tokio::spawn(subscriptions.run(cancel.clone()));
        Self { index, stats, cancel, task }
    }

    /// The counters of `id`'s only rank, once it is subscribed to.
    fn rank(&self, id: &str) -> Option<RankSnapshot> {
        self.stats.worker(&WorkerId::new(id).expect("id")).first().cloned()
    }

    /// Waits until `id` counted at least `n` messages refused for `reason`.
    async fn refused(&self, id: &str, reason: SkipReason, n: u64) {
        let mut changes = self.stats.changes();
        let counted = on_change(&mut changes, || {
            self.rank(id).filter(|rank| rank.skipped.get(reason) >= n).map(drop)
        })
        .await;
        assert!(counted.is_some(), "{id}: {reason} not counted {n} times: {:#?}", self.rank(id));
    }

    async fn stop(self) {
        assert!(!self.task.is_finished(), "the subscriptions stopped on their own");
        self.cancel.cancel();
        tokio::time::timeout(PATIENCE, self.task).await.expect("run stops").expect("no panic");
    }
}

/// Resident memory of this process, MB.
fn rss_mb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    let kb: u64 = line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("kB");
    kb / 1024
}

fn assert_rss_within(base: u64, what: &str) {
    let now = rss_mb();
    assert!(
        now <= base + RSS_MARGIN_MB,
        "{what}: resident memory grew from {base} MB to {now} MB (margin {RSS_MARGIN_MB} MB)"
    );
}

async fn listener() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let endpoint = format!("tcp://{}", listener.local_addr().expect("addr"));
    (listener, endpoint)
}

/// Accepts the router's next connection and greets it as a PUB.
async fn accept_pub(listener: &TcpListener) -> TcpStream {
    let (mut stream, _) = tokio::time::timeout(PATIENCE, listener.accept())
        .await
        .expect("the router connects")
        .expect("accept");
    handshake(&mut stream, "PUB").await.expect("handshake");
    stream
}

// ---- the tests -----------------------------------------------------------------------------

/// The worker `hostile`'s peer, behind `listener`, turns into a good publisher: the same
/// subscription reconnects and applies its first valid batch. Serves until aborted.
async fn behaves_again(router: &Router, listener: TcpListener) -> JoinHandle<()> {
    let serving = behave(listener, 1, 0..4);
    eventually("the hostile worker's valid batch applied", async || {
        held(&router.index, "hostile", 0..4) == 1
    })
    .await;
    serving
}

/// (a) One frame header announcing 2^60 bytes: refused at the header, the connection dropped
/// and re-established; the process lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_header_of_two_to_the_sixtieth_bytes_drops_the_connection_not_the_process() {
    let _serial = SERIAL.lock().await;
    let (hostile, hostile_endpoint) = listener().await;
    let (mut good, good_endpoint) = GoodPublisher::bound().await;
    let router = Router::start(vec![
        worker("hostile", &hostile_endpoint, None, false),
        worker("good", &good_endpoint, None, false),
    ]);
    let base = rss_mb();

    let mut stream = accept_pub(&hostile).await;
    stream.write_all(&header(false, false, 1 << 60)).await.expect("header");
    let _ = stream.write_all(&[0u8; 4096]).await;
    closed_by_router(&mut stream).await;
    router.refused("hostile", SkipReason::TooLarge, 1).await;

    // The same subscription reconnects, and takes a valid batch once the peer behaves.
    let serving = behaves_again(&router, hostile).await;
    let rank = router.rank("hostile").expect("subscribed");
    assert!(rank.connects >= 2, "{rank:#?}");
    good.publish_until_held(&router.index, "good", 100..104).await;
    assert_rss_within(base, "after a 2^60-byte frame header");

    serving.abort();
    router.stop().await;
}

/// (b) A multipart message that never ends: refused at the frame past `max_frames_per_message`
/// (small frames) or past `max_message_bytes` (large ones), while it accumulates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multipart_message_that_never_ends_is_refused_while_it_accumulates() {
    let _serial = SERIAL.lock().await;
    let (hostile, hostile_endpoint) = listener().await;
    let (mut good, good_endpoint) = GoodPublisher::bound().await;
    let router = Router::start(vec![
        worker("hostile", &hostile_endpoint, None, false),
        worker("good", &good_endpoint, None, false),
    ]);
    let base = rss_mb();

    // 1 KiB frames, every one flagged MORE, up to 256 MiB: refused at the 17th frame.
    let mut stream = accept_pub(&hostile).await;
    let small: Vec<u8> = frame(true, &[0x5a; 1024]).repeat(256);
    assert!(flood(&mut stream, &small, 256 << 20).await, "256 MiB of MORE frames taken in");
    router.refused("hostile", SkipReason::TooManyFrames, 1).await;
    assert_rss_within(base, "after 1 KiB frames flagged MORE");

    // 5 MiB frames, every one flagged MORE: refused at the 13th (past 64 MiB).
    let mut stream = accept_pub(&hostile).await;
    let large = frame(true, &vec![0xa5; 5 << 20]);
    assert!(flood(&mut stream, &large, 512 << 20).await, "512 MiB of MORE frames taken in");
    router.refused("hostile", SkipReason::TooLarge, 1).await;
    assert_rss_within(base, "after 5 MiB frames flagged MORE");

    let serving = behaves_again(&router, hostile).await;
    good.publish_until_held(&router.index, "good", 100..104).await;
    assert_rss_within(base, "at the end");

    serving.abort();
    router.stop().await;
}

/// (c) One frame of 200 MiB, announced and then sent: refused at its header, not buffered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_frame_is_refused_at_its_header_not_buffered() {
    let _serial = SERIAL.lock().await;
    let (hostile, hostile_endpoint) = listener().await;
    let (mut good, good_endpoint) = GoodPublisher::bound().await;
    let router = Router::start(vec![
        worker("hostile", &hostile_endpoint, None, false),
        worker("good", &good_endpoint, None, false),
    ]);
    let base = rss_mb();

    let mut stream = accept_pub(&hostile).await;
    let declared: usize = 200 << 20;
    stream.write_all(&header(false, false, declared as u64)).await.expect("header");
    let body = vec![0x33; 1 << 20];
    assert!(flood(&mut stream, &body, declared).await, "the whole 200 MiB frame taken in");
    router.refused("hostile", SkipReason::TooLarge, 1).await;
    assert_rss_within(base, "after a 200 MiB frame");

    let serving = behaves_again(&router, hostile).await;
    good.publish_until_held(&router.index, "good", 100..104).await;

    serving.abort();
    router.stop().await;
}

/// Bind mode: any TCP peer may connect to the router's SUB socket. A hostile one is refused
/// and dropped; the engine's publisher on the same socket goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_peer_of_a_bound_sub_socket_is_dropped_and_the_engine_goes_on() {
    let _serial = SERIAL.lock().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let endpoint = format!("tcp://127.0.0.1:{port}");
    let router = Router::start(vec![worker("bound", &endpoint, None, true)]);
    let base = rss_mb();

    let connect = async || {
        let mut stream = None;
        eventually("the router's SUB socket is bound", async || {
            stream = TcpStream::connect(("127.0.0.1", port)).await.ok();
            stream.is_some()
        })
        .await;
        let mut stream = stream.expect("connected");
        handshake(&mut stream, "PUB").await.expect("handshake");
        stream
    };
    let mut stream = connect().await;
    stream.write_all(&header(false, false, 1 << 60)).await.expect("header");
    closed_by_router(&mut stream).await;
    router.refused("bound", SkipReason::TooLarge, 1).await;

    let mut stream = connect().await;
    let small: Vec<u8> = frame(true, &[0x5a; 1024]).repeat(256);
    assert!(flood(&mut stream, &small, 256 << 20).await, "256 MiB of MORE frames taken in");
    router.refused("bound", SkipReason::TooManyFrames, 1).await;

    let mut good = GoodPublisher::connected(&endpoint).await;
    good.publish_until_held(&router.index, "bound", 100..104).await;
    assert_rss_within(base, "bind mode");

    router.stop().await;
}

/// A replay ROUTER that answers with a 2^60-byte frame: the replay fails, counted, and the
/// live batches are applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_reply_of_two_to_the_sixtieth_bytes_fails_the_replay_not_the_process() {
    let _serial = SERIAL.lock().await;
    let (replay, replay_endpoint) = listener().await;
    let (mut good, good_endpoint) = GoodPublisher::bound().await;
    let router =
        Router::start(vec![worker("replayed", &good_endpoint, Some(&replay_endpoint), false)]);
    let base = rss_mb();

    let answering = tokio::spawn(async move {
        while let Ok((mut stream, _)) = replay.accept().await {
            tokio::spawn(async move {
                if handshake(&mut stream, "ROUTER").await.is_ok()
                    && stream.write_all(&header(true, false, 1 << 60)).await.is_ok()
                {
                    closed_by_router(&mut stream).await;
                }
            });
        }
    });
    router.refused("replayed", SkipReason::TooLarge, 1).await;
    good.publish_until_held(&router.index, "replayed", 100..104).await;
    let rank = router.rank("replayed").expect("subscribed");
    assert!(rank.replay_failures >= 1, "{rank:#?}");
    assert_rss_within(base, "after a replay reply of 2^60 bytes");

    answering.abort();
    router.stop().await;
}

#[test]
fn the_raw_peer_speaks_zmtp_as_the_zeromq_crate_does() {
    assert_eq!(header(true, false, 3), [1, 3]);
    assert_eq!(header(false, false, 256), [2, 0, 0, 0, 0, 0, 0, 1, 0]);
    assert_eq!(&ready("PUB")[..2], &[4, 25]);
}
