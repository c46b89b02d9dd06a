//! KV-cache state: which engine holds which token blocks.
//!
//! Owns the ZeroMQ subscriptions to engine KV events (with replay), msgpack wire decoding,
//! local block hashing, the radix-tree prefix index with storage tiers, the predicted entries
//! of what the router just dispatched ([`Predictions`]), and the remote
//! indexer ([`remote`]: the gRPC service that serves [`KvIndex::lookup`] to other routers, and
//! the client that queries it).
//!
//! Does not own: cache-aware selection (router-policies) or the worker registry
//! (router-workers).
#![doc = include_str!("../README.md")]

mod error;
pub mod hash;
mod index;
mod medium;
mod predicted;
pub mod remote;
mod skip;
mod subscribe;
pub mod wire;

pub use error::{DecodeError, EndpointError, FrameError, IndexError, ReplayError};
pub use index::{
    ApplyReport, Holder, IndexConfig, IndexStats, KvIndex, ModelStats, PrefixMatch, PrefixMatches,
    WRITE_CHUNK,
};
pub use medium::Medium;
pub use predicted::{PredictedBlocks, PredictionConfig, Predictions};
pub use skip::{SkipCounts, SkipReason};
pub use subscribe::{KvStats, KvSubscriptions, RankSnapshot, SubscriptionConfig, WorkerSummary};
