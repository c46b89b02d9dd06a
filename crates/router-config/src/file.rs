//! The configuration file: types, defaults and parsing (YAML, or JSON which YAML accepts).
//!
//! Unknown fields are errors everywhere; parse errors name the field path
//! (`models[0].buckets[1].limits.max`). A top-level section is a `*Section` (`ServerSection`,
//! `AffinitySection`, ...), so it never reads like the domain crate's own settings
//! (`router_affinity::AffinityConfig`); an entry inside one is a `*Config` (`BucketConfig`).
//! The SLO keys (`ttft_slo`, `tps_slo`, a bucket's `ttft_ms` and `tokens_per_second`) are read
//! into router-buckets' own types, refusing zero, negative and non-finite estimates.

use std::fmt;
use std::num::NonZeroU64;
use std::path::{Path, PathBuf};

use router_buckets::{SloEstimate, SloPreference, TokensPerSecond};
use router_policies::PolicyConfig;
use router_workers::WorkerSpec;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

use super::discovery::DiscoverySection;
use super::sections::HealthSection;
use super::sections::TelemetrySection;
use super::server::ServerSection;

/// The whole configuration file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Listener, limits and operations.
    #[serde(default)]
    pub server: ServerSection,
    /// Engine health checks and the circuit breaker.
    #[serde(default)]
    pub health: HealthSection,
    /// Load-report settings.
    #[serde(default)]
    pub load: LoadSection,
    /// KV-event settings.
    #[serde(default)]
    pub kv: KvSection,
    /// Served models, each with its engines and buckets.
    #[serde(default)]
    pub models: Vec<ModelConfig>,
    /// Engines found through the Kubernetes API, joining a configured model.
    #[serde(default)]
    pub discovery: Option<DiscoverySection>,
    /// Trace export (OpenTelemetry, OTLP/gRPC).
    #[serde(default)]
    pub telemetry: TelemetrySection,
    /// Request preparation: the cache of prompt pieces' token ids.
    #[serde(default)]
    pub prepare: PrepareSection,
}

/// `prepare`: request preparation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrepareSection {
    /// Memory for the token ids of prompt pieces between a tokenizer's added tokens (the
    /// messages of a conversation), so that a prompt repeating the previous turn pays for its
    /// new text only; split evenly between the models with a tokenizer. 0 encodes every
    /// prompt whole.
    pub segment_cache_bytes: u64,
}

impl Default for PrepareSection {
    fn default() -> Self {
        Self { segment_cache_bytes: router_prepare::DEFAULT_SEGMENT_CACHE_BYTES }
    }
}

/// `load`: how engine load reports are judged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoadSection {
    /// Interval the router asks reporters to stream at, in milliseconds.
    pub report_interval_ms: u64,
    /// A report older than this (by receipt time) is stale, in milliseconds.
    pub stale_after_ms: u64,
}

impl Default for LoadSection {
    fn default() -> Self {
        Self { report_interval_ms: 500, stale_after_ms: 3000 }
    }
}

/// `kv`: the KV-event index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvSection {
    /// Upper bound on radix-tree nodes across models, split evenly between them.
    pub max_index_nodes: usize,
    /// How long a dispatched request's blocks count as predicted entries on its engine before
    /// the engine's KV events confirm them; 0 turns predicted entries off.
    pub predicted_ttl_ms: u64,
    /// Most predicted blocks remembered per (model, engine), oldest dropped first.
    pub predicted_max_blocks_per_worker: usize,
    /// How long a dispatch counts as cached on an engine without KV events (approximate
    /// mode: the router's own dispatches are its only picture of that cache); 0 turns it off.
    pub approximate_ttl_secs: u64,
    /// Most approximate blocks remembered over all engines, shared evenly between them,
    /// oldest dropped first.
    pub approximate_max_blocks: usize,
    /// Largest KV-event message (and so frame) an engine may send, in bytes; one past it is
    /// refused at its frame header and its connection dropped. The payload limit too.
    pub max_message_bytes: usize,
    /// Most frames in one KV-event message; a message past it is refused likewise.
    pub max_frames_per_message: usize,
}

