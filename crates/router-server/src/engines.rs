//! Which engine each worker runs, learned from its own answers where the configuration does
//! not say (`workers[].engine`, else `models[].engine`), and the chat rules each model renders
//! by as a consequence. SGLang serves `GET /get_server_info` (its server arguments and its
//! `version`); vLLM serves `GET /version` (`{"version": ...}`) and not the first. router-sim
//! answers `/get_server_info` as SGLang's API does but names itself there, and counts as
//! neither. A worker is probed once per incarnation, when healthy; one that answers neither
//! stays unknown. A model renders by the engine all its known workers run; when they run
//! different ones (or none is known), by its configured engine, else vLLM's rules, and a mix
//! is logged once.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use router_workers::{EngineKind, ModelId, Worker, WorkerId, WorkerRegistry};
use serde_json::Value;

use crate::forward::Forwarder;
use crate::prepare::Tokenization;

/// The engine that gave these answers: `server_info` to `GET /get_server_info` and `version`
/// to `GET /version` (each `None` when the engine did not answer it with JSON).
pub(crate) fn detect(server_info: Option<&Value>, version: Option<&Value>) -> Option<EngineKind> {
    let named = |answer: Option<&Value>| {
        answer.and_then(|a| a.get("version")).and_then(Value::as_str).map(str::to_owned)
    };
    if let Some(info) = server_info.filter(|info| info.get("model_path").is_some())
        && named(Some(info)).is_some_and(|v| !v.starts_with("router-sim"))
    {
        return Some(EngineKind::Sglang);
    }
    named(version).map(|_| EngineKind::Vllm)
}

/// Learns the engines of the workers of `models` (each with its tokenization) and keeps each
/// model's rules following them.
#[derive(Debug)]
pub(crate) struct EngineLearner {
    models: Vec<(ModelId, Arc<Tokenization>)>,
    /// Workers already asked, by incarnation.
    asked: Mutex<HashSet<(WorkerId, u64)>>,
    /// Models whose workers were last seen running different engines.
    mixed: Mutex<HashSet<ModelId>>,
}

impl EngineLearner {
    pub(crate) fn new(models: Vec<(ModelId, Arc<Tokenization>)>) -> Self {
        Self { models, asked: Mutex::default(), mixed: Mutex::default() }
    }

    /// Asks the healthy workers whose engine nobody named, then sets each model's rules.
    pub(crate) async fn learn(
        &self,
        registry: &WorkerRegistry,
        forwarder: &Forwarder,
        timeout: Duration,
    ) {
        let workers = registry.workers();
        // Workers that left (or came back as another incarnation) are forgotten.
        self.asked.lock().retain(|(id, incarnation)| {
            workers.iter().any(|w| w.id() == id && w.incarnation() == *incarnation)
        });
        for (model, tokenization) in &self.models {
            let unnamed = workers.iter().filter(|w| {
                w.serves(model)
                    && w.is_healthy()
                    && !w.engine_configured()
                    && tokenization.engine().is_none()
                    && w.learned_engine().is_none()
            });
            for worker in unnamed {
                if self.asked.lock().insert((worker.id().clone(), worker.incarnation())) {
                    ask(worker, forwarder, timeout).await;
                }
            }
            let engines = workers
                .iter()
                .filter(|w| w.serves(model))
                .map(|w| w.engine().or(tokenization.engine()));
            let before = tokenization.rules();
            let (rules, mixed) = tokenization.follow_engines(engines);
            if rules != before {
                tracing::info!(model = %model, ?rules, "chat requests now render by the rules of the engine the model's workers run");
            }
            let newly_mixed = if mixed {
                self.mixed.lock().insert(model.clone())
            } else {
                self.mixed.lock().remove(model);
                false
            };
            if newly_mixed {
                tracing::warn!(
                    model = %model,
                    ?rules,
                    "the model's workers run different engines; its chat requests render by one engine's rules, and prefix matches on the others may be inexact (set models[].engine to choose)"
                );
            }
        }
    }
}

/// Asks `worker` which engine it is and records the answer.
async fn ask(worker: &Worker, forwarder: &Forwarder, timeout: Duration) {
    let json = |answer: Option<(http::StatusCode, bytes::Bytes)>| {
        answer
            .filter(|(status, _)| status.is_success())
            .and_then(|(_, body)| serde_json::from_slice::<Value>(&body).ok())
    };
    let server_info = json(forwarder.get(worker, "/get_server_info", timeout).await);
    let version = match detect(server_info.as_ref(), None) {
        Some(_) => None,
        None => json(forwarder.get(worker, "/version", timeout).await),
    };
    match detect(server_info.as_ref(), version.as_ref()) {
        Some(kind) => {
            tracing::info!(worker = %worker.id(), engine = kind.as_str(), "learned the engine a worker runs");
            worker.learn_engine(kind);
        }
        None => {
            tracing::debug!(worker = %worker.id(), "the worker's answers name no engine the router knows")
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn each_engine_is_known_by_what_it_serves() {
        // SGLang's /get_server_info holds its server arguments and its version.
        let sglang = json!({"model_path": "Qwen/Qwen3-8B", "tp_size": 1, "page_size": 1, "version": "0.5.4"});
        let router_sim = json!({"model_path": "m", "version": "router-sim 0.1.0"});
        let vllm = json!({"version": "0.32.0"});
        let cases = [
            (Some(&sglang), None, Some(EngineKind::Sglang)),
            (Some(&sglang), Some(&vllm), Some(EngineKind::Sglang)),
            (None, Some(&vllm), Some(EngineKind::Vllm)),
            (Some(&router_sim), None, None),
            (Some(&router_sim), Some(&vllm), Some(EngineKind::Vllm)),
            (Some(&json!({"version": "1"})), None, None),
            (None, Some(&json!({"v": 1})), None),
            (None, None, None),
        ];
        for (info, version, expected) in cases {
            assert_eq!(detect(info, version), expected, "{info:?} {version:?}");
        }
    }
}
