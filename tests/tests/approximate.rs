//! Cache-aware selection from engine URLs alone, as sglang-router's launch line gives them: with
//! no KV events the router pictures each engine's cache from its own dispatches (approximate
//! mode, prompt text hashed when there is no tokenizer), and an engine that advertises its KV
//! publisher in `/get_server_info` is subscribed to without being told.

use std::collections::HashSet;

use router_e2e::{Engine, Http, Router, chat_body, kv_engines, picks_by_reason};
use router_test_support::eventually;

const ADMIN: &str = "approx-admin";

fn quick_start(engines: &[Engine], extra: &[&str]) -> Router {
    let mut args: Vec<String> = vec!["--worker-urls".into()];
    args.extend(engines.iter().map(|e| e.url.clone()));
    for arg in ["--policy", "cache_aware", "--port", "0", "--admin-token", ADMIN] {
        args.push(arg.into());
    }
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    Router::with_args(&args)
}

/// Sends `prompt` and returns the engine that served it.
async fn served(http: &Http, router: &Router, prompt: &str) -> String {
    let reply = http.chat(&router.url, &chat_body("m", prompt, 1), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.header("x-router-engine").expect("engine").to_owned()
}

#[tokio::test]
async fn urls_alone_keep_a_long_prefix_on_one_engine_while_new_prefixes_spread() {
    let engines: Vec<Engine> = (0..3).map(|_| Engine::start("m", &[])).collect();
    let router = quick_start(&engines, &[]);
    let http = Http::default();
    let document = "Here is the long shared document the whole team asks about. ".repeat(100);
    let home = served(&http, &router, &format!("{document} Question zero?")).await;
    for i in 1..=6 {
        let engine = served(&http, &router, &format!("{document} Question {i}?")).await;
        assert_eq!(engine, home, "follow-up {i} went where the document was sent");
    }
    let mut fresh = HashSet::new();
    for i in 0..12 {
        let prompt = format!("Topic {i}: a new conversation about something else entirely.");
        fresh.insert(served(&http, &router, &prompt).await);
    }
    assert!(fresh.len() > 1, "new prefixes spread over the idle engines: {fresh:?}");

    let approximate = picks_by_reason(&http, &router, "cache_approximate").await;
    assert!(approximate >= 6.0, "each follow-up says how it was matched: {approximate}");
    let state = router.admin_state(&http, ADMIN).await;
    assert!(state["approximate_blocks"].as_u64().is_some_and(|b| b > 0), "{state}");
    for worker in state["workers"].as_array().expect("workers") {
        assert_eq!(worker["kv"]["approximate"], true, "{worker}");
    }
}

#[tokio::test]
async fn engines_that_advertise_their_kv_events_are_subscribed_without_being_told() {
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let engines = kv_engines(2, &tokenizer, &[]);
    let router = quick_start(&engines, &["--model", "m", "--tokenizer", &tokenizer]);
    let http = Http::default();
    router
        .wait_for_workers(&http, ADMIN, "subscribed to the advertised publishers", |worker| {
            worker["kv"]["subscribed"] == true && worker["kv"]["approximate"] == false
        })
        .await;
    let document = "A shared system prompt that every request of this test repeats. ".repeat(100);
    let home = served(&http, &router, &format!("{document} First?")).await;
    eventually("the engine's own events reach the index", async || {
        let state = router.admin_state(&http, ADMIN).await;
        let workers = state["workers"].as_array().cloned().unwrap_or_default();
        workers.iter().any(|w| w["id"] == home && w["kv"]["blocks"].as_u64() > Some(0))
    })
    .await;
    for i in 0..4 {
        assert_eq!(served(&http, &router, &format!("{document} Next {i}?")).await, home);
    }
    let hits = picks_by_reason(&http, &router, "cache_hit").await;
    assert!(hits >= 4.0, "matched on the engines' own blocks: {hits}");
    assert_eq!(picks_by_reason(&http, &router, "cache_approximate").await, 0.0);
}
