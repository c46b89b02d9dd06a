//! The engine-reported load table under a manual clock: freshness on receipt, sequences and
//! instances, rank completeness, rejected and rate-limited reports, replaced and removed
//! workers, snapshots and change signals.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use router_workers::{ModelId, Stage, Worker, WorkerId, WorkerSpec};

use super::*;
use crate::{ManualClock, RankSample, Report, ReportKind};

fn worker(id: &str, dp_size: u32) -> Worker {
    let spec = WorkerSpec { dp_size, ..WorkerSpec::new(id, "http://127.0.0.1:1", Stage::Plain) };
    Worker::from_spec(&spec, vec![ModelId::new("m")]).expect("valid worker")
}

fn id(s: &str) -> WorkerId {
    WorkerId::new(s).expect("id")
}

struct Fixture {
    clock: Arc<ManualClock>,
    table: EngineReportedLoadTable,
}

impl Fixture {
    fn new() -> Self {
        Self::with_config(TableConfig::default())
    }

    fn with_config(config: TableConfig) -> Self {
        let clock = Arc::new(ManualClock::new());
        let table = EngineReportedLoadTable::new(config, clock.clone());
        Self { clock, table }
    }

    fn add(&self, name: &str, dp_size: u32) -> Worker {
        let w = worker(name, dp_size);
        self.table.register(&w);
        w
    }

    fn apply(&self, w: &Worker, report: Report) -> Result<ReportKind, RejectReason> {
        self.table.apply(w.id(), w.incarnation(), report)
    }

    fn load(&self, w: &Worker) -> Option<EngineLoad> {
        self.table.snapshot().get(w.id()).copied()
    }

    fn status(&self, w: &Worker) -> EngineLoadStatus {
        self.table.status_of(w.id()).expect("registered")
    }
}

fn native(rank: u32, running: u64) -> RankSample {
    RankSample::basic(rank, running, 1, 100, 1000).with_native(10, 200, 64)
}

fn report(w: &Worker, instance: u64, seq: u64, ranks: Vec<RankSample>) -> Report {
    let mut report = Report::new(w.id().as_str(), instance, seq, ReportKind::Native, ranks);
    report.dp_size = w.dp_size();
    report
}

#[test]
fn unregistered_engine_is_missing_and_its_reports_never_create_it() {
    let f = Fixture::new();
    let w = f.add("a", 1);
    assert_eq!(f.load(&w), None);
    assert_eq!(f.status(&w).freshness, Freshness::Missing);
    assert_eq!(f.status(&w).missing_reason, Some(MissingReason::NoReport));

    let ghost = worker("ghost", 1);
    let err = f.apply(&ghost, report(&ghost, 1, 1, vec![native(0, 1)]));
    assert_eq!(err, Err(RejectReason::UnknownEngine));
    assert!(f.table.status_of(ghost.id()).is_none());
    assert_eq!(f.table.snapshot().get(ghost.id()), None);
    assert_eq!(f.table.totals().rejected.get(RejectReason::UnknownEngine), 1);
}

#[test]
fn fresh_until_the_window_after_receipt_then_stale() {
    let f = Fixture::new();
    let w = f.add("a", 1);
    assert_eq!(f.apply(&w, report(&w, 1, 1, vec![native(0, 5)])), Ok(ReportKind::Native));
    let load = f.load(&w).expect("fresh");
    assert_eq!(load.running_requests, 5);
    f.clock.advance(Duration::from_millis(2999));
    assert!(f.load(&w).is_some());
    assert_eq!(f.status(&w).freshness, Freshness::Fresh);
    assert_eq!(f.status(&w).age_ms, Some(2999));
    f.clock.advance(Duration::from_millis(1));
    assert_eq!(f.load(&w), None, "stale reads as None, never zero");
    let status = f.status(&w);
    assert_eq!((status.freshness, status.kind), (Freshness::Stale, Some(ReportKind::Native)));
}

#[test]
fn window_grows_with_the_stated_interval_up_to_the_cap() {
    let f = Fixture::new();
    let w = f.add("a", 1);
    let mut slow = report(&w, 1, 1, vec![native(0, 5)]);
    slow.interval = Some(Duration::from_secs(2));
    f.apply(&w, slow).expect("accepted");
    f.clock.advance(Duration::from_millis(5999));
    assert!(f.load(&w).is_some(), "3 intervals of 2 s");
    f.clock.advance(Duration::from_millis(1));
    assert!(f.load(&w).is_none());

    let mut huge = report(&w, 1, 2, vec![native(0, 5)]);
    huge.interval = Some(Duration::from_secs(86_400));
    f.apply(&w, huge).expect("accepted");
    assert_eq!(f.status(&w).stale_after, Duration::from_secs(60));
    f.clock.advance(Duration::from_secs(60));
    assert!(f.load(&w).is_none(), "an engine cannot keep itself fresh for days");
}

