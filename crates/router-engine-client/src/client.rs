//! The engine clients: pooled HTTP/1.1 and HTTP/2 (h2c, or TLS with ALPN for `https://`
//! engines), one connection pool per thread that sends requests, so an event loop's requests
//! travel on connections driven by that loop; the connection setup under its own timeout.
//!
//! Inference requests to HTTP/1.1 engines go over the router's own connections
//! ([`router_http1::client`]): the
//! request and then its answer's body read the socket themselves, with no task between the
//! engine and the client. HTTP/2 engines, and the health probes and control requests of any
//! engine (a few a second), use hyper-util's pooled client.

use std::cell::RefCell;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client, ResponseFuture};
use hyper_util::rt::TokioExecutor;
use router_workers::Worker;
use rustls::ClientConfig;

use crate::REQUEST_ID_HEADER;
use crate::error::{BoxError, SendError};
use crate::tls::TlsConfigError;
use crate::trace::TraceHeaders;
use router_http1::answer::RequestHead;
use router_http1::client::{H1Answer, H1Error, H1Pool};
use router_prepare::DP_RANK;

/// The content type of every request to an engine.
const APPLICATION_JSON: HeaderValue = HeaderValue::from_static("application/json");

/// The engine connector: plain TCP for `http://`, rustls for `https://`, the whole connection
/// setup (TCP and TLS handshake) under the connect timeout.
type EngineConnector = ConnectTimeout<HttpsConnector<HttpConnector>>;

/// Bounds a connector's whole connection setup: `HttpConnector`'s own timeout covers only the
/// TCP handshake, and an engine that accepts TCP but stalls its TLS handshake must still count
/// as unreachable within `connect_timeout`.
#[derive(Clone, Debug)]
pub(crate) struct ConnectTimeout<C> {
    inner: C,
    timeout: Duration,
}

impl<C> tower::Service<http::Uri> for ConnectTimeout<C>
where
    C: tower::Service<http::Uri> + Send + 'static,
    C::Future: Send + 'static,
    C::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = C::Response;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<C::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let (connecting, timeout) = (self.inner.call(uri), self.timeout);
        Box::pin(async move {
            match tokio::time::timeout(timeout, connecting).await {
                Ok(connected) => connected.map_err(Into::into),
                Err(_) => Err(SetupTimeout(timeout).into()),
            }
        })
    }
}

/// The connection setup (TCP and TLS handshake) outlasted the connect timeout.
#[derive(Debug, thiserror::Error)]
#[error("connection setup took longer than {0:?}")]
struct SetupTimeout(Duration);

/// Connection and timeout settings of the engine clients.
#[derive(Clone, Debug)]
pub struct ForwardConfig {
    /// Speak HTTP/2 with prior knowledge (h2c) instead of HTTP/1.1.
    pub http2: bool,
    /// Timeout to establish a connection.
    pub connect_timeout: Duration,
    /// Timeout for the response head.
    pub request_timeout: Duration,
    /// Idle pooled connections kept per engine.
    pub pool_max_idle_per_host: usize,
    /// TLS for `https://` engines; `None` = system roots only.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl Default for ForwardConfig {
    fn default() -> Self {
        Self {
            http2: false,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(1800),
            pool_max_idle_per_host: 1024,
            tls: None,
        }
    }
}

/// How long an idle pooled connection to an engine is kept.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// One connection pool to the engines.
type EngineClient = Client<EngineConnector, Full<Bytes>>;

thread_local! {
    /// This thread's pool of each forwarder (by id): an event loop's requests use connections
    /// driven by that same loop, so a request never wakes another thread.
    static POOLS: RefCell<Vec<(u64, EngineClient)>> = const { RefCell::new(Vec::new()) };
}

/// The engine clients: one connection pool per thread that sends requests.
#[derive(Clone, Debug)]
pub struct Forwarder {
    /// Names this forwarder's pools in each thread's table.
    id: u64,
    connector: EngineConnector,
    /// The TLS settings in use (`config.tls`, or the system roots alone).
    tls: Arc<ClientConfig>,
    config: ForwardConfig,
}

