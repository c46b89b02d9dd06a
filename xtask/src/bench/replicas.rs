//! Router replicas that share nothing, measured: three router processes over one router-sim
//! fleet, the turns of multi-turn sessions sprayed over them round robin by `router-sim load`
//! (several `--target`s, a refused connection failing over to the next), against one router on
//! the same fleet and workload. Reports the fraction of turns served by their session's engine
//! (from `x-router-engine`), the cache hit rate and TTFT; also with one replica killed and
//! restarted on its port mid-run, and with one shared `router-server kv-indexer` behind every
//! replica instead of per-replica prefix trees. The page section `replicas`.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::Value;

use super::policies::{EngineEndpoints, Workload, load_json, start_engines};
use super::procs::{Bins, Proc};

/// Fleet and workload sizes: the policy comparison's shape, smaller (a session per replica
/// spray matters, not the fleet's size).
pub(crate) fn workload(quick: bool) -> Workload {
    let full = Workload {
        engines: 4,
        sessions: 48,
        turns: 6,
        system_prompts: 4,
        system_prompt_tokens: 512,
        turn_tokens: 96,
        output_tokens: 24,
        concurrency: 6,
        duration_secs: 60,
        kv_capacity_tokens: 16_384,
        prefill_tokens_per_sec: 40_000,
        decode_tokens_per_sec: 400,
    };
    if quick { Workload { sessions: 24, turns: 4, ..full } } else { full }
}

/// One configuration measured.
#[derive(Clone, Copy, Debug)]
struct Scenario {
    name: &'static str,
    replicas: usize,
    /// The group's policy, a YAML flow mapping's inside.
    policy: &'static str,
    /// Kill replica 2 a third into the run, restart it two thirds in.
    restart: bool,
    /// Put a shared `kv-indexer` behind the replicas (the policy reads `indexer`).
    indexer: bool,
}

const RENDEZVOUS: &str = "type: session_aware, new_binding: rendezvous";
const CACHE: &str = "type: cache_aware, cache_affinity_min_matched_tokens: 256, tie_break: request";

const SCENARIOS: &[Scenario] = &[
    Scenario { name: "1 replica", replicas: 1, policy: RENDEZVOUS, restart: false, indexer: false },
    Scenario {
        name: "3 replicas",
        replicas: 3,
        policy: RENDEZVOUS,
        restart: false,
        indexer: false,
    },
    Scenario {
        name: "3 replicas, one killed and restarted",
        replicas: 3,
        policy: RENDEZVOUS,
        restart: true,
        indexer: false,
    },
    Scenario {
        name: "3 replicas, power_of_two placement",
        replicas: 3,
        policy: "type: session_aware",
        restart: false,
        indexer: false,
    },
    Scenario { name: "1 replica", replicas: 1, policy: CACHE, restart: false, indexer: false },
    Scenario { name: "3 replicas", replicas: 3, policy: CACHE, restart: false, indexer: false },
    Scenario {
        name: "3 replicas, shared kv-indexer",
        replicas: 3,
        policy: CACHE,
        restart: false,
        indexer: true,
    },
];

/// One scenario's result, as `router-sim load --json` reported it.
pub(crate) struct ReplicaRun {
    scenario: Scenario,
    report: Value,
}

impl ReplicaRun {
    fn number(&self, key: &str) -> f64 {
        self.report[key].as_f64().unwrap_or(f64::NAN)
    }
}

fn workers_yaml(engines: &[EngineEndpoints]) -> String {
    engines
        .iter()
        .enumerate()
        .map(|(i, e)| {
            format!(
                "      - {{id: e{}, url: \"{}\", load_reporter: \"{}\", kv_events: {{endpoint: \"{}\", block_size: 16}}}}\n",
                i + 1,
                e.url,
                e.reporter,
                e.events
            )
        })
        .collect()
}

