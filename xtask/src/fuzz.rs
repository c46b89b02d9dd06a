//! `cargo xtask fuzz`: builds the libFuzzer targets of `fuzz/` on the stable toolchain and runs
//! each for a bounded time, failing when one finds a crash.
//!
//! No cargo-fuzz and no nightly: the build passes rustc's SanitizerCoverage pass and options
//! itself (`-Cpasses=sancov-module` and the `-sanitizer-coverage-*` LLVM options, which stable
//! rustc accepts; only `-Zsanitizer=...` would need nightly, so no sanitizer runs), and
//! libfuzzer-sys compiles libFuzzer with the C++ compiler. Each target starts from its
//! committed seeds (`fuzz/corpus/<target>/`, read only) plus a working corpus kept in the
//! build directory, so that later runs go on where earlier ones stopped. A crashing input is
//! saved under `fuzz/artifacts/<target>/` with the command that reproduces it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// Every target, in the order they run.
pub(crate) const TARGETS: [&str; 8] = [
    "kv_events",
    "kv_frames",
    "load_reports",
    "config",
    "prepare",
    "tokenize",
    "engine_answer",
    "client_head",
];

/// The coverage instrumentation cargo-fuzz uses, minus the sanitizer: inline 8-bit edge
/// counters with their PC table (libFuzzer's coverage feedback) and comparison tracing (so it
/// learns magic values). `--cfg fuzzing`, debug assertions and overflow checks as cargo-fuzz.
const RUSTFLAGS: &[&str] = &[
    "-Cpasses=sancov-module",
    "-Cllvm-args=-sanitizer-coverage-level=4",
    "-Cllvm-args=-sanitizer-coverage-inline-8bit-counters",
    "-Cllvm-args=-sanitizer-coverage-pc-table",
    "-Cllvm-args=-sanitizer-coverage-trace-compares",
    "--cfg",
    "fuzzing",
    "-Cdebug-assertions",
    "-Coverflow-checks",
];

/// Memory one target may use before libFuzzer reports it as a crash (out of memory).
const RSS_LIMIT_MB: u32 = 2048;
/// Seconds one input may take before libFuzzer reports it as a crash (timeout).
const INPUT_TIMEOUT_SECS: u32 = 10;
/// Largest input libFuzzer generates, in bytes.
const MAX_LEN: u32 = 16 * 1024;

/// What to run.
#[derive(Debug)]
pub(crate) struct Options {
    /// Seconds per target.
    pub seconds: u64,
    /// Only this target.
    pub target: Option<String>,
    /// Run the given input once instead of fuzzing (with `target`).
    pub reproduce: Option<PathBuf>,
    /// The cargo profile of fuzz/Cargo.toml to build with: `release` (the fastest targets) or
    /// `fuzz-ci` (the short run of `cargo xtask ci`: built about twice as fast, run slower).
    pub profile: &'static str,
}

impl Options {
    /// Parses `[--seconds N] [--target NAME] [--reproduce FILE]`.
    pub(crate) fn parse(args: &[&str]) -> Result<Self> {
        let mut options = Self { seconds: 60, target: None, reproduce: None, profile: "release" };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
            match *arg {
                "--seconds" => {
                    let text = value()?;
                    options.seconds =
                        text.parse().ok().filter(|s| *s > 0).with_context(|| {
                            format!("--seconds {text}: expected seconds above 0")
                        })?;
                }
                "--target" => {
                    let name = value()?;
                    if !TARGETS.contains(name) {
                        bail!("--target {name}: expected one of {}", TARGETS.join(", "));
                    }
                    options.target = Some((*name).to_owned());
                }
                "--reproduce" => options.reproduce = Some(PathBuf::from(value()?)),
                other => bail!("fuzz: unknown argument {other}"),
            }
        }
        if options.reproduce.is_some() && options.target.is_none() {
            bail!("--reproduce needs --target");
        }
        Ok(options)
    }
}

/// Builds the targets and runs them (or reproduces one input).
pub(crate) fn run(root: &Path, options: &Options) -> Result<()> {
    let targets: Vec<&str> = match &options.target {
        Some(name) => vec![name.as_str()],
        None => TARGETS.to_vec(),
    };
    let build_dir = build_dir(root);
    let started = Instant::now();
    let bins = build(root, &build_dir, &targets, options.profile)?;
    eprintln!("xtask fuzz: built {} target(s) in {:.0?}", targets.len(), started.elapsed());
    if let Some(input) = &options.reproduce {
        let bin = &bins[0];
        eprintln!("xtask fuzz: {} {}", bin.display(), input.display());
        let status = Command::new(bin).arg(input).status().context("running the target")?;
        if !status.success() {
            bail!("{} crashes on {} ({status})", targets[0], input.display());
        }
        eprintln!("xtask fuzz: {} runs {} without a crash", targets[0], input.display());
        return Ok(());
    }
    let mut crashed = Vec::new();
    for (name, bin) in targets.iter().zip(&bins) {
        let outcome = fuzz_one(root, &build_dir, name, bin, options.seconds)?;
        if let Some(artifact) = outcome {
            crashed.push((name, artifact));
        }
    }
    eprintln!("xtask fuzz: done in {:.0?}", started.elapsed());
    if !crashed.is_empty() {
        for (name, artifact) in &crashed {
            eprintln!(
                "xtask fuzz: {name} crashed on {}; reproduce with\n  cargo xtask fuzz --target {name} --reproduce {}",
                artifact.display(),
                artifact.display()
            );
        }
        bail!("{} target(s) crashed", crashed.len());
    }
    Ok(())
}

