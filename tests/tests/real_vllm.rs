//! The router in front of two real vLLM engines (the CPU build, tiny random-weight Llama-3
//! family models; `tests/vllm/setup.sh` installs them): everything the simulator cannot show.
//!
//! One scenario, in order, since every engine start costs half a minute on the 2-core machine:
//! 1. conversations whose messages are all content parts land where their prefix is cached,
//!    and vLLM's own `cached_tokens` confirms the hit;
//! 2. a router started after the engines learns what they already hold from their replay
//!    buffers, before anything new is published, and routes the next turn there;
//! 3. the engines' load is read from their Prometheus `/metrics` without any load source
//!    configured, so `predicted_ttft` picks on reports (reason `predicted_ttft`), with a
//!    prefill rate learned from the first tokens it observed;
//! 4. evictions (`BlockRemoved`) are followed: the index never holds more than an engine's
//!    small cache;
//! 5. a restarted engine is not credited with its old blocks;
//! 6. `/flush_cache` empties both engines through vLLM's `/reset_prefix_cache`.
//!
//! Run by `cargo xtask ci` as a step of its own (`--features real-engines`), one test at a time.

use std::time::Duration;

use router_e2e::vllm::{VllmEngine, VllmOptions};
use router_e2e::{ADMIN_TOKEN, Http, Reply, Router, kv_blocks};
use router_test_support::eventually;
use serde_json::{Value, json};

/// KV blocks of 32 tokens each engine has: room for a few long conversations, so that a
/// stream of new ones makes it evict.
const ENGINE_BLOCKS: u32 = 256;

fn tokenizer() -> String {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    dir.join("vllm/models/llama3/tokenizer.json").display().to_string()
}

/// A router in front of `engines`, `predicted_ttft` in its one bucket, probing health every
/// second; no load source is configured.
fn router_yaml(engines: &[&VllmEngine]) -> String {
    let workers: String = engines
        .iter()
        .enumerate()
        .map(|(i, e)| {
            format!(
                "      - {{id: v{}, url: \"{}\", block_size: 32, kv_events: {{endpoint: \"{}\", replay_endpoint: \"{}\"}}}}\n",
                i + 1,
                e.http_url(),
                e.kv_events_endpoint(),
                e.replay_endpoint()
            )
        })
        .collect();
    format!(
        "server: {{port: 0, admin_token: {ADMIN_TOKEN}}}\nhealth: {{interval_secs: 1, timeout_secs: 2}}\n\
         models:\n  - id: tiny\n    tokenizer: \"{}\"\n    workers:\n{workers}    buckets:\n      \
         - id: all\n        groups: {{plain: {{policy: {{type: predicted_ttft}}}}}}\n",
        tokenizer()
    )
}

/// A conversation of content parts in every message: a long shared document, then `turns`
/// question-and-answer rounds, then a last question.
fn conversation(topic: &str, turns: usize) -> Value {
    let document = format!("Notes on {topic}. ").repeat(1) + &format!(
        "The {topic} archive holds records of every season, each with its date, its place, the people who came and what they said. "
    )
    .repeat(30);
    let part = |text: String| json!([{"type": "text", "text": text}]);
    let mut messages = vec![
        json!({"role": "system", "content": part(format!("You answer questions about {topic}."))}),
        json!({"role": "user", "content": [{"type": "text", "text": document}, {"type": "text", "text": "Read this first."}]}),
        json!({"role": "assistant", "content": part("I have read it.".into())}),
    ];
    for turn in 0..turns {
        messages.push(
            json!({"role": "user", "content": part(format!("Question {turn} about {topic}?"))}),
        );
        messages.push(json!({"role": "assistant", "content": part(format!("Answer {turn}."))}));
    }
    messages
        .push(json!({"role": "user", "content": part(format!("Question {turns} about {topic}?"))}));
    json!({"model": "tiny", "messages": messages, "max_tokens": 1, "temperature": 0})
}

fn cached_tokens(reply: &Reply) -> u64 {
    reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0)
}

fn engine_of(reply: &Reply) -> String {
    reply.header("x-router-engine").expect("x-router-engine").to_owned()
}

async fn chat(http: &Http, router: &Router, body: &Value) -> Reply {
    let reply = http.chat(&router.url, body, &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("x-router-prompt-tokens-source"), Some("exact"), "{}", reply.body);
    reply
}

