//! Kubernetes discovery end to end: a router-server process finds router-sim engines as pods
//! of the fake API server (pod IP 127.0.0.1, each engine's ports as named container ports),
//! reached through a kubeconfig in `KUBECONFIG`. Pods are added, made unready, deleted,
//! relabelled and recreated; events are lost and a 410 forces a relist; the API server stops
//! and restarts. Throughout, the router serves exactly the ready pods, and a deleted pod's KV
//! index entries go with it. Also: an API server down at start, then forbidding the namespace,
//! keeps readiness false while a static worker still serves.

use std::collections::BTreeSet;

use router_e2e::tempfile_path::TempPath;
use router_e2e::{ADMIN_TOKEN, Engine, Http, Router, chat_body, kv_engines, worker_state};
use router_test_support::fake_kube::{FakeKube, PodBuilder, pod};
use router_test_support::poll_until;

const NS: &str = "inference";

fn port_of(address: &str) -> u16 {
    address.rsplit(':').next().and_then(|p| p.parse().ok()).expect("a port")
}

/// The pod standing for `engine`, named `name`, selected by `app=engine`.
fn engine_pod(name: &str, engine: &Engine) -> PodBuilder {
    pod(name)
        .label("app", "engine")
        .port("http", port_of(&engine.url))
        .port("kv", port_of(&engine.kv_events()))
        .port("load", port_of(&engine.process.url_after("load reporter on ")))
}

fn router_yaml(tokenizer: &str, extra_model: &str, discovery: &str) -> String {
    format!(
        "server: {{port: 0, admin_token: {ADMIN_TOKEN}}}\nload: {{report_interval_ms: 50}}\n\
         health: {{interval_secs: 1}}\ndiscovery: {{{discovery}, backoff_initial_ms: 50, \
         backoff_max_ms: 400}}\nmodels:\n  - id: m\n    tokenizer: \"{tokenizer}\"\n{extra_model}    \
         buckets: [{{id: all, groups: {{plain: {{policy: {{type: round_robin}}}}}}}}]\n"
    )
}

/// The ids of the router's workers.
async fn workers(http: &Http, router: &Router) -> BTreeSet<String> {
    let state = router.admin_state(http, ADMIN_TOKEN).await;
    let workers = state["workers"].as_array().cloned().unwrap_or_default();
    workers.iter().filter_map(|w| w["id"].as_str().map(str::to_owned)).collect()
}

