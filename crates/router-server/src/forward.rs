//! Forwarding to engines: pooled HTTP/1.1 and HTTP/2 clients (h2c, or TLS with ALPN for
//! `https://` engines), streaming passthrough with no buffering, and the SGLang bootstrap
//! protocol for prefill/decode pairs. Each thread that sends requests has its own connection
//! pool, so an event loop's requests travel on connections driven by that loop.
//!
//! The in-flight guards of the engines dispatched to travel with the response body and are
//! released when it ends, fails, or is dropped because the client went away; dropping the body
//! also drops the upstream response, which closes the engine connection and so cancels the
//! request there.

use std::cell::RefCell;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client, ResponseFuture};
use hyper_util::rt::TokioExecutor;
use router_state_load::InflightGuard;
use router_workers::Worker;
use std::future::Future as _;

use tokio::sync::oneshot;

use crate::error::ApiError;
use crate::tls::TlsConfigError;
use rustls::ClientConfig;

/// The engine connector: plain TCP for `http://`, rustls for `https://`, the whole connection
/// setup (TCP and TLS handshake) under the connect timeout.
type EngineConnector = ConnectTimeout<HttpsConnector<HttpConnector>>;

/// Bounds a connector's whole connection setup: `HttpConnector`'s own timeout covers only the
/// TCP handshake, and an engine that accepts TCP but stalls its TLS handshake must still count
/// as unreachable within `connect_timeout`.
#[derive(Clone, Debug)]
pub struct ConnectTimeout<C> {
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
                Err(_) => Err(format!("connection setup took longer than {timeout:?}").into()),
            }
        })
    }
}

/// Connection and timeout settings of the engine clients.
#[derive(Clone, Debug)]
pub struct ForwardConfig {
    /// Speak HTTP/2 with prior knowledge (h2c) instead of HTTP/1.1.
    pub http2: bool,
    /// Timeout to establish a connection.
    pub connect_timeout: Duration,
    /// Timeout for the whole request, response body included.
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

/// Why a request could not be sent to an engine.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SendError {
    /// The connection could not be made.
    #[error("{0}")]
    Unreachable(String),
    /// The exchange failed after connecting.
    #[error("{0}")]
    Failed(String),
    /// No response head within the request timeout.
    #[error("{0}")]
    Timeout(String),
}

impl SendError {
    /// A metrics label.
    pub fn kind(&self) -> &'static str {
        match self {
            SendError::Unreachable(_) => "unreachable",
            SendError::Failed(_) => "transport",
            SendError::Timeout(_) => "timeout",
        }
    }
}

impl From<SendError> for ApiError {
    fn from(err: SendError) -> Self {
        match err {
            SendError::Timeout(message) => ApiError::UpstreamTimeout(message),
            SendError::Unreachable(message) => ApiError::EngineUnreachable(message),
            SendError::Failed(message) => ApiError::Upstream(message),
        }
    }
}

/// How a dispatch to one engine ended, for the circuit breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The engine answered (2xx, or a 4xx that is the client's fault).
    Success,
    /// 5xx, a timeout or a broken stream.
    Failure,
    /// The engine refused or could not take the connection.
    Unreachable,
}

