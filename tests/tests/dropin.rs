//! A launch line of sglang-router (`python -m sglang_router.launch_router`) starts this router
//! and every flag takes effect: the metrics port serves `/metrics` with HELP lines, the
//! settings show in `/admin/state`, and the client key, request-id header, payload limit,
//! CORS origin and log directory are honoured on the wire. Flags with no equivalent are refused
//! with what replaces them.

use std::process::Command;

use router_e2e::tempfile_path::TempPath;
use router_e2e::{Engine, Http, Process, binary, chat_body};

const ADMIN: &str = "adm-token";
const KEY: &str = "sk-dropin";

fn owned(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

#[tokio::test]
async fn an_sglang_router_launch_line_starts_the_router_and_every_flag_takes_effect() {
    let (e1, e2) = (Engine::start("m", &[]), Engine::start("m", &[]));
    let logs = TempPath::write("placeholder", "");
    let log_dir = format!("{}-logs", logs.display());
    #[rustfmt::skip]
    let line = [
        "--worker-urls", &e1.url, &e2.url,
        "--policy", "least_load",
        "--host", "127.0.0.1", "--port", "0",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", "0",
        "--log-level", "info", "--log-dir", &log_dir,
        "--max-concurrent-requests", "3", "--queue-size", "5", "--queue-timeout-secs", "7",
        "--request-timeout-secs", "90", "--max-payload-size", "4096",
        "--api-key", KEY,
        "--request-id-headers", "x-correlation-id", "x-request-id",
        "--cors-allowed-origins", "https://ui.example",
        "--retry-max-retries", "4", "--retry-initial-backoff-ms", "20",
        "--retry-max-backoff-ms", "800", "--retry-backoff-multiplier", "1.5",
        "--retry-jitter-factor", "0.25",
        "--cb-failure-threshold", "6", "--cb-success-threshold", "2",
        "--cb-timeout-duration-secs", "11",
        "--health-check-interval-secs", "3", "--health-check-timeout-secs", "2",
        "--health-success-threshold", "1", "--health-failure-threshold", "4",
        "--health-check-endpoint", "/health",
        "--admin-token", ADMIN,
    ];
    let process = Process::spawn_with_env(
        "router-server",
        &owned(&line),
        &[("RUST_LOG", "")],
        "router listening on ",
    );
    let url = process.url_after("router listening on ");
    let metrics_url = process.url_after("metrics listening on ");
    let http = Http::default();

    // The separate metrics listener serves /metrics, every TYPE with its HELP.
    let metrics_base = metrics_url.trim_end_matches("/metrics");
    assert_ne!(metrics_base, url, "a port of its own");
    let scraped = http.get(metrics_base, "/metrics", &[]).await;
    assert_eq!(scraped.status, 200, "{}", scraped.body);
    let lines: Vec<&str> = scraped.body.lines().collect();
    assert!(lines.iter().any(|l| l.starts_with("# TYPE router_")), "{}", scraped.body);
    for (i, line) in lines.iter().enumerate() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split(' ').next().unwrap_or_default();
            let help = format!("# HELP {name} ");
            assert!(i > 0 && lines[i - 1].starts_with(&help), "{name} has no HELP");
        }
    }
    let other = http.get(metrics_base, "/v1/models", &[]).await;
    assert_eq!(other.status, 404, "the metrics port serves nothing else");

    // Every setting, as /admin/state shows it.
    let admin = format!("Bearer {ADMIN}");
    let state = http.get(&url, "/admin/state", &[("authorization", &admin)]).await.json();
    let (server, health) = (&state["settings"]["server"], &state["settings"]["health"]);
    for (key, value) in [
        ("max_concurrent_requests", serde_json::json!(3)),
        ("queue_size", serde_json::json!(5)),
        ("queue_timeout_secs", serde_json::json!(7)),
        ("request_timeout_secs", serde_json::json!(90)),
        ("max_body_bytes", serde_json::json!(4096)),
        ("log_level", serde_json::json!("info")),
        ("log_dir", serde_json::json!(log_dir)),
        ("metrics_host", serde_json::json!("127.0.0.1")),
        ("metrics_port", serde_json::json!(0)),
        ("request_id_headers", serde_json::json!(["x-correlation-id", "x-request-id"])),
        ("cors_allowed_origins", serde_json::json!(["https://ui.example"])),
    ] {
        assert_eq!(server[key], value, "server.{key}: {server}");
    }
    let retry = &server["retry"];
    assert_eq!(retry["max_retries"], 3, "four attempts, the first included: {retry}");
    assert_eq!(retry["backoff_ms"], 20);
    assert_eq!(retry["max_backoff_ms"], 800);
    assert_eq!(retry["backoff_multiplier"], 1.5);
    assert_eq!(retry["jitter_factor"], 0.25);
    for (key, value) in [
        ("breaker_failures", 6),
        ("breaker_successes", 2),
        ("breaker_open_secs", 11),
        ("interval_secs", 3),
        ("timeout_secs", 2),
        ("healthy_after", 1),
        ("unhealthy_after", 4),
    ] {
        assert_eq!(health[key], value, "health.{key}: {health}");
    }
    assert_eq!(health["endpoint"], "/health");
    let group = &state["models"][0]["buckets"][0]["groups"][0];
    assert_eq!(group["policy"], "load_based", "least_load is load_based: {group}");
    assert_eq!(state["admission"]["max_concurrent_requests"], 3);

    // --api-key: the client API wants it.
    let body = chat_body("m", "hello", 4);
    let refused = http.chat(&url, &body, &[]).await;
    assert_eq!(refused.status, 401, "{}", refused.body);
    let bearer = format!("Bearer {KEY}");
    let headers = [("authorization", bearer.as_str()), ("x-correlation-id", "corr-7")];
    let answered = http.chat(&url, &body, &headers).await;
    assert_eq!(answered.status, 200, "{}", answered.body);
    // --request-id-headers: the id comes from the first configured header and is echoed.
    assert_eq!(answered.header("x-request-id"), Some("corr-7"));

    // --max-payload-size: a larger body is a 413.
    let big = chat_body("m", &"x".repeat(5000), 4);
    let too_large = http.chat(&url, &big, &[("authorization", &bearer)]).await;
    assert_eq!(too_large.status, 413, "{}", too_large.body);

    // --cors-allowed-origins: the preflight is answered for the origin, and only for it.
    let preflight = |origin: &'static str| {
        let headers = [
            ("origin", origin),
            ("access-control-request-method", "POST"),
            ("access-control-request-headers", "authorization,content-type"),
        ];
        let http = http.clone();
        let target = format!("{url}/v1/chat/completions");
        async move { http.send("OPTIONS", &target, &headers, "").await }
    };
    let allowed = preflight("https://ui.example").await;
    assert_eq!(allowed.status, 200, "{allowed:?}");
    assert_eq!(allowed.header("access-control-allow-origin"), Some("https://ui.example"));
    let foreign = preflight("https://evil.example").await;
    assert_eq!(foreign.header("access-control-allow-origin"), None, "{foreign:?}");

    // --log-dir and --log-level: info lines go to the file.
    let file = std::path::Path::new(&log_dir).join("router-server.log");
    let text = std::fs::read_to_string(&file).expect("the log file");
    assert!(text.contains("INFO") && text.contains("router listening"), "{text}");
    drop(process);
    let _ = std::fs::remove_dir_all(&log_dir);
}

