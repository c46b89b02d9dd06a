//! Building a model's routing objects from its configuration, which is the validation too:
//! the server section's header, rate-limit and KV checks, each model's workers registered,
//! its buckets and groups built, and discovery's configuration.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use router_affinity::AffinityStore;
use router_buckets::{Bucket, BucketResolver, BucketSlo, BucketSpec, SloPreferences, TokenLimits};
use router_policies::{CachePrefixProvider, LiveEstimator, PolicyHandles};
use router_prepare::Tokenization;
use router_workers::{ApiKey, ModelId, Stage, Worker, WorkerId, WorkerRegistry, WorkerSpec};

use super::groups::{build_groups, check_prefix_groups, each_group, needs_tokens};
use super::{
    ConfigFile, DiscoverySection, GroupsConfig, ModelConfig, ModelRuntime, Problem, Problems,
    ServerSection, discovery,
};

/// Request-id header names and CORS origins that could not be used.
fn server_header_problems(server: &ServerSection, problems: &mut Problems) {
    if server.request_id_headers.is_empty() {
        problems.push("server.request_id_headers", "must name at least one header");
    }
    for (i, name) in server.request_id_headers.iter().enumerate() {
        if http::HeaderName::from_lowercase(name.as_bytes()).is_err() {
            problems.push(
                format!("server.request_id_headers[{i}]"),
                format!("{name:?} is not a lowercase header name"),
            );
        }
    }
    let origins = &server.cors_allowed_origins;
    if origins.len() > 1 && origins.iter().any(|o| o == "*") {
        problems.push("server.cors_allowed_origins", "`*` allows every origin: list it alone");
    }
    for (i, origin) in origins.iter().enumerate() {
        // A scheme and an authority, nothing after: `https://host[:port]`.
        let authority = origin.strip_prefix("https://").or_else(|| origin.strip_prefix("http://"));
        let valid = origin == "*"
            || authority.is_some_and(|a| {
                !a.is_empty() && !a.contains(['/', '?', '#', ' ']) && a.is_ascii()
            }) && http::HeaderValue::from_str(origin).is_ok();
        if !valid {
            problems.push(
                format!("server.cors_allowed_origins[{i}]"),
                format!("{origin:?} is not an origin (`https://host[:port]`, no path) or `*`"),
            );
        }
    }
    if server.metrics_host.is_some() && server.metrics_port.is_none() {
        problems.push("server.metrics_host", "needs server.metrics_port");
    }
}

/// Rate limits without their rate, and key names that are empty or given twice.
fn rate_limit_problems(server: &ServerSection, problems: &mut Problems) {
    let limits = server.rate_limit.iter().map(|limits| ("server.rate_limit".to_owned(), limits));
    let own = server.api_keys.iter().enumerate().filter_map(|(i, entry)| {
        entry.rate_limit.as_ref().map(|limits| (format!("server.api_keys[{i}].rate_limit"), limits))
    });
    for (path, limits) in limits.chain(own) {
        for (field, message) in limits.problems() {
            problems.push(format!("{path}.{field}"), message);
        }
    }
    let mut names = HashSet::new();
    for (i, entry) in server.api_keys.iter().enumerate() {
        let Some(name) = &entry.name else { continue };
        let path = format!("server.api_keys[{i}].name");
        if name.trim().is_empty() {
            problems.push(path, "must not be empty");
        } else if !names.insert(name.as_str()) {
            problems.push(path, format!("duplicate key name {name:?}"));
        }
    }
}

