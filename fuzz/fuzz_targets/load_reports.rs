//! Fuzz target `load_reports`: the engines' load-report decoders and the table they feed.
//!
//! The first byte chooses the decoder. `1` modulo 4: the rest is SGLang's `/v1/loads` JSON
//! body (`parse_v1_loads`). `3` modulo 4: the rest is a vLLM Prometheus `/metrics` body
//! (`parse_vllm_metrics`), whose reading, when it has one, is applied as a BASIC report to a
//! table for one engine of `1 + (first byte >> 2) % 4` ranks. Even: the rest is a stream of
//! length-delimited protobuf `LoadReport`s (`router.load.v1`, as the gRPC subscription
//! receives them), each decoded, turned into a [`Report`] and applied to an
//! [`EngineReportedLoadTable`] under a manual clock for one engine of
//! `1 + (first byte >> 1) % 4` ranks. Beyond "never panics": within one engine instance
//! accepted sequences strictly increase (while the table remembers the instance), a usable
//! load has every rank, and clamped values are in range; a vLLM reading has one rank per
//! engine, in ascending engine order, none using more KV than it has.
#![no_main]

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use prost::Message;
use router_proto::router::load::v1 as pb;
use router_state_load::{
    EngineReportedLoadTable, ManualClock, RejectReason, Report, ReportKind, TableConfig,
    parse_v1_loads, parse_vllm_metrics,
};
use router_workers::{ModelId, Stage, Worker, WorkerId, WorkerSpec};

/// Most reports decoded from one input.
const MAX_REPORTS: usize = 64;
/// Superseded instances the table remembers per engine (router-state-load's
/// `RETIRED_INSTANCES`): a report of an instance retired longer ago than that is a new
/// instance to it, by design, so only sequences of remembered instances must increase.
const RETIRED_INSTANCES: usize = 8;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    if mode & 3 == 3 {
        vllm_metrics(1 + u32::from(mode >> 2) % 4, rest);
        return;
    }
    if mode & 1 == 1 {
        if let Ok(ranks) = parse_v1_loads(rest) {
            for rank in &ranks {
                assert!(rank.estimated_prefill_queue_ms.is_none_or(f64::is_finite));
                assert!(rank.decode_tokens_per_sec.is_none_or(f64::is_finite));
            }
        }
        return;
    }
    reports(1 + u32::from(mode >> 1) % 4, rest);
});

/// One engine of `dp_size` ranks.
fn engine(dp_size: u32) -> Worker {
    let spec =
        WorkerSpec { dp_size, ..WorkerSpec::new("engine-0", "http://127.0.0.1:1", Stage::Plain) };
    let Ok(worker) = Worker::from_spec(&spec, vec![ModelId::new("m")]) else {
        panic!("the fixture worker is invalid");
    };
    worker
}

fn vllm_metrics(dp_size: u32, body: &[u8]) {
    let metrics = match parse_vllm_metrics(body) {
        Ok(metrics) => metrics,
        Err(error) => {
            let reason = error.reject_reason();
            assert!(
                matches!(reason, RejectReason::Malformed | RejectReason::AbsurdValue),
                "{error} counted as {reason}"
            );
            return;
        }
    };
    assert_eq!(metrics.ranks.len(), metrics.engines.len(), "a rank per engine");
    assert!(metrics.engines.windows(2).all(|w| w[0] < w[1]), "engines not ascending");
    for (rank, sample) in metrics.ranks.iter().enumerate() {
        assert_eq!(sample.dp_rank as usize, rank, "ranks are positions");
        assert!(sample.kv_used_tokens <= sample.kv_capacity_tokens, "{sample:?}");
        assert!(!sample.has_native_gauges(), "vLLM states no native gauge");
    }
    assert_ne!(metrics.instance_id, Some(0), "instance 0 means none");
    let clock = Arc::new(ManualClock::new());
    let table = EngineReportedLoadTable::new(TableConfig::default(), clock);
    let worker = engine(dp_size);
    table.register(&worker);
    let engines = metrics.ranks.len();
    let report = Report {
        dp_size,
        ..Report::new(
            worker.id().as_str(),
            metrics.instance_id.unwrap_or(0),
            1,
            ReportKind::Basic,
            metrics.ranks,
        )
    };
    let result = table.apply(worker.id(), worker.incarnation(), report);
    let snapshot = table.snapshot();
    match result {
        Ok(kind) => {
            assert_eq!(kind, ReportKind::Basic);
            assert_eq!(engines, dp_size as usize, "a usable load of other ranks than dp_size");
            assert!(snapshot.get(worker.id()).is_some_and(|load| load.native.is_none()));
        }
        Err(RejectReason::RankIncomplete) => assert_ne!(engines, dp_size as usize),
        Err(reason) => {
            assert_eq!(reason, RejectReason::AbsurdValue, "only values beyond any engine");
            assert!(snapshot.get(worker.id()).is_none());
        }
    }
}

