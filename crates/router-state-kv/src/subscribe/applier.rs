//! The apply side of one subscription: sequence tracking, replay, decoding, index updates.
//!
//! Rules, per (worker, rank):
//! - `seq == last + 1` (or `0` on a fresh subscription): apply.
//! - `seq > last + 1`, or a first batch after `0`: a gap. With a replay endpoint, replay from
//!   `last + 1` and apply what comes back in order; whatever replay cannot supply is lost
//!   history: clear this worker-rank's blocks, count the lost batches, continue.
//! - `seq <= last`: batches already applied through a replay are skipped as duplicates;
//!   anything else means the publisher restarted: clear, then treat the batch as the first of
//!   a fresh subscription.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::SubscriptionConfig;
use super::replay::{ReplayItem, ReplaySession};
use super::socket::Target;
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
    last: Option<u64>,
    /// Live batches in this range were already applied through a replay.
    replayed: Option<(u64, u64)>,
}

impl Sequencer {
    pub(crate) fn last(&self) -> Option<u64> {
        self.last
    }

    pub(crate) fn expected(&self) -> u64 {
        self.last.map_or(0, |last| last.saturating_add(1))
    }

    pub(crate) fn classify(&self, seq: u64) -> Verdict {
        let expected = self.expected();
        if seq == expected {
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
        *self = Self::default();
    }
}

/// Applies one subscription's batches to its holders (one per model the worker serves).
pub(crate) struct Applier {
    pub(crate) holders: Vec<Holder>,
    pub(crate) stats: Arc<RankStats>,
    pub(crate) target: Target,
    pub(crate) config: Arc<SubscriptionConfig>,
    pub(crate) sequence: Sequencer,
}

impl Applier {
    /// Applies queued batches until cancelled or the receiver is gone.
    pub(crate) async fn run(mut self, mut queue: mpsc::Receiver<Frame>, cancel: CancellationToken) {
        loop {
            let frame = tokio::select! {
                () = cancel.cancelled() => return,
                frame = queue.recv() => frame,
            };
            let Some(frame) = frame else { return };
            self.on_live(frame, &cancel).await;
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
        if frame.seq > expected {
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
        let mut session = ReplaySession::open(
            endpoint,
            start,
            config.connect_timeout,
            config.replay_timeout,
            config.replay_max_batches,
        )
        .await?;
        loop {
            let item = tokio::select! {
                () = cancel.cancelled() => return Ok(()),
                item = session.next() => item?,
            };
            match item {
                None => return Ok(()),
                Some(ReplayItem::Batch(frame)) => {
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

    fn on_replayed(&mut self, frame: &Frame) {
        let expected = self.sequence.expected();
        if frame.seq < expected {
            return;
        }
        if frame.seq > expected {
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
    use super::*;

    #[test]
    fn sequence_verdicts() {
        let mut s = Sequencer::default();
        assert_eq!(s.classify(0), Verdict::Apply);
        assert_eq!(s.classify(5), Verdict::Gap { expected: 0 });
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
