//! Router overhead against a generic proxy: the same requests straight to a fast engine,
//! through the router and through nginx in front of it, side by side in one run, with each
//! proxy's CPU time per request and per streamed event read from `/proc`; and the page section
//! `overhead`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::fake_engine::FakeEngine;
use super::nginx::{self, Nginx};
use super::procs::{Bins, Proc, engine};

/// What one load run saw.
pub(crate) struct Blast {
    /// Latencies of the successful requests, in ms, sorted.
    pub(crate) latencies: Vec<f64>,
    pub(crate) errors: usize,
    pub(crate) elapsed: Duration,
    /// SSE data events received over all answers (0 for JSON answers).
    pub(crate) events: usize,
}

/// Sends `total` copies of `body` to `url`'s chat endpoint from `concurrency` clients, each
/// answer read to its end.
pub(crate) async fn blast(
    url: &str,
    body: &'static str,
    total: usize,
    concurrency: usize,
) -> Result<Blast> {
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(concurrency)
        .build(HttpConnector::new());
    let next = Arc::new(AtomicUsize::new(0));
    let uri: http::Uri = format!("{url}/v1/chat/completions").parse()?;
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (client, next, uri) = (client.clone(), Arc::clone(&next), uri.clone());
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let (mut errors, mut events) = (0, 0);
            while next.fetch_add(1, Ordering::Relaxed) < total {
                let request = http::Request::post(uri.clone())
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from_static(body.as_bytes())))
                    .expect("request");
                let start = Instant::now();
                let answer = match client.request(request).await {
                    Ok(response) if response.status().is_success() => {
                        response.into_body().collect().await.ok().map(|b| b.to_bytes())
                    }
                    _ => None,
                };
                match answer {
                    Some(answer) => {
                        latencies.push(start.elapsed().as_secs_f64() * 1000.0);
                        events += data_events(&answer);
                    }
                    None => errors += 1,
                }
            }
            (latencies, errors, events)
        }));
    }
    let mut blast = Blast { latencies: Vec::new(), errors: 0, elapsed: Duration::ZERO, events: 0 };
    for worker in workers {
        let (latencies, errors, events) = worker.await?;
        blast.latencies.extend(latencies);
        blast.errors += errors;
        blast.events += events;
    }
    blast.elapsed = started.elapsed();
    blast.latencies.sort_by(f64::total_cmp);
    Ok(blast)
}

/// The SSE `data:` lines of `answer`.
fn data_events(answer: &[u8]) -> usize {
    let starts_line = |i: usize| i == 0 || answer[i - 1] == b'\n';
    answer.windows(5).enumerate().filter(|&(i, w)| w == b"data:" && starts_line(i)).count()
}

pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub(crate) const PLAIN: &str =
    r#"{"model":"m","messages":[{"role":"user","content":"ping"}],"max_tokens":64}"#;
pub(crate) const STREAM: &str =
    r#"{"model":"m","messages":[{"role":"user","content":"ping"}],"max_tokens":64,"stream":true}"#;

/// How a run's requests reach the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    Direct,
    Router,
    Nginx,
    /// The router with hyper reading every client connection (`--http1 hyper`).
    Hyper,
}

impl Via {
    const ALL: [Self; 4] = [Self::Direct, Self::Router, Self::Nginx, Self::Hyper];
}

/// One engine and kind of request, measured on every path.
struct Scenario {
    name: &'static str,
    /// Index into the benchmark's engines.
    engine: usize,
    body: &'static str,
}

const SCENARIOS: [Scenario; 6] = [
    Scenario { name: "router-sim, plain", engine: 0, body: PLAIN },
    Scenario { name: "router-sim, stream, 1 token per event", engine: 0, body: STREAM },
    Scenario { name: "router-sim, stream, 16 events per write", engine: 1, body: STREAM },
    Scenario { name: "fake engine, plain", engine: 2, body: PLAIN },
    Scenario { name: "fake engine, stream, 1 token per event", engine: 2, body: STREAM },
    Scenario { name: "fake engine, stream, 16 tokens per event", engine: 3, body: STREAM },
];

