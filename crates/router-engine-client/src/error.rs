//! Why a request could not be sent to an engine, or got no response head: each case with its
//! engine, so that the dispatcher can tell an engine that never received the request (the one
//! failure a plain dispatch retries elsewhere) from one that failed after.

use std::time::Duration;

use router_workers::WorkerId;

/// Any error of the HTTP stacks underneath, kept as the source of a [`SendError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a request could not be sent to an engine, or got no response head.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The connection could not be made: the engine received nothing (the one failure a
    /// plain dispatch retries).
    #[error("engine {worker} unreachable")]
    Unreachable {
        /// The engine.
        worker: WorkerId,
        /// The client's error (connect, TLS handshake, connection setup timeout).
        #[source]
        source: BoxError,
    },
    /// The exchange failed after connecting.
    #[error("engine {worker} failed")]
    Failed {
        /// The engine.
        worker: WorkerId,
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// No response head within `server.request_timeout_secs`.
    #[error("engine {worker} did not answer within {} s", after.as_secs())]
    Timeout {
        /// The engine.
        worker: WorkerId,
        /// The timeout.
        after: Duration,
    },
    /// The request itself could not be built (an engine URL the HTTP stack refuses).
    #[error("building the request to engine {worker} at {url}")]
    Request {
        /// The engine.
        worker: WorkerId,
        /// The URL.
        url: String,
        /// Why.
        #[source]
        source: BoxError,
    },
}

impl SendError {
    /// The engine.
    pub fn worker(&self) -> &WorkerId {
        match self {
            SendError::Unreachable { worker, .. }
            | SendError::Failed { worker, .. }
            | SendError::Timeout { worker, .. }
            | SendError::Request { worker, .. } => worker,
        }
    }

    /// A metrics label.
    pub fn kind(&self) -> &'static str {
        match self {
            SendError::Unreachable { .. } => "unreachable",
            SendError::Failed { .. } | SendError::Request { .. } => "transport",
            SendError::Timeout { .. } => "timeout",
        }
    }
}
