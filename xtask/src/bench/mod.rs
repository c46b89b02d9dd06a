//! `cargo xtask bench [--quick]`: the end-to-end benchmark against the simulated fleet.
//!
//! Builds the release binaries, then measures in one run, side by side:
//! 1. router overhead: requests straight to a fast engine and through the router (router CPU
//!    per request from `/proc`, throughput, latency), non-streaming and streaming;
//! 2. every policy on the same 8-engine fleet and multi-turn chat workload (cache hit rate,
//!    time to first token, per-engine share, throughput), each run on a fresh fleet.
//!
//! Writes `docs/benchmarks.md` and SVG plots beside it. `--quick` shrinks every run so the
//! whole benchmark finishes in about a minute.

mod fake_engine;
mod overhead;
mod policies;
mod procs;
mod svg;
mod trace;

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use crate::cargo;

/// Which sections to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Only {
    All,
    Overhead,
    Policies,
    Trace,
}

/// What `cargo xtask bench` was asked for.
#[derive(Debug)]
pub(crate) struct Options {
    pub(crate) quick: bool,
    pub(crate) only: Only,
    /// Build the release binaries first.
    pub(crate) build: bool,
    /// Run only the overhead cases whose name contains this, and write nothing: for profiling.
    pub(crate) case: Option<String>,
}

pub(crate) fn run(root: &Path, options: Options) -> Result<()> {
    let Options { quick, only, build, case } = options;
    let only = if case.is_some() { Only::Overhead } else { only };
    if build {
        cargo(root, &["build", "--release", "-p", "router-server", "-p", "router-sim"])?;
    }
    let bins = procs::Bins::release(root);
    let tokenizer = root.join("crates/router-sim/assets/tokenizer.json").display().to_string();

    let (requests, repeats) = if quick { (1_000, 1) } else { (10_000, 3) };
    let overhead = if only == Only::Policies {
        overhead::Overhead { cases: Vec::new() }
    } else {
        eprintln!("xtask bench: router overhead ({requests} requests x {repeats} per case)");
        let overhead = overhead::measure(&bins, requests, repeats, case.as_deref())?;
        for (name, run) in &overhead.cases {
            eprintln!(
                "  {name}: {:.0} req/s, p50 {:.2} ms, router CPU {}",
                run.rps(),
                run.p50_ms,
                run.router_cpu_us.map_or("-".to_owned(), |us| format!("{us:.1} us/request"))
            );
        }
        if only == Only::Overhead {
            return Ok(());
        }
        overhead
    };

    let workload = if quick { policies::Workload::quick() } else { policies::Workload::full() };
    let mut runs = Vec::new();
    if only != Only::Trace {
        for policy in policies::POLICIES {
            eprintln!("xtask bench: policy {policy}");
            match policies::run(&bins, policy, &workload, &tokenizer) {
                Ok(run) => runs.push(Ok(run)),
                Err(err) => runs.push(Err(((*policy).to_owned(), format!("{err:#}")))),
            }
        }
    }
    let replay = if quick { trace::Replay::quick() } else { trace::Replay::full() };
    let mut trace_runs = Vec::new();
    if only != Only::Policies {
        // Quick mode replays one trace through the baseline and the two affinity policies.
        let (traces, trace_policies): (Vec<_>, &[&str]) = if quick {
            (
                trace::traces(root).into_iter().take(1).collect(),
                &["round_robin", "session_aware", "cache_aware"],
            )
        } else {
            (trace::traces(root), policies::POLICIES)
        };
        for trace_file in traces {
            for policy in trace_policies {
                eprintln!("xtask bench: trace {} policy {policy}", trace_file.0);
                match trace::run(&bins, &trace_file, policy, &replay, &tokenizer) {
                    Ok(run) => trace_runs.push(Ok(run)),
                    Err(err) => trace_runs
                        .push(Err((format!("{} {policy}", trace_file.0), format!("{err:#}")))),
                }
            }
        }
    }

    let docs = root.join("docs");
    std::fs::create_dir_all(&docs)?;
    let mut page = render(&overhead, &runs, &workload, quick);
    page.push_str(&render_trace(&trace_runs, &replay));
    std::fs::write(docs.join("benchmarks.md"), page)?;
    let ok: Vec<&policies::PolicyRun> = runs.iter().filter_map(|r| r.as_ref().ok()).collect();
    let rows = |key: &str| -> Vec<(String, f64)> {
        ok.iter().map(|r| (r.policy.clone(), r.number(key))).collect()
    };
    std::fs::write(
        docs.join("bench-hit-rate.svg"),
        svg::bars("cache hit rate", "", &rows("cache_hit_rate")),
    )?;
    std::fs::write(
        docs.join("bench-ttft-p99.svg"),
        svg::bars("TTFT p99", "ms", &rows("ttft_p99_ms")),
    )?;
    std::fs::write(
        docs.join("bench-ttft-p50.svg"),
        svg::bars("TTFT p50", "ms", &rows("ttft_p50_ms")),
    )?;
    let overhead_rows: Vec<(String, f64)> = overhead
        .cases
        .iter()
        .filter_map(|(name, run)| run.router_cpu_us.map(|us| (name.replace("router, ", ""), us)))
        .collect();
    std::fs::write(
        docs.join("bench-router-cpu.svg"),
        svg::bars("router CPU per request", "us", &overhead_rows),
    )?;
    for name in ["conversation", "synthetic"] {
        let rows: Vec<(String, f64)> = trace_runs
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .filter(|r| r.trace == name)
            .map(|r| {
                (r.policy.clone(), r.number("cache_hit_rate") / r.number("oracle_fleet_hit_rate"))
            })
            .collect();
        if !rows.is_empty() {
            std::fs::write(
                docs.join(format!("bench-trace-{name}.svg")),
                svg::bars(&format!("{name} trace: hit rate / fleet oracle"), "", &rows),
            )?;
        }
    }
    eprintln!("xtask bench: wrote docs/benchmarks.md and docs/bench-*.svg");
    Ok(())
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown cpu".to_owned());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores, {cpu}")
}

