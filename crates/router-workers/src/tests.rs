//! The worker registry: id, kind and URL rules, lookups by model and stage, removal, the change
//! feed and incarnations, concurrent adds, and a proptest of the invariants under arbitrary
//! changes.

use std::sync::Arc;

use proptest::prelude::*;

use super::*;

fn model() -> ModelId {
    ModelId::new("llama")
}

fn worker(id: &str, stage: Stage) -> Worker {
    Worker::with_stage(id, &format!("http://127.0.0.1:9{}", id.len()), &model(), stage)
        .expect("valid worker")
}

#[test]
fn rejects_duplicate_ids() {
    let registry = WorkerRegistry::new();
    registry.add(worker("a", Stage::Plain)).expect("first add");
    let err = registry.add(worker("a", Stage::Plain)).expect_err("duplicate");
    assert!(matches!(err, WorkerError::Duplicate { ref id } if id.as_str() == "a"), "{err}");
    assert_eq!(registry.workers().len(), 1);
}

#[test]
fn rejects_plain_worker_in_pd_model_and_pd_worker_in_plain_model() {
    let registry = WorkerRegistry::new();
    registry.add(worker("p", Stage::Prefill)).expect("prefill");
    let err = registry.add(worker("x", Stage::Plain)).expect_err("mixed");
    assert!(matches!(err, WorkerError::MixedModel { .. }), "{err}");
    registry.add(worker("d", Stage::Decode)).expect("decode joins a PD model");

    let plain = WorkerRegistry::new();
    plain.add(worker("a", Stage::Plain)).expect("plain");
    for stage in [Stage::Prefill, Stage::Decode] {
        let err = plain.add(worker("b", stage)).expect_err("mixed");
        assert!(matches!(err, WorkerError::MixedModel { .. }), "{err}");
    }
}

#[test]
fn models_do_not_constrain_each_other() {
    let registry = WorkerRegistry::new();
    registry.add(worker("a", Stage::Plain)).expect("plain llama");
    let other = Worker::with_stage("b", "http://h:1", &ModelId::new("qwen"), Stage::Prefill)
        .expect("valid");
    registry.add(other).expect("PD engine of another model");
}

#[test]
fn replace_may_change_kind_only_when_it_is_the_last_of_its_kind() {
    let registry = WorkerRegistry::new();
    registry.add(worker("a", Stage::Plain)).expect("plain");
    registry.replace(worker("a", Stage::Prefill)).expect("sole engine may change kind");
    registry.add(worker("b", Stage::Decode)).expect("decode");
    let err = registry.replace(worker("b", Stage::Plain)).expect_err("would mix");
    assert!(matches!(err, WorkerError::MixedModel { .. }), "{err}");
    let err = registry.replace(worker("zz", Stage::Decode)).expect_err("unknown");
    assert!(matches!(err, WorkerError::NotFound { .. }), "{err}");
}

#[test]
fn rejects_urls_that_are_not_http_or_carry_credentials() {
    let spec = |url: &str| WorkerSpec::new("w", url, Stage::Plain);
    for url in ["ftp://h:1", "file:///etc/passwd", "h:1", "http://", "unix:/tmp/s"] {
        let err = Worker::from_spec(&spec(url), vec![model()]).expect_err(url);
        assert!(matches!(err, WorkerError::BadUrl { .. }), "{url}: {err}");
    }
    for url in ["http://user:pw@h:1", "https://token@h"] {
        let err = Worker::from_spec(&spec(url), vec![model()]).expect_err(url);
        assert!(err.to_string().contains("credentials"), "{err}");
        assert!(!err.to_string().contains("pw"), "credentials leak into {err}");
    }
    let ok = Worker::from_spec(&spec("https://engine.local:8443/"), vec![model()]).expect("ok");
    assert_eq!(ok.url(), "https://engine.local:8443");
}

