//! The page section `quality`: what was replayed and how, a table per trace (medians per
//! cache, load and policy, the best mean and p99 TTFT of each cache and load in bold), and the
//! line plots of TTFT p99 and hit rate against the offered load.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use super::{
    Cell, DECODE_TOKENS_PER_SEC, ENGINES, LENGTH_SCALE, MIN_MATCHED_TOKENS, Measured, Numbers,
    PREFILL_TOKENS_PER_SEC, clock,
};
use crate::bench::svg::{self, Series};

/// One table row: a cell and the medians of its successful repetitions.
struct Row<'a> {
    cell: &'a Cell,
    median: Option<Numbers>,
    failures: Vec<&'a str>,
    repetitions: usize,
}

fn rows(measured: &Measured) -> Vec<Row<'_>> {
    measured
        .cells
        .iter()
        .zip(&measured.runs)
        .map(|(cell, runs)| {
            let ok: Vec<Numbers> = runs.iter().filter_map(|r| r.as_ref().ok().copied()).collect();
            let failures =
                runs.iter().filter_map(|r| r.as_ref().err().map(String::as_str)).collect();
            let median = if ok.is_empty() { None } else { Some(Numbers::median(&ok)) };
            Row { cell, median, failures, repetitions: runs.len() }
        })
        .collect()
}

fn ms(value: f64) -> String {
    match value {
        v if !v.is_finite() => "-".to_owned(),
        v if v >= 100.0 => format!("{v:.0}"),
        v => format!("{v:.1}"),
    }
}

fn fixed(value: f64, decimals: usize) -> String {
    if value.is_finite() { format!("{value:.decimals$}") } else { "-".to_owned() }
}

fn bold_if(text: String, best: bool) -> String {
    if best { format!("**{text}**") } else { text }
}

