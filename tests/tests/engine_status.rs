//! Engine status end to end: an engine whose load reports say DRAINING, and a worker the
//! operator drains through the admin API, receive nothing new while their in-flight streams
//! finish, and take requests again once resumed. Who received what is read from the router's
//! `x-router-engine` header and from the engines' own counters (`GET /sim/state`).

use http_body_util::{BodyExt, Full};
use router_e2e::{ADMIN_TOKEN, Engine, Http, Router, chat_body, worker_state};
use router_test_support::eventually;

/// Two plain engines `e1`, `e2` streaming 20 tokens per second, with gRPC load reporters when
/// `reporters`.
fn engines(reporters: bool) -> Vec<Engine> {
    let mut flags = vec!["--decode-tokens-per-sec", "20"];
    if reporters {
        flags.extend(["--load-reporter", "127.0.0.1:0"]);
    }
    (0..2).map(|_| Engine::start("m", &flags)).collect()
}

fn router(engines: &[Engine]) -> Router {
    let workers: String = engines
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let reporter = if e.process.lines.iter().any(|l| l.starts_with("load reporter on ")) {
                format!(", load_reporter: \"{}\"", e.process.url_after("load reporter on "))
            } else {
                String::new()
            };
            format!("      - {{id: e{}, url: \"{}\"{reporter}}}\n", i + 1, e.url)
        })
        .collect();
    Router::with_config(&format!(
        "server: {{port: 0, admin_token: {ADMIN_TOKEN}}}\nload: {{report_interval_ms: 50}}\n\
         models:\n  - id: m\n    workers:\n{workers}    buckets:\n      \
         - id: all\n        groups: {{plain: {{policy: {{type: round_robin}}}}}}\n"
    ))
}

/// A streamed request for 40 tokens (two seconds), once its head is in: the engine that took
/// it, and the rest of its body to read.
async fn long_stream(http: &Http, router: &Router) -> (String, hyper::body::Incoming) {
    let mut body = chat_body("m", "a long answer please", 40);
    body["stream"] = true.into();
    let request = http::Request::post(format!("{}/v1/chat/completions", router.url))
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from(body.to_string())))
        .expect("request");
    let response = http.client().request(request).await.expect("response");
    assert_eq!(response.status(), 200);
    let engine = response.headers()["x-router-engine"].to_str().expect("ascii").to_owned();
    (engine, response.into_body())
}

async fn finishes_whole(body: hyper::body::Incoming) {
    let text =
        String::from_utf8_lossy(&body.collect().await.expect("whole body").to_bytes()).into_owned();
    assert!(text.trim_end().ends_with("data: [DONE]"), "the stream finished: {text}");
}

/// Generation requests engine `index` (of `e1`, `e2`) has received, by its own count.
async fn received(http: &Http, engines: &[Engine], id: &str) -> u64 {
    let index: usize = id[1..].parse::<usize>().expect("e<n>") - 1;
    let state = http.get(&engines[index].url, "/sim/state", &[]).await.json();
    state["received"].as_u64().expect("a count")
}

/// Sends `n` short requests; the engine that served each.
async fn served_by(http: &Http, router: &Router, n: usize) -> Vec<String> {
    let mut engines = Vec::new();
    for i in 0..n {
        let reply = http.chat(&router.url, &chat_body("m", &format!("short {i}"), 1), &[]).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        engines.push(reply.header("x-router-engine").expect("engine header").to_owned());
    }
    engines
}

fn other(id: &str) -> &'static str {
    if id == "e1" { "e2" } else { "e1" }
}

