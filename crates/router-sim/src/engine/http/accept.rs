//! The accept loop: each connection (plain TCP, or TLS once its handshake succeeds) is served
//! by hyper's HTTP/1.1 + HTTP/2 builder and dropped at once when the engine stops.

use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long a client may take to complete its TLS handshake before the connection is dropped.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` until `stop`, over TLS when `tls` is given, dropping every
/// open connection then. A failed accept or TLS handshake only loses that connection.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    router: Router,
    tls: Option<TlsAcceptor>,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (router, tls, stop) = (router.clone(), tls.clone(), stop.clone());
        tracker.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = serve_connection(stream, tls, router) => {}
            }
        });
    }
}

/// Serves one accepted connection to its end, after a TLS handshake when `tls` is given.
async fn serve_connection(stream: TcpStream, tls: Option<TlsAcceptor>, router: Router) {
    let Some(acceptor) = tls else {
        return serve_http(stream, router).await;
    };
    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => serve_http(stream, router).await,
        Ok(Err(error)) => tracing::debug!(%error, "tls handshake failed"),
        Err(_) => tracing::debug!(timeout = ?TLS_HANDSHAKE_TIMEOUT, "tls handshake timed out"),
    }
}

/// Speaks HTTP/1.1 or HTTP/2 (whichever the client starts with) on `io`.
async fn serve_http<I>(io: I, router: Router)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = TowerToHyperService::new(router);
    let builder = auto::Builder::new(TokioExecutor::new());
    if let Err(error) = builder.serve_connection(TokioIo::new(io), service).await {
        tracing::debug!(%error, "connection ended with an error");
    }
}