fn router_yaml(port: u16, policy: &str, engines: &[EngineEndpoints], tokenizer: &str) -> String {
    format!(
        "server: {{port: {port}}}\nload: {{report_interval_ms: 100}}\nmodels:\n  - id: m\n    tokenizer: \"{tokenizer}\"\n    workers:\n{}    buckets:\n      - id: all\n        groups: {{plain: {{policy: {{{policy}}}}}}}\n",
        workers_yaml(engines)
    )
}

/// A router replica: its configuration file and process.
struct Replica {
    config: std::path::PathBuf,
    proc: Option<Proc>,
    url: String,
}

impl Replica {
    fn start(
        bins: &Bins,
        index: usize,
        policy: &str,
        engines: &[EngineEndpoints],
        tokenizer: &str,
    ) -> Result<Self> {
        let config = std::env::temp_dir()
            .join(format!("xtask-bench-replica-{}-{index}.yaml", std::process::id()));
        std::fs::write(&config, router_yaml(0, policy, engines, tokenizer))?;
        let proc = Self::spawn(bins, &config)?;
        let url = proc.after("router listening on ")?;
        // A restart comes back on the same port, where the load generator sends.
        let port: u16 = url.rsplit(':').next().and_then(|p| p.parse().ok()).context("port")?;
        std::fs::write(&config, router_yaml(port, policy, engines, tokenizer))?;
        Ok(Self { config, proc: Some(proc), url })
    }

    fn spawn(bins: &Bins, config: &std::path::Path) -> Result<Proc> {
        let args = vec!["--config".to_owned(), config.display().to_string()];
        Proc::start(&bins.server, &args, "router listening on ")
    }

    /// Starts it again on its port, retrying while the port is still held.
    fn restart(&mut self, bins: &Bins) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match Self::spawn(bins, &self.config) {
                Ok(proc) => {
                    self.proc = Some(proc);
                    return Ok(());
                }
                Err(err) if Instant::now() > deadline => return Err(err),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.proc.take();
        let _ = std::fs::remove_file(&self.config);
    }
}

/// Runs one scenario on a fresh fleet (cold caches).
fn run(
    bins: &Bins,
    scenario: Scenario,
    workload: &Workload,
    tokenizer: &str,
) -> Result<ReplicaRun> {
    let (mut procs, endpoints) = start_engines(bins, &workload.engines(), tokenizer)?;
    let mut policy = scenario.policy.to_owned();
    let mut indexer_config = None;
    if scenario.indexer {
        let path =
            std::env::temp_dir().join(format!("xtask-bench-indexer-{}.yaml", std::process::id()));
        std::fs::write(&path, router_yaml(0, scenario.policy, &endpoints, tokenizer))?;
        let args: Vec<String> =
            ["kv-indexer", "--config", &path.display().to_string(), "--listen", "127.0.0.1:0"]
                .iter()
                .map(|s| (*s).to_owned())
                .collect();
        let proc = Proc::start(&bins.server, &args, "kv indexer listening on ")?;
        let addr = proc.after("kv indexer listening on ")?;
        policy.push_str(&format!(
            ", cache_prefix_provider: indexer, kv_indexer_endpoint: \"{addr}\""
        ));
        procs.push(proc);
        indexer_config = Some(path);
    }
    let mut replicas = (0..scenario.replicas)
        .map(|i| Replica::start(bins, i, &policy, &endpoints, tokenizer))
        .collect::<Result<Vec<_>>>()?;
    // Let KV-event subscriptions connect before traffic starts.
    std::thread::sleep(Duration::from_millis(500));

    let targets: Vec<String> = replicas.iter().map(|r| r.url.clone()).collect();
    let args = workload.load_args(&targets);
    let timeout = workload.timeout();
    let report = if scenario.restart {
        // The load runs on its own thread; the replica dies a third in, returns two thirds in
        // (of the single-replica run's expected length, about 1 s per 40 requests here).
        let expected =
            (workload.sessions * workload.turns) as f64 * 0.1 / workload.concurrency as f64;
        let load = {
            let bins_sim = bins.sim.clone();
            std::thread::spawn(move || {
                let bins = Bins { server: std::path::PathBuf::new(), sim: bins_sim };
                load_json(&bins, &args, timeout)
            })
        };
        std::thread::sleep(Duration::from_secs_f64(expected / 3.0));
        replicas[1].proc.take();
        std::thread::sleep(Duration::from_secs_f64(expected / 3.0));
        replicas[1].restart(bins)?;
        load.join().map_err(|_| anyhow::anyhow!("the load thread panicked"))??
    } else {
        load_json(bins, &args, timeout)?
    };
    drop(replicas);
    drop(procs);
    if let Some(path) = indexer_config {
        let _ = std::fs::remove_file(path);
    }
    Ok(ReplicaRun { scenario, report })
}

