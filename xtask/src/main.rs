//! Project automation, run as `cargo xtask <command>`.
//!
//! Owns the checks that keep the workspace honest (layering, generated code, lints) and the
//! commands CI and contributors run. Owns no product behaviour.

mod bench;
mod codegen;
mod deps;
mod lint;

use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

const USAGE: &str = "usage: cargo xtask <command>

commands:
  codegen [--check]   regenerate crates/router-proto from proto/*.proto (--check: fail if stale)
  deps                check internal dependency edges against ARCHITECTURE.md
  lint                cargo fmt --check, clippy -D warnings, rustdoc -D warnings
  bench [--quick] [--only overhead|policies|trace] [--no-build]\n                      end-to-end benchmark against the simulated fleet; writes docs/benchmarks.md
  ci                  lint, deps, codegen --check, then every test";

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
        ["bench", rest @ ..] => {
            let quick = rest.contains(&"--quick");
            let only = match rest.iter().position(|a| *a == "--only").and_then(|i| rest.get(i + 1))
            {
                None => bench::Only::All,
                Some(&"overhead") => bench::Only::Overhead,
                Some(&"policies") => bench::Only::Policies,
                Some(&"trace") => bench::Only::Trace,
                Some(other) => bail!("--only {other}: expected overhead, policies or trace"),
            };
            bench::run(&root, quick, only, !rest.contains(&"--no-build"))
        }
        ["ci"] => ci(&root),
        _ => bail!("{USAGE}"),
    }
}

fn ci(root: &std::path::Path) -> Result<()> {
    lint::run(root)?;
    deps::check_workspace(root)?;
    codegen::check(root)?;
    // Binaries first: the end-to-end tests run router-server and router-sim as processes.
    cargo(root, &["build", "--workspace", "--bins"])?;
    cargo(root, &["test", "--workspace", "--all-targets"])?;
    cargo(root, &["test", "--workspace", "--doc"])
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

fn env_cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

/// The workspace root: the parent of this crate's manifest directory.
pub(crate) fn workspace_root() -> std::path::PathBuf {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map_or_else(|| manifest.to_path_buf(), std::path::Path::to_path_buf)
}
