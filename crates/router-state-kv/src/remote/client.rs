//! The router side: prefix lookups against one indexer or several replicas, with a query
//! timeout and a limit on lookups in flight.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use router_proto::router::kv::v1 as pb;
use router_proto::router::kv::v1::kv_indexer_client::KvIndexerClient;
use router_proto::router::kv::v1::lookup_request::Query;
use router_workers::ModelId;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use super::convert::{MalformedResponse, from_proto};
use crate::PrefixMatches;
use crate::hash::Salt;

/// Where and how to query the remote indexer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClientConfig {
    /// Indexer addresses (`host:port`, or `http://host:port`): replicas of one index, tried
    /// in turn until one answers, starting with the last that did.
    pub endpoints: Vec<String>,
    /// The whole lookup (connecting, failing over, the answer) must finish within this;
    /// otherwise it is [`RemoteError::Timeout`].
    pub query_timeout: Duration,
    /// Lookups in flight at once; beyond it a lookup is [`RemoteError::Busy`] at once.
    pub max_inflight: usize,
}

impl ClientConfig {
    /// `endpoints` with the reference defaults: a 100 ms query timeout and 32 lookups in
    /// flight.
    pub fn new(endpoints: Vec<String>) -> Self {
        Self { endpoints, query_timeout: Duration::from_millis(100), max_inflight: 32 }
    }
}

/// A client configuration that cannot work.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientConfigError {
    /// No endpoint given.
    #[error("no kv indexer endpoint given")]
    NoEndpoints,
    /// An endpoint is not a valid address.
    #[error("invalid kv indexer endpoint {endpoint:?}")]
    Endpoint {
        /// The address given.
        endpoint: String,
        /// Why it does not parse.
        #[source]
        source: tonic::transport::Error,
    },
    /// A zero query timeout.
    #[error("kv indexer query timeout must be above zero")]
    ZeroTimeout,
    /// A zero in-flight limit.
    #[error("kv indexer in-flight limit must be at least 1")]
    ZeroInflight,
}

/// Why a remote lookup gave no result.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// The in-flight limit was reached; the lookup was not sent.
    #[error("{limit} kv indexer lookups already in flight")]
    Busy {
        /// The configured limit.
        limit: usize,
    },
    /// No answer within the query timeout.
    #[error("kv indexer lookup timed out after {after:?}")]
    Timeout {
        /// The configured timeout.
        after: Duration,
    },
    /// The indexer could not be reached or failed the call (the last endpoint tried).
    #[error("kv indexer {endpoint} unavailable")]
    Unavailable {
        /// The endpoint.
        endpoint: String,
        /// The status it ended with.
        #[source]
        source: Status,
    },
    /// The indexer answered something that is not a lookup result (the last endpoint tried).
    #[error("kv indexer {endpoint} sent a malformed answer")]
    Malformed {
        /// The endpoint.
        endpoint: String,
        /// What is wrong with it.
        #[source]
        source: MalformedResponse,
    },
    /// The indexer refused the query as invalid: a problem of the query, not of the backend.
    #[error("kv indexer {endpoint} refused the query")]
    InvalidQuery {
        /// The endpoint.
        endpoint: String,
        /// The refusal.
        #[source]
        source: Status,
    },
}

impl RemoteError {
    /// Whether the backend was unavailable (callers fall back), as opposed to an invalid
    /// query (an explicit error).
    pub fn is_unavailable(&self) -> bool {
        !matches!(self, RemoteError::InvalidQuery { .. })
    }
}

/// Spawns tonic's connection tasks on the runtime that built the client (the router's
/// background runtime), whichever thread makes the first lookup: a process serving from
/// several runtimes must not tie a shared channel to one of them.
#[derive(Clone)]
struct SpawnOn(tokio::runtime::Handle);

impl<F> hyper::rt::Executor<F> for SpawnOn
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    fn execute(&self, future: F) {
        self.0.spawn(future);
    }
}

struct Remote {
    address: String,
    endpoint: Endpoint,
    channel: OnceLock<Channel>,
}

impl Remote {
    /// The endpoint's channel, created on first use (inside the runtime); tonic reconnects it.
    fn channel(&self) -> Channel {
        self.channel.get_or_init(|| self.endpoint.connect_lazy()).clone()
    }
}

/// Queries a remote indexer (see the [module docs](super)). Share one client per indexer
/// configuration, so that its in-flight limit holds for the whole process.
pub struct RemoteIndexClient {
    config: ClientConfig,
    remotes: Box<[Remote]>,
    permits: Arc<Semaphore>,
    /// The endpoint that answered last; the next lookup starts there.
    preferred: AtomicUsize,
}

impl fmt::Debug for RemoteIndexClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteIndexClient")
            .field("config", &self.config)
            .field("inflight", &self.inflight())
            .finish_non_exhaustive()
    }
}

/// The largest answer accepted, in bytes (64k matches is far beyond any fleet).
const MAX_ANSWER_BYTES: usize = 4 << 20;