#[tokio::test]
async fn a_prefill_with_bootstrap_port_none_starts_a_pd_router() {
    let line = owned(&[
        "--pd-disaggregation",
        "--prefill",
        "http://127.0.0.1:9",
        "none",
        "--decode",
        "http://127.0.0.1:10",
        "--port",
        "0",
        "--admin-token",
        ADMIN,
    ]);
    let router = router_e2e::Router::with_args(&line);
    let http = Http::default();
    let state = router.admin_state(&http, ADMIN).await;
    let workers = state["workers"].as_array().expect("workers");
    assert_eq!(workers.len(), 2, "`none` is no engine: {state}");
    let prefill = workers.iter().find(|w| w["role"] == "prefill").expect("a prefill engine");
    assert_eq!(prefill["url"], "http://127.0.0.1:9");
    assert!(prefill["bootstrap_port"].is_null(), "the engine's default: {prefill}");
}

/// Every incumbent flag with what docs/incumbent-flags.md says this router does with it
/// (`honoured`, `ignored`, `refused`) and the values it takes (the incumbents' argparse
/// definitions, `incumbent-flags.tsv`).
fn incumbent_flags() -> Vec<(String, &'static str, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("root");
    let doc = std::fs::read_to_string(root.join("docs/incumbent-flags.md")).expect("doc");
    let tsv = root.join("crates/router-config/src/incumbents/incumbent-flags.tsv");
    let tsv = std::fs::read_to_string(tsv).expect("tsv");
    let values = |flag: &str| {
        tsv.lines().find_map(|l| {
            let mut fields = l.split('\t').skip(1);
            (fields.next() == Some(flag)).then(|| fields.next().unwrap_or_default().to_owned())
        })
    };
    doc.lines()
        .filter_map(|line| {
            let flag = line.strip_prefix("| `")?.split('`').next()?.to_owned();
            let here = line.rsplit(" | ").next()?.trim_end_matches(" |");
            let treatment = ["honoured", "ignored", "refused"]
                .into_iter()
                .find(|t| here.trim_start_matches("**").starts_with(t))?;
            let values = values(&flag).unwrap_or_else(|| panic!("{flag} not in the tsv"));
            Some((flag, treatment, values))
        })
        .collect()
}

