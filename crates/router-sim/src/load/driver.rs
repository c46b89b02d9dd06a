//! The arrival processes: closed-loop workers, open-loop Poisson arrivals, and a trace's own
//! clock. Sessions go back to a shared queue after each turn, so turns of different sessions
//! interleave as they would in a real chat service.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::client::{Client, Outcome};
use super::report::Report;
use super::workload::{
    Message, Session, SessionSpec, SplitMix, TraceRequest, TraceSpec, oracle_hit_rate,
};
use super::{Arrival, LoadConfig};

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

/// Plays one turn of `session`, recording the outcome.
async fn play(
    client: &Client,
    spec: &SessionSpec,
    mut session: Session,
    results: &Mutex<Vec<Outcome>>,
) -> Session {
    let (messages, user) = session.next_turn();
    let outcome = client.chat(&messages, spec.output_tokens, Some(&session.name)).await;
    let answer = outcome.error.is_none().then(|| outcome.content.clone());
    session.record(user, answer);
    results.lock().push(outcome);
    session
}

pub(crate) async fn sessions(config: &LoadConfig, spec: &SessionSpec, client: Client) -> Report {
    let pool = Arc::new(Pool::new(Session::all(spec)));
    let results = Arc::new(Mutex::new(Vec::new()));
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
    let outcomes = std::mem::take(&mut *results.lock());
    Report::new(&outcomes, elapsed, None)
}

pub(crate) async fn trace(
    config: &LoadConfig,
    spec: &TraceSpec,
    requests: Vec<TraceRequest>,
    client: Client,
) -> Report {
    let oracle = oracle_hit_rate(&requests);
    let results = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let deadline = start + config.duration;
    let in_flight = Arc::new(Semaphore::new(config.max_in_flight));
    let block_tokens = spec.block_tokens;
    let mut tasks = JoinSet::new();
    let replay = async {
        for request in requests {
            tokio::time::sleep_until(start + request.at).await;
            let Ok(permit) = Arc::clone(&in_flight).acquire_owned().await else { break };
            let (client, results) = (client.clone(), Arc::clone(&results));
            tasks.spawn(async move {
                let messages = [Message { role: "user", content: request.prompt(block_tokens) }];
                let outcome = client.chat(&messages, request.output_length.max(1), None).await;
                results.lock().push(outcome);
                drop(permit);
            });
            while tasks.try_join_next().is_some() {}
        }
        while tasks.join_next().await.is_some() {}
    };
    let _ = tokio::time::timeout_at(deadline, replay).await;
    let elapsed = start.elapsed().min(config.duration);
    let outcomes = std::mem::take(&mut *results.lock());
    Report::new(&outcomes, elapsed, oracle)
}
