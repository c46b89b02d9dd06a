//! The arrival processes: closed-loop workers, open-loop Poisson arrivals, and a trace's own
//! clock. Sessions go back to a shared queue after each turn, so turns of different sessions
//! interleave as they would in a real chat service.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::client::{Client, Outcome};
use super::report::RunReport;
use super::trace::Replay;
use super::workload::{Message, Session, SessionSpec, SplitMix};
use super::{Arrival, LoadgenConfig};

/// Sessions ready for their next turn, and how many still have turns to play.
struct Pool {
    ready: Mutex<VecDeque<Session>>,
    unfinished: Mutex<usize>,
    changed: Notify,
}

impl Pool {
    fn new(sessions: Vec<Session>) -> Self {
        let unfinished = sessions.iter().filter(|s| !s.finished()).count();
        Self {
            ready: Mutex::new(sessions.into_iter().filter(|s| !s.finished()).collect()),
            unfinished: Mutex::new(unfinished),
            changed: Notify::new(),
        }
    }

    /// The next ready session; `None` once every session is finished.
    async fn take(&self) -> Option<Session> {
        loop {
            let notified = self.changed.notified();
            if let Some(session) = self.ready.lock().pop_front() {
                return Some(session);
            }
            if *self.unfinished.lock() == 0 {
                return None;
            }
            notified.await;
        }
    }

    fn give_back(&self, session: Session) {
        if session.finished() {
            *self.unfinished.lock() -= 1;
        } else {
            self.ready.lock().push_back(session);
        }
        self.changed.notify_waiters();
    }
}

/// What the requests of a run produced: every outcome, and how many requests were sent.
#[derive(Debug, Default)]
struct Results {
    outcomes: Mutex<Vec<Outcome>>,
    sent: AtomicU64,
}

impl Results {
    fn push(&self, outcome: Outcome) {
        self.outcomes.lock().push(outcome);
    }

    fn sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    fn take(&self) -> (Vec<Outcome>, u64) {
        (std::mem::take(&mut *self.outcomes.lock()), self.sent.load(Ordering::Relaxed))
    }
}

/// Plays one turn of `session`, recording the outcome.
async fn play(
    client: &Client,
    spec: &SessionSpec,
    mut session: Session,
    results: &Results,
) -> Session {
    let (messages, user) = session.next_turn();
    results.sent();
    let outcome = client.chat(&messages, spec.output_tokens, Some(&session.name)).await;
    let answer = outcome.error.is_none().then(|| outcome.content.clone());
    session.record(user, answer);
    results.push(outcome);
    session
}

pub(crate) async fn sessions(
    config: &LoadgenConfig,
    spec: &SessionSpec,
    client: Client,
) -> RunReport {
    let pool = Arc::new(Pool::new(Session::all(spec)));
    let results = Arc::new(Results::default());
    let start = Instant::now();
    let deadline = start + config.duration;
    let spec = Arc::new(spec.clone());
    let mut tasks = JoinSet::new();
    match config.arrival {
        Arrival::Concurrency(workers) => {
            for _ in 0..workers {
                let (pool, results, client, spec) =
                    (Arc::clone(&pool), Arc::clone(&results), client.clone(), Arc::clone(&spec));
                tasks.spawn(async move {
                    while let Some(session) = pool.take().await {
                        let session = play(&client, &spec, session, &results).await;
                        pool.give_back(session);
                    }
                });
            }
        }
        Arrival::Rate(rate) => {
            let (pool, results, client, spec) =
                (Arc::clone(&pool), Arc::clone(&results), client.clone(), Arc::clone(&spec));
            let in_flight = Arc::new(Semaphore::new(config.max_in_flight));
            let seed = spec.seed;
            tasks.spawn(async move {
                let mut rng = SplitMix(seed ^ 0x7261_7465);
                let mut next = Instant::now();
                let mut turns = JoinSet::new();
                loop {
                    let gap = -(1.0 - rng.unit()).ln() / rate;
                    next += Duration::from_secs_f64(gap);
                    tokio::time::sleep_until(next).await;
                    let Some(session) = pool.take().await else { break };
                    let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else { break };
                    let (pool, results, client, spec) = (
                        Arc::clone(&pool),
                        Arc::clone(&results),
                        client.clone(),
                        Arc::clone(&spec),
                    );
                    turns.spawn(async move {
                        let session = play(&client, &spec, session, &results).await;
                        pool.give_back(session);
                        drop(permit);
                    });
                    while turns.try_join_next().is_some() {}
                }
                while turns.join_next().await.is_some() {}
            });
        }
    }
    let finished =
        tokio::time::timeout_at(deadline, async { while tasks.join_next().await.is_some() {} })
            .await;
    if finished.is_err() {
        tasks.abort_all();
    }
    let elapsed = start.elapsed().min(config.duration);
    let (outcomes, sent) = results.take();
    RunReport::new(&outcomes, elapsed, sent, None)
}

/// Replays a prepared trace on its own clock: each request at its time (once fewer than
/// `max_in_flight` are in flight), its prompt text made in its own task. Returns the report
/// and every finished request's outcome, in the order they finished.
pub(crate) async fn trace(
    config: &LoadgenConfig,
    replay: Arc<Replay>,
    client: Client,
) -> (RunReport, Vec<Outcome>) {
    let results = Arc::new(Results::default());
    let start = Instant::now();
    let deadline = start + config.duration;
    let in_flight = Arc::new(Semaphore::new(config.max_in_flight));
    let mut tasks = JoinSet::new();
    let send_all = async {
        for index in 0..replay.requests.len() {
            // A send time beyond the clock's range is never reached.
            let Some(due) = start.checked_add(replay.at(index)) else { break };
            tokio::time::sleep_until(due).await;
            let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else { break };
            results.sent();
            let (client, results, replay) =
                (client.clone(), Arc::clone(&results), Arc::clone(&replay));
            tasks.spawn(async move {
                let request = &replay.requests[index];
                let ids = replay.text.content_ids(request);
                let mut outcome = match replay.text.text(&ids) {
                    Ok(content) => {
                        let messages = [Message { role: "user", content }];
                        client.chat(&messages, request.output_length, None).await
                    }
                    Err(_) => {
                        Outcome { error: Some("prompt_text".to_owned()), ..Outcome::default() }
                    }
                };
                outcome.trace_index = Some(index);
                results.push(outcome);
                drop(permit);
            });
            while tasks.try_join_next().is_some() {}
        }
        while tasks.join_next().await.is_some() {}
    };
    let _ = tokio::time::timeout_at(deadline, send_all).await;
    let elapsed = start.elapsed().min(config.duration);
    let (outcomes, sent) = results.take();
    let judged = replay.report_over(usize::try_from(sent).unwrap_or(usize::MAX));
    (RunReport::new(&outcomes, elapsed, sent, Some(judged)), outcomes)
}