impl Default for KvSection {
    fn default() -> Self {
        let subscriptions = router_state_kv::SubscriptionConfig::default();
        Self {
            max_index_nodes: 4_000_000,
            predicted_ttl_ms: 5_000,
            predicted_max_blocks_per_worker: 1 << 16,
            approximate_ttl_secs: 120,
            approximate_max_blocks: 1_000_000,
            max_message_bytes: subscriptions.max_message_bytes,
            max_frames_per_message: subscriptions.max_frames_per_message,
        }
    }
}

impl KvSection {
    /// The KV-event subscriptions' settings: the message limits of this section.
    pub fn subscriptions(&self) -> router_state_kv::SubscriptionConfig {
        router_state_kv::SubscriptionConfig::with_message_limits(
            self.max_message_bytes,
            self.max_frames_per_message,
        )
    }

    /// The settings of predicted and approximate entries, `None` when both are off.
    pub fn predictions(&self) -> Option<router_state_kv::PredictionConfig> {
        let ahead = self.predicted_ttl_ms > 0 && self.predicted_max_blocks_per_worker > 0;
        let approximate = self.approximate_ttl_secs > 0 && self.approximate_max_blocks > 0;
        (ahead || approximate).then(|| router_state_kv::PredictionConfig {
            ttl: std::time::Duration::from_millis(self.predicted_ttl_ms),
            max_blocks_per_worker: self.predicted_max_blocks_per_worker,
            approximate_ttl: std::time::Duration::from_secs(self.approximate_ttl_secs),
            approximate_max_blocks: self.approximate_max_blocks,
        })
    }
}

/// The model id that serves any name a request gives (a quick start's, unless `--model`).
pub const ANY_MODEL: &str = router_workers::ModelId::ANY;

/// One served model.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The model name clients send.
    pub id: String,
    /// `tokenizer.json` of the model; without it, lengths are estimated and cache-aware
    /// selection has no token ids to match.
    #[serde(default)]
    pub tokenizer: Option<PathBuf>,
    /// A chat template file; default: `chat_template` of the `tokenizer_config.json` beside the
    /// tokenizer.
    #[serde(default)]
    pub chat_template: Option<PathBuf>,
    /// The engine the model's workers run (`vllm` or `sglang`), for those that do not say
    /// (`workers[].engine`); unset, the router learns each worker's from its answers. Chat
    /// requests are rendered by its rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<router_workers::EngineKind>,
    /// Session and routing-key headers and binding expiry.
    #[serde(default)]
    pub affinity: AffinitySection,
    /// How time-to-first-token targets (`x-sgl-ttft-slo-ms`) reorder the buckets.
    #[serde(default, deserialize_with = "slo_preference")]
    pub ttft_slo: SloPreference,
    /// How decode-throughput targets (`x-sgl-tps-slo`) reorder the buckets.
    #[serde(default, deserialize_with = "slo_preference")]
    pub tps_slo: SloPreference,
    /// The engines serving this model.
    #[serde(default)]
    pub workers: Vec<WorkerSpec>,
    /// Buckets, tried in length order.
    #[serde(default)]
    pub buckets: Vec<BucketConfig>,
}

/// `affinity` of a model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AffinitySection {
    /// Header carrying the session id.
    pub session_id_header: String,
    /// Header carrying the routing key.
    pub routing_key_header: String,
    /// Bindings idle this long expire, in seconds: the default of both kinds below.
    pub idle_timeout_secs: u64,
    /// Session bindings (`session_aware`) idle this long expire, in seconds; default
    /// `idle_timeout_secs`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_idle_timeout_secs: Option<u64>,
    /// Routing-key bindings (`sticky`) idle this long expire, in seconds; default
    /// `idle_timeout_secs`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sticky_idle_timeout_secs: Option<u64>,
    /// How often expired bindings are swept, in seconds.
    pub eviction_interval_secs: u64,
    /// Most bindings kept; beyond it the least recently used go first.
    pub max_entries: usize,
}

