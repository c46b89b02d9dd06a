//! The endpoint picker end to end: a real Envoy 1.40 (installed by `.ci/run`; these tests fail,
//! never skip, without it) asks `router-server epp` processes over ext_proc and forwards to
//! router-sim engines. Envoy's own `x-upstream-host` response header (its
//! `%UPSTREAM_REMOTE_ADDRESS%`) says where a request really went; the picker's
//! `x-router-engine` says what it chose.

use std::time::Duration;

use router_e2e::envoy::Envoy;
use router_e2e::tempfile_path::TempPath;
use router_e2e::{
    ADMIN_TOKEN, Engine, Http, Process, Reply, chat_body, kv_engines, kv_workers_yaml,
};
use router_test_support::{eventually, poll_until as eventually_bool};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A `router-server epp` process.
struct Picker {
    process: Process,
    /// gRPC `HOST:PORT`.
    grpc: String,
    /// `http://HOST:PORT` of its operations port.
    admin: String,
    _config: TempPath,
}

impl Picker {
    fn start(yaml: &str) -> Self {
        let config = TempPath::write("epp.yaml", yaml);
        let args = ["epp", "--config", &config.display(), "--grpc-port", "0"].map(str::to_owned);
        let process = Process::spawn("router-server", &args, "epp listening on ");
        let grpc = process.url_after("epp listening on ");
        let admin = process.url_after("epp admin on ");
        Self { process, grpc, admin, _config: config }
    }

    async fn state(&self, http: &Http) -> serde_json::Value {
        let bearer = format!("Bearer {ADMIN_TOKEN}");
        let reply = http.get(&self.admin, "/admin/state", &[("authorization", &bearer)]).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        reply.json()
    }

    /// Router-local in-flight requests over every engine.
    async fn inflight(&self, http: &Http) -> u64 {
        let state = self.state(http).await;
        let workers = state["workers"].as_array().cloned().unwrap_or_default();
        workers.iter().filter_map(|w| w["inflight"].as_u64()).sum()
    }

    async fn ready(&self, http: &Http) {
        eventually("every load reporter heard and KV subscription connected", async || {
            let state = self.state(http).await;
            state["workers"].as_array().is_some_and(|workers| {
                workers.iter().all(|w| {
                    (w["kv_events"].is_null() || w["kv"]["subscribed"] == true)
                        && (w["load_reporter"].is_null() || w["load"]["freshness"] == "fresh")
                })
            })
        })
        .await;
    }
}

fn picker_yaml(engines: &[Engine], tokenizer: &str, policy: &str) -> String {
    let workers = kv_workers_yaml(engines);
    format!(
        "server: {{port: 0, admin_token: {ADMIN_TOKEN}}}\nload: {{report_interval_ms: 50}}\nmodels:\n  - id: m\n    tokenizer: \"{tokenizer}\"\n    workers:\n{workers}    buckets:\n      \
         - id: all\n        groups: {{plain: {{policy: {policy}}}}}\n"
    )
}

/// `host:port` of an engine's URL.
fn host_port(engine: &Engine) -> &str {
    engine.url.trim_start_matches("http://")
}

/// POSTs a chat body through Envoy.
async fn chat(http: &Http, envoy: &Envoy, body: &serde_json::Value) -> Reply {
    let url = format!("{}/v1/chat/completions", envoy.url);
    http.send("POST", &url, &[("content-type", "application/json")], body.to_string()).await
}

/// The engine a reply went to, by Envoy's account, checked against the picker's own.
fn served_by<'e>(reply: &Reply, engines: &'e [Engine]) -> &'e str {
    let upstream = reply.header("x-upstream-host").expect("Envoy names the upstream");
    let picked = reply.header("x-router-engine").expect("the picker names its pick");
    let index = engines
        .iter()
        .position(|e| host_port(e) == upstream)
        .unwrap_or_else(|| panic!("upstream {upstream} is none of the engines"));
    let id = ["e1", "e2", "e3"][index];
    assert_eq!(picked, id, "Envoy went where the picker chose");
    id
}

