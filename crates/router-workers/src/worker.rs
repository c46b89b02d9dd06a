//! The engine as the router sees it: identity, role, endpoints and live health.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::{EngineStatus, WorkerError, WorkerLabels, WorkerOrigin};

/// Stable identifier of an engine, as written in the configuration (`P1`, `engine-3`).
///
/// Engines are named by this everywhere inside the router, never by URL. Cloning is cheap.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WorkerId(Arc<str>);

impl WorkerId {
    /// Wraps a non-empty identifier.
    pub fn new(id: impl AsRef<str>) -> Result<Self, WorkerError> {
        let id = id.as_ref();
        if id.trim().is_empty() {
            return Err(WorkerError::EmptyId);
        }
        Ok(Self(Arc::from(id)))
    }

    /// The identifier as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

/// Name of a served model, as clients send it in the `model` field.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ModelId(Arc<str>);

impl ModelId {
    /// The name of the model that serves any name a client sends (a quick start without
    /// `--model`): requests for names no other model has go to it.
    pub const ANY: &str = "*";

    /// Wraps a model name.
    pub fn new(id: impl AsRef<str>) -> Self {
        Self(Arc::from(id.as_ref()))
    }

    /// The model name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is the model that serves any name ([`ModelId::ANY`]).
    pub fn is_any(&self) -> bool {
        &*self.0 == Self::ANY
    }
}

/// A model is looked up by its name as a client sent it, without making a `ModelId` of it:
/// the derived `Hash` and `Eq` are those of the name.
impl std::borrow::Borrow<str> for ModelId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ModelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ModelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

/// The part of a request an engine serves: the whole of it, or one side of a
/// prefill/decode disaggregated pair. A worker's role is its stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// Serves complete requests.
    Plain,
    /// Computes the prompt's KV cache and hands it to a decode engine.
    Prefill,
    /// Generates tokens from a KV cache received from a prefill engine.
    Decode,
}

impl Stage {
    /// The configuration spelling: `plain`, `prefill` or `decode`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Plain => "plain",
            Stage::Prefill => "prefill",
            Stage::Decode => "decode",
        }
    }

    /// Whether this stage belongs to prefill/decode disaggregation.
    pub fn is_pd(self) -> bool {
        !matches!(self, Stage::Plain)
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where an engine publishes its KV-cache events (ZeroMQ), as configured.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvEventsSpec {
    /// The engine's PUB endpoint, `tcp://host:port`. Data-parallel rank `r` publishes on
    /// port + r.
    pub endpoint: String,
    /// The engine's replay ROUTER endpoint, when it has one (rank `r` on port + r).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_endpoint: Option<String>,
    /// Topic prefix to subscribe to; empty subscribes to everything.
    #[serde(default)]
    pub topic: String,
    /// Tokens per KV block on this engine; absent: the worker's `block_size`, else
    /// [`DEFAULT_BLOCK_SIZE`]. Events with another block size are skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u32>,
    /// Bind the router's SUB socket and let the engine connect, instead of connecting to it.
    /// Only for trusted networks.
    #[serde(default)]
    pub bind: bool,
}

/// Tokens per KV block of an engine with KV events whose configuration names none.
pub const DEFAULT_BLOCK_SIZE: u32 = 16;

impl KvEventsSpec {
    /// Events published at `endpoint`, with no replay endpoint, topic or block size of their
    /// own, connected to (not bound).
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            replay_endpoint: None,
            topic: String::new(),
            block_size: None,
            bind: false,
        }
    }
}

/// How the router learns an engine's load by polling it, when not from a gRPC load reporter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadPollSpec {
    /// Poll at this interval, in milliseconds.
    #[serde(default = "default_poll_interval_ms")]
    pub interval_ms: u64,
    /// What to poll: SGLang's `GET /v1/loads` (the default) or vLLM's Prometheus `GET /metrics`.
    #[serde(default)]
    pub format: LoadPollFormat,
}

impl LoadPollSpec {
    /// Polling of `format` every `interval_ms` milliseconds.
    pub fn new(interval_ms: u64, format: LoadPollFormat) -> Self {
        Self { interval_ms, format }
    }
}

fn default_poll_interval_ms() -> u64 {
    500
}

/// Which endpoint and body format a polled engine serves its load in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadPollFormat {
    /// SGLang's `GET /v1/loads` JSON, one entry per data-parallel rank.
    #[default]
    Sglang,
    /// vLLM's Prometheus text at `GET /metrics` (`vllm:num_requests_running`, ...), one
    /// `engine` label value per data-parallel rank.
    VllmMetrics,
}

