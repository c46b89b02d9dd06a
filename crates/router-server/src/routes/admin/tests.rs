//! The admin API through the router's routes: listing, adding (the only model by default, the
//! router's engine key given, every refusal with its status) and removing workers, and
//! `/admin/state` showing buckets, groups and their current candidates.

use axum::http::StatusCode;
use router_workers::{ModelId, WorkerId};

use crate::forward::{Outcome, OutcomeSink as _};
use crate::tests::{call, context, json, one_model};

const TOKEN: Option<&str> = Some("t0k");

fn id(text: &str) -> WorkerId {
    WorkerId::new(text).expect("id")
}

#[tokio::test]
async fn workers_are_listed_added_and_removed() {
    let top = "server: {admin_token: t0k, engine_api_key: engine-s3cret}";
    let workers = r#"[{id: a, url: "http://127.0.0.1:1"}]"#;
    let ctx = context(&one_model(top, "m", workers, "{type: round_robin}"));

    let (status, _, listed) = call(&ctx, "GET", "/admin/workers", TOKEN, "").await;
    assert_eq!(status, StatusCode::OK);
    let listed = json(&listed);
    assert_eq!(listed["workers"].as_array().map(Vec::len), Some(1));
    let a = &listed["workers"][0];
    assert_eq!(
        (&a["id"], &a["url"], &a["model"], &a["role"]),
        (&"a".into(), &"http://127.0.0.1:1".into(), &"m".into(), &"plain".into())
    );
    assert_eq!(
        (&a["healthy"], &a["inflight"], &a["breaker"]),
        (&true.into(), &0.into(), &"closed".into())
    );

    let added = r#"{"id": "b", "url": "http://127.0.0.1:2/", "dp_size": 2}"#;
    let (status, _, body) = call(&ctx, "POST", "/admin/workers", TOKEN, added).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let body = json(&body);
    assert_eq!(
        (&body["id"], &body["model"], &body["dp_size"]),
        (&"b".into(), &"m".into(), &2.into())
    );
    assert_eq!(body["url"], "http://127.0.0.1:2", "the URL as validated");
    let b = ctx.registry().get(&id("b")).expect("registered");
    assert!(b.serves(&ModelId::new("m")));
    let key = b.api_key().map(|k| k.expose());
    assert_eq!(key, Some("engine-s3cret"), "the router's engine key for a worker without one");

    let (_, _, listed) = call(&ctx, "GET", "/admin/workers", TOKEN, "").await;
    assert!(!listed.contains("s3cret"), "a listing never shows a key: {listed}");
    assert_eq!(json(&listed)["workers"].as_array().map(Vec::len), Some(2));

    let (status, _, body) = call(&ctx, "DELETE", "/admin/workers/b", TOKEN, "").await;
    assert_eq!((status, json(&body)), (StatusCode::OK, serde_json::json!({"removed": "b"})));
    assert!(ctx.registry().get(&id("b")).is_none());
}

