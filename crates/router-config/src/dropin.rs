//! The flags of sglang-router (`python -m sglang_router.launch_router`) and vllm-router that
//! this router honours, each mapped onto a configuration key, and those it refuses with what
//! replaces them.
//!
//! Every flag here applies on top of any configuration (a file, the demo or a quick start),
//! like `--host` and `--port`; [`DropInArgs::given`] names them for `Cli::check`, so none is
//! dropped silently with a subcommand. docs/configuration.md lists them with their keys.

use std::path::PathBuf;

use clap::Args;
use router_workers::ApiKey;

use super::file::ConfigFile;

/// sglang-router's default metrics port, used when only `--prometheus-host` is given.
pub(super) const DEFAULT_PROMETHEUS_PORT: u16 = 29000;

/// Flags shared with sglang-router and vllm-router.
#[derive(Debug, Default, Args)]
pub struct DropInArgs {
    /// Address of the separate metrics listener (`server.metrics_host`; with no
    /// `--prometheus-port`, port 29000).
    #[arg(long, value_name = "HOST")]
    pub prometheus_host: Option<String>,
    /// Port of a separate listener serving `/metrics` (`server.metrics_port`).
    #[arg(long, value_name = "PORT")]
    pub prometheus_port: Option<u16>,
    /// Log filter: `debug`, `info`, `warn`, `error` or any tracing directive
    /// (`server.log_level`; `RUST_LOG` wins when set).
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// Append logs to `DIR/router-server.log` instead of standard error (`server.log_dir`).
    #[arg(long, value_name = "DIR")]
    pub log_dir: Option<PathBuf>,
    /// Inference requests in flight at once (`server.max_concurrent_requests`; -1: no bound).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_concurrent_requests: Option<i64>,
    /// Requests waiting for a slot at once (`server.queue_size`; 0: no queue).
    #[arg(long, value_name = "N")]
    pub queue_size: Option<usize>,
    /// Longest wait for a slot, in seconds (`server.queue_timeout_secs`).
    #[arg(long, value_name = "SECS")]
    pub queue_timeout_secs: Option<u64>,
    /// How long an engine may take to send its response head (`server.request_timeout_secs`).
    #[arg(long, value_name = "SECS")]
    pub request_timeout_secs: Option<u64>,
    /// Largest accepted request body, in bytes (`server.max_body_bytes`).
    #[arg(long, value_name = "BYTES")]
    pub max_payload_size: Option<usize>,
    /// The key clients must send on `/v1/` (`server.api_keys`), also sent to engines that have
    /// no key of their own (`server.engine_api_key`, unless the file sets it).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Headers a client's request id is read from, first present wins
    /// (`server.request_id_headers`).
    #[arg(long, num_args = 1.., value_name = "HEADER")]
    pub request_id_headers: Vec<String>,
    /// Origins browsers may call the API from, `*` for any (`server.cors_allowed_origins`).
    #[arg(long, num_args = 1.., value_name = "ORIGIN")]
    pub cors_allowed_origins: Vec<String>,
    /// Attempts per request, the first included, as sglang-router counts them
    /// (`server.retry.max_retries` is one less).
    #[arg(long, value_name = "N")]
    pub retry_max_retries: Option<u32>,
    /// Delay before the first retry (`server.retry.backoff_ms`).
    #[arg(long, value_name = "MS")]
    pub retry_initial_backoff_ms: Option<u64>,
    /// Longest delay before a retry (`server.retry.max_backoff_ms`).
    #[arg(long, value_name = "MS")]
    pub retry_max_backoff_ms: Option<u64>,
    /// Growth of the delay per retry (`server.retry.backoff_multiplier`).
    #[arg(long, value_name = "FACTOR")]
    pub retry_backoff_multiplier: Option<f64>,
    /// Jitter added to each delay, a fraction of it (`server.retry.jitter_factor`).
    #[arg(long, value_name = "FRACTION")]
    pub retry_jitter_factor: Option<f64>,
    /// No retries (`server.retry.max_retries: 0`).
    #[arg(long)]
    pub disable_retries: bool,
    /// Consecutive failures that open an engine's breaker (`health.breaker_failures`).
    #[arg(long, value_name = "N")]
    pub cb_failure_threshold: Option<u32>,
    /// Successful trials that close a half-open breaker (`health.breaker_successes`).
    #[arg(long, value_name = "N")]
    pub cb_success_threshold: Option<u32>,
    /// Seconds an open breaker waits before a trial (`health.breaker_open_secs`).
    #[arg(long, value_name = "SECS")]
    pub cb_timeout_duration_secs: Option<u64>,
    /// No circuit breaker (`health.breaker_failures: 0`).
    #[arg(long)]
    pub disable_circuit_breaker: bool,
    /// Seconds between health probes (`health.interval_secs`).
    #[arg(long, value_name = "SECS")]
    pub health_check_interval_secs: Option<u64>,
    /// Health probe timeout (`health.timeout_secs`).
    #[arg(long, value_name = "SECS")]
    pub health_check_timeout_secs: Option<u64>,
    /// Passed probes that make an unhealthy engine healthy (`health.healthy_after`).
    #[arg(long, value_name = "N")]
    pub health_success_threshold: Option<u32>,
    /// Failed probes that make an engine unhealthy (`health.unhealthy_after`).
    #[arg(long, value_name = "N")]
    pub health_failure_threshold: Option<u32>,
    /// Path probed on each engine (`health.endpoint`).
    #[arg(long, value_name = "PATH")]
    pub health_check_endpoint: Option<String>,
    /// Bound on the approximate picture of engines without KV events, in tokens
    /// (`kv.approximate_max_blocks`, 16 tokens to a block).
    #[arg(long, value_name = "TOKENS")]
    pub max_tree_size: Option<u64>,
    /// How long a dispatch counts as cached on an engine without KV events
    /// (`kv.approximate_ttl_secs`).
    #[arg(long, value_name = "SECS")]
    pub cache_ttl_secs: Option<u64>,
    /// How long a dispatch counts as cached before the engine's KV events confirm it
    /// (`kv.predicted_ttl_ms`).
    #[arg(long, value_name = "MS")]
    pub selection_accounting_ttl_ms: Option<u64>,
    /// How long open requests may finish on SIGTERM (`server.shutdown_drain_secs`).
    #[arg(long, value_name = "SECS")]
    pub shutdown_grace_period_secs: Option<u64>,
    /// Seconds between load polls (`load.report_interval_ms`).
    #[arg(long, value_name = "SECS")]
    pub load_monitor_interval: Option<u64>,
    /// Export OpenTelemetry spans (`telemetry.otlp_endpoint`, by default
    /// `http://localhost:4317`).
    #[arg(long)]
    pub enable_trace: bool,
    /// The OTLP collector, `HOST:PORT` or a URL (`telemetry.otlp_endpoint`).
    #[arg(long, value_name = "ENDPOINT")]
    pub otlp_traces_endpoint: Option<String>,
    /// The PEM bundle trusted for `https://` engines (`server.engine_ca_file`; one file).
    #[arg(long, num_args = 1.., value_name = "FILE")]
    pub ca_cert_paths: Vec<PathBuf>,
    /// Longest wait for a client's request head (`server.header_read_timeout_secs`).
    #[arg(long, value_name = "SECS")]
    pub header_read_timeout_secs: Option<u64>,
    /// Speak HTTP/2 to engines (`server.upstream_http2`).
    #[arg(long)]
    pub upstream_http2: bool,
}

