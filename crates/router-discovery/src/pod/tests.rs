//! The pod → worker mapping, table-driven: each row a pod (built as the API server would
//! return it), its role and the router's settings, and the verdict written out.

use k8s_openapi::api::core::v1::Pod;
use router_test_support::fake_kube::{PodBuilder, pod};
use router_workers::{ModelId, Stage};

use super::*;
use crate::config::KvEventsTemplate;

/// The pod object with the namespace and uid the API server would give it.
fn object(builder: PodBuilder) -> Pod {
    let mut value = builder.build();
    value["metadata"]["namespace"] = "inference".into();
    if value["metadata"]["uid"].is_null() {
        value["metadata"]["uid"] = "uid-1".into();
    }
    serde_json::from_value(value).expect("a pod object")
}

/// The verdict in one line.
fn summary(verdict: &PodVerdict) -> String {
    match verdict {
        PodVerdict::Waiting(reason) => format!("waiting: {}", reason.as_str()),
        PodVerdict::Invalid(problem) => format!("invalid: {problem}"),
        PodVerdict::Serving(worker) => {
            let spec = &worker.spec;
            let mut line = format!("{} {} {} {}", spec.id, spec.role, worker.model, spec.url);
            if let Some(port) = spec.bootstrap_port {
                line.push_str(&format!(" bootstrap={port}"));
            }
            if let Some(kv) = &spec.kv_events {
                line.push_str(&format!(" kv={}", kv.endpoint));
                if let Some(replay) = &kv.replay_endpoint {
                    line.push_str(&format!(" replay={replay}"));
                }
            }
            if let Some(load) = &spec.load_reporter {
                line.push_str(&format!(" load={load}"));
            }
            line
        }
    }
}

fn named(name: &str) -> PodPort {
    PodPort::Name(name.to_owned())
}

