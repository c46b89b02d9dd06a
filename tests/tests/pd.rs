//! Prefill/decode dispatch end to end: the SGLang bootstrap protocol between real router-sim
//! engines, both picked from one bucket.

use router_e2e::{Engine, Http, Router, chat_body, pd_router_yaml};

struct Fleet {
    _engines: Vec<Engine>,
    router: Router,
}

fn fleet(prefill_flags: &[&str]) -> Fleet {
    let mut flags = vec!["--role", "prefill", "--bootstrap-port", "0"];
    flags.extend_from_slice(prefill_flags);
    let p = Engine::start("m", &flags);
    let d = Engine::start("m", &["--role", "decode"]);
    let yaml = pd_router_yaml(&p, &d, "", "power_of_two");
    let router = Router::with_config(&yaml);
    Fleet { _engines: vec![p, d], router }
}

#[tokio::test]
async fn pd_pair_serves_the_request_through_the_bootstrap_room() {
    let fleet = fleet(&[]);
    let http = Http::default();
    let reply = http.chat(&fleet.router.url, &chat_body("m", "hello pd", 6), &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.header("x-router-prefill-engine"), Some("P1"));
    assert_eq!(reply.header("x-router-decode-engine"), Some("D1"));
    assert_eq!(reply.header("x-router-bucket"), Some("pd"));
    assert_eq!(reply.json()["usage"]["completion_tokens"], 6);

    let mut body = chat_body("m", "hello pd stream", 4);
    body["stream"] = true.into();
    // A client's own bootstrap fields are never trusted.
    body["bootstrap_room"] = 7.into();
    body["bootstrap_host"] = "203.0.113.9".into();
    let reply = http.chat(&fleet.router.url, &body, &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply.body.trim_end().ends_with("data: [DONE]"), "{}", reply.body);
}

#[tokio::test]
async fn a_failing_prefill_is_a_clear_bad_gateway() {
    let fleet = fleet(&["--fail-rate", "1"]);
    let reply = Http::default().chat(&fleet.router.url, &chat_body("m", "x", 2), &[]).await;
    assert_eq!(reply.status, 502, "{}", reply.body);
    let message = reply.json()["error"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains("prefill engine P1"), "{message}");
}