/// The OTLP collector sglang-router exports to when `--enable-trace` names none.
const DEFAULT_OTLP_ENDPOINT: &str = "http://localhost:4317";

/// Policy names of sglang-router, smg and vllm-router with the policy of this router that has
/// their meaning.
pub(super) fn policy_alias(name: &str) -> &str {
    match name {
        "least_load" => "load_based",
        // vllm-router's policy over the engines' KV events.
        "kv_aware" => "cache_aware",
        // A key read from a request header keeps its requests on one engine.
        "consistent_hash" | "consistent_hashing" | "manual" => "sticky",
        // smg's pass-through to a single engine: any policy passes one engine through.
        "passthrough" => "round_robin",
        other => other,
    }
}

/// A refused policy name, with what replaces it.
pub(super) fn refused_policy(name: &str) -> Option<&'static str> {
    match name {
        "prefix_hash" => Some(
            "hashing a prompt's first tokens onto a ring has no equivalent here: cache_aware \
             matches whole cached prefixes (from the engines' KV events, or from the router's \
             own dispatches for engines without them), or sticky keeps a key a client sends",
        ),
        "bucket" => Some(
            "length classes are buckets of engines here: models[].buckets[] with token limits, \
             in a configuration file",
        ),
        "rendezvous_hash" => Some(
            "sessions are placed by rendezvous hashing with session_aware: --policy \
             session_aware --policy-arg new_binding=rendezvous (the session key from \
             x-session-id)",
        ),
        "sticky_least_loaded" => Some(
            "session_aware binds each session (x-session-id) to an engine and places a new one \
             on the less loaded of two: --policy session_aware",
        ),
        _ => None,
    }
}

