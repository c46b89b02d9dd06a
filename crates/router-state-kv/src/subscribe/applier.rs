//! The apply side of one subscription: sequence tracking, replay, decoding, index updates.
//!
//! Rules, per (worker, rank):
//! - A fresh subscription with a replay endpoint first replays the publisher's buffer from
//!   sequence 0, so that blocks cached before the router subscribed are known (vLLM keeps 10000
//!   batches and never re-announces a block). Whatever comes first, replayed or live, starts
//!   the sequence: a publisher that was running before the subscription sent its earlier
//!   batches to nobody, which is no lost history. The one exception: a first live batch past
//!   0 when the catch-up found nothing is a gap from 0 (the publisher came up after the
//!   catch-up, and its first batches fell into ZeroMQ's slow-joiner window), replayed as any
//!   other; without a replay endpoint it is simply applied.
//! - `seq == last + 1`: apply.
//! - `seq > last + 1`: a gap. With a replay endpoint, replay from `last + 1` and apply what
//!   comes back in order; whatever replay cannot supply is lost history: clear this
//!   worker-rank's blocks, count the lost batches, continue.
//! - `seq <= last`: batches already applied through a replay are skipped as duplicates;
//!   anything else means the publisher restarted: clear, then treat the batch as the first of
//!   a fresh subscription.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::SubscriptionConfig;
use super::replay::{ReplayItem, ReplaySession};
use super::socket::{QueuedBytes, Target};
use super::stats::RankStats;
use crate::wire::decode_batch;
use crate::wire::frames::Frame;
use crate::{ApplyReport, FrameError, Holder, SkipReason};

/// What to do with a batch, given the sequence so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Apply,
    Duplicate,
    Gap { expected: u64 },
    Restart,
}

/// Sequence state of one subscription.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sequencer {
    /// A replay endpoint can fill a fresh subscription's gap from 0.
    replayable: bool,
    last: Option<u64>,
    /// Live batches in this range were already applied through a replay.
    replayed: Option<(u64, u64)>,
}

impl Sequencer {
    /// A sequencer for a subscription with (`replayable`) or without a replay endpoint.
    pub(crate) fn new(replayable: bool) -> Self {
        Self { replayable, ..Self::default() }
    }

    pub(crate) fn last(&self) -> Option<u64> {
        self.last
    }

    pub(crate) fn expected(&self) -> u64 {
        self.last.map_or(0, |last| last.saturating_add(1))
    }

    pub(crate) fn classify(&self, seq: u64) -> Verdict {
        let expected = self.expected();
        if seq == expected || (self.last.is_none() && !self.replayable) {
            Verdict::Apply
        } else if seq > expected {
            Verdict::Gap { expected }
        } else if self.replayed.is_some_and(|(lo, hi)| (lo..=hi).contains(&seq)) {
            Verdict::Duplicate
        } else {
            Verdict::Restart
        }
    }

    pub(crate) fn consumed(&mut self, seq: u64) {
        self.last = Some(seq);
        if self.replayed.is_some_and(|(_, hi)| seq > hi) {
            self.replayed = None;
        }
    }

    pub(crate) fn mark_replayed(&mut self, from: u64) {
        self.replayed = self.last.filter(|last| *last >= from).map(|last| (from, last));
    }

    pub(crate) fn reset(&mut self) {
        *self = Self::new(self.replayable);
    }
}

/// Applies one subscription's batches to its holders (one per model the worker serves).
pub(crate) struct Applier {
    pub(crate) holders: Vec<Holder>,
    pub(crate) stats: Arc<RankStats>,
    pub(crate) target: Target,
    pub(crate) config: Arc<SubscriptionConfig>,
    pub(crate) sequence: Sequencer,
    /// The payload bytes of the queue, given back as each batch is done with.
    pub(crate) queued: Arc<QueuedBytes>,
}

