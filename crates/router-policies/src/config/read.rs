//! Reading `policy` maps: every key checked, every error naming its path.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

use super::{
    AdmissionLimits, CacheAwareSettings, ConfigError, NewBindingSettings, PolicyConfig,
    PolicySettings, PolicyType, PredictedTtftSettings, SessionAwareSettings, StickySettings,
    removed_policy_type, removed_setting,
};
use crate::{BindingScope, NewBinding};

/// Every tuning field, with the types it applies to.
const TUNING: &[(&str, PolicyType)] = &[
    ("cache_prefix_provider", PolicyType::CacheAware),
    ("cache_affinity_min_matched_tokens", PolicyType::CacheAware),
    ("cache_affinity_min_matched_ratio", PolicyType::CacheAware),
    ("cache_candidate_min_workers", PolicyType::CacheAware),
    ("cache_candidate_ratio", PolicyType::CacheAware),
    ("cache_candidate_max_workers", PolicyType::CacheAware),
    ("cache_switch_margin_tokens", PolicyType::CacheAware),
    ("worker_queue_limit", PolicyType::CacheAware),
    ("saturation_queue_floor", PolicyType::CacheAware),
    ("pressure_abs_threshold_tokens", PolicyType::CacheAware),
    ("pressure_rel_threshold", PolicyType::CacheAware),
    ("pressure_abs_threshold_ms", PolicyType::CacheAware),
    ("min_load_choices", PolicyType::CacheAware),
    ("kv_indexer_endpoint", PolicyType::CacheAware),
    ("kv_indexer_query_timeout_ms", PolicyType::CacheAware),
    ("kv_indexer_query_max_inflight", PolicyType::CacheAware),
    ("cache_prefix_provider", PolicyType::PredictedTtft),
    ("kv_indexer_endpoint", PolicyType::PredictedTtft),
    ("kv_indexer_query_timeout_ms", PolicyType::PredictedTtft),
    ("kv_indexer_query_max_inflight", PolicyType::PredictedTtft),
    ("default_prefill_tokens_per_sec", PolicyType::PredictedTtft),
    ("learn_rates", PolicyType::PredictedTtft),
    ("near_tie_ratio", PolicyType::PredictedTtft),
    ("near_tie_ms", PolicyType::PredictedTtft),
    ("recompute_weight", PolicyType::PredictedTtft),
    ("waiting_weight", PolicyType::PredictedTtft),
    ("tie_break", PolicyType::CacheAware),
    ("tie_break", PolicyType::PredictedTtft),
    ("fallback", PolicyType::Sticky),
    ("scope", PolicyType::Sticky),
    ("scope", PolicyType::SessionAware),
    ("new_binding", PolicyType::Sticky),
    ("new_binding", PolicyType::SessionAware),
    ("rendezvous_load_factor", PolicyType::Sticky),
    ("rendezvous_load_factor", PolicyType::SessionAware),
    ("rendezvous_load_floor", PolicyType::Sticky),
    ("rendezvous_load_floor", PolicyType::SessionAware),
];

/// One address or a list of them.
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// The fields as read, before the type is known to apply to them.
#[derive(Default)]
struct Raw {
    type_name: Option<String>,
    admission: Option<AdmissionLimits>,
    present: Vec<String>,
    cache: CacheAwareSettings,
    predicted: PredictedTtftSettings,
    sticky: StickySettings,
    scope: BindingScope,
    placement: NewBindingSettings,
}

