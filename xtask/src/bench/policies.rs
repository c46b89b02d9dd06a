//! What each policy buys: the same fleet and multi-turn chat workload through every policy,
//! with caches cold at the start of each run (the engines are restarted). Also owns the fleet
//! itself (engines plus a router running one policy), which the quality sweep reuses, and the
//! page section `policies`.

use std::fmt::Write as _;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::procs::{Bins, Proc, engine, router_with_config, run_with_timeout};

/// The policies compared, in table order.
pub(crate) const POLICIES: &[&str] = &[
    "round_robin",
    "random",
    "power_of_two",
    "load_based",
    "session_aware",
    "cache_aware",
    "predicted_ttft",
];

/// The simulated engines of one fleet.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Engines {
    pub(crate) count: usize,
    pub(crate) kv_capacity_tokens: usize,
    pub(crate) prefill_tokens_per_sec: u64,
    pub(crate) decode_tokens_per_sec: u64,
}

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

    /// `router-sim load` sending this workload to `targets` (round robin over them), with
    /// sessions keyed by `x-session-id` and a fixed seed, reporting JSON.
    pub(crate) fn load_args(&self, targets: &[String]) -> Vec<String> {
        let mut args = vec!["load".to_owned()];
        for target in targets {
            args.extend(["--target".to_owned(), target.clone()]);
        }
        let numbers = [
            ("--sessions", self.sessions),
            ("--turns", self.turns),
            ("--system-prompts", self.system_prompts),
            ("--system-prompt-tokens", self.system_prompt_tokens),
            ("--turn-tokens", self.turn_tokens),
            ("--output-tokens", self.output_tokens),
            ("--concurrency", self.concurrency),
        ];
        for (flag, value) in numbers {
            args.extend([flag.to_owned(), value.to_string()]);
        }
        args.extend(
            ["--model", "m", "--session-header", "x-session-id", "--seed", "7", "--json"]
                .map(str::to_owned),
        );
        args.extend(["--duration".to_owned(), self.duration_secs.to_string()]);
        args
    }

    /// How long a run of this workload may take before it is a failure.
    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_secs(self.duration_secs * 2 + 60)
    }

    pub(crate) fn engines(&self) -> Engines {
        Engines {
            count: self.engines,
            kv_capacity_tokens: self.kv_capacity_tokens,
            prefill_tokens_per_sec: self.prefill_tokens_per_sec,
            decode_tokens_per_sec: self.decode_tokens_per_sec,
        }
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
pub(crate) struct EngineEndpoints {
    pub(crate) url: String,
    pub(crate) events: String,
    pub(crate) replay: String,
    pub(crate) reporter: String,
}

/// A policy as the router's YAML names it, with the settings that differ from the defaults.
#[derive(Clone, Debug)]
pub(crate) struct PolicySpec {
    pub(crate) name: String,
    pub(crate) settings: Vec<(String, String)>,
}

/// A setting for one policy, given on the command line as `POLICY.KEY=VALUE` (`--set`), for
/// trying a value without editing the defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Setting {
    pub(crate) policy: String,
    pub(crate) key: String,
    pub(crate) value: String,
}

impl Setting {
    pub(crate) fn parse(text: &str) -> Result<Self> {
        let parsed = text.split_once('=').and_then(|(name, value)| {
            let (policy, key) = name.split_once('.')?;
            let nonempty = !policy.is_empty() && !key.is_empty() && !value.is_empty();
            nonempty.then(|| Self { policy: policy.into(), key: key.into(), value: value.into() })
        });
        parsed.with_context(|| format!("--set {text:?}: expected POLICY.KEY=VALUE"))
    }
}

impl PolicySpec {
    /// `policy`, with `cache_aware`'s matched-token threshold set to `min_matched_tokens`
    /// (workloads shorter than production need a threshold to scale).
    pub(crate) fn new(policy: &str, min_matched_tokens: usize) -> Self {
        let settings = match policy {
            "cache_aware" => {
                vec![("cache_affinity_min_matched_tokens".into(), min_matched_tokens.to_string())]
            }
            _ => Vec::new(),
        };
        Self { name: policy.to_owned(), settings }
    }

    /// This spec with the `settings` given for its policy, each replacing its key's value.
    pub(crate) fn with(mut self, settings: &[Setting]) -> Self {
        for setting in settings.iter().filter(|s| s.policy == self.name) {
            self.settings.retain(|(key, _)| *key != setting.key);
            self.settings.push((setting.key.clone(), setting.value.clone()));
        }
        self
    }
}

fn router_yaml(policy: &PolicySpec, workers: &[EngineEndpoints], tokenizer: &str) -> String {
    let tuning: String =
        policy.settings.iter().map(|(key, value)| format!(", {key}: {value}")).collect();
    let policy = &policy.name;
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
    /// Starts `spec.count` engines (KV events over ZeroMQ, load over gRPC) and a router with
    /// `policy` in front of them.
    pub(crate) fn start(
        bins: &Bins,
        policy: &PolicySpec,
        spec: &Engines,
        tokenizer: &str,
    ) -> Result<Self> {
        let (engines, workers) = start_engines(bins, spec, tokenizer)?;
        let (router, url) = router_with_config(bins, &router_yaml(policy, &workers, tokenizer))?;
        // Let subscriptions connect before traffic starts.
        std::thread::sleep(std::time::Duration::from_millis(500));
        Ok(Self { _engines: engines, _router: router, url })
    }
}