/// One measured run.
#[derive(Clone, Debug)]
pub(crate) struct Run {
    pub(crate) requests: usize,
    pub(crate) errors: usize,
    pub(crate) elapsed: Duration,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    /// SSE data events per answer (0 for plain answers).
    pub(crate) events_per_request: f64,
    /// The proxy's CPU per request; none for runs straight to the engine.
    pub(crate) proxy_cpu_us: Option<f64>,
    /// The share of the proxy's CPU spent in user space (the rest in the kernel), from the
    /// clock ticks of `/proc/<pid>/stat`.
    pub(crate) proxy_user_share: Option<f64>,
}

impl Run {
    pub(crate) fn rps(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    /// The proxy's CPU per request in user space and in the kernel.
    pub(crate) fn proxy_user_system_us(&self) -> Option<(f64, f64)> {
        let (cpu, user) = (self.proxy_cpu_us?, self.proxy_user_share?);
        Some((cpu * user, cpu * (1.0 - user)))
    }

    /// The proxy's CPU per streamed event, for streams.
    pub(crate) fn proxy_cpu_per_event_us(&self) -> Option<f64> {
        self.proxy_cpu_us
            .filter(|_| self.events_per_request > 0.0)
            .map(|us| us / self.events_per_request)
    }
}

/// One scenario's median run on each path, and the ratios of each repetition's runs.
#[derive(Debug)]
pub(crate) struct Case {
    pub(crate) name: String,
    pub(crate) direct: Run,
    pub(crate) router: Run,
    pub(crate) nginx: Run,
    /// The router under `--http1 hyper`.
    pub(crate) hyper: Run,
    /// One per repetition, from its runs (made one after the other).
    pub(crate) paired: Vec<Paired>,
}

/// The ratios of one repetition's runs of a case: run one after the other, seconds apart, they
/// share the machine's load of the moment, which the medians of separate runs need not.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Paired {
    /// Router CPU per request over nginx's.
    pub(crate) cpu: f64,
    /// Requests per second through the router over direct.
    pub(crate) router_throughput: f64,
    /// Requests per second through nginx over direct.
    pub(crate) nginx_throughput: f64,
    /// Router CPU per request under `--http1 hyper` over nginx's.
    pub(crate) hyper_cpu: f64,
}

impl Paired {
    fn of(direct: &Run, router: &Run, nginx: &Run, hyper: &Run) -> Option<Self> {
        Some(Self {
            cpu: router.proxy_cpu_us? / nginx.proxy_cpu_us?,
            hyper_cpu: hyper.proxy_cpu_us? / nginx.proxy_cpu_us?,
            router_throughput: router.rps() / direct.rps(),
            nginx_throughput: nginx.rps() / direct.rps(),
        })
    }
}

/// The median of `values` and their range, as the page shows them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Spread {
    pub(crate) median: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
}

impl Spread {
    fn of(values: impl Iterator<Item = f64>) -> Option<Self> {
        let mut values: Vec<f64> = values.collect();
        values.sort_by(f64::total_cmp);
        let (&min, &max) = (values.first()?, values.last()?);
        let mid = values.len() / 2;
        let median = if values.len().is_multiple_of(2) {
            (values[mid - 1] + values[mid]) / 2.0
        } else {
            values[mid]
        };
        Some(Self { median, min, max })
    }

    /// `median (min–max)`, each through `show`.
    fn render(&self, show: impl Fn(f64) -> String) -> String {
        format!("{} ({}–{})", show(self.median), show(self.min), show(self.max))
    }
}

impl Case {
    /// Router CPU per request over nginx's, over the repetitions.
    pub(crate) fn cpu_ratio(&self) -> Option<Spread> {
        Spread::of(self.paired.iter().map(|p| p.cpu))
    }

    /// Router CPU per request under `--http1 hyper` over nginx's, over the repetitions.
    pub(crate) fn hyper_cpu_ratio(&self) -> Option<Spread> {
        Spread::of(self.paired.iter().map(|p| p.hyper_cpu))
    }

    /// Requests per second through the router, and through nginx, over direct.
    pub(crate) fn throughput(&self) -> Option<(Spread, Spread)> {
        let router = Spread::of(self.paired.iter().map(|p| p.router_throughput))?;
        Some((router, Spread::of(self.paired.iter().map(|p| p.nginx_throughput))?))
    }
}

