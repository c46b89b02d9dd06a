//! `router-sim`: a simulated LLM engine (`router-sim engine`) and a workload generator
//! (`router-sim load`). See the crate README for flags, printed lines and the timing model.

use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use router_sim::engine::{self, ApiKey, EngineConfig, Exit, Faults, KvFormat};
use router_sim::load::{self, Arrival, LoadgenConfig, Pace, SessionSpec, TraceSpec, Workload};
use router_workers::Stage;
use tokio_util::sync::CancellationToken;

/// Exit status of an engine ended by `--die-after`.
const DIED_EXIT_CODE: u8 = 3;

#[derive(Debug, Parser)]
#[command(name = "router-sim", version, about = "A simulated LLM engine and a workload generator")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one simulated engine until interrupted.
    Engine(Box<EngineArgs>),
    /// Drive a router or engine with chat sessions (or a trace) and report what it measured.
    Load(Box<LoadArgs>),
}

fn parse_role(value: &str) -> Result<Stage, String> {
    match value {
        "plain" => Ok(Stage::Plain),
        "prefill" => Ok(Stage::Prefill),
        "decode" => Ok(Stage::Decode),
        other => Err(format!("unknown role {other:?} (expected plain, prefill or decode)")),
    }
}

#[derive(Debug, Args)]
struct EngineArgs {
    /// Address every socket binds to.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// HTTP port (0: any free port; see the printed `listening on` line).
    #[arg(long)]
    port: u16,
    /// Served model name.
    #[arg(long)]
    model: String,
    /// plain, prefill or decode.
    #[arg(long, default_value = "plain", value_parser = parse_role)]
    role: Stage,
    /// Tokens per KV block [default: 16].
    #[arg(long)]
    block_size: Option<usize>,
    /// KV capacity in tokens [default: 65536].
    #[arg(long)]
    kv_capacity_tokens: Option<usize>,
    /// Prefill speed for uncached prompt tokens [default: 1000000].
    #[arg(long)]
    prefill_tokens_per_sec: Option<f64>,
    /// Decode speed of each running request [default: 2000].
    #[arg(long)]
    decode_tokens_per_sec: Option<f64>,
    /// Running batch limit; more requests wait [default: 64].
    #[arg(long)]
    max_running: Option<usize>,
    /// Data-parallel ranks, each with its own cache and queue; rank r publishes KV events on
    /// the --kv-events port + r [default: 1].
    #[arg(long)]
    dp_size: Option<usize>,
    /// tokenizer.json to load; the chat template comes from tokenizer_config.json beside it.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Bind a ZeroMQ PUB socket for KV events here (tcp://HOST:PORT, port 0 allowed).
    #[arg(long)]
    kv_events: Option<String>,
    /// Bind a ZeroMQ ROUTER answering replay requests here (tcp://HOST:PORT).
    #[arg(long)]
    kv_replay: Option<String>,
    /// Event encoding: vllm, vllm-legacy, sglang or sglang-legacy.
    #[arg(long, default_value = "vllm")]
    kv_format: KvFormat,
    /// Topic frame of every KV event message.
    #[arg(long, default_value = "")]
    kv_topic: String,
    /// Batches kept for replay [default: 10000].
    #[arg(long)]
    kv_replay_buffer: Option<usize>,
    /// Bootstrap server port of a prefill engine (0: any free port).
    #[arg(long)]
    bootstrap_port: Option<u16>,
    /// Serve the gRPC load reporter (NATIVE reports) on this IP:PORT (port 0: any free port).
    #[arg(long, value_name = "HOST:PORT")]
    load_reporter: Option<SocketAddr>,
    /// How long a decode engine waits for its bootstrap room, in ms [default: 30000].
    #[arg(long)]
    bootstrap_timeout_ms: Option<u64>,
    /// Output tokens when a request sets no max_tokens [default: 16].
    #[arg(long)]
    default_max_tokens: Option<usize>,
    /// Tokens per streamed chunk, like SGLang's --stream-interval [default: 1].
    #[arg(long)]
    stream_interval: Option<usize>,
    /// Fraction of generation requests (chat, completions, /generate) answered with HTTP 500.
    #[arg(long, default_value_t = 0.0)]
    fail_rate: f64,
    /// The status of those answers (400..=599) [default: 500].
    #[arg(long)]
    fail_status: Option<u16>,
    /// Send `Retry-After: SECS` with those answers.
    #[arg(long, value_name = "SECS")]
    fail_retry_after: Option<u64>,
    /// Delay before anything is sent back for each generation request, in ms.
    #[arg(long, default_value_t = 0)]
    stall_ms: u64,
    /// Delay between each generation answer's head and its body, in ms.
    #[arg(long, default_value_t = 0)]
    stall_body_ms: u64,
    /// Exit (status 3) once this many generation requests have been answered.
    #[arg(long)]
    die_after: Option<u64>,
    /// Bind the KV-event sockets but publish nothing.
    #[arg(long)]
    no_kv_events: bool,
    /// Report zeros for the cumulative prefill counters, as no released engine reports them:
    /// the router gets no prefill rate from this engine's reports.
    #[arg(long)]
    no_prefill_counters: bool,
    /// Seed of the fault draws.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Require `Authorization: Bearer KEY` on every request under /v1/ and on /generate (401
    /// otherwise).
    #[arg(long, value_name = "KEY")]
    api_key: Option<ApiKey>,
    /// PEM certificate chain: serve HTTPS on --port (needs --tls-key).
    #[arg(long, value_name = "PATH")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "PATH")]
    tls_key: Option<PathBuf>,
}

