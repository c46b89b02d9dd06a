//! The remote indexer: the `router.kv.v1.KvIndexer` gRPC service over a [`KvIndex`], and the
//! client routers use to query it.
//!
//! A deployment with several routers can run one indexer process (`router-server kv-indexer`)
//! that subscribes to every engine's KV events and serves lookups, instead of every router
//! keeping its own index. The wire contract is `proto/kv.proto`.
//!
//! - [`KvIndexService`] answers `Lookup` from an `Arc<KvIndex>` by block hashes
//!   ([`KvIndex::lookup`]) or by token ids ([`KvIndex::lookup_tokens`]); [`serve`] and
//!   [`serve_with`] run it until a cancellation token fires.
//! - [`RemoteIndexClient`] queries one indexer or several replicas of it, with a query timeout
//!   (covering connection, failover and the answer) and a limit on lookups in flight. Beyond
//!   the limit a lookup fails at once ([`RemoteError::Busy`]) instead of queueing behind
//!   others. A timeout, a busy client, an unreachable or failing indexer and a malformed
//!   answer are all *unavailable* ([`RemoteError::is_unavailable`]): the caller falls back,
//!   but must not read them as a miss. Only a query the indexer refuses as invalid is not.
//!
//! Both sides hash with [`crate::hash`], so a router and its indexer must run the same hash
//! function and agree on the engines' block size. Channels are opened lazily on the first
//! lookup (constructors never spawn or connect).
//!
//! [`KvIndex`]: crate::KvIndex
//! [`KvIndex::lookup`]: crate::KvIndex::lookup
//! [`KvIndex::lookup_tokens`]: crate::KvIndex::lookup_tokens

mod client;
mod convert;
mod service;

pub use client::{ClientConfig, ClientConfigError, RemoteError, RemoteIndexClient};
pub use convert::MalformedResponse;
pub use service::{KvIndexService, ServeError, ServiceLimits, serve, serve_with};

#[cfg(test)]
mod tests;
