//! Policy tests over a real load table: fixtures, table-driven cases, properties, and the
//! rules that need a closer look (admission counts, construction).

mod cases;
pub(crate) mod doubles;
pub(crate) mod fixtures;
mod props;

use std::sync::Arc;

use router_state_load::ReportKind;
use router_workers::Stage;

use doubles::{Recording, running_cap};
use fixtures::{Fleet, Load, basic, engine, native};

use crate::{
    ConfigError, EngineObservation, LeastLoadPolicy, PickError, PickReason, PolicyConfig,
    PolicySettings, PolicyType, PowerOfTwoPolicy, StickyFallback,
};

#[test]
fn metrics_come_only_from_a_usable_report() {
    let fleet = Fleet::new(
        Stage::Prefill,
        &[
            engine("missing", Load::Missing).inflight(2),
            engine("basic", basic(3, 4)).inflight(1),
            engine("native", native(3, 4, 5, 6)),
        ],
    );
    let snapshot = fleet.table.snapshot();
    let get = |i: usize| snapshot.get(fleet.workers[i].id());

    let missing = EngineObservation::observe(get(0), 2);
    assert_eq!(missing, EngineObservation { inflight_requests: 2, ..EngineObservation::default() });

    let basic = EngineObservation::observe(get(1), 1);
    assert_eq!(get(1).map(|l| l.kind), Some(ReportKind::Basic));
    assert_eq!(
        basic,
        EngineObservation {
            running_requests: Some(3),
            waiting_requests: Some(4),
            kv_tokens: None,
            pending_prefill_tokens: None,
            inflight_requests: 1,
        }
    );

    // The fixture reports total KV tokens as used + uncached.
    let native = EngineObservation::observe(get(2), 0);
    assert_eq!(
        native,
        EngineObservation {
            running_requests: Some(3),
            waiting_requests: Some(4),
            kv_tokens: Some(11),
            pending_prefill_tokens: Some(5),
            inflight_requests: 0,
        }
    );
}

#[test]
fn power_of_two_admits_exactly_once_on_the_observation_it_chose() {
    let fleet = Fleet::new(
        Stage::Plain,
        &[engine("a", native(4, 0, 10, 0)).inflight(1), engine("b", native(0, 0, 90, 0))],
    );
    let admission = Recording::new(running_cap(5));
    let check = crate::AdmissionCheck::new(admission.clone(), fleet.load());
    let policy = PowerOfTwoPolicy::new(fleet.load()).with_admission(check);
    for round in 1..=10 {
        let pick = fleet.pick(&policy, 1).expect("admitted");
        assert_eq!(pick.worker.id().as_str(), "a");
        assert_eq!(admission.calls(), round);
    }
    let (id, metrics) = admission.seen.lock()[0].clone();
    assert_eq!(id.as_str(), "a");
    assert_eq!(metrics.running_requests, Some(4));
    assert_eq!(metrics.inflight_requests, 1);

    // Rejection: still one call, and no second engine tried.
    let strict = Recording::new(running_cap(4));
    let check = crate::AdmissionCheck::new(strict.clone(), fleet.load());
    let policy = PowerOfTwoPolicy::new(fleet.load()).with_admission(check);
    let err = fleet.pick(&policy, 1).expect_err("a is at its cap");
    assert!(matches!(err, PickError::AdmissionRejected(ref r) if r.worker.as_str() == "a"));
    assert!(err.advances_bucket());
    assert_eq!(strict.calls(), 1);

    // No candidates: admission is not invoked.
    let err = fleet.pick_from(&policy, &[], 1).expect_err("empty");
    assert!(matches!(err, PickError::NoCandidates { stage: Stage::Plain }));
    assert_eq!(strict.calls(), 1);
}

