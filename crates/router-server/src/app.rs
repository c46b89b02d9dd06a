//! `AppContext`: the shared services, started once and stopped on shutdown, and the routing
//! objects built from the configuration.

use hashbrown::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::HeaderName;
use metrics_exporter_prometheus::PrometheusHandle;
use parking_lot::Mutex;
use router_policies::{BlockSize, CacheSources, LoadHandles, Pick, RequestTokens};
use router_state_kv::{KvIndex, KvStats, KvSubscriptions, Predictions};
use router_state_load::{
    EngineReportedLoadTable, Inflight, InflightGuard, LoadSubscriptions, SubscriptionConfig,
};
use router_workers::{ModelId, RegistryEvent, Stage, WorkerRegistry};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::auth::Credentials;
use crate::error::ApiError;
use crate::forward::OutcomeSink;
use crate::health::HealthBook;
use crate::limit::Admission;
use crate::rate_limit::RateLimits;
use crate::retry::RetryBudget;
use router_config::{ModelRuntime, ServerSection};
use router_engine_client::{EngineLearner, Forwarder, ModelCards};

/// Everything a request handler needs, shared by all of them.
pub struct AppContext {
    server: ServerSection,
    /// `server.request_id_headers`, parsed once (a lookup by name would parse it per request).
    request_id_headers: Vec<HeaderName>,
    load_report_interval: Duration,
    registry: Arc<WorkerRegistry>,
    /// The load table and router-local in-flight accounting.
    load: LoadHandles,
    /// `None` in a remote-indexer deployment ([`router_config::keeps_local_index`]).
    kv_index: Option<Arc<KvIndex>>,
    /// What this router just dispatched, before the engines' KV events say so; `None`: off.
    predictions: Option<Arc<Predictions>>,
    /// Taken by `start`.
    kv_subscriptions: Mutex<Option<KvSubscriptions>>,
    /// The prefix sources the policies read (for their lookup counters).
    cache_sources: CacheSources,
    kv_counters: KvStats,
    models: HashMap<ModelId, ModelRuntime>,
    /// The model named `*`, which serves any model name.
    wildcard: Option<ModelId>,
    forwarder: Forwarder,
    health: Arc<HealthBook>,
    metrics: PrometheusHandle,
    credentials: Arc<Credentials>,
    retry_budget: RetryBudget,
    draining: AtomicBool,
    /// Cancelled when the drain runs out: the streams still open end with an error event.
    drain_ended: CancellationToken,
    admission: Arc<Admission>,
    /// The bounds on request bodies arriving and in memory.
    bodies: Arc<crate::limit::BodyBudget>,
    rate_limits: Arc<RateLimits>,
    model_cards: Arc<ModelCards>,
    /// How often and how patiently the model cards are refreshed (the health checker's).
    card_refresh: (Duration, Duration),
    /// Kubernetes discovery, taken by `start`.
    discovery: Mutex<Option<router_discovery::Discovery>>,
    /// Its status, when it is configured.
    discovery_state: Option<router_discovery::DiscoveryState>,
    cancel: CancellationToken,
    tasks: Mutex<JoinSet<()>>,
}

impl std::fmt::Debug for AppContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppContext").field("models", &self.models.keys()).finish_non_exhaustive()
    }
}