impl Applier {
    /// Replays what the publisher still holds (with a replay endpoint), then applies queued
    /// batches until cancelled or the receiver is gone.
    pub(crate) async fn run(mut self, mut queue: mpsc::Receiver<Frame>, cancel: CancellationToken) {
        if let Some(endpoint) = self.target.replay.clone() {
            self.catch_up(&endpoint, &cancel).await;
        }
        loop {
            let frame = tokio::select! {
                () = cancel.cancelled() => return,
                frame = queue.recv() => frame,
            };
            let Some(frame) = frame else { return };
            self.stats.heard();
            let size = frame.payload.len();
            self.on_live(frame, &cancel).await;
            self.queued.release(size);
            self.stats.set_last_seq(self.sequence.last());
            self.stats.tick();
        }
    }

    async fn on_live(&mut self, frame: Frame, cancel: &CancellationToken) {
        loop {
            match self.sequence.classify(frame.seq) {
                Verdict::Apply => self.apply(&frame),
                Verdict::Duplicate => self.stats.duplicate(),
                Verdict::Gap { expected } => self.fill_gap(expected, frame, cancel).await,
                Verdict::Restart => {
                    tracing::info!(worker = %self.stats.worker, rank = self.stats.rank,
                        seq = frame.seq, last = ?self.sequence.last(),
                        "kv event sequence went back: publisher restarted, clearing");
                    self.stats.restarted();
                    self.clear();
                    self.sequence.reset();
                    continue;
                }
            }
            return;
        }
    }

    /// A fresh subscription's replay from sequence 0: the publisher's whole buffer, applied
    /// before the live batches queued meanwhile (those it covered become duplicates). A
    /// publisher that is not up yet is no failure: its first live batch starts the sequence.
    async fn catch_up(&mut self, endpoint: &str, cancel: &CancellationToken) {
        self.stats.replay_started();
        match self.replay(endpoint, 0, cancel).await {
            Ok(()) => {
                tracing::info!(worker = %self.stats.worker, rank = self.stats.rank,
                    last = ?self.sequence.last(), "kv event history replayed at subscription");
            }
            Err(error) => {
                self.stats.replay_failed();
                tracing::debug!(worker = %self.stats.worker, rank = self.stats.rank, %error,
                    "kv event replay at subscription failed; following live batches");
            }
        }
        self.sequence.mark_replayed(0);
        self.stats.set_last_seq(self.sequence.last());
        self.stats.tick();
    }

    async fn fill_gap(&mut self, expected: u64, frame: Frame, cancel: &CancellationToken) {
        self.stats.gap();
        if let Some(endpoint) = self.target.replay.clone() {
            self.stats.replay_started();
            if let Err(error) = self.replay(&endpoint, expected, cancel).await {
                self.stats.replay_failed();
                tracing::warn!(worker = %self.stats.worker, rank = self.stats.rank, %error,
                    "kv event replay failed");
            }
            self.sequence.mark_replayed(frame.seq);
        }
        let expected = self.sequence.expected();
        if frame.seq < expected {
            self.stats.duplicate();
            return;
        }
        // Nothing known yet: what the replay could not bring was sent before we listened.
        if frame.seq > expected && self.sequence.last().is_some() {
            self.lose(frame.seq - expected);
        }
        self.apply(&frame);
    }

    async fn replay(
        &mut self,
        endpoint: &str,
        start: u64,
        cancel: &CancellationToken,
    ) -> Result<(), crate::ReplayError> {
        let config = Arc::clone(&self.config);
        let mut session = ReplaySession::open(endpoint, start, &config)
            .await
            .inspect_err(|error| self.refused(error))?;
        loop {
            let item = tokio::select! {
                () = cancel.cancelled() => return Ok(()),
                item = session.next() => item.inspect_err(|error| self.refused(error))?,
            };
            match item {
                None => return Ok(()),
                Some(ReplayItem::Batch(frame)) => {
                    self.stats.heard();
                    self.stats.replayed();
                    self.on_replayed(&frame);
                }
                Some(ReplayItem::Bad(FrameError::BadSeqLength { .. })) => {
                    self.stats.skip(SkipReason::SeqLength);
                }
                Some(ReplayItem::Bad(_)) => self.stats.skip(SkipReason::FrameCount),
            }
        }
    }

