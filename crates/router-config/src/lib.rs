//! The router's configuration: the file, the command line, and building the routing objects
//! from them (see the crate's README.md).
//!
//! Validation is the build itself: every model, worker, bucket, group and policy is
//! constructed, and every failure is collected with the path of the offending field, so
//! `check-config` and startup report the same problems.

mod build;
mod cli;
mod discovery;
mod dropin;
mod file;
mod groups;
mod incumbents;
mod located;
mod quick_start;
mod sections;
mod server;

use std::fmt;
use std::sync::Arc;

use router_affinity::AffinityStore;
use router_buckets::BucketResolver;
use router_workers::{ModelId, Worker, WorkerId, WorkerRegistry};

pub use cli::{
    Cli, Command, DEFAULT_EPP_FALLBACKS, DEFAULT_EPP_GRPC_PORT, ServeArgs, reject_dropped_options,
};
pub use discovery::{DiscoverySection, KvEventsPorts};
pub use dropin::{DropInArgs, learn_dp_sizes};
pub use file::{
    ANY_MODEL, AffinitySection, BucketConfig, ConfigFile, GroupConfig, GroupsConfig, KvSection,
    LimitsConfig, LoadSection, ModelConfig, ParseError, PdGroupsConfig, PrepareSection,
};
pub use incumbents::{Screened, screen};
pub use located::{Located, Positions, read as read_located};
pub use sections::{HealthSection, Rate, RateLimitSection, RetrySection, TelemetrySection};
pub use server::{ClientKeyConfig, Http1Server, ServerSection};

use router_prepare::Tokenization;

pub use build::{
    build_discovery, build_models, keeps_local_index, register_all_workers, with_engine_key,
};

/// One configuration problem, with the path of the field it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Field path, e.g. `models[0].buckets[1].groups.pd.decode.policy`.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// The routing objects of one model, built from its configuration.
pub struct ModelRuntime {
    /// Session bindings of this model's `session_aware` groups.
    pub sessions: Arc<AffinityStore>,
    /// Routing-key bindings of this model's `sticky` groups.
    pub routing_keys: Arc<AffinityStore>,
    /// The model name (`*` serves any name).
    pub id: ModelId,
    /// Its buckets.
    pub resolver: BucketResolver,
    /// Tokenizer and chat template, when configured.
    pub tokenization: Option<Arc<Tokenization>>,
    /// Whether a group of the model reads cached prefixes (`cache_aware`, `predicted_ttft`):
    /// its prompts are then hashed by text when it has no tokenizer, and its dispatches to
    /// engines without KV events are remembered (approximate mode).
    pub reads_prefixes: bool,
    /// Whether something reads a request's token ids or exact count (`needs_tokens`): only
    /// then is it tokenized; otherwise the size estimate stands.
    pub needs_tokens: bool,
    /// Affinity headers and expiry.
    pub affinity: AffinitySection,
    /// `affinity.session_id_header`, parsed once.
    pub session_header: http::HeaderName,
    /// `affinity.routing_key_header`, parsed once.
    pub routing_header: http::HeaderName,
}

impl fmt::Debug for ModelRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelRuntime").field("id", &self.id).finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Problems(Vec<Problem>);

impl Problems {
    fn push(&mut self, path: impl Into<String>, message: impl ToString) {
        self.0.push(Problem { path: path.into(), message: message.to_string() });
    }
}

/// A one-paragraph summary for `check-config`.
pub fn summary<'a>(
    models: impl IntoIterator<Item = &'a ModelRuntime>,
    registry: &WorkerRegistry,
) -> String {
    let mut models: Vec<&ModelRuntime> = models.into_iter().collect();
    models.sort_by(|a, b| a.id.cmp(&b.id));
    let mut out = String::new();
    for &model in &models {
        let workers = registry.workers().iter().filter(|w| w.serves(&model.id)).count();
        let slo = model.resolver.slo();
        out.push_str(&format!(
            "model {}: {} workers, tokenizer {}, ttft_slo {}, tps_slo {}\n",
            model.id,
            workers,
            if model.tokenization.is_some() { "loaded" } else { "none (size estimate)" },
            slo.ttft,
            slo.tps,
        ));
        for bucket in model.resolver.buckets() {
            let limits = bucket.limits();
            out.push_str(&format!(
                "  bucket {} (rank {}, input {}..={}, context {}",
                bucket.id(),
                bucket.rank(),
                limits.min,
                limits.max.map_or("unbounded".to_owned(), |m| m.to_string()),
                bucket.max_context_tokens().map_or("unbounded".to_owned(), |m| m.to_string()),
            ));
            // Declared estimates, and the missing ones an enabled preference will compare.
            let declared = bucket.slo();
            let unset = || "unset".to_owned();
            if declared.ttft_ms.is_some() || slo.ttft.is_enabled() {
                let ttft = declared.ttft_ms.map_or_else(unset, |e| e.to_string());
                out.push_str(&format!(", ttft_ms {ttft}"));
            }
            if declared.tokens_per_second.is_some() || slo.tps.is_enabled() {
                let tps = declared.tokens_per_second.map_or_else(unset, |e| e.to_string());
                out.push_str(&format!(", tokens_per_second {tps}"));
            }
            out.push_str("):");
            for group in bucket.groups().iter() {
                let members = group.members().map_or("all".to_owned(), |m| {
                    m.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
                });
                out.push_str(&format!(
                    " {} [{}] {}",
                    group.stage(),
                    members,
                    group.policy().name()
                ));
            }
            if let Some(pair_on) = bucket.groups().pair_on().filter(|p| !p.is_empty()) {
                out.push_str(&format!(", pair_on [{pair_on}]"));
            }
            out.push('\n');
        }
    }
    for warning in pairing_warnings(models, registry) {
        out.push_str(&format!("warning: {warning}\n"));
    }
    out
}

/// What an operator should hear about the PD pairing constraints of `models` over the
/// workers in `registry` now: `pair_on` labels no worker carries, and prefill engines with no
/// compatible decode engine in a bucket (by model, then bucket in configuration order).
/// Warnings, never errors: workers come and go through the admin API. With `only`, just
/// whether that prefill engine has a partner in each bucket of its model.
pub fn pairing_warnings<'a>(
    models: impl IntoIterator<Item = &'a ModelRuntime>,
    registry: &WorkerRegistry,
) -> Vec<router_buckets::PairingWarning> {
    pairing_warnings_for(models, registry, None)
}

/// [`pairing_warnings`] about one prefill engine only.
pub fn pairing_warnings_for<'a>(
    models: impl IntoIterator<Item = &'a ModelRuntime>,
    registry: &WorkerRegistry,
    only: Option<&WorkerId>,
) -> Vec<router_buckets::PairingWarning> {
    let workers = registry.workers();
    let mut models: Vec<&ModelRuntime> = models.into_iter().collect();
    models.sort_by(|a, b| a.id.cmp(&b.id));
    let mut warnings = Vec::new();
    for model in models {
        let served: Vec<Arc<Worker>> =
            workers.iter().filter(|w| w.serves(&model.id)).cloned().collect();
        for bucket in model.resolver.buckets() {
            warnings.extend(bucket.pairing_warnings(&served, only));
        }
    }
    warnings
}