/// The refusal of the first refused policy name among `args`.
pub(super) fn refuse(args: &[String]) -> Option<String> {
    for (i, arg) in args.iter().enumerate() {
        let name = arg.split('=').next().unwrap_or(arg);
        if ["--policy", "--prefill-policy", "--decode-policy"].contains(&name) {
            let value = arg.split_once('=').map(|(_, v)| v).or(args.get(i + 1).map(String::as_str));
            if let Some((value, why)) = value.and_then(|v| Some((v, refused_policy(v)?))) {
                return Some(format!("{name} {value} is not supported: {why}"));
            }
        }
    }
    None
}

impl DropInArgs {
    /// Every flag given, by name.
    pub fn given(&self) -> Vec<&'static str> {
        let s = self;
        [
            ("--prometheus-host", s.prometheus_host.is_some()),
            ("--prometheus-port", s.prometheus_port.is_some()),
            ("--log-level", s.log_level.is_some()),
            ("--log-dir", s.log_dir.is_some()),
            ("--max-concurrent-requests", s.max_concurrent_requests.is_some()),
            ("--queue-size", s.queue_size.is_some()),
            ("--queue-timeout-secs", s.queue_timeout_secs.is_some()),
            ("--request-timeout-secs", s.request_timeout_secs.is_some()),
            ("--max-payload-size", s.max_payload_size.is_some()),
            ("--api-key", s.api_key.is_some()),
            ("--request-id-headers", !s.request_id_headers.is_empty()),
            ("--cors-allowed-origins", !s.cors_allowed_origins.is_empty()),
            ("--retry-max-retries", s.retry_max_retries.is_some()),
            ("--retry-initial-backoff-ms", s.retry_initial_backoff_ms.is_some()),
            ("--retry-max-backoff-ms", s.retry_max_backoff_ms.is_some()),
            ("--retry-backoff-multiplier", s.retry_backoff_multiplier.is_some()),
            ("--retry-jitter-factor", s.retry_jitter_factor.is_some()),
            ("--disable-retries", s.disable_retries),
            ("--cb-failure-threshold", s.cb_failure_threshold.is_some()),
            ("--cb-success-threshold", s.cb_success_threshold.is_some()),
            ("--cb-timeout-duration-secs", s.cb_timeout_duration_secs.is_some()),
            ("--disable-circuit-breaker", s.disable_circuit_breaker),
            ("--health-check-interval-secs", s.health_check_interval_secs.is_some()),
            ("--health-check-timeout-secs", s.health_check_timeout_secs.is_some()),
            ("--health-success-threshold", s.health_success_threshold.is_some()),
            ("--health-failure-threshold", s.health_failure_threshold.is_some()),
            ("--health-check-endpoint", s.health_check_endpoint.is_some()),
            ("--max-tree-size", s.max_tree_size.is_some()),
            ("--cache-ttl-secs", s.cache_ttl_secs.is_some()),
            ("--selection-accounting-ttl-ms", s.selection_accounting_ttl_ms.is_some()),
            ("--shutdown-grace-period-secs", s.shutdown_grace_period_secs.is_some()),
            ("--load-monitor-interval", s.load_monitor_interval.is_some()),
            ("--enable-trace", s.enable_trace),
            ("--otlp-traces-endpoint", s.otlp_traces_endpoint.is_some()),
            ("--ca-cert-paths", !s.ca_cert_paths.is_empty()),
            ("--header-read-timeout-secs", s.header_read_timeout_secs.is_some()),
            ("--upstream-http2", s.upstream_http2),
        ]
        .into_iter()
        .filter_map(|(flag, set)| set.then_some(flag))
        .collect()
    }

    /// Sets the configuration keys of the flags given. Values are checked with the rest of
    /// the configuration (`AppContext::build`), under their key's name.
    pub fn apply(&self, config: &mut ConfigFile) -> Result<(), String> {
        if self.retry_max_retries.is_some() && self.disable_retries {
            return Err("--retry-max-retries and --disable-retries exclude each other".into());
        }
        if self.disable_circuit_breaker
            && let Some(flag) = [
                ("--cb-failure-threshold", self.cb_failure_threshold.is_some()),
                ("--cb-success-threshold", self.cb_success_threshold.is_some()),
                ("--cb-timeout-duration-secs", self.cb_timeout_duration_secs.is_some()),
            ]
            .into_iter()
            .find_map(|(flag, set)| set.then_some(flag))
        {
            return Err(format!("{flag} has no effect with --disable-circuit-breaker"));
        }
        let server = &mut config.server;
        if let Some(host) = &self.prometheus_host {
            server.metrics_host = Some(host.clone());
            server.metrics_port.get_or_insert(DEFAULT_PROMETHEUS_PORT);
        }
        if let Some(port) = self.prometheus_port {
            server.metrics_port = Some(port);
        }
        if let Some(level) = &self.log_level {
            server.log_level = match level.to_ascii_lowercase().as_str() {
                "warning" => "warn".to_owned(),
                "critical" | "fatal" => "error".to_owned(),
                other => other.to_owned(),
            };
        }
        if let Some(dir) = &self.log_dir {
            server.log_dir = Some(dir.clone());
        }
        if let Some(n) = self.max_concurrent_requests {
            server.max_concurrent_requests = match usize::try_from(n) {
                Ok(0) => {
                    return Err("--max-concurrent-requests 0 admits nothing; -1 is no bound".into());
                }
                Ok(n) => n.min(tokio::sync::Semaphore::MAX_PERMITS),
                Err(_) => tokio::sync::Semaphore::MAX_PERMITS,
            };
        }
        if let Some(n) = self.queue_size {
            server.queue_size = n;
        }
        if let Some(secs) = self.queue_timeout_secs {
            server.queue_timeout_secs = secs;
        }
        if let Some(secs) = self.request_timeout_secs {
            server.request_timeout_secs = secs;
        }
        if let Some(bytes) = self.max_payload_size {
            server.max_body_bytes = bytes;
        }
        if let Some(key) = &self.api_key {
            let key = ApiKey::new(key.as_str()).map_err(|why| format!("--api-key: {why}"))?;
            if server.engine_api_key.is_none() {
                server.engine_api_key = Some(key.clone());
            }
            server.api_keys = vec![key.into()];
        }
        if !self.request_id_headers.is_empty() {
            server.request_id_headers =
                self.request_id_headers.iter().map(|h| h.to_ascii_lowercase()).collect();
        }
        if !self.cors_allowed_origins.is_empty() {
            server.cors_allowed_origins.clone_from(&self.cors_allowed_origins);
        }
        let retry = &mut server.retry;
        if let Some(attempts) = self.retry_max_retries {
            retry.max_retries = attempts.saturating_sub(1);
        }
        if self.disable_retries {
            retry.max_retries = 0;
        }
        if let Some(ms) = self.retry_initial_backoff_ms {
            retry.backoff_ms = ms;
        }
        if let Some(ms) = self.retry_max_backoff_ms {
            retry.max_backoff_ms = ms;
        }
        if let Some(factor) = self.retry_backoff_multiplier {
            retry.backoff_multiplier = factor;
        }
        if let Some(fraction) = self.retry_jitter_factor {
            retry.jitter_factor = fraction;
        }
        let health = &mut config.health;
        if let Some(n) = self.cb_failure_threshold {
            health.breaker_failures = n;
        }
        if let Some(n) = self.cb_success_threshold {
            health.breaker_successes = n;
        }
        if let Some(secs) = self.cb_timeout_duration_secs {
            health.breaker_open_secs = secs;
        }
        if self.disable_circuit_breaker {
            health.breaker_failures = 0;
        }
        if let Some(secs) = self.health_check_interval_secs {
            health.interval_secs = secs;
        }
        if let Some(secs) = self.health_check_timeout_secs {
            health.timeout_secs = secs;
        }
        if let Some(n) = self.health_success_threshold {
            health.healthy_after = n;
        }
        if let Some(n) = self.health_failure_threshold {
            health.unhealthy_after = n;
        }
        if let Some(path) = &self.health_check_endpoint {
            health.endpoint = if path.starts_with('/') { path.clone() } else { format!("/{path}") };
        }
        self.apply_more(config)
    }

    /// The keys of smg's and vllm-router's flags.
    fn apply_more(&self, config: &mut ConfigFile) -> Result<(), String> {
        let kv = &mut config.kv;
        if let Some(tokens) = self.max_tree_size {
            let blocks = tokens / u64::from(router_policies::BlockSize::APPROXIMATE.get());
            kv.approximate_max_blocks = usize::try_from(blocks.max(1)).unwrap_or(usize::MAX);
        }
        if let Some(secs) = self.cache_ttl_secs {
            kv.approximate_ttl_secs = secs;
        }
        if let Some(ms) = self.selection_accounting_ttl_ms {
            kv.predicted_ttl_ms = ms;
        }
        let server = &mut config.server;
        if let Some(secs) = self.shutdown_grace_period_secs {
            server.shutdown_drain_secs = secs;
        }
        if let Some(secs) = self.header_read_timeout_secs {
            server.header_read_timeout_secs = secs;
        }
        if self.upstream_http2 {
            server.upstream_http2 = true;
        }
        match self.ca_cert_paths.as_slice() {
            [] => {}
            [file] => server.engine_ca_file = Some(file.clone()),
            _ => {
                return Err("--ca-cert-paths: one PEM bundle is read (server.engine_ca_file); \
                            concatenate the files into one"
                    .into());
            }
        }
        if let Some(secs) = self.load_monitor_interval {
            config.load.report_interval_ms = secs.saturating_mul(1000);
        }
        let endpoint = match &self.otlp_traces_endpoint {
            Some(endpoint) if endpoint.contains("://") => Some(endpoint.clone()),
            Some(endpoint) => Some(format!("http://{endpoint}")),
            None => self.enable_trace.then(|| DEFAULT_OTLP_ENDPOINT.to_owned()),
        };
        if endpoint.is_some() {
            config.telemetry.otlp_endpoint = endpoint;
        }
        Ok(())
    }
}