    /// Counts a replay whose reply was refused for its size, and says so once per connection
    /// (the refusal closed it; the replay counts as failed).
    fn refused(&self, error: &crate::ReplayError) {
        if let Some(reason) = error.refusal() {
            self.stats.skip(reason);
            tracing::warn!(worker = %self.stats.worker, rank = self.stats.rank, %error,
                reason = %reason, "kv event replay reply over the configured limit \
                (kv.max_message_bytes, kv.max_frames_per_message); connection dropped");
        }
    }

    fn on_replayed(&mut self, frame: &Frame) {
        let expected = self.sequence.expected();
        let fresh = self.sequence.last().is_none();
        if frame.seq < expected && !fresh {
            return;
        }
        if frame.seq > expected && !fresh {
            self.lose(frame.seq - expected);
        }
        let topic = frame.topic.as_deref().unwrap_or(self.target.topic.as_bytes());
        if !topic.starts_with(self.target.topic.as_bytes()) {
            self.stats.skip(SkipReason::TopicMismatch);
            self.sequence.consumed(frame.seq);
            return;
        }
        self.apply(frame);
    }

    /// History is gone: forget this worker-rank's blocks rather than keep a wrong picture.
    fn lose(&mut self, batches: u64) {
        tracing::info!(worker = %self.stats.worker, rank = self.stats.rank, batches,
            "kv event history lost, clearing");
        self.stats.lost(batches);
        self.clear();
    }

    fn clear(&mut self) {
        for holder in &self.holders {
            holder.clear();
        }
        self.stats.cleared();
    }

