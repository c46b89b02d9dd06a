//! One ext_proc stream, that is one HTTP request through Envoy: its messages read in order,
//! the request routed once its body is known (as each body mode allows), everything else
//! answered or echoed, and the in-flight guards of the pick held until the stream ends,
//! whichever way it ends (completion, Envoy closing it, a reset from either side).
//!
//! When the pick is made, by body mode:
//! - FULL_DUPLEX_STREAMED (what Gateway API gateways configure): the body is buffered to its
//!   end (or the trailers), then the headers are answered with the pick and the (prepared)
//!   body is streamed back in chunks; response chunks are echoed as they come.
//! - BUFFERED, BUFFERED_PARTIAL: Envoy waits for the headers answer before it sends the body,
//!   so the headers are answered at once and the pick rides on the body answer.
//! - STREAMED: with `send_body_without_waiting_for_header_response` the body is buffered as
//!   in full duplex and each chunk answered after the headers; without it Envoy holds the body
//!   until the headers are answered, so the pick is made from the headers alone (a
//!   passed-through request of the router's only model).
//! - NONE, or a request without a body or on a path the router does not prepare: the pick is
//!   made from the headers alone.

use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use router_proto::envoy::config::core::v3::HeaderMap as EnvoyHeaders;
use router_proto::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use router_proto::envoy::service::ext_proc::v3::{
    BodyMutation, HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse, body_mutation,
    processing_request::Request,
};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};
use tracing::debug;

use super::EppSettings;
use super::endpoints::subset_hint;
use super::pick::{RouteRequest, Routed, route};
use super::reply::{self, Side};
use crate::app::AppContext;
use crate::error::ApiError;
use crate::metrics;
use router_prepare::Endpoint;

/// The sending half of a stream's answers.
pub(crate) type Answers = mpsc::Sender<Result<ProcessingResponse, Status>>;

/// How a stream ended, for `router_epp_stream_ends_total{end}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// Envoy closed its side after the exchange.
    Closed,
    /// The stream broke: Envoy reset it (a client that went away) or the transport failed.
    Reset,
    /// Envoy stopped reading answers.
    Abandoned,
}

impl End {
    fn as_str(self) -> &'static str {
        match self {
            End::Closed => "closed",
            End::Reset => "reset",
            End::Abandoned => "abandoned",
        }
    }
}

/// Where a stream stands.
struct Exchange {
    ctx: Arc<AppContext>,
    settings: Arc<EppSettings>,
    started: Instant,
    request_mode: BodySendMode,
    response_mode: BodySendMode,
    /// Body chunks may come before the headers are answered (STREAMED).
    body_before_answer: bool,
    /// The request's headers, once read.
    headers: http::HeaderMap,
    /// The API of the request's path (`None`: not prepared by the router).
    endpoint: Option<Endpoint>,
    subset: Option<Vec<String>>,
    /// The request body so far, while the pick waits for it.
    body: BytesMut,
    /// STREAMED chunks received before the pick, answered after it.
    pending_chunks: usize,
    /// The pick and its guards: held until the stream ends.
    routed: Option<Routed>,
    /// A local reply was sent: nothing more is answered.
    finished: bool,
}

/// Runs one stream to its end, answering on `answers`.
pub(crate) async fn run(
    ctx: Arc<AppContext>,
    settings: Arc<EppSettings>,
    mut inbound: Streaming<ProcessingRequest>,
    answers: Answers,
) {
    metrics::epp_stream_open(1.0);
    let mut exchange = Exchange {
        ctx,
        settings,
        started: Instant::now(),
        request_mode: BodySendMode::FullDuplexStreamed,
        response_mode: BodySendMode::None,
        body_before_answer: false,
        headers: http::HeaderMap::new(),
        endpoint: None,
        subset: None,
        body: BytesMut::new(),
        pending_chunks: 0,
        routed: None,
        finished: false,
    };
    let mut first = true;
    let end = loop {
        let message = tokio::select! {
            message = inbound.message() => message,
            () = answers.closed() => break End::Abandoned,
        };
        let message = match message {
            Ok(Some(message)) => message,
            Ok(None) => break End::Closed,
            Err(status) => {
                debug!(%status, "ext_proc stream broke");
                break End::Reset;
            }
        };
        if first {
            first = false;
            exchange.configure(&message);
        }
        let replies = exchange.handle(message).await;
        let mut sent = true;
        for reply in replies {
            if answers.send(Ok(reply)).await.is_err() {
                sent = false;
                break;
            }
        }
        if !sent {
            break End::Abandoned;
        }
    };
    metrics::epp_stream_end(end.as_str());
    metrics::epp_stream_open(-1.0);
    // The pick's guards are released here, with the exchange.
    drop(exchange);
}

