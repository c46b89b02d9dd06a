//! What the router tells clients about its models (`GET /v1/models`, `GET /v1/models/{id}`):
//! each served model's card, taken from an engine of the model (its own `/v1/models` entry:
//! `root`, `max_model_len`, `owned_by`, `created`) and refreshed on the health checker's
//! interval, so tools that read `data[0].root` or `max_model_len` (vLLM's benchmark, say) see
//! what the engines serve. Until an engine has answered, a model's card names only itself.
//! The same tick learns which engine each worker runs ([`crate::engines`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use router_workers::{ModelId, Stage, WorkerRegistry};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::Forwarder;
use crate::engines::EngineLearner;

/// The engines' cards of the served models, by model.
#[derive(Debug, Default)]
pub struct ModelCards {
    cards: RwLock<HashMap<ModelId, Card>>,
    /// For the model `*` (a quick start that serves any name): the models its engines list,
    /// each with its card, listed in its place.
    served: RwLock<Vec<(String, Card)>>,
}

/// What an engine says about a model.
#[derive(Clone, Debug, PartialEq)]
struct Card {
    root: String,
    max_model_len: Option<u64>,
    owned_by: String,
    created: u64,
}

impl Card {
    /// The entry of `model` in an engine's `/v1/models` answer (or its only entry).
    fn from_models(answer: &Value, model: &ModelId) -> Option<Self> {
        let data = answer.get("data")?.as_array()?;
        let entry = data
            .iter()
            .find(|e| e.get("id").and_then(Value::as_str) == Some(model.as_str()))
            .or_else(|| (data.len() == 1).then(|| &data[0]))?;
        Self::of(entry)
    }

    /// Every entry of an engine's `/v1/models` answer, by the name it serves (vLLM lists its
    /// LoRA adapters beside the base model, each with its `parent`).
    fn all(answer: &Value) -> Vec<(String, Self)> {
        let entries = answer.get("data").and_then(Value::as_array).into_iter().flatten();
        entries
            .filter_map(|entry| {
                let id = entry.get("id").and_then(Value::as_str)?;
                Some((id.to_owned(), Self::of(entry)?))
            })
            .collect()
    }

    /// One entry of a `/v1/models` answer.
    fn of(entry: &Value) -> Option<Self> {
        let text = |field: &str| entry.get(field).and_then(Value::as_str).map(str::to_owned);
        Some(Self {
            root: text("root").or_else(|| text("id"))?,
            max_model_len: entry.get("max_model_len").and_then(Value::as_u64),
            owned_by: text("owned_by").unwrap_or_else(|| "router".to_owned()),
            created: entry.get("created").and_then(Value::as_u64).unwrap_or(0),
        })
    }
}

/// The `/v1/models` entry named `id`, from `card` (`None`: the router's own, until an engine
/// answered).
fn card_entry(id: &str, card: Option<&Card>) -> Value {
    let mut entry = json!({"id": id, "object": "model"});
    match card {
        Some(card) => {
            entry["root"] = card.root.clone().into();
            entry["owned_by"] = card.owned_by.clone().into();
            entry["created"] = card.created.into();
            if let Some(len) = card.max_model_len {
                entry["max_model_len"] = len.into();
            }
        }
        None => {
            entry["root"] = id.into();
            entry["owned_by"] = "router".into();
            entry["created"] = 0.into();
        }
    }
    entry
}

impl ModelCards {
    /// The `/v1/models` entries of `model`: its card, or for the model `*` the models its
    /// engines list (itself until they answer).
    pub fn entries(&self, model: &ModelId) -> Vec<Value> {
        if model.is_any() {
            let served = self.served.read();
            if !served.is_empty() {
                return served.iter().map(|(id, card)| card_entry(id, Some(card))).collect();
            }
        }
        vec![self.entry(model)]
    }

    /// The entry of the name `id` the model `*` serves, when its engines list it.
    pub fn served_entry(&self, id: &str) -> Option<Value> {
        let served = self.served.read();
        served.iter().find(|(name, _)| name == id).map(|(name, card)| card_entry(name, Some(card)))
    }

    /// The `/v1/models` entry of `model`.
    pub fn entry(&self, model: &ModelId) -> Value {
        card_entry(model.as_str(), self.cards.read().get(model))
    }

