//! The HTTP server: routes, limits, and graceful shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{delete, get, post};
use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tracing::info;

use crate::app::AppContext;
use crate::limit;
use crate::routes::{admin, chat, ops};

/// The router's HTTP routes over `ctx`.
pub fn routes(ctx: Arc<AppContext>) -> Router {
    let admin_routes = Router::new()
        .route("/admin/workers", get(admin::list_workers).post(admin::add_worker))
        .route("/admin/workers/{id}", delete(admin::remove_worker))
        .route("/admin/state", get(admin::state))
        .route_layer(axum::middleware::from_fn_with_state(Arc::clone(&ctx), admin::require_token));
    Router::new()
        .route(
            "/v1/chat/completions",
            post(chat::chat_completions)
                .layer(axum::middleware::from_fn_with_state(Arc::clone(&ctx), limit::concurrency)),
        )
        .route("/v1/models", get(ops::models))
        .route("/health", get(ops::health))
        .route("/readiness", get(ops::readiness))
        .route("/metrics", get(ops::prometheus))
        .merge(admin_routes)
        .layer(DefaultBodyLimit::max(ctx.max_body_bytes()))
        .with_state(ctx)
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
        let (shutdown, mut stop) = tokio::sync::watch::channel(false);
        let app = routes(Arc::clone(&ctx));
        let task = tokio::spawn(async move {
            // Streamed tokens are small writes: without TCP_NODELAY, Nagle's algorithm holds
            // each one until the client's delayed ACK (about 40 ms).
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|stop| *stop).await;
                })
                .await
        });
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
