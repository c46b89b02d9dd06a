//! The command line: serving with a file, `check-config`, `kv-indexer`, `epp`, `--demo`, and the
//! quick-start flags that build a single bucket without a file.
//!
//! No flag is dropped without a word ([`Cli::check`]): a quick-start flag with `--config` or
//! `--demo`, a PD flag without `--pd-disaggregation`, or a serving flag with a subcommand is
//! an error naming it. `--host`, `--port`, `--log-json`, `--worker-threads`, `--admin-token`
//! and the flags shared with sglang-router and vllm-router ([`DropInArgs`]) apply on top of a
//! file or the demo.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use router_workers::ApiKey;

use router_discovery::PodPort;

use super::discovery::DiscoverySection;
use super::dropin::{self, DropInArgs};
use super::file::ConfigFile;
use super::server::Http1Server;

/// The gRPC port of the endpoint picker unless `--grpc-port` says otherwise (the Gateway API
/// inference extension's convention).
pub const DEFAULT_EPP_GRPC_PORT: u16 = 9002;

/// Fallback engines the endpoint picker names after its pick unless `--fallbacks` says
/// otherwise: none, because plain Envoy's ORIGINAL_DST cluster reads the header as one address
/// (measured on Envoy 1.40: a list there finds no host); gateways that walk the list on retries
/// take `--fallbacks N`.
pub const DEFAULT_EPP_FALLBACKS: usize = 0;

/// The router's command line.
#[derive(Debug, Parser)]
#[command(name = "router-server", version, about = "A router for LLM inference fleets")]
pub struct Cli {
    /// What to run; without a subcommand the router serves.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Event-loop threads serving clients (overrides `server.worker_threads`; default: one per
    /// core). Each has its own listener and engine connections.
    #[arg(long, global = true, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub worker_threads: Option<u16>,
    /// Serving options.
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate a configuration file: print every problem and exit 1, or a summary and exit 0.
    CheckConfig {
        /// The configuration file.
        file: PathBuf,
    },
    /// Run only the KV-event subscriptions and index of the configured engines and serve the
    /// remote-indexer gRPC API.
    KvIndexer {
        /// The configuration file.
        #[arg(long)]
        config: PathBuf,
        /// Address of the gRPC listener.
        #[arg(long, default_value = "127.0.0.1:50060")]
        listen: String,
    },
    /// Run as an endpoint picker for Envoy-based gateways: an ext_proc gRPC server that picks
    /// each request's engine (workers, buckets and policies from the file) and lets Envoy
    /// forward; the file's `server.host:server.port` serves health, metrics and the admin API.
    Epp {
        /// The configuration file.
        #[arg(long)]
        config: PathBuf,
        /// Port of the ext_proc gRPC listener, on the file's `server.host` (0: any free port).
        #[arg(long, default_value_t = DEFAULT_EPP_GRPC_PORT)]
        grpc_port: u16,
        /// Engines named after the pick in `x-gateway-destination-endpoint`, for Envoy's retries.
        #[arg(long, default_value_t = DEFAULT_EPP_FALLBACKS, value_name = "N")]
        fallbacks: usize,
    },
}

