//! `router-server --demo`: the README's first command serves a working fleet.

use router_e2e::{Http, Router, chat_body};
use router_test_support::eventually;

#[tokio::test]
async fn the_demo_serves_plain_and_pd_models() {
    let router = Router::with_args(&["--demo".into(), "--port".into(), "0".into()]);
    let http = Http::default();
    let reply = http.chat(&router.url, &chat_body("demo", "Hello!", 4), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply.header("x-router-engine").is_some_and(|e| e.starts_with("engine-")));
    let reply = http.chat(&router.url, &chat_body("demo-pd", "Hello!", 4), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("x-router-prefill-engine"), Some("prefill-1"));
    assert_eq!(reply.header("x-router-decode-engine"), Some("decode-1"));
    // The pair's engines are data-parallel: the router names a rank of each.
    for header in ["x-router-prefill-rank", "x-router-decode-rank"] {
        assert!(reply.header(header).is_some_and(|r| r == "0" || r == "1"), "{header}");
    }

    // The banner's other two examples: completions on the plain model, /generate on the pair.
    let json = [("content-type", "application/json")];
    for (path, body) in [
        ("/v1/completions", r#"{"model": "demo", "prompt": "Once upon a time", "max_tokens": 8}"#),
        (
            "/generate",
            r#"{"model": "demo-pd", "text": "Hello", "sampling_params": {"max_new_tokens": 8}}"#,
        ),
    ] {
        let reply = http.send("POST", &format!("{}{path}", router.url), &json, body).await;
        assert_eq!(reply.status, 200, "{path}: {}", reply.body);
    }

    // The chat bodies SDKs and agents send: content as a list of parts, an assistant turn of
    // tool calls with null content, then the tool's answer. Rendered exactly, as the engine
    // renders them.
    let agent = r#"{"model": "demo", "max_tokens": 4, "messages": [
        {"role": "system", "content": [{"type": "text", "text": "You are terse."}]},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Lisbon?"},
                                     {"type": "text", "text": " Celsius please."}]},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "weather", "arguments": "{\"city\": \"Lisbon\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "21 C, sunny"}]}"#;
    let reply =
        http.send("POST", &format!("{}/v1/chat/completions", router.url), &json, agent).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("x-router-prompt-tokens-source"), Some("exact"), "{}", reply.body);

    // Clients that name no model (SGLang's bench_serving sends none) get the default, `demo`.
    let nameless = [
        (
            "/v1/chat/completions",
            r#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}"#,
        ),
        ("/generate", r#"{"text": "Hello", "sampling_params": {"max_new_tokens": 4}}"#),
    ];
    for (path, body) in nameless {
        let reply = http.send("POST", &format!("{}{path}", router.url), &json, body).await;
        assert_eq!(reply.status, 200, "{path}: {}", reply.body);
        assert!(
            reply.header("x-router-engine").is_some_and(|e| e.starts_with("engine-")),
            "{path}"
        );
    }

    // Every engine streams load reports over gRPC and publishes KV events.
    let fresh = r#"router_load_report_state{worker="engine-1",state="fresh"} 1"#;
    let kv = r#"router_kv_events{worker="engine-1",counter="blocks"}"#;
    let pd_fresh = r#"router_load_report_state{worker="prefill-1",state="fresh"} 1"#;
    eventually("fresh load reports and KV events, the pair's of both ranks", async || {
        let metrics = http.get(&router.url, "/metrics", &[]).await.body;
        metrics.contains(fresh) && metrics.contains(kv) && metrics.contains(pd_fresh)
    })
    .await;
}

#[tokio::test]
async fn the_demo_runs_wherever_its_binary_is_copied() {
    // The binary alone in a directory of its own, run from there.
    let dir = std::env::temp_dir().join(format!("router-demo-binary-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let copy = dir.join("router-server");
    std::fs::copy(router_e2e::binary("router-server"), &copy).expect("copied");
    let args = ["--demo".to_owned(), "--port".to_owned(), "0".to_owned()];
    let demo = router_e2e::Process::spawn_in(&copy, &dir, &args, "tokenizer (");
    let banner = demo.lines.join("\n");
    let url = demo.url_after("router listening on ");
    let tokenizer = banner
        .lines()
        .find_map(|l| l.split_once("prompts of a set length): ").map(|(_, path)| path.trim()))
        .expect("the banner names the tokenizer");
    assert!(!tokenizer.contains(env!("CARGO_MANIFEST_DIR")), "{tokenizer} is in the source tree");
    let written = std::fs::read_to_string(tokenizer).expect("the tokenizer is written out");
    assert!(written == router_sim::assets::gpt2::TOKENIZER_JSON, "GPT-2's BPE");
    let prompt = "Hello! Tell me about the weather in Lisbon today.";
    let reply = Http::default().chat(&url, &chat_body("demo", prompt, 4), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    // Router and engines count the same BPE tokens: a few per word, not one per byte.
    let counted: u64 = reply.header("x-router-prompt-tokens").expect("count").parse().expect("n");
    assert_eq!(reply.header("x-router-prompt-tokens-source"), Some("exact"));
    assert_eq!(reply.json()["usage"]["prompt_tokens"], counted, "{}", reply.body);
    assert!(counted < prompt.len() as u64 / 2, "{counted} tokens");
    drop(demo);
    std::fs::remove_dir_all(&dir).expect("cleaned");
}
