//! Model-wide bindings end to end (`scope: model` on `sticky` and `session_aware`): a
//! conversation that grows past a bucket's input range keeps its engine when that engine is in
//! both buckets, where per-bucket bindings place it afresh; and a bucket whose group lacks the
//! bound engine still picks from its own engines. Assertions are on the engines that served.

use router_e2e::{Engine, Http, Reply, Router};

/// A router serving model `m` from `engines` (ids `e1`, `e2`, ...) in two buckets over the
/// same engines, `short` (up to 200 input tokens) and `long` (the rest), each group running
/// `policy`; `long_members` restricts the long bucket's group.
fn config(engines: &[Engine], policy: &str, long_members: &str) -> String {
    let workers: String = engines
        .iter()
        .enumerate()
        .map(|(i, e)| format!("      - {{id: e{}, url: \"{}\"}}\n", i + 1, e.url))
        .collect();
    format!(
        "server: {{port: 0}}\nmodels:\n  - id: m\n    workers:\n{workers}    buckets:\n      \
         - {{id: short, limits: {{max: 200}}, groups: {{plain: {{worker_ids: [e1, e2], policy: {policy}}}}}}}\n      \
         - {{id: long, limits: {{min: 201}}, groups: {{plain: {{worker_ids: {long_members}, policy: {policy}}}}}}}\n"
    )
}

/// One turn of a conversation: the messages so far (each earlier turn's question and answer)
/// and a new question of `new_bytes` bytes.
fn turn(history: &[String], new_bytes: usize) -> serde_json::Value {
    let mut messages: Vec<serde_json::Value> = history
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            serde_json::json!({"role": role, "content": text})
        })
        .collect();
    messages.push(serde_json::json!({"role": "user", "content": "q".repeat(new_bytes)}));
    serde_json::json!({"model": "m", "messages": messages, "max_tokens": 2})
}

async fn send(http: &Http, router: &Router, body: &serde_json::Value, key: Option<&str>) -> Reply {
    let headers: Vec<(&str, &str)> = key.map(|k| ("x-routing-key", k)).into_iter().collect();
    let reply = http.chat(&router.url, body, &headers).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply
}

/// (bucket, engine) of a reply.
fn served(reply: &Reply) -> (String, String) {
    let header = |name| reply.header(name).unwrap_or_default().to_owned();
    (header("x-router-bucket"), header("x-router-engine"))
}

/// Plays a conversation under sticky routing with a round-robin fallback: one keyless request
/// first (so that the short bucket's rotation gives the conversation `e2`), then a short first
/// turn, a long second turn and a short third one. Returns where each of the three turns went.
async fn conversation(router: &Router) -> Vec<(String, String)> {
    let http = Http::default();
    let keyless = send(&http, router, &turn(&[], 20), None).await;
    assert_eq!(served(&keyless), ("short".to_owned(), "e1".to_owned()), "rotation starts at e1");
    let mut history = Vec::new();
    let mut seen = Vec::new();
    // About 9 tokens, then (with the first turn) past 500, then a short one of its own.
    for (new_bytes, fresh) in [(20, false), (2000, false), (20, true)] {
        let body = if fresh { turn(&[], new_bytes) } else { turn(&history, new_bytes) };
        let reply = send(&http, router, &body, Some("conversation-1")).await;
        seen.push(served(&reply));
        let question = body["messages"].as_array().and_then(|m| m.last()).cloned();
        history.push(
            question.and_then(|q| q["content"].as_str().map(str::to_owned)).unwrap_or_default(),
        );
        history.push("answer".to_owned());
    }
    seen
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(b, e)| ((*b).to_owned(), (*e).to_owned())).collect()
}

#[tokio::test]
async fn a_conversation_crossing_a_bucket_boundary_keeps_its_engine_only_with_model_scope() {
    let engines: Vec<Engine> = (0..3).map(|_| Engine::start("m", &[])).collect();

    // Model scope: the binding made in `short` is used in `long`, whose group has e2 too.
    let model = Router::with_config(&config(&engines, "{type: sticky, scope: model}", "[e1, e2]"));
    assert_eq!(
        conversation(&model).await,
        pairs(&[("short", "e2"), ("long", "e2"), ("short", "e2")]),
        "one engine for the whole conversation"
    );

    // Bucket scope (the default): `long` has no binding for the key and its own rotation
    // places it on e1; back in `short`, that bucket's binding still holds e2.
    let bucket = Router::with_config(&config(&engines, "{type: sticky}", "[e1, e2]"));
    assert_eq!(
        conversation(&bucket).await,
        pairs(&[("short", "e2"), ("long", "e1"), ("short", "e2")]),
        "each bucket places the key itself"
    );

    // Bucket-first still rules: a long bucket without e2 picks from its own engines and the
    // model-wide binding moves there, so the next short turn, where e3 is no candidate, moves
    // it again (to the short bucket's rotation).
    let elsewhere = Router::with_config(&config(&engines, "{type: sticky, scope: model}", "[e3]"));
    assert_eq!(
        conversation(&elsewhere).await,
        pairs(&[("short", "e2"), ("long", "e3"), ("short", "e1")]),
        "the bound engine is used only where it is a candidate"
    );
}

#[tokio::test]
async fn session_aware_with_model_scope_follows_the_session_header_across_buckets() {
    let engines: Vec<Engine> = (0..2).map(|_| Engine::start("m", &[])).collect();
    let router =
        Router::with_config(&config(&engines, "{type: session_aware, scope: model}", "[e1, e2]"));
    let http = Http::default();
    let first = http.chat(&router.url, &turn(&[], 20), &[("x-session-id", "session-1")]).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let (bucket, engine) = served(&first);
    assert_eq!(bucket, "short");
    // Whatever power-of-two chose first, every later turn stays there, long or short.
    for new_bytes in [2000, 20, 4000] {
        let reply =
            http.chat(&router.url, &turn(&[], new_bytes), &[("x-session-id", "session-1")]).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let expected_bucket = if new_bytes > 800 { "long" } else { "short" };
        assert_eq!(
            served(&reply),
            (expected_bucket.to_owned(), engine.clone()),
            "{new_bytes} bytes"
        );
    }
}
