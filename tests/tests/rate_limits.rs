//! Per-key rate limits over HTTP: a key over its request limit gets 429 `rate_limited` with
//! `Retry-After` while another key is served, a key's token limit refuses a request its bucket
//! cannot pay for now (429) and one it can never pay for (400), and the refusals are counted by
//! key name, never by key.

use router_e2e::{Engine, Http, Router, chat_body};

const SLOW_KEY: &str = "slow-client-key";
const TOKEN_KEY: &str = "token-client-key";
const OPEN_KEY: &str = "open-client-key";

/// One engine behind a router whose keys have the limits of the test.
fn config(engine: &Engine) -> String {
    format!(
        "server:\n  port: 0\n  api_keys:\n    \
         - {{key: {SLOW_KEY}, name: slow, rate_limit: {{requests_per_second: 0.05, burst: 1}}}}\n    \
         - {{key: {TOKEN_KEY}, name: tokens, rate_limit: {{tokens_per_second: 1, tokens_burst: 100}}}}\n    \
         - {OPEN_KEY}\n\
         models:\n  - id: m\n    workers:\n      - {{id: e1, url: \"{}\"}}\n    buckets:\n      \
         - id: all\n        groups: {{plain: {{policy: {{type: round_robin}}}}}}\n",
        engine.url
    )
}

fn bearer(key: &str) -> [(&'static str, String); 1] {
    [("authorization", format!("Bearer {key}"))]
}

/// The value of `router_rate_limited_total` for `key` and `limit` in a scrape.
fn limited(metrics: &str, key: &str, limit: &str) -> Option<String> {
    let labels = [format!("key=\"{key}\""), format!("limit=\"{limit}\"")];
    metrics
        .lines()
        .filter(|line| line.starts_with("router_rate_limited_total{"))
        .find(|line| labels.iter().all(|label| line.contains(label.as_str())))
        .and_then(|line| line.rsplit_once(' ').map(|(_, value)| value.to_owned()))
}

#[tokio::test]
async fn each_key_is_held_to_its_own_request_and_token_limits() {
    let engine = Engine::start("m", &[]);
    let router = Router::with_config(&config(&engine));
    let http = Http::default();
    let chat = |key: &'static str, max_tokens: u64| {
        let (http, url) = (http.clone(), router.url.clone());
        async move {
            let [(name, value)] = bearer(key);
            http.chat(&url, &chat_body("m", "hello", max_tokens), &[(name, value.as_str())]).await
        }
    };

    // One request every 20 s, a burst of one: the second is refused before the queue (slow
    // enough that a loaded machine cannot refill the bucket between the two).
    let first = chat(SLOW_KEY, 4).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let second = chat(SLOW_KEY, 4).await;
    assert_eq!(second.status, 429, "{}", second.body);
    let retry: u64 =
        second.header("retry-after").and_then(|v| v.parse().ok()).expect("Retry-After");
    assert!((1..=20).contains(&retry), "the bucket refills within 20 s, got Retry-After {retry}");
    let error = &second.json()["error"];
    assert_eq!(error["type"], "rate_limit_exceeded");
    assert_eq!(error["code"], "rate_limited");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(message.contains("API key slow is over its requests-per-second"), "{message}");
    // Another key is not held back by it.
    for _ in 0..3 {
        let other = chat(OPEN_KEY, 4).await;
        assert_eq!(other.status, 200, "{}", other.body);
    }

    // A bucket of 100 tokens refilling at 1 a second: a request of about 60 (prompt plus
    // max_tokens) passes, a second one does not fit what is left, and one larger than the
    // bucket is told it never will.
    let paid = chat(TOKEN_KEY, 60).await;
    assert_eq!(paid.status, 200, "{}", paid.body);
    let short = chat(TOKEN_KEY, 60).await;
    assert_eq!(short.status, 429, "{}", short.body);
    assert_eq!(short.json()["error"]["code"], "rate_limited");
    let retry: u64 = short.header("retry-after").and_then(|v| v.parse().ok()).expect("Retry-After");
    assert!(retry > 1, "about 20 tokens short at 1 a second, got Retry-After {retry}");
    let huge = chat(TOKEN_KEY, 500).await;
    assert_eq!(huge.status, 400, "{}", huge.body);
    assert_eq!(huge.header("retry-after"), None);
    assert_eq!(huge.json()["error"]["code"], "over_token_burst");
    let message = huge.json()["error"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains("may spend at most 100 at once"), "{message}");

    // Counted by key name and limit; no key shows up in the metrics.
    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    assert_eq!(limited(&metrics, "slow", "requests").as_deref(), Some("1"), "{metrics}");
    assert_eq!(limited(&metrics, "tokens", "tokens").as_deref(), Some("2"), "{metrics}");
    assert_eq!(limited(&metrics, "api_keys[2]", "requests"), None);
    for secret in [SLOW_KEY, TOKEN_KEY, OPEN_KEY] {
        assert!(!metrics.contains(secret), "{secret} leaked");
    }
}
