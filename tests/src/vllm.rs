//! Real vLLM engines for the end-to-end tests: starting `vllm serve` (the CPU build, from the
//! pinned venv that `tests/vllm/setup.sh` installs) on a tiny random-weight model of
//! `tests/vllm/models/`, on loopback, with prefix caching and ZeroMQ KV events, and stopping it.
//! Owns no product behaviour.
//!
//! The command line is the one `tests/vllm/serve.sh` documents: block size 32 (the CPU backend
//! needs a multiple of 32), eager mode, prefix caching, a 4096-token context, the model served
//! as `tiny`, `VLLM_SERVER_DEV_MODE=1` (for `POST /reset_prefix_cache`), 1 GiB of KV cache
//! unless [`VllmOptions::num_blocks`] says otherwise, and its compute threads pinned to one core.
//! The KV-event PUB socket and its replay ROUTER socket are given `tcp://*:0` with
//! `VLLM_HOST_IP=127.0.0.1`: vLLM then binds both to loopback ports of the kernel's choosing
//! (a fixed `tcp://*:PORT` would bind every interface) and names them in
//! `GET /kv_event_sources`, which [`VllmEngine::start`] reads once the engine is healthy.
//!
//! Engines start one at a time, across test processes too (a lock file in the temp dir): on
//! the 2-core machine one engine starts in about 30-45 s, two started together starved each
//! other past 90 s.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The vLLM release `tests/vllm/setup.sh` installs.
pub const VLLM_VERSION: &str = "0.32.0";

/// How long an engine may take to answer `/health` once it is its turn to start (about 30 s,
/// 45 s with other engines serving beside it, on the 2-core machine).
pub const START_DEADLINE: Duration = Duration::from_secs(90);

/// How long an engine waits for the others' starts to finish before it starts.
pub const TURN_DEADLINE: Duration = Duration::from_secs(600);

/// How to start an engine; [`VllmOptions::default`] is one engine on core 0 with 1 GiB of KV
/// cache.
#[derive(Clone, Debug)]
pub struct VllmOptions {
    /// Index of the core its compute threads are pinned to (`VLLM_CPU_OMP_THREADS_BIND`), taken
    /// modulo the machine's cores: give engines that run together different indices.
    pub core: usize,
    /// `--num-gpu-blocks-override`: the KV cache in blocks of 32 tokens, which the CPU backend
    /// honours (at least 129: the 4096-token context plus the one block vLLM keeps back);
    /// `None` for 1 GiB (65,536 blocks of the tiny models). A small cache makes the engine
    /// evict and publish `BlockRemoved`, and saves about 1 GiB of RSS.
    pub num_blocks: Option<u32>,
    /// The served model name (`--served-model-name`), `tiny` by default.
    pub served_model_name: String,
    /// More `vllm serve` flags, appended last (e.g. `--enable-auto-tool-choice`,
    /// `--tool-call-parser`, `hermes`: without them vLLM refuses chat requests with `tools`
    /// unless `tool_choice` is `none`).
    pub extra_args: Vec<String>,
}

impl Default for VllmOptions {
    fn default() -> Self {
        Self {
            core: 0,
            num_blocks: None,
            served_model_name: "tiny".to_owned(),
            extra_args: Vec::new(),
        }
    }
}

/// A running `vllm serve` process group, killed when dropped.
pub struct VllmEngine {
    child: Child,
    http_url: String,
    kv_events: String,
    replay: String,
    model: String,
    family: String,
    dir: PathBuf,
    options: VllmOptions,
}

/// The ports of a restart: the ones the engine had.
#[derive(Clone, Copy, Debug)]
struct Ports {
    http: u16,
    kv_events: u16,
    replay: u16,
}

/// The vLLM venv: `$ROUTER_VLLM_VENV`, else `$HOME/.cache/router-ci/vllm-0.32.0`. Panics,
/// telling how to install it, when it has no `bin/vllm`: the tests that need it never skip.
pub fn venv() -> PathBuf {
    let path = std::env::var_os("ROUTER_VLLM_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(format!(".cache/router-ci/vllm-{VLLM_VERSION}")));
    assert!(
        path.join("bin/vllm").exists(),
        "no vLLM venv at {} (no bin/vllm): run `bash tests/vllm/setup.sh` (or set ROUTER_VLLM_VENV)",
        path.display()
    );
    path
}

/// The directory of the tiny models: `$ROUTER_VLLM_MODELS`, else
/// `$HOME/.cache/router-ci/vllm-models`. Panics, telling how to build them, when `family`
/// (`llama3` or `chatml`) is missing.
pub fn model_dir(family: &str) -> PathBuf {
    let root = std::env::var_os("ROUTER_VLLM_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cache/router-ci/vllm-models"));
    let dir = root.join(family);
    assert!(
        dir.join("model.safetensors").exists(),
        "no model {} (no model.safetensors): run `bash tests/vllm/setup.sh` (families: llama3, chatml)",
        dir.display()
    );
    dir
}

