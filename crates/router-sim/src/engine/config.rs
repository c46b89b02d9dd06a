//! The engine's configuration, with the defaults of the command line.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use router_workers::Stage;

use super::EngineError;
use super::api_key::ApiKey;
use super::events::KvFormat;
use super::faults::Faults;

/// Most data-parallel ranks one engine simulates.
pub(super) const MAX_DP_SIZE: usize = 64;

/// Everything one simulated engine is configured with. [`EngineConfig::new`] gives the
/// command-line defaults, which keep tests fast.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// Address every socket binds to (`--host`, default 127.0.0.1).
    pub host: IpAddr,
    /// HTTP port; 0 lets the system choose (`--port`).
    pub port: u16,
    /// The served model name (`--model`).
    pub model: String,
    /// Plain, prefill or decode (`--role`).
    pub role: Stage,
    /// Tokens per KV block (`--block-size`, default 16).
    pub block_size: usize,
    /// KV capacity in tokens, rounded down to whole blocks (`--kv-capacity-tokens`, default
    /// 65536).
    pub kv_capacity_tokens: usize,
    /// Prefill speed for uncached prompt tokens (`--prefill-tokens-per-sec`, default 1e6).
    pub prefill_tokens_per_sec: f64,
    /// Decode speed per running request (`--decode-tokens-per-sec`, default 2000).
    pub decode_tokens_per_sec: f64,
    /// Running batch limit (`--max-running`, default 64), per rank.
    pub max_running: usize,
    /// Data-parallel ranks (`--dp-size`, default 1): each its own cache (of
    /// `kv_capacity_tokens`), queue and running batch, rank `r` publishing KV events on the
    /// `--kv-events` port plus `r`. A request names its rank in `data_parallel_rank` (body) or
    /// `X-data-parallel-rank` (header); others go to the ranks in turn.
    pub dp_size: usize,
    /// `tokenizer.json` to load, with the chat template beside it (`--tokenizer`); `None`
    /// uses the built-in equivalent of the shipped assets.
    pub tokenizer: Option<PathBuf>,
    /// PUB endpoint to bind, `tcp://HOST:PORT` (`--kv-events`).
    pub kv_events: Option<String>,
    /// Replay ROUTER endpoint to bind (`--kv-replay`).
    pub kv_replay: Option<String>,
    /// Event encoding (`--kv-format`, default vllm).
    pub kv_format: KvFormat,
    /// Topic frame of every event message (`--kv-topic`, default empty).
    pub kv_topic: String,
    /// Batches retained for replay (`--kv-replay-buffer`, default 10000).
    pub kv_replay_buffer: usize,
    /// Bootstrap server port of a prefill engine; 0 lets the system choose
    /// (`--bootstrap-port`).
    pub bootstrap_port: Option<u16>,
    /// Address of the gRPC load reporter (router-state-load's `LoadReporter` service streaming
    /// NATIVE reports); port 0 lets the system choose (`--load-reporter`). `None`: no reporter.
    pub load_reporter: Option<SocketAddr>,
    /// How long a decode engine waits for its bootstrap room (`--bootstrap-timeout-ms`,
    /// default 30 s).
    pub bootstrap_timeout: Duration,
    /// Output length when a request sets neither `max_tokens` nor `max_completion_tokens`
    /// (`--default-max-tokens`, default 16).
    pub default_max_tokens: usize,
    /// Tokens per streamed chunk, like SGLang's `--stream-interval` (`--stream-interval`,
    /// default 1: every token is sent as soon as it exists).
    pub stream_interval: usize,
    /// Fault injection.
    pub faults: Faults,
    /// Seed of the fault draws (`--seed`, default 0).
    pub seed: u64,
    /// Bearer token every request under `/v1/` and to `/generate` must carry (`--api-key`);
    /// `None` leaves the engine open. Never printed: its `Debug` is `<redacted>`.
    pub api_key: Option<ApiKey>,
    /// PEM certificate chain, leaf first: with [`EngineConfig::tls_key`] the HTTP port serves
    /// HTTPS (`--tls-cert`).
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of [`EngineConfig::tls_cert`] (`--tls-key`).
    pub tls_key: Option<PathBuf>,
}