#[test]
fn least_load_checks_in_load_order_and_stops_at_the_first_admitted() {
    let fleet = Fleet::new(
        Stage::Decode,
        &[
            engine("a", native(9, 2, 0, 0)),
            engine("b", native(9, 0, 0, 0)),
            engine("c", native(0, 3, 0, 0)),
            engine("d", native(0, 4, 0, 0)),
        ],
    );
    let admission = Recording::new(running_cap(5));
    let check = crate::AdmissionCheck::new(admission.clone(), fleet.load());
    let policy = LeastLoadPolicy::new(fleet.load()).with_admission(check);
    let pick = fleet.pick(&policy, 1).expect("c is admitted");
    assert_eq!(pick.worker.id().as_str(), "c");
    assert_eq!(admission.order(), ["b", "a", "c"]);
}

#[test]
fn construction_covers_the_load_policies_and_cache_aware() {
    let fleet = Fleet::new(Stage::Plain, &[engine("a", Load::Missing)]);
    let handles = fleet.handles();
    for (kind, name) in [
        (PolicySettings::RoundRobin, "round_robin"),
        (PolicySettings::Random, "random"),
        (PolicySettings::PowerOfTwo, "power_of_two"),
        (PolicySettings::LoadBased, "load_based"),
    ] {
        let policy = PolicyConfig::new(kind).build(&handles).expect(name);
        assert_eq!(policy.name(), name);
        for stage in [Stage::Plain, Stage::Prefill, Stage::Decode] {
            assert!(policy.supports_stage(stage));
        }
        let pick = fleet.pick(policy.as_ref(), 1).expect(name);
        assert_eq!(pick.reason, PickReason::OnlyCandidate);
    }
    // Cache-aware with the local provider needs the application's KV index.
    let config: PolicyConfig = serde_yaml_ng::from_str("type: cache_aware").expect("valid");
    let err = config.build(&handles).map(|_| ()).expect_err("no local index");
    assert!(
        matches!(err, ConfigError::MissingState { policy: PolicyType::CacheAware, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("needs a local KV index"), "{err}");
    let handles = handles.with_kv(Arc::new(router_state_kv::KvIndex::default()));
    let policy = config.build(&handles).expect("built over the local index");
    assert_eq!(policy.name(), "cache_aware");
    assert!(policy.supports_stage(Stage::Plain) && policy.supports_stage(Stage::Prefill));
    assert!(!policy.supports_stage(Stage::Decode));
}

#[test]
fn configured_admission_is_attached() {
    let fleet = Fleet::new(Stage::Plain, &[engine("a", native(9, 0, 0, 0))]);
    for kind in [
        PolicySettings::RoundRobin,
        PolicySettings::Random,
        PolicySettings::PowerOfTwo,
        PolicySettings::LoadBased,
    ] {
        let unlimited = PolicyConfig::new(kind.clone()).build(&fleet.handles()).expect("valid");
        assert!(fleet.pick(unlimited.as_ref(), 1).is_ok());
        let capped = PolicyConfig { kind, admission: running_cap(9) };
        let policy = capped.build(&fleet.handles()).expect("valid");
        let err = fleet.pick(policy.as_ref(), 1).expect_err("at the cap");
        assert_eq!(err.rejections().len(), 1, "{}", policy.name());
        assert_eq!(err.rejections()[0].worker.as_str(), "a");
    }
}

#[test]
fn sticky_fallbacks_are_built_without_admission() {
    let fleet = Fleet::new(
        Stage::Plain,
        &[engine("a", native(9, 0, 0, 0)), engine("b", native(9, 0, 0, 0))],
    );
    for fallback in [
        StickyFallback::RoundRobin,
        StickyFallback::Random,
        StickyFallback::PowerOfTwo,
        StickyFallback::LoadBased,
    ] {
        let policy = fallback.build(&fleet.handles());
        let request_stage = fleet.stage;
        let pick = fleet.pick(policy.as_ref(), 1).expect("no admission in a fallback");
        assert!(fleet.workers.iter().any(|w| Arc::ptr_eq(w, &pick.worker)), "{request_stage}");
    }
}
