//! Data-parallel ranks end to end: a router-sim engine with `--dp-size 2` (two caches and
//! queues behind one address, publishing KV events per rank, balancing unnamed requests over
//! its ranks in turn) behind a router that chooses the rank (`dp_route: body` for SGLang's
//! `data_parallel_rank` field, `header` for vLLM's `X-data-parallel-rank`), for every inference
//! endpoint, plain and PD; a client's own rank honoured only when allowed and only when the
//! engine has it.

use router_e2e::{
    ADMIN_TOKEN, Engine, Http, Reply, Router, chat_body, kv_blocks, kv_engines, pd_router_yaml,
};
use router_test_support::eventually;
use serde_json::{Value, json};

fn tokenizer() -> String {
    router_sim::assets::tokenizer_path().display().to_string()
}

/// One dp_size-2 engine publishing KV events and load reports.
fn dp_engine() -> Engine {
    kv_engines(1, &tokenizer(), &["--dp-size", "2"]).remove(0)
}

/// A router over `engine` as worker `e1` with `dp_size: 2` and `dp_route` (none when empty),
/// cache-aware, with `server` fields added.
fn router(engine: &Engine, dp_route: &str, server: &str) -> Router {
    let route = if dp_route.is_empty() { String::new() } else { format!(", dp_route: {dp_route}") };
    Router::with_config(&format!(
        "server: {{port: 0, admin_token: {ADMIN_TOKEN}{server}}}\nload: {{report_interval_ms: 50}}\n\
         models:\n  - id: m\n    tokenizer: \"{}\"\n    workers:\n      \
         - {{id: e1, url: \"{}\", dp_size: 2{route}, load_reporter: \"{}\", kv_events: {{endpoint: \"{}\"}}}}\n    \
         buckets:\n      - id: all\n        groups: {{plain: {{policy: {{type: cache_aware, \
         cache_affinity_min_matched_tokens: 64}}}}}}\n",
        tokenizer(),
        engine.url,
        engine.process.url_after("load reporter on "),
        engine.kv_events(),
    ))
}

fn cached_tokens(reply: &Reply) -> u64 {
    reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0)
}

fn rank(reply: &Reply) -> Option<u32> {
    reply.header("x-router-rank").and_then(|r| r.parse().ok())
}

