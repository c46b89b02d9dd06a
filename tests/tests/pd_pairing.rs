//! PD pairing constraints end to end: with `pair_on: [rack]` every pair the router dispatches
//! has both engines in one rack, as its response headers say and the engines' own counters
//! (`GET /sim/state`) confirm; engines without a partner receive nothing.

use std::collections::HashMap;

use router_e2e::{Engine, Http, Router, chat_body};

/// Prefill engines and their racks: P3's rack has no decode engine.
const PREFILLS: [(&str, &str); 3] = [("P1", "a"), ("P2", "b"), ("P3", "c")];
/// Decode engines and their racks: D4's rack has no prefill engine.
const DECODES: [(&str, &str); 4] = [("D1", "a"), ("D2", "b"), ("D3", "a"), ("D4", "d")];

fn rack_of(id: &str) -> &'static str {
    PREFILLS.iter().chain(&DECODES).find(|(e, _)| *e == id).map(|(_, r)| *r).expect("known")
}

async fn received(http: &Http, engine: &Engine) -> u64 {
    let state = http.get(&engine.url, "/sim/state", &[]).await.json();
    state["received"].as_u64().expect("a count")
}

#[tokio::test]
async fn a_decode_engine_of_another_rack_is_never_paired() {
    let prefills: Vec<Engine> = PREFILLS
        .iter()
        .map(|_| Engine::start("m", &["--role", "prefill", "--bootstrap-port", "0"]))
        .collect();
    let decodes: Vec<Engine> =
        DECODES.iter().map(|_| Engine::start("m", &["--role", "decode"])).collect();
    let mut workers = String::new();
    for ((id, rack), engine) in PREFILLS.iter().zip(&prefills) {
        workers.push_str(&format!(
            "      - {{id: {id}, url: \"{}\", role: prefill, bootstrap_port: {}, labels: {{rack: {rack}}}}}\n",
            engine.url,
            engine.bootstrap_port()
        ));
    }
    for ((id, rack), engine) in DECODES.iter().zip(&decodes) {
        workers.push_str(&format!(
            "      - {{id: {id}, url: \"{}\", role: decode, labels: {{rack: {rack}}}}}\n",
            engine.url
        ));
    }
    let yaml = format!(
        "server: {{port: 0}}\nmodels:\n  - id: m\n    workers:\n{workers}    buckets:\n      \
         - id: pd\n        groups:\n          pd:\n            pair_on: [rack]\n            \
         prefill: {{policy: {{type: round_robin}}}}\n            \
         decode: {{policy: {{type: round_robin}}}}\n"
    );
    let router = Router::with_config(&yaml);
    let http = Http::default();

    let mut pairs: HashMap<(String, String), u64> = HashMap::new();
    for i in 0..24 {
        let mut body = chat_body("m", &format!("request {i}"), 2);
        body["stream"] = (i % 2 == 0).into();
        let reply = http.chat(&router.url, &body, &[]).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let prefill = reply.header("x-router-prefill-engine").expect("prefill header").to_owned();
        let decode = reply.header("x-router-decode-engine").expect("decode header").to_owned();
        assert_eq!(rack_of(&prefill), rack_of(&decode), "{prefill} paired with {decode}");
        *pairs.entry((prefill, decode)).or_default() += 1;
    }
    // Round robin over the two prefill engines that have a partner, and within rack a over
    // its two decode engines: every compatible pair, and nothing else.
    let mut seen: Vec<_> = pairs.keys().map(|(p, d)| format!("{p}-{d}")).collect();
    seen.sort();
    assert_eq!(seen, ["P1-D1", "P1-D3", "P2-D2"], "{pairs:?}");
    let count = |engine: &str| {
        pairs.iter().filter(|((p, d), _)| p == engine || d == engine).map(|(_, n)| n).sum::<u64>()
    };
    assert_eq!((count("P1"), count("P2")), (12, 12), "{pairs:?}");

    // The engines' own counters agree: each saw exactly its share, the unpaired ones nothing.
    for ((id, _), engine) in PREFILLS.iter().zip(&prefills).chain(DECODES.iter().zip(&decodes)) {
        assert_eq!(received(&http, engine).await, count(id), "{id}");
    }
    assert_eq!(count("P3") + count("D4"), 0);
}
