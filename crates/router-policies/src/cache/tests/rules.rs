//! Table-driven cases: every rule and threshold of the algorithm, with its boundaries. Each
//! case runs for plain and for prefill groups.

use std::sync::Arc;

use router_workers::Stage;

use super::fixture::{BS, Eng, World, eng};
use crate::tests::doubles::running_cap;
use crate::{CacheAwareSettings, PickError, PickReason};

use PickReason::{CacheHit, CacheMiss, SaturationPin};

/// Prompt tokens of most requests: 256 blocks of 16.
const INPUT: usize = 4096;

enum Want {
    Pick(&'static str, PickReason),
    NoAdmissible(&'static [&'static str]),
}

struct Case {
    name: &'static str,
    engines: Vec<Eng>,
    settings: CacheAwareSettings,
    /// Admission: a cap on reported running requests.
    running_cap: Option<u64>,
    input: usize,
    want: Want,
}

/// The reference defaults, with an exact-minimum load fallback so that misses are
/// deterministic.
fn base() -> CacheAwareSettings {
    CacheAwareSettings { min_load_choices: 64, ..CacheAwareSettings::default() }
}

fn case(name: &'static str, engines: Vec<Eng>, want: Want) -> Case {
    Case { name, engines, settings: base(), running_cap: None, input: INPUT, want }
}

impl Case {
    fn settings(mut self, f: impl FnOnce(&mut CacheAwareSettings)) -> Self {
        f(&mut self.settings);
        self
    }

    fn cap(mut self, cap: u64) -> Self {
        self.running_cap = Some(cap);
        self
    }

    fn input(mut self, input: usize) -> Self {
        self.input = input;
        self
    }
}

fn run(cases: Vec<Case>) {
    for case in cases {
        for stage in [Stage::Plain, Stage::Prefill] {
            let world = World::new(stage, &case.engines);
            let mut policy = world.policy(case.settings.clone());
            if let Some(cap) = case.running_cap {
                let check = crate::AdmissionCheck::new(Arc::new(running_cap(cap)), world.load());
                policy = policy.with_admission(check);
            }
            let got = world.pick(&policy, case.input);
            let name = format!("{} ({stage})", case.name);
            match (&case.want, got) {
                (Want::Pick(id, reason), Ok(pick)) => {
                    assert_eq!((pick.worker.id().as_str(), pick.reason), (*id, *reason), "{name}");
                }
                (Want::NoAdmissible(ids), Err(PickError::NoAdmissibleEngine { rejections })) => {
                    let got: Vec<&str> = rejections.iter().map(|r| r.worker.as_str()).collect();
                    assert_eq!(got, *ids, "{name}");
                }
                (_, got) => panic!("{name}: unexpected {got:?}"),
            }
        }
    }
}

fn pick(id: &'static str, reason: PickReason) -> Want {
    Want::Pick(id, reason)
}

#[test]
fn hit_thresholds() {
    run(vec![
        case("exactly the minimum is a hit", vec![eng("c", 0), eng("a", 64)], pick("a", CacheHit)),
        case("one block short is a miss", vec![eng("a", 63), eng("c", 0)], pick("a", CacheMiss)),
        case(
            "a lower minimum at 63 blocks' tokens",
            vec![eng("c", 0), eng("a", 63)],
            pick("a", CacheHit),
        )
        .settings(|s| s.cache_affinity_min_matched_tokens = 63 * 16),
        case("one token above it", vec![eng("c", 0), eng("a", 63)], pick("c", CacheMiss))
            .settings(|s| s.cache_affinity_min_matched_tokens = 63 * 16 + 1),
        case("ratio reached exactly", vec![eng("c", 0), eng("a", 64)], pick("a", CacheHit))
            .settings(|s| s.cache_affinity_min_matched_ratio = Some(0.5))
            .input(2048),
        case("ratio just missed", vec![eng("c", 0), eng("a", 64)], pick("c", CacheMiss))
            .settings(|s| s.cache_affinity_min_matched_ratio = Some(0.5001))
            .input(2048),
        case("ratio alone, reached", vec![eng("c", 0), eng("a", 64)], pick("a", CacheHit))
            .settings(|s| {
                s.cache_affinity_min_matched_tokens = 0;
                s.cache_affinity_min_matched_ratio = Some(0.25);
            }),
        case("ratio alone, missed", vec![eng("c", 0), eng("a", 63)], pick("c", CacheMiss))
            .settings(|s| {
                s.cache_affinity_min_matched_tokens = 0;
                s.cache_affinity_min_matched_ratio = Some(0.25);
            }),
        case(
            "a minimum of 0 still needs one block",
            vec![eng("b", 0).inflight(1), eng("a", 0)],
            pick("a", CacheMiss),
        )
        .settings(|s| s.cache_affinity_min_matched_tokens = 0),
        case("the whole prompt cached", vec![eng("c", 0), eng("a", 256)], pick("a", CacheHit))
            .settings(|s| s.cache_affinity_min_matched_ratio = Some(1.0)),
        case(
            "blocks convert with each engine's own block size",
            vec![eng("a", 64), eng("b", 40).block_size(32)],
            pick("b", CacheHit),
        ),
        case(
            "a larger block size that falls short",
            vec![eng("b", 31).block_size(32), eng("a", 64)],
            pick("a", CacheHit),
        ),
        case(
            "an engine without KV events holds nothing",
            vec![eng("a", 200).no_kv(), eng("b", 64)],
            pick("b", CacheHit),
        ),
        case(
            "the storage tier does not shorten a match",
            vec![eng("a", 100), eng("b", 120).tier(router_state_kv::Medium::Disk)],
            pick("b", CacheHit),
        ),
    ]);
}

