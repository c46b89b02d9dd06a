//! `deploy/` as an operator applies it: the Kubernetes objects valid against Kubernetes' own
//! schemas (`kubernetes-validate`, which `.ci/run` installs; without it these tests fail, never
//! skip), the router's configuration inside them accepted by `router-server check-config`, the
//! objects wired to each other (selectors, port names, the service account), the Prometheus
//! Operator monitors selecting the router, and every query of the Grafana dashboard naming a
//! metric a router in service exports.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use router_e2e::tempfile_path::TempPath;
use router_e2e::{ADMIN_TOKEN, Http, Router, chat_body, kv_engines, kv_router_yaml};
use serde_json::Value;

fn deploy(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy").join(file)
}

/// Every document of a multi-document YAML file.
fn documents(file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(deploy(file)).expect("readable");
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|document| serde::Deserialize::deserialize(document).expect("YAML"))
        .collect()
}

/// The document of `kind` in `documents`.
fn of_kind<'a>(documents: &'a [Value], kind: &str) -> &'a Value {
    documents.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"))
}

/// Whether every label of `selector` is among `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector.as_object().is_some_and(|wanted| wanted.iter().all(|(k, v)| labels[k] == *v))
}

/// The names of `ports` (a list of objects with `name`).
fn port_names(ports: &Value) -> BTreeSet<String> {
    ports
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect()
}

/// `kubernetes-validate`: `$ROUTER_E2E_KUBERNETES_VALIDATE`, else where `.ci/run` installs it.
fn kubernetes_validate() -> PathBuf {
    if let Some(path) = std::env::var_os("ROUTER_E2E_KUBERNETES_VALIDATE") {
        return PathBuf::from(path);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    let path = home.join(".cache/router-ci/kubernetes-validate-1.37.0/bin/kubernetes-validate");
    assert!(
        path.exists(),
        "no kubernetes-validate at {} (set ROUTER_E2E_KUBERNETES_VALIDATE, or run .ci/run, which \
         installs kubernetes-validate==1.37.0 in a venv there)",
        path.display()
    );
    path
}

#[test]
fn the_manifests_are_valid_kubernetes_objects() {
    let output = Command::new(kubernetes_validate())
        .args(["--strict", "--kubernetes-version", "1.37.0"])
        .arg(deploy("router.yaml"))
        .output()
        .expect("kubernetes-validate runs");
    let said = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{said}");
    for object in ["serviceaccount", "role", "rolebinding", "configmap", "deployment", "service"] {
        assert!(said.contains(&format!("passed for resource {object}/")), "{object}: {said}");
    }
}

#[test]
fn the_router_configuration_of_the_manifest_passes_check_config() {
    let objects = documents("router.yaml");
    let config = of_kind(&objects, "ConfigMap")["data"]["router.yaml"].as_str().expect("config");
    let parsed: Value = serde_yaml_ng::from_str(config).expect("YAML");
    // Listening on every interface, on the port the container declares.
    assert_eq!(parsed["server"]["host"], "0.0.0.0");
    let container = &of_kind(&objects, "Deployment")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["ports"][0]["containerPort"], parsed["server"]["port"]);
    // The tokenizer lives on the engines' model volume; here, the simulator's stands in.
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let local = config.replace("/models/llama/tokenizer.json", &tokenizer);
    assert_ne!(local, config, "the manifest names the tokenizer it mounts");
    let file = TempPath::write("router.yaml", &local);
    let output = Command::new(router_e2e::binary("router-server"))
        .args(["check-config", &file.display()])
        .output()
        .expect("check-config runs");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{said}");
}

