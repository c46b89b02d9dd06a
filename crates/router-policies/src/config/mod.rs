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

use router_state_kv::remote::ClientConfig;

mod affinity;
mod cache_aware;
mod predicted_ttft;

pub use affinity::{NewBindingSettings, SessionAwareSettings, StickyFallback, StickySettings};
pub use cache_aware::CacheAwareSettings;
pub use predicted_ttft::PredictedTtftSettings;

use crate::{
    AdmissionCheck, AdmissionLimits, CacheAwarePolicy, CacheSource, LeastLoadPolicy, Policy,
    PolicyHandles, PowerOfTwoPolicy, PredictedTtftPolicy, RandomPolicy, RoundRobinPolicy,
    SessionAwarePolicy, StickyPolicy,
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

/// A setting's problem, named by its path from `policy`.
pub(super) fn invalid(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::InvalidValue { field: format!("policy.{field}"), reason: reason.into() }
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
        let load = handles.load.clone();
        let admission = (!self.admission.is_unlimited())
            .then(|| AdmissionCheck::new(Arc::new(self.admission), load.clone()));
        Ok(match &self.kind {
            PolicySettings::RoundRobin => match admission {
                None => Arc::new(RoundRobinPolicy::new()),
                Some(a) => Arc::new(RoundRobinPolicy::new().with_admission(a)),
            },
            PolicySettings::Random => match admission {
                None => Arc::new(RandomPolicy::new()),
                Some(a) => Arc::new(RandomPolicy::new().with_admission(a)),
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
                    policy = policy.with_rendezvous(load, factor);
                }
                match admission {
                    None => Arc::new(policy),
                    Some(a) => Arc::new(policy.with_admission(a)),
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