fn home() -> PathBuf {
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| "/root".into())
}

impl VllmEngine {
    /// Starts `vllm serve` on model `family` (`llama3` or `chatml`) and waits, up to
    /// [`START_DEADLINE`], for `/health`. Panics with the tail of the engine's log if it exits
    /// or stays unhealthy, or if the venv or the model is missing.
    pub fn start(family: &str, opts: VllmOptions) -> Self {
        // The HTTP port is found free and then handed over, so another process may take it in
        // between; the engine then exits at once and is started again on another port.
        let mut last_log = String::new();
        for _ in 0..3 {
            match Self::try_start(family, &opts, None) {
                Ok(engine) => return engine,
                Err(log) if log.contains("Address already in use") => last_log = log,
                Err(log) => {
                    panic!("vLLM engine `{family}` failed to start; its log ends with:\n{log}")
                }
            }
        }
        panic!(
            "vLLM engine `{family}` found its HTTP port taken three times; last log:\n{last_log}"
        )
    }

    /// Stops the engine and starts it again on the same ports, as a restarted process: the
    /// router sees its health probes refused, then answered, and a new KV-event sequence from
    /// an empty cache. The KV-event sockets are bound as `tcp://*:PORT` this time (vLLM binds
    /// a fixed port on every interface), so the router finds them where they were.
    pub fn restart(&mut self) {
        self.stop();
        let port = |endpoint: &str| {
            endpoint.rsplit(':').next().and_then(|p| p.parse().ok()).expect("a port")
        };
        let ports = Ports {
            http: port(&self.http_url),
            kv_events: port(&self.kv_events),
            replay: port(&self.replay),
        };
        let restarted =
            Self::try_start(&self.family, &self.options, Some(ports)).unwrap_or_else(|log| {
                panic!("vLLM engine `{}` failed to restart:\n{log}", self.family)
            });
        // The old value's drop signals a group that is gone and removes its log directory.
        *self = restarted;
    }

