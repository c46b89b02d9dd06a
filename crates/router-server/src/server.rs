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
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_io_timeout::TimeoutStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::app::AppContext;
use crate::error::ApiError;
use crate::routes::{admin, fleet, inference, ops};
use crate::{auth, limit};
use front::Front;
use router_config::ServerSection;
use router_http1::server as own;
use router_prepare::Endpoint;

/// How long streams still open when the drain runs out get to write their closing error event
/// before their connections close.
const STREAM_END_GRACE: Duration = Duration::from_secs(1);

/// The router's HTTP routes over `ctx`.
pub fn routes(ctx: Arc<AppContext>) -> Router {
    let admin_routes = admin_routes(&ctx);
    // One bound on concurrent inference requests (and its queue), whichever endpoint they use.
    let slot = || {
        let ids: Arc<[http::HeaderName]> = ctx.request_id_headers().into();
        let state = (Arc::clone(ctx.bodies()), Arc::clone(ctx.admission()), ids);
        from_fn_with_state(state, limit::concurrency)
    };
    // In front of it, each client key's rate limits: a limited request takes no queue place.
    let rate = || from_fn_with_state(Arc::clone(ctx.rate_limits()), limit::per_key);
    // A layer with nothing to do (no rate limit, no client key) is left out: each layer costs
    // every request a boxed future and a clone of the service behind it.
    let limits_rates = ctx.rate_limits().limits_anyone();
    let client_routes = Endpoint::ALL
        .into_iter()
        .fold(Router::new(), |routes, endpoint| {
            let handler = post(inference::handler(endpoint)).layer(slot());
            let handler = if limits_rates { handler.layer(rate()) } else { handler };
            routes.route(endpoint.path(), handler)
        })
        .route("/v1/models", get(ops::models))
        .route("/v1/models/{id}", get(ops::model))
        .route("/get_model_info", get(fleet::model_info))
        .route("/get_server_info", get(fleet::server_info))
        .route("/get_loads", get(fleet::loads));
    let client_routes = if ctx.credentials().client_keys.is_empty() {
        client_routes
    } else {
        client_routes
            .route_layer(from_fn_with_state(Arc::clone(ctx.credentials()), auth::require_api_key))
    };
    let cors = cors_layer(&ctx.server().cors_allowed_origins);
    let app = Router::new()
        .merge(client_routes)
        .route("/health", get(ops::health))
        .route("/readiness", get(ops::readiness))
        .route("/metrics", get(ops::prometheus))
        .merge(admin_routes)
        .fallback(no_route)
        .method_not_allowed_fallback(no_method)
        .layer(DefaultBodyLimit::max(ctx.max_body_bytes()))
        .with_state(ctx);
    match cors {
        Some(cors) => app.layer(cors),
        None => app,
    }
}

/// CORS for browsers on `origins` (`server.cors_allowed_origins`; `*` is any), `None` when
/// empty: the preflight is answered here, before authentication, and every answer to an
/// allowed origin carries `Access-Control-Allow-Origin`. Origins were validated with the
/// configuration; one that is not a header value is left out.
fn cors_layer(origins: &[String]) -> Option<tower_http::cors::CorsLayer> {
    use tower_http::cors::{AllowOrigin, Any, CorsLayer};
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| http::HeaderValue::from_str(o).ok()))
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([http::Method::GET, http::Method::POST, http::Method::DELETE])
            .allow_headers(Any)
            .expose_headers(Any),
    )
}

/// A path no route serves: a 404 in the API's error shape, as clients parse every error.
async fn no_route(method: http::Method, uri: http::Uri) -> ApiError {
    ApiError::NotFound(format!("no route for {method} {}", uri.path()))
}

/// A path served with other methods: a 405 in the API's error shape (axum keeps the `Allow`
/// header it computed).
async fn no_method(method: http::Method, uri: http::Uri) -> ApiError {
    ApiError::MethodNotAllowed { method: method.to_string(), path: uri.path().to_owned() }
}

