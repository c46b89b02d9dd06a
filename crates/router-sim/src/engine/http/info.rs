//! The probes: `/v1/models`, `/health`, `/get_server_info`, `/get_model_info`, SGLang's
//! `/v1/loads` (and the older `/get_load`), `POST /flush_cache`, and vLLM's `POST /v1/tokenize`
//! and `POST /v1/detokenize`.

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

/// SGLang's `/get_server_info`: its server arguments (those a router reads) and version. Like
/// SGLang's `kv_events_config` argument, the KV-event publisher's settings are a JSON string,
/// or null when the engine publishes none.
pub(crate) async fn server_info(State(engine): State<Arc<Engine>>) -> Json<serde_json::Value> {
    let config = &engine.config;
    let kv_events_config = config.kv_events.as_ref().map(|endpoint| {
        json!({
            "publisher": "zmq",
            "endpoint": endpoint,
            "replay_endpoint": config.kv_replay,
            "topic": config.kv_topic,
        })
        .to_string()
    });
    Json(json!({
        "model_path": config.model,
        "served_model_name": config.model,
        "tokenizer_path": engine.preprocessor.source().map(|p| p.display().to_string()),
        "page_size": config.block_size,
        "max_total_num_tokens": config.kv_capacity_tokens / config.block_size * config.block_size,
        "max_running_requests": config.max_running,
        "disaggregation_mode": disaggregation_mode(config.role),
        "disaggregation_bootstrap_port": config.bootstrap_port,
        "dp_size": config.dp_size,
        "tp_size": 1,
        "kv_events_format": config.kv_format.as_str(),
        "kv_events_config": kv_events_config,
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
    let source = LoadSource::new(Arc::clone(&engine.ranks));
    let source = source.hiding_prefill_counters(engine.faults.hides_prefill_counters());
    Json(source.snapshot().to_sglang_json())
}

/// The deprecated `GET /get_load` shape: a bare array per rank.
pub(crate) async fn legacy_load(State(engine): State<Arc<Engine>>) -> Json<serde_json::Value> {
    let snapshot = LoadSource::new(Arc::clone(&engine.ranks)).snapshot();
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
    // Each idle rank is flushed; a busy one keeps its cache and fails the request.
    let busy: usize = engine.ranks.all().iter().filter_map(|rank| rank.flush_cache().err()).sum();
    if busy == 0 {
        (StatusCode::OK, "Cache flushed.\n").into_response()
    } else {
        ApiError::bad_request(format!(
            "cannot flush the cache while {busy} requests are running or waiting"
        ))
        .into_response()
    }
}

/// vLLM's `POST /v1/tokenize` (`{"prompt": text}`): the prompt's ids as a completion prompt
/// gets them.
pub(crate) async fn tokenize(
    State(engine): State<Arc<Engine>>,
    Json(body): Json<serde_json::Value>,
) -> Response {
    let Some(prompt) = body.get("prompt").and_then(serde_json::Value::as_str) else {
        return ApiError::bad_request("'prompt' must be a string").into_response();
    };
    match engine.preprocessor.encode_prompt(prompt) {
        Ok(tokens) => Json(json!({
            "count": tokens.len(),
            "max_model_len": engine.config.kv_capacity_tokens,
            "tokens": tokens,
        }))
        .into_response(),
        Err(err) => ApiError::bad_request(format!("cannot tokenize: {err}")).into_response(),
    }
}

/// vLLM's `POST /v1/detokenize` (`{"tokens": [ids]}`).
pub(crate) async fn detokenize(
    State(engine): State<Arc<Engine>>,
    Json(body): Json<serde_json::Value>,
) -> Response {
    let ids: Option<Vec<u32>> =
        body.get("tokens").and_then(serde_json::Value::as_array).and_then(|ids| {
            ids.iter().map(|id| id.as_u64().and_then(|id| u32::try_from(id).ok())).collect()
        });
    let Some(ids) = ids else {
        return ApiError::bad_request("'tokens' must be a list of token ids").into_response();
    };
    match engine.preprocessor.decode(&ids) {
        Ok(prompt) => Json(json!({"prompt": prompt})).into_response(),
        Err(err) => ApiError::bad_request(format!("cannot detokenize: {err}")).into_response(),
    }
}
