//! KV events as subscribers see them: every wire format (vLLM and SGLang, map and array forms),
//! replay from a sequence number, removals on eviction and the all-cleared event on a flush.

use std::time::Duration;

use bytes::Bytes;
use rmpv::Value;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::common::*;

const WAIT: Duration = Duration::from_secs(10);

/// A decoded event: (type, hashes, parent, token_ids, block_size) whatever the format.
#[derive(Debug, Clone, PartialEq)]
struct Event {
    kind: String,
    hashes: Vec<u64>,
    parent: Option<u64>,
    token_ids: Vec<u64>,
    block_size: Option<u64>,
    medium: Option<String>,
}

fn hash(v: &Value) -> u64 {
    v.as_u64().or_else(|| v.as_i64().map(|h| h as u64)).expect("integer hash")
}

fn field<'a>(map: &'a [(Value, Value)], key: &str) -> Option<&'a Value> {
    map.iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v)
}

/// Decodes a payload `[ts, [events], dp_rank]` in any of the four forms.
fn decode(payload: &[u8]) -> Vec<Event> {
    let batch = rmpv::decode::read_value(&mut &payload[..]).expect("msgpack batch");
    let batch = batch.as_array().expect("batch array");
    assert_eq!(batch.len(), 3);
    assert!(batch[0].as_f64().is_some_and(|ts| ts > 1.6e9), "unix timestamp");
    assert_eq!(batch[2].as_u64(), Some(0), "dp rank 0");
    batch[1]
        .as_array()
        .expect("events")
        .iter()
        .map(|event| match event {
            Value::Map(map) => {
                let list = |key: &str| {
                    field(map, key)
                        .and_then(Value::as_array)
                        .map(|a| a.iter().map(hash).collect())
                        .unwrap_or_default()
                };
                Event {
                    kind: field(map, "type").and_then(Value::as_str).expect("type").to_owned(),
                    hashes: list("block_hashes"),
                    parent: field(map, "parent_block_hash").filter(|v| !v.is_nil()).map(hash),
                    token_ids: list("token_ids"),
                    block_size: field(map, "block_size").and_then(Value::as_u64),
                    medium: field(map, "medium").and_then(Value::as_str).map(str::to_owned),
                }
            }
            Value::Array(items) => {
                let kind = items[0].as_str().expect("type").to_owned();
                let list = |i: usize| {
                    items
                        .get(i)
                        .and_then(Value::as_array)
                        .map(|a| a.iter().map(hash).collect())
                        .unwrap_or_default()
                };
                match kind.as_str() {
                    "BlockStored" => Event {
                        hashes: list(1),
                        parent: items.get(2).filter(|v| !v.is_nil()).map(hash),
                        token_ids: list(3),
                        block_size: items.get(4).and_then(Value::as_u64),
                        medium: items.get(6).and_then(Value::as_str).map(str::to_owned),
                        kind,
                    },
                    "BlockRemoved" => Event {
                        hashes: list(1),
                        parent: None,
                        token_ids: vec![],
                        block_size: None,
                        medium: items.get(2).and_then(Value::as_str).map(str::to_owned),
                        kind,
                    },
                    _ => Event {
                        kind,
                        hashes: vec![],
                        parent: None,
                        token_ids: vec![],
                        block_size: None,
                        medium: None,
                    },
                }
            }
            other => panic!("event is neither map nor array: {other}"),
        })
        .collect()
}

async fn subscribe(endpoint: &str) -> zeromq::SubSocket {
    let mut sub = zeromq::SubSocket::new();
    tokio::time::timeout(WAIT, sub.connect(endpoint))
        .await
        .expect("connect in time")
        .expect("connects");
    sub.subscribe("").await.expect("subscribes");
    sub
}

async fn recv(sub: &mut zeromq::SubSocket) -> Vec<Bytes> {
    tokio::time::timeout(WAIT, sub.recv())
        .await
        .expect("an event in time")
        .expect("receives")
        .into_vec()
}

