//! `cargo xtask bench [--quick] [--only SECTION]`: the end-to-end benchmark against the
//! simulated fleet.
//!
//! Builds the release binaries, then measures, each section on its own fleets:
//! 1. `overhead`: requests straight to a fast engine, through the router and through nginx
//!    (proxy CPU per request and per streamed event from `/proc`, throughput, latency), plain
//!    and streaming; nginx is installed from Debian's packages when missing;
//! 2. `epp`: the endpoint picker, the same requests through Envoy with a static route and
//!    through Envoy asking `router-server epp` over ext_proc (added latency, picker CPU per
//!    request; needs the Envoy 1.40 that `.ci/run` installs);
//! 3. `policies`: every policy on the same 8-engine fleet and multi-turn chat workload (cache
//!    hit rate, time to first token, per-engine share, throughput), each on a fresh fleet;
//! 4. `quality`: routing quality under load, the Mooncake traces replayed open-loop at set
//!    offered loads through the policies, beside the traces' own bounds (about 45 minutes);
//! 5. `replicas`: three router replicas over one fleet, sessions sprayed over them, against
//!    one router (session engine agreement, hit rate, TTFT; a replica restarted; a shared
//!    `kv-indexer`);
//! 6. `real` (only with `--only real`: it needs the vLLM of `tests/vllm/setup.sh`): the
//!    policies in front of two real vLLM engines, router-sim fitted to them, and whether the
//!    two rank the policies alike.
//!
//! Each section lives between markers in `docs/benchmarks.md` (see `page`), and a run
//! replaces only the sections it measured, with their SVG plots beside the page. `--quick`
//! shrinks every run so the whole benchmark finishes in a few minutes.

mod epp;
mod fake_engine;
mod instructions;
mod long;
mod nginx;
mod overhead;
mod page;
mod peers;
mod policies;
mod procs;
mod quality;
mod real;
mod replicas;
mod svg;

use std::path::Path;

use anyhow::Result;

pub(crate) use policies::Setting;

use crate::cargo;

/// Which sections to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Only {
    All,
    Overhead,
    Epp,
    Policies,
    Quality,
    Replicas,
    Real,
    Long,
}

/// What `cargo xtask bench` was asked for.
#[derive(Debug)]
pub(crate) struct Options {
    pub(crate) quick: bool,
    pub(crate) only: Only,
    /// Build the release binaries first.
    pub(crate) build: bool,
    /// Run only the overhead cases whose name contains this (with `--only quality`, the sweep's
    /// cells whose label has each of its words), and write nothing: for profiling and trials.
    pub(crate) case: Option<String>,
    /// Policy settings for the quality cells run with `case` (`--set POLICY.KEY=VALUE`).
    pub(crate) settings: Vec<Setting>,
    /// Use (and build) the debug binaries (`--debug`): for a check on a machine too loaded
    /// for a release build; latencies and CPU are then not those of a release router, and the
    /// section says so.
    pub(crate) debug: bool,
}

