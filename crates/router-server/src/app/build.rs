//! Building the [`AppContext`] from a configuration: every routing object, the registry
//! with its workers, the shared state and its settings. Nothing starts here.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use http::HeaderName;
use parking_lot::Mutex;
use router_engine_client::{ForwardConfig, Forwarder};
use router_policies::{LoadHandles, PolicyHandles};
use router_state_kv::{KvIndex, KvSubscriptions, Predictions};
use router_state_load::{Clock, EngineReportedLoadTable, Inflight, SystemClock};
use router_workers::WorkerRegistry;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::auth::Credentials;
use crate::health::HealthBook;
use crate::limit::Admission;
use crate::retry::RetryBudget;
use router_config::{ConfigFile, Problem, build_discovery, build_models, keeps_local_index};

use super::AppContext;

impl AppContext {
    /// Builds every routing object from `config` and registers its workers. Starts nothing.
    pub fn build(config: &ConfigFile) -> Result<Self, Vec<Problem>> {
        let registry = Arc::new(WorkerRegistry::new());
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let load_table =
            Arc::new(EngineReportedLoadTable::new(load_settings(config), Arc::clone(&clock)));
        let inflight = Arc::new(Inflight::new(clock));
        let predictions = config.kv.predictions().map(|c| Arc::new(Predictions::new(c)));
        let kv_index = keeps_local_index(config).then(|| {
            let mut kv_index = KvIndex::new(config.kv_index());
            if let Some(predictions) = &predictions {
                kv_index = kv_index.with_predictions(Arc::clone(predictions));
            }
            Arc::new(kv_index)
        });
        // One load state for the policies and the dispatcher that feeds it (in flight, rates).
        let load = LoadHandles::new(load_table, inflight);
        let mut handles = PolicyHandles::new(load.clone());
        if let Some(kv_index) = &kv_index {
            handles = handles.with_kv(Arc::clone(kv_index));
        }
        if let Some(predictions) = &predictions {
            handles = handles.with_predictions(Arc::clone(predictions));
        }
        let kv = kv_index.as_ref().map(|kv_index| {
            KvSubscriptions::new(
                Arc::clone(kv_index),
                Arc::clone(&registry),
                config.kv.subscriptions(),
            )
        });
        let credentials = Credentials::resolve(&config.server).map_err(|err| {
            vec![Problem { path: err.variable.to_owned(), message: err.reason.to_owned() }]
        })?;
        let runtimes =
            build_models(config, &registry, &handles, credentials.engine_default.as_ref());
        let discovery = build_discovery(config, credentials.engine_default.as_ref());
        let (runtimes, discovery) = match (runtimes, discovery) {
            (Ok(runtimes), Ok(discovery)) => (runtimes, discovery),
            (runtimes, discovery) => {
                let mut problems = runtimes.err().unwrap_or_default();
                problems.extend(discovery.err().unwrap_or_default());
                return Err(problems);
            }
        };
        let discovery =
            discovery.map(|config| router_discovery::Discovery::new(config, Arc::clone(&registry)));
        let discovery_state = discovery.as_ref().map(router_discovery::Discovery::state);
        let wildcard = runtimes
            .iter()
            .find(|m| m.id.as_str() == router_config::ANY_MODEL)
            .map(|m| m.id.clone());
        let models = runtimes.into_iter().map(|m| (m.id.clone(), m)).collect();
        let engine_problem = |path: &str, err: &dyn std::fmt::Display| {
            vec![Problem { path: path.to_owned(), message: err.to_string() }]
        };
        let tls = router_engine_client::tls::engine_client_config(
            config.server.engine_ca_file.as_deref(),
        )
        .map_err(|err| engine_problem("server.engine_ca_file", &err))?;
        let forwarder = Forwarder::new(ForwardConfig {
            http2: config.server.upstream_http2,
            request_timeout: Duration::from_secs(config.server.request_timeout_secs),
            tls: Some(Arc::clone(&tls)),
            ..ForwardConfig::default()
        })
        .map_err(|err| engine_problem("server.engine_ca_file", &err))?;
        Ok(Self {
            // Validated with the configuration: every name is a lowercase header name.
            request_id_headers: (config.server.request_id_headers.iter())
                .filter_map(|name| HeaderName::from_lowercase(name.as_bytes()).ok())
                .collect(),
            server: config.server.clone(),
            load_report_interval: Duration::from_millis(config.load.report_interval_ms),
            health: Arc::new(HealthBook::new(Arc::clone(&registry), config.health.clone())),
            registry,
            load,
            kv_counters: kv.as_ref().map(KvSubscriptions::stats).unwrap_or_default(),
            kv_subscriptions: Mutex::new(kv),
            cache_sources: handles.cache,
            kv_index,
            predictions,
            models,
            wildcard,
            forwarder,
            metrics: crate::metrics::install(),
            rate_limits: Arc::new(crate::limit::rate_limits(&config.server, &credentials)),
            credentials: Arc::new(credentials),
            retry_budget: RetryBudget::new(&config.server.retry),
            draining: AtomicBool::new(false),
            drain_ended: CancellationToken::new(),
            bodies: Arc::new(crate::limit::BodyBudget::new(
                config.server.max_pending_bodies,
                config.server.max_inflight_body_bytes,
                config.server.max_body_bytes,
                config.server.body_read_timeout_secs,
            )),
            admission: Arc::new(Admission::new(
                config.server.max_concurrent_requests,
                config.server.queue_size,
                Duration::from_secs(config.server.queue_timeout_secs),
            )),
            model_cards: Arc::default(),
            card_refresh: (
                Duration::from_secs(config.health.interval_secs.max(1)),
                Duration::from_secs(config.health.timeout_secs.max(1)),
            ),
            discovery: Mutex::new(discovery),
            discovery_state,
            cancel: CancellationToken::new(),
            tasks: Mutex::new(JoinSet::new()),
        })
    }
}

fn load_settings(config: &ConfigFile) -> router_state_load::TableConfig {
    router_state_load::TableConfig {
        stale_after: Duration::from_millis(config.load.stale_after_ms),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
