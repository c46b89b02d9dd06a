//! KV-event subscriptions that follow the worker registry.
//!
//! [`KvSubscriptions::run`] subscribes to every worker with `kv_events` configured, one SUB
//! socket per (worker, data-parallel rank) in its own task, and keeps following the
//! registry's change feed: an added worker is subscribed, a removed or replaced one is
//! unsubscribed and its blocks purged from the index. Events still in flight for a removed
//! incarnation are refused by the index.

mod applier;
mod replay;
mod socket;
mod stats;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use router_workers::{RegistryEvent, Worker, WorkerId, WorkerRegistry};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use self::stats::{KvStats, RankSnapshot, WorkerSummary};

use self::applier::{Applier, Sequencer};
use self::socket::{QueuedBytes, Target, rank_endpoint};
use crate::KvIndex;
use crate::wire::DecodeLimits;

/// Subscription settings.
#[derive(Clone, Debug, PartialEq)]
pub struct SubscriptionConfig {
    /// Batches buffered between a socket and its applier; overflow is dropped and shows up
    /// as a gap.
    pub queue_capacity: usize,
    /// How long one connect attempt (SUB or replay DEALER) may take.
    pub connect_timeout: Duration,
    /// First delay before retrying a failed connect; doubles per failure.
    pub reconnect_backoff_initial: Duration,
    /// Longest delay between connect attempts.
    pub reconnect_backoff_max: Duration,
    /// How long to wait for each replay reply.
    pub replay_timeout: Duration,
    /// Most batches one replay may deliver.
    pub replay_max_batches: usize,
    /// Largest message a publisher (SUB) or replay (DEALER) connection may send, in bytes:
    /// every frame header is checked before anything is reserved for the frame, and one that
    /// would take its message past this bound drops the connection (counted as
    /// [`SkipReason::TooLarge`](crate::SkipReason::TooLarge)). It bounds each frame too.
    /// Keep [`DecodeLimits::max_payload_bytes`] at it ([`SubscriptionConfig::with_message_limits`]).
    pub max_message_bytes: usize,
    /// Most frames in one message; a frame header past it drops the connection (counted as
    /// [`SkipReason::TooManyFrames`](crate::SkipReason::TooManyFrames)). Live messages have
    /// 3 frames and replay replies 3 or 4.
    pub max_frames_per_message: usize,
    /// Decoder bounds.
    pub limits: DecodeLimits,
}

impl SubscriptionConfig {
    /// The defaults with `max_message_bytes` (which the decoder's payload limit follows) and
    /// `max_frames_per_message`.
    pub fn with_message_limits(max_message_bytes: usize, max_frames_per_message: usize) -> Self {
        let defaults = Self::default();
        Self {
            max_message_bytes,
            max_frames_per_message,
            limits: DecodeLimits { max_payload_bytes: max_message_bytes, ..defaults.limits },
            ..defaults
        }
    }

    /// Payload bytes that may wait between a socket and its applier: twice the largest
    /// message, so that a publisher outrunning the applier with large messages holds a
    /// bounded amount of memory (the rest is dropped, counted as a queue overflow).
    pub(crate) fn queue_max_bytes(&self) -> usize {
        self.max_message_bytes.saturating_mul(2)
    }
}

impl Default for SubscriptionConfig {
    fn default() -> Self {
        Self {
            queue_capacity: 4096,
            connect_timeout: Duration::from_millis(250),
            reconnect_backoff_initial: Duration::from_millis(50),
            reconnect_backoff_max: Duration::from_secs(2),
            replay_timeout: Duration::from_secs(2),
            replay_max_batches: 20_000,
            max_message_bytes: DecodeLimits::default().max_payload_bytes,
            max_frames_per_message: 16,
            limits: DecodeLimits::default(),
        }
    }
}

/// A subscribed worker incarnation.
struct Running {
    incarnation: u64,
    cancel: CancellationToken,
}

/// Follows the registry and keeps one subscription per (worker, rank) with `kv_events`.
///
/// Build it, take [`KvSubscriptions::stats`], then drive [`KvSubscriptions::run`] in a task the
/// server owns; nothing is spawned before `run`.
pub struct KvSubscriptions {
    index: Arc<KvIndex>,
    registry: Arc<WorkerRegistry>,
    config: Arc<SubscriptionConfig>,
    stats: KvStats,
}

impl std::fmt::Debug for KvSubscriptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvSubscriptions").field("config", &self.config).finish_non_exhaustive()
    }
}

impl KvSubscriptions {
    /// Subscriptions feeding `index` for the workers of `registry`.
    pub fn new(
        index: Arc<KvIndex>,
        registry: Arc<WorkerRegistry>,
        config: SubscriptionConfig,
    ) -> Self {
        Self { index, registry, config: Arc::new(config), stats: KvStats::default() }
    }

    /// The counters of every subscription, shared with the running tasks.
    pub fn stats(&self) -> KvStats {
        self.stats.clone()
    }

