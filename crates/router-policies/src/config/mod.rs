//! Policy configuration (`policy: {type, admission, ...tuning}`) and construction.
//!
//! Deserialization rejects, each with the path of the offending field: unknown fields, settings
//! that do not apply to the policy type (`policy.min_load_choices` on `round_robin`), invalid
//! values, and the dropped policy names and options of docs/design/POLICY_DESIGN.md §7 (with
//! what replaces them). Defaults are those of docs/design/POLICY_REFERENCE.md.
//!
//! Construction ([`PolicyConfig::build`]) receives the application's shared state handles;
//! policies never create their own subscriptions.

use std::fmt;
use std::sync::Arc;

use router_workers::Stage;
use serde::{Deserialize, Serialize};

use router_state_kv::remote::{ClientConfig, RemoteIndexClient};

use crate::{
    AdmissionCheck, AdmissionLimits, BindingScope, CacheAwarePolicy, CacheSource,
    DEFAULT_RENDEZVOUS_LOAD_FACTOR, DEFAULT_RENDEZVOUS_LOAD_FLOOR, EngineAdmission,
    LeastLoadPolicy, NewBinding, Policy, PolicyHandles, PowerOfTwoPolicy, PredictedTtftPolicy,
    RandomPolicy, RendezvousLoad, RoundRobinPolicy, SessionAwarePolicy, StickyPolicy,
};

/// Why a policy configuration was refused. Fields are named by their path from `policy`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `policy.type` is absent.
    #[error("policy.type is required (one of {})", PolicyType::names())]
    MissingType,
    /// `policy.type` names no policy.
    #[error("policy.type: unknown policy type {name:?} (expected one of {})", PolicyType::names())]
    UnknownType {
        /// The name given.
        name: String,
    },
    /// `policy.type` names a policy that was removed.
    #[error("policy.type: policy type {name:?} was removed; {replacement}")]
    RemovedType {
        /// The name given.
        name: String,
        /// What replaces it.
        replacement: &'static str,
    },
    /// A field no policy takes.
    #[error("unknown field {field}")]
    UnknownField {
        /// Its path.
        field: String,
    },
    /// A field that was removed with a dropped option.
    #[error("{field} was removed; {replacement}")]
    RemovedField {
        /// Its path.
        field: String,
        /// What replaces it.
        replacement: &'static str,
    },
    /// A field given twice.
    #[error("duplicate field {field}")]
    DuplicateField {
        /// Its path.
        field: String,
    },
    /// A setting of another policy type.
    #[error("{field} does not apply to policy type {policy}")]
    NotApplicable {
        /// Its path.
        field: String,
        /// The configured type.
        policy: PolicyType,
    },
    /// A value out of range or an incompatible combination.
    #[error("{field}: {reason}")]
    InvalidValue {
        /// Its path.
        field: String,
        /// What is wrong, naming the value.
        reason: String,
    },
    /// A valid configuration of a policy this build cannot construct yet.
    #[error("policy type {policy} is not available yet")]
    NotAvailable {
        /// The configured type.
        policy: PolicyType,
    },
    /// The policy needs shared state the application did not provide.
    #[error("policy type {policy} needs {state}, which the router does not provide")]
    MissingState {
        /// The configured type.
        policy: PolicyType,
        /// What is missing.
        state: &'static str,
    },
}

/// The policy types, by their configuration names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyType {
    /// `round_robin`
    RoundRobin,
    /// `random`
    Random,
    /// `power_of_two`
    PowerOfTwo,
    /// `load_based` (least-load)
    LoadBased,
    /// `session_aware`
    SessionAware,
    /// `sticky`
    Sticky,
    /// `cache_aware`
    CacheAware,
    /// `predicted_ttft`
    PredictedTtft,
}

impl PolicyType {
    /// Every type, in documentation order.
    pub const ALL: [PolicyType; 8] = [
        PolicyType::RoundRobin,
        PolicyType::Random,
        PolicyType::PowerOfTwo,
        PolicyType::LoadBased,
        PolicyType::SessionAware,
        PolicyType::Sticky,
        PolicyType::CacheAware,
        PolicyType::PredictedTtft,
    ];