#[test]
fn ordering_of_holders() {
    run(vec![
        case("least uncached work wins", vec![eng("a", 64), eng("b", 100)], pick("b", CacheHit)),
        case(
            "equal depth: less prefill pressure first",
            vec![eng("a", 100).uncached(500), eng("b", 100)],
            pick("b", CacheHit),
        ),
        case(
            "equal depth: queue time before waiting tokens",
            vec![eng("a", 100).queue_ms(5.0).uncached(900), eng("b", 100).queue_ms(9.0)],
            pick("a", CacheHit),
        ),
        case(
            "equal depth and pressure: worker id",
            vec![eng("b", 100), eng("a", 100)],
            pick("a", CacheHit),
        ),
        case(
            "a missing report compares everyone by in-flight requests",
            vec![eng("a", 100).uncached(0).inflight(3), eng("b", 100).missing().inflight(1)],
            pick("b", CacheHit),
        ),
    ]);
}

/// `a` is the deepest holder but at the running cap; `b` the next holder; `c`, `d` cold.
fn bound_fleet() -> Vec<Eng> {
    vec![eng("a", 200).running(9), eng("b", 150), eng("c", 0), eng("d", 0)]
}

#[test]
fn candidate_bounds() {
    let bounded = |name, min: usize, ratio: f64, max: usize, want| {
        case(name, bound_fleet(), want).cap(9).settings(|s| {
            s.cache_candidate_min_workers = min;
            s.cache_candidate_ratio = ratio;
            s.cache_candidate_max_workers = max;
        })
    };
    // Keeping one holder: the rejected leader leaves none, so b is reached only by the
    // fallback (the exact minimum, b first among equals).
    run(vec![
        bounded("one kept by the minimum", 1, 0.0, 32, pick("b", CacheMiss)),
        bounded("two kept by the minimum", 2, 0.0, 32, pick("b", CacheHit)),
        bounded("ratio x n = 1.0 keeps one", 1, 0.25, 32, pick("b", CacheMiss)),
        bounded("ratio x n = 1.04 rounds up to two", 1, 0.26, 32, pick("b", CacheHit)),
        bounded("the maximum caps the ratio", 1, 1.0, 1, pick("b", CacheMiss)),
        bounded("a maximum of two", 1, 1.0, 2, pick("b", CacheHit)),
    ]);
}

#[test]
fn candidate_bound_formula() {
    let world = World::new(Stage::Prefill, &[eng("a", 1)]);
    let policy = world.policy(CacheAwareSettings::default());
    // min(n, 32, max(8, ceil(0.05 n))).
    for (n, want) in
        [(0, 0), (3, 3), (8, 8), (64, 8), (160, 8), (161, 9), (400, 20), (640, 32), (1000, 32)]
    {
        assert_eq!(policy.candidate_bound(n), want, "n = {n}");
    }
}

