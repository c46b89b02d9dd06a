//! Router overhead: the same requests straight to a fast engine and through the router, side
//! by side in one run, with the router's own CPU time per request read from `/proc`; and the
//! page section `overhead`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::fake_engine::FakeEngine;
use super::procs::{Bins, Proc, engine};

/// One measured run.
#[derive(Clone, Debug)]
pub(crate) struct Run {
    pub(crate) requests: usize,
    pub(crate) errors: usize,
    pub(crate) elapsed: Duration,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    /// Router CPU per request, when the run went through the router.
    pub(crate) router_cpu_us: Option<f64>,
}

impl Run {
    pub(crate) fn rps(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }
}

/// The medians over repetitions of each case.
#[derive(Debug)]
pub(crate) struct Overhead {
    pub(crate) cases: Vec<(String, Run)>,
}

pub(crate) async fn blast(
    url: &str,
    body: &'static str,
    total: usize,
    concurrency: usize,
) -> Result<(Vec<f64>, usize, Duration)> {
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
            let mut errors = 0;
            while next.fetch_add(1, Ordering::Relaxed) < total {
                let request = http::Request::post(uri.clone())
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from_static(body.as_bytes())))
                    .expect("request");
                let start = Instant::now();
                let ok = match client.request(request).await {
                    Ok(response) => {
                        let ok = response.status().is_success();
                        ok && response.into_body().collect().await.is_ok()
                    }
                    Err(_) => false,
                };
                if ok {
                    latencies.push(start.elapsed().as_secs_f64() * 1000.0);
                } else {
                    errors += 1;
                }
            }
            (latencies, errors)
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    for worker in workers {
        let (l, e) = worker.await?;
        latencies.extend(l);
        errors += e;
    }
    Ok((latencies, errors, started.elapsed()))
}

pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

const NON_STREAMING: &str =
    r#"{"model":"m","messages":[{"role":"user","content":"ping"}],"max_tokens":1}"#;
const NON_STREAMING_64: &str =
    r#"{"model":"m","messages":[{"role":"user","content":"ping"}],"max_tokens":64}"#;
const STREAMING_64: &str =
    r#"{"model":"m","messages":[{"role":"user","content":"ping"}],"max_tokens":64,"stream":true}"#;

/// Runs every case `repeats` times, alternating direct and routed runs, and keeps the median
/// run (by throughput) of each.
/// Where a case sends its requests.
#[derive(Clone, Copy, Debug)]
enum Target {
    /// Straight to `engines[i]`.
    Engine(usize),
    /// Through `routers[i]`.
    Router(usize),
}

/// With `only`, just the cases whose name contains it.
pub(crate) fn measure(
    bins: &Bins,
    requests: usize,
    repeats: usize,
    only: Option<&str>,
) -> Result<Overhead> {
    let fast = ["--prefill-tokens-per-sec", "1e9", "--decode-tokens-per-sec", "1e9"];
    // Three fast engines: one streams every token as its own chunk (SGLang's default), one 16
    // tokens per chunk (`--stream-interval 16`), one the whole answer at once (an ideal engine):
    // a proxy's streaming cost is per chunk.
    let sims = [
        engine(bins, &fast)?,
        engine(bins, &[&fast[..], &["--stream-interval", "16"]].concat())?,
        engine(bins, &[&fast[..], &["--stream-interval", "64"]].concat())?,
    ];
    // And a canned responder, so that streaming and non-streaming cost the engine the same.
    let fake = FakeEngine::start()?;
    let engines: Vec<&str> =
        sims.iter().map(|(_, url)| url.as_str()).chain([fake.url.as_str()]).collect();
    // The router's runtime gets one thread: this machine's cores are shared with the engine and
    // the client, and a second router thread mostly adds cross-thread wake-ups. The default
    // (one thread per core) runs once too, for comparison.
    let start_router = |engine_url: &str, threads: Option<&str>| -> Result<(Proc, String)> {
        let mut args: Vec<String> =
            ["--worker-urls", engine_url, "--policy", "round_robin", "--port", "0"]
                .iter()
                .map(|s| (*s).to_owned())
                .collect();
        if let Some(threads) = threads {
            args.extend(["--worker-threads".to_owned(), threads.to_owned()]);
        }
        let router = Proc::start(&bins.server, &args, "router listening on ")?;
        let url = router.after("router listening on ")?;
        Ok((router, url))
    };
    let routers = [
        start_router(engines[0], Some("1"))?,
        start_router(engines[0], None)?,
        start_router(engines[1], Some("1"))?,
        start_router(engines[2], Some("1"))?,
        start_router(engines[3], Some("1"))?,
    ];
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("runtime")?;
    let concurrency = 16;
    // (name, body, target): the engine or router of that index.
    let all: [(&str, &'static str, Target); 15] = [
        ("direct, non-streaming, 1 token", NON_STREAMING, Target::Engine(0)),
        ("router, non-streaming, 1 token", NON_STREAMING, Target::Router(0)),
        ("router (threads = cores), non-streaming, 1 token", NON_STREAMING, Target::Router(1)),
        ("direct, non-streaming, 64 tokens", NON_STREAMING_64, Target::Engine(0)),
        ("router, non-streaming, 64 tokens", NON_STREAMING_64, Target::Router(0)),
        ("direct, streaming, 64 tokens", STREAMING_64, Target::Engine(0)),
        ("router, streaming, 64 tokens", STREAMING_64, Target::Router(0)),
        ("direct, streaming, 64 tokens, 16 per chunk", STREAMING_64, Target::Engine(1)),
        ("router, streaming, 64 tokens, 16 per chunk", STREAMING_64, Target::Router(2)),
        ("direct, streaming, 64 tokens, one chunk", STREAMING_64, Target::Engine(2)),
        ("router, streaming, 64 tokens, one chunk", STREAMING_64, Target::Router(3)),
        ("direct, fake engine, non-streaming, 64 tokens", NON_STREAMING_64, Target::Engine(3)),
        ("router, fake engine, non-streaming, 64 tokens", NON_STREAMING_64, Target::Router(4)),
        ("direct, fake engine, streaming, 64 tokens", STREAMING_64, Target::Engine(3)),
        ("router, fake engine, streaming, 64 tokens", STREAMING_64, Target::Router(4)),
    ];
    let cases: Vec<_> = all
        .into_iter()
        .filter(|(name, _, _)| only.is_none_or(|text| name.contains(text)))
        .collect();
    // Warm both paths (connection pools, allocator) before measuring.
    for engine_url in &engines {
        runtime.block_on(blast(engine_url, NON_STREAMING, 500, concurrency))?;
    }
    for (_, router_url) in &routers {
        runtime.block_on(blast(router_url, NON_STREAMING, 500, concurrency))?;
    }
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); cases.len()];
    for _ in 0..repeats {
        for (i, (_, body, target)) in cases.iter().enumerate() {
            let (router, url) = match *target {
                Target::Router(r) => (Some(&routers[r].0), routers[r].1.as_str()),
                Target::Engine(e) => (None, engines[e]),
            };
            let cpu_before = router.map(Proc::cpu_time).transpose()?;
            let (mut latencies, errors, elapsed) =
                runtime.block_on(blast(url, body, requests, concurrency))?;
            let cpu = match (router, cpu_before) {
                (Some(router), Some(before)) => Some(router.cpu_time()? - before),
                _ => None,
            };
            latencies.sort_by(f64::total_cmp);
            runs[i].push(Run {
                requests: latencies.len(),
                errors,
                elapsed,
                p50_ms: percentile(&latencies, 50.0),
                p99_ms: percentile(&latencies, 99.0),
                router_cpu_us: cpu.map(|cpu| cpu.as_secs_f64() * 1e6 / requests as f64),
            });
        }
    }
    let cases = cases
        .iter()
        .zip(runs)
        .map(|((name, _, _), mut runs)| {
            runs.sort_by(|a, b| a.rps().total_cmp(&b.rps()));
            ((*name).to_owned(), runs[runs.len() / 2].clone())
        })
        .collect();
    Ok(Overhead { cases })
}