/// Builds every model's routing objects and registers its workers in `registry`, giving
/// `engine_key` to workers configured without an `api_key`. Returns every problem found, not
/// just the first.
pub fn build_models(
    config: &ConfigFile,
    registry: &WorkerRegistry,
    handles: &PolicyHandles,
    engine_key: Option<&ApiKey>,
) -> Result<Vec<ModelRuntime>, Vec<Problem>> {
    let mut problems = Problems::default();
    if config.models.is_empty() {
        problems.push("models", "at least one model is required");
    }
    if config.server.max_body_bytes == 0 {
        problems.push("server.max_body_bytes", "must be at least 1");
    }
    if config.server.max_batch_size == 0 {
        problems.push("server.max_batch_size", "must be at least 1");
    }
    if let Some(default) = &config.server.default_model
        && !config.models.iter().any(|m| &m.id == default)
    {
        problems.push("server.default_model", format!("{default:?} is not a model of models[]"));
    }
    for (path, secs) in [
        ("server.header_read_timeout_secs", config.server.header_read_timeout_secs),
        ("server.body_read_timeout_secs", config.server.body_read_timeout_secs),
        ("server.client_write_timeout_secs", config.server.client_write_timeout_secs),
        ("server.engine_idle_timeout_secs", config.server.engine_idle_timeout_secs),
    ] {
        if secs == 0 {
            problems.push(path, "must be at least 1");
        }
    }
    for (field, message) in config.server.retry.problems() {
        problems.push(format!("server.retry.{field}"), message);
    }
    for (field, message) in config.telemetry.problems() {
        problems.push(format!("telemetry.{field}"), message);
    }
    if config.server.worker_threads.is_some_and(|n| n == 0 || n > 1024) {
        problems.push("server.worker_threads", "must be between 1 and 1024");
    }
    if config.server.max_header_bytes < 8192 {
        problems.push("server.max_header_bytes", "must be at least 8192");
    }
    if config.server.max_concurrent_requests == 0 {
        problems.push("server.max_concurrent_requests", "must be at least 1");
    }
    if config.server.queue_size > 0 && config.server.queue_timeout_secs == 0 {
        problems
            .push("server.queue_timeout_secs", "must be at least 1 with a queue (queue_size > 0)");
    }
    server_header_problems(&config.server, &mut problems);
    rate_limit_problems(&config.server, &mut problems);
    kv_problems(config, &mut problems);
    let mut model_ids = HashSet::new();
    let mut runtimes = Vec::new();
    for (m, model) in config.models.iter().enumerate() {
        let path = format!("models[{m}]");
        if model.id.trim().is_empty() {
            problems.push(format!("{path}.id"), "must not be empty");
            continue;
        }
        if !model_ids.insert(model.id.clone()) {
            problems.push(format!("{path}.id"), format!("duplicate model id {:?}", model.id));
            continue;
        }
        if let Some(runtime) =
            build_model(&path, model, config, registry, handles, engine_key, &mut problems)
        {
            runtimes.push(runtime);
        }
    }
    if problems.0.is_empty() { Ok(runtimes) } else { Err(problems.0) }
}

/// The largest tree the prefix index can address (two node ids are sentinels).
const MAX_TREE_NODES: usize = (u32::MAX - 2) as usize;

/// The smallest `kv.max_message_bytes`: an engine's handshake and a small batch must fit.
const MIN_KV_MESSAGE_BYTES: usize = 1024;
/// The fewest `kv.max_frames_per_message`: a replay reply has 4 frames.
const MIN_KV_FRAMES: usize = 4;

/// `kv.max_index_nodes` must give every configured model a tree of at least one node and at
/// most [`MAX_TREE_NODES`], since the bound is split evenly between them; the KV-event message
/// limits must let an engine's messages through.
fn kv_problems(config: &ConfigFile, problems: &mut Problems) {
    let kv = &config.kv;
    if kv.max_message_bytes < MIN_KV_MESSAGE_BYTES {
        problems.push(
            "kv.max_message_bytes",
            format!("{} is below the minimum of {MIN_KV_MESSAGE_BYTES}", kv.max_message_bytes),
        );
    }
    if kv.max_frames_per_message < MIN_KV_FRAMES {
        problems.push(
            "kv.max_frames_per_message",
            format!(
                "{} is below {MIN_KV_FRAMES}, the frames of a replay reply",
                kv.max_frames_per_message
            ),
        );
    }
    let models = config.models.len().max(1);
    let nodes = config.kv.max_index_nodes;
    if nodes < models {
        problems.push(
            "kv.max_index_nodes",
            format!("{nodes} is below the {models} configured models it is split between"),
        );
    } else if nodes / models > MAX_TREE_NODES {
        problems.push(
            "kv.max_index_nodes",
            format!(
                "{nodes} split between {models} models exceeds {MAX_TREE_NODES} nodes per model"
            ),
        );
    }
}