#[test]
fn a_report_already_too_old_on_arrival_is_stale() {
    let f = Fixture::new();
    let w = f.add("a", 2);
    let old = RankSample { age: Duration::from_secs(4), ..native(1, 1) };
    f.apply(&w, report(&w, 1, 1, vec![native(0, 1), old])).expect("accepted");
    assert_eq!(f.load(&w), None);
    assert_eq!(f.status(&w).freshness, Freshness::Stale);
}

#[test]
fn aggregate_is_as_old_as_its_oldest_rank() {
    let f = Fixture::new();
    let w = f.add("a", 2);
    let now = f.clock.now();
    let a = RankSample { age: Duration::from_millis(10), ..native(0, 1) };
    let b = RankSample { age: Duration::from_millis(300), ..native(1, 2) };
    f.apply(&w, report(&w, 1, 1, vec![a, b])).expect("accepted");
    let load = f.load(&w).expect("fresh");
    assert_eq!(load.captured_at, now - Duration::from_millis(300));
    assert_eq!(load.received_at, now);
    assert_eq!(load.running_requests, 3);
    assert_eq!(load.native.expect("native").total_kv_tokens, 400);
}

#[test]
fn sequence_must_increase_within_an_instance() {
    let f = Fixture::new();
    let w = f.add("a", 1);
    f.apply(&w, report(&w, 7, 10, vec![native(0, 1)])).expect("first");
    for seq in [10, 9, 0] {
        let back = f.apply(&w, report(&w, 7, seq, vec![native(0, 99)]));
        assert_eq!(back, Err(RejectReason::SequenceWentBack), "{seq}");
    }
    assert_eq!(f.load(&w).expect("kept").running_requests, 1, "rejected report changed nothing");
    f.apply(&w, report(&w, 7, 11, vec![native(0, 2)])).expect("next");
    assert_eq!(f.load(&w).expect("fresh").running_requests, 2);
    assert_eq!(f.status(&w).rejected.get(RejectReason::SequenceWentBack), 3);
    assert_eq!(f.status(&w).accepted, 2);
}

#[test]
fn new_instance_resets_baselines_and_old_instances_stay_retired() {
    let f = Fixture::new();
    let w = f.add("a", 1);
    let mut restarts = f.table.restarts();
    let counters = |tokens, busy| native(0, 1).with_prefill_counters(tokens, busy);
    f.apply(&w, report(&w, 1, 50, vec![counters(0, 0)])).expect("first");
    f.apply(&w, report(&w, 1, 51, vec![counters(5_000, 1_000_000)])).expect("second");
    let rate = f.load(&w).and_then(|l| l.native).and_then(|n| n.prefill_tokens_per_sec);
    assert_eq!(rate, Some(5_000.0));

    assert!(restarts.try_recv().is_err(), "a first instance is no restart");
    // A restart: sequence starts over, counters are small again.
    f.apply(&w, report(&w, 2, 1, vec![counters(9_000, 2_000_000)])).expect("restart");
    assert_eq!(restarts.try_recv().ok().as_ref(), Some(w.id()), "the restart is told");
    assert!(restarts.try_recv().is_err(), "once");
    let native_load = f.load(&w).and_then(|l| l.native).expect("native");
    assert_eq!(native_load.prefill_tokens_per_sec, None, "no rate across instances");
    assert_eq!(native_load.prefill_queue_ms, None);

    let late = f.apply(&w, report(&w, 1, 52, vec![counters(6_000, 1_100_000)]));
    assert_eq!(late, Err(RejectReason::StaleInstance));
    assert_eq!(f.load(&w).expect("kept").running_requests, 1);
}

