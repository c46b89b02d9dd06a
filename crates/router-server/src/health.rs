//! Engine health: periodic probes with hysteresis, and a per-engine circuit breaker fed by
//! dispatch outcomes. Both write one effective health flag into the worker registry, which
//! engine groups read when they list candidates.
//!
//! The breaker opens after `breaker_failures` consecutive failures, turns half-open exactly
//! `breaker_open_secs` later (the run loop wakes for it, whatever the probe interval), and then
//! lets at most `breaker_trials` trial requests through at once: the engine stops being a
//! candidate while that many are in flight. `breaker_successes` successful trials close it; a
//! failed one opens it again. A trial that never reports (its client left before any outcome)
//! gives back its place after another cool-down.
//!
//! An engine that declines a request with `Retry-After` is held off (no candidate) for that long,
//! capped by `server.retry.max_retry_after_secs`; the run loop wakes when the hold ends.
//!
//! An engine whose probes (or a dispatch) could not connect and then could has restarted: its
//! cache is empty whatever the router remembers. The book tells its restart hook (the KV index
//! forgets the engine's blocks) as soon as it answers again, which is before probes make it a
//! candidate again. A breaker opening on slow or failing answers is no restart.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use router_workers::{Worker, WorkerId, WorkerRegistry};
use serde::Serialize;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::forward::{Outcome, OutcomeSink};
use router_config::HealthSection;
use router_engine_client::{Forwarder, Probe};

/// What the book calls when an engine restarted.
pub(crate) type RestartHook = Box<dyn Fn(&Worker) + Send + Sync>;

/// The hook, for the book's `Debug`.
struct Hook(RestartHook);

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RestartHook")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Breaker {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
    },
    HalfOpen {
        /// Trials in flight.
        trials: u32,
        /// Trials that succeeded.
        successes: u32,
        /// When the last trial began.
        since: Instant,
    },
}

#[derive(Debug)]
struct EngineHealth {
    incarnation: u64,
    probe_healthy: bool,
    probe_streak: i64,
    /// The last attempt to reach the engine could not connect: it is down, and when it
    /// answers again it has restarted.
    refused: bool,
    breaker: Breaker,
    /// Until when the engine asked to be left alone (`Retry-After`).
    held_until: Option<Instant>,
}

impl EngineHealth {
    fn new(incarnation: u64) -> Self {
        Self {
            incarnation,
            probe_healthy: true,
            probe_streak: 0,
            refused: false,
            breaker: Breaker::Closed { failures: 0 },
            held_until: None,
        }
    }

    /// Whether the engine is a candidate: probes say it is up, and its breaker is closed, or
    /// half-open with room for another trial.
    fn effective(&self, config: &HealthSection) -> bool {
        self.probe_healthy
            && self.held_until.is_none()
            && match self.breaker {
                Breaker::Closed { .. } => true,
                Breaker::Open { .. } => false,
                Breaker::HalfOpen { trials, .. } => trials < config.breaker_trials.max(1),
            }
    }

    fn open(&mut self, now: Instant, config: &HealthSection) {
        self.breaker = Breaker::Open { until: now + Duration::from_secs(config.breaker_open_secs) };
    }
}

/// The health state of every engine and the registry it updates.
#[derive(Debug)]
pub struct HealthBook {
    registry: Arc<WorkerRegistry>,
    config: HealthSection,
    /// Looked up on every answer: foldhash, and the id copied only for an engine's first
    /// record.
    engines: Mutex<hashbrown::HashMap<WorkerId, EngineHealth>>,
    /// Wakes the run loop when a breaker opens or an engine is held off, so that it acts on
    /// time.
    opened: Notify,
    /// Engines whose breaker is half-open now, so that a dispatch to a closed breaker (all of
    /// them, nearly always) costs nothing here.
    half_open: AtomicUsize,
    /// Told of every restart.
    restart_hook: std::sync::OnceLock<Hook>,
}

/// The breaker state of one engine, for `/admin/state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    /// Dispatches flow.
    Closed,
    /// Dispatches are held off.
    Open,
    /// Trial dispatches decide.
    HalfOpen,
}