/// The metrics label of a body mode.
fn mode_label(mode: BodySendMode) -> &'static str {
    match mode {
        BodySendMode::None => "none",
        BodySendMode::Streamed => "streamed",
        BodySendMode::Buffered => "buffered",
        BodySendMode::BufferedPartial => "buffered_partial",
        BodySendMode::FullDuplexStreamed => "full_duplex_streamed",
    }
}

impl Exchange {
    /// Reads the filter's body modes from the first message. An Envoy that does not send them
    /// (before 1.32) is taken to stream in full duplex, as Gateway API gateways configure.
    fn configure(&mut self, first: &ProcessingRequest) {
        if let Some(config) = &first.protocol_config {
            self.request_mode = BodySendMode::try_from(config.request_body_mode)
                .unwrap_or(BodySendMode::FullDuplexStreamed);
            self.response_mode =
                BodySendMode::try_from(config.response_body_mode).unwrap_or(BodySendMode::None);
            self.body_before_answer = config.send_body_without_waiting_for_header_response;
        }
        metrics::epp_stream(mode_label(self.request_mode));
    }

    /// The answers to one message from Envoy.
    async fn handle(&mut self, message: ProcessingRequest) -> Vec<ProcessingResponse> {
        if self.subset.is_none() {
            self.subset = subset_hint(message.metadata_context.as_ref());
        }
        if self.finished || message.observability_mode {
            return Vec::new();
        }
        let Some(request) = message.request else { return Vec::new() };
        match request {
            Request::RequestHeaders(headers) => self.request_headers(headers).await,
            Request::RequestBody(body) => self.request_body(body).await,
            Request::RequestTrailers(_) => self.request_trailers().await,
            Request::ResponseHeaders(headers) => self.response_headers(&headers),
            Request::ResponseBody(body) => self.response_body(body),
            Request::ResponseTrailers(_) => vec![reply::trailers(Side::Response)],
        }
    }

    async fn request_headers(&mut self, headers: HttpHeaders) -> Vec<ProcessingResponse> {
        let (map, path) = convert_headers(headers.headers.as_ref());
        self.headers = map;
        let path = path.split('?').next().unwrap_or_default();
        self.endpoint = Endpoint::ALL.into_iter().find(|e| e.path() == path);
        let headers_only = headers.end_of_stream
            || self.endpoint.is_none()
            || match self.request_mode {
                BodySendMode::None => true,
                BodySendMode::Streamed => !self.body_before_answer,
                _ => false,
            };
        if headers_only {
            // No body to read: routed as a passed-through request of the only model.
            self.endpoint = None;
            return match self.route(Bytes::new()).await {
                Ok(routed) => vec![reply::routed_headers(routed)],
                Err(immediate) => vec![immediate],
            };
        }
        match self.request_mode {
            BodySendMode::Buffered | BodySendMode::BufferedPartial => {
                vec![reply::unrouted_headers()]
            }
            // FULL_DUPLEX_STREAMED, and STREAMED with the body sent before the answer: the
            // headers are answered once the body is in.
            _ => Vec::new(),
        }
    }

    async fn request_body(&mut self, body: HttpBody) -> Vec<ProcessingResponse> {
        if self.routed.is_some() {
            // Routed from the headers: the body passes as it is.
            return match self.request_mode {
                BodySendMode::FullDuplexStreamed => {
                    reply::streamed_chunks(Side::Request, &body.body, body.end_of_stream)
                }
                _ => vec![reply::body_continue(Side::Request, None)],
            };
        }
        if self.body.len() + body.body.len() > self.ctx.max_body_bytes() {
            return vec![
                self.immediate(&ApiError::BodyTooLarge { limit: self.ctx.max_body_bytes() }),
            ];
        }
        self.body.extend_from_slice(&body.body);
        match self.request_mode {
            BodySendMode::Buffered | BodySendMode::BufferedPartial => {
                let original = std::mem::take(&mut self.body).freeze();
                match self.route(original.clone()).await {
                    Ok(routed) => {
                        let replaced = (routed.body != original).then(|| routed.body.clone());
                        vec![reply::routed_buffered_body(routed, replaced.as_deref())]
                    }
                    Err(immediate) => vec![immediate],
                }
            }
            BodySendMode::Streamed => {
                self.pending_chunks += 1;
                if !body.end_of_stream {
                    return Vec::new();
                }
                self.route_buffered_stream().await
            }
            _ if body.end_of_stream => self.route_full_duplex(true).await,
            _ => Vec::new(),
        }
    }

    /// Trailers end the request body: a full-duplex or streamed body still waiting is routed
    /// now, its last chunk not ending the stream (the trailers do).
    async fn request_trailers(&mut self) -> Vec<ProcessingResponse> {
        let mut replies = match (self.routed.is_some(), self.request_mode) {
            (false, BodySendMode::FullDuplexStreamed) => self.route_full_duplex(false).await,
            (false, BodySendMode::Streamed) => self.route_buffered_stream().await,
            _ => Vec::new(),
        };
        if !self.finished {
            replies.push(reply::trailers(Side::Request));
        }
        replies
    }