#[test]
fn every_refused_incumbent_flag_exits_naming_its_replacement() {
    let flags = incumbent_flags();
    assert!(flags.len() > 240, "{} rows", flags.len());
    let refused: Vec<_> = flags.iter().filter(|(_, t, _)| *t == "refused").collect();
    assert!(refused.len() > 50, "{} refused", refused.len());
    for (flag, _, values) in refused {
        let value: &[&str] = if values == "none" { &[] } else { &["1"] };
        let output = Command::new(binary("router-server"))
            .args(["--worker-urls", "http://127.0.0.1:9", flag])
            .args(value)
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{flag}: {stderr}");
        assert!(stderr.starts_with(&format!("error: {flag} (")), "{flag}: {stderr}");
        assert!(stderr.contains(") is not supported: "), "{flag}: {stderr}");
        assert!(!stderr.contains("unexpected argument"), "{flag}: {stderr}");
    }
    for (policy, replacement) in [
        ("prefix_hash", "cache_aware"),
        ("bucket", "models[].buckets[]"),
        ("rendezvous_hash", "new_binding=rendezvous"),
        ("sticky_least_loaded", "--policy session_aware"),
    ] {
        let output = Command::new(binary("router-server"))
            .args(["--worker-urls", "http://127.0.0.1:9", "--policy", policy])
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{policy}: {stderr}");
        assert!(stderr.contains(&format!("--policy {policy} is not supported")), "{stderr}");
        assert!(stderr.contains(replacement), "{policy}: {stderr}");
    }
}

