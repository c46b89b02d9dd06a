//! The receive side of one subscription: a SUB socket per (worker, rank), connected (or
//! bound), reconnected with backoff, handing framed batches to the applier.
//!
//! The receive loop never waits for the index: it parses frames and `try_send`s them into a
//! bounded queue. A full queue drops the batch (counted as [`SkipReason::QueueOverflow`]); the
//! applier then sees a sequence gap and replays or clears, as for any other loss.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use zeromq::{Socket, SocketEvent, SocketOptions, SocketRecv, SubSocket};

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

/// Receives until cancelled or the applier is gone.
pub(crate) async fn receive(
    target: Target,
    queue: mpsc::Sender<Frame>,
    stats: Arc<RankStats>,
    config: Arc<SubscriptionConfig>,
    cancel: CancellationToken,
) {
    let mut backoff = config.reconnect_backoff_initial;
    while !cancel.is_cancelled() {
        let mut options = SocketOptions::default();
        options.connect_timeout(config.connect_timeout);
        let mut socket = SubSocket::with_options(options);
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
        loop {
            tokio::select! {
                () = cancel.cancelled() => {
                    stats.set_subscribed(false);
                    return;
                }
                event = monitor.next() => match event {
                    Some(SocketEvent::Disconnected(_)) if !target.bind => break,
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
                        tracing::debug!(worker = %stats.worker, rank = stats.rank, %error,
                            "kv event receive failed");
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
        // itself retries until the short connect timeout, then the loop backs off.
        if !pause(jittered(config.reconnect_backoff_initial), &cancel).await {
            return;
        }
    }
}

/// Parses one live message and queues it; returns false when the applier is gone.
fn forward(
    frames: &[bytes::Bytes],
    target: &Target,
    queue: &mpsc::Sender<Frame>,
    stats: &RankStats,
) -> bool {
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
    match queue.try_send(frame) {
        Ok(()) => true,
        Err(mpsc::error::TrySendError::Full(_)) => {
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