/// Replays from `start` through a fresh DEALER: (seq, topic, payload) until the end marker.
async fn replay(endpoint: &str, start: u64) -> Vec<(u64, Bytes, Bytes)> {
    let mut dealer = zeromq::DealerSocket::new();
    tokio::time::timeout(WAIT, dealer.connect(endpoint))
        .await
        .expect("connect in time")
        .expect("connects");
    let request =
        ZmqMessage::try_from(vec![Bytes::new(), Bytes::copy_from_slice(&start.to_be_bytes())])
            .expect("message");
    dealer.send(request).await.expect("sends");
    let mut batches = Vec::new();
    loop {
        let frames = tokio::time::timeout(WAIT, dealer.recv())
            .await
            .expect("reply in time")
            .expect("reply")
            .into_vec();
        assert_eq!(frames.len(), 4, "[\"\", topic, seq, payload]");
        assert!(frames[0].is_empty(), "empty delimiter");
        let seq = u64::from_be_bytes(frames[2].as_ref().try_into().expect("8-byte seq"));
        if seq == u64::MAX {
            assert!(frames[3].is_empty(), "end marker has an empty payload");
            return batches;
        }
        batches.push((seq, frames[1].clone(), frames[3].clone()));
    }
}

async fn kv_events_in(format: &str) {
    let sim = Sim::start(&[
        "--kv-events",
        "tcp://127.0.0.1:0",
        "--kv-replay",
        "tcp://127.0.0.1:0",
        "--kv-format",
        format,
        "--kv-topic",
        "kv@sim@m",
        "--block-size",
        "4",
    ])
    .await;
    let mut sub = subscribe(sim.endpoint("kv events")).await;
    // A subscription becomes live a little after connect: probe with distinct prompts
    // until the first batch arrives, so that the checked request is surely seen.
    let mut first = None;
    for i in 0..50 {
        chat(&sim, &request(&format!("probe {i}"), 1, false)).await;
        if let Ok(Ok(message)) = tokio::time::timeout(Duration::from_millis(200), sub.recv()).await
        {
            first = Some(message.into_vec());
            break;
        }
    }
    let first = first.expect("events arrive once subscribed");
    let mut received = vec![first];
    let content = "The quick brown fox jumps over the lazy dog";
    chat(&sim, &request(content, 1, false)).await;
    let prompt = chatml_user(content);
    let expected_tokens: Vec<u64> =
        prompt[..prompt.len() / 4 * 4].iter().map(|t| u64::from(*t)).collect();
    let stored = loop {
        let frames = recv(&mut sub).await;
        let events = decode(&frames[2]);
        received.push(frames);
        // The template's opening blocks are shared with the probes, so the new run starts
        // further in: find the event whose tokens end the prompt's last full block.
        if let Some(event) = events
            .into_iter()
            .find(|e| e.kind == "BlockStored" && expected_tokens.ends_with(&e.token_ids))
        {
            break event;
        }
    };
    assert_eq!(stored.block_size, Some(4), "{format}");
    assert_eq!(stored.medium.as_deref(), Some("GPU"), "{format}");
    assert_eq!(stored.token_ids.len(), stored.hashes.len() * 4, "{format}");
    assert!(stored.parent.is_some(), "the run continues the shared template prefix ({format})");

    for frames in &received {
        assert_eq!(frames.len(), 3, "[topic, seq, payload]");
        assert_eq!(frames[0].as_ref(), b"kv@sim@m");
        assert_eq!(frames[1].len(), 8);
    }
    let seqs: Vec<u64> = received
        .iter()
        .map(|f| u64::from_be_bytes(f[1].as_ref().try_into().expect("8 bytes")))
        .collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "consecutive seqs: {seqs:?}");

    // Replay from 0 returns every batch, in order, the same bytes the SUB saw.
    let replayed = replay(sim.endpoint("kv replay"), 0).await;
    let replayed_seqs: Vec<u64> = replayed.iter().map(|(s, _, _)| *s).collect();
    assert_eq!(replayed_seqs, (0..replayed.len() as u64).collect::<Vec<_>>());
    assert!(replayed.len() as u64 > *seqs.last().expect("seqs"));
    for frames in &received {
        let seq = u64::from_be_bytes(frames[1].as_ref().try_into().expect("8 bytes"));
        let (_, topic, payload) = &replayed[seq as usize];
        assert_eq!(topic.as_ref(), b"kv@sim@m");
        assert_eq!(payload, &frames[2], "{format} seq {seq}");
    }
    // A replay from the middle starts there.
    let tail = replay(sim.endpoint("kv replay"), 1).await;
    assert_eq!(tail, replayed[1..].to_vec());
    assert!(replay(sim.endpoint("kv replay"), replayed.len() as u64).await.is_empty());

    // The replay holds the whole history: the first batch stores the template from the root.
    let all: Vec<Event> = replayed.iter().flat_map(|(_, _, p)| decode(p)).collect();
    let root = all.iter().find(|e| e.kind == "BlockStored").expect("a stored event");
    assert_eq!(root.parent, None);
    assert_eq!(
        &root.token_ids[..4],
        &b"<|im"[..].iter().map(|b| u64::from(*b)).collect::<Vec<_>>()[..]
    );
}

