//! One streamed chat request through a pooled HTTP client, measured: time to the first
//! content token, usage, the engine that served it (`x-router-engine`), or why it failed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_TYPE, HeaderName};
use http::{HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

use super::LoadError;
use super::workload::Message;

/// Headers naming the engine that served a request, by preference.
const ENGINE_HEADERS: [&str; 2] = ["x-router-engine", "x-router-decode-engine"];

/// What happened to one request.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Outcome {
    /// The failure class (`status_503`, `connect`, `broken_stream`, ...), `None` on success.
    pub(crate) error: Option<String>,
    pub(crate) ttft: Option<Duration>,
    pub(crate) latency: Duration,
    pub(crate) prompt_tokens: Option<u64>,
    pub(crate) cached_tokens: Option<u64>,
    pub(crate) completion_tokens: Option<u64>,
    pub(crate) engine: Option<String>,
    pub(crate) content: String,
    /// The session the request was a turn of (`None` for trace requests).
    pub(crate) session: Option<String>,
    /// The request's 0-based index in its trace (`None` for session turns).
    pub(crate) trace_index: Option<usize>,
}

/// The generator's HTTP client (connection pool shared by every request), over one target or
/// several: with several, requests go to them round robin, as a load balancer spraying
/// requests over router replicas would, and a request whose target refuses the connection
/// goes on to the next one (the balancer's failover), once per target at most.
#[derive(Clone, Debug)]
pub(crate) struct Client {
    http: HyperClient<HttpConnector, Full<Bytes>>,
    uris: Arc<[Uri]>,
    next: Arc<AtomicUsize>,
    model: String,
    session_header: Option<HeaderName>,
}

/// The chat completions URI of `target`.
fn chat_uri(target: &str) -> Result<Uri, LoadError> {
    let trimmed = target.trim_end_matches('/');
    let url = if trimmed.ends_with("/v1/chat/completions") {
        trimmed.to_owned()
    } else {
        format!("{trimmed}/v1/chat/completions")
    };
    let uri: Uri =
        url.parse().map_err(|source| LoadError::Target { target: target.to_owned(), source })?;
    if uri.scheme_str() != Some("http") {
        return Err(LoadError::Scheme { target: target.to_owned() });
    }
    Ok(uri)
}