    /// The configuration name.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyType::RoundRobin => "round_robin",
            PolicyType::Random => "random",
            PolicyType::PowerOfTwo => "power_of_two",
            PolicyType::LoadBased => "load_based",
            PolicyType::SessionAware => "session_aware",
            PolicyType::Sticky => "sticky",
            PolicyType::CacheAware => "cache_aware",
            PolicyType::PredictedTtft => "predicted_ttft",
        }
    }

    /// The type with configuration name `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == name)
    }

    /// Whether a group of `stage` may use this type: prefix-aware selection (`cache_aware`,
    /// `predicted_ttft`) is meaningless for decode engines.
    pub fn supports_stage(self, stage: Stage) -> bool {
        !(self.reads_prefixes() && stage == Stage::Decode)
    }

    /// Whether this type reads a prefix source (the KV index or a remote indexer).
    pub fn reads_prefixes(self) -> bool {
        matches!(self, PolicyType::CacheAware | PolicyType::PredictedTtft)
    }

    pub(crate) fn names() -> String {
        Self::ALL.map(PolicyType::as_str).join(", ")
    }
}

impl fmt::Display for PolicyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What replaces a removed policy type, for configuration files and the quick-start flags
/// (`--policy`, `--prefill-policy`, `--decode-policy`).
pub fn removed_policy_type(name: &str) -> Option<&'static str> {
    Some(match name {
        "fused_score" | "score_policy" => {
            "use cache_aware for prefix-and-load selection, or power_of_two or load_based for \
             load only; fused score terms and weights have no replacement"
        }
        "legacy_host_affinity" => {
            "decode engines are chosen by their own group's policy within the same bucket as \
             the prefill engine; use power_of_two"
        }
        "bucket" => {
            "length buckets are configured under models[].buckets, each group with a policy"
        }
        "consistent_hashing" | "manual" => "use sticky (routing-key bindings)",
        "prefix_hash" => "use cache_aware",
        _ => return None,
    })
}

/// What replaces a removed policy option, for configuration files and the quick-start flags
/// (spelled with underscores: `stable_pair` for `--stable-pair`).
pub fn removed_setting(name: &str) -> Option<&'static str> {
    Some(match name {
        "fuse" | "fuse_terms" | "fuse_weights" => {
            "fused scoring was removed with fused_score; use cache_aware"
        }
        "stable_pair" => {
            "a prefill/decode pair always comes from one bucket; there is no pairing option"
        }
        "affinity_mode" => {
            "only admitted-binding reuse remains (session_aware, sticky); soft mode was removed"
        }
        "filter" => {
            "`overloaded` is admission.max_inflight_requests; `prefix_cache` has no replacement \
             (the cache-aware minimum-hit gate is not equivalent)"
        }
        "prefix_cache_min_share" => {
            "no replacement; cache_affinity_min_matched_tokens and \
             cache_affinity_min_matched_ratio gate cache hits and are not equivalent"
        }
        "max_in_flight" => "use admission.max_inflight_requests",
        _ => return None,
    })
}

/// Where cache-aware selection looks prefixes up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CachePrefixProvider {
    /// The local index fed by KV events.
    #[default]
    RadixTree,
    /// A remote indexer.
    Indexer,
}

/// How `cache_aware` (its power-of-k fallback on a miss) and `predicted_ttft` (its near ties)
/// draw: `tie_break`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TieBreak {
    /// From the thread's generator (the default): two replicas draw differently for one
    /// request.
    #[default]
    Sampled,
    /// From a generator seeded by the request (its session key, else its routing key, else
    /// its first prompt tokens): replicas running one router build draw alike for one request,
    /// and different requests still spread.
    Request,
}

