//! The rank choice as a table: queued work per rank, the dispatch correction, the held prefix,
//! decode picks, missing and basic reports, and engines the router does not route ranks of.

use std::sync::Arc;

use router_state_load::{
    EngineReportedLoadTable, Inflight, ManualClock, RankSample, Report, ReportKind, TableConfig,
};
use router_workers::{DpRoute, ModelId, Stage, Worker, WorkerSpec};

use super::*;
use crate::{HeldPrefix, LoadHandles, Pick, PickReason};

/// What one rank reports: `None` leaves the engine without a report.
#[derive(Clone, Copy)]
enum Rank {
    /// A NATIVE rank: waiting uncached tokens, running and waiting requests.
    Native(u64, u64, u64),
    /// A BASIC rank: running and waiting requests only.
    Basic(u64, u64),
}

struct Case {
    name: &'static str,
    stage: Stage,
    /// One entry per rank; empty: no report at all (dp_size then comes from `in_flight`).
    ranks: Vec<Rank>,
    dp_size: u32,
    /// Router dispatches after the report: (rank, tokens), still in flight.
    in_flight: Vec<(u32, u64)>,
    /// Router dispatches after the report that have finished: (rank, tokens).
    finished: Vec<(u32, u64)>,
    held: Option<HeldPrefix>,
    input: u64,
    want: RankChoice,
}

fn choice(rank: u32, reason: RankReason) -> RankChoice {
    RankChoice { rank, reason }
}

fn held(rank: u32, tokens: u64) -> Option<HeldPrefix> {
    Some(HeldPrefix { rank, tokens })
}

fn engine(dp_size: u32, route: Option<DpRoute>, stage: Stage) -> Arc<Worker> {
    let spec = WorkerSpec {
        model: Some("m".into()),
        dp_size,
        dp_route: route,
        ..WorkerSpec::new("e", "http://127.0.0.1:1", stage)
    };
    Arc::new(Worker::from_spec(&spec, vec![ModelId::new("m")]).expect("worker"))
}

fn handles(worker: &Worker, ranks: &[Rank]) -> LoadHandles {
    let clock = Arc::new(ManualClock::new());
    let table = Arc::new(EngineReportedLoadTable::new(TableConfig::default(), clock.clone()));
    table.register(worker);
    if !ranks.is_empty() {
        let (kind, samples) = report(ranks);
        let report = Report::new("e", 1, 1, kind, samples);
        table.apply(worker.id(), worker.incarnation(), report).expect("accepted");
    }
    LoadHandles::new(table, Arc::new(Inflight::new(clock)))
}

fn report(ranks: &[Rank]) -> (ReportKind, Vec<RankSample>) {
    let native = ranks.iter().all(|r| matches!(r, Rank::Native(..)));
    let samples = ranks
        .iter()
        .zip(0u32..)
        .map(|(rank, at)| match *rank {
            Rank::Native(uncached, running, waiting) => {
                RankSample::basic(at, running, waiting, 0, 10_000).with_native(uncached, 0, 64)
            }
            Rank::Basic(running, waiting) => RankSample::basic(at, running, waiting, 0, 10_000),
        })
        .collect();
    (if native { ReportKind::Native } else { ReportKind::Basic }, samples)
}

