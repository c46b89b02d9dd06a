//! The engine's OpenAI surface: non-streamed and streamed chat (chunks, usage, `[DONE]`),
//! cached tokens over a repeated prefix, tokenizer agreement, OpenAI-shaped errors, the probes
//! and the load endpoints.

use http::StatusCode;
use serde_json::json;

use crate::common::*;

#[tokio::test]
async fn non_streamed_chat_has_the_openai_shape() {
    let sim = Sim::start(&[]).await;
    let reply = chat(&sim, &request("Hello, simulator!", 5, false)).await;
    assert_eq!(reply.status, StatusCode::OK);
    let body = reply.json();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "m");
    let choice = &body["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"].as_str().map(str::len), Some(5), "one byte per token");
    assert_eq!(choice["finish_reason"], "length");
    let prompt_tokens = chatml_user("Hello, simulator!").len() as u64;
    assert_eq!(body["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(body["usage"]["completion_tokens"], 5);
    assert_eq!(body["usage"]["total_tokens"], prompt_tokens + 5);
    assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

    // Without a limit the default (16) applies and the answer ends naturally.
    let body = chat(&sim, &json!({"messages": [{"role": "user", "content": "hi"}]})).await.json();
    assert_eq!(body["usage"]["completion_tokens"], 16);
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    // max_completion_tokens wins over max_tokens.
    let body = chat(&sim, &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9, "max_completion_tokens": 2})).await.json();
    assert_eq!(body["usage"]["completion_tokens"], 2);
}

#[tokio::test]
async fn streamed_chat_sends_chunks_usage_and_done() {
    let sim = Sim::start(&[]).await;
    let reply = chat(&sim, &request("Stream me", 4, true)).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.headers["content-type"], "text/event-stream");
    let events = reply.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<serde_json::Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("json chunk"))
        .collect();
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let content: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(content.len(), 4);
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let usage = &chunks[chunks.len() - 1];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 4);
    assert_eq!(usage["usage"]["prompt_tokens"], chatml_user("Stream me").len() as u64);

    // Without include_usage there is no usage chunk.
    let mut body = request("Stream me", 4, true);
    body.as_object_mut().expect("object").remove("stream_options");
    let events = chat(&sim, &body).await.events();
    assert!(events.iter().all(|e| !e.contains("\"usage\"")), "{events:?}");
    assert_eq!(events.len(), 4 + 1 + 1, "4 token chunks, the finish chunk, [DONE]");
}

#[tokio::test]
async fn cached_tokens_grow_over_a_repeated_prefix() {
    let sim = Sim::start(&[]).await;
    let system = "You are a careful assistant. ".repeat(8);
    let turn1 = json!({"model": "m", "max_tokens": 8, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": "First question?"}]});
    let first = chat(&sim, &turn1).await.json();
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let prompt1 = first["usage"]["prompt_tokens"].as_u64().expect("prompt tokens");

    // The same prompt again: every full block but the one holding the last token is reused.
    let again = chat(&sim, &turn1).await.json();
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"], (prompt1 - 1) / 16 * 16);

    // The next turn of the conversation reuses at least the whole first prompt's blocks.
    let answer = first["choices"][0]["message"]["content"].as_str().expect("content").to_owned();
    let turn2 = json!({"model": "m", "max_tokens": 8, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": "First question?"},
        {"role": "assistant", "content": answer}, {"role": "user", "content": "And a second one?"}]});
    let second = chat(&sim, &turn2).await.json();
    let cached2 =
        second["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached");
    assert!(cached2 >= prompt1 / 16 * 16, "cached {cached2} of a history of {prompt1}");

    // A different system prompt shares only the template's first block ("<|im_start|>syst").
    let other = json!({"model": "m", "messages": [{"role": "system", "content": "Other."},
        {"role": "user", "content": "First question?"}]});
    assert_eq!(
        chat(&sim, &other).await.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
        16
    );
}

#[tokio::test]
async fn tokenizer_file_and_builtin_agree() {
    let tokenizer = router_sim::assets::tokenizer_path();
    let with_file = Sim::start(&["--tokenizer", tokenizer.to_str().expect("utf-8 path")]).await;
    let builtin = Sim::start(&[]).await;
    let body = json!({"model": "m", "max_tokens": 12, "messages": [
        {"role": "system", "content": "Système: réponds brièvement 🙂"},
        {"role": "user", "content": [{"type": "text", "text": "Bonjour "}, {"type": "text", "text": "là"}]}]});
    let a = chat(&with_file, &body).await.json();
    let b = chat(&builtin, &body).await.json();
    assert_eq!(a["usage"], b["usage"]);
    assert_eq!(a["choices"][0]["message"], b["choices"][0]["message"]);
    let info = get(&format!("{}/get_model_info", with_file.url())).await.json();
    assert!(info["tokenizer_path"].as_str().is_some_and(|p| p.ends_with("tokenizer.json")));
}

#[tokio::test]
async fn bad_requests_are_openai_errors() {
    let sim = Sim::start(&[]).await;
    let url = format!("{}/v1/chat/completions", sim.url());
    let raw = |body: &str| {
        let body = body.to_owned();
        let url = url.clone();
        async move {
            let request = http::Request::post(&url)
                .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                .expect("request");
            let response = client().request(request).await.expect("answered");
            let status = response.status();
            let body = http_body_util::BodyExt::collect(response.into_body())
                .await
                .expect("body")
                .to_bytes();
            (status, serde_json::from_slice::<serde_json::Value>(&body).expect("json error"))
        }
    };
    let (status, body) = raw("{not json").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["code"], 400);
    assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("invalid request body")));
    let (status, _) =
        raw(r#"{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) =
        raw(r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, body) =
        raw(r#"{"model": "other", "messages": [{"role": "user", "content": "x"}]}"#).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("other")));
}

#[tokio::test]
async fn probes_answer() {
    let sim =
        Sim::start(&["--kv-capacity-tokens", "4096", "--max-running", "7", "--block-size", "32"])
            .await;
    assert_eq!(get(&format!("{}/health", sim.url())).await.status, StatusCode::OK);
    let models = get(&format!("{}/v1/models", sim.url())).await.json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "m");
    let info = get(&format!("{}/get_server_info", sim.url())).await.json();
    assert_eq!(info["page_size"], 32);
    assert_eq!(info["max_total_num_tokens"], 4096);
    assert_eq!(info["max_running_requests"], 7);
    assert_eq!(info["disaggregation_mode"], "null");
    let model = get(&format!("{}/get_model_info", sim.url())).await.json();
    assert_eq!(model["model_path"], "m");
    assert_eq!(model["is_generation"], true);
}