/// Options of the serving mode.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Configuration file (YAML or JSON).
    #[arg(long, conflicts_with = "demo")]
    pub config: Option<PathBuf>,
    /// Run in front of an embedded simulated fleet.
    #[arg(long)]
    pub demo: bool,
    /// Listen address (overrides the file).
    #[arg(long)]
    pub host: Option<String>,
    /// Listen port (overrides the file).
    #[arg(long)]
    pub port: Option<u16>,
    /// Emit logs as JSON lines.
    #[arg(long)]
    pub log_json: bool,
    /// What reads clients' HTTP/1.1, `own` or `hyper` (overrides the file's `server.http1`).
    #[arg(long, value_enum)]
    pub http1: Option<Http1Server>,
    /// Quick start: plain engines for a single bucket.
    #[arg(long, num_args = 1.., value_name = "URL")]
    pub worker_urls: Vec<String>,
    /// Quick start: policy of the plain group.
    #[arg(long, value_name = "NAME")]
    pub policy: Option<String>,
    /// Quick start: prefill/decode disaggregation.
    #[arg(long)]
    pub pd_disaggregation: bool,
    /// Quick start: a prefill engine, optionally followed by its bootstrap port (or `none`: the
    /// engine's default bootstrap port). Repeatable.
    #[arg(long, num_args = 1..=2, value_names = ["URL", "BOOTSTRAP_PORT"], action = clap::ArgAction::Append)]
    pub prefill: Vec<String>,
    /// Quick start: a decode engine. Repeatable.
    #[arg(long, value_name = "URL", action = clap::ArgAction::Append)]
    pub decode: Vec<String>,
    /// Quick start: route each request to a data-parallel rank the router picks
    /// (`dp_route: body`), learning each engine's `dp_size` from its `/get_server_info` at
    /// startup, as sglang-router does.
    #[arg(long)]
    pub dp_aware: bool,
    /// Quick start: policy of the prefill group.
    #[arg(long, value_name = "NAME")]
    pub prefill_policy: Option<String>,
    /// Quick start: policy of the decode group.
    #[arg(long, value_name = "NAME")]
    pub decode_policy: Option<String>,
    /// Quick start: the model name served (default `*`, which accepts any name).
    #[arg(long)]
    pub model: Option<String>,
    /// Quick start: tokenizer.json for the model.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Quick start: the model's tokenizer as sglang-router and smg name it: a `tokenizer.json`,
    /// or a local directory holding one (nothing is downloaded).
    #[arg(long, value_name = "PATH", visible_alias = "tokenizer-path")]
    pub model_path: Option<PathBuf>,
    /// Quick start: the model's chat template file (`models[].chat_template`).
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// Quick start: the engines' runtime, `sglang` or `vllm` (`models[].engine`).
    #[arg(long, value_name = "NAME")]
    pub backend: Option<String>,
    /// Quick start: each engine's data-parallel size, ranks chosen by the router and named in
    /// vLLM's `X-data-parallel-rank` header (`dp_size`, `dp_route: header`).
    #[arg(long, value_name = "N")]
    pub intra_node_data_parallel_size: Option<u32>,
    /// Quick start: `URL=ENDPOINT`, the KV-event publisher of the engine at URL. Repeatable.
    #[arg(long, value_name = "URL=ENDPOINT", action = clap::ArgAction::Append)]
    pub kv_event_source: Vec<String>,
    /// Quick start: `URL=ENDPOINT`, the KV replay endpoint of the engine at URL. Repeatable.
    #[arg(long, value_name = "URL=ENDPOINT", action = clap::ArgAction::Append)]
    pub kv_event_replay_source: Vec<String>,
    /// Quick start: tokens per KV block of the engines given `--kv-event-source`.
    #[arg(long, value_name = "N")]
    pub kv_event_block_size: Option<u32>,
    /// Quick start: `cache_aware` hits need this share of the prompt cached
    /// (`cache_affinity_min_matched_ratio`).
    #[arg(long, value_name = "RATIO", visible_alias = "cache-match-threshold")]
    pub cache_threshold: Option<f64>,
    /// Quick start: the header the routing key is read from (`affinity.routing_key_header`;
    /// the first of several).
    #[arg(long, num_args = 1.., value_name = "HEADER")]
    pub routing_key_headers: Vec<String>,
    /// Quick start: routing-key bindings unused this long expire
    /// (`affinity.sticky_idle_timeout_secs`).
    #[arg(long, value_name = "SECS", visible_alias = "sticky-key-idle-secs")]
    pub max_idle_secs: Option<u64>,
    /// Quick start: `overloaded` caps router-local in-flight requests per engine.
    #[arg(long, value_name = "NAME")]
    pub filter: Vec<String>,
    /// Quick start: router-local in-flight cap per engine (`max_inflight_requests`).
    #[arg(long, value_name = "N")]
    pub max_in_flight: Option<u64>,
    /// Quick start: policy tuning `KEY=VALUE` (e.g. `cache_affinity_min_matched_tokens=512`).
    #[arg(long = "policy-arg", value_name = "KEY=VALUE")]
    pub policy_args: Vec<String>,
    /// Session-affinity mode; only `strict` (admitted-binding reuse) exists.
    #[arg(long, value_name = "MODE")]
    pub affinity_mode: Option<String>,
    /// Admin API bearer token (overrides `server.admin_token`; or `ROUTER_ADMIN_TOKEN`).
    #[arg(long)]
    pub admin_token: Option<String>,
    /// Find engines as Kubernetes pods (`discovery` in the file): with `--selector`, or with
    /// `--prefill-selector` and `--decode-selector`. On top of a file it sets those keys; as a
    /// quick start the discovered engines are the model's (besides any `--worker-urls`).
    #[arg(long)]
    pub service_discovery: bool,
    /// Discovery: label selector of plain engine pods, `KEY=VALUE` requirements (several are
    /// joined with commas; any selector syntax works).
    #[arg(long, num_args = 1.., value_name = "KEY=VALUE")]
    pub selector: Vec<String>,
    /// Discovery: label selector of prefill engine pods.
    #[arg(long, num_args = 1.., value_name = "KEY=VALUE")]
    pub prefill_selector: Vec<String>,
    /// Discovery: label selector of decode engine pods.
    #[arg(long, num_args = 1.., value_name = "KEY=VALUE")]
    pub decode_selector: Vec<String>,
    /// Discovery: the namespace watched (default: the kubeconfig context's or the pod's own).
    #[arg(long, value_name = "NAMESPACE")]
    pub service_discovery_namespace: Option<String>,
    /// Discovery: the engines' HTTP port, a number or a container port name (default 80).
    #[arg(long, value_name = "PORT")]
    pub service_discovery_port: Option<String>,
    /// The flags shared with sglang-router and vllm-router.
    #[command(flatten)]
    pub dropin: DropInArgs,
}