impl BreakerState {
    /// The state's name in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

fn state_of(breaker: Breaker) -> BreakerState {
    match breaker {
        Breaker::Closed { .. } => BreakerState::Closed,
        Breaker::Open { .. } => BreakerState::Open,
        Breaker::HalfOpen { .. } => BreakerState::HalfOpen,
    }
}

impl HealthBook {
    /// A book over `registry`.
    pub fn new(registry: Arc<WorkerRegistry>, config: HealthSection) -> Self {
        Self {
            registry,
            config,
            engines: Mutex::new(hashbrown::HashMap::new()),
            opened: Notify::new(),
            half_open: AtomicUsize::new(0),
            restart_hook: std::sync::OnceLock::new(),
        }
    }

    /// Calls `hook` for every engine that restarted (the first hook set stays).
    pub(crate) fn on_restart(&self, hook: RestartHook) {
        let _ = self.restart_hook.set(Hook(hook));
    }

    /// The configuration.
    pub fn config(&self) -> &HealthSection {
        &self.config
    }

    /// The breaker state of an engine.
    pub fn breaker(&self, id: &WorkerId) -> BreakerState {
        self.engines.lock().get(id).map_or(BreakerState::Closed, |e| state_of(e.breaker))
    }

    fn update(&self, worker: &Worker, change: impl FnOnce(&mut EngineHealth, &HealthSection)) {
        let healthy = {
            let mut engines = self.engines.lock();
            let entry = match engines.get_mut(worker.id()) {
                Some(entry) => entry,
                None => engines
                    .entry(worker.id().clone())
                    .or_insert_with(|| EngineHealth::new(worker.incarnation())),
            };
            if entry.incarnation > worker.incarnation() {
                // A late outcome of an engine since replaced: its successor's record stays.
                return;
            }
            let was_half_open = state_of(entry.breaker) == BreakerState::HalfOpen;
            if entry.incarnation != worker.incarnation() {
                *entry = EngineHealth::new(worker.incarnation());
            }
            let before = state_of(entry.breaker);
            change(entry, &self.config);
            let after = state_of(entry.breaker);
            match (was_half_open, after == BreakerState::HalfOpen) {
                (false, true) => {
                    self.half_open.fetch_add(1, Ordering::Relaxed);
                }
                (true, false) => {
                    self.half_open.fetch_sub(1, Ordering::Relaxed);
                }
                _ => {}
            }
            if before != after {
                let id = worker.id().as_str();
                crate::metrics::breaker_transition(id, before.as_str(), after.as_str());
                if after == BreakerState::Open {
                    self.opened.notify_one();
                }
            }
            entry.effective(&self.config)
        };
        // Nothing to write when `worker` already says so: an incarnation is one `Worker`, so
        // the registry's, if current, is this one (the usual case: a success on a healthy engine).
        if worker.is_healthy() == healthy {
            return;
        }
        // Only the current incarnation's health is written.
        if self.registry.get(worker.id()).is_some_and(|w| w.incarnation() == worker.incarnation()) {
            let _ = self.registry.set_health(worker.id(), healthy);
        }
    }

    /// Records one probe result: the engine answered (`ok` with a 2xx) or not; a probe that
    /// could not connect is [`HealthBook::record_refused`].
    pub fn record_probe(&self, worker: &Worker, ok: bool) {
        let mut restarted = false;
        self.update(worker, |engine, config| {
            restarted = std::mem::take(&mut engine.refused);
            Self::count_probe(engine, config, ok);
        });
        if restarted {
            tracing::info!(worker = %worker.id(), "engine answers again after refusing connections: restarted, forgetting its cache");
            if let Some(Hook(hook)) = self.restart_hook.get() {
                hook(worker);
            }
        }
    }

    /// Records a probe that could not connect.
    pub fn record_refused(&self, worker: &Worker) {
        self.update(worker, |engine, config| {
            engine.refused = true;
            Self::count_probe(engine, config, false);
        });
    }

