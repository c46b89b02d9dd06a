//! Table-driven fixtures: engines, reported loads, in-flight counts and a request, with the
//! expected pick and reason, run through policies built from configuration.

use router_workers::Stage;

use super::doubles::running_cap;
use super::fixtures::{
    Engine, Fleet, Load, Numbers, basic, engine, native, native_cap, native_queued,
};
use crate::{AdmissionLimits, Limit, PickError, PickReason, PolicyConfig, PolicySettings};

#[derive(Debug)]
enum Expect {
    Pick(&'static str, PickReason),
    Rejected(&'static str, Limit),
    NoAdmissible(&'static [(&'static str, Limit)]),
    NoCandidates,
}

struct Case {
    name: &'static str,
    stage: Stage,
    engines: Vec<Engine>,
    admission: AdmissionLimits,
    input_tokens: u64,
    expect: Expect,
}

fn case(name: &'static str, stage: Stage, engines: Vec<Engine>, expect: Expect) -> Case {
    Case { name, stage, engines, admission: AdmissionLimits::default(), input_tokens: 100, expect }
}

impl Case {
    fn admission(mut self, admission: AdmissionLimits) -> Self {
        self.admission = admission;
        self
    }

    fn input(mut self, tokens: u64) -> Self {
        self.input_tokens = tokens;
        self
    }
}

fn zero() -> Load {
    native(0, 0, 0, 0)
}

fn heavy() -> Load {
    native(50, 50, 5000, 900)
}

/// Builds `kind` with the case's admission over a fleet of the case's engines and checks the
/// outcome. Runs several times: the expectations hold whichever order the engines are sampled.
fn run(kind: &PolicySettings, cases: &[Case], repeats: usize) {
    for case in cases {
        let fleet = Fleet::new(case.stage, &case.engines);
        let config = PolicyConfig { kind: kind.clone(), admission: case.admission };
        let policy = config.build(&fleet.handles()).expect("buildable");
        for _ in 0..repeats {
            let outcome = fleet.pick(policy.as_ref(), case.input_tokens);
            let name = case.name;
            match (&case.expect, outcome) {
                (Expect::Pick(id, reason), Ok(pick)) => {
                    assert_eq!(pick.worker.id().as_str(), *id, "{name}");
                    assert_eq!(pick.reason, *reason, "{name}");
                    assert!(fleet.workers.iter().any(|w| std::sync::Arc::ptr_eq(w, &pick.worker)));
                }
                (Expect::Rejected(id, limit), Err(PickError::AdmissionRejected(r))) => {
                    assert_eq!((r.worker.as_str(), r.limit), (*id, *limit), "{name}");
                }
                (
                    Expect::NoAdmissible(expected),
                    Err(PickError::NoAdmissibleEngine { rejections }),
                ) => {
                    let got: Vec<_> =
                        rejections.iter().map(|r| (r.worker.as_str(), r.limit)).collect();
                    assert_eq!(got, *expected, "{name}");
                }
                (Expect::NoCandidates, Err(PickError::NoCandidates { stage })) => {
                    assert_eq!(stage, case.stage, "{name}");
                }
                (expected, got) => panic!("{name}: expected {expected:?}, got {got:?}"),
            }
        }
    }
}

