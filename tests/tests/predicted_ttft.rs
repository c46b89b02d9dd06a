//! Predicted-TTFT selection end to end on router-sim fleets: a burst of siblings sharing a new
//! prefix stays on the engine the first one went to (predicted entries, before any KV event)
//! until the queue it builds there makes another engine faster; and a streamed pick reports its
//! prediction beside the observed time to first token. The load comparison against round robin
//! is `predicted_ttft_under_load.rs`, a binary of its own so that nothing runs beside it.

use std::time::{Duration, Instant};

use router_e2e::{
    ADMIN_TOKEN, Http, Router, chat_body, engine_running, kv_engines, kv_router_yaml, picks,
    worker_state,
};
use router_test_support::eventually;

#[tokio::test]
async fn a_burst_of_siblings_stays_on_one_engine_until_its_queue_makes_another_faster() {
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    // Slow prefill: the first sibling's prefill outlasts the whole burst, so no KV event can
    // tell the router where the prefix is going before the burst is placed.
    let fleet = kv_engines(4, &tokenizer, &["--prefill-tokens-per-sec", "4000"]);
    let policy = "{type: predicted_ttft, default_prefill_tokens_per_sec: 4000}";
    let router = Router::with_config(&kv_router_yaml(&fleet, &tokenizer, policy));
    let http = Http::default();
    router.wait_until_ready(&http, ADMIN_TOKEN).await;

    let prefix = "You are a careful assistant. Here is a long shared document to read. ".repeat(24);
    let send = |i: usize| {
        let (http, url, body) = (
            http.clone(),
            router.url.clone(),
            chat_body("m", &format!("{prefix} Question {i}: what does part {i} say?"), 1),
        );
        tokio::spawn(async move {
            let reply = http.chat(&url, &body, &[]).await;
            assert_eq!(reply.status, 200, "{}", reply.body);
            let prompt = reply.json()["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
            (reply.header("x-router-engine").expect("engine").to_owned(), prompt)
        })
    };
    let first = send(0);
    // Let a load report show the first sibling in its prefill (no longer waiting): the engine
    // runs it, then a report received after that reaches the router.
    let mut engine = 0;
    eventually("the first sibling in its prefill", async || {
        for (n, e) in fleet.iter().enumerate() {
            if engine_running(&http, e).await == 1 {
                engine = n;
                return true;
            }
        }
        false
    })
    .await;
    let running_since = Instant::now();
    let id = format!("e{}", engine + 1);
    eventually("a load report from after its prefill started", async || {
        let state = router.admin_state(&http, ADMIN_TOKEN).await;
        let age = worker_state(&state, &id)["load"]["age_ms"].as_u64();
        age.is_some_and(|age| Duration::from_millis(age) < running_since.elapsed())
    })
    .await;
    // The siblings follow one another: each is placed before the next is sent.
    let mut rest = Vec::new();
    for i in 1..=14 {
        rest.push(send(i));
        eventually("the sibling placed", async || picks(&http, &router).await > i as f64).await;
    }
    let (home, prompt) = first.await.expect("first");
    assert!(prompt > 400, "a long shared prefix: {prompt} prompt tokens");
    let mut served = Vec::new();
    for task in rest {
        served.push(task.await.expect("sibling").0);
    }
    assert!(
        served[..3].iter().all(|e| *e == home),
        "the first siblings follow the prefix to {home} before any KV event: {served:?}"
    );
    assert!(
        served.iter().any(|e| *e != home),
        "once its queue is longer than a recompute elsewhere, the prefix spreads: {served:?}"
    );
    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    assert!(
        metrics.lines().any(|l| l.starts_with("router_picks_total")
            && l.contains("policy=\"predicted_ttft\"")
            && l.contains("reason=\"predicted_ttft\"")),
        "picks counted with their reason: {metrics}"
    );
}

#[tokio::test]
async fn a_streamed_pick_reports_predicted_against_observed_ttft() {
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let fleet = kv_engines(2, &tokenizer, &[]);
    let router = Router::with_config(&kv_router_yaml(&fleet, &tokenizer, "{type: predicted_ttft}"));
    let http = Http::default();
    router.wait_until_ready(&http, ADMIN_TOKEN).await;
    let mut body = chat_body("m", "Tell me a story about a lighthouse keeper.", 4);
    body["stream"] = true.into();
    let reply = http.chat(&router.url, &body, &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply.body.contains("data: [DONE]"), "{}", reply.body);
    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    for name in [
        "router_predicted_ttft_seconds_count",
        "router_observed_ttft_seconds_count",
        "router_ttft_observed_over_predicted_ratio_count",
    ] {
        assert!(
            metrics.lines().any(|l| l.starts_with(name) && l.ends_with(" 1")),
            "{name} once: {metrics}"
        );
    }
}

/// No engine reports a prefill rate (`--no-prefill-counters`, as vLLM and SGLang): the router
/// learns each one's from the first tokens it observes, and the two engines' rates, ten times
/// apart, come out near what they are.
#[tokio::test]
async fn each_engines_prefill_rate_is_learned_from_what_the_router_observes() {
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let slow =
        kv_engines(1, &tokenizer, &["--prefill-tokens-per-sec", "4000", "--no-prefill-counters"]);
    let fast =
        kv_engines(1, &tokenizer, &["--prefill-tokens-per-sec", "40000", "--no-prefill-counters"]);
    let fleet: Vec<_> = slow.into_iter().chain(fast).collect();
    let router = Router::with_config(&kv_router_yaml(&fleet, &tokenizer, "{type: predicted_ttft}"));
    let http = Http::default();
    router.wait_until_ready(&http, ADMIN_TOKEN).await;

    let rates = async || {
        let state = router.admin_state(&http, ADMIN_TOKEN).await;
        ["e1", "e2"].map(|id| worker_state(&state, id)["learned_prefill_tokens_per_sec"].as_f64())
    };
    // Prompts of many lengths, one at a time, until both engines have taught their rate; each
    // reported load is fresh, so the picks are on reports, not the router-local fallback.
    for i in 0..200 {
        if let [Some(_), Some(_)] = rates().await {
            break;
        }
        let text = format!("{i} ").repeat(100 + (i * 337) % 1400);
        let reply = http.chat(&router.url, &chat_body("m", &text, 1), &[]).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let [Some(slow), Some(fast)] = rates().await else {
        panic!("no rate learned for both engines: {:?}", rates().await)
    };
    assert!((3_000.0..5_000.0).contains(&slow), "the 4000 tokens/s engine learned as {slow}");
    assert!((25_000.0..60_000.0).contains(&fast), "the 40000 tokens/s engine learned as {fast}");
    let reported =
        "router_picks_total{policy=\"predicted_ttft\",stage=\"plain\",reason=\"predicted_ttft\"}";
    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    assert!(metrics.lines().any(|l| l.starts_with(reported)), "{metrics}");
}
