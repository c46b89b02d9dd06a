//! Routing quality under load: slices of the Mooncake FAST'25 traces replayed open-loop by
//! timestamp at a chosen offered load, through each policy on a fresh fleet, for every trace,
//! engine cache size and load, with the trace's own bounds beside each measurement.
//!
//! The repetition loop is outermost: each repetition runs every (cell, policy) once before the
//! next starts, so the noise of a shared machine hits every policy alike; the page reports the
//! median of each metric over the repetitions. A run that fails (the router refuses the
//! policy, the load fails) is kept as an error and the sweep goes on. Owns the page section
//! `quality` (see `render`).

mod render;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::Value;

pub(crate) use self::render::{render, write_plots};
use super::policies::{Engines, Fleet, PolicySpec, Setting, load_json};
use super::procs::Bins;

/// Engines per fleet.
pub(crate) const ENGINES: usize = 8;
/// Each engine's prefill speed, tokens per second.
pub(crate) const PREFILL_TOKENS_PER_SEC: u64 = 20_000;
/// Each request's decode speed, tokens per second.
pub(crate) const DECODE_TOKENS_PER_SEC: u64 = 400;
/// Every trace length (blocks, inputs, outputs) is multiplied by this: 512-token blocks
/// become 32-token ones, and a replay costs 16 times less prefill.
pub(crate) const LENGTH_SCALE: f64 = 0.0625;
/// `cache_aware`'s matched-token threshold: the production default of 1024, scaled with the
/// trace.
pub(crate) const MIN_MATCHED_TOKENS: usize = 64;

/// The full sweep's slice of each trace: sized so that three repetitions of the whole sweep
/// take about 30 minutes on a 2-core machine (29 min 34 s measured) (see [`Sweep::estimate_secs`]; 1500 requests
/// take about 45).
const FULL_REQUESTS: usize = 1_000;

/// The environment variable naming a directory where every run writes `router-sim load
/// --requests-out` (one JSON line per request: its oracle hits and floor beside what it met),
/// for seeing which requests make a cell's tail or its missed hits.
const REQUESTS_DIR: &str = "ROUTER_BENCH_REQUESTS_DIR";

/// Seconds a run costs besides its replay: starting eight engines and a router, the half
/// second for subscriptions, the load generator's oracles, the last answers, teardown
/// (measured: 1.6 to 2.2 s).
const RUN_OVERHEAD_SECS: f64 = 2.0;

/// One trace and the slice of it replayed.
#[derive(Clone, Debug)]
pub(crate) struct Trace {
    pub(crate) name: &'static str,
    pub(crate) path: PathBuf,
    /// Requests replayed: the first `requests` of the file.
    pub(crate) requests: usize,
    /// Requests in the whole file.
    pub(crate) total: usize,
}

/// One (trace, cache, load, policy) of the sweep.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Cell {
    /// Index into [`Sweep::traces`].
    pub(crate) trace: usize,
    /// KV tokens per engine.
    pub(crate) cache: usize,
    /// The offered load RHO.
    pub(crate) load: f64,
    pub(crate) policy: &'static str,
}

/// What is swept.
#[derive(Clone, Debug)]
pub(crate) struct Sweep {
    pub(crate) traces: Vec<Trace>,
    pub(crate) caches: Vec<usize>,
    pub(crate) loads: Vec<f64>,
    /// Run at every load.
    pub(crate) policies: Vec<&'static str>,
    /// Run at `extra_load` only.
    pub(crate) extra_policies: Vec<&'static str>,
    pub(crate) extra_load: f64,
    pub(crate) repetitions: usize,
    /// Policy settings other than the defaults (`--set`, for trials with `--case`).
    pub(crate) settings: Vec<Setting>,
}

impl Sweep {
    /// Both traces, 16k and 64k caches, four loads, every policy at 0.8: 76 runs a repetition.
    pub(crate) fn full(root: &Path) -> Self {
        Self {
            traces: traces(root, FULL_REQUESTS, &["conversation", "synthetic"]),
            caches: vec![16_384, 65_536],
            loads: vec![0.5, 0.7, 0.8, 0.9],
            policies: vec!["round_robin", "load_based", "cache_aware", "predicted_ttft"],
            extra_policies: vec!["random", "power_of_two", "session_aware"],
            extra_load: 0.8,
            repetitions: 3,
            settings: Vec::new(),
        }
    }