    fn count_probe(engine: &mut EngineHealth, config: &HealthSection, ok: bool) {
        engine.probe_streak = match (ok, engine.probe_streak) {
            (true, s) if s > 0 => s + 1,
            (true, _) => 1,
            (false, s) if s < 0 => s - 1,
            (false, _) => -1,
        };
        if engine.probe_healthy && -engine.probe_streak >= i64::from(config.unhealthy_after) {
            engine.probe_healthy = false;
        } else if !engine.probe_healthy && engine.probe_streak >= i64::from(config.healthy_after) {
            engine.probe_healthy = true;
        }
    }

    /// A request is being sent to `worker`: while its breaker is half-open it is a trial,
    /// and the engine stops being a candidate once `breaker_trials` are in flight.
    pub fn dispatching(&self, worker: &Worker) {
        if self.half_open.load(Ordering::Relaxed) == 0 {
            return;
        }
        let now = Instant::now();
        self.update(worker, |engine, _| {
            if let Breaker::HalfOpen { trials, successes, .. } = engine.breaker {
                engine.breaker = Breaker::HalfOpen { trials: trials + 1, successes, since: now };
            }
        });
    }

    /// Holds `worker` off for `hold` (it answered `Retry-After`): no candidate until then.
    pub fn hold_off(&self, worker: &Worker, hold: Duration) {
        let until = Instant::now() + hold;
        self.update(worker, |engine, _| {
            engine.held_until = Some(engine.held_until.map_or(until, |held| held.max(until)));
        });
        self.opened.notify_one();
    }

    /// Moves open breakers whose time is up to half-open, gives back the places of trials
    /// that never reported within a cool-down, and ends hold-offs that are over.
    pub fn tick(&self, now: Instant) {
        let due_ids: Vec<WorkerId> = self
            .engines
            .lock()
            .iter()
            .filter(|(_, e)| self.due_at(e).is_some_and(|at| at <= now))
            .map(|(id, _)| id.clone())
            .collect();
        let cool_down = Duration::from_secs(self.config.breaker_open_secs);
        for id in due_ids {
            if let Some(worker) = self.registry.get(&id) {
                self.update(&worker, |engine, _| {
                    if engine.held_until.is_some_and(|until| until <= now) {
                        engine.held_until = None;
                    }
                    match engine.breaker {
                        Breaker::Open { until } if until <= now => {
                            engine.breaker =
                                Breaker::HalfOpen { trials: 0, successes: 0, since: now };
                        }
                        Breaker::HalfOpen { trials, successes, since }
                            if trials > 0 && since + cool_down <= now =>
                        {
                            engine.breaker = Breaker::HalfOpen { trials: 0, successes, since: now };
                        }
                        _ => {}
                    }
                });
            }
        }
    }

    /// When `engine` next has work for [`Self::tick`]: the end of its breaker's cool-down, of
    /// a silent trial's, or of its hold-off, whichever is first.
    fn due_at(&self, engine: &EngineHealth) -> Option<Instant> {
        let cool_down = Duration::from_secs(self.config.breaker_open_secs);
        let breaker = match engine.breaker {
            Breaker::Open { until } => Some(until),
            Breaker::HalfOpen { trials, since, .. } if trials > 0 => Some(since + cool_down),
            _ => None,
        };
        breaker.into_iter().chain(engine.held_until).min()
    }

    /// The next instant [`Self::tick`] has work.
    fn next_due(&self) -> Option<Instant> {
        self.engines.lock().values().filter_map(|e| self.due_at(e)).min()
    }

    /// Forgets engines that left the registry.
    pub fn retain_registered(&self) {
        let registry = &self.registry;
        self.engines.lock().retain(|id, e| {
            let keep = registry.get(id).is_some_and(|w| w.incarnation() == e.incarnation);
            if !keep && state_of(e.breaker) == BreakerState::HalfOpen {
                self.half_open.fetch_sub(1, Ordering::Relaxed);
            }
            keep
        });
    }