pub(crate) fn run(root: &Path, options: Options) -> Result<()> {
    let Options { quick, only, build, case, settings, debug } = options;
    anyhow::ensure!(
        settings.is_empty() || (only == Only::Quality && case.is_some()),
        "--set is for trials: use it with --only quality --case, which write nothing"
    );
    if build {
        let mut args = vec!["build", "-p", "router-server", "-p", "router-sim"];
        if !debug {
            args.insert(1, "--release");
        }
        cargo(root, &args)?;
    }
    let bins =
        if debug { procs::Bins::in_profile(root, "debug") } else { procs::Bins::release(root) };
    let tokenizer = root.join("crates/router-sim/assets/tokenizer.json").display().to_string();
    let docs = root.join("docs");
    std::fs::create_dir_all(&docs)?;
    let machine = machine();
    let wants = |section: Only| only == Only::All || only == section;
    let command = |section: &str| {
        let only = if only == Only::All { String::new() } else { format!(" --only {section}") };
        let flags = format!(
            "{}{}",
            if quick { " --quick" } else { "" },
            if debug { " --debug" } else { "" }
        );
        format!("cargo xtask bench{only}{flags}")
    };
    let mut sections: Vec<(&str, String)> = Vec::new();

    if wants(Only::Overhead) && case.as_deref() == Some("instructions") {
        // Only the deterministic count: a quick check of a data-path change.
        for counted in instructions::measure(&bins)? {
            eprintln!("  {}", instructions::line(&counted));
        }
        return Ok(());
    }
    if wants(Only::Overhead) {
        let (requests, repeats) = if quick { (1_000, 1) } else { (10_000, 5) };
        eprintln!("xtask bench: router overhead ({requests} requests x {repeats} per case)");
        let overhead = overhead::measure(&bins, requests, repeats, case.as_deref())?;
        for case in &overhead.cases {
            let cpu = |run: &overhead::Run| match (run.proxy_cpu_us, run.proxy_user_system_us()) {
                (Some(us), Some((user, system))) => {
                    format!("{us:.1} us/request ({user:.1} user + {system:.1} kernel)")
                }
                (Some(us), None) => format!("{us:.1} us/request"),
                _ => "-".to_owned(),
            };
            let ratio = case.cpu_ratio().map_or("-".to_owned(), |r| {
                format!("{:.2}x ({:.2}x–{:.2}x)", r.median, r.min, r.max)
            });
            let hyper_ratio = case.hyper_cpu_ratio().map_or("-".to_owned(), |r| {
                format!("{:.2}x ({:.2}x–{:.2}x)", r.median, r.min, r.max)
            });
            eprintln!(
                "  {}: direct {:.0} req/s; router {:.0} req/s, {}; router (hyper) {:.0} req/s, \
                 {}; nginx {:.0} req/s, {}; router ÷ nginx {ratio}, router (hyper) ÷ nginx \
                 {hyper_ratio}",
                case.name,
                case.direct.rps(),
                case.router.rps(),
                cpu(&case.router),
                case.hyper.rps(),
                cpu(&case.hyper),
                case.nginx.rps(),
                cpu(&case.nginx),
            );
        }
        if case.is_some() {
            return Ok(());
        }
        std::fs::write(
            docs.join("bench-router-cpu.svg"),
            svg::bars("proxy CPU per request", "us", &overhead::cpu_rows(&overhead)),
        )?;
        eprintln!(
            "xtask bench: instructions per request under callgrind ({} requests per case)",
            instructions::REQUESTS
        );
        let counted = instructions::measure(&bins)?;
        for counted in &counted {
            eprintln!("  {}", instructions::line(counted));
        }
        let section = overhead::render(&overhead) + &instructions::render(&counted);
        sections.push(("overhead", provenance(&section, &command("overhead"), &machine)));
    }

    // Without Envoy the whole run goes on, the endpoint picker's section left as it was; asked
    // for alone, the section fails saying where Envoy was looked for.
    let envoy = epp::envoy_binary();
    if let (true, Err(err)) = (wants(Only::Epp) && only != Only::Epp, &envoy) {
        eprintln!(
            "xtask bench: endpoint picker skipped, its section of docs/benchmarks.md unchanged: \
             {err:#}"
        );
    } else if wants(Only::Epp) {
        let sizes = if quick {
            epp::Sizes { requests: 400, repeats: 3 }
        } else {
            epp::Sizes { requests: 2_000, repeats: 5 }
        };
        eprintln!(
            "xtask bench: endpoint picker ({} requests x {} per case and gateway)",
            sizes.requests, sizes.repeats
        );
        let measured = epp::measure(&bins, sizes)?;
        for case in &measured.cases {
            eprintln!(
                "  {}, {} clients: p50 {:.2} -> {:.2} ms, p99 {:.2} -> {:.2} ms, picker CPU {:.1} us/request",
                case.name,
                case.clients,
                case.direct.p50_ms,
                case.picked.p50_ms,
                case.direct.p99_ms,
                case.picked.p99_ms,
                case.picked.picker_cpu_us.unwrap_or(f64::NAN),
            );
        }
        sections.push(("epp", provenance(&epp::render(&measured), &command("epp"), &machine)));
    }

    if wants(Only::Policies) {
        let workload = if quick { policies::Workload::quick() } else { policies::Workload::full() };
        let mut runs = Vec::new();
        for policy in policies::POLICIES {
            eprintln!("xtask bench: policy {policy}");
            match policies::run(&bins, policy, &workload, &tokenizer) {
                Ok(run) => runs.push(Ok(run)),
                Err(err) => {
                    eprintln!("  failed: {err:#}");
                    runs.push(Err(((*policy).to_owned(), format!("{err:#}"))));
                }
            }
        }
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
        sections.push((
            "policies",
            provenance(&policies::render(&runs, &workload), &command("policies"), &machine),
        ));
    }

    if wants(Only::Quality) {
        let mut sweep =
            if quick { quality::Sweep::quick(root) } else { quality::Sweep::full(root) };
        if let Some(case) = &case {
            sweep.settings = settings;
            let cells = sweep.cells_matching(case);
            anyhow::ensure!(
                !cells.is_empty(),
                "--case {case:?} names no cell of the quality sweep"
            );
            quality::measure(&bins, sweep, cells, &tokenizer);
            return Ok(());
        }
        let cells = sweep.cells();
        let measured = quality::measure(&bins, sweep, cells, &tokenizer);
        quality::write_plots(&measured, &docs)?;
        sections.push(("quality", quality::render(&measured, &command("quality"), &machine)));
    }

    if wants(Only::Replicas) {
        let workload = replicas::workload(quick);
        let runs = replicas::measure(&bins, &workload, &tokenizer);
        let mut rendered = replicas::render(&runs, &workload);
        if debug {
            rendered.push_str(
                "\nMeasured with the debug binaries (`--debug`): TTFT is not a release router's.\n",
            );
        }
        sections.push(("replicas", provenance(&rendered, &command("replicas"), &machine)));
    }

    // The peers' venvs are installed on first use: only when asked for.
    if only == Only::Long {
        let measured = long::measure(root, &bins, quick)?;
        sections.push(("long", provenance(&long::render(&measured), &command("long"), &machine)));
    }

    // Real engines only when asked for: minutes of vLLM start-up and gigabytes of memory.
    if only == Only::Real {
        let measured = real::measure(root, &bins, quick)?;
        sections.push(("real", provenance(&real::render(&measured), &command("real"), &machine)));
    }

    sections.push(("reproduce", REPRODUCE.to_owned()));
    let path = docs.join("benchmarks.md");
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    std::fs::write(&path, page::splice(&old, &sections))?;
    let names: Vec<&str> = sections.iter().map(|(name, _)| *name).collect();
    eprintln!(
        "xtask bench: wrote sections {} of docs/benchmarks.md, and their docs/bench-*.svg",
        names.join(", ")
    );
    Ok(())
}