    /// One small cell: the conversation trace's first 150 requests, 64k caches, load 0.8,
    /// the four main policies, once.
    pub(crate) fn quick(root: &Path) -> Self {
        Self {
            traces: traces(root, 150, &["conversation"]),
            caches: vec![65_536],
            loads: vec![0.8],
            extra_policies: Vec::new(),
            repetitions: 1,
            ..Self::full(root)
        }
    }

    /// Every cell of one repetition, in table order (trace, cache, load, policy).
    pub(crate) fn cells(&self) -> Vec<Cell> {
        let mut cells = Vec::new();
        for trace in 0..self.traces.len() {
            for &cache in &self.caches {
                for &load in &self.loads {
                    let extra =
                        if load == self.extra_load { &self.extra_policies[..] } else { &[] };
                    for &policy in self.policies.iter().chain(extra) {
                        cells.push(Cell { trace, cache, load, policy });
                    }
                }
            }
        }
        cells
    }

    /// The cells of [`Sweep::cells`] whose label (`conversation 64k 0.8 predicted_ttft`)
    /// contains every word of `case`: `--case` runs only those, for trying a change on a few.
    pub(crate) fn cells_matching(&self, case: &str) -> Vec<Cell> {
        let words: Vec<&str> = case.split_whitespace().collect();
        let mut cells = self.cells();
        cells.retain(|cell| {
            let label = self.label(cell);
            words.iter().all(|word| label.contains(word))
        });
        cells
    }

    /// How progress lines and `--case` name a cell.
    pub(crate) fn label(&self, cell: &Cell) -> String {
        let trace = self.traces[cell.trace].name;
        format!("{trace} {}k {} {}", cell.cache / 1024, cell.load, cell.policy)
    }

    /// Expected seconds of one run: the fixed cost plus the replay, which lasts the uncached
    /// work over the load the fleet is offered. The uncached work per request is what the
    /// fleet LRU oracle leaves of the first 1500 requests at length scale 0.0625 (measured:
    /// 720 to 820 tokens a request with 16k caches, 600 to 700 with 64k).
    pub(crate) fn estimate_secs(&self, cell: &Cell) -> f64 {
        let per_request = if cell.cache <= 16_384 { 780.0 } else { 660.0 };
        let work = self.traces[cell.trace].requests as f64 * per_request;
        RUN_OVERHEAD_SECS + work / (cell.load * ENGINES as f64 * PREFILL_TOKENS_PER_SEC as f64)
    }

    fn engines(cache: usize) -> Engines {
        Engines {
            count: ENGINES,
            kv_capacity_tokens: cache,
            prefill_tokens_per_sec: PREFILL_TOKENS_PER_SEC,
            decode_tokens_per_sec: DECODE_TOKENS_PER_SEC,
        }
    }
}

/// The traces named: the full files from the shared data folder beside the checkout when
/// present, else the 200-request slices router-sim's tests carry; `requests` of each.
fn traces(root: &Path, requests: usize, names: &[&'static str]) -> Vec<Trace> {
    let shared = root.join("../shared/data/mooncake");
    let local = root.join("crates/router-sim/tests/data");
    names
        .iter()
        .map(|&name| {
            let full = shared.join(format!("{name}_trace.jsonl"));
            let path = if full.exists() {
                full
            } else {
                local.join(format!("{name}_trace_head200.jsonl"))
            };
            let total = std::fs::read_to_string(&path)
                .map_or(0, |text| text.lines().filter(|l| !l.trim().is_empty()).count());
            Trace { name, path, requests: requests.min(total.max(1)), total }
        })
        .collect()
}

/// What one run measured, from `router-sim load --json`; NaN where the report had no number.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Numbers {
    pub(crate) requests: f64,
    pub(crate) errors: f64,
    pub(crate) hit_rate: f64,
    pub(crate) unlimited: f64,
    pub(crate) fleet_lru: f64,
    pub(crate) belady: f64,
    pub(crate) ttft_mean: f64,
    pub(crate) ttft_p50: f64,
    pub(crate) ttft_p90: f64,
    pub(crate) ttft_p99: f64,
    pub(crate) floor_p99: f64,
    pub(crate) uncached_max_over_mean: f64,
    pub(crate) offered_load: f64,
    pub(crate) time_scale: f64,
}

fn at(report: &Value, path: &[&str]) -> f64 {
    path.iter().fold(report, |v, key| &v[key]).as_f64().unwrap_or(f64::NAN)
}

