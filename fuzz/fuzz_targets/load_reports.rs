//! Fuzz target `load_reports`: the engines' load-report decoders and the table they feed.
//!
//! The first byte chooses the decoder. Odd: the rest is SGLang's `/v1/loads` JSON body
//! (`parse_v1_loads`). Even: the rest is a stream of length-delimited protobuf `LoadReport`s
//! (`router.load.v1`, as the gRPC subscription receives them), each decoded, turned into a
//! [`Report`] and applied to an [`EngineReportedLoadTable`] under a manual clock for one
//! engine of `1 + (first byte >> 1) % 4` ranks. Beyond "never panics": within one engine
//! instance accepted sequences strictly increase (while the table remembers the instance), a usable load has every rank, and clamped
//! values are in range.
#![no_main]

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use prost::Message;
use router_proto::router::load::v1 as pb;
use router_state_load::{
    EngineReportedLoadTable, ManualClock, RejectReason, Report, TableConfig, parse_v1_loads,
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

fn reports(dp_size: u32, mut stream: &[u8]) {
    let clock = Arc::new(ManualClock::new());
    let table = EngineReportedLoadTable::new(TableConfig::default(), clock.clone());
    let spec =
        WorkerSpec { dp_size, ..WorkerSpec::new("engine-0", "http://127.0.0.1:1", Stage::Plain) };
    let Ok(worker) = Worker::from_spec(&spec, vec![ModelId::new("m")]) else {
        panic!("the fixture worker is invalid");
    };
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
