//! Why a payload, a message or a subscription was refused.

/// A msgpack event batch that cannot be decoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The payload is larger than [`crate::wire::DecodeLimits::max_payload_bytes`].
    #[error("payload of {size} bytes exceeds the limit of {limit} bytes")]
    PayloadTooLarge {
        /// Payload size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A collection or string is longer than its limit.
    #[error("{what} has {len} elements, more than the limit of {limit}")]
    TooLarge {
        /// What was too large (`events`, `block_hashes`, `token_ids`, `string`, ...).
        what: &'static str,
        /// Its declared or actual length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The batch array has fewer than two elements.
    #[error("event batch has fewer than the two required elements [ts, events]")]
    ShortBatch,
    /// Bytes follow the batch.
    #[error("{extra} trailing bytes after the event batch")]
    TrailingBytes {
        /// How many.
        extra: usize,
    },
    /// Not valid msgpack, or not the shape of an event batch.
    #[error("malformed event batch")]
    Msgpack(#[source] rmp_serde::decode::Error),
}

/// A ZeroMQ message that does not have the framing of docs/design/wire/KV_EVENTS.md.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// Wrong number of frames.
    #[error("message has {got} frames, expected {expected}")]
    FrameCount {
        /// Frames received.
        got: usize,
        /// Frames expected.
        expected: &'static str,
    },
    /// The sequence frame is not 8 bytes.
    #[error("sequence frame has {len} bytes, expected 8")]
    BadSeqLength {
        /// Its length.
        len: usize,
    },
    /// A replay reply does not start with the empty delimiter frame.
    #[error("replay reply does not start with an empty delimiter frame")]
    MissingDelimiter,
}

/// Why a replay request did not complete.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The replay endpoint could not be reached.
    #[error("cannot connect to replay endpoint {endpoint}")]
    Connect {
        /// The endpoint.
        endpoint: String,
        /// The transport error.
        #[source]
        source: zeromq::ZmqError,
    },
    /// Sending the request or receiving a reply failed.
    #[error("replay exchange with {endpoint} failed")]
    Transport {
        /// The endpoint.
        endpoint: String,
        /// The transport error.
        #[source]
        source: zeromq::ZmqError,
    },
    /// No reply arrived in time.
    #[error("replay endpoint {endpoint} did not answer within {timeout_ms} ms")]
    Timeout {
        /// The endpoint.
        endpoint: String,
        /// The per-message timeout.
        timeout_ms: u64,
    },
    /// More batches than the configured replay limit.
    #[error("replay from {endpoint} exceeded {limit} batches")]
    TooLong {
        /// The endpoint.
        endpoint: String,
        /// The limit.
        limit: usize,
    },
}

/// A worker's KV-event endpoint that cannot be subscribed to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointError {
    /// Not `tcp://host:port`.
    #[error("kv event endpoint {endpoint:?} is not tcp://host:port")]
    Malformed {
        /// The endpoint as configured.
        endpoint: String,
    },
    /// Base port plus the data-parallel rank does not fit in a port number.
    #[error("kv event endpoint {endpoint:?} has no port for data-parallel rank {rank}")]
    RankPortOverflow {
        /// The endpoint as configured.
        endpoint: String,
        /// The rank.
        rank: u32,
    },
}

/// A holder that cannot be registered in the index.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    /// Every holder slot of the model's tree is taken.
    #[error("model {model} already has the maximum of {limit} worker-rank holders")]
    TooManyHolders {
        /// The model.
        model: router_workers::ModelId,
        /// The limit.
        limit: u32,
    },
    /// The index already holds the most models its node bound is split between.
    #[error(
        "model {model} would be indexed beyond the {limit} models kv.max_index_nodes is split between"
    )]
    TooManyModels {
        /// The model.
        model: router_workers::ModelId,
        /// The limit.
        limit: usize,
    },
}