/// The medians over repetitions of each case.
#[derive(Debug)]
pub(crate) struct Overhead {
    pub(crate) cases: Vec<Case>,
}

/// Runs every scenario `repeats` times on each path, the paths' order rotating from one
/// repetition to the next, and keeps the median run (by throughput) of each and the ratios of
/// each repetition. With `only`, just the scenarios whose name contains it.
pub(crate) fn measure(
    bins: &Bins,
    requests: usize,
    repeats: usize,
    only: Option<&str>,
) -> Result<Overhead> {
    let nginx_bin = nginx::binary()?;
    let fast = ["--prefill-tokens-per-sec", "1e9", "--decode-tokens-per-sec", "1e9"];
    // router-sim engines that answer at once, streaming every token as its own event, one
    // writing each event as it comes (SGLang's default) and one 16 at a time
    // (`--stream-interval 16`); and canned responders whose whole answer is one write, with 1 or
    // 16 tokens per event, so that the engine costs nothing beside the proxy.
    let sims =
        [engine(bins, &fast)?, engine(bins, &[&fast[..], &["--stream-interval", "16"]].concat())?];
    let fakes = [FakeEngine::start(1)?, FakeEngine::start(16)?];
    let engines: Vec<&str> = sims
        .iter()
        .map(|(_, url)| url.as_str())
        .chain(fakes.iter().map(|fake| fake.url.as_str()))
        .collect();
    // The router's runtime gets one thread, as nginx gets one worker: this machine's two cores
    // are shared with the engine and the client.
    let start_router = |url: &str, front: &str| {
        let args = [
            "--worker-urls",
            url,
            "--policy",
            "round_robin",
            "--port",
            "0",
            "--worker-threads",
            "1",
            "--http1",
            front,
        ]
        .map(str::to_owned);
        let router = Proc::start(&bins.server, &args, "router listening on ")?;
        let url = router.after("router listening on ")?;
        anyhow::Ok((router, url))
    };
    let routers = engines.iter().map(|url| start_router(url, "own")).collect::<Result<Vec<_>>>()?;
    let hypers =
        engines.iter().map(|url| start_router(url, "hyper")).collect::<Result<Vec<_>>>()?;
    let nginxes =
        engines.iter().map(|url| Nginx::start(&nginx_bin, url)).collect::<Result<Vec<_>>>()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("runtime")?;
    let concurrency = 16;
    let scenarios: Vec<&Scenario> =
        SCENARIOS.iter().filter(|s| only.is_none_or(|text| s.name.contains(text))).collect();
    // Every path answers, and is warm (connection pools, allocator), before measuring.
    let proxies =
        (routers.iter().chain(&hypers)).map(|(_, url)| url).chain(nginxes.iter().map(|n| &n.url));
    for url in engines.iter().copied().chain(proxies.map(String::as_str)) {
        let warm = runtime.block_on(blast(url, PLAIN, 500, concurrency))?;
        if warm.errors > 0 {
            bail!("{} of 500 warm-up requests to {url} failed", warm.errors);
        }
    }
    let mut runs: Vec<[Vec<Run>; 4]> = scenarios.iter().map(|_| Default::default()).collect();
    for repeat in 0..repeats {
        for (i, scenario) in scenarios.iter().enumerate() {
            let mut order = Via::ALL;
            order.rotate_left(repeat % Via::ALL.len());
            for via in order {
                let (url, proxy) = match via {
                    Via::Direct => (engines[scenario.engine], None),
                    Via::Router => {
                        let (proc, url) = &routers[scenario.engine];
                        (url.as_str(), Some(proc))
                    }
                    Via::Nginx => {
                        let nginx = &nginxes[scenario.engine];
                        (nginx.url.as_str(), Some(&nginx.process))
                    }
                    Via::Hyper => {
                        let (proc, url) = &hypers[scenario.engine];
                        (url.as_str(), Some(proc))
                    }
                };
                let run = one_run(&runtime, url, proxy, scenario.body, requests, concurrency)?;
                runs[i][via as usize].push(run);
            }
        }
        eprintln!("  repetition {} of {repeats} done", repeat + 1);
    }
    let cases = scenarios
        .iter()
        .zip(runs)
        .map(|(scenario, [direct, router, nginx, hyper])| {
            let paired = (direct.iter().zip(&router).zip(&nginx).zip(&hyper))
                .filter_map(|(((direct, router), nginx), hyper)| {
                    Paired::of(direct, router, nginx, hyper)
                })
                .collect();
            Case {
                name: scenario.name.to_owned(),
                direct: median(direct),
                router: median(router),
                nginx: median(nginx),
                hyper: median(hyper),
                paired,
            }
        })
        .collect();
    Ok(Overhead { cases })
}

