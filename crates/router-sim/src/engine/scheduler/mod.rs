//! Continuous batching in simulated time.
//!
//! One loop per engine plays the accelerator. Each iteration admits waiting requests (up to
//! `max_running`, and as KV capacity allows), then runs one pass:
//! - a **prefill pass** when requests were just admitted: it lasts
//!   `uncached prompt tokens / prefill_tokens_per_sec` for the whole batch, after which each
//!   of them has its first token;
//! - otherwise a **decode step**: it lasts `1 / decode_tokens_per_sec` and gives one more
//!   token to every running request.
//!
//! Passes are laid end to end on a virtual clock and the loop sleeps on tokio timers until
//! each pass's end, so average rates hold even when a single sleep overshoots (the next
//! passes then run without sleeping until the clock catches up). With nothing to do the loop
//! waits for a submission.
//!
//! An engine with `--dp-size N` runs N schedulers, one per data-parallel rank, each with its own
//! cache, queue and KV-event publisher ([`Ranks`]). A request naming a rank goes there; the
//! others are spread over the ranks in turn, as SGLang's and vLLM's own balancers do by default.

mod state;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use state::SubmitError;
use state::{Pass, State};

use crate::engine::events::Publisher;
use crate::engine::load::{LoadSnapshot, RankLoad};

/// How much a pass costs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Timing {
    pub(crate) prefill_tokens_per_sec: f64,
    pub(crate) decode_tokens_per_sec: f64,
}

impl Timing {
    pub(crate) fn prefill(&self, uncached_tokens: u64) -> Duration {
        Duration::from_secs_f64(uncached_tokens as f64 / self.prefill_tokens_per_sec)
    }

    pub(crate) fn decode_step(&self) -> Duration {
        Duration::from_secs_f64(1.0 / self.decode_tokens_per_sec)
    }
}

/// How far the virtual clock may lag behind real time before the lag is forgotten (a
/// stalled process should not then run a burst of instant passes).
const MAX_LAG: Duration = Duration::from_millis(20);

/// What a request needs from the prompt onwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Prefill here (reusing the prefix cache), then decode.
    Full,
    /// PD decode: the KV came from a prefill engine, which had this much of it cached.
    Decode { cached_tokens: usize },
}

/// A request handed to the scheduler.
#[derive(Debug)]
pub(crate) struct Submission {
    pub(crate) prompt: Vec<u32>,
    /// The tokens to generate, in order; its length is the output length.
    pub(crate) output: Vec<u32>,
    pub(crate) kind: Kind,
    pub(crate) tx: mpsc::UnboundedSender<Progress>,
}

/// What a request's handler hears from the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Progress {
    /// The first output token, with the prompt tokens that were served from cache.
    First { cached_tokens: usize },
    /// One more output token.
    Token,
    /// The output is complete.
    Done,
}

/// The engine's scheduler: shared by the HTTP handlers (submit, load) and its loop.
#[derive(Debug)]
pub(crate) struct Scheduler {
    /// The data-parallel rank this scheduler plays.
    rank: u32,
    state: Mutex<State>,
    wake: Notify,
    timing: Timing,
    publisher: Option<Publisher>,
}

impl Scheduler {
    pub(crate) fn new(
        rank: u32,
        block_size: usize,
        capacity_tokens: usize,
        max_running: usize,
        caching: bool,
        timing: Timing,
        publisher: Option<Publisher>,
    ) -> Self {
        Self {
            rank,
            state: Mutex::new(State::new(block_size, capacity_tokens, max_running, caching)),
            wake: Notify::new(),
            timing,
            publisher,
        }
    }

    /// Queues a request; progress arrives on the submission's channel.
    pub(crate) fn submit(&self, submission: Submission) -> Result<(), SubmitError> {
        self.state.lock().submit(submission)?;
        self.wake.notify_one();
        Ok(())
    }

    /// Longest output that fits beside a prompt of `prompt` tokens.
    pub(crate) fn output_room(&self, prompt: usize) -> Option<usize> {
        self.state.lock().output_room(prompt)
    }

    /// The load right now: a lock and a pass over the running batch.
    pub(crate) fn load(&self) -> RankLoad {
        self.state.lock().load(self.rank, Instant::now())
    }

    /// Drops the prefix cache (publishing `AllBlocksCleared`) if the engine is idle;
    /// otherwise the number of requests in the way.
    pub(crate) fn flush_cache(&self) -> Result<(), usize> {
        let mut state = self.state.lock();
        state.flush_cache()?;
        self.publish(&mut state);
        Ok(())
    }