    /// Routes a whole FULL_DUPLEX_STREAMED body: the headers answer, then the body in chunks.
    async fn route_full_duplex(&mut self, ends: bool) -> Vec<ProcessingResponse> {
        let body = std::mem::take(&mut self.body).freeze();
        match self.route(body).await {
            Ok(routed) => {
                let mut replies = vec![reply::routed_headers(routed)];
                replies.extend(reply::streamed_chunks(Side::Request, &routed.body, ends));
                replies
            }
            Err(immediate) => vec![immediate],
        }
    }

    /// Routes a whole STREAMED body whose chunks came before the headers answer: the headers
    /// answer, then one answer per chunk (the first carrying a prepared body that differs,
    /// the others then cleared).
    async fn route_buffered_stream(&mut self) -> Vec<ProcessingResponse> {
        let original = std::mem::take(&mut self.body).freeze();
        let chunks = std::mem::take(&mut self.pending_chunks);
        match self.route(original.clone()).await {
            Ok(routed) => {
                let replaced = routed.body != original;
                let mut replies = vec![reply::routed_headers(routed)];
                for i in 0..chunks {
                    let mutation = replaced.then(|| BodyMutation {
                        mutation: Some(if i == 0 {
                            body_mutation::Mutation::Body(routed.body.to_vec())
                        } else {
                            body_mutation::Mutation::ClearBody(true)
                        }),
                    });
                    replies.push(reply::body_continue(Side::Request, mutation));
                }
                replies
            }
            Err(immediate) => vec![immediate],
        }
    }

    fn response_headers(&mut self, headers: &HttpHeaders) -> Vec<ProcessingResponse> {
        let (map, _) = convert_headers(headers.headers.as_ref());
        if let Some(routed) = &self.routed {
            let status = map
                .get(STATUS_KEY)
                .and_then(|s| s.to_str().ok())
                .and_then(|s| s.parse::<u16>().ok())
                .unwrap_or(0);
            let labels = &routed.labels;
            metrics::request(labels.model(), labels.bucket(), status, self.started.elapsed());
        }
        vec![reply::response_headers(self.routed.as_ref())]
    }

    fn response_body(&mut self, body: HttpBody) -> Vec<ProcessingResponse> {
        match self.response_mode {
            BodySendMode::FullDuplexStreamed => {
                reply::streamed_chunks(Side::Response, &body.body, body.end_of_stream)
            }
            _ => vec![reply::body_continue(Side::Response, None)],
        }
    }

    /// Routes the request with `body`; an error is answered with its local reply.
    async fn route(&mut self, body: Bytes) -> Result<&Routed, ProcessingResponse> {
        let request = RouteRequest {
            endpoint: self.endpoint,
            headers: &self.headers,
            body,
            subset: self.subset.as_deref(),
            fallbacks: self.settings.fallbacks,
            started: self.started,
        };
        match route(&self.ctx, request).await {
            Ok(routed) => {
                metrics::epp_fallbacks(routed.fallbacks);
                Ok(self.routed.insert(routed))
            }
            Err(err) => Err(self.immediate(&err)),
        }
    }

    /// The local reply for `err`, counted; the stream answers nothing after it.
    fn immediate(&mut self, err: &ApiError) -> ProcessingResponse {
        let (status, reply) = reply::immediate(err);
        metrics::epp_immediate_response(status);
        self.finished = true;
        reply
    }
}

/// The pseudo-header of a response's status, kept in the converted map under this name.
const STATUS_KEY: &str = "x-epp-status";

/// Envoy's headers as an HTTP header map (values from `raw_value`, else `value`; names or
/// values HTTP refuses are left out), and the request's `:path`. `:status` is kept as
/// [`STATUS_KEY`]; other pseudo-headers are dropped.
fn convert_headers(headers: Option<&EnvoyHeaders>) -> (http::HeaderMap, String) {
    let mut map = http::HeaderMap::new();
    let mut path = String::new();
    for header in headers.map(|h| h.headers.as_slice()).unwrap_or_default() {
        let value: &[u8] =
            if header.raw_value.is_empty() { header.value.as_bytes() } else { &header.raw_value };
        let key = match header.key.as_str() {
            ":path" => {
                path = String::from_utf8_lossy(value).into_owned();
                continue;
            }
            ":status" => STATUS_KEY,
            key if key.starts_with(':') => continue,
            key => key,
        };
        let (Ok(name), Ok(value)) =
            (http::HeaderName::from_bytes(key.as_bytes()), http::HeaderValue::from_bytes(value))
        else {
            continue;
        };
        map.append(name, value);
    }
    (map, path)
}
