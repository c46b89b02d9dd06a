//! Injected faults: failure rates, a stalled first byte, an engine that exits after N answers
//! and cuts its other streams, and an engine that publishes no KV events.

use std::time::Duration;

use http::{Method, StatusCode};
use tokio::time::Instant;

use crate::common::*;

#[tokio::test]
async fn fail_rate_one_answers_500() {
    let sim = Sim::start(&["--fail-rate", "1"]).await;
    for _ in 0..3 {
        let reply = chat(&sim, &request("x", 2, true)).await;
        assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(reply.json()["error"]["code"], 500);
    }
    // Every generation endpoint fails alike.
    let completion = post(&sim, "/v1/completions", &serde_json::json!({"prompt": "x"})).await;
    assert_eq!(completion.status, StatusCode::INTERNAL_SERVER_ERROR);
    let generate = post(&sim, "/generate", &serde_json::json!({"text": ["x", "y"]})).await;
    assert_eq!(generate.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(generate.error_message().contains("injected failure"));
    // Probes stay healthy: only generation requests fail.
    assert_eq!(get(&format!("{}/health", sim.url())).await.status, StatusCode::OK);
}

#[tokio::test]
async fn fail_rate_half_fails_some() {
    let sim = Sim::start(&["--fail-rate", "0.5", "--seed", "3"]).await;
    let mut failed = 0;
    for i in 0..40 {
        if chat(&sim, &request(&format!("r{i}"), 1, false)).await.status
            == StatusCode::INTERNAL_SERVER_ERROR
        {
            failed += 1;
        }
    }
    assert!((5..=35).contains(&failed), "{failed} of 40 failed");
}

#[tokio::test]
async fn stall_delays_the_first_byte() {
    let sim = Sim::start(&["--stall-ms", "300"]).await;
    let start = Instant::now();
    let reply = chat(&sim, &request("slow", 1, true)).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(start.elapsed() >= Duration::from_millis(300), "{:?}", start.elapsed());
}

#[tokio::test]
async fn die_after_exits_once_enough_requests_were_answered() {
    let mut sim = Sim::start(&["--die-after", "2"]).await;
    for i in 0..2 {
        let reply = chat(&sim, &request(&format!("request {i}"), 3, i == 1)).await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    let status = tokio::time::timeout(Duration::from_secs(10), sim.child.wait())
        .await
        .expect("exits in time")
        .expect("exit status");
    assert_eq!(status.code(), Some(3));
    let url = format!("{}/v1/chat/completions", sim.url());
    assert!(send(Method::POST, &url, Some(&request("too late", 1, false))).await.is_err());
}

#[tokio::test]
async fn dying_cuts_other_streams_mid_way() {
    let mut sim = Sim::start(&["--die-after", "1", "--decode-tokens-per-sec", "50"]).await;
    let url = format!("{}/v1/chat/completions", sim.url());
    // A long stream (200 tokens at 50/s = 4 s) is under way when a short request completes.
    let long = tokio::spawn({
        let url = url.clone();
        async move { send(Method::POST, &url, Some(&request("long one", 200, true))).await }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(&format!("{}/v1/loads", sim.url())).await.json()["loads"][0]["num_running_reqs"] != 1
    {
        assert!(Instant::now() < deadline, "the long stream never started");
        tokio::task::yield_now().await;
    }
    let short = chat(&sim, &request("short one", 1, false)).await;
    assert_eq!(short.status, StatusCode::OK);
    let long =
        tokio::time::timeout(Duration::from_secs(10), long).await.expect("ends").expect("joins");
    match long {
        Err(error) => assert!(error.contains("body failed"), "{error}"),
        Ok(reply) => {
            panic!("the long stream should have been cut: {}", String::from_utf8_lossy(&reply.body))
        }
    }
    let status = tokio::time::timeout(Duration::from_secs(10), sim.child.wait())
        .await
        .expect("exits")
        .expect("status");
    assert_eq!(status.code(), Some(3));
}

#[tokio::test]
async fn no_kv_events_publishes_nothing() {
    let sim = Sim::start(&[
        "--kv-events",
        "tcp://127.0.0.1:0",
        "--kv-replay",
        "tcp://127.0.0.1:0",
        "--no-kv-events",
    ])
    .await;
    chat(&sim, &request("this would store a few blocks of tokens in the cache", 4, false)).await;
    // The replay ring is empty: only the end marker comes back.
    let mut dealer = zeromq::DealerSocket::new();
    use zeromq::{Socket, SocketRecv, SocketSend};
    dealer.connect(sim.endpoint("kv replay")).await.expect("connects");
    let request = zeromq::ZmqMessage::try_from(vec![
        bytes::Bytes::new(),
        bytes::Bytes::copy_from_slice(&0u64.to_be_bytes()),
    ])
    .expect("message");
    dealer.send(request).await.expect("sends");
    let reply = tokio::time::timeout(Duration::from_secs(10), dealer.recv())
        .await
        .expect("in time")
        .expect("reply");
    let frames = reply.into_vec();
    assert_eq!(frames[2].as_ref(), &[0xff; 8], "first reply is the end marker");
    // Caching itself still works.
    let again = chat(
        &sim,
        &crate::common::request("this would store a few blocks of tokens in the cache", 4, false),
    )
    .await;
    assert!(
        again.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .is_some_and(|c| c > 0)
    );
}
