//! Slow and stalled clients (docs/design/RELIABILITY.md, HTTP front end): a request head
//! trickled forever, a body that never finishes, and a streaming client that stops reading. Each
//! one is cut off at its configured timeout and leaves nothing held: no connection, no in-flight
//! count, no engine request.

use std::time::Duration;

use router_e2e::{Engine, Http, Router, chat_body, engine_running, inflight};
use router_test_support::{PATIENCE, eventually};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// One engine, one bucket, and one-second client timeouts.
fn config(engine: &Engine) -> String {
    format!(
        "server: {{port: 0, admin_token: t, header_read_timeout_secs: 1, body_read_timeout_secs: 1, \
         client_write_timeout_secs: 1}}\nmodels:\n  - id: m\n    workers:\n      - {{id: e1, url: \"{}\"}}\n    \
         buckets:\n      - id: all\n        groups: {{plain: {{policy: {{type: round_robin}}}}}}\n",
        engine.url
    )
}

fn address(router: &Router) -> String {
    router.url.trim_start_matches("http://").to_owned()
}

/// Reads until the router closes the connection (or resets it); returns what arrived. Panics
/// when the connection is still open after `limit`.
async fn read_until_closed(stream: &mut TcpStream) -> String {
    let mut received = Vec::new();
    let outcome = tokio::time::timeout(PATIENCE, async {
        let mut chunk = [0u8; 4096];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    assert!(outcome.is_ok(), "the router kept the connection open for {PATIENCE:?}");
    String::from_utf8_lossy(&received).into_owned()
}

#[tokio::test]
async fn a_request_head_trickled_slowly_is_cut_off_at_the_header_timeout() {
    let engine = Engine::start("m", &[]);
    let router = Router::with_config(&config(&engine));
    let mut slow = TcpStream::connect(address(&router)).await.expect("connect");
    slow.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: router\r\n").await.expect("write");
    // One more header line well inside the timeout, then nothing: the head never completes.
    // The pause is what the test is about (a client slower than the router), not a wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    slow.write_all(b"content-type: application/json\r\n").await.expect("write");

    // Meanwhile other clients are served normally.
    let http = Http::default();
    let reply = http.chat(&router.url, &chat_body("m", "hello", 4), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);

    let received = read_until_closed(&mut slow).await;
    assert!(!received.contains("200 OK"), "a half-sent head was answered: {received}");
    assert!(
        received.is_empty() || received.starts_with("HTTP/1.1 408"),
        "unexpected answer to a timed-out head: {received}"
    );
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_at_the_header_timeout() {
    let engine = Engine::start("m", &[]);
    let router = Router::with_config(&config(&engine));
    let mut silent = TcpStream::connect(address(&router)).await.expect("connect");
    let received = read_until_closed(&mut silent).await;
    assert!(!received.contains("200 OK"), "{received}");
    // Likewise a client that goes quiet on a kept-alive connection after a request.
    let mut idle = TcpStream::connect(address(&router)).await.expect("connect");
    idle.write_all(b"GET /health HTTP/1.1\r\nhost: router\r\n\r\n").await.expect("write");
    let received = read_until_closed(&mut idle).await;
    assert!(received.starts_with("HTTP/1.1 200"), "{received}");
}

#[tokio::test]
async fn a_body_that_never_finishes_gets_408_and_holds_nothing() {
    let engine = Engine::start("m", &[]);
    let router = Router::with_config(&config(&engine));
    let body = chat_body("m", "hello", 4).to_string();
    let mut slow = TcpStream::connect(address(&router)).await.expect("connect");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: router\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    slow.write_all(head.as_bytes()).await.expect("write head");
    slow.write_all(&body.as_bytes()[..body.len() / 2]).await.expect("write half the body");

    let received = read_until_closed(&mut slow).await;
    assert!(received.starts_with("HTTP/1.1 408"), "expected 408, got: {received}");
    assert!(received.contains("\"code\":\"body_timeout\""), "{received}");
    let http = Http::default();
    assert_eq!(engine_running(&http, &engine).await, 0);
    assert_eq!(inflight(&http, &router, "t").await, 0);
}

#[tokio::test]
async fn a_streaming_client_that_stops_reading_is_cut_off_and_the_engine_request_cancelled() {
    // About 200k tokens at a million tokens a second: far more SSE bytes than the socket
    // buffers between the engine and the client hold, so the stream stalls on the client.
    let engine = Engine::start(
        "m",
        &["--decode-tokens-per-sec", "1000000", "--kv-capacity-tokens", "1000000"],
    );
    let router = Router::with_config(&config(&engine));
    let socket = TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("small receive buffer");
    let mut client =
        socket.connect(address(&router).parse().expect("addr")).await.expect("connect");
    let mut body = chat_body("m", "talk for a very long time", 200_000);
    body["stream"] = true.into();
    let body = body.to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: router\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    client.write_all(request.as_bytes()).await.expect("send the request");

    let http = Http::default();
    eventually("the engine running the request", async || {
        engine_running(&http, &engine).await == 1
    })
    .await;
    // The client reads nothing. Within the write timeout (plus the time to fill the buffers)
    // the router gives up on it: its in-flight count drops and the engine request is dropped.
    eventually("the router releasing the stalled stream", async || {
        inflight(&http, &router, "t").await == 0
    })
    .await;
    eventually("the engine dropping the request of a client that left", async || {
        engine_running(&http, &engine).await == 0
    })
    .await;
    // What the client can still read is a cut stream: the final [DONE] never came. The
    // router's socket buffers drain through the client's window, wider now that it reads.
    socket2::SockRef::from(&client).set_recv_buffer_size(1 << 20).expect("a wider buffer");
    let received = read_until_closed(&mut client).await;
    assert!(received.starts_with("HTTP/1.1 200"), "{}", &received[..received.len().min(200)]);
    assert!(!received.contains("data: [DONE]"), "the stream was not cut");

    // The router still serves everyone else.
    let reply = http.chat(&router.url, &chat_body("m", "hello", 4), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
}