/// The policy a sticky policy runs for new or missing keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StickyFallback {
    /// Round-robin (the default).
    #[default]
    RoundRobin,
    /// Random.
    Random,
    /// Power-of-two.
    PowerOfTwo,
    /// Least-load.
    LoadBased,
}

impl StickyFallback {
    /// Builds the fallback with `AdmissionLimits::default()`: the owning policy checks the
    /// engine its fallback returns.
    pub fn build(self, handles: &PolicyHandles) -> Arc<dyn Policy> {
        let load = handles.load.clone();
        match self {
            StickyFallback::RoundRobin => Arc::new(RoundRobinPolicy::new()),
            StickyFallback::Random => Arc::new(RandomPolicy::new()),
            StickyFallback::PowerOfTwo => Arc::new(PowerOfTwoPolicy::new(load)),
            StickyFallback::LoadBased => Arc::new(LeastLoadPolicy::new(load)),
        }
    }
}

/// `sticky` tuning.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StickySettings {
    /// `fallback`: the policy for new or missing routing keys (and keyless requests).
    pub fallback: StickyFallback,
    /// `scope`: one binding per bucket (the default) or for the whole model.
    pub scope: BindingScope,
    /// `new_binding` and `rendezvous_load_factor`: how new keys are placed.
    pub placement: NewBindingSettings,
}

/// `session_aware` tuning.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SessionAwareSettings {
    /// `scope`: one binding per bucket (the default) or for the whole model.
    pub scope: BindingScope,
    /// `new_binding` and `rendezvous_load_factor`: how new sessions are placed.
    pub placement: NewBindingSettings,
}

/// How `session_aware` and `sticky` place a key without a usable binding.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NewBindingSettings {
    /// `new_binding`: the fallback (the default: power-of-two for `session_aware`, the
    /// configured `fallback` for `sticky`) or `rendezvous`.
    pub new_binding: NewBinding,
    /// `rendezvous_load_factor` (with `rendezvous` only): a new key walks past an engine whose
    /// router-local in-flight count, the new request included, would exceed this factor times
    /// the candidates' mean; at least 1.
    pub rendezvous_load_factor: f64,
    /// `rendezvous_load_floor` (with `rendezvous` only): an engine with fewer router-local
    /// in-flight requests than this, the new one included, is never over the bound.
    pub rendezvous_load_floor: u64,
}

impl Default for NewBindingSettings {
    fn default() -> Self {
        Self {
            new_binding: NewBinding::Fallback,
            rendezvous_load_factor: DEFAULT_RENDEZVOUS_LOAD_FACTOR,
            rendezvous_load_floor: DEFAULT_RENDEZVOUS_LOAD_FLOOR,
        }
    }
}

impl NewBindingSettings {
    /// Checks the load factor.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let factor = self.rendezvous_load_factor;
        if !(factor >= 1.0 && factor.is_finite()) {
            return Err(invalid(
                "rendezvous_load_factor",
                format!("must be a finite number of at least 1, got {factor}"),
            ));
        }
        Ok(())
    }

    /// The rendezvous load bound, when new keys are placed by rendezvous hashing.
    fn rendezvous(&self) -> Option<RendezvousLoad> {
        match self.new_binding {
            NewBinding::Rendezvous => Some(RendezvousLoad {
                factor: self.rendezvous_load_factor,
                floor: self.rendezvous_load_floor,
            }),
            NewBinding::Fallback => None,
        }
    }
}

