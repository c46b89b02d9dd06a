//! What each policy buys: the same fleet and multi-turn chat workload through every policy,
//! with caches cold at the start of each run (the engines are restarted).

use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::procs::{Bins, Proc, engine, router_with_config};

/// The policies compared, in table order.
pub(crate) const POLICIES: &[&str] =
    &["round_robin", "random", "power_of_two", "load_based", "session_aware", "cache_aware"];

/// Fleet and workload sizes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Workload {
    pub(crate) engines: usize,
    pub(crate) sessions: usize,
    pub(crate) turns: usize,
    pub(crate) system_prompts: usize,
    pub(crate) system_prompt_tokens: usize,
    pub(crate) turn_tokens: usize,
    pub(crate) output_tokens: usize,
    pub(crate) concurrency: usize,
    pub(crate) duration_secs: u64,
    pub(crate) kv_capacity_tokens: usize,
    pub(crate) prefill_tokens_per_sec: u64,
    pub(crate) decode_tokens_per_sec: u64,
}

impl Workload {
    pub(crate) fn full() -> Self {
        Self {
            engines: 8,
            sessions: 64,
            turns: 6,
            system_prompts: 8,
            system_prompt_tokens: 1024,
            turn_tokens: 128,
            output_tokens: 32,
            concurrency: 16,
            duration_secs: 60,
            kv_capacity_tokens: 12_288,
            prefill_tokens_per_sec: 40_000,
            decode_tokens_per_sec: 400,
        }
    }

    pub(crate) fn quick() -> Self {
        Self { sessions: 16, turns: 3, duration_secs: 4, ..Self::full() }
    }
}

/// One policy's result, as `router-sim load --json` reported it.
#[derive(Debug)]
pub(crate) struct PolicyRun {
    pub(crate) policy: String,
    pub(crate) report: Value,
}

impl PolicyRun {
    pub(crate) fn number(&self, key: &str) -> f64 {
        self.report[key].as_f64().unwrap_or(f64::NAN)
    }

    /// The largest engine share over the mean share.
    pub(crate) fn max_share_over_mean(&self, engines: usize) -> f64 {
        let shares: Vec<f64> = self.report["engine_share"]
            .as_object()
            .map(|m| m.values().filter_map(Value::as_f64).collect())
            .unwrap_or_default();
        let max = shares.iter().copied().fold(0.0, f64::max);
        max * engines as f64
    }
}

/// Where one engine listens.
struct EngineEndpoints {
    url: String,
    events: String,
    replay: String,
    reporter: String,
}

fn router_yaml(policy: &str, workers: &[EngineEndpoints], tokenizer: &str) -> String {
    let tuning = match policy {
        // The workload's prompts are short next to the production default of 1024 matched
        // tokens; a hit is any shared system prompt (a full block or more).
        "cache_aware" => ", cache_affinity_min_matched_tokens: 256",
        _ => "",
    };
    let mut yaml = format!(
        "server: {{port: 0}}\nload: {{report_interval_ms: 100}}\nmodels:\n  - id: m\n    tokenizer: \"{tokenizer}\"\n    workers:\n"
    );
    for (i, engine) in workers.iter().enumerate() {
        yaml.push_str(&format!(
            "      - {{id: e{}, url: \"{}\", load_reporter: \"{}\", kv_events: {{endpoint: \"{}\", replay_endpoint: \"{}\", block_size: 16}}}}\n",
            i + 1,
            engine.url,
            engine.reporter,
            engine.events,
            engine.replay,
        ));
    }
    yaml.push_str(&format!(
        "    buckets:\n      - id: all\n        groups: {{plain: {{policy: {{type: {policy}{tuning}}}}}}}\n"
    ));
    yaml
}

/// A fresh fleet of simulated engines behind a router running one policy.
pub(crate) struct Fleet {
    _engines: Vec<Proc>,
    _router: Proc,
    pub(crate) url: String,
}

impl Fleet {
    /// Starts `workload.engines` engines (KV events over ZeroMQ, load over gRPC) and a router
    /// with `policy` in front of them.
    pub(crate) fn start(
        bins: &Bins,
        policy: &str,
        workload: &Workload,
        tokenizer: &str,
    ) -> Result<Self> {
        let capacity = workload.kv_capacity_tokens.to_string();
        let prefill = workload.prefill_tokens_per_sec.to_string();
        let decode = workload.decode_tokens_per_sec.to_string();
        let mut engines: Vec<Proc> = Vec::new();
        let mut workers = Vec::new();
        for _ in 0..workload.engines {
            let (proc, url) = engine(
                bins,
                &[
                    "--tokenizer",
                    tokenizer,
                    "--kv-capacity-tokens",
                    &capacity,
                    "--prefill-tokens-per-sec",
                    &prefill,
                    "--decode-tokens-per-sec",
                    &decode,
                    "--kv-events",
                    "tcp://127.0.0.1:0",
                    "--kv-replay",
                    "tcp://127.0.0.1:0",
                    "--load-reporter",
                    "127.0.0.1:0",
                ],
            )?;
            workers.push(EngineEndpoints {
                url,
                events: proc.after("kv events on ")?,
                replay: proc.after("kv replay on ")?,
                reporter: proc.after("load reporter on ")?,
            });
            engines.push(proc);
        }
        let (router, url) = router_with_config(bins, &router_yaml(policy, &workers, tokenizer))?;
        // Let subscriptions connect before traffic starts.
        std::thread::sleep(std::time::Duration::from_millis(500));
        Ok(Self { _engines: engines, _router: router, url })
    }
}

/// Runs `router-sim load ARGS` (which must include `--json`) and returns its last line.
pub(crate) fn load_json(bins: &Bins, args: &[String]) -> Result<Value> {
    let output = Command::new(&bins.sim).args(args).output().context("running router-sim load")?;
    if !output.status.success() {
        bail!("router-sim load failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().context("router-sim load printed nothing")?;
    serde_json::from_str(last).context("parsing the load report")
}

/// Runs the workload through `policy` on a fresh fleet.
pub(crate) fn run(
    bins: &Bins,
    policy: &str,
    workload: &Workload,
    tokenizer: &str,
) -> Result<PolicyRun> {
    let fleet = Fleet::start(bins, policy, workload, tokenizer)?;
    let router_url = fleet.url.clone();
    let args = [
        "load".to_owned(),
        "--target".into(),
        router_url,
        "--model".into(),
        "m".into(),
        "--sessions".into(),
        workload.sessions.to_string(),
        "--turns".into(),
        workload.turns.to_string(),
        "--system-prompts".into(),
        workload.system_prompts.to_string(),
        "--system-prompt-tokens".into(),
        workload.system_prompt_tokens.to_string(),
        "--turn-tokens".into(),
        workload.turn_tokens.to_string(),
        "--output-tokens".into(),
        workload.output_tokens.to_string(),
        "--concurrency".into(),
        workload.concurrency.to_string(),
        "--duration".into(),
        workload.duration_secs.to_string(),
        "--session-header".into(),
        "x-session-id".into(),
        "--seed".into(),
        "7".into(),
        "--json".into(),
    ];
    let report = load_json(bins, &args)?;
    drop(fleet);
    Ok(PolicyRun { policy: policy.to_owned(), report })
}