impl EngineConfig {
    /// The defaults for `model`.
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 0,
            model: model.into(),
            role: Stage::Plain,
            block_size: 16,
            kv_capacity_tokens: 65_536,
            prefill_tokens_per_sec: 1_000_000.0,
            decode_tokens_per_sec: 2_000.0,
            max_running: 64,
            dp_size: 1,
            tokenizer: None,
            kv_events: None,
            kv_replay: None,
            kv_format: KvFormat::Vllm,
            kv_topic: String::new(),
            kv_replay_buffer: 10_000,
            bootstrap_port: None,
            load_reporter: None,
            bootstrap_timeout: Duration::from_secs(30),
            default_max_tokens: 16,
            stream_interval: 1,
            faults: Faults::default(),
            seed: 0,
            api_key: None,
            tls_cert: None,
            tls_key: None,
        }
    }

    /// Rejects values the engine cannot run with, naming the flag.
    pub fn validate(&self) -> Result<(), EngineError> {
        let bad = |flag: &'static str, reason: String| Err(EngineError::Config { flag, reason });
        if self.model.is_empty() {
            return bad("--model", "must not be empty".into());
        }
        if self.block_size == 0 {
            return bad("--block-size", "must be at least 1".into());
        }
        if self.kv_capacity_tokens < self.block_size {
            return bad(
                "--kv-capacity-tokens",
                format!(
                    "{} is less than one block of {}",
                    self.kv_capacity_tokens, self.block_size
                ),
            );
        }
        for (flag, rate) in [
            ("--prefill-tokens-per-sec", self.prefill_tokens_per_sec),
            ("--decode-tokens-per-sec", self.decode_tokens_per_sec),
        ] {
            if !(rate.is_finite() && rate > 0.0) {
                return bad(flag, format!("{rate} is not a positive rate"));
            }
        }
        if self.max_running == 0 {
            return bad("--max-running", "must be at least 1".into());
        }
        if !(1..=MAX_DP_SIZE).contains(&self.dp_size) {
            return bad("--dp-size", format!("{} is not in 1..={MAX_DP_SIZE}", self.dp_size));
        }
        if self.default_max_tokens == 0 {
            return bad("--default-max-tokens", "must be at least 1".into());
        }
        if self.stream_interval == 0 {
            return bad("--stream-interval", "must be at least 1".into());
        }
        if let Some(status) = self.faults.fail_status
            && !(400..=599).contains(&status)
        {
            return bad("--fail-status", format!("{status} is not a 4xx or 5xx status"));
        }
        if !(0.0..=1.0).contains(&self.faults.fail_rate) {
            return bad("--fail-rate", format!("{} is not in [0, 1]", self.faults.fail_rate));
        }
        if self.faults.die_after == Some(0) {
            return bad("--die-after", "must be at least 1".into());
        }
        match (self.role, self.bootstrap_port) {
            (Stage::Prefill, None) => {
                return bad(
                    "--bootstrap-port",
                    "a prefill engine needs one (0 = any free port)".into(),
                );
            }
            (Stage::Plain | Stage::Decode, Some(port)) => {
                return bad(
                    "--bootstrap-port",
                    format!(
                        "{port} given to a {} engine; only prefill engines serve one",
                        self.role
                    ),
                );
            }
            _ => {}
        }
        if self.api_key.as_ref().is_some_and(ApiKey::is_empty) {
            return bad("--api-key", "must not be empty".into());
        }
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), None) => {
                return bad("--tls-key", format!("required with --tls-cert {}", cert.display()));
            }
            (None, Some(key)) => {
                return bad("--tls-cert", format!("required with --tls-key {}", key.display()));
            }
            _ => {}
        }
        Ok(())
    }

    /// Whether the HTTP port serves HTTPS (both `--tls-cert` and `--tls-key` given).
    pub fn tls(&self) -> bool {
        self.tls_cert.is_some() && self.tls_key.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejection(config: &EngineConfig) -> (&'static str, String) {
        match config.validate() {
            Err(EngineError::Config { flag, reason }) => (flag, reason),
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn tls_needs_both_files() {
        let mut config = EngineConfig::new("m");
        config.tls_cert = Some("cert.pem".into());
        let (flag, reason) = rejection(&config);
        assert_eq!(flag, "--tls-key");
        assert_eq!(reason, "required with --tls-cert cert.pem");
        assert_eq!(
            config.validate().map_err(|e| e.to_string()),
            Err("invalid --tls-key: required with --tls-cert cert.pem".into())
        );

        config.tls_cert = None;
        config.tls_key = Some("key.pem".into());
        assert_eq!(rejection(&config).0, "--tls-cert");
        assert!(!config.tls());

        config.tls_cert = Some("cert.pem".into());
        assert!(config.validate().is_ok());
        assert!(config.tls());
    }

    #[test]
    fn an_empty_api_key_is_refused() {
        let mut config = EngineConfig::new("m");
        config.api_key = Some(ApiKey::new(""));
        assert_eq!(rejection(&config), ("--api-key", "must not be empty".into()));
        config.api_key = Some(ApiKey::new("k"));
        assert!(config.validate().is_ok());
    }

    #[test]
    fn debug_redacts_the_api_key() {
        let mut config = EngineConfig::new("m");
        config.api_key = Some(ApiKey::new("very-secret-key"));
        let printed = format!("{config:?}");
        assert!(!printed.contains("very-secret-key"), "{printed}");
        assert!(printed.contains("api_key: Some(<redacted>)"), "{printed}");
    }
}