/// `cache_aware` tuning, with the defaults of docs/design/POLICY_REFERENCE.md.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheAwareSettings {
    /// Local index or remote indexer.
    pub cache_prefix_provider: CachePrefixProvider,
    /// A hit needs at least this many matched tokens.
    pub cache_affinity_min_matched_tokens: u64,
    /// A hit needs matched / input at least this (0..=1), when set.
    pub cache_affinity_min_matched_ratio: Option<f64>,
    /// Candidate bound: at least this many (when available).
    pub cache_candidate_min_workers: usize,
    /// Candidate bound: ceil(ratio x group size).
    pub cache_candidate_ratio: f64,
    /// Candidate bound: at most this many.
    pub cache_candidate_max_workers: usize,
    /// Within this many uncached tokens of the best holder, pressure may decide.
    pub cache_switch_margin_tokens: u64,
    /// Soft queue gate: engines with more waiting requests are deprioritised.
    pub worker_queue_limit: Option<u64>,
    /// Saturation pinning floor; at most `worker_queue_limit`.
    pub saturation_queue_floor: Option<u64>,
    /// Pressure guard, waiting-uncached-token form: absolute gap.
    pub pressure_abs_threshold_tokens: u64,
    /// Pressure guard: relative gap, above 1.
    pub pressure_rel_threshold: f64,
    /// Pressure guard, queue-time form: absolute gap in ms, when set.
    pub pressure_abs_threshold_ms: Option<f64>,
    /// k of the power-of-k load fallback on a miss.
    pub min_load_choices: usize,
    /// How the power-of-k fallback draws.
    pub tie_break: TieBreak,
    /// Remote indexer address(es), for the `indexer` provider.
    pub kv_indexer_endpoint: Vec<String>,
    /// Remote lookup timeout in ms.
    pub kv_indexer_query_timeout_ms: u64,
    /// Concurrent remote lookups.
    pub kv_indexer_query_max_inflight: usize,
}

impl Default for CacheAwareSettings {
    fn default() -> Self {
        Self {
            cache_prefix_provider: CachePrefixProvider::RadixTree,
            cache_affinity_min_matched_tokens: 1024,
            cache_affinity_min_matched_ratio: None,
            cache_candidate_min_workers: 8,
            cache_candidate_ratio: 0.05,
            cache_candidate_max_workers: 32,
            cache_switch_margin_tokens: 1024,
            worker_queue_limit: None,
            saturation_queue_floor: None,
            pressure_abs_threshold_tokens: 1024,
            pressure_rel_threshold: 1.5,
            pressure_abs_threshold_ms: None,
            min_load_choices: 2,
            tie_break: TieBreak::Sampled,
            kv_indexer_endpoint: Vec::new(),
            kv_indexer_query_timeout_ms: 100,
            kv_indexer_query_max_inflight: 32,
        }
    }
}

fn invalid(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::InvalidValue { field: format!("policy.{field}"), reason: reason.into() }
}

impl CacheAwareSettings {
    /// The remote-indexer client configuration these settings describe (meaningful for the
    /// `indexer` provider).
    pub fn indexer_client(&self) -> ClientConfig {
        ClientConfig {
            endpoints: self.kv_indexer_endpoint.clone(),
            query_timeout: std::time::Duration::from_millis(self.kv_indexer_query_timeout_ms),
            max_inflight: self.kv_indexer_query_max_inflight,
        }
    }