#[test]
fn power_of_two_fixtures() {
    use Expect::{NoCandidates, Pick, Rejected};
    use PickReason::{LocalPressure, OnlyCandidate, ReportedPressure};
    let (plain, prefill, decode) = (Stage::Plain, Stage::Prefill, Stage::Decode);
    let cases = vec![
        case(
            "plain: fewer waiting uncached tokens",
            plain,
            vec![engine("a", native(0, 0, 100, 0)), engine("b", native(0, 0, 50, 0))],
            Pick("b", ReportedPressure),
        ),
        case(
            "prefill: queue time first when both have it",
            prefill,
            vec![engine("a", native_queued(900, 5.0)), engine("b", native_queued(10, 50.0))],
            Pick("a", ReportedPressure),
        ),
        case(
            "prefill: queue time ignored unless both have it",
            prefill,
            vec![engine("a", native_queued(900, 5.0)), engine("b", native(0, 0, 10, 0))],
            Pick("b", ReportedPressure),
        ),
        case(
            "plain: then waiting requests",
            plain,
            vec![engine("a", native(0, 3, 10, 0)), engine("b", native(0, 2, 10, 0))],
            Pick("b", ReportedPressure),
        ),
        case(
            "plain: then running requests",
            plain,
            vec![engine("a", native(5, 2, 10, 0)), engine("b", native(4, 2, 10, 0))],
            Pick("b", ReportedPressure),
        ),
        case(
            "decode: waiting requests first, uncached tokens ignored",
            decode,
            vec![engine("a", native(0, 1, 0, 0)), engine("b", native(9, 0, 5000, 900))],
            Pick("b", ReportedPressure),
        ),
        case(
            "decode: then running requests",
            decode,
            vec![engine("a", native(3, 1, 0, 0)), engine("b", native(2, 1, 900, 0))],
            Pick("b", ReportedPressure),
        ),
        case(
            "decode: then kv usage fraction",
            decode,
            vec![
                engine("a", native_cap(2, 1, 500, 1000)),
                engine("b", native_cap(2, 1, 600, 2000)),
            ],
            Pick("b", ReportedPressure),
        ),
        case(
            "decode: then used kv tokens",
            decode,
            vec![engine("a", native_cap(2, 1, 200, 1000)), engine("b", native_cap(2, 1, 100, 500))],
            Pick("b", ReportedPressure),
        ),
        case(
            "reported tie: fewer in-flight",
            plain,
            vec![
                engine("a", native(1, 1, 1, 1)).inflight(2),
                engine("b", native(1, 1, 1, 1)).inflight(1),
            ],
            Pick("b", ReportedPressure),
        ),
        case(
            "missing report: compared by in-flight, not read as idle",
            plain,
            vec![engine("a", Load::Missing).inflight(3), engine("b", heavy()).inflight(1)],
            Pick("b", LocalPressure),
        ),
        case(
            "missing report: the reported engine's load does not count either",
            plain,
            vec![engine("a", Load::Missing), engine("b", zero()).inflight(1)],
            Pick("a", LocalPressure),
        ),
        case(
            "basic report: no native pressure",
            plain,
            vec![engine("a", basic(50, 50)).inflight(1), engine("b", zero()).inflight(2)],
            Pick("a", LocalPressure),
        ),
        case(
            "stale report: missing",
            plain,
            vec![
                engine("a", Load::Stale(Numbers { capacity: 1000, ..Numbers::default() }))
                    .inflight(2),
                engine("b", heavy()).inflight(1),
            ],
            Pick("b", LocalPressure),
        ),
        case(
            "rank-incomplete report: missing",
            decode,
            vec![
                engine("a", Load::RankIncomplete(Numbers { capacity: 1000, ..Numbers::default() }))
                    .inflight(2),
                engine("b", heavy()).inflight(1),
            ],
            Pick("b", LocalPressure),
        ),
        case(
            "no kv capacity: not a valid native report",
            decode,
            vec![engine("a", native_cap(0, 0, 0, 0)).inflight(2), engine("b", heavy()).inflight(1)],
            Pick("b", LocalPressure),
        ),
        case(
            "admission rejects the winner; the other engine is not tried",
            plain,
            vec![engine("a", native(10, 0, 0, 0)), engine("b", native(0, 0, 100, 0))],
            Rejected("a", Limit::RunningRequests),
        )
        .admission(running_cap(5)),
        case(
            "unknown reported metrics fail open",
            plain,
            vec![engine("a", Load::Missing), engine("b", Load::Missing).inflight(1)],
            Pick("a", LocalPressure),
        )
        .admission(AdmissionLimits {
            max_running_requests: Some(1),
            max_waiting_requests: Some(1),
            max_kv_tokens: Some(1),
            max_pending_prefill_tokens: Some(1),
            max_inflight_requests: None,
        }),
        case(
            "in-flight cap is always checked",
            plain,
            vec![engine("a", Load::Missing).inflight(2), engine("b", Load::Missing).inflight(3)],
            Rejected("a", Limit::InflightRequests),
        )
        .admission(AdmissionLimits {
            max_inflight_requests: Some(2),
            ..AdmissionLimits::default()
        }),
        case(
            "a basic report feeds the running cap",
            plain,
            vec![engine("a", basic(8, 0)), engine("b", basic(0, 0)).inflight(1)],
            Rejected("a", Limit::RunningRequests),
        )
        .admission(running_cap(8)),
        case(
            "a basic report leaves kv and pending prefill unknown",
            plain,
            vec![engine("a", basic(0, 0)), engine("b", basic(0, 0)).inflight(1)],
            Pick("a", LocalPressure),
        )
        .admission(AdmissionLimits {
            max_kv_tokens: Some(1),
            max_pending_prefill_tokens: Some(1),
            ..AdmissionLimits::default()
        }),
        case(
            "native total kv tokens feed the kv cap",
            plain,
            vec![engine("a", native(0, 0, 10, 100)), engine("b", native(0, 0, 20, 0))],
            Rejected("a", Limit::KvTokens),
        )
        .admission(AdmissionLimits { max_kv_tokens: Some(110), ..AdmissionLimits::default() }),
        case(
            "native waiting uncached tokens feed the pending prefill cap",
            prefill,
            vec![engine("a", native(0, 0, 10, 0)), engine("b", native(0, 0, 20, 0))],
            Rejected("a", Limit::PendingPrefillTokens),
        )
        .admission(AdmissionLimits {
            max_pending_prefill_tokens: Some(10),
            ..AdmissionLimits::default()
        }),
        case(
            "a cap admits while the metric is below it",
            plain,
            vec![engine("a", native(7, 0, 0, 0)), engine("b", native(7, 0, 1, 0))],
            Pick("a", ReportedPressure),
        )
        .admission(running_cap(8)),
        case(
            "one candidate is taken directly",
            plain,
            vec![engine("a", heavy())],
            Pick("a", OnlyCandidate),
        ),
        case(
            "one candidate is still admitted",
            plain,
            vec![engine("a", native(9, 0, 0, 0))],
            Rejected("a", Limit::RunningRequests),
        )
        .admission(running_cap(5)),
        case("no candidates", plain, vec![], NoCandidates).admission(running_cap(0)),
    ];
    run(&PolicySettings::PowerOfTwo, &cases, 16);
}

