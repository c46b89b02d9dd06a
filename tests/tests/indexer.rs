//! `router-server kv-indexer`: a separate process subscribes to the engines' KV events and
//! answers prefix lookups over gRPC.

use std::time::Duration;

use router_e2e::tempfile_path::TempPath;
use router_e2e::{Engine, Http, Process, chat_body};
use router_sim::tokens::{ChatMessage, Preprocessor};
use router_state_kv::hash::Salt;
use router_state_kv::remote::{ClientConfig, RemoteIndexClient};
use router_workers::{ModelId, WorkerId};

#[tokio::test]
async fn the_indexer_process_serves_what_the_engine_cached() {
    let engine = Engine::start("m", &["--kv-events", "tcp://127.0.0.1:0"]);
    let config = TempPath::write(
        "router.yaml",
        &format!(
            "models:\n  - id: m\n    workers:\n      - {{id: e1, url: \"{}\", kv_events: {{endpoint: \"{}\"}}}}\n    \
             buckets:\n      - id: all\n        groups: {{plain: {{}}}}\n",
            engine.url,
            engine.kv_events()
        ),
    );
    let indexer = Process::spawn(
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
    let addr = indexer.url_after("kv indexer listening on ");
    // The subscription needs a moment to connect before the engine publishes.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let prompt = "a prompt long enough to fill several blocks of sixteen tokens each ".repeat(4);
    let reply = Http::default().chat(&engine.url, &chat_body("m", &prompt, 1), &[]).await;
    assert_eq!(reply.status, 200);

    let ids =
        Preprocessor::builtin().prompt_ids(&[ChatMessage::new("user", prompt)]).expect("tokenizes");
    let client = RemoteIndexClient::new(ClientConfig {
        query_timeout: Duration::from_secs(2),
        ..ClientConfig::new(vec![addr])
    })
    .expect("client");
    let model = ModelId::new("m");
    let e1 = WorkerId::new("e1").expect("id");
    let mut held = 0;
    for _ in 0..100 {
        let matches =
            client.lookup_tokens(&model, &ids, 16, Salt::default()).await.expect("lookup");
        held = matches.get(&e1).map_or(0, |m| m.blocks);
        if held > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert_eq!(held as usize, ids.len() / 16, "every full block of the prompt is indexed");
}
