//! Project automation, run as `cargo xtask <command>`.
//!
//! Owns the checks that keep the workspace honest (layering, generated code, lints) and the
//! commands CI and contributors run. Owns no product behaviour.
#![expect(clippy::print_stdout, reason = "test output and the suite's summary go to stdout")]
#![expect(
    clippy::disallowed_methods,
    reason = "synchronous code: it waits for the processes it runs on its own thread"
)]

mod bench;
mod codegen;
mod deps;
mod fuzz;
mod lint;
mod tidy;

use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

const USAGE: &str = "usage: cargo xtask <command>

commands:
  codegen [--check]   regenerate crates/router-proto from proto/**/*.proto (--check: fail if stale)
  deps                check internal dependency edges against ARCHITECTURE.md
  lint                cargo fmt --check (fuzz/ too), clippy -D warnings, rustdoc -D warnings,
                      cargo deny (licenses, bans, sources)
  tidy                //! headers, module cycles, references to documents outside the repository
  bench [--quick] [--only overhead|epp|policies|quality|replicas|real|long] [--no-build] [--case TEXT]
        [--set POLICY.KEY=VALUE]...
                      end-to-end benchmark against the simulated fleet; writes docs/benchmarks.md
                      (--only: run one section and replace only it on the page; --case: only the
                      overhead cases whose name contains TEXT, or with --only quality the sweep's
                      cells whose label has each of its words, nothing written; --set, with
                      --only quality --case: that policy setting in those cells, for trials)
  fuzz [--seconds N] [--target NAME] [--reproduce FILE]
                      build the libFuzzer targets of fuzz/ (stable, instrumented) and run each
                      for N seconds (default 60); fails on a crash, saving the input under
                      fuzz/artifacts/ (--reproduce: run that one input once)
  ci                  lint, deps, tidy, codegen --check, every test, the real-engine tests
                      (vLLM, tests/vllm/setup.sh), then 10 s of each fuzz target";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[&str]) -> Result<()> {
    let root = workspace_root();
    match args {
        ["codegen"] => codegen::generate(&root),
        ["codegen", "--check"] => codegen::check(&root),
        ["deps"] => {
            deps::check_workspace(&root)?;
            eprintln!("xtask deps: every internal edge is allowed by ARCHITECTURE.md");
            Ok(())
        }
        ["lint"] => lint::run(&root),
        ["tidy"] => {
            tidy::check_workspace(&root)?;
            eprintln!("xtask tidy: headers, module graph and references are in order");
            Ok(())
        }
        ["bench", rest @ ..] => {
            let quick = rest.contains(&"--quick");
            let only = match rest.iter().position(|a| *a == "--only").and_then(|i| rest.get(i + 1))
            {
                None => bench::Only::All,
                Some(&"overhead") => bench::Only::Overhead,
                Some(&"epp") => bench::Only::Epp,
                Some(&"policies") => bench::Only::Policies,
                Some(&"quality") => bench::Only::Quality,
                Some(&"replicas") => bench::Only::Replicas,
                Some(&"real") => bench::Only::Real,
                Some(&"long") => bench::Only::Long,
                Some(&"trace") => bail!("--only trace: the trace replay is now --only quality"),
                Some(other) => {
                    bail!(
                        "--only {other}: expected overhead, epp, policies, quality, replicas, real or long"
                    )
                }
            };
            let case = match rest.iter().position(|a| *a == "--case") {
                None => None,
                Some(i) => {
                    Some(rest.get(i + 1).map(|c| (*c).to_owned()).context("--case needs a text")?)
                }
            };
            let settings = rest
                .iter()
                .enumerate()
                .filter(|(_, a)| **a == "--set")
                .map(|(i, _)| {
                    let text = rest.get(i + 1).context("--set needs POLICY.KEY=VALUE")?;
                    bench::Setting::parse(text)
                })
                .collect::<Result<Vec<_>>>()?;
            bench::run(
                &root,
                bench::Options {
                    quick,
                    only,
                    build: !rest.contains(&"--no-build"),
                    case,
                    settings,
                    debug: rest.contains(&"--debug"),
                },
            )
        }
        ["fuzz", rest @ ..] => fuzz::run(&root, &fuzz::Options::parse(rest)?),
        ["ci"] => ci(&root),
        _ => bail!("{USAGE}"),
    }
}

