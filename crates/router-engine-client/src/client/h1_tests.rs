//! The HTTP/1.1 connections against scripted engines on loopback sockets: reuse, an engine
//! that closes an idle connection or says `Connection: close`, informational heads, bodies
//! split across writes, and the failures of an engine that stops mid-answer, all through
//! [`Forwarder::send`] as the dispatch uses it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;
use http_body_util::BodyExt as _;
use router_workers::{ModelId, Stage, Worker, WorkerSpec};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::trace::TraceHeaders;
use crate::{EngineBody, ForwardConfig, Forwarder, SendError};

/// What a scripted engine does with each request it reads on a connection.
type Script = Arc<dyn Fn(usize, &mut Vec<u8>) -> Step + Send + Sync>;

/// One step of a scripted engine, after it has read a whole request.
enum Step {
    /// Writes these pieces (with a short pause between them), then keeps the connection.
    Answer(Vec<&'static str>),
    /// Writes these pieces, then closes the connection.
    AnswerAndClose(Vec<&'static str>),
}

/// A scripted engine: every connection reads requests (head and `Content-Length` body) and
/// follows the script, given the count of requests so far on all connections. Reports each
/// connection's end (EOF from the router) on `closed`.
struct Engine {
    url: String,
    connections: Arc<AtomicUsize>,
    closed: mpsc::UnboundedReceiver<usize>,
}

async fn engine(script: Script) -> Engine {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let connections = Arc::new(AtomicUsize::new(0));
    let (report, closed) = mpsc::unbounded_channel();
    let (counted, requests) = (Arc::clone(&connections), Arc::new(AtomicUsize::new(0)));
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let number = counted.fetch_add(1, Ordering::SeqCst);
            let (script, requests, report) =
                (Arc::clone(&script), Arc::clone(&requests), report.clone());
            tokio::spawn(async move {
                serve_connection(socket, &script, &requests).await;
                let _ = report.send(number);
            });
        }
    });
    Engine { url, connections, closed }
}

