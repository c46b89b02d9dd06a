//! Router-local in-flight accounting: one count per engine, guards released on completion,
//! error, panic and cancellation, the dispatch ledger, and a proptest that counts equal live
//! guards.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use router_workers::{Stage, WorkerId};

use super::*;
use crate::ManualClock;

fn id(s: &str) -> WorkerId {
    WorkerId::new(s).expect("id")
}

fn fixture() -> (Arc<ManualClock>, Inflight) {
    let clock = Arc::new(ManualClock::new());
    let inflight = Inflight::new(clock.clone());
    (clock, inflight)
}

#[test]
fn one_count_per_engine_over_stages() {
    let (_, inflight) = fixture();
    let (a, b) = (id("a"), id("b"));
    let g1 = inflight.acquire(&a, Stage::Prefill);
    let g2 = inflight.acquire(&a, Stage::Decode);
    let g3 = inflight.acquire(&b, Stage::Plain);
    assert_eq!(inflight.count(&a), 2);
    assert_eq!(inflight.count_stage(&a, Stage::Prefill), 1);
    assert_eq!(inflight.count_stage(&a, Stage::Plain), 0);
    assert_eq!((g1.worker(), g1.stage()), (&a, Stage::Prefill));
    drop(g1);
    assert_eq!(inflight.count(&a), 1);
    assert_eq!(inflight.counts(), vec![(a.clone(), 1), (b, 1)]);
    drop((g2, g3));
    assert_eq!(inflight.count(&a), 0);
    assert_eq!(inflight.count(&id("never")), 0);
    assert_eq!(inflight.dispatched_total(&a), 2, "releases do not undo dispatches");
}

fn forward(inflight: &Inflight, worker: &WorkerId, fail: bool) -> Result<u64, String> {
    let _guard = inflight.acquire(worker, Stage::Plain);
    if fail {
        return Err("engine answered 502".to_owned());
    }
    Ok(inflight.count(worker))
}

#[test]
fn released_on_completion_and_on_error() {
    let (_, inflight) = fixture();
    let a = id("a");
    assert_eq!(forward(&inflight, &a, false), Ok(1), "counted while in flight");
    assert_eq!(inflight.count(&a), 0);
    assert!(forward(&inflight, &a, true).is_err());
    assert_eq!(inflight.count(&a), 0);
}

#[test]
fn released_on_panic() {
    let (_, inflight) = fixture();
    let a = id("a");
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _guard = inflight.acquire(&a, Stage::Decode);
        assert_eq!(inflight.count(&a), 1);
        panic!("handler bug");
    }));
    assert!(result.is_err());
    assert_eq!(inflight.count(&a), 0);
}

#[tokio::test]
async fn released_when_the_request_future_is_cancelled() {
    let (_, inflight) = fixture();
    let inflight = Arc::new(inflight);
    let a = id("a");
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn({
        let inflight = Arc::clone(&inflight);
        let a = a.clone();
        async move {
            let _guard = inflight.acquire(&a, Stage::Plain);
            let _ = started_tx.send(());
            std::future::pending::<()>().await;
        }
    });
    started_rx.await.expect("task started");
    assert_eq!(inflight.count(&a), 1);
    task.abort();
    assert!(task.await.expect_err("aborted").is_cancelled());
    assert_eq!(inflight.count(&a), 0, "client disconnect drops the future and the guard");
}

#[test]
fn dispatched_since_counts_from_the_capture_time() {
    let (clock, inflight) = fixture();
    let a = id("a");
    let t0 = clock.now();
    drop(inflight.acquire(&a, Stage::Plain));
    clock.advance(Duration::from_millis(100));
    let captured = clock.now();
    drop(inflight.acquire(&a, Stage::Plain));
    let _held = inflight.acquire(&a, Stage::Plain);
    clock.advance(Duration::from_millis(100));
    drop(inflight.acquire(&a, Stage::Plain));
    assert_eq!(inflight.dispatched_since(&a, t0), 4);
    assert_eq!(inflight.dispatched_since(&a, captured), 3, "dispatches at the capture count");
    assert_eq!(inflight.dispatched_since(&a, captured + Duration::from_millis(1)), 1);
    assert_eq!(inflight.dispatched_since(&a, clock.now() + Duration::from_secs(1)), 0);
    assert_eq!(inflight.dispatched_since(&id("b"), t0), 0);
    let before_origin = t0.checked_sub(Duration::from_secs(1)).unwrap_or(t0);
    assert_eq!(inflight.dispatched_since(&a, before_origin), 4);
}