impl Numbers {
    pub(crate) fn from_report(report: &Value) -> Self {
        let or = |a: f64, b: f64| if a.is_finite() { a } else { b };
        Self {
            requests: at(report, &["requests"]),
            errors: at(report, &["errors"]),
            hit_rate: at(report, &["cache_hit_rate"]),
            unlimited: or(
                at(report, &["bounds", "hit_rate_unlimited"]),
                at(report, &["oracle_hit_rate"]),
            ),
            fleet_lru: or(
                at(report, &["bounds", "hit_rate_fleet_lru"]),
                at(report, &["oracle_fleet_hit_rate"]),
            ),
            belady: at(report, &["bounds", "hit_rate_belady"]),
            ttft_mean: at(report, &["ttft_mean_ms"]),
            ttft_p50: at(report, &["ttft_p50_ms"]),
            ttft_p90: at(report, &["ttft_p90_ms"]),
            ttft_p99: at(report, &["ttft_p99_ms"]),
            floor_p99: at(report, &["bounds", "ttft_floor_ms", "p99"]),
            uncached_max_over_mean: at(report, &["uncached_share_max_over_mean"]),
            offered_load: at(report, &["bounds", "offered_load"]),
            time_scale: at(report, &["time_scale"]),
        }
    }

    /// The median of each field over `runs`, over its finite values (NaN when none).
    pub(crate) fn median(runs: &[Numbers]) -> Self {
        let m = |field: fn(&Numbers) -> f64| median(runs.iter().map(field));
        Self {
            requests: m(|n| n.requests),
            errors: m(|n| n.errors),
            hit_rate: m(|n| n.hit_rate),
            unlimited: m(|n| n.unlimited),
            fleet_lru: m(|n| n.fleet_lru),
            belady: m(|n| n.belady),
            ttft_mean: m(|n| n.ttft_mean),
            ttft_p50: m(|n| n.ttft_p50),
            ttft_p90: m(|n| n.ttft_p90),
            ttft_p99: m(|n| n.ttft_p99),
            floor_p99: m(|n| n.floor_p99),
            uncached_max_over_mean: m(|n| n.uncached_max_over_mean),
            offered_load: m(|n| n.offered_load),
            time_scale: m(|n| n.time_scale),
        }
    }
}

/// The median of the finite values (the mean of the middle two for an even count).
fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.filter(|v| v.is_finite()).collect();
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The whole sweep's results.
#[derive(Debug)]
pub(crate) struct Measured {
    pub(crate) sweep: Sweep,
    pub(crate) cells: Vec<Cell>,
    /// Per cell, one result per repetition: the numbers, or why the run failed.
    pub(crate) runs: Vec<Vec<Result<Numbers, String>>>,
    pub(crate) elapsed: Duration,
}

/// Runs the sweep, printing the plan and a progress line per run.
/// Runs `cells` of `sweep` (all of [`Sweep::cells`] for the page) `sweep.repetitions` times.
pub(crate) fn measure(bins: &Bins, sweep: Sweep, cells: Vec<Cell>, tokenizer: &str) -> Measured {
    let total = cells.len() * sweep.repetitions;
    let estimates: Vec<f64> = cells.iter().map(|c| sweep.estimate_secs(c)).collect();
    let per_repetition: f64 = estimates.iter().sum();
    eprintln!(
        "xtask bench: quality: {total} runs ({} repetitions x {} cells), estimated {}",
        sweep.repetitions,
        cells.len(),
        clock(per_repetition * sweep.repetitions as f64)
    );
    for trace in &sweep.traces {
        eprintln!(
            "  {}: first {} of {} requests of {}",
            trace.name,
            trace.requests,
            trace.total,
            trace.path.display()
        );
    }
    let requests_dir = std::env::var_os(REQUESTS_DIR).map(PathBuf::from);
    if let Some(dir) = &requests_dir {
        match std::fs::create_dir_all(dir) {
            Ok(()) => eprintln!("  each run's requests: {}/LABEL-repN.jsonl", dir.display()),
            Err(err) => eprintln!("  {REQUESTS_DIR}={}: {err}; runs will fail", dir.display()),
        }
    }
    let started = Instant::now();
    let mut runs: Vec<Vec<Result<Numbers, String>>> = vec![Vec::new(); cells.len()];
    let mut estimated_done = 0.0;
    for repetition in 0..sweep.repetitions {
        for (i, cell) in cells.iter().enumerate() {
            let done = repetition * cells.len() + i;
            let elapsed = started.elapsed().as_secs_f64();
            // Scale the remaining estimate by how the finished runs compared with theirs.
            let pace = if estimated_done > 0.0 { elapsed / estimated_done } else { 1.0 };
            let left = (per_repetition * sweep.repetitions as f64 - estimated_done) * pace;
            eprintln!(
                "xtask bench: quality rep {}/{} {} (run {}/{total}, {} elapsed, about {} left)",
                repetition + 1,
                sweep.repetitions,
                sweep.label(cell),
                done + 1,
                clock(elapsed),
                clock(left),
            );
            let run_started = Instant::now();
            let requests_out = requests_dir.as_ref().map(|dir| {
                let label = sweep.label(cell).replace(' ', "-");
                dir.join(format!("{label}-rep{}.jsonl", repetition + 1))
            });
            let result = run(bins, &sweep, cell, tokenizer, estimates[i], requests_out.as_deref());
            let secs = run_started.elapsed().as_secs_f64();
            match &result {
                Ok(n) => eprintln!(
                    "  {secs:.1} s: hit {:.3} (fleet LRU {:.3}), TTFT mean {:.0} ms, p99 {:.0} ms \
                     (floor {:.0}), offered load {:.2}, {} errors",
                    n.hit_rate,
                    n.fleet_lru,
                    n.ttft_mean,
                    n.ttft_p99,
                    n.floor_p99,
                    n.offered_load,
                    n.errors
                ),
                Err(err) => eprintln!("  {secs:.1} s: failed: {err}"),
            }
            runs[i].push(result);
            estimated_done += estimates[i];
        }
    }
    let elapsed = started.elapsed();
    eprintln!("xtask bench: quality: {total} runs in {}", clock(elapsed.as_secs_f64()));
    Measured { sweep, cells, runs, elapsed }
}

