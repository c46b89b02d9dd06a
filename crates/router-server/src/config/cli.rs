//! The command line: serving with a file, `check-config`, `kv-indexer`, `--demo`, and the
//! quick-start flags that build a single bucket without a file.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use router_workers::{ApiKey, Stage, WorkerSpec};
use serde_json::{Map, Value, json};

use super::file::{
    BucketConfig, ConfigFile, GroupConfig, GroupsConfig, ModelConfig, PdGroupsConfig,
};

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
}

/// Options of the serving mode.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Configuration file (YAML or JSON).
    #[arg(long, conflicts_with_all = ["demo", "worker_urls", "pd_disaggregation"])]
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
    /// Quick start: plain engines for a single bucket.
    #[arg(long, num_args = 1.., value_name = "URL")]
    pub worker_urls: Vec<String>,
    /// Quick start: policy of the plain group.
    #[arg(long, value_name = "NAME")]
    pub policy: Option<String>,
    /// Quick start: prefill/decode disaggregation.
    #[arg(long)]
    pub pd_disaggregation: bool,
    /// Quick start: a prefill engine, optionally followed by its bootstrap port. Repeatable.
    #[arg(long, num_args = 1..=2, value_names = ["URL", "BOOTSTRAP_PORT"], action = clap::ArgAction::Append)]
    pub prefill: Vec<String>,
    /// Quick start: a decode engine. Repeatable.
    #[arg(long, value_name = "URL", action = clap::ArgAction::Append)]
    pub decode: Vec<String>,
    /// Quick start: policy of the prefill group.
    #[arg(long, value_name = "NAME")]
    pub prefill_policy: Option<String>,
    /// Quick start: policy of the decode group.
    #[arg(long, value_name = "NAME")]
    pub decode_policy: Option<String>,
    /// Quick start: the model name served (`*` accepts any name).
    #[arg(long, default_value = "*")]
    pub model: String,
    /// Quick start: tokenizer.json for the model.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
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
    /// Admin API bearer token (or `ROUTER_ADMIN_TOKEN`).
    #[arg(long)]
    pub admin_token: Option<String>,
}

/// The in-flight cap `--filter overloaded` applies without `--max-in-flight`.
const DEFAULT_OVERLOAD_INFLIGHT: u64 = 256;

/// Options and values that were removed, with what replaces them. Checked on the raw
/// arguments before parsing so the message can say more than "unknown argument".
pub fn reject_dropped_options(args: &[String]) -> Result<(), String> {
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
        !self.worker_urls.is_empty() || self.pd_disaggregation
    }

    /// Builds the configuration the quick-start flags describe: one model, one bucket.
    pub fn quick_start_config(&self) -> Result<ConfigFile, String> {
        if let Some(mode) = &self.affinity_mode
            && mode != "strict"
        {
            return Err(format!("--affinity-mode {mode}: only strict exists"));
        }
        let mut inflight_cap = self.max_in_flight;
        for filter in &self.filter {
            match filter.as_str() {
                "overloaded" => {
                    inflight_cap.get_or_insert(DEFAULT_OVERLOAD_INFLIGHT);
                }
                other => return Err(format!("--filter {other}: unknown filter (overloaded)")),
            }
        }
        let group = |policy: Option<&str>| -> Result<GroupConfig, String> {
            let mut map = Map::new();
            map.insert("type".into(), policy.unwrap_or("round_robin").into());
            for arg in &self.policy_args {
                let (key, value) = arg
                    .split_once('=')
                    .ok_or_else(|| format!("--policy-arg {arg}: expected KEY=VALUE"))?;
                let value = serde_json::from_str(value).unwrap_or_else(|_| Value::from(value));
                map.insert(key.replace('-', "_"), value);
            }
            if let Some(cap) = inflight_cap {
                map.insert("admission".into(), json!({"max_inflight_requests": cap}));
            }
            let policy = serde_json::from_value(Value::Object(map))
                .map_err(|err| format!("quick-start policy: {err}"))?;
            Ok(GroupConfig { worker_ids: None, policy })
        };
        let mut workers = Vec::new();
        let groups = if self.pd_disaggregation {
            if !self.worker_urls.is_empty() {
                return Err("--worker-urls and --pd-disaggregation exclude each other".into());
            }
            if self.prefill.is_empty() || self.decode.is_empty() {
                return Err(
                    "--pd-disaggregation needs at least one --prefill and one --decode".into()
                );
            }
            let mut prefill = self.prefill.iter().peekable();
            let mut index = 0;
            while let Some(url) = prefill.next() {
                let bootstrap_port = match prefill.peek().map(|p| p.parse::<u16>()) {
                    Some(Ok(port)) => {
                        prefill.next();
                        Some(port)
                    }
                    _ => None,
                };
                index += 1;
                workers.push(spec(format!("prefill-{index}"), url, Stage::Prefill, bootstrap_port));
            }
            for (i, url) in self.decode.iter().enumerate() {
                workers.push(spec(format!("decode-{}", i + 1), url, Stage::Decode, None));
            }
            GroupsConfig {
                plain: None,
                pd: Some(PdGroupsConfig {
                    prefill: group(self.prefill_policy.as_deref().or(self.policy.as_deref()))?,
                    decode: group(self.decode_policy.as_deref().or(self.policy.as_deref()))?,
                }),
            }
        } else {
            for (i, url) in self.worker_urls.iter().enumerate() {
                workers.push(spec(format!("worker-{}", i + 1), url, Stage::Plain, None));
            }
            GroupsConfig { plain: Some(group(self.policy.as_deref())?), pd: None }
        };
        let mut config = ConfigFile::default();
        config.server.admin_token = match &self.admin_token {
            Some(token) => {
                Some(ApiKey::new(token.as_str()).map_err(|why| format!("--admin-token: {why}"))?)
            }
            None => None,
        };
        config.models.push(ModelConfig {
            id: self.model.clone(),
            tokenizer: self.tokenizer.clone(),
            chat_template: None,
            affinity: Default::default(),
            workers,
            buckets: vec![BucketConfig {
                id: "default".into(),
                rank: 0,
                limits: Default::default(),
                max_context_tokens: None,
                groups,
            }],
        });
        Ok(config)
    }
}

fn spec(id: String, url: &str, role: Stage, bootstrap_port: Option<u16>) -> WorkerSpec {
    WorkerSpec { bootstrap_port, ..WorkerSpec::new(id, url, role) }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn bad_quick_start_policy_is_an_error() {
        let cli = parse("--worker-urls http://a:1 --policy nonsense");
        let err = cli.serve.quick_start_config().expect_err("unknown");
        assert!(err.contains("nonsense"), "{err}");
    }
}
