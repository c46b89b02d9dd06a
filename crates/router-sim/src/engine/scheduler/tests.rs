//! The timing model and the KV accounting, in paused tokio time.

use std::time::Duration;

use proptest::prelude::*;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::state::State;
use super::*;
use crate::engine::events::KvEvent;

const BS: usize = 4;

fn timing(prefill: f64, decode: f64) -> Timing {
    Timing { prefill_tokens_per_sec: prefill, decode_tokens_per_sec: decode }
}

struct Harness {
    scheduler: Arc<Scheduler>,
    events: mpsc::UnboundedReceiver<Vec<KvEvent>>,
    cancel: CancellationToken,
}

impl Harness {
    fn start(capacity: usize, max_running: usize, caching: bool, timing: Timing) -> Self {
        let (publisher, events) = Publisher::channel();
        let scheduler = Arc::new(Scheduler::new(
            0,
            BS,
            capacity,
            max_running,
            caching,
            timing,
            Some(publisher),
        ));
        let cancel = CancellationToken::new();
        tokio::spawn(Arc::clone(&scheduler).run(cancel.clone()));
        Self { scheduler, events, cancel }
    }

    fn submit(
        &self,
        prompt: Vec<u32>,
        output: usize,
        kind: Kind,
    ) -> mpsc::UnboundedReceiver<Progress> {
        let (tx, rx) = mpsc::unbounded_channel();
        let output = (0..output as u32).map(|i| 1000 + i).collect();
        self.scheduler.submit(Submission { prompt, output, kind, tx }).expect("submitted");
        rx
    }

