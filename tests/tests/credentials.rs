//! The three credentials (docs/design/RELIABILITY.md, Security): clients present a client key,
//! the router presents each engine's own key (never the client's), the admin API has its own
//! token. None of them is interchangeable, and none shows up in listings or metrics.

use router_e2e::{Engine, Http, Router, chat_body};

const CLIENT_KEY: &str = "client-key-1";
const ROTATED_CLIENT_KEY: &str = "client-key-2";
const ENGINE_KEY: &str = "engine-key-e1";
const ADMIN_TOKEN: &str = "admin-token";

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

/// One engine that demands `ENGINE_KEY`, behind a router that demands a client key.
fn config(engine: &Engine, worker_key: Option<&str>, server_extra: &str) -> String {
    let key = worker_key.map(|k| format!(", api_key: {k}")).unwrap_or_default();
    format!(
        "server: {{port: 0, admin_token: {ADMIN_TOKEN}{server_extra}}}\nmodels:\n  - id: m\n    workers:\n      \
         - {{id: e1, url: \"{}\"{key}}}\n    buckets:\n      - id: all\n        \
         groups: {{plain: {{policy: {{type: round_robin}}}}}}\n",
        engine.url
    )
}

#[tokio::test]
async fn clients_need_a_client_key_and_engines_get_their_own() {
    let engine = Engine::start("m", &["--api-key", ENGINE_KEY]);
    let router = Router::with_config(&config(
        &engine,
        Some(ENGINE_KEY),
        &format!(", api_keys: [{CLIENT_KEY}, {ROTATED_CLIENT_KEY}]"),
    ));
    let http = Http::default();
    let body = chat_body("m", "hello", 4);

    let missing = http.chat(&router.url, &body, &[]).await;
    assert_eq!(missing.status, 401, "{}", missing.body);
    assert_eq!(missing.json()["error"]["type"], "authentication_error");
    assert!(missing.json()["error"]["message"].as_str().unwrap_or_default().contains("missing"));
    let wrong = http.chat(&router.url, &body, &[("authorization", &bearer("nope"))]).await;
    assert_eq!(wrong.status, 401, "{}", wrong.body);
    // The other credentials are not client keys.
    for other in [ENGINE_KEY, ADMIN_TOKEN] {
        let reply = http.chat(&router.url, &body, &[("authorization", &bearer(other))]).await;
        assert_eq!(reply.status, 401, "{other} opened the client API: {}", reply.body);
    }

    // Either configured key works (rotation); the engine, which demands its own key, answers,
    // so the router sent that key and not the client's.
    for key in [CLIENT_KEY, ROTATED_CLIENT_KEY] {
        let reply = http.chat(&router.url, &body, &[("authorization", &bearer(key))]).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(reply.header("x-router-engine"), Some("e1"));
    }
    let models = http.get(&router.url, "/v1/models", &[]).await;
    assert_eq!(models.status, 401);
    let models =
        http.get(&router.url, "/v1/models", &[("authorization", &bearer(CLIENT_KEY))]).await;
    assert_eq!(models.status, 200, "{}", models.body);

    // Probes and metrics stay open; the admin API takes only its token.
    for path in ["/health", "/readiness", "/metrics"] {
        assert_eq!(http.get(&router.url, path, &[]).await.status, 200, "{path}");
    }
    let admin =
        http.get(&router.url, "/admin/workers", &[("authorization", &bearer(CLIENT_KEY))]).await;
    assert_eq!(admin.status, 401);
    let workers =
        http.get(&router.url, "/admin/workers", &[("authorization", &bearer(ADMIN_TOKEN))]).await;
    assert_eq!(workers.status, 200, "{}", workers.body);

    // No key appears in what the router shows.
    let state =
        http.get(&router.url, "/admin/state", &[("authorization", &bearer(ADMIN_TOKEN))]).await;
    let metrics = http.get(&router.url, "/metrics", &[]).await;
    for shown in [&workers.body, &state.body, &metrics.body] {
        for secret in [CLIENT_KEY, ROTATED_CLIENT_KEY, ENGINE_KEY, ADMIN_TOKEN] {
            assert!(!shown.contains(secret), "{secret} leaked: {shown}");
        }
    }
    // The refusals are counted: no key, a wrong one, the engine's and the admin's, /v1/models.
    let refused = "router_requests_refused_total{reason=\"unauthorized\"} 5";
    assert!(metrics.body.lines().any(|line| line == refused), "{}", metrics.body);
}

#[tokio::test]
async fn a_missing_engine_key_is_a_502_naming_the_router_not_a_401_for_the_client() {
    let engine = Engine::start("m", &["--api-key", ENGINE_KEY]);
    let router = Router::with_config(&config(&engine, None, ""));
    let http = Http::default();
    let reply = http.chat(&router.url, &chat_body("m", "hello", 4), &[]).await;
    assert_eq!(reply.status, 502, "{}", reply.body);
    let message = reply.json()["error"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains("refused the router's credentials"), "{message}");
}

#[tokio::test]
async fn the_default_engine_key_serves_configured_and_admin_added_workers() {
    let first = Engine::start("m", &["--api-key", ENGINE_KEY]);
    let second = Engine::start("m", &["--api-key", ENGINE_KEY]);
    // The client key and the engine key come from the environment this time.
    let router = Router::with_config_and_env(
        &config(&first, None, ""),
        &[("ROUTER_API_KEY", CLIENT_KEY), ("ROUTER_ENGINE_API_KEY", ENGINE_KEY)],
    );
    let http = Http::default();
    let client_key = bearer(CLIENT_KEY);
    let client = [("authorization", client_key.as_str())];
    let reply = http.chat(&router.url, &chat_body("m", "hello", 4), &client).await;
    assert_eq!(reply.status, 200, "{}", reply.body);

    let added = http
        .send(
            "POST",
            &format!("{}/admin/workers", router.url),
            &[("authorization", &bearer(ADMIN_TOKEN)), ("content-type", "application/json")],
            serde_json::json!({"id": "e2", "url": second.url, "model": "m"}).to_string(),
        )
        .await;
    assert_eq!(added.status, 201, "{}", added.body);
    // Round robin over e1 and e2: both answer, so e2 received the default key too.
    let mut engines = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let reply = http.chat(&router.url, &chat_body("m", "hello", 4), &client).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        engines.insert(reply.header("x-router-engine").unwrap_or_default().to_owned());
    }
    assert_eq!(engines.into_iter().collect::<Vec<_>>(), ["e1", "e2"]);
}
