//! The HTTP server: routes, limits, and graceful shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware::from_fn_with_state;
use axum::routing::{delete, get, post};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_io_timeout::TimeoutStream;
use tracing::{debug, info, warn};

use crate::app::AppContext;
use crate::config::ServerConfig;
use crate::routes::{admin, chat, ops};
use crate::{auth, limit};

/// The router's HTTP routes over `ctx`.
pub fn routes(ctx: Arc<AppContext>) -> Router {
    let admin_routes = Router::new()
        .route("/admin/workers", get(admin::list_workers).post(admin::add_worker))
        .route("/admin/workers/{id}", delete(admin::remove_worker))
        .route("/admin/state", get(admin::state))
        .route_layer(from_fn_with_state(Arc::clone(&ctx), auth::require_admin_token));
    let client_routes = Router::new()
        .route(
            "/v1/chat/completions",
            post(chat::chat_completions)
                .layer(from_fn_with_state(Arc::clone(&ctx), limit::concurrency)),
        )
        .route("/v1/models", get(ops::models))
        .route_layer(from_fn_with_state(Arc::clone(&ctx), auth::require_api_key));
    Router::new()
        .merge(client_routes)
        .route("/health", get(ops::health))
        .route("/readiness", get(ops::readiness))
        .route("/metrics", get(ops::prometheus))
        .merge(admin_routes)
        .layer(DefaultBodyLimit::max(ctx.max_body_bytes()))
        .with_state(ctx)
}

/// The per-connection limits that protect the router from slow clients and huge heads.
#[derive(Clone, Copy, Debug)]
struct ConnectionTimeouts {
    /// Whole request head (slowloris).
    header_read: Duration,
    /// A response write that makes no progress (a client that stops reading).
    write: Duration,
    /// Largest request head.
    max_header_bytes: usize,
}

impl From<&ServerConfig> for ConnectionTimeouts {
    fn from(server: &ServerConfig) -> Self {
        Self {
            header_read: Duration::from_secs(server.header_read_timeout_secs),
            write: Duration::from_secs(server.client_write_timeout_secs),
            max_header_bytes: server.max_header_bytes,
        }
    }
}

/// Accepts connections until `stop`, then lets every open connection finish its request and
/// close. Clients speak HTTP/1.1: every byte of a connection's life is then under a timeout
/// (HTTP/2 flow control would let a client that stops reading hold a stream without ever
/// stalling a socket write, and the HTTP/2 preface sniffing has no timeout of its own).
///
/// Connection tasks belong to this loop's [`JoinSet`]: when the loop is aborted after the drain
/// deadline, the connections it still holds are aborted with it, releasing their guards.
async fn accept_loop(
    listener: TcpListener,
    app: Router,
    timeouts: ConnectionTimeouts,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header_read)
        .max_header_size(timeouts.max_header_bytes);
    let graceful = GracefulShutdown::new();
    let service = TowerToHyperService::new(app);
    let mut connections = JoinSet::new();
    let stopped = async move {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    tokio::pin!(stopped);
    loop {
        while connections.try_join_next().is_some() {}
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    warn!(error = %err, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stopped => break,
        };
        // Streamed tokens are small writes: without TCP_NODELAY, Nagle's algorithm holds each
        // one until the client's delayed ACK (about 40 ms).
        let _ = tcp.set_nodelay(true);
        let mut io = TimeoutStream::new(tcp);
        io.set_write_timeout(Some(timeouts.write));
        let connection = builder.serve_connection(TokioIo::new(Box::pin(io)), service.clone());
        let connection = graceful.watch(connection);
        connections.spawn(async move {
            if let Err(err) = connection.await {
                debug!(%peer, error = %err, "client connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// A running router: its address and the handle that stops it.
pub struct Serving {
    /// The bound address.
    pub addr: SocketAddr,
    ctx: Arc<AppContext>,
    shutdown: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Serving {
    /// Starts background services and serves on `listener`.
    pub fn start(ctx: Arc<AppContext>, listener: TcpListener) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        ctx.start();
        let (shutdown, stop) = tokio::sync::watch::channel(false);
        let timeouts = ConnectionTimeouts::from(ctx.server());
        let app = routes(Arc::clone(&ctx));
        let task = tokio::spawn(accept_loop(listener, app, timeouts, stop));
        Ok(Self { addr, ctx, shutdown, task })
    }

    /// The application context.
    pub fn context(&self) -> &Arc<AppContext> {
        &self.ctx
    }

    /// Drains: readiness turns 503 and new chat requests are refused, in-flight requests
    /// finish (up to `drain` in all), then the listener closes and background services stop.
    pub async fn stop(self, drain: Duration) {
        let deadline = tokio::time::Instant::now() + drain;
        self.ctx.start_draining();
        while self.ctx.total_inflight() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = self.shutdown.send(true);
        let mut task = self.task;
        if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
            info!(?drain, "drain timed out; closing remaining connections");
            task.abort();
        }
        self.ctx.shutdown().await;
    }
}