/// Receives dispatch outcomes (the circuit breaker).
pub trait OutcomeSink: Send + Sync + 'static {
    /// Records how a dispatch to `worker` ended.
    fn record(&self, worker: &Worker, outcome: Outcome);
}

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
                .pool_idle_timeout(Duration::from_secs(90))
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

    /// The request timeout.
    pub fn request_timeout(&self) -> Duration {
        self.config.request_timeout
    }

    /// Sends `body` to `worker`'s chat endpoint and waits for the response head.
    pub async fn send(
        &self,
        worker: &Worker,
        body: Bytes,
        request_id: &HeaderValue,
    ) -> Result<Response<Incoming>, SendError> {
        let url = format!("{}/v1/chat/completions", worker.url());
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(&url)
            .header(header::CONTENT_TYPE, "application/json")
            .header("x-request-id", request_id)
            .body(Full::new(body))
            .map_err(|err| SendError::Failed(format!("building request to {url}: {err}")))?;
        authorize(&mut request, worker);
        match tokio::time::timeout(self.config.request_timeout, self.request(request)).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(err)) if err.is_connect() => Err(SendError::Unreachable(format!(
                "engine {} unreachable: {}",
                worker.id(),
                error_chain(&err)
            ))),
            Ok(Err(err)) => Err(SendError::Failed(format!(
                "engine {} failed: {}",
                worker.id(),
                error_chain(&err)
            ))),
            Err(_) => Err(SendError::Timeout(format!(
                "engine {} did not answer within {:?}",
                worker.id(),
                self.config.request_timeout
            ))),
        }
    }

    /// GETs `path` on `worker` with a timeout, returning the status (health checks).
    pub async fn probe(
        &self,
        worker: &Worker,
        path: &str,
        timeout: Duration,
    ) -> Option<StatusCode> {
        let mut request =
            Request::get(format!("{}{path}", worker.url())).body(Full::new(Bytes::new())).ok()?;
        authorize(&mut request, worker);
        let response = tokio::time::timeout(timeout, self.request(request)).await.ok()?.ok()?;
        let status = response.status();
        // Drain so the connection returns to the pool.
        let _ = tokio::time::timeout(timeout, response.into_body().collect()).await;
        Some(status)
    }
}

/// Adds the engine's own credential; the client's `Authorization` never travels further than
/// the router.
fn authorize<B>(request: &mut Request<B>, worker: &Worker) {
    if let Some(key) = worker.api_key() {
        request.headers_mut().insert(header::AUTHORIZATION, key.authorization().clone());
    }
}

fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A random 63-bit bootstrap room, as SGLang expects.
pub fn bootstrap_room() -> u64 {
    rand::random::<u64>() >> 1
}

/// The decode-side body for a PD request: the client's body plus the bootstrap fields.
pub fn with_bootstrap(
    body: &serde_json::Map<String, serde_json::Value>,
    prefill: &Worker,
    room: u64,
) -> Bytes {
    let mut body = body.clone();
    body.insert("bootstrap_host".into(), prefill.host().into());
    body.insert(
        "bootstrap_port".into(),
        prefill.bootstrap_port().unwrap_or(DEFAULT_BOOTSTRAP_PORT).into(),
    );
    body.insert("bootstrap_room".into(), room.into());
    Bytes::from(serde_json::to_vec(&body).unwrap_or_default())
}

/// SGLang's default bootstrap port, used when a prefill worker does not name one.
pub const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;

/// A response body streamed from an engine, holding the dispatch's in-flight guards until it
/// ends. A mid-stream failure becomes an SSE error event (for streams) and is reported to the
/// circuit breaker; a failed prefill partner aborts the decode stream the same way.
pub struct GuardedBody {
    inner: Incoming,
    guards: Vec<InflightGuard>,
    worker: Arc<Worker>,
    sink: Arc<dyn OutcomeSink>,
    sse: bool,
    partner_failure: Option<oneshot::Receiver<String>>,
    /// A frame or error polled while coalescing, delivered on the next poll.
    stashed: Option<Result<Frame<Bytes>, hyper::Error>>,
    /// The engine's body ended while coalescing.
    ended: bool,
    finished: bool,
}

/// Most bytes of already-arrived data frames merged into one write.
const COALESCE_LIMIT: usize = 64 * 1024;

impl GuardedBody {
    /// Wraps an engine's response body.
    pub fn new(
        inner: Incoming,
        guards: Vec<InflightGuard>,
        worker: Arc<Worker>,
        sink: Arc<dyn OutcomeSink>,
        sse: bool,
        partner_failure: Option<oneshot::Receiver<String>>,
    ) -> Self {
        Self {
            inner,
            guards,
            worker,
            sink,
            sse,
            partner_failure,
            stashed: None,
            ended: false,
            finished: false,
        }
    }

    fn finish(&mut self, outcome: Outcome) {
        if !self.finished {
            self.finished = true;
            self.sink.record(&self.worker, outcome);
            self.guards.clear();
            self.partner_failure = None;
        }
    }