/// Starts `spec.count` simulated engines (KV events over ZeroMQ, with replay, and load over
/// gRPC); returns them and where each listens.
pub(crate) fn start_engines(
    bins: &Bins,
    spec: &Engines,
    tokenizer: &str,
) -> Result<(Vec<Proc>, Vec<EngineEndpoints>)> {
    let capacity = spec.kv_capacity_tokens.to_string();
    let prefill = spec.prefill_tokens_per_sec.to_string();
    let decode = spec.decode_tokens_per_sec.to_string();
    let mut engines: Vec<Proc> = Vec::new();
    let mut endpoints = Vec::new();
    for _ in 0..spec.count {
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
        endpoints.push(EngineEndpoints {
            url,
            events: proc.after("kv events on ")?,
            replay: proc.after("kv replay on ")?,
            reporter: proc.after("load reporter on ")?,
        });
        engines.push(proc);
    }
    Ok((engines, endpoints))
}

/// Runs `router-sim load ARGS` (which must include `--json`), killed after `timeout`, and
/// returns its last line.
pub(crate) fn load_json(bins: &Bins, args: &[String], timeout: Duration) -> Result<Value> {
    let output = run_with_timeout(Command::new(&bins.sim).args(args), timeout)
        .context("running router-sim load")?;
    if !output.success {
        bail!("router-sim load failed: {}", output.stderr);
    }
    let last = output.stdout.lines().last().context("router-sim load printed nothing")?;
    serde_json::from_str(last).context("parsing the load report")
}

/// Runs the workload through `policy` on a fresh fleet.
pub(crate) fn run(
    bins: &Bins,
    policy: &str,
    workload: &Workload,
    tokenizer: &str,
) -> Result<PolicyRun> {
    // The workload's prompts are short next to the production default of 1024 matched tokens;
    // a hit is any shared system prompt (a full block or more).
    let spec = PolicySpec::new(policy, 256);
    let fleet = Fleet::start(bins, &spec, &workload.engines(), tokenizer)?;
    let args = workload.load_args(std::slice::from_ref(&fleet.url));
    let timeout = workload.timeout();
    let report = load_json(bins, &args, timeout)?;
    drop(fleet);
    Ok(PolicyRun { policy: policy.to_owned(), report })
}

/// The page section `policies`: the table and its plots.
pub(crate) fn render(runs: &[Result<PolicyRun, (String, String)>], workload: &Workload) -> String {
    let mut page = String::from("## Policies\n\n");
    let _ = writeln!(
        page,
        "{} router-sim engines ({} KV tokens each, prefill {} tokens/s, decode {} tokens/s per \
         request), byte-level tokenizer shared by router and engines, KV events over ZeroMQ and \
         load from `/v1/loads`. Workload: `router-sim load` with {} sessions of {} turns, {} \
         shared system prompts of {} tokens, {} tokens per user turn, {} output tokens, {} \
         concurrent requests, at most {} s; the session id travels in `x-session-id`. Every \
         policy gets a fresh fleet (cold caches); `cache_aware` runs with \
         `cache_affinity_min_matched_tokens: 256`.\n",
        workload.engines,
        workload.kv_capacity_tokens,
        workload.prefill_tokens_per_sec,
        workload.decode_tokens_per_sec,
        workload.sessions,
        workload.turns,
        workload.system_prompts,
        workload.system_prompt_tokens,
        workload.turn_tokens,
        workload.output_tokens,
        workload.concurrency,
        workload.duration_secs
    );
    page.push_str("| policy | requests | errors | req/s | cache hit rate | TTFT p50 ms | TTFT p99 ms | max share / mean |\n|---|---|---|---|---|---|---|---|\n");
    for run in runs {
        match run {
            Ok(run) => {
                let _ = writeln!(
                    page,
                    "| {} | {} | {} | {:.1} | {:.3} | {:.1} | {:.1} | {:.2} |",
                    run.policy,
                    run.number("requests"),
                    run.number("errors"),
                    run.number("throughput_rps"),
                    run.number("cache_hit_rate"),
                    run.number("ttft_p50_ms"),
                    run.number("ttft_p99_ms"),
                    run.max_share_over_mean(workload.engines),
                );
            }
            Err((policy, error)) => {
                let _ = writeln!(page, "| {policy} | failed: {} | | | | | | |", super::cell(error));
            }
        }
    }
    page.push_str("\n![cache hit rate](bench-hit-rate.svg)\n![TTFT p50](bench-ttft-p50.svg)\n![TTFT p99](bench-ttft-p99.svg)\n");
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_names_its_policy_and_replaces_only_its_key() {
        let waiting = Setting::parse("predicted_ttft.waiting_weight=0.5").expect("parses");
        assert_eq!(
            waiting,
            Setting {
                policy: "predicted_ttft".into(),
                key: "waiting_weight".into(),
                value: "0.5".into()
            }
        );
        for bad in ["waiting_weight=1", "predicted_ttft.waiting_weight", ".k=1", "p.=1", "p.k="] {
            let error = Setting::parse(bad).expect_err(bad).to_string();
            assert!(error.contains("POLICY.KEY=VALUE") && error.contains(bad), "{error}");
        }
        let min = Setting::parse("cache_aware.cache_affinity_min_matched_tokens=8").expect("ok");
        let cache_aware = PolicySpec::new("cache_aware", 64).with(&[min, waiting.clone()]);
        assert_eq!(
            cache_aware.settings,
            vec![("cache_affinity_min_matched_tokens".to_owned(), "8".to_owned())],
            "its own key replaced, another policy's setting left out"
        );
        let predicted = PolicySpec::new("predicted_ttft", 64).with(&[waiting]);
        assert_eq!(predicted.settings, vec![("waiting_weight".to_owned(), "0.5".to_owned())]);
    }
}
