//! The probes: `/v1/models`, `/health`, `/get_server_info`, `/get_model_info`, SGLang's
//! `/v1/loads` (and the older `/get_load`), and `POST /flush_cache`.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use router_workers::Stage;
use serde_json::json;

use super::Engine;
use super::error::ApiError;
use crate::engine::LoadSource;

pub(crate) async fn models(State(engine): State<Arc<Engine>>) -> Json<serde_json::Value> {
    let config = &engine.config;
    Json(json!({
        "object": "list",
        "data": [{
            "id": config.model,
            "object": "model",
            "created": engine.started_unix,
            "owned_by": "router-sim",
            "root": config.model,
            "max_model_len": config.kv_capacity_tokens,
        }],
    }))
}

pub(crate) async fn health(State(engine): State<Arc<Engine>>) -> StatusCode {
    engine.refuse_if_dying().await;
    StatusCode::OK
}

fn disaggregation_mode(role: Stage) -> &'static str {
    match role {
        Stage::Plain => "null",
        Stage::Prefill => "prefill",
        Stage::Decode => "decode",
    }
}

pub(crate) async fn server_info(State(engine): State<Arc<Engine>>) -> Json<serde_json::Value> {
    let config = &engine.config;
    Json(json!({
        "model_path": config.model,
        "served_model_name": config.model,
        "tokenizer_path": engine.preprocessor.source().map(|p| p.display().to_string()),
        "page_size": config.block_size,
        "max_total_num_tokens": config.kv_capacity_tokens / config.block_size * config.block_size,
        "max_running_requests": config.max_running,
        "disaggregation_mode": disaggregation_mode(config.role),
        "disaggregation_bootstrap_port": config.bootstrap_port,
        "dp_size": 1,
        "tp_size": 1,
        "kv_events_format": config.kv_format.as_str(),
        "prefill_tokens_per_sec": config.prefill_tokens_per_sec,
        "decode_tokens_per_sec": config.decode_tokens_per_sec,
        "version": concat!("router-sim ", env!("CARGO_PKG_VERSION")),
    }))
}

pub(crate) async fn model_info(State(engine): State<Arc<Engine>>) -> Json<serde_json::Value> {
    Json(json!({
        "model_path": engine.config.model,
        "tokenizer_path": engine.preprocessor.source().map(|p| p.display().to_string()),
        "is_generation": true,
        "preferred_sampling_params": null,
        "weight_version": "default",
        "has_image_understanding": false,
        "has_audio_understanding": false,
        "model_type": "router-sim",
        "architectures": ["RouterSimForCausalLM"],
    }))
}

pub(crate) async fn loads(State(engine): State<Arc<Engine>>) -> Json<serde_json::Value> {
    Json(LoadSource::new(Arc::clone(&engine.scheduler)).snapshot().to_sglang_json())
}

/// The deprecated `GET /get_load` shape: a bare array per rank.
pub(crate) async fn legacy_load(State(engine): State<Arc<Engine>>) -> Json<serde_json::Value> {
    let snapshot = LoadSource::new(Arc::clone(&engine.scheduler)).snapshot();
    let ranks: Vec<serde_json::Value> = snapshot
        .ranks
        .iter()
        .map(|r| {
            json!({
                "dp_rank": r.dp_rank,
                "num_reqs": r.running + r.waiting,
                "num_waiting_reqs": r.waiting,
                "num_tokens": r.total_kv_tokens,
            })
        })
        .collect();
    Json(serde_json::Value::Array(ranks))
}

pub(crate) async fn flush_cache(State(engine): State<Arc<Engine>>) -> Response {
    match engine.scheduler.flush_cache() {
        Ok(()) => (StatusCode::OK, "Cache flushed.\n").into_response(),
        Err(busy) => ApiError::bad_request(format!(
            "cannot flush the cache while {busy} requests are running or waiting"
        ))
        .into_response(),
    }
}