impl AppContext {
    /// Starts the background services: health checks and the state subscriptions. Warns
    /// first of every PD pairing constraint that leaves a prefill engine without a partner.
    pub fn start(self: &Arc<Self>) {
        for warning in router_config::pairing_warnings(self.models(), &self.registry) {
            tracing::warn!("{warning}");
        }
        // A restarted engine's cache is empty, and its speed may have changed: forget what it
        // held before it is picked again, and what it taught. Health probes tell of a restart
        // (refused, then answered), and so do load reports from a new instance.
        let forget = {
            let (index, rates) = (self.kv_index.clone(), Arc::clone(&self.load.rates));
            move |worker: &router_workers::WorkerId| {
                if let Some(index) = &index {
                    index.clear_worker(worker);
                }
                rates.forget(worker);
            }
        };
        let on_probe = forget.clone();
        self.health.on_restart(Box::new(move |worker| on_probe(worker.id())));
        let mut tasks = self.tasks.lock();
        tasks.spawn(forget_restarted(
            self.load.table.restarts(),
            forget,
            self.cancel.child_token(),
        ));
        let cancel = self.cancel.child_token();
        tasks.spawn(Arc::clone(&self.health).run(self.forwarder.clone(), cancel));
        let subscriptions = LoadSubscriptions::new(
            Arc::clone(&self.load.table),
            Arc::clone(&self.registry),
            SubscriptionConfig {
                report_interval: self.load_report_interval,
                tls: Some(self.forwarder.tls()),
                ..SubscriptionConfig::default()
            },
        );
        tasks.spawn(subscriptions.run(self.cancel.child_token()));
        if let Some(kv) = self.kv_subscriptions.lock().take() {
            tasks.spawn(kv.run(self.cancel.child_token()));
        }
        if let Some(discovery) = self.discovery.lock().take() {
            tasks.spawn(discovery.run(self.cancel.child_token()));
        }
        for model in self.models.values() {
            for store in [&model.sessions, &model.routing_keys] {
                tasks.spawn(router_affinity::run_sweeper(
                    Arc::clone(store),
                    self.cancel.child_token(),
                ));
                tasks.spawn(router_affinity::follow_registry(
                    Arc::clone(store),
                    Arc::clone(&self.registry),
                    self.cancel.child_token(),
                ));
            }
        }
        let tokenized = self
            .models
            .iter()
            .filter_map(|(id, model)| Some((id.clone(), Arc::clone(model.tokenization.as_ref()?))))
            .collect::<Vec<_>>();
        for (model, tokenization) in &tokenized {
            match tokenization.whole_reason() {
                None => {
                    tracing::info!(model = %model, "prompts are tokenized piece by piece, repeated pieces from the segment cache")
                }
                Some(reason) => {
                    tracing::info!(model = %model, ?reason, "prompts are tokenized whole")
                }
            }
        }
        // Engines' own blocks match only token ids: a model without a tokenizer routes on
        // text, pictured from its dispatches whatever its engines publish.
        let prefix_models = self
            .models
            .values()
            .filter(|m| m.reads_prefixes && m.tokenization.is_some())
            .map(|m| m.id.clone())
            .collect();
        let engines = EngineLearner::new(tokenized, prefix_models);
        let engines = (!engines.is_empty()).then_some(engines);
        tasks.spawn(Arc::clone(&self.model_cards).run(
            self.models.keys().cloned().collect(),
            engines,
            Arc::clone(&self.registry),
            self.forwarder.clone(),
            self.card_refresh,
            self.cancel.child_token(),
        ));
        tasks.spawn(forget_removed(
            Arc::clone(&self.registry),
            self.load.clone(),
            self.cancel.child_token(),
        ));
    }

    /// Stops every background task and waits for them.
    pub async fn shutdown(&self) {
        self.cancel.cancel();
        let mut tasks = std::mem::take(&mut *self.tasks.lock());
        while tasks.join_next().await.is_some() {}
    }

    /// Marks the router as draining: readiness fails and new requests are refused.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Whether the router is draining.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Ends the streams still open: each sends an error event (`router_shutdown`) and ends.
    pub fn end_drain(&self) {
        self.drain_ended.cancel();
    }

    /// Cancelled when the drain has run out.
    pub(crate) fn drain_ended(&self) -> &CancellationToken {
        &self.drain_ended
    }

    /// The routing objects serving `name`.
    pub fn model(&self, name: &str) -> Option<&ModelRuntime> {
        self.models.get(name).or_else(|| self.wildcard.as_ref().and_then(|w| self.models.get(w)))
    }

    /// The model a request names, or, when it names none (any inference endpoint, the fleet
    /// endpoints' `?model=`), `server.default_model`, else the router's only one: a model not
    /// served is 404 and a missing name on a router of several models and no default is 400.
    pub(crate) fn requested_model(&self, name: Option<&str>) -> Result<&ModelRuntime, ApiError> {
        match name {
            Some(name) => self.model(name).ok_or_else(|| ApiError::UnknownModel(name.to_owned())),
            None => {
                if let Some(default) = &self.server().default_model {
                    return self
                        .model(default)
                        .ok_or_else(|| ApiError::UnknownModel(default.clone()));
                }
                let mut models = self.models.values();
                models.next().filter(|_| models.next().is_none()).ok_or_else(|| {
                    ApiError::InvalidRequest {
                        message: "'model' is required: this router serves several models and \
                                  no server.default_model"
                            .to_owned(),
                        param: Some("model".to_owned()),
                    }
                })
            }
        }
    }

