//! Prefill/decode engines meeting on a bootstrap room, and the errors for a missing, mismatched
//! or failed room.

use http::StatusCode;
use serde_json::{Value, json};

use crate::common::*;

fn pd_request(content: &str, port: u16, room: u64, max_tokens: u64) -> Value {
    let mut body = request(content, max_tokens, true);
    body["bootstrap_host"] = json!("127.0.0.1");
    body["bootstrap_port"] = json!(port);
    body["bootstrap_room"] = json!(room);
    body
}

fn usage(reply: &Reply) -> Value {
    let events = reply.events();
    let chunk = events.iter().rev().find(|e| e.contains("\"usage\":{")).expect("a usage chunk");
    serde_json::from_str::<Value>(chunk).expect("json")["usage"].clone()
}

#[tokio::test]
async fn prefill_and_decode_meet_on_the_bootstrap_room() {
    let prefill = Sim::start(&[
        "--role",
        "prefill",
        "--bootstrap-port",
        "0",
        "--kv-replay",
        "tcp://127.0.0.1:0",
    ])
    .await;
    let decode = Sim::start(&["--role", "decode", "--bootstrap-timeout-ms", "5000"]).await;
    let port = prefill.port("bootstrap");
    let info = get(&format!("{}/get_server_info", prefill.url())).await.json();
    assert_eq!(info["disaggregation_mode"], "prefill");
    assert_eq!(info["disaggregation_bootstrap_port"], port);

    let content = "A prompt long enough to fill a few blocks of sixteen tokens each, twice over.";
    for (room, expect_cached) in [(11u64, false), (12, true)] {
        let body = pd_request(content, port, room, 6);
        // The decode request goes first: it must wait for the prefill to reach the room.
        let (d, p) = tokio::join!(chat(&decode, &body), async {
            tokio::task::yield_now().await;
            chat(&prefill, &body).await
        });
        assert_eq!(d.status, StatusCode::OK, "{}", String::from_utf8_lossy(&d.body));
        assert_eq!(p.status, StatusCode::OK);
        let (d_usage, p_usage) = (usage(&d), usage(&p));
        assert_eq!(p_usage["completion_tokens"], 1, "the prefill side answers one token");
        assert_eq!(d_usage["completion_tokens"], 6);
        assert_eq!(d_usage["prompt_tokens"], p_usage["prompt_tokens"]);
        // The decode side reports what the prefill side found cached.
        assert_eq!(d_usage["prompt_tokens_details"], p_usage["prompt_tokens_details"]);
        let cached = d_usage["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached");
        assert_eq!(cached > 0, expect_cached, "room {room}: cached {cached}");
    }
}

#[tokio::test]
async fn missing_mismatched_and_failed_rooms_are_clear_errors() {
    let prefill = Sim::start(&["--role", "prefill", "--bootstrap-port", "0"]).await;
    let failing =
        Sim::start(&["--role", "prefill", "--bootstrap-port", "0", "--fail-rate", "1"]).await;
    let decode = Sim::start(&["--role", "decode", "--bootstrap-timeout-ms", "300"]).await;
    let port = prefill.port("bootstrap");

    // Nobody prefills room 5.
    let reply = chat(&decode, &pd_request("lonely", port, 5, 4)).await;
    assert_eq!(reply.status, StatusCode::GATEWAY_TIMEOUT);
    let message = reply.json()["error"]["message"].as_str().expect("message").to_owned();
    assert!(message.contains("bootstrap room 5 not ready"), "{message}");

    // The prefill side saw another prompt in room 6.
    let prefilled = chat(&prefill, &pd_request("the prefill's prompt", port, 6, 4)).await;
    assert_eq!(prefilled.status, StatusCode::OK);
    let reply = chat(&decode, &pd_request("a different prompt", port, 6, 4)).await;
    assert_eq!(reply.status, StatusCode::CONFLICT);
    assert!(
        reply.json()["error"]["message"].as_str().is_some_and(|m| m.contains("different prompt"))
    );

    // The prefill failed: the decode side hears it at once rather than timing out.
    let failing_port = failing.port("bootstrap");
    let body = pd_request("doomed", failing_port, 7, 4);
    let p = chat(&failing, &body).await;
    assert_eq!(p.status, StatusCode::INTERNAL_SERVER_ERROR);
    let d = chat(&decode, &body).await;
    assert_eq!(d.status, StatusCode::BAD_GATEWAY);
    assert!(
        d.json()["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("prefill for bootstrap room 7 failed"))
    );

    // A decode engine needs the bootstrap fields; a plain one ignores none of them silently.
    let reply = chat(&decode, &request("no room", 4, false)).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    let mut partial = request("half a room", 4, false);
    partial["bootstrap_room"] = json!(9);
    assert_eq!(chat(&prefill, &partial).await.status, StatusCode::BAD_REQUEST);

    // The bootstrap server is up on the prefill side only.
    assert_eq!(get(&format!("http://127.0.0.1:{port}/health")).await.status, StatusCode::OK);
}