    fn drain_events(&mut self) -> Vec<KvEvent> {
        let mut all = Vec::new();
        while let Ok(batch) = self.events.try_recv() {
            all.extend(batch);
        }
        all
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Progress of one request with the (paused) time of each step since `start`.
async fn follow(
    rx: &mut mpsc::UnboundedReceiver<Progress>,
    start: Instant,
) -> Vec<(Progress, Duration)> {
    let mut seen = Vec::new();
    while let Some(progress) = rx.recv().await {
        seen.push((progress, start.elapsed()));
        if progress == Progress::Done {
            break;
        }
    }
    seen
}

fn assert_near(got: Duration, expected: Duration) {
    // Tokio timers have millisecond resolution; the model itself is exact.
    assert!(
        got >= expected && got <= expected + Duration::from_millis(2),
        "got {got:?}, expected {expected:?}"
    );
}

fn prompt(len: u32, salt: u32) -> Vec<u32> {
    (0..len).map(|t| t + salt * 100_000).collect()
}

#[tokio::test(start_paused = true)]
async fn prefill_then_decode_costs_what_the_model_says() {
    let h = Harness::start(4096, 8, true, timing(1000.0, 10.0));
    let start = Instant::now();
    let mut rx = h.submit(prompt(500, 0), 5, Kind::Full);
    let seen = follow(&mut rx, start).await;
    assert_eq!(seen.len(), 6, "first, 4 tokens, done: {seen:?}");
    assert_eq!(seen[0].0, Progress::First { cached_tokens: 0 });
    // 500 uncached tokens at 1000/s, then 4 decode steps at 10/s.
    assert_near(seen[0].1, Duration::from_millis(500));
    assert_near(seen[4].1, Duration::from_millis(900));
    assert_eq!(seen[5].0, Progress::Done);
    let load = h.scheduler.load();
    assert_eq!(load.total_prefill_uncached_tokens, 500);
    assert_eq!(load.total_prefill_busy_us, 500_000);
}

#[tokio::test(start_paused = true)]
async fn a_repeated_prompt_reuses_its_cached_blocks() {
    let h = Harness::start(4096, 8, true, timing(1000.0, 1000.0));
    let p = prompt(402, 0);
    let mut rx = h.submit(p.clone(), 1, Kind::Full);
    follow(&mut rx, Instant::now()).await;
    let start = Instant::now();
    let mut rx = h.submit(p, 1, Kind::Full);
    let seen = follow(&mut rx, start).await;
    // 402 tokens = 100 full blocks of 4 (+2); all 100 are reused.
    assert_eq!(seen[0].0, Progress::First { cached_tokens: 400 });
    assert_near(seen[0].1, Duration::from_millis(2));

    // A prompt that is exactly 100 blocks long reuses 99: its last token is always computed.
    let mut rx = h.submit(prompt(400, 0), 1, Kind::Full);
    let seen = follow(&mut rx, Instant::now()).await;
    assert_eq!(seen[0].0, Progress::First { cached_tokens: 396 });
    assert_eq!(h.scheduler.load().cache_hit_rate, (400.0 + 396.0) / (402.0 * 2.0 + 400.0));
}

#[tokio::test(start_paused = true)]
async fn requests_beyond_max_running_wait_their_turn() {
    let h = Harness::start(4096, 1, true, timing(1000.0, 100.0));
    let start = Instant::now();
    let mut a = h.submit(prompt(100, 0), 3, Kind::Full);
    let mut b = h.submit(prompt(100, 1), 3, Kind::Full);
    tokio::task::yield_now().await;
    let (a, b) = tokio::join!(follow(&mut a, start), follow(&mut b, start));
    // a: prefill 100 ms, 2 steps of 10 ms. b starts after a is done.
    assert_near(a[3].1, Duration::from_millis(120));
    assert_near(b[0].1, Duration::from_millis(220));
    assert_near(b[3].1, Duration::from_millis(240));
}

#[tokio::test(start_paused = true)]
async fn running_requests_share_passes() {
    let h = Harness::start(4096, 8, true, timing(1000.0, 100.0));
    let start = Instant::now();
    let mut a = h.submit(prompt(100, 0), 11, Kind::Full);
    let mut b = h.submit(prompt(100, 1), 11, Kind::Full);
    let (a, b) = tokio::join!(follow(&mut a, start), follow(&mut b, start));
    // One prefill pass for both (200 tokens), then 10 shared decode steps.
    for seen in [&a, &b] {
        assert_near(seen[0].1, Duration::from_millis(200));
        assert_near(seen[11].1, Duration::from_millis(300));
    }
}

#[tokio::test(start_paused = true)]
async fn pd_decode_skips_prefill_and_reports_the_prefill_cache() {
    let h = Harness::start(4096, 8, false, timing(1.0, 100.0));
    let start = Instant::now();
    let mut rx = h.submit(prompt(1000, 0), 3, Kind::Decode { cached_tokens: 640 });
    let seen = follow(&mut rx, start).await;
    assert_eq!(seen[0].0, Progress::First { cached_tokens: 640 });
    assert_near(seen[0].1, Duration::from_millis(10));
    assert_near(seen[2].1, Duration::from_millis(30));
    let mut h = h;
    assert!(h.drain_events().is_empty(), "decode engines publish nothing");
    assert_eq!(h.scheduler.load().total_prefill_uncached_tokens, 0);
}

#[tokio::test(start_paused = true)]
async fn stored_events_chain_prompt_and_output_blocks() {
    let mut h = Harness::start(4096, 8, true, timing(1000.0, 1000.0));
    let p = prompt(10, 0);
    // 10 prompt tokens + 7 output: KV computed for 16 tokens = 4 full blocks.
    let mut rx = h.submit(p.clone(), 7, Kind::Full);
    follow(&mut rx, Instant::now()).await;
    let events = h.drain_events();
    let stored: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            KvEvent::Stored { hashes, parent, token_ids } => {
                Some((hashes.clone(), *parent, token_ids.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(stored.len(), 3, "prompt blocks, then two output blocks as they fill: {stored:?}");
    let mut seq = p;
    seq.extend(1000..1007);
    let expected = crate::engine::cache::chain_hashes(None, &seq[..16], BS);
    assert_eq!(stored[0], (expected[..2].to_vec(), None, seq[..8].to_vec()));
    assert_eq!(stored[1], (vec![expected[2]], Some(expected[1]), seq[8..12].to_vec()));
    assert_eq!(stored[2], (vec![expected[3]], Some(expected[2]), seq[12..16].to_vec()));
}

#[tokio::test(start_paused = true)]
async fn full_kv_evicts_lru_blocks_and_queues_what_cannot_fit() {
    // 32 tokens = 8 blocks. Each request needs 6 blocks (20 prompt + 4 output).
    let mut h = Harness::start(32, 8, true, timing(1000.0, 100.0));
    let start = Instant::now();
    let mut a = h.submit(prompt(20, 0), 4, Kind::Full);
    let mut b = h.submit(prompt(20, 1), 4, Kind::Full);
    let (a, b) = tokio::join!(follow(&mut a, start), follow(&mut b, start));
    // b could not be admitted beside a: it starts after a finishes (20 ms + 3 steps).
    assert_near(a[4].1, Duration::from_millis(50));
    assert_near(b[0].1, Duration::from_millis(70));
    let events = h.drain_events();
    let removed: usize = events
        .iter()
        .map(|e| match e {
            KvEvent::Removed { hashes } => hashes.len(),
            _ => 0,
        })
        .sum();
    // a left 5 blocks cached (23 tokens of KV); b needs 6 of the 8: 3 of a's are evicted.
    assert_eq!(removed, 3, "b's admission evicted a's blocks: {events:?}");
    h.scheduler.with_state(State::check);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_leaves_frees_its_slot() {
    let h = Harness::start(4096, 1, true, timing(1000.0, 10.0));
    let a = h.submit(prompt(10, 0), 1000, Kind::Full);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(h.scheduler.load().running, 1);
    drop(a);
    let start = Instant::now();
    let mut b = h.submit(prompt(10, 1), 1, Kind::Full);
    let seen = follow(&mut b, start).await;
    // At most the rest of a's current decode step (10 ms), then b's 10 ms prefill; had a
    // kept its slot, b would wait for its 1000 tokens (100 s).
    assert!(seen[0].1 <= Duration::from_millis(21), "{:?}", seen[0].1);
    assert_eq!(h.scheduler.load().running, 0);
    h.scheduler.with_state(|s| assert_eq!(s.cached_blocks(), 4));
}

#[tokio::test(start_paused = true)]
async fn load_reports_queue_and_kv_while_busy() {
    let h = Harness::start(4096, 1, true, timing(1000.0, 10.0));
    let mut a = h.submit(prompt(40, 0), 100, Kind::Full);
    assert!(matches!(a.recv().await, Some(Progress::First { .. })));
    let _b = h.submit(prompt(30, 1), 5, Kind::Full);
    let load = h.scheduler.load();
    assert_eq!((load.running, load.waiting), (1, 1));
    assert_eq!(load.waiting_uncached_tokens, 30);
    // a holds 40 prompt tokens of KV (10 cached blocks).
    assert_eq!(load.kv_used_tokens, 40);
    assert_eq!(load.total_kv_tokens, 70);
    assert_eq!(load.kv_capacity_tokens, 4096);
    assert_eq!(load.max_running, 1);
}

#[tokio::test(start_paused = true)]
async fn flush_clears_only_when_idle() {
    let mut h = Harness::start(4096, 4, true, timing(1000.0, 10.0));
    let mut a = h.submit(prompt(40, 0), 3, Kind::Full);
    assert!(matches!(a.recv().await, Some(Progress::First { .. })));
    assert_eq!(h.scheduler.flush_cache(), Err(1));
    follow(&mut a, Instant::now()).await;
    h.drain_events();
    assert_eq!(h.scheduler.flush_cache(), Ok(()));
    assert_eq!(h.drain_events(), vec![KvEvent::Cleared]);
    h.scheduler.with_state(|s| assert_eq!(s.cached_blocks(), 0));
}

#[test]
fn prompts_that_cannot_fit_are_refused_and_outputs_are_cut() {
    let mut state = State::new(BS, 64, 4, true);
    let (tx, _rx) = mpsc::unbounded_channel();
    let submission = |len: u32, out: usize| Submission {
        prompt: prompt(len, 0),
        output: vec![7; out],
        kind: Kind::Full,
        tx: tx.clone(),
    };
    assert_eq!(
        state.submit(submission(64, 1)),
        Err(SubmitError::TooLong { prompt: 64, capacity: 64 })
    );
    assert_eq!(state.submit(submission(8, 0)), Err(SubmitError::NoOutput));
    assert_eq!(state.output_room(60), Some(4));
    assert!(state.submit(submission(60, 100)).is_ok());
}

#[derive(Clone, Debug)]
enum Op {
    Submit { prefix: u32, len: u32, out: usize, decode: bool },
    Step,
    Leave(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u32..3, 1u32..40, 1usize..12, any::<bool>())
            .prop_map(|(prefix, len, out, decode)| Op::Submit { prefix, len, out, decode }),
        Just(Op::Step),
        Just(Op::Step),
        (0usize..8).prop_map(Op::Leave),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Whatever arrives, the KV accounting never exceeds capacity, reservations match the
    /// running requests, and once every request has finished or left nothing stays
    /// referenced and the events replay to the cached set.
    #[test]
    fn kv_accounting_holds(ops in prop::collection::vec(op(), 1..80)) {
        let mut state = State::new(BS, 96, 3, true);
        let mut receivers = Vec::new();
        let mut cached = std::collections::HashSet::new();
        let now = Instant::now();
        let apply_events = |state: &mut State, cached: &mut std::collections::HashSet<u64>| {
            for event in state.take_events() {
                match event {
                    KvEvent::Stored { hashes, .. } => cached.extend(hashes),
                    KvEvent::Removed { hashes } => {
                        for h in hashes { assert!(cached.remove(&h)); }
                    }
                    KvEvent::Cleared => cached.clear(),
                }
            }
        };
        for op in ops {
            match op {
                Op::Submit { prefix, len, out, decode } => {
                    let (tx, rx) = mpsc::unbounded_channel();
                    let mut p: Vec<u32> = (0..16).map(|t| t + prefix * 1000).collect();
                    p.extend(0..len);
                    let kind = if decode { Kind::Decode { cached_tokens: 3 } } else { Kind::Full };
                    let _ = state.submit(Submission { prompt: p, output: vec![9; out], kind, tx });
                    receivers.push(rx);
                }
                Op::Step => match state.plan() {
                    state::Pass::Prefill { uncached_tokens } => state.finish_prefill(uncached_tokens, 1),
                    state::Pass::Decode => state.finish_decode(now),
                    state::Pass::Idle => {}
                },
                Op::Leave(i) if !receivers.is_empty() => {
                    let i = i % receivers.len();
                    receivers.remove(i);
                }
                Op::Leave(_) => {}
            }
            state.check();
            apply_events(&mut state, &mut cached);
            prop_assert_eq!(cached.len(), state.cached_blocks());
        }
        for _ in 0..10_000 {
            match state.plan() {
                state::Pass::Prefill { uncached_tokens } => state.finish_prefill(uncached_tokens, 1),
                state::Pass::Decode => state.finish_decode(now),
                state::Pass::Idle => break,
            }
            state.check();
        }
        apply_events(&mut state, &mut cached);
        let load = state.load(0, now);
        prop_assert_eq!((load.running, load.waiting, load.kv_used_tokens), (0, 0, 0));
        prop_assert_eq!(cached.len(), state.cached_blocks());
    }
}

#[test]
fn unnamed_requests_take_the_ranks_in_turn_and_named_ones_their_rank() {
    let schedulers: Vec<Arc<Scheduler>> = (0..3)
        .map(|rank| Arc::new(Scheduler::new(rank, BS, 1024, 4, true, timing(1e6, 1e3), None)))
        .collect();
    let ranks = Ranks::new(schedulers);
    let rank_of = |requested| ranks.pick(requested).map(|s| s.rank);
    assert_eq!(
        [None, None, None, None].map(rank_of),
        [Ok(0), Ok(1), Ok(2), Ok(0)],
        "the engine's own balancer"
    );
    assert_eq!(rank_of(Some(2)), Ok(2));
    assert_eq!(rank_of(Some(3)), Err(NoSuchRank { rank: 3, dp_size: 3 }));
    assert_eq!(
        NoSuchRank { rank: 3, dp_size: 3 }.to_string(),
        "data_parallel_rank 3 is out of range (dp_size 3)"
    );
    let snapshot = LoadSource::new(Arc::new(ranks)).snapshot();
    assert_eq!(snapshot.ranks.iter().map(|r| r.dp_rank).collect::<Vec<_>>(), vec![0, 1, 2]);
}