#[test]
fn the_objects_and_monitors_are_wired_to_each_other() {
    let objects = documents("router.yaml");
    let deployment = of_kind(&objects, "Deployment");
    let pod = &deployment["spec"]["template"];
    let container = &pod["spec"]["containers"][0];
    let container_ports = port_names(&container["ports"]);
    assert!(selects(&deployment["spec"]["selector"]["matchLabels"], &pod["metadata"]["labels"]));
    for probe in ["readinessProbe", "livenessProbe"] {
        let port = container[probe]["httpGet"]["port"].as_str().expect("a named port");
        assert!(container_ports.contains(port), "{probe} port {port}");
    }
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readiness");
    let account = pod["spec"]["serviceAccountName"].as_str().expect("an account");
    assert_eq!(of_kind(&objects, "ServiceAccount")["metadata"]["name"], account);
    let binding = of_kind(&objects, "RoleBinding");
    assert_eq!(binding["subjects"][0]["name"], account);
    assert_eq!(binding["roleRef"]["name"], of_kind(&objects, "Role")["metadata"]["name"]);
    let mounted: BTreeSet<&str> = container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["name"].as_str())
        .collect();
    let volumes: BTreeSet<&str> = pod["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(mounted, volumes, "every volume mounted, every mount a volume");
    let service = of_kind(&objects, "Service");
    assert!(selects(&service["spec"]["selector"], &pod["metadata"]["labels"]));
    let target = service["spec"]["ports"][0]["targetPort"].as_str().expect("named");
    assert!(container_ports.contains(target), "the Service's target port {target}");

    let monitors = documents("monitoring.yaml");
    let by_service = of_kind(&monitors, "ServiceMonitor");
    assert!(selects(
        &by_service["spec"]["selector"]["matchLabels"],
        &service["metadata"]["labels"]
    ));
    let endpoint = &by_service["spec"]["endpoints"][0];
    assert!(
        port_names(&service["spec"]["ports"]).contains(endpoint["port"].as_str().expect("port"))
    );
    assert_eq!(endpoint["path"], "/metrics");
    let by_pod = of_kind(&monitors, "PodMonitor");
    assert!(selects(&by_pod["spec"]["selector"]["matchLabels"], &pod["metadata"]["labels"]));
    let endpoint = &by_pod["spec"]["podMetricsEndpoints"][0];
    assert!(container_ports.contains(endpoint["port"].as_str().expect("port")));
    assert_eq!(endpoint["path"], "/metrics");
    for monitor in [by_service, by_pod] {
        assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
        assert_eq!(monitor["metadata"]["namespace"], deployment["metadata"]["namespace"]);
    }
}

/// The metric names a PromQL expression reads (a histogram's series by its own name).
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(start) = rest.find("router_") {
        let name: String =
            rest[start..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        rest = &rest[start + name.len()..];
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(&name);
        names.push(base.to_owned());
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_names_a_metric_the_router_exports() {
    let text = std::fs::read_to_string(deploy("grafana/router-dashboard.json")).expect("readable");
    let dashboard: Value = serde_json::from_str(&text).expect("JSON");
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
        .chain(dashboard["templating"]["list"].as_array().into_iter().flatten().filter_map(|v| {
            v["query"].as_str().filter(|q| q.contains("router_")).map(str::to_owned)
        }))
        .collect();
    assert!(exprs.len() >= 9, "{exprs:?}");

    // A router in service: cache-aware picks on reports, streams and whole answers, and a
    // client turned away, so that every series exists.
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let engines = kv_engines(2, &tokenizer, &[]);
    let yaml = kv_router_yaml(&engines, &tokenizer, "{type: predicted_ttft}").replace(
        &format!("admin_token: {ADMIN_TOKEN}"),
        &format!("admin_token: {ADMIN_TOKEN}, api_keys: [sk-dashboard]"),
    );
    let router = Router::with_config(&yaml);
    let http = Http::default();
    router.wait_until_ready(&http, ADMIN_TOKEN).await;
    let key = [("authorization", "Bearer sk-dashboard")];
    let shared = "A long shared system prompt for every question. ".repeat(8);
    for i in 0..6 {
        let mut body = chat_body("m", &format!("{shared} question {i}"), 4);
        body["stream"] = (i % 2 == 0).into();
        let reply = http.chat(&router.url, &body, &key).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let refused = http.chat(&router.url, &chat_body("m", "no key", 1), &[]).await;
    assert_eq!(refused.status, 401);
    let exported = http.get(&router.url, "/metrics", &[]).await.body;
    let has = |name: &str| {
        exported.lines().any(|line| {
            line.strip_prefix(name)
                .is_some_and(|after| after.starts_with(['{', ' ']) || after.starts_with("_bucket"))
        })
    };
    for expr in &exprs {
        for name in metric_names(expr) {
            assert!(has(&name), "{name} (in {expr}) is not exported:\n{exported}");
        }
    }
}
