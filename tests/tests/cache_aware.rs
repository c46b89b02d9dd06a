//! Cache-aware selection end to end: engines publish the blocks they cache over ZeroMQ, the
//! router (or a separate `router-server kv-indexer` process, answering prefix lookups over
//! gRPC) indexes them, and requests sharing a prefix go where it is cached.

use std::time::Duration;

use router_e2e::tempfile_path::TempPath;
use router_e2e::{
    ADMIN_TOKEN, Engine, Http, Process, Router, chat_body, kv_blocks, kv_engines, kv_workers_yaml,
};
use router_sim::tokens::{ChatMessage, Preprocessor};
use router_state_kv::hash::Salt;
use router_state_kv::remote::{ClientConfig, RemoteIndexClient};
use router_test_support::eventually;
use router_workers::{ModelId, WorkerId};

fn router_yaml(engines: &[Engine], tokenizer: &str, policy_extra: &str) -> String {
    router_yaml_with(&kv_workers_yaml(engines), tokenizer, policy_extra)
}

fn router_yaml_with(workers: &str, tokenizer: &str, policy_extra: &str) -> String {
    format!(
        "server: {{port: 0, admin_token: {ADMIN_TOKEN}}}\nmodels:\n  - id: m\n    tokenizer: \"{tokenizer}\"\n    workers:\n{workers}    buckets:\n      \
         - id: all\n        groups: {{plain: {{policy: {{type: cache_aware, cache_affinity_min_matched_tokens: 64{policy_extra}}}}}}}\n"
    )
}

/// The value of the `/metrics` sample whose line starts with `series` (name and labels).
fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
}

/// A first request with a shared prefix of `repeats` sentences, then, once its blocks reached
/// the index the router asks (its own, or `indexer`), six follow-ups; returns the engine of the
/// first and those of the follow-ups.
async fn follow_ups(
    router: &Router,
    repeats: usize,
    indexer: Option<&KvIndexer>,
) -> (String, Vec<String>) {
    let http = Http::default();
    router.wait_until_ready(&http, ADMIN_TOKEN).await;
    let prefix = "You are a careful assistant. Here is a long shared document. ".repeat(repeats);
    let first_prompt = format!("{prefix} Question zero?");
    let first = http.chat(&router.url, &chat_body("m", &first_prompt, 1), &[]).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let home = first.header("x-router-engine").expect("engine").to_owned();
    eventually("the first request's blocks in the index", async || match indexer {
        Some(indexer) => indexer.blocks(&home, &first_prompt).await > 0,
        None => kv_blocks(&http, router, ADMIN_TOKEN, &home).await > 0,
    })
    .await;
    let mut served = Vec::new();
    for i in 1..=6 {
        let reply = http
            .chat(&router.url, &chat_body("m", &format!("{prefix} Question {i}?"), 1), &[])
            .await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let cached =
            reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
        assert!(cached > 500, "the prefix was served from cache: {}", reply.body);
        served.push(reply.header("x-router-engine").expect("engine").to_owned());
    }
    (home, served)
}

/// Tokens per KV block of the engines (router-sim's default).
const BLOCK_SIZE: u32 = 16;

/// A running `router-server kv-indexer`, killed on drop.
struct KvIndexer {
    /// `HOST:PORT` of its gRPC service.
    addr: String,
    client: RemoteIndexClient,
    preprocessor: Preprocessor,
    _process: Process,
    _config: TempPath,
}

impl KvIndexer {
    /// Starts the indexer on the YAML `config` (model `m`); `preprocessor` renders and
    /// tokenizes prompts as the engines do.
    fn start(config: &str, preprocessor: Preprocessor) -> Self {
        let config = TempPath::write("indexer.yaml", config);
        let process = Process::spawn(
            "router-server",
            &[
                "kv-indexer".into(),
                "--config".into(),
                config.display(),
                "--listen".into(),
                "127.0.0.1:0".into(),
            ],
            "kv indexer listening on ",
        );
        let addr = process.url_after("kv indexer listening on ");
        let client = RemoteIndexClient::new(ClientConfig {
            query_timeout: Duration::from_secs(2),
            ..ClientConfig::new(vec![addr.clone()])
        })
        .expect("client");
        Self { addr, client, preprocessor, _process: process, _config: config }
    }

    /// The token ids of `prompt` sent as one user message.
    fn prompt_ids(&self, prompt: &str) -> Vec<u32> {
        self.preprocessor.prompt_ids(&[ChatMessage::new("user", prompt)]).expect("tokenizes")
    }