/// One run of `cell` on a fresh fleet; its error as one line.
fn run(
    bins: &Bins,
    sweep: &Sweep,
    cell: &Cell,
    tokenizer: &str,
    estimate_secs: f64,
    requests_out: Option<&Path>,
) -> Result<Numbers, String> {
    let measure = || -> Result<Numbers> {
        let engines = Sweep::engines(cell.cache);
        let policy = PolicySpec::new(cell.policy, MIN_MATCHED_TOKENS).with(&sweep.settings);
        let fleet = Fleet::start(bins, &policy, &engines, tokenizer)?;
        let trace = &sweep.traces[cell.trace];
        let args: Vec<String> = [
            "load",
            "--target",
            &fleet.url,
            "--model",
            "m",
            "--trace",
            &trace.path.display().to_string(),
            "--max-requests",
            &trace.requests.to_string(),
            "--trace-length-scale",
            &LENGTH_SCALE.to_string(),
            "--tokenizer",
            tokenizer,
            "--fleet-capacity-tokens",
            &(cell.cache * ENGINES).to_string(),
            "--offered-load",
            &cell.load.to_string(),
            "--engines",
            &ENGINES.to_string(),
            "--prefill-tokens-per-sec",
            &PREFILL_TOKENS_PER_SEC.to_string(),
            "--session-header",
            "x-session-id",
            "--json",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .chain(
            requests_out
                .into_iter()
                .flat_map(|path| ["--requests-out".to_owned(), path.display().to_string()]),
        )
        .collect();
        // Generous: an overloaded fleet drains its queue after the last arrival.
        let timeout = Duration::from_secs_f64(estimate_secs * 4.0 + 120.0);
        let report = load_json(bins, &args, timeout)?;
        drop(fleet);
        Ok(Numbers::from_report(&report))
    };
    measure().map_err(|err| one_line(&format!("{err:#}")))
}

/// `text` on one line, at most 300 characters.
fn one_line(text: &str) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() > 300 {
        format!("{}...", flat.chars().take(300).collect::<String>())
    } else {
        flat
    }
}