async fn serve_connection(mut socket: TcpStream, script: &Script, requests: &AtomicUsize) {
    let mut buf = Vec::new();
    loop {
        let Some(mut request) = read_request(&mut socket, &mut buf).await else { return };
        let step = script(requests.fetch_add(1, Ordering::SeqCst), &mut request);
        let (pieces, close) = match step {
            Step::Answer(pieces) => (pieces, false),
            Step::AnswerAndClose(pieces) => (pieces, true),
        };
        for piece in pieces {
            if socket.write_all(piece.as_bytes()).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if close {
            return;
        }
    }
}

/// Reads one request (head and body) off `socket`; `None` at EOF.
async fn read_request(socket: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
            let length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length: "))
                .map_or(0, |n| n.trim().parse().expect("a length"));
            if buf.len() >= end + 4 + length {
                return Some(buf.drain(..end + 4 + length).collect());
            }
        }
        let mut chunk = [0; 4096];
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn worker(url: &str) -> Worker {
    Worker::from_spec(&WorkerSpec::new("e1", url, Stage::Plain), vec![ModelId::new("m")])
        .expect("worker")
}

async fn send(
    client: &Forwarder,
    engine: &Engine,
) -> Result<http::Response<EngineBody>, SendError> {
    let id = HeaderValue::from_static("req-1");
    let body = Bytes::from_static(br#"{"model":"m"}"#);
    let trace = TraceHeaders::default();
    client.send(&worker(&engine.url), "/v1/chat/completions", body, &id, Some(3), &trace).await
}

async fn text(response: http::Response<EngineBody>) -> Result<String, String> {
    let body = response.into_body().collect().await.map_err(|err| err.to_string())?;
    Ok(String::from_utf8_lossy(&body.to_bytes()).into_owned())
}

fn client() -> Forwarder {
    Forwarder::new(ForwardConfig::default()).expect("forwarder")
}

const OK: &str = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";

#[tokio::test]
async fn a_connection_carries_one_request_after_another_and_the_request_is_whole() {
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let kept = Arc::clone(&seen);
    let engine = engine(Arc::new(move |_, request: &mut Vec<u8>| {
        kept.lock().push(String::from_utf8_lossy(request).into_owned());
        Step::Answer(vec![OK])
    }))
    .await;
    let client = client();
    for _ in 0..3 {
        let response = send(&client, &engine).await.expect("answered");
        assert_eq!(response.headers()["content-type"], "application/json");
        assert_eq!(text(response).await.as_deref(), Ok("{}"));
    }
    assert_eq!(engine.connections.load(Ordering::SeqCst), 1, "one connection reused");
    let host = engine.url.trim_start_matches("http://");
    assert_eq!(
        seen.lock()[0],
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n\
             content-type: application/json\r\nx-request-id: req-1\r\n\
             x-data-parallel-rank: 3\r\ncontent-length: 13\r\n\r\n{{\"model\":\"m\"}}"
        )
    );
}

#[tokio::test]
async fn an_idle_connection_the_engine_closed_is_not_used_again() {
    let mut engine = engine(Arc::new(|_, _: &mut Vec<u8>| Step::AnswerAndClose(vec![OK]))).await;
    let client = client();
    for round in 0..3 {
        let response = send(&client, &engine).await.expect("answered");
        assert_eq!(text(response).await.as_deref(), Ok("{}"), "round {round}");
        // The engine's close has reached the router's event loop before the next request.
        engine.closed.recv().await.expect("closed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(engine.connections.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn connection_close_or_an_answer_framed_by_closing_ends_the_connection() {
    let answers = [
        "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}",
        "HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n{}",
    ];
    for answer in answers {
        let mut engine =
            engine(Arc::new(move |_, _: &mut Vec<u8>| Step::Answer(vec![answer]))).await;
        let client = client();
        for _ in 0..2 {
            let response = send(&client, &engine).await.expect("answered");
            assert_eq!(text(response).await.as_deref(), Ok("{}"), "{answer:?}");
            // The router dropped the connection once the answer was read.
            engine.closed.recv().await.expect("closed by the router");
        }
        assert_eq!(engine.connections.load(Ordering::SeqCst), 2, "{answer:?}");
    }
    let mut engine = engine(Arc::new(|_, _: &mut Vec<u8>| {
        Step::AnswerAndClose(vec!["HTTP/1.1 200 OK\r\n\r\nuntil ", "the end"])
    }))
    .await;
    let response = send(&client(), &engine).await.expect("answered");
    assert_eq!(text(response).await.as_deref(), Ok("until the end"));
    engine.closed.recv().await.expect("closed");
}

#[tokio::test]
async fn a_chunked_stream_split_anywhere_arrives_whole_after_an_informational_head() {
    let engine = engine(Arc::new(|_, _: &mut Vec<u8>| {
        Step::Answer(vec![
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n",
            "content-type: text/event-stream\r\n\r\n",
            "f\r\ndata: {\"a\":1}\n\n\r\n",
            "F\r\ndata: {\"a\"",
            ":2}\n\n\r",
            "\ne\r\ndata: [DONE]\n\n\r\n0\r\n\r\n",
        ])
    }))
    .await;
    let client = client();
    for _ in 0..2 {
        let response = send(&client, &engine).await.expect("answered");
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        assert_eq!(
            text(response).await.as_deref(),
            Ok("data: {\"a\":1}\n\ndata: {\"a\":2}\n\ndata: [DONE]\n\n")
        );
    }
    assert_eq!(engine.connections.load(Ordering::SeqCst), 1, "reused after the last chunk");
}

#[tokio::test]
async fn an_engine_that_stops_mid_answer_fails_the_body_and_a_dropped_body_closes() {
    let engine = engine(Arc::new(|n, _: &mut Vec<u8>| match n {
        0 => Step::AnswerAndClose(vec!["HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf"]),
        1 => Step::AnswerAndClose(vec![
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nab",
        ]),
        2 => Step::AnswerAndClose(vec!["HTTP/1.1 200 OK\r\ncontent-le"]),
        3 => Step::AnswerAndClose(vec!["SSH-2.0-OpenSSH_9.6\r\n\r\n"]),
        _ => Step::Answer(vec!["HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab\r\n"]),
    }))
    .await;
    let client = client();
    for expected in ["before the end of its answer body", "before the end of its answer body"] {
        let response = send(&client, &engine).await.expect("a head");
        assert!(text(response).await.expect_err("cut").contains(expected));
    }
    let err = send(&client, &engine).await.expect_err("no whole head");
    assert!(format!("{:?}", err).contains("Closed(\"head\")"), "{err:?}");
    let err = send(&client, &engine).await.expect_err("not HTTP");
    assert!(format!("{:?}", err).contains("not an HTTP/1.1 response head"), "{err:?}");
    let mut engine = engine;
    while engine.closed.try_recv().is_ok() {}
    let response = send(&client, &engine).await.expect("a head");
    let mut body = response.into_body();
    let first = body.frame().await.expect("a frame").expect("data");
    assert_eq!(first.into_data().expect("data"), "ab");
    drop(body);
    // The engine sees its client go: the request is cancelled there.
    let closed = tokio::time::timeout(Duration::from_secs(10), engine.closed.recv()).await;
    assert!(closed.expect("within 10 s").is_some());
}

#[tokio::test]
async fn a_large_answer_arrives_whole_and_its_connection_serves_the_next() {
    let body: &'static str = "0123456789abcdef".repeat(64 * 1024).leak();
    let head: &'static str =
        format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len()).leak();
    let engine = engine(Arc::new(move |n, _: &mut Vec<u8>| match n {
        0 => Step::Answer(vec![head, body]),
        _ => Step::Answer(vec![OK]),
    }))
    .await;
    let client = client();
    let response = send(&client, &engine).await.expect("answered");
    let text = text(response).await.expect("whole");
    assert_eq!((text.len(), text.as_str() == body), (1 << 20, true));
    let response = send(&client, &engine).await.expect("answered");
    assert_eq!(self::text(response).await.as_deref(), Ok("{}"));
    assert_eq!(engine.connections.load(Ordering::SeqCst), 1);
}