    /// What clients are told about the models.
    pub(crate) fn model_cards(&self) -> &ModelCards {
        &self.model_cards
    }

    /// Every served model.
    pub fn models(&self) -> impl Iterator<Item = &ModelRuntime> {
        self.models.values()
    }

    /// Kubernetes discovery's status, when it is configured.
    pub fn discovery(&self) -> Option<&router_discovery::DiscoveryState> {
        self.discovery_state.as_ref()
    }

    /// The worker registry.
    pub fn registry(&self) -> &Arc<WorkerRegistry> {
        &self.registry
    }

    /// Engine-reported load.
    pub fn load_table(&self) -> &Arc<EngineReportedLoadTable> {
        &self.load.table
    }

    /// Router-local in-flight accounting.
    pub fn inflight(&self) -> &Arc<Inflight> {
        &self.load.inflight
    }

    /// The predicted entries of recent dispatches, when on.
    pub fn predictions(&self) -> Option<&Arc<Predictions>> {
        self.predictions.as_ref()
    }

    /// The load state as the policies read it.
    pub fn load(&self) -> &LoadHandles {
        &self.load
    }

    /// A dispatch of `pick` for `stage` of a request of `model`, to data-parallel rank `rank`
    /// when the router chose one: its in-flight guard (counted for the rank too), carrying the
    /// prefill work the policy expected (the whole input when it did not look; none for
    /// decode), and, for a tokenized request to an engine with KV events, its blocks recorded
    /// as predicted entries there (on that rank). A dispatch to a half-open engine is one of
    /// its breaker's trials.
    pub fn dispatched(
        &self,
        model: &ModelId,
        pick: &Pick,
        stage: Stage,
        rank: Option<u32>,
        input_tokens: u64,
        tokens: Option<&RequestTokens>,
    ) -> InflightGuard {
        let (worker, inflight) = (&pick.worker, &self.load.inflight);
        self.health.dispatching(worker);
        let work = if stage == Stage::Decode {
            0
        } else {
            if let (Some(predictions), Some(tokens)) = (&self.predictions, tokens) {
                let hashes = tokens.block_hashes(BlockSize::of(worker));
                let now = std::time::Instant::now();
                if BlockSize::is_approximate(worker) {
                    // Remembered only where a policy will look: the router's whole picture
                    // of an engine without KV events, for `kv.approximate_ttl_secs`.
                    if self.models.get(model).is_some_and(|m| m.reads_prefixes) {
                        predictions.record_approximate(model, worker.id(), rank, &hashes, now);
                    }
                } else {
                    match rank {
                        Some(rank) => {
                            predictions.record_on_rank(model, worker.id(), rank, &hashes, now)
                        }
                        None => predictions.record(model, worker.id(), &hashes, now),
                    }
                }
            }
            self.expect_kv_events(worker, input_tokens);
            pick.uncached_tokens.unwrap_or(input_tokens)
        };
        match rank {
            Some(rank) => inflight.acquire_on_rank(worker.id(), stage, rank, work),
            None => inflight.acquire_work(worker.id(), stage, work),
        }
    }

    /// A prompt of `input_tokens` goes to `worker`: when that fills two KV blocks, the engine
    /// publishes what it cached, and a subscription that hears nothing over many such prompts
    /// is reported (the bind/connect trap of vLLM's `tcp://*:PORT`, a firewall, a wrong port).
    fn expect_kv_events(&self, worker: &router_workers::Worker, input_tokens: u64) {
        let Some(block) = worker.block_size() else { return };
        if worker.kv_events().is_none() || input_tokens < 2 * u64::from(block) {
            return;
        }
        if self.kv_counters.expect_events(worker.id(), std::time::Instant::now()) {
            tracing::warn!(
                worker = %worker.id(),
                endpoint = worker.kv_events().map(|spec| spec.endpoint.as_str()),
                "KV events silent: the engine is prefilling but its subscription hears nothing; \
                 check the endpoint, and that exactly one side binds (vLLM binds only tcp://*:PORT)"
            );
            crate::metrics::kv_events_silent(worker.id().as_str());
        }
    }

