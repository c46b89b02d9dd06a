//! Serving one prepared request on in-process engines: the selection's record in the metrics
//! (each bucket passed over with its reason, each admission rejection met there, the pick),
//! and the retry loop: an unreachable engine is selected around within `max_retries` and the
//! budget, a retry that finds nothing left reports the failure that caused it, and only an
//! unreachable engine is retried.

use std::sync::Arc;
use std::time::Instant;

use axum::http::HeaderValue;
use axum::response::Response;

use router_workers::ModelId;

use super::{Labels, serve};
use router_test_support::nothing_listens;

use crate::app::AppContext;
use crate::error::ApiError;
use crate::tests::{Hits, answering, context, metric, one_model, prepared};

const JSON: &str = r#"{"choices":[{"message":{"content":"hi"}}]}"#;

async fn serve_one(ctx: &Arc<AppContext>, model: &str) -> (Result<Response, ApiError>, Labels) {
    let runtime = ctx.model(model).expect("served");
    let prepared = prepared(model, false);
    let mut labels = Labels::default();
    labels.set_model(&ModelId::new(model));
    let request_id = HeaderValue::from_static("test");
    let served = serve(
        ctx,
        runtime,
        &prepared,
        &request_id,
        Instant::now(),
        &mut labels,
        &crate::telemetry::RequestTrace::none(),
    )
    .await;
    (served, labels)
}

fn message(err: &ApiError) -> String {
    err.body()["error"]["message"].as_str().unwrap_or_default().to_owned()
}

/// Three buckets tried in order: `empty` (a group of no engines), `full` (its only engine at
/// an in-flight cap of 0), `open`; `open` alone when `with_open`.
fn three_buckets(model: &str, url: &str, with_open: bool) -> String {
    let open = if with_open {
        "      - {id: open, groups: {plain: {policy: {type: random}}}}\n"
    } else {
        ""
    };
    format!(
        "models:\n  - id: {model}\n    workers: [{{id: {model}-e, url: \"{url}\"}}]\n    \
         buckets:\n      \
         - {{id: empty, limits: {{max: 100000}}, groups: {{plain: {{worker_ids: []}}}}}}\n      \
         - {{id: full, rank: 1, limits: {{max: 100000}}, groups: {{plain: {{policy: \
         {{type: round_robin, admission: {{max_inflight_requests: 0}}}}}}}}}}\n{open}"
    )
}

#[tokio::test]
async fn the_buckets_passed_over_are_counted_with_their_reasons() {
    let (url, _) = answering(200, JSON).await;
    let rejections = || {
        let cap = [("limit", "max_inflight_requests")];
        metric("router_admission_rejections_total", &cap).unwrap_or(0.0)
    };
    let fallbacks = |model: &str, bucket: &str, reason: &str| {
        let labels = [("model", model), ("bucket", bucket), ("reason", reason)];
        metric("router_bucket_fallbacks_total", &labels)
    };

    let before = rejections();
    let ctx = context(&three_buckets("record", &url, true));
    let (served, labels) = serve_one(&ctx, "record").await;
    let response = served.expect("the open bucket serves it");
    assert_eq!(response.headers()["x-router-bucket"], "open");
    assert!(!response.headers().contains_key("x-router-retries"), "nothing was retried");
    assert_eq!((labels.model(), labels.bucket()), ("record", "open"));
    assert_eq!(fallbacks("record", "empty", "no_candidates"), Some(1.0));
    assert_eq!(fallbacks("record", "full", "admission"), Some(1.0));
    assert_eq!(fallbacks("record", "open", "no_candidates"), None);
    assert_eq!(rejections() - before, 1.0, "the rejection met in `full`");
    let pick = [("policy", "random"), ("stage", "plain"), ("reason", "only_candidate")];
    assert_eq!(metric("router_picks_total", &pick), Some(1.0));
    assert_eq!(metric("router_selection_seconds_count", &[("model", "record")]), Some(1.0));

    // A selection that fails counts what it passed over just the same.
    let before = rejections();
    let ctx = context(&three_buckets("record-fails", &url, false));
    let (served, labels) = serve_one(&ctx, "record-fails").await;
    let err = served.expect_err("no bucket can serve it");
    assert_eq!((err.status().as_u16(), err.kind().1), (503, "no_admissible_engine"));
    assert!(labels.bucket().is_empty(), "no bucket was selected");
    assert_eq!(fallbacks("record-fails", "empty", "no_candidates"), Some(1.0));
    assert_eq!(fallbacks("record-fails", "full", "admission"), Some(1.0));
    assert_eq!(rejections() - before, 1.0);
    assert_eq!(metric("router_selection_seconds_count", &[("model", "record-fails")]), None);
}