fn ci(root: &std::path::Path) -> Result<()> {
    lint::run(root)?;
    deps::check_workspace(root)?;
    tidy::check_workspace(root)?;
    codegen::check(root)?;
    // Binaries first: the end-to-end tests run router-server and router-sim as processes.
    cargo(root, &["build", "--workspace", "--bins"])?;
    let mut totals = TestTotals::default();
    let all =
        cargo_test(root, &["test", "--workspace", "--all-targets", "--no-fail-fast"], &mut totals);
    let doc = cargo_test(root, &["test", "--workspace", "--doc", "--no-fail-fast"], &mut totals);
    // The HTTP front's tests again with hyper reading every client connection
    // (`server.http1: hyper`); the whole suite above ran on the default, the own loop.
    let hyper = cargo_test_with(root, &HYPER_FRONT_TESTS, Some(HYPER_FRONT_ENV), &mut totals);
    // Real vLLM engines, after everything else and one test at a time: each test starts
    // engines of about 2-4 GB and a core each (tests/vllm/setup.sh installs them).
    let real = cargo_test(root, &REAL_ENGINE_TESTS, &mut totals);
    // One closing line for the whole suite, whatever the last test binary printed.
    // A short fuzzing run of every target: a crash fails CI.
    let fuzz = if all.is_ok() && doc.is_ok() && hyper.is_ok() && real.is_ok() {
        let options = fuzz::Options {
            seconds: CI_FUZZ_SECONDS,
            target: None,
            reproduce: None,
            profile: "fuzz-ci",
        };
        fuzz::run(root, &options)
    } else {
        Ok(())
    };
    println!("ci: {} passed, {} failed", totals.passed, totals.failed);
    all.and(doc).and(hyper).and(real).and(fuzz)
}

/// The HTTP front's end-to-end tests, run a second time under `server.http1: hyper`.
const HYPER_FRONT_TESTS: [&str; 13] = [
    "test",
    "-p",
    "router-e2e",
    "--test",
    "front_end",
    "--test",
    "hostile_clients",
    "--test",
    "slow_clients",
    "--test",
    "protocols",
    "--test",
    "plain",
];

/// What makes the end-to-end harness set `server.http1: hyper` in every router it starts.
const HYPER_FRONT_ENV: (&str, &str) = ("ROUTER_E2E_HTTP1", "hyper");

/// The real-engine test step of `ci`.
const REAL_ENGINE_TESTS: [&str; 9] = [
    "test",
    "-p",
    "router-e2e",
    "--features",
    "real-engines",
    "--test",
    "real_vllm",
    "--",
    "--test-threads=1",
];

/// Seconds each fuzz target runs in `cargo xtask ci`.
const CI_FUZZ_SECONDS: u64 = 10;

/// Passed and failed tests summed over every `test result:` line.
#[derive(Default)]
struct TestTotals {
    passed: u64,
    failed: u64,
}

impl TestTotals {
    /// Adds a libtest summary line (`test result: ok. 12 passed; 0 failed; ...`).
    fn add(&mut self, line: &str) {
        let Some(rest) = line.trim().strip_prefix("test result: ") else { return };
        let count = |word: &str| {
            rest.split(';')
                .find_map(|part| {
                    part.trim().strip_suffix(word)?.trim().rsplit(' ').next()?.parse().ok()
                })
                .unwrap_or(0)
        };
        self.passed += count("passed");
        self.failed += count("failed");
    }
}

/// Runs a cargo test command, echoing its output and summing its results.
fn cargo_test(root: &std::path::Path, args: &[&str], totals: &mut TestTotals) -> Result<()> {
    cargo_test_with(root, args, None, totals)
}

/// [`cargo_test`] with the environment variable `env` (`(name, value)`) set.
fn cargo_test_with(
    root: &std::path::Path,
    args: &[&str],
    env: Option<(&str, &str)>,
    totals: &mut TestTotals,
) -> Result<()> {
    use std::io::{BufRead, BufReader};
    let shown = env.map_or_else(String::new, |(name, value)| format!("{name}={value} "));
    eprintln!("xtask: {shown}cargo {}", args.join(" "));
    let mut command = Command::new(env_cargo());
    command.envs(env);
    let mut child = command
        .args(args)
        .current_dir(root)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines().map_while(std::result::Result::ok) {
            println!("{line}");
            totals.add(&line);
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

/// Runs cargo with `args` in the workspace root, failing on a non-zero exit.
pub(crate) fn cargo(root: &std::path::Path, args: &[&str]) -> Result<()> {
    eprintln!("xtask: cargo {}", args.join(" "));
    let status = Command::new(env_cargo())
        .args(args)
        .current_dir(root)
        .status()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

pub(crate) fn env_cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

/// The workspace root: the parent of this crate's manifest directory.
pub(crate) fn workspace_root() -> std::path::PathBuf {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map_or_else(|| manifest.to_path_buf(), std::path::Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::TestTotals;

    #[test]
    fn sums_libtest_summaries() {
        let mut totals = TestTotals::default();
        totals.add("test result: ok. 12 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out");
        totals
            .add("test result: FAILED. 3 passed; 2 failed; 1 ignored; 0 measured; 0 filtered out");
        totals.add("running 3 tests");
        assert_eq!((totals.passed, totals.failed), (15, 2));
    }
}