    /// Checks ranges and combinations.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(ratio) = self.cache_affinity_min_matched_ratio
            && !(0.0..=1.0).contains(&ratio)
        {
            return Err(invalid(
                "cache_affinity_min_matched_ratio",
                format!("must be between 0 and 1, got {ratio}"),
            ));
        }
        if !(0.0..=1.0).contains(&self.cache_candidate_ratio) {
            return Err(invalid(
                "cache_candidate_ratio",
                format!("must be between 0 and 1, got {}", self.cache_candidate_ratio),
            ));
        }
        if self.cache_candidate_max_workers == 0 {
            return Err(invalid("cache_candidate_max_workers", "must be at least 1, got 0"));
        }
        if self.cache_candidate_min_workers > self.cache_candidate_max_workers {
            return Err(invalid(
                "cache_candidate_min_workers",
                format!(
                    "{} exceeds cache_candidate_max_workers {}",
                    self.cache_candidate_min_workers, self.cache_candidate_max_workers
                ),
            ));
        }
        match (self.saturation_queue_floor, self.worker_queue_limit) {
            (Some(floor), None) => {
                return Err(invalid(
                    "saturation_queue_floor",
                    format!("{floor} needs worker_queue_limit to be set"),
                ));
            }
            (Some(floor), Some(limit)) if floor > limit => {
                return Err(invalid(
                    "saturation_queue_floor",
                    format!("{floor} exceeds worker_queue_limit {limit}"),
                ));
            }
            _ => {}
        }
        // NaN fails this comparison too.
        if !(self.pressure_rel_threshold > 1.0 && self.pressure_rel_threshold.is_finite()) {
            return Err(invalid(
                "pressure_rel_threshold",
                format!("must be a finite number above 1, got {}", self.pressure_rel_threshold),
            ));
        }
        if let Some(ms) = self.pressure_abs_threshold_ms
            && !(ms >= 0.0 && ms.is_finite())
        {
            return Err(invalid(
                "pressure_abs_threshold_ms",
                format!("must be a finite number of at least 0, got {ms}"),
            ));
        }
        if self.min_load_choices == 0 {
            return Err(invalid("min_load_choices", "must be at least 1, got 0"));
        }
        match self.cache_prefix_provider {
            CachePrefixProvider::Indexer => {
                if self.kv_indexer_endpoint.is_empty() {
                    return Err(invalid(
                        "kv_indexer_endpoint",
                        "is required when cache_prefix_provider is indexer",
                    ));
                }
                if let Some(empty) = self.kv_indexer_endpoint.iter().find(|e| e.trim().is_empty()) {
                    return Err(invalid("kv_indexer_endpoint", format!("empty address {empty:?}")));
                }
                for endpoint in &self.kv_indexer_endpoint {
                    // Parses the address only; nothing connects.
                    let config = ClientConfig::new(vec![endpoint.clone()]);
                    if RemoteIndexClient::new(config).is_err() {
                        return Err(invalid(
                            "kv_indexer_endpoint",
                            format!("invalid address {endpoint:?}"),
                        ));
                    }
                }
            }
            CachePrefixProvider::RadixTree => {
                if !self.kv_indexer_endpoint.is_empty() {
                    return Err(invalid(
                        "kv_indexer_endpoint",
                        "applies only when cache_prefix_provider is indexer",
                    ));
                }
            }
        }
        if self.kv_indexer_query_timeout_ms == 0 {
            return Err(invalid("kv_indexer_query_timeout_ms", "must be at least 1, got 0"));
        }
        if self.kv_indexer_query_max_inflight == 0 {
            return Err(invalid("kv_indexer_query_max_inflight", "must be at least 1, got 0"));
        }
        Ok(())
    }
}

/// `predicted_ttft` tuning.
#[derive(Clone, Debug, PartialEq)]
pub struct PredictedTtftSettings {
    /// Local index or remote indexer.
    pub cache_prefix_provider: CachePrefixProvider,
    /// Remote indexer address(es), for the `indexer` provider.
    pub kv_indexer_endpoint: Vec<String>,
    /// Remote lookup timeout in ms.
    pub kv_indexer_query_timeout_ms: u64,
    /// Concurrent remote lookups.
    pub kv_indexer_query_max_inflight: usize,
    /// The prefill rate assumed while no candidate's reports give one, in uncached tokens per
    /// second (meanwhile an engine without an estimate of its own assumes the median of the
    /// other candidates').
    pub default_prefill_tokens_per_sec: f64,
    /// Whether an engine that reports no prefill rate gets the rate learned from its observed
    /// first tokens (before the median of the others' and the default).
    pub learn_rates: bool,
    /// Candidates ranked above the best by at most this fraction of the best's predicted TTFT
    /// (plus `near_tie_ms`) are near ties: the one with the least uncached work wins, equal
    /// ones by sampling.
    pub near_tie_ratio: f64,
    /// Absolute part of the near-tie margin, in milliseconds.
    pub near_tie_ms: f64,
    /// Weight of the recomputation a candidate would cause, added to its predicted time for
    /// ranking: uncached tokens delay every request queued behind this one there, not only
    /// this one. 0 ranks by predicted TTFT alone; the default 6 counts that work seven times.
    pub recompute_weight: f64,
    /// Weight of the delay a candidate's recomputation adds to each request there still
    /// waiting for its first token, added to its predicted time for ranking per such request:
    /// a long prompt sent where others wait makes all of them wait for it. 0 leaves it out.
    pub waiting_weight: f64,
    /// How near ties are ordered.
    pub tie_break: TieBreak,
}

