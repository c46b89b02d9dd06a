//! The router's own HTTP/1.1 loop (router-http1) on a running router in front of a loopback
//! engine: kept-alive and pipelined requests, a body that arrives after its head, a head that
//! arrives in pieces, `Connection: close`, a connection handed to hyper after requests of its
//! own, and idle connections closed by the stop.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::server::Serving;
use crate::tests::{answering, context, one_model};

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
const ANSWER: &str = r#"{"id":"x","choices":[]}"#;

fn chat(extra: &str) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n{extra}\r\n{CHAT}",
        CHAT.len()
    )
}

/// A router on two event loops in front of one engine answering [`ANSWER`].
async fn router() -> Serving {
    let (engine, _hits) = answering(200, ANSWER).await;
    let workers = format!(r#"[{{id: h1-e1, url: "{engine}"}}]"#);
    let ctx = context(&one_model("", "m", &workers, "{type: round_robin}"));
    Serving::start(ctx, "127.0.0.1:0".parse().expect("address"), 2).expect("started")
}

/// One answer read off `socket`: its head and its body (framed by a length or chunked).
async fn answer(socket: &mut TcpStream, buf: &mut Vec<u8>) -> (String, String) {
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        read_more(socket, buf).await;
    };
    let head = String::from_utf8(buf.drain(..head_end).collect()).expect("text head");
    let lower = head.to_ascii_lowercase();
    let body = if let Some(length) = lower.split("content-length: ").nth(1) {
        let length: usize = length.split("\r\n").next().and_then(|n| n.parse().ok()).expect("n");
        while buf.len() < length {
            read_more(socket, buf).await;
        }
        buf.drain(..length).collect()
    } else {
        assert!(lower.contains("transfer-encoding: chunked"), "{head}");
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(at) = buf.windows(2).position(|w| w == b"\r\n") {
                    break at;
                }
                read_more(socket, buf).await;
            };
            let size = std::str::from_utf8(&buf[..line_end]).expect("size line");
            let size = usize::from_str_radix(size, 16).expect("hex size");
            while buf.len() < line_end + 2 + size + 2 {
                read_more(socket, buf).await;
            }
            body.extend_from_slice(&buf[line_end + 2..line_end + 2 + size]);
            buf.drain(..line_end + 2 + size + 2);
            if size == 0 {
                break body;
            }
        }
    };
    (head, String::from_utf8(body).expect("text body"))
}

async fn read_more(socket: &mut TcpStream, buf: &mut Vec<u8>) {
    let mut chunk = [0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), socket.read(&mut chunk))
        .await
        .expect("the router answers")
        .expect("read");
    assert!(n > 0, "the router closed early; read so far: {}", String::from_utf8_lossy(buf));
    buf.extend_from_slice(&chunk[..n]);
}

async fn connect(addr: SocketAddr) -> TcpStream {
    TcpStream::connect(addr).await.expect("connect")
}

/// Whether the router closes `socket` (reads nothing more) within a few seconds.
async fn closes(socket: &mut TcpStream) -> bool {
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), socket.read_to_end(&mut rest)).await;
    matches!(read, Ok(Ok(0)))
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_and_hyper_takes_over_at_another_route() {
    let serving = router().await;
    let mut socket = connect(serving.addr).await;
    // Two chat requests and a health check in one write; the last goes to hyper.
    let pipelined = format!(
        "{}{}GET /health HTTP/1.1\r\nhost: r\r\n\r\n",
        chat("x-request-id: first\r\n"),
        chat("x-request-id: second\r\n")
    );
    socket.write_all(pipelined.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    for id in ["first", "second"] {
        let (head, body) = answer(&mut socket, &mut buf).await;
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(head.contains(&format!("x-request-id: {id}\r\n")), "in order: {head}");
        assert!(head.contains("\r\ndate: "), "{head}");
        assert!(!head.contains("connection: close"), "{head}");
        assert_eq!(body, ANSWER);
    }
    let (head, body) = answer(&mut socket, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert_eq!(body, "ok");
    // Hyper serves the rest of the connection, the inference endpoints included.
    socket.write_all(chat("").as_bytes()).await.expect("write");
    let (head, body) = answer(&mut socket, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert_eq!(body, ANSWER);
    serving.stop(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_body_that_comes_after_its_head_is_read_as_it_arrives() {
    let serving = router().await;
    let mut socket = connect(serving.addr).await;
    let request = chat("");
    let (head, body) = request.split_at(request.len() - CHAT.len() + 7);
    socket.write_all(head.as_bytes()).await.expect("write");
    socket.flush().await.expect("flush");
    // Nothing to wait for but the router's reads: the rest goes in two more writes.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (middle, last) = body.split_at(body.len() / 2);
    socket.write_all(middle.as_bytes()).await.expect("write");
    tokio::time::sleep(Duration::from_millis(50)).await;
    socket.write_all(last.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    let (head, body) = answer(&mut socket, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert_eq!(body, ANSWER);
    // The connection is kept and serves the next request in this loop.
    socket.write_all(chat("").as_bytes()).await.expect("write");
    let (head, _) = answer(&mut socket, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    serving.stop(Duration::from_secs(5)).await;
}

/// A head sent in pieces, one split inside its final blank line, is served once whole; bare
/// LF line ends too (httparse reads them).
#[tokio::test]
async fn a_head_that_arrives_in_pieces_is_served_once_it_ends() {
    let serving = router().await;
    let mut socket = connect(serving.addr).await;
    let request = chat("");
    let blank = request.find("\r\n\r\n").expect("a head") + 2;
    for piece in
        [&request[..10], &request[10..blank], &request[blank..blank + 1], &request[blank + 1..]]
    {
        socket.write_all(piece.as_bytes()).await.expect("write");
        socket.flush().await.expect("flush");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut buf = Vec::new();
    let (head, body) = answer(&mut socket, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert_eq!(body, ANSWER);
    serving.stop(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn connection_close_is_answered_and_honoured() {
    let serving = router().await;
    let mut socket = connect(serving.addr).await;
    socket.write_all(chat("connection: close\r\n").as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    let (head, body) = answer(&mut socket, &mut buf).await;
    assert!(head.contains("\r\nconnection: close\r\n"), "{head}");
    assert_eq!(body, ANSWER);
    assert!(closes(&mut socket).await, "closed after the answer");
    serving.stop(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_bad_request_is_answered_by_hyper_and_an_error_keeps_the_openai_shape() {
    let serving = router().await;
    let mut socket = connect(serving.addr).await;
    let body = r#"{"model":"unknown","messages":[]}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(request.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    let (head, answered) = answer(&mut socket, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{head}");
    assert!(answered.contains("\"error\""), "{answered}");
    // A head that is not HTTP: hyper's own 400, and the connection closed.
    socket.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nbad header\r\n\r\n").await.expect("w");
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), socket.read_to_end(&mut rest)).await;
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{rest}");
    serving.stop(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn the_stop_closes_idle_connections_and_new_requests_find_no_listener() {
    let serving = router().await;
    let addr = serving.addr;
    let mut idle = connect(addr).await;
    idle.write_all(chat("").as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    let (head, _) = answer(&mut idle, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    serving.stop(Duration::from_secs(5)).await;
    assert!(closes(&mut idle).await, "the idle connection was closed by the stop");
    assert!(TcpStream::connect(addr).await.is_err());
}