#[test]
fn soft_queue_gate_and_saturation() {
    let gate = |s: &mut CacheAwareSettings| s.worker_queue_limit = Some(4);
    let floor = |s: &mut CacheAwareSettings| {
        s.worker_queue_limit = Some(4);
        s.saturation_queue_floor = Some(2);
    };
    run(vec![
        case(
            "a holder at the queue limit is passed over",
            vec![eng("a", 200).waiting(4), eng("b", 100)],
            pick("b", CacheHit),
        )
        .settings(gate),
        case(
            "one below the limit is not",
            vec![eng("a", 200).waiting(3), eng("b", 100)],
            pick("a", CacheHit),
        )
        .settings(gate),
        case(
            "a missing report is not queued (fail open)",
            vec![eng("a", 200).missing(), eng("b", 100)],
            pick("a", CacheHit),
        )
        .settings(gate),
        case(
            "a basic report gates too",
            vec![eng("a", 200).basic(0, 4), eng("b", 100)],
            pick("b", CacheHit),
        )
        .settings(gate),
        case(
            "without a limit nothing is queued",
            vec![eng("a", 200).waiting(50), eng("b", 100)],
            pick("a", CacheHit),
        ),
        case(
            "gated holders divert to an unqueued engine",
            vec![eng("a", 200).waiting(5), eng("c", 0)],
            pick("c", CacheMiss),
        )
        .settings(gate),
        case(
            "every engine queued: keep the prefix",
            vec![eng("a", 200).waiting(5), eng("b", 100).waiting(9), eng("c", 0).waiting(6)],
            pick("a", SaturationPin),
        )
        .settings(gate),
        case(
            "an engine without a report keeps the group from being all queued",
            vec![eng("a", 200).waiting(5), eng("c", 0).missing()],
            pick("c", CacheMiss),
        )
        .settings(gate),
        case(
            "floor: no fresh queue below it pins the holder",
            vec![eng("a", 200).waiting(5), eng("c", 0).waiting(3)],
            pick("a", SaturationPin),
        )
        .settings(floor),
        case(
            "floor: a queue equal to it is not below",
            vec![eng("a", 200).waiting(5), eng("c", 0).waiting(2)],
            pick("a", SaturationPin),
        )
        .settings(floor),
        case(
            "floor: a queue below it diverts",
            vec![eng("a", 200).waiting(5), eng("c", 0).waiting(1)],
            pick("c", CacheMiss),
        )
        .settings(floor),
        case(
            "floor: an unknown queue is no proof of idleness",
            vec![eng("a", 200).waiting(5), eng("c", 0).missing()],
            pick("a", SaturationPin),
        )
        .settings(floor),
        case(
            "saturation without a floor keeps the winner rule (deepest)",
            vec![
                eng("a", 200).waiting(8).uncached(9000),
                eng("b", 100).waiting(5),
                eng("c", 0).waiting(4),
            ],
            pick("a", SaturationPin),
        )
        .settings(gate),
        case(
            "floor: the least-pressured gated holder is pinned",
            vec![
                eng("a", 200).waiting(8).uncached(9000),
                eng("b", 100).waiting(5),
                eng("c", 0).waiting(4),
            ],
            pick("b", SaturationPin),
        )
        .settings(floor),
        case(
            "saturation pinning passes hard admission",
            vec![
                eng("a", 200).waiting(5).running(9),
                eng("b", 100).waiting(5),
                eng("c", 0).waiting(5),
            ],
            pick("b", SaturationPin),
        )
        .settings(gate)
        .cap(9),
        case(
            "floor pinning passes hard admission",
            vec![
                eng("a", 200).waiting(5).running(9),
                eng("b", 100).waiting(6),
                eng("c", 0).waiting(4),
            ],
            pick("b", SaturationPin),
        )
        .settings(floor)
        .cap(9),
        case(
            "every holder rejected while saturated: the fallback, never a rejected holder",
            vec![
                eng("a", 200).waiting(5).running(9),
                eng("b", 100).waiting(5).running(9),
                eng("c", 0).waiting(5).running(3),
            ],
            pick("c", CacheMiss),
        )
        .settings(gate)
        .cap(9),
    ]);
}

/// `a` holds the whole prompt; `b` is `uncached_gap` tokens behind. Both native.
fn guard_fleet(a: Eng, b_blocks: u32, b: impl FnOnce(Eng) -> Eng) -> Vec<Eng> {
    vec![a, b(eng("b", b_blocks))]
}

