//! The engine clients on in-process engines: what a request carries (the engine's own key,
//! the request id, JSON), HTTP/2 with prior knowledge, and how each failure to get a head is
//! named: nothing listening and a TLS handshake that never completes are unreachable (the one
//! failure retried), an engine that never answers is a timeout; probes likewise.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, Method, Version};
use bytes::Bytes;
use http::HeaderValue;
use parking_lot::Mutex;
use router_workers::{ApiKey, ModelId, Stage, Worker, WorkerSpec};

use super::{ForwardConfig, Forwarder, Probe};
use router_test_support::nothing_listens;

use crate::SendError;
use crate::trace::TraceHeaders;

/// What an engine saw of each request: method, path, version and headers.
type Seen = Arc<Mutex<Vec<(Method, String, Version, HeaderMap)>>>;

/// `app` served on a loopback port: its URL.
async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}")
}

/// An engine answering every request with 200, keeping what it saw.
async fn seeing_engine() -> (String, Seen) {
    let seen = Seen::default();
    let kept = Arc::clone(&seen);
    let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let (parts, _) = request.into_parts();
        kept.lock().push((parts.method, parts.uri.path().to_owned(), parts.version, parts.headers));
        async { "{}" }
    });
    (serve(app).await, seen)
}

/// An engine that accepts connections and never sends a byte.
async fn silent_engine() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    format!("127.0.0.1:{}", address.port())
}

fn worker(url: &str, key: Option<&str>) -> Worker {
    let spec = WorkerSpec {
        api_key: key.map(|k| ApiKey::new(k).expect("key")),
        ..WorkerSpec::new("e1", url, Stage::Plain)
    };
    Worker::from_spec(&spec, vec![ModelId::new("m")]).expect("worker")
}

fn forwarder(config: ForwardConfig) -> Forwarder {
    Forwarder::new(config).expect("forwarder")
}

const REQUEST_ID: HeaderValue = HeaderValue::from_static("req-1");

#[tokio::test]
async fn a_request_carries_the_engines_own_key_the_request_id_and_json() {
    let (url, seen) = seeing_engine().await;
    let client = forwarder(ForwardConfig::default());
    let mut client_headers = HeaderMap::new();
    let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    client_headers.insert("traceparent", HeaderValue::from_static(parent));
    for (key, trace) in
        [(Some("engine-key"), TraceHeaders::of(&client_headers)), (None, TraceHeaders::none())]
    {
        let engine = worker(&url, key);
        let body = Bytes::from_static(b"{}");
        let path = "/v1/chat/completions";
        let response = client.send(&engine, path, body, &REQUEST_ID, None, &trace).await;
        assert_eq!(response.expect("answered").status(), 200);
    }
    let seen = seen.lock();
    let [(method, path, version, keyed), (_, _, _, keyless)] = seen.as_slice() else {
        panic!("{seen:?}")
    };
    assert_eq!(
        (method, path.as_str(), *version),
        (&Method::POST, "/v1/chat/completions", Version::HTTP_11)
    );
    assert_eq!(keyed["authorization"], "Bearer engine-key");
    assert_eq!(keyed["x-request-id"], "req-1");
    assert_eq!(keyed["content-type"], "application/json");
    assert!(!keyless.contains_key("authorization"), "no key, no credential");
    assert_eq!(keyed["traceparent"], parent, "the trace context travels");
    assert!(!keyless.contains_key("traceparent"), "none made up");
}

#[tokio::test]
async fn http2_is_spoken_with_prior_knowledge_when_asked() {
    let (url, seen) = seeing_engine().await;
    let client = forwarder(ForwardConfig { http2: true, ..ForwardConfig::default() });
    let engine = worker(&url, None);
    let body = Bytes::from_static(b"{}");
    let trace = TraceHeaders::default();
    let path = "/v1/chat/completions";
    let response = client.send(&engine, path, body, &REQUEST_ID, None, &trace).await;
    assert_eq!(response.expect("answered").status(), 200);
    assert_eq!(seen.lock()[0].2, Version::HTTP_2);
}

