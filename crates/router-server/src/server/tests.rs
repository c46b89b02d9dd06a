//! The running server on loopback: it answers on the address it reports, refuses a request
//! head over `server.max_header_bytes` with 431, will not share a port another listener
//! holds, and is gone once stopped.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::Serving;
use crate::tests::{context, one_model};

/// What the server at `addr` answers to `request` (raw HTTP/1.1), until it closes.
async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut socket = tokio::net::TcpStream::connect(addr).await.expect("connect");
    socket.write_all(request).await.expect("write");
    let mut answer = Vec::new();
    socket.read_to_end(&mut answer).await.expect("read");
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn a_started_router_answers_on_its_address_until_stopped() {
    let workers = r#"[{id: srv-e1, url: "http://127.0.0.1:1"}]"#;
    let ctx = context(&one_model(
        "server: {max_header_bytes: 8192}",
        "srv",
        workers,
        "{type: round_robin}",
    ));
    let serving = Serving::start(ctx, "127.0.0.1:0".parse().expect("address"), 2).expect("started");
    let addr = serving.addr;
    assert_ne!(addr.port(), 0, "the port picked is reported");

    let health =
        exchange(addr, b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await;
    assert!(health.starts_with("HTTP/1.1 200 OK\r\n"), "{health}");
    assert!(health.ends_with("\r\n\r\nok"), "{health}");

    let huge = format!(
        "GET /health HTTP/1.1\r\nhost: x\r\nx-padding: {}\r\nconnection: close\r\n\r\n",
        "p".repeat(10_000)
    );
    let refused = exchange(addr, huge.as_bytes()).await;
    assert!(refused.starts_with("HTTP/1.1 431 "), "{refused}");

    // A port already listened on (here by this router) is refused, not shared through
    // SO_REUSEPORT.
    let taken = Serving::start(serving.context().clone(), addr, 1).err().expect("refused");
    assert_eq!(taken.kind(), std::io::ErrorKind::AddrInUse);

    serving.stop(Duration::from_secs(5)).await;
    let after = tokio::net::TcpStream::connect(addr).await;
    assert!(after.is_err(), "nothing listens once stopped");
}