#[test]
fn a_pod_is_a_worker_while_ready_not_terminating_and_with_an_ip() {
    let engine = || pod("e1").label("app", "engine").port("http", 8000);
    let plain = WorkerTemplate::new(named("http"));
    let endpoints = WorkerTemplate {
        kv_events: Some(KvEventsTemplate {
            port: named("kv"),
            replay_port: Some(PodPort::Number(5600)),
            topic: String::new(),
            block_size: None,
        }),
        load_reporter_port: Some(named("load")),
        ..WorkerTemplate::new(PodPort::Number(30000))
    };
    let fixed = ModelSource::Fixed(ModelId::new("m"));
    let by_label = ModelSource::Label {
        key: "router/model".into(),
        served: vec![ModelId::new("m"), ModelId::new("n")],
    };
    #[rustfmt::skip]
    let cases: Vec<(&str, PodBuilder, Stage, &WorkerTemplate, &ModelSource, &str)> = vec![
        ("ready, named port", engine(), Stage::Plain, &plain, &fixed,
            "e1 plain m http://127.0.0.1:8000"),
        ("not ready", engine().ready(false), Stage::Plain, &plain, &fixed,
            "waiting: not ready"),
        ("terminating, though still ready", engine().terminating(), Stage::Plain, &plain, &fixed,
            "waiting: terminating"),
        ("no IP yet", engine().ip(None), Stage::Plain, &plain, &fixed,
            "waiting: no pod IP"),
        ("not ready and without the port: waiting, not a problem yet",
            pod("e1").ready(false), Stage::Plain, &plain, &fixed, "waiting: not ready"),
        ("no container port of that name", pod("e1"), Stage::Plain, &plain, &fixed,
            "invalid: no container port named \"http\" (the engine's HTTP port)"),
        ("an IPv6 pod", engine().ip(Some("fd00::7")), Stage::Plain, &plain, &fixed,
            "e1 plain m http://[fd00::7]:8000"),
        ("an IP that is not one", engine().ip(Some("10.0.0")), Stage::Plain, &plain, &fixed,
            "invalid: pod IP \"10.0.0\" is not an IP address"),
        ("prefill with its bootstrap port",
            engine().annotation("sglang.ai/bootstrap-port", "8998"), Stage::Prefill, &plain, &fixed,
            "e1 prefill m http://127.0.0.1:8000 bootstrap=8998"),
        ("prefill without the annotation: the engine's default", engine(), Stage::Prefill,
            &plain, &fixed, "e1 prefill m http://127.0.0.1:8000"),
        ("a malformed bootstrap port",
            engine().annotation("sglang.ai/bootstrap-port", "eighty"), Stage::Prefill, &plain,
            &fixed, "invalid: annotation sglang.ai/bootstrap-port=\"eighty\": must be a port number from 1 to 65535"),
        ("bootstrap port 0", engine().annotation("sglang.ai/bootstrap-port", "0"),
            Stage::Prefill, &plain, &fixed,
            "invalid: annotation sglang.ai/bootstrap-port=\"0\": must be a port number from 1 to 65535"),
        ("a decode pod's bootstrap annotation is not its business",
            engine().annotation("sglang.ai/bootstrap-port", "eighty"), Stage::Decode, &plain,
            &fixed, "e1 decode m http://127.0.0.1:8000"),
        ("KV events and load reporter on the pod IP",
            pod("e1").port("kv", 5557).port("load", 50051), Stage::Plain, &endpoints, &fixed,
            "e1 plain m http://127.0.0.1:30000 kv=tcp://127.0.0.1:5557 replay=tcp://127.0.0.1:5600 load=127.0.0.1:50051"),
        ("no KV-event port", pod("e1").port("load", 50051), Stage::Plain, &endpoints, &fixed,
            "invalid: no container port named \"kv\" (KV events)"),
        ("the model from its label", engine().label("router/model", "n"), Stage::Plain, &plain,
            &by_label, "e1 plain n http://127.0.0.1:8000"),
        ("no model label", engine(), Stage::Plain, &plain, &by_label,
            "invalid: no label router/model naming its model"),
        ("a model not served", engine().label("router/model", "x"), Stage::Plain, &plain,
            &by_label, "invalid: label router/model=\"x\" names a model this router does not serve (m, n)"),
    ];
    for (name, builder, stage, template, models, expected) in cases {
        let verdict = judge(&object(builder), stage, "inference", template, models);
        assert_eq!(summary(&verdict), expected, "{name}");
    }
}

#[test]
fn a_serving_pod_names_itself_and_carries_the_engine_settings() {
    let template = WorkerTemplate {
        https: true,
        dp_size: 2,
        block_size: Some(32),
        ..WorkerTemplate::new(PodPort::Number(8443))
    };
    let verdict = judge(
        &object(pod("e1").uid("u-42")),
        Stage::Decode,
        "inference",
        &template,
        &ModelSource::Fixed(ModelId::new("m")),
    );
    let PodVerdict::Serving(worker) = verdict else { panic!("serving: {verdict:?}") };
    assert_eq!(worker.spec.url, "https://127.0.0.1:8443");
    assert_eq!((worker.spec.dp_size, worker.spec.block_size), (2, Some(32)));
    assert_eq!(worker.spec.model.as_deref(), Some("m"));
    let expected =
        DiscoveredPod { namespace: "inference".into(), pod: "e1".into(), uid: "u-42".into() };
    assert_eq!(worker.pod, expected);
}

#[test]
fn a_pod_without_a_name_or_uid_is_refused() {
    let mut unnamed = object(pod("e1"));
    unnamed.metadata.uid = None;
    let verdict = judge(
        &unnamed,
        Stage::Plain,
        "inference",
        &WorkerTemplate::new(PodPort::Number(1)),
        &ModelSource::Fixed(ModelId::new("m")),
    );
    assert_eq!(verdict, PodVerdict::Invalid(PodProblem::Unnamed));
}
