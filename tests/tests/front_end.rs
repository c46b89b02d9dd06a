//! The HTTP front end's hostile-input rows of docs/design/RELIABILITY.md that the JSON tests do
//! not cover: oversized heads, too many headers, unusable request ids, and hop-by-hop headers.

use std::time::Duration;

use router_e2e::{Engine, Http, Router, chat_body};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn config(engine: &Engine) -> String {
    format!(
        "server: {{port: 0}}\nmodels:\n  - id: m\n    workers:\n      - {{id: e1, url: \"{}\"}}\n    \
         buckets:\n      - id: all\n        groups: {{plain: {{policy: {{type: round_robin}}}}}}\n",
        engine.url
    )
}

/// Sends `head` (and `body`) on a raw connection and returns the status line of the answer.
async fn raw_status(router: &Router, head: &str, body: &str) -> String {
    let address = router.url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).await.expect("connect");
    let exchange = async {
        // The router may answer and close before reading everything we send.
        let _ = stream.write_all(head.as_bytes()).await;
        let _ = stream.write_all(body.as_bytes()).await;
        let mut answer = Vec::new();
        let mut chunk = [0u8; 4096];
        while !answer.windows(2).any(|w| w == b"\r\n") {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&chunk[..n]),
            }
        }
        String::from_utf8_lossy(&answer).lines().next().unwrap_or_default().to_owned()
    };
    tokio::time::timeout(Duration::from_secs(10), exchange).await.expect("an answer")
}

#[tokio::test]
async fn oversized_heads_and_header_floods_get_431() {
    let engine = Engine::start("m", &[]);
    let router = Router::with_config(&config(&engine));
    let body = chat_body("m", "hello", 4).to_string();
    let huge = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\n\
         x-padding: {}\r\ncontent-length: {}\r\n\r\n",
        "a".repeat(100 * 1024),
        body.len()
    );
    assert_eq!(
        raw_status(&router, &huge, &body).await,
        "HTTP/1.1 431 Request Header Fields Too Large"
    );

    let flood: String = (0..200).map(|i| format!("x-header-{i}: {i}\r\n")).collect();
    let flood = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\n\
         {flood}content-length: {}\r\n\r\n",
        body.len()
    );
    assert_eq!(
        raw_status(&router, &flood, &body).await,
        "HTTP/1.1 431 Request Header Fields Too Large"
    );

    // A bare CR inside a header value is not HTTP.
    let broken = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\nx-request-id: a\rb\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    assert_eq!(raw_status(&router, &broken, &body).await, "HTTP/1.1 400 Bad Request");

    // A client that waits for `100 Continue` before uploading an oversized body is told 413
    // instead, and never invited to send it.
    let expecting = "POST /v1/chat/completions HTTP/1.1\r\nhost: r\r\ncontent-type: application/json\r\n\
                     expect: 100-continue\r\ncontent-length: 100000000\r\n\r\n";
    assert_eq!(raw_status(&router, expecting, "").await, "HTTP/1.1 413 Payload Too Large");

    // The router is unharmed.
    let reply = Http::default().chat(&router.url, &chat_body("m", "hello", 4), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
}

#[tokio::test]
async fn unusable_request_ids_are_replaced_and_hop_by_hop_headers_stay_behind() {
    let engine = Engine::start("m", &[]);
    let router = Router::with_config(&config(&engine));
    let http = Http::default();
    let body = chat_body("m", "hello", 4);

    let kept = http.chat(&router.url, &body, &[("x-request-id", "client-id-42")]).await;
    assert_eq!(kept.header("x-request-id"), Some("client-id-42"));
    for unusable in ["has spaces in it", &"x".repeat(200), ""] {
        let reply = http.chat(&router.url, &body, &[("x-request-id", unusable)]).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let id = reply.header("x-request-id").unwrap_or_default();
        assert_eq!(id.len(), 32, "{unusable:?} -> {id:?}");
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    }

    // Hop-by-hop headers of the client end at the router: the exchange works and none of
    // them comes back.
    let reply = http
        .chat(
            &router.url,
            &body,
            &[("connection", "keep-alive, x-private"), ("x-private", "1"), ("te", "trailers")],
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    // A whole (non-streamed) answer keeps the engine's length instead of chunked framing.
    assert_eq!(reply.header("content-length"), Some(reply.body.len().to_string().as_str()));
    assert_eq!(reply.header("transfer-encoding"), None);
    for hop in ["x-private", "te", "upgrade", "proxy-authenticate"] {
        assert_eq!(reply.header(hop), None, "{hop} came back");
    }
}

#[tokio::test]
async fn client_model_names_never_become_metric_labels() {
    let engine = Engine::start("m", &[]);
    // The quick start serves any model name (`--model` defaults to `*`).
    let router = Router::with_args(&[
        "--worker-urls".to_owned(),
        engine.url.clone(),
        "--port".to_owned(),
        "0".to_owned(),
    ]);
    let http = Http::default();
    for i in 0..3 {
        let reply =
            http.chat(&router.url, &chat_body(&format!("made-up-model-{i}"), "hi", 2), &[]).await;
        // Routed (the engine itself refuses a model it does not serve, and says so).
        assert_eq!(reply.header("x-router-engine"), Some("worker-1"), "{}", reply.body);
    }
    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    assert!(!metrics.contains("made-up-model"), "{metrics}");
    assert!(metrics.contains("router_requests_total{model=\"*\""), "{metrics}");
}