#[test]
fn rejects_bad_worker_settings() {
    let mut spec: WorkerSpec =
        serde_json::from_str(r#"{"id": "w", "url": "http://h:1", "dp_size": 0}"#).expect("json");
    assert!(matches!(Worker::from_spec(&spec, vec![model()]), Err(WorkerError::ZeroDpSize { .. })));
    spec.dp_size = 1;
    spec.bootstrap_port = Some(8998);
    assert!(matches!(
        Worker::from_spec(&spec, vec![model()]),
        Err(WorkerError::BootstrapPortOnNonPrefill { .. })
    ));
    spec.bootstrap_port = None;
    assert!(matches!(Worker::from_spec(&spec, vec![]), Err(WorkerError::NoModel { .. })));
    spec.kv_events = Some(KvEventsSpec::new("10.0.0.1:5557"));
    assert!(matches!(
        Worker::from_spec(&spec, vec![model()]),
        Err(WorkerError::BadKvEndpoint { .. })
    ));
    assert_eq!(WorkerId::new("  "), Err(WorkerError::EmptyId));
}

#[test]
fn block_size_comes_from_the_worker_or_its_kv_events() {
    // (worker entry, block size or the error it names)
    for (json, expect) in [
        (r#"{"id": "w", "url": "http://h:1"}"#, Ok(None)),
        (r#"{"id": "w", "url": "http://h:1", "block_size": 32}"#, Ok(Some(32))),
        (
            r#"{"id": "w", "url": "http://h:1", "kv_events": {"endpoint": "tcp://h:5557"}}"#,
            Ok(Some(DEFAULT_BLOCK_SIZE)),
        ),
        (
            r#"{"id": "w", "url": "http://h:1", "kv_events": {"endpoint": "tcp://h:5557", "block_size": 64}}"#,
            Ok(Some(64)),
        ),
        (
            r#"{"id": "w", "url": "http://h:1", "block_size": 64, "kv_events": {"endpoint": "tcp://h:5557"}}"#,
            Ok(Some(64)),
        ),
        (
            r#"{"id": "w", "url": "http://h:1", "block_size": 32, "kv_events": {"endpoint": "tcp://h:5557", "block_size": 64}}"#,
            Err("block_size 32 differs from kv_events.block_size 64"),
        ),
        (
            r#"{"id": "w", "url": "http://h:1", "block_size": 0}"#,
            Err("block_size must be at least 1"),
        ),
        (
            r#"{"id": "w", "url": "http://h:1", "kv_events": {"endpoint": "tcp://h:5557", "block_size": 0}}"#,
            Err("block_size must be at least 1"),
        ),
    ] {
        let spec: WorkerSpec = serde_json::from_str(json).expect(json);
        let got = Worker::from_spec(&spec, vec![model()]).map(|w| w.block_size());
        match (got, expect) {
            (Ok(size), Ok(want)) => assert_eq!(size, want, "{json}"),
            (Err(err), Err(want)) => assert!(err.to_string().contains(want), "{json}: {err}"),
            (got, want) => panic!("{json}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn the_constructors_read_like_an_entry_naming_only_their_arguments() {
    let entry = r#"{"id": "w", "url": "http://h", "role": "decode",
        "kv_events": {"endpoint": "tcp://h:5557", "block_size": 32}}"#;
    let read: WorkerSpec = serde_json::from_str(entry).expect("entry");
    let built = WorkerSpec {
        kv_events: Some(KvEventsSpec { block_size: Some(32), ..KvEventsSpec::new("tcp://h:5557") }),
        ..WorkerSpec::new("w", "http://h", Stage::Decode)
    };
    assert_eq!(read, built);
}

#[test]
fn load_poll_reads_its_format_defaulting_to_sglang() {
    let cases: [(&str, Result<LoadPollSpec, &str>); 7] = [
        (r#"{}"#, Ok(LoadPollSpec::new(500, LoadPollFormat::Sglang))),
        (r#"{"interval_ms": 250}"#, Ok(LoadPollSpec::new(250, LoadPollFormat::Sglang))),
        (r#"{"format": "sglang"}"#, Ok(LoadPollSpec::new(500, LoadPollFormat::Sglang))),
        (
            r#"{"format": "vllm_metrics", "interval_ms": 100}"#,
            Ok(LoadPollSpec::new(100, LoadPollFormat::VllmMetrics)),
        ),
        (r#"{"format": "vllm"}"#, Err("unknown variant `vllm`")),
        (r#"{"format": "VllmMetrics"}"#, Err("unknown variant `VllmMetrics`")),
        (r#"{"interval": 100}"#, Err("unknown field `interval`")),
    ];
    for (load_poll, expect) in cases {
        let json = format!(r#"{{"id": "w", "url": "http://h:1", "load_poll": {load_poll}}}"#);
        let got = serde_json::from_str::<WorkerSpec>(&json).map(|spec| spec.load_poll);
        match (got, expect) {
            (Ok(got), Ok(want)) => assert_eq!(got, Some(want), "{load_poll}"),
            (Err(err), Err(want)) => assert!(err.to_string().contains(want), "{load_poll}: {err}"),
            (got, want) => panic!("{load_poll}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn load_poll_format_round_trips_and_reaches_the_worker() {
    for format in [LoadPollFormat::Sglang, LoadPollFormat::VllmMetrics] {
        let spec = WorkerSpec {
            load_poll: Some(LoadPollSpec::new(50, format)),
            ..WorkerSpec::new("w", "http://h:1", Stage::Plain)
        };
        let json = serde_json::to_string(&spec).expect("serialize");
        assert!(json.contains(&format!(r#""format":"{format}""#)), "{json}");
        let read: WorkerSpec = serde_json::from_str(&json).expect("read back");
        assert_eq!(read, spec);
        let worker = Worker::from_spec(&spec, vec![model()]).expect("worker");
        assert_eq!(worker.load_poll().map(|p| p.format), Some(format));
    }
}

#[test]
fn spec_rejects_unknown_fields() {
    let err = serde_json::from_str::<WorkerSpec>(r#"{"id": "w", "url": "http://h", "colour": 1}"#)
        .expect_err("unknown field");
    assert!(err.to_string().contains("colour"), "{err}");
}

#[test]
fn lookup_returns_healthy_workers_of_model_and_stage_sorted() {
    let registry = WorkerRegistry::new();
    for id in ["p2", "p1", "p3"] {
        registry.add(worker(id, Stage::Prefill)).expect("add");
    }
    registry.add(worker("d1", Stage::Decode)).expect("add");
    registry.set_health(&WorkerId::new("p2").expect("id"), false).expect("known");
    let ids: Vec<_> =
        registry.healthy(&model(), Stage::Prefill).iter().map(|w| w.id().to_string()).collect();
    assert_eq!(ids, ["p1", "p3"]);
    assert_eq!(registry.workers_for(&model(), Stage::Prefill).len(), 3);
    assert_eq!(registry.healthy(&model(), Stage::Decode).len(), 1);
    assert!(registry.healthy(&model(), Stage::Plain).is_empty());
    assert!(registry.healthy(&ModelId::new("other"), Stage::Prefill).is_empty());
    assert_eq!(registry.model_kind(&model()), Some(ModelKind::Pd));
}

#[test]
fn removal_drops_the_worker_from_lookups() {
    let registry = WorkerRegistry::new();
    registry.add(worker("a", Stage::Plain)).expect("add");
    let id = WorkerId::new("a").expect("id");
    registry.remove(&id).expect("remove");
    assert!(registry.get(&id).is_none());
    assert!(registry.healthy(&model(), Stage::Plain).is_empty());
    assert_eq!(registry.model_kind(&model()), None);
    assert!(matches!(registry.remove(&id), Err(WorkerError::NotFound { .. })));
}

#[test]
fn change_feed_reports_every_change_in_order() {
    let registry = WorkerRegistry::new();
    registry.add(worker("a", Stage::Plain)).expect("add");
    let (initial, mut feed) = registry.follow();
    assert_eq!(initial.len(), 1);
    let id = WorkerId::new("a").expect("id");
    registry.add(worker("b", Stage::Plain)).expect("add");
    registry.set_health(&id, false).expect("known");
    registry.set_health(&id, false).expect("no change, no event");
    let replaced = registry.replace(worker("a", Stage::Plain)).expect("replace");
    registry.remove(&id).expect("remove");

    let mut seen = Vec::new();
    while let Ok(event) = feed.try_recv() {
        seen.push(match event {
            RegistryEvent::Added(w) => format!("+{}", w.id()),
            RegistryEvent::Removed(w) => format!("-{}", w.id()),
            RegistryEvent::HealthChanged { worker, healthy } => {
                format!("{}={healthy}", worker.id())
            }
            RegistryEvent::DrainChanged { worker, drained } => {
                format!("{} drained={drained}", worker.id())
            }
            RegistryEvent::StatusReported { worker, status } => {
                format!("{} says {status}", worker.id())
            }
        });
    }
    assert_eq!(seen, ["+b", "a=false", "-a", "+a", "-a"]);
    assert!(replaced.is_healthy(), "a replacement starts healthy");
}

#[test]
fn a_worker_accepts_new_requests_only_when_healthy_undrained_and_not_starting_or_draining() {
    use EngineStatus::{Draining, Serving, Starting, Unknown};
    // (healthy, drained by the operator, reported status, accepts new requests)
    #[rustfmt::skip]
    let cases = [
        (true, false, Unknown, true),
        (true, false, Serving, true),
        (true, false, Starting, false),
        (true, false, Draining, false),
        (true, true, Serving, false),
        (true, true, Unknown, false),
        (false, false, Serving, false),
        (false, true, Draining, false),
    ];
    for (healthy, drained, status, accepts) in cases {
        let registry = WorkerRegistry::new();
        let a = registry.add(worker("a", Stage::Plain)).expect("add");
        registry.add(worker("b", Stage::Plain)).expect("add");
        registry.set_health(a.id(), healthy).expect("known");
        registry.set_drained(a.id(), drained).expect("known");
        registry.set_reported_status(&a, status);
        let case = format!("healthy {healthy}, drained {drained}, {status}");
        assert_eq!(a.accepts_new_requests(), accepts, "{case}");
        let ids: Vec<String> =
            registry.accepting(&model(), Stage::Plain).iter().map(|w| w.id().to_string()).collect();
        assert_eq!(ids, if accepts { vec!["a", "b"] } else { vec!["b"] }, "{case}");
        assert_eq!(registry.healthy(&model(), Stage::Plain).len(), if healthy { 2 } else { 1 });
    }
}

#[test]
fn drain_and_reported_status_are_changes_the_feed_hears_once() {
    let registry = WorkerRegistry::new();
    let a = registry.add(worker("a", Stage::Plain)).expect("add");
    let (_, mut feed) = registry.follow();
    let (same, changed) = registry.set_drained(a.id(), true).expect("known");
    assert!(Arc::ptr_eq(&same, &a) && changed);
    assert!(!registry.set_drained(a.id(), true).expect("known").1, "draining twice is no change");
    assert!(registry.set_reported_status(&a, EngineStatus::Draining));
    assert!(!registry.set_reported_status(&a, EngineStatus::Draining), "no change");
    assert!(registry.set_drained(a.id(), false).expect("known").1);
    let unknown = WorkerId::new("zz").expect("id");
    assert!(matches!(registry.set_drained(&unknown, true), Err(WorkerError::NotFound { .. })));

    let mut seen = Vec::new();
    while let Ok(event) = feed.try_recv() {
        seen.push(match event {
            RegistryEvent::DrainChanged { drained, .. } => format!("drained={drained}"),
            RegistryEvent::StatusReported { status, .. } => format!("says {status}"),
            other => panic!("unexpected {other:?}"),
        });
    }
    assert_eq!(seen, ["drained=true", "says draining", "drained=false"]);
    assert!(!a.is_drained() && a.reported_status() == EngineStatus::Draining);
}

#[test]
fn a_replaced_engine_keeps_its_drain_but_not_its_reported_status_or_late_reports() {
    let registry = WorkerRegistry::new();
    let old = registry.add(worker("a", Stage::Plain)).expect("add");
    registry.set_drained(old.id(), true).expect("known");
    registry.set_reported_status(&old, EngineStatus::Starting);
    let new = registry.replace(worker("a", Stage::Plain)).expect("replace");
    assert!(new.is_drained(), "the operator's drain is about the id");
    assert_eq!(new.reported_status(), EngineStatus::Unknown, "a new engine has said nothing");
    assert!(!registry.set_reported_status(&old, EngineStatus::Serving), "a late report");
    assert_eq!(new.reported_status(), EngineStatus::Unknown);
    registry.remove(new.id()).expect("remove");
    let again = registry.add(worker("a", Stage::Plain)).expect("add");
    assert!(!again.is_drained(), "a removed worker's drain is forgotten");
}

#[test]
fn labels_are_read_from_the_entry_and_names_must_not_be_empty() {
    let entry = r#"{"id": "w", "url": "http://h:1", "labels": {"rack": "r1", "tp": "8"}}"#;
    let spec: WorkerSpec = serde_json::from_str(entry).expect("entry");
    let worker = Worker::from_spec(&spec, vec![model()]).expect("valid");
    assert_eq!(
        (worker.label("rack"), worker.label("tp"), worker.label("zone")),
        (Some("r1"), Some("8"), None)
    );
    assert_eq!(worker.labels().len(), 2);
    let listed = serde_json::to_value(&spec).expect("ser");
    assert_eq!(listed["labels"], serde_json::json!({"rack": "r1", "tp": "8"}));
    let bare = serde_json::to_value(WorkerSpec::new("w", "http://h:1", Stage::Plain)).expect("ser");
    assert!(bare.get("labels").is_none(), "no labels, no field: {bare}");

    let unnamed: WorkerSpec =
        serde_json::from_str(r#"{"id": "w", "url": "http://h:1", "labels": {" ": "x"}}"#)
            .expect("parses");
    let err = Worker::from_spec(&unnamed, vec![model()]).expect_err("empty name");
    assert_eq!(err, WorkerError::EmptyLabelName { id: WorkerId::new("w").expect("id") });
    let err = serde_json::from_str::<WorkerSpec>(
        r#"{"id": "w", "url": "http://h:1", "labels": {"tp": 8}}"#,
    )
    .expect_err("a number");
    assert!(err.to_string().contains("expected a string"), "{err}");
}

#[test]
fn replacement_is_a_new_incarnation() {
    let registry = WorkerRegistry::new();
    let old = registry.add(worker("a", Stage::Plain)).expect("add");
    let new = registry.replace(worker("a", Stage::Plain)).expect("replace");
    assert_ne!(old.incarnation(), new.incarnation());
    let current = registry.get(old.id()).expect("present");
    assert!(Arc::ptr_eq(&current, &new));
}

#[test]
fn host_is_extracted_for_bootstrap() {
    let m = model();
    let w = Worker::plain("a", "http://10.0.0.1:30000/", &m).expect("ok");
    assert_eq!(w.host(), "10.0.0.1");
    let w = Worker::plain("b", "http://[::1]:30000", &m).expect("ok");
    assert_eq!(w.host(), "::1");
    let w = Worker::plain("c", "https://engine.local", &m).expect("ok");
    assert_eq!(w.host(), "engine.local");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_adds_of_one_id_admit_exactly_one() {
    let registry = Arc::new(WorkerRegistry::new());
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let registry = Arc::clone(&registry);
            tokio::spawn(async move { registry.add(worker("same", Stage::Plain)).is_ok() })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += usize::from(task.await.expect("task"));
    }
    assert_eq!(admitted, 1);
}

#[derive(Debug, Clone)]
enum Op {
    Add(u8, Stage),
    Replace(u8, Stage),
    Remove(u8),
    Health(u8, bool),
}

fn op() -> impl Strategy<Value = Op> {
    let stage = prop_oneof![Just(Stage::Plain), Just(Stage::Prefill), Just(Stage::Decode)];
    prop_oneof![
        (0u8..6, stage.clone()).prop_map(|(i, s)| Op::Add(i, s)),
        (0u8..6, stage).prop_map(|(i, s)| Op::Replace(i, s)),
        (0u8..6).prop_map(Op::Remove),
        (0u8..6, any::<bool>()).prop_map(|(i, h)| Op::Health(i, h)),
    ]
}

proptest! {
    /// Whatever sequence of changes is attempted, the registry never holds a mixed model,
    /// its indexes agree with each other, and the feed replays to the same membership.
    #[test]
    fn invariants_hold_under_arbitrary_changes(ops in prop::collection::vec(op(), 0..60)) {
        let registry = WorkerRegistry::new();
        let (_, mut feed) = registry.follow();
        for op in ops {
            let name = |i: u8| format!("w{i}");
            let _ = match op {
                Op::Add(i, s) => registry.add(worker(&name(i), s)).map(|_| ()),
                Op::Replace(i, s) => registry.replace(worker(&name(i), s)).map(|_| ()),
                Op::Remove(i) => registry.remove(&WorkerId::new(name(i)).expect("id")).map(|_| ()),
                Op::Health(i, h) => {
                    registry.set_health(&WorkerId::new(name(i)).expect("id"), h).map(|_| ())
                }
            };
        }
        let all = registry.workers();
        let kinds: std::collections::HashSet<_> = all.iter().map(|w| w.stage().is_pd()).collect();
        prop_assert!(kinds.len() <= 1, "mixed model");
        let indexed: usize = [Stage::Plain, Stage::Prefill, Stage::Decode]
            .into_iter()
            .map(|s| registry.workers_for(&model(), s).len())
            .sum();
        prop_assert_eq!(indexed, all.len());
        let mut replayed = std::collections::BTreeSet::new();
        while let Ok(event) = feed.try_recv() {
            match event {
                RegistryEvent::Added(w) => prop_assert!(replayed.insert(w.id().to_string())),
                RegistryEvent::Removed(w) => prop_assert!(replayed.remove(w.id().as_str())),
                RegistryEvent::HealthChanged { .. }
                | RegistryEvent::DrainChanged { .. }
                | RegistryEvent::StatusReported { .. } => {}
            }
        }
        let current: std::collections::BTreeSet<_> =
            all.iter().map(|w| w.id().to_string()).collect();
        prop_assert_eq!(replayed, current);
    }
}

#[test]
fn a_worker_comes_from_the_configuration_unless_told_otherwise() {
    let model = ModelId::new("m");
    let worker = Worker::plain("w", "http://127.0.0.1:1", &model).expect("worker");
    assert_eq!(worker.origin(), &WorkerOrigin::Config);
    let incarnation = worker.incarnation();
    let pod = DiscoveredPod { namespace: "ns".into(), pod: "w".into(), uid: "u-1".into() };
    let worker = worker.with_origin(WorkerOrigin::Discovery(pod.clone()));
    assert_eq!(worker.origin().pod(), Some(&pod));
    assert_eq!(worker.incarnation(), incarnation, "the same worker, only its origin said");
    let shown = serde_json::to_value(worker.origin()).expect("serializes");
    assert_eq!(
        shown,
        serde_json::json!({"source": "discovery", "namespace": "ns", "pod": "w", "uid": "u-1"})
    );
    assert_eq!(
        serde_json::to_value(WorkerOrigin::Admin).expect("serializes"),
        serde_json::json!({"source": "admin"})
    );
}

#[test]
fn a_request_uri_is_the_base_url_followed_by_the_path() {
    // (worker url, path, the URI a request to it goes to)
    let cases = [
        (
            "http://127.0.0.1:30000",
            "/v1/chat/completions",
            "http://127.0.0.1:30000/v1/chat/completions",
        ),
        ("https://engine.local:8443/", "/generate", "https://engine.local:8443/generate"),
        ("http://[::1]:8000", "/health", "http://[::1]:8000/health"),
        ("http://gw.local/prefix/", "/v1/models", "http://gw.local/prefix/v1/models"),
        ("http://h:1", "/get_load?include=all", "http://h:1/get_load?include=all"),
    ];
    for (url, path, expected) in cases {
        let worker = Worker::plain("w", url, &model()).expect(url);
        let uri = worker.uri_for(path).expect(path);
        assert_eq!(uri.to_string(), expected, "{url} + {path}");
        assert_eq!(uri, format!("{}{path}", worker.url()).parse::<http::Uri>().expect("parses"));
        let host = worker.host_header().map(|host| host.to_str().expect("ascii").to_owned());
        let authority = uri.authority().expect("absolute").as_str().to_owned();
        assert_eq!(host, (!url.contains("/prefix")).then_some(authority), "{url}: Host");
    }
    let worker = Worker::plain("w", "http://h:1", &model()).expect("ok");
    assert!(worker.uri_for("/with space").is_err(), "a path that is no URI path is an error");
}

#[test]
fn a_model_is_found_by_the_name_a_client_sent() {
    let models: std::collections::HashMap<ModelId, u8> =
        [(ModelId::new("llama"), 1), (ModelId::new("qwen"), 2)].into_iter().collect();
    assert_eq!(models.get("llama"), Some(&1));
    assert_eq!(models.get("qwen"), Some(&2));
    assert_eq!(models.get("Llama"), None, "names are compared exactly");
}