impl Default for PredictedTtftSettings {
    fn default() -> Self {
        let cache = CacheAwareSettings::default();
        Self {
            cache_prefix_provider: cache.cache_prefix_provider,
            kv_indexer_endpoint: cache.kv_indexer_endpoint,
            kv_indexer_query_timeout_ms: cache.kv_indexer_query_timeout_ms,
            kv_indexer_query_max_inflight: cache.kv_indexer_query_max_inflight,
            default_prefill_tokens_per_sec: 10_000.0,
            learn_rates: true,
            near_tie_ratio: 0.05,
            near_tie_ms: 1.0,
            recompute_weight: 6.0,
            waiting_weight: 0.25,
            tie_break: TieBreak::Sampled,
        }
    }
}

impl PredictedTtftSettings {
    /// These settings' prefix-source fields, read from the cache-aware ones they share.
    pub(crate) fn with_source_of(mut self, cache: &CacheAwareSettings) -> Self {
        self.cache_prefix_provider = cache.cache_prefix_provider;
        self.kv_indexer_endpoint = cache.kv_indexer_endpoint.clone();
        self.kv_indexer_query_timeout_ms = cache.kv_indexer_query_timeout_ms;
        self.kv_indexer_query_max_inflight = cache.kv_indexer_query_max_inflight;
        self
    }

    /// The prefix-source part as cache-aware settings (the validation and client
    /// configuration they share).
    fn source_settings(&self) -> CacheAwareSettings {
        CacheAwareSettings {
            cache_prefix_provider: self.cache_prefix_provider,
            kv_indexer_endpoint: self.kv_indexer_endpoint.clone(),
            kv_indexer_query_timeout_ms: self.kv_indexer_query_timeout_ms,
            kv_indexer_query_max_inflight: self.kv_indexer_query_max_inflight,
            ..CacheAwareSettings::default()
        }
    }

    /// The remote-indexer client configuration (meaningful for the `indexer` provider).
    pub fn indexer_client(&self) -> ClientConfig {
        self.source_settings().indexer_client()
    }

    /// Checks ranges and combinations.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.source_settings().validate()?;
        let rate = self.default_prefill_tokens_per_sec;
        if !(rate.is_finite() && rate > 0.0) {
            return Err(invalid(
                "default_prefill_tokens_per_sec",
                format!("must be a finite number above 0, got {rate}"),
            ));
        }
        if !(0.0..=1.0).contains(&self.near_tie_ratio) {
            return Err(invalid(
                "near_tie_ratio",
                format!("must be between 0 and 1, got {}", self.near_tie_ratio),
            ));
        }
        if !(self.recompute_weight >= 0.0 && self.recompute_weight.is_finite()) {
            return Err(invalid(
                "recompute_weight",
                format!("must be a finite number of at least 0, got {}", self.recompute_weight),
            ));
        }
        if !(self.waiting_weight >= 0.0 && self.waiting_weight.is_finite()) {
            return Err(invalid(
                "waiting_weight",
                format!("must be a finite number of at least 0, got {}", self.waiting_weight),
            ));
        }
        if !(self.near_tie_ms >= 0.0 && self.near_tie_ms.is_finite()) {
            return Err(invalid(
                "near_tie_ms",
                format!("must be a finite number of at least 0, got {}", self.near_tie_ms),
            ));
        }
        Ok(())
    }
}