#[test]
fn decode_speed_per_request_follows_the_reports_and_forgets_a_previous_instance() {
    let f = Fixture::new();
    let w = f.add("a", 2);
    let speed = |f: &Fixture| {
        f.load(&w).and_then(|l| l.native).and_then(|n| n.request_decode_tokens_per_sec)
    };
    let rank = |r, running, throughput| native(r, running).with_decode_rate(throughput);
    // Rank 0: 600 tokens/s over 3 requests; rank 1 has never decoded.
    f.apply(&w, report(&w, 1, 1, vec![rank(0, 3, 600.0), rank(1, 0, 0.0)])).expect("first");
    assert_eq!(speed(&f), Some(200.0), "the rank that decodes");
    // Rank 0 idle now keeps 200; rank 1 decodes 2 requests at 100 each.
    f.apply(&w, report(&w, 1, 2, vec![rank(0, 0, 0.0), rank(1, 2, 200.0)])).expect("second");
    assert_eq!(speed(&f), Some(150.0), "mean of 200 and 100");
    // A restart forgets the idle speeds of the old process.
    f.apply(&w, report(&w, 2, 1, vec![rank(0, 0, 0.0), rank(1, 0, 0.0)])).expect("restart");
    assert_eq!(speed(&f), None);
    // Without the field there is no speed at all.
    f.apply(&w, report(&w, 2, 2, vec![native(0, 4), native(1, 4)])).expect("no throughput");
    assert_eq!(speed(&f), None);
}

#[test]
fn prefill_queue_time_is_waiting_uncached_over_derived_rate() {
    let f = Fixture::new();
    let w = f.add("a", 2);
    let rank = |r, waiting, tokens, busy| {
        RankSample::basic(r, 1, 1, 1, 10)
            .with_native(waiting, 1, 8)
            .with_prefill_counters(tokens, busy)
    };
    f.apply(&w, report(&w, 1, 1, vec![rank(0, 0, 0, 0), rank(1, 0, 0, 0)])).expect("first");
    assert_eq!(f.load(&w).and_then(|l| l.native).and_then(|n| n.prefill_queue_ms), None);
    let second = vec![rank(0, 2_000, 1_000, 1_000_000), rank(1, 500, 2_000, 500_000)];
    f.apply(&w, report(&w, 1, 2, second)).expect("second");
    let n = f.load(&w).and_then(|l| l.native).expect("native");
    assert_eq!(n.prefill_tokens_per_sec, Some(5_000.0));
    // Rank 0: 2000 / 1000 tok/s = 2000 ms; rank 1: 500 / 4000 tok/s = 125 ms; mean 1062.5 ms.
    assert_eq!(n.prefill_queue_ms, Some(1062.5));
    assert_eq!(n.waiting_uncached_tokens, 2_500);
}

#[test]
fn dp_size_mismatch_is_rejected_and_changes_nothing() {
    let f = Fixture::new();
    let w = f.add("a", 2);
    f.apply(&w, report(&w, 1, 1, vec![native(0, 1), native(1, 1)])).expect("ok");
    let mut wrong = report(&w, 1, 2, vec![native(0, 9), native(1, 9), native(2, 9)]);
    wrong.dp_size = 3;
    assert_eq!(f.apply(&w, wrong), Err(RejectReason::DpSizeMismatch));
    assert_eq!(f.load(&w).expect("kept").running_requests, 2);
    // The sequence it carried was not consumed.
    f.apply(&w, report(&w, 1, 2, vec![native(0, 3), native(1, 3)])).expect("seq 2 still free");
}

#[test]
fn rank_incomplete_report_clears_the_engine_until_a_complete_one() {
    let f = Fixture::new();
    let w = f.add("a", 3);
    let full = |seq, running| report(&w, 1, seq, (0..3).map(|r| native(r, running)).collect());
    f.apply(&w, full(1, 1)).expect("ok");
    let partial = report(&w, 1, 2, vec![native(0, 0), native(2, 0)]);
    assert_eq!(f.apply(&w, partial), Err(RejectReason::RankIncomplete));
    assert_eq!(f.load(&w), None, "a silent rank must not look idle, nor keep old numbers");
    assert_eq!(f.status(&w).missing_reason, Some(MissingReason::RankIncomplete));
    let duplicated = report(&w, 1, 3, vec![native(0, 0), native(0, 0), native(1, 0)]);
    assert_eq!(f.apply(&w, duplicated), Err(RejectReason::RankIncomplete));
    f.apply(&w, full(4, 2)).expect("complete again");
    assert_eq!(f.load(&w).expect("fresh").running_requests, 6);
    assert_eq!(f.status(&w).rejected.get(RejectReason::RankIncomplete), 2);
}