    /// One attempt: the engine, or the tail of its log when it exited early.
    fn try_start(family: &str, opts: &VllmOptions, fixed: Option<Ports>) -> Result<Self, String> {
        let venv = venv();
        let model = model_dir(family);
        // Held until this engine is healthy or has failed.
        let _turn = start_turn();
        let dir = fresh_dir();
        let log_path = dir.join("engine.log");
        let log = std::fs::File::create(&log_path).expect("create the engine's log file");
        let port = fixed.map_or_else(free_port, |ports| ports.http);
        let cores = std::thread::available_parallelism().map(usize::from).unwrap_or(1);
        let core = (opts.core % cores).to_string();
        let (kv_port, replay_port) = fixed.map_or((0, 0), |ports| (ports.kv_events, ports.replay));
        let kv_config = format!(
            r#"{{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:{kv_port}","replay_endpoint":"tcp://*:{replay_port}","topic":""}}"#
        );
        let mut args: Vec<String> = vec![
            "serve".into(),
            model.display().to_string(),
            "--host".into(),
            "127.0.0.1".into(),
            "--port".into(),
            port.to_string(),
            "--served-model-name".into(),
            opts.served_model_name.clone(),
            "--block-size".into(),
            "32".into(),
            "--enforce-eager".into(),
            "--enable-prefix-caching".into(),
            "--max-model-len".into(),
            "4096".into(),
            "--enable-prompt-tokens-details".into(),
            "--kv-events-config".into(),
            kv_config,
        ];
        if let Some(blocks) = opts.num_blocks {
            args.extend(["--num-gpu-blocks-override".into(), blocks.to_string()]);
        }
        args.extend(opts.extra_args.iter().cloned());
        let child = Command::new(venv.join("bin/vllm"))
            .args(&args)
            .env("VLLM_TARGET_DEVICE", "cpu")
            .env("VLLM_CPU_KVCACHE_SPACE", "1")
            .env("VLLM_CPU_OMP_THREADS_BIND", &core)
            .env("VLLM_SERVER_DEV_MODE", "1")
            .env("VLLM_HOST_IP", "127.0.0.1")
            .env("VLLM_NO_USAGE_STATS", "1")
            .env("DO_NOT_TRACK", "1")
            .env("HF_HUB_OFFLINE", "1")
            .env("TRANSFORMERS_OFFLINE", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the log file handle"))
            .stderr(log)
            // Its own process group: the API server, the engine core and the worker are
            // killed together.
            .process_group(0)
            .spawn()
            .unwrap_or_else(|err| panic!("spawning {}: {err}", venv.join("bin/vllm").display()));
        let mut engine = Self {
            child,
            http_url: format!("http://127.0.0.1:{port}"),
            kv_events: String::new(),
            replay: String::new(),
            model: opts.served_model_name.clone(),
            family: family.to_owned(),
            dir,
            options: opts.clone(),
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if let Ok(Some(status)) = engine.child.try_wait() {
                return Err(format!("(exited: {status})\n{}", engine.log_tail(80)));
            }
            if get(addr, "/health").is_some_and(|(status, _)| status == 200) {
                break;
            }
            if Instant::now() > deadline {
                panic!(
                    "vLLM engine `{family}` not healthy on {} within {} s; its log ({}) ends with:\n{}",
                    engine.http_url,
                    START_DEADLINE.as_secs(),
                    engine.log_path().display(),
                    engine.log_tail(80)
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let (status, body) = get(addr, "/kv_event_sources").expect("GET /kv_event_sources");
        assert_eq!(status, 200, "GET /kv_event_sources: {body}");
        let sources: serde_json::Value =
            serde_json::from_str(&body).expect("/kv_event_sources is JSON");
        let endpoint = |key: &str| {
            let value = sources["0"][key].as_str().unwrap_or_default().to_owned();
            let port = value.rsplit(':').next().unwrap_or_default();
            assert!(
                value.starts_with("tcp://") && port.parse::<u16>().is_ok_and(|p| p > 0),
                "/kv_event_sources names {key} {value:?}, no bound port: {body}"
            );
            // The router connects over loopback whatever the engine bound.
            format!("tcp://127.0.0.1:{port}")
        };
        engine.kv_events = endpoint("endpoint");
        engine.replay = endpoint("replay_endpoint");
        if let Some(ports) = fixed {
            assert_eq!(engine.kv_events, format!("tcp://127.0.0.1:{}", ports.kv_events));
            assert_eq!(engine.replay, format!("tcp://127.0.0.1:{}", ports.replay));
        }
        Ok(engine)
    }

    /// `http://127.0.0.1:PORT`, the engine's OpenAI-compatible server.
    pub fn http_url(&self) -> &str {
        &self.http_url
    }

    /// `tcp://127.0.0.1:PORT`, the KV-event PUB socket, as the router connects to it (frames:
    /// topic, 8-byte big-endian sequence, msgpack payload).
    pub fn kv_events_endpoint(&self) -> &str {
        &self.kv_events
    }

    /// `tcp://127.0.0.1:PORT`, the replay ROUTER socket (send `["", start_seq]`).
    pub fn replay_endpoint(&self) -> &str {
        &self.replay
    }

    /// The served model name, for request bodies' `model`.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The model family it serves (`llama3` or `chatml`).
    pub fn family(&self) -> &str {
        &self.family
    }

    /// The engine's log file (its stdout and stderr), kept when a test panics.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("engine.log")
    }

    /// The last `lines` lines of the engine's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read(self.log_path()).unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Sends `signal` (a `kill` name such as `TERM`) to the engine's whole process group.
    fn signal_group(&self, signal: &str) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill")
            .args([&format!("-{signal}"), "--", &group])
            .stderr(Stdio::null())
            .status();
    }
}

impl VllmEngine {
    /// Stops the whole process group: SIGTERM lets vLLM stop its engine core and worker and
    /// release its shared memory; whatever is left after 10 s is killed.
    fn stop(&mut self) {
        self.signal_group("TERM");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.signal_group("KILL");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for VllmEngine {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("vLLM engine `{}` log kept at {}", self.family, self.log_path().display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Waits, up to [`TURN_DEADLINE`], for the lock file that lets one engine start at a time
/// (`$TMPDIR/router-e2e-vllm-start.lock`, locked with `flock`), and returns it locked.
fn start_turn() -> std::fs::File {
    let path = std::env::temp_dir().join("router-e2e-vllm-start.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|err| panic!("opening {}: {err}", path.display()));
    let deadline = Instant::now() + TURN_DEADLINE;
    loop {
        match file.try_lock() {
            Ok(()) => return file,
            Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(std::fs::TryLockError::WouldBlock) => panic!(
                "another vLLM engine held {} for over {} s while starting",
                path.display(),
                TURN_DEADLINE.as_secs()
            ),
            Err(std::fs::TryLockError::Error(err)) => {
                panic!("locking {}: {err}", path.display())
            }
        }
    }
}

/// A new directory for one engine's log.
fn fresh_dir() -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "router-e2e-vllm-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create the engine's temp dir");
    dir
}

/// A loopback port free at the time of asking.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}

/// `GET path` over HTTP/1.1 with short timeouts: the status and body, `None` when the engine
/// does not answer (yet).
fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let timeout = Duration::from_secs(2);
    let mut stream = TcpStream::connect_timeout(&addr, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).ok()?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}