/// Where the instrumented build and the working corpora live: `$ROUTER_FUZZ_TARGET_DIR`, else
/// `fuzz/target`.
fn build_dir(root: &Path) -> PathBuf {
    std::env::var_os("ROUTER_FUZZ_TARGET_DIR")
        .map_or_else(|| root.join("fuzz").join("target"), PathBuf::from)
}

/// The host's target triple; building for it explicitly keeps the instrumentation off build
/// scripts and proc macros.
fn host_triple() -> Result<String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let output = Command::new(rustc).arg("-vV").output().context("running rustc -vV")?;
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .find_map(|line| line.strip_prefix("host: "))
        .map(str::to_owned)
        .context("rustc -vV names no host")
}

/// Builds `targets` instrumented with cargo profile `profile` (optimised, with debug
/// assertions); returns their binaries.
fn build(root: &Path, build_dir: &Path, targets: &[&str], profile: &str) -> Result<Vec<PathBuf>> {
    let triple = host_triple()?;
    let manifest = root.join("fuzz").join("Cargo.toml");
    // Not --locked, like the workspace's own build in `ci`: a dependency added to a crate
    // lands in fuzz/Cargo.lock on the next run, which is then committed.
    let mut args = vec!["build", "--profile", profile, "--target", &triple, "--manifest-path"];
    let manifest_arg = manifest.to_string_lossy().into_owned();
    args.push(&manifest_arg);
    for target in targets {
        args.extend(["--bin", target]);
    }
    eprintln!("xtask fuzz: cargo {} (instrumented, into {})", args.join(" "), build_dir.display());
    let status = Command::new(crate::env_cargo())
        .args(&args)
        .current_dir(root.join("fuzz"))
        .env("CARGO_TARGET_DIR", build_dir)
        // The flags go in the encoded form, so that nothing else in the environment adds to
        // or splits them.
        .env("CARGO_ENCODED_RUSTFLAGS", RUSTFLAGS.join("\u{1f}"))
        .env_remove("RUSTFLAGS")
        .status()
        .context("running cargo build for fuzz/")?;
    if !status.success() {
        bail!("building the fuzz targets failed ({status})");
    }
    Ok(targets.iter().map(|t| build_dir.join(&triple).join(profile).join(t)).collect())
}

/// Runs one target for `seconds`; returns the crashing input it saved, if any.
fn fuzz_one(
    root: &Path,
    build_dir: &Path,
    name: &str,
    bin: &Path,
    seconds: u64,
) -> Result<Option<PathBuf>> {
    let seeds = root.join("fuzz").join("corpus").join(name);
    let working = build_dir.join("corpus").join(name);
    let artifacts = root.join("fuzz").join("artifacts").join(name);
    for dir in [&working, &artifacts] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let log_path = build_dir.join("logs").join(format!("{name}.log"));
    std::fs::create_dir_all(log_path.parent().unwrap_or(build_dir))?;
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    // libFuzzer writes new inputs into the first corpus directory only: the working one.
    let mut command = Command::new(bin);
    command
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_SECS}"))
        .arg(format!("-max_len={MAX_LEN}"))
        .arg("-print_final_stats=1")
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg(&working)
        .arg(&seeds)
        .stdout(Stdio::null())
        .stderr(log.try_clone()?);
    eprintln!("xtask fuzz: {name}: {seconds} s (log: {})", log_path.display());
    let status = command.status().with_context(|| format!("running {}", bin.display()))?;
    drop(log);
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let stats = Stats::read(&text);
    eprintln!("xtask fuzz: {name}: {}", stats.summary(seconds));
    if stats.executions == 0 {
        bail!("{name} executed no input (see {})", log_path.display());
    }
    if status.success() {
        return Ok(None);
    }
    // The interesting part of the log: the report from the first error on.
    let report_start = text
        .lines()
        .position(|l| l.contains("==ERROR") || l.contains("panicked at") || l.contains("deadly"))
        .unwrap_or(0);
    for line in text.lines().skip(report_start).take(60) {
        eprintln!("  | {line}");
    }
    let artifact = text
        .lines()
        .find_map(|l| l.split_once("Test unit written to ").map(|(_, p)| PathBuf::from(p.trim())));
    match artifact {
        Some(artifact) => Ok(Some(artifact)),
        None => {
            bail!("{name} failed ({status}) without saving an input; see {}", log_path.display())
        }
    }
}