impl Raw {
    fn read<'de, A: MapAccess<'de>>(&mut self, key: String, map: &mut A) -> Result<(), A::Error> {
        let duplicate = match key.as_str() {
            "type" => self.type_name.is_some(),
            "admission" => self.admission.is_some(),
            _ => self.present.contains(&key),
        };
        if duplicate {
            return Err(de::Error::custom(ConfigError::DuplicateField {
                field: format!("policy.{key}"),
            }));
        }
        let c = &mut self.cache;
        match key.as_str() {
            "type" => self.type_name = Some(value(map)?),
            "admission" => self.admission = Some(value(map)?),
            "cache_prefix_provider" => c.cache_prefix_provider = value(map)?,
            "cache_affinity_min_matched_tokens" => {
                c.cache_affinity_min_matched_tokens = value(map)?;
            }
            "cache_affinity_min_matched_ratio" => {
                c.cache_affinity_min_matched_ratio = Some(value(map)?);
            }
            "cache_candidate_min_workers" => c.cache_candidate_min_workers = value(map)?,
            "cache_candidate_ratio" => c.cache_candidate_ratio = value(map)?,
            "cache_candidate_max_workers" => c.cache_candidate_max_workers = value(map)?,
            "cache_switch_margin_tokens" => c.cache_switch_margin_tokens = value(map)?,
            "worker_queue_limit" => c.worker_queue_limit = Some(value(map)?),
            "saturation_queue_floor" => c.saturation_queue_floor = Some(value(map)?),
            "pressure_abs_threshold_tokens" => {
                c.pressure_abs_threshold_tokens = value(map)?;
            }
            "pressure_rel_threshold" => c.pressure_rel_threshold = value(map)?,
            "pressure_abs_threshold_ms" => c.pressure_abs_threshold_ms = Some(value(map)?),
            "min_load_choices" => c.min_load_choices = value(map)?,
            "kv_indexer_endpoint" => {
                c.kv_indexer_endpoint = match value(map)? {
                    OneOrMany::One(one) => vec![one],
                    OneOrMany::Many(many) => many,
                };
            }
            "kv_indexer_query_timeout_ms" => c.kv_indexer_query_timeout_ms = value(map)?,
            "kv_indexer_query_max_inflight" => {
                c.kv_indexer_query_max_inflight = value(map)?;
            }
            "default_prefill_tokens_per_sec" => {
                self.predicted.default_prefill_tokens_per_sec = value(map)?;
            }
            "learn_rates" => self.predicted.learn_rates = value(map)?,
            "near_tie_ratio" => self.predicted.near_tie_ratio = value(map)?,
            "near_tie_ms" => self.predicted.near_tie_ms = value(map)?,
            "recompute_weight" => self.predicted.recompute_weight = value(map)?,
            "waiting_weight" => self.predicted.waiting_weight = value(map)?,
            "tie_break" => {
                let tie_break = value(map)?;
                c.tie_break = tie_break;
                self.predicted.tie_break = tie_break;
            }
            "fallback" => self.sticky.fallback = value(map)?,
            "scope" => self.scope = value(map)?,
            "new_binding" => self.placement.new_binding = value(map)?,
            "rendezvous_load_factor" => self.placement.rendezvous_load_factor = value(map)?,
            "rendezvous_load_floor" => self.placement.rendezvous_load_floor = value(map)?,
            _ => {
                let field = format!("policy.{key}");
                let error = match removed_setting(&key) {
                    Some(replacement) => ConfigError::RemovedField { field, replacement },
                    None => ConfigError::UnknownField { field },
                };
                return Err(de::Error::custom(error));
            }
        }
        if key != "type" && key != "admission" {
            self.present.push(key);
        }
        Ok(())
    }

    fn finish(self) -> Result<PolicyConfig, ConfigError> {
        let name = self.type_name.ok_or(ConfigError::MissingType)?;
        let Some(policy) = PolicyType::from_name(&name) else {
            return Err(match removed_policy_type(&name) {
                Some(replacement) => ConfigError::RemovedType { name, replacement },
                None => ConfigError::UnknownType { name },
            });
        };
        for field in &self.present {
            let applies = TUNING.iter().any(|&(name, to)| name == field && to == policy);
            if !applies {
                return Err(ConfigError::NotApplicable {
                    field: format!("policy.{field}"),
                    policy,
                });
            }
        }
        let kind = match policy {
            PolicyType::RoundRobin => PolicySettings::RoundRobin,
            PolicyType::Random => PolicySettings::Random,
            PolicyType::PowerOfTwo => PolicySettings::PowerOfTwo,
            PolicyType::LoadBased => PolicySettings::LoadBased,
            PolicyType::SessionAware => PolicySettings::SessionAware(SessionAwareSettings {
                scope: self.scope,
                placement: self.placement,
            }),
            PolicyType::Sticky => PolicySettings::Sticky(StickySettings {
                scope: self.scope,
                placement: self.placement,
                ..self.sticky
            }),
            PolicyType::PredictedTtft => {
                PolicySettings::PredictedTtft(Box::new(self.predicted.with_source_of(&self.cache)))
            }
            PolicyType::CacheAware => PolicySettings::CacheAware(Box::new(self.cache)),
        };
        if let Some(field) = self
            .present
            .iter()
            .find(|f| *f == "rendezvous_load_factor" || *f == "rendezvous_load_floor")
            && self.placement.new_binding != NewBinding::Rendezvous
        {
            return Err(ConfigError::InvalidValue {
                field: format!("policy.{field}"),
                reason: "applies only when new_binding is rendezvous".to_owned(),
            });
        }
        let config = PolicyConfig { kind, admission: self.admission.unwrap_or_default() };
        config.validate()?;
        Ok(config)
    }
}

/// Reads the next value. Errors inside it keep the format's own path information (YAML names
/// the full path); wrapping them here would repeat it.
fn value<'de, T: Deserialize<'de>, A: MapAccess<'de>>(map: &mut A) -> Result<T, A::Error> {
    map.next_value()
}

impl<'de> Deserialize<'de> for PolicyConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PolicyVisitor;

        impl<'de> Visitor<'de> for PolicyVisitor {
            type Value = PolicyConfig;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a policy map {type, admission, ...tuning}")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PolicyConfig, A::Error> {
                let mut raw = Raw::default();
                while let Some(key) = map.next_key::<String>()? {
                    raw.read(key, &mut map)?;
                }
                raw.finish().map_err(de::Error::custom)
            }
        }

        deserializer.deserialize_map(PolicyVisitor)
    }
}
