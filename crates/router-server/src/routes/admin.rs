//! The admin API under `/admin/`, behind a bearer token compared in constant time. Without a
//! configured token the routes answer 404, as if absent.
//!
//! Workers are listed, added, removed, drained and resumed here; `/admin/state` shows the
//! buckets with their current candidates and every worker's live state; `/admin/tokenize`
//! shows the token ids the router routes an inference body with.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use router_workers::{
    EngineKind, ModelId, Worker, WorkerError, WorkerId, WorkerOrigin, WorkerSpec,
};
use serde_json::{Value, json};

use router_policies::BlockSize;

use crate::app::AppContext;
use crate::error::ApiError;
use router_config::with_engine_key;
use router_prepare::{
    Endpoint, EngineRules, InvalidRequest, body_members, edit_members, parse_request, prepare,
};

fn worker_json(ctx: &AppContext, worker: &Worker) -> Value {
    json!({
        "id": worker.id(),
        "url": worker.url(),
        "model": worker.models().first(),
        "role": worker.stage(),
        "labels": worker.labels(),
        "healthy": worker.is_healthy(),
        "drained": worker.is_drained(),
        "reported_status": worker.reported_status(),
        "accepting": worker.accepts_new_requests(),
        "inflight": ctx.inflight().count(worker.id()),
        "breaker": ctx.health().breaker(worker.id()),
        "dp_size": worker.dp_size(),
        "block_size": worker.block_size(),
        "bootstrap_port": worker.bootstrap_port(),
        "kv_events": worker.kv_events(),
        "load_reporter": worker.load_reporter(),
        "engine": worker.engine().map(EngineKind::as_str),
        "origin": worker.origin(),
    })
}

/// `GET /admin/workers`.
pub(crate) async fn list_workers(State(ctx): State<Arc<AppContext>>) -> Json<Value> {
    let workers: Vec<_> = ctx.registry().workers().iter().map(|w| worker_json(&ctx, w)).collect();
    Json(json!({"workers": workers}))
}

/// `POST /admin/workers`: a worker object exactly as in the configuration file. Its `model`
/// may be left out when the router serves one model; with several it names the one to join.
/// A bad field is a 400 whose `param` is its path (`labels.rack`). The answer is the worker,
/// with `warnings` when it is a prefill engine that no decode engine of some bucket may pair
/// with (`pair_on`).
pub(crate) async fn add_worker(
    State(ctx): State<Arc<AppContext>>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let mut deserializer = serde_json::Deserializer::from_slice(&body);
    let spec: WorkerSpec = serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        let (message, param) = if path == "." {
            (format!("invalid worker: {inner}"), None)
        } else {
            (format!("invalid worker: {path}: {inner}"), Some(path))
        };
        ApiError::InvalidRequest { message, param }
    })?;
    deserializer.end().map_err(|err| ApiError::InvalidRequest {
        message: format!("invalid worker: {err}"),
        param: None,
    })?;
    let model_id: ModelId = match spec.model.as_deref() {
        Some(name) => {
            ctx.model(name).ok_or_else(|| ApiError::UnknownModel(name.to_owned()))?.id.clone()
        }
        None => only_model(&ctx)?,
    };
    let invalid =
        |err: WorkerError| ApiError::InvalidRequest { message: err.to_string(), param: None };
    let spec = with_engine_key(&spec, ctx.credentials().engine_default.as_ref());
    let worker =
        Worker::from_spec(&spec, vec![model_id]).map_err(invalid)?.with_origin(WorkerOrigin::Admin);
    match ctx.registry().add(worker) {
        Ok(worker) => {
            let mut entry = worker_json(&ctx, &worker);
            let warnings: Vec<String> = router_config::pairing_warnings_for(
                ctx.models(),
                ctx.registry(),
                Some(worker.id()),
            )
            .iter()
            .map(ToString::to_string)
            .collect();
            for warning in &warnings {
                tracing::warn!("{warning}");
            }
            if !warnings.is_empty() {
                entry["warnings"] = json!(warnings);
            }
            Ok((StatusCode::CREATED, Json(entry)).into_response())
        }
        Err(err @ WorkerError::Duplicate { .. }) => Err(ApiError::WorkerExists(err)),
        Err(err) => Err(invalid(err)),
    }
}