impl EngineArgs {
    fn config(self) -> EngineConfig {
        let mut config = EngineConfig::new(self.model);
        config.host = self.host;
        config.port = self.port;
        config.role = self.role;
        config.block_size = self.block_size.unwrap_or(config.block_size);
        config.kv_capacity_tokens = self.kv_capacity_tokens.unwrap_or(config.kv_capacity_tokens);
        config.prefill_tokens_per_sec =
            self.prefill_tokens_per_sec.unwrap_or(config.prefill_tokens_per_sec);
        config.decode_tokens_per_sec =
            self.decode_tokens_per_sec.unwrap_or(config.decode_tokens_per_sec);
        config.max_running = self.max_running.unwrap_or(config.max_running);
        config.dp_size = self.dp_size.unwrap_or(config.dp_size);
        config.tokenizer = self.tokenizer;
        config.kv_events = self.kv_events;
        config.kv_replay = self.kv_replay;
        config.kv_format = self.kv_format;
        config.kv_topic = self.kv_topic;
        config.kv_replay_buffer = self.kv_replay_buffer.unwrap_or(config.kv_replay_buffer);
        config.bootstrap_port = self.bootstrap_port;
        config.load_reporter = self.load_reporter;
        if let Some(ms) = self.bootstrap_timeout_ms {
            config.bootstrap_timeout = Duration::from_millis(ms);
        }
        config.default_max_tokens = self.default_max_tokens.unwrap_or(config.default_max_tokens);
        config.stream_interval = self.stream_interval.unwrap_or(config.stream_interval);
        config.faults = Faults {
            fail_rate: self.fail_rate,
            fail_status: self.fail_status,
            fail_retry_after: self.fail_retry_after,
            stall: Duration::from_millis(self.stall_ms),
            stall_body: Duration::from_millis(self.stall_body_ms),
            die_after: self.die_after,
            no_kv_events: self.no_kv_events,
            no_prefill_counters: self.no_prefill_counters,
        };
        config.seed = self.seed;
        config.api_key = self.api_key;
        config.tls_cert = self.tls_cert;
        config.tls_key = self.tls_key;
        config
    }
}