const REPRODUCE: &str = "## Reproduce\n\n```sh\n\
cargo xtask bench                          # every section, about an hour on 2 cores (quality: ~45 min)\n\
cargo xtask bench --quick                  # every section, small: a few minutes\n\
cargo xtask bench --only quality           # or overhead, epp, policies or replicas: replaces only that section\n\
cargo xtask bench --only overhead          # direct, router and nginx side by side (installs nginx): 6-14 min\n\
cargo xtask bench --only epp               # Envoy with and without the endpoint picker: under a minute (without Envoy, the other runs skip this section)\n\
cargo xtask bench --only real              # two real vLLM engines (bash tests/vllm/setup.sh first), router-sim fitted to them\n\
cargo xtask bench --only long              # router CPU per request at 1k-128k token prompts, ours and sglang-router and vllm-router (installed into ~/.cache/router-bench): ~6 min\n\
cargo xtask bench --only quality --quick   # one cell of the sweep (conversation, 64k, RHO 0.8)\n\
cargo xtask bench --case streaming         # only the overhead cases naming it, nothing written (for perf/strace)\n\
cargo xtask bench --case instructions      # only the callgrind count of router and nginx, nothing written: ~3 min; ROUTER_BENCH_KEEP_CALLGRIND=1 keeps the dumps\n\
cargo xtask bench --only quality --case \"conversation 64k predicted_ttft\"   # those cells of the sweep, nothing written\n\
ROUTER_BENCH_REQUESTS_DIR=/tmp/req cargo xtask bench --only quality --quick   # also one JSON line per request of each run (router-sim load --requests-out)\n\
```\n";

/// `section` with a line saying which command produced it where, below its heading.
fn provenance(section: &str, command: &str, machine: &str) -> String {
    let line = format!("Produced by `{command}` on {machine}.\n\n");
    match section.split_once("\n\n") {
        Some((heading, rest)) => format!("{heading}\n\n{line}{rest}"),
        None => format!("{section}\n\n{line}"),
    }
}

/// `text` fit for one markdown table cell: no pipes, no line breaks.
pub(crate) fn cell(text: &str) -> String {
    text.replace('|', "/").replace('\n', " ")
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