    /// The leading blocks of `prompt` (one user message) the indexer says worker `id` holds.
    async fn blocks(&self, id: &str, prompt: &str) -> u32 {
        let ids = self.prompt_ids(prompt);
        let matches = self
            .client
            .lookup_tokens(&ModelId::new("m"), &ids, BLOCK_SIZE, Salt::default())
            .await
            .expect("lookup");
        matches.get(&WorkerId::new(id).expect("id")).map_or(0, |m| m.blocks)
    }

    /// Waits until the indexer follows the KV events of `engines` (workers `e1`, `e2`, ... in
    /// order). The process says nothing about its subscriptions, and what an engine publishes
    /// before one has connected is lost, so each engine is sent a probe prompt, replaced by a
    /// new one when the indexer still lacks it after ten checks, until the indexer holds one.
    /// Each probe goes to an emptied cache (`POST /flush_cache`): the chat template fills the
    /// first block of every prompt, so a probe sent to a warm cache announces only blocks
    /// under one the indexer may have missed, and those are never indexed.
    async fn wait_until_following(&self, engines: &[Engine]) {
        const CHECKS_PER_PROBE: u32 = 10;
        let http = Http::default();
        for (n, engine) in engines.iter().enumerate() {
            let id = format!("e{}", n + 1);
            let mut probes = 0;
            let mut probe: Option<(String, u32)> = None;
            eventually(&format!("the indexer following the KV events of {id}"), async || {
                if let Some((prompt, checks)) = &mut probe {
                    if self.blocks(&id, prompt).await > 0 {
                        return true;
                    }
                    *checks += 1;
                    if *checks < CHECKS_PER_PROBE {
                        return false;
                    }
                }
                let flush = format!("{}/flush_cache", engine.url);
                let flushed = http.send("POST", &flush, &[], "").await;
                assert_eq!(flushed.status, 200, "{}", flushed.body);
                probes += 1;
                let prompt = format!("Readiness probe {probes} for {id}. ").repeat(8);
                let reply = http.chat(&engine.url, &chat_body("m", &prompt, 1), &[]).await;
                assert_eq!(reply.status, 200, "{}", reply.body);
                probe = Some((prompt, 0));
                false
            })
            .await;
        }
    }
}

