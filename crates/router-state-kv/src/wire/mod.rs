//! The KV-event wire format engines publish: ZeroMQ frames and msgpack event batches.
//!
//! [`decode_batch`] turns a payload into an [`EventBatch`] of [`Event`]s, accepting the map
//! form (`{"type": ..., ...}`, vLLM >= 0.24, SGLang >= 0.5.20) and the array form (tag first,
//! older releases), hashes as u64, i64 or bytes (normalised by [`normalise_bytes_hash`]), and
//! token pairs. Unknown keys and trailing elements are ignored; unknown event types become
//! [`Event::Unknown`]. Every length is checked against [`DecodeLimits`] before anything is
//! allocated for it, and nesting depth is capped.
//!
//! [`frames`] parses the ZeroMQ multipart messages around the payload.

mod decode;
pub mod frames;

pub use decode::decode_batch;

use crate::Medium;

/// Bounds applied while decoding, so a hostile or broken publisher cannot make the router
/// allocate or recurse without limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Largest payload accepted, in bytes.
    pub max_payload_bytes: usize,
    /// Most events in one batch.
    pub max_events: usize,
    /// Most block hashes in one event.
    pub max_blocks_per_event: usize,
    /// Most token ids in one event.
    pub max_tokens_per_event: usize,
    /// Longest string field, in bytes.
    pub max_string_bytes: usize,
    /// Deepest msgpack nesting.
    pub max_depth: usize,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        Self {
            max_payload_bytes: 64 << 20,
            max_events: 1 << 16,
            max_blocks_per_event: 1 << 16,
            max_tokens_per_event: 1 << 22,
            max_string_bytes: 4096,
            max_depth: 32,
        }
    }
}

/// One published batch: `[ts, events, dp_rank]`.
#[derive(Clone, Debug, PartialEq)]
pub struct EventBatch {
    /// Publisher timestamp (seconds since the epoch, engine clock). Never compared with
    /// router time.
    pub ts: f64,
    /// The events, in the order they happened.
    pub events: Vec<Event>,
    /// The data-parallel rank that published, when the batch says.
    pub dp_rank: Option<i64>,
}

/// One KV-cache event.
#[derive(Clone, Debug, PartialEq)]
#[expect(
    clippy::large_enum_variant,
    reason = "almost every event is a BlockStored; boxing would add an allocation per event"
)]
pub enum Event {
    /// Blocks were stored (`BlockStored`).
    Stored(BlockStored),
    /// Blocks were removed (`BlockRemoved`).
    Removed(BlockRemoved),
    /// Every block was dropped (`AllBlocksCleared`).
    AllCleared,
    /// An event type this router does not know; skipped and counted.
    Unknown,
    /// A known event type missing a required field; skipped and counted.
    Invalid {
        /// The event type.
        event: &'static str,
        /// The missing field.
        missing: &'static str,
    },
}

/// `BlockStored`: consecutive blocks now held, the first one's parent given by engine hash.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BlockStored {
    /// Engine hashes of the stored blocks, in order, normalised to u64.
    pub block_hashes: Vec<u64>,
    /// Engine hash of the block before the first one; `None` at the root.
    pub parent_block_hash: Option<u64>,
    /// `block_hashes.len() * block_size` token ids, concatenated. Token pairs are reduced to
    /// their first element.
    pub token_ids: Vec<u32>,
    /// Whether `token_ids` arrived as pairs (SGLang under speculative decoding).
    pub token_pairs: bool,
    /// Tokens per block, when sent.
    pub block_size: Option<i64>,
    /// Deprecated numeric LoRA id.
    pub lora_id: Option<i64>,
    /// Storage tier; `None` means GPU.
    pub medium: Option<MediumField>,
    /// LoRA adapter name.
    pub lora_name: Option<String>,
    /// Per-block extra hash keys (multimodal hashes, LoRA name, salt), when sent.
    pub extra_keys: Option<Vec<Option<Vec<ExtraKey>>>>,
    /// KV-cache group index of hybrid models.
    pub group_idx: Option<i64>,
    /// Kind of the group's KV-cache spec.
    pub kv_cache_spec_kind: Option<SpecKind>,
    /// Sliding window of the group's spec, if any.
    pub kv_cache_spec_sliding_window: Option<i64>,
    /// Whether the publisher holds the blocks itself.
    pub locality: Option<Locality>,
    /// Secondary offloading tier that generated the event.
    pub ownership: Option<String>,
    /// Session the blocks belong to.
    pub session_id: Option<String>,
    /// Speculative lookahead tokens (SGLang).
    pub lookahead_token_ids: Option<Vec<u32>>,
    /// Cache salt the blocks were hashed with.
    pub cache_salt: Option<String>,
}

/// `BlockRemoved`: blocks no longer held on a tier.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BlockRemoved {
    /// Engine hashes of the removed blocks, normalised to u64.
    pub block_hashes: Vec<u64>,
    /// Storage tier; `None` means GPU.
    pub medium: Option<MediumField>,
    /// KV-cache group index of hybrid models.
    pub group_idx: Option<i64>,
    /// Whether the publisher held the blocks itself.
    pub locality: Option<Locality>,
    /// Secondary offloading tier that generated the event.
    pub ownership: Option<String>,
}

/// A `medium` value: a known tier or a name this router does not know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MediumField {
    /// A known tier.
    Known(Medium),
    /// Some other name; events carrying it are skipped and counted.
    Unknown,
}

impl MediumField {
    /// The tier, with a missing field meaning GPU; `None` for an unknown name.
    pub fn resolve(field: Option<MediumField>) -> Option<Medium> {
        match field {
            None => Some(Medium::Gpu),
            Some(MediumField::Known(medium)) => Some(medium),
            Some(MediumField::Unknown) => None,
        }
    }
}

/// `kv_cache_spec_kind`, reduced to what the router needs to know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecKind {
    /// Full attention: `full_attention`, `mla_attention`, `sink_full_attention`.
    Full,
    /// Anything else (sliding window, mamba, chunked local, cross attention, ...).
    Other,
}

/// `locality` of stored or removed blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Locality {
    /// The publisher holds the blocks.
    Local,
    /// Another engine holds the blocks; the router skips these events.
    Remote,
    /// Some other value.
    Other,
}

/// One element of a block's extra keys tuple.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtraKey {
    /// A string (LoRA name, cache salt, multimodal hash).
    Str(String),
    /// Anything else (integers, bytes, nested values).
    Other,
}

/// Normalises a bytes hash to u64: the last 8 bytes, big-endian (shorter inputs are
/// left-padded with zeros).
pub fn normalise_bytes_hash(bytes: &[u8]) -> u64 {
    let tail = &bytes[bytes.len().saturating_sub(8)..];
    tail.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
}

/// Normalises a signed hash (SGLang) to u64 as two's complement.
pub fn normalise_signed_hash(hash: i64) -> u64 {
    u64::from_ne_bytes(hash.to_ne_bytes())
}

#[cfg(test)]
mod tests;
