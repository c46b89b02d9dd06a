//! Forwarding to engines: the answers of router-engine-client's exchanges streamed to the client
//! ([`body`]), and the outcome of each for the circuit breaker.
//!
//! The in-flight guards of the engines dispatched to travel with the response and are released
//! when it ends, fails, or is dropped because the client went away.

mod body;

pub(crate) use body::{AnswerMetrics, GuardedBody, TtftPrediction, passthrough_headers};

use router_workers::Worker;

/// How a dispatch to one engine ended, for the circuit breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The engine answered (2xx, or a 4xx that is the client's fault).
    Success,
    /// 5xx, a timeout, a stall or a broken stream.
    Failure,
    /// The engine refused or could not take the connection.
    Unreachable,
}

/// Receives dispatch outcomes (the circuit breaker).
pub trait OutcomeSink: Send + Sync + 'static {
    /// Records how a dispatch to `worker` ended.
    fn record(&self, worker: &Worker, outcome: Outcome);
}
