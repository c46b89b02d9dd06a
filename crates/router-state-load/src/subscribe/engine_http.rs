//! The HTTP side of polling engines: one client per polling task, and a bounded `GET`.
//!
//! Shared by SGLang's `/v1/loads` polling and vLLM's `/metrics` polling and probing. A poll
//! that gets no answer, an error status, or a body beyond its bound is a [`PollError`]; what
//! the body says is the caller's business.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// The client a polling task keeps (and so its pooled connection).
pub(crate) type HttpClient = Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// Why one poll produced no body.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PollError {
    #[error("invalid url {0:?}")]
    Url(String, #[source] http::uri::InvalidUri),
    #[error("request failed")]
    Request(#[source] hyper_util::client::legacy::Error),
    #[error("engine answered {0}")]
    Status(http::StatusCode),
    #[error("reading the body failed")]
    Body(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("body larger than {0} bytes")]
    TooLarge(usize),
    #[error("timed out after {0:?}")]
    Timeout(Duration),
}

/// `{url}{path}` as a URI.
pub(crate) fn uri(url: &str, path: &str) -> Result<http::Uri, PollError> {
    let url = format!("{url}{path}");
    url.parse().map_err(|source| PollError::Url(url, source))
}

/// A client for `http://` engines, and for `https://` ones when `tls` is given.
pub(crate) fn http_client(tls: Option<&rustls::ClientConfig>) -> HttpClient {
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    let https = match tls {
        Some(tls) => HttpsConnectorBuilder::new().with_tls_config(tls.clone()).https_or_http(),
        // No TLS configured: https polls fail at the handshake, visibly.
        None => HttpsConnectorBuilder::new()
            .with_tls_config(
                rustls::ClientConfig::builder_with_provider(Arc::new(
                    rustls::crypto::ring::default_provider(),
                ))
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
            )
            .https_or_http(),
    };
    Client::builder(TokioExecutor::new()).build(https.enable_http1().wrap_connector(tcp))
}

/// One `GET`: what it asks for and how much it takes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Get<'a> {
    /// The `Accept` header.
    pub(crate) accept: &'static str,
    /// The engine's `Authorization` header, when it has an API key.
    pub(crate) authorization: Option<&'a http::HeaderValue>,
    /// Largest body taken, in bytes.
    pub(crate) max_bytes: usize,
    /// Deadline of the whole exchange, body included.
    pub(crate) timeout: Duration,
}

/// GETs `uri` under `get`'s bounds.
pub(crate) async fn fetch(
    client: &HttpClient,
    uri: http::Uri,
    get: Get<'_>,
) -> Result<Bytes, PollError> {
    tokio::time::timeout(get.timeout, fetch_unbounded(client, uri, get))
        .await
        .unwrap_or(Err(PollError::Timeout(get.timeout)))
}

async fn fetch_unbounded(
    client: &HttpClient,
    uri: http::Uri,
    get: Get<'_>,
) -> Result<Bytes, PollError> {
    let mut request = http::Request::get(uri)
        .header(http::header::ACCEPT, get.accept)
        .body(Empty::new())
        .map_err(|e| PollError::Body(Box::new(e)))?;
    if let Some(value) = get.authorization {
        request.headers_mut().insert(http::header::AUTHORIZATION, value.clone());
    }
    let response = client.request(request).await.map_err(PollError::Request)?;
    if response.status() != http::StatusCode::OK {
        return Err(PollError::Status(response.status()));
    }
    match Limited::new(response.into_body(), get.max_bytes).collect().await {
        Ok(body) => Ok(body.to_bytes()),
        Err(error) if error.is::<LengthLimitError>() => Err(PollError::TooLarge(get.max_bytes)),
        Err(error) => Err(PollError::Body(error)),
    }
}