impl Client {
    pub(crate) fn new(
        targets: &[String],
        model: &str,
        session_header: Option<&str>,
    ) -> Result<Self, LoadError> {
        let uris: Vec<Uri> = targets.iter().map(|t| chat_uri(t)).collect::<Result<_, _>>()?;
        let session_header = session_header
            .map(|name| {
                HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| LoadError::HeaderName { name: name.to_owned() })
            })
            .transpose()?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let http = HyperClient::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Self {
            http,
            uris: uris.into(),
            next: Arc::new(AtomicUsize::new(0)),
            model: model.to_owned(),
            session_header,
        })
    }

    /// Sends one streamed request and reads it to the end.
    pub(crate) async fn chat(
        &self,
        messages: &[Message],
        max_tokens: usize,
        session: Option<&str>,
    ) -> Outcome {
        let start = Instant::now();
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        let mut outcome = Outcome::default();
        for attempt in 0..self.uris.len().max(1) {
            let uri = &self.uris[(first + attempt) % self.uris.len()];
            outcome = self.exchange(uri, messages, max_tokens, session, start).await;
            if outcome.error.as_deref() != Some("connect") {
                break;
            }
        }
        outcome.latency = start.elapsed();
        outcome.session = session.map(str::to_owned);
        outcome
    }

    async fn exchange(
        &self,
        uri: &Uri,
        messages: &[Message],
        max_tokens: usize,
        session: Option<&str>,
        start: Instant,
    ) -> Outcome {
        let body = serde_json::json!({
            "model": self.model,
            "messages": messages,
            "stream": true,
            "stream_options": { "include_usage": true },
            "max_tokens": max_tokens,
        });
        let mut request = Request::builder().method(Method::POST).uri(uri.clone());
        if let Some(headers) = request.headers_mut() {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            if let (Some(name), Some(session)) = (&self.session_header, session)
                && let Ok(value) = HeaderValue::from_str(session)
            {
                headers.insert(name.clone(), value);
            }
        }
        let failed = |kind: &str| Outcome { error: Some(kind.to_owned()), ..Outcome::default() };
        let Ok(request) = request.body(Full::new(Bytes::from(body.to_string()))) else {
            return failed("bad_request");
        };
        let response = match self.http.request(request).await {
            Ok(response) => response,
            Err(error) if error.is_connect() => return failed("connect"),
            Err(_) => return failed("transport"),
        };
        let engine = ENGINE_HEADERS
            .iter()
            .find_map(|name| response.headers().get(*name))
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let status = response.status();
        let mut outcome = Outcome { engine, ..Outcome::default() };
        let mut body = response.into_body();
        if !status.is_success() {
            // Drain the error body so the connection can be reused.
            let _ = body.collect().await;
            outcome.error = Some(format!("status_{}", status.as_u16()));
            return outcome;
        }
        let mut parser = SseParser::default();
        loop {
            let frame = match body.frame().await {
                Some(Ok(frame)) => frame,
                Some(Err(_)) => break,
                None => break,
            };
            let Ok(data) = frame.into_data() else { continue };
            parser.push(&data);
            while let Some(event) = parser.next_event() {
                match apply(&mut outcome, &event, start) {
                    Flow::Continue => {}
                    Flow::Done => {
                        outcome.ttft.get_or_insert_with(|| start.elapsed());
                        return outcome;
                    }
                    Flow::Failed(kind) => {
                        outcome.error = Some(kind.to_owned());
                        return outcome;
                    }
                }
            }
        }
        outcome.error = Some("broken_stream".to_owned());
        outcome
    }
}

enum Flow {
    Continue,
    Done,
    Failed(&'static str),
}

/// Applies one SSE `data:` payload to the outcome.
fn apply(outcome: &mut Outcome, data: &str, start: Instant) -> Flow {
    if data == "[DONE]" {
        return Flow::Done;
    }
    let Ok(chunk) = serde_json::from_str::<serde_json::Value>(data) else {
        return Flow::Failed("bad_json");
    };
    if chunk.get("error").is_some_and(|e| !e.is_null()) {
        return Flow::Failed("stream_error");
    }
    if let Some(content) =
        chunk.pointer("/choices/0/delta/content").and_then(|c| c.as_str()).filter(|c| !c.is_empty())
    {
        if outcome.ttft.is_none() {
            outcome.ttft = Some(start.elapsed());
        }
        outcome.content.push_str(content);
    }
    if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
        outcome.prompt_tokens = usage.get("prompt_tokens").and_then(|v| v.as_u64());
        outcome.completion_tokens = usage.get("completion_tokens").and_then(|v| v.as_u64());
        outcome.cached_tokens = Some(
            usage
                .pointer("/prompt_tokens_details/cached_tokens")
                .and_then(|v| v.as_u64())
                .unwrap_or(0),
        );
    }
    Flow::Continue
}

/// Splits a byte stream into SSE events and yields their joined `data:` lines.
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    buffer: BytesMut,
}

impl SseParser {
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    pub(crate) fn next_event(&mut self) -> Option<String> {
        loop {
            let (end, skip) = find_boundary(&self.buffer)?;
            let raw = self.buffer.split_to(end + skip);
            let text = String::from_utf8_lossy(&raw[..end]);
            let data: Vec<&str> = text
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if !data.is_empty() {
                return Some(data.join("\n"));
            }
        }
    }
}