#[tokio::test]
async fn requests_sharing_a_prefix_go_where_it_is_cached() {
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let fleet = kv_engines(4, &tokenizer, &[]);
    let router = Router::with_config(&router_yaml(&fleet, &tokenizer, ""));
    let (home, served) = follow_ups(&router, 20, None).await;
    assert!(served.iter().all(|e| *e == home), "all follow-ups on {home}: {served:?}");
    let metrics = Http::default().get(&router.url, "/metrics", &[]).await.body;
    let hits = metrics
        .lines()
        .find(|l| l.starts_with("router_picks_total") && l.contains("reason=\"cache_hit\""))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(hits >= 6.0, "cache hits counted: {metrics}");
    // The local source's lookups: the first request missed, the follow-ups found the prefix.
    let found = r#"router_cache_lookups_total{source="local",outcome="found"}"#;
    assert!(sample(&metrics, found) >= 6.0, "{metrics}");
    assert!(
        sample(&metrics, r#"router_cache_lookups_total{source="local",outcome="empty"}"#) >= 1.0
    );
    let matched = r#"router_cache_matched_tokens_count{source="local"}"#;
    assert!(sample(&metrics, matched) >= 7.0, "{metrics}");
    assert!(sample(&metrics, r#"router_cache_matched_tokens_sum{source="local"}"#) > 3000.0);
}

#[tokio::test]
async fn new_prefixes_spread_over_equally_idle_engines() {
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let fleet = kv_engines(2, &tokenizer, &[]);
    let router = Router::with_config(&router_yaml(&fleet, &tokenizer, ""));
    let http = Http::default();
    let mut engines = std::collections::BTreeSet::new();
    // One at a time: both engines idle and neither holding the prompt, each an exact tie
    // (power-of-two compares both).
    for i in 0..12 {
        let body = chat_body("m", &format!("question {i}: {}", "why? ".repeat(i + 1)), 1);
        let reply = http.chat(&router.url, &body, &[]).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        engines.insert(reply.header("x-router-engine").expect("engine").to_owned());
    }
    assert!(engines.len() > 1, "every new prefix went to {engines:?}");
}

#[tokio::test]
async fn long_prompts_prepared_off_the_event_loop_route_the_same() {
    // About 18 KB of prompt: templated and tokenized on the blocking pool.
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let fleet = kv_engines(2, &tokenizer, &[]);
    let router = Router::with_config(&router_yaml(&fleet, &tokenizer, ""));
    let (home, served) = follow_ups(&router, 300, None).await;
    assert!(served.iter().all(|e| *e == home), "all follow-ups on {home}: {served:?}");
}

#[tokio::test]
async fn a_remote_indexer_process_serves_the_same_decisions() {
    let tokenizer = router_sim::assets::tokenizer_path().display().to_string();
    let fleet = kv_engines(4, &tokenizer, &[]);
    let preprocessor = Preprocessor::from_tokenizer_file(&router_sim::assets::tokenizer_path())
        .expect("tokenizer");
    let indexer = KvIndexer::start(
        &format!(
            "models:\n  - id: m\n    workers:\n{}    buckets:\n      - id: all\n        groups: {{plain: {{}}}}\n",
            kv_workers_yaml(&fleet)
        ),
        preprocessor,
    );
    indexer.wait_until_following(&fleet).await;
    let extra = format!(
        ", cache_prefix_provider: indexer, kv_indexer_endpoint: \"{}\", kv_indexer_query_timeout_ms: 1000",
        indexer.addr
    );
    // The router's workers carry no KV events, only their block size: the indexer has the
    // events, the router neither subscribes nor keeps a tree.
    let workers: String = fleet
        .iter()
        .enumerate()
        .map(|(i, e)| {
            format!(
                "      - {{id: e{}, url: \"{}\", load_reporter: \"{}\", block_size: 16}}\n",
                i + 1,
                e.url,
                e.process.url_after("load reporter on ")
            )
        })
        .collect();
    let router = Router::with_config(&router_yaml_with(&workers, &tokenizer, &extra));
    let (home, served) = follow_ups(&router, 20, Some(&indexer)).await;
    assert!(served.iter().all(|e| *e == home), "all follow-ups on {home}: {served:?}");
    let http = Http::default();
    let state = http
        .get(&router.url, "/admin/state", &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))])
        .await;
    let state = state.json();
    assert_eq!(state["index"]["local"], false, "no local tree: {state}");
    assert_eq!(state["index"]["nodes"], 0, "{state}");
    for worker in state["workers"].as_array().expect("workers") {
        assert_eq!(worker["kv"]["subscribed"], false, "no subscription: {worker}");
        assert_eq!(worker["block_size"], 16, "{worker}");
    }
    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    let found = r#"router_cache_lookups_total{source="remote",outcome="found"}"#;
    assert!(sample(&metrics, found) >= 6.0, "{metrics}");
    for outcome in ["timeout", "busy", "unreachable"] {
        let series =
            format!(r#"router_cache_lookups_total{{source="remote",outcome="{outcome}"}}"#);
        assert_eq!(sample(&metrics, &series), 0.0, "{metrics}");
    }
    assert!(!metrics.contains(r#"source="local""#), "no local source: {metrics}");
    assert!(!metrics.contains("router_kv_index_nodes"), "no local index: {metrics}");
}

#[tokio::test]
async fn the_indexer_process_serves_what_the_engine_cached() {
    let engine = Engine::start("m", &["--kv-events", "tcp://127.0.0.1:0"]);
    let indexer = KvIndexer::start(
        &format!(
            "models:\n  - id: m\n    workers:\n      - {{id: e1, url: \"{}\", kv_events: {{endpoint: \"{}\"}}}}\n    \
             buckets:\n      - id: all\n        groups: {{plain: {{}}}}\n",
            engine.url,
            engine.kv_events()
        ),
        Preprocessor::builtin(),
    );
    indexer.wait_until_following(std::slice::from_ref(&engine)).await;

    let prompt = "a prompt long enough to fill several blocks of sixteen tokens each ".repeat(4);
    let reply = Http::default().chat(&engine.url, &chat_body("m", &prompt, 1), &[]).await;
    assert_eq!(reply.status, 200);

    let full_blocks = indexer.prompt_ids(&prompt).len() / BLOCK_SIZE as usize;
    assert!(full_blocks > 1, "several blocks: {full_blocks}");
    eventually("every full block of the prompt indexed", async || {
        indexer.blocks("e1", &prompt).await as usize == full_blocks
    })
    .await;
}