#[test]
fn work_is_counted_in_flight_and_in_the_ledger() {
    let (clock, inflight) = fixture();
    let (a, b) = (id("a"), id("b"));
    let t0 = clock.now();
    drop(inflight.acquire_work(&a, Stage::Plain, 100));
    clock.advance(Duration::from_millis(100));
    let captured = clock.now();
    let held = inflight.acquire_work(&a, Stage::Prefill, 30);
    let _other = inflight.acquire_work(&b, Stage::Plain, 7);
    let _free = inflight.acquire(&a, Stage::Decode);
    assert_eq!(inflight.inflight_tokens(&a), 30, "released work leaves the in-flight sum");
    assert_eq!(inflight.dispatched_tokens_since(&a, t0), 130);
    assert_eq!(
        inflight.dispatched_tokens_since(&a, captured),
        30,
        "a dispatch without work adds none"
    );
    assert_eq!(inflight.dispatched_since(&a, captured), 2);
    assert_eq!(inflight.dispatched_tokens_since(&a, clock.now() + Duration::from_secs(1)), 0);
    assert_eq!(inflight.dispatched_tokens_since(&id("never"), t0), 0);
    drop(held);
    assert_eq!(inflight.inflight_tokens(&a), 0);
    assert_eq!(
        inflight.dispatched_tokens_since(&a, captured),
        30,
        "the ledger keeps released work"
    );
    assert_eq!(inflight.inflight_tokens(&b), 7);
}

#[test]
fn prefilled_work_leaves_the_sum_while_the_request_stays_in_flight() {
    let (clock, inflight) = fixture();
    let a = id("a");
    let since = clock.now();
    let mut plain = inflight.acquire_work(&a, Stage::Plain, 100);
    let mut ranked = inflight.acquire_on_rank(&a, Stage::Plain, 1, 30);
    let _waiting = inflight.acquire_work(&a, Stage::Plain, 5);
    plain.prefilled();
    assert_eq!(inflight.inflight_tokens(&a), 35, "its first token came: no work left");
    assert_eq!(inflight.count(&a), 3, "but it is still in flight");
    plain.prefilled();
    assert_eq!(inflight.inflight_tokens(&a), 35, "a second call does nothing");
    ranked.prefilled();
    assert_eq!(inflight.rank_inflight(&a, 1), RankWork { requests: 1, tokens: 0 });
    assert_eq!(inflight.inflight_tokens(&a), 5);
    drop((plain, ranked));
    assert_eq!(inflight.inflight_tokens(&a), 5, "nothing is released twice");
    assert_eq!(inflight.rank_inflight(&a, 1), RankWork::default());
    assert_eq!(inflight.count(&a), 1);
    assert_eq!(inflight.dispatched_tokens_since(&a, since), 135, "the ledger says what was sent");
}

#[test]
fn unprefilled_counts_requests_until_their_first_token() {
    let (_, inflight) = fixture();
    let (a, b) = (id("a"), id("b"));
    let mut long = inflight.acquire_work(&a, Stage::Plain, 100);
    let mut empty = inflight.acquire(&a, Stage::Prefill);
    let never = inflight.acquire_on_rank(&a, Stage::Plain, 0, 8);
    let _elsewhere = inflight.acquire_work(&b, Stage::Plain, 1);
    assert_eq!(inflight.unprefilled(&a), 3, "a request without work waits for its token too");
    long.prefilled();
    long.prefilled();
    assert_eq!(inflight.unprefilled(&a), 2, "counted down once, however often it is called");
    empty.prefilled();
    assert_eq!(inflight.unprefilled(&a), 1, "zero-token requests are counted down as well");
    drop((long, empty));
    assert_eq!(inflight.unprefilled(&a), 1, "a prefilled guard's drop takes nothing more");
    drop(never);
    assert_eq!(inflight.unprefilled(&a), 0, "one that never got a token leaves on drop");
    assert_eq!((inflight.unprefilled(&b), inflight.unprefilled(&id("never"))), (1, 0));
}

