//! The operations endpoints through the router's routes: `/v1/models` in the OpenAI shape,
//! `/health`, `/readiness` (ready, a model without a complete selection, draining) and
//! `/metrics` with the state gauges refreshed at scrape time.

use axum::http::{StatusCode, header};
use router_workers::WorkerId;

use crate::forward::{Outcome, OutcomeSink as _};
use crate::tests::{call, context, json};

/// Two models: `ops-b` on one plain engine, `ops-a` on another, each in one bucket.
fn two_models() -> String {
    let model = |id: &str, worker: &str, port: u16| {
        format!(
            "  - id: {id}\n    workers: [{{id: {worker}, url: \"http://127.0.0.1:{port}\"}}]\n    \
             buckets: [{{id: all, groups: {{plain: {{}}}}}}]\n"
        )
    };
    format!("models:\n{}{}", model("ops-b", "ops-b1", 1), model("ops-a", "ops-a1", 2))
}

#[tokio::test]
async fn models_are_listed_in_the_openai_shape_sorted_by_id() {
    // Before any engine has given its card, each model names only itself.
    let ctx = context(&two_models());
    let (status, _, body) = call(&ctx, "GET", "/v1/models", None, "").await;
    assert_eq!(status, StatusCode::OK);
    let entry = |id: &str| {
        let owner = "router";
        serde_json::json!({"id": id, "object": "model", "root": id, "created": 0, "owned_by": owner})
    };
    let expected = serde_json::json!({"object": "list", "data": [entry("ops-a"), entry("ops-b")]});
    assert_eq!(json(&body), expected);

    let (status, _, body) = call(&ctx, "GET", "/health", None, "").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
}

#[tokio::test]
async fn readiness_wants_a_complete_selection_for_every_model_and_no_drain() {
    let ctx = context(&two_models());
    let ready = || async { call(&ctx, "GET", "/readiness", None, "").await };
    let (status, _, body) = ready().await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ready"));

    let b1 = ctx.registry().get(&WorkerId::new("ops-b1").expect("id")).expect("registered");
    ctx.health().record(&b1, Outcome::Unreachable);
    let (status, _, body) = ready().await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body, "no complete selection for ops-b");

    ctx.health().record_probe(&b1, true);
    ctx.health().record_probe(&b1, true);
    assert_eq!(ready().await.0, StatusCode::OK, "healthy again after two good probes");

    ctx.start_draining();
    let (status, _, body) = ready().await;
    assert_eq!((status, body.as_str()), (StatusCode::SERVICE_UNAVAILABLE, "draining"));
}