/// What libFuzzer reported about one run.
#[derive(Debug, Default, PartialEq)]
struct Stats {
    /// Inputs executed.
    executions: u64,
    /// Executions per second.
    per_sec: u64,
    /// Coverage counters hit (edges).
    coverage: u64,
    /// Features (edges with hit counts, comparisons).
    features: u64,
    /// Inputs in the corpus at the end.
    corpus: u64,
    /// Inputs added in this run.
    new_units: u64,
    /// Peak resident memory, MB.
    peak_rss_mb: u64,
    /// Seconds it ran, when it ran to the end (`Done N runs in S second(s)`).
    seconds: Option<u64>,
}

impl Stats {
    /// Reads the last status line (`#N ... cov: C ft: F corp: U/S ...`) and the final
    /// `stat::` lines of a libFuzzer log.
    fn read(log: &str) -> Self {
        let mut stats = Self::default();
        let mut fields = BTreeMap::new();
        for line in log.lines() {
            if let Some(rest) = line.strip_prefix("Done ") {
                stats.seconds = rest
                    .split_once(" runs in ")
                    .and_then(|(_, s)| s.split_whitespace().next())
                    .and_then(|s| s.parse().ok());
            } else if let Some(rest) = line.strip_prefix("stat::")
                && let Some((key, value)) = rest.split_once(':')
            {
                fields.insert(key.trim().to_owned(), value.trim().parse().unwrap_or(0));
            } else if line.starts_with('#') {
                let words: Vec<&str> = line.split_whitespace().collect();
                let after = |key: &str| {
                    words
                        .iter()
                        .position(|w| *w == key)
                        .and_then(|i| words.get(i + 1))
                        .and_then(|w| w.split('/').next())
                        .and_then(|w| w.parse().ok())
                };
                stats.coverage = after("cov:").unwrap_or(stats.coverage);
                stats.features = after("ft:").unwrap_or(stats.features);
                stats.corpus = after("corp:").unwrap_or(stats.corpus);
            }
        }
        let field = |key: &str| fields.get(key).copied().unwrap_or(0);
        stats.executions = field("number_of_executed_units");
        stats.per_sec = field("average_exec_per_sec");
        stats.new_units = field("new_units_added");
        stats.peak_rss_mb = field("peak_rss_mb");
        stats
    }

    fn summary(&self, seconds: u64) -> String {
        let ran = match self.seconds {
            Some(s) => format!("in {s} s"),
            None => format!("before stopping early (of {seconds} s)"),
        };
        format!(
            "{} executions {ran} ({}/s), coverage {} edges / {} features, corpus {} inputs ({} new), peak RSS {} MB",
            self.executions,
            self.per_sec,
            self.coverage,
            self.features,
            self.corpus,
            self.new_units,
            self.peak_rss_mb
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libfuzzer_status_and_final_stats() {
        let log = "INFO: Seed: 1\n\
            #2\tINITED cov: 10 ft: 12 corp: 1/1b exec/s: 0 rss: 30Mb\n\
            #4096\tpulse  cov: 150 ft: 400 corp: 60/2Kb lim: 40 exec/s: 2048 rss: 40Mb\n\
            #9000\tDONE   cov: 160 ft: 420 corp: 64/3Kb lim: 43 exec/s: 900 rss: 41Mb\n\
            Done 9000 runs in 10 second(s)\n\
            stat::number_of_executed_units: 9000\n\
            stat::average_exec_per_sec:     900\n\
            stat::new_units_added:          63\n\
            stat::slowest_unit_time_sec:    0\n\
            stat::peak_rss_mb:              41\n";
        let stats = Stats::read(log);
        assert_eq!(
            stats,
            Stats {
                executions: 9000,
                per_sec: 900,
                coverage: 160,
                features: 420,
                corpus: 64,
                new_units: 63,
                peak_rss_mb: 41,
                seconds: Some(10),
            }
        );
    }

    #[test]
    fn options_default_and_reject_unknown_targets() {
        let options = Options::parse(&[]).expect("defaults");
        assert_eq!((options.seconds, options.target), (60, None));
        let options = Options::parse(&["--seconds", "5", "--target", "config"]).expect("valid");
        assert_eq!((options.seconds, options.target.as_deref()), (5, Some("config")));
        assert!(Options::parse(&["--target", "nope"]).is_err());
        assert!(Options::parse(&["--seconds", "0"]).is_err());
        assert!(Options::parse(&["--reproduce", "x"]).is_err(), "needs a target");
    }

    #[test]
    fn every_target_has_a_binary_and_seeds() {
        let root = crate::workspace_root();
        let manifest = std::fs::read_to_string(root.join("fuzz/Cargo.toml")).expect("manifest");
        for target in TARGETS {
            assert!(manifest.contains(&format!("name = \"{target}\"")), "{target}: no [[bin]]");
            let seeds = std::fs::read_dir(root.join("fuzz/corpus").join(target))
                .map(|dir| dir.count())
                .unwrap_or(0);
            assert!(seeds > 0, "{target}: no seeds in fuzz/corpus/{target}");
        }
    }
}