/// The value of the first `/metrics` sample whose line starts with `series`, 0 when absent.
async fn metric(http: &Http, router: &Router, series: &str) -> f64 {
    let text = http.get(&router.url, "/metrics", &[]).await.body;
    text.lines().find_map(|l| l.strip_prefix(series)?.trim().parse().ok()).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_vllm_engines_behind_the_router() {
    let options =
        |core| VllmOptions { core, num_blocks: Some(ENGINE_BLOCKS), ..VllmOptions::default() };
    let v1 = VllmEngine::start("llama3", options(0));
    let mut v2 = VllmEngine::start("llama3", options(1));
    let router = Router::with_config(&router_yaml(&[&v1, &v2]));
    let http = Http::default();
    router.wait_until_ready(&http, ADMIN_TOKEN).await;

    // 1. Multi-turn conversations in content parts go where their prefix is.
    for topic in ["tides", "orchards"] {
        let first = chat(&http, &router, &conversation(topic, 0)).await;
        let home = engine_of(&first);
        let prompt: u64 =
            first.header("x-router-prompt-tokens").and_then(|n| n.parse().ok()).expect("count");
        assert_eq!(
            first.json()["usage"]["prompt_tokens"].as_u64(),
            Some(prompt),
            "the router's count is vLLM's"
        );
        eventually("the first turn's blocks in the index", async || {
            kv_blocks(&http, &router, ADMIN_TOKEN, &home).await > 0
        })
        .await;
        for turns in 1..=3 {
            let next = chat(&http, &router, &conversation(topic, turns)).await;
            assert_eq!(engine_of(&next), home, "turn {turns} of {topic} left its prefix");
            assert!(cached_tokens(&next) >= 384, "turn {turns} of {topic}: {}", next.body);
        }
    }

    // 2. A router started now learns what the engines hold, before they publish anything.
    let late = Router::with_config(&router_yaml(&[&v1, &v2]));
    late.wait_until_ready(&http, ADMIN_TOKEN).await;
    eventually("the late router's index replayed", async || {
        kv_blocks(&http, &late, ADMIN_TOKEN, "v1").await
            + kv_blocks(&http, &late, ADMIN_TOKEN, "v2").await
            > 0
    })
    .await;
    let tides = chat(&http, &late, &conversation("tides", 4)).await;
    assert!(cached_tokens(&tides) >= 384, "the late router missed the prefix: {}", tides.body);

    // 3. Load polled from vLLM's /metrics: picks on reports, with learned rates.
    eventually("vLLM's metrics polled for load", async || {
        let state = router.admin_state(&http, ADMIN_TOKEN).await;
        router_e2e::worker_state(&state, "v1")["load"]["freshness"] == "fresh"
            && router_e2e::worker_state(&state, "v2")["load"]["freshness"] == "fresh"
    })
    .await;
    // The engine each worker runs, learned from its answers (vLLM serves `/version`).
    let state = router.admin_state(&http, ADMIN_TOKEN).await;
    assert_eq!(state["models"][0]["chat_rules"], "vllm", "{state}");
    let workers = http
        .get(&router.url, "/admin/workers", &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))])
        .await
        .json();
    for worker in workers["workers"].as_array().expect("workers") {
        assert_eq!(worker["engine"], "vllm", "{worker}");
    }
    for i in 0..4 {
        chat(&http, &router, &conversation(&format!("weather {i}"), 0)).await;
    }
    let reported =
        "router_picks_total{policy=\"predicted_ttft\",stage=\"plain\",reason=\"predicted_ttft\"}";
    assert!(metric(&http, &router, reported).await >= 1.0, "no pick on reports");

    // 4. Evictions are followed: new conversations push the old ones out of the small caches,
    //    and the index never counts more blocks than an engine holds.
    for i in 0..12 {
        chat(&http, &router, &conversation(&format!("history {i}"), 2)).await;
    }
    for id in ["v1", "v2"] {
        let blocks = kv_blocks(&http, &router, ADMIN_TOKEN, id).await;
        assert!(blocks <= u64::from(ENGINE_BLOCKS), "{id}: {blocks} blocks indexed");
    }
    let state = router.admin_state(&http, ADMIN_TOKEN).await;
    let removed: u64 = ["v1", "v2"]
        .iter()
        .map(|id| {
            router_e2e::worker_state(&state, id)["kv"]["removed_blocks"].as_u64().unwrap_or(0)
        })
        .sum();
    assert!(removed > 0, "no BlockRemoved followed: {state:#}");

    // 5. A restarted engine is not credited with its old blocks.
    let before = kv_blocks(&http, &router, ADMIN_TOKEN, "v2").await;
    assert!(before > 0);
    v2.restart();
    eventually("the restarted engine's blocks forgotten", async || {
        kv_blocks(&http, &router, ADMIN_TOKEN, "v2").await == 0
    })
    .await;
    eventually("the restarted engine healthy again", async || {
        let state = router.admin_state(&http, ADMIN_TOKEN).await;
        router_e2e::worker_state(&state, "v2")["healthy"] == true
    })
    .await;

    // 6. /flush_cache empties both through vLLM's own reset.
    let flushed = http
        .send(
            "POST",
            &format!("{}/flush_cache", router.url),
            &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))],
            "",
        )
        .await;
    assert_eq!(flushed.status, 200, "{}", flushed.body);
    assert_eq!(flushed.json()["flushed"].as_array().map(Vec::len), Some(2), "{}", flushed.body);
    let again = chat(&http, &router, &conversation("orchards", 5)).await;
    assert_eq!(cached_tokens(&again), 0, "the caches were emptied: {}", again.body);
    tokio::time::sleep(Duration::from_millis(10)).await;
}
