//! The shared state handles a policy is constructed with.
//!
//! Application wiring starts the shared services once and hands clones of these `Arc`s to every
//! policy; a policy never creates its own subscription, table or counter.

use std::fmt;
use std::sync::Arc;

use router_affinity::{AffinityConfig, AffinityStore};
use router_state_kv::{KvIndex, Predictions};
use router_state_load::{EngineReportedLoadTable, Inflight, PrefillRates};

use crate::CacheSources;

/// The load state: the engine-reported load table, the router-local in-flight accounting and
/// the prefill rates learned from observed first tokens.
#[derive(Clone)]
pub struct LoadHandles {
    /// Engine reports, read through a snapshot once per pick.
    pub table: Arc<EngineReportedLoadTable>,
    /// Router-local in-flight requests and the recent-dispatch ledger.
    pub inflight: Arc<Inflight>,
    /// Prefill rates learned per engine (the dispatcher feeds them).
    pub rates: Arc<PrefillRates>,
}

impl LoadHandles {
    /// Bundles the application's shared load table and in-flight accounting, with no rates
    /// learned yet.
    pub fn new(table: Arc<EngineReportedLoadTable>, inflight: Arc<Inflight>) -> Self {
        Self { table, inflight, rates: Arc::new(PrefillRates::new()) }
    }
}

impl fmt::Debug for LoadHandles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadHandles").finish_non_exhaustive()
    }
}

/// Every shared handle policy construction may need. Grows as policies that read other state
/// (the KV prefix index, the affinity store) are added; build it with [`PolicyHandles::new`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PolicyHandles {
    /// Load reports and in-flight accounting.
    pub load: LoadHandles,
    /// Session bindings, for `session_aware` policies.
    pub sessions: Arc<AffinityStore>,
    /// Routing-key bindings, for `sticky` policies. Never the same store as `sessions`: a
    /// scope has no policy-kind part, so a session id equal to a routing key would share a
    /// binding, and the two idle timeouts are configured separately.
    pub routing_keys: Arc<AffinityStore>,
    /// Prefix sources for `cache_aware` policies: the local KV index (set with
    /// [`Self::with_kv`]) and the shared remote-indexer clients, created on demand.
    pub cache: CacheSources,
}

impl PolicyHandles {
    /// Handles with the application's load state, and a session store and a routing-key store
    /// with the default affinity configuration. Replace those with [`Self::with_affinity`] to
    /// set their idle timeouts; either way the owner drives their sweepers and registry
    /// followers (`router_affinity::run_sweeper`, `router_affinity::follow_registry`).
    pub fn new(load: LoadHandles) -> Self {
        let store = || {
            Arc::new(
                AffinityStore::new(AffinityConfig::default())
                    .expect("the default affinity configuration is valid"),
            )
        };
        Self { load, sessions: store(), routing_keys: store(), cache: CacheSources::new() }
    }

    /// These handles with the given session and routing-key stores (one pair per model, each
    /// with the model's idle timeout).
    pub fn with_affinity(
        mut self,
        sessions: Arc<AffinityStore>,
        routing_keys: Arc<AffinityStore>,
    ) -> Self {
        self.sessions = sessions;
        self.routing_keys = routing_keys;
        self
    }

    /// These handles with the application's local KV prefix index, which `cache_aware`
    /// policies with the `radix_tree` provider read (all of them through one shared
    /// [`crate::CacheSource`]). Without it such policies cannot be built. The remote sources
    /// are kept.
    pub fn with_kv(mut self, index: Arc<KvIndex>) -> Self {
        self.cache = self.cache.with_local(index);
        self
    }

    /// These handles with the router's predicted entries laid over remote-indexer answers
    /// too (the local source reads its index's own). Call before building policies.
    pub fn with_predictions(mut self, predictions: Arc<Predictions>) -> Self {
        self.cache = self.cache.with_predictions(predictions);
        self
    }
}
