//! The receive side of one subscription: a SUB socket per (worker, rank), connected (or
//! bound), reconnected with backoff, handing framed batches to the applier.
//!
//! The receive loop never waits for the index: it parses frames and `try_send`s them into a
//! bounded queue. A full queue drops the batch (counted as [`SkipReason::QueueOverflow`]); the
//! applier then sees a sequence gap and replays or clears, as for any other loss.
//!
//! What a publisher can make the router hold is bounded: the socket's decoder refuses, at its
//! header, a frame that would take its message past `max_message_bytes` or
//! `max_frames_per_message` (the connection is dropped, counted as [`SkipReason::TooLarge`] or
//! [`SkipReason::TooManyFrames`], and re-established with backoff), so one connection holds at
//! most one message in assembly; and the queue holds at most
//! [`SubscriptionConfig::queue_max_bytes`] of payload, copied out of the connection's read
//! buffer so that a queued batch keeps nothing else alive.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use zeromq::{CodecError, Socket, SocketEvent, SocketOptions, SocketRecv, SubSocket, ZmqError};

use super::SubscriptionConfig;
use super::stats::RankStats;
use crate::wire::frames::{Frame, parse_live};
use crate::{EndpointError, FrameError, SkipReason};

/// `tcp://host:(port + rank)` for a configured `tcp://host:port`. With `bind`, a `*` host
/// becomes `0.0.0.0`.
pub(crate) fn rank_endpoint(
    endpoint: &str,
    rank: u32,
    bind: bool,
) -> Result<String, EndpointError> {
    let malformed = || EndpointError::Malformed { endpoint: endpoint.to_owned() };
    let rest = endpoint.strip_prefix("tcp://").ok_or_else(malformed)?;
    let (host, port) = rest.rsplit_once(':').ok_or_else(malformed)?;
    let port: u16 = port.parse().map_err(|_| malformed())?;
    if host.is_empty() {
        return Err(malformed());
    }
    let port = u16::try_from(u32::from(port) + rank)
        .map_err(|_| EndpointError::RankPortOverflow { endpoint: endpoint.to_owned(), rank })?;
    let host = if bind && host == "*" { "0.0.0.0" } else { host };
    Ok(format!("tcp://{host}:{port}"))
}

/// Where and how one (worker, rank) subscription receives.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub(crate) endpoint: String,
    pub(crate) replay: Option<String>,
    pub(crate) topic: String,
    pub(crate) bind: bool,
}

/// Waits `delay` unless cancelled first; returns whether to go on.
async fn pause(delay: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        () = cancel.cancelled() => false,
        () = tokio::time::sleep(delay) => true,
    }
}

fn jittered(delay: Duration) -> Duration {
    delay.mul_f64(1.0 + rand::random::<f64>() * 0.2)
}

/// Socket options with the subscription's connect timeout and inbound message limits; the
/// replay DEALER uses them too.
pub(crate) fn socket_options(config: &SubscriptionConfig) -> SocketOptions {
    let mut options = SocketOptions::default();
    options
        .connect_timeout(config.connect_timeout)
        .max_message_size(config.max_message_bytes)
        .max_message_frames(config.max_frames_per_message);
    options
}

/// The skip reason of a transport error that is the peer's message refused for a limit (the
/// connection it came on is closed), `None` for any other error.
pub(crate) fn refusal(error: &ZmqError) -> Option<SkipReason> {
    match error {
        ZmqError::Codec(CodecError::MessageTooLarge { .. }) => Some(SkipReason::TooLarge),
        ZmqError::Codec(CodecError::TooManyFrames { .. }) => Some(SkipReason::TooManyFrames),
        _ => None,
    }
}

/// Counts a refused message and says so, once per connection (the refusal closes it).
fn refused(stats: &RankStats, target: &Target, reason: SkipReason, error: &ZmqError) {
    stats.skip(reason);
    stats.tick();
    tracing::warn!(worker = %stats.worker, rank = stats.rank, endpoint = %target.endpoint,
        %error, "kv event publisher sent a message over the configured limit \
        (kv.max_message_bytes, kv.max_frames_per_message); connection dropped");
}