#[derive(Debug, Args)]
struct LoadArgs {
    /// Base URL of the router or engine (http://HOST:PORT); repeat it for several router
    /// replicas: requests go to them round robin, and a refused connection fails over to the
    /// next.
    #[arg(long, required = true)]
    target: Vec<String>,
    /// Model of every request.
    #[arg(long)]
    model: String,
    /// Chat sessions [default: 8].
    #[arg(long)]
    sessions: Option<usize>,
    /// Turns per session [default: 4].
    #[arg(long)]
    turns: Option<usize>,
    /// Distinct system prompts shared round-robin by the sessions [default: 2].
    #[arg(long)]
    system_prompts: Option<usize>,
    /// System prompt length in tokens [default: 512].
    #[arg(long)]
    system_prompt_tokens: Option<usize>,
    /// User turn length in tokens [default: 64].
    #[arg(long)]
    turn_tokens: Option<usize>,
    /// max_tokens of each request [default: 16].
    #[arg(long)]
    output_tokens: Option<usize>,
    /// Requests in flight at once (closed loop) [default: 4].
    #[arg(long, conflicts_with = "rate")]
    concurrency: Option<usize>,
    /// Poisson arrivals per second (open loop).
    #[arg(long)]
    rate: Option<f64>,
    /// Stop after this many seconds at the latest [default: 60].
    #[arg(long)]
    duration: Option<f64>,
    /// Send each request's session id in this header.
    #[arg(long)]
    session_header: Option<String>,
    /// Print one JSON object as the last line.
    #[arg(long)]
    json: bool,
    /// Replay this request trace (Mooncake JSONL) instead of sessions.
    #[arg(long, conflicts_with_all = ["sessions", "turns", "system_prompts", "system_prompt_tokens", "turn_tokens", "output_tokens", "concurrency", "rate"])]
    trace: Option<PathBuf>,
    /// Divide trace arrival times by this factor: 10 replays ten times faster [default: 1].
    #[arg(long, requires = "trace")]
    time_scale: Option<f64>,
    /// Choose the time scale so that the uncached prefill work the fleet oracle leaves arrives
    /// at RHO (in (0, 2]) times the fleet's prefill speed; needs --fleet-capacity-tokens,
    /// --engines and --prefill-tokens-per-sec.
    #[arg(long, value_name = "RHO", requires = "trace", conflicts_with = "time_scale")]
    offered_load: Option<f64>,
    /// Engines of the fleet, for the offered load.
    #[arg(long, value_name = "N", requires = "trace")]
    engines: Option<usize>,
    /// Prefill speed of each engine for uncached prompt tokens, for the TTFT floor and the
    /// offered load.
    #[arg(long, value_name = "MU", requires = "trace")]
    prefill_tokens_per_sec: Option<f64>,
    /// Replay only the first N trace requests.
    #[arg(long, requires = "trace")]
    max_requests: Option<usize>,
    /// Tokens per trace hash id [default: 512, as in the Mooncake traces].
    #[arg(long, requires = "trace")]
    trace_block_tokens: Option<usize>,
    /// Scale block tokens, input and output lengths together (0.125: 512-token blocks become
    /// 64-token ones; the prefix structure is kept) [default: 1].
    #[arg(long, requires = "trace")]
    trace_length_scale: Option<f64>,
    /// The engines' tokenizer.json (chat template beside it), for the trace text and the
    /// oracles [default: the built-in byte-level tokenizer and ChatML].
    #[arg(long, requires = "trace")]
    tokenizer: Option<PathBuf>,
    /// The engines' KV block size, the unit of the oracle hit rates [default: 16].
    #[arg(long, requires = "trace")]
    block_size: Option<usize>,
    /// The fleet's total KV capacity in tokens: adds the hit rate of one LRU cache that size
    /// (oracle_fleet_hit_rate).
    #[arg(long, requires = "trace")]
    fleet_capacity_tokens: Option<usize>,
    /// Write one JSON line per trace request sent to FILE, in trace order: its oracle hits and
    /// TTFT floor beside its TTFT, cached tokens and engine.
    #[arg(long, value_name = "FILE", requires = "trace")]
    requests_out: Option<PathBuf>,
    /// Bound on requests in flight for --rate and --trace [default: 1024].
    #[arg(long)]
    max_in_flight: Option<usize>,
    /// Seed of the generated texts and arrivals [default: 0].
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

impl LoadArgs {
    fn config(&self) -> anyhow::Result<LoadgenConfig> {
        let (first, more) = self.target.split_first().context("--target is required")?;
        let mut config = LoadgenConfig::new(first, &self.model);
        config.more_targets = more.to_vec();
        if let Some(secs) = self.duration {
            anyhow::ensure!(
                secs.is_finite() && secs > 0.0,
                "--duration {secs} is not a positive number of seconds"
            );
            config.duration = Duration::from_secs_f64(secs);
        }
        config.session_header = self.session_header.clone();
        config.max_in_flight = self.max_in_flight.unwrap_or(config.max_in_flight);
        config.arrival = match (self.concurrency, self.rate) {
            (_, Some(rate)) => Arrival::Rate(rate),
            (Some(n), None) => Arrival::Concurrency(n),
            (None, None) => config.arrival,
        };
        config.workload = match &self.trace {
            Some(path) => {
                let mut spec = TraceSpec::new(path);
                spec.pace = match (self.offered_load, self.time_scale) {
                    (Some(load), _) => Pace::OfferedLoad(load),
                    (None, Some(scale)) => Pace::TimeScale(scale),
                    (None, None) => spec.pace,
                };
                spec.engines = self.engines;
                spec.prefill_tokens_per_sec = self.prefill_tokens_per_sec;
                spec.max_requests = self.max_requests;
                spec.block_tokens = self.trace_block_tokens.unwrap_or(spec.block_tokens);
                spec.length_scale = self.trace_length_scale.unwrap_or(spec.length_scale);
                spec.tokenizer = self.tokenizer.clone();
                spec.engine_block_size = self.block_size.unwrap_or(spec.engine_block_size);
                spec.fleet_capacity_tokens = self.fleet_capacity_tokens;
                spec.requests_out = self.requests_out.clone();
                Workload::Trace(spec)
            }
            None => {
                let d = SessionSpec::default();
                Workload::Sessions(SessionSpec {
                    sessions: self.sessions.unwrap_or(d.sessions),
                    turns: self.turns.unwrap_or(d.turns),
                    system_prompts: self.system_prompts.unwrap_or(d.system_prompts),
                    system_prompt_tokens: self
                        .system_prompt_tokens
                        .unwrap_or(d.system_prompt_tokens),
                    turn_tokens: self.turn_tokens.unwrap_or(d.turn_tokens),
                    output_tokens: self.output_tokens.unwrap_or(d.output_tokens),
                    seed: self.seed,
                })
            }
        };
        Ok(config)
    }
}

fn say(lines: &[String]) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    for line in lines {
        writeln!(stdout, "{line}")?;
    }
    stdout.flush()?;
    Ok(())
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let terminate = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(_) => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            () = terminate => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn run_engine(args: EngineArgs) -> anyhow::Result<ExitCode> {
    let config = args.config();
    let cancel = CancellationToken::new();
    let running = engine::serve(config, cancel.clone()).await.context("engine failed to start")?;
    say(&running.ready_lines())?;
    let done = running.wait();
    tokio::pin!(done);
    let exit = tokio::select! {
        exit = &mut done => exit,
        () = shutdown_signal() => {
            cancel.cancel();
            done.await
        }
    };
    Ok(match exit {
        Exit::Stopped => ExitCode::SUCCESS,
        Exit::Died { answered } => {
            tracing::warn!(answered, "exiting: --die-after reached");
            ExitCode::from(DIED_EXIT_CODE)
        }
    })
}

async fn run_load(args: LoadArgs) -> anyhow::Result<ExitCode> {
    let config = args.config()?;
    let report = load::run(&config).await.context("load generator failed")?;
    let mut lines: Vec<String> = report.summary().lines().map(str::to_owned).collect();
    if args.json {
        lines.push(report.to_json().to_string());
    }
    say(&lines)?;
    Ok(ExitCode::SUCCESS)
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Engine(args) => run_engine(*args).await,
        Command::Load(args) => run_load(*args).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(args: &[&str]) -> Result<LoadArgs, clap::Error> {
        let base = ["router-sim", "load", "--target", "http://h:1", "--model", "m"];
        let cli = Cli::try_parse_from(base.iter().chain(args))?;
        match cli.command {
            Command::Load(args) => Ok(*args),
            Command::Engine(_) => unreachable!("a load command"),
        }
    }

    fn trace_spec(args: &[&str]) -> TraceSpec {
        let config = load(args).expect("parses").config().expect("a config");
        match config.workload {
            Workload::Trace(spec) => spec,
            Workload::Sessions(_) => unreachable!("a trace"),
        }
    }

    #[test]
    fn offered_load_flags_make_the_trace_spec() {
        let spec = trace_spec(&[
            "--trace",
            "t.jsonl",
            "--offered-load",
            "0.8",
            "--engines",
            "4",
            "--prefill-tokens-per-sec",
            "5000",
            "--fleet-capacity-tokens",
            "65536",
        ]);
        assert_eq!(spec.pace, Pace::OfferedLoad(0.8));
        assert_eq!((spec.engines, spec.prefill_tokens_per_sec), (Some(4), Some(5000.0)));
        assert_eq!(
            trace_spec(&["--trace", "t.jsonl", "--time-scale", "3"]).pace,
            Pace::TimeScale(3.0)
        );
        assert_eq!(trace_spec(&["--trace", "t.jsonl"]).pace, Pace::TimeScale(1.0));
    }

    #[test]
    fn offered_load_conflicts_with_time_scale_and_needs_a_trace() {
        let both = ["--trace", "t.jsonl", "--offered-load", "0.5", "--time-scale", "2"];
        let err = load(&both).expect_err("conflict").to_string();
        assert!(err.contains("--offered-load") && err.contains("--time-scale"), "{err}");
        for flag in ["--offered-load", "--engines", "--prefill-tokens-per-sec"] {
            let err = load(&[flag, "1"]).expect_err("needs --trace").to_string();
            assert!(err.contains("--trace"), "{flag}: {err}");
        }
    }
}
