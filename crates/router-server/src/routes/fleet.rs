//! SGLang's fleet endpoints, answered from the fleet: `GET /get_model_info` and
//! `GET /get_server_info` (`?model=` when the router serves several) proxied to a healthy
//! engine of the model; `GET /get_loads`, the load table per engine (per rank where the router
//! routes ranks) in sglang-router's shape;
//! and `POST /flush_cache` (admin token), fanned out to every engine, with the router's KV
//! picture of the engines that flushed cleared.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use router_workers::{Stage, Worker};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::app::AppContext;
use crate::dispatch::ENGINE_HEADER;
use crate::error::ApiError;

/// How long one engine may take to answer an information request or a flush.
const ENGINE_TIMEOUT: Duration = Duration::from_secs(10);

/// `?model=`.
#[derive(Debug, Deserialize)]
pub(crate) struct ModelQuery {
    model: Option<String>,
}

/// `GET /get_model_info`.
pub(crate) async fn model_info(
    State(ctx): State<Arc<AppContext>>,
    Query(query): Query<ModelQuery>,
) -> Result<Response, ApiError> {
    proxy_info(&ctx, query, "/get_model_info").await
}

/// `GET /get_server_info`.
pub(crate) async fn server_info(
    State(ctx): State<Arc<AppContext>>,
    Query(query): Query<ModelQuery>,
) -> Result<Response, ApiError> {
    proxy_info(&ctx, query, "/get_server_info").await
}

/// `path` of the first healthy engine of the queried model that answers it, as it answered.
async fn proxy_info(ctx: &AppContext, query: ModelQuery, path: &str) -> Result<Response, ApiError> {
    let model = ctx.requested_model(query.model.as_deref())?;
    let mut engines: Vec<Arc<Worker>> = ctx
        .registry()
        .workers()
        .into_iter()
        .filter(|w| w.serves(&model.id) && w.is_healthy())
        .collect();
    // A plain or decode engine knows what the client is served; a prefill engine comes last.
    engines.sort_by_key(|w| w.stage() == Stage::Prefill);
    for worker in &engines {
        if let Some((status, body)) = ctx.forwarder().get(worker, path, ENGINE_TIMEOUT).await
            && status.is_success()
        {
            return Ok(json_response(status, body, worker));
        }
    }
    Err(ApiError::NoEngineAnswered { model: model.id.to_string(), path: path.to_owned() })
}

fn json_response(status: StatusCode, body: Bytes, worker: &Worker) -> Response {
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(ENGINE_HEADER, worker.id_header().clone());
    response
}

/// `GET /get_loads`: every engine with its load, as sglang-router answers (`workers`, each with
/// `worker` (its URL) and `load`: running plus waiting requests from a fresh report, else -1),
/// plus the router's own view: id, model, role, data-parallel ranks, report freshness and
/// router-local in-flight requests. An engine whose ranks the router routes (`dp_route`) is
/// listed once per rank, as sglang-router lists its data-parallel-aware workers: `worker` is
/// `URL@RANK` and the numbers are the rank's.
pub(crate) async fn loads(State(ctx): State<Arc<AppContext>>) -> Json<Value> {
    let snapshot = ctx.load_table().snapshot();
    let mut workers = ctx.registry().workers();
    workers.sort_by(|a, b| a.id().as_str().cmp(b.id().as_str()));
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let mut entries: Vec<Value> = Vec::new();
    for worker in &workers {
        let load = snapshot.get(worker.id());
        let freshness = ctx
            .load_table()
            .status_of(worker.id())
            .map_or("missing", |status| status.freshness.as_str());
        let entry = |url: String, rank: Option<u32>| {
            json!({
                "worker": url,
                "id": worker.id().as_str(),
                "models": worker.models().iter().map(|m| m.as_str()).collect::<Vec<_>>(),
                "role": worker.stage().as_str(),
                "dp_size": worker.dp_size(),
                "dp_rank": rank,
                "freshness": freshness,
            })
        };
        if worker.dp_route().is_none() {
            let mut e = entry(worker.url().to_owned(), None);
            e["load"] = json!(load.map_or(-1, |l| count(l.total_requests())));
            e["running_requests"] = json!(load.map(|l| l.running_requests));
            e["waiting_requests"] = json!(load.map(|l| l.waiting_requests));
            e["inflight"] = json!(ctx.inflight().count(worker.id()));
            entries.push(e);
            continue;
        }
        let ranks = snapshot.ranks(worker.id());
        for rank in 0..worker.dp_size() {
            let reported = ranks.and_then(|r| r.get(usize::try_from(rank).ok()?));
            let mut e = entry(format!("{}@{rank}", worker.url()), Some(rank));
            e["load"] = json!(reported.map_or(-1, |r| count(r.total_requests())));
            e["running_requests"] = json!(reported.map(|r| r.running_requests));
            e["waiting_requests"] = json!(reported.map(|r| r.waiting_requests));
            e["inflight"] = json!(ctx.inflight().rank_inflight(worker.id(), rank).requests);
            entries.push(e);
        }
    }
    Json(json!({"workers": entries}))
}

/// `POST /flush_cache`: every engine flushes its prefix cache, by SGLang's `POST /flush_cache`
/// or, where that is a 404, vLLM's `POST /reset_prefix_cache` (served when the engine runs
/// with `VLLM_SERVER_DEV_MODE=1`). 200 only when every engine answered 2xx; otherwise 502
/// naming each that did not, with its status and message. The router forgets what the engines
/// that flushed held, so cache-aware routing does not chase blocks that are gone.
pub(crate) async fn flush_cache(State(ctx): State<Arc<AppContext>>) -> Response {
    let workers = ctx.registry().workers();
    let flushes = workers.iter().map(|worker| {
        let ctx = &ctx;
        async move {
            let forwarder = ctx.forwarder();
            let mut answer = forwarder.post_empty(worker, "/flush_cache", ENGINE_TIMEOUT).await;
            if answer.as_ref().is_some_and(|(status, _)| *status == StatusCode::NOT_FOUND) {
                answer = forwarder.post_empty(worker, "/reset_prefix_cache", ENGINE_TIMEOUT).await;
            }
            (worker, answer)
        }
    });
    let mut flushed = Vec::new();
    let mut failed = Vec::new();
    for (worker, answer) in futures::future::join_all(flushes).await {
        match answer {
            Some((status, _)) if status.is_success() => {
                if let Some(index) = ctx.kv_index() {
                    index.clear_worker(worker.id());
                }
                flushed.push(worker.id().to_string());
            }
            Some((status, body)) => failed.push(json!({
                "worker": worker.id().as_str(),
                "status": status.as_u16(),
                "message": String::from_utf8_lossy(&body[..body.len().min(512)]).trim(),
            })),
            None => failed.push(json!({
                "worker": worker.id().as_str(),
                "status": null,
                "message": "no answer",
            })),
        }
    }
    let status = if failed.is_empty() { StatusCode::OK } else { StatusCode::BAD_GATEWAY };
    (status, Json(json!({"flushed": flushed, "failed": failed}))).into_response()
}
