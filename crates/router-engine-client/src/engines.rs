//! Which engine each worker runs, learned from its own answers where the configuration does
//! not say (`workers[].engine`, else `models[].engine`), and the chat rules each model renders
//! by as a consequence. SGLang serves `GET /get_server_info` (its server arguments and its
//! `version`); vLLM serves `GET /version` (`{"version": ...}`) and not the first. router-sim
//! answers `/get_server_info` as SGLang's API does but names itself there, and counts as
//! neither. A worker is probed once per incarnation, when healthy; one that answers neither
//! stays unknown. A model renders by the engine all its known workers run; when they run
//! different ones (or none is known), by its configured engine, else vLLM's rules, and a mix
//! is logged once.
//!
//! Engines also say where they publish KV events: SGLang's `/get_server_info` carries its
//! `kv_events_config` (a JSON string, as launched) and its `page_size`. A worker with neither
//! KV events nor a block size, of a model whose policies read cached prefixes and which has a
//! tokenizer (engines' blocks are token ids), is asked once per incarnation (until it answers); one that advertises a ZeroMQ publisher is replaced by a
//! new incarnation subscribed to it, so its cache is known from its events instead of the
//! router's dispatches (approximate mode). A wildcard host (`tcp://*:P`, `0.0.0.0`) is the
//! engine's own host. vLLM advertises nothing by default: its workers stay approximate unless
//! configured.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use router_workers::{EngineKind, KvEventsSpec, ModelId, Worker, WorkerId, WorkerRegistry};
use serde_json::Value;

use crate::Forwarder;
use router_prepare::Tokenization;

