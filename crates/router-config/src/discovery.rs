//! `discovery:`, Kubernetes discovery in the configuration file, and its build into
//! router-discovery's `DiscoveryConfig` with every problem at its path.
//!
//! One section for the router: the cluster and namespace, a selector for plain engines or a
//! prefill and a decode selector, and the worker settings every discovered pod gets. The model
//! is `model` (default: the router's only one) or a pod label naming one of the configured
//! models (`model_label`); discovered workers join that model's buckets like configured ones.

use std::path::PathBuf;
use std::time::Duration;

use router_discovery::{
    BackoffConfig, ClusterConfig, DiscoveryConfig, KvEventsTemplate, LabelSelector, ModelSource,
    PodPort, PodSource, WorkerTemplate,
};
use router_workers::{ApiKey, DpRoute, LoadPollSpec, ModelId, Stage};
use serde::Deserialize;

use super::Problems;

/// `discovery`: engine pods found through the Kubernetes API.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiscoverySection {
    /// The API server's URL (`http://` allowed, for tests or a `kubectl proxy`); without
    /// `kubeconfig`, used without credentials.
    #[serde(default)]
    pub api_server: Option<String>,
    /// A kubeconfig file; default `KUBECONFIG`, `~/.kube/config`, then the pod's service
    /// account.
    #[serde(default)]
    pub kubeconfig: Option<PathBuf>,
    /// The namespace watched (`--service-discovery-namespace`); default the kubeconfig
    /// context's or the service account's.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Label selector of plain engines (`--selector`).
    #[serde(default)]
    pub selector: Option<String>,
    /// Label selector of prefill engines (`--prefill-selector`), with `decode_selector`.
    #[serde(default)]
    pub prefill_selector: Option<String>,
    /// Label selector of decode engines (`--decode-selector`), with `prefill_selector`.
    #[serde(default)]
    pub decode_selector: Option<String>,
    /// The model every discovered engine serves; default the router's only model.
    #[serde(default)]
    pub model: Option<String>,
    /// Instead of `model`: the pod label whose value names the model.
    #[serde(default)]
    pub model_label: Option<String>,
    /// The engine's HTTP port (`--service-discovery-port`): a number or a container port name.
    #[serde(default = "default_port")]
    pub port: PodPort,
    /// Speak HTTPS to the engines.
    #[serde(default)]
    pub https: bool,
    /// The engines' KV-event publisher, on the pod IP.
    #[serde(default)]
    pub kv_events: Option<KvEventsPorts>,
    /// The engines' gRPC load reporter port, on the pod IP.
    #[serde(default)]
    pub load_reporter_port: Option<PodPort>,
    /// Poll SGLang's `/v1/loads` instead.
    #[serde(default)]
    pub load_poll: Option<LoadPollSpec>,
    /// Data-parallel ranks per engine.
    #[serde(default = "one")]
    pub dp_size: u32,
    /// How the router names the chosen rank.
    #[serde(default)]
    pub dp_route: Option<DpRoute>,
    /// Tokens per KV block.
    #[serde(default)]
    pub block_size: Option<u32>,
    /// First wait after a failure (unreachable API server, 403, broken watch), in
    /// milliseconds; it doubles up to `backoff_max_ms`.
    #[serde(default = "default_backoff_initial_ms")]
    pub backoff_initial_ms: u64,
    /// Longest wait between attempts, in milliseconds.
    #[serde(default = "default_backoff_max_ms")]
    pub backoff_max_ms: u64,
}

impl Default for DiscoverySection {
    fn default() -> Self {
        Self {
            api_server: None,
            kubeconfig: None,
            namespace: None,
            selector: None,
            prefill_selector: None,
            decode_selector: None,
            model: None,
            model_label: None,
            port: default_port(),
            https: false,
            kv_events: None,
            load_reporter_port: None,
            load_poll: None,
            dp_size: 1,
            dp_route: None,
            block_size: None,
            backoff_initial_ms: default_backoff_initial_ms(),
            backoff_max_ms: default_backoff_max_ms(),
        }
    }
}