#[tokio::test]
async fn kv_events_vllm() {
    kv_events_in("vllm").await;
}

#[tokio::test]
async fn kv_events_vllm_legacy() {
    kv_events_in("vllm-legacy").await;
}

#[tokio::test]
async fn kv_events_sglang() {
    kv_events_in("sglang").await;
}

#[tokio::test]
async fn kv_events_sglang_legacy() {
    kv_events_in("sglang-legacy").await;
}

#[tokio::test]
async fn eviction_publishes_block_removed_for_stored_blocks() {
    // 128 tokens of KV in blocks of 4; each request needs about 20 blocks of the 32.
    let sim = Sim::start(&[
        "--kv-replay",
        "tcp://127.0.0.1:0",
        "--block-size",
        "4",
        "--kv-capacity-tokens",
        "128",
    ])
    .await;
    for i in 0..6 {
        let reply = chat(&sim, &request(&format!("distinct prompt number {i}"), 2, false)).await;
        assert_eq!(reply.status, http::StatusCode::OK);
    }
    let events: Vec<Event> =
        replay(sim.endpoint("kv replay"), 0).await.iter().flat_map(|(_, _, p)| decode(p)).collect();
    let mut cached = std::collections::HashSet::new();
    let mut removed = 0;
    for event in &events {
        match event.kind.as_str() {
            "BlockStored" => {
                if let Some(parent) = event.parent {
                    assert!(cached.contains(&parent), "a stored block's parent is cached");
                }
                cached.extend(event.hashes.iter().copied());
            }
            "BlockRemoved" => {
                for hash in &event.hashes {
                    assert!(cached.remove(hash), "removed a block that was stored");
                    removed += 1;
                }
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert!(removed > 0, "the small cache had to evict");
    assert!(cached.len() <= 32, "never more blocks than the capacity");
    let loads = get(&format!("{}/v1/loads", sim.url())).await.json();
    assert_eq!(loads["loads"][0]["num_used_tokens"], 0, "nothing runs");
}

#[tokio::test]
async fn flush_cache_publishes_all_blocks_cleared() {
    let sim = Sim::start(&["--kv-replay", "tcp://127.0.0.1:0", "--kv-format", "sglang"]).await;
    chat(&sim, &request("something to cache, long enough for a block or two", 1, false)).await;
    let reply = send(http::Method::POST, &format!("{}/flush_cache", sim.url()), None)
        .await
        .expect("answered");
    assert_eq!(reply.status, http::StatusCode::OK);
    // The publisher hands batches to the replay ring asynchronously: wait for the last one.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let batches = replay(sim.endpoint("kv replay"), 0).await;
        let last = decode(&batches.last().expect("batches").2);
        if last[0].kind == "AllBlocksCleared" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no AllBlocksCleared: {last:?}");
    }
    let again =
        chat(&sim, &request("something to cache, long enough for a block or two", 1, false))
            .await
            .json();
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "the cache is empty");
}