fn one_run(
    runtime: &tokio::runtime::Runtime,
    url: &str,
    proxy: Option<&Proc>,
    body: &'static str,
    requests: usize,
    concurrency: usize,
) -> Result<Run> {
    let ticks_per_sec = super::procs::clock_ticks_per_sec();
    let user_system = |proxy: &Proc| proxy.stat_user_system(ticks_per_sec);
    let before =
        proxy.map(|proxy| Ok::<_, anyhow::Error>((proxy.cpu_time()?, user_system(proxy)?)));
    let before = before.transpose()?;
    let blast = runtime.block_on(blast(url, body, requests, concurrency))?;
    let (cpu, user_share) = match (proxy, before) {
        (Some(proxy), Some((cpu, (user, system)))) => {
            let (user_after, system_after) = user_system(proxy)?;
            let (user, system) = (user_after - user, system_after - system);
            let ticked = (user + system).as_secs_f64();
            let share = (ticked > 0.0).then(|| user.as_secs_f64() / ticked);
            (Some(proxy.cpu_time()? - cpu), share)
        }
        _ => (None, None),
    };
    let served = blast.latencies.len();
    Ok(Run {
        requests: served,
        errors: blast.errors,
        elapsed: blast.elapsed,
        p50_ms: percentile(&blast.latencies, 50.0),
        p99_ms: percentile(&blast.latencies, 99.0),
        events_per_request: blast.events as f64 / served.max(1) as f64,
        proxy_cpu_us: cpu.map(|cpu| cpu.as_secs_f64() * 1e6 / requests as f64),
        proxy_user_share: user_share,
    })
}

/// The median run by throughput.
fn median(mut runs: Vec<Run>) -> Run {
    runs.sort_by(|a, b| a.rps().total_cmp(&b.rps()));
    runs.swap_remove(runs.len() / 2)
}

/// The bars of the CPU plot: router and nginx CPU per request of every case.
pub(crate) fn cpu_rows(overhead: &Overhead) -> Vec<(String, f64)> {
    let mut rows = Vec::new();
    for case in &overhead.cases {
        for (proxy, run) in
            [("router", &case.router), ("router, hyper", &case.hyper), ("nginx", &case.nginx)]
        {
            if let Some(us) = run.proxy_cpu_us {
                rows.push((format!("{}: {proxy}", case.name), us));
            }
        }
    }
    rows
}