impl RemoteIndexClient {
    /// Checks `config` and prepares one lazily connected channel per endpoint. Connects to
    /// nothing and spawns nothing; when called inside a tokio runtime, the channels' tasks
    /// will run on that runtime.
    pub fn new(config: ClientConfig) -> Result<Self, ClientConfigError> {
        let home = tokio::runtime::Handle::try_current().ok();
        if config.endpoints.is_empty() {
            return Err(ClientConfigError::NoEndpoints);
        }
        if config.query_timeout.is_zero() {
            return Err(ClientConfigError::ZeroTimeout);
        }
        if config.max_inflight == 0 {
            return Err(ClientConfigError::ZeroInflight);
        }
        let remotes = config
            .endpoints
            .iter()
            .map(|address| {
                let trimmed = address.trim();
                let uri = if trimmed.contains("://") {
                    trimmed.to_owned()
                } else {
                    format!("http://{trimmed}")
                };
                let endpoint = Endpoint::from_shared(uri)
                    .map_err(|source| ClientConfigError::Endpoint {
                        endpoint: address.clone(),
                        source,
                    })?
                    // The query timeout bounds every lookup; this only bounds a background
                    // connection attempt to a silent host, so that it is retried.
                    .connect_timeout(config.query_timeout + Duration::from_secs(1))
                    .tcp_nodelay(true);
                let endpoint = match &home {
                    Some(home) => endpoint.executor(SpawnOn(home.clone())),
                    None => endpoint,
                };
                Ok(Remote { address: address.clone(), endpoint, channel: OnceLock::new() })
            })
            .collect::<Result<Box<[_]>, _>>()?;
        Ok(Self {
            permits: Arc::new(Semaphore::new(config.max_inflight)),
            config,
            remotes,
            preferred: AtomicUsize::new(0),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// Lookups in flight now.
    pub fn inflight(&self) -> usize {
        self.config.max_inflight.saturating_sub(self.permits.available_permits())
    }

    /// Which workers hold how many leading blocks of a request, given its local block hashes
    /// (see [`crate::hash::block_hashes`]); the remote twin of [`crate::KvIndex::lookup`].
    pub async fn lookup(
        &self,
        model: &ModelId,
        hashes: &[u64],
    ) -> Result<PrefixMatches, RemoteError> {
        let query = Query::BlockHashes(pb::BlockHashes { hashes: hashes.to_vec() });
        self.query(model, query, Some(hashes.len())).await
    }

    /// Has the indexer hash `tokens` and look them up; the remote twin of
    /// [`crate::KvIndex::lookup_tokens`].
    pub async fn lookup_tokens(
        &self,
        model: &ModelId,
        tokens: &[u32],
        block_size: u32,
        salt: Salt<'_>,
    ) -> Result<PrefixMatches, RemoteError> {
        let query = Query::Tokens(pb::TokenQuery {
            token_ids: tokens.to_vec(),
            block_size,
            lora_name: salt.lora_name.unwrap_or_default().to_owned(),
            cache_salt: salt.cache_salt.unwrap_or_default().to_owned(),
        });
        let expected =
            usize::try_from(block_size).ok().filter(|&b| b > 0).map(|b| tokens.len() / b);
        self.query(model, query, expected).await
    }

    async fn query(
        &self,
        model: &ModelId,
        query: Query,
        expected_blocks: Option<usize>,
    ) -> Result<PrefixMatches, RemoteError> {
        let limit = self.config.max_inflight;
        let _permit = self.permits.try_acquire().map_err(|_| RemoteError::Busy { limit })?;
        let request = pb::LookupRequest { model: model.as_str().to_owned(), query: Some(query) };
        let after = self.config.query_timeout;
        let deadline = Instant::now() + after;
        tokio::time::timeout_at(deadline, self.failover(request, expected_blocks, deadline))
            .await
            .map_err(|_| RemoteError::Timeout { after })?
    }

    /// Tries every endpoint once, starting with the one that answered last, until one answers
    /// or refuses the query as invalid.
    async fn failover(
        &self,
        request: pb::LookupRequest,
        expected_blocks: Option<usize>,
        deadline: Instant,
    ) -> Result<PrefixMatches, RemoteError> {
        let n = self.remotes.len();
        let start = self.preferred.load(Ordering::Relaxed) % n;
        let mut last = None;
        for offset in 0..n {
            let at = (start + offset) % n;
            let remote = &self.remotes[at];
            let endpoint = || remote.address.clone();
            let mut call = tonic::Request::new(request.clone());
            call.set_timeout(deadline.saturating_duration_since(Instant::now()));
            let mut client =
                KvIndexerClient::new(remote.channel()).max_decoding_message_size(MAX_ANSWER_BYTES);
            let error = match client.lookup(call).await {
                Ok(answer) => match from_proto(answer.into_inner(), expected_blocks) {
                    Ok(found) => {
                        self.preferred.store(at, Ordering::Relaxed);
                        return Ok(found);
                    }
                    Err(source) => RemoteError::Malformed { endpoint: endpoint(), source },
                },
                Err(status) if status.code() == Code::InvalidArgument => {
                    return Err(RemoteError::InvalidQuery { endpoint: endpoint(), source: status });
                }
                Err(status) => RemoteError::Unavailable { endpoint: endpoint(), source: status },
            };
            tracing::debug!(endpoint = %remote.address, error = &error as &dyn std::error::Error, "kv indexer lookup failed");
            if Instant::now() >= deadline {
                // Whatever the last call failed with, it ran out of time (the gRPC deadline
                // of the call is the query's own).
                return Err(RemoteError::Timeout { after: self.config.query_timeout });
            }
            last = Some(error);
        }
        Err(last.expect("a client has at least one endpoint"))
    }
}