#[test]
fn ledger_work_saturates_with_its_length() {
    let (clock, inflight) = fixture();
    let a = id("a");
    let start = clock.now();
    for _ in 0..LEDGER_LEN + 10 {
        clock.advance(Duration::from_micros(1));
        drop(inflight.acquire_work(&a, Stage::Plain, 2));
    }
    assert_eq!(inflight.dispatched_tokens_since(&a, start), 2 * LEDGER_LEN as u64);
    assert_eq!(inflight.dispatched_tokens_since(&a, clock.now()), 2);
}

#[test]
fn ledger_saturates_at_its_length() {
    let (clock, inflight) = fixture();
    let a = id("a");
    let start = clock.now();
    for _ in 0..LEDGER_LEN + 10 {
        clock.advance(Duration::from_micros(1));
        drop(inflight.acquire(&a, Stage::Plain));
    }
    assert_eq!(inflight.dispatched_since(&a, start), LEDGER_LEN as u64);
    assert_eq!(inflight.dispatched_since(&a, clock.now()), 1);
    assert_eq!(inflight.dispatched_total(&a), LEDGER_LEN as u64 + 10);
}

#[test]
fn removed_engine_starts_over_and_old_guards_release_elsewhere() {
    let (_, inflight) = fixture();
    let a = id("a");
    let old = inflight.acquire(&a, Stage::Plain);
    inflight.remove(&a);
    assert_eq!(inflight.count(&a), 0);
    let new = inflight.acquire(&a, Stage::Plain);
    drop(old);
    assert_eq!(inflight.count(&a), 1, "the old guard released into the forgotten counters");
    drop(new);
    assert_eq!(inflight.count(&a), 0);
}

