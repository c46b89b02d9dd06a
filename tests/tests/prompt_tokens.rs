//! The prompt tokens the router routes with, seen from outside: `x-router-prompt-tokens` and
//! its source on every inference answer, `POST /admin/tokenize`, chat bodies in every shape
//! an SDK sends (content parts, `null` content with tool calls), and the requests it cannot
//! render exactly, which are served all the same and counted. Real `router-sim` engines
//! render with vLLM's rules, so the router's count equals the engine's.

use router_e2e::{ADMIN_TOKEN, Http, Router, chat_body, kv_engines, kv_router_yaml};
use router_test_support::eventually;
use serde_json::{Value, json};

fn tokenizer() -> String {
    router_sim::assets::tokenizer_path().display().to_string()
}

async fn tokenize(http: &Http, router: &Router, body: &Value) -> Value {
    let reply = http
        .send(
            "POST",
            &format!("{}/admin/tokenize", router.url),
            &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))],
            body.to_string(),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_says_the_prompt_tokens_it_was_routed_with() {
    let tokenizer = tokenizer();
    let engines = kv_engines(2, &tokenizer, &[]);
    let router = Router::with_config(&kv_router_yaml(&engines, &tokenizer, "{type: cache_aware}"));
    let http = Http::default();
    router.wait_until_ready(&http, ADMIN_TOKEN).await;

    // Parts in every message, and an assistant turn of tool calls with null content.
    let shared = "You read long documents with care and answer briefly. ".repeat(20);
    let conversation = |question: &str| {
        json!({"model": "m", "max_tokens": 1, "messages": [
            {"role": "system", "content": [{"type": "text", "text": shared}]},
            {"role": "user", "content": [{"type": "text", "text": "Look it up."}, {"type": "text", "text": "Then tell me."}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "lookup", "arguments": "{\"q\": \"x\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "found it"},
            {"role": "user", "content": [{"type": "text", "text": question}]}]})
    };
    let first = http.chat(&router.url, &conversation("First?"), &[]).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let counted: u64 =
        first.header("x-router-prompt-tokens").expect("the count").parse().expect("n");
    assert_eq!(first.header("x-router-prompt-tokens-source"), Some("exact"));
    assert_eq!(
        first.json()["usage"]["prompt_tokens"].as_u64(),
        Some(counted),
        "the engine counted what the router counted"
    );
    let shown = tokenize(&http, &router, &conversation("First?")).await;
    assert_eq!(shown["source"], "exact");
    assert_eq!(shown["token_ids"].as_array().map(Vec::len), Some(counted as usize));

    // The follow-up finds the conversation's prefix where it went.
    let home = first.header("x-router-engine").expect("engine").to_owned();
    eventually("the first request's blocks indexed", async || {
        router_e2e::kv_blocks(&http, &router, ADMIN_TOKEN, &home).await > 0
    })
    .await;
    let next = http.chat(&router.url, &conversation("Second?"), &[]).await;
    assert_eq!(next.status, 200, "{}", next.body);
    assert_eq!(next.header("x-router-engine"), Some(home.as_str()));
    let cached = next.json()["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    assert!(cached.unwrap_or(0) > 200, "{}", next.body);

    // Completions and /generate say it too; `add_special_tokens` is honoured.
    let completion = json!({"model": "m", "prompt": "count to three", "max_tokens": 1});
    let reply = http
        .send("POST", &format!("{}/v1/completions", router.url), &[], completion.to_string())
        .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("x-router-prompt-tokens-source"), Some("exact"));
    let plain = tokenize(
        &http,
        &router,
        &json!({"endpoint": "completions", "model": "m",
        "prompt": "count to three"}),
    )
    .await;
    let bare = tokenize(
        &http,
        &router,
        &json!({"endpoint": "completions", "model": "m",
        "prompt": "count to three", "add_special_tokens": false}),
    )
    .await;
    assert!(plain["prompt_tokens"].as_u64() >= bare["prompt_tokens"].as_u64());
    let ids = json!({"input_ids": [[1, 2, 3], [4, 5]], "sampling_params": {"max_new_tokens": 1}});
    let reply = http.send("POST", &format!("{}/generate", router.url), &[], ids.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("x-router-prompt-tokens"), Some("5"), "a batch sums its prompts");

    // An image cannot be rendered as a text-only engine would: served, estimated, counted.
    let image = json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]});
    let reply = http.chat(&router.url, &image, &[]).await;
    assert_eq!(reply.status, 200, "the engine renders what it can: {}", reply.body);
    assert_eq!(reply.header("x-router-prompt-tokens-source"), Some("estimated"));
    let shown = tokenize(&http, &router, &image).await;
    assert_eq!(
        (shown["token_ids"].clone(), shown["unmatchable"].clone()),
        (Value::Null, json!("non_text_part"))
    );
    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    assert!(
        metrics.contains("router_prefix_unmatchable_total{reason=\"non_text_part\"} "),
        "{metrics}"
    );
}

/// A body whose rendering differs between the engines' rules: SGLang turns a final assistant
/// message into a user message, vLLM continues after it with a generation prompt.
fn ends_with_an_assistant() -> Value {
    json!({"model": "m", "max_tokens": 1, "messages": [
        {"role": "user", "content": "Say hello."},
        {"role": "assistant", "content": "Hello"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_requests_render_by_the_rules_of_the_engine_the_workers_run() {
    let tokenizer = tokenizer();
    let engines = kv_engines(1, &tokenizer, &[]);
    let http = Http::default();
    let admin = format!("Bearer {ADMIN_TOKEN}");
    // router-sim names itself in /get_server_info and serves no /version: no engine is
    // learned, and the model renders by vLLM's rules.
    let unnamed = Router::with_config(&kv_router_yaml(&engines, &tokenizer, "{type: round_robin}"));
    unnamed.wait_until_ready(&http, ADMIN_TOKEN).await;
    let named = Router::with_config(
        &kv_router_yaml(&engines, &tokenizer, "{type: round_robin}")
            .replace("{id: e1,", "{id: e1, engine: sglang,"),
    );
    named.wait_until_ready(&http, ADMIN_TOKEN).await;

    for (router, engine, rules) in
        [(&unnamed, Value::Null, "vllm"), (&named, json!("sglang"), "sglang")]
    {
        let workers = http.get(&router.url, "/admin/workers", &[("authorization", &admin)]).await;
        assert_eq!(workers.json()["workers"][0]["engine"], engine, "{}", workers.body);
        let state = router.admin_state(&http, ADMIN_TOKEN).await;
        assert_eq!(state["models"][0]["chat_rules"], rules, "{state}");
    }
    let by_vllm = tokenize(&http, &unnamed, &ends_with_an_assistant()).await;
    let by_sglang = tokenize(&http, &named, &ends_with_an_assistant()).await;
    assert_eq!((&by_vllm["source"], &by_sglang["source"]), (&json!("exact"), &json!("exact")));
    assert_ne!(by_vllm["token_ids"], by_sglang["token_ids"], "the two rules render it alike");

    // Routing itself reads no token of these requests (round_robin, one unbounded bucket):
    // they are not tokenized, and the answer says the count is the estimate.
    let reply = http.chat(&unnamed.url, &chat_body("m", "count me", 2), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("x-router-prompt-tokens-source"), Some("estimated"));
}
