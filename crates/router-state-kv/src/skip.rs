//! Why a message or an event was not applied, and counters per reason.

use std::fmt;

/// Why a message or an event was dropped instead of applied. Every drop is counted under one
/// of these; none of them stops a subscription.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum SkipReason {
    /// A ZeroMQ message without exactly 3 frames (or a replay reply without 3 or 4).
    FrameCount,
    /// A sequence frame that is not 8 bytes.
    SeqLength,
    /// A message whose topic does not start with the configured topic.
    TopicMismatch,
    /// A payload that is not a decodable event batch (bad msgpack, wrong shape, over a limit).
    Malformed,
    /// A message dropped because the applier queue was full (shows up as a gap too).
    QueueOverflow,
    /// An event type the router does not know.
    UnknownEventType,
    /// A known event type without a required field.
    InvalidEvent,
    /// `block_size` different from the worker's configured block size.
    BlockSizeMismatch,
    /// `token_ids` length is not `len(block_hashes) * block_size`.
    TokenCountMismatch,
    /// `parent_block_hash` names no block this worker-rank holds.
    UnknownParent,
    /// A KV-cache group that is not full attention.
    NotFullAttention,
    /// A KV-cache group other than the ones accepted for this worker-rank.
    OtherGroup,
    /// `locality: REMOTE`: blocks another engine holds.
    RemoteLocality,
    /// A `medium` this router does not know.
    UnknownMedium,
    /// Blocks whose extra keys (multimodal hashes, prompt embeddings, unknown salts) mean
    /// token ids alone do not identify them; they and the rest of their event are skipped.
    ExtraKeys,
    /// A local hash already used by a block with a different parent.
    HashConflict,
    /// The tree is at its node limit and nothing could be evicted.
    IndexFull,
    /// Events for a worker incarnation that was removed or replaced.
    StaleHolder,
    /// A message (live or replayed) whose frame header would have taken it past
    /// `max_message_bytes`: refused at that header, before anything was reserved for the
    /// frame, and the connection it came on dropped.
    TooLarge,
    /// A message with more frames than `max_frames_per_message`: refused at the first frame
    /// past it, and the connection it came on dropped.
    TooManyFrames,
}

impl SkipReason {
    /// Every reason, in declaration order.
    pub const ALL: [SkipReason; 20] = [
        SkipReason::FrameCount,
        SkipReason::SeqLength,
        SkipReason::TopicMismatch,
        SkipReason::Malformed,
        SkipReason::QueueOverflow,
        SkipReason::UnknownEventType,
        SkipReason::InvalidEvent,
        SkipReason::BlockSizeMismatch,
        SkipReason::TokenCountMismatch,
        SkipReason::UnknownParent,
        SkipReason::NotFullAttention,
        SkipReason::OtherGroup,
        SkipReason::RemoteLocality,
        SkipReason::UnknownMedium,
        SkipReason::ExtraKeys,
        SkipReason::HashConflict,
        SkipReason::IndexFull,
        SkipReason::StaleHolder,
        SkipReason::TooLarge,
        SkipReason::TooManyFrames,
    ];

    /// A snake_case label for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::FrameCount => "frame_count",
            SkipReason::SeqLength => "seq_length",
            SkipReason::TopicMismatch => "topic_mismatch",
            SkipReason::Malformed => "malformed",
            SkipReason::QueueOverflow => "queue_overflow",
            SkipReason::UnknownEventType => "unknown_event_type",
            SkipReason::InvalidEvent => "invalid_event",
            SkipReason::BlockSizeMismatch => "block_size_mismatch",
            SkipReason::TokenCountMismatch => "token_count_mismatch",
            SkipReason::UnknownParent => "unknown_parent",
            SkipReason::NotFullAttention => "not_full_attention",
            SkipReason::OtherGroup => "other_group",
            SkipReason::RemoteLocality => "remote_locality",
            SkipReason::UnknownMedium => "unknown_medium",
            SkipReason::ExtraKeys => "extra_keys",
            SkipReason::HashConflict => "hash_conflict",
            SkipReason::IndexFull => "index_full",
            SkipReason::StaleHolder => "stale_holder",
            SkipReason::TooLarge => "too_large",
            SkipReason::TooManyFrames => "too_many_frames",
        }
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A count per [`SkipReason`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SkipCounts([u64; SkipReason::ALL.len()]);

impl SkipCounts {
    /// Adds `n` under `reason`.
    pub fn add(&mut self, reason: SkipReason, n: u64) {
        self.0[reason as usize] += n;
    }

    /// The count for `reason`.
    pub fn get(&self, reason: SkipReason) -> u64 {
        self.0[reason as usize]
    }

    /// The sum over all reasons.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Non-zero counts, by reason.
    pub fn iter(&self) -> impl Iterator<Item = (SkipReason, u64)> + '_ {
        SkipReason::ALL.into_iter().map(|r| (r, self.get(r))).filter(|(_, n)| *n > 0)
    }
}