#[test]
fn the_cheapest_rank_wins() {
    use Rank::{Basic, Native};
    let cases = [
        Case {
            name: "queued uncached work decides",
            stage: Stage::Plain,
            ranks: vec![Native(900, 1, 1), Native(100, 9, 9)],
            dp_size: 2,
            in_flight: vec![],
            finished: vec![],
            held: None,
            input: 500,
            want: choice(1, RankReason::LeastWork),
        },
        Case {
            name: "the rank holding the prefix is credited with it",
            stage: Stage::Plain,
            ranks: vec![Native(100, 0, 0), Native(300, 0, 0)],
            dp_size: 2,
            in_flight: vec![],
            finished: vec![],
            held: held(1, 400),
            input: 500,
            want: choice(1, RankReason::CachedPrefix),
        },
        Case {
            name: "a holder queued beyond recomputing elsewhere loses",
            stage: Stage::Prefill,
            ranks: vec![Native(0, 0, 0), Native(900, 0, 0)],
            dp_size: 2,
            in_flight: vec![],
            finished: vec![],
            held: held(1, 400),
            input: 500,
            want: choice(0, RankReason::LeastWork),
        },
        Case {
            name: "what the router sent since the report counts before the engine says so",
            stage: Stage::Plain,
            ranks: vec![Native(0, 0, 0), Native(200, 0, 0)],
            dp_size: 2,
            in_flight: vec![(0, 600)],
            finished: vec![],
            held: None,
            input: 100,
            want: choice(1, RankReason::LeastWork),
        },
        Case {
            name: "a dispatch since the report that already finished is not queued",
            stage: Stage::Plain,
            ranks: vec![Native(0, 0, 0), Native(0, 0, 0)],
            dp_size: 2,
            in_flight: vec![],
            finished: vec![(0, 800)],
            held: held(0, 790),
            input: 800,
            want: choice(0, RankReason::CachedPrefix),
        },
        Case {
            name: "equal work goes to the rank with fewer requests",
            stage: Stage::Plain,
            ranks: vec![Native(50, 3, 0), Native(50, 1, 0), Native(50, 2, 0)],
            dp_size: 3,
            in_flight: vec![],
            finished: vec![],
            held: None,
            input: 10,
            want: choice(1, RankReason::LeastWork),
        },
        Case {
            name: "a decode pick compares requests, not tokens",
            stage: Stage::Decode,
            ranks: vec![Basic(5, 1), Basic(2, 0)],
            dp_size: 2,
            in_flight: vec![(1, 0), (1, 0), (1, 0), (1, 0), (1, 0)],
            finished: vec![],
            held: None,
            input: 10,
            want: choice(0, RankReason::LeastWork),
        },
        Case {
            name: "without a report the router's own in-flight work decides",
            stage: Stage::Plain,
            ranks: vec![],
            dp_size: 2,
            in_flight: vec![(0, 300), (1, 100)],
            finished: vec![],
            held: None,
            input: 10,
            want: choice(1, RankReason::LeastWork),
        },
        Case {
            name: "a basic report has no queued tokens: in-flight work counts",
            stage: Stage::Plain,
            ranks: vec![Basic(0, 0), Basic(0, 0)],
            dp_size: 2,
            in_flight: vec![(0, 50)],
            finished: vec![],
            held: held(0, 40),
            input: 100,
            want: choice(1, RankReason::LeastWork),
        },
        Case {
            name: "a held prefix naming no rank of the engine is ignored",
            stage: Stage::Plain,
            ranks: vec![Native(10, 0, 0), Native(0, 0, 0)],
            dp_size: 2,
            in_flight: vec![],
            finished: vec![],
            held: held(7, 500),
            input: 500,
            want: choice(1, RankReason::LeastWork),
        },
        Case {
            name: "one rank needs no choice",
            stage: Stage::Plain,
            ranks: vec![Native(10, 0, 0)],
            dp_size: 1,
            in_flight: vec![],
            finished: vec![],
            held: None,
            input: 10,
            want: choice(0, RankReason::OnlyRank),
        },
    ];
    for case in cases {
        let worker = engine(case.dp_size, Some(DpRoute::Body), case.stage);
        let load = handles(&worker, &case.ranks);
        for &(rank, tokens) in &case.finished {
            drop(load.inflight.acquire_on_rank(worker.id(), case.stage, rank, tokens));
        }
        let _guards: Vec<_> = case
            .in_flight
            .iter()
            .map(|&(rank, tokens)| {
                load.inflight.acquire_on_rank(worker.id(), case.stage, rank, tokens)
            })
            .collect();
        let pick =
            Pick::new(Arc::clone(&worker), PickReason::RoundRobin).with_cached_prefix(case.held);
        let got = choose_rank(&load, &pick, case.stage, case.input);
        assert_eq!(got, Some(case.want), "{}", case.name);
    }
}

#[test]
fn complete_ties_take_turns() {
    let worker = engine(3, Some(DpRoute::Body), Stage::Plain);
    let idle = Rank::Native(0, 0, 0);
    let load = handles(&worker, &[idle, idle, idle]);
    let pick = Pick::new(Arc::clone(&worker), PickReason::RoundRobin);
    let chosen: std::collections::BTreeSet<u32> = (0..12)
        .map(|_| choose_rank(&load, &pick, Stage::Plain, 10).expect("a rank").rank)
        .collect();
    // Other tests choose ranks at the same time, so only the spread is certain, not the order.
    assert!(chosen.len() > 1, "every tie went to rank {chosen:?}");
}

#[test]
fn an_engine_without_dp_route_balances_its_ranks_itself() {
    let worker = engine(4, None, Stage::Plain);
    let load = handles(&worker, &[]);
    let pick = Pick::new(Arc::clone(&worker), PickReason::RoundRobin);
    assert_eq!(choose_rank(&load, &pick, Stage::Plain, 100), None);
}

#[test]
fn dispatches_spread_a_burst_over_idle_ranks() {
    let worker = engine(3, Some(DpRoute::Header), Stage::Plain);
    let load = handles(&worker, &[]);
    let pick = Pick::new(Arc::clone(&worker), PickReason::RoundRobin);
    let mut guards = Vec::new();
    let mut chosen = Vec::new();
    for _ in 0..6 {
        let rank = choose_rank(&load, &pick, Stage::Plain, 100).expect("routed").rank;
        guards.push(load.inflight.acquire_on_rank(worker.id(), Stage::Plain, rank, 100));
        chosen.push(rank);
    }
    // Each dispatch makes its rank the busier: every round of three covers every rank (which
    // one starts a round of equals is their turn, shared with other tests running now).
    for round in chosen.chunks(3) {
        let mut round = round.to_vec();
        round.sort_unstable();
        assert_eq!(round, [0, 1, 2], "{chosen:?}");
    }
}