impl Default for AffinitySection {
    fn default() -> Self {
        Self {
            session_id_header: "x-session-id".to_owned(),
            routing_key_header: "x-routing-key".to_owned(),
            idle_timeout_secs: 600,
            session_idle_timeout_secs: None,
            sticky_idle_timeout_secs: None,
            eviction_interval_secs: 60,
            max_entries: 1_000_000,
        }
    }
}

impl AffinitySection {
    /// Idle expiry of session bindings, in seconds, with the key that set it.
    pub fn session_idle_secs(&self) -> (u64, &'static str) {
        match self.session_idle_timeout_secs {
            Some(secs) => (secs, "session_idle_timeout_secs"),
            None => (self.idle_timeout_secs, "idle_timeout_secs"),
        }
    }

    /// Idle expiry of routing-key bindings, in seconds, with the key that set it.
    pub fn sticky_idle_secs(&self) -> (u64, &'static str) {
        match self.sticky_idle_timeout_secs {
            Some(secs) => (secs, "sticky_idle_timeout_secs"),
            None => (self.idle_timeout_secs, "idle_timeout_secs"),
        }
    }
}

/// One bucket.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketConfig {
    /// Unique, non-empty id.
    pub id: String,
    /// Tie-breaker among buckets of equal capacity (lower first).
    #[serde(default)]
    pub rank: u32,
    /// Inclusive input-token range.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// Context capacity: input plus requested output must fit.
    #[serde(default)]
    pub max_context_tokens: Option<u64>,
    /// Time to first token the bucket delivers, in milliseconds, or `live`.
    #[serde(default, deserialize_with = "ttft_estimate")]
    pub ttft_ms: Option<SloEstimate<NonZeroU64>>,
    /// Decode speed of one request the bucket delivers, in tokens per second, or `live`.
    #[serde(default, deserialize_with = "tps_estimate")]
    pub tokens_per_second: Option<SloEstimate<TokensPerSecond>>,
    /// Exactly one of `plain` or `pd`.
    pub groups: GroupsConfig,
}

impl BucketConfig {
    /// The one bucket a quick start or the demo serves with: every request, `groups`.
    pub fn default_for(groups: GroupsConfig) -> Self {
        Self {
            id: "default".into(),
            rank: 0,
            limits: LimitsConfig::default(),
            max_context_tokens: None,
            ttft_ms: None,
            tokens_per_second: None,
            groups,
        }
    }
}

/// `limits` of a bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Smallest input, inclusive.
    #[serde(default)]
    pub min: u64,
    /// Largest input, inclusive; absent = unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
}

/// `groups` of a bucket: exactly one of the two.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupsConfig {
    /// One group of plain engines.
    #[serde(default)]
    pub plain: Option<GroupConfig>,
    /// A prefill group and a decode group.
    #[serde(default)]
    pub pd: Option<PdGroupsConfig>,
}

/// `groups.pd`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PdGroupsConfig {
    /// The prefill group.
    pub prefill: GroupConfig,
    /// The decode group.
    pub decode: GroupConfig,
    /// Worker labels on which a pair must agree: a decode engine serves a prefill engine only
    /// when both carry each label with the same value. Empty = any pair.
    #[serde(default)]
    pub pair_on: Vec<String>,
}

/// One engine group.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupConfig {
    /// Members; absent = every healthy engine of the model and role, `[]` = none.
    #[serde(default)]
    pub worker_ids: Option<Vec<String>>,
    /// The attached policy; default `round_robin` with no admission caps.
    #[serde(default = "default_policy")]
    pub policy: PolicyConfig,
}

fn default_policy() -> PolicyConfig {
    PolicyConfig::new(router_policies::PolicySettings::RoundRobin)
}