/// Builds Kubernetes discovery's configuration from the `discovery` section (`None` without
/// one), with every problem at its path. Discovered workers without an `api_key` get
/// `engine_key`.
pub fn build_discovery(
    config: &ConfigFile,
    engine_key: Option<&ApiKey>,
) -> Result<Option<router_discovery::DiscoveryConfig>, Vec<Problem>> {
    let Some(section) = &config.discovery else { return Ok(None) };
    let shapes: Vec<discovery::ModelShape<'_>> = config
        .models
        .iter()
        .map(|m| discovery::ModelShape {
            id: &m.id,
            plain_buckets: m.buckets.iter().any(|b| b.groups.plain.is_some()),
            pd_buckets: m.buckets.iter().any(|b| b.groups.pd.is_some()),
        })
        .collect();
    let mut problems = Problems::default();
    let built = discovery::build(section, &shapes, engine_key, &mut problems);
    if problems.0.is_empty() { Ok(built) } else { Err(problems.0) }
}

/// Registers every configured worker in `registry` (what the `kv-indexer` process needs),
/// with the same checks and field paths as [`build_models`].
pub fn register_all_workers(
    config: &ConfigFile,
    registry: &WorkerRegistry,
    engine_key: Option<&ApiKey>,
) -> Result<(), Vec<Problem>> {
    let mut problems = Problems::default();
    kv_problems(config, &mut problems);
    for (m, model) in config.models.iter().enumerate() {
        register_workers(&format!("models[{m}]"), model, registry, engine_key, &mut problems);
    }
    if problems.0.is_empty() { Ok(()) } else { Err(problems.0) }
}

/// Registers one model's workers; returns the role of each one registered.
fn register_workers(
    path: &str,
    model: &ModelConfig,
    registry: &WorkerRegistry,
    engine_key: Option<&ApiKey>,
    problems: &mut Problems,
) -> HashMap<WorkerId, Stage> {
    let model_id = ModelId::new(&model.id);
    let mut roles = HashMap::new();
    for (w, spec) in model.workers.iter().enumerate() {
        let wpath = format!("{path}.workers[{w}]");
        if let Some(named) = &spec.model
            && named != &model.id
        {
            problems.push(
                format!("{wpath}.model"),
                format!("{named:?} differs from the enclosing model {:?}", model.id),
            );
            continue;
        }
        let spec = with_engine_key(spec, engine_key);
        match Worker::from_spec(&spec, vec![model_id.clone()]).and_then(|w| registry.add(w)) {
            Ok(worker) => {
                roles.insert(worker.id().clone(), worker.stage());
            }
            Err(err) => problems.push(wpath, err),
        }
    }
    roles
}

/// `spec`, with `default` as its API key when it has none of its own.
pub fn with_engine_key<'a>(spec: &'a WorkerSpec, default: Option<&ApiKey>) -> Cow<'a, WorkerSpec> {
    match default {
        Some(key) if spec.api_key.is_none() => {
            Cow::Owned(WorkerSpec { api_key: Some(key.clone()), ..spec.clone() })
        }
        _ => Cow::Borrowed(spec),
    }
}

/// The discovery section when it may find engines of `model`: its `model`, the router's only
/// model, or any model when a label names it.
fn discovered<'a>(config: &'a ConfigFile, model: &ModelConfig) -> Option<&'a DiscoverySection> {
    config.discovery.as_ref().filter(|d| match (&d.model, &d.model_label) {
        (Some(named), _) => *named == model.id,
        (None, Some(_)) => true,
        (None, None) => config.models.len() == 1,
    })
}