    /// The prefix index fed by KV events; `None` when every prefix lookup goes to a remote
    /// indexer.
    pub fn kv_index(&self) -> Option<&Arc<KvIndex>> {
        self.kv_index.as_ref()
    }

    /// The prefix sources of the policies: the local index's and each remote indexer's.
    pub fn cache_sources(&self) -> &CacheSources {
        &self.cache_sources
    }

    /// KV-event subscription counters.
    pub fn kv_stats(&self) -> &KvStats {
        &self.kv_counters
    }

    /// The engine clients.
    pub fn forwarder(&self) -> &Forwarder {
        &self.forwarder
    }

    /// Health and circuit breakers.
    pub fn health(&self) -> &Arc<HealthBook> {
        &self.health
    }

    /// The circuit breaker as the sink of dispatch outcomes.
    pub fn health_sink(&self) -> Arc<dyn OutcomeSink> {
        Arc::clone(&self.health) as Arc<dyn OutcomeSink>
    }

    /// The Prometheus handle.
    pub fn metrics(&self) -> &PrometheusHandle {
        &self.metrics
    }

    /// The budget shared by every retry.
    pub fn retry_budget(&self) -> &RetryBudget {
        &self.retry_budget
    }

    /// The client, engine and admin credentials in force.
    pub fn credentials(&self) -> &Arc<Credentials> {
        &self.credentials
    }

    /// The server settings.
    pub fn server(&self) -> &ServerSection {
        &self.server
    }

    /// The headers a client's request id is taken from, in order of preference.
    pub(crate) fn request_id_headers(&self) -> &[HeaderName] {
        &self.request_id_headers
    }

    /// The rate limits of the client keys.
    pub(crate) fn rate_limits(&self) -> &Arc<RateLimits> {
        &self.rate_limits
    }

    /// The bounds on request bodies arriving and in memory.
    pub(crate) fn bodies(&self) -> &Arc<crate::limit::BodyBudget> {
        &self.bodies
    }

    /// The concurrency bound of inference requests and its queue.
    pub(crate) fn admission(&self) -> &Arc<Admission> {
        &self.admission
    }

    /// Largest accepted body.
    pub fn max_body_bytes(&self) -> usize {
        self.server.max_body_bytes
    }

    /// Router-local in-flight requests across every engine.
    pub fn total_inflight(&self) -> u64 {
        self.registry.workers().iter().map(|w| self.load.inflight.count(w.id())).sum()
    }
}

/// Calls `forget` for every engine whose load reports came from a new instance: a restart
/// the health probes may have missed (the engine came back between two probes).
async fn forget_restarted(
    mut restarts: tokio::sync::broadcast::Receiver<router_workers::WorkerId>,
    forget: impl Fn(&router_workers::WorkerId),
    cancel: CancellationToken,
) {
    loop {
        let restarted = tokio::select! {
            () = cancel.cancelled() => return,
            restarted = restarts.recv() => restarted,
        };
        match restarted {
            Ok(worker) => {
                tracing::info!(worker = %worker, "engine reports from a new instance: restarted, forgetting its cache");
                forget(&worker);
            }
            Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                tracing::warn!(
                    missed,
                    "engine restarts missed; their caches clear on their next KV events"
                );
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Forgets the in-flight counters and learned rates of engines that leave the registry, so an
/// engine added later under the same id starts from zero (guards still held count into the
/// forgotten counters). Behind the feed (a burst of changes, say a thousand pods), it forgets
/// the counters of every engine no longer registered.
async fn forget_removed(
    registry: Arc<WorkerRegistry>,
    load: LoadHandles,
    cancel: CancellationToken,
) {
    let inflight = &load.inflight;
    let (_, mut feed) = registry.follow();
    loop {
        let event = tokio::select! {
            () = cancel.cancelled() => return,
            event = feed.recv() => event,
        };
        match event {
            Ok(RegistryEvent::Removed(worker)) => {
                inflight.remove(worker.id());
                load.rates.forget(worker.id());
            }
            Ok(_) => {}
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                let (current, resumed) = registry.follow();
                feed = resumed;
                let live: std::collections::HashSet<&router_workers::WorkerId> =
                    current.iter().map(|w| w.id()).collect();
                for (id, _) in inflight.counts() {
                    if !live.contains(&id) {
                        inflight.remove(&id);
                    }
                }
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        }
    }
}

mod build;
#[cfg(test)]
mod tests;