impl Forwarder {
    /// Builds the pooled client. HTTP/2 is prior knowledge (h2c) for `http://` engines and
    /// negotiated by ALPN for `https://` ones.
    pub fn new(config: ForwardConfig) -> Result<Self, TlsConfigError> {
        let mut tcp = HttpConnector::new();
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(config.connect_timeout));
        tcp.enforce_http(false);
        let tls = match &config.tls {
            Some(tls) => Arc::clone(tls),
            None => crate::tls::engine_client_config(None)?,
        };
        let https =
            HttpsConnectorBuilder::new().with_tls_config(ClientConfig::clone(&tls)).https_or_http();
        let connector = if config.http2 {
            https.enable_http2().wrap_connector(tcp)
        } else {
            https.enable_http1().wrap_connector(tcp)
        };
        let connector = ConnectTimeout { inner: connector, timeout: config.connect_timeout };
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Self { id, connector, tls, config })
    }

    /// Sends `request` through this thread's pool (created on first use).
    fn request(&self, request: Request<Full<Bytes>>) -> ResponseFuture {
        POOLS.with_borrow_mut(|pools| {
            if let Some((_, client)) = pools.iter().find(|(id, _)| *id == self.id) {
                return client.request(request);
            }
            let client = Client::builder(TokioExecutor::new())
                .pool_idle_timeout(POOL_IDLE_TIMEOUT)
                .pool_max_idle_per_host(self.config.pool_max_idle_per_host)
                .http2_only(self.config.http2)
                .build(self.connector.clone());
            let response = client.request(request);
            pools.push((self.id, client));
            response
        })
    }

    /// The TLS settings for `https://` engines, to share with other engine clients.
    pub fn tls(&self) -> Arc<ClientConfig> {
        Arc::clone(&self.tls)
    }

    /// POSTs the JSON `body` to `path` (`/v1/chat/completions`, say) on `worker`, naming
    /// data-parallel rank `rank` in the `X-data-parallel-rank` header when given and carrying
    /// the W3C trace context `trace`, and waits for the response head.
    pub async fn send(
        &self,
        worker: &Worker,
        path: &str,
        body: Bytes,
        request_id: &HeaderValue,
        rank: Option<u32>,
        trace: &TraceHeaders,
    ) -> Result<Response<EngineBody>, SendError> {
        let invalid = |source: BoxError| SendError::Request {
            worker: worker.id().clone(),
            url: format!("{}{path}", worker.url()),
            source,
        };
        let timeout = self.config.request_timeout;
        let worker_id = || worker.id().clone();
        if self.config.http2 {
            // HTTP/2 names the engine and the path in the URI.
            let uri = worker.uri_for(path).map_err(|err| invalid(err.into()))?;
            // Built in place, each header with its name already parsed: the builder would
            // parse every name and the whole URL again on each request.
            let mut request = Request::new(Full::new(body));
            *request.method_mut() = Method::POST;
            *request.uri_mut() = uri;
            let headers = request.headers_mut();
            headers.insert(header::CONTENT_TYPE, APPLICATION_JSON);
            headers.insert(REQUEST_ID_HEADER, request_id.clone());
            if let Some(rank) = rank {
                headers.insert(DP_RANK, rank.into());
            }
            authorize(&mut request, worker);
            trace.apply(request.headers_mut());
            let Ok(sent) = tokio::time::timeout(timeout, self.request(request)).await else {
                return Err(SendError::Timeout { worker: worker_id(), after: timeout });
            };
            sent.map(|response| response.map(EngineBody::H2)).map_err(|source| {
                let worker = worker_id();
                if source.is_connect() {
                    SendError::Unreachable { worker, source: source.into() }
                } else {
                    SendError::Failed { worker, source: source.into() }
                }
            })
        } else {
            let head =
                h1_head(worker, path, body.len(), request_id, rank, trace).map_err(invalid)?;
            let connect_uri = || worker.uri_for("/").unwrap_or_default();
            let pool = self.h1();
            // The timeout is kept by the connection's own timer (router-http1's pool).
            let sent = pool.send(worker.url(), connect_uri, &head, &body, timeout).await;
            sent.map(|response| response.map(EngineBody::H1)).map_err(|err| match err {
                H1Error::Connect(source) => SendError::Unreachable { worker: worker_id(), source },
                H1Error::Exchange(source) => {
                    SendError::Failed { worker: worker_id(), source: source.into() }
                }
                H1Error::TimedOut => SendError::Timeout { worker: worker_id(), after: timeout },
            })
        }
    }

    /// This forwarder's HTTP/1.1 connections.
    fn h1(&self) -> H1Pool<'_, EngineConnector> {
        H1Pool {
            id: self.id,
            connector: &self.connector,
            max_per_engine: self.config.pool_max_idle_per_host,
            idle_timeout: POOL_IDLE_TIMEOUT,
        }
    }

    /// GETs `path` on `worker` with a timeout, returning the status (health checks).
    pub async fn probe(&self, worker: &Worker, path: &str, timeout: Duration) -> Probe {
        let mut request = Request::new(Full::new(Bytes::new()));
        *request.uri_mut() = match worker.uri_for(path) {
            Ok(uri) => uri,
            Err(_) => return Probe::NoAnswer,
        };
        authorize(&mut request, worker);
        let exchange = async {
            let response = match self.request(request).await {
                Ok(response) => response,
                Err(error) if error.is_connect() => return Probe::Refused,
                Err(_) => return Probe::NoAnswer,
            };
            let status = response.status();
            // Read to the end, so the connection returns to the pool.
            let body = http_body_util::Limited::new(response.into_body(), 1 << 20);
            match body.collect().await {
                Ok(_) => Probe::Answered(status),
                Err(_) => Probe::NoAnswer,
            }
        };
        tokio::time::timeout(timeout, exchange).await.unwrap_or(Probe::NoAnswer)
    }

    /// GETs `path` on `worker`, head and body within `timeout` (at most 1 MiB of body): the
    /// status and the body, or `None` when the engine could not answer.
    pub async fn get(
        &self,
        worker: &Worker,
        path: &str,
        timeout: Duration,
    ) -> Option<(StatusCode, Bytes)> {
        self.bodiless(Method::GET, worker, path, timeout).await
    }

    /// POSTs nothing to `path` on `worker` (a control request such as `/flush_cache`), as
    /// [`Forwarder::get`] does.
    pub async fn post_empty(
        &self,
        worker: &Worker,
        path: &str,
        timeout: Duration,
    ) -> Option<(StatusCode, Bytes)> {
        self.bodiless(Method::POST, worker, path, timeout).await
    }

    async fn bodiless(
        &self,
        method: Method,
        worker: &Worker,
        path: &str,
        timeout: Duration,
    ) -> Option<(StatusCode, Bytes)> {
        const LIMIT: usize = 1 << 20;
        let mut request = Request::new(Full::new(Bytes::new()));
        *request.method_mut() = method;
        *request.uri_mut() = worker.uri_for(path).ok()?;
        authorize(&mut request, worker);
        let exchange = async {
            let response = self.request(request).await.ok()?;
            let status = response.status();
            // Read to the end, so the connection returns to the pool.
            let body = http_body_util::Limited::new(response.into_body(), LIMIT);
            Some((status, body.collect().await.ok()?.to_bytes()))
        };
        tokio::time::timeout(timeout, exchange).await.ok()?
    }
}