fn build_model(
    path: &str,
    model: &ModelConfig,
    config: &ConfigFile,
    registry: &WorkerRegistry,
    handles: &PolicyHandles,
    engine_key: Option<&ApiKey>,
    problems: &mut Problems,
) -> Option<ModelRuntime> {
    let discovery = discovered(config, model);
    let max_tokenized_bytes = config.server.max_tokenized_prompt_bytes;
    let tokenized_models = config.models.iter().filter(|m| m.tokenizer.is_some()).count();
    let segment_cache_bytes =
        config.prepare.segment_cache_bytes / u64::try_from(tokenized_models.max(1)).unwrap_or(1);
    let model_id = ModelId::new(&model.id);
    let before = problems.0.len();
    let roles = register_workers(path, model, registry, engine_key, problems);
    let mut header = |key: &str, name: &str| {
        let parsed = http::HeaderName::from_bytes(name.as_bytes()).ok();
        if parsed.is_none() {
            problems
                .push(format!("{path}.affinity.{key}"), format!("{name:?} is not a header name"));
        }
        parsed
    };
    let session_header = header("session_id_header", &model.affinity.session_id_header);
    let routing_header = header("routing_key_header", &model.affinity.routing_key_header);

    // One store per kind of binding, each with its own idle timeout; a zero timeout is
    // reported at the key that set it.
    let mut store = |(idle_secs, key): (u64, &str)| {
        if idle_secs == 0 {
            problems.push(format!("{path}.affinity.{key}"), "must be at least 1");
            return None;
        }
        let config = router_affinity::AffinityConfig {
            idle_timeout: Duration::from_secs(idle_secs),
            sweep_interval: Duration::from_secs(model.affinity.eviction_interval_secs),
            max_entries: model.affinity.max_entries,
        };
        AffinityStore::new(config)
            .map(Arc::new)
            .map_err(|err| problems.push(format!("{path}.affinity"), err))
            .ok()
    };
    let sessions = store(model.affinity.session_idle_secs());
    let routing_keys = store(model.affinity.sticky_idle_secs());
    let (Some(sessions), Some(routing_keys)) = (sessions, routing_keys) else { return None };
    let handles = &handles.clone().with_affinity(Arc::clone(&sessions), Arc::clone(&routing_keys));

    let pd_model = roles.values().any(|s| s.is_pd());
    let mut buckets = Vec::new();
    for (b, bucket) in model.buckets.iter().enumerate() {
        let bpath = format!("{path}.buckets[{b}]");
        check_prefix_groups(model, discovery, &bucket.groups, &bpath, problems);
        let Some(groups) = build_groups(&bpath, &bucket.groups, handles, problems) else {
            continue;
        };
        if !roles.is_empty() && groups.is_pd() != pd_model {
            let (has, wants) = if pd_model { ("plain", "prefill/decode") } else { ("pd", "plain") };
            problems.push(
                format!("{bpath}.groups"),
                format!("a {has} bucket in a model served by {wants} engines"),
            );
            continue;
        }
        let slo =
            BucketSlo { ttft_ms: bucket.ttft_ms, tokens_per_second: bucket.tokens_per_second };
        let live = if slo.is_live() {
            match live_estimator(&bucket.groups, handles) {
                Ok(live) => live,
                Err(err) => {
                    problems.push(&bpath, err);
                    continue;
                }
            }
        } else {
            None
        };
        let spec = BucketSpec {
            id: bucket.id.clone(),
            rank: bucket.rank,
            limits: TokenLimits { min: bucket.limits.min, max: bucket.limits.max },
            max_context_tokens: bucket.max_context_tokens,
            groups,
            slo,
            live,
        };
        match Bucket::new(spec) {
            Ok(built) => {
                for err in built.check_membership(&roles) {
                    problems.push(format!("{bpath}.groups"), err);
                }
                buckets.push(built);
            }
            Err(err) => problems.push(bpath, err),
        }
    }
    let slo = SloPreferences { ttft: model.ttft_slo, tps: model.tps_slo };
    // A duplicate id is named where it is repeated, not only on the list.
    let mut duplicate = false;
    for (j, bucket) in model.buckets.iter().enumerate() {
        if let Some(first) = model.buckets[..j].iter().position(|b| b.id == bucket.id) {
            let message =
                format!("duplicate bucket id {:?} (first at buckets[{first}])", bucket.id);
            problems.push(format!("{path}.buckets[{j}].id"), message);
            duplicate = true;
        }
    }
    let resolver = match BucketResolver::new(model_id.clone(), buckets) {
        Ok(resolver) => Some(resolver.with_slo(slo)),
        Err(router_buckets::ResolverBuildError::DuplicateId { .. }) if duplicate => None,
        Err(err) => {
            problems.push(format!("{path}.buckets"), err);
            None
        }
    };
    let tokenization = match &model.tokenizer {
        None => {
            if model.chat_template.is_some() {
                problems.push(format!("{path}.chat_template"), "needs a tokenizer");
            }
            None
        }
        Some(tokenizer) => match Tokenization::load(tokenizer, model.chat_template.as_deref()) {
            Ok(t) => {
                let t = t
                    .with_engine(model.engine)
                    .with_max_tokenized_bytes(max_tokenized_bytes)
                    .with_segment_cache_bytes(segment_cache_bytes);
                // What the configuration names counts from the start; the rest is learned.
                t.follow_engines(model.workers.iter().map(|w| w.engine.or(model.engine)));
                Some(Arc::new(t))
            }
            Err(err) => {
                // The error and its causes, outermost first, on one line.
                let causes = std::iter::successors(
                    Some(&err as &(dyn std::error::Error + 'static)),
                    |err| err.source(),
                );
                let message = causes.map(ToString::to_string).collect::<Vec<_>>().join(": ");
                problems.push(format!("{path}.tokenizer"), message);
                None
            }
        },
    };
    if problems.0.len() > before {
        return None;
    }
    let reads_prefixes = model
        .buckets
        .iter()
        .flat_map(|bucket| each_group("", &bucket.groups))
        .any(|(_, _, group)| group.policy.prefix_provider().is_some());
    let needs_tokens = needs_tokens(model, &config.server, reads_prefixes);
    Some(ModelRuntime {
        id: model_id,
        resolver: resolver?,
        tokenization,
        reads_prefixes,
        needs_tokens,
        affinity: model.affinity.clone(),
        session_header: session_header?,
        routing_header: routing_header?,
        sessions,
        routing_keys,
    })
}

/// The live SLO estimator of a bucket: it reads what the bucket's first group (plain, or
/// prefill) reads ([`LiveEstimator::for_group`]). `None` for a bucket whose groups are not
/// configured as one kind (already reported by the group check).
fn live_estimator(
    groups: &GroupsConfig,
    handles: &PolicyHandles,
) -> Result<Option<Arc<LiveEstimator>>, router_policies::ConfigError> {
    let first = match (&groups.plain, &groups.pd) {
        (Some(plain), None) => plain,
        (None, Some(pd)) => &pd.prefill,
        _ => return Ok(None),
    };
    LiveEstimator::for_group(&first.policy, handles).map(|live| Some(Arc::new(live)))
}

/// Whether the router keeps a local prefix index fed by KV events. It does unless every group
/// that reads cached prefixes asks a remote indexer: such a deployment needs neither a tree
/// nor subscriptions of its own. (Without any prefix-reading group the index still shows the
/// engines' caches in `/admin/state`.)
pub fn keeps_local_index(config: &ConfigFile) -> bool {
    let mut providers = config
        .models
        .iter()
        .flat_map(|model| &model.buckets)
        .flat_map(|bucket| each_group("", &bucket.groups))
        .filter_map(|(_, _, group)| group.policy.prefix_provider())
        .peekable();
    providers.peek().is_none() || providers.any(|p| p == CachePrefixProvider::RadixTree)
}