/// Runs every scenario; a failed one is reported in its row.
pub(crate) fn measure(
    bins: &Bins,
    workload: &Workload,
    tokenizer: &str,
) -> Vec<Result<ReplicaRun, (&'static str, &'static str, String)>> {
    SCENARIOS
        .iter()
        .map(|&scenario| {
            eprintln!("xtask bench: replicas: {} ({})", scenario.name, scenario.policy);
            let result = run(bins, scenario, workload, tokenizer);
            match &result {
                Ok(run) => eprintln!(
                    "  on session's engine {:.4}, hit rate {:.3}, TTFT p50 {:.1} ms, p99 {:.1} ms, errors {}",
                    run.number("session_engine_agreement"),
                    run.number("cache_hit_rate"),
                    run.number("ttft_p50_ms"),
                    run.number("ttft_p99_ms"),
                    run.number("errors"),
                ),
                Err(err) => eprintln!("  failed: {err:#}"),
            }
            result.map_err(|err| (scenario.name, scenario.policy, format!("{err:#}")))
        })
        .collect()
}

/// The page section `replicas`.
pub(crate) fn render(
    runs: &[Result<ReplicaRun, (&'static str, &'static str, String)>],
    workload: &Workload,
) -> String {
    let mut page = String::from("## Router replicas\n\n");
    let _ = writeln!(
        page,
        "{} router-sim engines (16384 KV tokens each, prefill 40000 tokens/s, decode 400 \
         tokens/s per request), KV events over ZeroMQ, load over gRPC. Workload: `router-sim \
         load` with {} sessions of {} turns, {} shared system prompts of {} tokens, {} tokens \
         per user turn, {} output tokens, {} concurrent requests; the session id travels in \
         `x-session-id`, and with several replicas the requests go to them round robin (a \
         refused connection fails over to the next replica, as a load balancer would). Each row \
         runs on a fresh fleet. \"On session's engine\" is the fraction of successful turns \
         served by the engine that served most of their session's turns. The restarted replica \
         is killed a third into the run and started again on its port, with no bindings, two \
         thirds in.\n",
        workload.engines,
        workload.sessions,
        workload.turns,
        workload.system_prompts,
        workload.system_prompt_tokens,
        workload.turn_tokens,
        workload.output_tokens,
        workload.concurrency,
    );
    page.push_str("| policy | routers | requests | errors | on session's engine | cache hit rate | TTFT p50 ms | TTFT p99 ms |\n|---|---|---|---|---|---|---|---|\n");
    for run in runs {
        match run {
            Ok(run) => {
                let _ = writeln!(
                    page,
                    "| `{}` | {} | {} | {} | {:.4} | {:.3} | {:.1} | {:.1} |",
                    run.scenario.policy,
                    run.scenario.name,
                    run.number("requests"),
                    run.number("errors"),
                    run.number("session_engine_agreement"),
                    run.number("cache_hit_rate"),
                    run.number("ttft_p50_ms"),
                    run.number("ttft_p99_ms"),
                );
            }
            Err((name, policy, error)) => {
                let _ = writeln!(
                    page,
                    "| `{policy}` | {name} | failed: {} | | | | | |",
                    super::cell(error)
                );
            }
        }
    }
    page
}
