//! Interoperability with libzmq: a Python publisher (pyzmq + msgpack) frames KV events exactly
//! as engines do, including a replay ROUTER, and the router's subscriptions build the index.
//!
//! Needs `python3` with `pyzmq` and `msgpack` (`pip install pyzmq msgpack`); without them the
//! test fails, it never skips.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use router_state_kv::hash::Salt;
use router_state_kv::{KvIndex, KvStats, KvSubscriptions, SkipReason, SubscriptionConfig};
use router_test_support::on_change;
use router_workers::{KvEventsSpec, ModelId, Worker, WorkerId, WorkerRegistry, WorkerSpec};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

const BS: u32 = 4;

fn require_python() {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import zmq, msgpack"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "the KV-event interop test needs python3 with pyzmq and msgpack: \
         run `pip install pyzmq msgpack` (CI's .ci/run installs them)"
    );
}

struct Publisher {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    pub_port: u16,
    replay_port: u16,
}

impl Publisher {
    async fn start(args: &[&str]) -> Self {
        require_python();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/zmq_publisher.py");
        let mut child = Command::new("python3")
            .arg(script)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 starts");
        let stdin = child.stdin.take().expect("piped stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let ready = stdout.next_line().await.expect("read").expect("READY line");
        let parts: Vec<&str> = ready.split_whitespace().collect();
        assert_eq!(parts.first(), Some(&"READY"), "{ready}");
        let pub_port = parts[1].parse().expect("port");
        let replay_port = parts[2].parse().expect("port");
        Self { child, stdin, stdout, pub_port, replay_port }
    }

    async fn cmd(&mut self, line: &str) -> String {
        self.stdin.write_all(format!("{line}\n").as_bytes()).await.expect("write");
        self.stdin.flush().await.expect("flush");
        let reply = self.stdout.next_line().await.expect("read").expect("reply");
        assert!(reply.starts_with("OK"), "{line} -> {reply}");
        reply
    }

    async fn batch(&mut self, rank: u32, spec: Value) -> u64 {
        let reply = self.cmd(&format!("batch {rank} {spec}")).await;
        reply[3..].parse().expect("seq")
    }

    async fn quit(mut self) {
        let _ = self.stdin.write_all(b"quit\n").await;
        let _ = timeout(Duration::from_secs(5), self.child.wait()).await;
    }
}

fn stored(hashes: &[u64], parent: Option<u64>, tokens: std::ops::Range<u32>) -> Value {
    json!({
        "type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
        "token_ids": tokens.collect::<Vec<u32>>(), "block_size": BS, "lora_id": null,
        "medium": "GPU", "lora_name": null,
    })
}

fn model() -> ModelId {
    ModelId::new("llama")
}

fn worker(id: &str, endpoint: String, replay: Option<String>, dp_size: u32, bind: bool) -> Worker {
    let spec = WorkerSpec {
        model: Some("llama".into()),
        dp_size,
        kv_events: Some(KvEventsSpec {
            replay_endpoint: replay,
            topic: "kv@w".into(),
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

fn rank_of(index: &KvIndex, id: &str, tokens: std::ops::Range<u32>) -> Option<u32> {
    let tokens: Vec<u32> = tokens.collect();
    let id = WorkerId::new(id).expect("id");
    index.lookup_tokens(&model(), &tokens, BS, Salt::default()).get(&id).map(|m| m.rank)
}

/// Waits until `cond` holds. While nothing changes, publishes empty heartbeat batches on
/// `ranks`: a batch lost to the slow-joiner window then shows up as a gap and is replayed,
/// exactly as in production. Correctness never depends on the timing, only liveness.
async fn settle(
    p: &mut Publisher,
    stats: &KvStats,
    ranks: &[u32],
    what: &str,
    cond: impl Fn() -> bool,
) {
    let mut changes = stats.changes();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}: {:#?}", stats.ranks());
        if timeout(Duration::from_millis(300), changes.changed()).await.is_err() {
            for rank in ranks {
                p.batch(*rank, json!({"events": []})).await;
            }
        }
    }
}

async fn wait_subscribed(stats: &KvStats, id: &str, ranks: usize) {
    let id = WorkerId::new(id).expect("id");
    let mut changes = stats.changes();
    let subscribed = on_change(&mut changes, || {
        let snapshot = stats.worker(&id);
        (snapshot.len() == ranks && snapshot.iter().all(|r| r.subscribed)).then_some(())
    });
    assert!(subscribed.await.is_some(), "{id} not subscribed: {:#?}", stats.worker(&id));
}

fn config() -> SubscriptionConfig {
    SubscriptionConfig { replay_timeout: Duration::from_secs(5), ..SubscriptionConfig::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libzmq_publisher_with_replay_builds_the_index() {
    let mut p = Publisher::start(&["--topic", "kv@w1"]).await;
    let registry = Arc::new(WorkerRegistry::new());
    let index = Arc::new(KvIndex::default());
    registry
        .add(worker(
            "w1",
            format!("tcp://127.0.0.1:{}", p.pub_port),
            Some(format!("tcp://127.0.0.1:{}", p.replay_port)),
            1,
            false,
        ))
        .expect("add worker");
    let subscriptions = KvSubscriptions::new(Arc::clone(&index), Arc::clone(&registry), config());
    let stats = subscriptions.stats();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(subscriptions.run(cancel.clone()));
    wait_subscribed(&stats, "w1", 1).await;
    let w1 = WorkerId::new("w1").expect("id");
    let rank0 = |stats: &KvStats| stats.worker(&w1)[0].clone();

    // Map form with u64 hashes, then a child in old vLLM array form with i64 hashes.
    p.batch(0, json!({"events": [stored(&[1001, 1002, 1003, 1004], None, 0..16)]})).await;
    let mut child = stored(&[0xF000_0000_0000_0005, 1006], Some(1004), 100..108);
    child["hash_kind"] = json!("i64");
    p.batch(0, json!({"form": "array", "events": [child]})).await;
    settle(&mut p, &stats, &[0], "chain A and its child", || {
        held_tokens(&index, &[(0..16), (100..108)]) == 6
    })
    .await;

    // A lost batch (bytes hashes, token pairs) is recovered through 4-frame replay.
    let mut lost = stored(&[2001, 2002], None, 200..208);
    lost["hash_kind"] = json!("bytes");
    lost["pairs"] = json!(true);
    p.batch(0, json!({"publish": false, "events": [lost]})).await;
    p.batch(0, json!({"events": [stored(&[3001], None, 300..304)]})).await;
    settle(&mut p, &stats, &[0], "replayed batch", || {
        held(&index, "w1", 200..208) == 2 && held(&index, "w1", 300..304) == 1
    })
    .await;
    assert!(rank0(&stats).gaps >= 1 && rank0(&stats).replays >= 1);
    assert!(rank0(&stats).replayed_batches >= 1);

    // Old 3-frame replay replies, recovering a lost removal.
    p.cmd("frames 3").await;
    p.batch(0, json!({"publish": false, "events": [{"type": "BlockRemoved", "block_hashes": [1004], "medium": "GPU"}]})).await;
    p.batch(0, json!({"form": "array", "events": [stored(&[4001], None, 400..404)]})).await;
    settle(&mut p, &stats, &[0], "3-frame replay", || {
        held(&index, "w1", 400..404) == 1 && held_tokens(&index, &[(0..16), (100..108)]) == 3
    })
    .await;

    // A batch on another topic is filtered by the SUB, and skipped when replay brings it.
    p.cmd("frames 4").await;
    p.batch(0, json!({"topic": "other", "events": [stored(&[5001], None, 500..504)]})).await;
    p.batch(0, json!({"events": [stored(&[6001], None, 600..604)]})).await;
    settle(&mut p, &stats, &[0], "topic filter", || held(&index, "w1", 600..604) == 1).await;
    assert_eq!(held(&index, "w1", 500..504), 0);
    assert!(rank0(&stats).skipped.get(SkipReason::TopicMismatch) >= 1);

    // Bad framing and a malformed payload are counted and skipped; the stream goes on.
    p.cmd("garbage 0").await;
    p.batch(0, json!({"events": [stored(&[7001], None, 700..704)]})).await;
    settle(&mut p, &stats, &[0], "garbage skipped", || {
        let r = rank0(&stats);
        held(&index, "w1", 700..704) == 1
            && r.skipped.get(SkipReason::FrameCount) >= 1
            && r.skipped.get(SkipReason::SeqLength) >= 1
            && r.skipped.get(SkipReason::Malformed) >= 1
    })
    .await;

    // The engine restarts: its sequence starts over; the old picture is cleared.
    let before = rank0(&stats);
    p.cmd("restart").await;
    p.batch(0, json!({"events": [stored(&[8001], None, 800..804)]})).await;
    settle(&mut p, &stats, &[0], "restart handled", || {
        held(&index, "w1", 800..804) == 1 && held(&index, "w1", 0..16) == 0
    })
    .await;
    let after = rank0(&stats);
    assert!(after.restarts > before.restarts, "{after:#?}");
    assert!(after.connects > before.connects, "reconnected after the publisher restart");
    assert_eq!(held(&index, "w1", 300..304), 0);

    // Removing the worker unsubscribes it and purges its blocks.
    registry.remove(&w1).expect("remove");
    let mut changes = stats.changes();
    while !stats.worker(&w1).is_empty() {
        timeout(Duration::from_secs(10), changes.changed())
            .await
            .expect("unsubscribed")
            .expect("alive");
    }
    assert_eq!(held(&index, "w1", 800..804), 0);
    assert_eq!(index.stats().nodes, 0);

    cancel.cancel();
    timeout(Duration::from_secs(10), task).await.expect("run stops").expect("no panic");
    p.quit().await;
}

/// Leading blocks of w1 for the concatenation of token ranges.
fn held_tokens(index: &KvIndex, ranges: &[std::ops::Range<u32>]) -> u32 {
    let tokens: Vec<u32> = ranges.iter().cloned().flatten().collect();
    let id = WorkerId::new("w1").expect("id");
    index.lookup_tokens(&model(), &tokens, BS, Salt::default()).blocks(&id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bound_sub_sockets_per_rank_and_worker_replacement() {
    require_python();
    // Two consecutive free ports for the router's SUB sockets (rank 0 and 1).
    let base = loop {
        let first = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = first.local_addr().expect("addr").port();
        if port < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            break port;
        }
    };
    let registry = Arc::new(WorkerRegistry::new());
    let index = Arc::new(KvIndex::default());
    let subscriptions = KvSubscriptions::new(Arc::clone(&index), Arc::clone(&registry), config());
    let stats = subscriptions.stats();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(subscriptions.run(cancel.clone()));

    let router_sub = format!("tcp://127.0.0.1:{base}");
    let mut p =
        Publisher::start(&["--ranks", "2", "--topic", "kv@w2", "--connect", &router_sub]).await;
    let replay = format!("tcp://127.0.0.1:{}", p.replay_port);
    registry
        .add(worker("w2", router_sub.clone(), Some(replay.clone()), 2, true))
        .expect("add worker after run started");
    wait_subscribed(&stats, "w2", 2).await;

    p.batch(0, json!({"events": [stored(&[1, 2], None, 0..8)]})).await;
    p.batch(1, json!({"events": [stored(&[1], None, 50..54)]})).await;
    settle(&mut p, &stats, &[0, 1], "both ranks", || {
        rank_of(&index, "w2", 0..8) == Some(0) && rank_of(&index, "w2", 50..54) == Some(1)
    })
    .await;
    assert_eq!(held(&index, "w2", 0..8), 2);

    // Replacing the worker drops the old incarnation's state; the new subscription rebuilds
    // it from the engine's replay ring.
    let old = registry.get(&WorkerId::new("w2").expect("id")).expect("present").incarnation();
    let new = registry.replace(worker("w2", router_sub, Some(replay), 2, true)).expect("replace");
    assert_ne!(old, new.incarnation());
    wait_subscribed(&stats, "w2", 2).await;
    settle(&mut p, &stats, &[0, 1], "state rebuilt for the new incarnation", || {
        stats
            .worker(&WorkerId::new("w2").expect("id"))
            .iter()
            .all(|r| r.incarnation == new.incarnation())
            && held(&index, "w2", 0..8) == 2
            && held(&index, "w2", 50..54) == 1
    })
    .await;

    cancel.cancel();
    timeout(Duration::from_secs(10), task).await.expect("run stops").expect("no panic");
    p.quit().await;
}

/// A router started after its engine: the blocks the engine announced to nobody are learned
/// from its replay buffer as soon as the router subscribes, before anything new is published;
/// and what the engine publishes next is applied after them, not taken for lost history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_started_after_its_engine_learns_what_the_engine_holds_at_once() {
    let mut p = Publisher::start(&["--topic", "kv@w1"]).await;
    p.batch(0, json!({"events": [stored(&[1001, 1002], None, 0..8)]})).await;
    p.batch(0, json!({"events": [stored(&[1003], Some(1002), 8..12)]})).await;

    let registry = Arc::new(WorkerRegistry::new());
    let index = Arc::new(KvIndex::default());
    let replay = format!("tcp://127.0.0.1:{}", p.replay_port);
    let endpoint = format!("tcp://127.0.0.1:{}", p.pub_port);
    registry.add(worker("w1", endpoint, Some(replay), 1, false)).expect("add worker");
    let subscriptions = KvSubscriptions::new(Arc::clone(&index), Arc::clone(&registry), config());
    let stats = subscriptions.stats();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(subscriptions.run(cancel.clone()));

    // No heartbeat: nothing live arrives that could reveal a gap.
    let mut changes = stats.changes();
    let deadline = Instant::now() + Duration::from_secs(30);
    while held(&index, "w1", 0..12) < 3 {
        assert!(Instant::now() < deadline, "history not replayed: {:#?}", stats.ranks());
        let _ = timeout(Duration::from_millis(200), changes.changed()).await;
    }
    let w1 = WorkerId::new("w1").expect("id");
    wait_subscribed(&stats, "w1", 1).await;
    p.batch(0, json!({"events": [stored(&[1004], Some(1003), 12..16)]})).await;
    settle(&mut p, &stats, &[0], "the next live batch", || held(&index, "w1", 0..16) == 4).await;
    let rank = &stats.worker(&w1)[0];
    assert_eq!((rank.lost_batches, rank.clears), (0, 0), "{rank:#?}");

    cancel.cancel();
    timeout(Duration::from_secs(10), task).await.expect("run stops").expect("no panic");
    p.quit().await;
}
