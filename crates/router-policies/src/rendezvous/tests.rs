//! Rendezvous placement: the pinned hash, the load bound, and as properties that independently
//! built replicas agree, that removing an engine moves only its keys, and that the bound holds.

use std::collections::HashMap;
use std::sync::Arc;

use futures::executor::block_on;
use proptest::prelude::*;
use router_affinity::{AffinityConfig, AffinityStore};
use router_state_load::{
    EngineReportedLoadTable, Inflight, InflightGuard, ManualClock, TableConfig,
};
use router_workers::{ModelId, Stage, Worker, WorkerId};

use super::*;
use crate::{
    ConfigError, LoadHandles, NewBinding, PickError, PickReason, PickRequest, PolicyConfig,
    PolicyHandles, PolicySettings,
};

fn id(name: &str) -> WorkerId {
    WorkerId::new(name).expect("valid id")
}

fn worker(model: &ModelId, name: &str) -> Arc<Worker> {
    Arc::new(Worker::plain(name, "http://127.0.0.1:9", model).expect("valid worker"))
}

/// One router replica: its own load state, stores and policy, over engines named `ids` given
/// in that order.
struct Replica {
    model: ModelId,
    workers: Vec<Arc<Worker>>,
    load: LoadHandles,
    policy: Arc<dyn crate::Policy>,
    guards: Vec<InflightGuard>,
}

impl Replica {
    fn new(yaml: &str, ids: &[String]) -> Self {
        let model = ModelId::new("m");
        let workers = ids.iter().map(|name| worker(&model, name)).collect();
        let clock = Arc::new(ManualClock::new());
        let table = Arc::new(EngineReportedLoadTable::new(TableConfig::default(), clock.clone()));
        let load = LoadHandles::new(table, Arc::new(Inflight::new(clock)));
        let config: PolicyConfig = serde_yaml_ng::from_str(yaml).expect(yaml);
        let handles = PolicyHandles::new(load.clone()).with_affinity(
            Arc::new(AffinityStore::new(AffinityConfig::default()).expect("store")),
            Arc::new(AffinityStore::new(AffinityConfig::default()).expect("store")),
        );
        let policy = config.build(&handles).expect(yaml);
        Self { model, workers, load, policy, guards: Vec::new() }
    }

    fn busy(&mut self, name: &str, n: u64) {
        for _ in 0..n {
            self.guards.push(self.load.inflight.acquire(&id(name), Stage::Plain));
        }
    }

    fn pick(&self, session: Option<&str>, routing: Option<&str>) -> Result<String, PickError> {
        let request = PickRequest {
            model: &self.model,
            stage: Stage::Plain,
            bucket: "b",
            input_tokens: 100,
            expected_peak_tokens: None,
            tokens: None,
            session_key: session,
            routing_key: routing,
        };
        let pick = block_on(self.policy.pick(&self.workers, &request))?;
        Ok(pick.worker.id().as_str().to_owned())
    }
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("engine-{i}")).collect()
}

#[test]
fn the_weight_is_pinned() {
    // Computed independently (FNV-1a 64, 0xff separator, splitmix64 finalizer); a change here
    // moves every key of every deployment.
    assert_eq!(rendezvous_weight("session-1", &id("engine-a")), 0x0783_194f_b325_5232);
    assert_eq!(rendezvous_weight("session-1", &id("engine-b")), 0x151b_4844_b2fb_68a3);
    assert_eq!(rendezvous_weight("", &id("e")), 0x5f56_c978_b3f8_ef53);
}

#[test]
fn the_load_bound_is_that_of_bounded_loads() {
    // ceil(1.25 * (3 + 1) / 4) = 2; ceil(1.25 * (0 + 1) / 4) = 1; ceil(2 * 9 / 3) = 6.
    let bare = |factor| RendezvousLoad { factor, floor: 0 };
    assert_eq!(rendezvous_load_bound(3, 4, bare(1.25)), 2);
    assert_eq!(rendezvous_load_bound(0, 4, bare(1.25)), 1);
    assert_eq!(rendezvous_load_bound(8, 3, bare(2.0)), 6);
    assert_eq!(rendezvous_load_bound(5, 0, bare(1.0)), 6);
    // The floor lifts a small bound only: ceil(1.25 * 41 / 4) = 13.
    assert_eq!(rendezvous_load_bound(3, 4, RendezvousLoad::default()), 4);
    assert_eq!(rendezvous_load_bound(40, 4, RendezvousLoad::default()), 13);
}