#[tokio::test]
async fn an_engine_reporting_draining_receives_nothing_new_while_its_stream_finishes() {
    let engines = engines(true);
    let router = router(&engines);
    let http = Http::default();
    router.wait_until_ready(&http, ADMIN_TOKEN).await;

    let (busy, stream) = long_stream(&http, &router).await;
    let index: usize = busy[1..].parse::<usize>().expect("e<n>") - 1;
    let drained = http.send("POST", &format!("{}/sim/drain", engines[index].url), &[], "").await;
    assert_eq!(drained.json()["status"], "draining");
    let says = "the engine's DRAINING report heard";
    router
        .wait_for_workers(&http, ADMIN_TOKEN, says, |w| {
            w["id"] != busy.as_str()
                || (w["reported_status"] == "draining" && w["accepting"] == false)
        })
        .await;
    let state = router.admin_state(&http, ADMIN_TOKEN).await;
    let entry = worker_state(&state, &busy);
    assert_eq!((&entry["healthy"], &entry["drained"]), (&true.into(), &false.into()), "{entry}");
    assert_eq!(entry["inflight"], 1, "its stream is still running: {entry}");
    let before = received(&http, &engines, &busy).await;

    let others = served_by(&http, &router, 8).await;
    assert!(others.iter().all(|e| e == other(&busy)), "{others:?}");
    assert_eq!(received(&http, &engines, &busy).await, before, "nothing new reached {busy}");
    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    for line in [
        format!("router_engine_status{{worker=\"{busy}\",status=\"draining\"}} 1"),
        format!("router_engine_accepting{{worker=\"{busy}\"}} 0"),
        format!("router_engine_accepting{{worker=\"{}\"}} 1", other(&busy)),
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} missing from\n{metrics}");
    }
    finishes_whole(stream).await;

    let resumed = http.send("POST", &format!("{}/sim/resume", engines[index].url), &[], "").await;
    assert_eq!(resumed.json()["status"], "serving");
    router.wait_for_workers(&http, ADMIN_TOKEN, "serving again", |w| w["accepting"] == true).await;
    let after = served_by(&http, &router, 4).await;
    assert!(after.contains(&busy), "{busy} takes requests again: {after:?}");
}

#[tokio::test]
async fn a_worker_drained_by_hand_receives_nothing_new_until_resumed() {
    let engines = engines(false);
    let router = router(&engines);
    let http = Http::default();
    let admin = format!("Bearer {ADMIN_TOKEN}");
    let post = |path: String, auth: Option<&str>| {
        let (http, url) = (http.clone(), router.url.clone());
        let headers: Vec<(&str, String)> =
            auth.map(|a| ("authorization", a.to_owned())).into_iter().collect();
        async move {
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            http.send("POST", &format!("{url}{path}"), &headers, "").await
        }
    };

    let (busy, stream) = long_stream(&http, &router).await;
    let drained = post(format!("/admin/workers/{busy}/drain"), Some(&admin)).await;
    assert_eq!(drained.status, 200, "{}", drained.body);
    let entry = drained.json();
    assert_eq!(
        (&entry["id"], &entry["drained"], &entry["accepting"], &entry["inflight"]),
        (&busy.as_str().into(), &true.into(), &false.into(), &1.into()),
        "{entry}"
    );
    let before = received(&http, &engines, &busy).await;
    let others = served_by(&http, &router, 6).await;
    assert!(others.iter().all(|e| e == other(&busy)), "{others:?}");
    assert_eq!(received(&http, &engines, &busy).await, before, "nothing new reached {busy}");
    finishes_whole(stream).await;
    eventually("the drained worker's stream released", async || {
        worker_state(&router.admin_state(&http, ADMIN_TOKEN).await, &busy)["inflight"] == 0
    })
    .await;

    for (path, auth, status) in [
        ("/admin/workers/nope/drain".to_owned(), Some(admin.as_str()), 404),
        ("/admin/workers/nope/resume".to_owned(), Some(admin.as_str()), 404),
        (format!("/admin/workers/{busy}/resume"), None, 401),
    ] {
        let reply = post(path.clone(), auth).await;
        assert_eq!(reply.status, status, "{path}: {}", reply.body);
    }

    // With both drained there is nothing to select: 503, and the router is not ready.
    assert_eq!(
        post(format!("/admin/workers/{}/drain", other(&busy)), Some(&admin)).await.status,
        200
    );
    let refused = http.chat(&router.url, &chat_body("m", "anyone?", 1), &[]).await;
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert_eq!(refused.json()["error"]["code"], "no_candidates");
    assert_eq!(http.get(&router.url, "/readiness", &[]).await.status, 503);

    for id in ["e1", "e2"] {
        let resumed = post(format!("/admin/workers/{id}/resume"), Some(&admin)).await;
        assert_eq!((resumed.status, &resumed.json()["accepting"]), (200, &true.into()));
    }
    assert_eq!(http.get(&router.url, "/readiness", &[]).await.status, 200);
    let mut after = served_by(&http, &router, 4).await;
    after.sort();
    after.dedup();
    assert_eq!(after, ["e1", "e2"], "both take requests again");
}