impl Cli {
    /// Checks that every flag given applies to what runs, so that none is ignored: serving
    /// flags have no effect on a subcommand, and quick-start flags none on a file or the demo.
    pub fn check(&self) -> Result<(), String> {
        let Some(command) = &self.command else { return self.serve.check() };
        let name = match command {
            Command::CheckConfig { .. } => "check-config",
            Command::KvIndexer { .. } => "kv-indexer",
            Command::Epp { .. } => "epp",
        };
        let serving = self.worker_threads.map(|_| "--worker-threads");
        match serving.into_iter().chain(self.serve.given().into_iter().map(|(flag, _)| flag)).next()
        {
            Some(flag) => Err(format!(
                "{flag} applies only when serving, not to {name}: {name} reads everything from its \
                 configuration file"
            )),
            None => Ok(()),
        }
    }
}

/// Where a quick-start setting goes in a configuration file.
fn file_equivalent(flag: &str) -> &'static str {
    match flag {
        "--worker-urls" => "models[].workers (role: plain)",
        "--pd-disaggregation" | "--prefill" | "--decode" => {
            "models[].workers (role: prefill with bootstrap_port, or decode) and a pd bucket"
        }
        "--policy" | "--prefill-policy" | "--decode-policy" => {
            "models[].buckets[].groups.<group>.policy"
        }
        "--policy-arg" => "the keys of models[].buckets[].groups.<group>.policy",
        "--model" => "models[].id",
        "--tokenizer" => "models[].tokenizer",
        "--filter" | "--max-in-flight" => "policy.admission.max_inflight_requests",
        "--affinity-mode" => "nothing: strict is the only affinity mode; drop the flag",
        "--dp-aware" => "models[].workers[].dp_size and dp_route: body",
        _ => "its equivalent",
    }
}