/// The admin API, behind the admin token.
fn admin_routes(ctx: &Arc<AppContext>) -> Router<Arc<AppContext>> {
    Router::new()
        .route("/admin/workers", get(admin::list_workers).post(admin::add_worker))
        .route("/admin/workers/{id}", delete(admin::remove_worker))
        .route("/admin/workers/{id}/drain", post(admin::drain_worker))
        .route("/admin/workers/{id}/resume", post(admin::resume_worker))
        .route("/admin/state", get(admin::state))
        .route("/admin/tokenize", post(admin::tokenize))
        .route("/flush_cache", post(fleet::flush_cache))
        .route_layer(from_fn_with_state(Arc::clone(ctx.credentials()), auth::require_admin_token))
}

/// The operations surface alone, for the endpoint picker's HTTP port: `/health`,
/// `/readiness`, `/metrics` and the admin API; no client endpoint (clients go through Envoy).
pub fn operations_routes(ctx: Arc<AppContext>) -> Router {
    Router::new()
        .route("/health", get(ops::health))
        .route("/readiness", get(ops::readiness))
        .route("/metrics", get(ops::prometheus))
        .merge(admin_routes(&ctx))
        .layer(DefaultBodyLimit::max(ctx.max_body_bytes()))
        .with_state(ctx)
}

/// Only `/metrics`, for the separate metrics listener (`server.metrics_port`).
pub fn metrics_routes(ctx: Arc<AppContext>) -> Router {
    Router::new().route("/metrics", get(ops::prometheus)).with_state(ctx)
}

/// The separate listener serving only `/metrics` (`server.metrics_host`, `metrics_port`),
/// on the runtime that starts it.
pub struct MetricsListener {
    /// The bound address.
    pub addr: SocketAddr,
    stop: CancellationToken,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl MetricsListener {
    /// Binds `addr` (a host and port; port 0 picks a free one) and serves `/metrics` there.
    pub async fn start(ctx: Arc<AppContext>, addr: &str) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let app = metrics_routes(ctx);
        let served = tokio::spawn(async move {
            axum::serve(listener, app).with_graceful_shutdown(stopped.cancelled_owned()).await
        });
        Ok(Self { addr, stop, served })
    }

    /// Stops listening; a scrape in progress finishes.
    pub async fn stop(self) {
        self.stop.cancel();
        match self.served.await {
            Ok(Err(err)) => warn!(error = %err, "the metrics listener ended with an error"),
            Err(err) => warn!(error = %err, "the metrics listener panicked"),
            Ok(Ok(())) => {}
        }
    }
}

/// The per-connection limits that protect the router from slow clients and huge heads.
#[derive(Clone, Copy, Debug)]
struct ConnectionLimits {
    /// The whole request head within a time (slowloris) and a size, both fronts alike.
    heads: own::Limits,
    /// A response write that makes no progress (a client that stops reading).
    write: Duration,
}

impl From<&ServerSection> for ConnectionLimits {
    fn from(server: &ServerSection) -> Self {
        Self {
            heads: own::Limits {
                header_read: Duration::from_secs(server.header_read_timeout_secs),
                max_header_bytes: server.max_header_bytes,
            },
            write: Duration::from_secs(server.client_write_timeout_secs),
        }
    }
}

