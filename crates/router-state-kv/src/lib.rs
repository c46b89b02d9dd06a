//! KV-cache state: which engine holds which token blocks.
//!
//! Owns the ZeroMQ subscriptions to engine KV events (with replay), msgpack wire decoding,
//! local block hashing, the radix-tree prefix index with storage tiers, and the remote-indexer
//! gRPC service and client.
//!
//! Does not own: cache-aware selection (router-policies) or the worker registry.
