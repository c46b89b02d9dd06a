//! `predicted_ttft` tuning and its checks.

use router_state_kv::remote::ClientConfig;

use super::{CacheAwareSettings, CachePrefixProvider, ConfigError, TieBreak, invalid};

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
    pub(super) fn source_settings(&self) -> CacheAwareSettings {
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