#[test]
fn native_without_every_gauge_reads_as_basic_and_basic_ignores_native_fields() {
    let f = Fixture::new();
    let w = f.add("a", 2);
    let lacking = RankSample { max_running_requests: None, ..native(1, 1) };
    assert_eq!(f.apply(&w, report(&w, 1, 1, vec![native(0, 1), lacking])), Ok(ReportKind::Basic));
    let load = f.load(&w).expect("fresh");
    assert_eq!((load.kind, load.native), (ReportKind::Basic, None));

    let mut basic = report(&w, 1, 2, vec![native(0, 1), native(1, 1)]);
    basic.kind = ReportKind::Basic;
    assert_eq!(f.apply(&w, basic), Ok(ReportKind::Basic));
    assert_eq!(f.load(&w).expect("fresh").native, None);
    assert_eq!(f.status(&w).kind, Some(ReportKind::Basic));
}

#[test]
fn absurd_values_are_rejected_and_overfull_kv_is_clamped() {
    let f = Fixture::new();
    let w = f.add("a", 1);
    f.apply(&w, report(&w, 1, 1, vec![native(0, 4)])).expect("ok");
    let absurd = RankSample { running_requests: u64::MAX, ..native(0, 0) };
    assert_eq!(f.apply(&w, report(&w, 1, 2, vec![absurd])), Err(RejectReason::AbsurdValue));
    assert_eq!(f.load(&w).expect("kept").running_requests, 4);

    let overfull = RankSample { kv_used_tokens: 5_000, ..native(0, 4) };
    f.apply(&w, report(&w, 1, 3, vec![overfull])).expect("clamped, not rejected");
    let load = f.load(&w).expect("fresh");
    assert_eq!(load.kv_used_tokens, 1000);
    assert_eq!(load.kv_usage_fraction(), Some(1.0));
    assert_eq!(f.status(&w).clamped, 1);
    assert_eq!(f.table.totals().clamped, 1);
}

#[test]
fn report_naming_another_engine_is_rejected() {
    let f = Fixture::new();
    let a = f.add("a", 1);
    let b = f.add("b", 1);
    let for_b = report(&b, 1, 1, vec![native(0, 1)]);
    assert_eq!(f.apply(&a, for_b), Err(RejectReason::EngineMismatch));
    assert_eq!(f.load(&a), None);
    assert_eq!(f.load(&b), None);
}

#[test]
fn floods_are_rate_limited_per_engine() {
    let config =
        TableConfig { max_reports_per_sec: 10.0, report_burst: 5, ..TableConfig::default() };
    let f = Fixture::with_config(config);
    let w = f.add("a", 1);
    let other = f.add("b", 1);
    let results: Vec<_> =
        (1..=50).map(|seq| f.apply(&w, report(&w, 1, seq, vec![native(0, seq)]))).collect();
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 5);
    assert_eq!(f.status(&w).rejected.get(RejectReason::RateLimited), 45);
    assert_eq!(f.load(&w).expect("fresh").running_requests, 5, "the table holds the last accepted");
    f.apply(&other, report(&other, 1, 1, vec![native(0, 1)])).expect("other engines unaffected");
    f.clock.advance(Duration::from_millis(300));
    let after: Vec<_> =
        (51..=60).map(|seq| f.apply(&w, report(&w, 1, seq, vec![native(0, seq)]))).collect();
    assert_eq!(after.iter().filter(|r| r.is_ok()).count(), 3, "10/s refills 3 in 300 ms");
}

#[test]
fn reports_of_a_replaced_worker_are_ignored() {
    let f = Fixture::new();
    let old = f.add("a", 1);
    f.apply(&old, report(&old, 1, 1, vec![native(0, 1)])).expect("ok");
    let new = f.add("a", 1);
    assert_ne!(old.incarnation(), new.incarnation());
    assert_eq!(f.load(&new), None, "a new incarnation starts missing");
    let late = f.apply(&old, report(&old, 1, 2, vec![native(0, 7)]));
    assert_eq!(late, Err(RejectReason::StaleIncarnation));
    assert_eq!(f.load(&new), None);
    f.table.mark_missing(old.id(), old.incarnation(), MissingReason::Disconnected);
    assert!(!f.table.unregister(old.id(), old.incarnation()), "old incarnation cannot remove");
    f.apply(&new, report(&new, 1, 1, vec![native(0, 3)])).expect("new incarnation reports");
    assert_eq!(f.load(&new).expect("fresh").running_requests, 3);
}

