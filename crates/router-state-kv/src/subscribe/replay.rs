//! Replay: a fresh DEALER per request to the engine's ROUTER, read until the end marker.
//!
//! A DEALER does not notice a restarted ROUTER (the request would vanish), so every replay
//! opens its own socket, bounded by a connect timeout and a per-reply timeout, and by the
//! subscription's inbound message limits: a reply over them ends the replay.

use std::time::Duration;

use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::SubscriptionConfig;
use super::socket::{refusal, socket_options};
use crate::wire::frames::{Frame, ReplayReply, parse_replay, replay_request};
use crate::{FrameError, ReplayError, SkipReason};

/// One reply of a replay session.
#[derive(Debug)]
pub(crate) enum ReplayItem {
    /// A replayed batch.
    Batch(Frame),
    /// A reply without the replay framing; skipped.
    Bad(FrameError),
}

/// An open replay exchange.
pub(crate) struct ReplaySession {
    socket: DealerSocket,
    endpoint: String,
    timeout: Duration,
    remaining: usize,
    limit: usize,
}

impl ReplaySession {
    /// Connects and asks for every batch from `start` on.
    pub(crate) async fn open(
        endpoint: &str,
        start: u64,
        config: &SubscriptionConfig,
    ) -> Result<Self, ReplayError> {
        let (timeout, limit) = (config.replay_timeout, config.replay_max_batches);
        let mut socket = DealerSocket::with_options(socket_options(config));
        socket
            .connect(endpoint)
            .await
            .map_err(|source| ReplayError::Connect { endpoint: endpoint.to_owned(), source })?;
        let request =
            ZmqMessage::try_from(replay_request(start)).expect("a replay request has two frames");
        let send = socket.send(request);
        match tokio::time::timeout(timeout, send).await {
            Ok(Ok(())) => {}
            Ok(Err(source)) => {
                return Err(ReplayError::Transport { endpoint: endpoint.to_owned(), source });
            }
            Err(_) => return Err(timeout_error(endpoint, timeout)),
        }
        Ok(Self { socket, endpoint: endpoint.to_owned(), timeout, remaining: limit, limit })
    }

    /// The next reply, or `None` after the end marker.
    pub(crate) async fn next(&mut self) -> Result<Option<ReplayItem>, ReplayError> {
        let message = match tokio::time::timeout(self.timeout, self.socket.recv()).await {
            Ok(Ok(message)) => message,
            Ok(Err(source)) => {
                return Err(ReplayError::Transport { endpoint: self.endpoint.clone(), source });
            }
            Err(_) => return Err(timeout_error(&self.endpoint, self.timeout)),
        };
        match parse_replay(&message.into_vec()) {
            Ok(ReplayReply::End) => Ok(None),
            Ok(ReplayReply::Batch(frame)) => {
                if self.remaining == 0 {
                    return Err(ReplayError::TooLong {
                        endpoint: self.endpoint.clone(),
                        limit: self.limit,
                    });
                }
                self.remaining -= 1;
                Ok(Some(ReplayItem::Batch(frame)))
            }
            Err(error) => Ok(Some(ReplayItem::Bad(error))),
        }
    }
}

impl ReplayError {
    /// The skip reason when the replay ended because the engine's reply was over a message
    /// limit (the connection is closed).
    pub(crate) fn refusal(&self) -> Option<SkipReason> {
        match self {
            ReplayError::Connect { source, .. } | ReplayError::Transport { source, .. } => {
                refusal(source)
            }
            ReplayError::Timeout { .. } | ReplayError::TooLong { .. } => None,
        }
    }
}

fn timeout_error(endpoint: &str, timeout: Duration) -> ReplayError {
    ReplayError::Timeout {
        endpoint: endpoint.to_owned(),
        timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
    }
}