impl LoadPollFormat {
    /// The configuration name: `sglang` or `vllm_metrics`.
    pub fn as_str(self) -> &'static str {
        match self {
            LoadPollFormat::Sglang => "sglang",
            LoadPollFormat::VllmMetrics => "vllm_metrics",
        }
    }
}

impl fmt::Display for LoadPollFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

fn default_dp_size() -> u32 {
    1
}

/// How the router tells a data-parallel engine which rank serves a request.
///
/// Without it (the default) the engine balances its ranks itself; with it the router picks the
/// rank (by its cached prefix and load, as it picks engines) and names it on every request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DpRoute {
    /// `"data_parallel_rank": r` in the JSON body, as SGLang reads it.
    Body,
    /// The `X-data-parallel-rank: r` header, as vLLM reads it.
    Header,
}

impl DpRoute {
    /// The configuration name.
    pub fn as_str(self) -> &'static str {
        match self {
            DpRoute::Body => "body",
            DpRoute::Header => "header",
        }
    }
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

/// The serving engine a worker runs: its API is the same for the router, but its rules for
/// turning a chat request into a prompt differ in places, and the router renders as it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// vLLM.
    Vllm,
    /// SGLang.
    Sglang,
}

impl EngineKind {
    /// The configuration name.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
        }
    }

    fn to_bits(kind: Option<Self>) -> u8 {
        match kind {
            None => 0,
            Some(EngineKind::Vllm) => 1,
            Some(EngineKind::Sglang) => 2,
        }
    }

    fn from_bits(bits: u8) -> Option<Self> {
        match bits {
            1 => Some(EngineKind::Vllm),
            2 => Some(EngineKind::Sglang),
            _ => None,
        }
    }
}

/// A worker as written in the configuration file and accepted by the admin API.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSpec {
    /// Stable identifier, unique across the router.
    pub id: String,
    /// Base URL of the engine's HTTP server (`http://host:port`).
    pub url: String,
    /// `plain`, `prefill` or `decode`.
    #[serde(default = "default_role")]
    pub role: Stage,
    /// Model served: in the configuration file the enclosing model entry (a different name is
    /// an error); through the admin API the router's only model when it serves one, else
    /// required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Port of the prefill engine's bootstrap server for PD transfer (prefill only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_port: Option<u16>,
    /// Number of data-parallel ranks behind this engine.
    #[serde(default = "default_dp_size", skip_serializing_if = "is_one")]
    pub dp_size: u32,
    /// How the router names the chosen rank to the engine; without it the engine picks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_route: Option<DpRoute>,
    /// Tokens per KV block on this engine, which prefix lookups hash requests with. Needed
    /// without `kv_events` when a remote indexer knows the engine's cache; with `kv_events`
    /// it is their block size (and must equal `kv_events.block_size` when both are given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u32>,
    /// KV-event publisher of the engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_events: Option<KvEventsSpec>,
    /// gRPC load-reporter endpoint (`host:port`) the router dials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_reporter: Option<String>,
    /// Poll the engine's load (SGLang's `/v1/loads` or vLLM's `/metrics`) instead of (or
    /// without) a gRPC reporter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_poll: Option<LoadPollSpec>,
    /// The operator's string labels (`rack: r1`, `transfer: mooncake`); a PD bucket's
    /// `pair_on` pairs a prefill engine only with decode engines whose values are equal.
    #[serde(default, skip_serializing_if = "WorkerLabels::is_empty")]
    pub labels: WorkerLabels,
    /// The engine's API key (its `--api-key`), sent as `Authorization: Bearer` on every HTTP
    /// request to it. Never serialized: listings and dumps cannot leak it.
    #[serde(default, skip_serializing)]
    pub api_key: Option<ApiKey>,
    /// The engine it runs (`vllm` or `sglang`); unset, the router learns it from the engine's
    /// own answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineKind>,
}

impl WorkerSpec {
    /// A worker `id` at `url` in `role`, with every optional setting at its default: one
    /// data-parallel rank and no model, bootstrap port, block size, KV events, load source,
    /// labels or API key. Set others with struct update syntax (`WorkerSpec { dp_size: 2, ..spec }`).
    pub fn new(id: impl Into<String>, url: impl Into<String>, role: Stage) -> Self {
        Self {
            id: id.into(),
            url: url.into(),
            role,
            model: None,
            bootstrap_port: None,
            dp_size: 1,
            dp_route: None,
            block_size: None,
            kv_events: None,
            load_reporter: None,
            load_poll: None,
            labels: WorkerLabels::new(),
            api_key: None,
            engine: None,
        }
    }
}