/// The page section `overhead`: every run, the router against nginx, and the CPU plot.
pub(crate) fn render(overhead: &Overhead) -> String {
    let mut page = String::from("## Router overhead\n\n");
    page.push_str(
        "The same requests (a chat completion of 64 tokens, 16 concurrent clients) straight to \
         an engine, through the router (round_robin, `--worker-threads 1`; its own HTTP/1.1 \
         loop, the default, and with hyper reading every client connection, `--http1 hyper`) \
         and through nginx \
         (`xtask/src/bench/nginx.conf`: one worker in one process, keep-alive upstream \
         connections, `proxy_buffering off`) in front of the same engine. Engines: router-sim \
         answering at once (prefill and decode at 1e9 tokens/s), one event per token, each \
         event written as it comes (SGLang's default) or 16 at a time (`--stream-interval \
         16`), and a canned \
         responder inside the benchmark (the `fake engine`: the whole answer in one write, \
         JSON or SSE events of 1 or 16 tokens), which costs nothing beside the proxy. Proxy CPU \
         is the proxy process's run time over the run (from `/proc/<pid>/task/*/schedstat`) \
         divided by its requests, and by the SSE events each answer carried. Each row is the \
         median run (by throughput) of its repetitions; the four paths of a case run one \
         after the other, their order rotating between repetitions.\n\n",
    );
    page.push_str(
        "| case | path | requests | errors | req/s | p50 ms | p99 ms | events/request | proxy CPU/request | proxy CPU/event |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    let us = |value: Option<f64>| value.map_or("-".to_owned(), |us| format!("{us:.1} us"));
    for case in &overhead.cases {
        for (path, run) in [
            ("direct", &case.direct),
            ("router", &case.router),
            ("router, `--http1 hyper`", &case.hyper),
            ("nginx", &case.nginx),
        ] {
            let _ = writeln!(
                page,
                "| {} | {path} | {} | {} | {:.0} | {:.2} | {:.2} | {:.1} | {} | {} |",
                case.name,
                run.requests,
                run.errors,
                run.rps(),
                run.p50_ms,
                run.p99_ms,
                run.events_per_request,
                us(run.proxy_cpu_us),
                us(run.proxy_cpu_per_event_us()),
            );
        }
    }
    let repeats = overhead.cases.first().map_or(0, |case| case.paired.len());
    let _ = write!(
        page,
        "\n### The router against nginx\n\n\
         Each ratio is the median over the {repeats} repetitions of the ratio within one \
         repetition (whose runs follow each other, under the same load of this shared \
         machine), with the lowest and highest in brackets; the CPU columns are those of the \
         median runs above.\n\n\
         | case | router CPU/request | nginx CPU/request | router ÷ nginx | router (hyper) ÷ nginx | router user + kernel | nginx user + kernel | router req/s ÷ direct | nginx req/s ÷ direct |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    let split = |run: &Run| {
        run.proxy_user_system_us()
            .map_or("-".to_owned(), |(user, system)| format!("{user:.1} + {system:.1} us"))
    };
    let times = |ratio: f64| format!("{ratio:.2}x");
    let percent = |ratio: f64| format!("{:.0}%", ratio * 100.0);
    for case in &overhead.cases {
        let (router_throughput, nginx_throughput) = case.throughput().map_or_else(
            || ("-".to_owned(), "-".to_owned()),
            |(router, nginx)| (router.render(percent), nginx.render(percent)),
        );
        let _ = writeln!(
            page,
            "| {} | {} | {} | {} | {} | {} | {} | {router_throughput} | {nginx_throughput} |",
            case.name,
            us(case.router.proxy_cpu_us),
            us(case.nginx.proxy_cpu_us),
            case.cpu_ratio().map_or("-".to_owned(), |ratio| ratio.render(times)),
            case.hyper_cpu_ratio().map_or("-".to_owned(), |ratio| ratio.render(times)),
            split(&case.router),
            split(&case.nginx),
        );
    }
    page.push_str(
        "\nUser + kernel splits each proxy's CPU per request by the shares of its user and \
         system clock ticks over the run (`/proc/<pid>/stat`; each 10 ms tick is charged to the \
         mode it lands in, so the split is approximate). Both proxies read and write once on \
         each side of a plain request (two reads and two writes, under strace); nginx also \
         asks the engine's socket for its error state each time (getsockopt). The router makes \
         no more system calls than nginx: what it spends beyond nginx is user-space work, \
         whose instructions are counted below.\n\n\
         The aim: router CPU per plain request at most 1.3x nginx's, per stream of one event \
         per token at most 1.5x, and streaming throughput through the router at least 90% of \
         direct at one event per token.\n\n![proxy CPU per request](bench-router-cpu.svg)\n",
    );
    page
}

#[cfg(test)]
mod tests {
    use super::Spread;

    #[test]
    fn a_spread_is_the_median_and_the_range() {
        let spread = |values: &[f64]| Spread::of(values.iter().copied());
        assert_eq!(spread(&[]), None);
        assert_eq!(spread(&[1.2]), Some(Spread { median: 1.2, min: 1.2, max: 1.2 }));
        assert_eq!(spread(&[1.5, 1.0, 1.25]), Some(Spread { median: 1.25, min: 1.0, max: 1.5 }));
        assert_eq!(
            spread(&[2.0, 1.0, 1.5, 1.0]),
            Some(Spread { median: 1.25, min: 1.0, max: 2.0 })
        );
        let shown = Spread { median: 1.234, min: 1.0, max: 1.5 }.render(|r| format!("{r:.2}x"));
        assert_eq!(shown, "1.23x (1.00x–1.50x)");
    }
}