/// The prefix source a policy of type `policy` reads: the local index's for `radix_tree`, or
/// the shared source of the indexer configuration `client` for `indexer`.
fn prefix_source(
    handles: &PolicyHandles,
    policy: PolicyType,
    provider: CachePrefixProvider,
    client: &ClientConfig,
) -> Result<Arc<CacheSource>, ConfigError> {
    match provider {
        CachePrefixProvider::RadixTree => {
            handles.cache.local().map(Arc::clone).ok_or(ConfigError::MissingState {
                policy,
                state: "a local KV index (cache_prefix_provider: radix_tree)",
            })
        }
        CachePrefixProvider::Indexer => handles
            .cache
            .remote(client)
            .map_err(|error| invalid("kv_indexer_endpoint", error.to_string())),
    }
}

/// A policy type with its tuning.
#[derive(Clone, Debug, PartialEq)]
pub enum PolicySettings {
    /// `round_robin`
    RoundRobin,
    /// `random`
    Random,
    /// `power_of_two`
    PowerOfTwo,
    /// `load_based`
    LoadBased,
    /// `session_aware`
    SessionAware(SessionAwareSettings),
    /// `sticky`
    Sticky(StickySettings),
    /// `cache_aware`
    CacheAware(Box<CacheAwareSettings>),
    /// `predicted_ttft`
    PredictedTtft(Box<PredictedTtftSettings>),
}

impl PolicySettings {
    /// The type of this kind.
    pub fn policy_type(&self) -> PolicyType {
        match self {
            PolicySettings::RoundRobin => PolicyType::RoundRobin,
            PolicySettings::Random => PolicyType::Random,
            PolicySettings::PowerOfTwo => PolicyType::PowerOfTwo,
            PolicySettings::LoadBased => PolicyType::LoadBased,
            PolicySettings::SessionAware(_) => PolicyType::SessionAware,
            PolicySettings::Sticky(_) => PolicyType::Sticky,
            PolicySettings::CacheAware(_) => PolicyType::CacheAware,
            PolicySettings::PredictedTtft(_) => PolicyType::PredictedTtft,
        }
    }
}

/// One group's `policy` entry: the type with its tuning, and its admission caps.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyConfig {
    /// Type and tuning.
    pub kind: PolicySettings,
    /// Hard per-engine caps; the default admits everything.
    pub admission: AdmissionLimits,
}

impl PolicyConfig {
    /// `kind` with default admission.
    pub fn new(kind: PolicySettings) -> Self {
        Self { kind, admission: AdmissionLimits::default() }
    }

    /// The configured type.
    pub fn policy_type(&self) -> PolicyType {
        self.kind.policy_type()
    }

    /// Where this policy looks cached prefixes up: `Some` for the types that read them
    /// (`cache_aware`, `predicted_ttft`), `None` for the others.
    pub fn prefix_provider(&self) -> Option<CachePrefixProvider> {
        match &self.kind {
            PolicySettings::CacheAware(settings) => Some(settings.cache_prefix_provider),
            PolicySettings::PredictedTtft(settings) => Some(settings.cache_prefix_provider),
            _ => None,
        }
    }

    /// The prefix source this policy reads (see [`Self::build`]); `None` for the types that
    /// read none.
    pub(crate) fn prefix_source(
        &self,
        handles: &PolicyHandles,
    ) -> Result<Option<Arc<CacheSource>>, ConfigError> {
        let (policy, provider, client) = match &self.kind {
            PolicySettings::CacheAware(s) => {
                (PolicyType::CacheAware, s.cache_prefix_provider, s.indexer_client())
            }
            PolicySettings::PredictedTtft(s) => {
                (PolicyType::PredictedTtft, s.cache_prefix_provider, s.indexer_client())
            }
            _ => return Ok(None),
        };
        prefix_source(handles, policy, provider, &client).map(Some)
    }