    /// Runs until `cancel` fires, then stops every subscription task and waits for them.
    pub async fn run(self, cancel: CancellationToken) {
        let tracker = TaskTracker::new();
        let mut running: HashMap<WorkerId, Running> = HashMap::new();
        let (workers, mut feed) = self.registry.follow();
        self.resync(&workers, &mut running, &tracker, &cancel);
        loop {
            let event = tokio::select! {
                () = cancel.cancelled() => break,
                event = feed.recv() => event,
            };
            match event {
                Ok(RegistryEvent::Added(worker)) => {
                    self.start(&worker, &mut running, &tracker, &cancel);
                }
                Ok(RegistryEvent::Removed(worker)) => self.stop(&worker, &mut running),
                Ok(
                    RegistryEvent::HealthChanged { .. }
                    | RegistryEvent::DrainChanged { .. }
                    | RegistryEvent::StatusReported { .. },
                ) => {}
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "worker registry feed lagged; resynchronising");
                    let (workers, resumed) = self.registry.follow();
                    feed = resumed;
                    self.resync(&workers, &mut running, &tracker, &cancel);
                }
                Err(broadcast::error::RecvError::Closed) => {
                    cancel.cancelled().await;
                    break;
                }
            }
        }
        for run in running.values() {
            run.cancel.cancel();
        }
        tracker.close();
        tracker.wait().await;
    }

    /// Makes the running set match `workers` exactly.
    fn resync(
        &self,
        workers: &[Arc<Worker>],
        running: &mut HashMap<WorkerId, Running>,
        tracker: &TaskTracker,
        cancel: &CancellationToken,
    ) {
        let current: HashMap<&WorkerId, u64> =
            workers.iter().map(|w| (w.id(), w.incarnation())).collect();
        let stale: Vec<(WorkerId, u64)> = running
            .iter()
            .filter(|(id, run)| current.get(id) != Some(&run.incarnation))
            .map(|(id, run)| (id.clone(), run.incarnation))
            .collect();
        for (id, incarnation) in stale {
            self.stop_incarnation(&id, incarnation, running);
        }
        for worker in workers {
            if !running.contains_key(worker.id()) {
                self.start(worker, running, tracker, cancel);
            }
        }
    }

    fn start(
        &self,
        worker: &Arc<Worker>,
        running: &mut HashMap<WorkerId, Running>,
        tracker: &TaskTracker,
        cancel: &CancellationToken,
    ) {
        let (Some(spec), Some(block_size)) = (worker.kv_events(), worker.block_size()) else {
            return;
        };
        if let Some(previous) = running.get(worker.id()) {
            let incarnation = previous.incarnation;
            self.stop_incarnation(worker.id(), incarnation, running);
        }
        let token = cancel.child_token();
        for rank in 0..worker.dp_size() {
            let endpoints = rank_endpoint(&spec.endpoint, rank, spec.bind).and_then(|sub| {
                let replay = spec
                    .replay_endpoint
                    .as_deref()
                    .map(|replay| rank_endpoint(replay, rank, false))
                    .transpose()?;
                Ok((sub, replay))
            });
            let (endpoint, replay) = match endpoints {
                Ok(endpoints) => endpoints,
                Err(error) => {
                    tracing::error!(worker = %worker.id(), rank, %error,
                        "cannot subscribe to kv events");
                    continue;
                }
            };
            let stats =
                self.stats.register(worker.id(), worker.incarnation(), rank, endpoint.clone());
            let mut holders = Vec::new();
            for model in worker.models() {
                match self.index.holder(model, worker.id(), worker.incarnation(), rank, block_size)
                {
                    Ok(holder) => holders.push(holder),
                    Err(error) => tracing::error!(worker = %worker.id(), rank, %error,
                        "cannot index kv events"),
                }
            }
            stats.set_holders(holders.iter().map(crate::Holder::view).collect());
            let target = Target { endpoint, replay, topic: spec.topic.clone(), bind: spec.bind };
            let (tx, rx) = mpsc::channel(self.config.queue_capacity.max(1));
            let queued = Arc::new(QueuedBytes::new(self.config.queue_max_bytes()));
            let applier = Applier {
                holders,
                stats: Arc::clone(&stats),
                target: target.clone(),
                config: Arc::clone(&self.config),
                sequence: Sequencer::new(target.replay.is_some()),
                queued: Arc::clone(&queued),
            };
            tracker.spawn(applier.run(rx, token.clone()));
            tracker.spawn(socket::receive(
                target,
                socket::Queue { frames: tx, bytes: queued },
                stats,
                Arc::clone(&self.config),
                token.clone(),
            ));
        }
        running.insert(
            worker.id().clone(),
            Running { incarnation: worker.incarnation(), cancel: token },
        );
    }

    fn stop(&self, worker: &Arc<Worker>, running: &mut HashMap<WorkerId, Running>) {
        self.stop_incarnation(worker.id(), worker.incarnation(), running);
    }

    fn stop_incarnation(
        &self,
        id: &WorkerId,
        incarnation: u64,
        running: &mut HashMap<WorkerId, Running>,
    ) {
        if running.get(id).is_some_and(|run| run.incarnation == incarnation)
            && let Some(run) = running.remove(id)
        {
            run.cancel.cancel();
        }
        let purged = self.index.remove_incarnation(id, incarnation);
        self.stats.unregister(id, incarnation);
        tracing::debug!(worker = %id, incarnation, purged, "kv event subscription stopped");
    }
}