/// Accepts connections until `stop`, then lets every open connection finish its request and
/// close. Where the front serves the inference endpoints directly, a connection starts in the
/// router's own HTTP/1.1 loop ([`router_http1::server`]) and is handed to hyper at the first
/// request of another
/// shape. Clients speak HTTP/1.1: every byte of a connection's life is then under a timeout
/// (HTTP/2 flow control would let a client that stops reading hold a stream without ever
/// stalling a socket write, and the HTTP/2 preface sniffing has no timeout of its own).
///
/// Connection tasks belong to this loop's [`JoinSet`]: when the loop is aborted after the drain
/// deadline, the connections it still holds are aborted with it, releasing their guards.
async fn accept_loop(
    listener: TcpListener,
    service: Front,
    limits: ConnectionLimits,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.heads.header_read)
        .max_header_size(limits.heads.max_header_bytes);
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    let connection_stop = stop.clone();
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
        io.set_write_timeout(Some(limits.write));
        let io = Box::pin(io);
        let (builder, service, watcher) = (builder.clone(), service.clone(), graceful.watcher());
        let stop = connection_stop.clone();
        connections.spawn(async move {
            // The router's own loop first where the front serves inference directly; hyper
            // takes over at a request that loop leaves it, or from the start.
            let io = match service.own_loop() {
                Some(direct) => match own::serve(io, direct, limits.heads, stop).await {
                    own::Ended::HandedOver(rewound) => rewound,
                    own::Ended::Closed => return,
                },
                None => own::Rewound::unread(io),
            };
            let connection = builder.serve_connection(TokioIo::new(io), service);
            if let Err(err) = watcher.watch(connection).await {
                debug!(%peer, error = %err, "client connection ended with an error");
            }
        });
    }
    drop(listener);
    // Hyper's connections are told to finish; the router's own loops heard the stop already.
    let drained = async { while connections.join_next().await.is_some() {} };
    tokio::join!(graceful.shutdown(), drained);
    Ok(())
}

/// A running router: its address and the handle that stops it.
///
/// Clients are served by `event_loops` threads, each with a current-thread runtime, its own
/// `SO_REUSEPORT` listener on the one address (the kernel spreads connections over them) and
/// its own engine connection pool: a request lives on one thread from accept to the last byte,
/// with no cross-thread wake-ups. Background services (state subscriptions, health checks,
/// sweepers) stay on the runtime that called [`Serving::start`].
pub struct Serving {
    /// The bound address.
    pub addr: SocketAddr,
    ctx: Arc<AppContext>,
    shutdown: tokio::sync::watch::Sender<bool>,
    loops: Vec<EventLoop>,
}

/// One event-loop thread; it ends once its graceful shutdown is over, or at once on `abort`.
struct EventLoop {
    /// Ends the loop at once, aborting its connections.
    abort: CancellationToken,
    thread: std::thread::JoinHandle<()>,
}

impl Serving {
    /// Starts background services on the current runtime and `event_loops` (at least one)
    /// threads serving clients on `addr` (port 0 picks a free port, shared by all of them).
    pub fn start(
        ctx: Arc<AppContext>,
        addr: SocketAddr,
        event_loops: usize,
    ) -> std::io::Result<Self> {
        let front = Front::router(Arc::clone(&ctx));
        Self::start_front(ctx, front, addr, event_loops)
    }

    /// [`Serving::start`] serving `app` instead of the router's routes (the endpoint picker
    /// serves [`operations_routes`]).
    pub fn start_app(
        ctx: Arc<AppContext>,
        app: Router,
        addr: SocketAddr,
        event_loops: usize,
    ) -> std::io::Result<Self> {
        Self::start_front(ctx, Front::app(app), addr, event_loops)
    }

