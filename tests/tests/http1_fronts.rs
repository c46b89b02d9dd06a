//! Both client fronts, `server.http1: own` (the router's own HTTP/1.1 loop, router-http1) and
//! `hyper`, answer every inference endpoint alike, whole and streamed, on one router-sim engine:
//! the same status, engine, content type, body framing and answer shape. (`cargo xtask ci` also
//! runs the front end's hostile-input and slow-client tests under `hyper`.)

use router_e2e::{Engine, Http, Reply, Router};
use serde_json::{Value, json};

fn router(engine: &Engine, front: &str) -> Router {
    Router::with_config(&format!(
        "server: {{port: 0, http1: {front}}}\nmodels:\n  - id: m\n    workers:\n      - {{id: e1, url: \"{}\"}}\n    \
         buckets:\n      - id: all\n        groups: {{plain: {{policy: {{type: round_robin}}}}}}\n",
        engine.url
    ))
}

/// What must match between the fronts: status, engine, content type, framing, and the answer's
/// shape (its `object` and choice count, or the stream's event count and last event).
fn shape(reply: &Reply) -> Value {
    let events: Vec<&str> = reply.body.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    let answer = if events.is_empty() {
        let body: Value = serde_json::from_str(&reply.body).unwrap_or(Value::Null);
        json!({"object": body["object"], "choices": body["choices"].as_array().map(Vec::len),
               "error": body["error"]["type"], "text": body["text"].is_string()})
    } else {
        json!({"events": events.len(), "last": events.last()})
    };
    json!({
        "status": reply.status,
        "engine": reply.header("x-router-engine"),
        "content-type": reply.header("content-type"),
        "chunked": reply.header("transfer-encoding"),
        "length": reply.header("content-length").is_some(),
        "answer": answer,
    })
}

#[tokio::test]
async fn both_fronts_answer_every_endpoint_alike_whole_and_streamed() {
    let engine = Engine::start("m", &[]);
    let (own, hyper) = (router(&engine, "own"), router(&engine, "hyper"));
    let http = Http::default();
    let chat =
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
    let completion = json!({"model": "m", "prompt": "Once upon a time", "max_tokens": 3});
    let generate =
        json!({"model": "m", "text": "Once upon a time", "sampling_params": {"max_new_tokens": 3}});
    let streamed = |body: &Value| {
        let mut body = body.clone();
        body["stream"] = json!(true);
        body
    };
    let requests = [
        ("/v1/chat/completions", chat.clone()),
        ("/v1/chat/completions", streamed(&chat)),
        ("/v1/completions", completion.clone()),
        ("/v1/completions", streamed(&completion)),
        ("/generate", generate.clone()),
        ("/generate", streamed(&generate)),
        // router-sim serves none of these: the engine's refusal comes back alike.
        ("/v1/embeddings", json!({"model": "m", "input": "x"})),
        ("/v1/rerank", json!({"model": "m", "query": "q", "documents": ["a"]})),
        ("/v1/score", json!({"model": "m", "text_1": "a", "text_2": "b"})),
        // A body the router refuses: the same error from either front.
        ("/v1/chat/completions", json!({"model": "m", "messages": "not a list"})),
    ];
    for (path, body) in requests {
        let mut shapes = Vec::new();
        for router in [&own, &hyper] {
            let url = format!("{}{path}", router.url);
            let headers = [("content-type", "application/json")];
            shapes.push(shape(&http.send("POST", &url, &headers, body.to_string()).await));
        }
        assert_eq!(shapes[0], shapes[1], "{path} {body}: own, then hyper");
        let status = shapes[0]["status"].as_u64();
        assert!(status.is_some_and(|s| s < 500), "{path} {body}: {}", shapes[0]);
    }
}
