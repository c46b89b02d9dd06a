//! The inference APIs beside chat, end to end through the router to router-sim engines:
//! OpenAI completions and SGLang's `/generate`, whole and streamed, single and batched, plain
//! and PD; token ids a client sends route cache-aware without tokenizing; bad bodies are 400s
//! naming the field.

use router_e2e::{
    ADMIN_TOKEN, Engine, Http, Reply, Router, chat_body, kv_engines, kv_router_yaml, pd_router_yaml,
};
use serde_json::{Value, json};

fn plain_router(engine: &Engine) -> Router {
    Router::with_config(&format!(
        "server: {{port: 0}}\nmodels:\n  - id: m\n    workers:\n      - {{id: e1, url: \"{}\"}}\n    \
         buckets:\n      - id: all\n        groups: {{plain: {{policy: {{type: round_robin}}}}}}\n",
        engine.url
    ))
}

async fn post(http: &Http, router: &Router, path: &str, body: &Value) -> Reply {
    let url = format!("{}{path}", router.url);
    http.send("POST", &url, &[("content-type", "application/json")], body.to_string()).await
}

/// The `data:` payloads of a stream, `[DONE]` last.
fn events(reply: &Reply) -> Vec<String> {
    reply.body.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_owned).collect()
}

#[tokio::test]
async fn completions_in_every_prompt_shape_whole_and_streamed() {
    let engine = Engine::start("m", &[]);
    let router = plain_router(&engine);
    let http = Http::default();
    for (prompt, choices) in [
        (json!("Once upon a time"), 1),
        (json!(["one", "two"]), 2),
        (json!([11, 12, 13]), 1),
        (json!([[11, 12], [13, 14, 15]]), 2),
    ] {
        let body = json!({"model": "m", "prompt": prompt, "max_tokens": 3});
        let reply = post(&http, &router, "/v1/completions", &body).await;
        assert_eq!(reply.status, 200, "{prompt}: {}", reply.body);
        assert_eq!(reply.header("x-router-engine"), Some("e1"));
        let answer = reply.json();
        assert_eq!(answer["object"], "text_completion", "{answer}");
        assert_eq!(answer["choices"].as_array().map(Vec::len), Some(choices), "{answer}");
        assert_eq!(answer["usage"]["completion_tokens"], 3 * choices, "{answer}");
    }
    let body = json!({"model": "m", "prompt": "stream me", "max_tokens": 4, "stream": true});
    let reply = post(&http, &router, "/v1/completions", &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let events = events(&reply);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{}", reply.body);
    let first: Value = serde_json::from_str(&events[0]).expect("json event");
    assert_eq!(first["object"], "text_completion", "{first}");
}

#[tokio::test]
async fn generate_with_text_ids_batches_and_streams() {
    let engine = Engine::start("m", &[]);
    let router = plain_router(&engine);
    let http = Http::default();
    let params = json!({"max_new_tokens": 3});
    let reply =
        post(&http, &router, "/generate", &json!({"text": "hello", "sampling_params": params}))
            .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let answer = reply.json();
    assert_eq!(answer["meta_info"]["completion_tokens"], 3, "{answer}");
    assert!(answer["text"].is_string(), "{answer}");

    let body = json!({"input_ids": [[1, 2, 3], [4, 5]], "sampling_params": params});
    let reply = post(&http, &router, "/generate", &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let answers = reply.json();
    let answers = answers.as_array().expect("one answer per prompt");
    let prompt_tokens: Vec<_> =
        answers.iter().map(|a| a["meta_info"]["prompt_tokens"].clone()).collect();
    assert_eq!(prompt_tokens, [json!(3), json!(2)]);

    let body = json!({"text": "stream", "sampling_params": params, "stream": true});
    let reply = post(&http, &router, "/generate", &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let events = events(&reply);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{}", reply.body);
    let last: Value = serde_json::from_str(&events[events.len() - 2]).expect("json event");
    assert_eq!(last["meta_info"]["completion_tokens"], 3, "{last}");
}

#[tokio::test]
async fn bad_bodies_are_400s_naming_the_field() {
    let engine = Engine::start("m", &[]);
    let router = plain_router(&engine);
    let http = Http::default();
    for (path, body, param) in [
        ("/v1/completions", json!({"model": "m", "prompt": ["a", 1]}), "prompt"),
        ("/v1/completions", json!({"model": "m", "prompt": []}), "prompt"),
        ("/v1/completions", json!({"prompt": "x", "model": 5}), "model"),
        ("/generate", json!({"text": "a", "input_ids": [1]}), "text"),
        ("/generate", json!({"input_ids": []}), "input_ids"),
        (
            "/generate",
            json!({"text": "a", "sampling_params": {"max_new_tokens": -1}}),
            "sampling_params.max_new_tokens",
        ),
    ] {
        let reply = post(&http, &router, path, &body).await;
        assert_eq!(reply.status, 400, "{path} {body}: {}", reply.body);
        assert_eq!(reply.json()["error"]["param"], param, "{path} {body}: {}", reply.body);
    }
}

#[tokio::test]
async fn pd_pairs_serve_completions_and_generate_batches() {
    let p = Engine::start("m", &["--role", "prefill", "--bootstrap-port", "0"]);
    let d = Engine::start("m", &["--role", "decode"]);
    let router = Router::with_config(&pd_router_yaml(&p, &d, "", "round_robin"));
    let http = Http::default();
    let cases = [
        ("/v1/completions", json!({"model": "m", "prompt": "pd please", "max_tokens": 2})),
        (
            "/v1/completions",
            json!({"model": "m", "prompt": "pd stream", "max_tokens": 2, "stream": true}),
        ),
        ("/generate", json!({"text": ["one", "two"], "sampling_params": {"max_new_tokens": 2}})),
        (
            "/generate",
            json!({"input_ids": [7, 8, 9], "sampling_params": {"max_new_tokens": 2}, "stream": true}),
        ),
    ];
    for (path, body) in cases {
        let reply = post(&http, &router, path, &body).await;
        assert_eq!(reply.status, 200, "{path} {body}: {}", reply.body);
        assert_eq!(reply.header("x-router-prefill-engine"), Some("P1"));
        assert_eq!(reply.header("x-router-decode-engine"), Some("D1"));
        assert!(!reply.body.contains("\"error\""), "{path} {body}: {}", reply.body);
    }
}

#[tokio::test]
async fn token_ids_route_to_the_engine_holding_their_prefix() {
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let fleet = kv_engines(3, &tokenizer, &[]);
    let policy = "{type: cache_aware, cache_affinity_min_matched_tokens: 64}";
    let router = Router::with_config(&kv_router_yaml(&fleet, &tokenizer, policy));
    let http = Http::default();
    router.wait_until_ready(&http, ADMIN_TOKEN).await;
    let prefix: Vec<u32> = (0..600).map(|i| 10 + i % 200).collect();
    let mut engines = Vec::new();
    for tail in 0..4u32 {
        let mut ids = prefix.clone();
        ids.push(250 - tail);
        let body = json!({"input_ids": ids, "sampling_params": {"max_new_tokens": 1}});
        let reply = post(&http, &router, "/generate", &body).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        if tail > 0 {
            let cached = reply.json()["meta_info"]["cached_tokens"].as_u64().unwrap_or(0);
            assert!(cached >= 512, "the shared ids were served from cache: {}", reply.body);
        }
        engines.push(reply.header("x-router-engine").expect("engine").to_owned());
    }
    assert!(engines.iter().all(|e| *e == engines[0]), "one engine for one prefix: {engines:?}");
}

#[tokio::test]
async fn the_model_list_carries_the_engines_card() {
    let engine = Engine::start("m", &["--kv-capacity-tokens", "32768"]);
    let router = plain_router(&engine);
    let http = Http::default();
    let mut listed = Value::Null;
    router_test_support::eventually("the engine's card on /v1/models", async || {
        listed = http.get(&router.url, "/v1/models", &[]).await.json();
        listed["data"][0]["max_model_len"].is_u64()
    })
    .await;
    let card = &listed["data"][0];
    assert_eq!(card["id"], "m", "{listed}");
    assert_eq!(card["root"], "m", "{listed}");
    assert_eq!(card["max_model_len"], 32768, "{listed}");
    assert_eq!(card["owned_by"], "router-sim", "{listed}");
    let one = http.get(&router.url, "/v1/models/m", &[]).await;
    assert_eq!(one.status, 200);
    assert_eq!(one.json(), *card);
    let missing = http.get(&router.url, "/v1/models/other", &[]).await;
    assert_eq!(missing.status, 404, "{}", missing.body);
}

#[tokio::test]
async fn a_quick_start_lists_the_models_its_engines_serve() {
    let engine = Engine::start("llama", &[]);
    let args = ["--worker-urls", &engine.url, "--port", "0"].map(str::to_owned);
    let router = Router::with_args(&args);
    let http = Http::default();
    // It serves any name (`*`), and lists the ones its engines list.
    router_test_support::eventually("the engine's model on /v1/models", async || {
        let listed = http.get(&router.url, "/v1/models", &[]).await.json();
        listed["data"][0]["id"] == "llama"
    })
    .await;
    let listed = http.get(&router.url, "/v1/models", &[]).await.json();
    assert_eq!(listed["data"].as_array().map(Vec::len), Some(1), "no `*` listed: {listed}");
    let one = http.get(&router.url, "/v1/models/llama", &[]).await;
    assert_eq!(one.status, 200, "{}", one.body);
    assert_eq!(one.json()["id"], "llama");
    let missing = http.get(&router.url, "/v1/models/other", &[]).await;
    assert_eq!(missing.status, 404, "{}", missing.body);
    let chat = http.chat(&router.url, &chat_body("llama", "hi", 1), &[]).await;
    assert_eq!(chat.status, 200, "{}", chat.body);
}

#[tokio::test]
async fn fleet_information_loads_and_a_fanned_out_cache_flush() {
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let fleet = kv_engines(2, &tokenizer, &[]);
    let policy = "{type: cache_aware, cache_affinity_min_matched_tokens: 64}";
    let router = Router::with_config(&kv_router_yaml(&fleet, &tokenizer, policy));
    let http = Http::default();
    router.wait_until_ready(&http, ADMIN_TOKEN).await;

    for path in ["/get_server_info", "/get_model_info"] {
        let reply = http.get(&router.url, path, &[]).await;
        assert_eq!(reply.status, 200, "{path}: {}", reply.body);
        assert!(reply.json().is_object(), "{path}: {}", reply.body);
        assert!(reply.header("x-router-engine").is_some(), "{path}");
    }
    let other = http.get(&router.url, "/get_server_info?model=other", &[]).await;
    assert_eq!(other.status, 404, "{}", other.body);

    let loads = http.get(&router.url, "/get_loads", &[]).await.json();
    let workers = loads["workers"].as_array().expect("sglang-router's shape");
    assert_eq!(workers.len(), 2, "{loads}");
    for (worker, engine) in workers.iter().zip(&fleet) {
        assert_eq!(worker["worker"], engine.url.as_str(), "{loads}");
        assert_eq!(worker["load"], 0, "a fresh report of an idle engine: {loads}");
    }

    let ids: Vec<u32> = (0..400).map(|i| 20 + i % 100).collect();
    let body = json!({"input_ids": ids, "sampling_params": {"max_new_tokens": 1}});
    let reply = post(&http, &router, "/generate", &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let home = reply.header("x-router-engine").expect("engine").to_owned();
    router_test_support::eventually("the prompt's blocks in the index", async || {
        router_e2e::kv_blocks(&http, &router, ADMIN_TOKEN, &home).await > 0
    })
    .await;

    let url = format!("{}/flush_cache", router.url);
    let refused = http.send("POST", &url, &[], "").await;
    assert_eq!(refused.status, 401, "flushing needs the admin token: {}", refused.body);
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let flushed = http.send("POST", &url, &[("authorization", &bearer)], "").await;
    assert_eq!(flushed.status, 200, "{}", flushed.body);
    assert_eq!(flushed.json()["flushed"], json!(["e1", "e2"]), "{}", flushed.body);
    assert_eq!(router_e2e::kv_blocks(&http, &router, ADMIN_TOKEN, &home).await, 0);
    let again = post(&http, &router, "/generate", &body).await;
    assert_eq!(again.json()["meta_info"]["cached_tokens"], 0, "the engine's cache is empty");
}

#[tokio::test]
async fn the_rest_of_the_openai_surface_passes_through_to_an_engine_of_the_model() {
    let engine = Engine::start("m", &[]);
    let router = plain_router(&engine);
    let http = Http::default();
    let reply = post(&http, &router, "/v1/tokenize", &json!({"model": "m", "prompt": "hi"})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("x-router-engine"), Some("e1"));
    let tokens = reply.json()["tokens"].clone();
    assert!(tokens.as_array().is_some_and(|t| !t.is_empty()), "{}", reply.body);
    // No model named: the router's only one.
    let reply = post(&http, &router, "/v1/detokenize", &json!({"tokens": tokens})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.json()["prompt"], "hi", "{}", reply.body);
    // An engine without the API answers for itself: its 404 passes through, from the engine.
    let reply = post(&http, &router, "/v1/embeddings", &json!({"model": "m", "input": "x"})).await;
    assert_eq!(reply.status, 404, "{}", reply.body);
    assert_eq!(reply.header("x-router-engine"), Some("e1"), "the engine's own answer");
    let reply = post(&http, &router, "/v1/score", &json!({"model": "other"})).await;
    assert_eq!(reply.status, 404, "{}", reply.body);
    assert_eq!(reply.json()["error"]["code"], "model_not_found", "{}", reply.body);
    let reply = http.get(&router.url, "/v1/unknown", &[]).await;
    assert_eq!(reply.status, 404, "other paths stay 404");
}
