//! Operations endpoints: `/v1/models` (and one model's card), `/health`, `/readiness`,
//! `/metrics`.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use router_policies::{MatchedTokens, SourceStats};
use router_workers::ModelId;
use serde_json::json;

use crate::app::AppContext;
use crate::error::ApiError;
use crate::metrics;

/// `GET /v1/models`: the OpenAI list shape, each entry the model's card (for a quick start
/// serving any name, `*`, the models its engines list).
pub(crate) async fn models(State(ctx): State<Arc<AppContext>>) -> Json<serde_json::Value> {
    let mut ids: Vec<&ModelId> = ctx.models().map(|m| &m.id).collect();
    ids.sort_unstable_by_key(|id| id.as_str());
    let data: Vec<_> = ids.into_iter().flat_map(|id| ctx.model_cards().entries(id)).collect();
    Json(json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{id}`: one served model's card (404 for a model not served here).
pub(crate) async fn model(
    State(ctx): State<Arc<AppContext>>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    if let Some(model) = ctx.models().find(|m| m.id.as_str() == id) {
        return Ok(Json(ctx.model_cards().entry(&model.id)));
    }
    // A quick start serving any name: the names its engines list.
    ctx.model_cards().served_entry(&id).map(Json).ok_or(ApiError::UnknownModel(id))
}

/// `GET /health`: the process is alive.
pub(crate) async fn health() -> &'static str {
    "ok"
}

/// `GET /readiness`: Kubernetes discovery (when on) has listed its pods once, and every model
/// has a complete selection possible in at least one bucket (so a model whose engines are all
/// drained, starting or draining is not ready).
pub(crate) async fn readiness(State(ctx): State<Arc<AppContext>>) -> Response {
    if ctx.is_draining() {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining").into_response();
    }
    if let Some(discovery) = ctx.discovery().filter(|d| !d.is_synced()) {
        let status = discovery.status();
        let error = status
            .cluster_error
            .or_else(|| status.sources.into_iter().find_map(|s| s.last_error))
            .map_or_else(String::new, |error| format!(": {error}"));
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("kubernetes discovery has not listed its pods yet{error}"),
        )
            .into_response();
    }
    let unready: Vec<_> = ctx
        .models()
        .filter(|m| !m.resolver.has_candidates(ctx.registry()))
        .map(|m| m.id.to_string())
        .collect();
    if unready.is_empty() {
        (StatusCode::OK, "ready").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("no complete selection for {}", unready.join(", ")),
        )
            .into_response()
    }
}

/// `GET /metrics`: Prometheus text, with the state gauges refreshed first.
pub(crate) async fn prometheus(State(ctx): State<Arc<AppContext>>) -> Response {
    refresh_state_gauges(&ctx);
    let sources = cache_sources(&ctx);
    for (kind, stats, _) in &sources {
        metrics::cache_lookups(kind, stats);
    }
    let mut text = ctx.metrics().render();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    let matched: Vec<_> = sources.iter().map(|(kind, _, matched)| (*kind, *matched)).collect();
    text.push_str(&metrics::cache_matched_tokens(&matched));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// The lookup counters of the prefix sources, summed per kind (`local`, `remote`).
fn cache_sources(ctx: &AppContext) -> Vec<(&'static str, SourceStats, MatchedTokens)> {
    let mut kinds: Vec<(&'static str, SourceStats, MatchedTokens)> = Vec::new();
    for source in ctx.cache_sources().all() {
        let (stats, matched) = (source.stats(), source.matched_tokens());
        match kinds.iter_mut().find(|(kind, _, _)| *kind == source.kind()) {
            Some(entry) => {
                entry.1 = entry.1.merged(&stats);
                entry.2 = entry.2.merged(&matched);
            }
            None => kinds.push((source.kind(), stats, matched)),
        }
    }
    kinds
}

fn refresh_state_gauges(ctx: &AppContext) {
    for worker in ctx.registry().workers() {
        let id = worker.id().as_str();
        metrics::inflight(id, ctx.inflight().count(worker.id()));
        metrics::engine_healthy(id, worker.is_healthy());
        metrics::engine_status(id, worker.reported_status());
        metrics::engine_drained(id, worker.is_drained());
        metrics::engine_accepting(id, worker.accepts_new_requests());
        let (state, age) = match ctx.load_table().status_of(worker.id()) {
            Some(status) => (status.freshness.as_str(), status.age_ms),
            None => ("missing", None),
        };
        metrics::load_freshness(id, state, age);
        if let Some(kv) = ctx.kv_stats().summary(worker.id()) {
            metrics::kv_worker(
                id,
                &[
                    ("blocks", kv.blocks),
                    ("gaps", kv.gaps),
                    ("replays", kv.replays),
                    ("clears", kv.clears),
                    ("skipped", kv.skipped),
                    ("last_seq", kv.last_seq.unwrap_or(0)),
                ],
            );
        }
    }
    if let Some(index) = ctx.kv_index() {
        let index = index.stats();
        metrics::kv_index(index.nodes, index.bytes);
    }
    for model in ctx.models() {
        if let Some(stats) = model.tokenization.as_ref().and_then(|t| t.segment_cache_stats()) {
            metrics::segment_cache(model.id.as_str(), stats);
        }
    }
    if let Some(predictions) = ctx.predictions() {
        metrics::predicted_blocks(predictions.blocks(std::time::Instant::now()));
    }
}

#[cfg(test)]
mod tests;
