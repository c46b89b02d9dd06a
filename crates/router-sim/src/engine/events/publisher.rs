//! The ZeroMQ side: a PUB socket bound at `--kv-events` sending `[topic, seq (8 bytes BE),
//! payload]`, and a ROUTER bound at `--kv-replay` answering `["", start_seq]` with
//! `["", topic, seq, payload]` for every retained batch from `start_seq` on, then
//! `["", topic, ff..ff, ""]`. Batches are retained in a bounded ring.
//!
//! An engine with several data-parallel ranks runs one publisher per rank ([`start_ranks`]),
//! rank `r` on the configured ports plus `r`, as SGLang and vLLM bind them.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use super::{KvEvent, KvFormat, encode_batch};
use crate::engine::EngineError;

/// The sequence number that ends a replay.
const END_OF_REPLAY: [u8; 8] = [0xff; 8];

/// Where and how to publish.
#[derive(Clone, Debug)]
pub(crate) struct PublisherOptions {
    pub(crate) events: Option<String>,
    pub(crate) replay: Option<String>,
    pub(crate) format: KvFormat,
    pub(crate) topic: String,
    pub(crate) block_size: u32,
    pub(crate) ring: usize,
    /// False under `--no-kv-events`: sockets are bound but nothing is sent or retained.
    pub(crate) enabled: bool,
    /// The data-parallel rank every batch names.
    pub(crate) dp_rank: u32,
}

/// The bound endpoints, with the ports the system chose.
#[derive(Clone, Debug, Default)]
pub(crate) struct BoundEndpoints {
    pub(crate) events: Option<String>,
    pub(crate) replay: Option<String>,
}

/// The scheduler's handle: hands batches to the publishing task without blocking.
#[derive(Clone, Debug)]
pub(crate) struct Publisher {
    tx: mpsc::UnboundedSender<Vec<KvEvent>>,
}

impl Publisher {
    /// A publisher whose batches land on the returned receiver (tests only).
    #[cfg(test)]
    pub(crate) fn channel() -> (Self, mpsc::UnboundedReceiver<Vec<KvEvent>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { tx }, rx)
    }

    /// Queues one batch (one scheduler step's events). The queue is drained as fast as the
    /// socket accepts; a PUB socket never blocks on slow subscribers.
    pub(crate) fn publish(&self, events: Vec<KvEvent>) {
        if !events.is_empty() {
            // A closed channel means the engine is shutting down; the batch is moot.
            let _ = self.tx.send(events);
        }
    }
}

#[derive(Default)]
struct Ring {
    capacity: usize,
    next_seq: u64,
    batches: VecDeque<(u64, Bytes)>,
}

impl Ring {
    fn push(&mut self, payload: Bytes) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.capacity > 0 {
            if self.batches.len() == self.capacity {
                self.batches.pop_front();
            }
            self.batches.push_back((seq, payload));
        }
        seq
    }

    fn since(&self, start: u64) -> Vec<(u64, Bytes)> {
        self.batches.iter().filter(|(seq, _)| *seq >= start).cloned().collect()
    }
}

fn check_endpoint(flag: &'static str, endpoint: &str) -> Result<(), EngineError> {
    let rest = endpoint.strip_prefix("tcp://").ok_or_else(|| EngineError::Config {
        flag,
        reason: format!("{endpoint:?} is not a tcp://HOST:PORT endpoint"),
    })?;
    if rest
        .rsplit_once(':')
        .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
    {
        return Err(EngineError::Config {
            flag,
            reason: format!("{endpoint:?} is not a tcp://HOST:PORT endpoint"),
        });
    }
    Ok(())
}

/// How often a run of free consecutive ports is looked for before giving up.
const PORT_RUN_ATTEMPTS: usize = 32;