/// `discovery.kv_events`: the ports of the engines' KV-event publisher.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvEventsPorts {
    /// The PUB port.
    pub port: PodPort,
    /// The replay ROUTER port.
    #[serde(default)]
    pub replay_port: Option<PodPort>,
    /// Topic prefix subscribed to.
    #[serde(default)]
    pub topic: String,
    /// Tokens per KV block of the events.
    #[serde(default)]
    pub block_size: Option<u32>,
}

fn default_port() -> PodPort {
    PodPort::Number(80)
}

fn one() -> u32 {
    1
}

fn default_backoff_initial_ms() -> u64 {
    500
}

fn default_backoff_max_ms() -> u64 {
    30_000
}

/// What discovery needs to know of a configured model: its name and its kinds of buckets.
pub(super) struct ModelShape<'a> {
    /// `models[].id`.
    pub(super) id: &'a str,
    /// It has a plain bucket.
    pub(super) plain_buckets: bool,
    /// It has a pd bucket.
    pub(super) pd_buckets: bool,
}

/// Builds the discovery configuration of `section` for a router serving `models`, pushing
/// every problem with its path; `None` when there was one. Discovered workers get
/// `engine_key` as their API key.
pub(super) fn build(
    section: &DiscoverySection,
    models: &[ModelShape<'_>],
    engine_key: Option<&ApiKey>,
    problems: &mut Problems,
) -> Option<DiscoveryConfig> {
    let before = problems.0.len();
    let mut sources = Vec::new();
    for (key, stage, text) in [
        ("selector", Stage::Plain, &section.selector),
        ("prefill_selector", Stage::Prefill, &section.prefill_selector),
        ("decode_selector", Stage::Decode, &section.decode_selector),
    ] {
        let Some(text) = text else { continue };
        match LabelSelector::parse(text) {
            Ok(selector) => sources.push(PodSource { stage, selector }),
            Err(err) => problems.push(format!("discovery.{key}"), err),
        }
    }
    match (&section.selector, &section.prefill_selector, &section.decode_selector) {
        (None, None, None) => problems.push(
            "discovery",
            "needs selector (plain engines), or prefill_selector and decode_selector",
        ),
        (_, Some(_), None) => {
            problems.push("discovery.decode_selector", "needed with prefill_selector")
        }
        (_, None, Some(_)) => {
            problems.push("discovery.prefill_selector", "needed with decode_selector")
        }
        _ => {}
    }
    let model = model_source(section, models, problems);
    if let Some(ModelSource::Fixed(model)) = &model
        && let Some(config) = models.iter().find(|m| m.id == model.as_str())
    {
        check_kind(section, config, problems);
    }
    for (key, size) in [
        ("discovery.dp_size", Some(section.dp_size)),
        ("discovery.block_size", section.block_size),
        ("discovery.kv_events.block_size", section.kv_events.as_ref().and_then(|k| k.block_size)),
    ] {
        if size == Some(0) {
            problems.push(key, "must be at least 1");
        }
    }
    if let Some(url) = &section.api_server
        && let Err(err) = router_workers::validate_url(url)
    {
        problems.push("discovery.api_server", err);
    }
    if section.namespace.as_deref().is_some_and(|ns| ns.trim().is_empty()) {
        problems.push("discovery.namespace", "must not be empty");
    }
    if section.backoff_initial_ms == 0 {
        problems.push("discovery.backoff_initial_ms", "must be at least 1");
    }
    if section.backoff_max_ms < section.backoff_initial_ms {
        problems.push("discovery.backoff_max_ms", "must be at least backoff_initial_ms");
    }
    for (key, port) in [
        ("discovery.port", Some(&section.port)),
        ("discovery.load_reporter_port", section.load_reporter_port.as_ref()),
        ("discovery.kv_events.port", section.kv_events.as_ref().map(|k| &k.port)),
        (
            "discovery.kv_events.replay_port",
            section.kv_events.as_ref().and_then(|k| k.replay_port.as_ref()),
        ),
    ] {
        match port {
            Some(PodPort::Number(0)) => problems.push(key, "must be a port from 1 to 65535"),
            Some(PodPort::Name(name)) if name.is_empty() || name.len() > 15 => {
                problems.push(key, "a container port name has 1 to 15 characters")
            }
            _ => {}
        }
    }
    if problems.0.len() > before {
        return None;
    }
    let template = WorkerTemplate {
        https: section.https,
        port: section.port.clone(),
        kv_events: section.kv_events.as_ref().map(|kv| KvEventsTemplate {
            port: kv.port.clone(),
            replay_port: kv.replay_port.clone(),
            topic: kv.topic.clone(),
            block_size: kv.block_size,
        }),
        load_reporter_port: section.load_reporter_port.clone(),
        load_poll: section.load_poll.clone(),
        dp_size: section.dp_size,
        dp_route: section.dp_route,
        block_size: section.block_size,
        api_key: engine_key.cloned(),
    };
    Some(DiscoveryConfig {
        cluster: ClusterConfig {
            api_server: section.api_server.clone(),
            kubeconfig: section.kubeconfig.clone(),
            namespace: section.namespace.clone(),
        },
        sources,
        template,
        model: model?,
        backoff: BackoffConfig {
            initial: Duration::from_millis(section.backoff_initial_ms),
            max: Duration::from_millis(section.backoff_max_ms),
        },
    })
}

fn model_source(
    section: &DiscoverySection,
    models: &[ModelShape<'_>],
    problems: &mut Problems,
) -> Option<ModelSource> {
    let served: Vec<ModelId> = models.iter().map(|m| ModelId::new(m.id)).collect();
    let names = || models.iter().map(|m| m.id).collect::<Vec<_>>().join(", ");
    match (&section.model, &section.model_label) {
        (Some(_), Some(_)) => {
            problems.push("discovery.model_label", "exclusive with discovery.model");
            None
        }
        (Some(model), None) => match served.iter().find(|m| m.as_str() == model) {
            Some(model) => Some(ModelSource::Fixed(model.clone())),
            None => {
                problems.push(
                    "discovery.model",
                    format!("{model:?} is not a configured model ({})", names()),
                );
                None
            }
        },
        (None, Some(key)) => {
            // A key alone parses as the selector "has this label", and as nothing else.
            let plain = !key.contains(|c: char| "=!,()".contains(c) || c.is_whitespace());
            let valid = plain && LabelSelector::parse(key).is_ok_and(|s| s.to_string() == *key);
            if valid {
                Some(ModelSource::Label { key: key.clone(), served })
            } else {
                problems.push("discovery.model_label", format!("{key:?} is not a label key"));
                None
            }
        }
        (None, None) => match served.as_slice() {
            [only] => Some(ModelSource::Fixed(only.clone())),
            _ => {
                problems.push(
                    "discovery.model",
                    format!(
                        "required: this router serves {} models ({}); or name them with \
                         model_label",
                        served.len(),
                        names()
                    ),
                );
                None
            }
        },
    }
}

/// A model is served by plain engines or by PD pairs: its selectors and its buckets agree.
fn check_kind(section: &DiscoverySection, model: &ModelShape<'_>, problems: &mut Problems) {
    let pd_selectors = section.prefill_selector.is_some() || section.decode_selector.is_some();
    if section.selector.is_some() && pd_selectors {
        problems.push(
            "discovery.selector",
            format!(
                "model {:?} would be served by plain and PD engines: use selector or the \
                 prefill and decode selectors (or model_label for several models)",
                model.id
            ),
        );
        return;
    }
    if pd_selectors && model.plain_buckets {
        problems.push(
            "discovery.prefill_selector",
            format!("model {:?} has plain buckets, which cannot use prefill engines", model.id),
        );
    }
    if section.selector.is_some() && model.pd_buckets {
        problems.push(
            "discovery.selector",
            format!("model {:?} has pd buckets, which cannot use plain engines", model.id),
        );
    }
}
