//! KV-cache state: which engine holds which token blocks.
//!
//! Owns the ZeroMQ subscriptions to engine KV events (with replay), msgpack wire decoding,
//! local block hashing, and the radix-tree prefix index with storage tiers.
//!
//! Does not own: cache-aware selection (router-policies), the worker registry
//! (router-workers), or the remote-indexer gRPC service (a later addition that wraps
//! [`KvIndex::lookup`]).
#![doc = include_str!("../README.md")]

mod error;
pub mod hash;
mod index;
mod medium;
mod skip;
mod subscribe;
pub mod wire;

pub use error::{DecodeError, EndpointError, FrameError, IndexError, ReplayError};
pub use index::{
    ApplyReport, Holder, IndexConfig, IndexStats, KvIndex, ModelStats, PrefixMatch,
    PrefixMatches, WRITE_CHUNK,
};
pub use medium::Medium;
pub use skip::{SkipCounts, SkipReason};
pub use subscribe::{
    KvStats, KvSubscriptions, RankSnapshot, SubscriptionConfig, WorkerSummary,
};