#[test]
fn least_load_fixtures() {
    use Expect::{NoAdmissible, NoCandidates, Pick};
    use PickReason::{LeastLocalLoad, LeastReportedLoad, OnlyCandidate};
    let (plain, prefill, decode) = (Stage::Plain, Stage::Prefill, Stage::Decode);
    let cases = vec![
        case(
            "exact minimum of the stage pressure",
            plain,
            vec![
                engine("a", native(0, 0, 300, 0)),
                engine("b", native(0, 0, 100, 0)),
                engine("c", native(0, 0, 200, 0)),
            ],
            Pick("b", LeastReportedLoad),
        ),
        case(
            "requests dispatched since the report count",
            plain,
            vec![
                engine("a", zero()).recent(3),
                engine("b", native(0, 0, 200, 0)),
                engine("c", native(0, 0, 250, 0)),
            ],
            Pick("b", LeastReportedLoad),
        )
        .input(100),
        case(
            "requests dispatched before the report do not count twice",
            plain,
            vec![
                engine("a", zero()).inflight(3),
                engine("b", native(0, 0, 200, 0)),
                engine("c", native(0, 0, 250, 0)),
            ],
            Pick("a", LeastReportedLoad),
        )
        .input(100),
        case(
            "decode: recent dispatches are waiting requests",
            decode,
            vec![
                engine("a", zero()).recent(2),
                engine("b", native(0, 1, 0, 0)),
                engine("c", native(0, 3, 0, 0)),
            ],
            Pick("b", LeastReportedLoad),
        ),
        case(
            "prefill: queue time compared without unreported dispatches",
            prefill,
            vec![engine("a", native_queued(500, 1.0)), engine("b", native_queued(50, 100.0))],
            Pick("a", LeastReportedLoad),
        ),
        case(
            "prefill: unreported dispatches drop the queue time",
            prefill,
            vec![
                engine("a", native_queued(0, 1.0)).recent(1),
                engine("b", native_queued(50, 100.0)),
            ],
            Pick("b", LeastReportedLoad),
        )
        .input(100),
        case(
            "a missing report: every engine by in-flight",
            plain,
            vec![
                engine("a", zero()).inflight(2),
                engine("b", Load::Missing).inflight(1),
                engine("c", zero()).inflight(3),
            ],
            Pick("b", LeastLocalLoad),
        ),
        case(
            "a basic report: every engine by in-flight",
            decode,
            vec![engine("a", zero()).inflight(2), engine("b", basic(90, 90)).inflight(1)],
            Pick("b", LeastLocalLoad),
        ),
        case(
            "local ties go to the first candidate",
            plain,
            vec![
                engine("a", Load::Missing).inflight(1),
                engine("b", Load::Missing),
                engine("c", Load::Missing),
            ],
            Pick("b", LeastLocalLoad),
        ),
        case(
            "reported ties go to fewer in-flight, then the first candidate",
            plain,
            vec![
                engine("a", native(1, 1, 1, 1)).inflight(2),
                engine("b", native(1, 1, 1, 1)).inflight(1),
                engine("c", native(1, 1, 1, 1)).inflight(1),
            ],
            Pick("b", LeastReportedLoad),
        ),
        case(
            "a rejected minimum gives way to the next least loaded",
            plain,
            vec![
                engine("a", native(0, 0, 100, 0)),
                engine("b", native(9, 0, 50, 0)),
                engine("c", native(0, 0, 200, 0)),
            ],
            Pick("a", LeastReportedLoad),
        )
        .admission(running_cap(5)),
        case(
            "every engine rejected: all rejections, least loaded first",
            plain,
            vec![
                engine("a", native(9, 0, 100, 0)),
                engine("b", native(9, 0, 50, 0)),
                engine("c", native(9, 0, 200, 0)),
            ],
            NoAdmissible(&[
                ("b", Limit::RunningRequests),
                ("a", Limit::RunningRequests),
                ("c", Limit::RunningRequests),
            ]),
        )
        .admission(running_cap(5)),
        case(
            "one candidate is taken directly",
            plain,
            vec![engine("a", heavy())],
            Pick("a", OnlyCandidate),
        ),
        case(
            "one rejected candidate",
            plain,
            vec![engine("a", heavy())],
            NoAdmissible(&[("a", Limit::RunningRequests)]),
        )
        .admission(running_cap(5)),
        case("no candidates", decode, vec![], NoCandidates).admission(running_cap(0)),
    ];
    run(&PolicySettings::LoadBased, &cases, 1);
}

