//! The endpoint picker (`router-server epp`): an Envoy `ext_proc` gRPC server that picks the
//! engine of each request with the router's own preparation, bucket loop, policies and live
//! state, for Envoy-based Gateway API inference gateways (docs/epp.md).
//!
//! Owns the gRPC service and its lifecycle ([`EppServer`]), the gRPC health of `liveness`,
//! `readiness` and the ext_proc service (`health`), one stream per request (`stream`), the
//! decision (`pick`), the messages sent back (`reply`) and the `ip:port` naming of engines
//! and the subset hint (`endpoints`).
//!
//! Does not own: preparation (`crate::routes::inference::prepare_request`), selection
//! (`crate::serve::select`, router-buckets), the HTTP admin surface (`crate::server`), or
//! forwarding: Envoy sends the request, the picker only names where.

mod endpoints;
mod health;
mod pick;
mod reply;
mod stream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use router_proto::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use router_proto::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

use crate::app::AppContext;

/// How the picker answers.
#[derive(Clone, Debug)]
pub struct EppSettings {
    /// Engines of the routed group named after the pick in `x-gateway-destination-endpoint`,
    /// for Envoy's retries; fewer when the group has fewer admitted candidates.
    pub fallbacks: usize,
}

impl Default for EppSettings {
    fn default() -> Self {
        Self { fallbacks: router_config::DEFAULT_EPP_FALLBACKS }
    }
}

/// The ext_proc service over the shared routing objects.
#[derive(Clone, Debug)]
struct ExtProcService {
    ctx: Arc<AppContext>,
    settings: Arc<EppSettings>,
    cancel: CancellationToken,
}

/// Answers queued per stream before the stream's task waits for Envoy to read them.
const ANSWER_QUEUE: usize = 64;

#[tonic::async_trait]
impl ExternalProcessor for ExtProcService {
    type ProcessStream = ReceiverStream<Result<ProcessingResponse, Status>>;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let (answers, stream) = tokio::sync::mpsc::channel(ANSWER_QUEUE);
        let inbound = request.into_inner();
        let (ctx, settings, cancel) =
            (Arc::clone(&self.ctx), Arc::clone(&self.settings), self.cancel.clone());
        // The stream's task owns its state and guards; it ends when either side of the stream
        // does, or when the server is stopped past its drain.
        tokio::spawn(async move {
            tokio::select! {
                () = stream::run(ctx, settings, inbound, answers) => {}
                () = cancel.cancelled() => {}
            }
        });
        Ok(Response::new(ReceiverStream::new(stream)))
    }
}

/// A running picker: its gRPC address and what stops it.
pub struct EppServer {
    /// The bound gRPC address.
    pub addr: SocketAddr,
    stop_accepting: CancellationToken,
    abort_streams: CancellationToken,
    health: health::EppHealth,
    served: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl EppServer {
    /// Serves ext_proc and gRPC health on `listener` over `ctx` (whose background services
    /// the caller starts, as [`crate::server::Serving`] does).
    pub fn start(
        ctx: Arc<AppContext>,
        listener: TcpListener,
        settings: EppSettings,
    ) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let (stop_accepting, abort_streams) = (CancellationToken::new(), CancellationToken::new());
        let (health, health_service) = health::EppHealth::start(Arc::clone(&ctx));
        // Envoy's BUFFERED mode sends a whole body in one message.
        let max_message = ctx.max_body_bytes().saturating_add(64 * 1024);
        let service =
            ExtProcService { ctx, settings: Arc::new(settings), cancel: abort_streams.clone() };
        let ext_proc = ExternalProcessorServer::new(service)
            .max_decoding_message_size(max_message)
            .max_encoding_message_size(max_message);
        let stopped = stop_accepting.clone();
        // The builder's `tcp_nodelay` does not reach connections from an incoming stream: the
        // stream sets it. Without it Nagle holds each small ext_proc answer until Envoy's
        // delayed ACK (about 40 ms; `cargo xtask bench --only epp` measured it).
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        let served = tokio::spawn(
            tonic::transport::Server::builder()
                .http2_keepalive_interval(Some(Duration::from_secs(30)))
                .add_service(health_service)
                .add_service(ext_proc)
                .serve_with_incoming_shutdown(incoming, async move {
                    stopped.cancelled().await;
                }),
        );
        Ok(Self { addr, stop_accepting, abort_streams, health, served })
    }

    /// Stops: health turns NOT_SERVING at once (so Envoy's health check moves new requests to
    /// another replica), open streams get up to `drain` to finish, then the rest are cut.
    pub async fn stop(self, drain: Duration) {
        self.health.not_serving().await;
        self.stop_accepting.cancel();
        let mut served = self.served;
        if tokio::time::timeout(drain, &mut served).await.is_err() {
            self.abort_streams.cancel();
            let _ = served.await;
        }
        self.health.stop();
    }
}

#[cfg(test)]
mod tests;