/// `secs` as `1h02m`, `14m05s` or `42s`.
pub(crate) fn clock(secs: f64) -> String {
    let secs = secs.max(0.0).round() as u64;
    match secs {
        s if s >= 3600 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        s if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn repetitions_alternate_over_the_cells_and_extras_run_at_one_load() {
        let sweep = Sweep::full(Path::new("/nonexistent"));
        let cells = sweep.cells();
        // 2 traces x 2 caches x (4 loads x 4 policies + 3 extras at 0.8).
        assert_eq!(cells.len(), 76);
        let extras: Vec<&Cell> = cells.iter().filter(|c| c.policy == "session_aware").collect();
        assert_eq!(extras.len(), 4);
        assert!(extras.iter().all(|c| c.load == 0.8));
        assert_eq!(cells[0], Cell { trace: 0, cache: 16_384, load: 0.5, policy: "round_robin" });
        let quick = Sweep::quick(Path::new("/nonexistent")).cells();
        assert_eq!(quick.len(), 4);
        assert!(quick.iter().all(|c| c.cache == 65_536 && c.load == 0.8));
    }

    #[test]
    fn a_case_keeps_the_cells_whose_label_has_every_word() {
        let sweep = Sweep::full(Path::new("/nonexistent"));
        let picked = sweep.cells_matching("conversation 64k predicted_ttft");
        assert_eq!(picked.len(), 4, "one a load");
        assert!(picked.iter().all(|c| c.trace == 0 && c.cache == 65_536));
        assert_eq!(sweep.label(&picked[2]), "conversation 64k 0.8 predicted_ttft");
        assert_eq!(sweep.cells_matching("0.8 session_aware").len(), 4);
        assert!(sweep.cells_matching("no such policy").is_empty());
        assert_eq!(sweep.cells_matching("").len(), sweep.cells().len());
    }

    #[test]
    fn the_full_sweep_is_estimated_at_about_half_an_hour() {
        let root = Path::new("/nonexistent");
        let mut sweep = Sweep::full(root);
        for trace in &mut sweep.traces {
            trace.requests = FULL_REQUESTS;
        }
        let secs: f64 = sweep.cells().iter().map(|c| sweep.estimate_secs(c)).sum::<f64>()
            * sweep.repetitions as f64;
        // Measured: 29 min 34 s for the 228 runs.
        assert!((25.0 * 60.0..40.0 * 60.0).contains(&secs), "{}", clock(secs));
    }

    #[test]
    fn numbers_read_the_bounds_and_fall_back_to_the_old_oracle_keys() {
        let report = json!({
            "requests": 10, "errors": 1, "cache_hit_rate": 0.2, "ttft_mean_ms": 50.0,
            "ttft_p50_ms": 40.0, "ttft_p90_ms": 80.0, "ttft_p99_ms": 120.0,
            "oracle_hit_rate": 0.4, "oracle_fleet_hit_rate": 0.3,
            "uncached_share_max_over_mean": 1.25, "time_scale": 12.5,
            "bounds": {"hit_rate_belady": 0.35, "hit_rate_fleet_lru": null,
                       "ttft_floor_ms": {"mean": 5.0, "p50": 4.0, "p90": 8.0, "p99": 9.0},
                       "offered_load": 0.79}
        });
        let n = Numbers::from_report(&report);
        assert_eq!((n.requests, n.errors, n.hit_rate), (10.0, 1.0, 0.2));
        assert_eq!((n.unlimited, n.fleet_lru, n.belady), (0.4, 0.3, 0.35));
        assert_eq!((n.floor_p99, n.offered_load, n.time_scale), (9.0, 0.79, 12.5));
        let missing = Numbers::from_report(&json!({"bounds": {"ttft_floor_ms": null}}));
        assert!(missing.floor_p99.is_nan() && missing.belady.is_nan());
    }

    #[test]
    fn medians_skip_missing_values() {
        assert_eq!(median([3.0, 1.0, 2.0].into_iter()), 2.0);
        assert_eq!(median([4.0, 1.0, f64::NAN, 2.0, 3.0].into_iter()), 2.5);
        assert!(median(std::iter::empty()).is_nan());
        let a = Numbers { ttft_p99: 10.0, floor_p99: f64::NAN, ..Numbers::default() };
        let b = Numbers { ttft_p99: 30.0, floor_p99: 2.0, ..Numbers::default() };
        let c = Numbers { ttft_p99: 20.0, floor_p99: f64::NAN, ..Numbers::default() };
        let m = Numbers::median(&[a, b, c]);
        assert_eq!((m.ttft_p99, m.floor_p99), (20.0, 2.0));
    }

    #[test]
    fn errors_fit_on_one_line_and_times_read_as_clocks() {
        assert_eq!(
            one_line("router-server did not\n  become ready"),
            "router-server did not become ready"
        );
        assert!(one_line(&"x ".repeat(400)).ends_with("..."));
        assert_eq!(
            (clock(42.0), clock(845.0), clock(3720.0)),
            ("42s".into(), "14m05s".into(), "1h02m".into())
        );
    }
}
