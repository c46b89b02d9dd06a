//! Store-level tests: concurrency, expiry with paused time, eviction at the cap, scope
//! isolation, and invalidation through a real `WorkerRegistry`.

use std::sync::Arc;
use std::time::Duration;

use router_test_support::settle;
use router_workers::{ModelId, Stage, Worker, WorkerRegistry};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{AffinityConfig, AffinityStore, Binding, Scope, follow_registry, run_sweeper};

fn model() -> ModelId {
    ModelId::new("m")
}

fn worker(id: &str) -> Worker {
    Worker::plain(id, "http://127.0.0.1:9", &model()).expect("valid worker")
}

fn scope(key: &str) -> Scope {
    Scope::new(&model(), "bucket", Stage::Plain, key).expect("valid scope")
}

fn store_with(config: AffinityConfig) -> Arc<AffinityStore> {
    Arc::new(AffinityStore::new(config).expect("valid config"))
}

fn store() -> Arc<AffinityStore> {
    store_with(AffinityConfig::default())
}

/// Gives spawned tasks on a current-thread runtime a few turns to run (to subscribe, or to
/// register a timer).
async fn let_tasks_run() {
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_binds_converge_on_one_binding() {
    const TASKS: usize = 32;
    let registry = WorkerRegistry::new();
    let candidates: Vec<Arc<Worker>> =
        (0..TASKS).map(|i| registry.add(worker(&format!("w{i:02}"))).expect("added")).collect();
    let store = store();
    for round in 0..8 {
        let scope = scope(&format!("session-{round}"));
        let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
        let tasks: Vec<_> = candidates
            .iter()
            .map(|mine| {
                let (store, scope, barrier, mine) =
                    (store.clone(), scope.clone(), barrier.clone(), mine.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    match store.bind(&scope, Binding::of(&mine)) {
                        Ok(()) => (true, Binding::of(&mine)),
                        Err(winner) => (false, winner),
                    }
                })
            })
            .collect();
        let mut winners = 0;
        let mut effective = Vec::new();
        for task in tasks {
            let (won, binding) = task.await.expect("task finished");
            winners += usize::from(won);
            effective.push(binding);
        }
        assert_eq!(winners, 1, "round {round}: exactly one bind creates the binding");
        let stored = store.get(&scope).expect("bound");
        assert!(effective.iter().all(|b| *b == stored), "round {round}: all see the winner");
        assert!(stored.find_in(&candidates).is_some(), "the winner is one of the candidates");
    }
    assert_eq!(store.len(), 8);
    assert_eq!(store.stats().bound, 8);
}

