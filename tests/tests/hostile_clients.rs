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

/// `n` copies of `item` joined by commas, inside `before` and `after`.
fn repeated(before: &str, item: &str, n: usize, after: &str) -> String {
    let mut body = String::with_capacity(before.len() + (item.len() + 1) * n + after.len());
    body.push_str(before);
    for i in 0..n {
        if i > 0 {
            body.push(',');
        }
        body.push_str(item);
    }
    body.push_str(after);
    body
}

/// Found attacking the router: one 32 MiB `/generate` body of 16M `input_ids` took it up by
/// 1.47 GB. Each body here is about 24 MiB and goes to a fresh router with a tokenizer, whose
/// peak resident memory may grow by at most six times the body: the body itself, what is
/// read of it, and the copy an engine is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_costs_a_small_multiple_of_its_size_whatever_its_shape() {
    const MIB: usize = 1 << 20;
    let n = 12 * MIB;
    let text = "word ".repeat(24 * MIB / 5);
    let cases = [
        // Valid: 12M token ids (the engine refuses a prompt past its cache).
        (
            "/generate",
            repeated(r#"{"input_ids":["#, "1", n, r#"],"sampling_params":{"max_new_tokens":1}}"#),
        ),
        // Too many prompts, past the batch limit: refused as they are read.
        ("/generate", repeated(r#"{"input_ids":["#, "[1]", n / 2, "]}")),
        ("/v1/completions", repeated(r#"{"model":"m","prompt":["#, r#""""#, n * 2 / 3, "]}")),
        // Fields the router reads as values, sent as long lists of tiny items.
        (
            "/v1/completions",
            repeated(r#"{"model":"m","prompt":"x","stop":["#, r#""""#, n * 2 / 3, "]}"),
        ),
        ("/v1/completions", repeated(r#"{"model":["#, "0", n, r#"],"prompt":"x"}"#)),
        // Valid: members the router only walks.
        (
            "/generate",
            repeated(
                r#"{"text":"x","sampling_params":{"max_new_tokens":1,"stop_token_ids":["#,
                "1",
                n,
                "]}}",
            ),
        ),
        (
            "/v1/chat/completions",
            repeated(
                r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"logit_bias":{"#,
                r#""1":0"#,
                n / 3,
                "}}",
            ),
        ),
        // Valid: prompts longer than the router tokenizes, one long text and many messages.
        ("/v1/completions", format!(r#"{{"model":"m","max_tokens":1,"prompt":"{text}"}}"#)),
        (
            "/v1/chat/completions",
            format!(
                r#"{{"model":"m","max_tokens":1,"messages":[{{"role":"user","content":"{text}"}}]}}"#
            ),
        ),
        (
            "/v1/chat/completions",
            repeated(
                r#"{"model":"m","max_tokens":1,"messages":["#,
                r#"{"role":"user","content":"hi"}"#,
                3 * n / 50,
                "]}",
            ),
        ),
        // Valid: messages whose text is short and whose rendering is long.
        (
            "/v1/chat/completions",
            repeated(
                r#"{"model":"m","max_tokens":1,"messages":["#,
                r#"{"role":"user","content":""}"#,
                3 * n / 50,
                "]}",
            ),
        ),
    ];
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let engine = Engine::start("m", &["--prefill-tokens-per-sec", "1000000000"]);
    let config = format!(
        "server: {{port: 0}}\nmodels:\n  - id: m\n    tokenizer: \"{tokenizer}\"\n    workers:\n      \
         - {{id: e1, url: \"{}\"}}\n    buckets:\n      - id: all\n        groups: {{plain: {{policy: \
         {{type: round_robin}}}}}}\n",
        engine.url
    );
    let http = Http::default();
    for (path, body) in cases {
        let router = Router::with_config(&config);
        let size = body.len() as u64;
        let start = router.process.peak_rss_bytes();
        let reply = http
            .send(
                "POST",
                &format!("{}{path}", router.url),
                &[("content-type", "application/json")],
                body,
            )
            .await;
        assert!(reply.status < 500, "{path}: {} {}", reply.status, reply.body);
        let grown = router.process.peak_rss_bytes().saturating_sub(start);
        eprintln!(
            "{path} {} MiB: {} {} -> peak grown by {} MiB",
            size >> 20,
            reply.status,
            reply.body.chars().take(160).collect::<String>(),
            grown >> 20
        );
        assert!(
            grown < 6 * size,
            "{path}: a {} MiB body grew the peak by {} MiB",
            size >> 20,
            grown >> 20
        );
    }
}
