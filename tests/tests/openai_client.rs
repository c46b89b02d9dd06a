//! The official OpenAI Python client (pinned in `.ci/run`) drives chat and completions through
//! the router to a router-sim engine, whole and streamed, and reads a 400 as its own error.

use std::path::PathBuf;
use std::process::Command;

use router_e2e::{Engine, Router};

#[test]
fn the_official_openai_client_speaks_chat_and_completions_through_the_router() {
    let engine = Engine::start("m", &[]);
    let router = Router::with_config(&format!(
        "server: {{port: 0}}\nmodels:\n  - id: m\n    workers:\n      - {{id: e1, url: \"{}\"}}\n    \
         buckets:\n      - id: all\n        groups: {{plain: {{policy: {{type: round_robin}}}}}}\n",
        engine.url
    ));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/openai_client.py");
    let output =
        Command::new("python3").arg(&script).arg(&router.url).output().expect("python3 runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the client failed (is `openai` installed? .ci/run installs it): {stderr}"
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let seen: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!(seen["chat"]["tokens"], 3, "{seen}");
    assert!(seen["chat"]["content"].as_str().is_some_and(|c| !c.is_empty()), "{seen}");
    assert!(seen["chat_stream"].as_str().is_some_and(|c| !c.is_empty()), "{seen}");
    assert_eq!(seen["completions"]["choices"], 2, "{seen}");
    assert_eq!(seen["completions"]["tokens"], 4, "{seen}");
    assert!(seen["completions_stream"].as_str().is_some_and(|c| !c.is_empty()), "{seen}");
    assert_eq!(seen["bad"], "prompt", "{seen}");
}