    fn start_front(
        ctx: Arc<AppContext>,
        front: Front,
        addr: SocketAddr,
        event_loops: usize,
    ) -> std::io::Result<Self> {
        if addr.port() != 0 {
            // SO_REUSEPORT would let these listeners join another process's on the same port
            // (a stale router of the same user) and split its traffic: a plain bind first
            // fails as it should when the port is taken.
            drop(std::net::TcpListener::bind(addr)?);
        }
        // Without SO_REUSEPORT (outside Unix) the loops cannot share the port: one loop.
        let event_loops = if cfg!(unix) { event_loops.max(1) } else { 1 };
        let first = reuseport_listener(addr)?;
        let addr = first.local_addr()?;
        let mut listeners = vec![first];
        for _ in 1..event_loops {
            listeners.push(reuseport_listener(addr)?);
        }
        ctx.start();
        let (shutdown, stop) = tokio::sync::watch::channel(false);
        let limits = ConnectionLimits::from(ctx.server());
        let loops = listeners
            .into_iter()
            .enumerate()
            .map(|(i, listener)| EventLoop::spawn(i, listener, front.clone(), limits, stop.clone()))
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Self { addr, ctx, shutdown, loops })
    }

    /// The application context.
    pub fn context(&self) -> &Arc<AppContext> {
        &self.ctx
    }

    /// Drains: readiness turns 503 and new chat requests are refused, in-flight requests
    /// finish (up to `drain` in all), then the listeners close and background services stop.
    pub async fn stop(self, drain: Duration) {
        let deadline = tokio::time::Instant::now() + drain;
        self.ctx.start_draining();
        while self.ctx.total_inflight() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if self.ctx.total_inflight() > 0 {
            // Open streams end with an error event of their own, given a moment to write it
            // before their connections close.
            self.ctx.end_drain();
            let written = tokio::time::Instant::now() + STREAM_END_GRACE;
            while self.ctx.total_inflight() > 0 && tokio::time::Instant::now() < written {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let _ = self.shutdown.send(true);
        let joins = self.loops.into_iter().map(|EventLoop { abort, thread }| {
            (abort, tokio::task::spawn_blocking(move || thread.join()))
        });
        let mut late = Vec::new();
        for (abort, mut joined) in joins {
            match tokio::time::timeout_at(deadline, &mut joined).await {
                Ok(ended) => report_loop_end(ended),
                Err(_) => late.push((abort, joined)),
            }
        }
        if !late.is_empty() {
            info!(?drain, "drain timed out; closing the remaining connections");
        }
        // Every late loop is told first, then awaited: a slow one holds up no other.
        for (abort, _) in &late {
            abort.cancel();
        }
        for (_, joined) in late {
            report_loop_end(joined.await);
        }
        self.ctx.shutdown().await;
    }
}

/// Logs an event loop that panicked.
fn report_loop_end(ended: Result<std::thread::Result<()>, tokio::task::JoinError>) {
    if let Ok(Err(panic)) = ended {
        warn!(?panic, "an event loop panicked");
    }
}

impl EventLoop {
    fn spawn(
        index: usize,
        listener: std::net::TcpListener,
        front: Front,
        limits: ConnectionLimits,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let (ready_tx, ready) = std::sync::mpsc::channel::<std::io::Result<()>>();
        let abort = CancellationToken::new();
        let aborted = abort.clone();
        let thread =
            std::thread::Builder::new().name(format!("router-loop-{index}")).spawn(move || {
                runtime.block_on(async move {
                    // The listener joins this loop's reactor, so it is made here.
                    let listener = match TcpListener::from_std(listener) {
                        Ok(listener) => {
                            let _ = ready_tx.send(Ok(()));
                            listener
                        }
                        Err(err) => {
                            let _ = ready_tx.send(Err(err));
                            return;
                        }
                    };
                    tokio::select! {
                        served = accept_loop(listener, front, limits, stop) => {
                            if let Err(err) = served {
                                warn!(error = %err, "event loop ended with an error");
                            }
                        }
                        () = aborted.cancelled() => {}
                    }
                });
                // Drops whatever connection tasks are left; blocking work (a long
                // tokenization, a DNS lookup) gets a second, not forever.
                runtime.shutdown_timeout(Duration::from_secs(1));
            })?;
        match ready.recv() {
            Ok(Ok(())) => Ok(Self { abort, thread }),
            Ok(Err(err)) => Err(err),
            Err(_) => Err(std::io::Error::other("the event loop thread ended before listening")),
        }
    }
}

/// A listening socket on `addr` that other sockets of this process may share
/// (`SO_REUSEPORT`), non-blocking for tokio.
fn reuseport_listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    #[cfg(unix)]
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

mod front;

#[cfg(test)]
mod h1_tests;
#[cfg(test)]
mod tests;