/// The page section `overhead`: the table, the streaming ratios and the CPU plot.
pub(crate) fn render(overhead: &Overhead) -> String {
    let mut page = String::from("## Router overhead\n\n");
    page.push_str(
        "router-sim engines that answer at once (prefill and decode at 1e9 tokens/s), 16 \
         concurrent clients, the same requests straight to an engine and through a router \
         (round_robin) in front of it. Router CPU is the router process's user+system time over \
         the run divided by its requests. The router runs with `--worker-threads 1` (this \
         machine's two cores are shared with the engine and the client) except in the row \
         marked `threads = cores`. Streaming is measured three ways: one chunk per token (the \
         engines' default), 16 tokens per chunk (`--stream-interval 16`) and the whole answer \
         in one chunk: a proxy pays one read and one write per chunk. The `fake engine` rows use a \
         canned responder inside the benchmark (the same 64 tokens as JSON or as SSE events, \
         written at once), so that the engine costs the same whether it streams or not. Each case is the median \
         (by throughput) of its repetitions, run alternately.\n\n",
    );
    page.push_str("| case | requests | errors | req/s | p50 ms | p99 ms | router CPU/request |\n|---|---|---|---|---|---|---|\n");
    for (name, run) in &overhead.cases {
        let _ = writeln!(
            page,
            "| {name} | {} | {} | {:.0} | {:.2} | {:.2} | {} |",
            run.requests,
            run.errors,
            run.rps(),
            run.p50_ms,
            run.p99_ms,
            run.router_cpu_us.map_or("-".to_owned(), |us| format!("{us:.1} us")),
        );
    }
    let rps = |name: &str| overhead.cases.iter().find(|(n, _)| n == name).map(|(_, r)| r.rps());
    let plain = rps("router, non-streaming, 64 tokens");
    let direct_plain = rps("direct, non-streaming, 64 tokens");
    page.push('\n');
    for chunking in ["", ", 16 per chunk", ", one chunk"] {
        let routed = rps(&format!("router, streaming, 64 tokens{chunking}"));
        let direct = rps(&format!("direct, streaming, 64 tokens{chunking}"));
        if let (Some(routed), Some(direct), Some(plain), Some(direct_plain)) =
            (routed, direct, plain, direct_plain)
        {
            let label = if chunking.is_empty() { ", one chunk per token" } else { chunking };
            let _ = writeln!(
                page,
                "- Streaming 64 tokens{label}: through the router {:.0}% of the direct streaming \
                 throughput; {:.0}% of the router's non-streaming throughput for the same answers \
                 (the engine alone: {:.0}%).",
                routed / direct * 100.0,
                routed / plain * 100.0,
                direct / direct_plain * 100.0,
            );
        }
    }
    if let (Some(stream), Some(plain)) = (
        rps("router, fake engine, streaming, 64 tokens"),
        rps("router, fake engine, non-streaming, 64 tokens"),
    ) {
        let _ = writeln!(
            page,
            "- With the fake engine (a canned answer in one write, so both modes cost it the \
             same): streaming through the router reaches {:.0}% of the non-streaming throughput.",
            stream / plain * 100.0
        );
    }
    page.push('\n');
    page.push_str("![router CPU per request](bench-router-cpu.svg)\n");
    page
}