fn render(
    overhead: &overhead::Overhead,
    runs: &[Result<policies::PolicyRun, (String, String)>],
    workload: &policies::Workload,
    quick: bool,
) -> String {
    let mut page = String::from("# Benchmarks\n\n");
    let _ = writeln!(
        page,
        "Produced by `cargo xtask bench{}` on {} (this file is overwritten by each run; the \
         machine is shared and noisy, so compare rows of one run, not runs).\n",
        if quick { " --quick" } else { "" },
        machine()
    );
    page.push_str("## Router overhead\n\n");
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
    page.push_str("![router CPU per request](bench-router-cpu.svg)\n\n");

    page.push_str("## Policies\n\n");
    let _ = writeln!(
        page,
        "{} router-sim engines ({} KV tokens each, prefill {} tokens/s, decode {} tokens/s per \
         request), byte-level tokenizer shared by router and engines, KV events over ZeroMQ and \
         load from `/v1/loads`. Workload: `router-sim load` with {} sessions of {} turns, {} \
         shared system prompts of {} tokens, {} tokens per user turn, {} output tokens, {} \
         concurrent requests, at most {} s; the session id travels in `x-session-id`. Every \
         policy gets a fresh fleet (cold caches).\n",
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
                let _ = writeln!(
                    page,
                    "| {policy} | failed: {} | | | | | | |",
                    error.replace('|', "/").replace('\n', " ")
                );
            }
        }
    }
    page.push_str("\n![cache hit rate](bench-hit-rate.svg)\n![TTFT p50](bench-ttft-p50.svg)\n![TTFT p99](bench-ttft-p99.svg)\n\n");
    page
}

fn render_trace(
    runs: &[Result<trace::TraceRun, (String, String)>],
    replay: &trace::Replay,
) -> String {
    let fleet = trace::fleet();
    let mut page = String::from("## Mooncake traces\n\n");
    let _ = writeln!(
        page,
        "The first {} requests of each Mooncake FAST'25 trace (`../shared/data/mooncake/`), replayed \
         {}x faster with every length scaled by {} (512-token blocks become {}-token ones; the \
         prefix structure is kept), on {} engines of {} KV tokens each (prefill {} tokens/s, decode \
         {} tokens/s per request), fresh for every policy. `oracle` is the hit rate one unlimited \
         cache would reach on the replayed prompts, `fleet oracle` that of one LRU cache of the \
         fleet's total capacity; both are computed by `router-sim load` from the trace itself, in \
         the engines' 16-token blocks over the prompts as the engines tokenize them.\n",
        replay.max_requests,
        replay.time_scale,
        replay.length_scale,
        (512.0 * replay.length_scale) as u64,
        fleet.engines,
        fleet.kv_capacity_tokens,
        fleet.prefill_tokens_per_sec,
        fleet.decode_tokens_per_sec,
    );
    page.push_str("| trace | policy | requests | errors | hit rate | oracle | fleet oracle | hit / fleet oracle | TTFT p50 ms | TTFT p99 ms | max share / mean |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for run in runs {
        match run {
            Ok(run) => {
                let shares: Vec<f64> = run.report["engine_share"]
                    .as_object()
                    .map(|m| m.values().filter_map(serde_json::Value::as_f64).collect())
                    .unwrap_or_default();
                let max_share = shares.iter().copied().fold(0.0, f64::max) * fleet.engines as f64;
                let _ = writeln!(
                    page,
                    "| {} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.2} | {:.1} | {:.1} | {:.2} |",
                    run.trace,
                    run.policy,
                    run.number("requests"),
                    run.number("errors"),
                    run.number("cache_hit_rate"),
                    run.number("oracle_hit_rate"),
                    run.number("oracle_fleet_hit_rate"),
                    run.number("cache_hit_rate") / run.number("oracle_fleet_hit_rate"),
                    run.number("ttft_p50_ms"),
                    run.number("ttft_p99_ms"),
                    max_share,
                );
            }
            Err((name, error)) => {
                let _ = writeln!(
                    page,
                    "| {name} | failed: {} | | | | | | | | | |",
                    error.replace('|', "/").replace('\n', " ")
                );
            }
        }
    }
    page.push_str("\n![conversation trace](bench-trace-conversation.svg)\n![synthetic trace](bench-trace-synthetic.svg)\n\n");
    page.push_str("## Reproduce\n\n```sh\ncargo xtask bench                   # everything, about ten minutes on 2 cores\ncargo xtask bench --quick           # every section, small\ncargo xtask bench --only overhead   # or policies, or trace\ncargo xtask bench --case streaming  # only the overhead cases naming it, nothing written (for perf/strace)\n```\n");
    page
}
