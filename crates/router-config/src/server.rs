//! The `server` section: the listener, its limits and timeouts, the client keys, and
//! operations (logs, metrics listener, request ids, CORS, which front reads HTTP/1.1).

use std::fmt;
use std::path::PathBuf;

use router_workers::ApiKey;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

use super::sections::RateLimitSection;
use super::sections::RetrySection;

/// `server`: listener, limits and operations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    /// Listen address (`--host` overrides).
    pub host: String,
    /// Listen port (`--port` overrides).
    pub port: u16,
    /// Bearer token of the admin API (or `ROUTER_ADMIN_TOKEN`); neither = admin API off.
    #[serde(skip_serializing)]
    pub admin_token: Option<ApiKey>,
    /// Keys clients must send as `Authorization: Bearer` on `/v1/` (or `ROUTER_API_KEY`);
    /// none = the client API is open. Several allow rotation. Each is a key, or an object
    /// naming it and giving its own rate limits ([`ClientKeyConfig`]).
    #[serde(skip_serializing)]
    pub api_keys: Vec<ClientKeyConfig>,
    /// Requests and tokens per second of each client key (or, with no key, of all clients
    /// together); unset = no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimitSection>,
    /// Key sent to engines whose worker entry has no `api_key` (or `ROUTER_ENGINE_API_KEY`).
    #[serde(skip_serializing)]
    pub engine_api_key: Option<ApiKey>,
    /// PEM bundle of CA certificates trusted for `https://` engines, besides the system's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_ca_file: Option<PathBuf>,
    /// Event-loop threads serving clients (`--worker-threads` overrides); unset = one per core.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_threads: Option<usize>,
    /// Largest accepted request body, in bytes.
    pub max_body_bytes: usize,
    /// Most prompts in one batched completions or `/generate` request; beyond it 400.
    pub max_batch_size: usize,
    /// Longest prompt text the router tokenizes, in bytes (a rendered chat prompt, or one
    /// prompt string); a longer one is routed on its size estimate, without a prefix lookup
    /// (tokenizing costs tens of bytes of memory per byte of text).
    pub max_tokenized_prompt_bytes: usize,
    /// The model of a request that names none; unset, the only model when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_model: Option<String>,
    /// Largest accepted request head (request line and headers), in bytes; beyond it 431.
    pub max_header_bytes: usize,
    /// Inference requests in flight at once; more wait in the admission queue.
    pub max_concurrent_requests: usize,
    /// Requests that may wait for a slot at once; beyond it 429 with `Retry-After` (0: no
    /// queue, a request beyond the bound is refused at once).
    pub queue_size: usize,
    /// Longest wait in the admission queue, in seconds; then 429 with `Retry-After`.
    pub queue_timeout_secs: u64,
    /// How long an engine may take to send its response head, in seconds (a stream may then
    /// last as long as it lasts).
    pub request_timeout_secs: u64,
    /// Longest silence between two bytes of an engine's body, in seconds, once its head has
    /// arrived; beyond it a stream ends with an error event and a whole answer is a 504. Long
    /// prefills send their head early, so this is generous.
    pub engine_idle_timeout_secs: u64,
    /// Most request bodies arriving at once; one more is a 429 `bodies_full` at its head.
    pub max_pending_bodies: usize,
    /// Most bytes of request bodies in memory at once (arriving, queued or being served); a
    /// body that would pass it is a 429 `bodies_full`.
    pub max_inflight_body_bytes: usize,
    /// Longest time from dispatch to the last byte of a non-streamed answer, head and body
    /// together, in seconds (per attempt, and per exchange of a PD pair); beyond it a 504
    /// `engine_timeout`. An engine trickling a byte now and then cannot hold a request past it.
    pub answer_timeout_secs: u64,
    /// Longest time from dispatch to the first byte of a streamed answer's body, in seconds;
    /// beyond it the stream ends with an error event (after that, `engine_idle_timeout_secs`
    /// bounds each silence).
    pub first_byte_timeout_secs: u64,
    /// How long shutdown waits for in-flight requests, in seconds.
    pub shutdown_drain_secs: u64,
    /// A client must send a request's whole head within this many seconds of starting it (or
    /// of going idle on a kept-alive connection); slower clients are disconnected.
    pub header_read_timeout_secs: u64,
    /// A client must send a request's whole body within this many seconds of its head; a
    /// slower one gets 408.
    pub body_read_timeout_secs: u64,
    /// A response write that cannot make progress for this many seconds (a client that stops
    /// reading its stream) closes the connection, which cancels the engine request.
    pub client_write_timeout_secs: u64,
    /// Whether a client's `data_parallel_rank` (body) or `X-data-parallel-rank` (header)
    /// overrides the router's rank choice on engines whose worker sets `dp_route`. Either way a
    /// rank the engine does not have is a 400.
    pub allow_client_dp_rank: bool,
    /// Retries of dispatches to engines that could not be reached.
    pub retry: RetrySection,
    /// Speak HTTP/2 with prior knowledge (h2c) to engines instead of HTTP/1.1.
    pub upstream_http2: bool,
    /// What reads clients' HTTP/1.1: `own`, the router's own loop (router-http1) for the
    /// inference endpoints' common requests, hyper for every other; or `hyper` for all.
    pub http1: Http1Server,
    /// Emit logs as JSON lines.
    pub log_json: bool,
    /// Log filter, a `tracing` directive (`info`, `debug`, `router_server=debug,info`);
    /// `RUST_LOG` wins when set (`--log-level` overrides this key).
    pub log_level: String,
    /// Directory logs are appended to (`router-server.log`) instead of standard error; unset =
    /// standard error (`--log-dir`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_dir: Option<PathBuf>,
    /// Address of a separate listener serving only `/metrics` (`--prometheus-host`); default
    /// `host`. Used only with `metrics_port`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_host: Option<String>,
    /// Port of a separate listener serving only `/metrics` (`--prometheus-port`); unset = no
    /// separate listener. `/metrics` stays on the API port either way.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_port: Option<u16>,
    /// Headers a client's request id is taken from, the first present wins
    /// (`--request-id-headers`); it is echoed as `x-request-id`, logged, and sent to engines.
    pub request_id_headers: Vec<String>,
    /// Origins browsers may call the client API from (CORS); `*` allows any; empty = no CORS
    /// headers (`--cors-allowed-origins`).
    pub cors_allowed_origins: Vec<String>,
}