#[tokio::test]
async fn a_scrape_refreshes_the_state_gauges_first() {
    let ctx = context(&two_models());
    let a1 = ctx.registry().get(&WorkerId::new("ops-a1").expect("id")).expect("registered");
    ctx.health().record(&a1, Outcome::Unreachable);
    let (status, headers, text) = call(&ctx, "GET", "/metrics", None, "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers[header::CONTENT_TYPE], "text/plain; version=0.0.4");
    for line in [
        r#"router_engine_healthy{worker="ops-a1"} 0"#,
        r#"router_engine_healthy{worker="ops-b1"} 1"#,
        r#"router_engine_inflight{worker="ops-a1"} 0"#,
        r#"router_load_report_state{worker="ops-b1",state="missing"} 1"#,
        r#"router_load_report_state{worker="ops-b1",state="fresh"} 0"#,
        r#"router_load_report_state{worker="ops-b1",state="stale"} 0"#,
        // This context's local index, appended after the recorder's text.
        "# TYPE router_cache_matched_tokens histogram",
        r#"router_cache_matched_tokens_count{source="local"} 0"#,
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} missing from\n{text}");
    }
    assert_eq!(text.matches("# TYPE router_cache_matched_tokens ").count(), 1);
    assert!(
        !text.contains(r#"router_load_report_age_seconds{worker="ops-b1"}"#),
        "no report, no age"
    );
}

#[tokio::test]
async fn a_scrape_shows_each_engines_reported_status_drain_and_whether_it_accepts_requests() {
    let yaml = "models:\n  - id: st\n    workers: [{id: ops-s1, url: \"http://127.0.0.1:1\"}, \
                {id: ops-s2, url: \"http://127.0.0.1:2\"}]\n    \
                buckets: [{id: all, groups: {plain: {}}}]\n";
    let ctx = context(yaml);
    let s1 = ctx.registry().get(&WorkerId::new("ops-s1").expect("id")).expect("registered");
    ctx.registry().set_reported_status(&s1, router_workers::EngineStatus::Draining);
    ctx.registry().set_drained(&WorkerId::new("ops-s2").expect("id"), true).expect("known");
    let (_, _, text) = call(&ctx, "GET", "/metrics", None, "").await;
    for line in [
        r#"router_engine_status{worker="ops-s1",status="draining"} 1"#,
        r#"router_engine_status{worker="ops-s1",status="serving"} 0"#,
        r#"router_engine_status{worker="ops-s1",status="starting"} 0"#,
        r#"router_engine_status{worker="ops-s1",status="unknown"} 0"#,
        r#"router_engine_status{worker="ops-s2",status="unknown"} 1"#,
        r#"router_engine_drained{worker="ops-s1"} 0"#,
        r#"router_engine_drained{worker="ops-s2"} 1"#,
        r#"router_engine_accepting{worker="ops-s1"} 0"#,
        r#"router_engine_accepting{worker="ops-s2"} 0"#,
        r#"router_engine_healthy{worker="ops-s1"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} missing from\n{text}");
    }
    // Neither engine takes new requests, so the model has no complete selection.
    let (status, _, body) = call(&ctx, "GET", "/readiness", None, "").await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "no complete selection for st")
    );
    ctx.registry().set_drained(&WorkerId::new("ops-s2").expect("id"), false).expect("known");
    let (_, _, text) = call(&ctx, "GET", "/metrics", None, "").await;
    assert!(text.lines().any(|l| l == r#"router_engine_accepting{worker="ops-s2"} 1"#), "{text}");
    assert_eq!(call(&ctx, "GET", "/readiness", None, "").await.0, StatusCode::OK);
}

#[tokio::test]
async fn readiness_waits_for_discovery_to_list_its_pods_even_with_static_workers() {
    let yaml = format!(
        "discovery: {{selector: app=engine, model: ops-a, api_server: \"http://127.0.0.1:9\"}}\n{}",
        two_models()
    );
    let ctx = context(&yaml);
    let (status, _, body) = call(&ctx, "GET", "/readiness", None, "").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body, "kubernetes discovery has not listed its pods yet");
    assert!(
        ctx.model("ops-a").is_some_and(|m| m.resolver.has_candidates(ctx.registry())),
        "the static worker is still a candidate"
    );
}

#[tokio::test]
async fn a_tokenized_models_segment_cache_is_on_the_metrics_page() {
    let tokenizer = router_sim::assets::gpt2::tokenizer_path();
    let ctx = context(&format!(
        "models:\n  - id: ops-t\n    tokenizer: \"{}\"\n    workers: [{{id: ops-t1, url: \
         \"http://127.0.0.1:1\"}}]\n    buckets: [{{id: all, groups: {{plain: {{}}}}}}]\n",
        tokenizer.display()
    ));
    let (status, _, text) = call(&ctx, "GET", "/metrics", None, "").await;
    assert_eq!(status, StatusCode::OK);
    let value = |name: &str| {
        let prefix = format!("{name}{{model=\"ops-t\"");
        let line = text.lines().find(|l| l.starts_with(&prefix));
        let line = line.unwrap_or_else(|| panic!("{name} missing from\n{text}"));
        line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).expect("a number")
    };
    // The probe texts checked at load are in it already.
    assert!(value("router_segment_cache_entries") > 0.0);
    assert!(value("router_segment_cache_bytes") > 0.0);
    assert!(text.contains(r#"router_segment_cache_lookups_total{model="ops-t",result="hit"}"#));
}