#[test]
fn round_robin_and_random_fixtures() {
    use Expect::{NoCandidates, Pick, Rejected};
    let one = |reason| {
        vec![
            case(
                "one candidate",
                Stage::Plain,
                vec![engine("a", Load::Missing)],
                Pick("a", reason),
            ),
            case(
                "one candidate, admitted",
                Stage::Plain,
                vec![engine("a", native(9, 0, 0, 0))],
                Rejected("a", Limit::RunningRequests),
            )
            .admission(running_cap(9)),
            case("no candidates", Stage::Prefill, vec![], NoCandidates).admission(running_cap(0)),
        ]
    };
    run(&PolicySettings::RoundRobin, &one(PickReason::OnlyCandidate), 3);
    run(&PolicySettings::Random, &one(PickReason::OnlyCandidate), 3);
}

#[test]
fn round_robin_rotates_and_admits_the_engine_it_reached() {
    let fleet = Fleet::new(
        Stage::Decode,
        &[engine("a", zero()), engine("b", native(9, 0, 0, 0)), engine("c", zero())],
    );
    let config = PolicyConfig { kind: PolicySettings::RoundRobin, admission: running_cap(5) };
    let policy = config.build(&fleet.handles()).expect("buildable");
    let mut seen = Vec::new();
    for _ in 0..6 {
        match fleet.pick(policy.as_ref(), 1) {
            Ok(pick) => {
                assert_eq!(pick.reason, PickReason::RoundRobin);
                seen.push(pick.worker.id().to_string());
            }
            Err(PickError::AdmissionRejected(r)) => seen.push(format!("!{}", r.worker)),
            Err(other) => panic!("{other}"),
        }
    }
    assert_eq!(seen, ["a", "!b", "c", "a", "!b", "c"]);
}

#[test]
fn random_reports_its_reason_and_admits_its_draw() {
    let fleet = Fleet::new(Stage::Plain, &[engine("a", native(9, 0, 0, 0)), engine("b", zero())]);
    let config = PolicyConfig { kind: PolicySettings::Random, admission: running_cap(5) };
    let policy = config.build(&fleet.handles()).expect("buildable");
    let (mut picked, mut rejected) = (0, 0);
    for _ in 0..64 {
        match fleet.pick(policy.as_ref(), 1) {
            Ok(pick) => {
                assert_eq!((pick.worker.id().as_str(), pick.reason), ("b", PickReason::Random));
                picked += 1;
            }
            Err(PickError::AdmissionRejected(r)) => {
                assert_eq!(r.worker.as_str(), "a");
                rejected += 1;
            }
            Err(other) => panic!("{other}"),
        }
    }
    assert!(picked > 0 && rejected > 0, "{picked} picked, {rejected} rejected");
}