/// A model whose engines are `engines` in id order (`None`: nothing listens), round-robin
/// from the first, with `retry` as `server.retry` (no backoff unless it says).
async fn fleet(model: &str, retry: &str, engines: &[Option<u16>]) -> (Arc<AppContext>, Vec<Hits>) {
    let mut workers = Vec::new();
    let mut hits = Vec::new();
    for (i, engine) in engines.iter().enumerate() {
        let url = match engine {
            Some(status) => {
                let (url, engine_hits) = answering(*status, JSON).await;
                hits.push(engine_hits);
                url
            }
            None => {
                hits.push(Hits::default());
                nothing_listens()
            }
        };
        workers.push(format!("{{id: {model}-{i}, url: \"{url}\"}}"));
    }
    let top = format!("server: {{retry: {{backoff_ms: 0, {retry}}}}}");
    let yaml = one_model(&top, model, &format!("[{}]", workers.join(", ")), "{type: round_robin}");
    (context(&yaml), hits)
}

fn unhealthy(ctx: &AppContext) -> usize {
    ctx.registry().workers().iter().filter(|w| !w.is_healthy()).count()
}

#[tokio::test]
async fn an_unreachable_engine_is_selected_around() {
    let (ctx, hits) = fleet("around", "max_retries: 2", &[None, Some(200)]).await;
    let (served, labels) = serve_one(&ctx, "around").await;
    let response = served.expect("the second engine answers");
    assert_eq!(response.headers()["x-router-engine"], "around-1");
    assert_eq!(response.headers()["x-router-retries"], "1");
    assert_eq!(labels.bucket(), "all");
    assert_eq!(hits[1].count(), 1);
    assert_eq!(metric("router_retries_total", &[("model", "around")]), Some(1.0));
}

#[tokio::test]
async fn a_retry_that_finds_nothing_reports_the_failure_that_caused_it() {
    let (ctx, _) = fleet("alone", "max_retries: 2", &[None]).await;
    let (served, _) = serve_one(&ctx, "alone").await;
    let err = served.expect_err("the only engine is down");
    // Not the 503 of the empty selection that followed.
    assert_eq!((err.status().as_u16(), err.kind().1), (502, "engine_unreachable"));
    assert!(message(&err).starts_with("engine alone-0 unreachable"), "{}", message(&err));
    assert_eq!(metric("router_retries_total", &[("model", "alone")]), Some(1.0));
}

#[tokio::test]
async fn retries_stop_at_max_retries_with_the_last_failure() {
    let (ctx, hits) = fleet("bounded", "max_retries: 1", &[None, None, None, Some(200)]).await;
    let (served, _) = serve_one(&ctx, "bounded").await;
    let err = served.expect_err("two attempts, both unreachable");
    assert_eq!(err.kind().1, "engine_unreachable");
    assert!(!message(&err).starts_with("engine bounded-0 "), "the last failure: {}", message(&err));
    assert_eq!(unhealthy(&ctx), 2, "the first attempt and one retry");
    assert_eq!(hits[3].count(), 0);
    assert_eq!(metric("router_retries_total", &[("model", "bounded")]), Some(1.0));
}

#[tokio::test]
async fn no_retry_without_max_retries_or_budget() {
    let (ctx, hits) = fleet("off", "max_retries: 0", &[None, Some(200)]).await;
    let err = serve_one(&ctx, "off").await.0.expect_err("retries are off");
    assert_eq!(err.kind().1, "engine_unreachable");
    assert_eq!(hits[1].count(), 0);
    assert_eq!(metric("router_retries_total", &[("model", "off")]), None);

    let spent = "max_retries: 2, budget_ratio: 0.0, budget_min_per_sec: 0.0";
    let (ctx, hits) = fleet("spent", spent, &[None, Some(200)]).await;
    let err = serve_one(&ctx, "spent").await.0.expect_err("the budget is spent");
    assert_eq!(err.kind().1, "engine_unreachable");
    assert_eq!(hits[1].count(), 0);
    assert_eq!(metric("router_retry_budget_exhausted_total", &[("model", "spent")]), Some(1.0));
    assert_eq!(metric("router_retries_total", &[("model", "spent")]), None);
}

#[tokio::test]
async fn an_engine_that_answered_is_never_retried() {
    let (ctx, hits) = fleet("answered", "max_retries: 2", &[Some(500), Some(200)]).await;
    let err = serve_one(&ctx, "answered").await.0.expect_err("a 500");
    assert_eq!((err.status().as_u16(), err.kind().1), (502, "engine_failed"));
    assert_eq!((hits[0].count(), hits[1].count()), (1, 0));
    assert_eq!(metric("router_retries_total", &[("model", "answered")]), None);
}