#[tokio::test]
async fn envoy_routes_through_the_picker_to_the_engine_it_chose() {
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let engines = kv_engines(
        2,
        &tokenizer,
        &["--decode-tokens-per-sec", "50", "--kv-capacity-tokens", "600000"],
    );
    let picker = Picker::start(&picker_yaml(
        &engines,
        &tokenizer,
        "{type: cache_aware, cache_affinity_min_matched_tokens: 64}",
    ));
    let http = Http::default();
    picker.ready(&http).await;
    let envoy = Envoy::start(std::slice::from_ref(&picker.grpc), false).await;
    eventually("Envoy serving through the picker", async || {
        chat(&http, &envoy, &chat_body("m", "hello", 1)).await.status == 200
    })
    .await;

    // A chat answer.
    let reply = chat(&http, &envoy, &chat_body("m", "what is a router?", 3)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.json()["object"], "chat.completion", "{}", reply.body);
    served_by(&reply, &engines);
    assert_eq!(reply.header("x-router-bucket"), Some("all"));

    // A streamed one.
    let mut body = chat_body("m", "stream it", 4);
    body["stream"] = true.into();
    let reply = chat(&http, &envoy, &body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("content-type"), Some("text/event-stream"));
    assert!(reply.body.contains("data: ") && reply.body.contains("[DONE]"), "{}", reply.body);
    served_by(&reply, &engines);

    // A 200 KB body arrives whole (router-sim's tokenizer has a token per byte).
    let big = "abcdefghij".repeat(20_000);
    let reply = chat(&http, &envoy, &chat_body("m", &big, 1)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let prompt_tokens = reply.json()["usage"]["prompt_tokens"].as_u64().expect("usage");
    assert!(prompt_tokens >= 200_000, "the whole body reached the engine: {prompt_tokens}");
    served_by(&reply, &engines);

    // Cache-aware through Envoy: once the first prompt's blocks are indexed, the same prefix
    // goes to the same engine.
    let prefix = "You are a careful assistant. Here is a long shared document. ".repeat(30);
    let first = chat(&http, &envoy, &chat_body("m", &format!("{prefix} Question zero?"), 1)).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let home = served_by(&first, &engines).to_owned();
    eventually("the first prompt's blocks in the picker's index", async || {
        let state = picker.state(&http).await;
        let workers = state["workers"].as_array().cloned().unwrap_or_default();
        workers.iter().any(|w| w["id"] == home.as_str() && w["kv"]["blocks"].as_u64() > Some(30))
    })
    .await;
    for i in 1..=4 {
        let body = chat_body("m", &format!("{prefix} Question {i}?"), 1);
        let reply = chat(&http, &envoy, &body).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(served_by(&reply, &engines), home, "the shared prefix stays home");
        let cached = reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
        assert!(cached.unwrap_or(0) > 500, "served from the cache: {}", reply.body);
    }

    // A client that goes away mid-stream: Envoy resets the ext_proc stream and the picker
    // releases the request's in-flight count at once, long before the generation would end.
    eventually("every finished request's stream closed and released", async || {
        picker.inflight(&http).await == 0
    })
    .await;
    let mut body = chat_body("m", "a long answer please", 500);
    body["stream"] = true.into();
    let body = body.to_string();
    let address = envoy.url.trim_start_matches("http://").to_owned();
    let mut socket = tokio::net::TcpStream::connect(&address).await.expect("connect to Envoy");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    socket.write_all(head.as_bytes()).await.expect("head");
    socket.write_all(body.as_bytes()).await.expect("body");
    let mut first_bytes = [0u8; 512];
    let read = tokio::time::timeout(Duration::from_secs(10), socket.read(&mut first_bytes))
        .await
        .expect("the stream starts")
        .expect("read");
    assert!(String::from_utf8_lossy(&first_bytes[..read]).starts_with("HTTP/1.1 200"));
    assert_eq!(picker.inflight(&http).await, 1, "the open stream holds its engine");
    drop(socket);
    eventually("the in-flight count released after the client reset", async || {
        picker.inflight(&http).await == 0
    })
    .await;
    let metrics = http.get(&picker.admin, "/metrics", &[]).await.body;
    // Released by the reset, not by the generation's end: the stream ended as reset.
    assert!(metrics.contains("router_epp_stream_ends_total{end=\"reset\"}"), "{metrics}");
    assert!(
        metrics.contains("router_epp_streams_total{mode=\"full_duplex_streamed\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("router_requests_total{model=\"m\",bucket=\"all\",status=\"200\"}"));
}

#[tokio::test]
async fn a_killed_picker_fails_closed_and_a_second_replica_keeps_serving() {
    let engine = Engine::start("m", &["--load-reporter", "127.0.0.1:0"]);
    let url = &engine.url;
    let reporter = engine.process.url_after("load reporter on ");
    let yaml = format!(
        "server: {{port: 0, admin_token: {ADMIN_TOKEN}}}\nmodels:\n  - id: m\n    workers:\n      \
         - {{id: e1, url: \"{url}\", load_reporter: \"{reporter}\"}}\n    buckets:\n      \
         - {{id: all, groups: {{plain: {{policy: {{type: load_based}}}}}}}}\n"
    );
    let mut first = Picker::start(&yaml);
    let mut second = Picker::start(&yaml);
    let http = Http::default();
    let envoy = Envoy::start(&[first.grpc.clone(), second.grpc.clone()], false).await;
    let mut clusters = String::new();
    let healthy = eventually_bool(async || {
        clusters = http.get(&envoy.admin, "/clusters", &[]).await.body;
        [&first.grpc, &second.grpc]
            .iter()
            .all(|grpc| clusters.contains(&format!("picker::{grpc}::health_flags::healthy")))
    })
    .await;
    assert!(healthy, "both pickers pass Envoy's health check:\n{clusters}");
    let request = chat_body("m", "are you there?", 1);
    let all_served = async |count: usize| {
        for _ in 0..count {
            if chat(&http, &envoy, &request).await.status != 200 {
                return false;
            }
        }
        true
    };
    eventually("both pickers healthy and serving", async || all_served(10).await).await;

    // One replica dies: FULL_DUPLEX_STREAMED fails closed for the streams it had, and once
    // Envoy's health check marks it down every request goes to the other.
    first.process.kill();
    eventually("the second replica serving every request", async || all_served(10).await).await;
    assert!(all_served(20).await, "the surviving replica keeps serving");

    // No replica left: the filter fails closed (failure_mode_allow: false) with a 500.
    second.process.kill();
    let reply = chat(&http, &envoy, &request).await;
    assert_eq!(reply.status, 500, "fail closed: {}", reply.body);
    assert!(reply.header("x-upstream-host").is_none(), "nothing reached an engine");
}
