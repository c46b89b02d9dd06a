//! Engine selection policies and admission.
//!
//! Owns the `Policy` contract (`PickRequest`, `Pick`, `PickError`), admission
//! (`AdmissionLimits`, `EngineAdmission`), the concrete policies and their construction from
//! configuration, and the cache-source adapter with its per-request memo.
//!
//! The load policies built so far:
//! - [`RoundRobinPolicy`] (`round_robin`): one cursor per instance;
//! - [`RandomPolicy`] (`random`): one uniform draw;
//! - [`PowerOfTwoPolicy`] (`power_of_two`): two distinct uniform samples, the stage's pressure
//!   comparison ([`pressure`]), admission once on the winner;
//! - [`LeastLoadPolicy`] (`load_based`): the exact minimum with the recent-dispatch correction;
//! - [`min_load_choices`]: the power-of-k helper the cache-aware fallback reuses.
//!
//! The affinity policies, over the shared stores of router-affinity (rules in `affinity.rs`):
//! - [`SessionAwarePolicy`] (`session_aware`): reuses an admitted session binding regardless
//!   of pressure; power-of-two for new, keyless or out-of-group sessions;
//! - [`StickyPolicy`] (`sticky`): the same rules for routing keys, with the configured
//!   fallback ([`StickyFallback`]).
//!
//! Both bind per bucket by default, or for the whole model with `scope: model`
//! ([`BindingScope`]), and place new keys by their fallback or, with `new_binding: rendezvous`
//! ([`NewBinding`]), by seedless rendezvous hashing with bounded loads ([`rendezvous_choice`]),
//! so that router replicas sharing nothing agree.
//!
//! Cache-aware selection ([`CacheAwarePolicy`], `cache_aware`) reads prefixes through a
//! [`CacheSource`] (the local index or a remote indexer) once per prepared request
//! ([`PrefixMemo`], carried by [`RequestTokens`]), and falls back to power-of-k on a miss.
//!
//! Predicted-TTFT selection ([`PredictedTtftPolicy`], `predicted_ttft`) reads the same sources
//! and the load state, and picks the candidate with the lowest predicted time to first token.
//! Its cost model (`ttft_model.rs`) also gives buckets their live SLO estimates
//! ([`LiveEstimator`]), with the decode speed of one request from the load reports.
//!
//! A picked engine with data-parallel ranks routed by the router (`dp_route`) gets its rank
//! from [`choose_rank`], the same cost model one level down.
//!
//! Construction from configuration is [`PolicyConfig::build`], which takes the shared state
//! handles ([`PolicyHandles`]); policies never create their own subscriptions.
//!
//! Does not own: bucket resolution (router-buckets), shared state ingestion (the state crates),
//! or dispatch (router-server).

pub mod admission;
mod affinity;
mod cache;
pub mod config;
mod contract;
mod handles;
mod least_load;
mod live;
mod power_of_two;
mod predicted_ttft;
pub mod pressure;
mod random;
mod ranks;
mod rendezvous;
mod round_robin;
mod sampler;
mod session_aware;
mod sticky;
mod ttft_model;

pub use admission::{
    AdmissionCheck, AdmissionLimits, EngineAdmission, EngineObservation, Limit, Rejection,
};
pub use affinity::{BindingScope, KeySource, MAX_BIND_ATTEMPTS, NewBinding};
pub use cache::{
    BlockSize, CacheAwarePolicy, CacheSource, CacheSources, CachedPrefix, CachedPrefixes,
    LookupError, MATCHED_TOKEN_BOUNDS, MatchedTokens, PrefixMemo, PrefixOutcome, SourceStats,
    Unavailable,
};
pub use config::{
    CacheAwareSettings, CachePrefixProvider, ConfigError, NewBindingSettings, PolicyConfig,
    PolicySettings, PolicyType, PredictedTtftSettings, SessionAwareSettings, StickyFallback,
    StickySettings, TieBreak, removed_policy_type, removed_setting,
};
pub use contract::{
    HeldPrefix, Pick, PickError, PickReason, PickRequest, Policy, RequestTokens, SyncPolicy,
};
pub use handles::{LoadHandles, PolicyHandles};
pub use least_load::LeastLoadPolicy;
pub use live::LiveEstimator;
pub use power_of_two::{LoadChoice, PowerOfTwoPolicy, min_load_choices};
pub use predicted_ttft::PredictedTtftPolicy;
pub use random::RandomPolicy;
pub use ranks::{RankChoice, RankReason, choose_rank};
pub use rendezvous::{
    DEFAULT_RENDEZVOUS_LOAD_FACTOR, DEFAULT_RENDEZVOUS_LOAD_FLOOR, RendezvousLoad,
    rendezvous_choice, rendezvous_load_bound, rendezvous_order, rendezvous_weight,
};
pub use round_robin::RoundRobinPolicy;
/// The reason a key cannot name a binding, carried by [`PickError::InvalidKey`].
pub use router_affinity::ScopeError;
pub use session_aware::SessionAwarePolicy;
pub use sticky::StickyPolicy;

#[cfg(test)]
pub(crate) mod tests;
