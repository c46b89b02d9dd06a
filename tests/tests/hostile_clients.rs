//! What a hostile client can make the router hold, measured on a real router process: a head
//! declaring an absurd body is refused at once, and bodies behind a busy admission slot hold
//! at most `server.max_inflight_body_bytes` of memory; the rest is refused at its head.

use std::time::Duration;

use router_e2e::{Engine, Http, Router, chat_body};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// The status line of the answer to `head` (and `body`) sent on a fresh connection.
async fn raw(addr: &str, head: &str, body: &[u8]) -> (TcpStream, String) {
    let mut socket = TcpStream::connect(addr).await.expect("connect");
    socket.write_all(head.as_bytes()).await.expect("head");
    let _ = socket.write_all(body).await;
    let mut answer = vec![0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(20), socket.read(&mut answer))
        .await
        .expect("an answer within 20 s")
        .unwrap_or(0);
    let status =
        String::from_utf8_lossy(&answer[..n]).lines().next().unwrap_or_default().to_owned();
    (socket, status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_behind_a_busy_slot_hold_bounded_memory_and_a_huge_head_is_refused() {
    let engine = Engine::start("m", &[]);
    let router = Router::with_config(&format!(
        "server: {{port: 0, max_concurrent_requests: 1, queue_size: 16, max_inflight_body_bytes: 67108864}}\n\
         models:\n  - id: m\n    workers:\n      - {{id: e1, url: \"{}\"}}\n    buckets:\n      \
         - id: all\n        groups: {{plain: {{policy: {{type: round_robin}}}}}}\n",
        engine.url
    ));
    let http = Http::default();
    let addr = router.url.trim_start_matches("http://").to_owned();

    // The one slot is busy with a long stream.
    let mut long = chat_body("m", "go on", 200_000);
    long["stream"] = serde_json::json!(true);
    let busy_head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        long.to_string().len()
    );
    let (_busy, status) = raw(&addr, &busy_head, long.to_string().as_bytes()).await;
    assert!(status.contains(" 200 "), "{status}");
    let before = router.process.rss_bytes();

    // Found attacking the router: this head took it from 36 MB to 566 MB in 1.5 s.
    let huge =
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 900000000000\r\n\r\n";
    let (_huge, status) = raw(&addr, huge, &[0u8; 65536]).await;
    assert!(status.contains(" 413 "), "{status}");

    // Five 30 MiB bodies: two fit the 64 MiB budget and wait in the queue, the others are
    // refused at their heads.
    let body = vec![b' '; 30 << 20];
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let mut waiting = Vec::new();
    let mut refused = 0;
    for _ in 0..5 {
        let mut socket = TcpStream::connect(&addr).await.expect("connect");
        socket.write_all(head.as_bytes()).await.expect("head");
        let sent = tokio::time::timeout(Duration::from_secs(10), socket.write_all(&body)).await;
        let mut answer = vec![0u8; 4096];
        match tokio::time::timeout(Duration::from_millis(500), socket.read(&mut answer)).await {
            Ok(Ok(n)) if n > 0 => {
                let text = String::from_utf8_lossy(&answer[..n]);
                assert!(text.contains(" 429 ") && text.contains("bodies_full"), "{text}");
                refused += 1;
            }
            _ => {
                assert!(matches!(sent, Ok(Ok(()))), "an admitted body was read whole");
                waiting.push(socket);
            }
        }
    }
    assert_eq!((waiting.len(), refused), (2, 3));
    let grown = router.process.rss_bytes().saturating_sub(before);
    assert!(grown < 200 << 20, "the router grew by {} MiB", grown >> 20);

    let state = http.get(&router.url, "/health", &[]).await;
    assert_eq!(state.status, 200, "the router lives");
}