    fn apply(&mut self, frame: &Frame) {
        self.sequence.consumed(frame.seq);
        let batch = match decode_batch(&frame.payload, &self.config.limits) {
            Ok(batch) => batch,
            Err(error) => {
                tracing::debug!(worker = %self.stats.worker, rank = self.stats.rank,
                    seq = frame.seq, %error, "kv event batch skipped");
                self.stats.skip(SkipReason::Malformed);
                return;
            }
        };
        if batch.dp_rank.is_some_and(|rank| rank != i64::from(self.stats.rank)) {
            self.stats.rank_mismatch();
        }
        let mut first: Option<ApplyReport> = None;
        for holder in &self.holders {
            let report = holder.apply(&batch.events);
            first.get_or_insert(report);
        }
        if let Some(report) = first {
            self.stats.applied(&report);
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use rmpv::Value;
    use router_workers::{ModelId, WorkerId};

    use super::*;
    use crate::hash::Salt;
    use crate::{KvIndex, KvStats};

    fn payload(hash: u64, tokens: &[u32]) -> Bytes {
        let event = Value::Map(vec![
            ("type".into(), "BlockStored".into()),
            ("block_hashes".into(), Value::Array(vec![hash.into()])),
            ("parent_block_hash".into(), Value::Nil),
            ("token_ids".into(), Value::Array(tokens.iter().map(|t| (*t).into()).collect())),
            ("block_size".into(), 2.into()),
        ]);
        let batch = Value::Array(vec![1.0.into(), Value::Array(vec![event]), 0.into()]);
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, &batch).expect("encode");
        out.into()
    }

    fn frame(seq: u64, payload: Bytes) -> Frame {
        Frame { topic: Some(Bytes::new()), seq, payload }
    }

    fn applier(index: &KvIndex, stats: &KvStats) -> Applier {
        let worker = WorkerId::new("w").expect("id");
        let holder = index.holder(&ModelId::new("m"), &worker, 1, 0, 2).expect("register");
        let rank_stats = stats.register(&worker, 1, 0, "tcp://127.0.0.1:1".into());
        rank_stats.set_holders(vec![holder.view()]);
        Applier {
            stats: rank_stats,
            holders: vec![holder],
            target: Target {
                endpoint: String::new(),
                replay: None,
                topic: String::new(),
                bind: false,
            },
            config: Arc::new(SubscriptionConfig::default()),
            sequence: Sequencer::default(),
            queued: Arc::new(QueuedBytes::new(usize::MAX)),
        }
    }

    fn held(index: &KvIndex, tokens: &[u32]) -> u32 {
        let worker = WorkerId::new("w").expect("id");
        index.lookup_tokens(&ModelId::new("m"), tokens, 2, Salt::default()).blocks(&worker)
    }

    #[tokio::test]
    async fn without_replay_a_gap_clears_and_a_restart_starts_over() {
        let index = KvIndex::default();
        let stats = KvStats::default();
        let mut applier = applier(&index, &stats);
        let cancel = CancellationToken::new();
        applier.on_live(frame(0, payload(1, &[1, 1])), &cancel).await;
        assert_eq!(held(&index, &[1, 1]), 1);
        // Batch 1 never arrives: the picture may be wrong, so it is dropped.
        applier.on_live(frame(2, payload(2, &[2, 2])), &cancel).await;
        assert_eq!((held(&index, &[1, 1]), held(&index, &[2, 2])), (0, 1));
        // A malformed batch is skipped but consumes its sequence number.
        applier.on_live(frame(3, Bytes::from_static(b"\xc1")), &cancel).await;
        applier.on_live(frame(4, payload(4, &[4, 4])), &cancel).await;
        assert_eq!(held(&index, &[4, 4]), 1);
        // The publisher restarted: sequence 0 again.
        applier.on_live(frame(0, payload(9, &[9, 9])), &cancel).await;
        assert_eq!((held(&index, &[2, 2]), held(&index, &[9, 9])), (0, 1));
        let snapshot = &stats.ranks()[0];
        assert_eq!((snapshot.gaps, snapshot.lost_batches, snapshot.restarts), (1, 1, 1));
        assert_eq!(snapshot.clears, 2);
        assert_eq!(snapshot.skipped.get(SkipReason::Malformed), 1);
        assert_eq!(snapshot.blocks, 1);
        assert_eq!(applier.sequence.last(), Some(0));
    }

    /// A router that subscribes to a running engine: its first batch is the engine's 4242nd.
    #[tokio::test]
    async fn a_fresh_subscriptions_first_batch_is_applied_not_taken_for_lost_history() {
        let index = KvIndex::default();
        let stats = KvStats::default();
        let mut applier = applier(&index, &stats);
        let cancel = CancellationToken::new();
        applier.on_live(frame(4242, payload(1, &[1, 1])), &cancel).await;
        applier.on_live(frame(4243, payload(2, &[2, 2])), &cancel).await;
        assert_eq!((held(&index, &[1, 1]), held(&index, &[2, 2])), (1, 1));
        let snapshot = &stats.ranks()[0];
        assert_eq!((snapshot.gaps, snapshot.lost_batches, snapshot.clears), (0, 0, 0));
    }

    #[test]
    fn sequence_verdicts() {
        let replayable = Sequencer::new(true);
        assert_eq!(replayable.classify(5), Verdict::Gap { expected: 0 }, "replayed from 0");
        let mut s = Sequencer::default();
        assert_eq!(s.classify(0), Verdict::Apply);
        assert_eq!(s.classify(5), Verdict::Apply, "a fresh subscription starts anywhere");
        s.consumed(0);
        assert_eq!(s.classify(1), Verdict::Apply);
        assert_eq!(s.classify(3), Verdict::Gap { expected: 1 });
        assert_eq!(s.classify(0), Verdict::Restart, "seq went back");
        s.consumed(1);
        assert_eq!(s.classify(1), Verdict::Restart, "a repeat outside a replay is a restart");
    }

    #[test]
    fn live_batches_covered_by_a_replay_are_duplicates_until_the_stream_passes_them() {
        let mut s = Sequencer::default();
        s.consumed(4);
        // Live 7 showed a gap; replay delivered 5..=9.
        for seq in 5..=9 {
            s.consumed(seq);
        }
        s.mark_replayed(7);
        assert_eq!(s.classify(8), Verdict::Duplicate);
        assert_eq!(s.classify(9), Verdict::Duplicate);
        assert_eq!(s.classify(6), Verdict::Restart, "below the live gap point: a restart");
        assert_eq!(s.classify(10), Verdict::Apply);
        s.consumed(10);
        assert_eq!(s.classify(8), Verdict::Restart, "the window closes once passed");
        s.reset();
        assert_eq!(s.last(), None);
    }
}