#[tokio::test]
async fn a_launch_line_with_every_ignored_incumbent_flag_starts_and_warns_for_each() {
    let engine = Engine::start("m", &[]);
    let ignored: Vec<(String, String)> = incumbent_flags()
        .into_iter()
        .filter(|(_, treatment, _)| *treatment == "ignored")
        .map(|(flag, _, values)| (flag, values))
        .collect();
    assert!(ignored.len() > 50, "{} ignored", ignored.len());
    let mut line = owned(&["--worker-urls", &engine.url, "--port", "0"]);
    for (flag, values) in &ignored {
        line.push(flag.clone());
        match values.as_str() {
            "none" => {}
            "one" => line.push("1".into()),
            _ => line.extend(["a".to_owned(), "b".to_owned()]),
        }
    }
    // Standard error to a file, standard output read up to the ready line.
    let log = TempPath::write("stderr.log", "");
    let mut child = Command::new(binary("router-server"))
        .args(&line)
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(log.display()).expect("log file"))
        .spawn()
        .expect("spawns");
    let stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let ready = std::io::BufRead::lines(stdout)
        .map_while(Result::ok)
        .find_map(|l| l.split_once("router listening on ").map(|(_, url)| url.trim().to_owned()));
    let stderr = std::fs::read_to_string(log.display()).expect("stderr");
    let url = ready.unwrap_or_else(|| panic!("the router never listened: {stderr}"));
    let reply = Http::default().chat(&url, &chat_body("m", "hello", 2), &[]).await;
    child.kill().ok();
    child.wait().ok();
    assert_eq!(reply.status, 200, "{}", reply.body);
    for (flag, _) in &ignored {
        assert!(stderr.contains(&format!("warning: {flag} ")), "{flag}: {stderr}");
    }
    assert!(!stderr.contains("unexpected argument"), "{stderr}");
}

#[tokio::test]
async fn the_flags_apply_on_top_of_a_configuration_file() {
    let yaml = format!(
        r#"
server: {{port: 0, admin_token: {ADMIN}, queue_size: 9, retry: {{max_retries: 5}}}}
health: {{breaker_failures: 3}}
models:
  - id: m
    workers: [{{id: w1, url: "http://127.0.0.1:9"}}]
    buckets: [{{id: all, groups: {{plain: {{policy: {{type: round_robin}}}}}}}}]
"#
    );
    let file = TempPath::write("router.yaml", &yaml);
    let line = owned(&[
        "--config",
        &file.display(),
        "--disable-retries",
        "--disable-circuit-breaker",
        "--max-concurrent-requests",
        "-1",
        "--prometheus-port",
        "0",
        "--health-check-endpoint",
        "health_generate",
    ]);
    let process = Process::spawn("router-server", &line, "router listening on ");
    let url = process.url_after("router listening on ");
    let metrics = process.url_after("metrics listening on ");
    let http = Http::default();
    let scraped = http.get(metrics.trim_end_matches("/metrics"), "/metrics", &[]).await;
    assert_eq!(scraped.status, 200);
    assert!(scraped.body.contains("# HELP router_engine_healthy "), "{}", scraped.body);
    let admin = format!("Bearer {ADMIN}");
    let state = http.get(&url, "/admin/state", &[("authorization", &admin)]).await.json();
    let (server, health) = (&state["settings"]["server"], &state["settings"]["health"]);
    assert_eq!(server["queue_size"], 9, "the file's own keys stay: {server}");
    assert_eq!(server["retry"]["max_retries"], 0, "--disable-retries");
    assert_eq!(health["breaker_failures"], 0, "--disable-circuit-breaker");
    assert_eq!(health["endpoint"], "/health_generate");
    let unbounded = server["max_concurrent_requests"].as_u64().expect("a number");
    assert!(unbounded > 1 << 40, "-1 is no bound: {unbounded}");
}

#[tokio::test]
async fn dp_aware_learns_each_engines_dp_size_and_routes_to_its_ranks() {
    let engine = Engine::start("m", &["--dp-size", "3"]);
    let line =
        owned(&["--worker-urls", &engine.url, "--dp-aware", "--port", "0", "--admin-token", ADMIN]);
    let router = router_e2e::Router::with_args(&line);
    let http = Http::default();
    let state = router.admin_state(&http, ADMIN).await;
    assert_eq!(state["workers"][0]["dp_size"], 3, "from /get_server_info: {state}");
    for _ in 0..3 {
        let answered = http.chat(&router.url, &chat_body("m", "hello", 2), &[]).await;
        assert_eq!(answered.status, 200, "{}", answered.body);
    }
    let scraped = http.get(&router.url, "/metrics", &[]).await.body;
    let ranked = scraped.lines().filter(|l| l.starts_with("router_dp_rank_dispatches_total{"));
    assert!(ranked.count() >= 1, "the router chose ranks: {scraped}");
}