/// Options and values that were removed, with what replaces them. Checked on the raw
/// arguments before parsing so the message can say more than "unknown argument".
pub fn reject_dropped_options(args: &[String]) -> Result<(), String> {
    if let Some(refusal) = dropin::refuse(args) {
        return Err(refusal);
    }
    let value_after = |flag: &str| {
        args.iter().enumerate().find_map(|(i, a)| {
            a.strip_prefix(&format!("{flag}="))
                .map(str::to_owned)
                .or_else(|| (a == flag).then(|| args.get(i + 1).cloned().unwrap_or_default()))
        })
    };
    for arg in args {
        let name = arg.split('=').next().unwrap_or(arg);
        if name.starts_with("--fuse") {
            return Err(format!(
                "{name} was removed with the fused_score policy; use --policy cache_aware (its \
                 switch margin and pressure guard) or power_of_two"
            ));
        }
        if name == "--stable-pair" {
            return Err("--stable-pair was removed: prefill and decode are always picked from \
                        the same bucket by their own group policies"
                .to_owned());
        }
        if name == "--prefix-cache-min-share" {
            return Err("--prefix-cache-min-share was removed; use --policy cache_aware with \
                        --policy-arg cache_affinity_min_matched_tokens=N (not equivalent: it \
                        gates on matched tokens, not share)"
                .to_owned());
        }
    }
    for flag in ["--policy", "--prefill-policy", "--decode-policy"] {
        match value_after(flag).as_deref() {
            Some(name @ ("fused_score" | "score_policy")) => {
                return Err(format!(
                    "{flag} {name} was removed; use cache_aware for prefix-aware selection or \
                     power_of_two / load_based for load"
                ));
            }
            Some("legacy_host_affinity") => {
                return Err(format!(
                    "{flag} legacy_host_affinity was removed; use power_of_two (or \
                     session_aware for conversation affinity)"
                ));
            }
            _ => {}
        }
    }
    if value_after("--affinity-mode").as_deref() == Some("soft") {
        return Err("--affinity-mode soft was removed: only strict admitted-binding reuse \
                    remains (the default); drop the option"
            .to_owned());
    }
    if value_after("--filter").as_deref() == Some("prefix_cache") {
        return Err("--filter prefix_cache was removed; use --policy cache_aware, whose minimum \
                    hit gate replaces it (not equivalent to the removed share filter)"
            .to_owned());
    }
    Ok(())
}

impl ServeArgs {
    /// Whether quick-start flags describe the fleet.
    pub fn is_quick_start(&self) -> bool {
        !self.worker_urls.is_empty() || self.pd_disaggregation || self.service_discovery
    }

