//! The errors of an exchange with one engine: why it could not be sent (router-engine-client's
//! `SendError`) or failed after ([`EngineError`]), each with its engine, the status it maps to, and whether a
//! retry or another selection may follow.

use std::time::Duration;

use axum::http::StatusCode;
use router_engine_client::SendError;
use router_workers::WorkerId;

use super::BoxError;

/// Why an exchange with one engine failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum EngineError {
    /// The request could not be sent, or no response head came back.
    #[error(transparent)]
    Send(#[from] SendError),
    /// The engine answered with a server error; `text` is the start of its body.
    #[error("engine {worker} answered {}: {text}", status.as_u16())]
    Status {
        /// The engine.
        worker: WorkerId,
        /// Its status.
        status: StatusCode,
        /// At most 1 KiB of its body.
        text: String,
    },
    /// The engine declined the request with a status the router retries elsewhere
    /// (`server.retry.on_status`: busy, overloaded, unavailable, gateway errors). Answered
    /// with that status when no retry is left.
    #[error("engine {worker} declined the request ({}): {text}", status.as_u16())]
    Declined {
        /// The engine.
        worker: WorkerId,
        /// Its status.
        status: StatusCode,
        /// At most 1 KiB of its body.
        text: String,
    },
    /// The engine refused the router's credential (401 or 403). Passing that on would tell
    /// the client its own key is wrong.
    #[error(
        "engine {worker} refused the router's credentials ({}); check the worker's api_key",
        status.as_u16()
    )]
    RefusedCredentials {
        /// The engine.
        worker: WorkerId,
        /// Its status.
        status: StatusCode,
    },
    /// A prefill engine refused the request (a 4xx other than a credential refusal).
    #[error("engine {worker} refused the request ({}): {text}", status.as_u16())]
    Refused {
        /// The engine.
        worker: WorkerId,
        /// Its status.
        status: StatusCode,
        /// At most 1 KiB of its body.
        text: String,
    },
    /// The engine's body broke off.
    #[error("engine {worker} failed mid-response")]
    MidResponse {
        /// The engine.
        worker: WorkerId,
        /// The transport's error.
        #[source]
        source: BoxError,
    },
    /// The engine sent its head, then nothing for `server.engine_idle_timeout_secs`.
    #[error("engine {worker} sent nothing for {} s", silence.as_secs())]
    Stalled {
        /// The engine.
        worker: WorkerId,
        /// How long it was silent.
        silence: Duration,
    },
    /// A whole (non-streamed) answer not finished within `server.answer_timeout_secs` of its
    /// dispatch.
    #[error("engine {worker} did not finish its answer within {} s", limit.as_secs())]
    Overdue {
        /// The engine.
        worker: WorkerId,
        /// The deadline's length.
        limit: Duration,
    },
    /// A whole (non-streamed) answer larger than the router buffers.
    #[error("engine {worker} answered more than {limit} bytes")]
    AnswerTooLarge {
        /// The engine.
        worker: WorkerId,
        /// The limit in bytes.
        limit: usize,
    },
}

impl EngineError {
    /// The engine.
    pub(crate) fn worker(&self) -> &WorkerId {
        match self {
            EngineError::Send(err) => err.worker(),
            EngineError::Status { worker, .. }
            | EngineError::Declined { worker, .. }
            | EngineError::RefusedCredentials { worker, .. }
            | EngineError::Refused { worker, .. }
            | EngineError::MidResponse { worker, .. }
            | EngineError::Stalled { worker, .. }
            | EngineError::Overdue { worker, .. }
            | EngineError::AnswerTooLarge { worker, .. } => worker,
        }
    }

    /// A metrics label (`router_engine_failures_total{kind}`).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            EngineError::Send(err) => err.kind(),
            EngineError::Status { .. } => "status",
            EngineError::Declined { .. } => "declined",
            EngineError::RefusedCredentials { .. } => "credentials",
            EngineError::Refused { .. } => "refused",
            EngineError::MidResponse { .. } => "transport",
            EngineError::Stalled { .. } => "stalled",
            EngineError::Overdue { .. } => "overdue",
            EngineError::AnswerTooLarge { .. } => "too_large",
        }
    }

    pub(super) fn is_timeout(&self) -> bool {
        matches!(
            self,
            EngineError::Send(SendError::Timeout { .. })
                | EngineError::Stalled { .. }
                | EngineError::Overdue { .. }
        )
    }

    pub(super) fn code(&self) -> &'static str {
        match self {
            EngineError::Send(SendError::Unreachable { .. }) => "engine_unreachable",
            EngineError::Declined { .. } => "engine_declined",
            _ if self.is_timeout() => "engine_timeout",
            _ => "engine_failed",
        }
    }
}