/// The first blank line: `\n\n` or `\r\n\r\n`, as (event end, separator length).
fn find_boundary(buffer: &[u8]) -> Option<(usize, usize)> {
    let lf = buffer.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buffer.windows(4).position(|w| w == b"\r\n\r\n").map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_split_across_frames() {
        let mut parser = SseParser::default();
        parser.push(b"data: {\"a\"");
        assert_eq!(parser.next_event(), None);
        parser.push(b": 1}\n\n: comment\n\ndata: [DONE]\r\n\r\n");
        assert_eq!(parser.next_event().as_deref(), Some("{\"a\": 1}"));
        assert_eq!(parser.next_event().as_deref(), Some("[DONE]"));
        assert_eq!(parser.next_event(), None);
    }

    #[test]
    fn chunks_fill_the_outcome() {
        let start = Instant::now();
        let mut outcome = Outcome::default();
        let role = r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#;
        assert!(matches!(apply(&mut outcome, role, start), Flow::Continue));
        assert_eq!(outcome.ttft, None, "an empty delta is not a token");
        let token = r#"{"choices":[{"index":0,"delta":{"content":"hi"}}]}"#;
        assert!(matches!(apply(&mut outcome, token, start), Flow::Continue));
        assert!(outcome.ttft.is_some());
        let usage = r#"{"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":64}}}"#;
        assert!(matches!(apply(&mut outcome, usage, start), Flow::Continue));
        assert_eq!((outcome.prompt_tokens, outcome.cached_tokens), (Some(100), Some(64)));
        let no_details = r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1}}"#;
        apply(&mut outcome, no_details, start);
        assert_eq!(outcome.cached_tokens, Some(0), "absent details mean nothing cached");
        assert!(matches!(apply(&mut outcome, "[DONE]", start), Flow::Done));
        assert!(matches!(
            apply(&mut outcome, r#"{"error":{"message":"x"}}"#, start),
            Flow::Failed("stream_error")
        ));
        assert_eq!(outcome.content, "hi");
    }

    #[test]
    fn targets_get_the_chat_path_and_must_be_http() {
        let one = |t: &str| vec![t.to_owned()];
        let client = Client::new(&one("http://127.0.0.1:8080/"), "m", None).expect("valid");
        assert_eq!(client.uris[0].to_string(), "http://127.0.0.1:8080/v1/chat/completions");
        let client = Client::new(&one("http://h:1/v1/chat/completions"), "m", Some("x-session-id"))
            .expect("valid");
        assert_eq!(client.uris[0].path(), "/v1/chat/completions");
        assert!(Client::new(&one("https://h:1"), "m", None).is_err());
        assert!(Client::new(&one("http://h:1"), "m", Some("bad header")).is_err());
        let several = ["http://a:1".to_owned(), "https://b:2".to_owned()];
        assert!(Client::new(&several, "m", None).is_err(), "every target is checked");
        let several = ["http://a:1".to_owned(), "http://b:2".to_owned()];
        let client = Client::new(&several, "m", None).expect("valid");
        assert_eq!(client.uris.len(), 2);
    }

    #[tokio::test]
    async fn requests_go_round_robin_and_fail_over_a_refused_target() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        // Two tiny HTTP servers naming themselves in x-router-engine, and one closed port.
        async fn server(name: &'static str) -> String {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("addr");
            tokio::spawn(async move {
                while let Ok((mut socket, _)) = listener.accept().await {
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 65536];
                        let _ = socket.read(&mut buf).await;
                        let body = "data: [DONE]\n\n";
                        let reply = format!(
                            "HTTP/1.1 200 OK\r\nx-router-engine: {name}\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = socket.write_all(reply.as_bytes()).await;
                    });
                }
            });
            format!("http://{addr}")
        }
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            format!("http://{}", listener.local_addr().expect("addr"))
        };
        let targets = [server("a").await, closed, server("b").await];
        let client = Client::new(&targets, "m", None).expect("valid");
        let mut engines = Vec::new();
        for _ in 0..6 {
            let outcome = client.chat(&[], 1, Some("s")).await;
            assert_eq!(outcome.session.as_deref(), Some("s"));
            engines.push(outcome.engine.unwrap_or_default());
        }
        // a, (closed -> b), b, a, (closed -> b), b.
        assert_eq!(engines, ["a", "b", "b", "a", "b", "b"]);
    }
}