/// Waits until the router's workers are exactly `expected`, then checks that requests reach
/// them and nothing else (round robin: every one of them within two rounds).
async fn serves_exactly(http: &Http, router: &Router, expected: &[&str]) {
    let expected: BTreeSet<String> = expected.iter().map(|s| (*s).to_owned()).collect();
    let mut last = BTreeSet::new();
    let converged = poll_until(async || {
        last = workers(http, router).await;
        last == expected
    });
    assert!(converged.await, "expected workers {expected:?}, the router has {last:?}");
    let mut served = BTreeSet::new();
    for i in 0..(2 * expected.len()).max(2) {
        let reply = http.chat(&router.url, &chat_body("m", &format!("question {i}"), 2), &[]).await;
        if expected.is_empty() {
            assert_eq!(reply.status, 503, "no pod is serving: {}", reply.body);
            continue;
        }
        assert_eq!(reply.status, 200, "{}", reply.body);
        let engine = reply.header("x-router-engine").expect("the engine is named").to_owned();
        assert!(expected.contains(&engine), "{engine} served, but only {expected:?} are ready");
        served.insert(engine);
    }
    assert_eq!(served, expected, "round robin reaches every ready pod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_serves_exactly_the_ready_pods_through_changes_a_relist_and_a_restart() {
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let engines = kv_engines(4, &tokenizer, &[]);
    let mut fake = FakeKube::start().await;
    fake.put_pod(NS, engine_pod("e1", &engines[0]).build());
    fake.put_pod(NS, engine_pod("e2", &engines[1]).build());
    fake.put_pod(NS, engine_pod("e3", &engines[2]).ready(false).build());
    // Selected and ready, but without the KV-event port: skipped, named in the state.
    fake.put_pod(NS, pod("broken").label("app", "engine").port("http", 1).port("load", 2).build());
    fake.put_pod(NS, pod("web").label("app", "web").port("http", 3).build());
    let kubeconfig = TempPath::write("kubeconfig", &fake.kubeconfig(NS));
    let discovery =
        "selector: app=engine, port: http, kv_events: {port: kv}, load_reporter_port: load";
    let router = Router::with_config_and_env(
        &router_yaml(&tokenizer, "", discovery),
        &[("KUBECONFIG", &kubeconfig.display())],
    );
    let http = Http::default();

    let ready = poll_until(async || http.get(&router.url, "/readiness", &[]).await.status == 200);
    assert!(
        ready.await,
        "ready once listed: {}",
        http.get(&router.url, "/readiness", &[]).await.body
    );
    serves_exactly(&http, &router, &["e1", "e2"]).await;
    let state = router.admin_state(&http, ADMIN_TOKEN).await;
    assert_eq!(
        worker_state(&state, "e1")["origin"],
        serde_json::json!({"source": "discovery", "namespace": NS, "pod": "e1",
            "uid": fake_uid(&state, "e1")})
    );
    assert_eq!(worker_state(&state, "e1")["kv_events"]["endpoint"], engines[0].kv_events());
    assert_eq!(state["discovery"]["namespace"], NS, "from the kubeconfig's context");
    let skipped = &state["discovery"]["skipped"];
    assert_eq!(skipped[0]["pod"], "broken", "{skipped}");
    assert!(skipped[0]["reason"].as_str().is_some_and(|r| r.contains("\"kv\"")), "{skipped}");

    // Added when ready, removed when unready.
    fake.put_pod(NS, engine_pod("e3", &engines[2]).build());
    serves_exactly(&http, &router, &["e1", "e2", "e3"]).await;
    fake.put_pod(NS, engine_pod("e1", &engines[0]).ready(false).build());
    serves_exactly(&http, &router, &["e2", "e3"]).await;

    // A deleted pod takes its KV index entries with it.
    let long = "a long shared system prompt for the cache ".repeat(30);
    let cached = poll_until(async || {
        let _ = http.chat(&router.url, &chat_body("m", &long, 2), &[]).await;
        let state = router.admin_state(&http, ADMIN_TOKEN).await;
        worker_state(&state, "e2")["kv"]["blocks"].as_u64().unwrap_or(0) > 0
    });
    assert!(cached.await, "e2's KV events reached the index");
    fake.delete_pod(NS, "e2");
    serves_exactly(&http, &router, &["e3"]).await;
    let purged = poll_until(async || {
        let state = router.admin_state(&http, ADMIN_TOKEN).await;
        let held: u64 = state["workers"]
            .as_array()
            .map(|ws| ws.iter().filter_map(|w| w["kv"]["blocks"].as_u64()).sum())
            .unwrap_or(0);
        state["index"]["block_holders"].as_u64() == Some(held)
    });
    assert!(purged.await, "only live workers hold blocks in the index");

    // Relabelled out of the selection, and back.
    fake.put_pod(NS, engine_pod("e3", &engines[2]).label("app", "retired").build());
    serves_exactly(&http, &router, &[]).await;
    fake.put_pod(NS, engine_pod("e1", &engines[0]).build());
    fake.put_pod(NS, engine_pod("e3", &engines[2]).build());
    serves_exactly(&http, &router, &["e1", "e3"]).await;

    // Events lost, then 410 Gone: the relist finds e1 deleted and e2 recreated.
    let lists = fake.lists();
    fake.set_silent(true);
    fake.delete_pod(NS, "e1");
    fake.put_pod(NS, engine_pod("e2", &engines[1]).build());
    fake.set_silent(false);
    fake.expire_watches();
    serves_exactly(&http, &router, &["e2", "e3"]).await;
    assert!(fake.lists() > lists, "relisted: {:?}", fake.requests());

    // The API server restarts; meanwhile the router keeps serving what it knows.
    fake.stop().await;
    serves_exactly(&http, &router, &["e2", "e3"]).await;
    fake.put_pod(NS, engine_pod("e4", &engines[3]).build());
    fake.restart().await;
    serves_exactly(&http, &router, &["e2", "e3", "e4"]).await;
    let state = router.admin_state(&http, ADMIN_TOKEN).await;
    assert_eq!(state["discovery"]["synced"], true);
    assert_eq!(http.get(&router.url, "/readiness", &[]).await.status, 200);
}

/// The uid the router shows for `id` (assigned by the fake), after checking its form.
fn fake_uid(state: &serde_json::Value, id: &str) -> String {
    let uid = worker_state(state, id)["origin"]["uid"].as_str().unwrap_or_default().to_owned();
    assert!(uid.starts_with(&format!("uid-{id}-")), "{uid}");
    uid
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_down_at_start_then_forbidding_keeps_readiness_false_while_static_workers_serve()
 {
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let engines = kv_engines(2, &tokenizer, &[]);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let static_worker = format!(
        "    workers: [{{id: s1, url: \"{}\", load_reporter: \"{}\"}}]\n",
        engines[0].url,
        engines[0].process.url_after("load reporter on ")
    );
    let discovery = format!(
        "api_server: \"http://127.0.0.1:{port}\", namespace: {NS}, selector: app=engine, \
         port: http, load_reporter_port: load"
    );
    let router = Router::with_config(&router_yaml(&tokenizer, &static_worker, &discovery));
    let http = Http::default();

    let unready = async |fragment: &str| {
        let mut last = String::new();
        let seen = poll_until(async || {
            let reply = http.get(&router.url, "/readiness", &[]).await;
            last = reply.body;
            reply.status == 503 && last.contains(fragment)
        });
        assert!(seen.await, "readiness never said {fragment:?}; last: {last}");
    };
    unready("cannot reach the Kubernetes API server").await;
    serves_exactly(&http, &router, &["s1"]).await;

    let fake = FakeKube::start_on(port).await;
    fake.forbid(NS, true);
    fake.put_pod(NS, engine_pod("e1", &engines[1]).build());
    unready("forbidden (403)").await;
    serves_exactly(&http, &router, &["s1"]).await;

    fake.forbid(NS, false);
    let ready = poll_until(async || http.get(&router.url, "/readiness", &[]).await.status == 200);
    assert!(ready.await, "ready once listed");
    serves_exactly(&http, &router, &["e1", "s1"]).await;
}