#[tokio::test]
async fn loads_report_queue_and_kv() {
    let sim = Sim::start(&["--max-running", "1", "--decode-tokens-per-sec", "20"]).await;
    let idle = get(&format!("{}/v1/loads", sim.url())).await.json();
    assert_eq!(idle["loads"].as_array().map(Vec::len), Some(1));
    let rank = &idle["loads"][0];
    assert_eq!(rank["dp_rank"], 0);
    assert_eq!(
        (rank["num_running_reqs"].as_u64(), rank["num_waiting_reqs"].as_u64()),
        (Some(0), Some(0))
    );
    assert_eq!(rank["max_total_num_tokens"], 65536);
    assert_eq!(rank["max_running_requests"], 1);
    assert!(idle["timestamp"].as_str().is_some_and(|t| t.ends_with("+00:00")));

    // A long stream holds the only running slot; a second request waits behind it.
    let long = tokio::spawn({
        let url = sim.url().to_owned();
        async move {
            let body = request("hold the slot", 400, true);
            send(http::Method::POST, &format!("{url}/v1/chat/completions"), Some(&body)).await
        }
    });
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    // Running, and prefilled (so its blocks are cached).
    loop {
        let rank = get(&format!("{}/v1/loads", sim.url())).await.json()["loads"][0].clone();
        if rank["num_running_reqs"] == 1 && rank["total_prefill_uncached_tokens"] != 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the long stream never ran: {rank}");
        tokio::task::yield_now().await;
    }
    let waiting = tokio::spawn({
        let url = sim.url().to_owned();
        async move {
            let body = request("wait behind it", 1, false);
            send(http::Method::POST, &format!("{url}/v1/chat/completions"), Some(&body)).await
        }
    });
    let rank = loop {
        let loads = get(&format!("{}/v1/loads", sim.url())).await.json();
        let rank = loads["loads"][0].clone();
        if rank["num_waiting_reqs"] == 1 && rank["num_running_reqs"] == 1 {
            break rank;
        }
        assert!(tokio::time::Instant::now() < deadline, "never saw 1 running + 1 waiting: {rank}");
        tokio::task::yield_now().await;
    };
    let waiting_prompt = chatml_user("wait behind it").len() as u64;
    // Its first block ("<|im_start|>user") is cached already, the rest is not.
    assert_eq!(rank["num_waiting_uncached_tokens"], waiting_prompt - 16);
    let used = rank["num_used_tokens"].as_u64().expect("used");
    assert!(used >= chatml_user("hold the slot").len() as u64, "{rank}");
    assert_eq!(rank["num_total_tokens"], used + waiting_prompt);
    assert!(rank["total_prefill_uncached_tokens"].as_u64().is_some_and(|t| t > 0));
    let legacy = get(&format!("{}/get_load", sim.url())).await.json();
    assert_eq!(legacy[0]["num_reqs"], 2);
    long.abort();
    waiting.abort();
}

#[tokio::test]
async fn a_stream_interval_sends_several_tokens_per_chunk() {
    use http_body_util::BodyExt;
    // Slow enough decoding that, one token per chunk, every token would be its own chunk.
    let sim = Sim::start(&["--stream-interval", "4", "--decode-tokens-per-sec", "200"]).await;
    let body = request("Stream me in chunks", 10, true);
    let http_request = http::Request::post(format!("{}/v1/chat/completions", sim.url()))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(body.to_string())))
        .expect("request");
    let response = client().request(http_request).await.expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut chunks = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("frame").into_data() {
            chunks.push(String::from_utf8_lossy(&data).into_owned());
        }
    }
    let tokens_per_chunk: Vec<usize> =
        chunks.iter().map(|c| c.matches("\"content\":").count()).collect();
    // Ten tokens: 4 + 4 + the last 2 with the end of the stream.
    assert_eq!(tokens_per_chunk, [4, 4, 2], "{chunks:?}");
    assert!(chunks.last().is_some_and(|c| c.ends_with("data: [DONE]\n\n")));
}