    /// The discovery flags given besides `--service-discovery`.
    fn discovery_flags(&self) -> Vec<&'static str> {
        let s = self;
        [
            ("--selector", !s.selector.is_empty()),
            ("--prefill-selector", !s.prefill_selector.is_empty()),
            ("--decode-selector", !s.decode_selector.is_empty()),
            ("--service-discovery-namespace", s.service_discovery_namespace.is_some()),
            ("--service-discovery-port", s.service_discovery_port.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, set)| set.then_some(flag))
        .collect()
    }

    /// Every serving flag given, with whether it is quick-start only (it builds the
    /// configuration that a file or the demo otherwise provides).
    fn given(&self) -> Vec<(&'static str, bool)> {
        let s = self;
        [
            ("--config", s.config.is_some(), false),
            ("--demo", s.demo, false),
            ("--host", s.host.is_some(), false),
            ("--port", s.port.is_some(), false),
            ("--log-json", s.log_json, false),
            ("--http1", s.http1.is_some(), false),
            ("--admin-token", s.admin_token.is_some(), false),
            ("--worker-urls", !s.worker_urls.is_empty(), true),
            ("--pd-disaggregation", s.pd_disaggregation, true),
            ("--prefill", !s.prefill.is_empty(), true),
            ("--decode", !s.decode.is_empty(), true),
            ("--policy", s.policy.is_some(), true),
            ("--prefill-policy", s.prefill_policy.is_some(), true),
            ("--decode-policy", s.decode_policy.is_some(), true),
            ("--model", s.model.is_some(), true),
            ("--tokenizer", s.tokenizer.is_some(), true),
            ("--filter", !s.filter.is_empty(), true),
            ("--max-in-flight", s.max_in_flight.is_some(), true),
            ("--policy-arg", !s.policy_args.is_empty(), true),
            ("--affinity-mode", s.affinity_mode.is_some(), true),
            ("--dp-aware", s.dp_aware, true),
            ("--model-path", s.model_path.is_some(), true),
            ("--chat-template", s.chat_template.is_some(), true),
            ("--backend", s.backend.is_some(), true),
            ("--intra-node-data-parallel-size", s.intra_node_data_parallel_size.is_some(), true),
            ("--kv-event-source", !s.kv_event_source.is_empty(), true),
            ("--kv-event-replay-source", !s.kv_event_replay_source.is_empty(), true),
            ("--kv-event-block-size", s.kv_event_block_size.is_some(), true),
            ("--cache-threshold", s.cache_threshold.is_some(), true),
            ("--routing-key-headers", !s.routing_key_headers.is_empty(), true),
            ("--max-idle-secs", s.max_idle_secs.is_some(), true),
            ("--service-discovery", s.service_discovery, false),
        ]
        .into_iter()
        .filter(|(_, set, _)| *set)
        .map(|(flag, _, quick)| (flag, quick))
        .chain(self.discovery_flags().into_iter().map(|flag| (flag, false)))
        .chain(self.dropin.given().into_iter().map(|flag| (flag, false)))
        .collect()
    }

    /// Quick-start flags only build a quick start, and the PD ones only a PD quick start.
    fn check(&self) -> Result<(), String> {
        let quick: Vec<&str> =
            self.given().into_iter().filter(|(_, quick)| *quick).map(|(flag, _)| flag).collect();
        if let Some(flag) = quick.first() {
            if self.config.is_some() {
                return Err(format!(
                    "{flag} is a quick-start flag and has no effect with --config: set {} in \
                     the configuration file instead",
                    file_equivalent(flag)
                ));
            }
            if self.demo {
                return Err(format!(
                    "{flag} is a quick-start flag and has no effect with --demo, whose fleet and \
                     policies are fixed"
                ));
            }
        }
        let discovery = self.discovery_flags();
        if let Some(flag) = discovery.first().filter(|_| !self.service_discovery) {
            return Err(format!("{flag} needs --service-discovery"));
        }
        if self.service_discovery && self.demo {
            return Err("--service-discovery has no effect with --demo, whose fleet is fixed: \
                        serve a configuration file with a discovery section instead"
                .to_owned());
        }
        if self.service_discovery && self.config.is_none() {
            let pd_selector =
                discovery.iter().find(|f| ["--prefill-selector", "--decode-selector"].contains(f));
            if let Some(flag) = pd_selector.filter(|_| !self.pd_disaggregation) {
                return Err(format!("{flag} needs --pd-disaggregation"));
            }
            if self.pd_disaggregation && discovery.contains(&"--selector") {
                return Err("--selector selects plain engines: a --pd-disaggregation quick start \
                            discovers with --prefill-selector and --decode-selector"
                    .to_owned());
            }
        }
        if !self.pd_disaggregation
            && let Some(flag) = quick.iter().find(|f| {
                ["--prefill", "--decode", "--prefill-policy", "--decode-policy"].contains(f)
            })
        {
            return Err(format!("{flag} needs --pd-disaggregation"));
        }
        Ok(())
    }

    /// Applies the flags that go on top of any configuration (a file, the demo or a quick
    /// start) but `--host`, `--port` and `--log-json`: `--admin-token`, the flags shared with
    /// sglang-router and vllm-router, and the discovery flags, which set the keys of the
    /// `discovery` section (creating it).
    pub fn apply_overrides(&self, config: &mut ConfigFile) -> Result<(), String> {
        self.dropin.apply(config)?;
        if let Some(token) = &self.admin_token {
            let token =
                ApiKey::new(token.as_str()).map_err(|why| format!("--admin-token: {why}"))?;
            config.server.admin_token = Some(token);
        }
        if self.service_discovery {
            let section = config.discovery.get_or_insert_with(DiscoverySection::default);
            for (flag, key) in [
                (&self.selector, &mut section.selector),
                (&self.prefill_selector, &mut section.prefill_selector),
                (&self.decode_selector, &mut section.decode_selector),
            ] {
                if !flag.is_empty() {
                    *key = Some(flag.join(","));
                }
            }
            if let Some(namespace) = &self.service_discovery_namespace {
                section.namespace = Some(namespace.clone());
            }
            if let Some(port) = &self.service_discovery_port {
                section.port = match port.parse::<u16>() {
                    Ok(number) => PodPort::Number(number),
                    Err(_) if port.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') => {
                        PodPort::Name(port.clone())
                    }
                    Err(_) => {
                        return Err(format!(
                            "--service-discovery-port {port}: a port number or a container \
                             port name"
                        ));
                    }
                };
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use router_workers::{DpRoute, Stage};

    use super::*;
    use crate::quick_start::DEFAULT_OVERLOAD_INFLIGHT;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    fn parse(line: &str) -> Cli {
        Cli::try_parse_from(args(&format!("router-server {line}"))).expect("parses")
    }

    #[test]
    fn every_dropped_option_is_rejected_with_its_replacement() {
        for (line, mention) in [
            ("--policy fused_score", "cache_aware"),
            ("--policy=score_policy", "cache_aware"),
            ("--fuse-weight-cache 0.5", "fused_score"),
            ("--decode-policy legacy_host_affinity", "power_of_two"),
            ("--stable-pair", "same bucket"),
            ("--affinity-mode soft", "strict"),
            ("--filter prefix_cache", "cache_aware"),
            ("--prefix-cache-min-share 0.3", "cache_affinity_min_matched_tokens"),
        ] {
            let err = reject_dropped_options(&args(line)).expect_err(line);
            let option = line.split([' ', '=']).next().unwrap_or(line);
            assert!(err.contains(option), "{line}: {err}");
            assert!(err.contains(mention), "{line}: {err}");
        }
        reject_dropped_options(&args("--policy cache_aware --filter overloaded")).expect("fine");
    }

    #[test]
    fn worker_urls_build_one_plain_bucket() {
        let cli =
            parse("--worker-urls http://a:1 http://b:2 --policy load_based --max-in-flight 7");
        let config = cli.serve.quick_start_config().expect("config");
        let model = &config.models[0];
        assert_eq!(model.workers.len(), 2);
        assert_eq!(model.workers[1].url, "http://b:2");
        let group = model.buckets[0].groups.plain.as_ref().expect("plain");
        assert_eq!(group.policy.policy_type().to_string(), "load_based");
        assert_eq!(group.policy.admission.max_inflight_requests, Some(7));
    }

    #[test]
    fn filter_overloaded_maps_to_max_inflight_requests() {
        let cli = parse("--worker-urls http://a:1 --filter overloaded");
        let config = cli.serve.quick_start_config().expect("config");
        let group = config.models[0].buckets[0].groups.plain.as_ref().expect("plain");
        assert_eq!(group.policy.admission.max_inflight_requests, Some(DEFAULT_OVERLOAD_INFLIGHT));
    }

    #[test]
    fn pd_flags_build_one_pd_bucket_with_bootstrap_ports() {
        let cli = parse(
            "--pd-disaggregation --prefill http://p1:1 9001 --prefill http://p2:1 \
             --decode http://d1:1 --prefill-policy power_of_two --decode-policy random",
        );
        let config = cli.serve.quick_start_config().expect("config");
        let workers = &config.models[0].workers;
        assert_eq!(workers.len(), 3);
        assert_eq!(workers[0].bootstrap_port, Some(9001));
        assert_eq!(workers[1].bootstrap_port, None);
        assert_eq!(workers[2].role, Stage::Decode);
        let pd = config.models[0].buckets[0].groups.pd.as_ref().expect("pd");
        assert_eq!(pd.prefill.policy.policy_type().to_string(), "power_of_two");
        assert_eq!(pd.decode.policy.policy_type().to_string(), "random");
    }

    #[test]
    fn a_flag_that_would_have_no_effect_is_an_error_naming_it() {
        // (command line, the flag named, another fragment of the message)
        for (line, flag, mention) in [
            ("--config r.yaml --policy cache_aware", "--policy", "groups.<group>.policy"),
            ("--config r.yaml --max-in-flight 4", "--max-in-flight", "max_inflight_requests"),
            ("--config r.yaml --filter overloaded", "--filter", "max_inflight_requests"),
            ("--config r.yaml --policy-arg min_load_choices=3", "--policy-arg", "policy"),
            ("--config r.yaml --tokenizer t.json", "--tokenizer", "models[].tokenizer"),
            ("--config r.yaml --model m", "--model", "models[].id"),
            ("--config r.yaml --worker-urls http://a:1", "--worker-urls", "models[].workers"),
            ("--config r.yaml --pd-disaggregation", "--pd-disaggregation", "pd bucket"),
            ("--config r.yaml --prefill http://p:1 9001", "--prefill", "bootstrap_port"),
            ("--config r.yaml --decode-policy random", "--decode-policy", "policy"),
            ("--config r.yaml --affinity-mode strict", "--affinity-mode", "drop the flag"),
            ("--demo --policy random", "--policy", "--demo"),
            ("--demo --worker-urls http://a:1", "--worker-urls", "--demo"),
            ("--demo --tokenizer t.json", "--tokenizer", "--demo"),
            ("--worker-urls http://a:1 --prefill-policy random", "--prefill-policy", "--pd-"),
            ("--worker-urls http://a:1 --decode http://d:1", "--decode", "--pd-disaggregation"),
            ("--port 1 check-config r.yaml", "--port", "check-config"),
            ("--policy random kv-indexer --config r.yaml", "--policy", "kv-indexer"),
            ("check-config r.yaml --worker-threads 2", "--worker-threads", "check-config"),
        ] {
            let err = parse(line).check().expect_err(line);
            assert!(err.starts_with(flag), "{line}: {err}");
            assert!(err.contains(mention), "{line}: {err}");
        }
        for line in [
            "--config r.yaml --port 0 --host h --admin-token t --log-json --worker-threads 2",
            "--demo --port 0 --admin-token t",
            "--worker-urls http://a:1 --policy random --model m --tokenizer t.json",
            "--pd-disaggregation --prefill http://p:1 --decode http://d:1 --prefill-policy random",
            "check-config r.yaml",
            "kv-indexer --config r.yaml",
        ] {
            parse(line).check().unwrap_or_else(|err| panic!("{line}: {err}"));
        }
    }

    #[test]
    fn the_admin_token_applies_on_top_of_any_configuration() {
        let cli = parse("--config r.yaml --admin-token s3cret");
        let mut config = ConfigFile::default();
        cli.serve.apply_overrides(&mut config).expect("valid token");
        assert_eq!(config.server.admin_token.as_ref().map(ApiKey::expose), Some("s3cret"));
        let cli = Cli::try_parse_from(["router-server", "--demo", "--admin-token", "a b"]);
        let err = cli.expect("parses").serve.apply_overrides(&mut config);
        assert!(err.expect_err("a tab").contains("--admin-token"));
    }

    #[test]
    fn the_incumbents_quick_start_flags_build_their_keys() {
        let dir = std::env::temp_dir().join(format!("router-model-path-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("tokenizer.json"), "{}").expect("file");
        let line = format!(
            "--worker-urls http://a:1 http://b:2 --policy kv_aware --cache-threshold 0.3 \
             --model-path {} --chat-template t.jinja --backend vllm \
             --intra-node-data-parallel-size 4 --routing-key-headers X-User x-other \
             --sticky-key-idle-secs 90 --kv-event-source http://a:1=tcp://a:5557 \
             --kv-event-replay-source http://a:1/=tcp://a:5558 --kv-event-block-size 32",
            dir.display()
        );
        let config = parse(&line).serve.quick_start_config().expect("config");
        let model = &config.models[0];
        assert_eq!(model.tokenizer.as_deref(), Some(&*dir.join("tokenizer.json")));
        assert_eq!(model.chat_template.as_deref(), Some(std::path::Path::new("t.jinja")));
        assert_eq!(model.engine, Some(router_workers::EngineKind::Vllm));
        assert_eq!(model.affinity.routing_key_header, "x-user", "the first header");
        assert_eq!(model.affinity.sticky_idle_timeout_secs, Some(90));
        let policy = &model.buckets[0].groups.plain.as_ref().expect("plain").policy;
        let router_policies::PolicySettings::CacheAware(settings) = &policy.kind else {
            panic!("kv_aware is cache_aware: {policy:?}");
        };
        assert_eq!(settings.cache_affinity_min_matched_ratio, Some(0.3));
        let (a, b) = (&model.workers[0], &model.workers[1]);
        assert_eq!((a.dp_size, a.dp_route), (4, Some(DpRoute::Header)));
        let kv = a.kv_events.as_ref().expect("a's events");
        assert_eq!(kv.endpoint, "tcp://a:5557");
        assert_eq!(kv.replay_endpoint.as_deref(), Some("tcp://a:5558"));
        assert_eq!(kv.block_size, Some(32));
        assert!(b.kv_events.is_none(), "b has no source: approximate mode");
        std::fs::remove_dir_all(&dir).ok();

        for (line, named) in [
            ("--worker-urls http://a:1 --backend openai", "--backend openai"),
            ("--worker-urls http://a:1 --model-path /nowhere/model", "--model-path /nowhere"),
            (
                "--worker-urls http://a:1 --kv-event-source http://c:3=tcp://c:1",
                "no quick-start engine",
            ),
            (
                "--worker-urls http://a:1 --kv-event-source http://a:1=tcp://a:1,tcp://a:2",
                "one endpoint per engine",
            ),
            (
                "--worker-urls http://a:1 --kv-event-replay-source http://a:1=tcp://a:2",
                "has no --kv-event-source",
            ),
            ("--worker-urls http://a:1 --kv-event-block-size 16", "needs --kv-event-source"),
        ] {
            let err = parse(line).serve.quick_start_config().expect_err(line);
            assert!(err.contains(named), "{line}: {err}");
        }
    }

    #[test]
    fn the_discovery_flags_set_the_discovery_section_on_a_quick_start_or_a_file() {
        let cli = parse(
            "--service-discovery --selector app=sglang tier=gpu --service-discovery-namespace \
             inference --service-discovery-port http --policy power_of_two",
        );
        cli.serve.check().expect("a discovery quick start");
        let mut config = cli.serve.quick_start_config().expect("config");
        assert!(config.models[0].workers.is_empty(), "the fleet is discovered");
        cli.serve.apply_overrides(&mut config).expect("overrides");
        let section = config.discovery.as_ref().expect("discovery");
        assert_eq!(section.selector.as_deref(), Some("app=sglang,tier=gpu"));
        assert_eq!(section.namespace.as_deref(), Some("inference"));
        assert_eq!(section.port, PodPort::Name("http".into()));

        let cli = parse(
            "--pd-disaggregation --service-discovery --prefill-selector role=prefill \
             --decode-selector role=decode --service-discovery-port 30000",
        );
        cli.serve.check().expect("a PD discovery quick start");
        let mut config = cli.serve.quick_start_config().expect("no --prefill needed");
        cli.serve.apply_overrides(&mut config).expect("overrides");
        let section = config.discovery.as_ref().expect("discovery");
        assert_eq!(section.prefill_selector.as_deref(), Some("role=prefill"));
        assert_eq!(section.port, PodPort::Number(30000));
        assert!(config.models[0].buckets[0].groups.pd.is_some());

        // On top of a file, the flags set (or create) its discovery keys.
        let cli = parse("--config r.yaml --service-discovery --selector app=x");
        cli.serve.check().expect("with a file");
        let mut config = ConfigFile::default();
        cli.serve.apply_overrides(&mut config).expect("overrides");
        assert_eq!(config.discovery.and_then(|d| d.selector).as_deref(), Some("app=x"));
    }

    #[test]
    fn a_discovery_flag_that_would_have_no_effect_is_an_error_naming_it() {
        for (line, flag, mention) in [
            ("--config r.yaml --selector app=x", "--selector", "--service-discovery"),
            (
                "--worker-urls http://a:1 --service-discovery-port 80",
                "--service-discovery-port",
                "needs",
            ),
            ("--demo --service-discovery --selector a=b", "--service-discovery", "--demo"),
            (
                "--service-discovery --prefill-selector r=p --decode-selector r=d",
                "--prefill-selector",
                "--pd-disaggregation",
            ),
            (
                "--pd-disaggregation --service-discovery --selector a=b",
                "--selector",
                "plain engines",
            ),
            ("--service-discovery check-config r.yaml", "--service-discovery", "check-config"),
        ] {
            let err = parse(line).check().expect_err(line);
            assert!(err.starts_with(flag), "{line}: {err}");
            assert!(err.contains(mention), "{line}: {err}");
        }
        let cli = parse("--service-discovery --selector a=b --service-discovery-port a/b");
        let mut config = ConfigFile::default();
        let err = cli.serve.apply_overrides(&mut config).expect_err("not a port");
        assert!(err.starts_with("--service-discovery-port"), "{err}");
    }

    #[test]
    fn bad_quick_start_policy_is_an_error() {
        let cli = parse("--worker-urls http://a:1 --policy nonsense");
        let err = cli.serve.quick_start_config().expect_err("unknown");
        assert!(err.contains("nonsense"), "{err}");
    }
}
