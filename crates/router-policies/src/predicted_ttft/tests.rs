//! The predicted-TTFT cost model as a table (queued work, dispatch correction, cache credit,
//! missing reports, ties), over a real prefix index and load table.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use router_state_load::{EngineLoad, EngineStatus, NativeLoad, ReportKind};
use router_workers::Stage;

use super::*;
use crate::cache::tests::fixture::{Eng, World, eng, wid};
use crate::tests::doubles::{Recording, running_cap};
use crate::{AdmissionLimits, PickError, PickReason, PredictedTtftSettings};

/// One token per millisecond, so predicted milliseconds read as tokens; recomputed work
/// counted twice (weight 1) and not per waiting request (weight 0), which the cases' margins
/// are written for, whatever the defaults.
fn settings() -> PredictedTtftSettings {
    PredictedTtftSettings {
        default_prefill_tokens_per_sec: 1000.0,
        recompute_weight: 1.0,
        waiting_weight: 0.0,
        ..Default::default()
    }
}

fn policy(world: &World, seed: u64) -> PredictedTtftPolicy {
    PredictedTtftPolicy::new(Arc::clone(&world.source), world.load(), settings())
        .expect("valid")
        .with_seed(seed)
}

struct Case {
    name: &'static str,
    engines: Vec<Eng>,
    /// Work dispatched by this router after each engine's report: (engine, tokens).
    dispatched: Vec<(&'static str, u64)>,
    /// Work dispatched after the report that has already finished: (engine, tokens).
    finished: Vec<(&'static str, u64)>,
    input: usize,
    winner: &'static str,
    reason: PickReason,
    /// The winner's predicted ms (= tokens at 1000 tokens/s) and uncached tokens.
    ms: f64,
    uncached: u64,
}

#[test]
fn the_lowest_predicted_ttft_wins() {
    let cases = [
        Case {
            name: "queued work decides between equal caches",
            engines: vec![eng("a", 0).uncached(5_000), eng("b", 0).uncached(200)],
            dispatched: vec![],
            finished: vec![],
            input: 1_024,
            winner: "b",
            reason: PickReason::PredictedTtft,
            ms: 1_224.0,
            uncached: 1_024,
        },
        Case {
            name: "work dispatched since the report counts before the engine says so",
            engines: vec![eng("a", 0), eng("b", 0).uncached(1_000)],
            dispatched: vec![("a", 4_000)],
            finished: vec![],
            input: 1_024,
            winner: "b",
            reason: PickReason::PredictedTtft,
            ms: 2_024.0,
            uncached: 1_024,
        },
        Case {
            name: "work dispatched since the report that already finished is queued nowhere",
            engines: vec![eng("a", 0), eng("b", 0).uncached(1_000)],
            dispatched: vec![("a", 300)],
            finished: vec![("a", 4_000)],
            input: 1_024,
            winner: "a",
            reason: PickReason::PredictedTtft,
            ms: 1_324.0,
            uncached: 1_024,
        },
        Case {
            name: "the cached prefix is credited",
            engines: vec![eng("a", 60).uncached(500), eng("b", 0)],
            dispatched: vec![],
            finished: vec![],
            input: 1_024,
            winner: "a",
            reason: PickReason::PredictedTtft,
            ms: 564.0,
            uncached: 64,
        },
        Case {
            name: "a cache-rich engine whose queue is slower than recomputing loses",
            engines: vec![eng("a", 64).uncached(3_000), eng("b", 0).uncached(100)],
            dispatched: vec![],
            finished: vec![],
            input: 1_040,
            winner: "b",
            reason: PickReason::PredictedTtft,
            ms: 1_140.0,
            uncached: 1_040,
        },
        Case {
            name: "without KV events every token is uncached",
            engines: vec![eng("a", 60).no_kv().uncached(300), eng("b", 0).uncached(50)],
            dispatched: vec![],
            finished: vec![],
            input: 1_024,
            winner: "b",
            reason: PickReason::PredictedTtft,
            ms: 1_074.0,
            uncached: 1_024,
        },
        Case {
            name: "a missing report compares router-local in-flight work",
            engines: vec![eng("a", 0).uncached(9_000), eng("b", 0).missing()],
            dispatched: vec![("b", 3_000), ("a", 1_000)],
            finished: vec![],
            input: 512,
            winner: "a",
            reason: PickReason::PredictedTtftLocal,
            ms: 1_512.0,
            uncached: 512,
        },
        Case {
            // vLLM's metrics: running and waiting requests, no waiting tokens. The pick is still
            // on reports (fresh ones from every candidate), with the router's own work on top.
            name: "a basic report adds the router's own work and is a reported basis",
            engines: vec![eng("a", 0).basic(0, 0), eng("b", 0)],
            dispatched: vec![("a", 100)],
            finished: vec![],
            input: 512,
            winner: "b",
            reason: PickReason::PredictedTtft,
            ms: 512.0,
            uncached: 512,
        },
    ];
    for case in cases {
        let world = World::new(Stage::Plain, &case.engines);
        let _guards: Vec<_> = case
            .dispatched
            .iter()
            .map(|(id, tokens)| world.inflight.acquire_work(&wid(id), Stage::Plain, *tokens))
            .collect();
        for (id, tokens) in &case.finished {
            drop(world.inflight.acquire_work(&wid(id), Stage::Plain, *tokens));
        }
        let pick = world.pick(&policy(&world, 1), case.input).expect(case.name);
        assert_eq!(pick.worker.id().as_str(), case.winner, "{}", case.name);
        assert_eq!(pick.reason, case.reason, "{}", case.name);
        assert_eq!(pick.predicted_ttft_ms, Some(case.ms), "{}", case.name);
        assert_eq!(pick.uncached_tokens, Some(case.uncached), "{}", case.name);
    }
}

#[test]
fn the_recompute_weight_counts_the_work_a_miss_adds() {
    // a holds 960 of 1024 tokens but 1100 are queued there: 1164 ms against b's 1024 ms.
    let world = World::new(Stage::Plain, &[eng("a", 60).uncached(1_100), eng("b", 0)]);
    let pick = |weight: f64| {
        let settings = PredictedTtftSettings { recompute_weight: weight, ..settings() };
        let policy = PredictedTtftPolicy::new(Arc::clone(&world.source), world.load(), settings)
            .expect("valid")
            .with_seed(5);
        world.pick(&policy, 1_024).expect("pick")
    };
    assert_eq!(pick(0.0).worker.id().as_str(), "b", "by predicted TTFT alone");
    let weighted = pick(1.0);
    assert_eq!(weighted.worker.id().as_str(), "a", "b's 1024 recomputed tokens count twice");
    assert_eq!(weighted.predicted_ttft_ms, Some(1_164.0), "the prediction itself is unweighted");
}

#[test]
fn the_waiting_weight_counts_the_delay_a_miss_adds_to_each_waiting_request() {
    // Neither holds the prompt. a reports nothing queued but three requests of this router
    // there have no first token yet; b reports 300 tokens queued and has none of ours.
    let world = World::new(Stage::Plain, &[eng("a", 0).inflight(3), eng("b", 0).uncached(300)]);
    let pick = |weight: f64| {
        let settings = PredictedTtftSettings { waiting_weight: weight, ..settings() };
        let policy = PredictedTtftPolicy::new(Arc::clone(&world.source), world.load(), settings)
            .expect("valid")
            .with_seed(5);
        world.pick(&policy, 1_024).expect("pick")
    };
    // Weight 0: a 1024 + 1024 against b 1324 + 1024. Weight 1: a's 1024 recomputed tokens
    // also delay each of its three waiting requests, 1024 + 4 x 1024 against b's 2348.
    let unweighted = pick(0.0);
    assert_eq!(unweighted.worker.id().as_str(), "a", "by predicted TTFT and recompute work");
    let weighted = pick(1.0);
    assert_eq!(weighted.worker.id().as_str(), "b", "where fewer requests wait for it");
    assert_eq!(weighted.predicted_ttft_ms, Some(1_324.0), "the prediction itself is unweighted");
}

#[test]
fn request_tie_breaks_agree_across_replicas_and_spread_over_requests() {
    use futures::FutureExt;

    let world = World::new(Stage::Plain, &[eng("a", 0), eng("b", 0).uncached(20), eng("c", 0)]);
    let settings = PredictedTtftSettings { tie_break: crate::TieBreak::Request, ..settings() };
    let replica = || {
        PredictedTtftPolicy::new(Arc::clone(&world.source), world.load(), settings.clone())
            .expect("valid")
    };
    let (first, second) = (replica(), replica());
    let mut reversed = world.workers.clone();
    reversed.reverse();
    let mut winners = BTreeSet::new();
    for session in 0..48 {
        let key = format!("session-{session}");
        let tokens = crate::RequestTokens::new(crate::cache::tests::fixture::prompt(1_000));
        let mut request = world.request(1_000, Some(&tokens));
        request.session_key = Some(&key);
        let pick = |policy: &PredictedTtftPolicy, engines: &[Arc<Worker>]| {
            let pick = policy.pick(engines, &request).now_or_never().expect("ready");
            pick.expect("pick").worker.id().to_string()
        };
        let a = pick(&first, &world.workers);
        assert_eq!(a, pick(&second, &reversed), "{key}");
        assert_eq!(a, pick(&first, &world.workers), "{key} again");
        winners.insert(a);
    }
    assert_eq!(winners, ["a", "b", "c"].map(String::from).into(), "requests spread over ties");
}

#[test]
fn near_ties_are_sampled_and_clear_winners_are_not() {
    let world = World::new(Stage::Plain, &[eng("a", 0), eng("b", 0).uncached(20), eng("c", 0)]);
    let mut winners = BTreeSet::new();
    for seed in 0..64 {
        let pick = world.pick(&policy(&world, seed), 1_000).expect("pick");
        winners.insert(pick.worker.id().to_string());
    }
    // b is 20 ms behind a 1000 ms best: within 5 % plus 1 ms, a near tie like c.
    assert_eq!(winners, ["a", "b", "c"].map(String::from).into(), "every near tie wins sometimes");

    let world = World::new(Stage::Plain, &[eng("a", 0), eng("b", 0).uncached(200)]);
    for seed in 0..32 {
        let pick = world.pick(&policy(&world, seed), 1_000).expect("pick");
        assert_eq!(pick.worker.id().as_str(), "a", "200 ms behind is no tie");
    }

    // 80 ms behind a 1000 ms best is no tie either, although the ranking costs (2000 and
    // 2080, with the recomputed tokens) are within 5 %: the margin is of predicted time.
    let world = World::new(Stage::Plain, &[eng("a", 0), eng("b", 0).uncached(80)]);
    for seed in 0..32 {
        let pick = world.pick(&policy(&world, seed), 1_000).expect("pick");
        assert_eq!(pick.worker.id().as_str(), "a", "80 ms behind a 1000 ms best is no tie");
    }

    // Among near ties, the holder of the prefix wins: a is 32 ms slower than b (queued work),
    // within the margin, and recomputes 992 fewer tokens.
    let world = World::new(
        Stage::Plain,
        &[eng("a", 62).uncached(1_040), eng("b", 0).uncached(16), eng("c", 0).uncached(16)],
    );
    for seed in 0..32 {
        let pick = world.pick(&policy(&world, seed), 1_024).expect("pick");
        assert_eq!(pick.worker.id().as_str(), "a", "seed {seed}");
    }
}

#[test]
fn admission_is_checked_fastest_first_and_every_rejection_is_kept() {
    let world = World::new(
        Stage::Plain,
        &[eng("a", 0).uncached(300).running(9), eng("b", 0).running(9), eng("c", 0).uncached(900)],
    );
    let recording = Recording::new(running_cap(4));
    let check = crate::AdmissionCheck::new(recording.clone(), world.load());
    let policy = policy(&world, 3).with_admission(check);
    let pick = world.pick(&policy, 1_000).expect("c is admitted");
    assert_eq!(pick.worker.id().as_str(), "c");
    assert_eq!(recording.order(), ["b", "a", "c"], "by predicted time");

    let recording = Recording::new(AdmissionLimits {
        max_inflight_requests: Some(0),
        ..AdmissionLimits::default()
    });
    let all_full = World::new(Stage::Plain, &[eng("a", 0).inflight(1), eng("b", 0).inflight(1)]);
    let policy =
        PredictedTtftPolicy::new(Arc::clone(&all_full.source), all_full.load(), settings())
            .expect("valid")
            .with_admission(crate::AdmissionCheck::new(recording, all_full.load()));
    match all_full.pick(&policy, 100) {
        Err(PickError::NoAdmissibleEngine { rejections }) => assert_eq!(rejections.len(), 2),
        other => panic!("expected every engine rejected, got {other:?}"),
    }
}

#[test]
fn no_candidates_and_decode_groups_are_errors() {
    let world = World::new(Stage::Plain, &[eng("a", 0)]);
    let policy = policy(&world, 0);
    assert!(matches!(
        world.pick_from(&policy, &[], 10),
        Err(PickError::NoCandidates { stage: Stage::Plain })
    ));
    assert!(!policy.supports_stage(Stage::Decode));
    assert!(policy.supports_stage(Stage::Prefill));
    let decode = World::new(Stage::Decode, &[eng("a", 0)]);
    assert!(matches!(
        decode.pick(
            &PredictedTtftPolicy::new(Arc::clone(&decode.source), decode.load(), settings())
                .expect("valid"),
            10
        ),
        Err(PickError::UnsupportedStage { policy: "predicted_ttft", stage: Stage::Decode })
    ));
}

#[test]
fn only_a_positive_finite_prefill_rate_estimate_is_used() {
    let world = World::new(Stage::Plain, &[eng("a", 0)]);
    let policy = policy(&world, 0);
    let now = Instant::now();
    let load = |rate: Option<f64>| EngineLoad {
        kind: ReportKind::Native,
        status: EngineStatus::Unknown,
        captured_at: now,
        received_at: now,
        dp_size: 1,
        running_requests: 0,
        waiting_requests: 0,
        kv_used_tokens: 0,
        kv_capacity_tokens: 1_000,
        native: Some(NativeLoad {
            waiting_uncached_tokens: 1_000,
            total_kv_tokens: 0,
            max_running_requests: 8,
            prefill_tokens_per_sec: rate,
            prefill_queue_ms: None,
            request_decode_tokens_per_sec: None,
        }),
    };
    let engine = &world.workers[0];
    for (rate, used) in [
        (Some(4_000.0), 4_000.0),
        (None, 1_000.0),
        (Some(0.0), 1_000.0),
        (Some(-5.0), 1_000.0),
        (Some(f64::NAN), 1_000.0),
        (Some(f64::INFINITY), 1_000.0),
    ] {
        let estimate = policy.estimate(engine, Some(&load(rate)), Basis::Reported, 1_000, 0);
        assert_eq!(estimate.rate, used, "{rate:?}");
        assert_eq!(estimate.ms, 2_000.0 / used * 1000.0, "{rate:?}");
    }
}

#[test]
fn an_engine_without_a_rate_estimate_is_assumed_as_fast_as_its_peers() {
    // Busy engines with 3000 tokens waiting, and an idle one without an estimate: at the
    // default (1000 tokens/s) the idle one would rank 4000 (2000 ms for a 2000-token request,
    // plus 2000 recomputed), behind one at 4000 tokens/s (1250 ms + 500); at its peers' rate
    // it ranks 1000 and wins.
    let cases = [
        ("the median of the others' estimates", vec![2_000, 4_000, 4_000], "fresh", 500.0),
        ("of an even number, the mean of the middle two", vec![2_000, 6_000], "fresh", 500.0),
        ("while none has one, the configured default", vec![], "fresh", 2_000.0),
    ];
    for (name, rates, winner, ms) in cases {
        let mut engines: Vec<Eng> = ["a", "b", "c"]
            .into_iter()
            .zip(&rates)
            .map(|(id, &rate)| eng(id, 0).uncached(3_000).rate(rate))
            .collect();
        if rates.is_empty() {
            engines.push(eng("a", 0).uncached(3_000));
        }
        engines.push(eng("fresh", 0));
        let world = World::new(Stage::Plain, &engines);
        let pick = world.pick(&policy(&world, 1), 2_000).expect(name);
        assert_eq!(pick.worker.id().as_str(), winner, "{name}");
        assert_eq!(pick.predicted_ttft_ms, Some(ms), "{name}");
    }
}

#[test]
fn the_running_pass_is_credited_with_what_the_engine_prefilled_since_it_began() {
    let world = World::new(Stage::Plain, &[eng("a", 0)]);
    let policy = policy(&world, 0);
    let engine = &world.workers[0];
    let rate = policy.settings().default_prefill_tokens_per_sec;
    let _running = world.inflight.acquire_work(engine.id(), Stage::Plain, 3 * rate as u64);
    let local = || policy.estimate(engine, None, Basis::Local, 100, 0);
    assert_eq!((local().queued, local().waiting), (3 * rate as u64, 0), "a pass just begun");
    world.clock.advance(Duration::from_secs(1));
    let _next = world.inflight.acquire_work(engine.id(), Stage::Plain, rate as u64);
    assert_eq!(
        (local().queued, local().waiting),
        (2 * rate as u64 + rate as u64, 1),
        "a second into the pass a third of it is done; the next request waits whole"
    );
    world.clock.advance(Duration::from_secs(5));
    assert_eq!(local().queued, rate as u64, "a pass long done leaves only what waits");
}

#[test]
fn the_prefill_pass_a_report_leaves_out_counts_until_its_first_token() {
    let world = World::new(Stage::Plain, &[eng("a", 0)]);
    let policy = policy(&world, 0);
    let engine = &world.workers[0];
    let id = engine.id();
    // Dispatched before the report, which counts 1000 tokens still waiting: this one is in
    // the prefill pass the engine runs now, so the report does not count it.
    let mut running = world.inflight.acquire_work(id, Stage::Plain, 3_000);
    let load = |waiting: u64| EngineLoad {
        kind: ReportKind::Native,
        status: EngineStatus::Unknown,
        captured_at: Instant::now(),
        received_at: Instant::now(),
        dp_size: 1,
        running_requests: 1,
        waiting_requests: 1,
        kv_used_tokens: 0,
        kv_capacity_tokens: 100_000,
        native: Some(NativeLoad {
            waiting_uncached_tokens: waiting,
            total_kv_tokens: 0,
            max_running_requests: 8,
            prefill_tokens_per_sec: None,
            prefill_queue_ms: None,
            request_decode_tokens_per_sec: None,
        }),
    };
    let queued = |waiting: u64| {
        policy.estimate(engine, Some(&load(waiting)), Basis::Reported, 100, 0).queued
    };
    assert_eq!(queued(1_000), 3_000, "the router's unprefilled work covers the running pass");
    assert_eq!(queued(5_000), 5_000, "a report that says more (other routers' work) wins");
    running.prefilled();
    assert_eq!(queued(1_000), 1_000, "after the first token only the report's queue is left");
    assert_eq!(
        policy.estimate(engine, None, Basis::Local, 100, 0).queued,
        0,
        "router-local work is what has no first token yet"
    );
}

#[test]
fn settings_are_validated_with_their_names() {
    for (settings, field) in [
        (
            PredictedTtftSettings { default_prefill_tokens_per_sec: 0.0, ..settings() },
            "default_prefill_tokens_per_sec",
        ),
        (
            PredictedTtftSettings { default_prefill_tokens_per_sec: f64::NAN, ..settings() },
            "default_prefill_tokens_per_sec",
        ),
        (PredictedTtftSettings { near_tie_ratio: 1.5, ..settings() }, "near_tie_ratio"),
        (PredictedTtftSettings { near_tie_ms: -1.0, ..settings() }, "near_tie_ms"),
        (PredictedTtftSettings { recompute_weight: f64::NAN, ..settings() }, "recompute_weight"),
        (PredictedTtftSettings { waiting_weight: -0.5, ..settings() }, "waiting_weight"),
    ] {
        let error = settings.validate().expect_err(field).to_string();
        assert!(error.contains(&format!("policy.{field}")), "{error}");
    }
}

/// No engine reports a rate (vLLM does not): a rate learned from observed first tokens stands
/// in for it, and `learn_rates: false` turns that off.
#[test]
fn a_learned_rate_stands_in_for_a_reported_one() {
    // a has 1000 tokens of this router's work in flight; b none; neither reports a rate.
    let world = World::new(Stage::Plain, &[eng("a", 0).missing(), eng("b", 0).missing()]);
    let _busy = world.inflight.acquire_work(&wid("a"), Stage::Plain, 1_000);
    let load = world.load();
    // a prefills 100k tokens a second, b 2k, as their first tokens showed.
    for i in 0..16u64 {
        let work = 500 + i * 200;
        let at = |rate: f64| Duration::from_secs_f64(0.01 + work as f64 / rate);
        load.rates.observe(&wid("a"), work, at(100_000.0));
        load.rates.observe(&wid("b"), work, at(2_000.0));
    }
    let pick = |learn_rates: bool| {
        let settings = PredictedTtftSettings { learn_rates, ..settings() };
        let policy = PredictedTtftPolicy::new(Arc::clone(&world.source), load.clone(), settings)
            .expect("valid")
            .with_seed(1);
        world.pick(&policy, 1_000).expect("pick")
    };
    let learned = pick(true);
    assert_eq!(learned.worker.id().as_str(), "a", "2000 tokens at 100k/s beat 1000 at 2k/s");
    let ms = learned.predicted_ttft_ms.expect("a prediction");
    assert!((ms - 20.0).abs() < 1.0, "{ms}");
    assert_eq!(pick(false).worker.id().as_str(), "b", "the default rate alike for both");
}