/// The engine that gave these answers: `server_info` to `GET /get_server_info` and `version`
/// to `GET /version` (each `None` when the engine did not answer it with JSON).
pub fn detect(server_info: Option<&Value>, version: Option<&Value>) -> Option<EngineKind> {
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

/// The KV-event publisher an engine advertises in its `/get_server_info` answer `info`:
/// SGLang's `kv_events_config` (a JSON string, or an object) naming a `zmq` publisher, its
/// wildcard host replaced by `host`, with `page_size` as its block size.
pub fn advertised_kv_events(info: &Value, host: &str) -> Option<KvEventsSpec> {
    let config = match info.get("kv_events_config")? {
        Value::String(text) => serde_json::from_str::<Value>(text).ok()?,
        object @ Value::Object(_) => object.clone(),
        _ => return None,
    };
    if config.get("publisher").and_then(Value::as_str).is_some_and(|p| p != "zmq") {
        return None;
    }
    let at_host = |endpoint: &str| -> Option<String> {
        let (scheme, rest) = endpoint.split_once("://")?;
        let (bound, port) = rest.rsplit_once(':')?;
        let wildcard = matches!(bound, "*" | "0.0.0.0" | "[::]" | "::");
        let host = if wildcard { host } else { bound };
        Some(format!("{scheme}://{host}:{port}"))
    };
    let endpoint = at_host(config.get("endpoint")?.as_str()?)?;
    let replay = config.get("replay_endpoint").and_then(Value::as_str).and_then(at_host);
    let topic = config.get("topic").and_then(Value::as_str).unwrap_or_default();
    let block_size =
        info.get("page_size").and_then(Value::as_u64).and_then(|s| u32::try_from(s).ok());
    Some(KvEventsSpec {
        replay_endpoint: replay,
        topic: topic.to_owned(),
        block_size: block_size.filter(|&size| size > 0),
        ..KvEventsSpec::new(endpoint)
    })
}

/// The `/get_server_info` answers of one learning tick, by worker id: a worker asked for its
/// KV-event publisher and for its engine on the same tick is asked once.
#[derive(Default)]
struct ServerInfo(
    Mutex<std::collections::HashMap<WorkerId, Option<(http::StatusCode, bytes::Bytes)>>>,
);

impl ServerInfo {
    /// `worker`'s answer, asked of it on the first call of the tick.
    async fn of(
        &self,
        worker: &Worker,
        forwarder: &Forwarder,
        timeout: Duration,
    ) -> Option<(http::StatusCode, bytes::Bytes)> {
        if let Some(answer) = self.0.lock().get(worker.id()) {
            return answer.clone();
        }
        let answer = forwarder.get(worker, "/get_server_info", timeout).await;
        self.0.lock().insert(worker.id().clone(), answer.clone());
        answer
    }
}

/// Learns the engines of the workers of `models` (each with its tokenization) and keeps each
/// model's rules following them; and subscribes the workers of `prefix_models` to the KV
/// events their engines advertise.
#[derive(Debug)]
pub struct EngineLearner {
    models: Vec<(ModelId, Arc<Tokenization>)>,
    /// Workers already asked, by incarnation.
    asked: Mutex<HashSet<(WorkerId, u64)>>,
    /// Models whose workers were last seen running different engines.
    mixed: Mutex<HashSet<ModelId>>,
    /// Models whose policies read cached prefixes.
    prefix_models: Vec<ModelId>,
    /// Workers whose engines answered what they publish, by incarnation.
    advertised: Mutex<HashSet<(WorkerId, u64)>>,
}

impl EngineLearner {
    /// Learns the engines of `models`' workers (each model with its tokenization, whose rules
    /// follow them) and subscribes the workers of `prefix_models` to what their engines
    /// advertise.
    pub fn new(models: Vec<(ModelId, Arc<Tokenization>)>, prefix_models: Vec<ModelId>) -> Self {
        Self {
            models,
            asked: Mutex::default(),
            mixed: Mutex::default(),
            prefix_models,
            advertised: Mutex::default(),
        }
    }

    /// Whether there is anything to learn.
    pub fn is_empty(&self) -> bool {
        self.models.is_empty() && self.prefix_models.is_empty()
    }

    /// Subscribes the healthy workers of the prefix models that have no KV events and no
    /// block size to the publishers their engines advertise.
    async fn subscribe_advertised(
        &self,
        workers: &[Arc<Worker>],
        registry: &WorkerRegistry,
        (forwarder, timeout, answers): (&Forwarder, Duration, &ServerInfo),
    ) {
        self.advertised.lock().retain(|(id, incarnation)| {
            workers.iter().any(|w| w.id() == id && w.incarnation() == *incarnation)
        });
        let unknown = workers.iter().filter(|w| {
            w.is_healthy()
                && w.kv_events().is_none()
                && w.block_size().is_none()
                && self.prefix_models.iter().any(|m| w.serves(m))
                && !self.advertised.lock().contains(&(w.id().clone(), w.incarnation()))
        });
        for worker in unknown {
            let Some((status, body)) = answers.of(worker, forwarder, timeout).await else {
                continue;
            };
            self.advertised.lock().insert((worker.id().clone(), worker.incarnation()));
            let info = serde_json::from_slice::<Value>(&body).ok().filter(|_| status.is_success());
            let host = http::Uri::try_from(worker.url()).ok().and_then(|uri| {
                uri.host().map(|host| host.trim_start_matches('[').trim_end_matches(']').to_owned())
            });
            let (Some(info), Some(host)) = (info, host) else { continue };
            let Some(spec) = advertised_kv_events(&info, &host) else { continue };
            let endpoint = spec.endpoint.clone();
            match worker.with_kv_events(spec).map(|subscribed| registry.replace(subscribed)) {
                Ok(Ok(subscribed)) => tracing::info!(
                    worker = %worker.id(),
                    endpoint,
                    block_size = subscribed.block_size(),
                    "subscribing to the KV events the engine advertises"
                ),
                Ok(Err(err)) | Err(err) => tracing::warn!(
                    worker = %worker.id(),
                    endpoint,
                    error = %err,
                    "the engine advertises KV events the router cannot subscribe to"
                ),
            }
        }
    }

    /// Asks the healthy workers whose engine nobody named, then sets each model's rules.
    pub async fn learn(&self, registry: &WorkerRegistry, forwarder: &Forwarder, timeout: Duration) {
        let workers = registry.workers();
        let answers = ServerInfo::default();
        if !self.prefix_models.is_empty() {
            self.subscribe_advertised(&workers, registry, (forwarder, timeout, &answers)).await;
        }
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
                    ask(worker, forwarder, timeout, &answers).await;
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
async fn ask(worker: &Worker, forwarder: &Forwarder, timeout: Duration, answers: &ServerInfo) {
    let json = |answer: Option<(http::StatusCode, bytes::Bytes)>| {
        answer
            .filter(|(status, _)| status.is_success())
            .and_then(|(_, body)| serde_json::from_slice::<Value>(&body).ok())
    };
    let server_info = json(answers.of(worker, forwarder, timeout).await);
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

    #[test]
    fn an_advertised_publisher_is_reached_at_the_engine_host() {
        // As SGLang launched with --kv-events-config '{"publisher": "zmq", ...}' answers.
        let config = json!({"publisher": "zmq", "endpoint": "tcp://*:5557",
                            "replay_endpoint": "tcp://0.0.0.0:5558", "topic": "kv"});
        let info = json!({"page_size": 32, "kv_events_config": config.to_string()});
        let spec = advertised_kv_events(&info, "10.0.0.7").expect("advertised");
        assert_eq!(spec.endpoint, "tcp://10.0.0.7:5557");
        assert_eq!(spec.replay_endpoint.as_deref(), Some("tcp://10.0.0.7:5558"));
        assert_eq!((spec.topic.as_str(), spec.block_size), ("kv", Some(32)));
        let named = json!({"kv_events_config": {"endpoint": "tcp://192.168.1.2:6000"}});
        let spec = advertised_kv_events(&named, "10.0.0.7").expect("an object works too");
        assert_eq!((spec.endpoint.as_str(), spec.block_size), ("tcp://192.168.1.2:6000", None));
        for silent in [
            json!({"page_size": 1}),
            json!({"kv_events_config": null}),
            json!({"kv_events_config": "{\"publisher\": \"null\", \"endpoint\": \"tcp://*:1\"}"}),
            json!({"kv_events_config": "not json"}),
            json!({"kv_events_config": "{\"publisher\": \"zmq\"}"}),
        ] {
            assert!(advertised_kv_events(&silent, "h").is_none(), "{silent}");
        }
    }
}