#[test]
fn a_new_key_walks_past_a_loaded_or_rejected_engine_and_binds_for_good() {
    let ids = names(3);
    let idle = Replica::new("{type: session_aware, new_binding: rendezvous}", &ids);
    let top = idle.pick(Some("s"), None).expect("picked");
    let order: Vec<String> = rendezvous_order("s", &idle.workers)
        .into_iter()
        .map(|i| idle.workers[i].id().as_str().to_owned())
        .collect();
    assert_eq!(top, order[0]);

    // Under the floor the top engine takes it however uneven the load (3 in flight: bound
    // max(ceil(1.25 * 4 / 3), 4) = 4).
    let mut loaded = Replica::new("{type: session_aware, new_binding: rendezvous}", &ids);
    loaded.busy(&order[0], 3);
    let mut under = Replica::new("{type: session_aware, new_binding: rendezvous}", &ids);
    under.busy(&order[0], 3);
    assert_eq!(under.pick(Some("s"), None).expect("picked"), order[0]);
    // The top engine at the bound (5 in flight: max(ceil(1.25 * 6 / 3), 4) = 4).
    loaded.busy(&order[0], 2);
    assert_eq!(loaded.pick(Some("s"), None).expect("picked"), order[1]);
    // Bound now: reused whatever the load.
    loaded.busy(&order[1], 10);
    assert_eq!(loaded.pick(Some("s"), None).expect("picked"), order[1]);

    // Admission rejects the top engine: the next weight takes it.
    let yaml = "{type: sticky, new_binding: rendezvous, admission: {max_inflight_requests: 1}}";
    let mut capped = Replica::new(yaml, &ids);
    capped.busy(&order[0], 1);
    assert_eq!(capped.pick(None, Some("s")).expect("picked"), order[1]);
    // Every engine rejected: the bound key keeps its binding and gets its engine's
    // rejection; a new key gets the rejection of its engine of highest weight.
    capped.busy(&order[1], 1);
    capped.busy(&order[2], 1);
    let rejected = |key: &str| match capped.pick(None, Some(key)) {
        Err(PickError::AdmissionRejected(rejection)) => rejection.worker.as_str().to_owned(),
        other => panic!("expected a rejection, got {other:?}"),
    };
    assert_eq!(rejected("s"), order[1]);
    let top_of_t = rendezvous_order("t", &capped.workers)[0];
    assert_eq!(rejected("t"), capped.workers[top_of_t].id().as_str());
}

#[test]
fn keyless_requests_still_go_to_the_fallback() {
    let ids = names(3);
    let replica = Replica::new("{type: sticky, new_binding: rendezvous}", &ids);
    // Round-robin, the sticky default: the rotation, not one engine.
    let picks: Vec<String> = (0..3).map(|_| replica.pick(None, None).expect("picked")).collect();
    assert_eq!(picks, ids);
    let request = PickRequest {
        model: &replica.model,
        stage: Stage::Plain,
        bucket: "b",
        input_tokens: 1,
        expected_peak_tokens: None,
        tokens: None,
        session_key: None,
        routing_key: Some("k"),
    };
    let pick = block_on(replica.policy.pick(&replica.workers, &request)).expect("picked");
    assert_eq!(pick.reason, PickReason::AffinityBound);
}