/// The section's markdown; `command` is the command line that produced it.
pub(crate) fn render(measured: &Measured, command: &str, machine: &str) -> String {
    let sweep = &measured.sweep;
    let mut page = String::from("## Routing quality under load\n\n");
    let _ = writeln!(
        page,
        "Produced by `{command}` on {machine}, in {}: {} runs, {} cells x {} repetition{}. Every \
         number is the median over the repetitions, which alternate (the repetition loop is \
         outermost: each repetition runs every cell and policy once before the next starts), so \
         the noise of this shared 2-core VM hits every policy alike. Compare rows of a cell, not \
         runs.\n",
        clock(measured.elapsed.as_secs_f64()),
        measured.cells.len() * sweep.repetitions,
        measured.cells.len(),
        sweep.repetitions,
        if sweep.repetitions == 1 { "" } else { "s" },
    );
    let _ = writeln!(
        page,
        "Each run replays the start of a Mooncake FAST'25 trace (`../shared/data/mooncake/`) \
         open-loop: every request is sent at its trace timestamp divided by a time scale, \
         whatever state the fleet is in. Lengths are scaled by {LENGTH_SCALE} (512-token blocks \
         become {}-token ones; the prefix structure is kept), so `cache_aware` requires \
         {MIN_MATCHED_TOKENS} matched tokens (production's 1024, scaled alike). The time scale \
         is chosen per run (`router-sim load --offered-load RHO`) so that the **offered load** \
         RHO = (prompt tokens one LRU cache of the fleet's total capacity would still have to \
         prefill, per second) / ({ENGINES} engines x {PREFILL_TOKENS_PER_SEC} tokens/s): at RHO \
         1 the fleet is saturated even if routing did as well as one shared cache. Fleet: \
         {ENGINES} router-sim engines with the KV cache of the row (capacity tokens each), \
         prefill {PREFILL_TOKENS_PER_SEC} tokens/s, decode {DECODE_TOKENS_PER_SEC} tokens/s per \
         request, KV events over ZeroMQ, load reported every 100 ms; a fresh fleet (cold caches) \
         for every run.\n",
        (512.0 * LENGTH_SCALE) as u64,
    );
    page.push_str(
        "Bounds, computed by `router-sim load` from the replayed prompts in the engines' \
         16-token blocks: *unlimited* (one cache that never evicts) and *Belady* (one cache of \
         the fleet's capacity evicting the block needed furthest in the future, MIN) are upper \
         bounds on the hit rate of any routing; *fleet LRU* (one LRU cache of the fleet's \
         capacity) is a target, not a bound: routing can beat it, since separate caches keep \
         unrelated prefixes from evicting each other. The *TTFT floor* of a request is its \
         prompt tokens the unlimited cache misses, prefilled at full speed with no queueing; \
         a percentile of the floor bounds the same percentile of TTFT from below. *Uncached \
         max/mean* is the busiest engine's share of the prefilled tokens over the mean share \
         (1 is perfectly even); *offered load* is the load as replayed.\n\n",
    );
    let rows = rows(measured);
    for (t, trace) in sweep.traces.iter().enumerate() {
        let trace_rows: Vec<&Row<'_>> = rows.iter().filter(|r| r.cell.trace == t).collect();
        let _ = writeln!(
            page,
            "### {} trace\n\nThe first {} of its {} requests (`{}`).",
            trace.name,
            trace.requests,
            trace.total,
            trace.path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        );
        let unlimited =
            super::median(trace_rows.iter().filter_map(|r| r.median.as_ref()).map(|n| n.unlimited));
        if unlimited.is_finite() {
            let _ = writeln!(
                page,
                "Hit rate of one unlimited cache (the bound for every cache size): {unlimited:.3}."
            );
        }
        page.push_str(
            "\n| cache | RHO | policy | requests | errors | hit rate | fleet LRU | Belady | hit / \
             fleet LRU | TTFT mean ms | p50 ms | p90 ms | p99 ms | floor p99 ms | p99 / floor p99 \
             | uncached max/mean | offered load |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        let mut notes = Vec::new();
        for row in &trace_rows {
            let cell = row.cell;
            let head = format!("| {}k | {} | {} |", cell.cache / 1024, cell.load, cell.policy);
            let Some(n) = &row.median else {
                let _ = writeln!(
                    page,
                    "{head} failed: {} |{}",
                    crate::bench::cell(row.failures.first().copied().unwrap_or("no run")),
                    " |".repeat(13)
                );
                continue;
            };
            if !row.failures.is_empty() {
                notes.push(format!(
                    "- {}k, RHO {}, {}: {} of {} repetitions failed ({}); the row is the median \
                     of the others.",
                    cell.cache / 1024,
                    cell.load,
                    cell.policy,
                    row.failures.len(),
                    row.repetitions,
                    crate::bench::cell(row.failures[0]),
                ));
            }
            // Best of the cell: the lowest mean and p99 among the rows with numbers.
            let peers = trace_rows
                .iter()
                .filter(|r| r.cell.cache == cell.cache && r.cell.load == cell.load)
                .filter_map(|r| r.median.as_ref());
            let (best_mean, best_p99) = peers.fold((f64::INFINITY, f64::INFINITY), |(m, p), n| {
                (m.min(n.ttft_mean), p.min(n.ttft_p99))
            });
            let _ = writeln!(
                page,
                "{head} {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                fixed(n.requests, 0),
                fixed(n.errors, 0),
                fixed(n.hit_rate, 3),
                fixed(n.fleet_lru, 3),
                fixed(n.belady, 3),
                fixed(n.hit_rate / n.fleet_lru, 2),
                bold_if(ms(n.ttft_mean), n.ttft_mean == best_mean),
                ms(n.ttft_p50),
                ms(n.ttft_p90),
                bold_if(ms(n.ttft_p99), n.ttft_p99 == best_p99),
                ms(n.floor_p99),
                fixed(n.ttft_p99 / n.floor_p99, 1),
                fixed(n.uncached_max_over_mean, 2),
                fixed(n.offered_load, 2),
            );
        }
        page.push('\n');
        for note in &notes {
            let _ = writeln!(page, "{note}");
        }
        if !notes.is_empty() {
            page.push('\n');
        }
        for &cache in &sweep.caches {
            let stem = plot_stem(trace.name, cache);
            let _ = writeln!(
                page,
                "![{name} {k}k: TTFT p99 vs offered load]({stem}-p99.svg)\n\
                 ![{name} {k}k: hit rate / fleet LRU vs offered load]({stem}-hit.svg)",
                name = trace.name,
                k = cache / 1024,
            );
        }
        page.push('\n');
    }
    page
}

fn plot_stem(trace: &str, cache: usize) -> String {
    format!("bench-quality-{trace}-{}k", cache / 1024)
}

/// Writes `bench-quality-{trace}-{cache}k-{p99,hit}.svg` into `docs`.
pub(crate) fn write_plots(measured: &Measured, docs: &Path) -> Result<()> {
    let sweep = &measured.sweep;
    let rows = rows(measured);
    let policies: Vec<&str> = sweep.policies.iter().chain(&sweep.extra_policies).copied().collect();
    for (t, trace) in sweep.traces.iter().enumerate() {
        for &cache in &sweep.caches {
            let of = |policy: &str| -> Vec<(f64, Numbers)> {
                rows.iter()
                    .filter(|r| {
                        r.cell.trace == t && r.cell.cache == cache && r.cell.policy == policy
                    })
                    .filter_map(|r| r.median.map(|n| (r.cell.load, n)))
                    .collect()
            };
            let series = |value: fn(&Numbers) -> f64| -> Vec<Series> {
                policies
                    .iter()
                    .map(|p| Series {
                        name: (*p).to_owned(),
                        points: of(p).iter().map(|(load, n)| (*load, value(n))).collect(),
                        dashed: false,
                    })
                    .collect()
            };
            // The bounds are the trace's, the same for every policy: take them from any row.
            let bound = |value: fn(&Numbers) -> f64, name: &str| -> Series {
                let mut points: Vec<(f64, f64)> = Vec::new();
                for &load in &sweep.loads {
                    let v = rows
                        .iter()
                        .filter(|r| {
                            r.cell.trace == t && r.cell.cache == cache && r.cell.load == load
                        })
                        .filter_map(|r| r.median.as_ref().map(value))
                        .find(|v| v.is_finite());
                    points.extend(v.map(|v| (load, v)));
                }
                Series { name: name.to_owned(), points, dashed: true }
            };
            let mut p99 = series(|n| n.ttft_p99);
            p99.push(bound(|n| n.floor_p99, "floor p99 (bound)"));
            let mut hit = series(|n| n.hit_rate / n.fleet_lru);
            hit.push(bound(|n| n.belady / n.fleet_lru, "Belady (bound)"));
            hit.push(bound(|_| 1.0, "fleet LRU"));
            let stem = plot_stem(trace.name, cache);
            let title = format!("{} trace, {}k KV tokens per engine", trace.name, cache / 1024);
            std::fs::write(
                docs.join(format!("{stem}-p99.svg")),
                svg::lines(&format!("{title}: TTFT p99"), "offered load RHO", "ms", &p99),
            )?;
            std::fs::write(
                docs.join(format!("{stem}-hit.svg")),
                svg::lines(
                    &format!("{title}: hit rate / fleet LRU"),
                    "offered load RHO",
                    "hit rate / fleet LRU hit rate",
                    &hit,
                ),
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::super::{Sweep, Trace};
    use super::*;

    fn numbers(mean: f64, p99: f64) -> Numbers {
        Numbers {
            requests: 150.0,
            hit_rate: 0.15,
            fleet_lru: 0.2,
            belady: 0.25,
            ttft_mean: mean,
            ttft_p99: p99,
            floor_p99: 10.0,
            ..Numbers::default()
        }
    }

    #[test]
    fn the_table_bolds_the_best_of_each_cell_and_keeps_failures_as_rows() {
        let sweep = Sweep {
            traces: vec![Trace {
                name: "conversation",
                path: PathBuf::from("conversation_trace.jsonl"),
                requests: 150,
                total: 12_031,
            }],
            caches: vec![65_536],
            loads: vec![0.8],
            policies: vec!["round_robin", "cache_aware", "predicted_ttft"],
            extra_policies: Vec::new(),
            extra_load: 0.8,
            repetitions: 2,
            settings: Vec::new(),
        };
        let cells = sweep.cells();
        let runs = vec![
            vec![Ok(numbers(90.0, 400.0)), Ok(numbers(110.0, 600.0))],
            vec![Ok(numbers(60.0, 700.0)), Err("the load | failed".to_owned())],
            vec![Err("router-server did not become ready: unknown policy".to_owned()); 2],
        ];
        let measured = Measured { sweep, cells, runs, elapsed: Duration::from_secs(75) };
        let page = render(&measured, "cargo xtask bench --only quality --quick", "2 cores");
        let row = |policy: &str| {
            page.lines().find(|l| l.contains(&format!("| {policy} |"))).expect(policy).to_owned()
        };
        // round_robin: median mean 100, p99 500 (best p99); cache_aware: mean 60 (best mean).
        assert!(
            row("round_robin").contains("| 100 |") && row("round_robin").contains("| **500** |")
        );
        assert!(
            row("cache_aware").contains("| **60.0** |") && row("cache_aware").contains("| 700 |")
        );
        assert!(row("predicted_ttft").contains("failed: router-server did not become ready"));
        assert_eq!(
            row("predicted_ttft").matches('|').count(),
            row("round_robin").matches('|').count()
        );
        assert!(page.contains("1 of 2 repetitions failed (the load / failed)"), "{page}");
        assert!(page.contains("(bench-quality-conversation-64k-p99.svg)"));
        assert!(page.contains("in 1m15s: 6 runs, 3 cells x 2 repetitions"));
    }
}
