//! The indexer side: `KvIndexer.Lookup` answered from a shared [`KvIndex`].

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use router_proto::router::kv::v1 as pb;
use router_proto::router::kv::v1::kv_indexer_server::{KvIndexer, KvIndexerServer};
use router_proto::router::kv::v1::lookup_request::Query;
use router_workers::ModelId;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use super::convert::to_proto;
use crate::KvIndex;
use crate::hash::Salt;

/// Bounds on what one lookup may ask, checked before any work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceLimits {
    /// Most block hashes in one query.
    pub max_query_blocks: usize,
    /// Most token ids in one query.
    pub max_query_tokens: usize,
    /// Largest encoded request accepted, in bytes.
    pub max_request_bytes: usize,
}

impl Default for ServiceLimits {
    /// 262,144 blocks, 4,194,304 tokens (a 4M-token prompt; 262,144 blocks of 16), 24 MiB.
    fn default() -> Self {
        Self { max_query_blocks: 1 << 18, max_query_tokens: 1 << 22, max_request_bytes: 24 << 20 }
    }
}

/// The `KvIndexer` gRPC service over a shared index. Cheap to clone.
#[derive(Clone)]
pub struct KvIndexService {
    index: Arc<KvIndex>,
    limits: ServiceLimits,
}

impl fmt::Debug for KvIndexService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KvIndexService").field("limits", &self.limits).finish_non_exhaustive()
    }
}

/// Why [`serve`] or [`serve_with`] stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The listening address could not be bound.
    #[error("cannot bind the kv indexer on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("kv indexer server failed")]
    Transport(#[source] tonic::transport::Error),
}

impl KvIndexService {
    /// Answers lookups from `index` with the default [`ServiceLimits`].
    pub fn new(index: Arc<KvIndex>) -> Self {
        Self { index, limits: ServiceLimits::default() }
    }

    /// These limits instead of the defaults.
    pub fn with_limits(mut self, limits: ServiceLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The service wrapped for `tonic::transport::Server::add_service`, with the request size
    /// limit applied.
    pub fn into_server(self) -> KvIndexerServer<Self> {
        let limit = self.limits.max_request_bytes;
        KvIndexerServer::new(self).max_decoding_message_size(limit)
    }

    /// Answers one lookup (what the gRPC method runs, callable without a transport).
    pub fn answer(&self, request: pb::LookupRequest) -> Result<pb::LookupResponse, Status> {
        if request.model.is_empty() {
            return Err(Status::invalid_argument("model is empty"));
        }
        let model = ModelId::new(&request.model);
        let found = match request.query {
            None => {
                return Err(Status::invalid_argument("no query: set block_hashes or tokens"));
            }
            Some(Query::BlockHashes(query)) => {
                let limit = self.limits.max_query_blocks;
                if query.hashes.len() > limit {
                    return Err(Status::invalid_argument(format!(
                        "{} block hashes exceed the limit of {limit}",
                        query.hashes.len()
                    )));
                }
                self.index.lookup(&model, &query.hashes)
            }
            Some(Query::Tokens(query)) => {
                if query.block_size == 0 {
                    return Err(Status::invalid_argument("block_size must be at least 1"));
                }
                let limit = self.limits.max_query_tokens;
                if query.token_ids.len() > limit {
                    return Err(Status::invalid_argument(format!(
                        "{} token ids exceed the limit of {limit}",
                        query.token_ids.len()
                    )));
                }
                let salt = Salt {
                    lora_name: Some(query.lora_name.as_str()).filter(|s| !s.is_empty()),
                    cache_salt: Some(query.cache_salt.as_str()).filter(|s| !s.is_empty()),
                };
                self.index.lookup_tokens(&model, &query.token_ids, query.block_size, salt)
            }
        };
        Ok(to_proto(&found))
    }
}

#[tonic::async_trait]
impl KvIndexer for KvIndexService {
    async fn lookup(
        &self,
        request: Request<pb::LookupRequest>,
    ) -> Result<Response<pb::LookupResponse>, Status> {
        // A lookup costs microseconds under a shared read lock: answer inline.
        self.answer(request.into_inner()).map(Response::new)
    }
}

/// Serves lookups from `index` on `addr` with the default limits until `cancel` fires.
pub async fn serve(
    addr: SocketAddr,
    index: Arc<KvIndex>,
    cancel: CancellationToken,
) -> Result<(), ServeError> {
    let listener =
        TcpListener::bind(addr).await.map_err(|source| ServeError::Bind { addr, source })?;
    serve_with(listener, KvIndexService::new(index), cancel).await
}

/// Serves `service` on an already bound listener until `cancel` fires, then shuts down
/// gracefully (lookups are unary and short, so the drain is quick).
pub async fn serve_with(
    listener: TcpListener,
    service: KvIndexService,
    cancel: CancellationToken,
) -> Result<(), ServeError> {
    // Small unary answers: without TCP_NODELAY, Nagle and delayed acks add ~40 ms each.
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(service.into_server())
        .serve_with_incoming_shutdown(incoming, cancel.cancelled_owned())
        .await
        .map_err(ServeError::Transport)
}