#[test]
fn concurrent_replaces_from_threads_apply_exactly_once() {
    let a = worker("a");
    let others: Vec<Worker> = (0..8).map(|i| worker(&format!("w{i}"))).collect();
    let store = store();
    let scope = scope("k");
    assert_eq!(store.bind(&scope, Binding::of(&a)), Ok(()));
    let barrier = std::sync::Barrier::new(others.len());
    let outcomes: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = others
            .iter()
            .map(|new| {
                let (store, scope, barrier, expected) = (&store, &scope, &barrier, Binding::of(&a));
                s.spawn(move || {
                    barrier.wait();
                    store.replace(scope, &expected, Binding::of(new))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("thread finished")).collect()
    });
    let winners: Vec<_> = outcomes.iter().filter(|o| o.is_ok()).collect();
    assert_eq!(winners.len(), 1, "only one replace can see the expected binding");
    let current = store.get(&scope).expect("still bound");
    assert_ne!(current, Binding::of(&a));
    for outcome in &outcomes {
        if let Err(actual) = outcome {
            assert_eq!(actual.as_ref(), Some(&current), "losers are told the winner");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn idle_bindings_expire_and_use_refreshes_them() {
    let store = store();
    let a = worker("a");
    let idle = store.config().idle_timeout;
    assert_eq!(idle, Duration::from_secs(600));
    let used = scope("used");
    let unused = scope("unused");
    assert_eq!(store.bind(&used, Binding::of(&a)), Ok(()));
    assert_eq!(store.bind(&unused, Binding::of(&a)), Ok(()));

    tokio::time::advance(idle - Duration::from_secs(1)).await;
    assert_eq!(store.get(&used), Some(Binding::of(&a)), "alive one second before the timeout");
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(store.get(&unused), None, "expired at the timeout, before any sweep");
    assert_eq!(store.get(&used), Some(Binding::of(&a)), "the lookup at 599 s refreshed it");

    // Expired but not yet swept: it occupies memory until the sweep frees it.
    tokio::time::advance(idle).await;
    assert_eq!(store.len(), 1);
    assert_eq!(store.sweep(Instant::now()), 1);
    assert!(store.is_empty());
    assert_eq!(store.stats().expired, 2);
}

#[tokio::test(start_paused = true)]
async fn sweep_frees_exactly_the_idle_bindings() {
    let store = store();
    let a = worker("a");
    assert_eq!(store.bind(&scope("old"), Binding::of(&a)), Ok(()));
    tokio::time::advance(Duration::from_secs(300)).await;
    assert_eq!(store.bind(&scope("new"), Binding::of(&a)), Ok(()));
    tokio::time::advance(Duration::from_secs(299)).await;
    assert_eq!(store.sweep(Instant::now()), 0, "nothing is idle for 600 s yet");
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(store.sweep(Instant::now()), 1);
    assert_eq!(store.get(&scope("new")), Some(Binding::of(&a)));
    assert_eq!(store.get(&scope("old")), None);
    // A stale `now` expires nothing.
    let later = Instant::now() + Duration::from_secs(10_000);
    assert_eq!(store.sweep(Instant::now() - Duration::from_secs(1)), 0);
    assert_eq!(store.sweep(later), 1);
}

#[tokio::test(start_paused = true)]
async fn sweeper_task_expires_bindings_on_its_interval_and_stops_on_cancel() {
    let store = store_with(AffinityConfig {
        idle_timeout: Duration::from_secs(100),
        sweep_interval: Duration::from_secs(60),
        ..AffinityConfig::default()
    });
    let cancel = CancellationToken::new();
    let sweeper = tokio::spawn(run_sweeper(store.clone(), cancel.clone()));
    let_tasks_run().await;
    assert_eq!(store.bind(&scope("k"), Binding::of(&worker("a"))), Ok(()));

    // Sweeps at 60 s find nothing idle for 100 s; the one at 120 s frees it.
    tokio::time::advance(Duration::from_secs(61)).await;
    let_tasks_run().await;
    assert_eq!(store.len(), 1);
    tokio::time::advance(Duration::from_secs(60)).await;
    settle("second sweep frees the binding", || store.is_empty()).await;
    assert_eq!(store.stats().expired, 1);

    cancel.cancel();
    sweeper.await.expect("sweeper stops on cancel");
}

#[test]
fn a_full_store_evicts_the_least_recently_used_binding() {
    let store = store_with(AffinityConfig { max_entries: 3, ..AffinityConfig::default() });
    let (a, b) = (worker("a"), worker("b"));
    for key in ["k0", "k1", "k2"] {
        assert_eq!(store.bind(&scope(key), Binding::of(&a)), Ok(()));
    }
    // Use order now: k0 (oldest), k1, k2. Each kind of use moves a binding to the fresh end.
    assert!(store.get(&scope("k0")).is_some());
    assert_eq!(store.replace(&scope("k1"), &Binding::of(&a), Binding::of(&b)), Ok(()));
    // Order: k2, k0, k1.
    assert_eq!(store.bind(&scope("k3"), Binding::of(&a)), Ok(()));
    assert_eq!(store.get(&scope("k2")), None, "k2 was the least recently used");
    // Order: k0, k1, k3. A losing bind is a use too.
    assert_eq!(store.bind(&scope("k0"), Binding::of(&b)), Err(Binding::of(&a)));
    assert_eq!(store.bind(&scope("k4"), Binding::of(&a)), Ok(()));
    assert_eq!(store.get(&scope("k1")), None, "k1 was the least recently used");
    for key in ["k0", "k3", "k4"] {
        assert!(store.get(&scope(key)).is_some(), "{key} survives");
    }
    assert_eq!(store.len(), 3);
    assert_eq!(store.stats().evicted, 2);
}

#[test]
fn scopes_that_differ_in_any_part_hold_separate_bindings() {
    let store = store();
    let (a, b) = (worker("a"), worker("b"));
    let m = |name: &str| ModelId::new(name);
    let first = Scope::new(&m("a:b"), "c", Stage::Prefill, "k").expect("valid");
    let split_elsewhere = Scope::new(&m("a"), "b:c", Stage::Prefill, "k").expect("valid");
    let other_stage = Scope::new(&m("a:b"), "c", Stage::Decode, "k").expect("valid");
    let other_bucket = Scope::new(&m("a:b"), "c2", Stage::Prefill, "k").expect("valid");
    let bucket_key_split = Scope::new(&m("a:b"), "c|1:k", Stage::Prefill, "").err();
    assert!(bucket_key_split.is_some(), "empty keys never make a scope");

    assert_eq!(store.bind(&first, Binding::of(&a)), Ok(()));
    for other in [&split_elsewhere, &other_stage, &other_bucket] {
        assert_eq!(store.get(other), None, "{other:?} must not see {first:?}");
        assert_eq!(store.bind(other, Binding::of(&b)), Ok(()));
    }
    assert_eq!(store.get(&first), Some(Binding::of(&a)));
    assert_eq!(store.len(), 4);
}

#[test]
fn replace_requires_the_expected_binding() {
    let store = store();
    let (a, b, c) = (worker("a"), worker("b"), worker("c"));
    let k = scope("k");
    assert_eq!(store.replace(&k, &Binding::of(&a), Binding::of(&b)), Err(None));
    assert_eq!(store.get(&k), None, "a failed replace creates nothing");
    assert_eq!(store.bind(&k, Binding::of(&a)), Ok(()));
    assert_eq!(store.replace(&k, &Binding::of(&c), Binding::of(&b)), Err(Some(Binding::of(&a))));
    // Same id, other incarnation: not the expected binding.
    let a_again = worker("a");
    assert_eq!(
        store.replace(&k, &Binding::of(&a_again), Binding::of(&b)),
        Err(Some(Binding::of(&a)))
    );
    assert_eq!(store.replace(&k, &Binding::of(&a), Binding::of(&b)), Ok(()));
    assert_eq!(store.get(&k), Some(Binding::of(&b)));
    assert_eq!(store.stats().replaced, 1);
}

#[test]
fn invalidation_by_id_and_by_incarnation() {
    let store = store();
    let (a_old, a_new, b) = (worker("a"), worker("a"), worker("b"));
    assert_eq!(store.bind(&scope("old"), Binding::of(&a_old)), Ok(()));
    assert_eq!(store.bind(&scope("new"), Binding::of(&a_new)), Ok(()));
    assert_eq!(store.bind(&scope("b"), Binding::of(&b)), Ok(()));

    assert_eq!(store.invalidate_incarnation(&a_old), 1);
    assert_eq!(store.get(&scope("new")), Some(Binding::of(&a_new)));
    assert_eq!(store.bind(&scope("old"), Binding::of(&a_old)), Ok(()));
    assert_eq!(store.invalidate_worker(a_old.id()), 2, "every incarnation of the id");
    assert_eq!(store.get(&scope("b")), Some(Binding::of(&b)));
    assert_eq!(store.len(), 1);
    assert_eq!(store.stats().invalidated, 3);
}

#[tokio::test]
async fn bindings_of_a_removed_worker_are_invalidated() {
    let registry = Arc::new(WorkerRegistry::new());
    let a = registry.add(worker("a")).expect("added");
    let b = registry.add(worker("b")).expect("added");
    let gone = worker("gone");
    let store = store();
    // Made before the follower starts, to an engine not in the registry: dropped on start.
    assert_eq!(store.bind(&scope("gone"), Binding::of(&gone)), Ok(()));
    let cancel = CancellationToken::new();
    let follower = tokio::spawn(follow_registry(store.clone(), registry.clone(), cancel.clone()));
    settle("start-up resync", || store.get(&scope("gone")).is_none()).await;

    // Made while following, so only the feed can remove them.
    assert_eq!(store.bind(&scope("s1"), Binding::of(&a)), Ok(()));
    assert_eq!(store.bind(&scope("s2"), Binding::of(&b)), Ok(()));
    assert_eq!(store.bind(&scope("s3"), Binding::of(&a)), Ok(()));
    registry.remove(a.id()).expect("removed");
    settle("removal invalidates", || store.len() == 1).await;
    assert_eq!(store.get(&scope("s2")), Some(Binding::of(&b)));
    assert_eq!(store.get(&scope("s1")), None);

    // Health changes keep bindings: an unhealthy engine is simply not a candidate meanwhile.
    registry.set_health(b.id(), false).expect("known worker");
    registry.set_health(b.id(), true).expect("known worker");
    registry.remove(b.id()).expect("removed");
    settle("second removal", || store.is_empty()).await;

    cancel.cancel();
    follower.await.expect("follower stops on cancel");
}

#[tokio::test]
async fn replacement_keeps_bindings_already_moved_to_the_new_engine() {
    let registry = Arc::new(WorkerRegistry::new());
    let old = registry.add(worker("a")).expect("added");
    let store = store();
    let cancel = CancellationToken::new();
    let follower = tokio::spawn(follow_registry(store.clone(), registry.clone(), cancel.clone()));
    let_tasks_run().await;

    assert_eq!(store.bind(&scope("moved"), Binding::of(&old)), Ok(()));
    assert_eq!(store.bind(&scope("stale"), Binding::of(&old)), Ok(()));
    let new = registry.replace(worker("a")).expect("replaced");
    // Before the follower hears of it, a policy moves one session to the new engine.
    assert_eq!(store.replace(&scope("moved"), &Binding::of(&old), Binding::of(&new)), Ok(()));
    settle("old incarnation invalidated", || store.len() == 1).await;
    assert_eq!(store.get(&scope("moved")), Some(Binding::of(&new)));

    cancel.cancel();
    follower.await.expect("follower stops on cancel");
}

#[tokio::test]
async fn a_follower_that_lags_behind_resynchronises() {
    let registry = Arc::new(WorkerRegistry::new());
    let a = registry.add(worker("a")).expect("added");
    let b = registry.add(worker("b")).expect("added");
    let store = store();
    let cancel = CancellationToken::new();
    let follower = tokio::spawn(follow_registry(store.clone(), registry.clone(), cancel.clone()));
    let_tasks_run().await;
    assert_eq!(store.bind(&scope("a"), Binding::of(&a)), Ok(()));
    assert_eq!(store.bind(&scope("b"), Binding::of(&b)), Ok(()));

    // Without yielding, push the removal of `a` out of the feed's 1024-event buffer.
    registry.remove(a.id()).expect("removed");
    for i in 0..600 {
        let id = registry.add(worker(&format!("churn{i}"))).expect("added").id().clone();
        registry.remove(&id).expect("removed");
    }
    settle("resync after lag", || store.get(&scope("a")).is_none()).await;
    assert_eq!(store.get(&scope("b")), Some(Binding::of(&b)));

    cancel.cancel();
    follower.await.expect("follower stops on cancel");
}