/// The model a worker without `model` joins: the router's only one.
fn only_model(ctx: &AppContext) -> Result<ModelId, ApiError> {
    let models: Vec<&ModelId> = ctx.models().map(|m| &m.id).collect();
    if let [only] = models.as_slice() {
        return Ok((*only).clone());
    }
    let mut ids: Vec<&str> = models.iter().map(|id| id.as_str()).collect();
    ids.sort_unstable();
    Err(ApiError::InvalidRequest {
        message: format!(
            "'model' is required: this router serves {} models ({})",
            ids.len(),
            ids.join(", ")
        ),
        param: Some("model".into()),
    })
}

/// `DELETE /admin/workers/{id}`.
pub(crate) async fn remove_worker(
    State(ctx): State<Arc<AppContext>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id = WorkerId::new(&id).map_err(|err| ApiError::NotFound(err.to_string()))?;
    if let Some(pod) = ctx.registry().get(&id).as_ref().and_then(|w| w.origin().pod()) {
        return Err(ApiError::WorkerDiscovered {
            id: id.to_string(),
            namespace: pod.namespace.clone(),
            pod: pod.pod.clone(),
        });
    }
    let removed = ctx.registry().remove(&id).map_err(|err| ApiError::NotFound(err.to_string()))?;
    Ok(Json(json!({"removed": removed.id()})))
}

/// `POST /admin/workers/{id}/drain`: takes the worker out of selection until resumed, whatever
/// its health or load reports say; its in-flight requests finish (watch `inflight` fall to 0).
/// Idempotent. 404 for an unknown worker.
pub(crate) async fn drain_worker(
    State(ctx): State<Arc<AppContext>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_drained(&ctx, &id, true)
}

/// `POST /admin/workers/{id}/resume`: lifts the operator's drain; the worker is a candidate
/// again once it is also healthy and not reporting starting or draining. Idempotent. 404 for
/// an unknown worker.
pub(crate) async fn resume_worker(
    State(ctx): State<Arc<AppContext>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    set_drained(&ctx, &id, false)
}

fn set_drained(ctx: &AppContext, id: &str, drained: bool) -> Result<Json<Value>, ApiError> {
    let id = WorkerId::new(id).map_err(|err| ApiError::NotFound(err.to_string()))?;
    let (worker, changed) = ctx
        .registry()
        .set_drained(&id, drained)
        .map_err(|err| ApiError::NotFound(err.to_string()))?;
    if changed {
        let inflight = ctx.inflight().count(worker.id());
        let action = if drained { "drained" } else { "resumed" };
        tracing::info!(worker = %worker.id(), inflight, "worker {action} by the operator");
    }
    Ok(Json(worker_json(ctx, &worker)))
}

