//! `cache_aware` tuning and its checks.

use router_state_kv::remote::{ClientConfig, RemoteIndexClient};

use super::{CachePrefixProvider, ConfigError, TieBreak, invalid};

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