#[test]
fn concurrent_acquire_and_release_balance() {
    let (_, inflight) = fixture();
    let inflight = Arc::new(inflight);
    let workers: Vec<WorkerId> = (0..4).map(|i| id(&format!("w{i}"))).collect();
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let inflight = Arc::clone(&inflight);
            let workers = workers.clone();
            std::thread::spawn(move || {
                for i in 0..2_000 {
                    let _g = inflight.acquire(&workers[(i + t) % workers.len()], Stage::Plain);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    let total: u64 = workers.iter().map(|w| inflight.dispatched_total(w)).sum();
    assert_eq!(total, 4_000);
    assert!(workers.iter().all(|w| inflight.count(w) == 0));
}

proptest! {
    /// Any interleaving of acquires and releases leaves each engine's count equal to its live
    /// guards, per stage and in total.
    #[test]
    fn count_equals_live_guards(ops in proptest::collection::vec((0usize..3, 0usize..3, any::<bool>()), 0..200)) {
        let (_, inflight) = fixture();
        let workers = [id("a"), id("b"), id("c")];
        let stages = [Stage::Plain, Stage::Prefill, Stage::Decode];
        let mut live: Vec<InflightGuard> = Vec::new();
        for (w, s, release) in ops {
            if release && !live.is_empty() {
                drop(live.swap_remove(w % live.len()));
            } else {
                live.push(inflight.acquire(&workers[w], stages[s]));
            }
            for worker in &workers {
                let expected = live.iter().filter(|g| g.worker() == worker).count() as u64;
                prop_assert_eq!(inflight.count(worker), expected);
                for stage in stages {
                    let expected = live.iter().filter(|g| g.worker() == worker && g.stage() == stage).count() as u64;
                    prop_assert_eq!(inflight.count_stage(worker, stage), expected);
                }
            }
        }
    }
}

#[test]
fn a_rank_counts_its_own_dispatches_beside_the_engine() {
    let (clock, inflight) = fixture();
    let a = id("a");
    let unranked = inflight.acquire_work(&a, Stage::Plain, 100);
    let on_one = inflight.acquire_on_rank(&a, Stage::Plain, 1, 30);
    let on_three = inflight.acquire_on_rank(&a, Stage::Prefill, 3, 7);
    assert_eq!(on_three.rank(), Some(3));
    assert_eq!(unranked.rank(), None);
    assert_eq!(inflight.count(&a), 3);
    assert_eq!(inflight.inflight_tokens(&a), 137);
    assert_eq!(inflight.rank_inflight(&a, 1), RankWork { requests: 1, tokens: 30 });
    assert_eq!(inflight.rank_inflight(&a, 3), RankWork { requests: 1, tokens: 7 });
    // A rank between two others, never dispatched to, and one beyond them all are empty.
    assert_eq!(inflight.rank_inflight(&a, 2), RankWork::default());
    assert_eq!(inflight.rank_inflight(&a, 9), RankWork::default());
    assert_eq!(inflight.rank_inflight(&id("never"), 0), RankWork::default());

    drop(on_one);
    assert_eq!(inflight.rank_inflight(&a, 1), RankWork::default());
    assert_eq!(inflight.inflight_tokens(&a), 107);
    drop((unranked, on_three));
    assert_eq!(inflight.rank_inflight(&a, 3), RankWork::default());
    assert_eq!(inflight.count(&a), 0);

    // The ledger keeps each dispatch's rank: only what went to a rank since an instant counts.
    let before = clock.now();
    clock.advance(Duration::from_millis(5));
    let since = clock.now();
    drop(inflight.acquire_on_rank(&a, Stage::Plain, 1, 11));
    drop(inflight.acquire_on_rank(&a, Stage::Plain, 0, 5));
    drop(inflight.acquire_work(&a, Stage::Plain, 1000));
    assert_eq!(inflight.rank_dispatched_since(&a, 1, since).tokens, 11);
    assert_eq!(inflight.rank_dispatched_since(&a, 0, since).tokens, 5);
    assert_eq!(inflight.rank_dispatched_since(&a, 1, before), RankWork { requests: 2, tokens: 41 });
    assert_eq!(inflight.rank_dispatched_since(&a, 2, before).tokens, 0);
    assert_eq!(inflight.dispatched_tokens_since(&a, since), 1016);
}

#[test]
fn the_running_pass_is_credited_with_the_work_done_since_it_began() {
    let (clock, inflight) = fixture();
    let a = id("a");
    // 1000 tokens/s: one token per millisecond.
    let rate = 1_000.0;
    assert_eq!(inflight.prefill_queue(&a, rate).tokens, 0, "an engine never seen has none");
    let mut first = inflight.acquire_work(&a, Stage::Plain, 400);
    clock.advance(Duration::from_millis(100));
    let _second = inflight.acquire_work(&a, Stage::Plain, 300);
    assert_eq!(
        inflight.prefill_queue(&a, rate).tokens,
        300 + 300,
        "100 ms into the first request's pass, 300 of its tokens are left; the second waits whole"
    );
    assert_eq!(inflight.prefill_queue(&a, rate).waiting, 1, "the second waits for the next pass");
    assert_eq!(inflight.prefill_queue(&a, f64::NAN).tokens, 700, "no credit without a usable rate");
    assert_eq!(inflight.prefill_queue(&a, 0.0).tokens, 700);
    clock.advance(Duration::from_millis(500));
    assert_eq!(
        inflight.prefill_queue(&a, rate).tokens,
        300,
        "a pass long done leaves only what waits"
    );
    first.prefilled();
    assert_eq!(
        inflight.prefill_queue(&a, rate),
        PrefillQueue { tokens: 300, waiting: 0 },
        "the next pass begins at the first token, with the second in it"
    );
    clock.advance(Duration::from_millis(250));
    assert_eq!(inflight.prefill_queue(&a, rate).tokens, 50);
    assert!(inflight.prefill_queue(&a, rate).tokens <= inflight.inflight_tokens(&a));
}

#[test]
fn a_dispatch_to_an_engine_with_nothing_waiting_begins_a_pass() {
    let (clock, inflight) = fixture();
    let a = id("a");
    let rate = 1_000.0;
    drop(inflight.acquire_work(&a, Stage::Plain, 100));
    clock.advance(Duration::from_secs(5));
    let _fresh = inflight.acquire_work(&a, Stage::Plain, 200);
    assert_eq!(
        inflight.prefill_queue(&a, rate),
        PrefillQueue { tokens: 200, waiting: 0 },
        "an idle engine gets no credit, and the dispatch is in the pass it begins"
    );
    let _next = inflight.acquire_work(&a, Stage::Plain, 70);
    assert_eq!(
        inflight.prefill_queue(&a, rate),
        PrefillQueue { tokens: 270, waiting: 1 },
        "one dispatched in the same instant, but after, waits for the next pass"
    );
    clock.advance(Duration::from_millis(50));
    assert_eq!(inflight.prefill_queue(&a, rate).tokens, 150 + 70);
}