    /// Probes every engine once, concurrently.
    pub async fn probe_all(&self, forwarder: &Forwarder) {
        let timeout = Duration::from_secs(self.config.timeout_secs);
        let workers = self.registry.workers();
        let probes = workers.iter().map(|worker| async move {
            (worker, forwarder.probe(worker, &self.config.endpoint, timeout).await)
        });
        for (worker, probe) in futures::future::join_all(probes).await {
            match probe {
                Probe::Answered(status) => self.record_probe(worker, status.is_success()),
                Probe::Refused => self.record_refused(worker),
                Probe::NoAnswer => self.record_probe(worker, false),
            }
        }
        self.tick(Instant::now());
        self.retain_registered();
    }

    /// Probes every interval, and half-opens breakers when their cool-down ends, until
    /// cancelled.
    pub async fn run(self: Arc<Self>, forwarder: Forwarder, cancel: CancellationToken) {
        let mut interval =
            tokio::time::interval(Duration::from_secs(self.config.interval_secs.max(1)));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let due = self.next_due();
            let cool_down_ends = async {
                match due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = interval.tick() => self.probe_all(&forwarder).await,
                () = cool_down_ends => self.tick(Instant::now()),
                // A breaker opened: its cool-down is the next one to wait for.
                () = self.opened.notified() => {}
            }
        }
    }
}