impl Default for ServerSection {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".to_owned(),
            port: 8080,
            admin_token: None,
            api_keys: Vec::new(),
            rate_limit: None,
            engine_api_key: None,
            engine_ca_file: None,
            worker_threads: None,
            max_body_bytes: 32 * 1024 * 1024,
            max_batch_size: 1024,
            max_tokenized_prompt_bytes: 4 << 20,
            default_model: None,
            max_header_bytes: 64 * 1024,
            max_concurrent_requests: 16_384,
            queue_size: 1024,
            queue_timeout_secs: 60,
            request_timeout_secs: 1800,
            engine_idle_timeout_secs: 300,
            max_pending_bodies: 1024,
            max_inflight_body_bytes: 1 << 30,
            answer_timeout_secs: 1800,
            first_byte_timeout_secs: 1800,
            shutdown_drain_secs: 30,
            header_read_timeout_secs: 30,
            body_read_timeout_secs: 60,
            client_write_timeout_secs: 60,
            allow_client_dp_rank: false,
            retry: RetrySection::default(),
            upstream_http2: false,
            http1: Http1Server::Own,
            log_json: false,
            log_level: "info".to_owned(),
            log_dir: None,
            metrics_host: None,
            metrics_port: None,
            request_id_headers: vec!["x-request-id".to_owned()],
            cors_allowed_origins: Vec::new(),
        }
    }
}

/// What serves clients' HTTP/1.1 connections (`server.http1`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Http1Server {
    /// The router's own loop serves an inference endpoint's `POST` framed by a Content-Length
    /// and hands a connection to hyper at its first request of any other shape (the default:
    /// fewer instructions per request, docs/benchmarks.md, Fast paths).
    #[default]
    Own,
    /// hyper serves every connection.
    Hyper,
}

/// One entry of `server.api_keys`: the key alone (`- sk-...`), or `{key, name, rate_limit}`.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientKeyConfig {
    /// The secret.
    pub key: ApiKey,
    /// What metrics and errors call the key (never the key itself); default `api_keys[i]`.
    pub name: Option<String>,
    /// The key's own limits, replacing `server.rate_limit` whole for it (`{}`: none).
    pub rate_limit: Option<RateLimitSection>,
}

impl From<ApiKey> for ClientKeyConfig {
    fn from(key: ApiKey) -> Self {
        Self { key, name: None, rate_limit: None }
    }
}

impl<'de> Deserialize<'de> for ClientKeyConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// The object form.
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Entry {
            key: ApiKey,
            #[serde(default)]
            name: Option<String>,
            #[serde(default)]
            rate_limit: Option<RateLimitSection>,
        }

        struct EntryVisitor;

        impl<'de> Visitor<'de> for EntryVisitor {
            type Value = ClientKeyConfig;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key, or an object with key, name and rate_limit")
            }

            fn visit_str<E: de::Error>(self, key: &str) -> Result<ClientKeyConfig, E> {
                ApiKey::new(key).map(ClientKeyConfig::from).map_err(E::custom)
            }

            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<ClientKeyConfig, A::Error> {
                let entry = Entry::deserialize(de::value::MapAccessDeserializer::new(map))?;
                let Entry { key, name, rate_limit } = entry;
                Ok(ClientKeyConfig { key, name, rate_limit })
            }
        }

        deserializer.deserialize_any(EntryVisitor)
    }
}