/// The socket's side of one subscription's queue to its applier.
#[derive(Debug)]
pub(crate) struct Queue {
    pub(crate) frames: mpsc::Sender<Frame>,
    /// Payload bytes in `frames`; the applier gives them back as it takes each batch.
    pub(crate) bytes: Arc<QueuedBytes>,
}

/// Payload bytes waiting in one subscription's queue, kept under a budget.
#[derive(Debug)]
pub(crate) struct QueuedBytes {
    used: AtomicUsize,
    budget: usize,
}

impl QueuedBytes {
    pub(crate) fn new(budget: usize) -> Self {
        Self { used: AtomicUsize::new(0), budget }
    }

    /// Takes `n` bytes of the budget; false (and nothing taken) when they do not fit.
    fn try_take(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|total| *total <= self.budget)
            })
            .is_ok()
    }

    /// Gives back `n` bytes taken before.
    pub(crate) fn release(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// Receives until cancelled or the applier is gone.
pub(crate) async fn receive(
    target: Target,
    queue: Queue,
    stats: Arc<RankStats>,
    config: Arc<SubscriptionConfig>,
    cancel: CancellationToken,
) {
    let mut backoff = config.reconnect_backoff_initial;
    // Grows while each connection ends with a refused message.
    let mut refused_backoff = config.reconnect_backoff_initial;
    while !cancel.is_cancelled() {
        let mut socket = SubSocket::with_options(socket_options(&config));
        let mut monitor = socket.monitor();
        let setup = async {
            socket.subscribe(&target.topic).await?;
            if target.bind {
                socket.bind(&target.endpoint).await.map(drop)
            } else {
                socket.connect(&target.endpoint).await
            }
        };
        let outcome = tokio::select! {
            () = cancel.cancelled() => return,
            outcome = setup => outcome,
        };
        if let Err(error) = outcome {
            if let Some(reason) = refusal(&error) {
                refused(&stats, &target, reason, &error);
            }
            tracing::debug!(worker = %stats.worker, rank = stats.rank, endpoint = %target.endpoint,
                %error, "kv event subscription not established; retrying");
            if !pause(jittered(backoff), &cancel).await {
                return;
            }
            backoff = (backoff * 2).min(config.reconnect_backoff_max);
            continue;
        }
        backoff = config.reconnect_backoff_initial;
        stats.set_subscribed(true);
        tracing::debug!(worker = %stats.worker, rank = stats.rank, endpoint = %target.endpoint,
            bind = target.bind, "kv event subscription established");
        let mut was_refused = false;
        loop {
            tokio::select! {
                () = cancel.cancelled() => {
                    stats.set_subscribed(false);
                    return;
                }
                event = monitor.next() => match event {
                    Some(SocketEvent::Disconnected(_)) if !target.bind => break,
                    // A connecting peer whose handshake was over a limit (bind mode).
                    Some(SocketEvent::AcceptFailed(error)) => {
                        if let Some(reason) = refusal(&error) {
                            refused(&stats, &target, reason, &error);
                        }
                    }
                    Some(_) => {}
                    None => break,
                },
                message = socket.recv() => match message {
                    Ok(message) => {
                        let frames = message.into_vec();
                        if !forward(&frames, &target, &queue, &stats) {
                            stats.set_subscribed(false);
                            return;
                        }
                    }
                    Err(error) => {
                        if let Some(reason) = refusal(&error) {
                            refused(&stats, &target, reason, &error);
                            was_refused = true;
                        } else {
                            tracing::debug!(worker = %stats.worker, rank = stats.rank, %error,
                                "kv event receive failed");
                        }
                        if !target.bind {
                            break;
                        }
                    }
                },
            }
        }
        stats.set_subscribed(false);
        drop(socket);
        // The publisher went away (often: it is restarting). Reconnect promptly; connect
        // itself retries until the short connect timeout, then the loop backs off. A publisher
        // whose connections keep ending in a refused message is retried ever more slowly.
        let delay = if was_refused {
            let delay = refused_backoff;
            refused_backoff = (refused_backoff * 2).min(config.reconnect_backoff_max);
            delay
        } else {
            refused_backoff = config.reconnect_backoff_initial;
            config.reconnect_backoff_initial
        };
        if !pause(jittered(delay), &cancel).await {
            return;
        }
    }
}

/// Parses one live message and queues it; returns false when the applier is gone.
fn forward(frames: &[Bytes], target: &Target, queue: &Queue, stats: &RankStats) -> bool {
    let frame = match parse_live(frames) {
        Ok(frame) => frame,
        Err(FrameError::BadSeqLength { .. }) => {
            stats.skip(SkipReason::SeqLength);
            return true;
        }
        Err(_) => {
            stats.skip(SkipReason::FrameCount);
            return true;
        }
    };
    if !frame.topic.as_deref().unwrap_or_default().starts_with(target.topic.as_bytes()) {
        stats.skip(SkipReason::TopicMismatch);
        return true;
    }
    let size = frame.payload.len();
    if !queue.bytes.try_take(size) {
        stats.skip(SkipReason::QueueOverflow);
        return true;
    }
    // Copies: the received frames are slices of the connection's read buffer, which a queued
    // batch would otherwise keep alive whole.
    let frame = Frame {
        topic: frame.topic.as_deref().map(Bytes::copy_from_slice),
        seq: frame.seq,
        payload: Bytes::copy_from_slice(&frame.payload),
    };
    match queue.frames.try_send(frame) {
        Ok(()) => true,
        Err(mpsc::error::TrySendError::Full(_)) => {
            queue.bytes.release(size);
            stats.skip(SkipReason::QueueOverflow);
            true
        }
        Err(mpsc::error::TrySendError::Closed(_)) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_holds_copies_within_its_byte_budget() {
        let stats = crate::KvStats::default();
        let worker = router_workers::WorkerId::new("w").expect("id");
        let rank = stats.register(&worker, 1, 0, "tcp://127.0.0.1:1".into());
        let target =
            Target { endpoint: String::new(), replay: None, topic: "kv".into(), bind: false };
        let (frames, mut rx) = mpsc::channel(8);
        let queue = Queue { frames, bytes: Arc::new(QueuedBytes::new(10)) };
        let message = |seq: u64| {
            let buffer = Bytes::from(format!("kv{}12345678", "x".repeat(6)).into_bytes());
            vec![buffer.slice(..2), Bytes::copy_from_slice(&seq.to_be_bytes()), buffer.slice(8..)]
        };
        let first = message(0);
        assert!(forward(&first, &target, &queue, &rank));
        let queued = rx.try_recv().expect("queued");
        assert_eq!(queued.payload, first[2]);
        assert_ne!(queued.payload.as_ptr(), first[2].as_ptr(), "a copy, not a slice");
        // 8 of 10 bytes taken: a second batch does not fit until the first is given back.
        assert!(forward(&message(1), &target, &queue, &rank));
        assert!(rx.try_recv().is_err());
        assert_eq!(stats.worker(&worker)[0].skipped.get(SkipReason::QueueOverflow), 1);
        queue.bytes.release(queued.payload.len());
        assert!(forward(&message(2), &target, &queue, &rank));
        assert_eq!(rx.try_recv().expect("queued").seq, 2);
    }

    #[test]
    fn rank_endpoints_offset_the_port() {
        assert_eq!(
            rank_endpoint("tcp://10.0.0.1:5557", 0, false).as_deref(),
            Ok("tcp://10.0.0.1:5557")
        );
        assert_eq!(
            rank_endpoint("tcp://10.0.0.1:5557", 3, false).as_deref(),
            Ok("tcp://10.0.0.1:5560")
        );
        assert_eq!(rank_endpoint("tcp://*:5557", 1, true).as_deref(), Ok("tcp://0.0.0.0:5558"));
        assert_eq!(rank_endpoint("tcp://[::1]:5557", 1, false).as_deref(), Ok("tcp://[::1]:5558"));
        assert!(matches!(
            rank_endpoint("tcp://h:65535", 1, false),
            Err(EndpointError::RankPortOverflow { rank: 1, .. })
        ));
        assert!(rank_endpoint("ipc:///tmp/x", 0, false).is_err());
        assert!(rank_endpoint("tcp://:1", 0, false).is_err());
    }
}