#[test]
fn switch_margin_and_pressure_guard() {
    let full = 256;
    let margin_blocks = full - 1024 / BS; // b exactly 1024 uncached tokens behind
    let ms = |s: &mut CacheAwareSettings| s.pressure_abs_threshold_ms = Some(10.0);
    run(vec![
        case(
            "a much busier leader loses to a holder within the margin",
            guard_fleet(eng("a", full).uncached(5000), margin_blocks, |b| b.uncached(1000)),
            pick("b", CacheHit),
        ),
        case(
            "just outside the margin it does not",
            guard_fleet(eng("a", full).uncached(5000), margin_blocks - 1, |b| b.uncached(1000)),
            pick("a", CacheHit),
        ),
        case(
            "absolute gap equal to the threshold: no switch",
            guard_fleet(eng("a", full).uncached(3024), margin_blocks, |b| b.uncached(2000)),
            pick("a", CacheHit),
        ),
        case(
            "absolute gap one above: switch",
            guard_fleet(eng("a", full).uncached(3025), margin_blocks, |b| b.uncached(2000)),
            pick("b", CacheHit),
        ),
        case(
            "relative gap equal to the threshold: no switch",
            guard_fleet(eng("a", full).uncached(6000), margin_blocks, |b| b.uncached(4000)),
            pick("a", CacheHit),
        ),
        case(
            "relative gap just above: switch",
            guard_fleet(eng("a", full).uncached(6001), margin_blocks, |b| b.uncached(4000)),
            pick("b", CacheHit),
        ),
        case(
            "queue time: both gaps exceeded",
            guard_fleet(eng("a", full).queue_ms(40.0), margin_blocks, |b| b.queue_ms(20.0)),
            pick("b", CacheHit),
        )
        .settings(ms),
        case(
            "queue time: absolute gap equal to the threshold",
            guard_fleet(eng("a", full).queue_ms(30.0), margin_blocks, |b| b.queue_ms(20.0)),
            pick("a", CacheHit),
        )
        .settings(ms),
        case(
            "queue time: relative gap equal to the threshold",
            guard_fleet(eng("a", full).queue_ms(45.0), margin_blocks, |b| b.queue_ms(30.0)),
            pick("a", CacheHit),
        )
        .settings(ms),
        case(
            "queue time decides over waiting tokens when both have it",
            guard_fleet(eng("a", full).queue_ms(25.0).uncached(9000), margin_blocks, |b| {
                b.queue_ms(20.0)
            }),
            pick("a", CacheHit),
        )
        .settings(ms),
        case(
            "without a millisecond threshold the token form decides",
            guard_fleet(eng("a", full).queue_ms(25.0).uncached(9000), margin_blocks, |b| {
                b.queue_ms(20.0)
            }),
            pick("b", CacheHit),
        ),
        case(
            "one side without a queue estimate: the token form",
            guard_fleet(eng("a", full).queue_ms(100.0).uncached(9000), margin_blocks, |b| b),
            pick("b", CacheHit),
        )
        .settings(ms),
        case(
            "without a native report on both sides nobody is more pressured",
            guard_fleet(eng("a", full).basic(0, 0), margin_blocks, |b| b),
            pick("a", CacheHit),
        ),
        case(
            "the alternative must pass admission",
            guard_fleet(eng("a", full).uncached(5000), margin_blocks, |b| b.uncached(0).running(9)),
            pick("a", CacheHit),
        )
        .cap(9),
        case(
            "a margin of 0 keeps the leader one block ahead",
            guard_fleet(eng("a", full).uncached(5000), full - 1, |b| b),
            pick("a", CacheHit),
        )
        .settings(|s| s.cache_switch_margin_tokens = 0),
    ]);
}

#[test]
fn admission_and_fallback() {
    let gate = |s: &mut CacheAwareSettings| s.worker_queue_limit = Some(4);
    run(vec![
        case(
            "a rejected leader gives way to the next holder",
            vec![eng("a", 200).running(9), eng("b", 100), eng("c", 0)],
            pick("b", CacheHit),
        )
        .cap(9),
        case(
            "only rejections: every one of them",
            vec![eng("a", 200).running(9), eng("b", 100).running(10), eng("c", 0).running(9)],
            Want::NoAdmissible(&["a", "b", "c"]),
        )
        .cap(9),
        case(
            "miss: the least loaded is rejected, the next is taken",
            vec![eng("a", 0).running(9), eng("b", 0).uncached(100), eng("c", 0).uncached(200)],
            pick("b", CacheMiss),
        )
        .cap(9),
        case(
            "miss: the unqueued tier is preferred over a lighter queued engine",
            vec![eng("a", 0).waiting(5), eng("b", 0).uncached(100)],
            pick("b", CacheMiss),
        )
        .settings(gate),
        case(
            "miss: the queued tier when every unqueued engine is rejected",
            vec![eng("a", 0).waiting(5), eng("b", 0).running(9)],
            pick("a", CacheMiss),
        )
        .settings(gate)
        .cap(9),
        case(
            "miss: rejections of holders and fallback alike",
            vec![eng("a", 100).running(9), eng("b", 0).running(9)],
            Want::NoAdmissible(&["a", "b"]),
        )
        .cap(9),
    ]);
}
