//! KV-cache events: what the engine tells routers about its prefix cache, encoded the way
//! vLLM and SGLang publishers encode them (with this crate's own msgpack writer, never the
//! router's decoder), published on a ZeroMQ PUB socket with a replay ROUTER.

mod encode;
mod publisher;

use std::fmt;
use std::str::FromStr;

pub use encode::encode_batch;
pub(crate) use publisher::{BoundEndpoints, Publisher, PublisherOptions, start_ranks};

/// The wire form of the events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvFormat {
    /// Current vLLM (>= 0.24): map-encoded events, u64 hashes.
    #[default]
    Vllm,
    /// Older vLLM (0.23): array-encoded events, u64 hashes.
    VllmLegacy,
    /// Current SGLang (>= 0.5.20): map-encoded events, i64 hashes.
    Sglang,
    /// Older SGLang (0.5.15): array-encoded events, i64 hashes.
    SglangLegacy,
}

impl KvFormat {
    /// Every format, in the order of the command-line help.
    pub const ALL: [KvFormat; 4] =
        [KvFormat::Vllm, KvFormat::VllmLegacy, KvFormat::Sglang, KvFormat::SglangLegacy];

    /// The command-line spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            KvFormat::Vllm => "vllm",
            KvFormat::VllmLegacy => "vllm-legacy",
            KvFormat::Sglang => "sglang",
            KvFormat::SglangLegacy => "sglang-legacy",
        }
    }
}

impl fmt::Display for KvFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `--kv-format` value that names no format.
#[derive(Debug, thiserror::Error)]
#[error("unknown kv format {0:?} (expected vllm, vllm-legacy, sglang or sglang-legacy)")]
pub struct UnknownKvFormat(pub String);

impl FromStr for KvFormat {
    type Err = UnknownKvFormat;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        KvFormat::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| UnknownKvFormat(s.to_owned()))
    }
}

/// One change of the engine's prefix cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// Consecutive blocks entered the cache (GPU tier).
    Stored {
        /// Engine hashes of the blocks, in order.
        hashes: Vec<u64>,
        /// Hash of the block before the first one; `None` at the root.
        parent: Option<u64>,
        /// The blocks' tokens, concatenated (`hashes.len() * block_size`).
        token_ids: Vec<u32>,
    },
    /// Blocks were evicted.
    Removed {
        /// Engine hashes of the evicted blocks.
        hashes: Vec<u64>,
    },
    /// The whole cache was dropped.
    Cleared,
}

#[cfg(test)]
mod tests;