/// What a health probe found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// The engine answered with this status.
    Answered(StatusCode),
    /// Nothing listens: the connection was refused (or could not be made).
    Refused,
    /// Connected, but no whole answer in time.
    NoAnswer,
}

/// The HTTP/1.1 head of a request of `length` bytes to `path` on `worker` (the path alone on
/// the request line, the engine in `Host`), with the headers [`Forwarder::send`] names.
fn h1_head(
    worker: &Worker,
    path: &str,
    length: usize,
    request_id: &HeaderValue,
    rank: Option<u32>,
    trace: &TraceHeaders,
) -> Result<Vec<u8>, BoxError> {
    let full_uri;
    let (target, host) = match worker.host_header() {
        Some(host) => (path, host.clone()),
        // An engine URL with a path of its own: the path goes before `path`.
        None => {
            full_uri = worker.uri_for(path)?;
            let host = full_uri.authority().map(|a| HeaderValue::from_str(a.as_str()));
            let host = host.transpose()?.unwrap_or(HeaderValue::from_static(""));
            (full_uri.path_and_query().map_or("/", |p| p.as_str()), host)
        }
    };
    if !is_origin_form(target) {
        return Err(format!("{target:?} is not a request target").into());
    }
    let mut head = RequestHead::new("POST", target);
    head.field(&header::HOST, &host);
    head.field(&header::CONTENT_TYPE, &APPLICATION_JSON);
    head.field(&REQUEST_ID_HEADER, request_id);
    if let Some(rank) = rank {
        head.decimal_field(&DP_RANK, rank.into());
    }
    if let Some(key) = worker.api_key() {
        head.field(&header::AUTHORIZATION, key.authorization());
    }
    trace.each(|name, value| head.field(name, value));
    Ok(head.finish(length))
}

/// Whether `target` can stand on a request line as it is: a path (with any query) of visible
/// ASCII characters.
#[inline]
fn is_origin_form(target: &str) -> bool {
    target.starts_with('/') && target.bytes().all(|byte| byte.is_ascii_graphic())
}

/// An engine's answer body: read by the router's own HTTP/1.1 connection (router-http1), or by
/// hyper's HTTP/2 client.
#[derive(Debug)]
pub enum EngineBody {
    /// Read by the router's own HTTP/1.1 connection.
    H1(H1Answer),
    /// Handed over by hyper's HTTP/2 connection task.
    H2(Incoming),
}

impl EngineBody {
    /// Whether a connection task of its own hands this body's frames over one at a time
    /// (hyper's HTTP/2), rather than the body reading its socket as it is polled.
    #[inline]
    pub fn handed_over_by_a_task(&self) -> bool {
        matches!(self, EngineBody::H2(_))
    }
}

impl Body for EngineBody {
    type Data = Bytes;
    type Error = BoxError;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            EngineBody::H1(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            EngineBody::H2(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match self {
            EngineBody::H1(body) => body.is_end_stream(),
            EngineBody::H2(body) => body.is_end_stream(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match self {
            EngineBody::H1(body) => body.size_hint(),
            EngineBody::H2(body) => body.size_hint(),
        }
    }
}

/// Adds the engine's own credential; the client's `Authorization` never travels further than
/// the router.
#[inline]
fn authorize<B>(request: &mut Request<B>, worker: &Worker) {
    if let Some(key) = worker.api_key() {
        request.headers_mut().insert(header::AUTHORIZATION, key.authorization().clone());
    }
}

#[cfg(test)]
mod h1_tests;
#[cfg(test)]
mod tests;