/// A credential: readable on purpose with [`ApiKey::expose`], never printed by `Debug` and
/// never serialized. It carries the `Authorization` value that presents it, built once.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct ApiKey {
    key: String,
    /// `Bearer <key>`, marked sensitive (HTTP/2 never indexes it; its `Debug` hides it).
    authorization: http::HeaderValue,
}

impl ApiKey {
    /// A key of visible ASCII characters (it travels in an HTTP header).
    pub fn new(key: impl Into<String>) -> Result<Self, &'static str> {
        let key = key.into();
        if key.is_empty() {
            return Err("an API key must not be empty");
        }
        let invalid = "an API key must be visible ASCII characters without spaces";
        if !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid);
        }
        let mut authorization =
            http::HeaderValue::try_from(format!("Bearer {key}")).map_err(|_| invalid)?;
        authorization.set_sensitive(true);
        Ok(Self { key, authorization })
    }

    /// The secret itself, for the one place that checks it.
    pub fn expose(&self) -> &str {
        &self.key
    }

    /// The `Authorization` header value that presents this key.
    pub fn authorization(&self) -> &http::HeaderValue {
        &self.authorization
    }
}

impl TryFrom<String> for ApiKey {
    type Error = &'static str;

    fn try_from(key: String) -> Result<Self, Self::Error> {
        Self::new(key)
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

fn default_role() -> Stage {
    Stage::Plain
}

static NEXT_INCARNATION: AtomicU64 = AtomicU64::new(1);

/// `id` (of an engine, a bucket) as the value of the response header that names it, made once
/// by its owner; an id no header value may carry (a control character) is named `invalid`.
pub fn id_header(id: &str) -> http::HeaderValue {
    http::HeaderValue::from_str(id).unwrap_or_else(|_| http::HeaderValue::from_static("invalid"))
}

/// One engine. Shared as `Arc<Worker>`; everything but its live state (health, the
/// operator's drain, the status its load reports state) is immutable, so a changed engine is a
/// new `Worker` (with a new [`Worker::incarnation`]) that replaces the old one.
#[derive(Debug)]
pub struct Worker {
    id: WorkerId,
    /// `id` as a header value, made once (see [`Worker::id_header`]).
    id_header: http::HeaderValue,
    url: String,
    /// `url` parsed once, when it has no path: requests then build their URI from its scheme
    /// and authority instead of parsing the whole URL again (see [`Worker::uri_for`]), with
    /// that authority as a `Host` header value made once (see [`Worker::host_header`]).
    address: Option<(http::Uri, http::HeaderValue)>,
    models: Vec<ModelId>,
    stage: Stage,
    bootstrap_port: Option<u16>,
    dp_size: u32,
    dp_route: Option<DpRoute>,
    block_size: Option<u32>,
    kv_events: Option<KvEventsSpec>,
    load_reporter: Option<String>,
    load_poll: Option<LoadPollSpec>,
    labels: WorkerLabels,
    api_key: Option<ApiKey>,
    origin: WorkerOrigin,
    incarnation: u64,
    healthy: AtomicBool,
    /// Taken out of selection by the operator (`POST /admin/workers/{id}/drain`).
    drained: AtomicBool,
    /// [`EngineStatus`] bits: the status the engine's latest accepted load report stated.
    reported_status: AtomicU8,
    /// The engine it runs, as configured; without it, [`Worker::learned_engine`] counts.
    engine: Option<EngineKind>,
    /// [`EngineKind`] bits: the engine its answers showed (0: not known yet).
    learned_engine: AtomicU8,
}

impl Worker {
    /// Validates a spec into a worker serving `models`, from the configuration (see
    /// [`Worker::with_origin`]). The worker starts healthy, not drained, and with an unknown
    /// reported status.
    pub fn from_spec(spec: &WorkerSpec, models: Vec<ModelId>) -> Result<Self, WorkerError> {
        let id = WorkerId::new(&spec.id)?;
        let url = validate_url(&spec.url)?;
        if models.is_empty() {
            return Err(WorkerError::NoModel { id });
        }
        if spec.dp_size == 0 {
            return Err(WorkerError::ZeroDpSize { id });
        }
        if spec.bootstrap_port.is_some() && spec.role != Stage::Prefill {
            return Err(WorkerError::BootstrapPortOnNonPrefill { id, role: spec.role });
        }
        let events_block_size = spec.kv_events.as_ref().and_then(|kv| kv.block_size);
        let block_size = match (spec.block_size, events_block_size) {
            (Some(worker), Some(events)) if worker != events => {
                return Err(WorkerError::ConflictingBlockSize { id, worker, events });
            }
            (Some(size), _) | (None, Some(size)) => Some(size),
            (None, None) => spec.kv_events.as_ref().map(|_| DEFAULT_BLOCK_SIZE),
        };
        if block_size == Some(0) {
            return Err(WorkerError::ZeroBlockSize { id });
        }
        if let Some(kv) = &spec.kv_events {
            validate_zmq_endpoint(&id, &kv.endpoint)?;
            if let Some(replay) = &kv.replay_endpoint {
                validate_zmq_endpoint(&id, replay)?;
            }
        }
        if spec.labels.iter().any(|(name, _)| name.trim().is_empty()) {
            return Err(WorkerError::EmptyLabelName { id });
        }
        let address = http::Uri::try_from(url.as_str())
            .ok()
            .filter(|uri| uri.path() == "/")
            .and_then(|uri| {
                let host = http::HeaderValue::from_str(uri.authority()?.as_str()).ok()?;
                Some((uri, host))
            });
        let id_header = id_header(id.as_str());
        Ok(Self {
            id,
            id_header,
            url,
            address,
            models,
            stage: spec.role,
            bootstrap_port: spec.bootstrap_port,
            dp_size: spec.dp_size,
            dp_route: spec.dp_route,
            block_size,
            kv_events: spec.kv_events.clone(),
            load_reporter: spec.load_reporter.clone(),
            load_poll: spec.load_poll.clone(),
            labels: spec.labels.clone(),
            api_key: spec.api_key.clone(),
            origin: WorkerOrigin::Config,
            incarnation: NEXT_INCARNATION.fetch_add(1, Ordering::Relaxed),
            healthy: AtomicBool::new(true),
            drained: AtomicBool::new(false),
            reported_status: AtomicU8::new(EngineStatus::Unknown.to_bits()),
            engine: spec.engine,
            learned_engine: AtomicU8::new(EngineKind::to_bits(None)),
        })
    }

    /// Builds a plain, healthy worker for one model, with no engine-side endpoints.
    pub fn plain(id: &str, url: &str, model: &ModelId) -> Result<Self, WorkerError> {
        Self::with_stage(id, url, model, Stage::Plain)
    }

    /// Builds a healthy worker of the given stage for one model, with no engine-side endpoints.
    pub fn with_stage(
        id: &str,
        url: &str,
        model: &ModelId,
        stage: Stage,
    ) -> Result<Self, WorkerError> {
        let spec = WorkerSpec { model: Some(model.to_string()), ..WorkerSpec::new(id, url, stage) };
        Self::from_spec(&spec, vec![model.clone()])
    }

    /// This worker as its engine advertises itself: the same engine publishing KV events at
    /// `kv_events` (its block size, else this worker's, else [`DEFAULT_BLOCK_SIZE`]), as a new
    /// incarnation to [`crate::WorkerRegistry::replace`] this one with. Health, drain and the
    /// learned engine carry over.
    pub fn with_kv_events(&self, kv_events: KvEventsSpec) -> Result<Self, WorkerError> {
        let id = self.id.clone();
        validate_zmq_endpoint(&id, &kv_events.endpoint)?;
        if let Some(replay) = &kv_events.replay_endpoint {
            validate_zmq_endpoint(&id, replay)?;
        }
        let block_size = match (self.block_size, kv_events.block_size) {
            (Some(worker), Some(events)) if worker != events => {
                return Err(WorkerError::ConflictingBlockSize { id, worker, events });
            }
            (Some(size), _) | (None, Some(size)) => size,
            (None, None) => DEFAULT_BLOCK_SIZE,
        };
        if block_size == 0 {
            return Err(WorkerError::ZeroBlockSize { id });
        }
        Ok(Self {
            id,
            id_header: self.id_header.clone(),
            url: self.url.clone(),
            address: self.address.clone(),
            models: self.models.clone(),
            stage: self.stage,
            bootstrap_port: self.bootstrap_port,
            dp_size: self.dp_size,
            dp_route: self.dp_route,
            block_size: Some(block_size),
            kv_events: Some(kv_events),
            load_reporter: self.load_reporter.clone(),
            load_poll: self.load_poll.clone(),
            labels: self.labels.clone(),
            api_key: self.api_key.clone(),
            origin: self.origin.clone(),
            incarnation: NEXT_INCARNATION.fetch_add(1, Ordering::Relaxed),
            healthy: AtomicBool::new(self.is_healthy()),
            drained: AtomicBool::new(self.is_drained()),
            reported_status: AtomicU8::new(EngineStatus::Unknown.to_bits()),
            engine: self.engine,
            learned_engine: AtomicU8::new(self.learned_engine.load(Ordering::Relaxed)),
        })
    }

    /// This worker, coming from `origin` instead of the configuration.
    pub fn with_origin(self, origin: WorkerOrigin) -> Self {
        Self { origin, ..self }
    }

    /// Where this worker came from.
    pub fn origin(&self) -> &WorkerOrigin {
        &self.origin
    }

    /// The stable identifier.
    pub fn id(&self) -> &WorkerId {
        &self.id
    }

    /// [`Worker::id`] as a header value, made once: the router names the engine that served
    /// each answer in a response header.
    pub fn id_header(&self) -> &http::HeaderValue {
        &self.id_header
    }

    /// Base URL without a trailing slash.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The URI of `path` (`/v1/chat/completions`, with any query) on this engine: the base URL
    /// followed by `path`.
    pub fn uri_for(&self, path: &str) -> Result<http::Uri, http::Error> {
        match &self.address {
            Some((origin, _)) => {
                let mut parts = http::uri::Parts::default();
                parts.scheme = origin.scheme().cloned();
                parts.authority = origin.authority().cloned();
                parts.path_and_query = Some(http::uri::PathAndQuery::try_from(path)?);
                Ok(http::Uri::from_parts(parts)?)
            }
            None => Ok(http::Uri::try_from(format!("{}{path}", self.url))?),
        }
    }

    /// The `Host` header of a request to this engine (its URL's host and port), made once;
    /// `None` when the URL has a path, and the HTTP client then derives it per request.
    pub fn host_header(&self) -> Option<&http::HeaderValue> {
        self.address.as_ref().map(|(_, host)| host)
    }

    /// Models this engine serves.
    pub fn models(&self) -> &[ModelId] {
        &self.models
    }

    /// Whether this engine serves `model`.
    pub fn serves(&self, model: &ModelId) -> bool {
        self.models.contains(model)
    }

    /// The engine's API key, when it has one.
    pub fn api_key(&self) -> Option<&ApiKey> {
        self.api_key.as_ref()
    }

    /// The engine's role.
    pub fn stage(&self) -> Stage {
        self.stage
    }

    /// Bootstrap port of a prefill engine, for PD transfer.
    pub fn bootstrap_port(&self) -> Option<u16> {
        self.bootstrap_port
    }

    /// Number of data-parallel ranks.
    pub fn dp_size(&self) -> u32 {
        self.dp_size
    }

    /// How the router names a chosen rank to this engine; `None` when the engine balances its
    /// ranks itself.
    pub fn dp_route(&self) -> Option<DpRoute> {
        self.dp_route
    }

    /// Tokens per KV block: the configured `block_size`, else that of the KV events (by
    /// default [`DEFAULT_BLOCK_SIZE`]); `None` for an engine with neither, whose cache no prefix
    /// lookup can see.
    pub fn block_size(&self) -> Option<u32> {
        self.block_size
    }

    /// KV-event publisher settings, when the engine publishes events.
    pub fn kv_events(&self) -> Option<&KvEventsSpec> {
        self.kv_events.as_ref()
    }

    /// gRPC load-reporter endpoint, when the engine has one.
    pub fn load_reporter(&self) -> Option<&str> {
        self.load_reporter.as_deref()
    }

    /// Load polling settings (`/v1/loads` or vLLM's `/metrics`), when configured.
    pub fn load_poll(&self) -> Option<&LoadPollSpec> {
        self.load_poll.as_ref()
    }

    /// The operator's labels.
    pub fn labels(&self) -> &WorkerLabels {
        &self.labels
    }

    /// The value of label `name`, if the worker has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.get(name)
    }

    /// Process-unique number of this `Worker` value: a replaced engine with the same id has a
    /// different incarnation, so state and picks tied to the old one can be told apart.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// Current health as last set by the health checker.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }

    /// Sets health; returns the previous value. Use [`crate::WorkerRegistry::set_health`] so the
    /// change feed hears about it.
    pub(crate) fn store_health(&self, healthy: bool) -> bool {
        self.healthy.swap(healthy, Ordering::AcqRel)
    }

    /// Whether the operator has taken this engine out of selection (until resumed).
    pub fn is_drained(&self) -> bool {
        self.drained.load(Ordering::Acquire)
    }

    /// Sets the operator's drain; returns the previous value. Use
    /// [`crate::WorkerRegistry::set_drained`].
    pub(crate) fn store_drained(&self, drained: bool) -> bool {
        self.drained.swap(drained, Ordering::AcqRel)
    }

    /// The status the engine's latest accepted load report stated; [`EngineStatus::Unknown`]
    /// before any (and for engines whose reports never say). It stays until a newer report
    /// states another, even when reports stop: an engine that said it was draining and then
    /// went silent is not trusted with new requests again until it says otherwise.
    pub fn reported_status(&self) -> EngineStatus {
        EngineStatus::from_bits(self.reported_status.load(Ordering::Acquire))
    }

    /// The engine it runs: as configured, else as learned from its answers, else unknown.
    pub fn engine(&self) -> Option<EngineKind> {
        self.engine.or_else(|| self.learned_engine())
    }

    /// Whether its engine was configured (then nothing is learned).
    pub fn engine_configured(&self) -> bool {
        self.engine.is_some()
    }

    /// The engine its answers showed, when they did.
    pub fn learned_engine(&self) -> Option<EngineKind> {
        EngineKind::from_bits(self.learned_engine.load(Ordering::Acquire))
    }

    /// Records the engine its answers show.
    pub fn learn_engine(&self, kind: EngineKind) {
        self.learned_engine.store(EngineKind::to_bits(Some(kind)), Ordering::Release);
    }

    /// Records the reported status; returns the previous one. Use
    /// [`crate::WorkerRegistry::set_reported_status`].
    pub(crate) fn store_reported_status(&self, status: EngineStatus) -> EngineStatus {
        EngineStatus::from_bits(self.reported_status.swap(status.to_bits(), Ordering::AcqRel))
    }

    /// Whether the engine may be given new requests: healthy, not drained by the operator,
    /// and not reporting that it is starting or draining. Requests already dispatched to it
    /// are never affected.
    pub fn accepts_new_requests(&self) -> bool {
        self.is_healthy() && !self.is_drained() && self.reported_status().accepts_new_requests()
    }

    /// The host part of the base URL (for PD `bootstrap_host`).
    pub fn host(&self) -> &str {
        let rest = self.url.split_once("://").map_or(self.url.as_str(), |(_, r)| r);
        let authority = rest.split('/').next().unwrap_or(rest);
        if let Some(v6) = authority.strip_prefix('[') {
            return v6.split(']').next().unwrap_or(v6);
        }
        authority.rsplit_once(':').map_or(authority, |(host, _)| host)
    }
}

/// Accepts `http` and `https` URLs with a host and no credentials; returns the URL without a
/// trailing slash.
pub fn validate_url(raw: &str) -> Result<String, WorkerError> {
    let bad = |reason: &'static str| WorkerError::BadUrl { url: redact(raw), reason };
    let parsed = url::Url::parse(raw).map_err(|_| bad("not a valid url"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad("scheme must be http or https"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(bad("credentials are not allowed in worker urls"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad("missing host"));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(bad("query and fragment are not allowed"));
    }
    Ok(raw.trim_end_matches('/').to_owned())
}

/// Hides anything between the scheme and an `@` so credentials never reach logs.
fn redact(raw: &str) -> String {
    match (raw.find("://"), raw.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***{}", &raw[..scheme_end], &raw[at..])
        }
        _ => raw.to_owned(),
    }
}

fn validate_zmq_endpoint(id: &WorkerId, endpoint: &str) -> Result<(), WorkerError> {
    let ok = endpoint
        .strip_prefix("tcp://")
        .and_then(|rest| rest.rsplit_once(':'))
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if ok {
        Ok(())
    } else {
        Err(WorkerError::BadKvEndpoint { id: id.clone(), endpoint: endpoint.to_owned() })
    }
}
