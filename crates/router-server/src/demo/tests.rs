//! The demo fleet: its configuration builds as a router would build it, with both models on
//! their engines and the recommended policy, and each model answers a chat request.

use std::sync::Arc;

use axum::http::StatusCode;

use super::{RECOMMENDED_POLICY, banner, start};
use crate::app::AppContext;
use crate::tests::{call, json};

#[tokio::test]
async fn the_demo_fleet_serves_both_models() {
    let (fleet, config) = start(0).await.expect("the fleet starts");
    let ctx = Arc::new(AppContext::build(&config).expect("the demo's configuration is valid"));
    let mut ids: Vec<String> = ctx.models().map(|m| m.id.to_string()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["demo", "demo-pd"]);
    let workers: Vec<String> =
        ctx.registry().workers().iter().map(|w| w.id().to_string()).collect();
    assert_eq!(workers, ["decode-1", "engine-1", "engine-2", "engine-3", "engine-4", "prefill-1"]);
    let demo = ctx.model("demo").expect("demo");
    let policy = demo.resolver.buckets()[0].groups().iter().next().expect("a group").policy();
    assert_eq!(policy.name(), RECOMMENDED_POLICY);
    assert!(demo.tokenization.is_some(), "the sim's tokenizer");

    for model in ["demo", "demo-pd"] {
        let messages = r#"[{"role": "user", "content": "Hello!"}]"#;
        let body = format!(r#"{{"model": "{model}", "max_tokens": 2, "messages": {messages}}}"#);
        let (status, headers, answer) =
            call(&ctx, "POST", "/v1/chat/completions", None, &body).await;
        assert_eq!(status, StatusCode::OK, "{model}: {answer}");
        assert!(headers.contains_key("x-router-bucket"), "{model}");
        assert!(json(&answer)["choices"].is_array(), "{model}: {answer}");
    }
    fleet.stop();

    // The tokenizer came out of the binary, not the source tree.
    assert_eq!(fleet.tokenizer(), super::tokenizer_dir().join("tokenizer.json"));
    let written = std::fs::read_to_string(fleet.tokenizer()).expect("written out");
    assert!(written == router_sim::assets::gpt2::TOKENIZER_JSON, "the demo writes GPT-2's BPE");
    let text = banner("127.0.0.1:8080".parse().expect("address"), fleet.tokenizer());
    assert!(text.starts_with("router listening on http://127.0.0.1:8080\n"), "{text}");
    assert!(text.contains(&fleet.tokenizer().display().to_string()), "{text}");
    for path in ["/v1/chat/completions", "/v1/completions", "/generate"] {
        assert!(text.contains(&format!("curl -s http://127.0.0.1:8080{path}")), "{text}");
    }
}