#[tokio::test(start_paused = true)]
async fn each_failure_to_get_a_head_is_named() {
    // A connection that cannot be made, or whose TLS handshake never ends, is unreachable
    // within the connect timeout (well before the request timeout).
    let silent = silent_engine().await;
    let unreachable = ForwardConfig {
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(3600),
        ..ForwardConfig::default()
    };
    // An engine that takes the request and never answers is a timeout; a connect timeout
    // longer than the request's keeps it so however the connection goes.
    let timeout = ForwardConfig {
        connect_timeout: Duration::from_secs(3600),
        request_timeout: Duration::from_secs(60),
        ..ForwardConfig::default()
    };
    let cases = [
        ("nothing listens", nothing_listens(), unreachable.clone(), "unreachable"),
        (
            "a TLS handshake that never ends",
            format!("https://{silent}"),
            unreachable,
            "unreachable",
        ),
        ("no head", format!("http://{silent}"), timeout, "timeout"),
    ];
    for (name, url, config, kind) in cases {
        let client = forwarder(config);
        let body = Bytes::from_static(b"{}");
        let sent = client
            .send(
                &worker(&url, None),
                "/v1/chat/completions",
                body,
                &REQUEST_ID,
                None,
                &TraceHeaders::default(),
            )
            .await;
        let err = sent.expect_err(name);
        assert_eq!(err.kind(), kind, "{name}: {err:?}");
        assert_eq!(err.worker().as_str(), "e1", "{name}");
        if kind == "timeout" {
            assert!(matches!(err, SendError::Timeout { after, .. } if after.as_secs() == 60));
            assert_eq!(err.to_string(), "engine e1 did not answer within 60 s");
        }
    }
}

#[tokio::test]
async fn a_probe_answers_the_status_or_nothing() {
    let app = axum::Router::new().route("/health", axum::routing::get(|| async { "ok" })).route(
        "/sick",
        axum::routing::get(|| async { (http::StatusCode::SERVICE_UNAVAILABLE, "no") }),
    );
    let up = serve(app).await;
    let client = forwarder(ForwardConfig::default());
    let probe = |url: String, path: &'static str| {
        let client = client.clone();
        async move { client.probe(&worker(&url, None), path, Duration::from_secs(5)).await }
    };
    assert_eq!(probe(up.clone(), "/health").await, Probe::Answered(http::StatusCode::OK));
    assert_eq!(probe(up, "/sick").await, Probe::Answered(http::StatusCode::SERVICE_UNAVAILABLE));
    assert_eq!(probe(nothing_listens(), "/health").await, Probe::Refused);
}

/// An HTTP/1.1 engine on raw sockets that answers `{}` to every request and closes each
/// connection after `per_connection` answers, without saying so (as an engine's keep-alive
/// limit does); it counts the connections it accepted.
async fn closing_engine(per_connection: usize) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                for _ in 0..per_connection {
                    // One request: its head, then the body its content-length announces.
                    let request_len = loop {
                        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buffer[..end]).to_lowercase();
                            let length = head
                                .lines()
                                .find_map(|line| line.strip_prefix("content-length:"))
                                .and_then(|value| value.trim().parse::<usize>().ok())
                                .unwrap_or(0);
                            if buffer.len() >= end + 4 + length {
                                break end + 4 + length;
                            }
                        }
                        let mut chunk = [0u8; 4096];
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                    };
                    buffer.drain(..request_len);
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
                    if socket.write_all(answer).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (format!("http://{address}"), accepted)
}

#[tokio::test]
async fn connections_are_reused_and_one_the_engine_closed_while_idle_loses_no_request() {
    use http_body_util::BodyExt as _;
    let send = |client: Forwarder, engine: Worker| async move {
        let body = Bytes::from_static(b"{}");
        let trace = TraceHeaders::default();
        let response = client
            .send(&engine, "/v1/chat/completions", body, &REQUEST_ID, None, &trace)
            .await
            .expect("answered");
        assert_eq!(response.status(), 200);
        // Read to the end: the connection is then free for the next request.
        response.into_body().collect().await.expect("body").to_bytes()
    };
    let accepted =
        |count: &std::sync::atomic::AtomicUsize| count.load(std::sync::atomic::Ordering::SeqCst);

    // One request after another share one connection.
    let (url, connections) = closing_engine(usize::MAX).await;
    let client = forwarder(ForwardConfig::default());
    for _ in 0..20 {
        assert_eq!(send(client.clone(), worker(&url, None)).await, "{}");
    }
    assert_eq!(accepted(&connections), 1, "one connection served them all");

    // An engine that closes every connection after three answers: the requests that found
    // their pooled connection closed went out again on a new one, and none failed.
    let (url, connections) = closing_engine(3).await;
    let client = forwarder(ForwardConfig::default());
    for _ in 0..20 {
        assert_eq!(send(client.clone(), worker(&url, None)).await, "{}");
    }
    assert_eq!(accepted(&connections), 7, "a new connection after every third answer");

    // Concurrent requests each take a connection of their own, and keep them for later.
    let (url, connections) = closing_engine(usize::MAX).await;
    let client = forwarder(ForwardConfig::default());
    for _ in 0..3 {
        let batch = (0..4).map(|_| send(client.clone(), worker(&url, None)));
        futures::future::join_all(batch).await;
    }
    assert!(accepted(&connections) <= 4, "{} connections for 4 at a time", accepted(&connections));
}