#[test]
fn configuration_reads_new_binding_and_checks_the_factor() {
    let read = |yaml: &str| serde_yaml_ng::from_str::<PolicyConfig>(yaml).map(|c| c.kind);
    match read("{type: session_aware, new_binding: rendezvous, rendezvous_load_factor: 2}") {
        Ok(PolicySettings::SessionAware(settings)) => {
            assert_eq!(settings.placement.new_binding, NewBinding::Rendezvous);
            assert_eq!(settings.placement.rendezvous_load_factor, 2.0);
        }
        other => panic!("unexpected {other:?}"),
    }
    match read("{type: sticky}") {
        Ok(PolicySettings::Sticky(settings)) => {
            assert_eq!(settings.placement.new_binding, NewBinding::Fallback);
            assert_eq!(settings.placement.rendezvous_load_factor, DEFAULT_RENDEZVOUS_LOAD_FACTOR);
        }
        other => panic!("unexpected {other:?}"),
    }
    let error = |yaml: &str| read(yaml).expect_err(yaml).to_string();
    assert!(
        error("{type: sticky, new_binding: rendezvous, rendezvous_load_factor: 0.5}").contains(
            "policy.rendezvous_load_factor: must be a finite number of at least 1, got 0.5"
        ),
    );
    assert!(
        error("{type: session_aware, rendezvous_load_factor: 2}")
            .contains("applies only when new_binding is rendezvous"),
    );
    assert!(
        error("{type: sticky, rendezvous_load_floor: 2}")
            .contains("policy.rendezvous_load_floor: applies only when new_binding is rendezvous"),
    );
    match read("{type: sticky, new_binding: rendezvous, rendezvous_load_floor: 0}") {
        Ok(PolicySettings::Sticky(settings)) => {
            assert_eq!(settings.placement.rendezvous_load_floor, 0);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(
        error("{type: power_of_two, new_binding: rendezvous}").contains(
            &ConfigError::NotApplicable {
                field: "policy.new_binding".to_owned(),
                policy: crate::PolicyType::PowerOfTwo,
            }
            .to_string()
        ),
    );
    assert!(error("{type: session_aware, new_binding: hashing}").contains("hashing"));
    // The replica-independent tie-break of the prefix-aware policies.
    match read("{type: cache_aware, tie_break: request}") {
        Ok(PolicySettings::CacheAware(s)) => assert_eq!(s.tie_break, crate::TieBreak::Request),
        other => panic!("unexpected {other:?}"),
    }
    match read("{type: predicted_ttft, tie_break: request}") {
        Ok(PolicySettings::PredictedTtft(s)) => assert_eq!(s.tie_break, crate::TieBreak::Request),
        other => panic!("unexpected {other:?}"),
    }
    assert!(error("{type: sticky, tie_break: request}").contains("does not apply"));
}

proptest! {
    #[test]
    fn independently_built_replicas_agree(
        n in 1usize..12,
        rotation in 0usize..12,
        keys in prop::collection::vec("[a-z0-9-]{1,24}", 1..40),
        sticky: bool,
    ) {
        let ids = names(n);
        let mut rotated = ids.clone();
        rotated.rotate_left(rotation % n);
        rotated.reverse();
        let yaml = if sticky {
            "{type: sticky, new_binding: rendezvous, fallback: random}"
        } else {
            "{type: session_aware, new_binding: rendezvous}"
        };
        let first = Replica::new(yaml, &ids);
        let second = Replica::new(yaml, &rotated);
        for key in &keys {
            let pick = |r: &Replica| {
                if sticky { r.pick(None, Some(key)) } else { r.pick(Some(key), None) }
            };
            prop_assert_eq!(pick(&first).expect("picked"), pick(&second).expect("picked"));
        }
    }

    #[test]
    fn removing_an_engine_moves_only_its_keys(
        n in 2usize..12,
        removed in 0usize..12,
        keys in prop::collection::vec("[a-z0-9-]{1,24}", 1..60),
        loads in prop::collection::vec(0u64..4, 12),
    ) {
        let model = ModelId::new("m");
        let all: Vec<Arc<Worker>> = names(n).iter().map(|name| worker(&model, name)).collect();
        let removed = removed % n;
        let rest: Vec<Arc<Worker>> =
            all.iter().enumerate().filter(|(i, _)| *i != removed).map(|(_, w)| w.clone()).collect();
        // Loads held equal across the change, and a factor large enough that no engine is at
        // the bound: placement is by weight alone, as between quiet replicas.
        let load: HashMap<WorkerId, u64> =
            all.iter().zip(&loads).map(|(w, l)| (w.id().clone(), *l)).collect();
        let inflight = |id: &WorkerId| load[id];
        let wide = RendezvousLoad { factor: 100.0, floor: 0 };
        for key in &keys {
            let before = rendezvous_choice(key, &all, wide, inflight, |_| true).expect("one");
            let after = rendezvous_choice(key, &rest, wide, inflight, |_| true).expect("one");
            if before != removed {
                prop_assert_eq!(all[before].id(), rest[after].id());
            }
        }
    }

    #[test]
    fn bounded_load_holds(
        n in 1usize..10,
        keys in prop::collection::hash_set("[a-z0-9]{1,16}", 1..200),
        factor in 1.0f64..3.0,
        floor in 0u64..6,
    ) {
        let bounds = RendezvousLoad { factor, floor };
        let model = ModelId::new("m");
        let engines: Vec<Arc<Worker>> = names(n).iter().map(|name| worker(&model, name)).collect();
        let mut load: HashMap<WorkerId, u64> = HashMap::new();
        let mut total = 0u64;
        for key in &keys {
            let bound = rendezvous_load_bound(total, n, bounds);
            let chosen = rendezvous_choice(
                key,
                &engines,
                bounds,
                |id| load.get(id).copied().unwrap_or(0),
                |_| true,
            )
            .expect("one");
            let count = load.entry(engines[chosen].id().clone()).or_default();
            // With a factor of at least 1 some engine is always under the bound.
            prop_assert!(*count < bound, "{count} at bound {bound}");
            *count += 1;
            total += 1;
            let max = load.values().copied().max().unwrap_or(0);
            let limit = (factor * total as f64 / n as f64).ceil() as u64;
            prop_assert!(max <= limit.max(floor).max(1), "max {max} over {limit}, floor {floor}");
        }
    }
}
