//! Why a worker or a registry change was refused.

use crate::{ModelId, Stage, WorkerId};

/// A worker that cannot be built, or a registry change that would break a rule.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkerError {
    /// Worker ids must be non-empty.
    #[error("worker id must not be empty")]
    EmptyId,
    /// The URL is not a usable engine address.
    #[error("worker url {url:?} rejected: {reason}")]
    BadUrl {
        /// The offending URL, with any credentials masked.
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A worker must serve at least one model.
    #[error("worker {id} serves no model")]
    NoModel {
        /// The worker.
        id: WorkerId,
    },
    /// `dp_size` must be at least 1.
    #[error("worker {id}: dp_size must be at least 1")]
    ZeroDpSize {
        /// The worker.
        id: WorkerId,
    },
    /// `block_size` (or `kv_events.block_size`) must be at least 1.
    #[error("worker {id}: block_size must be at least 1")]
    ZeroBlockSize {
        /// The worker.
        id: WorkerId,
    },
    /// `block_size` and `kv_events.block_size` disagree.
    #[error("worker {id}: block_size {worker} differs from kv_events.block_size {events}")]
    ConflictingBlockSize {
        /// The worker.
        id: WorkerId,
        /// `block_size`.
        worker: u32,
        /// `kv_events.block_size`.
        events: u32,
    },
    /// A KV-event endpoint that is not `tcp://host:port`.
    #[error("worker {id}: kv event endpoint {endpoint:?} must be tcp://host:port")]
    BadKvEndpoint {
        /// The worker.
        id: WorkerId,
        /// The endpoint as given.
        endpoint: String,
    },
    /// Only prefill engines have a bootstrap server.
    #[error("worker {id}: bootstrap_port is only valid for prefill workers, not {role}")]
    BootstrapPortOnNonPrefill {
        /// The worker.
        id: WorkerId,
        /// Its role.
        role: Stage,
    },
    /// A label name must not be empty.
    #[error("worker {id}: label names must not be empty")]
    EmptyLabelName {
        /// The worker.
        id: WorkerId,
    },
    /// Another worker already has this id.
    #[error("duplicate worker id {id}")]
    Duplicate {
        /// The id.
        id: WorkerId,
    },
    /// No worker has this id.
    #[error("unknown worker id {id}")]
    NotFound {
        /// The id.
        id: WorkerId,
    },
    /// The worker would make a model served by both plain and PD engines.
    #[error("worker {id} ({role}) would mix plain and prefill/decode engines in model {model}")]
    MixedModel {
        /// The worker.
        id: WorkerId,
        /// The model that would be mixed.
        model: ModelId,
        /// The worker's role.
        role: Stage,
    },
}