    /// Checks ranges and combinations (deserialization already did).
    pub fn validate(&self) -> Result<(), ConfigError> {
        match &self.kind {
            PolicySettings::CacheAware(settings) => settings.validate(),
            PolicySettings::PredictedTtft(settings) => settings.validate(),
            PolicySettings::SessionAware(settings) => settings.placement.validate(),
            PolicySettings::Sticky(settings) => settings.placement.validate(),
            _ => Ok(()),
        }
    }

    /// Constructs the policy over the application's shared state.
    ///
    /// `session_aware` binds in `handles.sessions` and `sticky` in `handles.routing_keys`.
    /// `cache_aware` and `predicted_ttft` read `handles.cache`: the local index's source for
    /// the `radix_tree` provider (missing: [`ConfigError::MissingState`]), or the shared source
    /// of their indexer configuration for `indexer` (every policy with the same endpoints,
    /// timeout and in-flight limit shares one client).
    pub fn build(&self, handles: &PolicyHandles) -> Result<Arc<dyn Policy>, ConfigError> {
        self.validate()?;
        let admission: Option<Arc<dyn EngineAdmission>> =
            if self.admission.is_unlimited() { None } else { Some(Arc::new(self.admission)) };
        let load = handles.load.clone();
        let checked =
            |admission: Arc<dyn EngineAdmission>| AdmissionCheck::new(admission, load.clone());
        Ok(match &self.kind {
            PolicySettings::RoundRobin => match admission {
                None => Arc::new(RoundRobinPolicy::new()),
                Some(a) => Arc::new(RoundRobinPolicy::new().with_admission(checked(a))),
            },
            PolicySettings::Random => match admission {
                None => Arc::new(RandomPolicy::new()),
                Some(a) => Arc::new(RandomPolicy::new().with_admission(checked(a))),
            },
            PolicySettings::PowerOfTwo => match admission {
                None => Arc::new(PowerOfTwoPolicy::new(load)),
                Some(a) => Arc::new(PowerOfTwoPolicy::new(load).with_admission(a)),
            },
            PolicySettings::LoadBased => match admission {
                None => Arc::new(LeastLoadPolicy::new(load)),
                Some(a) => Arc::new(LeastLoadPolicy::new(load).with_admission(a)),
            },
            PolicySettings::SessionAware(settings) => {
                let mut policy = SessionAwarePolicy::new(Arc::clone(&handles.sessions), load)
                    .with_scope(settings.scope);
                if let Some(factor) = settings.placement.rendezvous() {
                    policy = policy.with_rendezvous(factor);
                }
                match admission {
                    None => Arc::new(policy),
                    Some(a) => Arc::new(policy.with_admission(a)),
                }
            }
            PolicySettings::Sticky(settings) => {
                let fallback = settings.fallback.build(handles);
                let mut policy = StickyPolicy::new(Arc::clone(&handles.routing_keys), fallback)
                    .with_scope(settings.scope);
                if let Some(factor) = settings.placement.rendezvous() {
                    policy = policy.with_rendezvous(load.clone(), factor);
                }
                match admission {
                    None => Arc::new(policy),
                    Some(a) => Arc::new(policy.with_admission(checked(a))),
                }
            }
            PolicySettings::CacheAware(settings) => {
                let source = prefix_source(
                    handles,
                    PolicyType::CacheAware,
                    settings.cache_prefix_provider,
                    &settings.indexer_client(),
                )?;
                let policy = CacheAwarePolicy::new(source, load, (**settings).clone())?;
                match admission {
                    None => Arc::new(policy),
                    Some(a) => Arc::new(policy.with_admission(a)),
                }
            }
            PolicySettings::PredictedTtft(settings) => {
                let source = prefix_source(
                    handles,
                    PolicyType::PredictedTtft,
                    settings.cache_prefix_provider,
                    &settings.indexer_client(),
                )?;
                let policy = PredictedTtftPolicy::new(source, load, (**settings).clone())?;
                match admission {
                    None => Arc::new(policy),
                    Some(a) => Arc::new(policy.with_admission(a)),
                }
            }
        })
    }
}

mod read;
#[cfg(test)]
mod tests;