async fn post(
    http: &Http,
    router: &Router,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> Reply {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    http.send("POST", &format!("{}{path}", router.url), &all, body.to_string()).await
}

/// Waits until the engine's load reports say every rank is idle. A report taken while the last
/// request still queued makes its rank look busy until the next report (the choice reads the
/// last report, as an engine's does); a conversation's next turn comes seconds later, when the
/// reports are current, and this waits for that.
async fn idle_report(http: &Http, router: &Router) {
    eventually("a load report of idle ranks", async || {
        let loads = http.get(&router.url, "/get_loads", &[]).await.json();
        let entries = loads["workers"].as_array().cloned().unwrap_or_default();
        !entries.is_empty() && entries.iter().all(|e| e["load"] == 0)
    })
    .await;
}

/// A first request with a long prefix, then (once its blocks are indexed) six follow-ups
/// sharing it: the rank of each and the prompt tokens each found cached.
async fn follow_ups(router: &Router) -> (Option<u32>, Vec<(Option<u32>, u64)>) {
    let http = Http::default();
    router.wait_until_ready(&http, ADMIN_TOKEN).await;
    let prefix = "You are a careful assistant. Here is a long shared document. ".repeat(40);
    let first =
        http.chat(&router.url, &chat_body("m", &format!("{prefix} Question zero?"), 1), &[]).await;
    assert_eq!(first.status, 200, "{}", first.body);
    eventually("the first request's blocks in the index", async || {
        kv_blocks(&http, router, ADMIN_TOKEN, "e1").await > 0
    })
    .await;
    let mut served = Vec::new();
    for i in 1..=6 {
        idle_report(&http, router).await;
        let body = chat_body("m", &format!("{prefix} Question {i}?"), 1);
        let reply = http.chat(&router.url, &body, &[]).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        served.push((rank(&reply), cached_tokens(&reply)));
    }
    (rank(&first), served)
}

#[tokio::test]
async fn the_router_keeps_a_prefix_on_the_rank_that_holds_it() {
    for route in ["header", "body"] {
        let engine = dp_engine();
        let router = router(&engine, route, "");
        let (home, served) = follow_ups(&router).await;
        let home = home.expect("the router named the first request's rank");
        assert!(home < 2, "{route}: rank {home}");
        for (rank, cached) in &served {
            assert_eq!(
                *rank,
                Some(home),
                "{route}: every follow-up goes to the prefix's rank: {served:?}"
            );
            assert!(*cached > 500, "{route}: the engine served it on that rank, from cache");
        }
    }
}

#[tokio::test]
async fn without_dp_route_the_engines_own_balancer_scatters_the_prefix() {
    let engine = dp_engine();
    let router = router(&engine, "", "");
    let (home, served) = follow_ups(&router).await;
    assert_eq!(home, None, "no rank is named");
    assert!(served.iter().all(|(rank, _)| rank.is_none()));
    // The engine's turn-taking sends the first follow-up to the rank without the prefix.
    let misses = served.iter().filter(|(_, cached)| *cached == 0).count();
    assert!(misses >= 1, "the engine put a follow-up on the other rank: {served:?}");
}

#[tokio::test]
async fn every_endpoint_streamed_or_not_is_served_on_a_chosen_rank() {
    let engine = dp_engine();
    let router = router(&engine, "body", "");
    let http = Http::default();
    router.wait_until_ready(&http, ADMIN_TOKEN).await;
    for stream in [false, true] {
        let requests = [
            ("/v1/chat/completions", chat_body("m", "hello there", 3)),
            (
                "/v1/completions",
                json!({"model": "m", "prompt": "Once upon a time", "max_tokens": 3}),
            ),
            (
                "/generate",
                json!({"text": "Once upon a time", "sampling_params": {"max_new_tokens": 3}}),
            ),
            (
                "/generate",
                json!({"input_ids": [[11, 12, 13], [14, 15]], "sampling_params": {"max_new_tokens": 2}}),
            ),
        ];
        for (path, mut body) in requests {
            body["stream"] = json!(stream);
            let reply = post(&http, &router, path, &body, &[]).await;
            assert_eq!(reply.status, 200, "{path} stream={stream}: {}", reply.body);
            assert!(rank(&reply).is_some_and(|r| r < 2), "{path}: {:?}", reply.headers);
            if stream {
                assert!(reply.body.trim_end().ends_with("data: [DONE]"), "{path}: {}", reply.body);
            }
        }
    }
    // /get_loads lists the engine once per rank, as sglang-router lists dp-aware workers.
    let loads = http.get(&router.url, "/get_loads", &[]).await.json();
    let workers: Vec<&str> = loads["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .filter_map(|w| w["worker"].as_str())
        .collect();
    assert_eq!(workers, [format!("{}@0", engine.url), format!("{}@1", engine.url)], "{loads}");
}

#[tokio::test]
async fn a_clients_rank_is_checked_and_overrides_only_when_allowed() {
    let engine = dp_engine();
    let http = Http::default();
    let prompt = "A prompt of its own, long enough to be cached in a few blocks. ".repeat(12);

    let strict = router(&engine, "body", "");
    strict.wait_until_ready(&http, ADMIN_TOKEN).await;
    for (body_rank, header) in
        [(Some(5), None), (None, Some("7")), (None, Some("one")), (Some(0), Some("1"))]
    {
        let mut body = chat_body("m", "hi", 1);
        if let Some(rank) = body_rank {
            body["data_parallel_rank"] = json!(rank);
        }
        let headers: Vec<(&str, &str)> =
            header.map(|h| vec![("x-data-parallel-rank", h)]).unwrap_or_default();
        let reply = post(&http, &strict, "/v1/chat/completions", &body, &headers).await;
        assert_eq!(reply.status, 400, "{body_rank:?} {header:?}: {}", reply.body);
        let param = reply.json()["error"]["param"].as_str().unwrap_or_default().to_owned();
        assert!(
            param.contains("data_parallel_rank") || param.contains("data-parallel-rank"),
            "{}",
            reply.body
        );
    }
    let mut body = chat_body("m", "Something else entirely, for the strict router.", 1);
    body["data_parallel_rank"] = json!(1);
    let reply = post(&http, &strict, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(rank(&reply), Some(0), "without allow_client_dp_rank the router chooses");
    drop(strict);

    let open = router(&engine, "header", ", allow_client_dp_rank: true");
    open.wait_until_ready(&http, ADMIN_TOKEN).await;
    let body = chat_body("m", &prompt, 1);
    let on_rank = async |asked: &str| {
        post(&http, &open, "/v1/chat/completions", &body, &[("x-data-parallel-rank", asked)]).await
    };
    let first = on_rank("1").await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(rank(&first), Some(1), "the client's rank, as allowed");
    eventually("rank 1's blocks reach the index", async || {
        kv_blocks(&http, &open, ADMIN_TOKEN, "e1").await > 0
    })
    .await;
    let again = on_rank("1").await;
    assert_eq!(rank(&again), Some(1));
    assert!(cached_tokens(&again) > 100, "rank 1 holds it: {}", again.body);
    let elsewhere = on_rank("0").await;
    assert_eq!(rank(&elsewhere), Some(0));
    // Rank 0 holds at most the chat template's opening block, from the strict router's request.
    assert!(cached_tokens(&elsewhere) < 64, "rank 0 does not hold it: {}", elsewhere.body);
}

#[tokio::test]
async fn a_pd_pair_of_data_parallel_engines_gets_a_rank_each() {
    let tokenizer = tokenizer();
    let prefill = Engine::start(
        "m",
        &[
            "--role",
            "prefill",
            "--bootstrap-port",
            "0",
            "--dp-size",
            "2",
            "--tokenizer",
            &tokenizer,
        ],
    );
    let decode =
        Engine::start("m", &["--role", "decode", "--dp-size", "2", "--tokenizer", &tokenizer]);
    let yaml = pd_router_yaml(&prefill, &decode, "", "round_robin")
        .replace("role: prefill,", "role: prefill, dp_size: 2, dp_route: body,")
        .replace("role: decode}", "role: decode, dp_size: 2, dp_route: header}");
    let router = Router::with_config(&yaml);
    let http = Http::default();
    for stream in [false, true] {
        for (path, mut body) in [
            ("/v1/chat/completions", chat_body("m", "a pair", 3)),
            (
                "/generate",
                json!({"text": ["one", "two"], "sampling_params": {"max_new_tokens": 2}}),
            ),
        ] {
            body["stream"] = json!(stream);
            let reply = post(&http, &router, path, &body, &[]).await;
            assert_eq!(reply.status, 200, "{path} stream={stream}: {}", reply.body);
            for header in ["x-router-prefill-rank", "x-router-decode-rank"] {
                let rank: Option<u32> = reply.header(header).and_then(|r| r.parse().ok());
                assert!(rank.is_some_and(|r| r < 2), "{path} {header}: {:?}", reply.headers);
            }
        }
    }
}