#[tokio::test]
async fn each_refused_change_has_its_status_and_says_why() {
    let workers = r#"[{id: a, url: "http://127.0.0.1:1"}]"#;
    let ctx =
        context(&one_model("server: {admin_token: t0k}", "m", workers, "{type: round_robin}"));
    #[rustfmt::skip]
    let cases: [(&str, &str, &str, &str, u16, &str, &str); 7] = [
        ("not JSON", "POST", "/admin/workers", "{", 400, "invalid_request", "invalid worker: "),
        ("an unknown field", "POST", "/admin/workers", r#"{"id": "c", "url": "http://127.0.0.1:3", "weight": 2}"#,
            400, "invalid_request", "invalid worker: weight: unknown field `weight`"),
        ("a URL with credentials", "POST", "/admin/workers", r#"{"id": "c", "url": "http://u:p@127.0.0.1:3"}"#,
            400, "invalid_request", "worker url"),
        ("a model not served here", "POST", "/admin/workers", r#"{"id": "c", "url": "http://127.0.0.1:3", "model": "n"}"#,
            404, "model_not_found", r#"model "n" is not served"#),
        ("a taken id", "POST", "/admin/workers", r#"{"id": "a", "url": "http://127.0.0.1:3"}"#,
            409, "invalid_request", "duplicate worker id a"),
        ("removing an unknown worker", "DELETE", "/admin/workers/zz", "", 404, "not_found", "unknown worker id zz"),
        ("without the token", "GET", "/admin/workers", "", 401, "unauthorized", "missing or invalid admin bearer token"),
    ];
    for (name, method, path, body, status, code, says) in cases {
        let token = if name == "without the token" { None } else { TOKEN };
        let (got, _, answer) = call(&ctx, method, path, token, body).await;
        assert_eq!(got.as_u16(), status, "{name}: {answer}");
        let answer = json(&answer);
        assert_eq!(answer["error"]["code"], code, "{name}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.starts_with(says), "{name}: {message}");
        assert!(!message.contains("u:p@"), "{name}: credentials are masked: {message}");
    }
    let ids: Vec<String> = ctx.registry().workers().iter().map(|w| w.id().to_string()).collect();
    assert_eq!(ids, ["a"], "nothing changed");
}

#[tokio::test]
async fn a_worker_joining_one_of_several_models_must_name_it() {
    let yaml = "server: {admin_token: t0k}\nmodels:\n  \
                - {id: n, buckets: [{id: all, groups: {plain: {}}}]}\n  \
                - {id: m, buckets: [{id: all, groups: {plain: {}}}]}\n";
    let ctx = context(yaml);
    let unnamed = r#"{"id": "c", "url": "http://127.0.0.1:3"}"#;
    let (status, _, body) = call(&ctx, "POST", "/admin/workers", TOKEN, unnamed).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let body = json(&body);
    assert_eq!(body["error"]["param"], "model");
    assert_eq!(body["error"]["message"], "'model' is required: this router serves 2 models (m, n)");

    let named = r#"{"id": "c", "url": "http://127.0.0.1:3", "model": "n"}"#;
    let (status, _, _) = call(&ctx, "POST", "/admin/workers", TOKEN, named).await;
    assert_eq!(status, StatusCode::CREATED);
    let c = ctx.registry().get(&id("c")).expect("registered");
    assert_eq!(c.models(), [ModelId::new("n")]);
}

#[tokio::test]
async fn the_state_shows_each_groups_current_candidates() {
    let yaml = "server: {admin_token: t0k}\nmodels:\n  - id: m\n    workers: \
                [{id: a, url: \"http://127.0.0.1:1\"}, {id: b, url: \"http://127.0.0.1:2\"}]\n    \
                buckets:\n      \
                - {id: short, rank: 3, limits: {max: 1000}, max_context_tokens: 2000, \
                groups: {plain: {worker_ids: [a], policy: {type: random}}}}\n      \
                - {id: long, groups: {plain: {}}}\n";
    let ctx = context(yaml);
    let a = ctx.registry().get(&id("a")).expect("a");
    ctx.health().record(&a, Outcome::Unreachable);

    let (status, _, state) = call(&ctx, "GET", "/admin/state", TOKEN, "").await;
    assert_eq!(status, StatusCode::OK);
    let state = json(&state);
    let buckets = &state["models"][0]["buckets"];
    assert_eq!(state["models"][0]["id"], "m");
    let short = &buckets[0];
    assert_eq!(
        (&short["id"], &short["rank"], &short["max_context_tokens"]),
        (&"short".into(), &3.into(), &2000.into())
    );
    assert_eq!(short["limits"], serde_json::json!({"min": 0, "max": 1000}));
    let group = &short["groups"][0];
    assert_eq!((&group["stage"], &group["policy"]), (&"plain".into(), &"random".into()));
    assert_eq!(group["worker_ids"], serde_json::json!(["a"]));
    assert_eq!(group["candidates"], serde_json::json!([]), "a is unhealthy");
    let long = &buckets[1]["groups"][0];
    assert_eq!(
        (&long["worker_ids"], &long["candidates"]),
        (&serde_json::Value::Null, &serde_json::json!(["b"]))
    );

    let workers = state["workers"].as_array().expect("workers");
    assert_eq!(workers.len(), 2);
    assert_eq!((&workers[0]["id"], &workers[0]["healthy"]), (&"a".into(), &false.into()));
    assert_eq!(
        workers[1]["load"],
        serde_json::json!({"freshness": "missing", "age_ms": null, "kind": null})
    );
    assert_eq!(workers[1]["kv"]["subscribed"], false);
    assert_eq!(state["index"]["local"], true);
}

#[tokio::test]
async fn a_worker_is_drained_and_resumed_by_hand_whatever_its_health_and_reports() {
    let workers = r#"[{id: a, url: "http://127.0.0.1:1"}, {id: b, url: "http://127.0.0.1:2"}]"#;
    let ctx =
        context(&one_model("server: {admin_token: t0k}", "m", workers, "{type: round_robin}"));
    let candidates = |ctx: &std::sync::Arc<crate::app::AppContext>| {
        let model = ctx.models().next().expect("m");
        let group = model.resolver.buckets()[0].groups().iter().next().expect("plain");
        group
            .candidates(ctx.registry(), &model.id)
            .iter()
            .map(|w| w.id().to_string())
            .collect::<Vec<_>>()
    };
    let a = ctx.registry().get(&id("a")).expect("a");
    let (status, _, listed) = call(&ctx, "GET", "/admin/workers", TOKEN, "").await;
    assert_eq!(status, StatusCode::OK);
    let first = &json(&listed)["workers"][0];
    assert_eq!(
        (&first["drained"], &first["reported_status"], &first["accepting"], &first["labels"]),
        (&false.into(), &"unknown".into(), &true.into(), &serde_json::json!({}))
    );

    for _ in 0..2 {
        let (status, _, body) = call(&ctx, "POST", "/admin/workers/a/drain", TOKEN, "").await;
        assert_eq!(status, StatusCode::OK, "draining is idempotent: {body}");
        let body = json(&body);
        assert_eq!(
            (&body["id"], &body["drained"], &body["accepting"]),
            (&"a".into(), &true.into(), &false.into())
        );
        assert_eq!(body["healthy"], true, "a drain is not a health verdict");
    }
    assert_eq!(candidates(&ctx), ["b"]);
    // Probes and reports neither lift nor replace the drain.
    ctx.health().record(&a, Outcome::Success);
    ctx.registry().set_reported_status(&a, router_workers::EngineStatus::Serving);
    assert_eq!(candidates(&ctx), ["b"]);

    let (status, _, body) = call(&ctx, "POST", "/admin/workers/a/resume", TOKEN, "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (json(&body)["drained"].clone(), json(&body)["accepting"].clone()),
        (false.into(), true.into())
    );
    assert_eq!(candidates(&ctx), ["a", "b"]);

    // Resuming lifts only the operator's drain: an engine that says it is draining stays out.
    ctx.registry().set_reported_status(&a, router_workers::EngineStatus::Draining);
    let (_, _, body) = call(&ctx, "POST", "/admin/workers/a/resume", TOKEN, "").await;
    let body = json(&body);
    assert_eq!(
        (&body["drained"], &body["reported_status"], &body["accepting"]),
        (&false.into(), &"draining".into(), &false.into())
    );
    assert_eq!(candidates(&ctx), ["b"]);

    #[rustfmt::skip]
    let refused: [(&str, Option<&str>, u16, &str); 4] = [
        ("/admin/workers/zz/drain", TOKEN, 404, "unknown worker id zz"),
        ("/admin/workers/zz/resume", TOKEN, 404, "unknown worker id zz"),
        ("/admin/workers/a/drain", None, 401, "missing or invalid admin bearer token"),
        ("/admin/workers/a/drain", Some("wrong"), 401, "missing or invalid admin bearer token"),
    ];
    for (path, token, want, says) in refused {
        let (status, _, body) = call(&ctx, "POST", path, token, "").await;
        assert_eq!(status.as_u16(), want, "{path}: {body}");
        assert_eq!(json(&body)["error"]["message"], says, "{path}");
    }
    assert!(!ctx.registry().get(&id("a")).expect("a").is_drained(), "nothing drained a");
    let (status, headers, body) = call(&ctx, "GET", "/admin/workers/a/drain", TOKEN, "").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(json(&body)["error"]["code"], "method_not_allowed", "{body}");
    assert_eq!(headers.get("allow").map(|v| v.to_str().expect("ASCII")), Some("POST"));
    // Every path answers in the API's error shape, served or not.
    for (method, path, status, code) in [
        ("GET", "/v1/nothing", 404, "not_found"),
        ("POST", "/admin/nowhere", 404, "not_found"),
        ("GET", "/v1/chat/completions", 405, "method_not_allowed"),
        ("DELETE", "/health", 405, "method_not_allowed"),
    ] {
        let (got, _, body) = call(&ctx, method, path, None, "").await;
        assert_eq!(got.as_u16(), status, "{method} {path}: {body}");
        assert_eq!(json(&body)["error"]["code"], code, "{method} {path}");
        assert!(json(&body)["error"]["message"].as_str().is_some_and(|m| m.contains(path)));
    }
}

#[tokio::test]
async fn labels_come_through_the_admin_api_and_a_bad_one_is_named() {
    let yaml = "server: {admin_token: t0k}\nmodels:\n  - id: m\n    workers:\n      \
                - {id: D1, url: \"http://127.0.0.1:1\", role: decode, labels: {rack: a}}\n    \
                buckets:\n      - {id: pd, groups: {pd: {prefill: {}, decode: {}, pair_on: [rack]}}}\n";
    let ctx = context(yaml);
    let paired =
        r#"{"id": "P1", "url": "http://127.0.0.1:2", "role": "prefill", "labels": {"rack": "a"}}"#;
    let (status, _, body) = call(&ctx, "POST", "/admin/workers", TOKEN, paired).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let body = json(&body);
    assert_eq!(body["labels"], serde_json::json!({"rack": "a"}));
    assert!(body.get("warnings").is_none(), "P1 pairs with D1: {body}");
    assert_eq!(ctx.registry().get(&id("P1")).expect("P1").label("rack"), Some("a"));

    let unpaired =
        r#"{"id": "P2", "url": "http://127.0.0.1:3", "role": "prefill", "labels": {"rack": "b"}}"#;
    let (status, _, body) = call(&ctx, "POST", "/admin/workers", TOKEN, unpaired).await;
    assert_eq!(status, StatusCode::CREATED, "a warning is no refusal: {body}");
    assert_eq!(
        json(&body)["warnings"],
        serde_json::json!(["bucket pd: prefill engine P2 has no decode engine with the same \
                            pair_on labels, so it is never selected there"])
    );

    let (_, _, state) = call(&ctx, "GET", "/admin/state", TOKEN, "").await;
    let state = json(&state);
    assert_eq!(state["models"][0]["buckets"][0]["pair_on"], serde_json::json!(["rack"]));

    for (body, param) in [
        (
            r#"{"id": "P3", "url": "http://127.0.0.1:4", "role": "prefill", "labels": {"rack": 3}}"#,
            "labels.rack",
        ),
        (
            r#"{"id": "P3", "url": "http://127.0.0.1:4", "role": "prefill", "labels": {"ok": "x", "tp": true}}"#,
            "labels.tp",
        ),
        (r#"{"id": "P3", "url": "http://127.0.0.1:4", "labels": ["rack"]}"#, "labels"),
    ] {
        let (status, _, answer) = call(&ctx, "POST", "/admin/workers", TOKEN, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        let answer = json(&answer);
        assert_eq!(answer["error"]["param"], param, "{body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with(&format!("invalid worker: {param}: invalid type")),
            "{message}"
        );
    }
    assert!(ctx.registry().get(&id("P3")).is_none());
}

#[tokio::test]
async fn the_state_says_where_each_worker_came_from_and_a_discovered_one_is_its_pods() {
    let top = "server: {admin_token: t0k}\ndiscovery: {selector: app=engine, api_server: \"http://127.0.0.1:9\"}";
    let workers = r#"[{id: a, url: "http://127.0.0.1:1"}]"#;
    let ctx = context(&one_model(top, "m", workers, "{type: round_robin}"));
    let added = r#"{"id": "b", "url": "http://127.0.0.1:2"}"#;
    assert_eq!(call(&ctx, "POST", "/admin/workers", TOKEN, added).await.0, StatusCode::CREATED);
    let pod = router_workers::DiscoveredPod {
        namespace: "inference".into(),
        pod: "engine-0".into(),
        uid: "uid-7".into(),
    };
    let discovered =
        router_workers::Worker::plain("engine-0", "http://127.0.0.1:3", &ModelId::new("m"))
            .expect("worker")
            .with_origin(router_workers::WorkerOrigin::Discovery(pod));
    ctx.registry().add(discovered).expect("added");

    let (status, _, body) = call(&ctx, "GET", "/admin/state", TOKEN, "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let state = json(&body);
    let origins: Vec<(String, serde_json::Value)> = state["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .map(|w| (w["id"].as_str().unwrap_or_default().to_owned(), w["origin"].clone()))
        .collect();
    assert_eq!(
        origins,
        [
            ("a".to_owned(), serde_json::json!({"source": "config"})),
            ("b".to_owned(), serde_json::json!({"source": "admin"})),
            (
                "engine-0".to_owned(),
                serde_json::json!({
                    "source": "discovery", "namespace": "inference", "pod": "engine-0", "uid": "uid-7"
                })
            ),
        ]
    );
    let discovery = &state["discovery"];
    assert_eq!(discovery["synced"], false, "never started: {discovery}");
    assert_eq!(discovery["sources"][0]["selector"], "app=engine");
    assert_eq!(discovery["sources"][0]["role"], "plain");

    // A discovered worker leaves with its pod, not through the admin API.
    let (status, _, body) = call(&ctx, "DELETE", "/admin/workers/engine-0", TOKEN, "").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let message = json(&body)["error"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains("pod inference/engine-0"), "{message}");
    assert!(ctx.registry().get(&id("engine-0")).is_some());
    assert_eq!(call(&ctx, "DELETE", "/admin/workers/b", TOKEN, "").await.0, StatusCode::OK);
}