    fn publish(&self, state: &mut State) {
        let events = state.take_events();
        if let Some(publisher) = &self.publisher {
            publisher.publish(events);
        }
    }

    /// Runs the loop until `cancel`.
    pub(crate) async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let mut clock = Instant::now();
        loop {
            let pass = {
                let mut state = self.state.lock();
                let pass = state.plan();
                if pass == Pass::Idle {
                    self.publish(&mut state);
                }
                pass
            };
            let duration = match pass {
                Pass::Idle => {
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        () = self.wake.notified() => {
                            // An idle engine starts the next pass now, with no lag to spend.
                            clock = Instant::now();
                            continue;
                        }
                    }
                }
                Pass::Prefill { uncached_tokens } => self.timing.prefill(uncached_tokens),
                Pass::Decode => self.timing.decode_step(),
            };
            let now = Instant::now();
            clock = clock.max(now.checked_sub(MAX_LAG).unwrap_or(now)) + duration;
            if clock > now {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep_until(clock) => {}
                }
            } else {
                tokio::task::yield_now().await;
            }
            let mut state = self.state.lock();
            match pass {
                Pass::Prefill { uncached_tokens } => {
                    state.finish_prefill(uncached_tokens, duration.as_micros() as u64);
                }
                Pass::Decode => state.finish_decode(clock),
                Pass::Idle => {}
            }
            self.publish(&mut state);
        }
    }

    #[cfg(test)]
    pub(crate) fn with_state<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.state.lock())
    }
}

/// The schedulers of an engine's data-parallel ranks, and its balancer for requests that name
/// no rank.
#[derive(Debug)]
pub(crate) struct Ranks {
    schedulers: Vec<Arc<Scheduler>>,
    next: AtomicUsize,
}

/// A rank a request named that the engine does not have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("data_parallel_rank {rank} is out of range (dp_size {dp_size})")]
pub(crate) struct NoSuchRank {
    pub(crate) rank: u32,
    pub(crate) dp_size: usize,
}

impl Ranks {
    /// The ranks, rank `r` being `schedulers[r]`; at least one.
    pub(crate) fn new(schedulers: Vec<Arc<Scheduler>>) -> Self {
        assert!(!schedulers.is_empty(), "an engine has at least one rank");
        Self { schedulers, next: AtomicUsize::new(0) }
    }

    /// The scheduler of `requested`, or of the next rank in turn when the request names none.
    pub(crate) fn pick(&self, requested: Option<u32>) -> Result<&Arc<Scheduler>, NoSuchRank> {
        let dp_size = self.schedulers.len();
        let at = match requested {
            Some(rank) => usize::try_from(rank).unwrap_or(usize::MAX),
            None => self.next.fetch_add(1, Ordering::Relaxed) % dp_size,
        };
        self.schedulers.get(at).ok_or(NoSuchRank { rank: requested.unwrap_or(0), dp_size })
    }

    /// Every rank's scheduler, in rank order.
    pub(crate) fn all(&self) -> &[Arc<Scheduler>] {
        &self.schedulers
    }
}

/// A cloneable handle that takes load snapshots of a running engine (for a load reporter,
/// `/v1/loads`, or an embedding process). A snapshot is one lock and one pass over the running
/// batch per rank, cheap enough for any report interval.
#[derive(Clone, Debug)]
pub struct LoadSource {
    ranks: Arc<Ranks>,
    /// Report the cumulative prefill counters (zeros otherwise).
    prefill_counters: bool,
}

impl LoadSource {
    pub(crate) fn new(ranks: Arc<Ranks>) -> Self {
        Self { ranks, prefill_counters: true }
    }

    /// This source reporting zeros for the cumulative prefill counters (`--no-prefill-counters`).
    pub(crate) fn hiding_prefill_counters(mut self, hide: bool) -> Self {
        self.prefill_counters = !hide;
        self
    }

    /// The engine's load now: every rank, consistent within a rank.
    pub fn snapshot(&self) -> LoadSnapshot {
        let ranks = self
            .ranks
            .all()
            .iter()
            .map(|scheduler| {
                let mut load = scheduler.load();
                if !self.prefill_counters {
                    load.total_prefill_uncached_tokens = 0;
                    load.total_prefill_busy_us = 0;
                }
                load
            })
            .collect();
        LoadSnapshot { captured_at: SystemTime::now(), ranks }
    }
}

#[cfg(test)]
mod tests;
