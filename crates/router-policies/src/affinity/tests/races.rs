//! Lost compare-and-sets. The table drives a real store with a competing writer that makes
//! one move just before each of the policy's writes, so every interleaving is exact; the last
//! test races real picks on two threads.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::executor::block_on;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use router_affinity::{AffinityConfig, AffinityStore, Binding, Scope};
use router_workers::{ModelId, Stage, Worker};

use super::fixture::{Flavor, Fleet, outcome, store};
use crate::affinity::{Affinity, Bindings, KeySource};
use crate::{
    AdmissionLimits, MAX_BIND_ATTEMPTS, Pick, PickError, PickReason, PickRequest, Policy,
    PowerOfTwoPolicy, StickyFallback,
};

/// What the competing writer does just before one of the policy's writes.
#[derive(Clone, Copy, Debug)]
enum Move {
    /// Binds the scope to this fleet engine if it is unbound.
    Bind(&'static str),
    /// Binds or rebinds the scope to this fleet engine, whatever it holds.
    Overwrite(&'static str),
    /// Drops every binding to this fleet engine (as the registry follower does).
    Invalidate(&'static str),
}

/// A real store whose scope a competitor changes between the policy's read and its write.
struct Interleaved {
    store: AffinityStore,
    workers: Vec<Arc<Worker>>,
    moves: Mutex<VecDeque<Move>>,
    writes: AtomicUsize,
}

impl Interleaved {
    fn new(fleet: &Fleet, moves: &[Move]) -> Self {
        Self {
            store: AffinityStore::new(AffinityConfig::default()).expect("valid config"),
            workers: fleet.workers.clone(),
            moves: Mutex::new(moves.iter().copied().collect()),
            writes: AtomicUsize::new(0),
        }
    }

    fn binding(&self, id: &str) -> Binding {
        let worker = self.workers.iter().find(|w| w.id().as_str() == id).expect("fleet engine");
        Binding::of(worker)
    }

    fn compete(&self, scope: &Scope) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        let Some(next) = self.moves.lock().pop_front() else { return };
        match next {
            Move::Bind(id) => {
                let _ = self.store.bind(scope, self.binding(id));
            }
            Move::Overwrite(id) => match self.store.get(scope) {
                None => self.store.bind(scope, self.binding(id)).expect("unbound"),
                Some(current) => {
                    self.store.replace(scope, &current, self.binding(id)).expect("unchanged");
                }
            },
            Move::Invalidate(id) => {
                self.store.invalidate_worker(self.binding(id).worker());
            }
        }
    }
}

impl Bindings for Interleaved {
    fn get(&self, scope: &Scope) -> Option<Binding> {
        self.store.get(scope)
    }

    fn bind(&self, scope: &Scope, binding: Binding) -> Result<(), Binding> {
        self.compete(scope);
        self.store.bind(scope, binding)
    }

    fn replace(
        &self,
        scope: &Scope,
        expected: &Binding,
        new: Binding,
    ) -> Result<(), Option<Binding>> {
        self.compete(scope);
        self.store.replace(scope, expected, new)
    }
}

/// A real fallback that counts how often it runs.
#[derive(Debug)]
struct Counted {
    inner: PowerOfTwoPolicy,
    calls: AtomicUsize,
}

impl Policy for Counted {
    fn pick<'a>(
        &'a self,
        engines: &'a [Arc<Worker>],
        request: &'a PickRequest<'a>,
    ) -> BoxFuture<'a, Result<Pick, PickError>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.pick(engines, request)
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}

struct Race {
    rule: &'static str,
    before: Option<&'static str>,
    moves: &'static [Move],
    /// Requests in flight to `b`; `a` is idle, so the fallback always picks `a`.
    busy_b: u64,
    inflight_cap: Option<u64>,
    expect: &'static str,
    after: Option<&'static str>,
    /// Compare-and-sets the policy attempted.
    writes: usize,
}

const RACES: &[Race] = &[
    Race {
        rule: "a concurrent winner among the candidates is returned instead of the own choice",
        before: None,
        moves: &[Move::Bind("b")],
        busy_b: 1,
        inflight_cap: None,
        expect: "b affinity_reused",
        after: Some("b"),
        writes: 1,
    },
    Race {
        rule: "a concurrent winner is checked before it is returned, and stays bound",
        before: None,
        moves: &[Move::Bind("b")],
        busy_b: 2,
        inflight_cap: Some(2),
        expect: "rejected b",
        after: Some("b"),
        writes: 1,
    },
    Race {
        rule: "a concurrent winner outside the candidates is replaced",
        before: None,
        moves: &[Move::Bind("c")],
        busy_b: 1,
        inflight_cap: None,
        expect: "a affinity_bound",
        after: Some("a"),
        writes: 2,
    },
    Race {
        rule: "a binding that vanished before the replace is bound afresh",
        before: Some("c"),
        moves: &[Move::Invalidate("c")],
        busy_b: 1,
        inflight_cap: None,
        expect: "a affinity_bound",
        after: Some("a"),
        writes: 2,
    },
    Race {
        rule: "a stale binding moved to a candidate meanwhile is reused",
        before: Some("c"),
        moves: &[Move::Overwrite("b")],
        busy_b: 1,
        inflight_cap: None,
        expect: "b affinity_reused",
        after: Some("b"),
        writes: 1,
    },
    Race {
        rule: "a competitor that keeps moving the binding outside the group exhausts the retry",
        before: None,
        moves: &[
            Move::Overwrite("c"),
            Move::Overwrite("d"),
            Move::Overwrite("c"),
            Move::Overwrite("d"),
            Move::Overwrite("c"),
            Move::Overwrite("d"),
        ],
        busy_b: 1,
        inflight_cap: None,
        expect: "error no candidates for plain",
        after: Some("d"),
        writes: MAX_BIND_ATTEMPTS,
    },
];

#[test]
fn lost_compare_and_sets_follow_the_rules() {
    assert_eq!(MAX_BIND_ATTEMPTS, 4, "the exhaustion row makes exactly this many moves");
    for race in RACES {
        let fleet = Fleet::new();
        fleet.busy("b", race.busy_b);
        let store = Interleaved::new(&fleet, race.moves);
        let scope = fleet.scope("k");
        if let Some(id) = race.before {
            store.store.bind(&scope, store.binding(id)).expect("fresh store");
        }
        let fallback = Arc::new(Counted {
            inner: PowerOfTwoPolicy::new(fleet.load.clone()),
            calls: AtomicUsize::new(0),
        });
        let mut affinity = Affinity::new(KeySource::Session, Arc::clone(&fallback) as _);
        if let Some(cap) = race.inflight_cap {
            let limits = AdmissionLimits { max_inflight_requests: Some(cap), ..Default::default() };
            affinity.admission = Some(fleet.admission(limits));
        }
        let engines = fleet.group(&["a", "b"]);
        let request = fleet.request(Flavor::Session, Some("k"));

        let result = block_on(affinity.pick(&store, &engines, &request));
        assert_eq!(outcome(&result), race.expect, "{}", race.rule);
        let after = store.store.get(&scope).map(|b| b.worker().as_str().to_owned());
        assert_eq!(after.as_deref(), race.after, "{}: binding after", race.rule);
        assert_eq!(store.writes.load(Ordering::Relaxed), race.writes, "{}: writes", race.rule);
        assert_eq!(fallback.calls.load(Ordering::Relaxed), 1, "{}: one fallback run", race.rule);
    }
}

/// Many picks of one new key at once, on two threads, with some engines over their admission
/// cap: every pick that succeeds returns the one binding, which is a candidate and admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_picks_converge_on_one_admitted_binding() {
    const TASKS: usize = 32;
    const KEYS: usize = 12;
    let fleet = Fleet::new();
    fleet.busy("a", 1);
    fleet.busy("c", 1);
    let limits = AdmissionLimits { max_inflight_requests: Some(1), ..Default::default() };
    let engines: Arc<[Arc<Worker>]> = fleet.group(&["a", "b", "c", "d"]).into();
    let flavors = [
        Flavor::Session,
        Flavor::Sticky(StickyFallback::Random),
        Flavor::Sticky(StickyFallback::RoundRobin),
    ];
    for flavor in flavors {
        let store = store();
        let policy = flavor.build(&fleet, &store, limits);
        for k in 0..KEYS {
            let key: Arc<str> = format!("key-{k}").into();
            let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
            let tasks: Vec<_> = (0..TASKS)
                .map(|_| {
                    let (policy, engines, key, barrier) = (
                        Arc::clone(&policy),
                        Arc::clone(&engines),
                        Arc::clone(&key),
                        Arc::clone(&barrier),
                    );
                    let model = fleet.model.clone();
                    tokio::spawn(async move {
                        let mut request = PickRequest {
                            model: &model,
                            stage: Stage::Plain,
                            bucket: super::fixture::BUCKET,
                            input_tokens: 100,
                            expected_peak_tokens: None,
                            tokens: None,
                            session_key: None,
                            routing_key: None,
                        };
                        match flavor {
                            Flavor::Session => request.session_key = Some(&key),
                            Flavor::Sticky(_) => request.routing_key = Some(&key),
                        }
                        barrier.wait().await;
                        policy.pick(&engines, &request).await
                    })
                })
                .collect();
            let mut picked = Vec::new();
            for task in tasks {
                match task.await.expect("task finished") {
                    Ok(pick) => picked.push(pick),
                    Err(PickError::AdmissionRejected(rejection)) => {
                        // Only a fallback choice over the cap is ever rejected.
                        assert!(["a", "c"].contains(&rejection.worker.as_str()), "{rejection}");
                    }
                    Err(other) => panic!("{flavor:?}: unexpected {other}"),
                }
            }
            let context = format!("{flavor:?} {key}");
            let scope = Scope::new(&ModelId::new("m"), super::fixture::BUCKET, Stage::Plain, &key)
                .expect("valid scope");
            let stored = store.get(&scope).expect("some pick was admitted and bound the key");
            let winner = stored.find_in(&engines).expect("the binding is a candidate");
            assert!(["b", "d"].contains(&winner.id().as_str()), "{context}: bound {winner:?}");
            assert!(
                picked.iter().all(|p| Arc::ptr_eq(&p.worker, winner)),
                "{context}: every successful pick returned the binding"
            );
            let bound = picked.iter().filter(|p| p.reason == PickReason::AffinityBound).count();
            assert_eq!(bound, 1, "{context}: exactly one pick created the binding");
        }
        assert_eq!(store.len(), KEYS);
    }
}