/// A configuration that could not be read or parsed.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// The file could not be read.
    #[error("reading {path}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid YAML or JSON, or does not match the schema.
    #[error("{path}: {message}")]
    Syntax {
        /// The file.
        path: String,
        /// The field path and what is wrong.
        message: String,
    },
}

impl ConfigFile {
    /// The prefix index's settings: `kv.max_index_nodes` split evenly between the configured
    /// models, so that the bound holds over all of them.
    pub fn kv_index(&self) -> router_state_kv::IndexConfig {
        router_state_kv::IndexConfig::new(self.kv.max_index_nodes, self.models.len())
    }

    /// Reads and parses a configuration file.
    pub fn load(path: &Path) -> Result<Self, ParseError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ParseError::Read { path: path.display().to_string(), source })?;
        Self::parse(&text)
            .map_err(|message| ParseError::Syntax { path: path.display().to_string(), message })
    }

    /// Parses YAML (or JSON) text; the error names the field path.
    pub fn parse(text: &str) -> Result<Self, String> {
        let deserializer = serde_yaml_ng::Deserializer::from_str(text);
        serde_path_to_error::deserialize(deserializer).map_err(|err| {
            let path = err.path().to_string();
            let inner = err.into_inner().to_string();
            // YAML names the path of errors inside values itself.
            if path == "." || inner.starts_with(&format!("{path}: ")) {
                inner
            } else {
                format!("{path}: {inner}")
            }
        })
    }
}

/// `ttft_slo` / `tps_slo`: `disabled`, `slo_first` or `best_effort`; anything else is an error
/// the parser prefixes with the field's path.
fn slo_preference<'de, D: Deserializer<'de>>(deserializer: D) -> Result<SloPreference, D::Error> {
    struct PreferenceVisitor;

    impl Visitor<'_> for PreferenceVisitor {
        type Value = SloPreference;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("disabled, slo_first or best_effort")
        }

        fn visit_str<E: de::Error>(self, name: &str) -> Result<SloPreference, E> {
            name.parse().map_err(E::custom)
        }
    }

    deserializer.deserialize_str(PreferenceVisitor)
}

/// `ttft_ms`: a positive integer of milliseconds, or `live`.
fn ttft_estimate<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<SloEstimate<NonZeroU64>>, D::Error> {
    deserializer.deserialize_any(EstimateVisitor::<NonZeroU64> {
        expected: "a positive integer of milliseconds or live",
        from_f64: |_| None,
        from_u64: NonZeroU64::new,
    })
}

/// `tokens_per_second`: a finite number above 0, or `live`.
fn tps_estimate<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<SloEstimate<TokensPerSecond>>, D::Error> {
    deserializer.deserialize_any(EstimateVisitor::<TokensPerSecond> {
        expected: "a finite number of tokens per second above 0, or live",
        from_f64: TokensPerSecond::new,
        from_u64: |v| TokensPerSecond::new(v as f64),
    })
}

/// Reads a bucket's declared estimate: a number its kind accepts, `live`, or null (absent).
struct EstimateVisitor<T> {
    expected: &'static str,
    from_f64: fn(f64) -> Option<T>,
    from_u64: fn(u64) -> Option<T>,
}

impl<T> EstimateVisitor<T> {
    fn refuse<E: de::Error>(&self, got: impl fmt::Display) -> E {
        E::custom(format_args!("must be {}, got {got}", self.expected))
    }
}

impl<'de, T> Visitor<'de> for EstimateVisitor<T> {
    type Value = Option<SloEstimate<T>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.expected)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        (self.from_u64)(v).map(|v| Some(SloEstimate::Declared(v))).ok_or_else(|| self.refuse(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        match u64::try_from(v) {
            Ok(v) => self.visit_u64(v),
            Err(_) => Err(self.refuse(v)),
        }
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        (self.from_f64)(v).map(|v| Some(SloEstimate::Declared(v))).ok_or_else(|| self.refuse(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        if v == "live" {
            Ok(Some(SloEstimate::Live))
        } else {
            Err(self.refuse(format_args!("{v:?}")))
        }
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}