impl OutcomeSink for HealthBook {
    fn record(&self, worker: &Worker, outcome: Outcome) {
        // The clock is read only where a breaker opens: a success, the usual outcome, needs none.
        self.update(worker, |engine, config| match (outcome, engine.breaker) {
            (Outcome::Success, Breaker::HalfOpen { trials, successes, since }) => {
                let successes = successes + 1;
                engine.breaker = if successes >= config.breaker_successes.max(1) {
                    Breaker::Closed { failures: 0 }
                } else {
                    Breaker::HalfOpen { trials: trials.saturating_sub(1), successes, since }
                };
            }
            (Outcome::Success, _) => engine.breaker = Breaker::Closed { failures: 0 },
            (Outcome::Failure, Breaker::HalfOpen { .. }) => engine.open(Instant::now(), config),
            (Outcome::Failure, Breaker::Closed { failures }) => {
                let failures = failures + 1;
                if config.breaker_failures > 0 && failures >= config.breaker_failures {
                    engine.open(Instant::now(), config);
                } else {
                    engine.breaker = Breaker::Closed { failures };
                }
            }
            (Outcome::Failure, Breaker::Open { .. }) => {}
            (Outcome::Unreachable, breaker) => {
                // A refused connection is definitive: stop sending until probes say otherwise.
                engine.probe_healthy = false;
                engine.refused = true;
                engine.probe_streak = -i64::from(config.unhealthy_after);
                if matches!(breaker, Breaker::HalfOpen { .. }) {
                    engine.open(Instant::now(), config);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use router_workers::ModelId;

    use super::*;

    fn setup() -> (Arc<WorkerRegistry>, Arc<Worker>, HealthBook) {
        let registry = Arc::new(WorkerRegistry::new());
        let worker = registry
            .add(Worker::plain("e1", "http://127.0.0.1:1", &ModelId::new("m")).expect("worker"))
            .expect("add");
        let book = HealthBook::new(Arc::clone(&registry), HealthSection::default());
        (registry, worker, book)
    }

    #[test]
    fn probes_have_hysteresis() {
        let (_, worker, book) = setup();
        book.record_probe(&worker, false);
        book.record_probe(&worker, false);
        assert!(worker.is_healthy(), "two failures are not enough");
        book.record_probe(&worker, false);
        assert!(!worker.is_healthy(), "three failures make it unhealthy");
        book.record_probe(&worker, true);
        assert!(!worker.is_healthy(), "one success is not enough");
        book.record_probe(&worker, true);
        assert!(worker.is_healthy(), "two successes make it healthy");
    }

    #[test]
    fn an_engine_that_could_not_be_reached_and_then_answers_has_restarted() {
        let (_, worker, book) = setup();
        let restarts = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&restarts);
        book.on_restart(Box::new(move |_| {
            counted.fetch_add(1, Ordering::Relaxed);
        }));
        let restarts = || restarts.load(Ordering::Relaxed);
        // Failing answers, and a breaker opening on them, are no restart.
        for _ in 0..12 {
            book.record_probe(&worker, false);
            book.record(&worker, Outcome::Failure);
        }
        book.record_probe(&worker, true);
        assert_eq!(restarts(), 0);
        // Refused, then an answer (even an unhealthy one): restarted, told once.
        book.record_refused(&worker);
        book.record_refused(&worker);
        book.record_probe(&worker, false);
        book.record_probe(&worker, true);
        assert_eq!(restarts(), 1);
        // A refused dispatch counts as a refused probe.
        book.record(&worker, Outcome::Unreachable);
        assert!(!worker.is_healthy());
        book.record_probe(&worker, true);
        assert_eq!(restarts(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn breaker_opens_after_failures_and_half_opens_later() {
        let (_, worker, book) = setup();
        for _ in 0..9 {
            book.record(&worker, Outcome::Failure);
        }
        assert!(worker.is_healthy());
        book.record(&worker, Outcome::Failure);
        assert!(!worker.is_healthy(), "ten failures open the breaker");
        assert_eq!(book.breaker(worker.id()), BreakerState::Open);

        tokio::time::advance(Duration::from_secs(29)).await;
        book.tick(Instant::now());
        assert!(!worker.is_healthy());
        tokio::time::advance(Duration::from_secs(2)).await;
        book.tick(Instant::now());
        assert!(worker.is_healthy(), "half-open lets a trial through");
        book.record(&worker, Outcome::Failure);
        assert!(!worker.is_healthy(), "a failed trial reopens");
        tokio::time::advance(Duration::from_secs(31)).await;
        book.tick(Instant::now());
        book.record(&worker, Outcome::Success);
        assert_eq!(book.breaker(worker.id()), BreakerState::Closed);
        assert!(worker.is_healthy());
    }

    #[test]
    fn successes_reset_the_failure_count() {
        let (_, worker, book) = setup();
        for _ in 0..20 {
            book.record(&worker, Outcome::Failure);
            book.record(&worker, Outcome::Success);
        }
        assert!(worker.is_healthy(), "interleaved failures never open the breaker");
    }

    #[test]
    fn unreachable_is_unhealthy_at_once() {
        let (_, worker, book) = setup();
        book.record(&worker, Outcome::Unreachable);
        assert!(!worker.is_healthy());
        book.record_probe(&worker, true);
        book.record_probe(&worker, true);
        assert!(worker.is_healthy());
    }

    fn book(config: HealthSection) -> (Arc<WorkerRegistry>, HealthBook) {
        let registry = Arc::new(WorkerRegistry::new());
        (Arc::clone(&registry), HealthBook::new(registry, config))
    }

    fn worker_at(registry: &WorkerRegistry, id: &str, url: &str) -> Arc<Worker> {
        registry.add(Worker::plain(id, url, &ModelId::new("m")).expect("worker")).expect("add")
    }

    fn forwarder() -> Forwarder {
        Forwarder::new(router_engine_client::ForwardConfig::default()).expect("forwarder")
    }

    #[tokio::test]
    async fn a_probe_counts_only_a_2xx_on_the_configured_endpoint() {
        let engine =
            axum::Router::new().route("/ready", axum::routing::get(|| async { "ok" })).route(
                "/broken",
                axum::routing::get(|| async { (http::StatusCode::BAD_GATEWAY, "no") }),
            );
        let up = crate::tests::serve(engine).await;
        let down = router_test_support::nothing_listens();
        let cases = [
            ("a 2xx on the endpoint", "/ready", &up, true),
            ("the default endpoint, which this engine lacks (404)", "/health", &up, false),
            ("a 5xx", "/broken", &up, false),
            ("nothing listens", "/ready", &down, false),
        ];
        for (name, endpoint, url, healthy) in cases {
            let config = HealthSection {
                endpoint: endpoint.to_owned(),
                unhealthy_after: 1,
                healthy_after: 1,
                ..HealthSection::default()
            };
            let (registry, book) = book(config);
            let worker = worker_at(&registry, "e1", url);
            book.probe_all(&forwarder()).await;
            assert_eq!(worker.is_healthy(), healthy, "{name}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn run_probes_every_interval_until_cancelled() {
        let config =
            HealthSection { interval_secs: 10, timeout_secs: 1, ..HealthSection::default() };
        let (registry, book) = book(config);
        let worker = worker_at(&registry, "e1", &router_test_support::nothing_listens());
        let cancel = CancellationToken::new();
        let running = tokio::spawn(Arc::new(book).run(forwarder(), cancel.clone()));
        // Probes at 0 s and 10 s: two failures, one short of unhealthy_after.
        tokio::time::sleep(Duration::from_secs(19)).await;
        assert!(worker.is_healthy(), "two failed probes are not enough");
        // The third, at 20 s.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!worker.is_healthy(), "three failed probes make it unhealthy");
        cancel.cancel();
        running.await.expect("run returns once cancelled");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_while_open_does_not_extend_it_and_a_good_trial_closes_it() {
        let config = HealthSection { breaker_failures: 2, ..HealthSection::default() };
        let (registry, book) = book(config);
        let worker = worker_at(&registry, "e1", "http://127.0.0.1:1");
        book.record(&worker, Outcome::Failure);
        assert_eq!(book.breaker(worker.id()), BreakerState::Closed, "one failure of two");
        book.record(&worker, Outcome::Failure);
        assert_eq!(book.breaker(worker.id()), BreakerState::Open);
        tokio::time::advance(Duration::from_secs(20)).await;
        // A stream that began before the breaker opened fails now: it changes nothing.
        book.record(&worker, Outcome::Failure);
        tokio::time::advance(Duration::from_secs(10)).await;
        book.tick(Instant::now());
        assert_eq!(book.breaker(worker.id()), BreakerState::HalfOpen, "30 s after opening");
        assert!(worker.is_healthy(), "the trial request may go");
        book.record(&worker, Outcome::Success);
        assert_eq!(book.breaker(worker.id()), BreakerState::Closed);
        book.record(&worker, Outcome::Failure);
        assert_eq!(book.breaker(worker.id()), BreakerState::Closed, "the count started over");
    }

    #[tokio::test(start_paused = true)]
    async fn a_breaker_of_zero_failures_never_opens() {
        let config = HealthSection { breaker_failures: 0, ..HealthSection::default() };
        let (registry, book) = book(config);
        let worker = worker_at(&registry, "e1", "http://127.0.0.1:1");
        for _ in 0..50 {
            book.record(&worker, Outcome::Failure);
        }
        assert_eq!(book.breaker(worker.id()), BreakerState::Closed, "the breaker is off");
        assert!(worker.is_healthy(), "failures alone never take it out");
    }

    #[tokio::test(start_paused = true)]
    async fn the_breaker_half_opens_exactly_after_its_cool_down_whatever_the_probe_interval() {
        let up = crate::tests::serve(
            axum::Router::new().route("/health", axum::routing::get(|| async { "ok" })),
        )
        .await;
        let config = HealthSection {
            interval_secs: 10,
            breaker_failures: 1,
            breaker_open_secs: 30,
            ..HealthSection::default()
        };
        let (registry, book) = book(config);
        let worker = worker_at(&registry, "e1", &up);
        let book = Arc::new(book);
        let cancel = CancellationToken::new();
        let running = tokio::spawn(Arc::clone(&book).run(forwarder(), cancel.clone()));
        // Probes run at 0, 10, 20, 30, 40 s; the breaker opens at 5 s.
        tokio::time::sleep(Duration::from_secs(5)).await;
        book.record(&worker, Outcome::Failure);
        assert_eq!(book.breaker(worker.id()), BreakerState::Open);
        tokio::time::sleep(Duration::from_millis(29_990)).await;
        assert_eq!(book.breaker(worker.id()), BreakerState::Open, "10 ms before the end");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(book.breaker(worker.id()), BreakerState::HalfOpen, "at 35 s, not at 40");
        assert!(worker.is_healthy());
        cancel.cancel();
        running.await.expect("run returns once cancelled");
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_admits_its_trials_only_and_closes_on_enough_successes() {
        let config = HealthSection {
            breaker_failures: 1,
            breaker_trials: 2,
            breaker_successes: 2,
            ..HealthSection::default()
        };
        let (registry, book) = book(config);
        let worker = worker_at(&registry, "e1", "http://127.0.0.1:1");
        book.record(&worker, Outcome::Failure);
        tokio::time::advance(Duration::from_secs(30)).await;
        book.tick(Instant::now());
        assert_eq!(book.breaker(worker.id()), BreakerState::HalfOpen);
        book.dispatching(&worker);
        assert!(worker.is_healthy(), "room for a second trial");
        book.dispatching(&worker);
        assert!(!worker.is_healthy(), "two trials in flight: no third");
        book.record(&worker, Outcome::Success);
        assert_eq!(book.breaker(worker.id()), BreakerState::HalfOpen, "one success of two");
        assert!(worker.is_healthy(), "a trial's place is free again");
        book.record(&worker, Outcome::Success);
        assert_eq!(book.breaker(worker.id()), BreakerState::Closed);
        assert!(worker.is_healthy());
    }

    #[tokio::test(start_paused = true)]
    async fn one_trial_by_default_and_a_silent_trial_gives_its_place_back() {
        let config = HealthSection { breaker_failures: 1, ..HealthSection::default() };
        let (registry, book) = book(config);
        let worker = worker_at(&registry, "e1", "http://127.0.0.1:1");
        book.record(&worker, Outcome::Failure);
        tokio::time::advance(Duration::from_secs(30)).await;
        book.tick(Instant::now());
        book.dispatching(&worker);
        assert!(!worker.is_healthy(), "exactly one trial");
        // Its client left before any outcome: after a cool-down the place is free again.
        tokio::time::advance(Duration::from_secs(29)).await;
        book.tick(Instant::now());
        assert!(!worker.is_healthy());
        tokio::time::advance(Duration::from_secs(1)).await;
        book.tick(Instant::now());
        assert!(worker.is_healthy());
        assert_eq!(book.breaker(worker.id()), BreakerState::HalfOpen);
        book.dispatching(&worker);
        book.record(&worker, Outcome::Unreachable);
        assert_eq!(book.breaker(worker.id()), BreakerState::Open, "an unreachable trial reopens");
    }

    #[test]
    fn an_engine_that_left_is_forgotten() {
        let config = HealthSection { breaker_failures: 1, ..HealthSection::default() };
        let (registry, book) = book(config);
        let worker = worker_at(&registry, "e1", "http://127.0.0.1:1");
        book.record(&worker, Outcome::Failure);
        assert_eq!(book.breaker(worker.id()), BreakerState::Open);
        registry.remove(worker.id()).expect("removed");
        book.retain_registered();
        assert_eq!(book.breaker(worker.id()), BreakerState::Closed);
        // An engine added later under the same id starts healthy and closed.
        let again = worker_at(&registry, "e1", "http://127.0.0.1:1");
        assert!(again.is_healthy());
        assert_eq!(book.breaker(again.id()), BreakerState::Closed);
    }

    #[test]
    fn a_late_outcome_of_a_replaced_engine_leaves_its_successor_alone() {
        let (registry, book) = book(HealthSection::default());
        let old = worker_at(&registry, "e1", "http://127.0.0.1:1");
        let new = registry
            .replace(Worker::plain("e1", "http://127.0.0.1:2", &ModelId::new("m")).expect("worker"))
            .expect("replaced");
        book.record(&new, Outcome::Unreachable);
        assert!(!new.is_healthy());
        // A stream of the old engine ends well after the replacement.
        book.record(&old, Outcome::Success);
        // One failed probe of the new engine: still unhealthy, as it was.
        book.record_probe(&new, false);
        assert!(!new.is_healthy(), "the new engine keeps its own record");
    }
}