fn reports(dp_size: u32, mut stream: &[u8]) {
    let clock = Arc::new(ManualClock::new());
    let table = EngineReportedLoadTable::new(TableConfig::default(), clock.clone());
    let worker = engine(dp_size);
    let id: WorkerId = worker.id().clone();
    table.register(&worker);
    // The last accepted sequence of each instance the table still remembers, and the
    // instances it remembers as retired, oldest first.
    let mut last: HashMap<u64, u64> = HashMap::new();
    let mut current: Option<u64> = None;
    let mut retired: VecDeque<u64> = VecDeque::new();
    for _ in 0..MAX_REPORTS {
        if stream.is_empty() {
            break;
        }
        let Ok(wire) = pb::LoadReport::decode_length_delimited(&mut stream) else { break };
        clock.advance(Duration::from_millis(20));
        let report = match Report::from_wire(&wire) {
            Ok(report) => report,
            Err(reason) => {
                assert_eq!(reason, RejectReason::Malformed, "from_wire rejects only the kind");
                table.reject(&id, worker.incarnation(), reason);
                continue;
            }
        };
        assert_eq!(report.ranks.len(), wire.ranks.len(), "a rank was lost in decoding");
        let (instance, sequence) = (report.instance_id, report.sequence);
        let result = table.apply(&id, worker.incarnation(), report);
        // An accepted or rank-incomplete report moved the table's order to its instance.
        if matches!(result, Ok(_) | Err(RejectReason::RankIncomplete))
            && let Some(previous) = current.replace(instance)
            && previous != instance
        {
            retired.push_back(previous);
            if retired.len() > RETIRED_INSTANCES
                && let Some(forgotten) = retired.pop_front()
                && !retired.contains(&forgotten)
            {
                last.remove(&forgotten);
            }
        }
        let snapshot = table.snapshot();
        assert_eq!(
            snapshot.get(&id).is_some(),
            snapshot.ranks(&id).is_some(),
            "a load without its ranks, or ranks without a load"
        );
        match result {
            Ok(_) => {
                if let Some(previous) = last.insert(instance, sequence) {
                    assert!(
                        sequence > previous,
                        "instance {instance}: sequence {sequence} accepted after {previous}"
                    );
                }
                if let Some(load) = snapshot.get(&id) {
                    assert_eq!(load.dp_size, dp_size);
                    assert!(
                        load.kv_capacity_tokens == 0
                            || load.kv_used_tokens <= load.kv_capacity_tokens,
                        "used KV {} above capacity {}",
                        load.kv_used_tokens,
                        load.kv_capacity_tokens
                    );
                    if let Some(native) = load.native {
                        for rate in [
                            native.prefill_tokens_per_sec,
                            native.prefill_queue_ms,
                            native.request_decode_tokens_per_sec,
                        ]
                        .into_iter()
                        .flatten()
                        {
                            assert!(rate.is_finite() && rate >= 0.0, "bad derived value {rate}");
                        }
                    }
                    let ranks = snapshot.ranks(&id).map_or(0, <[_]>::len);
                    assert_eq!(ranks, dp_size as usize, "a usable load misses ranks");
                }
            }
            Err(RejectReason::RankIncomplete) => {
                assert!(snapshot.get(&id).is_none(), "a rank-incomplete report left a load");
            }
            Err(_) => {}
        }
    }
    let totals = table.totals();
    let status = table.status_of(&id).map(|s| s.accepted);
    assert_eq!(status, Some(totals.accepted), "per-engine and total counts disagree");
}