    /// Asks one healthy engine of each of `models` (a plain or decode engine: the one that
    /// answers) for its card, keeping the last good answer when none can say.
    pub async fn refresh(
        &self,
        models: &[ModelId],
        registry: &WorkerRegistry,
        forwarder: &Forwarder,
        timeout: Duration,
    ) {
        for model in models {
            let engines = registry.workers();
            let candidates = engines.iter().filter(|w| {
                w.is_healthy()
                    && w.serves(model)
                    && matches!(w.stage(), Stage::Plain | Stage::Decode)
            });
            for worker in candidates {
                let Some((status, body)) = forwarder.get(worker, "/v1/models", timeout).await
                else {
                    continue;
                };
                let answer = status
                    .is_success()
                    .then(|| serde_json::from_slice::<Value>(&body).ok())
                    .flatten();
                let Some(answer) = answer else { continue };
                if model.is_any() {
                    let served = Card::all(&answer);
                    if !served.is_empty() {
                        *self.served.write() = served;
                    }
                }
                if let Some(card) = Card::from_models(&answer, model) {
                    self.cards.write().insert(model.clone(), card);
                    break;
                }
            }
        }
    }

    /// Refreshes every `interval` until `cancel`, at once first, each engine given `timeout`;
    /// `engines`, when given, learns on the same tick which engine each worker runs.
    pub async fn run(
        self: Arc<Self>,
        models: Vec<ModelId>,
        engines: Option<EngineLearner>,
        registry: Arc<WorkerRegistry>,
        forwarder: Forwarder,
        (interval, timeout): (Duration, Duration),
        cancel: CancellationToken,
    ) {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = ticks.tick() => {
                    self.refresh(&models, &registry, &forwarder, timeout).await;
                    if let Some(engines) = &engines {
                        engines.learn(&registry, &forwarder, timeout).await;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_entry_becomes_the_card_and_a_model_without_one_names_itself() {
        let model = ModelId::new("m");
        let answer = json!({"data": [
            {"id": "other", "root": "x"},
            {"id": "m", "root": "/models/m-7b", "max_model_len": 32768, "owned_by": "vllm", "created": 7},
        ]});
        let card = Card::from_models(&answer, &model).expect("m's entry");
        assert_eq!(card.root, "/models/m-7b");
        let cards = ModelCards::default();
        assert_eq!(cards.entry(&model)["root"], "m", "before any engine answered");
        assert!(cards.entry(&model).get("max_model_len").is_none());
        cards.cards.write().insert(model.clone(), card);
        let entry = cards.entry(&model);
        assert_eq!(
            entry,
            json!({"id": "m", "object": "model", "root": "/models/m-7b", "max_model_len": 32768,
                   "owned_by": "vllm", "created": 7})
        );
        // A single entry of another name still describes the engine's only model; the id of
        // the entry a client sees is the router's name.
        let only = json!({"data": [{"id": "served-name"}]});
        assert_eq!(Card::from_models(&only, &model).map(|c| c.root), Some("served-name".into()));
        assert!(Card::from_models(&json!({"data": []}), &model).is_none());
        assert!(Card::from_models(&json!({"object": "list"}), &model).is_none());
    }

    #[test]
    fn a_model_serving_any_name_lists_what_its_engines_serve() {
        let any = ModelId::new(ModelId::ANY);
        let cards = ModelCards::default();
        assert_eq!(cards.entries(&any), [cards.entry(&any)], "itself until the engines answer");
        // vLLM lists a LoRA adapter beside its base model.
        let answer = json!({"data": [
            {"id": "llama", "root": "/models/llama", "owned_by": "vllm", "created": 1},
            {"id": "sql-lora", "root": "/adapters/sql", "parent": "llama", "owned_by": "vllm"},
        ]});
        *cards.served.write() = Card::all(&answer);
        let ids: Vec<Value> = cards.entries(&any).iter().map(|e| e["id"].clone()).collect();
        assert_eq!(ids, [json!("llama"), json!("sql-lora")]);
        assert_eq!(
            cards.served_entry("sql-lora").map(|e| e["root"].clone()),
            Some("/adapters/sql".into())
        );
        assert_eq!(cards.served_entry("other"), None);
    }
}