/// `GET /admin/state`: buckets, workers with their origin and their KV and load state, the
/// index size, and Kubernetes discovery's status when it runs.
pub(crate) async fn state(State(ctx): State<Arc<AppContext>>) -> Json<Value> {
    let mut models: Vec<Value> = ctx
        .models()
        .map(|model| {
            let buckets: Vec<Value> = model
                .resolver
                .buckets()
                .iter()
                .map(|bucket| {
                    let groups: Vec<Value> = bucket
                        .groups()
                        .iter()
                        .map(|group| {
                            json!({
                                "stage": group.stage(),
                                "worker_ids": group.members(),
                                "policy": group.policy().name(),
                                "candidates": group
                                    .candidates(ctx.registry(), &model.id)
                                    .iter()
                                    .map(|w| w.id().to_string())
                                    .collect::<Vec<_>>(),
                            })
                        })
                        .collect();
                    let mut entry = json!({
                        "id": bucket.id(),
                        "rank": bucket.rank(),
                        "limits": {"min": bucket.limits().min, "max": bucket.limits().max},
                        "max_context_tokens": bucket.max_context_tokens(),
                        "groups": groups,
                    });
                    if let Some(pair_on) = bucket.groups().pair_on() {
                        entry["pair_on"] = json!(pair_on.labels());
                    }
                    entry
                })
                .collect();
            // The engine whose rules chat requests render by (null without a tokenizer).
            let chat_rules = model.tokenization.as_ref().map(|t| match t.rules() {
                EngineRules::Vllm => "vllm",
                EngineRules::Sglang => "sglang",
            });
            json!({"id": model.id, "chat_rules": chat_rules, "buckets": buckets})
        })
        .collect();
    models.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    let workers: Vec<Value> = ctx
        .registry()
        .workers()
        .iter()
        .map(|worker| {
            let mut entry = worker_json(&ctx, worker);
            let load = match ctx.load_table().status_of(worker.id()) {
                Some(status) => json!({
                    "freshness": status.freshness.as_str(),
                    "age_ms": status.age_ms,
                    "kind": status.kind.map(|k| k.as_str()),
                }),
                None => json!({"freshness": "missing", "age_ms": null, "kind": null}),
            };
            entry["load"] = load;
            entry["learned_prefill_tokens_per_sec"] = json!(ctx.load().rates.rate(worker.id()));
            entry["kv"] = match ctx.kv_stats().summary(worker.id()) {
                Some(kv) => json!({
                    "subscribed": kv.subscribed,
                    "last_seq": kv.last_seq,
                    "blocks": kv.blocks,
                    "removed_blocks": kv.removed_blocks,
                    "gaps": kv.gaps,
                    "replays": kv.replays,
                    "clears": kv.clears,
                    "skipped": kv.skipped,
                }),
                None => json!({
                    "subscribed": false, "last_seq": null, "blocks": 0, "removed_blocks": 0, "gaps": 0,
                    "replays": 0, "clears": 0, "skipped": 0,
                }),
            };
            // No block size and no KV events: pictured from the router's dispatches alone.
            entry["kv"]["approximate"] = json!(BlockSize::is_approximate(worker));
            entry
        })
        .collect();
    // Without a local index (every lookup goes to a remote indexer) there is no tree here.
    let index = ctx.kv_index().map(|index| index.stats()).unwrap_or_default();
    // Predicted entries are the router's own guesses, kept apart from what engines reported.
    let held = ctx.predictions().map(|p| p.blocks(std::time::Instant::now()));
    Json(json!({
        "models": models,
        "workers": workers,
        "discovery": ctx.discovery().map(|d| d.status()),
        "index": {
            "local": ctx.kv_index().is_some(),
            "nodes": index.nodes,
            "bytes": index.bytes,
            "block_holders": index.block_holders,
        },
        "predicted_blocks": held.map(|held| held.predicted),
        "approximate_blocks": held.map(|held| held.approximate),
        "admission": {
            "max_concurrent_requests": ctx.server().max_concurrent_requests,
            "free_slots": ctx.admission().available(),
            "queued": ctx.admission().queued(),
            "queue_size": ctx.server().queue_size,
            "bodies_arriving_room": ctx.bodies().arriving_room(),
            "body_bytes_room": ctx.bodies().bytes_room(),
        },
        // The settings in effect (file, then flags), secrets left out.
        "settings": {
            "server": ctx.server(),
            "health": ctx.health().config(),
        },
    }))
}

#[cfg(test)]
mod tests;

/// `POST /admin/tokenize`: the token ids the router computes for an inference body, as it
/// routes it: `{"token_ids": [...], "prompt_tokens": n, "source": "exact" | "estimated",
/// "unmatchable": reason | null}`. The body is a chat, completions or `/generate` body, named
/// by its `"endpoint"` (`chat` when absent; the field is not part of the request). A batch
/// shows its first prompt's ids (what the prefix lookup reads) and counts every prompt;
/// `token_ids` is null when the count is an estimate.
pub(crate) async fn tokenize(
    State(ctx): State<Arc<AppContext>>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    let named = body_members(&body, &["endpoint"]).map_err(InvalidRequest::not_json)?;
    let endpoint = match named.and_then(|mut named| named.remove("endpoint")) {
        None => Endpoint::Chat,
        Some(Value::String(name)) => match name.as_str() {
            "chat" => Endpoint::Chat,
            "completions" => Endpoint::Completions,
            "generate" => Endpoint::Generate,
            other => {
                return Err(ApiError::InvalidRequest {
                    message: format!("endpoint {other:?} is none of chat, completions, generate"),
                    param: Some("endpoint".into()),
                });
            }
        },
        Some(_) => {
            return Err(ApiError::InvalidRequest {
                message: "endpoint must be a string".into(),
                param: Some("endpoint".into()),
            });
        }
    };
    let body = edit_members(&body, &["endpoint"], &[]).map_err(InvalidRequest::not_json)?;
    let request = parse_request(endpoint, &body, ctx.server().max_batch_size)?;
    let model = ctx.requested_model(request.model.as_deref())?;
    let prepared = prepare(body, request, model.tokenization.as_deref(), None, None)?;
    Ok(Json(json!({
        "model": model.id.as_str(),
        "token_ids": prepared.tokens.as_ref().map(|tokens| tokens.ids()),
        "prompt_tokens": prepared.input_tokens,
        "source": prepared.token_source.as_str(),
        "unmatchable": prepared.unmatchable,
    })))
}