    /// Passes one polled result on, finishing the dispatch at the end or on an error.
    fn deliver(
        &mut self,
        polled: Poll<Option<Result<Frame<Bytes>, hyper::Error>>>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match polled {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                self.finish(Outcome::Success);
                Poll::Ready(None)
            }
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
            Poll::Ready(Some(Err(err))) => {
                let message = format!("engine {} failed mid-response: {err}", self.worker.id());
                self.finish(Outcome::Failure);
                Poll::Ready(self.error_frame(&message))
            }
        }
    }

    fn error_frame(&self, message: &str) -> Option<Result<Frame<Bytes>, std::io::Error>> {
        let body = serde_json::json!({
            "error": {"message": message, "type": "upstream_error", "code": "engine_failed"}
        });
        if self.sse {
            Some(Ok(Frame::data(Bytes::from(format!("data: {body}\n\n")))))
        } else {
            Some(Err(std::io::Error::other(message.to_owned())))
        }
    }
}

impl Body for GuardedBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.finished {
            return Poll::Ready(None);
        }
        if let Some(partner) = &mut this.partner_failure
            && let Poll::Ready(result) = Pin::new(partner).poll(cx)
        {
            this.partner_failure = None;
            if let Ok(message) = result {
                this.finish(Outcome::Success);
                return Poll::Ready(this.error_frame(&message));
            }
        }
        if let Some(stashed) = this.stashed.take() {
            return this.deliver(Poll::Ready(Some(stashed)));
        }
        if this.ended {
            return this.deliver(Poll::Ready(None));
        }
        let first = Pin::new(&mut this.inner).poll_frame(cx);
        let Poll::Ready(Some(Ok(frame))) = first else {
            return this.deliver(first);
        };
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(frame) => return Poll::Ready(Some(Ok(frame))),
        };
        // Coalesce data frames that are already here (a burst of SSE events) into one write;
        // never wait for more, so the first byte goes out as soon as it arrives.
        let mut batch: Option<bytes::BytesMut> = None;
        while batch.as_ref().map_or(data.len(), bytes::BytesMut::len) < COALESCE_LIMIT {
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(next))) => match next.into_data() {
                    Ok(more) => {
                        batch
                            .get_or_insert_with(|| bytes::BytesMut::from(&data[..]))
                            .extend_from_slice(&more);
                    }
                    Err(trailers) => {
                        this.stashed = Some(Ok(trailers));
                        break;
                    }
                },
                Poll::Ready(Some(Err(err))) => {
                    this.stashed = Some(Err(err));
                    break;
                }
                Poll::Ready(None) => {
                    this.ended = true;
                    break;
                }
                Poll::Pending => break,
            }
        }
        let data = batch.map_or(data, bytes::BytesMut::freeze);
        Poll::Ready(Some(Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.finished
    }

    /// The engine's own length, so a non-streamed answer keeps its `content-length`. A stream
    /// may gain an error event, so its length is never promised.
    fn size_hint(&self) -> http_body::SizeHint {
        if self.sse || self.partner_failure.is_some() {
            http_body::SizeHint::default()
        } else {
            self.inner.size_hint()
        }
    }
}

impl Drop for GuardedBody {
    fn drop(&mut self) {
        // The client went away before the end: not the engine's fault.
        self.finish(Outcome::Success);
    }
}

/// A response body that runs a callback once, as its first data frame passes (the client's
/// time to first token, for comparing a policy's prediction with what happened).
pub struct FirstByte<B> {
    inner: B,
    on_first: Option<Box<dyn FnOnce() + Send>>,
}

impl<B> FirstByte<B> {
    /// `inner`, calling `on_first` when its first data frame is polled.
    pub fn new(inner: B, on_first: impl FnOnce() + Send + 'static) -> Self {
        Self { inner, on_first: Some(Box::new(on_first)) }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for FirstByte<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && frame.is_data()
            && let Some(on_first) = self.on_first.take()
        {
            on_first();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Copies the engine's response headers that make sense end to end (content type, caching),
/// never hop-by-hop ones.
pub fn passthrough_headers(from: &HeaderMap, to: &mut HeaderMap) {
    for name in [header::CONTENT_TYPE, header::CACHE_CONTROL] {
        if let Some(value) = from.get(&name) {
            to.insert(name, value.clone());
        }
    }
}