#[test]
fn missing_at_once_and_removal() {
    let f = Fixture::new();
    let w = f.add("a", 1);
    f.apply(&w, report(&w, 1, 1, vec![native(0, 1)])).expect("ok");
    f.table.mark_missing(w.id(), w.incarnation(), MissingReason::Disconnected);
    assert_eq!(f.load(&w), None);
    let status = f.status(&w);
    assert_eq!(status.freshness, Freshness::Missing);
    assert_eq!(status.missing_reason, Some(MissingReason::Disconnected));
    assert_eq!((status.age_ms, status.kind), (None, None));
    f.apply(&w, report(&w, 1, 2, vec![native(0, 1)])).expect("resumes with the same instance");
    assert!(f.table.unregister(w.id(), w.incarnation()));
    assert_eq!(f.load(&w), None);
    assert!(f.table.status().is_empty());
    let gone = f.apply(&w, report(&w, 1, 3, vec![native(0, 1)]));
    assert_eq!(gone, Err(RejectReason::UnknownEngine));
}

#[test]
fn a_snapshot_never_changes_its_answers() {
    let f = Fixture::new();
    let w = f.add("a", 1);
    f.apply(&w, report(&w, 1, 1, vec![native(0, 1)])).expect("ok");
    let before = f.table.snapshot();
    f.apply(&w, report(&w, 1, 2, vec![native(0, 2)])).expect("ok");
    f.clock.advance(Duration::from_secs(10));
    assert_eq!(before.get(w.id()).expect("still fresh at capture").running_requests, 1);
    assert_eq!(f.table.snapshot().get(w.id()), None, "now stale");
    assert_eq!(before.iter().count(), 1);
}

#[test]
fn changes_are_signalled() {
    let f = Fixture::new();
    let mut changes = f.table.changes();
    let w = f.add("a", 1);
    assert!(changes.has_changed().expect("open"));
    changes.mark_unchanged();
    let _ = f.apply(&w, report(&w, 1, 1, vec![native(0, 1)]));
    assert!(changes.has_changed().expect("open"));
    assert_eq!(f.table.status_of(&id("a")).map(|s| s.accepted), Some(1));
}

proptest! {
    /// However the ranks of a report are chosen, the engine reads as Some exactly when they
    /// cover 0..dp_size once each, and then the sum is over every rank.
    #[test]
    fn only_rank_complete_reports_are_usable(
        dp_size in 1u32..6,
        ranks in proptest::collection::vec((0u32..7, 0u64..1000), 0..9),
    ) {
        let f = Fixture::new();
        let w = f.add("a", dp_size);
        let samples: Vec<_> = ranks.iter().map(|&(r, running)| native(r, running)).collect();
        let mut sorted: Vec<u32> = ranks.iter().map(|&(r, _)| r).collect();
        sorted.sort_unstable();
        let complete = sorted == (0..dp_size).collect::<Vec<_>>();
        let result = f.apply(&w, report(&w, 1, 1, samples));
        let load = f.load(&w);
        prop_assert_eq!(load.is_some(), complete);
        prop_assert_eq!(result.is_ok(), complete);
        if let Some(load) = load {
            prop_assert_eq!(load.running_requests, ranks.iter().map(|&(_, n)| n).sum::<u64>());
            prop_assert_eq!(load.dp_size, dp_size);
        }
    }

    /// Whatever sequence of (instance, sequence) pairs arrives, what the table shows is the
    /// last accepted report, and within one instance accepted sequences strictly increase.
    #[test]
    fn accepted_sequences_strictly_increase_per_instance(
        reports in proptest::collection::vec((0u64..3, 0u64..20), 1..40),
    ) {
        let config = TableConfig { report_burst: 1000, ..TableConfig::default() };
        let f = Fixture::with_config(config);
        let w = f.add("a", 1);
        let mut last: Option<(u64, u64)> = None;
        for (i, (instance, seq)) in reports.into_iter().enumerate() {
            let running = i as u64;
            if f.apply(&w, report(&w, instance, seq, vec![native(0, running)])).is_ok() {
                if let Some((li, ls)) = last {
                    prop_assert!(li != instance || seq > ls);
                }
                last = Some((instance, seq));
                prop_assert_eq!(f.load(&w).map(|l| l.running_requests), Some(running));
            }
        }
    }
}