/// How long an engine may take to answer `/get_server_info` at startup (`--dp-aware`).
const SERVER_INFO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `--dp-aware`: asks every engine with `dp_route` for its `dp_size` (`GET /get_server_info`,
/// as sglang-router does) and sets it on its worker. An engine that cannot say is an error
/// naming it: routing to ranks it may not have would fail every request.
pub async fn learn_dp_sizes(config: &mut ConfigFile) -> Result<(), String> {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    let client: Client<_, Empty<bytes::Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    for worker in config.models.iter_mut().flat_map(|m| m.workers.iter_mut()) {
        if worker.dp_route.is_none() {
            continue;
        }
        let url = format!("{}/get_server_info", worker.url.trim_end_matches('/'));
        let fail = |why: String| format!("--dp-aware: asking {url} for dp_size: {why}");
        if !url.starts_with("http://") {
            return Err(fail(
                "only http:// engines can be asked; declare dp_size in a \
                             configuration file instead"
                    .to_owned(),
            ));
        }
        let uri: http::Uri = url.parse().map_err(|err| fail(format!("{err}")))?;
        let asked = async {
            let response = client.get(uri).await.map_err(|err| err.to_string())?;
            let status = response.status();
            let body = response.into_body().collect().await.map_err(|err| err.to_string())?;
            if !status.is_success() {
                return Err(format!("status {status}"));
            }
            serde_json::from_slice::<serde_json::Value>(&body.to_bytes())
                .map_err(|err| format!("not JSON: {err}"))
        };
        let info = tokio::time::timeout(SERVER_INFO_TIMEOUT, asked)
            .await
            .map_err(|_| fail(format!("no answer within {SERVER_INFO_TIMEOUT:?}")))?
            .map_err(fail)?;
        worker.dp_size = info["dp_size"]
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n >= 1)
            .ok_or_else(|| fail(format!("no dp_size of at least 1 in {info}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::Cli;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    /// The configuration `line` makes of a default file.
    fn applied(line: &str) -> Result<ConfigFile, String> {
        let cli = Cli::try_parse_from(args(&format!("router-server --config r.yaml {line}")))
            .map_err(|err| err.to_string())?;
        cli.check()?;
        let mut config = ConfigFile::default();
        cli.serve.apply_overrides(&mut config)?;
        Ok(config)
    }

    /// What one key of the configuration reads, as text.
    type Read = fn(&ConfigFile) -> String;

    #[test]
    fn every_flag_sets_its_configuration_key() {
        let key = |config: &ConfigFile| config.server.api_keys[0].key.expose().to_owned();
        #[rustfmt::skip]
        let table: &[(&str, Read, &str)] = &[
            ("--prometheus-port 9100", |c| format!("{:?}", c.server.metrics_port), "Some(9100)"),
            ("--prometheus-host 0.0.0.0", |c| format!("{:?} {:?}", c.server.metrics_host, c.server.metrics_port), "Some(\"0.0.0.0\") Some(29000)"),
            ("--prometheus-host h --prometheus-port 1", |c| format!("{:?}", c.server.metrics_port), "Some(1)"),
            ("--log-level debug", |c| c.server.log_level.clone(), "debug"),
            ("--log-level WARNING", |c| c.server.log_level.clone(), "warn"),
            ("--log-level critical", |c| c.server.log_level.clone(), "error"),
            ("--log-dir /var/log/router", |c| format!("{:?}", c.server.log_dir), "Some(\"/var/log/router\")"),
            ("--max-concurrent-requests 64", |c| c.server.max_concurrent_requests.to_string(), "64"),
            ("--max-concurrent-requests -1", |c| (c.server.max_concurrent_requests == tokio::sync::Semaphore::MAX_PERMITS).to_string(), "true"),
            ("--queue-size 7", |c| c.server.queue_size.to_string(), "7"),
            ("--queue-timeout-secs 9", |c| c.server.queue_timeout_secs.to_string(), "9"),
            ("--request-timeout-secs 11", |c| c.server.request_timeout_secs.to_string(), "11"),
            ("--max-payload-size 1024", |c| c.server.max_body_bytes.to_string(), "1024"),
            ("--api-key k1", key, "k1"),
            ("--api-key k1", |c| c.server.engine_api_key.as_ref().map(|k| k.expose().to_owned()).unwrap_or_default(), "k1"),
            ("--request-id-headers X-Trace-Id x-req", |c| c.server.request_id_headers.join(","), "x-trace-id,x-req"),
            ("--cors-allowed-origins https://a.example http://b:3000", |c| c.server.cors_allowed_origins.join(","), "https://a.example,http://b:3000"),
            ("--retry-max-retries 4", |c| c.server.retry.max_retries.to_string(), "3"),
            ("--retry-max-retries 0", |c| c.server.retry.max_retries.to_string(), "0"),
            ("--retry-initial-backoff-ms 50", |c| c.server.retry.backoff_ms.to_string(), "50"),
            ("--retry-max-backoff-ms 3000", |c| c.server.retry.max_backoff_ms.to_string(), "3000"),
            ("--retry-backoff-multiplier 1.5", |c| c.server.retry.backoff_multiplier.to_string(), "1.5"),
            ("--retry-jitter-factor 0.1", |c| c.server.retry.jitter_factor.to_string(), "0.1"),
            ("--disable-retries", |c| c.server.retry.max_retries.to_string(), "0"),
            ("--cb-failure-threshold 3", |c| c.health.breaker_failures.to_string(), "3"),
            ("--cb-success-threshold 2", |c| c.health.breaker_successes.to_string(), "2"),
            ("--cb-timeout-duration-secs 12", |c| c.health.breaker_open_secs.to_string(), "12"),
            ("--disable-circuit-breaker", |c| c.health.breaker_failures.to_string(), "0"),
            ("--health-check-interval-secs 4", |c| c.health.interval_secs.to_string(), "4"),
            ("--health-check-timeout-secs 2", |c| c.health.timeout_secs.to_string(), "2"),
            ("--health-success-threshold 5", |c| c.health.healthy_after.to_string(), "5"),
            ("--health-failure-threshold 6", |c| c.health.unhealthy_after.to_string(), "6"),
            ("--health-check-endpoint health_generate", |c| c.health.endpoint.clone(), "/health_generate"),
            ("--health-check-endpoint /ping", |c| c.health.endpoint.clone(), "/ping"),
            ("--max-tree-size 67108864", |c| c.kv.approximate_max_blocks.to_string(), "4194304"),
            ("--cache-ttl-secs 300", |c| c.kv.approximate_ttl_secs.to_string(), "300"),
            ("--selection-accounting-ttl-ms 800", |c| c.kv.predicted_ttl_ms.to_string(), "800"),
            ("--shutdown-grace-period-secs 90", |c| c.server.shutdown_drain_secs.to_string(), "90"),
            ("--header-read-timeout-secs 7", |c| c.server.header_read_timeout_secs.to_string(), "7"),
            ("--upstream-http2", |c| c.server.upstream_http2.to_string(), "true"),
            ("--ca-cert-paths /etc/ca.pem", |c| format!("{:?}", c.server.engine_ca_file), "Some(\"/etc/ca.pem\")"),
            ("--load-monitor-interval 2", |c| c.load.report_interval_ms.to_string(), "2000"),
            ("--enable-trace", |c| format!("{:?}", c.telemetry.otlp_endpoint), "Some(\"http://localhost:4317\")"),
            ("--otlp-traces-endpoint collector:4317", |c| format!("{:?}", c.telemetry.otlp_endpoint), "Some(\"http://collector:4317\")"),
            ("--enable-trace --otlp-traces-endpoint https://c:4317", |c| format!("{:?}", c.telemetry.otlp_endpoint), "Some(\"https://c:4317\")"),
        ];
        for (line, read, expected) in table {
            let config = applied(line).unwrap_or_else(|err| panic!("{line}: {err}"));
            assert_eq!(read(&config), *expected, "{line}");
        }
        // A flag not given leaves the file's value.
        let config = applied("--queue-size 3").expect("applies");
        assert_eq!(config.server.retry, crate::RetrySection::default());
        assert_eq!(config.health, crate::HealthSection::default());
    }

    #[test]
    fn an_api_key_flag_keeps_the_files_engine_key() {
        let cli = Cli::try_parse_from(args("router-server --config r.yaml --api-key client"))
            .expect("parses");
        let mut config = ConfigFile::default();
        config.server.engine_api_key = Some(ApiKey::new("engine").expect("a key"));
        cli.serve.apply_overrides(&mut config).expect("applies");
        assert_eq!(config.server.engine_api_key.as_ref().map(ApiKey::expose), Some("engine"));
        assert_eq!(config.server.api_keys[0].key.expose(), "client");
    }

    #[test]
    fn contradicting_flags_are_errors_naming_them() {
        for (line, mention) in [
            ("--disable-retries --retry-max-retries 3", "--retry-max-retries"),
            ("--disable-circuit-breaker --cb-failure-threshold 3", "--cb-failure-threshold"),
            ("--disable-circuit-breaker --cb-timeout-duration-secs 3", "--cb-timeout-duration"),
            ("--max-concurrent-requests 0", "-1"),
        ] {
            let err = applied(line).expect_err(line);
            assert!(err.contains(mention), "{line}: {err}");
        }
    }

    #[test]
    fn every_refused_policy_name_says_what_replaces_it() {
        // (the launch line, a fragment of the replacement)
        for (line, replacement) in [
            ("--policy prefix_hash", "cache_aware"),
            ("--prefill-policy=prefix_hash", "cache_aware"),
            ("--prefill-policy bucket", "models[].buckets[]"),
            ("--policy rendezvous_hash", "new_binding=rendezvous"),
            ("--decode-policy sticky_least_loaded", "--policy session_aware"),
        ] {
            let line = format!("--worker-urls http://a:1 {line}");
            let err = crate::reject_dropped_options(&args(&line)).expect_err(&line);
            let flag = line.split_whitespace().nth(2).and_then(|f| f.split('=').next());
            assert!(err.starts_with(flag.unwrap_or_default()), "{line}: {err}");
            assert!(err.contains(replacement), "{line}: {err}");
        }
    }

    #[test]
    fn the_policy_names_of_both_routers_map_to_their_equivalent() {
        for (name, ours) in [
            ("least_load", "load_based"),
            ("kv_aware", "cache_aware"),
            ("passthrough", "round_robin"),
            ("consistent_hash", "sticky"),
            ("consistent_hashing", "sticky"),
            ("manual", "sticky"),
            ("round_robin", "round_robin"),
            ("random", "random"),
            ("power_of_two", "power_of_two"),
        ] {
            let line = format!("router-server --worker-urls http://a:1 --policy {name}");
            let cli = Cli::try_parse_from(args(&line)).expect("parses");
            let config = cli.serve.quick_start_config().expect(name);
            let group = config.models[0].buckets[0].groups.plain.as_ref().expect("plain");
            assert_eq!(group.policy.policy_type().as_str(), ours, "{name}");
        }
    }

    #[test]
    fn a_prefill_bootstrap_port_of_none_is_the_engines_default() {
        let line = "router-server --pd-disaggregation --prefill http://p1:1 none --prefill \
                    http://p2:1 8998 --decode http://d:1";
        let cli = Cli::try_parse_from(args(line)).expect("parses");
        let config = cli.serve.quick_start_config().expect("config");
        let workers = &config.models[0].workers;
        assert_eq!(workers.len(), 3, "none is not an engine");
        assert_eq!((workers[0].url.as_str(), workers[0].bootstrap_port), ("http://p1:1", None));
        assert_eq!(workers[1].bootstrap_port, Some(8998));
    }

    #[test]
    fn dp_aware_routes_quick_start_engines_by_body_rank_and_is_quick_start_only() {
        let line = "router-server --worker-urls http://a:1 http://b:1 --dp-aware";
        let cli = Cli::try_parse_from(args(line)).expect("parses");
        cli.check().expect("a quick start");
        let config = cli.serve.quick_start_config().expect("config");
        for worker in &config.models[0].workers {
            assert_eq!(worker.dp_route, Some(router_workers::DpRoute::Body), "{}", worker.id);
        }
        let cli = Cli::try_parse_from(args("router-server --config r.yaml --dp-aware"));
        let err = cli.expect("parses").check().expect_err("no effect on a file");
        assert!(err.starts_with("--dp-aware") && err.contains("dp_size"), "{err}");
    }

    #[tokio::test]
    async fn dp_aware_names_an_engine_that_cannot_say_its_dp_size() {
        let line = "router-server --worker-urls http://127.0.0.1:9 --dp-aware";
        let cli = Cli::try_parse_from(args(line)).expect("parses");
        let mut config = cli.serve.quick_start_config().expect("config");
        let err = learn_dp_sizes(&mut config).await.expect_err("nothing listens on port 9");
        assert!(err.starts_with("--dp-aware: asking http://127.0.0.1:9/get_server_info"), "{err}");
    }

    #[test]
    fn a_drop_in_flag_with_a_subcommand_is_an_error_naming_it() {
        for line in ["--prometheus-port 1 check-config r.yaml", "--log-level debug epp --config r"]
        {
            let cli = Cli::try_parse_from(args(&format!("router-server {line}"))).expect(line);
            let err = cli.check().expect_err(line);
            assert!(err.starts_with(line.split(' ').next().unwrap_or(line)), "{line}: {err}");
        }
    }
}