/// One publisher per data-parallel rank (`dp_size` of them), rank `r` bound on the ports of
/// `options` plus `r`. A port of 0 becomes the start of a run of `dp_size` free ports. The
/// endpoints returned are rank 0's.
pub(crate) async fn start_ranks(
    options: PublisherOptions,
    dp_size: usize,
    cancel: CancellationToken,
    tracker: &TaskTracker,
) -> Result<(Vec<Publisher>, BoundEndpoints), EngineError> {
    if dp_size <= 1 {
        let (publisher, bound) = start(options, cancel, tracker).await?;
        return Ok((vec![publisher], bound));
    }
    let ranks = u16::try_from(dp_size).unwrap_or(u16::MAX);
    let events =
        options.events.as_deref().map(|e| rank_base("--kv-events", e, ranks)).transpose()?;
    let replay =
        options.replay.as_deref().map(|e| rank_base("--kv-replay", e, ranks)).transpose()?;
    let mut publishers = Vec::with_capacity(dp_size);
    let mut first = None;
    for rank in 0..ranks {
        let at = |base: &Option<(String, u16)>| {
            base.as_ref().map(|(host, port)| format!("tcp://{host}:{}", port + rank))
        };
        let options = PublisherOptions {
            events: at(&events),
            replay: at(&replay),
            dp_rank: u32::from(rank),
            ..options.clone()
        };
        let (publisher, bound) = start(options, cancel.clone(), tracker).await?;
        publishers.push(publisher);
        first.get_or_insert(bound);
    }
    Ok((publishers, first.unwrap_or_default()))
}

/// The host and first port of `ranks` consecutive rank endpoints based on `endpoint`: its own
/// port, or, for port 0, the start of a run of free ones.
fn rank_base(flag: &'static str, endpoint: &str, ranks: u16) -> Result<(String, u16), EngineError> {
    check_endpoint(flag, endpoint)?;
    let (host, port) = endpoint
        .strip_prefix("tcp://")
        .and_then(|rest| rest.rsplit_once(':'))
        .and_then(|(host, port)| Some((host.to_owned(), port.parse::<u16>().ok()?)))
        .ok_or_else(|| EngineError::Config {
            flag,
            reason: format!("{endpoint:?} is not a tcp://HOST:PORT endpoint"),
        })?;
    let too_high = || EngineError::Config {
        flag,
        reason: format!("{ranks} ranks from port {port} go beyond port 65535"),
    };
    if port != 0 {
        port.checked_add(ranks - 1).ok_or_else(too_high)?;
        return Ok((host, port));
    }
    let bind_host = if host == "*" { "0.0.0.0" } else { host.as_str() };
    free_port_run(bind_host, ranks).map(|start| (host.clone(), start)).ok_or_else(|| {
        EngineError::Config { flag, reason: format!("found no {ranks} consecutive free ports") }
    })
}

/// The first of `n` consecutive ports that are free on `host` right now.
fn free_port_run(host: &str, n: u16) -> Option<u16> {
    use std::net::TcpListener;
    (0..PORT_RUN_ATTEMPTS).find_map(|_| {
        let first = TcpListener::bind((host, 0)).ok()?;
        let start = first.local_addr().ok()?.port();
        let rest: Option<Vec<TcpListener>> = (1..n)
            .map(|offset| TcpListener::bind((host, start.checked_add(offset)?)).ok())
            .collect();
        rest.map(|_| start)
    })
}

/// Binds the sockets and starts the publishing and replay tasks on `tracker`.
pub(crate) async fn start(
    options: PublisherOptions,
    cancel: CancellationToken,
    tracker: &TaskTracker,
) -> Result<(Publisher, BoundEndpoints), EngineError> {
    let ring = Arc::new(Mutex::new(Ring { capacity: options.ring, ..Ring::default() }));
    let mut bound = BoundEndpoints::default();

    let mut pub_socket = None;
    if let Some(endpoint) = &options.events {
        check_endpoint("--kv-events", endpoint)?;
        let mut socket = zeromq::PubSocket::new();
        let resolved = socket.bind(endpoint).await.map_err(|source| EngineError::ZmqBind {
            what: "kv events",
            endpoint: endpoint.clone(),
            source,
        })?;
        bound.events = Some(resolved.to_string());
        pub_socket = Some(socket);
    }
    if let Some(endpoint) = &options.replay {
        check_endpoint("--kv-replay", endpoint)?;
        let mut socket = zeromq::RouterSocket::new();
        let resolved = socket.bind(endpoint).await.map_err(|source| EngineError::ZmqBind {
            what: "kv replay",
            endpoint: endpoint.clone(),
            source,
        })?;
        bound.replay = Some(resolved.to_string());
        let topic = Bytes::from(options.topic.clone());
        tracker.spawn(serve_replay(socket, Arc::clone(&ring), topic, cancel.clone()));
    }

    let (tx, rx) = mpsc::unbounded_channel();
    tracker.spawn(publish_loop(rx, pub_socket, ring, options, cancel));
    Ok((Publisher { tx }, bound))
}

