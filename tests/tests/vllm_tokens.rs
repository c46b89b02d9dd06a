//! The router's prompt token ids against a real vLLM's, without an engine: every request shape
//! of `tests/vllm/corpus.json`, for both template families (Llama-3 and ChatML), as vLLM 0.32
//! tokenized it (`tests/vllm/goldens/`, made once by `tests/vllm/make_goldens.py` against real
//! engines). A router process loads each family's tokenizer and template, and
//! `POST /admin/tokenize` must give the engine's ids exactly; a shape the engine refused for
//! holding non-text parts must be one the router counts as unmatchable, never routed on
//! wrong ids.

use std::path::{Path, PathBuf};

use router_e2e::{ADMIN_TOKEN, Http, Router};
use serde_json::{Value, json};

fn vllm_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("vllm")
}

/// A router serving model `tiny` with `family`'s tokenizer; its one engine is never asked.
fn router(family: &str) -> Router {
    let tokenizer = vllm_dir().join("models").join(family).join("tokenizer.json");
    Router::with_config(&format!(
        "server: {{port: 0, admin_token: {ADMIN_TOKEN}}}\nmodels:\n  - id: tiny\n    tokenizer: \"{}\"\n    \
         workers:\n      - {{id: e1, url: \"http://127.0.0.1:9\"}}\n    buckets:\n      \
         - id: all\n        groups: {{plain: {{policy: {{type: round_robin}}}}}}\n",
        tokenizer.display()
    ))
}

async fn check_family(family: &str) {
    let text = std::fs::read_to_string(vllm_dir().join("goldens").join(format!("{family}.json")))
        .expect("golden file");
    let goldens: Value = serde_json::from_str(&text).expect("json");
    let router = router(family);
    let http = Http::default();
    let mut mismatches = Vec::new();
    let shapes = goldens["shapes"].as_array().expect("shapes");
    for shape in shapes {
        let name = shape["name"].as_str().expect("name");
        let mut body = shape["body"].clone();
        body["endpoint"] = shape["endpoint"].clone();
        let reply = http
            .send(
                "POST",
                &format!("{}/admin/tokenize", router.url),
                &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))],
                body.to_string(),
            )
            .await;
        assert_eq!(reply.status, 200, "{family}/{name}: {}", reply.body);
        let ours = reply.json();
        match &shape["token_ids"] {
            Value::Null => {
                // Only a shape with a non-text part may lack ids: it is routed without a lookup.
                let engine_error = &shape["error"]["message"];
                assert_eq!(
                    (ours["token_ids"].clone(), ours["unmatchable"].clone()),
                    (Value::Null, json!("non_text_part")),
                    "{family}/{name}: the engine refused it ({engine_error}); the router must not route on ids"
                );
            }
            ids => {
                if ours["token_ids"] != *ids {
                    mismatches.push(format!(
                        "{family}/{name}: router {} ids ({}), vLLM {} ids\n  vLLM rendered {:?}",
                        ours["token_ids"].as_array().map_or(0, Vec::len),
                        ours["source"],
                        ids.as_array().map_or(0, Vec::len),
                        shape["rendered"].as_str().unwrap_or_default(),
                    ));
                }
                assert_eq!(ours["source"], "exact", "{family}/{name}");
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} shapes differ:\n{}",
        mismatches.len(),
        shapes.len(),
        mismatches.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_llama3_family_tokenizes_as_vllm_does() {
    check_family("llama3").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chatml_family_tokenizes_as_vllm_does() {
    check_family("chatml").await;
}