async fn publish_loop(
    mut rx: mpsc::UnboundedReceiver<Vec<KvEvent>>,
    mut socket: Option<zeromq::PubSocket>,
    ring: Arc<Mutex<Ring>>,
    options: PublisherOptions,
    cancel: CancellationToken,
) {
    let topic = Bytes::from(options.topic.clone());
    loop {
        let events = tokio::select! {
            () = cancel.cancelled() => break,
            events = rx.recv() => match events {
                Some(events) => events,
                None => break,
            },
        };
        if !options.enabled {
            continue;
        }
        let ts =
            SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        let rank = Some(options.dp_rank);
        let payload =
            Bytes::from(encode_batch(options.format, ts, &events, options.block_size, rank));
        let seq = ring.lock().push(payload.clone());
        if let Some(socket) = socket.as_mut() {
            let frames = vec![topic.clone(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload];
            let Ok(message) = ZmqMessage::try_from(frames) else { continue };
            if let Err(error) = socket.send(message).await {
                tracing::warn!(%error, seq, "kv event publish failed");
            }
        }
    }
}

async fn serve_replay(
    mut socket: zeromq::RouterSocket,
    ring: Arc<Mutex<Ring>>,
    topic: Bytes,
    cancel: CancellationToken,
) {
    loop {
        let request = tokio::select! {
            () = cancel.cancelled() => break,
            request = socket.recv() => request,
        };
        let frames = match request {
            Ok(message) => message.into_vec(),
            Err(error) => {
                tracing::warn!(%error, "kv replay socket failed; replay is off");
                break;
            }
        };
        // [identity, "", start_seq] from a DEALER, or [identity, start_seq] without delimiter.
        let (identity, delimited, start) = match frames.as_slice() {
            [identity, empty, start] if empty.is_empty() => (identity.clone(), true, start),
            [identity, start] => (identity.clone(), false, start),
            _ => {
                tracing::warn!(frames = frames.len(), "malformed kv replay request ignored");
                continue;
            }
        };
        let Ok(start) = <[u8; 8]>::try_from(start.as_ref()).map(u64::from_be_bytes) else {
            tracing::warn!(len = start.len(), "kv replay start_seq is not 8 bytes");
            continue;
        };
        let batches = ring.lock().since(start);
        let end = (END_OF_REPLAY, Bytes::new());
        let replies = batches
            .into_iter()
            .map(|(seq, payload)| (seq.to_be_bytes(), payload))
            .chain(std::iter::once(end));
        for (seq, payload) in replies {
            let mut frames = vec![identity.clone()];
            if delimited {
                frames.push(Bytes::new());
            }
            frames.extend([topic.clone(), Bytes::copy_from_slice(&seq), payload]);
            let Ok(message) = ZmqMessage::try_from(frames) else { break };
            if let Err(error) = socket.send(message).await {
                tracing::warn!(%error, "kv replay reply failed");
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_the_newest_batches_with_their_sequence() {
        let mut ring = Ring { capacity: 3, ..Ring::default() };
        for i in 0..5u8 {
            assert_eq!(ring.push(Bytes::from(vec![i])), u64::from(i));
        }
        let seqs: Vec<u64> = ring.since(0).iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, vec![2, 3, 4]);
        assert_eq!(ring.since(4).len(), 1);
        assert!(ring.since(5).is_empty());
        assert_eq!(ring.since(3)[0].1, Bytes::from(vec![3u8]));
    }

    #[test]
    fn endpoints_must_be_tcp_host_port() {
        assert!(check_endpoint("--kv-events", "tcp://127.0.0.1:0").is_ok());
        assert!(check_endpoint("--kv-events", "tcp://*:5557").is_ok());
        for bad in ["127.0.0.1:5557", "tcp://127.0.0.1", "ipc:///tmp/x", "tcp://:5"] {
            let err = check_endpoint("--kv-events", bad).expect_err(bad);
            assert!(err.to_string().contains(bad), "{err}");
        }
    }
}
